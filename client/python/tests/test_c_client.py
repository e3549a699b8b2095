"""Bit for bit against the C client (fp4idx-cli, built on libfp4idx-client)
and the golden files: appends, full logits, top-k, packed and dequantized
reads."""
import json
import os

import numpy as np
import pytest

import fp4idx
from fp4idx import arrays
from conftest import GOLDEN, cli

CASES = ["dyadic_h32", "gauss_h32", "gauss_h64"]


def golden(name):
    meta = json.load(open(os.path.join(GOLDEN, "manifest.json")))[name]
    dt = {"bf16": "<u2", "float32": "<f4", "int32": "<i4", "uint8": "u1"}[meta["dtype"]]
    return np.fromfile(os.path.join(GOLDEN, name), dtype=dt).reshape(meta["shape"])


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def cli_score(tmp_path, sock, seq, q, w, lens=None, topk=None):
    """fp4idx-cli score --format raw -> logits, or (positions, logits)."""
    qf, wf, out = tmp_path / "q.bin", tmp_path / "w.bin", tmp_path / "out.bin"
    q.astype("<u2").tofile(qf)
    w.astype("<u2").tofile(wf)
    args = ["score", seq, "--q", qf, "--w", wf, "--heads", q.shape[1],
            "--format", "raw", "--out", out]
    if lens is not None:
        args += ["--lens", ",".join(str(int(v)) for v in lens)]
    if topk is not None:
        args += ["--topk", topk]
    cli(sock, *args)
    raw = out.read_bytes()
    R = q.shape[0]
    if topk is None:
        return np.frombuffer(raw, "<f4").reshape(R, -1)
    half = len(raw) // 2
    return (np.frombuffer(raw[:half], "<i4").reshape(R, topk),
            np.frombuffer(raw[half:], "<f4").reshape(R, topk))


@pytest.mark.parametrize("case", CASES)
def test_golden_scores_equal_reference_and_c_client(case, client, daemon, seq, tmp_path):
    keys, q, w = golden(f"{case}_keys.bin"), golden(f"{case}_q.bin"), golden(f"{case}_w.bin")
    lens, ref = golden(f"{case}_lens.bin"), golden(f"{case}_ref.bin")
    s_py, s_c = seq(), seq()
    assert client.append(s_py, keys) == (0, len(keys))          # uint16 = bf16 bits
    keys.tofile(tmp_path / "k.bin")
    cli(daemon.socket, "append", s_c, tmp_path / "k.bin", "--dtype", "bf16")
    # The keys the C client stored are the bytes this client stored.
    assert np.array_equal(client.read(s_py), client.read(s_c))

    logits = client.score(s_py, q, w, lens=lens)
    W = int(lens.max())
    assert logits.shape == (q.shape[0], W) and logits.dtype == np.float32
    assert np.array_equal(bits(logits), bits(ref[:, :W]))
    assert np.array_equal(bits(logits), bits(cli_score(tmp_path, daemon.socket, s_c, q, w, lens)))

    for k in (1, 16, 100):
        pos, val, cnt = client.topk(s_py, q, w, k, lens=lens)
        cpos, cval = cli_score(tmp_path, daemon.socket, s_c, q, w, lens, topk=k)
        assert pos.dtype == np.int32 and cnt.dtype == np.int32
        assert np.array_equal(pos, cpos) and np.array_equal(bits(val), bits(cval))
        assert np.array_equal(cnt, np.minimum(lens, k))


