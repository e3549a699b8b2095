"""The fp4idx status codes, as in protocol/fp4idx_status.h (FP4IDX_STATUS_MAP).

(name, number, message, exception class name), in the header's order.
tests/test_status.py parses the header and fails when this table drifts
from it; a new code is one new line here.
"""

STATUS = (
    ("OK", 0, "success", None),
    ("EINVAL", -1, "invalid argument", "InvalidArgument"),
    ("EPROTO", -2, "malformed frame or message", "ProtocolError"),
    ("E2BIG", -3, "frame or field exceeds a limit", "TooBig"),
    ("ETYPE", -4, "unknown request type", "UnknownRequest"),
    ("EVERSION", -5, "unsupported protocol version", "UnsupportedVersion"),
    ("ESHAPE", -6, "tensor shape or dtype does not match", "ShapeMismatch"),
    ("ENOSEQ", -7, "unknown sequence", "NoSequence"),
    ("ERANGE", -8, "position or visible count out of range", "OutOfRange"),
    ("ENONFINITE", -9, "non-finite value (NaN or inf) in a key", "NonFinite"),
    ("EFULL", -10, "page pool is full", "PoolFull"),
    ("ENOMEM", -11, "out of host memory", "OutOfMemory"),
    ("ENODEV", -12, "no such device or backend not available", "NoDevice"),
    ("EDEVICE", -13, "device (CUDA) error", "DeviceError"),
    ("ETIMEDOUT", -14, "timed out", "Timeout"),
    ("ECONN", -15, "connection failed or closed", "ConnectionLost"),
    ("EIO", -16, "input/output error", "IOFailure"),
    ("ECORRUPT", -17, "corrupt snapshot or log", "Corrupt"),
    ("ESHUTDOWN", -18, "daemon is shutting down", "ShuttingDown"),
    ("EEXIST", -19, "already exists", "AlreadyExists"),
    ("EINTERNAL", -20, "internal error", "InternalError"),
)
