#!/bin/bash
# device round 9 (prepared 2026-12-08, not run): branch client-spin (the automatic busy poll,
# the reply region, the daemon's one copy into it) beside main; run with client-spin checked
# out (the Python arm takes client/python of the working tree). MIN=1: the GPU test and one
# alternation only. Then the Python client, a perf profile at 32 clients, the batching policies.
set -u
REPO=$PWD; cd .dev && tar xJf h.tar.xz || exit 1
export LD_LIBRARY_PATH=$PWD/h/lib
L=/tmp/rl9/logs; rm -rf $L; mkdir -p $L; S=$L/summary.txt
snap() { (cd /tmp/rl9 && tar czf $OUT/r9.tgz logs); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $S
export FP4IDX_GOLDEN_DIR=$REPO/tests/golden
FP4IDXD=$PWD/rr/fp4idxd timeout 120 rr/test_cuda_regions --jobs 2 > $L/t.log 2>&1
echo "test_cuda_regions rc=$? $(grep -a Synthesis $L/t.log | tail -1)" >> $S
snap
ARGS="--backend cuda --local cuda --cache-bytes 24G -r 3 -n 500 -w 50 --sections ace -b 20 --ctx 16384,400000 --topk 2048 --region-ctx 400000"
[ "${MIN:-0}" = 1 ] || ARGS="$ARGS --sections acde --clients 1,32,64 --conc-ctx 32768 --conc-topk 512 --conc-calls 30"
one() { # name daemon bench [extra args]
  timeout 100 $3 -d $2 $ARGS ${4:-} > $L/$1.log 2>&1
  echo "== $1 rc=$?" >> $S
  grep -a -E '^    (score_logits|info) ' $L/$1.log | head -2 >> $S
  grep -a -E '^    (16384|400000) +2048' $L/$1.log >> $S
  grep -a -E '^    (1|32|64) +[0-9]+ ' $L/$1.log >> $S
  grep -a -E '^    top-2048 ' $L/$1.log >> $S
  snap
}
for run in 1 2 3; do
  one main.$run $PWD/h/new/fp4idxd $PWD/h/new/fp4idx-bench-socket
  one rr.$run $PWD/rr/fp4idxd $PWD/rr/fp4idx-bench-socket
  [ "${MIN:-0}" = 1 ] || one rr_noregion.$run $PWD/rr/fp4idxd $PWD/rr/fp4idx-bench-socket "--reply-region 0"
  [ "${MIN:-0}" = 1 ] || one rr_spin50.$run $PWD/rr/fp4idxd $PWD/rr/fp4idx-bench-socket "--client-busy-poll 50"
  [ "${MIN:-0}" = 1 ] && [ $run = 1 ] && break
done
[ "${MIN:-0}" = 1 ] && { snap; cat $S; exit 0; }
D=$PWD/h/new/fp4idxd
C=$PWD/rr/fp4idx-bench-socket
# the Python client, main's package and the working tree's, against one CUDA daemon (the branch's)
$PWD/rr/fp4idxd --backend cuda --socket /tmp/p9.sock --cache-bytes 8G > $L/pyd.log 2>&1 &
DP=$!
for i in $(seq 100); do [ -S /tmp/p9.sock ] && break; sleep 0.1; done
cd $REPO
for run in 1 2; do for w in old new; do
  timeout 120 python3 .dev/pyrt.py /tmp/p9.sock $w >> $L/py.txt 2>&1
done; done
kill $DP; wait $DP
cat $L/py.txt >> $S
cd $REPO/.dev
snap
# daemon settings and batching policies at 32 / 64 clients (the new client),
# alternated: main's daemon with options, the experiment daemon (.dev/eb:
# main + env switches X_COLLECT_FIRST, X_NODIRECT; X_BATCH_LOG prints runs)
E=$REPO/.dev/eb/fp4idxd
mk() { printf '#!/bin/sh\nexec %s "%s" %s "$@"\n' "$3" "$2" "$4" > /tmp/d_$1; chmod +x /tmp/d_$1; }
mk base env $D ""
mk bp50 env $D "--busy-poll-us 50"
mk io2 env $D "--io-threads 2"
mk xbase "env X_BATCH_LOG=1" $E ""
mk xcollect "env X_BATCH_LOG=1 X_COLLECT_FIRST=1" $E ""
mk xnodirect "env X_BATCH_LOG=1 X_NODIRECT=1" $E ""
for run in 1 2; do for n in xbase xcollect xnodirect; do for c in 32 64; do
  timeout 100 $C -d /tmp/d_$n --backend cuda --local cuda --cache-bytes 24G -r 3 --sections d --clients $c --conc-ctx 32768 --conc-topk 512 --conc-calls 30 > $L/d_$n.$c.$run.log 2>&1
  echo "== daemon $n clients $c run $run rc=$? $(grep -a 'X worker' $L/d_$n.$c.$run.log | tail -1)" >> $S
  grep -a -E '^    (32|64) +[0-9]+ ' $L/d_$n.$c.$run.log >> $S
done; done; done
snap
# where the daemon's CPU goes at 32 clients (perf, where the machine has it)
cd $REPO/.dev
if command -v perf > /dev/null; then
  $D --backend cuda --socket /tmp/p8.sock --cache-bytes 24G > $L/perfd.log 2>&1 &
  DP=$!
  for i in $(seq 100); do [ -S /tmp/p8.sock ] && break; sleep 0.1; done
  timeout 120 $C -s /tmp/p8.sock --sections d --clients 32 --conc-calls 3000 -r 3 --local none > $L/perfb.log 2>&1 &
  BP=$!
  sleep 1.5
  timeout 30 perf record -g -p $DP -o $L/perf.data -- sleep 4 > $L/perfrec.log 2>&1
  wait $BP
  kill $DP; wait $DP
  perf report -i $L/perf.data --stdio --no-children --sort comm,dso,sym 2>/dev/null | grep -v '^$' | head -300 > $L/perf.txt
  perf report -i $L/perf.data --stdio --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' | head -20 >> $S
  grep -a -E '^    32 ' $L/perfb.log >> $S
  rm -f $L/perf.data
elif command -v cuda-gdb > /dev/null; then
  # no perf (nor gdb) on these machines: the daemon's thread stacks sampled by
  # cuda-gdb attaching (it debugs host code too), a poor man's profiler
  $PWD/rr/fp4idxd --backend cuda --socket /tmp/p8.sock --cache-bytes 24G > $L/perfd.log 2>&1 &
  DP=$!
  for i in $(seq 100); do [ -S /tmp/p8.sock ] && break; sleep 0.1; done
  timeout 120 $C -s /tmp/p8.sock --sections d --clients 32 --conc-calls 3000 -r 3 --local none > $L/perfb.log 2>&1 &
  BP=$!
  sleep 1.5
  for i in $(seq 20); do
    timeout 10 cuda-gdb -p $DP -batch -ex "thread apply all bt 12" >> $L/gdb.txt 2>/dev/null
  done
  wait $BP
  kill $DP; wait $DP
  echo "no perf; cuda-gdb samples in gdb.txt: $(grep -c '^Thread' $L/gdb.txt) thread stacks" >> $S
else
  echo "no perf, no cuda-gdb" >> $S
fi
snap; cat $S
