#!/usr/bin/env python3
"""bench_python.py -- per-request cost of the Python client (client/python)
against the C client (libfp4idx-client, via fp4idx-bench-calls), both
talking to the same CPU fp4idxd, one request in flight:

  info       c.info()                       / fp4idx_client_info
  score64    c.score(seq, q, w), 64 keys    / fp4idx_client_score_into
  topk100k   c.topk(seq, q, w, 16), 100,000 keys / fp4idx_client_topk

R=4 rows x H=32 heads, q/w given as bf16 bit patterns (uint16) on both
sides; `score64 f32 q/w` also times float32 q/w rounded by the Python client,
and the `AsyncClient` rows the asyncio client (one call awaited at a time),
both against the C client's figure for the same request.

A second table (Python only) gives the full logits of the 100,000-key
sequence (R=4 x H=32, 1.6 MB of float32; and H=1, the same logits for
1/32 of the scoring) through the socket against the same call with q/w in
a registered host region and out= a view of it
(client/python regions: only the small maps cross the socket), with the
bytes the daemon sent per call (its stats counter); the two results are
checked byte-equal first. --logits-only runs just that table.
Each round runs the C program, then the Python calls (warm-up first), and
the rounds interleave so that both see the same load; the table gives the
median over rounds of each round's p50, [min..max] after it, the ratio
Python/C of those medians, and the difference (what Python adds per call);
then the p50 of the calling thread's CPU time per call (the client's own
work, which the load of other processes does not inflate).

  python3 bench/bench_python.py [--build build] [-n 5000] [-b 20] [-r 3] [--logits-only]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "client", "python"))
import fp4idx  # noqa: E402

SMALL, BIG = 1, 2


def start_daemon(build, sock):
    p = subprocess.Popen([os.path.join(build, "daemon", "fp4idxd"), "--socket", sock,
                          "--backend", "cpu", "--cache-bytes", "512M", "--log-level", "warn"])
    for _ in range(500):
        if os.path.exists(sock):
            try:
                fp4idx.Client(sock).close()
                return p
            except fp4idx.ConnectionLost:
                pass
        time.sleep(0.02)
    p.kill()
    raise SystemExit("fp4idxd did not start")


def p50(t):
    t = sorted(t)
    return t[(len(t) + 1) // 2 - 1] / 1000.0  # nearest rank, us


def time_calls(fn, n, warm):
    """-> (wall p50, thread CPU p50) in us of n calls of fn after warm ones."""
    for _ in range(warm):
        fn()
    wall, cpu = [], []
    pc, tt = time.perf_counter_ns, time.thread_time_ns
    for _ in range(n):
        c0, t0 = tt(), pc()
        fn()
        wall.append(pc() - t0)
        cpu.append(tt() - c0)
    return p50(wall), p50(cpu)


def time_async(sock, q, w, n, warm):
    """p50 (us) of sequential awaited AsyncClient calls: info, score64."""
    import asyncio

    async def run():
        out = {}
        async with fp4idx.AsyncClient(sock) as a:
            for name, mk in (("info, AsyncClient", lambda: a.info()),
                             ("score64, AsyncClient", lambda: a.score(SMALL, q, w))):
                for _ in range(warm):
                    await mk()
                wall, cpu = [], []
                pc, tt = time.perf_counter_ns, time.thread_time_ns
                for _ in range(n):
                    c0, t0 = tt(), pc()
                    await mk()
                    wall.append(pc() - t0)
                    cpu.append(tt() - c0)
                out[name] = (p50(wall), p50(cpu))
        return out
    return asyncio.run(run())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("-n", type=int, default=5000, help="small calls per case and round")
    ap.add_argument("-b", type=int, default=20, help="100k top-k calls per round")
    ap.add_argument("-w", type=int, default=500, help="warm-up calls (small cases)")
    ap.add_argument("-r", type=int, default=3, help="rounds")
    ap.add_argument("--logits-only", action="store_true",
                    help="only the 100k full-logits table (socket vs host region)")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="fp4idx-benchpy-")
    sock = os.path.join(tmp, "fp4idxd.sock")
    daemon = start_daemon(a.build, sock)
    try:
        rng = np.random.default_rng(0)
        c = fp4idx.Client(sock)
        c.append(SMALL, fp4idx.bf16_bits(rng.standard_normal((64, 128), dtype=np.float32)))
        for i in range(0, 100000, 8192):
            m = min(8192, 100000 - i)
            c.append(BIG, fp4idx.bf16_bits(rng.standard_normal((m, 128), dtype=np.float32)))
        qf = rng.standard_normal((4, 32, 128), dtype=np.float32)
        wf = rng.random((4, 32), dtype=np.float32)
        q, w = fp4idx.bf16_bits(qf), fp4idx.bf16_bits(wf)
        q.tofile(os.path.join(tmp, "q.bin"))
        w.tofile(os.path.join(tmp, "w.bin"))
        region = c.region(4 << 20)
        qr, wr = region.array(q.dtype, q.shape), region.array(w.dtype, w.shape)
        qr[...], wr[...] = q, w
        out = region.array(np.float32, (4, 100000))
        if c.score(BIG, qr, wr, out=out) is not out or \
                out.tobytes() != c.score(BIG, q, w).tobytes():
            raise SystemExit("host-region logits differ from the socket path")
        # H=1: the same 1.6 MB of logits for 1/32 of the scoring work, so
        # that the transport's share shows through the CPU backend's compute.
        q1, w1 = np.ascontiguousarray(q[:, :1]), np.ascontiguousarray(w[:, :1])
        q1r, w1r = region.array(q1.dtype, q1.shape), region.array(w1.dtype, w1.shape)
        q1r[...], w1r[...] = q1, w1
        logit_cases = {
            "logits100k, socket": lambda: c.score(BIG, q, w),
            "logits100k, host region (q, w, out)": lambda: c.score(BIG, qr, wr, out=out),
            "logits100k H=1, socket": lambda: c.score(BIG, q1, w1),
            "logits100k H=1, host region": lambda: c.score(BIG, q1r, w1r, out=out),
        }
        lres = {k: {"py": [], "py_cpu": [], "bytes": []} for k in logit_cases}
        py_cases = {
            "info": (lambda: c.info(), a.n, a.w),
            "score64": (lambda: c.score(SMALL, q, w), a.n, a.w),
            "score64 f32 q/w": (lambda: c.score(SMALL, qf, wf), a.n, a.w),
            "topk100k": (lambda: c.topk(BIG, q, w, 16), a.b, 2),
        }
        names = [*py_cases, "info, AsyncClient", "score64, AsyncClient"]
        res = {k: {"c": [], "py": [], "c_cpu": [], "py_cpu": []} for k in names}
        cmd = [os.path.join(a.build, "bench", "fp4idx-bench-calls"), "-s", sock,
               "-a", str(SMALL), "-B", str(BIG), "-q", os.path.join(tmp, "q.bin"),
               "-W", os.path.join(tmp, "w.bin"), "-n", str(a.n), "-b", str(a.b),
               "-w", str(a.w)]
        for _ in range(a.r):
            for name, fn in logit_cases.items():
                r0 = c.stats()["response_bytes"]
                fn()
                r1 = c.stats()["response_bytes"]
                wall, cpu = time_calls(fn, a.b, 2)
                lres[name]["py"].append(wall)
                lres[name]["py_cpu"].append(cpu)
                lres[name]["bytes"].append(r1 - r0)  # the call's reply + r0's
            if a.logits_only:
                continue
            # (not `out`: the logits cases' lambdas read that name, the region's array)
            stdout = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            for line in stdout.split():
                name, _, wall, _, _, cpu = line.split(",")
                res[name]["c"].append(float(wall))
                res[name]["c_cpu"].append(float(cpu))
            timed = {name: time_calls(fn, n, warm) for name, (fn, n, warm) in py_cases.items()}
            timed.update(time_async(sock, q, w, a.n, a.w))
            for name, (wall, cpu) in timed.items():
                res[name]["py"].append(wall)
                res[name]["py_cpu"].append(cpu)
        s0 = c.stats()["response_bytes"]
        stats_reply = c.stats()["response_bytes"] - s0  # a stats reply counts in the next
        region.close()
        c.close()
    finally:
        daemon.terminate()
        daemon.wait()

    med = statistics.median
    print(f"{a.r} rounds, {a.b} calls/round (2 warm-up); p50 per round, median "
          "[min..max] of rounds, us\n")
    print("| case | Python p50 | Python CPU p50 | reply bytes per call |")
    print("|---|---|---|---|")
    for name, r in lres.items():
        print(f"| {name} | {med(r['py']):,.1f} [{min(r['py']):,.1f}..{max(r['py']):,.1f}] | "
              f"{med(r['py_cpu']):,.1f} | {med(r['bytes']) - stats_reply:,.0f} |")
    print()
    if a.logits_only:
        return

    print(f"{a.r} rounds; small cases {a.n} calls/round ({a.w} warm-up), "
          f"topk100k {a.b} calls/round; p50 per round, median [min..max] of rounds, us\n")
    print("| case | C client p50 | Python p50 | ratio Python/C | Python - C "
          "| C client CPU p50 | Python CPU p50 | Python - C CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in res.items():
        base = {"score64 f32 q/w": "score64", "info, AsyncClient": "info",
                "score64, AsyncClient": "score64"}.get(name, name)
        cref, ccpu = res[base]["c"], res[base]["c_cpu"]
        cm, pm = med(cref), med(r["py"])
        print(f"| {name} | {cm:,.1f} [{min(cref):,.1f}..{max(cref):,.1f}] | "
              f"{pm:,.1f} [{min(r['py']):,.1f}..{max(r['py']):,.1f}] | "
              f"**{pm / cm:.2f}** | {pm - cm:+,.1f} | {med(ccpu):,.1f} | "
              f"{med(r['py_cpu']):,.1f} | {med(r['py_cpu']) - med(ccpu):+,.1f} |")


if __name__ == "__main__":
    main()
