#!/bin/bash
# topk_device_run4a.sh -- issue 17 round 4, device call 1 (bench/RESULTS.md,
# "Round 4"): why the cluster path costs ~110 us with 16-block clusters.
# The probe of cluster launch costs, main's top-k table, the cluster path at
# forced cluster sizes, and ncu (full set) of cluster_kernel at 16 and 2
# blocks per cluster. Run from a folder holding bin/ (fp4idx-bench-cuda,
# fp4idx-probe-topk-cluster) and lib/; logs under $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib
nvidia-smi -L
B=bin/fp4idx-bench-cuda
echo "== probe"; timeout 40 bin/fp4idx-probe-topk-cluster > $OUT/probe.log 2>&1; echo "rc $?"; cat $OUT/probe.log
echo "== main bench"; timeout 50 $B --topk --check --csv $OUT/main_topk.csv > $OUT/main.log 2>&1; echo "rc $?"; grep -E "^\|" $OUT/main.log | tail -10
echo "== cluster sizes"
for cm in 2 4 8 16; do timeout 20 $B --topk --only r4_ctx65536 --cluster-max $cm >> $OUT/sizes.log 2>&1; done
timeout 20 $B --topk --only r4_ctx400000 --cluster-max 16 >> $OUT/sizes.log 2>&1
for cm in 1 2 4; do timeout 20 $B --topk --only s16_r4 --cluster-max $cm >> $OUT/sizes.log 2>&1; done
for cm in 1 2; do timeout 20 $B --topk --only s32_r4 --cluster-max $cm >> $OUT/sizes.log 2>&1; done
grep -E "k=" $OUT/sizes.log | cut -c1-80
echo "== ncu"
N="ncu --clock-control none"
timeout 40 $N --set full -k regex:cluster_kernel -c 1 --kill yes -o $OUT/cl16 $B --topk --only r4_ctx65536 --cluster-max 16 > $OUT/ncu16.log 2>&1; echo "rc $?"
timeout 40 $N --set full -k regex:cluster_kernel -c 1 --kill yes -o $OUT/cl2 $B --topk --only s32_r4 --cluster-max 2 > $OUT/ncu2.log 2>&1; echo "rc $?"
for r in cl16 cl2; do
  ncu -i $OUT/$r.ncu-rep --page details > $OUT/${r}_details.txt 2>&1
  ncu -i $OUT/$r.ncu-rep --page source --csv --print-source sass > $OUT/${r}_sass.csv 2>&1 || ncu -i $OUT/$r.ncu-rep --page source --csv > $OUT/${r}_sass.csv 2>&1
  grep -E "Duration|Cluster|Elapsed Cycles|SM Active|Achieved Occupancy|Registers|Shared Memory|Waves|Block Limit|Stall|Warp Cycles|Issued" $OUT/${r}_details.txt | head -60
done
cd $OUT && tar czf ncu.tgz *_details.txt *_sass.csv ncu*.log && rm -f *_sass.csv && ls -la
