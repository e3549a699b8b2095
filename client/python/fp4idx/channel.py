"""Channels (protocol/PROTOCOL.md "Channels"): score calls made by a CUDA
stream with no host round trip, so that they can sit inside a captured CUDA
graph (torch.cuda.graph) and be replayed.

A channel is opened once over the socket (Client.channel): a control block
-- a sealed memfd that this process and the daemon both map, registered
here with the CUDA driver (cuMemHostRegister) -- goes to the daemon with
`channel_open`, bound to regions of the connection for q, w, lens and the
outputs. A call (Channel.score / Channel.topk) is then four kinds of stream
operations on the caller's torch stream, issued through ctypes on
libcuda.so.1 as the C client does (client/channel.c): reset the slot's
completion word, write the descriptor, ring the doorbell
(cuStreamWriteValue32/64), wait until the completion word says done
(cuStreamWaitValue32). The daemon runs the score on the regions and writes
the completion word after the outputs.

Replays: a captured call writes the same values each time, so what changes
per step lives in device memory the caller's kernels update before the
call: q, w and lens in the bound regions, and the sequence as a one-element
int64 CUDA tensor passed as `seq` (copied into the descriptor on the stream).

Failures never hang a stream: a bad call completes with its status
(Channel.status, Channel.check); a thread of the channel watches the
connection and, once it is closed (the daemon died, Client.close), writes
every pending completion word with ECONN, and keeps doing so for later calls
until the channel is closed.

stream="host" makes the calls with CPU stores and a host wait instead (the
same block, descriptor, doorbell and completion word), for hosts without a
GPU and tests.
"""
import ctypes
import mmap
import os
import platform
import select
import struct
import threading
import time

import numpy as np

from . import arrays, cuda_driver, ops, regions
from .errors import BY_NAME, error_for

# The layout of protocol/fp4idx_channel.h.
MAGIC = 0x48433446        # "F4CH"
VERSION = 1
HEADER_BYTES = 64
SLOT_BYTES = 128
DOORBELL_AT = 96
COMPLETION_AT = 100
DONE = 0x80000000
TICKET_MASK = 0x7FFF
F_LENS = 1
MAX_SLOTS = 1024
MAX_ROWS = 65536
MAX_HEADS = 128
MAX_TOPK = 1 << 20
_HEADER = struct.Struct("<IIIIQ")
_DESC = struct.Struct("<IIQIIIIQQQQQQ")   # fp4idx_channel_desc_t, 80 bytes
_SEQ_WORD = 1                             # the descriptor's u64 word holding seq

# F_SEAL_GROW as well as the regions' seals: the block never changes size.
_SEALS = regions._SEALS | 0x0004

_ECONN = BY_NAME["ECONN"].code


def _invalid(msg):
    return BY_NAME["EINVAL"](msg)


def _call_error(channel, ticket, status, more=""):
    """The typed exception of a call that completed with `status`."""
    text = error_for(status).text
    return error_for(status, f"channel {channel} call {ticket}: {text}{more}")


def block_bytes(slots):
    """Bytes of a control block of `slots` slots."""
    return HEADER_BYTES + SLOT_BYTES * slots


def slot_of(ticket, slots):
    """The slot of the call with `ticket` (1, 2, ..., 2^32 - 1, then 1)."""
    return (ticket - 1) % slots


def completion(ticket, status):
    """The completion word of a finished call (status 0 or negative)."""
    return DONE | (ticket & TICKET_MASK) << 16 | (-status & 0xFFFF)


# flags of the driver calls (cuda.h; the calls: cuda_driver.py)
_CU_HOST_PORTABLE_DEVICEMAP = 0x01 | 0x02
_CU_STREAM_WAIT_VALUE_AND = 0x2


# ---- the channel -----------------------------------------------------------------

def _torch():
    try:
        import torch
    except ImportError:
        raise BY_NAME["ENODEV"]("channel calls on a CUDA stream need torch with CUDA "
                                "(stream='host' makes them with the CPU)") from None
    if not torch.cuda.is_available():
        raise BY_NAME["ENODEV"]("no CUDA device for the channel's stream (stream='host' "
                                "makes the calls with the CPU)")
    return torch


def _region_id(r, what):
    if isinstance(r, regions.Region):
        if r.closed:
            raise BY_NAME["EREGION"](f"{what}: region {r.id} is closed ({r.released})")
        return r.id
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise _invalid(f"{what} must be a Region (or a region id), got {r!r}")
    return r


