#!/usr/bin/env python3
"""two_daemons.py -- one fp4idxd per device behind the Python ShardedClient
(issue 16): does a batch of scores over many sequences finish in about the
time one daemon takes for its share?

It starts fp4idxd as the fp4idxd@N units would (one socket per daemon,
`--device K` with the CUDA backend), plus one more daemon for the reference
set ("one"): one daemon on --devices' first device, and the "N" set of one
daemon per entry of --devices. It checks from `info` that each daemon
reports the backend asked for and its own device (CUDA: the name and PCI
bus id; daemons given the same --device must report the same device,
different ones different devices), injects S sequences of L keys into both
sets through a ShardedClient (the "one" set: a ShardedClient of one
socket), and then, rounds interleaved so that both sets see the same load:

  score_many  all S sequences, R rows x H heads each, top-K, one
              score_many call (the ShardedClient sends each daemon its part
              before reading any reply): wall time, key-rows scored per s
  alone i     the N set's daemon i scoring only its own part (what the
              two-daemon call should take: the slowest part)
  single i    p50 of a one-sequence top-K on daemon i (--latency-n calls)

Every score_many result of the N set must equal the one-daemon result byte
for byte (positions, logits, counts); a difference exits 1. The table gives
the median of --repeat rounds [min..max]; --csv writes the same rows.

  python3 bench/two_daemons.py [--build build] [--backend cpu|cuda]
      [--devices 0,1] [--seqs 64] [--keys 100000] [--cache-bytes SIZE]
      [--threads 1] [--repeat 3] [--latency-n 50] [--csv FILE] [--check-only]
      [--socket-dir DIR] [--balance]

CPU daemons each get --threads worker threads (default 1: a daemon stands
for one device); --devices then only counts the daemons. --check-only
skips the timing (one round, the equality check): what the CI test runs.
"""
import argparse
import csv
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


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--daemon", help="fp4idxd binary (default BUILD/daemon/fp4idxd)")
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--devices", default="0,1",
                    help="one daemon per entry, its --device (default 0,1)")
    ap.add_argument("--seqs", type=int, default=64, help="sequences S")
    ap.add_argument("--keys", type=int, default=100000, help="keys per sequence L")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--cache-bytes", help="each daemon's pool (default: all S x L keys)")
    ap.add_argument("--threads", type=int, default=1, help="CPU backend threads per daemon")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--latency-n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--socket-dir", default=os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(), "fp4idx-two-daemons"),
        help="where the sockets go (the split of the sequences follows their paths)")
    ap.add_argument("--csv", help="write the table's rows there")
    ap.add_argument("--balance", action="store_true",
                    help="pick sequence ids that split S evenly over the daemons "
                         "(default: ids 0..S-1, split as rendezvous hashing falls)")
    ap.add_argument("--check-only", action="store_true",
                    help="one round, no timing: the byte-equality check alone")
    a = ap.parse_args()
    a.devices = [int(d) for d in a.devices.split(",")]
    if a.seqs < 1 or a.keys < 1 or not a.devices:
        ap.error("--seqs, --keys and --devices must be positive / non-empty")
    return a


