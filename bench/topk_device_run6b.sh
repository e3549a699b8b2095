#!/bin/bash
# topk_device_run6b.sh -- issue 17 round 6, device call 2 (bench/RESULTS.md,
# "Round 6"): GPU tests of the variants (vD first: the branch's kernel),
# compute-sanitizer racecheck and memcheck of vD on cuda_topk/cluster_small,
# `fp4idx-bench-cuda --topk --check` of main (built from main HEAD) and
# of every variant in the same call, and vD's phase timeline. Run from a
# folder holding pkg.tgz (main/, vA/ .. vD/: fp4idx-bench-cuda, and
# test_cuda_topk for the tested ones) and lib/, inside the repository.
# Logs in /tmp/l, packed into $OUT/logs.tgz after every stage.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib FP4IDX_GOLDEN_DIR=$PWD/../tests/golden
L=/tmp/l; mkdir -p $L; pack() { tar czf $OUT/logs.tgz -C /tmp l; }
tar xzf pkg.tgz; nvidia-smi -L; date -u
t() { echo "== test_cuda_topk $1"; timeout $2 $1/test_cuda_topk -j4 --verbose > $L/t_$1.log 2>&1; echo "rc $?"; grep -E "Synthesis|FAIL|Assert|rror" $L/t_$1.log | head -8; pack; }
b() { echo "== bench $1"; timeout 30 $1/fp4idx-bench-cuda --topk --check --csv $L/$1.csv > $L/b_$1.log 2>&1; echo "rc $?"; pack; }
t vD 90
b main; b vD
echo "== racecheck vD cluster_small"; timeout 60 compute-sanitizer --tool racecheck vD/test_cuda_topk --filter 'cuda_topk/cluster_small' -j1 > $L/rc_vD.log 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|Synthesis" $L/rc_vD.log | head -6; pack
echo "== memcheck vD cluster_small"; timeout 40 compute-sanitizer --tool memcheck vD/test_cuda_topk --filter 'cuda_topk/cluster_small' -j1 > $L/mc_vD.log 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|Synthesis" $L/mc_vD.log | head -4; pack
b vC; b vB; b vA
echo "== phases vD"; timeout 25 vD/fp4idx-bench-cuda --topk --phases > $L/p_vD.log 2>&1; echo "rc $?"; pack
t vC 45; t vB 45
for v in main vA vB vC vD; do echo "-- $v $(grep -c bit-exact $L/b_$v.log 2>/dev/null) bit-exact"; grep -E "^\|" $L/b_$v.log 2>/dev/null | tail -10 | cut -d"|" -f2,4,6; grep MISMATCH $L/b_$v.log 2>/dev/null | head -3; done
grep -E "^phases|span|TOTAL" $L/p_vD.log | head -30
