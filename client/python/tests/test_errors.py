"""Every status a real CPU daemon can be made to send, raised as its class;
the client-side ones (EINVAL, ETIMEDOUT, ECONN); reconnection; and the
exception table checked against protocol/fp4idx_status.h."""
import os
import re
import socket
import threading

import numpy as np
import pytest

import fp4idx
from fp4idx import ops
from fp4idx.errors import CLASSES
from conftest import REPO


def test_classes_match_status_header():
    text = open(os.path.join(REPO, "protocol", "fp4idx_status.h")).read()
    header = [(n, int(v), m) for n, v, m in
              re.findall(r'X\((\w+),\s*(-?\d+),\s*"([^"]*)"\)', text)]
    assert len(header) >= 21 and header[0] == ("OK", 0, "success")
    # One class per error code, in the header's order, with its name and text.
    assert [(k.name, k.code, k.text) for k in CLASSES] == header[1:]
    assert len({k.__name__ for k in CLASSES}) == len(CLASSES)
    for k in CLASSES:
        assert issubclass(k, fp4idx.Error) and getattr(fp4idx, k.__name__) is k
        e = fp4idx.error_for(k.code, "m")
        assert type(e) is k and e.message == "m" and e.name == k.name
    e = fp4idx.error_for(-99, "future code")
    assert type(e) is fp4idx.Error and e.code == -99 and e.message == "future code"


def q_w(R=1, H=4, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((R, H, 128)).astype(np.float32),
            rng.random((R, H)).astype(np.float32))


def test_daemon_errors_raise_their_class(client, seq):
    s = seq()
    client.append(s, np.ones((10, 128), np.float32))
    q, w = q_w()
    cases = [
        # EPROTO: an unknown field (the daemon's reply; the connection stays)
        (fp4idx.ProtocolError, lambda: client._run(ops.Request("info", {"bogus": 1}, dict))),
        (fp4idx.ProtocolError, lambda: client.topk(s, q, w, 0)),
        (fp4idx.TooBig, lambda: client.topk(s, q, w, 1048577)),
        (fp4idx.TooBig, lambda: client.score_many([{"seq": s, "q": q, "w": w}] * 1025, 4)),
        (fp4idx.UnknownRequest, lambda: client._run(ops.Request("frobnicate", {}, dict))),
        (fp4idx.NotEnabled, lambda: client.save()),            # no --data-dir
        (fp4idx.UnsupportedVersion, lambda: client.hello(version=2)),
        (fp4idx.ShapeMismatch, lambda: client.append(s, np.ones((3, 127), np.float32))),
        (fp4idx.ShapeMismatch, lambda: client.score(s, *q_w(H=129))),
        (fp4idx.ShapeMismatch, lambda: client.score(s, q, w, mask=np.ones((1, 11), bool))),
        (fp4idx.NoSequence, lambda: client.drop(s + 10 ** 9)),
        (fp4idx.NoSequence, lambda: client.score(s + 10 ** 9, q, w)),
        (fp4idx.OutOfRange, lambda: client.truncate(s, 11)),
        (fp4idx.OutOfRange, lambda: client.score(s, q, w, lens=[11])),
        (fp4idx.OutOfRange, lambda: client.read(s, 5, 6)),
        (fp4idx.NonFinite, lambda: client.append(s, np.full((2, 128), np.nan, np.float32))),
        (fp4idx.NonFinite, lambda: client.append(s, np.full((1, 128), np.inf, np.float32))),
    ]
    for cls, call in cases:
        with pytest.raises(cls) as ei:
            call()
        e = ei.value
        assert e.code == cls.code and e.name == cls.name and e.message
        assert client.connected  # daemon errors keep the connection
    # ... and nothing changed.
    assert client.read(s).shape == (10, 68)
    assert client.hello() == {"version": 1, "server": client.info()["server"]}


def test_pool_full(make_daemon):
    d = make_daemon(cache_bytes="64K")     # 15 pages of 64 keys
    with fp4idx.Client(d.socket) as c:
        info = c.info()
        room = info["pages_total"] * info["page_size"]
        c.append(1, np.ones((room - 5, 128), np.float32))
        with pytest.raises(fp4idx.PoolFull) as ei:
            c.append(2, np.ones((70, 128), np.float32))
        assert ei.value.code == -10
        assert c.info()["sequences"] == 1   # all or nothing: no seq 2


