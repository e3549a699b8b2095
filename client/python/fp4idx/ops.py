"""The operations of protocol/PROTOCOL.md as data: each builder returns a
Request (the op name, its fields, and how to turn the reply into the
method's result). Client, Pipeline, AsyncClient and ShardedClient all run
these same Requests. call() builds the Request of any op of the op table
(optable.py, generated from protocol/optable.py) from its fields, so a new
operation needs nothing here; a builder is for the ops whose result a
method shapes (arrays, tuples).
"""
from . import arrays
from .errors import BY_NAME
from .optable import OPS


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


def append(seq, keys, rounding="rne", table=None):
    if rounding not in ("rne", "threshold"):
        raise arrays._invalid(f"rounding must be 'rne' or 'threshold', got {rounding!r}")
    f = {"seq": _uint("seq", seq), "keys": arrays.keys_tensor(keys, table)}
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


def register_host(size):
    """A host region of `size` bytes; its memfd goes with the frame."""
    f = {"kind": "host", "size": _uint("size", size)}
    return Request("register", f, lambda r: r["region"])


def register_cuda(handle, size, device):
    f = {"kind": "cuda", "size": _uint("size", size), "handle": bytes(handle),
         "device": _uint("device", device)}
    return Request("register", f, lambda r: r["region"])


def unregister(region):
    return Request("unregister", {"region": _uint("region", region)}, lambda r: None)


_OUT_NAMES = ("positions", "logits", "counts")
_OUT_DTYPES = {"positions": "i32", "logits": "f32", "counts": "i32"}


def _out_refs(out, topk, table):
    """score's `out=` -> the entry's `out` map of region references.
    out: the logits array (score), or (positions, logits, counts) (topk),
    each a numpy view of a host region, a torch tensor in a registered
    region, or a Ref. NoRegion for an array outside this connection's
    regions (the daemon can only write into those)."""
    if topk is None:
        names, vals = ("logits",), (out,)
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise arrays._invalid("topk out= must be (positions, logits, counts)")
        names, vals = _OUT_NAMES, tuple(out)
    refs = {}
    for name, v in zip(names, vals):
        ref = arrays.region_ref(v, table, _OUT_DTYPES[name])
        if ref is None:
            raise BY_NAME["ENOREGION"](
                f"out {name}: not in a region registered on this connection (the daemon "
                "writes results only into regions: make it with region.array(...), or a "
                "tensor of a register_cuda region)")
        refs[name] = ref
    return refs


def _result(res, topk, device, out=None):
    if out is not None:  # the daemon wrote into the caller's arrays
        return out if topk is None else tuple(out)
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


def _entry(d, topk, table):
    """One entry dict (seq, q, w, lens, mask, out) -> (wire map, device,
    out or None)."""
    e = arrays.entry(_uint("seq", d["seq"]), d["q"], d["w"], d.get("lens"), d.get("mask"),
                     table)
    out = d.get("out")
    if out is not None:
        e["out"] = _out_refs(out, topk, table)
    return e, (arrays.torch_device(d["q"], d["w"], d.get("lens"), d.get("mask")), out)


def score(seq, q, w, lens=None, mask=None, topk=None, out=None, table=None):
    """score (topk None) or topk of one sequence; out: see _out_refs."""
    e, (dev, out) = _entry({"seq": seq, "q": q, "w": w, "lens": lens, "mask": mask,
                            "out": out}, topk, table)
    f = _score_fields([e], arrays.heads_of(e), topk)
    return Request("score", f, lambda r: _result(r["results"][0], topk, dev, out), e["seq"])


def score_many(entries, heads, topk=None, table=None):
    """Several entries in one request; `entries` are dicts with seq, q, w and
    optionally lens, mask and out. The result is a list, one per entry."""
    wired, devs = [], []
    if not entries:
        raise arrays._invalid("score_many needs at least one entry")
    for d in entries:
        unknown = set(d) - {"seq", "q", "w", "lens", "mask", "out"}
        if unknown:
            raise arrays._invalid(f"score_many entry: unknown keys {sorted(unknown)}")
        e, dev = _entry(d, topk, table)
        wired.append(e)
        devs.append(dev)
    return score_wired(wired, devs, heads, topk)


