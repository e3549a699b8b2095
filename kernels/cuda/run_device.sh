#!/bin/bash
# run_device.sh [tests|bench|sanitize|all]... -- what the CUDA backend runs on
# the lent GPU machine (build here into build-D, bundle libs into
# build-D/devlib, carry build-D). Logs go to $OUT (or /tmp).
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp}
export LD_LIBRARY_PATH=$PWD/build-D/devlib FP4IDX_GOLDEN_DIR=$PWD/tests/golden
B=build-D
for what in "$@"; do
  case $what in
  info)
    pwd; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader ;;
  tests)
    set -o pipefail
    timeout 400 $B/tests/test_cuda -j1 --verbose 2>&1 | tee $OUT/test_cuda.log | grep -E "FAIL|Skip|Synthesis|error|differ" | head -60
    echo "test_cuda rc=$?"
    sh tests/sass_check.sh $B/kernels/cuda/CMakeFiles/fp4idx_cuda_score_obj.dir/score*.cu.o 2>&1 | tee $OUT/sass_check.log ;;
  bench)
    timeout 300 $B/bench/fp4idx-bench-cuda --check --csv $OUT/bench.csv 2>&1 | tee $OUT/bench.log ;;
  benchold)
    FP4IDX_CUDA_MMASYNC=1 timeout 200 $B/bench/fp4idx-bench-cuda --csv $OUT/bench_mmasync.csv 2>&1 | tee $OUT/bench_mmasync.log | tail -7 ;;
  testsold)
    FP4IDX_CUDA_MMASYNC=1 timeout 400 $B/tests/test_cuda -j1 2>&1 | tail -3 ;;
  benchfast)
    timeout 200 $B/bench/fp4idx-bench-cuda --csv $OUT/bench.csv 2>&1 | tee $OUT/bench.log ;;
  variants)
    timeout 200 $B/bench/fp4idx-bench-cuda --variants --case 2 --case 3 2>&1 | tee $OUT/variants.log ;;
  ncu)
    timeout 200 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
      -k regex:score_kernel -c 1 $B/bench/fp4idx-bench-cuda --case 2 > $OUT/ncu.log 2>&1
    echo "ncu rc=$?"; grep -E "Stall|Throughput|Pipe|Occupancy|Warp Cycles|Issued|Bank|Eligible|Active Warps" $OUT/ncu.log | head -60 ;;
  ncufull)
    for c in 0 2; do
      timeout 250 ncu --clock-control none --set full --import-source yes -k regex:score_sm90 -c 1 \
        $B/bench/fp4idx-bench-cuda --case $c > $OUT/ncufull_$c.log 2>&1
      echo "ncu case $c rc=$?"
      grep -E "Duration|Elapsed Cycles|Issue Slots Busy|Executed Ipc A|Theoretical Occ|Achieved Occ|Registers Per|Stall|stall|Tensor|pipe|Pipe" $OUT/ncufull_$c.log | head -40
    done ;;
  stalls)
    timeout 200 ncu --clock-control none --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum" \
      -k regex:score -c 1 $B/bench/fp4idx-bench-cuda --case 2 > $OUT/stalls.log 2>&1
    echo "ncu rc=$?"; grep -E "ratio|sum|pct" $OUT/stalls.log | awk '$NF+0 > 0.05 || /sum|pct/' | head -40 ;;
  race)
    timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/test_cuda -j1 --filter='cuda_*/g*' > $OUT/san_race.log 2>&1
    echo "racecheck rc=$?"; grep -hE "RACECHECK SUMMARY|Synthesis" $OUT/san_race.log ;;
  e2e)
    B=$B OUT=$OUT/e2e bash kernels/cuda/e2e_daemon.sh cpu cuda 2>&1 | tee $OUT/e2e.log ;;
  sanitize)
    for spec in "memcheck:cuda_*/g*" "memcheck:cuda_random/dyadic_h32" "racecheck:cuda_*/g*"; do
      tool=${spec%%:*}; filt=${spec#*:}; tag=$tool_$(echo "$filt" | tr -c 'a-z0-9\n' '_')
      timeout 250 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/test_cuda -j1 \
        --filter="$filt" > "$OUT/san_${tool}_$(echo "$filt" | tr -c 'a-z0-9' '_').log" 2>&1
      echo "sanitizer $tool [$filt] rc=$?"
      grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|Synthesis" "$OUT/san_${tool}_$(echo "$filt" | tr -c 'a-z0-9' '_').log"
    done ;;
  esac
done
