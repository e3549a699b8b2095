"""The CUDA driver API through ctypes on libcuda.so.1, which is present
wherever a GPU driver is (no toolkit needed): one loaded library per
process, its entry points resolved on first use, for the CUDA regions
(regions.py: the allocation that holds a device pointer, its IPC handle)
and the channels' stream operations (channel.py), as client/channel.c
does for the C client.

Errors: NoDevice (ENODEV) when the library cannot be loaded or lacks an
entry point; DeviceError (EDEVICE) for a call that did not return
CUDA_SUCCESS. Callers that answer with another error (a region's
RegionError) catch those two.
"""
import ctypes

from .errors import BY_NAME

# cuStreamBatchMemOp's operations (CUstreamBatchMemOpType).
OP_WAIT32, OP_WRITE32, OP_WRITE64 = 1, 2, 5


class MemOp(ctypes.Structure):
    """One CUstreamBatchMemOpParams (cuda.h): a 48-byte union whose wait and
    write members share this layout; a 32-bit value is the low word."""
    _fields_ = [("operation", ctypes.c_uint32), ("address", ctypes.c_uint64),
                ("value", ctypes.c_uint64), ("flags", ctypes.c_uint),
                ("alias", ctypes.c_uint64), ("pad", ctypes.c_uint64)]


assert ctypes.sizeof(MemOp) == 48

_vp, _u64, _u32, _uint = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint
_pvp, _int, _size = ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_size_t

# attribute -> (names to try, the _v2 ones of CUDA 11.7+ first; argument types)
_ENTRY = {
    "init": (("cuInit",), (_uint,)),
    "device_get": (("cuDeviceGet",), (ctypes.POINTER(_int), _int)),
    "bus_id": (("cuDeviceGetPCIBusId",), (ctypes.c_char_p, _int, _int)),
    "retain": (("cuDevicePrimaryCtxRetain",), (_pvp, _int)),
    "release": (("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), (_int,)),
    "push": (("cuCtxPushCurrent_v2", "cuCtxPushCurrent"), (_vp,)),
    "pop": (("cuCtxPopCurrent_v2", "cuCtxPopCurrent"), (_pvp,)),
    "synchronize": (("cuCtxSynchronize",), ()),
    "address_range": (("cuMemGetAddressRange_v2", "cuMemGetAddressRange"),
                      (ctypes.POINTER(_u64), ctypes.POINTER(_size), _u64)),
    "ipc_handle": (("cuIpcGetMemHandle",), (ctypes.c_char_p, _u64)),
    "host_register": (("cuMemHostRegister_v2", "cuMemHostRegister"), (_vp, _size, _uint)),
    "host_device_pointer": (("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"),
                            (ctypes.POINTER(_u64), _vp, _uint)),
    "host_unregister": (("cuMemHostUnregister",), (_vp,)),
    "write32": (("cuStreamWriteValue32_v2", "cuStreamWriteValue32"), (_vp, _u64, _u32, _uint)),
    "write64": (("cuStreamWriteValue64_v2", "cuStreamWriteValue64"), (_vp, _u64, _u64, _uint)),
    "wait32": (("cuStreamWaitValue32_v2", "cuStreamWaitValue32"), (_vp, _u64, _u32, _uint)),
    "memcpy": (("cuMemcpyAsync",), (_u64, _u64, _size, _vp)),
    "batch": (("cuStreamBatchMemOp_v2",), (_vp, _uint, ctypes.POINTER(MemOp), _uint)),
}


class Driver:
    """libcuda.so.1, initialized (cuInit). One per process: Driver.get()."""

    _one = None

    @classmethod
    def get(cls):
        if cls._one is None:
            cls._one = cls()
        return cls._one

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise BY_NAME["ENODEV"](f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}") \
                from None
        self.check(self.init(0), "cuInit")

    def __getattr__(self, attr):
        """An entry point of _ENTRY, resolved once (NoDevice when the driver
        lacks it)."""
        spec = _ENTRY.get(attr)
        if spec is None or attr == "lib":
            raise AttributeError(attr)
        names, argtypes = spec
        for name in names:
            f = getattr(self.lib, name, None)
            if f is not None:
                f.argtypes, f.restype = list(argtypes), ctypes.c_int
                setattr(self, attr, f)
                return f
        raise BY_NAME["ENODEV"](f"the CUDA driver has no {names[0]}")

    def has(self, attr):
        """Whether the driver has entry point `attr` (a missing one is
        looked up once: it reads None after)."""
        try:
            return getattr(self, attr) is not None
        except BY_NAME["ENODEV"]:
            setattr(self, attr, None)
            return False

    def check(self, rc, what):
        """DeviceError for a driver call that did not return CUDA_SUCCESS."""
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise BY_NAME["EDEVICE"](f"{what} failed: {(name.value or b'').decode() or rc}")

    def primary_context(self, ordinal):
        """-> (CUdevice, the retained primary context) of device `ordinal`."""
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.device_get(ctypes.byref(dev), int(ordinal)), f"cuDeviceGet({ordinal})")
        self.check(self.retain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
        return dev.value, ctx

    def pushed(self, ctx):
        """`with`: context `ctx` current on this thread, the old one after."""
        return _Pushed(self, ctx)

    def memops(self, stream, ops):
        """ops, a list of (operation, address, value, flags), on the stream in
        order: one cuStreamBatchMemOp, or (no batch, or refused) one call
        each."""
        if self.has("batch"):
            arr = (MemOp * len(ops))(*(MemOp(o, a, v, f) for o, a, v, f in ops))
            if self.batch(stream, len(ops), arr, 0) == 0:
                return
        for o, a, v, f in ops:
            if o == OP_WRITE32:
                self.check(self.write32(stream, a, v, f), "cuStreamWriteValue32")
            elif o == OP_WRITE64:
                self.check(self.write64(stream, a, v, f), "cuStreamWriteValue64")
            else:
                self.check(self.wait32(stream, a, v, f), "cuStreamWaitValue32")

    def allocation(self, ptr, ordinal):
        """Device pointer on device `ordinal` -> (base, size, 64-byte IPC
        handle, PCI bus id) of the allocation that holds it
        (cudaIpcGetMemHandle names a whole allocation, and an importer's
        mapping starts at its base)."""
        device, ctx = self.primary_context(ordinal)
        try:
            with self.pushed(ctx):
                base, size = ctypes.c_uint64(), ctypes.c_size_t()
                self.check(self.address_range(ctypes.byref(base), ctypes.byref(size), ptr),
                           "cuMemGetAddressRange")
                handle = ctypes.create_string_buffer(64)
                self.check(self.ipc_handle(handle, base.value),
                           "cuIpcGetMemHandle (memory from cudaMalloc is needed: the "
                           "caching allocator's expandable_segments cannot be shared)")
                bus = ctypes.create_string_buffer(32)
                self.check(self.bus_id(bus, 32, device), "cuDeviceGetPCIBusId")
                return base.value, size.value, handle.raw, bus.value.decode()
        finally:
            self.release(device)


class _Pushed:
    __slots__ = ("drv", "ctx")

    def __init__(self, drv, ctx):
        self.drv, self.ctx = drv, ctx

    def __enter__(self):
        self.drv.check(self.drv.push(self.ctx), "cuCtxPushCurrent")

    def __exit__(self, *exc):
        self.drv.pop(ctypes.byref(ctypes.c_void_p()))
