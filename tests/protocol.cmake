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
