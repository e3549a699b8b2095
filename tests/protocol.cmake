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
fp4idx_add_test(test_protocol_channel
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_protocol_channel.c LIBS fp4idx_protocol)
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

# The libFuzzer target's inputs, replayed on every build (gcc, ASan): the
# seed corpus and one file per crash ever found (tests/fuzz/regressions).
# tests/fuzz/replay_main.c is a main() that feeds each file to
# LLVMFuzzerTestOneInput once.
set(_fuzz_dir ${CMAKE_CURRENT_LIST_DIR}/fuzz)
add_executable(fuzz_codec_replay ${_fuzz_dir}/fuzz_codec.c ${_fuzz_dir}/replay_main.c)
target_link_libraries(fuzz_codec_replay PRIVATE fp4idx_protocol)
add_test(NAME fuzz_codec_replay
         COMMAND fuzz_codec_replay ${_fuzz_dir}/corpus ${_fuzz_dir}/regressions)

# Coverage-guided fuzzing with libFuzzer (clang only, off by default):
#   cmake -B build-fuzz -DCMAKE_C_COMPILER=clang -DFP4IDX_LIBFUZZER=ON
#   cmake --build build-fuzz --target fuzz_codec
#   mkdir -p /tmp/fz && build-fuzz/tests/fuzz_codec -max_total_time=300 \
#     /tmp/fz tests/fuzz/corpus tests/fuzz/regressions
# (libFuzzer adds new inputs to its FIRST directory: keep that one scratch.)
# The codec itself is instrumented: fp4idx_protocol_fuzz is the protocol
# library compiled again with -fsanitize=fuzzer-no-link (coverage counters
# and comparison hooks, no libFuzzer main), so the fuzzer is guided by the
# decoder's branches, not only the harness's. A separate copy keeps the
# daemon and the client free of the instrumentation. ASan + UBSan on both.
# ctest runs it for 10 s; .ci/run runs it for 60 s (tests/fuzz/run.sh).
option(FP4IDX_LIBFUZZER "Build the libFuzzer codec target (clang)" OFF)
if(FP4IDX_LIBFUZZER)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FP4IDX_LIBFUZZER=ON needs clang")
  endif()
  set(_fuzz_san -fsanitize=address,undefined -fno-sanitize-recover=undefined)
  add_library(fp4idx_protocol_fuzz STATIC ${FP4IDX_PROTOCOL_SOURCES})
  target_include_directories(fp4idx_protocol_fuzz PUBLIC ${PROJECT_SOURCE_DIR}/protocol ${FP4IDX_GEN_DIR})
  add_dependencies(fp4idx_protocol_fuzz fp4idx_optable)
  target_link_libraries(fp4idx_protocol_fuzz PUBLIC PkgConfig::MSGPACK)
  target_compile_options(fp4idx_protocol_fuzz PRIVATE -fsanitize=fuzzer-no-link ${_fuzz_san})
  add_executable(fuzz_codec ${_fuzz_dir}/fuzz_codec.c)
  target_link_libraries(fuzz_codec PRIVATE fp4idx_protocol_fuzz)
  target_compile_options(fuzz_codec PRIVATE -fsanitize=fuzzer ${_fuzz_san})
  target_link_options(fuzz_codec PRIVATE -fsanitize=fuzzer ${_fuzz_san})
  file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus)
  add_test(NAME fuzz_codec
           COMMAND fuzz_codec -max_total_time=10 -max_len=4096
                   ${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus
                   ${_fuzz_dir}/corpus ${_fuzz_dir}/regressions)
endif()

# The committed outputs of the op table (protocol/optable.py): PROTOCOL.md's
# op reference and the Python client's table must be what the generator
# makes of it now (protocol/gen_optable.py docs --write rewrites both).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
add_test(NAME test_optable_docs
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/protocol/gen_optable.py docs --check)
