"""Pipelining: one write, results in order, errors in place, and no
deadlock when the replies outgrow the socket buffers."""
import numpy as np
import pytest

import fp4idx


def test_pipeline_equals_sequential(client, seq):
    rng = np.random.default_rng(3)
    s = seq()
    chunks = [rng.standard_normal((int(rng.integers(1, 90)), 128)).astype(np.float32)
              for _ in range(20)]
    q = rng.standard_normal((2, 8, 128)).astype(np.float32)
    w = rng.random((2, 8)).astype(np.float32)
    p = client.pipeline()
    for ch in chunks:                      # each score sees the append before it
        p.append(s, ch)
        p.score(s, q, w)
    assert len(p) == 40
    res = p.execute()
    assert len(p) == 0
    total = 0
    for i, ch in enumerate(chunks):
        first, length = res[2 * i]
        assert first == total and length == total + len(ch)
        total = length
        assert res[2 * i + 1].shape == (2, total)
    final = client.score(s, q, w)
    assert np.array_equal(res[-1].view(np.uint32), final.view(np.uint32))


def test_pipeline_errors_in_place(client, seq):
    s = seq()
    p = client.pipeline()
    p.append(s, np.ones((5, 128), np.float32)).drop(s + 10 ** 9).truncate(s, 2).info()
    with pytest.raises(fp4idx.NoSequence):
        p.execute()
    assert client.read(s).shape == (2, 68)   # the requests after the error ran
    p.truncate(s, 9).truncate(s, 1)
    r = p.execute(raise_on_error=False)
    assert isinstance(r[0], fp4idx.OutOfRange) and r[1] == 1


def test_large_pipeline_does_not_deadlock(client, seq):
    # 64 full-logit replies of 4 x 20,000 f32 (20 MB in all) while 64 requests
    # are in flight (the daemon reads at most 32 ahead).
    s = seq()
    client.append(s, np.random.default_rng(0).standard_normal((20000, 128)).astype(np.float32))
    q = np.ones((4, 1, 128), np.float32)
    w = np.ones((4, 1), np.float32)
    with client.pipeline() as p:
        for _ in range(64):
            p.score(s, q, w)
        res = p.execute()
    assert len(res) == 64 and all(r.shape == (4, 20000) for r in res)
    assert all(np.array_equal(r, res[0]) for r in res)
    assert client.info()["sequences"] >= 1
