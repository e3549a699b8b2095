"""The blocking client: one Unix socket connection, requests in order,
pipelining through Pipeline.

Not thread-safe: one Client per thread (as libfp4idx-client).
"""
import array as _array
import os
import select
import socket as _socket
import time

from . import channel as _channel
from . import ops, regions, wire
from .errors import BY_NAME, Error, error_for
from .methods import Methods, Queue, Scan, first_error

_KEEP = 4 << 20  # a receive buffer grown above this is dropped after use
_IOV_MAX = 1024
_SMALL = 4096  # bodies below this are joined to their header for one send
# The busy poll, as libfp4idx-client's (client/spin.h): BUSY_POLL_AUTO, what
# a new Client on a host of at least 4 CPUs starts with (on fewer, 0: the
# spin would take the core the daemon needs), spins about one and a half
# times the connection's recent waits for a reply, at least
# BUSY_POLL_DEFAULT_US and at most BUSY_POLL_AUTO_MAX_US, and the least
# where replies take longer than that (the daemon busy with other clients).
BUSY_POLL_DEFAULT_US = 50
BUSY_POLL_AUTO = -1
BUSY_POLL_AUTO_MAX_US = 500
# topk's results of at least REPLY_REGION_DEFAULT bytes come back through
# the connection's reply region (libfp4idx-client's
# FP4IDX_CLIENT_REPLY_REGION_DEFAULT): a host region made at the first such
# call, grown in steps of _REPLY_GRAIN up to _REPLY_MAX (larger results
# stay on the socket).
REPLY_REGION_DEFAULT = 16 << 10
_REPLY_GRAIN = 64 << 10
_REPLY_MAX = 64 << 20


