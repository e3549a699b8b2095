"""Host regions (PROTOCOL.md "Regions") through the Python client, CPU
daemons: the same bytes as the socket path, out= written in place, bulk
data kept off the socket (the daemon's request/response byte counters), and
every refusal a clear error that changes nothing."""
import asyncio

import numpy as np
import pytest

import fp4idx
from fp4idx import ops
from fp4idx.regions import Ref


def case(n=700, rows=4, heads=16, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n, 128), dtype=np.float32)
    q = fp4idx.bf16_bits(rng.standard_normal((rows, heads, 128), dtype=np.float32))
    w = fp4idx.bf16_bits(rng.random((rows, heads), dtype=np.float32))
    return keys, q, w


def put(region, a):
    """A copy of numpy array `a` in `region` (bump-allocated)."""
    v = region.array(a.dtype, a.shape)
    v[...] = a
    return v


def traffic(c, fn):
    """-> (request, response) bytes the daemon counted for fn(). A stats
    reply counts in the next one; its own size is measured by a pair of
    calls first and taken off."""
    s0, s1 = c.stats(), c.stats()
    fn()
    s2 = c.stats()
    own = [s1[k] - s0[k] for k in ("request_bytes", "response_bytes")]
    return tuple(s2[k] - s1[k] - o for k, o in zip(("request_bytes", "response_bytes"), own))


def test_append_score_topk_equal_socket_path(client, seq):
    keys, q, w = case()
    lens = np.array([700, 350, 5, 0], np.int32)
    mask = (np.arange(4 * 700).reshape(4, 700) % 3 != 0)
    s_sock, s_reg = seq(), seq()
    with client.region(4 << 20) as r:
        for dtype in (np.float32, np.uint16):   # f32 and bf16 keys
            src = keys if dtype == np.float32 else fp4idx.bf16_bits(keys)
            a, b = seq(), seq()
            client.append(a, src)
            client.append(b, put(r, src))
            assert np.array_equal(client.read(a), client.read(b))
        packed = client.read(a)                 # u8 [n,68] keys from the region
        client.append(s_sock, packed)
        assert client.append(s_reg, put(r, packed)) == (0, 700)
        assert np.array_equal(client.read(s_sock), client.read(s_reg))

        qr, wr, lr, mr = put(r, q), put(r, w), put(r, lens), put(r, mask)
        want = client.score(s_sock, q, w, lens=lens, mask=mask)
        got = client.score(s_reg, qr, wr, lens=lr, mask=mr)
        assert got.tobytes() == want.tobytes()
        for k in (1, 16, 700, 900):
            want_t = client.topk(s_sock, q, w, k, lens=lens)
            got_t = client.topk(s_reg, qr, wr, k, lens=lr)
            for x, y in zip(got_t, want_t):
                assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_references_keep_bulk_off_the_socket(client, seq):
    keys, q, w = case(n=4000, rows=4, heads=32)
    s = seq()
    with client.region(8 << 20) as r:
        k = put(r, keys)
        sent, got = traffic(client, lambda: client.append(s, k))
        assert sent < 1000 and got < 1000, (sent, got)   # not the 2 MB of keys
        qr, wr = put(r, q), put(r, w)
        out = r.array(np.float32, (4, 4000))
        sent, got = traffic(client, lambda: client.score(s, qr, wr, out=out))
        assert sent < 1000 and got < 1000, (sent, got)   # not q's 32 KB, the logits' 64 KB
        res = []
        sent, got = traffic(client, lambda: res.append(client.score(s, q, w)))
        inline = res[0]
        assert sent > q.nbytes and got > inline.nbytes   # the socket path does carry them
        assert out.tobytes() == inline.tobytes()


def test_out_written_in_place(client, seq):
    keys, q, w = case(n=300)
    s = seq()
    client.append(s, keys)
    with client.region(1 << 20) as r:
        out = r.array(np.float32, (4, 300))
        out[...] = np.nan
        res = client.score(s, q, w, out=out)
        assert res is out
        assert out.tobytes() == client.score(s, q, w).tobytes()
        # The same bytes through another view of the region's memory.
        off = out.__array_interface__["data"][0] - r.base
        again = r.array(np.float32, (4, 300), offset=off)
        assert again.tobytes() == out.tobytes()
        pos, val, cnt = (r.array(np.int32, (4, 8)), r.array(np.float32, (4, 8)),
                         r.array(np.int32, (4,)))
        for a in (pos, val, cnt):
            a[...] = 77
        res = client.topk(s, q, w, 8, lens=[300, 5, 2, 0], out=(pos, val, cnt))
        assert res[0] is pos and res[1] is val and res[2] is cnt
        want = client.topk(s, q, w, 8, lens=[300, 5, 2, 0])
        for x, y in zip((pos, val, cnt), want):
            assert x.tobytes() == y.tobytes()
        assert list(cnt) == [8, 5, 2, 0] and pos[3, 0] == -1
        # score_many with out on one entry, the other through the socket.
        out2 = r.array(np.float32, (4, 300))
        a, b = client.score_many([{"seq": s, "q": q, "w": w, "out": out2},
                                  {"seq": s, "q": q, "w": w}], heads=16)
        assert a is out2 and a.tobytes() == b.tobytes()


