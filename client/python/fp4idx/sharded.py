"""ShardedClient: the same methods over several daemons (one per GPU, the
fp4idxd@N units). A sequence lives on the shard that rendezvous hashing
picks for its id, so every call about one sequence goes to one daemon and
adding a daemon moves only the sequences the new one wins.
"""
import concurrent.futures
import hashlib

from . import arrays, ops
from .client import Client
from .errors import BY_NAME, Error
from .methods import Methods, Queue, Scan, first_error

_SUMMED = ("pages_total", "pages_free", "sequences", "keys", "connections")


def _weight(seq, name):
    h = hashlib.blake2b(seq.to_bytes(8, "little"), digest_size=8, key=name)
    return int.from_bytes(h.digest(), "little")


class ShardedClient(Methods, Scan):
    """Several fp4idxd daemons behind one client.

    sockets: the daemons' socket paths; a shard's identity is its path
    string (the same list in any order gives the same placement). timeout as
    for Client. Single-sequence calls go to the sequence's shard;
    score_many splits its entries by shard, sends every part before reading
    any reply (the daemons compute at the same time) and merges the results
    in entry order; info() and stats() add up counters over the shards
    (and list each shard's own reply under "shards"); list() walks the
    shards in turn (see _plan_list for its cursor).
    """

    def __init__(self, sockets, timeout=None):
        sockets = list(sockets)
        if not sockets:
            raise ValueError("ShardedClient needs at least one socket")
        if len(set(sockets)) != len(sockets):
            raise ValueError("ShardedClient: a socket is listed twice")
        self.sockets = sockets
        self.timeout = timeout
        self._keys = [s.encode()[:64] if len(s.encode()) <= 64 else
                      hashlib.blake2b(s.encode(), digest_size=32).digest()
                      for s in sockets]
        self.shards = []
        try:
            for s in sockets:
                self.shards.append(Client(s, timeout))
        except Error:
            self.close()
            raise
        self._pool = None

    def shard_of(self, seq):
        """The index (into .sockets) of the shard that holds sequence `seq`."""
        seq = int(seq)
        best, best_w = 0, -1
        for i, k in enumerate(self._keys):
            w = _weight(seq, k)
            if w > best_w:
                best, best_w = i, w
        return best

    def close(self):
        """Closes every shard's connection (a later call connects again)."""
        for c in self.shards:
            c.close()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def pipeline(self):
        """-> a pipeline whose execute() runs each shard's part concurrently."""
        return ShardedPipeline(self)

    # ---- planning: request -> per-shard requests + merge -----------------------
    def _plan(self, req):
        if req.op == "fork" and self.shard_of(req.fields["dst"]) != self.shard_of(req.seq):
            # The pages live on src's daemon; dst's calls would go elsewhere.
            raise arrays._invalid(
                f"fork: sequence {req.fields['dst']} lives on another shard than "
                f"{req.seq}; pick a dst with shard_of(dst) == shard_of(src)")
        if req.seq is not None:
            return [(self.shard_of(req.seq), req)], lambda rs: rs[0]
        if req.many is not None:
            return self._plan_many(req)
        if req.op == "list":
            return self._plan_list(req)
        merge = {"info": _merge_info, "hello": _merge_info, "stats": _merge_stats,
                 "save": lambda rs: None}.get(req.op, list)
        return [(i, req) for i in range(len(self.shards))], merge

    def _plan_many(self, req):
        devs, heads, topk = req.many
        groups = {}
        for i, (e, d) in enumerate(zip(req.fields["seqs"], devs)):
            groups.setdefault(self.shard_of(e["seq"]), []).append((i, e, d))
        parts, order = [], []
        for shard, items in groups.items():
            parts.append((shard, ops.score_wired([e for _, e, _ in items],
                                                 [d for _, _, d in items], heads, topk)))
            order.append([i for i, _, _ in items])

        def merge(rs):
            out = [None] * len(devs)
            for idx, res in zip(order, rs):
                for i, r in zip(idx, res):
                    out[i] = r
            return out
        return parts, merge

    def _plan_list(self, req):
        """A sharded scan walks shard 0, then 1, ... each to its end. Its
        cursor is daemon_cursor * N + shard (N shards): 0 starts shard 0,
        a shard's last step (daemon cursor 0) hands on to the next shard's
        start (cursor = that shard's index), and the last shard's end is 0.
        Daemon cursors are bucket positions of the daemon's table (below its
        size), so the product stays far inside the 64 bits of a cursor."""
        n = len(self.shards)
        cursor = req.fields.get("cursor", 0)
        shard, own = cursor % n, cursor // n
        count = req.fields.get("count")

        def merge(rs):
            nxt, seqs = rs[0]
            if nxt:
                if nxt > ((1 << 64) - 1 - shard) // n:
                    raise BY_NAME["EINTERNAL"](
                        f"list: shard {shard}'s cursor {nxt} does not fit a sharded cursor")
                return nxt * n + shard, seqs
            return (shard + 1 if shard + 1 < n else 0), seqs
        return [(shard, ops.list_(own, count))], merge

    def _run(self, req):
        parts, merge = self._plan(req)
        if len(parts) == 1:
            shard, q = parts[0]
            return merge([self.shards[shard]._run(q)])
        # Send every part first, then read: the daemons work concurrently.
        started, first_err = [], None
        for shard, q in parts:
            try:
                started.append((shard, q, self.shards[shard]._start_req(q)))
            except Error as e:
                first_err = first_err or e
        results = []
        for shard, q, rid in started:
            try:
                results.append(self.shards[shard]._finish(q, rid))
            except Error as e:  # still read the other shards' replies
                first_err = first_err or e
        if first_err is not None:
            raise first_err
        return merge(results)


