"""Channels called by a real CUDA stream through the Python client: an
fp4idxd on the CUDA backend, one registered CUDA region (torch tensor) for
q, w, lens and outputs, and channel calls that are stream operations on a
torch stream (cuStreamWriteValue / cuStreamWaitValue through ctypes).
Checks: every call's outputs equal the bytes the socket's region path
writes (full logits and top-k over 64, 16,384 and 100,000 keys, several
rows and heads, with and without lens); a torch.cuda.graph of many calls
replayed 3 times gives those bytes each time; a graph whose sequence and
lens live in device memory gives each step's bytes when they change
between replays; a bad call completes with its error and the stream goes
on; a killed daemon releases the waiting stream with ECONN. Every wait on a
stream has a deadline: a lost completion fails the test instead of hanging
it (the channel is closed, which releases the stream). Skipped without
torch and a GPU (run on the GPU machine with
`pytest client/python/tests/test_channel_cuda.py`)."""
import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import fp4idx  # noqa: E402
from conftest import Daemon, stop_daemon  # noqa: E402

SEQS = {1: 64, 2: 16384, 3: 100000}       # sequence -> keys
RMAX, HMAX = 8, 128
WAIT_S = 60                                # the longest a stream may take to pass a call


def wait(stream, ch):
    """Until `stream` has passed its work; on a missed deadline the channel
    is closed (its pending completion words get ECONN, so the stream ends)
    and the test fails."""
    end = time.monotonic() + WAIT_S
    while not stream.query():
        if time.monotonic() > end:
            ch.close()
            pytest.fail(f"the stream did not pass the channel call in {WAIT_S} s")
        time.sleep(0.0005)


def host_bytes(t):
    return t.cpu().numpy().tobytes()


@pytest.fixture(scope="module")
def cuda_daemon():
    d = Daemon(cache_bytes="1G", backend="cuda")
    yield d
    d.close()


class Setting:
    """`with`: a client of the CUDA daemon with the sequences `seqs`
    (dropped at the end), one CUDA region of 64 MiB (a torch uint8
    tensor), and a side stream."""

    def __init__(self, sock, seqs=SEQS, seed=7):
        self.c = fp4idx.Client(sock, timeout=120)
        self.g = torch.Generator().manual_seed(seed)
        self.seqs = seqs
        for s, n in seqs.items():
            self.c.append(s, torch.randn(n, 128, generator=self.g).numpy())
        self.buf = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
        self.r = self.c.register_cuda(self.buf)
        self.stream = torch.cuda.Stream()

    def inputs(self, rows, heads, lens=None):
        """q, w (and lens) filled in the region, on the stream."""
        t = self.r.tensor
        q = t(torch.bfloat16, (rows, heads, 128))
        w = t(torch.bfloat16, (rows, heads))
        with torch.cuda.stream(self.stream):
            q.copy_(torch.randn(rows, heads, 128, generator=self.g).to(torch.bfloat16))
            w.copy_(torch.rand(rows, heads, generator=self.g).to(torch.bfloat16))
        if lens is None:
            return q, w, None
        ld = t(torch.int32, (rows,))
        with torch.cuda.stream(self.stream):
            ld.copy_(torch.tensor(lens, dtype=torch.int32))
        return q, w, ld

    def outputs(self, rows, k=None, width=None, fill=0xAB):
        """(positions, logits, counts) for top-k, or logits [rows, width],
        in the region, every byte `fill`."""
        t = self.r.tensor
        outs = (t(torch.float32, (rows, width)),) if k is None else (
            t(torch.int32, (rows, k)), t(torch.float32, (rows, k)), t(torch.int32, (rows,)))
        with torch.cuda.stream(self.stream):
            for o in outs:
                o.view(torch.uint8).fill_(fill)
        return outs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        try:
            self.r.close()
            for s in self.seqs:
                self.c.drop(s)
        except fp4idx.ConnectionLost:
            pass                                # the daemon is gone (killed by the test)
        self.c.close()


# (sequence, rows, heads, k (None: full logits), lens (None: the whole sequence))
CASES = [
    (1, 1, 64, None, None), (1, 4, 32, 16, [64, 63, 1, 0]), (1, 8, 128, 64, None),
    (2, 2, 64, None, None), (2, 8, 128, 512, [16384, 9000, 17, 0, 1, 16000, 2, 8192]),
    (2, 3, 16, 1, None), (2, 4, 64, None, [100, 16384, 5, 0]),
    (3, 4, 64, 2048, None), (3, 8, 32, 64, [100000, 1, 99999, 50000, 0, 7, 2048, 4096]),
    (3, 1, 128, None, [70000]), (3, 2, 16, 512, None),
]


def socket_reference(s, seq, q, w, k, lens, width):
    """The socket's region path into fresh outputs -> their bytes."""
    out = s.outputs(q.shape[0], k, width, fill=0xCD)
    with torch.cuda.stream(s.stream):   # the socket path waits for the current stream
        if k is None:
            s.c.score(seq, q, w, lens=lens, out=out[0])
        else:
            s.c.topk(seq, q, w, k, lens=lens, out=out)
    return [host_bytes(o) for o in out]


def call(ch, seq, q, w, k, lens, out):
    if k is None:
        return ch.score(seq, q, w, lens=lens, out=out[0])
    return ch.topk(seq, q, w, k, lens=lens, out=out)


def width_of(seq, lens):
    return max(lens) if lens else SEQS[seq]


