# Daemon tests: the cache alone (unit), then the real fp4idxd spawned on a
# temporary socket by tests/common/daemon_harness.c and driven through the
# wire codec.
fp4idx_add_test(test_daemon_cache SOURCES test_daemon_cache.c
  LIBS fp4idxd_cache LABELS unit)
fp4idx_add_test(test_daemon_cache_oom SOURCES test_daemon_cache_oom.c
  LIBS fp4idx_format LABELS unit)
# Prefix sharing (fork, copy-on-write) over a real backend; the CUDA build
# runs the same cases on the GPU (label gpu, skips without a device).
fp4idx_add_test(test_cache_fork SOURCES test_cache_fork.c
  LIBS fp4idxd_cache fp4idx_cpu LABELS unit)
# The same with chunks of 3 page ids: forks, copies and trims across chunk
# boundaries all the time.
fp4idx_add_test(test_cache_fork_chunk3
  SOURCES test_cache_fork.c ${PROJECT_SOURCE_DIR}/daemon/cache.c
  LIBS fp4idx_cpu fp4idx_format LABELS unit)
target_include_directories(test_cache_fork_chunk3 PRIVATE ${PROJECT_SOURCE_DIR}/daemon)
target_compile_definitions(test_cache_fork_chunk3 PRIVATE FP4IDX_CACHE_CHUNK=3)
if(TARGET fp4idx_cuda)
  fp4idx_add_test(test_cache_fork_cuda SOURCES test_cache_fork.c
    LIBS fp4idxd_cache fp4idx_cpu fp4idx_cuda LABELS gpu)
  target_compile_definitions(test_cache_fork_cuda PRIVATE FP4IDX_TEST_FORK_CUDA)
endif()
fp4idx_add_test(test_daemon_config SOURCES test_daemon_config.c
  LIBS fp4idxd_core LABELS unit)
# GPU sharing mode (MPS, time slices) from the driver's and NVML's view.
fp4idx_add_test(test_daemon_sharing SOURCES test_daemon_sharing.c
  LIBS fp4idxd_core LABELS unit daemon)
fp4idx_add_test(test_daemon_worker SOURCES test_daemon_worker.c
  LIBS fp4idxd_core LABELS unit)

add_library(fp4idx_daemon_harness STATIC ${CMAKE_CURRENT_SOURCE_DIR}/common/daemon_harness.c)
target_include_directories(fp4idx_daemon_harness PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/common)
target_link_libraries(fp4idx_daemon_harness PUBLIC fp4idx_protocol)
target_compile_definitions(fp4idx_daemon_harness PRIVATE
  FP4IDXD_PATH="$<TARGET_FILE:fp4idxd>")
add_dependencies(fp4idx_daemon_harness fp4idxd)

# Log lines: text / journal forms, detection, and the daemon under a
# journal-like stderr.
fp4idx_add_test(test_daemon_log SOURCES test_daemon_log.c
  LIBS fp4idxd_core LABELS unit daemon)
target_compile_definitions(test_daemon_log PRIVATE FP4IDXD_PATH="$<TARGET_FILE:fp4idxd>")
add_dependencies(test_daemon_log fp4idxd)

foreach(t golden errors concurrency lifecycle memory list fork exposure budget closes nonfinite reqpath)
  fp4idx_add_test(test_daemon_${t} SOURCES test_daemon_${t}.c
    LIBS fp4idx_daemon_harness fp4idx_test_util fp4idx_format Threads::Threads
    LABELS daemon)
  # No Criterion .timeout in these files: Criterion 2.4 leaks a 48-byte timer
  # in its runner when tests with .timeout run in parallel, which fails the
  # ASan CI build. ctest bounds the whole program instead; the harness's
  # socket timeouts (10 s) make a stuck daemon fail a test, not hang it.
  set_tests_properties(test_daemon_${t} PROPERTIES TIMEOUT 300)
endforeach()
# fp4idxd-hold (test only): fp4idxd whose first backend read holds the
# worker until the test releases it (tests/fp4idxd_hold.c), so that
# test_daemon_reqpath orders its events without sleeping.
add_executable(fp4idxd-hold fp4idxd_hold.c)
target_link_libraries(fp4idxd-hold PRIVATE fp4idxd_program fp4idx_backend m)
target_compile_definitions(test_daemon_reqpath PRIVATE
  FP4IDXD_HOLD_PATH="$<TARGET_FILE:fp4idxd-hold>")
