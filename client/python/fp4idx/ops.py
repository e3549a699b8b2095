"""The operations of protocol/PROTOCOL.md as data: each builder returns a
Request (the op name, its fields, and how to turn the reply into the
method's result). Client, Pipeline, AsyncClient and ShardedClient all run
these same Requests, so a new operation is one builder here plus one line
in methods.py.
"""
from . import arrays


class Request:
    """One request: op, fields, parse(reply) -> result, seq (the sequence it
    belongs to, for sharding; None when it is not about one sequence)."""

    __slots__ = ("op", "fields", "parse", "seq", "many")

    def __init__(self, op, fields, parse, seq=None, many=None):
        self.op = op
        self.fields = fields
        self.parse = parse
        self.seq = seq
        self.many = many  # score of several entries: (devices, heads, topk)


def _uint(name, v):
    v = int(v)
    if v < 0 or v >= 1 << 64:
        raise arrays._invalid(f"{name} must be in 0..2^64-1, got {v}")
    return v


def _plain(reply):
    reply.pop("id", None)
    reply.pop("status", None)
    return reply


def hello(version=1, client=None):
    f = {"version": _uint("version", version)}
    if client is not None:
        f["client"] = str(client)
    return Request("hello", f, _plain)


def info():
    return Request("info", {}, _plain)


def stats():
    return Request("stats", {}, _plain)


def save():
    return Request("save", {}, lambda r: None)


def list_(cursor=0, count=None):
    """One step of the scan over the sequences (PROTOCOL.md, `list`)."""
    f, cursor = {}, _uint("cursor", cursor)
    if cursor:
        f["cursor"] = cursor
    if count is not None:
        f["count"] = _uint("count", count)  # the daemon checks 1..10000
    return Request("list", f, lambda r: (r["cursor"], list(r["seqs"])))


def append(seq, keys, rounding="rne"):
    if rounding not in ("rne", "threshold"):
        raise arrays._invalid(f"rounding must be 'rne' or 'threshold', got {rounding!r}")
    f = {"seq": _uint("seq", seq), "keys": arrays.keys_tensor(keys)}
    if rounding != "rne":
        f["rounding"] = rounding
    return Request("append", f, lambda r: (r["first"], r["length"]), f["seq"])


def truncate(seq, length):
    f = {"seq": _uint("seq", seq), "length": _uint("length", length)}
    return Request("truncate", f, lambda r: r["length"], f["seq"])


def fork(src, dst, length):
    f = {"src": _uint("src", src), "dst": _uint("dst", dst), "length": _uint("length", length)}
    return Request("fork", f, lambda r: r["length"], f["src"])


def drop(seq):
    seq = _uint("seq", seq)
    return Request("drop", {"seq": seq}, lambda r: None, seq)


def read(seq, start=0, count=None, dequant=False):
    f = {"seq": _uint("seq", seq)}
    if start:
        f["from"] = _uint("start", start)
    if count is not None:
        f["count"] = _uint("count", count)
    if dequant:
        f["dequant"] = True
    return Request("read", f, lambda r: arrays.array(r["keys"]), f["seq"])


def _result(res, topk, device):
    out = arrays.output
    if topk is None:
        return out(arrays.array(res["logits"]), device)
    return (out(arrays.array(res["positions"]), device),
            out(arrays.array(res["logits"]), device),
            out(arrays.array(res["counts"]), device))


def _score_fields(entries, heads, topk):
    f = {"heads": _uint("heads", heads), "seqs": entries}
    if topk is not None:
        f["topk"] = _uint("topk", topk)
    return f


def score(seq, q, w, lens=None, mask=None, topk=None):
    """score (topk None) or topk of one sequence."""
    dev = arrays.torch_device(q, w, lens, mask)
    e = arrays.entry(_uint("seq", seq), q, w, lens, mask)
    f = _score_fields([e], arrays.heads_of(e), topk)
    return Request("score", f, lambda r: _result(r["results"][0], topk, dev), e["seq"])


def score_many(entries, heads, topk=None):
    """Several entries in one request; `entries` are dicts with seq, q, w and
    optionally lens and mask. The result is a list, one per entry."""
    wired, devs = [], []
    if not entries:
        raise arrays._invalid("score_many needs at least one entry")
    for d in entries:
        unknown = set(d) - {"seq", "q", "w", "lens", "mask"}
        if unknown:
            raise arrays._invalid(f"score_many entry: unknown keys {sorted(unknown)}")
        dev = arrays.torch_device(d["q"], d["w"], d.get("lens"), d.get("mask"))
        wired.append(arrays.entry(_uint("seq", d["seq"]), d["q"], d["w"],
                                  d.get("lens"), d.get("mask")))
        devs.append(dev)
    return score_wired(wired, devs, heads, topk)


def score_wired(wired, devs, heads, topk):
    """score_many of entries already in wire form (ShardedClient splits these)."""
    f = _score_fields(wired, heads, topk)

    def parse(r):
        return [_result(res, topk, dev) for res, dev in zip(r["results"], devs)]
    return Request("score", f, parse, many=(devs, heads, topk))
