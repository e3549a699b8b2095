# fp4idx_persist: snapshots, the append log, SGLang page export and CRC-32C
# (plain files and callbacks: no libuv, no cache, no systemd), used by the
# daemon, the CLI (export/import) and the tests.
# fp4idx_notify: the systemd glue (sd_notify, LISTEN_FDS), with libsystemd
# when the build found it.
# Included from daemon/CMakeLists.txt (and tests/service.cmake when alone).
set(_fp4idx_persist_dir ${CMAKE_CURRENT_LIST_DIR})
add_library(fp4idx_persist STATIC
  ${_fp4idx_persist_dir}/crc32c.c
  ${_fp4idx_persist_dir}/snapshot.c
  ${_fp4idx_persist_dir}/aof.c
  ${_fp4idx_persist_dir}/logmark.c
  ${_fp4idx_persist_dir}/export.c)
target_include_directories(fp4idx_persist PUBLIC ${_fp4idx_persist_dir})
target_link_libraries(fp4idx_persist PUBLIC fp4idx_protocol fp4idx_format Threads::Threads)

add_library(fp4idx_notify STATIC ${_fp4idx_persist_dir}/notify.c)
target_include_directories(fp4idx_notify PUBLIC ${_fp4idx_persist_dir})
target_link_libraries(fp4idx_notify PUBLIC fp4idx_protocol)
if(LIBSYSTEMD_FOUND)
  target_compile_definitions(fp4idx_notify PRIVATE FP4IDX_HAVE_SYSTEMD=1)
  target_link_libraries(fp4idx_notify PRIVATE PkgConfig::LIBSYSTEMD)
endif()
