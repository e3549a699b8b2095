# Tests of fp4idxd as a service (install, persistence): snapshot and append log
# files, SGLang export, sd_notify/LISTEN_FDS, the systemd unit files.

fp4idx_add_test(test_snapshot SOURCES test_snapshot.c LIBS fp4idx_persist)
fp4idx_add_test(test_aof SOURCES test_aof.c LIBS fp4idx_persist)
fp4idx_add_test(test_export SOURCES test_export.c LIBS fp4idx_persist fp4idx_format)
fp4idx_add_test(test_notify SOURCES test_notify.c LIBS fp4idx_notify)

# The unit files: verified against the built daemon when there is one.
if(TARGET fp4idxd)
  set(_fp4idx_units_daemon $<TARGET_FILE:fp4idxd>)
else()
  set(_fp4idx_units_daemon /bin/true)
endif()
if(TARGET fp4idx-cli)
  set(_fp4idx_units_cli $<TARGET_FILE:fp4idx-cli>)
else()
  set(_fp4idx_units_cli /bin/true)
endif()
add_test(NAME test_units
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_units.sh
                 ${PROJECT_SOURCE_DIR}/deploy ${_fp4idx_units_daemon} ${_fp4idx_units_cli})
set_tests_properties(test_units PROPERTIES SKIP_RETURN_CODE 77 LABELS unit)

# The man pages name every command and option the programs' --help shows.
if(TARGET fp4idxd AND TARGET fp4idx-cli)
  add_test(NAME test_man COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_man.sh
                                 ${PROJECT_SOURCE_DIR}/deploy/man
                                 $<TARGET_FILE:fp4idxd> $<TARGET_FILE:fp4idx-cli>)
  set_tests_properties(test_man PROPERTIES LABELS unit)
endif()

# The .deb: CPack builds it from this tree, its contents are checked and the
# daemon it carries is started the way the units say (no system change; see
# the script for the real dpkg -i variant).
if(TARGET fp4idxd)
  add_test(NAME test_deb COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_deb.sh
                                 ${CMAKE_BINARY_DIR})
  set_tests_properties(test_deb PROPERTIES SKIP_RETURN_CODE 77 LABELS deb TIMEOUT 600)
endif()

# lintian on the three packages (errors and warnings fail).
if(TARGET fp4idxd)
  add_test(NAME test_lintian COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_lintian.sh
                                     ${CMAKE_BINARY_DIR})
  set_tests_properties(test_lintian PROPERTIES SKIP_RETURN_CODE 77 LABELS deb TIMEOUT 600)
endif()

# The real daemon as a service (restart, kill -9, socket activation, notify).
if(TARGET fp4idx_daemon_harness)
  fp4idx_add_test(test_service_daemon SOURCES test_service_daemon.c
    LIBS fp4idx_daemon_harness fp4idx_format Threads::Threads LABELS daemon)
  target_compile_definitions(test_service_daemon PRIVATE
    FP4IDXD_PATH="$<TARGET_FILE:fp4idxd>")
  # Tail loss: a short or missing log is refused (persist/logmark.h).
  fp4idx_add_test(test_daemon_tailloss SOURCES test_daemon_tailloss.c
    LIBS fp4idx_daemon_harness fp4idx_persist LABELS daemon)
  set_tests_properties(test_daemon_tailloss PROPERTIES TIMEOUT 300)
endif()

# fp4idx-cli save / export / import against the real daemon.
if(TARGET fp4idxd AND TARGET fp4idx-cli)
  add_test(NAME test_service_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_service_cli.sh
                                         $<TARGET_FILE:fp4idxd> $<TARGET_FILE:fp4idx-cli>)
  set_tests_properties(test_service_cli PROPERTIES LABELS daemon)
endif()