class ShardedPipeline(Queue):
    """ShardedClient's pipeline: requests are grouped per shard, each shard's
    group is one pipelined write, the groups run in parallel threads, and
    the results come back in the order the calls were queued."""

    def execute(self, raise_on_error=True):
        """-> the queued calls' results in order (errors as for Pipeline)."""
        sc = self._client
        reqs = self._take()
        plans = [sc._plan(q) for q in reqs]
        per_shard = {}
        for pi, (parts, _) in enumerate(plans):
            for shard, q in parts:
                per_shard.setdefault(shard, []).append((pi, q))
        if sc._pool is None:
            sc._pool = concurrent.futures.ThreadPoolExecutor(len(sc.shards))
        futs = {shard: sc._pool.submit(sc.shards[shard]._exchange, [q for _, q in items])
                for shard, items in per_shard.items()}
        got = [[] for _ in plans]
        for shard, items in per_shard.items():
            for (pi, _), r in zip(items, futs[shard].result()):
                got[pi].append(r)
        results = []
        for (parts, merge), rs in zip(plans, got):
            err = next((r for r in rs if isinstance(r, Error)), None)
            results.append(err if err is not None else merge(rs))
        return first_error(results, raise_on_error)


def _merge_info(rs):
    out = dict(rs[0])
    for k in _SUMMED:
        if k in out:
            out[k] = sum(r.get(k, 0) for r in rs)
    if "max_frame" in out:
        out["max_frame"] = min(r["max_frame"] for r in rs)
    for k in ("backend", "device", "server", "page_size", "version", "gpu_sharing"):
        vals = [r.get(k) for r in rs]
        if any(v != vals[0] for v in vals):
            out[k] = vals
    out["shards"] = rs
    return out


def _merge_stats(rs):
    out = _merge_info(rs)
    out["uptime_s"] = min(r.get("uptime_s", 0.0) for r in rs)
    reqs = {}
    for r in rs:
        for op, c in r.get("requests", {}).items():
            m = reqs.get(op)
            if m is None:
                reqs[op] = {k: (list(v) if isinstance(v, list) else v) for k, v in c.items()}
                continue
            m["count"] += c["count"]
            m["errors"] += c["errors"]
            m["latency_sum_us"] += c["latency_sum_us"]
            m["latency_hist"] = [a + b for a, b in zip(m["latency_hist"], c["latency_hist"])]
    out["requests"] = reqs
    return out
