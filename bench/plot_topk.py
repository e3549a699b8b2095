#!/usr/bin/env python3
"""plot_topk.py [CSV] [PNG] [GPU] -- the GPU top-k (fp4idx-bench-cuda --topk
--csv): per case and k, one bar per `*_us` column of the CSV, in file
order (the benchmark writes topk_us, score_us and score_topk_us; CSVs of
several builds merged side by side add their own columns), with the top-k
targets where given. Defaults: docs/topk_h200.csv -> docs/topk_h200.png, GPU
H200 (the title's)."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

docs = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(docs, "topk_h200.csv")
dst = sys.argv[2] if len(sys.argv) > 2 else os.path.join(docs, "topk_h200.png")
gpu = sys.argv[3] if len(sys.argv) > 3 else "H200"
rows = list(csv.DictReader(open(src)))
goal = {("r4_ctx65536", "512"): 5, ("r4_ctx65536", "2048"): 5, ("r4_ctx400000", "2048"): 12,
        ("s16_r4_ctx9295", "2048"): 8}
labels = ["%sx%s\nk=%s" % (r["rows"], r["ctx"], r["k"]) for r in rows]
series = [c for c in rows[0] if c.endswith("_us")]
names = {"topk_us": "top-k alone", "score_us": "scorer alone", "score_topk_us": "score + top-k"}
fig, ax = plt.subplots(figsize=(12, 4.8))
w = 0.8 / len(series)
for j, key in enumerate(series):
    xs = [i + (j - (len(series) - 1) / 2) * w for i in range(len(rows))]
    ax.bar(xs, [float(r[key]) for r in rows], w, label=names.get(key, key[: -len("_us")]),
           color="C%d" % j)
gx = [i for i, r in enumerate(rows) if (r["case"], r["k"]) in goal]
ax.plot([x - (len(series) - 1) / 2 * w for x in gx], [goal[(rows[i]["case"], rows[i]["k"])] for i in gx], "v",
        color="k", ms=9, label="target (top-k alone)")
ax.set_yscale("log")
ax.set_xticks(range(len(rows)))
ax.set_xticklabels(labels, fontsize=7)
ax.set_ylabel("us per call (median of 3 x 10 graph replays)")
ax.set_title("GPU top-k, one %s (fp4idx-bench-cuda --topk)" % gpu)
ax.grid(True, axis="y", which="both", alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(dst, dpi=110)
print("wrote", dst)
