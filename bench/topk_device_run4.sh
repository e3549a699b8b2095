#!/bin/bash
# topk_device_run4.sh -- issue 17 round 4, device call 2 (bench/RESULTS.md,
# "Round 4"): GPU tests of this branch, main's and this branch's top-k
# bench in one run, cluster sizes, ncu of the new cluster_kernel, then
# compute-sanitizer memcheck and racecheck (last: a sanitizer stopped by its
# timeout can leave its child on the GPU). Run from a folder holding bin/
# (test_cuda_topk, test_cuda, fp4idx-bench-cuda), base/ (main's
# fp4idx-bench-cuda) and lib/, inside the repository; logs under $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib FP4IDX_GOLDEN_DIR=$PWD/../tests/golden
nvidia-smi -L
B=bin/fp4idx-bench-cuda
echo "== test_cuda_topk"; timeout 100 bin/test_cuda_topk -j4 > $OUT/t_topk.log 2>&1; echo "rc $?"; grep -E "Synthesis|FAIL|fail|Assert" $OUT/t_topk.log | head -12
echo "== test_cuda filters"; for f in 'cuda_random/*' 'cuda_batch/*' 'cuda_graph/*'; do timeout 30 bin/test_cuda -j4 --filter "$f" >> $OUT/t_cuda.log 2>&1; echo "$f rc $?"; done; grep -E "Synthesis|FAIL" $OUT/t_cuda.log
echo "== bench main"; timeout 45 base/fp4idx-bench-cuda --topk --check --csv $OUT/base_topk.csv > $OUT/b_base.log 2>&1; echo "rc $?"
echo "== bench topk4"; timeout 45 $B --topk --check --csv $OUT/new_topk.csv > $OUT/b_new.log 2>&1; echo "rc $?"
grep -E "^\|" $OUT/b_base.log | tail -10 | cut -d'|' -f2,4,5,6,9,12; grep -E "^\|" $OUT/b_new.log | tail -10 | cut -d'|' -f2,4,6,9,11,12,13; grep -c bit-exact $OUT/b_new.log $OUT/b_base.log; grep MISMATCH $OUT/b_new.log
echo "== cluster sizes"; for cm in 4 8; do timeout 12 $B --topk --only r4_ctx65536 --cluster-max $cm >> $OUT/b_sizes.log 2>&1; done
timeout 12 $B --topk --only s16_r4 --cluster-max 1 >> $OUT/b_sizes.log 2>&1; grep -E "k=" $OUT/b_sizes.log | cut -c1-78
echo "== ncu"; M=gpu__time_duration.sum,sm__cycles_active.avg,launch__grid_size,launch__cluster_dim_x
for c in r4_ctx65536 r4_ctx400000 s32_r4 s16_r4; do timeout 15 ncu --clock-control none --metrics $M -k regex:cluster_kernel -c 2 --kill yes $B --topk --only $c > $OUT/ncu_$c.log 2>&1; echo "$c: $(grep -E 'gpu__time_duration|cluster_dim' $OUT/ncu_$c.log | head -2 | awk '{print $NF}' | tr '\n' ' ')"; done
timeout 25 ncu --clock-control none --set full -k regex:cluster_kernel -c 1 --kill yes -o $OUT/v2_65536 $B --topk --only r4_ctx65536 > /dev/null 2>&1
ncu -i $OUT/v2_65536.ncu-rep --page details > $OUT/v2_details.txt 2>&1; ncu -i $OUT/v2_65536.ncu-rep --page source --csv --print-source sass > $OUT/v2_sass.csv 2>&1
grep -E "Duration|Warp Cycles Per Issued|Issued Ipc|Achieved Occ" $OUT/v2_details.txt | head -5
echo "== memcheck"; timeout 50 compute-sanitizer --tool memcheck bin/test_cuda_topk -j1 --filter 'cuda_topk/cluster_select_edges' > $OUT/san.log 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|Synthesis" $OUT/san.log
echo "== racecheck"; timeout 60 compute-sanitizer --tool racecheck bin/test_cuda_topk -j1 --filter 'cuda_topk/nan_never_returned_negative_zero_ties' >> $OUT/san.log 2>&1; echo "rc $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Synthesis" $OUT/san.log | tail -2
cd $OUT && tar czf logs.tgz *.log *.csv *.txt && rm -f ncu_*.log v2_sass.csv && ls