def _bindings(table, region, q, w, lens, out):
    """The regions a channel's calls use -> {"q", "w", "lens", "out"} ids
    (lens 0: calls pass no lens). Each defaults to `region`, which defaults
    to the connection's only open region."""
    if region is None and None in (q, w, out):
        if len(table.regions) != 1:
            raise _invalid(f"name the channel's regions (region=, or q=, w=, lens=, out=): "
                           f"this connection has {len(table.regions)} open regions")
        region = table.regions[0]
    pick = {"q": q, "w": w, "lens": lens, "out": out}
    ids = {}
    for name, r in pick.items():
        if name == "lens" and r is False:
            ids[name] = 0
            continue
        ids[name] = _region_id(region if r is None else r, name)
    return ids


class Channel:
    """A channel of one connection (made by Client.channel). Calls:
    score(...), topk(...) -> the call's ticket; status(ticket); check();
    close() (or `with`). Attributes: .id (the daemon's), .slots, .regions
    (the bound region ids), .stream ("host", a torch stream, or None: the
    current stream of each call), .closed, .dead (the connection is gone)."""

    def __init__(self, client, stream, bind, slots):
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            raise _invalid(f"slots must be in 1..{MAX_SLOTS}, got {slots!r}")
        self.slots = slots
        self.size = block_bytes(slots)
        self.regions = bind
        self.stream = stream
        self.id = None
        self.closed = False
        self.dead = False
        self._client = client
        self._table = client._regions
        self._host = stream == "host"
        self._next = 1
        self._lock = threading.Lock()
        self._latest = {}         # slot -> the ticket of its latest call
        self._mm = None
        self._drv = self._ctx = self._device = None
        self._dblock = 0
        self._wake = self._sock = self._watcher = None
        self._released = 0
        fd = -1
        try:
            self._device = self._stream_device(stream)
            fd = self._make_block()
            if not self._host:
                self._map_device()
            self._conn = client._sock or client.connect()
            self._sock = os.dup(self._conn.fileno())
            self._wake = os.pipe()
            self.id = client._run(ops.call("channel_open", {
                "slots": slots, "size": self.size, "q_region": bind["q"],
                "w_region": bind["w"], "out_region": bind["out"],
                "lens_region": bind["lens"] or None}), fd)["channel"]
            self._watcher = threading.Thread(target=self._watch, name=f"fp4idx-channel-{self.id}",
                                             daemon=True)
            self._watcher.start()
        except BaseException:
            self._free()
            raise
        finally:
            if fd >= 0:
                os.close(fd)
        client._channels.append(self)

    def __repr__(self):
        state = "closed" if self.closed else "dead" if self.dead else "open"
        return f"<fp4idx.Channel {self.id} {self.slots} slots {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- setting up ----------------------------------------------------------
    def _stream_device(self, stream):
        if self._host:
            if platform.machine() not in ("x86_64", "AMD64"):
                raise BY_NAME["ENODEV"]("stream='host' orders its stores as x86-64 does; this "
                                        f"host is {platform.machine()}")
            return None
        if stream is not None and not (hasattr(stream, "cuda_stream") and
                                       hasattr(stream, "device")):
            raise _invalid(f"stream must be a torch.cuda.Stream, None (the current stream of "
                           f"each call) or 'host', got {stream!r}")
        torch = _torch()
        if stream is None:
            return torch.cuda.current_device()
        return stream.device.index if stream.device.index is not None else \
            torch.cuda.current_device()

    def _make_block(self):
        """The sealed memfd of the control block, mapped here, with its
        header -> the fd (to send)."""
        try:
            fd = regions.memfd(self.size, "fp4idx-channel", _SEALS)
        except OSError as e:
            raise BY_NAME["ENOMEM"](f"cannot make the channel's control block: "
                                    f"{e.strerror or e}") from None
        try:
            self._mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            raise BY_NAME["ENOMEM"](f"cannot map the channel's control block: "
                                    f"{e.strerror or e}") from None
        self._base = regions.host_address(self._mm)
        _HEADER.pack_into(self._mm, 0, MAGIC, VERSION, self.slots, SLOT_BYTES, self.size)
        return fd

    def _map_device(self):
        """Registers the block with the CUDA driver (portable, mapped) and
        takes its device address."""
        drv = cuda_driver.Driver.get()
        for need in ("write32", "write64", "wait32", "memcpy"):
            getattr(drv, need)  # NoDevice now, not at the first call, for a driver without them
        cudev, ctx = drv.primary_context(self._device)
        self._drv, self._ctx, self._cudev = drv, ctx, cudev
        with drv.pushed(ctx):
            drv.check(drv.host_register(self._base, self.size, _CU_HOST_PORTABLE_DEVICEMAP),
                      "cuMemHostRegister of the channel's block")
            d = ctypes.c_uint64()
            rc = drv.host_device_pointer(ctypes.byref(d), self._base, 0)
            if rc != 0 or not d.value:
                drv.host_unregister(self._base)
                drv.check(rc or 1, "cuMemHostGetDevicePointer")
            self._dblock = d.value

    # ---- the words of the block -------------------------------------------------
    def _word(self, slot, at):
        """The u32 at byte `at` of `slot`, as a ctypes object over the mapping."""
        return ctypes.c_uint32.from_address(self._base + HEADER_BYTES + slot * SLOT_BYTES + at)

    def _release(self):
        """Writes ECONN into every pending (0) completion word of a slot
        this channel has called on -> how many."""
        n = 0
        for i in list(self._latest):
            word = self._word(i, COMPLETION_AT)
            if word.value == 0:
                word.value = completion(self._word(i, 0).value, _ECONN)
                n += 1
        return n

    def _watch(self):
        """Waits for the connection to close (or the channel to), then
        releases the pending calls, and keeps releasing later ones (every
        millisecond) until the channel closes."""
        p = select.poll()
        p.register(self._sock, select.POLLRDHUP)
        p.register(self._wake[0], select.POLLIN)
        hup = select.POLLRDHUP | select.POLLHUP | select.POLLERR | select.POLLNVAL
        nap, stop = None, False
        while not stop:
            for fd, ev in p.poll(nap):
                if fd == self._sock and ev & hup:
                    self.dead = True
                    p.unregister(fd)
                    nap = 1
                elif fd == self._wake[0]:
                    stop = True
            if self.dead:
                self._release()
        self._released = self._release()   # read after the join

    # ---- calls ---------------------------------------------------------------
    def score(self, seq, q, w, lens=None, out=None):
        """Enqueues a full-logits call -> its ticket. out: float32 [R, W] in
        the bound output region, W = max(lens) or the sequence's length
        (ShapeMismatch, from the daemon, otherwise). See topk for the rest."""
        if out is None:
            raise _invalid("a channel call needs out= (float32 [R, W] in the channel's output "
                           "region): the daemon writes results only into regions")
        ref = self._ref(out, "f32", "out")
        if len(ref["shape"]) != 2:
            raise _invalid(f"out must be [R, W], got shape {ref['shape']}")
        rows, width = ref["shape"]
        return self._call(seq, q, w, lens, rows, 0, width, (ref["offset"], 0, 0))

    def topk(self, seq, q, w, k, lens=None, out=None):
        """Enqueues a top-k call -> its ticket. seq: the sequence (int), or
        a one-element int64 CUDA tensor read when the stream reaches the
        call (a sequence that changes from one replay to the next). q
        bf16 [R,H,128], w bf16 [R,H], lens int32 [R] (None: the whole
        sequence) in the bound input regions; out: (positions int32 [R,k],
        logits float32 [R,k], counts int32 [R]) in the output region.
        Tensors are torch CUDA tensors of a register_cuda region, or numpy
        arrays of a host region (region.array), or Refs.

        On a CUDA stream the call is enqueued and its own status comes with
        its completion word (status, check). With stream='host' it has
        completed on return, and a failed call raises its error.
        Raises: InvalidArgument (shapes, dtypes, k, rows, heads: checked
        here), NoRegion (a tensor in no region of the connection),
        RegionError (in a region the channel is not bound to), DeviceError
        (the driver refused a stream operation), ConnectionLost (the channel
        is closed or its connection lost)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_TOPK:
            raise _invalid(f"k must be in 1..{MAX_TOPK}, got {k!r}")
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise _invalid("topk needs out=(positions, logits, counts) in the channel's output "
                           "region")
        refs = [self._ref(x, dt, name) for x, dt, name in
                zip(out, ("i32", "f32", "i32"), ("positions", "logits", "counts"))]
        if len(refs[2]["shape"]) != 1:
            raise _invalid(f"counts must be [R], got {refs[2]['shape']}")
        rows = refs[2]["shape"][0]
        for ref, name in zip(refs[:2], ("positions", "logits")):
            if ref["shape"] != [rows, int(k)]:
                raise _invalid(f"{name} must be [R, k] = [{rows}, {k}], got {ref['shape']}")
        return self._call(seq, q, w, lens, rows, int(k), 0,
                          (refs[1]["offset"], refs[0]["offset"], refs[2]["offset"]))

    def _ref(self, x, want, name):
        """Tensor `x` of a call -> its reference map in the region the
        channel binds `name` to."""
        bound = self.regions["out" if name in ("out", "positions", "logits", "counts") else name]
        ref = arrays.region_ref(x, self._table, want, sync=False)
        if ref is None:
            raise BY_NAME["ENOREGION"](f"{name}: not in a region registered on this connection "
                                       "(a channel reads and writes only its regions)")
        if ref["dtype"] != want:
            raise _invalid(f"{name}: a Ref of {ref['dtype']} where {want} goes")
        if ref["region"] != bound:
            raise BY_NAME["EREGION"](f"{name} is in region {ref['region']}; the channel's "
                                     f"{'lens' if name == 'lens' else name} region is "
                                     f"{bound or 'none'}")
        return ref

    def _call(self, seq, q, w, lens, rows, k, width, outs):
        if self.closed or self.dead:
            raise BY_NAME["ECONN"](f"channel {self.id} is "
                                   f"{'closed' if self.closed else 'lost with its connection'}")
        seq_ptr, seq = self._seq(seq)
        qr, wr = self._ref(q, "bf16", "q"), self._ref(w, "bf16", "w")
        if len(qr["shape"]) != 3 or qr["shape"][2] != 128 or qr["shape"][0] != rows:
            raise _invalid(f"q must be [R, H, 128] with R = {rows} (the outputs' rows), got "
                           f"{qr['shape']}")
        heads = qr["shape"][1]
        if not 1 <= rows <= MAX_ROWS or not 1 <= heads <= MAX_HEADS:
            raise _invalid(f"rows must be in 1..{MAX_ROWS} and heads in 1..{MAX_HEADS}, got "
                           f"{rows} and {heads}")
        if wr["shape"] != [rows, heads]:
            raise _invalid(f"w must be [R, H] = [{rows}, {heads}], got {wr['shape']}")
        lens_at = 0
        if lens is not None:
            lr = self._ref(lens, "i32", "lens")
            if lr["shape"] != [rows]:
                raise _invalid(f"lens must be [R] = [{rows}], got {lr['shape']}")
            lens_at = lr["offset"]
        with self._lock:
            t = self._next
            self._next = t + 1 if t < 0xFFFFFFFF else 1
        desc = _DESC.pack(t, F_LENS if lens is not None else 0, seq, rows, heads, k, width,
                          qr["offset"], wr["offset"], lens_at, *outs)
        slot = slot_of(t, self.slots)
        self._latest[slot] = t
        if self._host:
            self._host_call(slot, t, desc)
        else:
            self._stream_call(slot, t, desc, seq_ptr)
        return t

    def _seq(self, seq):
        """-> (device address of a one-element int64 CUDA tensor or 0, the
        descriptor's seq)."""
        if isinstance(seq, (int, np.integer)) and not isinstance(seq, bool):
            return 0, ops._uint("seq", seq)
        torch = None if self._host else _torch()
        if torch is None or not isinstance(seq, torch.Tensor) or seq.device.type != "cuda" or \
                seq.dtype != torch.int64 or seq.numel() != 1:
            raise _invalid("seq must be an int, or (on a CUDA stream) a one-element int64 "
                           f"CUDA tensor, got {type(seq).__name__}")
        return seq.data_ptr(), 0

    def _host_call(self, slot, t, desc):
        """The call by this thread: CPU stores, then a wait on the word (the
        watcher writes ECONN into it when the connection goes). x86-64
        keeps these stores in program order, so the daemon that sees the
        doorbell sees the descriptor."""
        done = self._word(slot, COMPLETION_AT)
        done.value = 0
        ctypes.memmove(self._base + HEADER_BYTES + slot * SLOT_BYTES, desc, len(desc))
        self._word(slot, DOORBELL_AT).value = t
        spins = 0
        while not done.value & DONE:
            spins += 1
            if spins > 2000:
                time.sleep(20e-6 if spins < 20000 else 1e-3)
        self._raise_status(t, done.value)

    def _stream_call(self, slot, t, desc, seq_ptr):
        """The call as stream operations: reset the completion word, write
        the descriptor (ten 64-bit words; seq copied from its tensor when
        it is one), ring, wait."""
        torch = _torch()
        stream = self.stream if self.stream is not None else torch.cuda.current_stream(
            self._device)
        h = ctypes.c_void_p(stream.cuda_stream)
        base = self._dblock + HEADER_BYTES + slot * SLOT_BYTES
        drv = self._drv
        head = [(cuda_driver.OP_WRITE32, base + COMPLETION_AT, 0, 0)]
        head += [(cuda_driver.OP_WRITE64, base + 8 * i, v, 0)
                 for i, v in enumerate(struct.unpack("<10Q", desc))
                 if not (seq_ptr and i == _SEQ_WORD)]
        tail = [(cuda_driver.OP_WRITE32, base + DOORBELL_AT, t, 0),
                (cuda_driver.OP_WAIT32, base + COMPLETION_AT, DONE, _CU_STREAM_WAIT_VALUE_AND)]
        with drv.pushed(self._ctx):
            if not seq_ptr:
                drv.memops(h, head + tail)
                return
            drv.memops(h, head)
            drv.check(drv.memcpy(base + 8 * _SEQ_WORD, seq_ptr, 8, h), "cuMemcpyAsync of seq")
            drv.memops(h, tail)

    # ---- results ---------------------------------------------------------------
    def status(self, ticket):
        """The status of the latest call with `ticket`, read from its
        completion word on the host (after the stream passed the call):
        0, a negative status code (fp4idx.error_for turns it into its
        exception; ECONN when the channel or connection closed first), or
        None while it has not completed (or the slot serves a later call)."""
        if self.closed:
            raise BY_NAME["ECONN"](f"channel {self.id} is closed")
        if isinstance(ticket, bool) or not isinstance(ticket, int) or not 1 <= ticket <= 0xFFFFFFFF:
            raise _invalid(f"ticket must be in 1..2^32-1, got {ticket!r}")
        word = self._word(slot_of(ticket, self.slots), COMPLETION_AT).value
        if not word & DONE or (word >> 16) & TICKET_MASK != ticket & TICKET_MASK:
            return None
        return -(word & 0xFFFF)

    def _raise_status(self, t, word):
        st = -(word & 0xFFFF)
        if st:
            raise _call_error(self.id, t, st)

    def check(self, synchronize=True):
        """Raises the error of the first failed call among the latest call
        of each slot (a slot keeps the status of its latest call only:
        give the channel as many slots as the calls to check at once) ->
        how many completed calls were checked. synchronize: first wait for
        the channel's stream (None: the whole device) so that every call
        enqueued has completed."""
        if synchronize and not self._host and not self.closed:
            torch = _torch()
            if self.stream is not None:
                self.stream.synchronize()
            else:
                torch.cuda.synchronize(self._device)
        n, failed = 0, []
        for slot, t in sorted(self._latest.items()):
            st = self.status(t)
            if st is None:
                continue
            n += 1
            if st:
                failed.append((t, st))
        if failed:
            t, st = failed[0]
            raise _call_error(self.id, t, st, f" ({len(failed)} of the {n} calls checked failed)")
        return n

    # ---- lifetime ----------------------------------------------------------------
    def close(self):
        """Closes the channel: asks the daemon to close it (while the
        connection is open), writes ECONN into every pending completion
        word, stops the watcher, unregisters and unmaps the block. Streams
        must have no call of the channel still to come (synchronize them
        first, and replay no graph that holds its calls afterwards): a call
        already waiting is released with ECONN, and then the device is
        synchronized before the block is unregistered. Closing twice is a
        no-op. Raises what the daemon answered, after closing."""
        if self.closed:
            return
        self.closed = True
        err = None
        c = self._client
        if not self.dead and c._sock is self._conn:
            try:
                c._run(ops.call("channel_close", {"channel": self.id}))
            except BY_NAME["ECONN"]:
                pass  # lost with its connection: the daemon closed it
            except Exception as e:  # the daemon's refusal: raised once freed
                err = e
        if self in c._channels:
            c._channels.remove(self)
        self._free()
        if err is not None:
            raise err

    def _free(self):
        self.dead = True
        if self._watcher is not None:
            os.write(self._wake[1], b"x")
            self._watcher.join()   # it releases the pending calls last
        elif self._mm is not None:
            self._released = self._release()
        if self._dblock:
            with self._drv.pushed(self._ctx):
                if self._released:  # a stream may still wait on a released word
                    self._drv.synchronize()
                self._drv.host_unregister(self._base)
            self._dblock = 0
        if self._ctx is not None:
            self._drv.release(self._cudev)
            self._ctx = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        for fd in (self._sock, *(self._wake or ())):
            if fd is not None:
                os.close(fd)
        self._sock = self._wake = None
