"""Arrays in and out: numpy / ml_dtypes / torch values <-> wire tensors.

A wire tensor is {"dtype", "shape", "data"} (protocol/PROTOCOL.md, "Tensors").
Inputs:

- keys: float32 [n,128] (other float dtypes are cast to float32 first),
  bfloat16 [n,128] as ml_dtypes.bfloat16 or as uint16 bit patterns,
  uint8 [n,68] packed FP4 keys; torch tensors (CPU or CUDA) of
  torch.float32 / torch.bfloat16 / torch.uint8.
- q [R,H,128] and w [R,H]: bfloat16 (uint16 bits, ml_dtypes, torch.bfloat16)
  go as they are; any float array (float32, float64, torch.float32, ...) is
  converted to float32 and then rounded to bf16 by this client with
  round-to-nearest-even (the formula of PROTOCOL.md, "Tensors").
- lens [R]: integers 0..2^31-1; mask [R,W]: bool or uint8 (0 hides).

Results are numpy arrays, or torch tensors on the device of the request's
torch inputs when there were any.
"""
import sys

import numpy as np

from . import regions

HEAD_DIM = 128
KEY_BYTES = 68

_WIRE = {"bf16": np.dtype("<u2"), "f32": np.dtype("<f4"),
         "i32": np.dtype("<i4"), "u8": np.dtype("u1")}


def _torch():
    return sys.modules.get("torch")


def torch_device(*values):
    """The device of the first torch tensor among `values` (None if none is
    torch): where the results of the request go."""
    torch = _torch()
    if torch is None:
        return None
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return None


def _from_torch(t):
    """torch tensor -> numpy array on the host (bf16 as uint16 bits).

    This is a copy for CUDA tensors (and for non-contiguous ones): the socket
    path, for tensors outside any registered region (region_ref)."""
    torch = _torch()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


_ML = []


def _ml_dtypes():
    """ml_dtypes when installed (imported once), else None."""
    if not _ML:
        try:
            import ml_dtypes
        except ImportError:
            ml_dtypes = None
        _ML.append(ml_dtypes)
    return _ML[0]


def _is_bf16(a):
    return a.dtype.name == "bfloat16"  # ml_dtypes.bfloat16 (or jax's)


def as_numpy(x):
    """Any supported input -> numpy array (bf16 values as ml_dtypes or uint16)."""
    if type(x) is np.ndarray:
        return x
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return _from_torch(x)
    return np.asarray(x)


def bf16_bits(x):
    """float or bf16 array -> bf16 bit patterns (uint16), RNE for floats.

    uint16 input is taken as bit patterns already; ml_dtypes.bfloat16 is
    viewed as its bits; other floats: f32, then round to nearest even."""
    a = as_numpy(x)
    if a.dtype == np.uint16:
        return a
    if _is_bf16(a):
        return a.view(np.uint16)
    if a.dtype.kind not in "fiu":
        raise _invalid(f"expected a float or bf16 array, got dtype {a.dtype}")
    f = np.ascontiguousarray(a, dtype="<f4")
    ml = _ml_dtypes()
    if ml is not None:  # the same RNE in C, about twice as fast
        return f.astype(ml.bfloat16).view("<u2")
    return _rne_numpy(f)


def _rne_numpy(f):
    """float32 array -> bf16 bits, RNE, in numpy integer ops."""
    u = f.view("<u4")
    r = u >> 16
    r &= 1
    r += 0x7FFF
    r += u  # wraps only for NaNs with high payloads, fixed below
    r >>= 16
    b = r.astype("<u2")
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    if nan.any():  # keep NaNs NaN (the daemon decides what to do with them)
        b[nan] = (b[nan] & 0x8000) | 0x7FC0
    return b


def wire(dtype, a):
    """numpy array -> wire tensor map.

    The one place bulk data enters a request inline: the array's bytes go to
    msgpack as a memoryview (packed into the frame once). Arrays in a
    registered region never get here (region_ref names them instead)."""
    want = _WIRE[dtype]
    if a.dtype != want or not a.flags.c_contiguous:
        a = np.ascontiguousarray(a, dtype=want)
    return {"dtype": dtype, "shape": list(a.shape),
            "data": memoryview(a).cast("B") if a.size else b""}


def region_ref(x, table, want, sync=True):
    """Input `x` -> a region reference map when it lies in a region of
    `table` (the connection's regions; None: none), else None (x goes
    through the socket). `want`: the wire dtype x is sent as. A Ref is
    sent as it is. RegionError for an array in a region that cannot be
    named as `want` (regions.find_array). sync: see regions.find_tensor."""
    if isinstance(x, regions.Ref):
        return x.wire()
    if table is None:
        return None
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type == "cuda":
            return regions.find_tensor(table, x, want, sync)
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.view(torch.int16).numpy().view(np.uint16)
        else:
            x = x.numpy()
    if not isinstance(x, np.ndarray):
        return None
    return regions.find_array(table, x, want)


def _keys_dtype(x):
    """The wire dtype keys `x` go as (None: not known without converting)."""
    if isinstance(x, regions.Ref):
        return x.dtype
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return {torch.uint8: "u8", torch.bfloat16: "bf16", torch.float32: "f32"}.get(x.dtype)
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    return "bf16" if dt == np.uint16 else regions.wire_dtype(np.dtype(dt)) or "f32"


