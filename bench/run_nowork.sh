#!/bin/bash
# run_nowork.sh -- the daemon's own cost per stage, without a GPU: fp4idxd-nowork
# (the daemon with the no-work backend, bench/backend_nowork.h) measured
# through its socket by fp4idx-bench-socket, for bench/RESULTS.md ("No-work
# backend"). Builds nothing.
#
#   bench/run_nowork.sh BUILD_DIR
#
# BUILD_DIR is a configured and built tree (BUILD_DIR/bench/fp4idxd-nowork,
# BUILD_DIR/bench/fp4idx-bench-socket). Cases, each -r 3 runs (the bench
# reports the median of the per-run figures): (a) info and a 64-key score
# of 4 rows x 32 heads, full logits and top-16, 2000 calls after 200
# warm-up; (c) 4x32 rows at 16,384 and 400,000 keys, top-2048, 200 calls;
# (d) 1/8/32 clients, 32,768 keys each, top-512, 200 calls per client.
# No in-process comparison (--local none: there is no compute to compare).
#
# Output in $OUT (default /tmp/nowork): bench.log (the bench's tables, stage
# breakdowns included), summary.csv (every case, fp4idx-bench-socket
# --summary), nowork.csv (the table's cases: round trip p50/p99, the
# daemon's own time, requests/s, stage means), machine.txt (CPU, load
# before and after), stages.png when matplotlib is there
# (bench/plot_socket.py --summary); the table is printed last.
# EXTRA: more options for the bench, after these (later ones win), e.g. a
# quick run: EXTRA="-n 200 -w 20 -b 20 --conc-calls 20 -r 1".
set -u
BUILD=${1:?usage: run_nowork.sh BUILD_DIR}
OUT=${OUT:-/tmp/nowork}
DAEMON=$BUILD/bench/fp4idxd-nowork
BENCH=$BUILD/bench/fp4idx-bench-socket
for f in "$DAEMON" "$BENCH"; do
  [ -x "$f" ] || { echo "run_nowork.sh: $f is missing (build BUILD_DIR first)" >&2; exit 1; }
done
mkdir -p "$OUT"
ARGS=(-d "$DAEMON" --backend nowork --local none --cache-bytes 1G -r 3
      --sections acd -n 2000 -w 200 -b 200 --ctx 16384,400000 --topk 2048
      --clients 1,8,32 --conc-ctx 32768 --conc-topk 512 --conc-calls 200)
read -r -a EXTRA_A <<< "${EXTRA:-}"
ARGS+=("${EXTRA_A[@]}")

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) CPUs"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"
"$BENCH" "${ARGS[@]}" --summary "$OUT/summary.csv" > "$OUT/bench.log" 2>&1
rc=$?
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
cat "$OUT/bench.log"
[ $rc -eq 0 ] || { echo "run_nowork.sh: fp4idx-bench-socket failed (rc=$rc)" >&2; exit $rc; }

# The table's cases from the summary: one row each.
awk -F, '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  function name() {
    if ($1 == "info") return "info"
    if ($1 == "score_logits") return "score 64 keys full logits"
    if ($1 == "score_topk16") return "score 64 keys top-16"
    if ($1 == "single") return sprintf("score %d keys top-%d", $2, $3)
    if ($1 == "concurrent") return sprintf("%d clients %d keys top-%d", $4, $2, $3)
    return ""
  }
  BEGIN {
    split("read queue decode execute upload kernels download encode wake write", st, " ")
    printf "case,p50_us,p99_us,daemon_us,requests_per_s"
    for (i = 1; i <= 10; i++) printf ",%s_us", st[i]
    printf "\n"
  }
  name() != "" {
    printf "%s,%s,%s,%s,%s", name(), $col["p50_us"], $col["p99_us"], $col["daemon_us"],
      $col["requests_per_s"]
    for (i = 1; i <= 10; i++) printf ",%s", $col[st[i] "_us"]
    printf "\n"
  }' "$OUT/summary.csv" > "$OUT/nowork.csv"

if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$(dirname "$0")/plot_socket.py" --summary -o "$OUT/stages.png" "$OUT/summary.csv" \
    > /dev/null 2>&1 || echo "(plot failed)"
fi

echo
echo "== the daemon's own cost, no-work backend ($(sed -n 's/^cpu: //p' "$OUT/machine.txt"))"
cat "$OUT/machine.txt"
column -s, -t < "$OUT/nowork.csv"
echo "(us; p50/p99: client round trip; daemon: frame complete to reply encoded;"
echo " stages: means per request; requests/s: all clients over the wall time)"