def spin_window(setting, recent_us):
    """The spin window of the next wait, us (libfp4idx-client's
    fp4idx__client_spin_window): a fixed setting is the window; BUSY_POLL_AUTO
    follows recent_us (spin_learn)."""
    if setting != BUSY_POLL_AUTO:
        return max(setting, 0)
    if recent_us <= 0 or recent_us > BUSY_POLL_AUTO_MAX_US:
        return BUSY_POLL_DEFAULT_US
    return min(max(recent_us + recent_us // 2 + 20, BUSY_POLL_DEFAULT_US), BUSY_POLL_AUTO_MAX_US)


def spin_learn(recent_us, wait_us):
    """The recent wait after a reply whose first bytes came wait_us after the
    wait began: the longer of wait_us and recent_us less an eighth."""
    recent_us = max(recent_us, 0)
    return max(max(wait_us, 0), recent_us - recent_us // 8)


class Client(Methods, Scan):
    """A connection to one fp4idxd.

    socket: the daemon's socket path (None: $FP4IDX_SOCKET, else
    $XDG_RUNTIME_DIR/fp4idx/fp4idxd.sock, else /run/fp4idx/fp4idxd.sock, as
    libfp4idx-client). timeout: seconds, None to wait forever; it bounds
    each wait for the socket of a call (connect, every send and receive),
    and the whole exchange of a pipeline.

    reply_region: topk's results of at least this many bytes (positions,
    logits and counts; 0: never) come back through a host region the client
    registers for the connection at the first such call (and grows, up to
    64 MiB; one of the connection's regions), then are copied into the
    returned arrays: the same values, with no result bytes on the socket.
    Where no region can be had (the daemon's region limits, no memfd), the
    socket from then on.

    busy_poll_us: how long each wait for a reply polls the socket before
    the thread sleeps: us (0: sleep at once), or BUSY_POLL_AUTO (-1: about
    one and a half times this connection's recent waits, 50..500 us, see
    BUSY_POLL_AUTO); None: BUSY_POLL_AUTO on a host of 4 or more CPUs, else
    0, as libfp4idx-client. A reply that comes within it is taken without
    the scheduler's wake-up (on a busy or virtualized host, most of a small
    call's round trip), at the price of the calling thread spinning
    meanwhile; the spin yields the CPU to any other runnable thread on
    each turn.

    Connects at once (ConnectionLost when no daemon answers). When the
    connection is lost, or a call times out, that call raises
    ConnectionLost / Timeout and the connection is closed; the next call
    connects again (it does not resend the failed request: an append may or
    may not have been applied, as for any lost reply).
    """

    def __init__(self, socket=None, timeout=None, busy_poll_us=None,
                 reply_region=REPLY_REGION_DEFAULT):
        self.socket_path = socket if socket is not None else wire.default_socket()
        self.timeout = timeout
        if busy_poll_us is None:
            busy_poll_us = BUSY_POLL_AUTO if (os.cpu_count() or 1) >= 4 else 0
        if isinstance(busy_poll_us, bool) or not isinstance(busy_poll_us, int) or \
                not (0 <= busy_poll_us <= 1000000 or busy_poll_us == BUSY_POLL_AUTO):
            raise BY_NAME["EINVAL"](f"busy_poll_us must be an int in 0..1000000 or "
                                    f"BUSY_POLL_AUTO (-1), got {busy_poll_us!r}")
        self.busy_poll_us = busy_poll_us
        self._spin_recent = 0  # recent waits for a reply, us (spin_learn)
        if isinstance(reply_region, bool) or not isinstance(reply_region, int) or \
                reply_region < 0:
            raise BY_NAME["EINVAL"](f"reply_region must be an int >= 0, got {reply_region!r}")
        self.reply_region = reply_region
        self._reply = None  # the reply region (a Region), once made
        self._poll = None  # the socket's poll(0), for the busy poll
        self._sock = None
        self._enc = wire.Encoder()
        self._regions = regions.Table(self._unregister)
        self._channels = []   # open channels of this connection (channel.Channel)
        self._guard = _Guard(self)
        self._reset_buffer(1 << 16)
        self.connect()

    # ---- connection -------------------------------------------------------
    def connect(self):
        """(Re)connects, closing any old connection first."""
        self.close()
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.socket_path)
        except _socket.timeout:
            s.close()
            raise BY_NAME["ETIMEDOUT"](f"connect {self.socket_path}: timed out") from None
        except OSError as e:
            s.close()
            raise BY_NAME["ECONN"](f"connect {self.socket_path}: {e.strerror or e}") from None
        self._sock = s
        self._poll = None  # made for this socket at the first spin
        return s

    @property
    def connected(self):
        """True while a connection is open."""
        return self._sock is not None

    def close(self):
        """Closes the connection (a later call connects again). The daemon
        releases this connection's regions: their Region objects are closed
        (their numpy views stay readable until dropped). Open channels are
        lost: their pending calls complete with ECONN (close them too)."""
        if self._sock is not None:
            if self._channels:
                # each channel's watcher holds a dup of the socket: shut it
                # down so that the daemon and the watchers see it close
                try:
                    self._sock.shutdown(_socket.SHUT_RDWR)
                except OSError:
                    pass
            self._sock.close()
            self._sock = None
        self._start = self._end = 0
        self._regions.release_all("its connection closed")

    # ---- regions (PROTOCOL.md "Regions") -----------------------------------
    def region(self, size):
        """-> a new host Region of `size` bytes registered on this
        connection: a memfd sealed against shrinking, mapped here and by
        the daemon. Arrays made by region.array(...) are then sent as
        references and can be score's out=. Close it (or use `with`) to
        unregister it; Client.close releases it too. TooBig beyond 16
        regions or 64 GiB per connection; RegionError when the daemon
        refuses it; OutOfMemory when the memfd cannot be made."""
        size = ops._uint("size", size)
        fd, mm = regions.host_memory(size)
        try:
            rid = self._run(ops.register_host(size), fd)
        except BaseException:
            mm.close()
            raise
        finally:
            os.close(fd)  # the daemon mapped its own copy; ours is the mmap
        return self._regions.add(regions.Region(self._regions, rid, "host", size,
                                                regions.host_address(mm), mm=mm))

    def register_cuda(self, tensor, device=None):
        """Registers the CUDA allocation that holds torch tensor `tensor`
        (its IPC handle; the daemon opens it on its GPU) -> a CUDA Region.
        Tensors in that allocation (`tensor`, its views, other tensors the
        caching allocator placed there) are then sent as references and can
        be score's out=. The Region keeps `tensor` alive until it is closed.
        device: the GPU's ordinal in the daemon's numbering (default: the
        tensor's index here; give it when CUDA_VISIBLE_DEVICES differs).
        RegionError: a daemon on the CPU backend or on another GPU, memory
        that cannot be shared (expandable segments), no CUDA driver."""
        base, size, handle, dev, bus = regions.cuda_allocation(tensor)
        return self._register_cuda(base, size, handle, dev if device is None else device,
                                   bus, tensor)

    def register_cuda_ptr(self, ptr, device=0, daemon_device=None):
        """As register_cuda for a raw device pointer (e.g. from cudaMalloc,
        CuPy) on CUDA device `device` of this process; the whole allocation
        holding it is registered. The caller keeps the memory alive."""
        base, size, handle, bus = regions.pointer_allocation(ptr, device)
        return self._register_cuda(base, size, handle,
                                   device if daemon_device is None else daemon_device, bus, None)

    def _register_cuda(self, base, size, handle, device, bus, owner):
        regions.check_cuda_daemon(self.info(), bus, self.socket_path)
        rid = self._run(ops.register_cuda(handle, size, device))
        return self._regions.add(regions.Region(self._regions, rid, "cuda", size, base,
                                                owner=owner))

    # ---- channels (PROTOCOL.md "Channels") ----------------------------------
    def channel(self, stream=None, region=None, *, q=None, w=None, lens=None, out=None,
                slots=64):
        """-> a Channel (fp4idx.channel): score calls that a CUDA stream
        makes with no host round trip, usable inside torch.cuda.graph.

        stream: the torch stream the calls go on (None: the current stream
        of each call, which is the capturing one inside torch.cuda.graph),
        or "host" for calls made by this thread with CPU stores (hosts
        without a GPU, tests). region: the registered Region the calls read
        q, w, lens from and write outputs into (None: this connection's
        only open region); q=, w=, lens=, out= name another region for one
        of them (lens=False: calls pass no lens). slots: 1..1024; calls in
        flight together need a slot each, and a slot keeps the status of
        its latest call (64: one decode step of 61 layers checked at once).
        Raises: InvalidArgument, NoDevice (no torch CUDA for a stream),
        DeviceError (the driver refused to register the block), the
        daemon's NoRegion / RegionError / TooBig (more than 4 channels),
        connection errors."""
        bind = _channel._bindings(self._regions, region, q, w, lens, out)
        return _channel.Channel(self, stream, bind, slots)

    def topk(self, seq, q, w, k, lens=None, mask=None, out=None):
        """As Methods.topk; without out=, large results come back through the
        connection's reply region (reply_region)."""
        shape = getattr(q, "shape", None)
        if out is None and self.reply_region and isinstance(k, int) and k > 0 and \
                shape is not None and len(shape) == 3 and shape[0] > 0:
            rows = int(shape[0])
            kk = rows * k * 4
            nbytes = 2 * kk + rows * 4
            if self.reply_region <= nbytes <= _REPLY_MAX:
                r = self._reply_region(nbytes)
                if r is not None:
                    res = (r.array("int32", (rows, k), 0), r.array("float32", (rows, k), kk),
                           r.array("int32", (rows,), 2 * kk))
                    pos, val, cnt = Methods.topk(self, seq, q, w, k, lens, mask, out=res)
                    return pos.copy(), val.copy(), cnt.copy()
        return Methods.topk(self, seq, q, w, k, lens, mask, out)

    def _reply_region(self, nbytes):
        """The reply region with room for nbytes (made or grown), or None
        where none can be had (reply_region is then 0)."""
        r = self._reply
        if r is not None and not r.closed and r.size >= nbytes:
            return r
        size = max(nbytes, 2 * r.size if r is not None else 0)
        size = min((size + _REPLY_GRAIN - 1) // _REPLY_GRAIN * _REPLY_GRAIN, _REPLY_MAX)
        self._reply = None
        if r is not None and not r.closed:
            r.close()
        try:
            self._reply = self.region(size)
        except Error:
            if self._sock is None:
                raise  # the connection is gone: as the socket's call would
            self.reply_region = 0
            return None
        return self._reply

    def _unregister(self, rid):
        if self._sock is None:  # the connection closed: the daemon let go already
            return
        try:
            self._run(ops.unregister(rid))
        except BY_NAME["ECONN"]:
            pass  # lost with its connection

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def pipeline(self):
        """-> Pipeline: its methods queue requests; execute() sends them in
        one write and returns the results in order."""
        return Pipeline(self)

    # ---- one request ------------------------------------------------------
    def _run(self, req, fd=-1):
        rid, bufs = self._enc.frame(req)
        with self._guard:
            if fd >= 0:
                self._send_with_fd(bufs, fd)
            else:
                self._send_frame(bufs)
            r = self._recv_reply()
        return self._result(req, rid, r)

    def _send_with_fd(self, bufs, fd):
        """Sends a frame with `fd` as SCM_RIGHTS on its first byte (the
        daemon takes the fd of the sendmsg that carries a frame's start)."""
        sock = self._sock or self.connect()
        frame = bufs[0] + bufs[1]
        anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _array.array("i", [fd]))]
        n = sock.sendmsg([frame], anc)
        if n < len(frame):
            sock.sendall(frame[n:])

    def _start_req(self, req):
        """Sends `req` -> its id (then _finish reads the reply)."""
        rid, bufs = self._enc.frame(req)
        with self._guard:
            self._send_frame(bufs)
        return rid

    def _send_frame(self, bufs):
        sock = self._sock or self.connect()
        try:
            if len(bufs[1]) < _SMALL:
                sock.sendall(bufs[0] + bufs[1])  # one small copy, one syscall
            else:
                self._sendmsg_all(sock, bufs)  # header + body, no copy
        except (BrokenPipeError, ConnectionResetError):
            self._raise_parting_error()
            raise

    def _raise_parting_error(self):
        """The daemon closed while we were sending: a frame above max_frame
        gets one error reply (id 0) before the close (PROTOCOL.md, "When the
        connection closes"); raise that error if it is there."""
        try:
            self._sock.settimeout(1.0)
            r = self._recv_reply()
        except (OSError, Error):
            return
        finally:
            self.close()
        if isinstance(r.get("status"), int) and r["status"] < 0:
            raise error_for(r["status"], str(r.get("error", "")) +
                            " (the daemon closed the connection)")

    def _finish(self, req, rid):
        with self._guard:
            if self._sock is None:
                raise BY_NAME["ECONN"]("connection lost before the reply")
            r = self._recv_reply()
        return self._result(req, rid, r)

    def _result(self, req, rid, r):
        try:
            return wire.result(req, rid, r)
        except Error as e:
            if getattr(e, "fatal", False):
                self.close()
            raise

    # ---- many requests ------------------------------------------------------
    def _exchange(self, reqs):
        """Sends `reqs` in one write while reading their replies (so that a
        pipeline larger than the socket buffers cannot deadlock with the
        daemon's 32-in-flight limit); -> list of results or Error objects."""
        frames = [self._enc.frame(q) for q in reqs]
        out = [memoryview(b) for _, bufs in frames for b in bufs]
        replies = []
        with self._guard:
            sock = self._sock or self.connect()
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            sock.setblocking(False)
            poller = select.poll()
            try:
                while len(replies) < len(frames):
                    r = self._try_frame()
                    if r is not None:
                        replies.append(r)
                        continue
                    poller.register(sock, select.POLLIN | (select.POLLOUT if out else 0))
                    wait = None if deadline is None else max(0, deadline - time.monotonic()) * 1000
                    if not poller.poll(wait):
                        raise _socket.timeout()
                    if out:
                        try:
                            _drop_sent(out, sock.sendmsg(out[:_IOV_MAX]))
                        except BlockingIOError:
                            pass
                    self._recv_some(sock)
            finally:
                if self._sock is sock:
                    sock.settimeout(self.timeout)
        results = []
        for (rid, _), q, r in zip(frames, reqs, replies):
            try:
                results.append(self._result(q, rid, r))
            except Error as e:
                if getattr(e, "fatal", False):
                    raise
                results.append(e)
        return results

    # ---- transport ---------------------------------------------------------
    @staticmethod
    def _sendmsg_all(sock, bufs):
        views = [memoryview(b) for b in bufs]
        while views:
            _drop_sent(views, sock.sendmsg(views[:_IOV_MAX]))

    def _reset_buffer(self, size):
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    def _try_frame(self):
        """-> one whole reply from the buffer, or None (never blocks)."""
        avail = self._end - self._start
        if avail < 4:
            return None
        s = self._start
        n = wire.body_length(self._view[s:s + 4])
        if avail < 4 + n:
            if s + 4 + n > len(self._buf):  # make room for the whole frame
                old = self._view[s:self._end]
                size = max(len(self._buf), 4 + n)
                buf = bytearray(size)
                buf[:avail] = old
                self._buf, self._view = buf, memoryview(buf)
                self._start, self._end = 0, avail
            return None
        r = wire.decode(self._view[s + 4:s + 4 + n])
        self._start = s + 4 + n
        if self._start == self._end:
            if len(self._buf) > _KEEP:
                self._reset_buffer(1 << 16)
            self._start = self._end = 0
        return r

    def _recv_some(self, sock):
        if self._end == len(self._buf) and self._start:  # compact
            avail = self._end - self._start
            self._buf[:avail] = self._view[self._start:self._end]
            self._start, self._end = 0, avail
        try:
            n = sock.recv_into(self._view[self._end:])
        except BlockingIOError:
            return
        if n == 0:
            raise BY_NAME["ECONN"]("daemon closed the connection")
        self._end += n

    def _recv_reply(self):
        t0 = None  # the wait for this reply's first bytes began (spun calls)
        while True:
            r = self._try_frame()
            if r is not None:
                return r
            if self.busy_poll_us:
                if t0 is None:
                    t0 = time.perf_counter()
                self._spin()
            had = self._end
            self._recv_some(self._sock)
            if t0 and self._end != had:
                self._spin_recent = spin_learn(self._spin_recent,
                                               int((time.perf_counter() - t0) * 1e6))
                t0 = 0  # learned: not again for this reply

    def _spin(self):
        """Polls the socket, without sleeping and yielding the CPU to any
        other runnable thread on each turn, until it has bytes or the spin
        window (spin_window) has passed; the receive after it then finds
        them without a wake-up (or sleeps as before)."""
        poll = self._poll
        if poll is None:
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            poll = self._poll = poller.poll
        if poll(0):
            return
        end = time.perf_counter() + spin_window(self.busy_poll_us, self._spin_recent) * 1e-6
        while not poll(0) and time.perf_counter() < end:
            os.sched_yield()


class _Guard:
    """Maps socket failures to fp4idx errors and closes the connection (its
    stream position is unknown after them)."""

    __slots__ = ("c",)

    def __init__(self, c):
        self.c = c

    def __enter__(self):
        return self

    def __exit__(self, typ, e, tb):
        if typ is None:
            return False
        if issubclass(typ, Error):
            if e.code == BY_NAME["ECONN"].code or getattr(e, "fatal", False):
                self.c.close()
            return False
        if issubclass(typ, _socket.timeout):
            self.c.close()
            raise BY_NAME["ETIMEDOUT"](f"no reply within {self.c.timeout} s") from None
        if issubclass(typ, OSError):
            self.c.close()
            raise BY_NAME["ECONN"](f"{self.c.socket_path}: {e.strerror or e}") from None
        return False


def _drop_sent(views, n):
    while n:
        if n >= len(views[0]):
            n -= len(views.pop(0))
        else:
            views[0] = views[0][n:]
            n = 0


class Pipeline(Queue):
    """Requests collected and sent together: every method queues its request
    and returns the pipeline; execute() sends them all in one write and
    returns their results in order.

    With raise_on_error=True (default) the first daemon error is raised after
    all replies are read; with False errors are returned in the list as
    fp4idx.Error objects. Used as a context manager, the queue is dropped
    on exit.
    """

    def execute(self, raise_on_error=True):
        """Sends the queued requests in one write -> their results in order."""
        reqs = self._take()
        return first_error(self._client._exchange(reqs) if reqs else [], raise_on_error)