def test_io_error_on_save(make_daemon, tmp_path):
    data = tmp_path / "data"
    d = make_daemon(extra=["--data-dir", str(data)])
    with fp4idx.Client(d.socket) as c:
        c.append(1, np.ones((3, 128), np.float32))
        assert c.save() is None
        (data / "snapshot.fp4s.tmp").mkdir()     # the temp file cannot be opened
        (data / "snapshot.fp4s.tmp" / "x").write_text("x")
        with pytest.raises(fp4idx.IOFailure) as ei:
            c.save()
        assert isinstance(ei.value, OSError) and ei.value.code == -16
        (data / "snapshot.fp4s.tmp" / "x").unlink()   # let the final snapshot work
        (data / "snapshot.fp4s.tmp").rmdir()
        c.save()


def test_frame_too_big_closes_then_reconnects(make_daemon):
    d = make_daemon(extra=["--max-frame", "64K"])
    with fp4idx.Client(d.socket) as c:
        with pytest.raises(fp4idx.TooBig):
            c.append(1, np.ones((1000, 128), np.float32))   # 512 KB frame
        c.append(1, np.ones((10, 128), np.float32))          # a new connection
        assert c.read(1).shape == (10, 68)


def test_client_side_errors(client, seq):
    with pytest.raises(fp4idx.InvalidArgument) as ei:
        client.append(seq(), np.ones((1, 128), np.float32), rounding="nearest")
    assert isinstance(ei.value, ValueError) and ei.value.code == -1
    with pytest.raises(fp4idx.InvalidArgument):
        client.drop(-1)
    with pytest.raises(fp4idx.InvalidArgument):
        client.score_many([], 4)
    with pytest.raises(fp4idx.InvalidArgument):
        client.append(seq(), np.ones((2, 128), np.complex64))
    with pytest.raises(fp4idx.InvalidArgument):
        client.score(1, np.ones((1, 1, 128), np.float32), np.ones((1, 1), np.float32), lens=[-1])
    with pytest.raises(fp4idx.ConnectionLost) as ei:
        fp4idx.Client("/nonexistent/fp4idxd.sock")
    assert isinstance(ei.value, ConnectionError) and ei.value.code == -15


def test_timeout_then_reconnect(tmp_path):
    # A listener that accepts and never answers.
    path = str(tmp_path / "mute.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    conns = []
    t = threading.Thread(target=lambda: [conns.append(srv.accept()[0]) for _ in range(2)])
    t.start()
    c = fp4idx.Client(path, timeout=0.2)
    with pytest.raises(fp4idx.Timeout) as ei:
        c.info()
    assert isinstance(ei.value, TimeoutError) and ei.value.code == -14
    assert not c.connected
    with pytest.raises(fp4idx.Timeout):
        c.info()   # connected again, timed out again
    t.join()
    c.close()
    for s in conns:
        s.close()
    srv.close()


def test_connection_loss_raises_and_reconnects(make_daemon):
    d = make_daemon()
    c = fp4idx.Client(d.socket, timeout=30)
    c.append(5, np.ones((4, 128), np.float32))
    d.stop()
    with pytest.raises(fp4idx.ConnectionLost):
        c.info()
    assert not c.connected
    with pytest.raises(fp4idx.ConnectionLost):
        c.info()                 # no daemon yet: connecting fails
    d.start()
    assert c.info()["sequences"] == 0   # reconnected (no --data-dir: empty)
    c.close()


def test_garbled_replies_close_the_connection(tmp_path):
    # A fake daemon: the reply to the first request carries the wrong id, to
    # the second one it is not msgpack.
    import asyncio
    import struct
    import msgpack
    path = str(tmp_path / "fake.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    bad = [msgpack.packb({"id": 999, "status": 0}), b"\xc1\xc1"]

    def serve():
        for i in range(4):
            s, _ = srv.accept()
            n, = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))
            s.recv(n, socket.MSG_WAITALL)
            body = bad[i % 2]
            s.sendall(struct.pack(">I", len(body)) + body)
            s.recv(1)   # until the client closes
            s.close()
    t = threading.Thread(target=serve)
    t.start()
    c = fp4idx.Client(path, timeout=10)
    for _ in range(2):
        with pytest.raises(fp4idx.ProtocolError):
            c.info()
        assert not c.connected      # the next call connects again

    async def main():
        a = fp4idx.AsyncClient(path, timeout=10)
        for _ in range(2):
            with pytest.raises(fp4idx.ProtocolError):
                await a.info()
            await asyncio.sleep(0)
            assert not a.connected
    asyncio.run(main())
    t.join(10)
    srv.close()
