#!/usr/bin/env bash
# tests/tsan_daemon.sh -- fp4idxd built with ThreadSanitizer (CUDA off) and
# driven by the daemon and client tests of an existing build, so the loop,
# the worker, the CPU backend's threads and the metrics thread run every
# request path those tests take under the race detector. (The tests
# themselves stay uninstrumented: Criterion cannot set up its arena under
# TSan.) A report makes the daemon exit 66 when it stops, which fails the
# test that stopped it; this script also prints every report and fails.
#
#   tests/tsan_daemon.sh TEST_BUILD_DIR [TSAN_BUILD_DIR]
#
# TEST_BUILD_DIR holds the tests (build 1 of .ci/run); TSAN_BUILD_DIR
# (default build-tsan) gets the instrumented daemon. The Python client's
# pytest suite runs against it as well. Left out, because the
# detector's ~10x slowdown or its shadow memory breaks what they measure,
# not because of a race: test_daemon_lifecycle (its graceful stops wait
# for big scores past the tests' 10 s receive timeout) and
# test_daemon_budget (it bounds the daemon's RSS).
set -euo pipefail
cd "$(dirname "$0")/.."
TESTS=${1:?usage: tests/tsan_daemon.sh TEST_BUILD_DIR [TSAN_BUILD_DIR]}
DIR=${2:-build-tsan}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

mkdir -p "$DIR"
cmake -S . -B "$DIR" -DFP4IDX_CUDA=OFF -DFP4IDX_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread \
  > "$DIR/configure.log" 2>&1 || { cat "$DIR/configure.log"; exit 1; }
cmake --build "$DIR" -j"$JOBS" --target fp4idxd > "$DIR/build.log" 2>&1 ||
  { tail -40 "$DIR/build.log"; exit 1; }

logs=$(cd "$DIR" && pwd)/tsan-reports
rm -rf "$logs" && mkdir -p "$logs"
export FP4IDXD=$(cd "$DIR" && pwd)/daemon/fp4idxd
# tests/tsan_daemon.supp: an fd number reused across threads (why there)
# the tests' RSS bounds skip a daemon under TSan (its shadow grows by tens of MiB)
export FP4IDX_TEST_DAEMON_SANITIZER=thread
export TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0 log_path=$logs/report suppressions=$PWD/tests/tsan_daemon.supp"
failed=0
run_tests() { # LABEL TEST...
  local label=$1 t
  shift
  for t in "$@"; do
    if [[ ! -x "$TESTS/tests/$t" ]]; then
      echo "tests/tsan_daemon.sh: $TESTS/tests/$t is missing"
      exit 1
    fi
    if (cd "$TESTS/tests" && ./"$t" > "$logs/$label.$t.out" 2>&1); then
      echo "$label $t: $(grep -h 'Synthesis' "$logs/$label.$t.out" | sed 's/.*Synthesis: //')"
    else
      echo "$label $t: FAILED (log below)"
      tail -200 "$logs/$label.$t.out"
      failed=1
    fi
  done
}
# As configured on this machine (fewer than 4 CPUs: no busy polling) ...
run_tests default test_daemon_errors test_daemon_reqpath test_daemon_concurrency \
  test_daemon_golden test_daemon_fork test_daemon_list test_daemon_exposure \
  test_daemon_nonfinite test_daemon_metrics test_daemon_log test_daemon_memory \
  test_daemon_tailloss test_daemon_closes test_daemon_powercut test_service_daemon test_client_e2e \
  test_client_cli test_client_oom test_client_regions test_client_channel
# the Python client's suite too (its daemons are this one)
if (FP4IDX_CLI="$TESTS/client/fp4idx-cli" FP4IDX_GOLDEN_DIR="$PWD/tests/golden" \
    PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD/client/python" \
    python3 -m pytest client/python/tests -q -p no:cacheprovider > "$logs/default.pytest.out" 2>&1); then
  echo "default pytest: $(tail -n 1 "$logs/default.pytest.out")"
else
  echo "default pytest: FAILED (log below)"
  tail -30 "$logs/default.pytest.out"
  failed=1
fi
# ... and with busy polling on, as on a GPU host, so that the spinning loop
# and worker (busypoll.h, worker.c) run too; the tests' own --busy-poll-us
# comes later and wins. A subset: the big scores of the others pass the
# tests' receive timeout with two threads spinning on two cores under TSan.
# Two I/O loops here, so that the loops' shared polling count runs too.
real=$FP4IDXD
export FP4IDXD=$(cd "$DIR" && pwd)/fp4idxd-busy-poll
printf '#!/bin/sh\nexec "%s" --busy-poll-us 100 --io-threads 2 "$@"\n' "$real" > "$FP4IDXD"
chmod +x "$FP4IDXD"
run_tests busy-poll test_daemon_errors test_daemon_concurrency test_daemon_golden \
  test_daemon_fork test_daemon_tailloss test_service_daemon test_client_e2e test_client_regions \
  test_client_channel
# ... and with four I/O loops (server.h; the default on this machine is
# one), so connections live on three threads besides the main loop: the
# hand-off, the worker's replies to each loop, the budget's shared counters
# and messages, the stop and close_all reaching every loop. Not
# test_daemon_closes: it bounds the daemon's RSS, which the detector's
# per-thread state grows with three more threads.
export FP4IDXD=$(cd "$DIR" && pwd)/fp4idxd-io-loops
printf '#!/bin/sh\nexec "%s" --io-threads 4 "$@"\n' "$real" > "$FP4IDXD"
chmod +x "$FP4IDXD"
run_tests io-loops test_daemon_errors test_daemon_reqpath test_daemon_concurrency \
  test_daemon_fork test_daemon_list test_daemon_exposure \
  test_daemon_nonfinite test_daemon_metrics test_service_daemon test_client_e2e \
  test_client_regions test_client_channel
if ls "$logs"/report.* > /dev/null 2>&1; then
  echo "tests/tsan_daemon.sh: ThreadSanitizer reports:"
  cat "$logs"/report.*
  failed=1
fi
[[ $failed == 0 ]] && echo "tests/tsan_daemon.sh: no race reported"
exit $failed
