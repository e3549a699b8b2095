#!/bin/bash
# device_run.sh STEP... -- what the CUDA backend runs on the lent GPU machine
# (bench/RESULTS.md says how it was used). Binaries come from $BIN (default
# bin: test_cuda, fp4idx-bench-cuda, fp4idxd, fp4idx-cli and, for the
# baseline, fp4idx-bench-cuda-base built from the previous commit), their
# libraries from $LIB (default lib; /work/shared/device/bundle-libs.sh
# fills it), the golden files from $FP4IDX_GOLDEN_DIR. Each step's full log
# goes to $LOGS (default $OUT or /tmp); the summary lines are printed.
#   smoke     one golden scorer test (exit 1 when it fails: stop there)
#   tests     GPU tests (Criterion synthesis)
#   bench     fp4idx-bench-cuda --check: baseline (-base, the previous
#             commit's scorer), an intermediate build (-prev, --label
#             $PREV_LABEL) when present, then this one
#   e2e       the daemon end to end, cuda vs cpu (tests/e2e_daemon.sh)
#   sass      tests/sass_check.sh on the scorer objects in $OBJ (default obj)
#   sanitize  compute-sanitizer memcheck + racecheck on the golden tests
#   ncu       Nsight Compute on case 2 (400k keys), main sections
cd "$(dirname "$0")/.." || exit 1
BIN=${BIN:-bin} LIB=${LIB:-lib}
LOGS=${LOGS:-${OUT:-/tmp}}
export LD_LIBRARY_PATH=$PWD/$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FP4IDX_GOLDEN_DIR=${FP4IDX_GOLDEN_DIR:-$PWD/tests/golden}
mkdir -p "$LOGS"
for what in "$@"; do
  case $what in
  smoke)
    timeout 30 "$BIN/test_cuda" -j1 --filter='cuda_golden/dyadic_h32' > "$LOGS/smoke.log" 2>&1
    rc=$?
    echo "smoke rc=$rc: $(grep -h Synthesis "$LOGS/smoke.log" | tail -1)"
    [ $rc -eq 0 ] || { tail -20 "$LOGS/smoke.log"; exit 1; } ;;
  sass)
    sh tests/sass_check.sh "${OBJ:-obj}"/score*.o > "$LOGS/sass.log" 2>&1
    echo "sass_check rc=$?"; cat "$LOGS/sass.log" ;;
  tests)
    timeout 300 "$BIN/test_cuda" -j8 --verbose > "$LOGS/test_cuda.log" 2>&1
    echo "test_cuda rc=$?: $(grep -h Synthesis "$LOGS/test_cuda.log" | tail -1)"
    grep -hiE "\[FAIL\]|differ|Crash|Skip|bigpool" "$LOGS/test_cuda.log" | head -12 ;;
  bench)
    : > "$LOGS/bench.log"
    [ -x "$BIN/fp4idx-bench-cuda-base" ] &&
      timeout 150 "$BIN/fp4idx-bench-cuda-base" --check --csv "$LOGS/bench_base.csv" \
        >> "$LOGS/bench.log" 2>&1
    [ -x "$BIN/fp4idx-bench-cuda-prev" ] &&
      timeout 150 "$BIN/fp4idx-bench-cuda-prev" --check --label "${PREV_LABEL:-prev}" \
        --csv "$LOGS/bench_prev.csv" >> "$LOGS/bench.log" 2>&1
    timeout 150 "$BIN/fp4idx-bench-cuda" --check --csv "$LOGS/bench_new.csv" >> "$LOGS/bench.log" 2>&1
    echo "bench rc=$?"
    grep -E "^check|^\|" "$LOGS/bench.log" ;;
  e2e)
    timeout 120 bash tests/e2e_daemon.sh "$BIN/fp4idxd" "$BIN/fp4idx-cli" "$FP4IDX_GOLDEN_DIR" \
      /tmp/fp4idx_e2e > "$LOGS/e2e.log" 2>&1
    echo "e2e rc=$?"; grep -E "DIFFERS|differ|skipped|e2e rc" "$LOGS/e2e.log" | sort | uniq -c ;;
  sanitize)
    for tool in memcheck racecheck; do
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/test_cuda" -j1 \
        --filter='cuda_golden/*' > "$LOGS/san_$tool.log" 2>&1
      echo "$tool rc=$?: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/san_$tool.log" | tr '\n' ' ')$(grep -h Synthesis "$LOGS/san_$tool.log" | tail -1)"
    done ;;
  ncu)
    for c in ${NCU_CASES:-2}; do
      timeout 150 ncu --clock-control none --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        -k regex:score -c 1 "$BIN/fp4idx-bench-cuda" --case $c > "$LOGS/ncu_$c.log" 2>&1
      echo "ncu case $c rc=$?"
      grep -E "Duration|Issue Slots Busy|Issued Warp|Achieved Occ|Registers Per|Eligible Warps|No Eligible|Stall|Throughput" "$LOGS/ncu_$c.log" | head -24
    done ;;
  *) echo "device_run.sh: unknown step $what"; exit 2 ;;
  esac
done
