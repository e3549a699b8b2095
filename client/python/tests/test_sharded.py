"""ShardedClient over three daemons gives what one daemon gives."""
import numpy as np
import pytest

import fp4idx


@pytest.fixture
def three(make_daemon):
    return [make_daemon(cache_bytes="32M") for _ in range(3)]


def test_sharded_equals_one_daemon(three, make_daemon):
    one = make_daemon(cache_bytes="64M")
    rng = np.random.default_rng(21)
    seqs = [int(s) for s in rng.integers(0, 2 ** 63, 24)]
    H = 8
    with fp4idx.ShardedClient([d.socket for d in three], timeout=60) as sc, \
            fp4idx.Client(one.socket, timeout=60) as c:
        for s in seqs:
            k = rng.standard_normal((int(rng.integers(1, 300)), 128)).astype(np.float32)
            assert sc.append(s, k) == c.append(s, k)
        # Every shard holds some sequences, each sequence on exactly one shard.
        counts = [sh.info()["sequences"] for sh in sc.shards]
        assert sum(counts) == len(seqs) and all(n > 0 for n in counts)
        for s in seqs:
            assert sc.shards[sc.shard_of(s)].read(s).shape == c.read(s).shape
        entries = []
        for s in seqs + seqs[:5]:      # the same sequence may appear twice
            R = int(rng.integers(1, 4))
            entries.append({"seq": s, "q": rng.standard_normal((R, H, 128)).astype(np.float32),
                            "w": rng.random((R, H)).astype(np.float32)})
        for topk in (None, 5):
            got = sc.score_many(entries, H, topk=topk)
            ref = c.score_many(entries, H, topk=topk)
            assert len(got) == len(entries)
            for g, r in zip(got, ref):
                if topk is None:
                    assert np.array_equal(g.view(np.uint32), r.view(np.uint32))
                else:
                    assert all(np.array_equal(x, y) for x, y in zip(g, r))
        e = entries[0]
        assert np.array_equal(sc.score(e["seq"], e["q"], e["w"]), c.score(e["seq"], e["q"], e["w"]))
        assert sc.truncate(seqs[0], 1) == c.truncate(seqs[0], 1) == 1
        sc.drop(seqs[1])
        c.drop(seqs[1])
        info, ref_info = sc.info(), c.info()
        assert info["sequences"] == ref_info["sequences"] == len(seqs) - 1
        assert len(info["shards"]) == 3
        assert info["pages_total"] == sum(sh.info()["pages_total"] for sh in sc.shards)
        assert info["pages_total"] - info["pages_free"] == \
            ref_info["pages_total"] - ref_info["pages_free"]
        assert sc.hello()["version"] == 1
        st = sc.stats()
        assert st["keys"] == c.stats()["keys"] and st["connections"] >= 3
        assert st["requests"]["append"]["count"] == len(seqs)
        assert sum(st["requests"]["append"]["latency_hist"]) == len(seqs)
        with pytest.raises(fp4idx.NoSequence):
            sc.drop(seqs[1])
        with pytest.raises(fp4idx.NoSequence):   # one bad entry fails the batch
            sc.score_many(entries[:3] + [{"seq": seqs[1], "q": e["q"], "w": e["w"]}], H)
        # The shards' connections are still in step after the error.
        assert np.array_equal(sc.read(seqs[2]), c.read(seqs[2]))
        # A sharded pipeline: results in call order.
        p = sc.pipeline()
        for s in seqs[2:8]:
            p.read(s, 0, 1)
        p.info().score_many(entries[2:9], H, topk=3)
        res = p.execute()
        for s, r in zip(seqs[2:8], res):
            assert np.array_equal(r, c.read(s, 0, 1))
        assert res[6]["sequences"] == len(seqs) - 1
        for g, r in zip(res[7], c.score_many(entries[2:9], H, topk=3)):
            assert all(np.array_equal(x, y) for x, y in zip(g, r))


def test_rendezvous_placement_is_stable(three):
    socks = [d.socket for d in three]
    with fp4idx.ShardedClient(socks) as a, fp4idx.ShardedClient(socks[::-1]) as b, \
            fp4idx.ShardedClient(socks[:2]) as two:
        seqs = range(3000)
        pa = [socks[a.shard_of(s)] for s in seqs]
        assert pa == [socks[::-1][b.shard_of(s)] for s in seqs]   # order-free
        spread = [pa.count(s) for s in socks]
        assert min(spread) > 800                                   # balanced
        # Removing a shard moves only that shard's sequences.
        for s, where in zip(seqs, pa):
            if where != socks[2]:
                assert socks[two.shard_of(s)] == where
