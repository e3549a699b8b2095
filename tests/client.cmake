# Client library and CLI tests.
#   test_client_cli_units  CLI internals, no daemon (npy, args, output, Prometheus)
#   test_client_conn       the library's transport against an in-process fake
#                          daemon: short reads, closes mid-response, timeouts,
#                          id mismatch, oversize announcements, error replies
#   test_client_e2e        the real fp4idxd (tests/common/daemon_harness):
#                          golden cases bit for bit, top-k, errors, CLI
fp4idx_add_test(test_client_cli_units SOURCES test_client_cli_units.c
  LIBS fp4idx_cli_core LABELS unit client)
fp4idx_add_test(test_client_conn SOURCES test_client_conn.c
  LIBS fp4idx::client Threads::Threads LABELS unit client)
if(TARGET fp4idx_daemon_harness)
  fp4idx_add_test(test_client_e2e SOURCES test_client_e2e.c
    LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util Threads::Threads
    LABELS daemon client)
endif()
if(TARGET fp4idx_daemon_harness)
  fp4idx_add_test(test_client_cli SOURCES test_client_cli.c
    LIBS fp4idx_cli_core fp4idx_daemon_harness fp4idx_test_util
    LABELS daemon client)
  target_compile_definitions(test_client_cli PRIVATE
    FP4IDX_CLI_PATH="$<TARGET_FILE:fp4idx-cli>")
  add_dependencies(test_client_cli fp4idx-cli)
endif()
if(TARGET fp4idx_daemon_harness)
  # Allocation-failure loops: the linker routes the static library's
  # malloc/calloc/realloc through the test's hooks.
  fp4idx_add_test(test_client_oom SOURCES test_client_oom.c
    LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util
    LABELS daemon client)
  target_link_options(test_client_oom PRIVATE
    -Wl,--wrap=malloc -Wl,--wrap=calloc -Wl,--wrap=realloc)
endif()
if(TARGET fp4idx_daemon_harness)
  # Host regions (same-host zero copy) on the CPU backend: results equal the
  # socket path, the malformed-region matrix, the security cases.
  fp4idx_add_test(test_client_regions SOURCES test_client_regions.c
    LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util Threads::Threads
    LABELS daemon client)
  set_tests_properties(test_client_regions PROPERTIES TIMEOUT 300)
  # Channels on the CPU backend, calls made by the host: results equal the
  # socket's, bad calls, refusals, isolation, a killed daemon, an exiting client.
  fp4idx_add_test(test_client_channel SOURCES test_client_channel.c
    LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util Threads::Threads
    LABELS daemon client)
  set_tests_properties(test_client_channel PROPERTIES TIMEOUT 300)
  # The same tests with a stand-in libcuda.so.1 (cuda_driver_stub.c) loaded
  # first: the host calls with a driver present, and the C client's stream
  # path (one cuStreamBatchMemOp a call, op by op where it is refused)
  # without a GPU.
  add_library(fp4idx_cuda_driver_stub SHARED cuda_driver_stub.c)
  set_target_properties(fp4idx_cuda_driver_stub PROPERTIES OUTPUT_NAME cuda VERSION 1 SOVERSION 1
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/stub_driver)
  fp4idx_add_test(test_client_channel_stream SOURCES test_client_channel.c
    LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util Threads::Threads ${CMAKE_DL_LIBS}
    LABELS daemon client)
  target_compile_definitions(test_client_channel_stream PRIVATE
    FP4IDX_TEST_STUB_DRIVER="${CMAKE_CURRENT_BINARY_DIR}/stub_driver/libcuda.so.1")
  add_dependencies(test_client_channel_stream fp4idx_cuda_driver_stub)
  set_tests_properties(test_client_channel_stream PROPERTIES TIMEOUT 300)
endif()

# README.md's library example, compiled against the build tree's
# uninstalled .pc and run against the daemon it starts, as written.
if(TARGET fp4idxd AND TARGET fp4idx-cli)
  add_test(NAME test_readme COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_readme.sh
                                    ${PROJECT_SOURCE_DIR}/README.md ${CMAKE_BINARY_DIR})
  set_tests_properties(test_readme PROPERTIES LABELS "daemon;client" TIMEOUT 180)
endif()
