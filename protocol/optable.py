"""optable.py -- the op table: every operation of the wire protocol, its
fields declared once, with their types. protocol/gen_optable.py turns it
into the C structs, the codec of every field, the FP4IDX_OP_MAP X-macro
(enum, names, flags, field tables, handler table), the C client's typed
wrappers, the op reference of PROTOCOL.md and the Python client's table.

An op is OP(name, flags, doc, request, response, ...), in wire order of the
spec (the enum follows it: append new ops at the end). A field is
F(name, kind, ...). Kinds:

  uint    uint64_t; optional fields take `default` 0 when absent
  u32     uint32_t, with a range (`min`/`max`, see below)
  bool    bool
  num     double (a msgpack float or integer)
  str     a request string: a view into the frame, at most `max` bytes
  fixstr  a response string: char[cap], cut to fit
  enum    a str naming one of `values` (wire name -> C constant), as int
  tensor  fp4idx_tensor_t, checked against `shapes` (dtype, dims) where
          a dim is an integer macro, "n" (any) or "n>=1"
  entries a response array of maps whose `fields` are uint: the struct
          `entry` (generated) and the members <name> (array) and n<name>
          (count); at most one per response (it owns the allocation)
  more    the escape hatch for nested fields (arrays of maps, maps of
          counters, a bin that depends on another field): its C members
          (`decl`) and its codec are hand-written in protocol/codec_more.c,
          per op and direction. Only the last fields of a row may be
          `more`.

Presence of an optional request field (`pack`, what the encoder sends):
  "always"   the field is sent even at its default
  "nonzero"  sent when the member is not 0 (0 means absent)
  "flag"     sent when the bool member `has_<c>` is set (decoded likewise)
  "nonnull"  (str) sent when the view's ptr is not NULL
Ranges: `min`/`max` (numbers or macros); the error of a value out of range
is `range_err` ("count": 0 is EPROTO "leave it out for <absent>", above max
E2BIG; "shape": ESHAPE "expected lo..hi"; "min": EPROTO "must be >= min").

Response fields marked `since=2` came after protocol version 1 was first
published: a decoder takes them as 0 / "" when absent.

`doc` of a field is its row in PROTOCOL.md; `type` overrides the type
column, `req` the required column. An op's `doc` opens its section,
`request_more` follows the request table, `response_more` the response
table, `notes` closes it. `client` names the C client wrapper generated for
an op whose fields are all uint (fp4idx_client_<client>; `client_doc` its
comment, else one from the field docs), `py` the Python
result ("value": the one response field, "none": None, default the dict).
"""


def F(name, kind, **kw):
    f = {"name": name, "kind": kind}
    f.update(kw)
    return f


def OP(name, flags, doc, request, response, **kw):
    o = {"name": name, "flags": flags, "doc": doc, "request": request,
         "response": response}
    o.update(kw)
    return o


SEQ_KNOWN = "an existing sequence (ENOSEQ otherwise)"

