# Daemon tests: the cache alone (unit), then the real fp4idxd spawned on a
# temporary socket by tests/common/daemon_harness.c and driven through the
# wire codec.
fp4idx_add_test(test_daemon_cache SOURCES test_daemon_cache.c
  LIBS fp4idxd_cache LABELS unit)
fp4idx_add_test(test_daemon_cache_oom SOURCES test_daemon_cache_oom.c
  LIBS fp4idx_format LABELS unit)
fp4idx_add_test(test_daemon_config SOURCES test_daemon_config.c
  LIBS fp4idxd_core LABELS unit)
fp4idx_add_test(test_daemon_worker SOURCES test_daemon_worker.c
  LIBS fp4idxd_core LABELS unit)

add_library(fp4idx_daemon_harness STATIC ${CMAKE_CURRENT_SOURCE_DIR}/common/daemon_harness.c)
target_include_directories(fp4idx_daemon_harness PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/common)
target_link_libraries(fp4idx_daemon_harness PUBLIC fp4idx_protocol)
target_compile_definitions(fp4idx_daemon_harness PRIVATE
  FP4IDXD_PATH="$<TARGET_FILE:fp4idxd>")
add_dependencies(fp4idx_daemon_harness fp4idxd)

foreach(t golden errors concurrency lifecycle memory list reqpath)
  fp4idx_add_test(test_daemon_${t} SOURCES test_daemon_${t}.c
    LIBS fp4idx_daemon_harness fp4idx_test_util fp4idx_format Threads::Threads
    LABELS daemon)
  # No Criterion .timeout in these files: Criterion 2.4 leaks a 48-byte timer
  # in its runner when tests with .timeout run in parallel, which fails the
  # ASan CI build. ctest bounds the whole program instead; the harness's
  # socket timeouts (10 s) make a stuck daemon fail a test, not hang it.
  set_tests_properties(test_daemon_${t} PROPERTIES TIMEOUT 300)
endforeach()
if(TARGET fp4idx_cuda)
  target_compile_definitions(test_daemon_lifecycle PRIVATE FP4IDX_TEST_HAVE_CUDA)
  target_compile_definitions(test_daemon_golden PRIVATE FP4IDX_TEST_HAVE_CUDA)
endif()
