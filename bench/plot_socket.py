#!/usr/bin/env python3
"""plot_socket.py -- draw fp4idx-bench-socket's latency samples.

Usage: bench/plot_socket.py [-o OUT.png] SAMPLES.csv [MORE.csv ...]

SAMPLES.csv is the --csv output of fp4idx-bench-socket (case,run,index,us);
several files (separate invocations) are pooled. Draws, for the small round
trips of part (a) (score_logits, score_topk16, info), a histogram on
log-spaced bins (left) and the CDF (right), all runs pooled; dashed lines
mark p50 and p99. Writes OUT.png (default bench/socket_latency.png). Needs
matplotlib.
"""
import csv
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CASES = [("score_logits", "score, full logits (64 keys, R=4, H=32)"),
         ("score_topk16", "score, top-k 16 (64 keys, R=4, H=32)"),
         ("info", "info")]


def pct(sorted_v, p):
    """Nearest-rank percentile, as the benchmark prints it."""
    k = max(1, min(len(sorted_v), math.ceil(p / 100.0 * len(sorted_v))))
    return sorted_v[k - 1]


def main():
    args = sys.argv[1:]
    out = "bench/socket_latency.png"
    if len(args) >= 2 and args[0] == "-o":
        out, args = args[1], args[2:]
    if not args or any(a.startswith("-") for a in args):
        sys.exit(__doc__)
    samples = {name: [] for name, _ in CASES}
    runs = set()
    for fi, path in enumerate(args):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["case"] in samples:
                    samples[row["case"]].append(float(row["us"]))
                    runs.add((fi, row["run"]))
    if not any(samples.values()):
        sys.exit("no latency samples in " + " ".join(args))

    lo = min(min(v) for v in samples.values() if v)
    hi = max(max(v) for v in samples.values() if v)
    nb = 8  # bins per octave
    e0, e1 = math.floor(math.log2(lo) * nb), math.ceil(math.log2(hi) * nb)
    bins = [2 ** (e / nb) for e in range(e0, e1 + 1)]

    fig, (ax_h, ax_c) = plt.subplots(1, 2, figsize=(13, 5))
    colors = ["tab:blue", "tab:orange", "tab:green"]
    for (name, label), color in zip(CASES, colors):
        v = sorted(samples[name])
        if not v:
            continue
        p50, p99 = pct(v, 50), pct(v, 99)
        lab = f"{label}: p50 {p50:.0f} us, p99 {p99:.0f} us"
        ax_h.hist(v, bins=bins, histtype="step", linewidth=1.5, color=color, label=lab)
        ax_c.plot(v, [(i + 1) / len(v) for i in range(len(v))], color=color, label=lab)
        for p in (p50, p99):
            ax_h.axvline(p, color=color, linestyle="--", linewidth=0.8)
            ax_c.axvline(p, color=color, linestyle="--", linewidth=0.8)
    for ax in (ax_h, ax_c):
        ax.set_xscale("log")
        ax.set_xlabel("round trip through the socket (us, log scale)")
        ax.grid(True, which="both", alpha=0.3)
    ax_h.set_ylabel("calls per bin (8 bins per octave)")
    ax_h.set_title("Latency histogram")
    ax_c.set_ylabel("fraction of calls <= x")
    ax_c.set_title("Latency CDF")
    ax_c.legend(loc="lower right", fontsize=8)
    n = len(samples[CASES[0][0]])
    fig.suptitle(f"fp4idx-bench-socket: fp4idxd (CPU backend) via libfp4idx-client, "
                 f"{n} calls per case over {len(runs)} runs, 2-core shared VM")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
