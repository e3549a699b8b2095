"""Channels (PROTOCOL.md "Channels") through the Python client against CPU
daemons, with calls made by the host (stream="host": the same control
block, descriptor, doorbell and completion word a CUDA stream writes):
results equal the socket's bytes round the ring, a bad call completes with
its status and the channel goes on, refusals change nothing, a killed
daemon or a closed client releases a waiting call with ConnectionLost, and
a client that exits with a channel open leaves the daemon with none. The
CUDA stream path is tests/test_channel_cuda.py."""
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import fp4idx
from fp4idx import channel as chmod
from fp4idx.regions import Ref
from conftest import stop_daemon, wait_until

N, R, H, K = 900, 4, 8, 32
PKG = os.path.dirname(os.path.dirname(os.path.abspath(fp4idx.__file__)))


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((N, 128), dtype=np.float32)
    q = fp4idx.bf16_bits(rng.standard_normal((R, H, 128), dtype=np.float32))
    w = fp4idx.bf16_bits(rng.random((R, H), dtype=np.float32))
    lens = np.array([N, N - 1, 17, N // 2], np.int32)
    return keys, q, w, lens


class Setting:
    """A sequence of N keys and one host region holding q, w, lens and room
    for every output."""

    def __init__(self, c, s, seed=0):
        self.c, self.seq = c, s
        self.keys, self.q, self.w, self.lens = inputs(seed)
        c.append(s, self.keys)
        self.r = c.region(1 << 20)
        self.qr = self.put(self.q)
        self.wr = self.put(self.w)
        self.lr = self.put(self.lens)
        self.pos = self.r.array(np.int32, (R, K))
        self.val = self.r.array(np.float32, (R, K))
        self.cnt = self.r.array(np.int32, (R,))
        self.logits = self.r.array(np.float32, (R, N))

    def put(self, a):
        v = self.r.array(a.dtype, a.shape)
        v[...] = a
        return v

    @property
    def out(self):
        return (self.pos, self.val, self.cnt)

    def scribble(self):
        for a in (self.pos, self.val, self.cnt, self.logits):
            a.view(np.uint8)[...] = 0xAB


def same(got, want):
    for x, y in zip(got, want):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def counters(c):
    s = c.stats()
    return s["channel_calls"], s["channel_errors"]


def wait_rung(ch, th, slot=0):
    """Until the host call of thread `th` has rung slot's doorbell (the
    daemon is stopped, so nothing consumes it)."""
    wait_until(lambda: ch._word(slot, chmod.DOORBELL_AT).value != 0 or not th.is_alive(),
               "the call did not ring its doorbell")
    assert th.is_alive(), "the call ended while the daemon was stopped"


def test_host_calls_equal_the_socket_round_the_ring(client, seq):
    s = Setting(client, seq())
    want_t = client.topk(s.seq, s.q, s.w, K, lens=s.lens)      # the socket, plain arrays
    want_l = client.score(s.seq, s.q, s.w)
    open0 = client.info()["channels"]
    calls0, errors0 = counters(client)
    with client.channel("host", slots=3) as ch:
        assert ch.regions == {"q": s.r.id, "w": s.r.id, "lens": s.r.id, "out": s.r.id}
        assert client.info()["channels"] == open0 + 1
        tickets = []
        for i in range(10):                       # 10 calls over 3 slots, both kinds
            s.scribble()
            if i % 2 == 0:
                tickets.append(ch.topk(s.seq, s.qr, s.wr, K, lens=s.lr, out=s.out))
                same(s.out, want_t)
            else:
                tickets.append(ch.score(s.seq, s.qr, s.wr, out=s.logits))
                assert s.logits.tobytes() == want_l.tobytes()
        assert tickets == list(range(1, 11))
        for t in tickets[-3:]:                    # the latest call of each slot
            assert ch.status(t) == 0
        assert ch.status(tickets[0]) is None      # its slot serves a later call now
        assert ch.check() == 3
        # the region path of the socket writes the same bytes
        got = client.topk(s.seq, s.qr, s.wr, K, lens=s.lr, out=s.out)
        same(got, want_t)
        assert counters(client) == (calls0 + 10, errors0)
    assert ch.closed and client.info()["channels"] == open0
    with pytest.raises(fp4idx.ConnectionLost, match="closed"):
        ch.topk(s.seq, s.qr, s.wr, K, out=s.out)
    ch.close()                                    # twice: a no-op
    s.r.close()


def test_a_bad_call_completes_with_its_status_and_the_channel_goes_on(client, seq):
    s = Setting(client, seq(), seed=1)
    want = client.topk(s.seq, s.q, s.w, K, lens=s.lens)
    calls0, errors0 = counters(client)
    rid, q_at = s.r.id, s.qr.__array_interface__["data"][0] - s.r.base
    with client.channel("host", slots=2) as ch:
        with pytest.raises(fp4idx.NoSequence, match="channel") as e:
            ch.topk(s.seq + 10**9, s.qr, s.wr, K, out=s.out)   # the score path's check
        assert ch.status(1) == fp4idx.NoSequence.code == e.value.code
        # the daemon's descriptor checks, through Refs the client passes as they are
        with pytest.raises(fp4idx.RegionError):           # misaligned q
            ch.topk(s.seq, Ref(rid, q_at + 1, "bf16", [R, H, 128]), s.wr, K, out=s.out)
        with pytest.raises(fp4idx.RegionError):           # counts past the region's end
            ch.topk(s.seq, s.qr, s.wr, K, out=(s.pos, s.val, Ref(rid, s.r.size - 4, "i32", [R])))
        with pytest.raises(fp4idx.RegionError):           # logits over q
            ch.topk(s.seq, s.qr, s.wr, K, out=(s.pos, Ref(rid, q_at, "f32", [R, K]), s.cnt))
        with pytest.raises(fp4idx.ShapeMismatch):         # W is the sequence's length
            ch.score(s.seq, s.qr, s.wr, out=s.r.array(np.float32, (R, N - 1)))
        s.lr[0] = N + 1                                   # lens above the length
        with pytest.raises(fp4idx.OutOfRange):
            ch.topk(s.seq, s.qr, s.wr, K, lens=s.lr, out=s.out)
        s.lr[...] = s.lens
        t = ch.topk(s.seq, s.qr, s.wr, K, lens=s.lr, out=s.out)
        same(s.out, want)
        assert ch.status(t) == 0 and ch.status(t - 1) == fp4idx.OutOfRange.code
        with pytest.raises(fp4idx.OutOfRange, match="1 of the 2 calls checked failed"):
            ch.check()
        ch.topk(s.seq, s.qr, s.wr, K, lens=s.lr, out=s.out)
        assert ch.check() == 2
        assert counters(client) == (calls0 + 8, errors0 + 6)
    s.r.close()


def test_client_side_refusals_change_nothing(client, seq):
    s = Setting(client, seq(), seed=2)
    with client.region(1 << 16) as other, client.channel("host", s.r, slots=2) as ch:
        before = counters(client)
        cases = [
            (fp4idx.NoRegion, lambda: ch.topk(s.seq, s.q, s.wr, K, out=s.out)),  # q off-region
            (fp4idx.RegionError, lambda: ch.topk(s.seq, other.array(np.uint16, (R, H, 128)),
                                                 s.wr, K, out=s.out)),           # unbound region
            (fp4idx.RegionError, lambda: ch.topk(s.seq, s.put(s.q.astype(np.float32)), s.wr,
                                                 K, out=s.out)),                 # f32 q
            (fp4idx.InvalidArgument, lambda: ch.topk(s.seq, s.qr[:2], s.wr, K, out=s.out)),
            (fp4idx.InvalidArgument, lambda: ch.topk(s.seq, s.qr, s.put(s.w[:, :4].copy()), K,
                                                     out=s.out)),
            (fp4idx.InvalidArgument, lambda: ch.topk(s.seq, s.qr, s.wr, K, lens=s.lr[:2],
                                                     out=s.out)),
            (fp4idx.InvalidArgument, lambda: ch.topk(s.seq, s.qr, s.wr, K + 1, out=s.out)),
            (fp4idx.InvalidArgument, lambda: ch.topk(s.seq, s.qr, s.wr, 0, out=s.out)),
            (fp4idx.InvalidArgument, lambda: ch.topk(s.seq, s.qr, s.wr, K)),
            (fp4idx.InvalidArgument, lambda: ch.score(s.seq, s.qr, s.wr)),
            (fp4idx.InvalidArgument, lambda: ch.topk(np.zeros(1), s.qr, s.wr, K, out=s.out)),
            (fp4idx.InvalidArgument, lambda: ch.topk(-1, s.qr, s.wr, K, out=s.out)),
            (fp4idx.InvalidArgument, lambda: ch.status(0)),
        ]
        for exc, fn in cases:
            with pytest.raises(exc):
                fn()
        assert counters(client) == before                 # nothing reached the daemon
        assert ch.check() == 0
    s.r.close()


def test_open_refusals(client, seq):
    open0 = client.info()["channels"]
    with pytest.raises(fp4idx.InvalidArgument, match="regions"):
        client.channel("host")                            # no region on the connection
    with client.region(1 << 16) as r:
        for slots in (0, 1025, True):
            with pytest.raises(fp4idx.InvalidArgument, match="slots"):
                client.channel("host", slots=slots)
        with pytest.raises(fp4idx.NoRegion):
            client.channel("host", r, out=r.id + 1000)
        with pytest.raises(fp4idx.InvalidArgument, match="stream"):
            client.channel(object())
        chs = [client.channel("host", slots=1) for _ in range(4)]
        with pytest.raises(fp4idx.TooBig):                # 4 channels per connection
            client.channel("host")
        assert client.info()["channels"] == open0 + 4
        for ch in chs:
            ch.close()
    assert client.info()["channels"] == open0


def test_a_stream_channel_without_cuda_is_no_device(client):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this host has CUDA: tests/test_channel_cuda.py covers it")
    except ImportError:
        pass
    open0 = client.info()["channels"]
    with client.region(1 << 16):
        with pytest.raises(fp4idx.NoDevice):
            client.channel()
    assert client.info()["channels"] == open0


def host_call_in_thread(ch, s):
    """Starts a host call in a thread -> (thread, [its exception])."""
    got = []

    def run():
        try:
            ch.topk(s.seq, s.qr, s.wr, K, out=s.out)
            got.append(None)
        except fp4idx.Error as e:
            got.append(e)
    th = threading.Thread(target=run)
    th.start()
    return th, got


def rung_on_a_stopped_daemon(make_daemon, seq):
    """A daemon, stopped (SIGSTOP), with a host call of a client's channel
    rung on it -> (daemon, client, Setting, channel, call thread, [its
    exception])."""
    d = make_daemon()
    c = fp4idx.Client(d.socket, timeout=60)
    s = Setting(c, seq)
    ch = c.channel("host", slots=2)
    stop_daemon(d)                                        # it cannot serve the call
    th, got = host_call_in_thread(ch, s)
    wait_rung(ch, th)
    return d, c, s, ch, th, got


def test_a_killed_daemon_releases_a_waiting_call(make_daemon):
    d, c, s, ch, th, got = rung_on_a_stopped_daemon(make_daemon, 5)
    os.kill(d.proc.pid, signal.SIGKILL)
    th.join()
    assert isinstance(got[0], fp4idx.ConnectionLost)
    assert ch.status(1) == fp4idx.ConnectionLost.code and ch.dead
    with pytest.raises(fp4idx.ConnectionLost):            # later calls fail at once
        ch.topk(s.seq, s.qr, s.wr, K, out=s.out)
    with pytest.raises(fp4idx.ConnectionLost):
        ch.check()
    ch.close()                                            # without a daemon
    d.proc.wait()
    d.proc = None
    c.close()


def test_closing_the_client_releases_a_waiting_call(make_daemon):
    d, c, s, ch, th, got = rung_on_a_stopped_daemon(make_daemon, 6)
    c.close()                  # the watcher sees the connection go and releases the call
    th.join()
    os.kill(d.proc.pid, signal.SIGCONT)
    assert isinstance(got[0], fp4idx.ConnectionLost)
    assert ch.status(1) == fp4idx.ConnectionLost.code
    ch.close()
    assert_no_channel_left(d)                            # and the daemon lives on


@pytest.mark.parametrize("client_gone", [False, True])
def test_a_daemon_stopped_as_a_call_rings_exits_cleanly(make_daemon, client_gone):
    """SIGTERM right as the daemon wakes to a rung call (its client still
    there, or gone meanwhile): the channel watcher queues the call on the
    worker while the daemon stops, so the watcher must end before the
    worker does. The call completes (with its result, or ConnectionLost)
    and the daemon exits 0 (under ThreadSanitizer, with no race reported)."""
    d, c, s, ch, th, got = rung_on_a_stopped_daemon(make_daemon, 6)
    if client_gone:
        c.close()
    os.kill(d.proc.pid, signal.SIGCONT)
    assert d.stop() == 0                                 # SIGTERM at once, exit 0
    th.join(60)
    assert not th.is_alive()
    assert got[0] is None or isinstance(got[0], fp4idx.ConnectionLost), got[0]
    ch.close()
    c.close()


def assert_no_channel_left(d):
    """The daemon closes a channel when it sees its connection close, which
    may come after another connection's first request: ask until it has."""
    with fp4idx.Client(d.socket, timeout=60) as c:
        wait_until(lambda: c.stats()["channels"] == 0, "the daemon kept the channel")
        assert d.proc.poll() is None


def test_a_client_that_exits_with_a_channel_open_leaves_no_channel(make_daemon):
    d = make_daemon()
    code = ("import os, sys, fp4idx\n"
            "c = fp4idx.Client(sys.argv[1])\n"
            "c.append(1, [[0.5] * 128] * 4)\n"
            "r = c.region(1 << 16)\n"
            "ch = c.channel('host', slots=2)\n"
            "print(ch.id, flush=True)\n"
            "os._exit(0)\n")
    env = dict(os.environ, PYTHONPATH=PKG)
    p = subprocess.run([sys.executable, "-c", code, d.socket], env=env, capture_output=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.strip() == b"1"
    assert_no_channel_left(d)
