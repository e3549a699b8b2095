#!/usr/bin/env bash
# tests/fuzz/conn_run.sh -- the connection fuzzer (tests/fuzz/fuzz_conn.c)
# against the sanitizer build's daemon, for a bounded time (what .ci/run
# does after build 2).
#
#   tests/fuzz/conn_run.sh [SECONDS] [BUILD_DIR]     (default 60, build-asan)
#
# BUILD_DIR is an ASan + UBSan build (cmake -DFP4IDX_SANITIZE=ON
# -DFP4IDX_CUDA=OFF) holding daemon/fp4idxd and tests/fuzz_conn. The
# daemon runs with the CPU backend on a temporary socket, with a small
# cache, buffer budget and max frame (so that the budget, EFULL and the
# frame limit are reached) and a short buffer timeout. After SECONDS of
# fuzzing it gets SIGTERM and must exit 0 in time.
#
# Fails (exit 1) when the fuzzer reports a finding (canary mismatch or
# timeout, lost canary, refused connect, malformed reply), when the daemon
# died, exited non-zero or did not stop, or when its output holds a
# sanitizer report; the report, the daemon's last lines and the fuzzer's
# seed are printed. Logs stay in BUILD_DIR/connfuzz/.
#
# Environment: CONNFUZZ_SEED (replay a seed), CONNFUZZ_CONNS (default 32),
# CONNFUZZ_MODE (mixed, the default, or lies: mostly length lies),
# CONNFUZZ_ARGS (more fuzz_conn options), CONNFUZZ_IO_THREADS (the
# daemon's --io-threads, default 4: connections spread over the main loop
# and three threads, the hand-off and cross-loop messages under fire),
# ASAN_OPTIONS / UBSAN_OPTIONS /
# LSAN_OPTIONS (defaults as in .ci/run).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
secs=${1:-60}
build=${2:-build-asan}
daemon=$build/daemon/fp4idxd
fuzzer=$build/tests/fuzz_conn
for f in "$daemon" "$fuzzer"; do
  if [[ ! -x "$f" ]]; then
    echo "tests/fuzz/conn_run.sh: $f not found (build $build with -DFP4IDX_SANITIZE=ON first)" >&2
    exit 1
  fi
done
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/.ci/lsan.supp}

logs=$build/connfuzz
mkdir -p "$logs"
dlog=$logs/daemon.log
flog=$logs/fuzz.log
: >"$dlog"
: >"$flog"
tmp=$(mktemp -d /tmp/fp4idx-connfuzz.XXXXXX)
sock=$tmp/d.sock
dpid=
cleanup() {
  [[ -n "$dpid" ]] && kill -KILL "$dpid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

"$daemon" --socket "$sock" --backend cpu --cache-bytes 16M --buffer-budget 16M \
  --max-frame 4M --buffer-timeout 3 --io-threads "${CONNFUZZ_IO_THREADS:-4}" \
  --log-level warn >"$dlog" 2>&1 &
dpid=$!
for _ in $(seq 300); do
  [[ -S "$sock" ]] && break
  kill -0 "$dpid" 2>/dev/null || break
  sleep 0.1
done
if [[ ! -S "$sock" ]]; then
  echo "tests/fuzz/conn_run.sh: the daemon did not start; its output:" >&2
  tail -n 50 "$dlog" >&2
  exit 1
fi

args=(--socket "$sock" --seconds "$secs" --conns "${CONNFUZZ_CONNS:-32}"
      --mode "${CONNFUZZ_MODE:-mixed}")
[[ -n "${CONNFUZZ_SEED:-}" ]] && args+=(--seed "$CONNFUZZ_SEED")
# shellcheck disable=SC2206
[[ -n "${CONNFUZZ_ARGS:-}" ]] && args+=($CONNFUZZ_ARGS)
"$fuzzer" "${args[@]}" 2>&1 | tee "$flog"
frc=${PIPESTATUS[0]}

fail=0
drc=
if kill -0 "$dpid" 2>/dev/null; then
  kill -TERM "$dpid"
  for _ in $(seq 600); do
    kill -0 "$dpid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$dpid" 2>/dev/null; then
    echo "tests/fuzz/conn_run.sh: FAIL: the daemon did not exit within 60 s of SIGTERM" >&2
    kill -ABRT "$dpid" 2>/dev/null
    sleep 2
    fail=1
  fi
fi
wait "$dpid"
drc=$?
dpid=
if [[ "$drc" -ne 0 ]]; then
  if [[ "$drc" -gt 128 ]]; then
    echo "tests/fuzz/conn_run.sh: FAIL: the daemon died (signal $((drc - 128)), exit status $drc)" >&2
  else
    echo "tests/fuzz/conn_run.sh: FAIL: the daemon exited with status $drc" >&2
  fi
  fail=1
fi
report='ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|SUMMARY: (Address|Leak|Undefined)|AddressSanitizer:DEADLYSIGNAL'
if grep -Eq "$report" "$dlog"; then
  echo "tests/fuzz/conn_run.sh: FAIL: sanitizer report from the daemon:" >&2
  # the report itself: from its first line, at most 200 lines
  first=$(grep -En "$report" "$dlog" | head -n 1 | cut -d: -f1)
  tail -n "+$((first > 3 ? first - 3 : 1))" "$dlog" | head -n 200 >&2
  fail=1
elif [[ "$fail" -ne 0 ]]; then
  echo "tests/fuzz/conn_run.sh: the daemon's last lines:" >&2
  tail -n 40 "$dlog" >&2
fi
if [[ "$frc" -ne 0 ]]; then
  echo "tests/fuzz/conn_run.sh: FAIL: the fuzzer exited with status $frc (see its FINDING line)" >&2
  fail=1
fi
seed=$(sed -n 's/^fuzz_conn: seed \([0-9]*\).*/\1/p' "$flog" | head -n 1)
if [[ "$fail" -ne 0 ]]; then
  echo "tests/fuzz/conn_run.sh: replay: CONNFUZZ_SEED=$seed tests/fuzz/conn_run.sh $secs $build" >&2
  echo "tests/fuzz/conn_run.sh: logs in $logs" >&2
  exit 1
fi
echo "tests/fuzz/conn_run.sh: OK ($secs s, seed $seed, no finding, daemon exited 0)"
