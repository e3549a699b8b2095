"""Zero-copy regions (protocol/PROTOCOL.md, "Regions", `register`).

A region is memory this process shares with the daemon: a host region (a
sealed memfd both sides map) or a CUDA region (a device allocation the
daemon opens by its IPC handle). Once registered, arrays that live in it
are sent as references {region, offset, dtype, shape}: their bytes never
cross the socket, and `out=` arrays in it receive score results in place.

A region belongs to the connection that registered it: the daemon releases
it when that connection closes (Client.close, or a lost connection), and
this module then marks it released (using it raises RegionError).
"""
import fcntl
import mmap
import os
import sys

import numpy as np

from . import cuda_driver
from .errors import BY_NAME

# What daemon/regions.c requires of a host region's fd: a memfd that cannot
# shrink under the daemon's mapping (F_SEAL_SHRINK) and stays writable;
# F_SEAL_SEAL keeps anyone from adding a write seal later.
# (fcntl names them from Python 3.9 on; the values are Linux's.)
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0x0002) | getattr(fcntl, "F_SEAL_SEAL", 0x0001)
_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_ALIGN = 256  # bump allocations start on this boundary (any dtype, cache lines)

_WIRE_OF = {np.dtype("<u2"): "bf16", np.dtype("<f4"): "f32",
            np.dtype("<i4"): "i32", np.dtype("u1"): "u8"}


def _no_region(msg):
    return BY_NAME["ENOREGION"](msg)


def _region_error(msg):
    return BY_NAME["EREGION"](msg)


class Ref:
    """An explicit reference {region, offset, dtype, shape} (PROTOCOL.md,
    "Tensors"): passed where an array goes, it is sent as it is, unchecked
    by the client (the daemon checks it: NoRegion, RegionError)."""

    __slots__ = ("region", "offset", "dtype", "shape")

    def __init__(self, region, offset, dtype, shape):
        if dtype not in ("bf16", "f32", "i32", "u8"):
            raise BY_NAME["EINVAL"](f"Ref dtype must be bf16, f32, i32 or u8, got {dtype!r}")
        self.region = int(region)
        self.offset = int(offset)
        self.dtype = dtype
        self.shape = [int(d) for d in shape]

    @property
    def ndim(self):
        return len(self.shape)

    def wire(self):
        return {"region": self.region, "offset": self.offset,
                "dtype": self.dtype, "shape": list(self.shape)}


def memfd(size, name="fp4idx-region", seals=_SEALS):
    """-> an fd of a new memfd of `size` bytes sealed as the daemon requires
    (MFD_ALLOW_SEALING, ftruncate, `seals`: F_SEAL_SHRINK | F_SEAL_SEAL
    unless told)."""
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    fd = os.memfd_create(name, flags)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, _F_ADD_SEALS, seals)
    except OSError:
        os.close(fd)
        raise
    return fd


def host_memory(size):
    """-> (fd, mmap) of a new sealed memfd of `size` bytes (>= 1) and this
    process's mapping of it, for a register request (the caller closes the
    fd once it is sent). InvalidArgument for size 0, OutOfMemory when the
    memfd or the mapping cannot be made."""
    if size < 1:
        raise BY_NAME["EINVAL"]("a region needs size >= 1")
    try:
        fd = memfd(size)
    except OSError as e:
        raise BY_NAME["ENOMEM"](f"cannot make a {size}-byte memfd: {e.strerror or e}") from None
    try:
        return fd, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as e:
        os.close(fd)
        raise BY_NAME["ENOMEM"](f"cannot map a {size}-byte memfd: {e.strerror or e}") from None


def check_cuda_daemon(info, bus, where):
    """RegionError unless daemon `info` says CUDA backend on the GPU of PCI
    bus id `bus` (the daemon can open memory of its own GPU only)."""
    if info.get("backend") != "cuda":
        raise _region_error(f"CUDA regions need a daemon on the CUDA backend; {where} runs "
                            f"{info.get('backend')}")
    if not same_bus(str(info.get("device", "")), bus):
        raise _region_error(f"the tensor is on GPU {bus}, the daemon on {info.get('device')}: "
                            "it can open memory of its own GPU only")


