#!/bin/bash
# device_run.sh STEP... -- what the CUDA backend runs on the lent GPU machine
# (bench/RESULTS.md says how it was used). Binaries come from $BIN (default
# bin: test_cuda, fp4idx-bench-cuda, fp4idxd, fp4idx-cli and, for the
# baseline, fp4idx-bench-cuda-base built from the previous commit), their
# libraries from $LIB (default lib; /work/shared/device/bundle-libs.sh
# fills it), the golden files from $FP4IDX_GOLDEN_DIR. Each step's full log
# goes to $LOGS (default $OUT or /tmp); the summary lines are printed.
#   tests     GPU tests (Criterion synthesis)
#   bench     fp4idx-bench-cuda --check, baseline then new, one CSV
#   e2e       the daemon end to end, cuda vs cpu (tests/e2e_daemon.sh)
#   sanitize  compute-sanitizer memcheck + racecheck on the golden tests
#   ncu       Nsight Compute on case 2 (400k keys) and case 4 (32 sequences)
cd "$(dirname "$0")/.." || exit 1
BIN=${BIN:-bin} LIB=${LIB:-lib}
LOGS=${LOGS:-${OUT:-/tmp}}
export LD_LIBRARY_PATH=$PWD/$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FP4IDX_GOLDEN_DIR=${FP4IDX_GOLDEN_DIR:-$PWD/tests/golden}
mkdir -p "$LOGS"
for what in "$@"; do
  case $what in
  tests)
    timeout 300 "$BIN/test_cuda" -j4 > "$LOGS/test_cuda.log" 2>&1
    echo "test_cuda rc=$?: $(grep -h Synthesis "$LOGS/test_cuda.log" | tail -1)"
    grep -hE "\[FAIL\]|differ|Crash|Skip" "$LOGS/test_cuda.log" | head -12 ;;
  bench)
    : > "$LOGS/bench.log"
    [ -x "$BIN/fp4idx-bench-cuda-base" ] &&
      timeout 150 "$BIN/fp4idx-bench-cuda-base" --check --label base --csv "$LOGS/bench_base.csv" \
        >> "$LOGS/bench.log" 2>&1
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
    for c in 2 4; do
      timeout 150 ncu --clock-control none --set full -k regex:score -c 1 \
        "$BIN/fp4idx-bench-cuda" --case $c > "$LOGS/ncu_$c.log" 2>&1
      echo "ncu case $c rc=$?"
      grep -E "Duration|Issue Slots Busy|Achieved Occ|Registers Per|Tensor|Eligible Warps|No Eligible" "$LOGS/ncu_$c.log" | head -14
    done ;;
  *) echo "device_run.sh: unknown step $what"; exit 2 ;;
  esac
done
