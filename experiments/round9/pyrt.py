"""Round trips of the Python client (old package vs new) against one running
fp4idxd: 64-key score, 16,384 keys top-2048, 400,000 keys top-2048; R=4 x H=32."""
import importlib, statistics, sys, time
import numpy as np
sock, which = sys.argv[1], sys.argv[2]
sys.path.insert(0, {"old": ".dev/pyold/client/python", "new": "client/python"}[which])
import fp4idx
rng = np.random.default_rng(1)
c = fp4idx.Client(sock, timeout=60)
seqs = {}
for n, s in ((64, 11), (16384, 12), (int(sys.argv[3]) if len(sys.argv) > 3 else 400000, 13)):
    try:
        c.drop(s)
    except Exception:
        pass
    for i in range(0, n, 8192):
        m = min(8192, n - i)
        c.append(s, rng.standard_normal((m, 128), dtype=np.float32))
    seqs[n] = s
q = fp4idx.bf16_bits(rng.standard_normal((4, 32, 128), dtype=np.float32))
w = fp4idx.bf16_bits(rng.random((4, 32), dtype=np.float32))
out = []
for name, f, calls in (("score64", lambda: c.score(seqs[64], q, w), 2000),
                       ("16k top2048", lambda: c.topk(seqs[16384], q, w, 2048), 1000),
                       ("400k top2048", lambda: c.topk(seqs[max(seqs)], q, w, 2048), 1000)):
    for _ in range(100):
        f()
    t = []
    for _ in range(calls):
        t0 = time.perf_counter(); f(); t.append((time.perf_counter() - t0) * 1e6)
    out.append(f"{name} {statistics.median(t):.1f}")
print(which, c.busy_poll_us, " | ".join(out))
