#!/bin/bash
# run_d2.sh -- one device call for the pipelined sm_90a scorers (v2, v3):
# GPU tests with the default scorer and under FP4IDX_CUDA_SCORER=v2/v3, the
# s7 bench of v1/v2/v3 (hot + cold, bit-checked against the CPU backend),
# the daemon end to end under v2, compute-sanitizer on v2. Build here into
# build-D2, copy the binaries + bundled libs into build-D2x (carried):
#   mkdir -p build-D2x/{tests,bench,daemon,client}; cp ... ;
#   /work/shared/device/bundle-libs.sh build-D2x/devlib build-D2x/*/*
# Steps run in priority order and are skipped when the time budget
# (BUDGET seconds, default 380) would run out. Logs: $OUT/d2logs.tgz;
# bench CSV: $OUT/bench.csv; the summary ($OUT/summary.txt) is printed last.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/d2}
W=$(mktemp -d)  # logs here, then one tarball into $OUT (few files come back)
L=$W/logs
mkdir -p "$L" "$OUT"
B=build-D2x
BUDGET=${BUDGET:-380}
export LD_LIBRARY_PATH=$PWD/$B/devlib FP4IDX_GOLDEN_DIR=$PWD/tests/golden
sum=$L/summary.txt
: > "$sum"
left() { echo $((BUDGET - SECONDS)); }
# step NAME NEED_S TIMEOUT_S CMD... : runs CMD if NEED_S seconds remain.
step() {
  local name=$1 need=$2 to=$3; shift 3
  if [ "$(left)" -lt "$need" ]; then echo "$name: skipped (time)" | tee -a "$sum"; return; fi
  [ "$to" -gt "$(left)" ] && to=$(left)
  local t0=$SECONDS
  timeout "$to" "$@" > "$L/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)" >> "$sum"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > "$L/info.log" 2>&1

step tests_default 60 120 $B/tests/test_cuda -j8 --verbose
step bench 40 120 env -u FP4IDX_CUDA_SCORER $B/bench/fp4idx-bench-cuda --check --scorers v1,v2,v3 --csv "$OUT/bench.csv"
step tests_v2 50 100 env FP4IDX_CUDA_SCORER=v2 $B/tests/test_cuda -j8 --verbose
step e2e_v2 25 60 env FP4IDX_CUDA_SCORER=v2 B=$B OUT=$L/e2e bash kernels/cuda/e2e_daemon.sh cpu cuda
step memcheck_v2 30 70 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_cuda -j1 --filter='cuda_scorer/v2_golden'
step racecheck_v2 30 70 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_cuda -j1 --filter='cuda_scorer/v2_golden'
step tests_v3 45 100 env FP4IDX_CUDA_SCORER=v3 $B/tests/test_cuda -j8 --verbose
step memcheck_v3 25 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/test_cuda -j1 --filter='cuda_scorer/v3_golden'

{
  echo "== $(cat "$L/info.log")"
  for f in tests_default tests_v2 tests_v3; do
    [ -f "$L/$f.log" ] && echo "$f: $(grep -h 'Synthesis' "$L/$f.log" | tail -1)" &&
      grep -hE '\[FAIL\]|differ|Crash' "$L/$f.log" | grep -v Synthesis | head -6
  done
  for f in memcheck_v2 racecheck_v2 memcheck_v3; do
    [ -f "$L/$f.log" ] && echo "$f: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$L/$f.log" | tr '\n' ' ') $(grep -h Synthesis "$L/$f.log" | tail -1)"
  done
  [ -f "$L/e2e_v2.log" ] && grep -hE 'differ|DIFFERS|e2e rc' "$L/e2e_v2.log" | sort | uniq -c | head -12
  [ -f "$L/bench.log" ] && grep -E '^check|^\|' "$L/bench.log"
} >> "$sum"
tar czf "$OUT/d2logs.tgz" -C "$W" logs
cp "$sum" "$OUT/summary.txt"
cat "$sum"
