#!/bin/bash
# run_socket.sh -- the request-path measurements on one GPU, for
# docs/RESULTS.md ("Through the socket"): fp4idxd --backend cuda measured through its
# socket by fp4idx-bench-socket, the new build and the previous commit in the
# same run.
#
#   bench/run_socket.sh NEW_DIR [PREV_DIR]
#
# NEW_DIR holds this branch's fp4idxd and fp4idx-bench-socket (PREV_DIR the
# previous commit's fp4idxd, and its fp4idx-bench-socket if present); the
# shared libraries they need on a machine that lacks them, if any, lie in
# $LIB, or DIR/lib or DIR/devlib beside them.
# The new benchmark drives both daemons, so daemon-side changes compare with
# the same client; the previous benchmark (old client library, its own
# cases) runs against the previous daemon when present. Output: the raw
# logs, summary CSVs and samples in $OUT (default /tmp/socket_h200), and a
# table of the issue's cases printed last (p50 us; aggregate requests/s for
# the 32-client case, as % of one in-process launch of all 32).
#
# Cases: (a) 64-key score 4x32 full logits / top-16, info: 2000 calls after
# 200 warm-up, x3 runs; (c) 4x32 rows at 16,384 / 100,000 / 400,000 keys,
# full logits and top-16/512/2048, 30 calls x3 runs, stage breakdown; (d)
# 1/8/32/64 clients, 32,768 keys each, top-512, 50 calls per client x3
# runs, vs one in-process CUDA launch of all N (--local cuda); (e) full
# logits and top-2048 at 400,000 keys through the socket, a host region and
# a CUDA region.
set -u
NEW=${1:?usage: run_socket.sh NEW_DIR [PREV_DIR]}
PREV=${2:-}
OUT=${OUT:-/tmp/socket_h200}
mkdir -p "$OUT"
for d in ${LIB:-} "$NEW/lib" "$NEW/devlib" ${PREV:+"$PREV/lib" "$PREV/devlib"}; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
CACHE=${CACHE:-24G}
BACKEND=${BACKEND:-cuda}   # BACKEND=cpu: the same cases on a machine without a GPU
LOCAL=${LOCAL:-$BACKEND}
ARGS=(--backend "$BACKEND" --local "$LOCAL" --cache-bytes "$CACHE" -r 3
      -n 2000 -w 200 --sections acde -b 30 --region-cuda --region-ctx 400000
      --ctx 16384,100000,400000 --topk 0,16,512,2048
      --clients 1,8,32,64 --conc-ctx 32768 --conc-topk 512 --conc-calls 50)
# EXTRA: more options, after these (later ones win), e.g. a quick smoke run:
#   EXTRA="-n 50 -w 5 -b 2 -r 1 --ctx 4096 --topk 0,2048 --clients 2 --conc-calls 2"
read -r -a EXTRA_A <<< "${EXTRA:-}"
ARGS+=("${EXTRA_A[@]}")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader \
  > "$OUT/gpu.txt" 2>&1 || echo "no GPU ($BACKEND backend)" > "$OUT/gpu.txt"
# NEW_ARGS: daemon options for the new daemon only (e.g. "--io-threads 4"),
# through a wrapper in $OUT that the benchmark spawns; run once per value,
# PREV given once, to compare settings of one build.
run() { # NAME DAEMON_DIR
  local name=$1 dir=$2 daemon=$2/fp4idxd
  if [ "$name" = new ] && [ -n "${NEW_ARGS:-}" ]; then
    daemon=$OUT/fp4idxd-new-args
    printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$(cd "$dir" && pwd)/fp4idxd" "$NEW_ARGS" > "$daemon"
    chmod +x "$daemon"
  fi
  echo "== $name: $daemon ${NEW_ARGS:+($NEW_ARGS)}, bench $NEW/fp4idx-bench-socket" | tee "$OUT/$name.log"
  "$NEW/fp4idx-bench-socket" -d "$daemon" "${ARGS[@]}" --summary "$OUT/$name.summary.csv" \
    --csv "$OUT/$name.samples.csv" >> "$OUT/$name.log" 2>&1
  echo "rc=$?" >> "$OUT/$name.log"
  cat "$OUT/$name.log"
}
[ -n "$PREV" ] && run prev "$PREV"
run new "$NEW"
if [ -n "$PREV" ] && [ -x "$PREV/fp4idx-bench-socket" ]; then
  # the previous client library end to end, its own cases (a) and (c, 100k)
  echo "== prev bench, prev daemon" | tee "$OUT/prev_own.log"
  "$PREV/fp4idx-bench-socket" -d "$PREV/fp4idxd" -n 2000 -w 200 -k 1048576 -b 30 -r 3 \
    >> "$OUT/prev_own.log" 2>&1 || true
  cat "$OUT/prev_own.log"