def score_wired(wired, devs, heads, topk):
    """score_many of entries already in wire form (ShardedClient splits
    these); devs: (torch device, out) per entry."""
    f = _score_fields(wired, heads, topk)

    def parse(r):
        return [_result(res, topk, dev, out) for res, (dev, out) in zip(r["results"], devs)]
    return Request("score", f, parse, many=(devs, heads, topk))


# ---- any op of the table, by name ----------------------------------------------

def _check_field(op, spec, v, table):
    """One request field against its row of the op table -> its wire value."""
    name, kind = spec["name"], spec["kind"]
    what = f"{op} {name}"
    if kind in ("uint", "u32"):
        if isinstance(v, bool) or not isinstance(v, int):
            raise arrays._invalid(f"{what} must be an int, got {type(v).__name__}")
        v = _uint(what, v)
        lo, hi = spec.get("min", 0), spec.get("max")
        if v < lo or (hi is not None and v > hi):
            raise arrays._invalid(f"{what} must be in {lo}..{hi if hi is not None else '2^64-1'}, got {v}")
        return v
    if kind == "bool":
        if not isinstance(v, bool):
            raise arrays._invalid(f"{what} must be a bool, got {type(v).__name__}")
        return v
    if kind == "str":
        v = str(v)
        if "max" in spec and len(v.encode()) > spec["max"]:
            raise arrays._invalid(f"{what} is longer than {spec['max']} bytes")
        return v
    if kind == "enum":
        if v not in spec["values"]:
            raise arrays._invalid(f"{what} must be one of {spec['values']}, got {v!r}")
        return v
    if kind == "tensor" and not isinstance(v, dict):
        return arrays.tensor(v, spec["dtypes"], table, what)
    return v  # "more" fields and tensor maps go as given; the daemon checks them


def _parse_for(op, result):
    """The reply of op -> its result: None, the one field's value, or the
    dict of its fields; tensor fields as numpy arrays."""
    tensors = OPS[op]["tensors"]

    def fields(r):
        r = _plain(r)
        for name in tensors:
            if isinstance(r.get(name), dict) and "data" in r[name]:
                r[name] = arrays.array(r[name])
        return r
    if result == "none":
        return lambda r: None
    if result == "value":
        return lambda r: fields(r)[OPS[op]["response"][0]]
    return fields


def call(op, fields, table=None):
    """Any op of protocol/optable.py by its wire name, with its fields as a
    dict (a trailing "_" of a name is dropped: from_ -> "from") -> a
    Request whose result is the reply's fields as a dict (None for ops
    without response fields). Arrays go as tensors of a dtype the field
    takes, or as region references when they lie in a region of `table`.
    Unknown ops and fields, missing required fields and values of the wrong
    kind or out of range raise InvalidArgument before anything is sent."""
    row = OPS.get(op)
    if row is None:
        raise arrays._invalid(f"unknown op {op!r} (ops: {', '.join(OPS)})")
    given = {(k[:-1] if k.endswith("_") else k): v for k, v in fields.items()}
    specs = {s["name"]: s for s in row["request"]}
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise arrays._invalid(f"{op}: unknown fields {unknown} (fields: {sorted(specs)})")
    f = {}
    for s in row["request"]:
        if s["name"] not in given or given[s["name"]] is None:
            if s.get("required"):
                raise arrays._invalid(f"{op}: missing field {s['name']!r}")
            continue
        f[s["name"]] = _check_field(op, s, given[s["name"]], table)
    result = row["result"] if row["response"] else "none"
    return Request(op, f, _parse_for(op, result), f.get("seq"))
