# The Python client's pytest suite (client/python/tests) against the fp4idxd
# and fp4idx-cli of this build. It needs python3 with msgpack, numpy and
# pytest (tests/run.sh installs them through deploy/install-deps.sh); a
# missing module fails the test rather than skipping it.
find_program(FP4IDX_PYTHON NAMES python3 python)
if(FP4IDX_PYTHON)
  add_test(NAME test_python
    COMMAND ${FP4IDX_PYTHON} -m pytest ${PROJECT_SOURCE_DIR}/client/python/tests
            -q -p no:cacheprovider
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(test_python PROPERTIES
    LABELS "daemon;client;python"
    TIMEOUT 600
    ENVIRONMENT "FP4IDXD=$<TARGET_FILE:fp4idxd>;FP4IDX_CLI=$<TARGET_FILE:fp4idx-cli>;FP4IDX_GOLDEN_DIR=${FP4IDX_GOLDEN_DIR};PYTHONDONTWRITEBYTECODE=1;PYTHONPATH=${PROJECT_SOURCE_DIR}/client/python")
  # bench/two_daemons.py at a small size, CPU daemons: the ShardedClient over
  # two daemons gives byte for byte what one daemon gives (no timing). The
  # socket folder is per build tree (socket paths must stay short, and two
  # builds testing at once must not share sockets).
  string(MD5 _fp4idx_two_id "${CMAKE_BINARY_DIR}")
  string(SUBSTRING "${_fp4idx_two_id}" 0 10 _fp4idx_two_id)
  add_test(NAME test_two_daemons
    COMMAND ${FP4IDX_PYTHON} ${PROJECT_SOURCE_DIR}/bench/two_daemons.py
            --daemon $<TARGET_FILE:fp4idxd> --backend cpu --devices 0,1
            --seqs 12 --keys 3000 --check-only
            --socket-dir /tmp/fp4idx-two-${_fp4idx_two_id})
  set_tests_properties(test_two_daemons PROPERTIES
    LABELS "daemon;python" TIMEOUT 300
    ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
else()
  # No interpreter: a failing test says so (never a silent skip).
  add_test(NAME test_python COMMAND sh -c "echo 'test_python: python3 not found' >&2; exit 1")
endif()
