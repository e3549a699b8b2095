"""AsyncClient: the same results as Client, concurrent calls pipelined on
one connection, errors, pipeline(), loss and reconnect."""
import asyncio

import numpy as np
import pytest

import fp4idx


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def test_async_equals_sync(daemon, client, seq):
    rng = np.random.default_rng(11)
    s = seq()
    keys = rng.standard_normal((500, 128)).astype(np.float32)
    q = rng.standard_normal((3, 16, 128)).astype(np.float32)
    w = rng.random((3, 16)).astype(np.float32)
    lens = np.array([500, 250, 1], np.int32)

    async def main():
        async with fp4idx.AsyncClient(daemon.socket, timeout=60) as a:
            assert await a.append(s, keys) == (0, 500)
            # 50 calls from concurrent tasks on one connection.
            calls = [a.score(s, q, w, lens=lens) for _ in range(25)]
            calls += [a.topk(s, q, w, 8, lens=lens) for _ in range(25)]
            res = await asyncio.gather(*calls)
            many = await a.score_many([{"seq": s, "q": q, "w": w},
                                       {"seq": s, "q": q[:1], "w": w[:1], "lens": [7]}], 16, topk=4)
            return res, many, await a.read(s, 10, 3), await a.info()
    res, many, rd, info = run(main())
    ref = client.score(s, q, w, lens=lens)
    rpos, rval, rcnt = client.topk(s, q, w, 8, lens=lens)
    for r in res[:25]:
        assert np.array_equal(r.view(np.uint32), ref.view(np.uint32))
    for p, v, c in res[25:]:
        assert np.array_equal(p, rpos) and np.array_equal(v, rval) and np.array_equal(c, rcnt)
    sync_many = client.score_many([{"seq": s, "q": q, "w": w},
                                   {"seq": s, "q": q[:1], "w": w[:1], "lens": [7]}], 16, topk=4)
    for a, b in zip(many, sync_many):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert np.array_equal(rd, client.read(s, 10, 3))
    assert info["backend"] == "cpu"


def test_async_errors_and_pipeline(daemon, seq):
    s = seq()

    async def main():
        a = fp4idx.AsyncClient(daemon.socket)
        await a.connect()
        with pytest.raises(fp4idx.NoSequence) as ei:
            await a.drop(s)
        assert ei.value.code == -7
        # An error in the middle of concurrent calls fails only its own call.
        r = await asyncio.gather(a.append(s, np.ones((3, 128), np.float32)),
                                 a.truncate(s, 10), a.truncate(s, 1),
                                 return_exceptions=True)
        assert r[0] == (0, 3) and isinstance(r[1], fp4idx.OutOfRange) and r[2] == 1
        p = a.pipeline()
        p.append(s, np.ones((4, 128), np.float32)).read(s).drop(s).drop(s)
        out = await p.execute(raise_on_error=False)
        assert out[0] == (1, 5) and out[1].shape == (5, 68) and out[2] is None
        assert isinstance(out[3], fp4idx.NoSequence)
        with pytest.raises(fp4idx.InvalidArgument):
            await a.append(s, np.ones((1, 128), np.float32), rounding="x")
        await a.close()
    run(main())


def test_async_loss_and_reconnect(make_daemon):
    d = make_daemon()

    async def main():
        async with fp4idx.AsyncClient(d.socket, timeout=30) as a:
            await a.info()
            d.stop()
            with pytest.raises(fp4idx.ConnectionLost):
                await a.info()
            d.start()
            assert (await a.info())["sequences"] == 0
    run(main())


def test_async_connect_refused():
    async def main():
        with pytest.raises(fp4idx.ConnectionLost):
            await fp4idx.AsyncClient("/nonexistent/fp4idxd.sock").connect()
    run(main())


def test_async_timeout_fails_waiting_calls(tmp_path):
    import socket
    path = str(tmp_path / "mute.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)

    async def main():
        a = fp4idx.AsyncClient(path, timeout=0.2)
        await a.connect()
        r = await asyncio.gather(a.info(), a.info(), return_exceptions=True)
        assert all(isinstance(e, fp4idx.Timeout) for e in r), r
        assert not a.connected
        await a.close()
    run(main())
    srv.close()