def test_pipeline_and_async(client, daemon, seq):
    keys, q, w = case(n=200)
    s = seq()
    with client.region(1 << 20) as r:
        k, qr, wr = put(r, keys), put(r, q), put(r, w)
        out = r.array(np.float32, (4, 200))
        p = client.pipeline()
        p.append(s, k).score(s, qr, wr, out=out).score(s, q, w)
        (_, n), got, want = p.execute()
        assert n == 200 and got is out and out.tobytes() == want.tobytes()

    async def run():
        s2 = seq()
        async with fp4idx.AsyncClient(daemon.socket, timeout=60) as a:
            async with await a.region(1 << 20) as ar:
                await a.append(s2, put(ar, keys))
                outs = [ar.array(np.float32, (4, 200)) for _ in range(4)]
                qa, wa = put(ar, q), put(ar, w)
                res = await asyncio.gather(*(a.score(s2, qa, wa, out=o) for o in outs),
                                           a.score(s2, q, w))
                for o, x in zip(outs, res):
                    assert x is o and o.tobytes() == res[-1].tobytes()
                with pytest.raises(fp4idx.InvalidArgument):
                    ar.close()                  # an async region: aclose
            assert ar.closed
            with pytest.raises(fp4idx.NoRegion):
                await a._run(ops.unregister(ar.id))
        return res[-1]
    assert asyncio.run(run()).tobytes() == want.tobytes()


def test_refused_references_change_nothing(client, seq):
    keys, q, w = case(n=100)
    s, fresh = seq(), seq()
    client.append(s, keys)
    with client.region(1 << 16) as r:
        # A region this connection never registered.
        with pytest.raises(fp4idx.NoRegion, match="not registered"):
            client.append(fresh, Ref(r.id + 40, 0, "f32", [1, 128]))
        with pytest.raises(fp4idx.NoSequence):
            client.read(fresh)                  # nothing was created
        # Out of bounds, and misaligned, as the daemon checks them.
        with pytest.raises(fp4idx.RegionError, match="outside region"):
            client.append(fresh, r.ref("f32", [1, 128], r.size - 256))
        with pytest.raises(fp4idx.RegionError, match="multiple of 4"):
            client.append(fresh, r.ref("f32", [1, 128], 2))
        with pytest.raises(fp4idx.NoSequence):
            client.read(fresh)
        # ... and as the client finds them first, before sending anything.
        with pytest.raises(fp4idx.RegionError, match="multiple of 4"):
            r.array(np.float32, (1, 128), offset=2)
        with pytest.raises(fp4idx.RegionError, match="outside region"):
            r.array(np.float32, (1, 128), offset=r.size - 4)
        raw = r.array(np.uint8, (1 << 16,), offset=0)
        odd = raw[1:1 + 2 * 16 * 128].view(np.uint16).reshape(1, 16, 128)
        with pytest.raises(fp4idx.RegionError, match="not aligned"):
            client.score(s, odd, w[:1])
        with pytest.raises(fp4idx.RegionError, match="is sent as bf16"):
            client.score(s, r.array(np.float32, (1, 16, 128), offset=0), w[:1])
        with pytest.raises(fp4idx.RegionError, match="is sent as f32"):
            client.append(fresh, r.array(">f4", (1, 128), offset=0))   # big-endian bytes
        with pytest.raises(fp4idx.RegionError, match="non-contiguous"):
            client.score(s, q[:1], w[:1], out=r.array(np.float32, (1, 200), offset=0)[:, ::2])
        # Bump allocator full.
        with pytest.raises(fp4idx.RegionError, match="do not fit"):
            r.array(np.uint8, (1 << 17,))


