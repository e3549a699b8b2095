"""Typed errors: one exception class per status code of protocol/fp4idx_status.h.

Every class derives from fp4idx.Error and carries .code (the stable negative
number), .name ("ENOSEQ") and .message (the daemon's text, for people; never
parse it). Where a builtin exception means the same thing the class also
derives from it (ValueError, TimeoutError, ConnectionError, MemoryError,
OSError), so generic handlers keep working.
"""
from ._status import STATUS

__all__ = ["Error", "error_for", "BY_CODE", "BY_NAME"]


class Error(Exception):
    """A failed fp4idx call: .code (int < 0), .name (str), .message (str)."""

    code = None
    name = "UNKNOWN"

    def __init__(self, message="", code=None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{message} ({self.name}, {self.code})")

    __module__ = "fp4idx"

    def __reduce__(self):
        return (error_for, (self.code, self.message))


# Builtin bases for the codes whose meaning matches one.
_BUILTIN = {
    "EINVAL": ValueError,
    "ETIMEDOUT": TimeoutError,
    "ECONN": ConnectionError,
    "ENOMEM": MemoryError,
    "EIO": OSError,
}

BY_CODE = {}
BY_NAME = {}
for _name, _code, _msg, _cls in STATUS:
    if _cls is None:
        continue
    _bases = (Error, _BUILTIN[_name]) if _name in _BUILTIN else (Error,)
    _k = type(_cls, _bases, {"code": _code, "name": _name,
                             "__doc__": f"{_name} ({_code}): {_msg}.",
                             "__module__": "fp4idx"})
    globals()[_cls] = _k
    __all__.append(_cls)
    BY_CODE[_code] = _k
    BY_NAME[_name] = _k


def error_for(code, message=""):
    """Returns the exception for status `code` (a generic Error for a code
    this package does not know yet, as PROTOCOL.md asks)."""
    cls = BY_CODE.get(code)
    if cls is None:
        return Error(message, code)
    return cls(message)
