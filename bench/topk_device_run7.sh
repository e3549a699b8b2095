#!/bin/bash
# topk_device_run7.sh -- issue 17 round 7, the one device call (bench/RESULTS.md,
# "Round 7"): `fp4idx-bench-cuda --topk --check` of main (built from main
# HEAD) and of the variants vE (steps 1 + 3: topk6-next), vF (+ step 4), vG
# (+ step 2) and vH (+ the count from the pass-1 histogram) in the same call;
# test_cuda_topk -j8 of vH, then compute-sanitizer racecheck and memcheck of
# vH on cuda_topk/cluster_small; the phase timelines of main and vH; then, as
# time allows, the tests of vE, vF and vG. Run from a folder holding pkg.tgz
# (main/, vE/ .. vH/:
# fp4idx-bench-cuda and test_cuda_topk) and lib/, inside the repository.
# Logs in /tmp/l, packed into $OUT/logs.tgz after every stage; a stage that
# would not end by LIMIT seconds is skipped (the call's limit is 240 s).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib FP4IDX_GOLDEN_DIR=$PWD/../tests/golden
L=/tmp/l; mkdir -p $L; pack() { tar czf $OUT/logs.tgz -C /tmp l; }
LIMIT=225
left() { [ $((SECONDS + $1)) -le $LIMIT ] || { echo "-- skipped (t=${SECONDS}s): $2"; return 1; }; }
tar xzf pkg.tgz; nvidia-smi -L; date -u
b() { left 30 "bench $1" || return; echo "== bench $1 t=${SECONDS}"; timeout 30 $1/fp4idx-bench-cuda --topk --check --csv $L/$1.csv > $L/b_$1.log 2>&1; echo "rc $?"; pack; }
t() { left $2 "tests $1" || return; echo "== test_cuda_topk $1 t=${SECONDS}"; timeout $2 $1/test_cuda_topk -j8 --verbose > $L/t_$1.log 2>&1; echo "rc $?"; grep -E "Synthesis|FAIL|Assert|rror" $L/t_$1.log | head -8; pack; }
p() { left 25 "phases $1" || return; echo "== phases $1 t=${SECONDS}"; timeout 25 $1/fp4idx-bench-cuda --topk --phases > $L/p_$1.log 2>&1; echo "rc $?"; pack; }
s() { left 60 "$1 vH" || return; echo "== $1 vH cluster_small t=${SECONDS}"; timeout 60 compute-sanitizer --tool $1 vH/test_cuda_topk --filter 'cuda_topk/cluster_small' -j1 > $L/$1_vH.log 2>&1; echo "rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|Synthesis" $L/$1_vH.log | head -6; pack; }
b main; b vH
t vH 60
s racecheck; s memcheck
b vE; b vF; b vG
p main; p vH
t vG 40; t vE 40; t vF 40
for v in main vE vF vG vH; do echo "-- $v $(grep -c bit-exact $L/b_$v.log 2>/dev/null) bit-exact"; grep -E "^\|" $L/b_$v.log 2>/dev/null | tail -10 | cut -d"|" -f2,4,6; grep MISMATCH $L/b_$v.log 2>/dev/null | head -3; done
for v in main vH; do echo "-- phases $v"; grep -E "^phases|span|TOTAL" $L/p_$v.log 2>/dev/null | head -30; done
echo "t=${SECONDS}s"
