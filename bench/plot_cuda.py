#!/usr/bin/env python3
"""plot_cuda.py [CSV] [PNG] [GPU] -- time per call against context for the CUDA
scorer (fp4idx-bench-cuda --csv; one line per value of the scorer column,
e.g. a baseline build's CSV and the new one's concatenated), with the
SGLang Triton figures and the physical floor of the method in
docs/RESULTS.md (SGLang's and the floor are the H200's). Defaults:
docs/cuda_h200.csv -> docs/cuda_h200.png, GPU H200 (the title's)."""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

docs = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(docs, "cuda_h200.csv")
dst = sys.argv[2] if len(sys.argv) > 2 else os.path.join(docs, "cuda_h200.png")
gpu = sys.argv[3] if len(sys.argv) > 3 else "H200"
rows = list(csv.DictReader(open(src)))
# Older CSVs have no scorer column: one scorer, called v1.
for r in rows:
    r.setdefault("scorer", "v1")
    if not r["scorer"]:
        r["scorer"] = "v1"
scorers = list(dict.fromkeys(r["scorer"] for r in rows))  # in file order
h32_all = [r for r in rows if r["seqs"] == "1" and r["heads"] == "32"]

fig, ax = plt.subplots(figsize=(7, 4.5))
first = sorted((r for r in h32_all if r["scorer"] == scorers[0]), key=lambda r: int(r["ctx"]))
ctx = [int(r["ctx"]) for r in first]
ax.loglog(ctx, [float(r["sglang_us"]) for r in first], "s--", color="gray", label="SGLang Triton (exp2-free)")
ax.loglog(ctx, [float(r["floor_us"]) for r in first], "-", color="k", lw=0.8, label="floor (804 TFLOP/s, 4.25 TB/s)")
for k, sc in enumerate(scorers):
    h32 = sorted((r for r in h32_all if r["scorer"] == sc), key=lambda r: int(r["ctx"]))
    x = [int(r["ctx"]) for r in h32]
    tag = "fp4idx CUDA" if len(scorers) == 1 else "fp4idx CUDA %s" % sc
    ax.loglog(x, [float(r["hot_us"]) for r in h32], "o-", color="C%d" % k, label=tag + ", hot")
    ax.loglog(x, [float(r["cold_us"]) for r in h32], "x:", color="C%d" % k, label=tag + ", cold (8 caches)")
    for r in rows:
        if r["scorer"] == sc and (r["heads"] == "64" or r["seqs"] != "1"):
            lbl = "H=64" if r["heads"] == "64" else "%s seqs" % r["seqs"]
            if len(scorers) > 1:
                lbl += " " + sc
            ax.loglog([int(r["ctx"])], [float(r["hot_us"])], "D", color="C%d" % k)
            ax.annotate("%s: %.1f us" % (lbl, float(r["hot_us"])), (int(r["ctx"]), float(r["hot_us"])),
                        textcoords="offset points", xytext=(8, 8 - 11 * k), fontsize=7)
ax.loglog([16384, 100000, 400000], [3.5, 7, 20], "v", color="C3", label="goal (issue 26)")
ax.set_xlabel("context (keys)")
ax.set_ylabel("us per call (median of 3 x 10 graph replays)")
ax.set_title("FP4 index scorer, R=4 rows x 32 heads, one %s" % gpu)
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=7, loc="lower right")
fig.tight_layout()
fig.savefig(dst, dpi=120)
print("wrote", dst)
