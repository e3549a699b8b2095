#!/usr/bin/env python3
"""A minimal fp4idx client written from protocol/PROTOCOL.md alone.

Needs the `msgpack` package (>= 1.0) and numpy. Usage as a library:

    c = Client("/run/user/1000/fp4idx/fp4idxd.sock")
    c.call("hello", version=1, client="example")
    c.call("append", seq=7, keys=tensor(bf16(np.ones((1, 128)))))
    r = c.call("score", heads=1, seqs=[{"seq": 7,
              "q": tensor(bf16(np.ones((1, 1, 128)))),
              "w": tensor(bf16(np.ones((1, 1))))}])
    logits = array(r["results"][0]["logits"])   # float32 [1, 1]

`python3 fp4idx_client.py --selftest [PROTOCOL.md]` checks that this client
produces the exact request bytes of the PROTOCOL.md transcript and decodes
its replies; `python3 fp4idx_client.py SOCKET` runs a demo of every op
against a running fp4idxd.
"""
import socket
import struct
import sys

import msgpack
import numpy as np

DTYPES = {"bf16": "<u2", "f32": "<f4", "i32": "<i4", "u8": "u1"}


class Error(Exception):
    """A daemon error reply: .status is the stable negative code."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def bf16(a):
    """float array -> bf16 bit patterns (uint16), round to nearest even."""
    u = np.asarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")


def tensor(a, dtype=None):
    """numpy array -> wire tensor map. uint16 arrays are taken as bf16."""
    a = np.ascontiguousarray(a)
    if dtype is None:
        dtype = {np.dtype("<u2"): "bf16", np.dtype("<f4"): "f32",
                 np.dtype("<i4"): "i32", np.dtype("u1"): "u8"}[a.dtype]
    a = a.astype(DTYPES[dtype], copy=False)
    return {"dtype": dtype, "shape": list(a.shape), "data": a.tobytes()}


def array(t):
    """wire tensor map -> numpy array (bf16 stays as uint16 bit patterns)."""
    return np.frombuffer(t["data"], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])


def frame(msg):
    body = msgpack.packb(msg)
    return struct.pack(">I", len(body)) + body


class Client:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.next_id = 1

    def _recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("daemon closed the connection")
            buf += chunk
        return bytes(buf)

    def send(self, op, **fields):
        """Sends one request (pipelining: call recv() later); returns its id."""
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(frame({"id": rid, "op": op, **fields}))
        return rid

    def recv(self):
        """Reads one response map (responses come in request order)."""
        (n,) = struct.unpack(">I", self._recv_exact(4))
        return msgpack.unpackb(self._recv_exact(n))

    def call(self, op, **fields):
        rid = self.send(op, **fields)
        r = self.recv()
        assert r["id"] == rid, (r["id"], rid)
        if r["status"] != 0:
            raise Error(r["status"], r.get("error", ""))
        return r


def selftest(md_path):
    """Compares our request frames with the hex transcript of PROTOCOL.md."""
    text = open(md_path).read()
    blocks = []
    for part in text.split("\n## Transcript")[1].split("```\n")[1::2]:
        blocks.append(bytes.fromhex(part.replace("\n", " ")))
    ones = np.ones
    requests = [
        {"id": 1, "op": "hello", "version": 1, "client": "example"},
        {"id": 2, "op": "append", "seq": 7,
         "keys": tensor(bf16(ones((1, 128)))), "rounding": "rne"},
        {"id": 3, "op": "score", "heads": 1, "seqs": [
            {"seq": 7, "q": tensor(bf16(ones((1, 1, 128)))),
             "w": tensor(bf16(ones((1, 1))))}]},
        {"id": 4, "op": "drop", "seq": 99},
        {"id": 5, "op": "frobnicate"},
    ]
    for i, req in enumerate(requests):
        assert frame(req) == blocks[2 * i], f"request {i} differs"
        reply = blocks[2 * i + 1]
        (n,) = struct.unpack(">I", reply[:4])
        assert n == len(reply) - 4
        r = msgpack.unpackb(reply[4:])
        assert r["id"] == req["id"]
        print(req["op"], "->", {k: v for k, v in r.items()
                                if k != "results"})
    r = msgpack.unpackb(blocks[5][4:])
    assert array(r["results"][0]["logits"])[0, 0] == 128.0
    assert msgpack.unpackb(blocks[7][4:])["status"] == -7
    print("selftest: ok")


def demo(path):
    """Talks to a running daemon: every op, pipelining, the error rules."""
    c = Client(path)
    print(c.call("hello", version=1, client="fp4idx_client.py"))
    try:
        c.call("hello", version=2)
    except Error as e:
        print("hello version 2 ->", e.status, e.message)
    print(c.call("info"))
    rng = np.random.default_rng(0)
    seq = int(rng.integers(1 << 62))
    keys = rng.standard_normal((300, 128)).astype("<f4")
    print(c.call("append", seq=seq, keys=tensor(keys)))
    print(c.call("append", seq=seq, keys=tensor(bf16(keys[:10])),
                 rounding="threshold"))
    q = bf16(rng.standard_normal((4, 32, 128)))
    w = bf16(rng.random((4, 32)))
    lens = np.array([310, 309, 308, 100], "<i4")
    entry = {"seq": seq, "q": tensor(q), "w": tensor(w), "lens": tensor(lens)}
    logits = array(c.call("score", heads=32, seqs=[entry])["results"][0]["logits"])
    print("logits", logits.shape, "row 3 sees 100 keys:", logits[3, 99], logits[3, 100])
    res = c.call("score", heads=32, topk=5, seqs=[entry])["results"][0]
    pos = array(res["positions"])
    assert (np.argsort(-logits[0], kind="stable")[:5] == pos[0]).all()
    print("top-5 of row 0:", pos[0], "counts", array(res["counts"]))
    print(c.call("truncate", seq=seq, length=200))
    print("read", array(c.call("read", seq=seq, **{"from": 5, "count": 2,
                                                    "dequant": True})["keys"]).shape)
    ids = [c.send("drop", seq=seq ^ 1), c.send("frobnicate"), c.send("drop", seq=seq)]
    for rid in ids:  # pipelined: answers in request order
        r = c.recv()
        print("pipelined", rid, "->", r["id"], r["status"], r.get("error", ""))
    c.sock.sendall(struct.pack(">I", 3) + b"\x93\x01\x02")  # not a map
    print("bad message:", c.recv())  # the connection stays open
    print("stats ops:", sorted(c.call("stats")["requests"]))
    c.sock.sendall(struct.pack(">I", 0x7FFFFFFF))  # a frame above max_frame
    print("bad frame:", c.recv())
    try:
        c.recv()
    except ConnectionError as e:
        print("then:", e)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--selftest":
        selftest(sys.argv[2] if len(sys.argv) > 2 else "protocol/PROTOCOL.md")
    elif len(sys.argv) == 2:
        demo(sys.argv[1])
    else:
        print(__doc__)
