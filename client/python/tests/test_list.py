"""list / scan_sequences on every client, against real daemons."""
import asyncio

import numpy as np
import pytest

import fp4idx


def _fill(c, seqs, page_size):
    """Appends (i % 5) * page_size // 2 + 1 keys to the i-th sequence ->
    {seq: (keys, pages)}."""
    want = {}
    for i, s in enumerate(seqs):
        n = (i % 5) * page_size // 2 + 1
        c.append(s, np.ones((n, 128), np.float32))
        want[s] = (n, -(-n // page_size))
    return want


def _walk(c, count):
    """A full scan by hand -> (list of entries, number of steps)."""
    out, cursor, steps = [], 0, 0
    while True:
        cursor, seqs = c.list(cursor, count)
        out.extend(seqs)
        steps += 1
        if cursor == 0:
            return out, steps
        assert steps < 10000, "the scan does not end"


def _as_dict(entries):
    d = {}
    for e in entries:
        d[e["seq"]] = (e["keys"], e["pages"])
    return d


def test_list_and_scan(make_daemon):
    d = make_daemon()
    with fp4idx.Client(d.socket, timeout=60) as c:
        assert c.list() == (0, [])
        assert list(c.scan_sequences()) == []
        ps = c.info()["page_size"]
        seqs = [3 * i + 1 for i in range(40)] + [2 ** 64 - 1]
        want = _fill(c, seqs, ps)
        got, steps = _walk(c, 7)
        assert _as_dict(got) == want and steps > 1
        assert all(set(e) == {"seq", "keys", "pages", "pages_shared"} for e in got)
        scanned = list(c.scan_sequences(count=3))
        assert len(scanned) == len(want) and _as_dict(scanned) == want
        # Bad counts: the daemon's errors, and the connection stays usable.
        with pytest.raises(fp4idx.ProtocolError):
            c.list(0, 0)
        with pytest.raises(fp4idx.TooBig):
            c.list(0, 10001)
        with pytest.raises(fp4idx.InvalidArgument):
            c.list(-1)
        with pytest.raises(fp4idx.InvalidArgument):
            c.list(0, -5)
        c.drop(seqs[0])
        want.pop(seqs[0])
        assert _as_dict(c.scan_sequences()) == want
        # In a pipeline, between other calls.
        res = c.pipeline().list(0, 10000).drop(seqs[1]).list(0, 10000).execute()
        assert res[0][0] == 0 and _as_dict(res[0][1]) == want
        want.pop(seqs[1])
        assert _as_dict(res[2][1]) == want


def test_list_async(make_daemon):
    d = make_daemon()

    async def main():
        async with fp4idx.AsyncClient(d.socket, timeout=60) as c:
            ps = (await c.info())["page_size"]
            want = {}
            for s in range(100, 130):
                await c.append(s, np.ones((s, 128), np.float32))
                want[s] = (s, -(-s // ps))
            cursor, seqs = await c.list(0, 10000)
            assert cursor == 0 and _as_dict(seqs) == want
            got = [e async for e in c.scan_sequences(count=4)]
            assert len(got) == len(want) and _as_dict(got) == want
            p = c.pipeline()
            p.list(0, 10000).list(0, 0)
            r = await p.execute(raise_on_error=False)
            assert _as_dict(r[0][1]) == want and isinstance(r[1], fp4idx.ProtocolError)
    asyncio.run(main())


def test_list_sharded(make_daemon):
    shards = [make_daemon() for _ in range(3)]
    socks = [d.socket for d in shards]
    with fp4idx.ShardedClient(socks, timeout=60) as sc:
        assert sc.list() == (1, []) and _walk(sc, 10) == ([], 3)  # each shard once
        ps = sc.info()["page_size"]
        seqs = list(range(1, 61))
        want = _fill(sc, seqs, ps)
        per_shard = [sh.info()["sequences"] for sh in sc.shards]
        assert all(n > 0 for n in per_shard)
        # The cursor encoding: shard (cursor % 3) is scanned, from its own
        # cursor (cursor // 3); the end of one shard hands on to the next.
        cursor, seen_shards, entries = 0, [], []
        while True:
            shard = cursor % 3
            own = cursor // 3
            ref_next, ref = sc.shards[shard].list(own, 4)
            nxt, got = sc.list(cursor, 4)
            assert _as_dict(got) == _as_dict(ref)
            assert all(sc.shard_of(e["seq"]) == shard for e in got)
            if ref_next:
                assert nxt == ref_next * 3 + shard
            else:
                assert nxt == (shard + 1 if shard < 2 else 0)
            seen_shards.append(shard)
            entries.extend(got)
            cursor = nxt
            if cursor == 0:
                break
        assert seen_shards == sorted(seen_shards) and set(seen_shards) == {0, 1, 2}
        assert _as_dict(entries) == want
        scanned = list(sc.scan_sequences(count=5))
        assert len(scanned) == len(want) and _as_dict(scanned) == want
        # One step with a count above every shard's size: one step per shard.
        _, steps = _walk(sc, 10000)
        assert steps == 3
        # A pipeline routes each step to its shard.
        res = sc.pipeline().list(0, 10000).list(1, 10000).list(2, 10000).execute()
        assert [r[0] for r in res] == [1, 2, 0]
        assert _as_dict(x for r in res for x in r[1]) == want
        with pytest.raises(fp4idx.TooBig):
            sc.list(1, 10001)
        assert sc.list(2, 10000)[0] == 0   # the shards' connections still in step
