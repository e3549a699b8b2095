"""Framing (PROTOCOL.md, "Framing"): a big-endian u32 length, then one
msgpack map. Shared by the blocking and the asyncio transports."""
import os
import struct

import msgpack

from .errors import BY_NAME, error_for

_HDR = struct.Struct(">I")
# The largest reply a client must accept: 1 GiB of result tensors + 64 KiB.
MAX_REPLY = (1 << 30) + (1 << 16)


def default_socket():
    """The default socket, as libfp4idx-client: $FP4IDX_SOCKET, else
    $XDG_RUNTIME_DIR/fp4idx/fp4idxd.sock for non-root users, else
    /run/fp4idx/fp4idxd.sock."""
    env = os.environ.get("FP4IDX_SOCKET")
    if env:
        return env
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if os.geteuid() != 0 and xdg:
        return os.path.join(xdg, "fp4idx", "fp4idxd.sock")
    return "/run/fp4idx/fp4idxd.sock"


class Encoder:
    """Packs requests into frames with one reused msgpack Packer."""

    def __init__(self):
        self._packer = msgpack.Packer(autoreset=True)
        self._next_id = 1

    def frame(self, req):
        """-> (id, [header, body]) for Request `req`."""
        rid = self._next_id
        self._next_id = rid + 1 if rid < (1 << 64) - 1 else 1  # never id 0
        msg = {"id": rid, "op": req.op}
        msg.update(req.fields)
        body = self._packer.pack(msg)
        return rid, [_HDR.pack(len(body)), body]


def desync(msg):
    """A local EPROTO: the stream can no longer be trusted (the client closes
    the connection), unlike an EPROTO reply of the daemon."""
    e = BY_NAME["EPROTO"](msg)
    e.fatal = True
    return e


def body_length(hdr):
    (n,) = _HDR.unpack(hdr)
    if n > MAX_REPLY:
        raise desync(f"reply of {n} bytes announced (more than 1 GiB + 64 KiB)")
    return n


def decode(body):
    try:
        r = msgpack.unpackb(body, raw=False)
    except Exception as e:  # msgpack raises several types for bad bytes
        raise desync(f"undecodable reply: {e}") from None
    if not isinstance(r, dict) or not isinstance(r.get("status"), int):
        raise desync("reply is not a map with a status")
    return r


def result(req, rid, r):
    """Checks reply `r` against request id `rid`; -> req.parse(r) or raises."""
    st = r["status"]
    if st != 0:
        if st > 0:
            raise desync(f"reply status {st} is not 0 or negative")
        raise error_for(st, str(r.get("error", "")))
    if r.get("id") != rid:
        raise desync(f"reply id {r.get('id')} for request {rid}")
    return req.parse(r)