class Daemon:
    def __init__(self, args, folder, name, device):
        self.socket = os.path.join(folder, f"fp4idxd-{name}.sock")
        self.device = device
        binary = args.daemon or os.path.join(args.build, "daemon", "fp4idxd")
        cmd = [binary, "--socket", self.socket, "--backend", args.backend,
               "--cache-bytes", args.cache_bytes, "--log-level", "warn"]
        if args.backend == "cuda":
            cmd += ["--device", str(device)]
        else:
            cmd += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120  # a GPU daemon's start can take a while
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"fp4idxd exited with {self.proc.returncode}: {cmd}")
            try:
                fp4idx.Client(self.socket, timeout=10).close()
                return
            except fp4idx.Error:
                time.sleep(0.05)
        raise SystemExit(f"fp4idxd did not open {self.socket}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def check_devices(args, daemons):
    """info of each daemon: the backend asked for; CUDA: one device string
    per distinct --device. -> [(socket, device string)]."""
    seen = []
    for d in daemons:
        with fp4idx.Client(d.socket, timeout=60) as c:
            info = c.info()
        if info["backend"] != args.backend:
            raise SystemExit(f"{d.socket}: backend {info['backend']}, asked for {args.backend}")
        seen.append((d, info["device"]))
    if args.backend == "cuda":
        for a, da in seen:
            for b, db in seen:
                if (a.device == b.device) != (da == db):
                    raise SystemExit(f"--device {a.device} reports {da!r} and --device "
                                     f"{b.device} reports {db!r}: not one device per ordinal")
    return [(d.socket, dev) for d, dev in seen]


def keys_of(args, i):
    """Sequence i's keys, float32 [L,128], the same on every run."""
    return np.random.default_rng([args.seed, i]).standard_normal(
        (args.keys, 128), dtype=np.float32)


def entries_of(args, ids):
    rng = np.random.default_rng([args.seed, 1 << 32])
    out = []
    for i in ids:
        q = fp4idx.bf16_bits(rng.standard_normal((args.rows, args.heads, 128), dtype=np.float32))
        w = fp4idx.bf16_bits(rng.random((args.rows, args.heads), dtype=np.float32))
        out.append({"seq": i, "q": q, "w": w})
    return out


def seq_ids(args, scn):
    """Sequence ids: 0..S-1, or with --balance the first ids that give each
    daemon S/N (its share rounded) of them."""
    if not args.balance:
        return list(range(args.seqs))
    n = len(scn.shards)
    room = [args.seqs // n + (i < args.seqs % n) for i in range(n)]
    ids, i = [], 0
    while len(ids) < args.seqs:
        if room[scn.shard_of(i)]:
            room[scn.shard_of(i)] -= 1
            ids.append(i)
        i += 1
    return ids


def inject(args, clients, ids):
    """Appends every sequence to every ShardedClient of `clients`, in chunks
    that fit the frame limit -> seconds per client."""
    chunk = max(1, (32 << 20) // (128 * 4))
    took = [0.0] * len(clients)
    for i in ids:
        k = keys_of(args, i)
        for j, sc in enumerate(clients):
            t0 = time.perf_counter()
            for s in range(0, args.keys, chunk):
                sc.append(i, k[s:s + chunk])
            took[j] += time.perf_counter() - t0
    return took


def same(a, b):
    return all(x.tobytes() == y.tobytes() and x.dtype == y.dtype for x, y in zip(a, b))


def p50(t):
    t = sorted(t)
    return t[(len(t) + 1) // 2 - 1]


def main():
    args = parse_args()
    n = len(args.devices)
    page = 64
    if args.cache_bytes is None:  # every daemon can hold all the keys (a shard may get most)
        pages = args.seqs * -(-args.keys // page)
        args.cache_bytes = str(pages * page * 68 + (16 << 20))
    # A fixed folder: the shards' identities are their socket paths, so the
    # same paths give the same split on every run.
    folder = args.socket_dir
    os.makedirs(folder, exist_ok=True)
    daemons = []
    try:
        one = Daemon(args, folder, "one", args.devices[0])
        daemons.append(one)
        shards = [Daemon(args, folder, str(i), dev) for i, dev in enumerate(args.devices)]
        daemons += shards
        devs = check_devices(args, daemons)
        for sock, dev in devs:
            print(f"{os.path.basename(sock)}: {args.backend} {dev}")
        sc1 = fp4idx.ShardedClient([one.socket], timeout=600)
        scn = fp4idx.ShardedClient([d.socket for d in shards], timeout=600)
        ids = seq_ids(args, scn)
        split = [0] * n
        for i in ids:
            split[scn.shard_of(i)] += 1
        print(f"{args.seqs} sequences x {args.keys} keys, split {split} over {n} daemons")
        t_one, t_n = inject(args, [sc1, scn], ids)
        print(f"inject: one daemon {t_one:.2f} s, {n} daemons {t_n:.2f} s "
              f"({args.seqs * args.keys / t_one / 1e6:.2f} vs "
              f"{args.seqs * args.keys / t_n / 1e6:.2f} M keys/s)")
        entries = entries_of(args, ids)
        parts = [[e for e in entries if scn.shard_of(e["seq"]) == i] for i in range(n)]
        ref = sc1.score_many(entries, args.heads, topk=args.topk)
        got = scn.score_many(entries, args.heads, topk=args.topk)
        bad = [e["seq"] for e, r, g in zip(entries, ref, got) if not same(r, g)]
        if bad:
            print(f"FAIL: {len(bad)} of {args.seqs} sequences differ between one and "
                  f"{n} daemons (first: seq {bad[0]})")
            return 1
        print(f"results: {n} daemons equal one daemon byte for byte "
              f"({args.seqs} sequences, top-{args.topk} positions, logits, counts)")
        if args.check_only:
            return 0
        rows = measure(args, sc1, scn, entries, parts)
        report(args, n, split, rows)
        return 0
    finally:
        rcs = [d.stop() for d in daemons]
        if any(rc != 0 for rc in rcs):  # a crash fails the run, whatever it measured
            print(f"FAIL: fp4idxd exit statuses {rcs} (expected 0)")
            sys.exit(1)


def measure(args, sc1, scn, entries, parts):
    """Interleaved rounds -> {name: [seconds per round]} (single: p50)."""
    n = len(parts)
    calls = {"one: score_many": lambda: sc1.score_many(entries, args.heads, topk=args.topk),
             f"{n}: score_many": lambda: scn.score_many(entries, args.heads, topk=args.topk)}
    for i, part in enumerate(parts):
        if part:
            calls[f"{n}: alone {i}"] = (
                lambda c=scn.shards[i], p=part: c.score_many(p, args.heads, topk=args.topk))
    single = {"one: single": (sc1.shards[0], entries[0])}
    for i, part in enumerate(parts):
        if part:
            single[f"{n}: single {i}"] = (scn.shards[i], part[0])
    for fn in calls.values():  # warm-up
        fn()
    out = {k: [] for k in list(calls) + list(single)}
    for _ in range(args.repeat):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t0)
        for name, (c, e) in single.items():
            t = []
            for _ in range(args.latency_n):
                t0 = time.perf_counter()
                c.topk(e["seq"], e["q"], e["w"], args.topk)
                t.append(time.perf_counter() - t0)
            out[name].append(p50(t))
    return out


def report(args, n, split, rows):
    one = statistics.median(rows["one: score_many"])
    many = statistics.median(rows[f"{n}: score_many"])
    table = []
    for name, t in rows.items():
        med = statistics.median(t)
        seqs = args.seqs if "score_many" in name else None
        if "alone" in name:
            seqs = split[int(name.rsplit(" ", 1)[1])]
        if "single" in name:
            seqs = 1
        rate = seqs * args.rows * args.keys / med
        table.append({"run": name, "sequences": seqs, "median_s": med, "min_s": min(t),
                      "max_s": max(t), "key_rows_per_s": rate})
    print(f"\n{args.backend} backend, devices {args.devices}, {args.seqs} x {args.keys} keys, "
          f"{args.rows}x{args.heads} rows, top-{args.topk}, median of {args.repeat} rounds "
          f"(single: p50 of {args.latency_n} calls per round)")
    print(f"{'run':<18} {'seqs':>5} {'median':>11} {'[min..max]':>24} {'key-rows/s':>11}")
    for r in table:
        print(f"{r['run']:<18} {r['sequences']:>5} {fmt(r['median_s']):>11} "
              f"{'[' + fmt(r['min_s']) + '..' + fmt(r['max_s']) + ']':>24} "
              f"{r['key_rows_per_s'] / 1e6:>9.1f} M")
    bound = args.seqs / max(split)
    print(f"\nscore_many throughput, {n} daemons / one: {one / many:.2f}x "
          f"(the split {split} bounds it at {bound:.2f}x)")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, ["backend", "devices", "seqs_total", "keys", "rows", "heads",
                                   "topk", "run", "sequences", "median_s", "min_s", "max_s",
                                   "key_rows_per_s"])
            w.writeheader()
            for r in table:
                w.writerow({"backend": args.backend, "devices": ";".join(map(str, args.devices)),
                            "seqs_total": args.seqs, "keys": args.keys, "rows": args.rows,
                            "heads": args.heads, "topk": args.topk, **r})
        print(f"wrote {args.csv}")


def fmt(s):
    return f"{s * 1e3:.2f} ms" if s < 10 else f"{s:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
