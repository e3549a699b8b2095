"""Client.topk's reply region (reply_region): large results come back
through a host region of the connection, with the socket's values, no
result bytes on the socket, a region that grows and comes back after a
reconnect, the socket's errors, and reply_region=0 for the socket."""
import numpy as np
import pytest

import fp4idx
from fp4idx import client as client_mod


def _sent(c):
    return c.stats()["response_bytes"]


def test_topk_through_the_reply_region_equals_the_socket(daemon, seq):
    rng = np.random.default_rng(11)
    s = seq()
    keys = rng.standard_normal((5000, 128), dtype=np.float32)
    q = fp4idx.bf16_bits(rng.standard_normal((4, 16, 128), dtype=np.float32))
    w = fp4idx.bf16_bits(rng.random((4, 16), dtype=np.float32))
    lens = np.array([5000, 4999, 3000, 17], dtype=np.int32)
    with fp4idx.Client(daemon.socket, timeout=60) as c, \
            fp4idx.Client(daemon.socket, timeout=60, reply_region=0) as plain:
        assert c.reply_region == client_mod.REPLY_REGION_DEFAULT == 16 << 10
        c.append(s, keys)
        for i, k in enumerate((16, 2048, 1200, 4096, 2048, 4096)):
            if i == 3:
                small = c._reply                   # k 4096 outgrows it
            if i == 4:
                assert small.closed and c._reply is not small
                c.close()                          # a new connection: a new region
            b0 = _sent(c)
            got = c.topk(s, q, w, k, lens=lens)
            sent = _sent(c) - b0                   # the first stats reply's bytes too
            want = plain.topk(s, q, w, k, lens=lens)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert a.tobytes() == b.tobytes()
            nbytes = 4 * k * 8 + 16
            if nbytes >= c.reply_region:
                assert sent < nbytes // 2, f"k {k}: {sent} bytes on the socket"
            else:
                assert sent >= nbytes
        assert c._reply is not None and c._reply.size >= 4 * 4096 * 8 + 16
        # the returned arrays are the caller's: a later call does not change them
        first = c.topk(s, q, w, 2048, lens=lens)
        keep = [a.copy() for a in first]
        c.topk(s, q[:, ::-1].copy(), w, 2048, lens=lens)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(first, keep))
        # errors as the socket gives them
        for cl in (c, plain):
            with pytest.raises(fp4idx.NoSequence):
                cl.topk(s + 99999, q, w, 2048)
        bad = q.copy()
        bad[0, 0, 0] = 0x7fc0                      # NaN
        with pytest.raises(fp4idx.NonFinite):
            c.topk(s, bad, w, 2048)
        assert c.topk(s, q, w, 2048, lens=lens)[2].tolist() == [2048, 2048, 2048, 17]
    with pytest.raises(fp4idx.InvalidArgument, match="reply_region"):
        fp4idx.Client(daemon.socket, reply_region=-1)


def test_no_room_for_a_reply_region_uses_the_socket(daemon, seq):
    """A connection holding the daemon's 16 regions: topk by the socket,
    right, and reply_region drops to 0 (no register attempt per call)."""
    rng = np.random.default_rng(12)
    s = seq()
    q = fp4idx.bf16_bits(rng.standard_normal((4, 16, 128), dtype=np.float32))
    w = fp4idx.bf16_bits(rng.random((4, 16), dtype=np.float32))
    with fp4idx.Client(daemon.socket, timeout=60) as c, \
            fp4idx.Client(daemon.socket, timeout=60, reply_region=0) as plain:
        c.append(s, rng.standard_normal((3000, 128), dtype=np.float32))
        held = [c.region(4096) for _ in range(16)]
        for _ in range(2):
            b0 = _sent(c)
            got = c.topk(s, q, w, 2048)
            assert _sent(c) - b0 >= 4 * 2048 * 8
        assert c.reply_region == 0
        want = plain.topk(s, q, w, 2048)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
        for r in held:
            r.close()
