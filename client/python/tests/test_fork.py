"""fork through the Python client: a fork and its own keys score like the
same keys appended to a sequence of their own; bad forks raise the typed
errors; the sharded client forks within a shard and refuses across shards."""
import numpy as np
import pytest

import fp4idx


def test_fork_scores_like_a_copy(make_daemon):
    d = make_daemon(cache_bytes="16M")
    rng = np.random.default_rng(3)
    prompt = rng.standard_normal((300, 128)).astype(np.float32)
    own = rng.standard_normal((17, 128)).astype(np.float32)
    q = rng.standard_normal((2, 4, 128)).astype(np.float32)
    w = rng.random((2, 4)).astype(np.float32)
    with fp4idx.Client(d.socket, timeout=60) as c:
        c.append(1, prompt)
        assert c.fork(1, 2, 300) == 300
        assert c.append(2, own) == (300, 317)
        c.append(3, prompt)
        c.append(3, own)
        assert np.array_equal(c.read(2), c.read(3))
        assert np.array_equal(c.score(2, q, w).view(np.uint32), c.score(3, q, w).view(np.uint32))
        assert c.read(1).shape == (300, 68)        # the source is unchanged
        assert c.info()["pages_shared"] == 300 // 64
        with pytest.raises(fp4idx.AlreadyExists):
            c.fork(1, 2, 1)
        with pytest.raises(fp4idx.NoSequence):
            c.fork(99, 100, 0)
        with pytest.raises(fp4idx.OutOfRange):
            c.fork(1, 100, 301)
        with pytest.raises(fp4idx.InvalidArgument):
            c.fork(1, -1, 0)
        c.drop(1)
        assert np.array_equal(c.read(2), c.read(3))


def test_sharded_fork_stays_on_its_shard(make_daemon):
    ds = [make_daemon(cache_bytes="16M") for _ in range(2)]
    with fp4idx.ShardedClient([d.socket for d in ds], timeout=60) as sc:
        keys = np.ones((10, 128), np.float32)
        sc.append(5, keys)
        same = next(s for s in range(6, 1000) if sc.shard_of(s) == sc.shard_of(5))
        other = next(s for s in range(6, 1000) if sc.shard_of(s) != sc.shard_of(5))
        assert sc.fork(5, same, 10) == 10
        assert np.array_equal(sc.read(same), sc.read(5))
        with pytest.raises(fp4idx.InvalidArgument):
            sc.fork(5, other, 10)
