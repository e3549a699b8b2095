#!/usr/bin/env python3
"""plot_socket.py -- draw fp4idx-bench-socket's latency samples.

Usage: bench/plot_socket.py [-o OUT.png] SAMPLES.csv [MORE.csv ...]
       bench/plot_socket.py --summary [-o OUT.png] SUMMARY.csv [PREV.csv]

SAMPLES.csv is the --csv output of fp4idx-bench-socket (case,run,index,us);
several files (separate invocations) are pooled. Draws, for the small round
trips of part (a) (score_logits, score_topk16, info), a histogram on
log-spaced bins (left) and the CDF (right), all runs pooled; dashed lines
mark p50 and p99. Writes OUT.png (default docs/socket_latency.png). Needs
matplotlib.

With --summary, SUMMARY.csv is the --summary output (one row per case of
parts (c) and (d)); draws (left) the daemon's stage breakdown of every
single-client case as stacked bars (stage means per request) with the
client's round trip as a dot, and (right) the aggregate requests/s of N
concurrent clients next to one in-process launch of all N. A second file
(e.g. the previous commit's) is drawn hatched beside the first. Default
OUT.png: docs/socket_stages_h200.png.
"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs"))
CASES = [("score_logits", "score, full logits (64 keys, R=4, H=32)"),
         ("score_topk16", "score, top-k 16 (64 keys, R=4, H=32)"),
         ("info", "info")]


def pct(sorted_v, p):
    """Nearest-rank percentile, as the benchmark prints it."""
    k = max(1, min(len(sorted_v), math.ceil(p / 100.0 * len(sorted_v))))
    return sorted_v[k - 1]


STAGES = ["read", "queue", "decode", "execute", "upload", "kernels", "download",
          "encode", "wake", "write"]


def load_summary(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(x):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return v


def plot_summary(args, out):
    runs = [load_summary(p) for p in args[:2]]
    # each file is named in the legend by its name without the extension
    names = [os.path.splitext(os.path.basename(p))[0] for p in args[:2]]
    fig, (ax_s, ax_c) = plt.subplots(1, 2, figsize=(15, 6))
    cmap = plt.get_cmap("tab10")
    single = [r for r in runs[0] if r["section"] == "single"]
    labels = [f"{int(r['ctx']) // 1000}k\n{'full' if r['topk'] == '0' else 'top' + r['topk']}"
              for r in single]
    width = 0.8 / len(runs)
    for ri, rows in enumerate(runs):
        rows = {(r["ctx"], r["topk"]): r for r in rows if r["section"] == "single"}
        xs = [i + ri * width for i in range(len(single))]
        bottom = [0.0] * len(single)
        for si, st in enumerate(STAGES):
            v = [max(0.0, num(rows.get((r["ctx"], r["topk"]), {}).get(st + "_us")))
                 if (r["ctx"], r["topk"]) in rows else 0.0 for r in single]
            v = [0.0 if math.isnan(x) else x for x in v]
            ax_s.bar(xs, v, width, bottom=bottom, color=cmap(si), hatch="//" if ri else None,
                     label=st if ri == 0 else None, edgecolor="white", linewidth=0.3)
            bottom = [b + x for b, x in zip(bottom, v)]
        p50 = [num(rows[(r["ctx"], r["topk"])]["p50_us"]) if (r["ctx"], r["topk"]) in rows
               else float("nan") for r in single]
        ax_s.plot(xs, p50, "k^" if ri else "ko",
                  label=f"client round trip p50 ({names[ri]}{', hatched' if ri else ''})")
    ax_s.set_xticks([i + width * (len(runs) - 1) / 2 for i in range(len(single))])
    ax_s.set_xticklabels(labels, fontsize=8)
    ax_s.set_yscale("log")
    ax_s.set_ylabel("us per request (stage means; log scale)")
    ax_s.set_title("One client, R=4 x H=32: where the time goes")
    ax_s.legend(fontsize=7, ncol=2)
    ax_s.grid(True, which="both", axis="y", alpha=0.3)
    for ri, rows in enumerate(runs):
        conc = [r for r in rows if r["section"] == "concurrent"]
        n = [int(r["clients"]) for r in conc]
        ax_c.plot(n, [num(r["requests_per_s"]) for r in conc], "o-" if ri == 0 else "o--",
                  color="tab:blue", label=f"through the daemon ({names[ri]})")
        ax_c.plot(n, [num(r["inprocess_per_s"]) for r in conc], "s-" if ri == 0 else "s--",
                  color="tab:green", label=f"one in-process launch of all N ({names[ri]})")
    ax_c.set_xscale("log", base=2)
    ax_c.set_xlabel("concurrent clients N (each its own sequence)")
    ax_c.set_ylabel("score requests per second (all clients)")
    conc0 = [r for r in runs[0] if r["section"] == "concurrent"]
    if conc0:
        ax_c.set_title(f"{conc0[0]['ctx']} keys, top-{conc0[0]['topk']}, R=4 x H=32")
    ax_c.legend(fontsize=8)
    ax_c.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main():
    args = sys.argv[1:]
    if args and args[0] == "--summary":
        args = args[1:]
        out = os.path.join(DOCS, "socket_stages_h200.png")
        if len(args) >= 2 and args[0] == "-o":
            out, args = args[1], args[2:]
        if not args:
            sys.exit(__doc__)
        plot_summary(args, out)
        return
    out = os.path.join(DOCS, "socket_latency.png")
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
