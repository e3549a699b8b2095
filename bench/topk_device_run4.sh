#!/bin/bash
# topk_device_run4.sh -- issue 17 round 4, device call 2 (bench/RESULTS.md,
# "Round 4"): GPU tests of this branch, main's and this branch's top-k
# bench in one run, cluster sizes, compute-sanitizer memcheck and
# racecheck, ncu of the new cluster_kernel. Run from a folder holding bin/
# (test_cuda_topk, test_cuda, fp4idx-bench-cuda), base/ (main's
# fp4idx-bench-cuda) and lib/, inside the repository. Logs in /tmp/l, packed
# into $OUT/logs.tgz after every stage (a stop at the time limit keeps them).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib FP4IDX_GOLDEN_DIR=$PWD/../tests/golden
L=/tmp/l; mkdir -p $L; pack() { tar czf $OUT/logs.tgz -C /tmp l; }
nvidia-smi -L
B=bin/fp4idx-bench-cuda
echo "== test_cuda_topk"; timeout 90 bin/test_cuda_topk -j4 --verbose > $L/t_topk.log 2>&1; echo "rc $?"; grep -E "Synthesis|FAIL|Assert" $L/t_topk.log | head -12; grep -c PASS $L/t_topk.log
echo "== test_cuda filters"; for f in 'cuda_random/*' 'cuda_batch/*' 'cuda_graph/*'; do timeout 30 bin/test_cuda -j4 --filter "$f" >> $L/t_cuda.log 2>&1; echo "$f rc $?"; done; grep -E "Synthesis|FAIL" $L/t_cuda.log; pack
echo "== bench main"; timeout 40 base/fp4idx-bench-cuda --topk --check --csv $L/base_topk.csv > $L/b_base.log 2>&1; echo "rc $?"
echo "== bench topk4"; timeout 40 $B --topk --check --csv $L/new_topk.csv > $L/b_new.log 2>&1; echo "rc $?"; pack
grep -E "^\|" $L/b_base.log | tail -10 | cut -d'|' -f2,4,6,9,12; grep -E "^\|" $L/b_new.log | tail -10 | cut -d'|' -f2,4,6,9,11,12,13; grep -c bit-exact $L/b_new.log $L/b_base.log; grep -E "MISMATCH|cluster" $L/b_new.log | cut -c1-40
echo "== cluster sizes"; for cm in 4 8; do timeout 12 $B --topk --only r4_ctx65536 --cluster-max $cm >> $L/b_sizes.log 2>&1; done; grep -E "k=" $L/b_sizes.log | cut -c1-78; pack
echo "== memcheck"; timeout 45 compute-sanitizer --tool memcheck bin/test_cuda_topk -j1 --filter 'cuda_topk/cluster_select_edges' > $L/san.log 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|Synthesis" $L/san.log; pack
echo "== racecheck"; timeout 50 compute-sanitizer --tool racecheck bin/test_cuda_topk -j1 --filter 'cuda_topk/nan_never_returned_negative_zero_ties' >> $L/san.log 2>&1; echo "rc $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Synthesis" $L/san.log | tail -2; pack
echo "== ncu"; M=gpu__time_duration.sum,sm__cycles_active.avg,launch__grid_size,launch__cluster_dim_x
for c in r4_ctx65536 s32_r4; do timeout 15 ncu --clock-control none --metrics $M -k regex:cluster_kernel -c 1 --kill yes $B --topk --only $c > $L/ncu_$c.log 2>&1; grep -E 'gpu__time_duration|cluster_dim|grid_size' $L/ncu_$c.log | awk -v c=$c '{printf "%s %s %s; ", c, $1, $NF} END {print ""}'; done; pack
timeout 25 ncu --clock-control none --set full -k regex:cluster_kernel -c 1 --kill yes -o /tmp/v2 $B --topk --only r4_ctx65536 > /dev/null 2>&1
ncu -i /tmp/v2.ncu-rep --page details > $L/v2_details.txt 2>&1; ncu -i /tmp/v2.ncu-rep --page source --csv --print-source sass > $L/v2_sass.csv 2>&1; pack
grep -E "Duration|Warp Cycles Per Issued|Achieved Occ" $L/v2_details.txt | head -4