fi

# The issue's table from the logs and summaries.
pick() { # LOG CASE -> p50 of (a)
  awk -v c="$2" '$1 == c {print $2; exit}' "$1" 2>/dev/null
}
sum() { # CSV SECTION CTX TOPK CLIENTS FIELD
  awk -F, -v s="$2" -v x="$3" -v k="$4" -v n="$5" -v f="$6" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == s && $2 == x && $3 == k && $4 == n { print $col[f]; exit }' "$1" 2>/dev/null
}
{
  echo
  echo "== the request-path cases ($(cat "$OUT/gpu.txt")), p50 us"
  printf "%-52s %12s %12s %10s\n" "case" "previous" "new" "goal"
  for side in prev new; do eval "L_$side=\$OUT/\$side.log S_$side=\$OUT/\$side.summary.csv"; done
  row() { printf "%-52s %12s %12s %10s\n" "$1" "${2:--}" "${3:--}" "$4"; }
  row "info" "$(pick "$L_prev" info)" "$(pick "$L_new" info)" "<= 10"
  row "64-key score, 4x32 rows (full logits)" "$(pick "$L_prev" score_logits)" \
      "$(pick "$L_new" score_logits)" "<= 25"
  row "4x32 rows, 16,384 keys, top-2048" "$(sum "$S_prev" single 16384 2048 1 p50_us)" \
      "$(sum "$S_new" single 16384 2048 1 p50_us)" "<= 45"
  row "4x32 rows, 400,000 keys, top-2048" "$(sum "$S_prev" single 400000 2048 1 p50_us)" \
      "$(sum "$S_new" single 400000 2048 1 p50_us)" "<= 80"
  row "4x32 rows, 400,000 keys, full logits" "$(sum "$S_prev" single 400000 0 1 p50_us)" \
      "$(sum "$S_new" single 400000 0 1 p50_us)" "-"
  # (e)'s top-2048 line, its last column: q, w and the outputs in a CUDA region
  region_in() { awk '/^\(e\) regions/ { e = 1 } e && $1 == "top-2048" { if (NF >= 5) print $NF; exit }' "$1" 2>/dev/null; }
  row "4x32 rows, 400,000 keys, top-2048, q/w/out in CUDA regions" "$(region_in "$L_prev")" \
      "$(region_in "$L_new")" "<= 65"
  for n in 32 64; do
    for side in prev new; do
      eval "S=\$S_$side"
      a=$(sum "$S" concurrent 32768 512 $n requests_per_s)
      l=$(sum "$S" concurrent 32768 512 $n inprocess_per_s)
      if [ -n "$a" ] && [ -n "$l" ]; then
        eval "C_$side=\"$a/s ($(awk -v a="$a" -v l="$l" 'BEGIN{printf "%.0f%%", 100*a/l}'))\""
      else
        eval "C_$side=-"
      fi
    done
    goal=">= 85%"; [ "$n" = 64 ] && goal=">= 80%"
    row "$n clients x 32,768 keys top-512: aggregate" "$C_prev" "$C_new" "$goal"
    for side in prev new; do
      eval "S=\$S_$side"
      w=$(sum "$S" concurrent 32768 512 $n worker_cpu_pct)
      l=$(sum "$S" concurrent 32768 512 $n loops_cpu_pct)
      eval "U_$side=\"${w:--} / ${l:--}\""
    done
    row "  the daemon's worker / I/O loops, % of one CPU" "$U_prev" "$U_new" ""
  done
  echo "(previous = the previous commit's daemon driven by the new benchmark;"
  echo " stage breakdowns: the (c) tables in new.log; regions: its (e) tables)"
} | tee "$OUT/table.txt"