def test_overlap_and_out_outside_regions(client, seq):
    keys, q, w = case(n=64, rows=1, heads=4)
    s = seq()
    client.append(s, keys)
    with client.region(1 << 16) as r:
        qr = put(r, q)
        before = bytes(r.array(np.uint8, (1 << 16,), offset=0))
        # logits [1,64] f32 written over q's first bytes.
        over = r.array(np.float32, (1, 64), offset=qr.__array_interface__["data"][0] - r.base)
        with pytest.raises(fp4idx.RegionError, match="overlap"):
            client.score(s, qr, w, out=over)
        assert bytes(r.array(np.uint8, (1 << 16,), offset=0)) == before   # untouched
        with pytest.raises(fp4idx.NoRegion, match="not in a region"):
            client.score(s, q, w, out=np.zeros((1, 64), np.float32))
        with pytest.raises(fp4idx.ShapeMismatch):
            client.score(s, qr, w, out=r.array(np.float32, (1, 63)))
        t_out = (r.array(np.int32, (1, 4)), r.array(np.float32, (1, 4)), r.array(np.int32, (1,)))
        with pytest.raises(fp4idx.RegionError, match="overlap"):
            client.topk(s, qr, w, 4, out=(t_out[0], t_out[0].view(np.float32), t_out[2]))


def test_closed_region(client, seq):
    keys, q, w = case(n=50)
    s = seq()
    r = client.region(1 << 16)
    k = put(r, keys)
    rid = r.id
    r.close()
    r.close()                                   # twice: a no-op
    assert r.closed
    with pytest.raises(fp4idx.RegionError, match="closed"):
        client.append(s, k)                     # a view of the closed region
    with pytest.raises(fp4idx.RegionError, match="closed"):
        r.array(np.float32, (1, 128))
    with pytest.raises(fp4idx.NoRegion):
        client.append(s, Ref(rid, 0, "f32", [1, 128]))   # unregistered on the daemon
    assert k.sum() == keys.sum()                # our view stays readable
    with pytest.raises(fp4idx.NoSequence):
        client.read(s)


def test_other_connection_cannot_use_it(daemon, client, seq):
    keys, q, w = case(n=80)
    s = seq()
    client.append(s, keys)
    with client.region(1 << 16) as r, fp4idx.Client(daemon.socket, timeout=60) as other:
        k, qr = put(r, keys), put(r, q)
        with pytest.raises(fp4idx.NoRegion):
            other.append(seq(), r.ref("f32", [80, 128], k.__array_interface__["data"][0] - r.base))
        with pytest.raises(fp4idx.NoRegion):
            other._run(ops.unregister(r.id))
        with pytest.raises(fp4idx.NoRegion, match="not in a region"):
            other.score(s, q, w, out=r.array(np.float32, (4, 80)))
        # Its arrays are plain memory to the other client: they go inline.
        assert other.score(s, qr, w).tobytes() == client.score(s, q, w).tobytes()
        assert client.score(s, qr, w).tobytes() == client.score(s, q, w).tobytes()   # still ours


def test_close_releases_regions(daemon, seq):
    keys, q, w = case(n=40)
    c = fp4idx.Client(daemon.socket, timeout=60)
    r = c.region(1 << 16)
    k = put(r, keys)
    c.close()                                   # the daemon releases them with the connection
    assert r.closed and "connection closed" in r.released
    with pytest.raises(fp4idx.RegionError, match="connection closed"):
        c.append(seq(), k)                      # reconnects; the region is gone
    with pytest.raises(fp4idx.NoRegion):
        c.append(seq(), Ref(r.id, 0, "f32", [1, 128]))
    r2 = c.region(1 << 16)                      # the new connection registers again
    assert not r2.closed
    assert c.append(seq(), put(r2, keys)) == (0, 40)
    c.close()


def test_region_caps_and_sharded(daemon, make_daemon):
    with fp4idx.Client(daemon.socket, timeout=60) as c:
        regs = [c.region(4096) for _ in range(16)]
        with pytest.raises(fp4idx.TooBig):
            c.region(4096)
        regs[0].close()
        regs.append(c.region(4096))             # a slot freed by unregister
        assert len({x.id for x in regs}) == 17   # ids never reused
        with pytest.raises(fp4idx.InvalidArgument):
            c.region(0)
        # A CUDA region on a CPU daemon: the daemon says so (no GPU needed).
        with pytest.raises(fp4idx.RegionError, match="CPU backend"):
            c._run(ops.register_cuda(bytes(64), 4096, 0))
        # A host register without its fd.
        with pytest.raises(fp4idx.RegionError, match="SCM_RIGHTS"):
            c._run(ops.register_host(4096))
    d2 = make_daemon()
    with fp4idx.ShardedClient([daemon.socket, d2.socket], timeout=60) as sc:
        keys, q, w = case(n=30)
        sc.append(5, keys)
        with pytest.raises(fp4idx.NoRegion):
            sc.score(5, q, w, out=np.zeros((4, 30), np.float32))
        sc.drop(5)
