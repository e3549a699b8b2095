#!/usr/bin/env python3
"""plot_topk.py [CSV] [PNG] -- the GPU top-k (fp4idx-bench-cuda --topk
--csv, one run of each binary merged into one CSV): per case and k, the old
one-block-per-row kernel, main's top-k (the one-kernel cluster path as
merged), the branch's round (the CSV's round<N>_us column: round 7, the
count from the pass-1 histogram and the phase timeline's steps), the scorer
alone and score + main's and the round's top-k, with the issue 17 targets
where given.
Defaults: bench/topk_h200.csv -> bench/topk_h200.png."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "topk_h200.csv")
dst = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "topk_h200.png")
rows = list(csv.DictReader(open(src)))
rnd = next(c[: -len("_us")] for c in rows[0] if c.startswith("round") and c.endswith("_us"))
rname = "round " + rnd[len("round"):]
goal = {("r4_ctx65536", "512"): 5, ("r4_ctx65536", "2048"): 5, ("r4_ctx400000", "2048"): 12,
        ("s16_r4_ctx9295", "2048"): 8}
labels = ["%sx%s\nk=%s" % (r["rows"], r["ctx"], r["k"]) for r in rows]
series = [("old_us", "old top-k (1 block/row)", "C7"), ("main_us", "main top-k (cluster kernel)", "C0"),
          (rnd + "_us", rname + " top-k", "C4"), ("score_us", "scorer alone", "C2"),
          ("score_main_us", "score + main top-k", "C1"), ("score_" + rnd + "_us", "score + " + rname, "C5")]
fig, ax = plt.subplots(figsize=(12, 4.8))
w = 0.14
for j, (key, name, col) in enumerate(series):
    xs = [i + (j - 2.5) * w for i in range(len(rows))]
    ax.bar(xs, [float(r[key]) for r in rows], w, label=name, color=col)
gx = [i for i, r in enumerate(rows) if (r["case"], r["k"]) in goal]
ax.plot([x - 0.5 * w for x in gx], [goal[(rows[i]["case"], rows[i]["k"])] for i in gx], "v",
        color="C3", ms=9, label="issue 17 goal (top-k alone)")
ax.set_yscale("log")
ax.set_xticks(range(len(rows)))
ax.set_xticklabels(labels, fontsize=7)
ax.set_ylabel("us per call (median of 3 x 10 graph replays)")
ax.set_title("GPU top-k, one H200 (fp4idx-bench-cuda --topk)")
ax.grid(True, axis="y", which="both", alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(dst, dpi=110)
print("wrote", dst)
