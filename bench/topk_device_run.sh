#!/bin/bash
# topk_device_run.sh -- issue 17 round 3's device call (bench/RESULTS.md,
# "Round 3"): GPU tests, main's and this branch's top-k bench in one run,
# bench variants, ncu per kernel, the daemon's stats, sanitizers last (a
# sanitizer stopped by its timeout can leave its child on the GPU).
# Run from a folder holding bin/ (this branch's test_cuda_topk, test_cuda,
# fp4idx-bench-cuda, fp4idxd, fp4idx-cli, topk_daemon.sh), base/ (main's
# fp4idx-bench-cuda) and lib/ (shared/device/bundle-libs.sh), inside the
# repository (tests/golden one level up); logs under $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib FP4IDX_GOLDEN_DIR=$PWD/../tests/golden
nvidia-smi -L
echo "== test_cuda_topk (topk3)"; timeout 120 bin/test_cuda_topk -j1 > $OUT/t_topk.log 2>&1; echo "rc $?"; grep -E "Synthesis|FAIL|fail" $OUT/t_topk.log | head -20
echo "== test_cuda filters"; for f in 'cuda_random/*' 'cuda_batch/*' 'cuda_graph/*'; do timeout 40 bin/test_cuda -j1 --filter "$f" >> $OUT/t_cuda.log 2>&1; echo "$f rc $?"; done; grep -E "Synthesis|FAIL" $OUT/t_cuda.log
echo "== bench main"; timeout 40 base/fp4idx-bench-cuda --topk --check --csv $OUT/base_topk.csv > $OUT/b_base.log 2>&1; echo "rc $?"
echo "== bench topk3"; timeout 40 bin/fp4idx-bench-cuda --topk --check --csv $OUT/new_topk.csv > $OUT/b_new.log 2>&1; echo "rc $?"
grep -E "^\|" $OUT/b_base.log | tail -10; grep -E "^\|" $OUT/b_new.log | tail -10; grep -c bit-exact $OUT/b_new.log $OUT/b_base.log; grep MISMATCH $OUT/b_new.log
echo "== variants"; timeout 20 bin/fp4idx-bench-cuda --topk --path chunked --only s32 > $OUT/b_var.log 2>&1
for cap in 0 2048; do timeout 25 bin/fp4idx-bench-cuda --topk --only r4_ctx --bucket-cap $cap > $OUT/b_cap$cap.log 2>&1; done
grep -hE "k=" $OUT/b_var.log $OUT/b_cap*.log | cut -c1-70
M=gpu__time_duration.sum,sm__cycles_active.avg,launch__grid_size
for c in r4_ctx65536 r4_ctx400000 s16_r4_ctx9295; do
  timeout 20 ncu --clock-control none --metrics $M -k "regex:hist_kernel|compact_kernel|rank_kernel|finish_kernel" -c 4 --kill yes --csv bin/fp4idx-bench-cuda --topk --only $c --path chunked > $OUT/ncu_$c.csv 2>/dev/null
  echo "ncu $c:"; python3 -c "
import csv
rows=[r for r in csv.reader(open('$OUT/ncu_$c.csv')) if len(r)>10]
h=rows[0]; ki=h.index('Kernel Name'); mi=h.index('Metric Name'); vi=h.index('Metric Value'); ii=h.index('ID')
d={}
for r in rows[1:]: d.setdefault(int(r[ii]),[r[ki][11:24],{}])[1][r[mi]]=r[vi]
for i,(k,m) in sorted(d.items()): print(' ',k,m.get('gpu__time_duration.sum'),'ns grid',m.get('launch__grid_size'))
" 2>&1 | head -5
done
echo "== daemon"; timeout 40 bash bin/topk_daemon.sh bin 400000 2048 20 > $OUT/daemon.log 2>&1; echo "rc $?"; grep -iE -A3 "score" $OUT/daemon.log | head -8
echo "== memcheck"; timeout 40 compute-sanitizer --tool memcheck bin/test_cuda_topk -j1 --filter 'cuda_topk/rank_finish_bucket_edges' > $OUT/san.log 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|Synthesis" $OUT/san.log
echo "== racecheck"; timeout 120 compute-sanitizer --tool racecheck bin/test_cuda_topk -j1 --filter 'cuda_topk/invisible_rows_and_lens_below_k' >> $OUT/san.log 2>&1; echo "rc $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Synthesis" $OUT/san.log | tail -2
cd $OUT && tar czf logs.tgz *.log *.csv && rm -f ncu_*.csv && ls