OPS = [
    OP("hello", ["LOOP"],
       """Optional version handshake; send it first if you want to check that the
daemon speaks your protocol version. A daemon never requires it.""",
       [F("version", "uint", required=True,
          doc="the protocol version the client speaks: 1",
          cdoc="the client's; the daemon answers EVERSION unless it is "
               "FP4IDX_PROTOCOL_VERSION"),
        F("client", "str", max="FP4IDX_PROTO_MAX_STRING", pack="nonnull",
          doc="a name for logs, at most 256 bytes")],
       [F("version", "uint", doc="the daemon's protocol version, 1"),
        F("server", "fixstr", cap="FP4IDX_PROTO_NAME_CAP",
          doc='the daemon, e.g. `"fp4idxd 0.1.0"`')],
       notes="""Errors: EVERSION when the daemon does not speak `version` (the connection
stays open; the client may retry with another version or disconnect)."""),

    OP("info", ["LOOP"], "", [],
       [F("version", "uint", doc="protocol version (1)"),
        F("server", "fixstr", cap="FP4IDX_PROTO_NAME_CAP",
          doc='daemon name and version, `"fp4idxd X.Y.Z"`'),
        F("backend", "fixstr", cap="FP4IDX_PROTO_SHORT_CAP", doc='`"cuda"` or `"cpu"`'),
        F("device", "fixstr", cap="FP4IDX_PROTO_DEVICE_CAP",
          doc='the device: for CUDA its name and PCI bus id, e.g. `"NVIDIA H200 '
              '(00000000:19:00.0)"` (daemons on different GPUs report different ids), '
              'or a CPU description'),
        F("page_size", "uint", doc="keys per cache page"),
        F("pages_total", "uint", doc="pages in the pool"),
        F("pages_free", "uint", doc="pages not in use"),
        F("sequences", "uint", doc="sequences currently stored"),
        F("max_frame", "uint", doc="the largest request body the daemon accepts, bytes"),
        F("pages_shared", "uint", since=2,
          doc="pages in use that two sequences or more see (`fork`); the pages in use, "
              "`pages_total - pages_free`, count each page once however many sequences "
              "see it. Added with `fork`: a client reading an older daemon takes it as 0"),
        F("gpu_sharing", "fixstr", cap="FP4IDX_PROTO_SHORT_CAP", since=2,
          doc='how the daemon shares its GPU with other processes: `"mps"` (it is a '
              'client of the CUDA Multi-Process Service: kernels of all clients run side '
              'by side), `"time_slice"` (no MPS, and other processes hold contexts on the '
              'GPU: they take turns in time slices of milliseconds, which a request may '
              'wait for), `"exclusive"` (no MPS, no other process), `"unknown"` (no MPS, '
              'and the daemon cannot read the GPU\'s process list: no NVML) or `"none"` '
              '(the CPU backend). Read at most a second before the reply. Optional: a '
              'client reading an older daemon takes it as `""`'),
        F("gpu_other_processes", "uint", since=2,
          doc="processes other than the daemon that hold a compute context on its GPU "
              "(under MPS the other clients; the MPS server is not counted); 0 for "
              '`"unknown"` and `"none"`. Optional: 0 when absent'),
        F("channels", "uint", since=2,
          doc='channels open now, of every connection ("Channels"; `stats` counts their '
              'calls). Optional: 0 when absent')],
       resp_type="fp4idx_info_t"),

    OP("append", ["MUTATES"],
       "Appends keys to a sequence, creating the sequence if it does not exist.",
       [F("seq", "uint", required=True, doc="sequence id, any 64-bit value"),
        F("keys", "tensor", required=True,
          shapes=[("BF16", ["n>=1", "FP4IDX_PROTO_HEAD_DIM"]),
                  ("F32", ["n>=1", "FP4IDX_PROTO_HEAD_DIM"]),
                  ("U8", ["n>=1", "FP4IDX_PROTO_SLOT_BYTES"])],
          want="bf16 [n,128], f32 [n,128] or u8 [n,68] with n >= 1",
          cdoc="bf16 or f32 [n,128], or u8 [n,68]; n >= 1 (checked)",
          doc="`bf16 [n,128]` or `f32 [n,128]` (quantized by the daemon), or `u8 [n,68]` "
              "(already packed FP4 keys, stored as is, each of the 4 scale bytes in "
              "1..254); n >= 1; may be a region reference (bulk ingest: the keys never "
              "cross the socket)"),
        F("rounding", "enum", pack="always",
          values=[("rne", "FP4IDX_WIRE_ROUND_RNE"),
                  ("threshold", "FP4IDX_WIRE_ROUND_THRESHOLD")],
          default="FP4IDX_WIRE_ROUND_RNE",
          doc='`"rne"` (default: round to nearest, ties to even) or `"threshold"`; '
              'ignored for `u8` keys',
          cdoc="FP4IDX_WIRE_ROUND_*, default RNE")],
       [F("first", "uint", doc="the position of the first new key = the length before the append"),
        F("length", "uint", doc="the sequence length after it")],
       notes="""The new keys have positions `first .. length-1`.

All or nothing: if any key holds NaN or ±inf (ENONFINITE), a packed key
has a scale byte 0 or 255 (ENONFINITE: 255 is NaN in UE8M0, and 0 decodes
as 2^-127 in torch but as 0 here; the quantizer writes only 1..254), or the
page pool lacks room for all n keys (EFULL), nothing is stored and a new
sequence is not created. The message names the first bad key."""),

    OP("score", [],
       """Scores verify rows against the keys of one or more sequences (the
"lightning indexer" scorer): for row r
of an entry and visible position l,
`logit = f32(bf16(sum_h bf16(max(bf16(q[r,h] . k_l), 0) * w[r,h])))`,
where `k_l` is the stored key decoded exactly and every dot product and sum
is exact before its single rounding (see "Appendix: key format and
scorer").""",
       [F("heads", "u32", required=True, min=1, max="FP4IDX_PROTO_MAX_HEADS",
          range_err="shape", doc="H, 1..128, the same for every entry", cdoc="H, 1..128"),
        F("topk", "u32", min=1, max="FP4IDX_PROTO_MAX_TOPK", range_err="count",
          absent="logits", pack="nonzero",
          doc="k >= 1: return the k best positions per row instead of all logits",
          cdoc="k >= 1, or 0 when absent (full logits)"),
        F("seqs", "more", required=True, type="array of maps",
          decl=["fp4idx_score_seq_t *seqs; /* nseqs entries, 1..MAX_SCORE_SEQS */",
                "size_t nseqs;"],
          doc="1..1024 entries, scored independently, answered in the same order")],
       [F("results", "more", type="array of maps",
          decl=["fp4idx_score_result_t *results;", "size_t nresults;"],
          doc="one map per entry of `seqs`, in order")],
       request_more="""Each entry of `seqs`:

| key | type | required | meaning |
|---|---|---|---|
| `seq` | uint | yes | a sequence that exists (ENOSEQ otherwise); the same sequence may appear in several entries |
| `q` | tensor | yes | `bf16 [R,H,128]`, R >= 1: the query of each row and head; finite (ENONFINITE for NaN or ±inf) |
| `w` | tensor | yes | `bf16 [R,H]`: the head weights of each row; finite (ENONFINITE for NaN or ±inf) |
| `lens` | tensor | no | `i32 [R]`: row r sees positions `0 .. lens[r]-1`; each value in 0..length of the sequence (ERANGE otherwise). Without it every row sees every key |
| `mask` | tensor | no | `u8 [R,W]`: 0 hides position l of row r, non-zero keeps it; W as below (ESHAPE otherwise) |
| `out` | map | no | where the results go instead of the reply: region references (EPROTO for inline tensors). Without `topk`: `{"logits": f32 [R,W]}`; with `topk`: `{"positions": i32 [R,k], "logits": f32 [R,k], "counts": i32 [R]}`, all three (EPROTO when one is missing or extra). A dtype or shape other than the result's is ESHAPE; an output overlapping any other tensor of the request in the same region is EREGION |

Any of `q`, `w`, `lens`, `mask` may be a region reference.

W, the width of an entry's logits, is `max(lens)` when `lens` is given and
the sequence's length otherwise. W may be 0. One exception: when `lens` is
a reference into a CUDA region and the entry has `out` or `topk`, the
daemon does not read `lens` on the host (the GPU checks it, below), so W
is the caller's: the width of `out.logits` for full logits, else the
width of `mask`, else the sequence's length; each `lens[r]` must lie in
0..W (ERANGE), and positions past `lens[r]` are -inf as always.

`q`, `w` and `lens` in CUDA regions are read by the GPU where they lie and
checked there, after the kernels, which write into the daemon's own
buffer: the results reach `out` (or the reply) only when every value
passed. A failed check is the same error, with the same message, as for
the same values inline.""",
       response_more="""Each entry of `results`, without `topk`:

| key | type | meaning |
|---|---|---|
| `seq` | uint | the entry's sequence |
| `logits` | tensor | `f32 [R,W]`; position l of row r is `-inf` when `l >= lens[r]` or the mask hides it |

With `topk` = k:

| key | type | meaning |
|---|---|---|
| `seq` | uint | the entry's sequence |
| `positions` | tensor | `i32 [R,k]`: positions sorted by logit descending, ties by lower position first |
| `logits` | tensor | `f32 [R,k]`: the logits of those positions |
| `counts` | tensor | `i32 [R]`: how many of the k slots of each row are used (the visible positions of the row, at most k) |

Unused slots (a row with fewer than k visible positions) hold position -1
and logit -inf. Only visible positions are ever returned.

For an entry with `out`, the result tensors of its `results` map are the
same region references (`{"region", "offset", "dtype", "shape"}`, no
`data`): the values are in the region when the reply arrives.""",
       notes="""The whole request succeeds or fails: if any entry is invalid (unknown
sequence, a NaN or ±inf in its `q` or `w`, a `lens` value out of range, a
mask of the wrong width) the response is an error and no results are
returned. Since keys, q and w are all finite, every logit is finite or
-inf (hidden), so top-k always ranks every visible position. A result larger than 1 GiB,
or than the daemon's buffer budget, is refused with E2BIG ("Large responses")."""),

    OP("truncate", ["MUTATES"], "",
       [F("seq", "uint", required=True, doc=SEQ_KNOWN),
        F("length", "uint", required=True,
          doc="the new length n, at most the current length (ERANGE otherwise)")],
       [F("length", "uint", doc="the new length")],
       request_more="""Keeps positions `0 .. n-1` and drops the rest (e.g. rejected speculative
tokens); pages that no longer hold a key return to the pool. Truncating to
the current length changes nothing; truncating to 0 keeps the (empty)
sequence.""",
       client="truncate",
       client_doc="""Drops keys past position `length` of seq (rejected speculative tokens).
Takes: length <= current key count; out_length (may be NULL) receives it.
Returns: FP4IDX_OK; FP4IDX_ENOSEQ (unknown seq); FP4IDX_ERANGE (length
  above the key count); connection errors."""),

    OP("drop", ["MUTATES"], "",
       [F("seq", "uint", required=True, doc=SEQ_KNOWN)],
       [],
       request_more="""Removes the sequence and returns to the pool every page that no other
sequence sees (see `fork`).""",
       client="drop", py="none",
       client_doc="""Drops sequence seq and frees its pages.
Returns: FP4IDX_OK; FP4IDX_ENOSEQ (unknown seq); connection errors."""),

    OP("fork", ["MUTATES"],
       """Makes a new sequence that starts as the first keys of another, without
copying them: prompt prefixes shared by many requests, parallel sampling,
beam search, speculative branches.""",
       [F("src", "uint", required=True, doc=SEQ_KNOWN),
        F("dst", "uint", required=True,
          doc="the new sequence's id; must not exist (EEXIST otherwise, also when `dst` = `src`)",
          cdoc="the new sequence"),
        F("length", "uint", required=True,
          doc="how many keys of `src` the new sequence starts with, 0 up to `src`'s length "
              "(ERANGE otherwise)",
          cdoc="the keys of src it starts with")],
       [F("length", "uint", doc="the new sequence's length")],
       notes="""`dst` holds positions `0 .. length-1` of `src`, byte for byte, and is from
then on a sequence like any other: `append`, `score`, `truncate`, `read`,
`drop` and `fork` work on it. The pages are shared, not copied, so the fork
takes no page of the pool (it never fails with EFULL) and its cost does not
grow with `length` (one shared entry per 256 pages). What either sequence
does afterwards is never seen by the other: appends, truncates and drops of
`src` leave `dst` as it was and the other way round. The one page both may
write -- a partly filled last page -- is copied the first time a sequence
appends into it while another still sees it, so that append needs one free
page (EFULL otherwise, nothing changes). A page returns to the pool when the
last sequence that sees it lets go of it (`truncate`, `drop`). Scores of a
forked sequence equal, bit for bit, those of the same keys appended to a
sequence of its own. With persistence, a fork is logged like a `truncate`
and the snapshot keeps the sharing: after a restart or a crash the
sequences hold the same keys and share the same number of pages.""",
       client="fork",
       client_doc="""Makes the new sequence dst the first `length` keys of src without copying
them: the daemon shares src's pages, and appends, truncates and drops of
either sequence later never show in the other (prompt prefixes, parallel
sampling, beam search; PROTOCOL.md "fork"). Takes no free page; the first
append into a shared, partly filled last page takes one (EFULL then).
Takes: length <= src's key count; dst not yet known; out_length (may be
  NULL) receives dst's length.
Returns: FP4IDX_OK; FP4IDX_ENOSEQ (unknown src); FP4IDX_EEXIST (dst
  exists, dst == src included); FP4IDX_ERANGE (length above src's key
  count); FP4IDX_ENOMEM (daemon out of host memory); connection errors.
  On any error nothing changed."""),

    OP("read", [], "Reads stored keys back.",
       [F("seq", "uint", required=True, doc=SEQ_KNOWN),
        F("from", "uint", pack="always",
          doc="the first position, default 0; at most the length (ERANGE otherwise)",
          cdoc="default 0"),
        F("count", "uint", pack="flag",
          doc="how many keys, default to the end; `from + count` at most the length "
              "(ERANGE otherwise)",
          cdoc="valid when has_count (false: to the end of the sequence)"),
        F("dequant", "bool", pack="always",
          doc="false (default): packed keys; true: decoded values",
          cdoc="default false: packed u8 [n,68]; true: f32 [n,128]")],
       [F("keys", "tensor",
          shapes=[("U8", ["n", "FP4IDX_PROTO_SLOT_BYTES"]),
                  ("F32", ["n", "FP4IDX_PROTO_HEAD_DIM"])],
          want="u8 [n,68] or f32 [n,128]",
          cdoc="u8 [n,68] packed or f32 [n,128] dequantized; n may be 0",
          doc="`u8 [count,68]` (packed, exactly as stored) or `f32 [count,128]` "
              "(dequantized: each element = E2M1 value x its block's scale, exact); "
              "count may be 0")],
       notes="""A result larger than 1 GiB, or than the daemon's buffer budget, is refused
with E2BIG ("Large responses")."""),

    OP("stats", ["LOOP"], "", [],
       [F("uptime_s", "num", doc="seconds since the daemon started"),
        F("connections", "uint", doc="open client connections"),
        F("sequences", "uint", doc="sequences stored"),
        F("keys", "uint", doc="keys stored over all sequences"),
        F("backend", "fixstr", cap="FP4IDX_PROTO_SHORT_CAP", doc="as in `info`"),
        F("device", "fixstr", cap="FP4IDX_PROTO_DEVICE_CAP", doc="as in `info`"),
        F("pages_total", "uint", doc="as in `info`"),
        F("pages_free", "uint", doc="as in `info`"),
        F("pages_shared", "uint", since=2, doc="as in `info`"),
        F("keys_appended", "uint", since=2, doc="keys of acknowledged appends since start"),
        F("rows_scored", "uint", since=2, doc="verify rows of answered scores since start"),
        F("request_bytes", "uint", since=2,
          doc="bytes of request frames received, length prefix included"),
        F("response_bytes", "uint", since=2,
          doc="bytes of response frames sent, length prefix included (the `stats` reply "
              "itself not yet counted)"),
        F("queue_depth", "uint", since=2,
          doc="requests received and waiting for the worker, now"),
        F("device_mem_total", "uint", since=2,
          doc="bytes of the backend's device memory (host memory on the CPU backend)"),
        F("device_mem_free", "uint", since=2, doc="of which free, now"),
        F("gpu_sharing", "fixstr", cap="FP4IDX_PROTO_SHORT_CAP", since=2, doc="as in `info`"),
        F("gpu_other_processes", "uint", since=2, doc="as in `info`"),
        F("buffered_bytes", "uint", since=2,
          doc="bytes the daemon holds for its connections now, counted against its buffer "
              "budget: requests read and not yet run, replies not yet written out"),
        F("buffered_bytes_peak", "uint", since=2,
          doc="the most `buffered_bytes` has been since start"),
        F("buffer_budget", "uint", since=2,
          doc="the buffer budget (`--buffer-budget`), bytes"),
        F("channels", "uint", since=2, doc="channels open now (\"Channels\")"),
        F("channel_calls", "uint", since=2,
          doc="channel calls completed since start (each also counts as a `score`)"),
        F("channel_errors", "uint", since=2,
          doc="of which completed with an error status"),
        F("errors_by_status", "more", type="map", since=2,
          decl=["/* status name -> count, held by -code (index 0 unused); names this",
                " * build does not know are skipped when decoding */",
                "uint64_t status_errors[FP4IDX_PROTO_MAX_STATUSES];"],
          doc="status name (str, e.g. `ENOSEQ`) -> requests answered with that code since "
              "start; codes never answered are absent"),
        F("requests", "more", type="map",
          decl=["fp4idx_op_stats_t *ops; /* nops entries (map \"requests\", wire order) */",
                "size_t nops;"],
          doc="op name (str) -> counters of that op, below; ops never requested may be "
              "absent; `unknown` counts requests whose op could not be decoded"),
        F("stages", "more", type="map", since=2,
          decl=["/* nstages entries (map \"stages\": time per stage of the request path, op",
                " * holding the stage name, errors 0); absent on the wire when 0 */",
                "fp4idx_op_stats_t *stages;", "size_t nstages;"],
          doc="stage name (str) -> counters of the time requests spent in that stage, with "
              "the keys below (`errors` is 0)")],
       resp_type="fp4idx_stats_t",
       response_more="""The fields marked optional came after protocol version 1 was first
published: a decoder treats them as optional (0, or an empty map, when
absent) and skips `errors_by_status` names it does not know.

Counters of one op or stage:

| key | type | meaning |
|---|---|---|
| `count` | uint | requests of this op answered |
| `errors` | uint | of which answered with an error |
| `latency_us_le` | array of float | bucket upper bounds in microseconds, inclusive: 1, 2, 4, ..., 2^24, then +inf (a float) |
| `latency_hist` | array of uint | requests per bucket, same length as `latency_us_le`; plain counts, NOT cumulative |
| `latency_sum_us` | float | total latency in microseconds |

Stages, in the order a request passes them: `read` (first byte of the
frame -> whole frame received), `queue` (-> the compute thread picks it up),
`decode`, `execute` (the op's host work: checks, cache, staging; for a
backend that does not time its device work, all of it), `upload`
(host-to-device copies), `kernels` (device compute, or the CPU backend's
score), `download` (device-to-host copies), `encode`, `wake` (response
built -> the event loop has it), `write` (-> the socket took it). A request
counts once in every stage it reaches (zero-length stages included), so the
sums of `queue` through `encode` equal the `latency_sum_us` of all ops
together (the same clock readings at each boundary); `read`, `wake` and
`write` lie outside the op latency. A batch of score requests run as one
launch charges its whole `upload`, `kernels` and `download` time to each
request in it. A long full-logits reply (one sequence, 1 MiB of logits or
more) may be answered once the first part of its logits is back from the
device and written while the rest comes: its `download` is that first
part, and the rest of the copy lies inside its `write`.

(For a Prometheus histogram, accumulate `latency_hist` and label each sum
with `le` = the bound; `fp4idx-cli stats --prometheus` does that, for the
stages too.)"""),

    OP("save", ["PERSIST"], "", [], [],
       request_more="""Writes a snapshot of the cache when the daemon runs
with persistence (`--data-dir`); the response is sent once the
snapshot is on disk (written to a temporary file, fsync'ed, renamed). The
append log starts afresh after it. Other requests wait while it runs (it
takes about the used pool size divided by the disk's write speed). Without
persistence the answer is EDISABLED ("persistence is not enabled: start
fp4idxd with --data-dir"; daemons before this code answered ETYPE); a
disk failure is EIO (the previous snapshot and the log stay valid).""",
       notes="""With persistence, `append`, `truncate`, `drop` and `fork` are written to the
append log before their reply; when that write fails the request fails with EIO
and changes nothing.""", py="none", client="save",
       client_doc="""Asks the daemon to write its snapshot now (and start a fresh append log).
Returns: FP4IDX_OK once the snapshot is on disk; FP4IDX_EDISABLED (daemon
  runs without --data-dir; ETYPE from daemons before that code);
  FP4IDX_EIO (disk); connection errors."""),

    OP("list", [],
       """One step of a scan over the sequences, in the manner of Redis `SCAN`: a
daemon holding a million sequences answers in bounded pieces.""",
       [F("cursor", "uint", pack="always",
          doc="0 (the default) starts a scan; otherwise the `cursor` of the previous "
              "step's response",
          cdoc="0 (the default) starts a scan"),
        F("count", "u32", min=1, max="FP4IDX_PROTO_MAX_LIST_COUNT", range_err="count",
          absent="the default", pack="nonzero",
          doc="about how many sequences to return, 1..10000 (default 100); 0: EPROTO, "
              "above 10000: E2BIG",
          cdoc="1..FP4IDX_PROTO_MAX_LIST_COUNT; 0: absent (default)")],
       [F("cursor", "uint", doc="the cursor of the next step; 0 when the scan is complete"),
        F("seqs", "entries", entry="fp4idx_list_entry_t",
          fields=[F("seq", "uint", doc="the sequence id"),
                  F("keys", "uint", doc="keys it holds", cdoc="keys held"),
                  F("pages", "uint", doc="pages they take (ceil(keys / page_size))",
                    cdoc="pages they take"),
                  F("pages_shared", "uint", since=2,
                    doc="of these, the pages another sequence sees too (`fork`); absent (0) "
                        "from a daemon without `fork`",
                    cdoc="of which another sequence sees too (fork)")],
          doc="the sequences of this step, in no particular order, possibly none")],
       notes="""Guarantees, as for `SCAN`: a full scan (from cursor 0 until the response's
cursor is 0) returns every sequence that exists during the whole scan at
least once; a sequence appended or dropped while the scan runs may or may
not be returned; a sequence may be returned twice when the daemon's table
grew during the scan (clients dedupe by `seq`). Each step does bounded work:
it visits at most 10 x `count` buckets of the daemon's table, and returns
after the bucket that brings it to `count` sequences (so a few more than
`count` may come, and a step may return none while the cursor is not yet 0).
The cursor is opaque: pass back exactly what the daemon sent. A cursor that
was never returned is not an error; the step then starts from an arbitrary
point of the table."""),

    OP("register", [],
       """Registers a memory region shared with the daemon, for the zero-copy path of
clients on the same host (see "Regions").""",
       [F("kind", "enum", required=True,
          values=[("host", "FP4IDX_REGION_HOST"), ("cuda", "FP4IDX_REGION_CUDA")],
          doc='`"host"`: a memfd passed with the request; `"cuda"`: CUDA device memory by '
              'its IPC handle (anything else: EPROTO)',
          cdoc="FP4IDX_REGION_*"),
        F("size", "uint", required=True, min=1, range_err="min",
          doc="bytes of the region, >= 1 (0: EPROTO)",
          cdoc="bytes the client says the region has"),
        F("handle", "more", type="bin", req="cuda only",
          decl=["const void *handle; /* cuda: view of the handle bytes; NULL for host */",
                "size_t handle_len;"],
          doc="the 64 bytes of a `cudaIpcMemHandle_t` (`cudaIpcGetMemHandle`); EPROTO for "
              "another length, or with kind host"),
        F("device", "more", type="uint", req="cuda only",
          decl=["uint64_t device; /* cuda: the daemon-side device ordinal */"],
          doc="the CUDA device ordinal the memory is on, in the daemon's numbering; EPROTO "
              "with kind host")],
       [F("region", "uint",
          doc="the region's id: 1, 2, ... per connection, never reused on it"),
        F("size", "uint", doc="bytes of the region")],
       request_more="""Host: the request frame must be sent with one file descriptor as
`SCM_RIGHTS` ancillary data of the `sendmsg` that carries the frame's
first byte. The fd must be a memfd (`memfd_create` with
`MFD_ALLOW_SEALING`) sealed with `F_SEAL_SHRINK` and at least `size` bytes
long, and not sealed against writes; the daemon maps `size` bytes of it
shared and read-write and closes its copy of the fd. Otherwise: EREGION (no
fd, not a memfd -- POSIX shm objects and files are refused because they
could shrink under the daemon's mapping --, unsealed, too short, not
mappable). With the CUDA backend the daemon also pins the mapping
(`cudaHostRegister`), so its device copies go straight in and out of it.

CUDA: the daemon opens the handle on its own device
(`cudaIpcOpenMemHandle`). EREGION when the daemon runs the CPU backend,
`device` is not the daemon's device, the driver refuses the handle, or the
allocation behind it is smaller than `size`.""",
       notes="""More than 16 regions or 64 GiB of regions on one connection: E2BIG. Each
register is logged with the peer's `SO_PEERCRED` (pid, uid, gid)."""),

    OP("unregister", [],
       """Releases the region (the daemon unmaps or closes its side; the client's
memory is untouched). ENOREGION when this connection holds no such
region.""",
       [F("region", "uint", required=True, doc="a region of this connection")],
       [], py="none"),

    OP("length", [],
       """How many keys a sequence holds, without reading them: whether a prompt
prefix is cached before appending after it or forking from it.""",
       [F("seq", "uint", required=True, doc=SEQ_KNOWN)],
       [F("length", "uint", doc="the keys the sequence holds (positions `0 .. length-1`)")],
       client="length", py="value"),

    OP("channel_open", [],
       """Opens a channel: stream-ordered score calls that a client's CUDA stream
makes with no host round trip (see "Channels"). The control block, a sealed
memfd, comes with the request as SCM_RIGHTS, like a host `register`; the
calls read q, w and lens from, and write their results into, regions this
connection registered.""",
       [F("slots", "u32", required=True, min=1, max="FP4IDX_PROTO_MAX_CHANNEL_SLOTS",
          range_err="shape", doc="slots of the control block, 1..1024 (ESHAPE otherwise)",
          cdoc="1..FP4IDX_PROTO_MAX_CHANNEL_SLOTS"),
        F("size", "uint", required=True, min=1, range_err="min",
          doc="bytes of the control block, `64 + 128 * slots` or more (0: EPROTO)",
          cdoc="bytes of the control block"),
        F("q_region", "uint", required=True, doc="the region calls read `q` from"),
        F("w_region", "uint", required=True, doc="the region calls read `w` from"),
        F("out_region", "uint", required=True, doc="the region calls write their results into"),
        F("lens_region", "uint", pack="nonzero",
          doc="the region calls read `lens` from; absent (0): calls may not pass lens",
          cdoc="0: calls pass no lens")],
       [F("channel", "uint",
          doc="the channel's id: 1, 2, ... per connection, never reused on it"),
        F("slots", "uint", doc="slots of the control block")],
       request_more="""The fd must be a memfd (`MFD_ALLOW_SEALING`) sealed with `F_SEAL_SHRINK`,
not sealed against writes, exactly `size` bytes long, holding a block the
client initialised for `slots` slots (layout in "Channels"). Otherwise
EREGION (no fd, not a sealed memfd, a size or header that does not match).
A region id that this connection did not register: ENOREGION. With the
CUDA backend the daemon pins its mapping of the block (`cudaHostRegister`).""",
       notes="""More than 4 channels on one connection: E2BIG. Each channel_open is logged
with the peer's `SO_PEERCRED` (pid, uid, gid). A channel belongs to its
connection and is closed when it closes."""),

    OP("channel_close", [],
       """Closes a channel: the daemon stops watching its doorbells, completes every
call it has taken and not yet answered with ECONN, and unmaps the block.
ENOREGION when this connection holds no such channel.""",
       [F("channel", "uint", required=True, doc="a channel of this connection")],
       [], py="none"),
]
