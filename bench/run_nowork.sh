#!/bin/bash
# run_nowork.sh -- the daemon's own cost per stage, without a GPU: fp4idxd-nowork
# (the daemon with the no-work backend, bench/backend_nowork.h) measured
# through its socket by fp4idx-bench-socket, for docs/RESULTS.md ("No-work
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
# The whole bench runs $RUNS times (default 3, a fresh daemon each), and
# the table gives, per figure, the median over those invocations and, for
# the round trip p50, its range: on a shared machine whole invocations move.
#
# Output in $OUT (default /tmp/nowork): bench.N.log (invocation N's tables,
# stage breakdowns included), summary.N.csv (its fp4idx-bench-socket
# --summary), nowork.csv (the table's cases over all invocations: round
# trip p50 median/min/max, p99, the daemon's time (frame complete to reply
# encoded), its own time (every stage but kernels, first byte read to reply
# written), requests/s, stage means), machine.txt (CPU, commit, load before and after), stages.png when
# matplotlib is there (bench/plot_socket.py --summary of invocation 1); the
# table is printed last.
# EXTRA: more options for the bench, after these (later ones win), e.g. a
# quick run: RUNS=1 EXTRA="-n 200 -w 20 -b 20 --conc-calls 20 -r 1".
# DAEMON_ARGS: more options for the spawned daemon (e.g. "--io-threads 4"),
# through a wrapper script in $OUT that fp4idx-bench-socket spawns as -d.
set -u
BUILD=${1:?usage: run_nowork.sh BUILD_DIR}
OUT=${OUT:-/tmp/nowork}
RUNS=${RUNS:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
DAEMON=$BUILD/bench/fp4idxd-nowork
BENCH=$BUILD/bench/fp4idx-bench-socket
for f in "$DAEMON" "$BENCH"; do
  [ -x "$f" ] || { echo "run_nowork.sh: $f is missing (build BUILD_DIR first)" >&2; exit 1; }
done
mkdir -p "$OUT"
if [ -n "${DAEMON_ARGS:-}" ]; then
  wrapper=$OUT/fp4idxd-nowork-args
  printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$(cd "$(dirname "$DAEMON")" && pwd)/fp4idxd-nowork" \
    "$DAEMON_ARGS" > "$wrapper"
  chmod +x "$wrapper"
  DAEMON=$wrapper
fi
ARGS=(-d "$DAEMON" --backend nowork --local none --cache-bytes 1G -r 3
      --sections acd -n 2000 -w 200 -b 200 --ctx 16384,400000 --topk 2048
      --clients 1,8,32 --conc-ctx 32768 --conc-topk 512 --conc-calls 200)
read -r -a EXTRA_A <<< "${EXTRA:-}"
ARGS+=("${EXTRA_A[@]}")

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "daemon options: ${DAEMON_ARGS:-(none)}"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) CPUs"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"
for i in $(seq 1 "$RUNS"); do
  "$BENCH" "${ARGS[@]}" --summary "$OUT/summary.$i.csv" > "$OUT/bench.$i.log" 2>&1
  rc=$?
  cat "$OUT/bench.$i.log"
  [ $rc -eq 0 ] || { echo "run_nowork.sh: fp4idx-bench-socket failed (rc=$rc)" >&2; exit $rc; }
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

# The table's cases, one row each, medians over the invocations.
python3 - "$OUT" "$RUNS" <<'EOF'
import csv, math, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
STAGES = ["read", "queue", "decode", "execute", "upload", "kernels", "download", "encode",
          "wake", "write"]
def name(r):
    s = r["section"]
    if s == "info": return "info"
    if s == "score_logits": return "score 64 keys full logits"
    if s == "score_topk16": return "score 64 keys top-16"
    if s == "single": return f"score {r['ctx']} keys top-{r['topk']}"
    if s == "concurrent": return f"{r['clients']} clients {r['ctx']} keys top-{r['topk']}"
    return None
cases = {}
for i in range(1, runs + 1):
    with open(f"{out}/summary.{i}.csv", newline="") as f:
        for r in csv.DictReader(f):
            n = name(r)
            if n: cases.setdefault(n, []).append(r)
def med(rows, key):
    v = [float(r[key]) for r in rows if r.get(key) not in (None, "", "nan")]
    v = [x for x in v if not math.isnan(x)]
    return statistics.median(v) if v else float("nan")
def own(r):  # the daemon's own time: every stage but the backend's call
    v = [float(r[s + "_us"]) for s in STAGES if s != "kernels"]
    return sum(v)
for rows in cases.values():
    for r in rows: r["own_us"] = own(r)
cols = ["case", "p50_us", "p50_min_us", "p50_max_us", "p99_us", "daemon_us", "own_us",
        "requests_per_s"]
cols += [s + "_us" for s in STAGES]
with open(f"{out}/nowork.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(cols)
    for n, rows in cases.items():
        p50 = [float(r["p50_us"]) for r in rows]
        row = [n, med(rows, "p50_us"), min(p50), max(p50), med(rows, "p99_us"),
               med(rows, "daemon_us"), med(rows, "own_us"), med(rows, "requests_per_s")]
        row += [med(rows, s + "_us") for s in STAGES]
        w.writerow([row[0]] + ["nan" if isinstance(x, float) and math.isnan(x)
                               else f"{x:.1f}" for x in row[1:]])
EOF

if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$HERE/plot_socket.py" --summary -o "$OUT/stages.png" "$OUT/summary.1.csv" \
    > /dev/null 2>&1 || echo "(plot failed)"
fi

echo
echo "== the daemon's own cost, no-work backend, $RUNS invocations of -r 3"
cat "$OUT/machine.txt"
column -s, -t < "$OUT/nowork.csv"
echo "(us; p50 (median, min, max over the invocations) / p99: client round trip;"
echo " daemon: frame complete to reply encoded; own: the stage means summed, all but"
echo " kernels (the no-work backend's own call), first byte read to reply written;"
echo " stages: means per request;"
echo " requests/s: all clients over the wall time)"
