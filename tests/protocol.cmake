# Protocol codec tests (protocol/). test_protocol_util.c is the shared helper:
# a one-line msgpack notation for malformed inputs and the PROTOCOL.md
# transcript builder.
set(_proto_util ${CMAKE_CURRENT_LIST_DIR}/test_protocol_util.c)

fp4idx_add_test(test_protocol_frame
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_frame.c ${_proto_util} LIBS fp4idx_protocol)
fp4idx_add_test(test_protocol_codec
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_codec.c ${_proto_util} LIBS fp4idx_protocol)
fp4idx_add_test(test_protocol_reject
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_reject.c ${_proto_util} LIBS fp4idx_protocol)
fp4idx_add_test(test_protocol_fuzz
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_fuzz.c ${_proto_util} LIBS fp4idx_protocol)
fp4idx_add_test(test_protocol_spec
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_spec.c ${_proto_util} LIBS fp4idx_protocol)
# the spec test reads PROTOCOL.md (status table, limits, hex transcript)
target_compile_definitions(test_protocol_spec PRIVATE
  FP4IDX_PROTOCOL_MD="${PROJECT_SOURCE_DIR}/protocol/PROTOCOL.md")
# out-of-memory loops: the test's allocator wraps malloc/calloc/realloc of
# everything linked statically into it (the codec included)
fp4idx_add_test(test_protocol_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_oom.c ${_proto_util}
  LIBS fp4idx_protocol)
target_link_options(test_protocol_oom PRIVATE
  -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc)

# Coverage-guided fuzzing with libFuzzer (clang only, off by default):
#   cmake -B build-fuzz -DCMAKE_C_COMPILER=clang -DFP4IDX_LIBFUZZER=ON
#   mkdir -p /tmp/fz && build-fuzz/tests/fuzz_codec -max_total_time=300 \
#     /tmp/fz tests/fuzz/corpus
# (libFuzzer adds new inputs to its FIRST directory: keep that one scratch.)
# ctest runs it for 10 s from the seed corpus (the transcript bodies).
option(FP4IDX_LIBFUZZER "Build the libFuzzer codec target (clang)" OFF)
if(FP4IDX_LIBFUZZER)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FP4IDX_LIBFUZZER=ON needs clang")
  endif()
  add_executable(fuzz_codec ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_codec.c)
  target_link_libraries(fuzz_codec PRIVATE fp4idx_protocol)
  target_compile_options(fuzz_codec PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_codec PRIVATE -fsanitize=fuzzer)
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus)
  add_test(NAME fuzz_codec
           COMMAND fuzz_codec -max_total_time=10 -max_len=4096
                   ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus
                   ${CMAKE_CURRENT_LIST_DIR}/fuzz/corpus)
endif()
