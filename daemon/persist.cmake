# fp4idx_persist: snapshots, the append log, SGLang page export, CRC-32C and
# the systemd glue (sd_notify, LISTEN_FDS). No libuv, no cache: plain files
# and callbacks, so the tests drive it without a daemon. Included from
# daemon/CMakeLists.txt (and from tests/service.cmake when built alone).
set(_fp4idx_persist_dir ${CMAKE_CURRENT_LIST_DIR})
add_library(fp4idx_persist STATIC
  ${_fp4idx_persist_dir}/crc32c.c
  ${_fp4idx_persist_dir}/snapshot.c
  ${_fp4idx_persist_dir}/aof.c
  ${_fp4idx_persist_dir}/export.c
  ${_fp4idx_persist_dir}/notify.c)
target_include_directories(fp4idx_persist PUBLIC ${_fp4idx_persist_dir})
target_link_libraries(fp4idx_persist PUBLIC fp4idx_protocol Threads::Threads)
if(LIBSYSTEMD_FOUND)
  target_compile_definitions(fp4idx_persist PRIVATE FP4IDX_HAVE_SYSTEMD=1)
  target_link_libraries(fp4idx_persist PRIVATE PkgConfig::LIBSYSTEMD)
endif()