@pytest.mark.parametrize("rounding", ["rne", "threshold"])
def test_golden_quantizer(rounding, client, seq):
    keys = golden("quant_keys.bin")
    tag = "rne" if rounding == "rne" else "thr"
    s = seq()
    client.append(s, keys, rounding=rounding)
    packed = client.read(s)
    assert packed.dtype == np.uint8 and packed.shape == (len(keys), 68)
    assert np.array_equal(packed[:, :64], golden(f"quant_payload_{tag}.bin"))
    assert np.array_equal(packed[:, 64:], golden(f"quant_scales_{tag}.bin"))
    # Packed keys go back in unchanged.
    s2 = seq()
    client.append(s2, packed)
    assert np.array_equal(client.read(s2), packed)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_cases_equal_c_client(seed, client, daemon, seq, tmp_path):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 700))
    H = int(rng.choice([1, 7, 32, 64, 128]))
    R = int(rng.integers(1, 6))
    keys = (rng.standard_normal((n, 128)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    s_py, s_c = seq(), seq()
    client.append(s_py, keys)                                   # f32, daemon quantizes
    keys.tofile(tmp_path / "k.bin")
    cli(daemon.socket, "append", s_c, tmp_path / "k.bin", "--dtype", "f32")
    assert np.array_equal(client.read(s_py), client.read(s_c))
    dq = client.read(s_py, dequant=True)
    cli(daemon.socket, "read", s_c, "--dequant", "--out", tmp_path / "dq.bin")
    assert np.array_equal(bits(dq), np.fromfile(tmp_path / "dq.bin", "<u4").reshape(n, 128))

    qf = rng.standard_normal((R, H, 128)).astype(np.float32)
    wf = rng.random((R, H)).astype(np.float32)
    qb, wb = fp4idx.bf16_bits(qf), fp4idx.bf16_bits(wf)
    lens = rng.integers(0, n + 1, R).astype(np.int32)
    lens[0] = n
    # float32 q/w are rounded by the client exactly as the bf16 bits are.
    got = client.score(s_py, qf, wf, lens=lens)
    assert np.array_equal(bits(got), bits(client.score(s_py, qb, wb, lens=lens)))
    assert np.array_equal(bits(got), bits(cli_score(tmp_path, daemon.socket, s_c, qb, wb, lens)))
    assert np.all(np.isneginf(got[np.arange(n)[None, :] >= lens[:, None]]))
    k = int(rng.integers(1, 40))
    pos, val, cnt = client.topk(s_py, qf, wf, k, lens=lens)
    cpos, cval = cli_score(tmp_path, daemon.socket, s_c, qb, wb, lens, topk=k)
    assert np.array_equal(pos, cpos) and np.array_equal(bits(val), bits(cval))


def test_mask_hides_positions(client, seq):
    rng = np.random.default_rng(9)
    s = seq()
    client.append(s, rng.standard_normal((200, 128)).astype(np.float32))
    q = rng.standard_normal((3, 4, 128)).astype(np.float32)
    w = rng.random((3, 4)).astype(np.float32)
    mask = rng.random((3, 200)) < 0.5
    full = client.score(s, q, w)
    masked = client.score(s, q, w, mask=mask)
    assert np.array_equal(bits(masked[mask]), bits(full[mask]))
    assert np.all(np.isneginf(masked[~mask]))
    pos, _, cnt = client.topk(s, q, w, 300, mask=mask.astype(np.uint8))
    assert np.array_equal(cnt, mask.sum(1))
    for r in range(3):
        assert set(pos[r, :cnt[r]]) == set(np.flatnonzero(mask[r]))


@pytest.mark.parametrize("impl", ["numpy", "bf16_bits"])
def test_bf16_rounding_is_rne(impl):
    # bf16_bits takes ml_dtypes' cast when it is installed, numpy ops otherwise.
    rne = arrays._rne_numpy if impl == "numpy" else fp4idx.bf16_bits
    # Ties go to the even bf16: 1 + 2^-8 -> 1.0, 1 + 3*2^-8 -> 1 + 2^-6.
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20,
                  -2.5, 3.4e38, np.inf, -np.inf, 0.0, -0.0], np.float32)
    b = rne(x)
    assert list(b) == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x7F80,
                       0x7F80, 0xFF80, 0x0000, 0x8000]
    nan = np.array([np.nan, -np.nan], np.float32)
    nan[0:1].view(np.uint32)[0] = 0x7FFFFFFF   # the payload that would wrap
    assert np.all(rne(nan) & 0x7FFF > 0x7F80)
    rng = np.random.default_rng(0)
    f = (rng.standard_normal(100000) * 10.0 ** rng.uniform(-30, 30, 100000)).astype(np.float32)
    b = rne(f)
    back = (b.astype(np.uint32) << 16).view(np.float32)
    nxt = ((b.astype(np.uint32) + 1) << 16).view(np.float32)
    prv = ((b.astype(np.uint32) - 1) << 16).view(np.float32)
    err = np.abs(f.astype(np.float64) - back)
    assert np.all(err <= np.abs(f.astype(np.float64) - nxt))   # nearest
    assert np.all(err <= np.abs(f.astype(np.float64) - prv))


def test_bf16_inputs_ml_dtypes(client, seq):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    kf = rng.standard_normal((70, 128)).astype(np.float32)
    kb = kf.astype(ml_dtypes.bfloat16)
    s1, s2 = seq(), seq()
    client.append(s1, kb)
    client.append(s2, kb.view(np.uint16))
    assert np.array_equal(client.read(s1), client.read(s2))
    q = rng.standard_normal((2, 8, 128)).astype(np.float32)
    w = rng.random((2, 8)).astype(np.float32)
    # ml_dtypes' float32 -> bf16 cast is RNE too: the same bits as ours.
    assert np.array_equal(q.astype(ml_dtypes.bfloat16).view(np.uint16), fp4idx.bf16_bits(q))
    a = client.score(s1, q.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16))
    assert np.array_equal(bits(a), bits(client.score(s1, q, w)))
