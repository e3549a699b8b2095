#!/bin/bash
# run_kernels.sh -- the kernels' table of docs/RESULTS.md (the scorer's
# cases, the top-k alone and score + top-k), the new build beside a
# previous one in the same call: fp4idx-bench-cuda --check and --topk
# --check of each build, runs alternated, every case checked bit for bit
# (the scorer against the CPU backend, the top-k against a host sort).
#
#   bench/run_kernels.sh NEW_DIR [PREV_DIR]
#
# A DIR holds one build's fp4idx-bench-cuda (DIR/lib or DIR/devlib, when
# present, goes on LD_LIBRARY_PATH). RUNS (default 2): invocations per
# build, alternated (each is itself the median of 3 timings per case).
# Output in $OUT (default /tmp/kernels_out): scorer.BUILD.RUN.{log,csv},
# topk.BUILD.RUN.{log,csv}, gpu.txt, table.txt; cuda.png and topk.png
# (bench/plot_cuda.py, plot_topk.py) where matplotlib is there. The table
# is printed last: per case and build the median over the runs, and the
# count of cases that were not bit-exact (must be 0).
set -u
NEW=${1:?usage: run_kernels.sh NEW_DIR [PREV_DIR]}
PREV=${2:-}
OUT=${OUT:-/tmp/kernels_out}
RUNS=${RUNS:-2}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
builds="new"
[ -n "$PREV" ] && builds="new prev"
bad=0
for run in $(seq 1 "$RUNS"); do
  for b in $builds; do
    dir=$NEW
    [ "$b" = prev ] && dir=$PREV
    lib="$dir/lib:$dir/devlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    LD_LIBRARY_PATH=$lib "$dir/fp4idx-bench-cuda" --check --label "$b" \
      --csv "$OUT/scorer.$b.$run.csv" > "$OUT/scorer.$b.$run.log" 2>&1 ||
      { echo "run_kernels.sh: $b scorer run $run failed ($OUT/scorer.$b.$run.log)"; bad=1; }
    LD_LIBRARY_PATH=$lib "$dir/fp4idx-bench-cuda" --topk --check \
      --csv "$OUT/topk.$b.$run.csv" > "$OUT/topk.$b.$run.log" 2>&1 ||
      { echo "run_kernels.sh: $b top-k run $run failed ($OUT/topk.$b.$run.log)"; bad=1; }
    echo "$b run $run done"
  done
done

# The table: medians over the runs. The top-k CSV of older builds names its
# columns new_us / score_new_us (the planner's path) where later ones have
# topk_us / score_topk_us.
python3 - "$OUT" "$RUNS" $builds <<'EOF' | tee "$OUT/table.txt"
import csv, glob, os, statistics, sys
out, runs, builds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def rows(kind, b):
    got = {}
    for r in range(1, runs + 1):
        p = os.path.join(out, "%s.%s.%d.csv" % (kind, b, r))
        if not os.path.exists(p):
            continue
        for row in csv.DictReader(open(p)):
            got.setdefault((row["case"], row.get("k", "")), []).append(row)
    return got
def med(rs, *names):
    for n in names:
        v = [float(r[n]) for r in rs if r.get(n) not in (None, "")]
        if v:
            return statistics.median(v)
    return None
def fmt(v):
    return "-" if v is None else "%.2f" % v
gpu = open(os.path.join(out, "gpu.txt")).read().strip()
print("== kernels (%s), median of %d runs per build, us" % (gpu, runs))
sc = {b: rows("scorer", b) for b in builds}
tk = {b: rows("topk", b) for b in builds}
print("%-36s %s" % ("case", " ".join("%12s" % b for b in builds)))
for key in sorted(sc[builds[0]]):
    print("%-36s %s" % ("scorer " + key[0], " ".join(
        "%12s" % fmt(med(sc[b].get(key, []), "hot_us")) for b in builds)))
for key in sorted(tk[builds[0]], key=lambda x: (x[0], int(x[1] or 0))):
    name = "%s k=%s" % key
    print("%-36s %s" % ("top-k " + name, " ".join(
        "%12s" % fmt(med(tk[b].get(key, []), "topk_us", "new_us")) for b in builds)))
    print("%-36s %s" % ("  score + top-k / score", " ".join("%12s" % (
        "-" if med(tk[b].get(key, []), "score_us") is None else "%.2f" % (
            med(tk[b].get(key, []), "score_topk_us", "score_new_us") /
            med(tk[b].get(key, []), "score_us"))) for b in builds)))
for b in builds:
    n = sum(1 for kind in ("scorer", "topk")
            for p in glob.glob(os.path.join(out, "%s.%s.*.log" % (kind, b)))
            for line in open(p, errors="replace") if "MISMATCH" in line)
    print("%s: %d lines MISMATCH (must be 0)" % (b, n))
EOF
if python3 -c "import matplotlib" 2> /dev/null; then
  cat "$OUT"/scorer.*.1.csv | awk 'NR == 1 || $0 !~ /^case,/' > "$OUT/scorer.csv"
  python3 "$here/plot_cuda.py" "$OUT/scorer.csv" "$OUT/cuda.png" "$(cut -d, -f1 "$OUT/gpu.txt")" \
    > /dev/null 2>&1 || echo "run_kernels.sh: plot_cuda.py failed"
  python3 "$here/plot_topk.py" "$OUT/topk.new.1.csv" "$OUT/topk.png" "$(cut -d, -f1 "$OUT/gpu.txt")" \
    > /dev/null 2>&1 ||
    echo "run_kernels.sh: plot_topk.py failed"
fi
exit $bad
