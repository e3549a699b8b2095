"""Typed errors: one exception class per status code of protocol/fp4idx_status.h.

Every class derives from fp4idx.Error and carries .code (the stable negative
number), .name ("ENOSEQ") and .message (the daemon's text, for people; never
parse it); .text is the code's fixed description, as in the header. Where a
builtin exception means the same thing the class also derives from it
(ValueError, TimeoutError, ConnectionError, MemoryError, OSError), so
generic handlers keep working. tests/test_errors.py fails when these classes
and the header's FP4IDX_STATUS_MAP disagree; a new code is one new class
here, listed in CLASSES.
"""

__all__ = ["Error", "error_for", "CLASSES", "BY_CODE", "BY_NAME"]


class Error(Exception):
    """A failed fp4idx call: .code (int < 0), .name (str), .message (str)."""

    code = None
    name = "UNKNOWN"
    text = "unknown status"

    def __init__(self, message="", code=None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{message} ({self.name}, {self.code})")

    def __reduce__(self):
        return (error_for, (self.code, self.message))


class InvalidArgument(Error, ValueError):
    """EINVAL (-1): invalid argument."""
    code, name, text = -1, "EINVAL", "invalid argument"


class ProtocolError(Error):
    """EPROTO (-2): malformed frame or message."""
    code, name, text = -2, "EPROTO", "malformed frame or message"


class TooBig(Error):
    """E2BIG (-3): frame or field exceeds a limit."""
    code, name, text = -3, "E2BIG", "frame or field exceeds a limit"


class UnknownRequest(Error):
    """ETYPE (-4): unknown request type."""
    code, name, text = -4, "ETYPE", "unknown request type"


class UnsupportedVersion(Error):
    """EVERSION (-5): unsupported protocol version."""
    code, name, text = -5, "EVERSION", "unsupported protocol version"


class ShapeMismatch(Error):
    """ESHAPE (-6): tensor shape or dtype does not match."""
    code, name, text = -6, "ESHAPE", "tensor shape or dtype does not match"


class NoSequence(Error):
    """ENOSEQ (-7): unknown sequence."""
    code, name, text = -7, "ENOSEQ", "unknown sequence"


class OutOfRange(Error):
    """ERANGE (-8): position or visible count out of range."""
    code, name, text = -8, "ERANGE", "position or visible count out of range"


class NonFinite(Error):
    """ENONFINITE (-9): non-finite value (NaN or inf) in a key, q or w."""
    code, name, text = -9, "ENONFINITE", "non-finite value (NaN or inf) in a key, q or w"


class PoolFull(Error):
    """EFULL (-10): page pool is full."""
    code, name, text = -10, "EFULL", "page pool is full"


class OutOfMemory(Error, MemoryError):
    """ENOMEM (-11): out of host memory."""
    code, name, text = -11, "ENOMEM", "out of host memory"


class NoDevice(Error):
    """ENODEV (-12): no such device or backend not available."""
    code, name, text = -12, "ENODEV", "no such device or backend not available"


class DeviceError(Error):
    """EDEVICE (-13): device (CUDA) error."""
    code, name, text = -13, "EDEVICE", "device (CUDA) error"


class Timeout(Error, TimeoutError):
    """ETIMEDOUT (-14): timed out."""
    code, name, text = -14, "ETIMEDOUT", "timed out"


class ConnectionLost(Error, ConnectionError):
    """ECONN (-15): connection failed or closed."""
    code, name, text = -15, "ECONN", "connection failed or closed"


class IOFailure(Error, OSError):
    """EIO (-16): input/output error."""
    code, name, text = -16, "EIO", "input/output error"


class Corrupt(Error):
    """ECORRUPT (-17): corrupt snapshot or log."""
    code, name, text = -17, "ECORRUPT", "corrupt snapshot or log"


class ShuttingDown(Error):
    """ESHUTDOWN (-18): daemon is shutting down."""
    code, name, text = -18, "ESHUTDOWN", "daemon is shutting down"


class AlreadyExists(Error):
    """EEXIST (-19): already exists."""
    code, name, text = -19, "EEXIST", "already exists"


class InternalError(Error):
    """EINTERNAL (-20): internal error."""
    code, name, text = -20, "EINTERNAL", "internal error"


class NotEnabled(Error):
    """EDISABLED (-21): not enabled in this daemon (e.g. save without --data-dir)."""
    code, name, text = -21, "EDISABLED", "not enabled in this daemon"


# In the header's order.
CLASSES = (
    InvalidArgument,
    ProtocolError,
    TooBig,
    UnknownRequest,
    UnsupportedVersion,
    ShapeMismatch,
    NoSequence,
    OutOfRange,
    NonFinite,
    PoolFull,
    OutOfMemory,
    NoDevice,
    DeviceError,
    Timeout,
    ConnectionLost,
    IOFailure,
    Corrupt,
    ShuttingDown,
    AlreadyExists,
    InternalError,
    NotEnabled,
)
__all__ += [k.__name__ for k in CLASSES]
BY_CODE = {k.code: k for k in CLASSES}
BY_NAME = {k.name: k for k in CLASSES}
for _k in (Error, *CLASSES):
    _k.__module__ = "fp4idx"  # reprs and tracebacks say fp4idx.NoSequence


def error_for(code, message=""):
    """Returns the exception for status `code` (a generic Error for a code
    this package does not know yet, as PROTOCOL.md asks)."""
    cls = BY_CODE.get(code)
    if cls is None:
        return Error(message, code)
    return cls(message)