def _shaped(ref, ndim, what, want):
    """A reference of ndim - 1 dims gains a leading 1 (one row or key);
    another number of dims is EINVAL."""
    if len(ref["shape"]) == ndim - 1:
        ref["shape"] = [1, *ref["shape"]]
    if len(ref["shape"]) != ndim:
        raise _invalid(f"{what} must be {want}, got shape {ref['shape']}")
    return ref


def keys_tensor(keys, table=None):
    """Keys of an append -> wire tensor (bf16/f32 [n,128] or u8 [n,68]), or
    a region reference when they lie in a region of `table`."""
    kd = _keys_dtype(keys)
    ref = region_ref(keys, table, kd) if kd is not None else None
    if ref is not None:
        return _shaped(ref, 2, "keys", "[n,128] (or [n,68] uint8)")
    a = as_numpy(keys)
    if a.ndim == 1 and a.shape[0] in (HEAD_DIM, KEY_BYTES):
        a = a.reshape(1, -1)
    if a.ndim != 2:
        raise _invalid(f"keys must be [n,128] (or [n,68] uint8), got shape {list(a.shape)}")
    if a.dtype == np.uint8:
        dtype = "u8"
    elif a.dtype == np.uint16 or _is_bf16(a):
        dtype, a = "bf16", a.view(np.uint16)
    elif a.dtype == np.float32:
        dtype = "f32"
    elif a.dtype.kind == "f":
        dtype, a = "f32", a.astype(np.float32)
    else:
        raise _invalid(f"keys dtype {a.dtype}: expected float32, bfloat16 "
                       "(ml_dtypes or uint16 bits) or uint8 packed")
    return wire(dtype, a)


def tensor(x, dtypes, table=None, what="tensor"):
    """Any array -> wire tensor in one of the wire `dtypes` an op's field
    takes (the op table's), or a region reference when it lies in a region
    of `table`. float64 and other floats go as f32 when f32 is allowed;
    another dtype is EINVAL naming `what`."""
    kd = _keys_dtype(x)
    if kd in dtypes:
        ref = region_ref(x, table, kd)
        if ref is not None:
            return ref
    a = as_numpy(x)
    if a.dtype == np.uint16 or _is_bf16(a):
        dt, a = "bf16", a.view(np.uint16)
    else:
        dt = regions.wire_dtype(a.dtype)
        if dt not in dtypes and a.dtype.kind == "f" and "f32" in dtypes:
            dt, a = "f32", a.astype(np.float32)
    if dt not in dtypes:
        raise _invalid(f"{what}: dtype {a.dtype} is none of {', '.join(dtypes)}")
    return wire(dt, a)


def entry(seq, q, w, lens=None, mask=None, table=None):
    """One score entry (PROTOCOL.md, `score`): q [R,H,128], w [R,H] -> map.
    Inputs in a region of `table` go as references."""
    e = {"seq": int(seq)}
    ref = region_ref(q, table, "bf16")
    if ref is not None:
        e["q"] = _shaped(ref, 3, "q", "[R,H,128]")
    else:
        qb = bf16_bits(q)
        if qb.ndim == 2:  # one row
            qb = qb.reshape(1, *qb.shape)
        if qb.ndim != 3:
            raise _invalid(f"q must be [R,H,128], got shape {list(qb.shape)}")
        e["q"] = wire("bf16", qb)
    ref = region_ref(w, table, "bf16")
    if ref is not None:
        e["w"] = _shaped(ref, 2, "w", "[R,H]")
    else:
        wb = bf16_bits(w)
        if wb.ndim == 1:
            wb = wb.reshape(1, -1)
        e["w"] = wire("bf16", wb)
    ref = None if lens is None else region_ref(lens, table, "i32")
    if ref is not None:
        e["lens"] = ref
    elif lens is not None:
        la = as_numpy(lens)
        if la.dtype.kind not in "iu":
            raise _invalid(f"lens must be integers, got dtype {la.dtype}")
        if la.size and (la.min() < 0 or la.max() > 0x7FFFFFFF):
            raise _invalid("lens values must be in 0..2^31-1")
        e["lens"] = wire("i32", la.reshape(-1))
    ref = None if mask is None else region_ref(mask, table, "u8")
    if ref is not None:
        e["mask"] = ref
    elif mask is not None:
        ma = as_numpy(mask)
        e["mask"] = wire("u8", ma.astype(np.uint8) if ma.dtype != np.uint8 else ma)
    return e


def heads_of(e):
    return e["q"]["shape"][1]


def array(t):
    """wire tensor map -> a new writable numpy array (bf16 as uint16 bits)."""
    a = np.frombuffer(t["data"], dtype=_WIRE[t["dtype"]]).reshape(t["shape"])
    return a.copy()


def output(a, device):
    """numpy result -> itself, or a torch tensor on `device` (None: numpy)."""
    if device is None:
        return a
    t = _torch().from_numpy(a)
    return t if device.type == "cpu" else t.to(device)


def _invalid(msg):
    from .errors import BY_NAME
    return BY_NAME["EINVAL"](msg)
