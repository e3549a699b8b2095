"""The public methods, written once: Client, Pipeline, AsyncClient and
ShardedClient each supply `_run(request)` (run now, queue, await, route)."""
from . import ops
from .errors import Error


class Methods:
    def call(self, op, **fields):
        """Any op of the op table (protocol/optable.py) by its wire name ->
        the reply's fields as a dict, or None for an op without any:
        c.call("truncate", seq=7, length=3) -> {"length": 3}. A field named
        like a Python keyword takes a trailing "_" (from_=...). Fields are
        checked against the table before anything is sent (InvalidArgument)."""
        return self._run(ops.call(op, fields, self._table()))

    def __getattr__(self, name):
        """An op of the table that has no method of its own, as one:
        c.length(seq=7) is c.call("length", seq=7)."""
        if not name.startswith("_") and name in ops.OPS:
            return lambda **fields: self.call(name, **fields)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")

    def _table(self):
        """The regions of the connection requests go to (regions.Table), or
        None where there is none (ShardedClient): arrays in them are sent
        as references."""
        return getattr(self, "_regions", None)

    def hello(self, version=1, client=None):
        """Version handshake -> {"version", "server"}; UnsupportedVersion."""
        return self._run(ops.hello(version, client))

    def info(self):
        """-> dict: version, server, backend, device, page_size, pages_total,
        pages_free, sequences, max_frame, pages_shared (forks), gpu_sharing
        ("mps", "time_slice", "exclusive", "unknown", "none") and
        gpu_other_processes."""
        return self._run(ops.info())

    def stats(self):
        """-> dict of daemon counters (PROTOCOL.md, `stats`)."""
        return self._run(ops.stats())

    def save(self):
        """Snapshot now (daemon with --data-dir; NotEnabled otherwise)."""
        return self._run(ops.save())

    def append(self, seq, keys, rounding="rne"):
        """Appends keys -> (first, length). keys: float32 / bf16 [n,128] or
        uint8 [n,68] packed; keys in a registered region are read by the
        daemon from there. NonFinite, PoolFull, ShapeMismatch, and for
        region keys NoRegion, RegionError."""
        return self._run(ops.append(seq, keys, rounding, self._table()))

    def score(self, seq, q, w, lens=None, mask=None, out=None):
        """-> logits float32 [R, W] (-inf where invisible). NoSequence,
        OutOfRange (lens), ShapeMismatch. Inputs in a registered region go
        as references; out: a float32 [R, W] array in a registered region
        (region.array, or a tensor of a CUDA region) that the daemon writes
        the logits into -- then out itself is returned (NoRegion when it is
        in no region of this connection, RegionError for a misaligned or
        overlapping one, ShapeMismatch for another shape)."""
        return self._run(ops.score(seq, q, w, lens, mask, out=out, table=self._table()))

    def topk(self, seq, q, w, k, lens=None, mask=None, out=None):
        """-> (positions int32 [R,k], logits float32 [R,k], counts int32 [R]);
        unused slots hold position -1 and logit -inf. out: (positions,
        logits, counts) arrays in registered regions, written in place and
        returned (errors as score's out)."""
        return self._run(ops.score(seq, q, w, lens, mask, topk=k, out=out,
                                   table=self._table()))

    def score_many(self, entries, heads, topk=None):
        """Several sequences in one request -> a list with score's (or topk's)
        result per entry, in order (an entry may carry "out" as score's)."""
        return self._run(ops.score_many(entries, heads, topk, self._table()))

    def truncate(self, seq, length):
        """Keeps the first `length` keys -> the new length. OutOfRange."""
        return self._run(ops.truncate(seq, length))

    def fork(self, src, dst, length):
        """Makes the new sequence dst the first `length` keys of src without
        copying them (shared pages; later appends to either never show in
        the other) -> dst's length. NoSequence, AlreadyExists, OutOfRange."""
        return self._run(ops.fork(src, dst, length))

    def drop(self, seq):
        """Removes the sequence. NoSequence."""
        return self._run(ops.drop(seq))

    def read(self, seq, start=0, count=None, dequant=False):
        """-> packed uint8 [n,68], or float32 [n,128] with dequant=True."""
        return self._run(ops.read(seq, start, count, dequant))

    def list(self, cursor=0, count=None):
        """One step of a scan over the sequences, like Redis SCAN -> (next
        cursor, [{"seq", "keys", "pages", "pages_shared"}, ...]). Start with cursor 0, pass
        back each returned cursor until it is 0; count (1..10000, daemon
        default 100) is about how many per step. A step may return none
        before the end, and a sequence may come twice (scan_sequences
        dedupes). ProtocolError (count 0), TooBig (count > 10000)."""
        return self._run(ops.list_(cursor, count))


class Scan:
    """scan_sequences() for the blocking clients (Client, ShardedClient)."""

    def scan_sequences(self, count=None):
        """Yields every sequence of a full list scan once (deduped by seq),
        as list's dicts; sequences appended or dropped meanwhile may or may
        not come (PROTOCOL.md, `list`)."""
        seen, cursor = set(), 0
        while True:
            cursor, seqs = self.list(cursor, count)
            yield from unseen(seen, seqs)
            if cursor == 0:
                return


def unseen(seen, seqs):
    """-> the entries of `seqs` whose seq is not in `seen` (added to it): a
    scan may return a sequence twice."""
    out = []
    for s in seqs:
        if s["seq"] not in seen:
            seen.add(s["seq"])
            out.append(s)
    return out


class Queue(Methods):
    """The pipelines' common part: every method queues its request and
    returns the pipeline (calls chain); execute() is each pipeline's own."""

    def __init__(self, client):
        self._client = client
        self._reqs = []

    def _table(self):
        return self._client._table()

    def _run(self, req):
        self._reqs.append(req)
        return self

    def __len__(self):
        return len(self._reqs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._reqs = []

    def _take(self):
        reqs, self._reqs = self._reqs, []
        return reqs


def first_error(results, raise_on_error):
    """Raises the first fp4idx.Error of `results` when raise_on_error;
    -> results."""
    if raise_on_error:
        for r in results:
            if isinstance(r, Error):
                raise r
    return results
