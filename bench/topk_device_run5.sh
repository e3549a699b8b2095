#!/bin/bash
# topk_device_run5.sh -- issue 17 round 5, the one device call (bench/RESULTS.md,
# "Round 5"): GPU tests of v2 (branch topk5-owner's head, 6e0fe55) and v1
# (1ef593f), and the top-k bench of main (base/, built from 5849d68), v1
# and v2 in one run. Run from a folder holding pkg.tgz (base/, v1/, v2/:
# fp4idx-bench-cuda and test_cuda_topk each) and lib/,
# inside the repository. Logs in /tmp/l, packed into $OUT/logs.tgz after
# every stage (a stop at the time limit keeps them). No sanitizers (no time).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib FP4IDX_GOLDEN_DIR=$PWD/../tests/golden
L=/tmp/l; mkdir -p $L; pack() { tar czf $OUT/logs.tgz -C /tmp l; }
tar xzf pkg.tgz; nvidia-smi -L; date -u
echo "== test_cuda_topk v2"; timeout 80 v2/test_cuda_topk -j4 --verbose > $L/t_v2.log 2>&1; echo "rc $?"; grep -E "Synthesis|FAIL|Assert" $L/t_v2.log | head -12; pack
for v in base v1 v2; do
  echo "== bench $v"; timeout 30 $v/fp4idx-bench-cuda --topk --check --csv $L/$v.csv > $L/b_$v.log 2>&1; echo "rc $?"; pack
done
for v in base v1 v2; do echo "-- $v"; grep -E "^\|" $L/b_$v.log | tail -10 | cut -d"|" -f2,3,4,6,9,11,13; grep -c bit-exact $L/b_$v.log; grep -E "MISMATCH" $L/b_$v.log | head -3; done
echo "== test_cuda_topk v1"; timeout 45 v1/test_cuda_topk -j4 --verbose > $L/t_v1.log 2>&1; echo "rc $?"; grep -E "Synthesis|FAIL|Assert" $L/t_v1.log | head -12; pack
