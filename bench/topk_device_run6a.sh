#!/bin/bash
# topk_device_run6a.sh -- issue 17 round 6, device call 1 (bench/RESULTS.md,
# "Round 6"): the phase timeline (`fp4idx-bench-cuda --topk --phases`) of
# main's kernel (m0/) and of the variants (v1/ ...), and `--topk --check` of
# the variants. Run from a folder holding pkg.tgz (one folder per binary
# set) and lib/, inside the repository. Logs in /tmp/l, packed into
# $OUT/logs.tgz after every stage (a stop at the time limit keeps them).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib FP4IDX_GOLDEN_DIR=$PWD/../tests/golden
L=/tmp/l; mkdir -p $L; pack() { tar czf $OUT/logs.tgz -C /tmp l; }
tar xzf pkg.tgz; nvidia-smi -L; date -u
sets=$(ls -d m0 v* 2>/dev/null)
for v in $sets; do
  echo "== phases $v"; timeout 40 $v/fp4idx-bench-cuda --topk --phases > $L/p_$v.log 2>&1; echo "rc $?"; pack
done
for v in $sets; do
  [ "$v" = m0 ] && continue
  echo "== bench $v"; timeout 35 $v/fp4idx-bench-cuda --topk --check --csv $L/$v.csv > $L/b_$v.log 2>&1; echo "rc $?"; pack
done
for v in $sets; do echo "-- $v"; grep -E "^\|" $L/b_$v.log 2>/dev/null | tail -10 | cut -d"|" -f2,3,4,6,9; grep -c bit-exact $L/b_$v.log 2>/dev/null; grep MISMATCH $L/b_$v.log 2>/dev/null | head -3; done
for v in $sets; do echo "-- phases $v"; grep -E "^phases|span|TOTAL" $L/p_$v.log | head -40; done
