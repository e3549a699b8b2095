"""CUDA regions through the Python client: torch CUDA tensors registered by
their IPC handle with a CUDA fp4idxd, keys appended from the region and
results scored into CUDA tensors, compared byte for byte with the socket
path and with a CPU daemon. Skipped without torch and a GPU (run on the GPU
machine with `pytest client/python/tests -k cuda`)."""
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import fp4idx  # noqa: E402
from fp4idx import ops  # noqa: E402

N, R, H = 5000, 4, 32


def host_bytes(x):
    """The bytes of a result, a numpy array or a torch tensor (on any device)."""
    return x.cpu().numpy().tobytes() if isinstance(x, torch.Tensor) else x.tobytes()


def carve(buf, nbytes, dtype, shape, at):
    """A tensor of `dtype`/`shape` at byte at[0] of uint8 tensor `buf`."""
    off = (at[0] + 255) // 256 * 256
    at[0] = off + nbytes
    return buf[off:off + nbytes].view(dtype).view(*shape)


def inputs_in_one_buffer(seed):
    """Keys, q, w and lens (seeded) on the host, and one CUDA buffer with
    the keys, q, w and lens copied into it and room for full logits and a
    top-64: a SimpleNamespace of both (buf, k_d, q_d, w_d, l_d, logits_d,
    pos_d, val_d, cnt_d; qn and wn: q and w as numpy uint16)."""
    g = torch.Generator().manual_seed(seed)
    t = SimpleNamespace(keys=torch.randn(N, 128, generator=g),
                        q=torch.randn(R, H, 128, generator=g).to(torch.bfloat16),
                        w=torch.rand(R, H, generator=g).to(torch.bfloat16),
                        lens=torch.tensor([N, N // 2, 7, 0], dtype=torch.int32),
                        dev=torch.device("cuda", torch.cuda.current_device()))
    t.buf = torch.zeros(16 << 20, dtype=torch.uint8, device=t.dev)
    at = [0]
    t.k_d = carve(t.buf, N * 512, torch.float32, (N, 128), at)
    t.q_d = carve(t.buf, R * H * 256, torch.bfloat16, (R, H, 128), at)
    t.w_d = carve(t.buf, R * H * 2, torch.bfloat16, (R, H), at)
    t.l_d = carve(t.buf, R * 4, torch.int32, (R,), at)
    t.logits_d = carve(t.buf, R * N * 4, torch.float32, (R, N), at)
    t.pos_d = carve(t.buf, R * 64 * 4, torch.int32, (R, 64), at)
    t.val_d = carve(t.buf, R * 64 * 4, torch.float32, (R, 64), at)
    t.cnt_d = carve(t.buf, R * 4, torch.int32, (R,), at)
    t.k_d.copy_(t.keys)
    t.q_d.copy_(t.q)
    t.w_d.copy_(t.w)
    t.l_d.copy_(t.lens)
    t.qn = t.q.view(torch.int16).numpy().view(np.uint16)
    t.wn = t.w.view(torch.int16).numpy().view(np.uint16)
    return t


@pytest.fixture(scope="module")
def cuda_daemon():
    from conftest import Daemon
    d = Daemon(cache_bytes="1G", backend="cuda")
    yield d
    d.close()


def test_cuda_region_equals_socket_and_cpu(cuda_daemon, daemon):
    t = inputs_in_one_buffer(3)
    keys, lens, dev, buf = t.keys, t.lens, t.dev, t.buf
    k_d, q_d, w_d, l_d = t.k_d, t.q_d, t.w_d, t.l_d
    logits_d, pos_d, val_d, cnt_d = t.logits_d, t.pos_d, t.val_d, t.cnt_d
    qn, wn = t.qn, t.wn
    logits_d.fill_(float("nan"))

    with fp4idx.Client(cuda_daemon.socket, timeout=120) as c, \
            fp4idx.Client(daemon.socket, timeout=120) as cpu:
        assert c.info()["backend"] == "cuda"
        with c.register_cuda(buf) as r:
            assert r.kind == "cuda" and r.size >= buf.numel()
            s_reg, s_sock, s_cpu = 71001, 71002, 71003
            assert c.append(s_reg, k_d) == (0, N)          # keys read from the region
            c.append(s_sock, keys.numpy())
            cpu.append(s_cpu, keys.numpy())
            packed = c.read(s_sock)
            assert np.array_equal(c.read(s_reg), packed)
            assert np.array_equal(cpu.read(s_cpu), packed)

            res = c.score(s_reg, q_d, w_d, out=logits_d)
            assert res is logits_d
            want = c.score(s_sock, qn, wn)
            assert logits_d.cpu().numpy().tobytes() == want.tobytes()
            assert cpu.score(s_cpu, qn, wn).tobytes() == want.tobytes()

            res = c.topk(s_reg, q_d, w_d, 64, lens=l_d, out=(pos_d, val_d, cnt_d))
            assert res[0] is pos_d
            want_t = c.topk(s_sock, qn, wn, 64, lens=lens.numpy())
            for x, y in zip((pos_d, val_d, cnt_d), want_t):
                assert x.cpu().numpy().tobytes() == y.tobytes()
            for x, y in zip(want_t, cpu.topk(s_cpu, qn, wn, 64, lens=lens.numpy())):
                assert x.tobytes() == y.tobytes()

            # A CUDA tensor of another allocation is no out= target.
            with pytest.raises(fp4idx.NoRegion):
                c.score(s_reg, q_d, w_d, out=torch.empty(R, N, device=dev))
            # Overlap of an output with an input, checked by the daemon.
            q_off = q_d.data_ptr() - buf.data_ptr()
            over = buf[q_off:q_off + R * N * 4].view(torch.float32).view(R, N)
            with pytest.raises(fp4idx.RegionError, match="overlap"):
                c.score(s_reg, q_d, w_d, out=over)
            for s in (s_reg, s_sock):
                c.drop(s)
            cpu.drop(s_cpu)


def test_cuda_region_refusals(cuda_daemon, daemon):
    buf = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    with fp4idx.Client(cuda_daemon.socket, timeout=60) as c:
        with pytest.raises(fp4idx.RegionError, match="device"):
            c.register_cuda(buf, device=torch.cuda.current_device() + 1)
        with pytest.raises(fp4idx.RegionError):
            c._run(ops.register_cuda(bytes(64), 4096, torch.cuda.current_device()))
    with fp4idx.Client(daemon.socket, timeout=60) as cpu:
        with pytest.raises(fp4idx.RegionError, match="CUDA backend"):
            cpu.register_cuda(buf)


def test_cuda_region_inputs_are_checked_on_the_device(cuda_daemon):
    """q, w and lens in a CUDA region are read by the kernels where they lie
    and checked on the device: a NaN, an inf or a length out of range fails
    the call with the message a host input gets, writes no output, and the
    next good call gives the socket's bytes. With lens in the region, full
    logits are as wide as the out tensor the caller gives (-inf past each
    row's length)."""
    t = inputs_in_one_buffer(5)
    keys, q, w, lens, buf = t.keys, t.q, t.w, t.lens, t.buf
    q_d, w_d, l_d, logits_d = t.q_d, t.w_d, t.l_d, t.logits_d
    qn, wn = t.qn, t.wn
    outs = (t.pos_d, t.val_d, t.cnt_d)
    s = 72001
    with fp4idx.Client(cuda_daemon.socket, timeout=120) as c:
        c.append(s, keys.numpy())
        want_t = c.topk(s, qn, wn, 64, lens=lens.numpy())
        with c.register_cuda(buf):
            bad = [(lambda: q_d[1, 3].__setitem__(5, float("nan")), q_d, q,
                    fp4idx.NonFinite, r"q\[1,3,5\] is NaN"),
                   (lambda: w_d[3].__setitem__(31, float("inf")), w_d, w,
                    fp4idx.NonFinite, r"w\[3,31\] is inf"),
                   (lambda: l_d.__setitem__(2, N + 1), l_d, lens,
                    fp4idx.OutOfRange, rf"lens\[2\] = {N + 1} outside 0\.\.{N}")]
            for spoil, t, good, exc, msg in bad:
                spoil()
                for o in outs:
                    o.fill_(-7)
                torch.cuda.synchronize()
                with pytest.raises(exc, match=msg):
                    c.topk(s, q_d, w_d, 64, lens=l_d, out=outs)
                for o in outs:   # nothing written
                    assert bool((o == -7).all())
                with pytest.raises(exc, match=msg):   # results by the socket
                    c.topk(s, q_d, w_d, 64, lens=l_d)
                t.copy_(good)
                torch.cuda.synchronize()
            res = c.topk(s, q_d, w_d, 64, lens=l_d, out=outs)
            for x, y in zip(res, want_t):
                assert x.cpu().numpy().tobytes() == y.tobytes()
            for x, y in zip(c.topk(s, q_d, w_d, 64, lens=l_d), want_t):
                assert host_bytes(x) == y.tobytes()

            # full logits as wide as out= (N), lens in the region
            logits_d.fill_(7.0)
            c.score(s, q_d, w_d, lens=l_d, out=logits_d)
            full = c.score(s, qn, wn)   # every key visible
            got = logits_d.cpu().numpy()
            for r in range(R):
                n = int(lens[r])
                assert got[r, :n].tobytes() == full[r, :n].tobytes()
                assert np.all(np.isneginf(got[r, n:]))
        c.drop(s)
