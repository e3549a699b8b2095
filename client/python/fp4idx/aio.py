"""AsyncClient: the same methods as Client, as coroutines over asyncio
streams. Calls from concurrent tasks share the connection and are
pipelined: each request is written at once, and one reader task hands the
replies (which come in request order) to the waiting calls in order.
"""
import array as _array
import asyncio
import collections
import os
import socket as _socket

from . import ops, regions, wire
from .errors import BY_NAME, Error
from .methods import Methods, Queue, first_error, unseen

_BACKLOG = 1 << 20  # bytes queued in the transport before a call waits (drain)


class AsyncClient(Methods):
    """asyncio client of one fp4idxd. Create it, then `await c.connect()` or
    use `async with fp4idx.AsyncClient(...) as c:`; a call on a closed or
    lost connection connects first. socket and timeout as for Client
    (timeout: seconds per call; on expiry the connection is closed, every
    waiting call fails with Timeout)."""

    def __init__(self, socket=None, timeout=None):
        self.socket_path = socket if socket is not None else wire.default_socket()
        self.timeout = timeout
        self._enc = wire.Encoder()
        self._reader = self._writer = self._task = None
        self._pending = collections.deque()  # (future, request, id), in send order
        self._lock = None
        self._regions = regions.Table(aunregister=self._unregister)

    async def connect(self):
        """(Re)connects, failing calls still waiting on an old connection."""
        await self.close()
        try:
            coro = asyncio.open_unix_connection(self.socket_path, limit=1 << 20)
            self._reader, self._writer = await asyncio.wait_for(coro, self.timeout)
        except asyncio.TimeoutError:
            raise BY_NAME["ETIMEDOUT"](f"connect {self.socket_path}: timed out") from None
        except OSError as e:
            raise BY_NAME["ECONN"](f"connect {self.socket_path}: {e.strerror or e}") from None
        self._task = asyncio.ensure_future(self._read_loop(self._reader))
        return self

    @property
    def connected(self):
        """True while a connection is open."""
        return self._writer is not None

    async def close(self):
        """Closes the connection; calls still waiting fail with ConnectionLost.
        The daemon releases the connection's regions (closed here too)."""
        self._fail_all(BY_NAME["ECONN"]("connection closed"))
        self._regions.release_all("its connection closed")
        w, t = self._writer, self._task
        self._reader = self._writer = self._task = None
        if t is not None and t is not asyncio.current_task():
            t.cancel()
        if w is not None:
            w.close()
            try:
                await w.wait_closed()
            except OSError:
                pass

    async def __aenter__(self):
        if self._writer is None:
            await self.connect()
        return self

    async def __aexit__(self, *exc):
        await self.close()

    def pipeline(self):
        """-> AsyncPipeline: queue calls, then `await p.execute()`."""
        return AsyncPipeline(self)

    async def scan_sequences(self, count=None):
        """Async iterator over every sequence of a full list scan, once each
        (as Client.scan_sequences): `async for s in c.scan_sequences(): ...`"""
        seen, cursor = set(), 0
        while True:
            cursor, seqs = await self.list(cursor, count)
            for s in unseen(seen, seqs):
                yield s
            if cursor == 0:
                return

    # ---- regions ---------------------------------------------------------------
    async def region(self, size):
        """-> a host Region of `size` bytes on this connection, as
        Client.region (close it with `await region.aclose()` or `async
        with`). asyncio's streams cannot pass a file descriptor, so the
        register frame is written with sendmsg on the stream's own socket
        once everything queued before it has left the transport (calls of
        other tasks go on meanwhile)."""
        size = ops._uint("size", size)
        fd, mm = regions.host_memory(size)
        try:
            rid = await self._wait(await self._send_fd(ops.register_host(size), fd))
        except BaseException:
            mm.close()
            raise
        finally:
            os.close(fd)
        return self._regions.add(regions.Region(self._regions, rid, "host", size,
                                                regions.host_address(mm), mm=mm))

    async def register_cuda(self, tensor, device=None):
        """As Client.register_cuda (a CUDA Region; `await region.aclose()`)."""
        base, size, handle, dev, bus = regions.cuda_allocation(tensor)
        regions.check_cuda_daemon(await self.info(), bus, self.socket_path)
        rid = await self._run(ops.register_cuda(handle, size, dev if device is None else device))
        return self._regions.add(regions.Region(self._regions, rid, "cuda", size, base,
                                                owner=tensor))

    async def _unregister(self, rid):
        if self._writer is None:  # the daemon released it with the connection
            return
        try:
            await self._run(ops.unregister(rid))
        except BY_NAME["ECONN"]:
            pass

    async def _send_fd(self, req, fd):
        """Writes `req` with `fd` as SCM_RIGHTS on the frame's first byte ->
        its future. The transport must have nothing queued (its bytes would
        come after ours), and nothing may be written between: the sendmsg
        and the queueing of the rest happen in one step of the loop."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._writer is None:
                await self.connect()
            w = self._writer
            rid, bufs = self._enc.frame(req)
            frame = bufs[0] + bufs[1]
            raw = w.get_extra_info("socket")
            sock = _socket.socket(fileno=os.dup(raw.fileno()))
            sock.setblocking(False)
            anc = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _array.array("i", [fd]))]
            try:
                while True:
                    while w.transport.get_write_buffer_size():
                        await asyncio.sleep(0.0005)  # drain() returns at once below its mark
                    try:
                        n = sock.sendmsg([frame], anc)
                    except BlockingIOError:  # the daemon's receive buffer is full
                        await asyncio.sleep(0.001)
                        continue
                    break
            except OSError as e:
                await self._lost(BY_NAME["ECONN"](f"{self.socket_path}: {e.strerror or e}"))
                raise BY_NAME["ECONN"](f"{self.socket_path}: {e.strerror or e}") from None
            finally:
                sock.close()
            fut = asyncio.get_running_loop().create_future()
            self._pending.append((fut, req, rid))
            if n < len(frame):
                w.write(frame[n:])
            return fut

    # ---- requests ------------------------------------------------------------
    async def _run(self, req):
        (fut,) = await self._send([req])
        return await self._wait(fut)

    async def _send(self, reqs):
        """Writes `reqs` in one write -> their futures."""
        if self._writer is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:  # one connect at a time
                if self._writer is None:
                    await self.connect()
        w = self._writer
        if w is None:  # lost again while connecting
            raise BY_NAME["ECONN"](f"{self.socket_path}: connection lost")
        loop = asyncio.get_running_loop()
        futs, chunks = [], []
        for req in reqs:
            rid, bufs = self._enc.frame(req)
            fut = loop.create_future()
            self._pending.append((fut, req, rid))
            futs.append(fut)
            chunks.extend(bufs)
        w.writelines(chunks)  # no await between queueing and writing
        # Wait for the socket only when the transport holds a backlog (drain
        # is the flow control; a small request is already on its way).
        if w.transport.get_write_buffer_size() > _BACKLOG:
            try:
                await w.drain()
            except OSError as e:
                await self._lost(BY_NAME["ECONN"](f"{self.socket_path}: {e.strerror or e}"))
        return futs

    async def _wait(self, fut):
        if self.timeout is None:
            return await fut
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout)
        except asyncio.TimeoutError:
            await self._lost(BY_NAME["ETIMEDOUT"](f"no reply within {self.timeout} s"))
            return fut.result()  # raises the Timeout set by _lost

    async def _read_loop(self, reader):
        try:
            while True:
                hdr = await reader.readexactly(4)
                body = await reader.readexactly(wire.body_length(hdr))
                r = wire.decode(body)
                if not self._pending:
                    raise wire.desync("a reply nobody asked for")
                fut, req, rid = self._pending.popleft()
                try:
                    res = wire.result(req, rid, r)
                except Exception as e:  # the daemon's error, or a reply we cannot use
                    if not fut.done():
                        fut.set_exception(e)
                    if getattr(e, "fatal", False):
                        raise
                    continue
                if not fut.done():
                    fut.set_result(res)
        except asyncio.CancelledError:
            raise
        except asyncio.IncompleteReadError:
            await self._lost(BY_NAME["ECONN"]("daemon closed the connection"))
        except Error as e:
            await self._lost(e)
        except OSError as e:
            await self._lost(BY_NAME["ECONN"](f"{self.socket_path}: {e.strerror or e}"))

    def _fail_all(self, err):
        while self._pending:
            fut = self._pending.popleft()[0]
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # retrieved: no "never retrieved" warning

    async def _lost(self, err):
        self._fail_all(err)
        await self.close()


class AsyncPipeline(Queue):
    """AsyncClient's pipeline: methods queue (and return the pipeline);
    `await p.execute(raise_on_error=True)` writes all at once and returns
    the results in order (errors as fp4idx.Error objects when
    raise_on_error is False; a lost connection or a timeout always raises)."""

    async def execute(self, raise_on_error=True):
        """Writes the queued requests at once -> their results in order."""
        reqs = self._take()
        if not reqs:
            return []
        futs = await self._client._send(reqs)
        results = await asyncio.gather(*(self._client._wait(f) for f in futs),
                                       return_exceptions=True)
        for r in results:
            if not isinstance(r, Error) and isinstance(r, BaseException):
                raise r
            if isinstance(r, Error) and r.code in (-14, -15):
                raise r
        return first_error(results, raise_on_error)
