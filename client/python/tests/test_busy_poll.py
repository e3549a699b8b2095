"""The blocking Client's busy poll (busy_poll_us): its default follows the
host's CPUs as libfp4idx-client's does, a spinning client gets the replies
a sleeping one gets, and a reply later than the spin still comes (the
receive then sleeps as before)."""
import os
import signal
import threading

import numpy as np
import pytest

import fp4idx
from fp4idx import client as client_mod
from conftest import stop_daemon, wait_until


def test_the_default_follows_the_cpus_and_bad_values_are_refused(daemon, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with fp4idx.Client(daemon.socket) as c:
        assert c.busy_poll_us == 0
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    with fp4idx.Client(daemon.socket) as c:
        assert c.busy_poll_us == client_mod.BUSY_POLL_AUTO == -1
    with fp4idx.Client(daemon.socket, busy_poll_us=0) as c:
        assert c.busy_poll_us == 0
    for bad in (-2, 1.5, True, 10 ** 7, "50"):
        with pytest.raises(fp4idx.InvalidArgument, match="busy_poll_us"):
            fp4idx.Client(daemon.socket, busy_poll_us=bad)


def test_the_automatic_window_follows_recent_waits():
    """As libfp4idx-client's spin.h (test_client_conn's spin_window test)."""
    A, lo, hi = client_mod.BUSY_POLL_AUTO, 50, client_mod.BUSY_POLL_AUTO_MAX_US
    win, learn = client_mod.spin_window, client_mod.spin_learn
    assert win(0, 90) == 0 and win(1000, 5000) == 1000
    assert win(A, 0) == lo and win(A, 10) == lo
    assert win(A, 90) == 90 + 45 + 20
    assert win(A, 400) == hi and win(A, hi) == hi
    assert win(A, hi + 1) == lo and win(A, 100000) == lo
    r = learn(0, 96)
    assert r == 96
    r = learn(r, 8)
    assert r == 84 and win(A, r) >= 96
    assert learn(r, 200) == 200
    r = 200
    for _ in range(40):
        r = learn(r, 10)
    assert 10 <= r < 20
    assert learn(-5, -7) == 0


def _counting(c):
    """c with its spins counted in c.spins."""
    c.spins = 0
    spin = c._spin

    def counted():
        c.spins += 1
        spin()
    c._spin = counted
    return c


def test_a_spinning_client_gets_what_a_sleeping_one_gets(daemon, seq):
    rng = np.random.default_rng(7)
    s = seq()
    keys = rng.standard_normal((300, 128), dtype=np.float32)
    q = fp4idx.bf16_bits(rng.standard_normal((4, 8, 128), dtype=np.float32))
    w = fp4idx.bf16_bits(rng.random((4, 8), dtype=np.float32))
    got = {}
    for bp in (0, 1000, client_mod.BUSY_POLL_AUTO):
        with _counting(fp4idx.Client(daemon.socket, timeout=60, busy_poll_us=bp)) as c:
            if bp == 0:
                c.append(s, keys)
            logits = c.score(s, q, w)
            pos, val, cnt = c.topk(s, q, w, 16)
            with c.pipeline() as p:
                p.length(seq=s).length(seq=s)
                lengths = p.execute()
            c.close()                                  # a new socket: a new poller
            again = c.score(s, q, w)
            got[bp] = (logits.tobytes(), pos.tobytes(), val.tobytes(), cnt.tobytes(),
                       lengths, again.tobytes())
            if bp:
                assert c.spins >= 3, "the spinning client did not spin"  # score, topk, score
            else:
                assert c.spins == 0, "a client with busy_poll_us=0 spun"
    assert got[0] == got[1000] == got[client_mod.BUSY_POLL_AUTO]


def test_a_reply_later_than_the_spin_still_comes(make_daemon):
    d = make_daemon(cache_bytes="16M")
    with fp4idx.Client(d.socket, timeout=60, busy_poll_us=1) as c:
        c.info()
        stop_daemon(d)                                 # no reply until SIGCONT
        out, tid = {}, []

        def call():
            tid.append(threading.get_native_id())
            out["info"] = c.info()
        t = threading.Thread(target=call)
        t.start()

        def asleep():  # past the spin, asleep in poll(2) on the socket
            if not tid:
                return False
            with open(f"/proc/self/task/{tid[0]}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/self/task/{tid[0]}/wchan") as f:
                where = f.read()  # "0" where the kernel does not say
            return state == "S" and ("poll" in where or where in ("", "0"))
        wait_until(asleep, "the calling thread never slept")
        os.kill(d.proc.pid, signal.SIGCONT)
        t.join(60)
        assert not t.is_alive()
        assert out["info"]["sequences"] == 0