def test_stream_calls_equal_the_socket(cuda_daemon):
    with Setting(cuda_daemon.socket) as s, s.c.channel(s.stream, slots=4) as ch:
        calls0 = s.c.stats()["channel_calls"]
        for i, (seq, rows, heads, k, lens) in enumerate(CASES):
            q, w, ld = s.inputs(rows, heads, lens)
            out = s.outputs(rows, k, width_of(seq, lens))
            t = call(ch, seq, q, w, k, ld, out)
            wait(s.stream, ch)
            assert ch.status(t) == 0, f"case {i}"
            want = socket_reference(s, seq, q, w, k, ld, width_of(seq, lens))
            assert [host_bytes(o) for o in out] == want, f"case {i}: {CASES[i]}"
        assert ch.check() == 4
        assert s.c.stats()["channel_calls"] == calls0 + len(CASES)


def test_a_captured_graph_replays_to_the_same_bytes(cuda_daemon):
    with Setting(cuda_daemon.socket) as s, s.c.channel(slots=64) as ch:  # None: capturing
        plan = []                               # 40 calls over the cases, each its own outputs
        for i in range(40):
            seq, rows, heads, k, lens = CASES[i % len(CASES)]
            q, w, ld = s.inputs(rows, heads, lens)
            plan.append((seq, q, w, k, ld, s.outputs(rows, k, width_of(seq, lens))))
        want = [socket_reference(s, seq, q, w, k, ld, out[0].shape[1] if k is None else None)
                for seq, q, w, k, ld, out in plan]
        calls0 = s.c.stats()["channel_calls"]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s.stream):
            tickets = [call(ch, seq, q, w, k, ld, out) for seq, q, w, k, ld, out in plan]
        assert s.c.stats()["channel_calls"] == calls0      # captured, not run
        for replay, fill in enumerate((0x11, 0x22, 0x33)):
            with torch.cuda.stream(s.stream):
                for *_, out in plan:
                    for o in out:
                        o.view(torch.uint8).fill_(fill)
                g.replay()
            wait(s.stream, ch)
            for i, (*_, out) in enumerate(plan):
                assert [host_bytes(o) for o in out] == want[i], f"replay {replay}, call {i}"
            assert all(ch.status(t) == 0 for t in tickets)
        assert ch.check() == 40
        assert s.c.stats()["channel_calls"] == calls0 + 3 * 40


def test_sequence_and_lens_in_device_memory_change_between_replays(cuda_daemon):
    with Setting(cuda_daemon.socket) as s, s.c.channel(slots=8) as ch:
        rows, heads, k = 4, 64, 256
        q, w, ld = s.inputs(rows, heads, [1, 1, 1, 1])
        seq_d = torch.zeros(1, dtype=torch.int64, device="cuda")
        out = s.outputs(rows, k)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s.stream):
            ch.topk(seq_d, q, w, k, lens=ld, out=out)
        steps = [(2, [16384, 100, 0, 4000]), (3, [100000, 16384, 99999, 1]),
                 (1, [64, 3, 0, 64]), (3, [5, 50000, 0, 70000])]
        for seq, lens in steps:                 # what the caller's kernels would update
            with torch.cuda.stream(s.stream):
                seq_d.fill_(seq)
                ld.copy_(torch.tensor(lens, dtype=torch.int32))
                for o in out:
                    o.view(torch.uint8).fill_(0xAB)
                g.replay()
            wait(s.stream, ch)
            got = [host_bytes(o) for o in out]
            assert got == socket_reference(s, seq, q, w, k, ld, None), (seq, lens)
        assert ch.check() == 1


def test_a_bad_call_completes_with_its_status_and_the_stream_goes_on(cuda_daemon):
    with Setting(cuda_daemon.socket, seqs={11: 1000}) as s, \
            s.c.channel(s.stream, slots=4) as ch:
        q, w, ld = s.inputs(4, 32, [1000, 1001, 0, 5])      # 1001: above the length
        out = s.outputs(4, 16)
        t1 = ch.topk(12345, q, w, 16, out=out)               # no such sequence
        t2 = ch.topk(11, q, w, 16, lens=ld, out=out)
        t3 = ch.topk(11, q, w, 16, out=out)
        wait(s.stream, ch)
        assert ch.status(t1) == fp4idx.NoSequence.code
        assert ch.status(t2) == fp4idx.OutOfRange.code
        assert ch.status(t3) == 0
        got = [host_bytes(o) for o in out]
        assert got == socket_reference(s, 11, q, w, 16, None, None)
        with pytest.raises(fp4idx.NoSequence, match="2 of the 3 calls checked failed"):
            ch.check()


def test_a_killed_daemon_releases_the_waiting_stream(make_daemon):
    d = make_daemon(backend="cuda", cache_bytes="256M")
    with Setting(d.socket, seqs={5: 4096}) as s, s.c.channel(s.stream, slots=2) as ch:
        q, w, _ = s.inputs(2, 16)
        out = s.outputs(2, 8)
        s.stream.synchronize()
        stop_daemon(d)                                      # it cannot serve the call
        t = ch.topk(5, q, w, 8, out=out)
        assert not s.stream.query()                         # so the stream waits
        os.kill(d.proc.pid, signal.SIGKILL)
        wait(s.stream, ch)                                  # released by the watcher
        assert ch.status(t) == fp4idx.ConnectionLost.code
        with pytest.raises(fp4idx.ConnectionLost):
            ch.check()
        with pytest.raises(fp4idx.ConnectionLost):          # later calls fail at once
            ch.topk(5, q, w, 8, out=out)
        d.proc.wait()
        d.proc = None