add_dependencies(test_daemon_reqpath fp4idxd-hold)
# "length", through the codec and the C client's generated call.
fp4idx_add_test(test_daemon_length
  SOURCES test_daemon_length.c ${CMAKE_CURRENT_SOURCE_DIR}/test_protocol_util.c
  LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util LABELS daemon client)
set_tests_properties(test_daemon_length PROPERTIES TIMEOUT 300)
if(TARGET fp4idx_cuda)
  target_compile_definitions(test_daemon_lifecycle PRIVATE FP4IDX_TEST_HAVE_CUDA)
  target_compile_definitions(test_daemon_golden PRIVATE FP4IDX_TEST_HAVE_CUDA)
  target_compile_definitions(test_daemon_fork PRIVATE FP4IDX_TEST_HAVE_CUDA)
endif()

# fp4idxd-nowork (bench/: the daemon with the benchmark-only no-work
# backend) answers every op with replies of the right shapes.
if(TARGET fp4idxd-nowork)
  fp4idx_add_test(test_daemon_nowork SOURCES test_daemon_nowork.c
    LIBS fp4idx_daemon_harness fp4idx_format m LABELS daemon)
  target_compile_definitions(test_daemon_nowork PRIVATE
    FP4IDXD_NOWORK_PATH="$<TARGET_FILE:fp4idxd-nowork>")
  add_dependencies(test_daemon_nowork fp4idxd-nowork)
  set_tests_properties(test_daemon_nowork PROPERTIES TIMEOUT 120)
endif()

# Metrics: counters and gauges, the --metrics-listen scrape endpoint
# (libmicrohttpd), and promtool's lint on what it serves.
if(TARGET fp4idx_daemon_harness AND TARGET fp4idx_metrics_http)
  fp4idx_add_test(test_daemon_metrics SOURCES test_daemon_metrics.c
    LIBS fp4idx_metrics_http fp4idx_daemon_harness fp4idx::client LABELS daemon)
  set_tests_properties(test_daemon_metrics PROPERTIES TIMEOUT 120)
endif()
if(TARGET fp4idxd AND TARGET fp4idx-cli)
  add_test(NAME test_promtool COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_promtool.sh
                                      $<TARGET_FILE:fp4idxd> $<TARGET_FILE:fp4idx-cli>)
  set_tests_properties(test_promtool PROPERTIES SKIP_RETURN_CODE 77 LABELS daemon TIMEOUT 120)
endif()
# Power loss: the daemon under an LD_PRELOAD layer that drops unsynced writes
# at a random moment (tests/powercut/powercut_preload.c). The layer is built
# without the sanitizer flags of an ASan build: it runs inside the daemon
# ahead of the sanitizer runtime.
add_library(fp4idx_powercut MODULE ${CMAKE_CURRENT_SOURCE_DIR}/powercut/powercut_preload.c)
set_target_properties(fp4idx_powercut PROPERTIES LINK_OPTIONS ""
  COMPILE_OPTIONS "-Wall;-Wextra;-Wshadow;$<$<BOOL:${FP4IDX_WERROR}>:-Werror>")
target_link_libraries(fp4idx_powercut PRIVATE ${CMAKE_DL_LIBS} Threads::Threads)
fp4idx_add_test(test_daemon_powercut SOURCES test_daemon_powercut.c
  LIBS fp4idx_daemon_harness Threads::Threads LABELS daemon)
target_compile_definitions(test_daemon_powercut PRIVATE
  FP4IDX_POWERCUT_SO="$<TARGET_FILE:fp4idx_powercut>")
add_dependencies(test_daemon_powercut fp4idx_powercut)
set_tests_properties(test_daemon_powercut PROPERTIES TIMEOUT 600)

# The connection fuzzer (tests/fuzz/fuzz_conn.c): plain libc, its own
# msgpack; tests/fuzz/conn_run.sh runs it against the sanitizer build's
# daemon (.ci/run, after build 2). Built with every build, not a ctest.
add_executable(fuzz_conn ${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz_conn.c)