class Region:
    """A registered region of one connection. Made by Client.region(size)
    (host) or Client.register_cuda(tensor) (CUDA); `with` closes it.

    .id (the daemon's id), .size (bytes), .kind ("host" or "cuda"),
    .closed. Host regions hand out numpy views: array(dtype, shape,
    offset=None) (offset None: the next free bytes of a bump allocator,
    aligned to 256; reset() starts it again)."""

    def __init__(self, table, rid, kind, size, base, mm=None, owner=None):
        self._table = table
        self.id = rid
        self.kind = kind
        self.size = size
        self.base = base          # address of byte 0 in this process
        self._mm = mm             # host: the mmap (ours; the daemon has its own)
        self._u8 = np.frombuffer(mm, np.uint8) if mm is not None else None
        self._owner = owner       # cuda: the tensor that keeps the memory alive
        self._next = 0
        self.closed = False
        self.released = None      # why it is no longer usable, once it is not

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<fp4idx.Region {self.id} {self.kind} {self.size} bytes {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self.closed:
            raise _region_error(f"region {self.id} is closed ({self.released})")

    # ---- host memory ---------------------------------------------------------
    def alloc(self, nbytes, align=_ALIGN):
        """-> the offset of `nbytes` fresh bytes (bump allocator, `align`
        a power of two). RegionError when the region is full."""
        self._check_open()
        off = (self._next + align - 1) & ~(align - 1)
        if nbytes < 0 or off + nbytes > self.size:
            raise _region_error(f"region {self.id}: {nbytes} bytes at {off} do not fit "
                                f"its {self.size} bytes ({self.size - self._next} left)")
        self._next = off + nbytes
        return off

    def reset(self):
        """Makes the bump allocator start at offset 0 again (views already
        handed out keep pointing at the same bytes)."""
        self._next = 0

    def array(self, dtype, shape, offset=None):
        """-> a numpy array of `dtype` and `shape` in this host region, at
        byte `offset` (None: allocated). Writes to it are seen by the
        daemon; passed to a call of this region's client it is sent as a
        reference. RegionError: not a host region, closed, out of bounds,
        or an offset that is not a multiple of the dtype's size."""
        self._check_open()
        if self._u8 is None:
            raise _region_error(f"region {self.id} is a {self.kind} region: make views of "
                                "the registered tensor instead")
        dt = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if offset is None:
            offset = self.alloc(n, max(_ALIGN, dt.itemsize))
        if offset < 0 or offset % dt.itemsize:
            raise _region_error(f"offset {offset} is not a multiple of {dt.itemsize} "
                                f"(the size of {dt})")
        if offset + n > self.size:
            raise _region_error(f"bytes [{offset}, {offset + n}) are outside region "
                                f"{self.id} ({self.size} bytes)")
        return self._u8[offset:offset + n].view(dt).reshape(shape)

    def tensor(self, dtype, shape, offset=None):
        """CUDA region made by register_cuda(tensor) -> a torch tensor of
        `dtype` and `shape` carved from that tensor at byte `offset` of it
        (None: the next free bytes, 256-aligned; reset() starts again). It lies in the region, so calls send
        it as a reference and it can be an out=. RegionError: not a CUDA
        region of a contiguous tensor, closed, out of bounds, misaligned."""
        self._check_open()
        torch = sys.modules.get("torch")
        t = self._owner
        if torch is None or t is None or not t.is_contiguous():
            raise _region_error(f"region {self.id}: tensor() needs a CUDA region registered "
                                "from a contiguous torch tensor (host regions: array())")
        u8 = t.view(-1).view(torch.uint8)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        item = torch.empty((), dtype=dtype).element_size()
        n = int(np.prod(shape, dtype=np.int64)) * item
        start = t.data_ptr() - self.base   # where the tensor begins in the allocation
        if offset is None:  # bump allocation, in bytes of the registered tensor
            offset = (self._next + _ALIGN - 1) & ~(_ALIGN - 1)
            if offset + n > u8.numel():
                raise _region_error(f"region {self.id}: {n} bytes at {offset} do not fit the "
                                    f"registered tensor's {u8.numel()} bytes")
            self._next = offset + n
        if offset < 0 or (start + offset) % item:
            raise _region_error(f"offset {offset} is not aligned to {item} bytes")
        if offset + n > u8.numel():
            raise _region_error(f"bytes [{offset}, {offset + n}) are outside the registered "
                                f"tensor ({u8.numel()} bytes)")
        return u8[offset:offset + n].view(dtype).view(shape)

    def ref(self, dtype, shape, offset):
        """-> a Ref to `shape` elements of wire dtype `dtype` ("bf16", "f32",
        "i32", "u8") at byte `offset` of this region (checked by the daemon)."""
        self._check_open()
        return Ref(self.id, offset, dtype, shape)

    # ---- lifetime ------------------------------------------------------------
    def close(self):
        """Unregisters the region (when its connection is still open) and
        drops this process's mapping (at once, or when the last numpy view
        of it is gone). Closing twice is a no-op. A region of an
        AsyncClient is closed with `await region.aclose()` (or `async with`)."""
        if self.closed:
            return
        if self._table.aunregister is not None and self.released is None:
            raise BY_NAME["EINVAL"]("a region of an AsyncClient: await region.aclose()")
        self._table.forget(self)
        if self.released is None:
            self.released = "closed by the client"
            try:
                self._table.unregister(self)
            finally:
                self._drop()
        else:
            self._drop()

    async def aclose(self):
        """close() for a region of an AsyncClient."""
        if self.closed:
            return
        self._table.forget(self)
        if self.released is None:
            self.released = "closed by the client"
            try:
                await self._table.aunregister(self.id)
            finally:
                self._drop()
        else:
            self._drop()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    def _release(self, why):
        """The daemon no longer has it (its connection closed)."""
        if self.released is None:
            self.released = why
        self.close()

    def _drop(self):
        self.closed = True
        self._u8 = None
        self._owner = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                # Views still point into it: the mapping lives on until the
                # last one goes; the daemon has already let go of it.
                self._table.keep_closed(self)
                return
            self._mm = None


class Table:
    """The regions of one connection, by address: which region an array's
    memory lies in (`find`), and their release when the connection closes."""

    def __init__(self, unregister=None, aunregister=None):
        self._unregister = unregister   # fn(region id): the unregister request
        self.aunregister = aunregister  # the same as a coroutine (AsyncClient)
        self.regions = []               # open regions
        self._closed = []               # closed, but views of them still exist

    def add(self, region):
        self.regions.append(region)
        return region

    def forget(self, region):
        if region in self.regions:
            self.regions.remove(region)

    def keep_closed(self, region):
        self._closed = [r for r in self._closed if r._mm is not None and _busy(r)]
        self._closed.append(region)

    def unregister(self, region):
        self._unregister(region.id)

    def release_all(self, why):
        """The connection closed: the daemon released every region."""
        for r in list(self.regions):
            r._release(why)

    def find(self, addr, nbytes, kind):
        """-> (region, offset) holding [addr, addr + nbytes) of memory `kind`
        ("host" or "cuda"), None when no region of this table holds addr.
        RegionError when the bytes run past the region, or it is closed."""
        for r in self.regions:
            if r.kind == kind and r.base <= addr < r.base + r.size:
                off = addr - r.base
                if off + nbytes > r.size:
                    raise _region_error(f"an array at offset {off} of region {r.id} runs "
                                        f"{off + nbytes - r.size} bytes past its end")
                return r, off
        for r in self._closed:
            if kind == "host" and r.base <= addr < r.base + r.size:
                raise _region_error(f"the array is in region {r.id}, which is closed "
                                    f"({r.released})")
        return None


def _busy(region):
    try:
        region._mm.close()
    except BufferError:
        return True
    region._mm = None
    return False


def host_address(mm):
    """The address of byte 0 of mmap `mm` in this process."""
    a = np.frombuffer(mm, np.uint8)
    addr = a.__array_interface__["data"][0]
    del a
    return addr


def wire_dtype(dt):
    """numpy dtype -> its wire name, or None (bool is sent as u8)."""
    if dt == np.bool_:
        return "u8"
    if dt.name == "bfloat16":
        return "bf16"
    if dt.byteorder == ">":
        return None  # the wire is little-endian: big-endian bytes cannot be named
    return _WIRE_OF.get(dt)


def find_array(table, a, want):
    """Numpy array `a` (to be sent as wire dtype `want`) -> a reference map
    when it lies in a region of `table`, else None (the socket path).
    RegionError for an array in a region that cannot be a reference:
    misaligned, non-contiguous, of another dtype, or past its end."""
    if table is None or not table.regions and not table._closed or a.size == 0:
        return None
    addr = a.__array_interface__["data"][0]
    hit = table.find(addr, a.nbytes, "host")
    if hit is None:
        return None
    r, off = hit
    return _reference(r, off, a.dtype, a.shape, a.flags.c_contiguous, want)


def _reference(r, off, dt, shape, contiguous, want):
    got = wire_dtype(dt)
    if got != want:
        raise _region_error(f"an array of dtype {dt} in region {r.id} is sent as {want}: "
                            f"make it {want} in the region (or copy it out of the region)")
    if not contiguous:
        raise _region_error(f"a non-contiguous array in region {r.id}: a reference names "
                            "C-ordered elements (np.ascontiguousarray copies it out)")
    item = dt.itemsize
    if off % item:
        raise _region_error(f"an array at offset {off} of region {r.id} is not aligned to "
                            f"{item} bytes (the size of {want})")
    return {"region": r.id, "offset": off, "dtype": want, "shape": [int(d) for d in shape]}


# ---- torch CUDA tensors ------------------------------------------------------
_TORCH_WIRE = {"bfloat16": "bf16", "float32": "f32", "int32": "i32", "uint8": "u8",
               "bool": "u8"}


def find_tensor(table, t, want, sync=True):
    """torch CUDA tensor `t` -> a reference map when it lies in a CUDA region
    of `table`, else None. RegionError as find_array. sync: wait for the
    current stream first (a socket request; a channel call is ordered by
    its stream instead)."""
    if table is None or not table.regions or t.numel() == 0:
        return None
    nbytes = t.numel() * t.element_size()
    hit = table.find(t.data_ptr(), nbytes, "cuda")
    if hit is None:
        return None
    r, off = hit
    got = _TORCH_WIRE.get(str(t.dtype).replace("torch.", ""))
    if got != want:
        raise _region_error(f"a tensor of {t.dtype} in CUDA region {r.id} is sent as {want}")
    if not t.is_contiguous():
        raise _region_error(f"a non-contiguous tensor in CUDA region {r.id}")
    if off % t.element_size():
        raise _region_error(f"a tensor at offset {off} of region {r.id} is not aligned to "
                            f"{t.element_size()} bytes")
    # The daemon is another process: no stream orders its access after the
    # kernels that wrote this tensor (or still read an out= tensor) here.
    if sync:
        sys.modules["torch"].cuda.current_stream(t.device).synchronize()
    return {"region": r.id, "offset": off, "dtype": want, "shape": list(t.shape)}


def _allocation(ptr, device):
    """Device pointer -> (base, size, handle, PCI bus id) of its allocation
    (cuda_driver.Driver.allocation), a driver's failure as RegionError."""
    try:
        return cuda_driver.Driver.get().allocation(int(ptr), int(device))
    except (BY_NAME["ENODEV"], BY_NAME["EDEVICE"]) as e:
        raise _region_error(f"CUDA region: {e.message}") from None


def cuda_allocation(tensor):
    """torch CUDA tensor -> (base, size, handle, device index, PCI bus id)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
        raise BY_NAME["EINVAL"]("register_cuda takes a torch CUDA tensor "
                                "(or use register_cuda_ptr with a device pointer)")
    dev = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    base, size, handle, bus = _allocation(tensor.data_ptr(), dev)
    return base, size, handle, dev, bus


def pointer_allocation(ptr, device):
    """Device pointer -> (base, size, handle, PCI bus id)."""
    return _allocation(ptr, device)


def same_bus(daemon_device, bus):
    """False when the daemon's info `device` names a PCI bus id other than
    `bus` ("NVIDIA H200 (00000000:19:00.0)" against "0000:19:00.0")."""
    if "(" not in daemon_device or not bus:
        return True
    theirs = daemon_device.rsplit("(", 1)[1].rstrip(")").lower()
    if ":" not in theirs:
        return True
    return theirs.split(":", 1)[1] == bus.lower().split(":", 1)[1]
