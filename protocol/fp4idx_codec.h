/* fp4idx_codec.h -- the fp4idx wire codec, shared by the daemon and the client.
 *
 * The wire format is specified in protocol/PROTOCOL.md; this header is its C
 * face. In short: a frame is a 4-byte big-endian body length N, then N bytes
 * holding exactly one msgpack map. Requests are {"id", "op", ...}, responses
 * {"id", "status", ...} (plus "error" when status < 0).
 *
 * What lives here:
 *   - framing: header put/get and an incremental frame reader whose state
 *     lives on the connection ("need more bytes" is a normal return);
 *   - C structs for every request and response;
 *   - strict decoders (fp4idx_decode_request, fp4idx_decode_response) that
 *     validate every field (type, presence, shape against dtype, data length,
 *     ranges, caps) before the caller touches anything;
 *   - encoders that append a whole frame (header + body) to a msgpack_sbuffer.
 *
 * Zero copy: decoded tensors (fp4idx_tensor_t) and strings are VIEWS into the
 * frame body that was decoded. They stay valid exactly as long as that body
 * buffer does; the codec never copies tensor bytes. Tensor data is NOT
 * aligned (msgpack puts it at any byte offset): read elements with memcpy or
 * the fp4idx_load_* helpers below, or copy the block once into aligned memory;
 * never cast `data` to `const float *` and dereference it.
 *
 * Byte order: tensor data is little-endian on the wire and the codec passes
 * it through untouched, so it assumes a little-endian host (x86-64, aarch64);
 * the build fails on a big-endian one.
 *
 * Threading: no global state; every function is safe to call concurrently on
 * different objects.
 *
 * Errors: negative fp4idx status codes (fp4idx_status.h). Functions that take
 * `msg, msgcap` write a NUL-terminated, human-readable detail there on error
 * (naming the offending field, e.g. "seqs[2].q: shape [4,32,64], expected
 * [R,32,128]"); msg may be NULL when msgcap is 0.
 */
#ifndef FP4IDX_CODEC_H
#define FP4IDX_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <msgpack.h>

#include "fp4idx_status.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fp4idx codec assumes a little-endian host (tensor data is LE on the wire)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- versions and limits (all listed in PROTOCOL.md "Limits") ------------ */

#define FP4IDX_PROTOCOL_VERSION 1u /* "version" of hello/info */

#define FP4IDX_FRAME_HEADER 4u                     /* bytes of the BE length */
#define FP4IDX_MAX_FRAME_DEFAULT (64u << 20)       /* default request cap */
#define FP4IDX_MAX_FRAME_LIMIT 0xFFFFFFFFu         /* header can't say more */
#define FP4IDX_FRAME_GROW_MIN 4096u  /* smallest body buffer of the reader */
#define FP4IDX_PROTO_MAX_HEADS 128u                /* "heads" is 1..128 */
#define FP4IDX_PROTO_HEAD_DIM 128u                 /* elements per key / q row */
#define FP4IDX_PROTO_SLOT_BYTES 68u                /* packed FP4 key */
#define FP4IDX_PROTO_SCALE_BYTES 4u                /* its last bytes: UE8M0 scales */
#define FP4IDX_PROTO_MAX_NDIM 4u                   /* dims of a tensor */
#define FP4IDX_PROTO_MAX_SCORE_SEQS 1024u          /* entries of score "seqs" */
#define FP4IDX_PROTO_MAX_TOPK (1u << 20)           /* "topk" upper bound */
#define FP4IDX_PROTO_MAX_OBJECTS (1u << 20)        /* msgpack objects/message */
#define FP4IDX_PROTO_MAX_DEPTH 8u                  /* container nesting */
#define FP4IDX_PROTO_MAX_STRING 256u               /* "client", "error", ... */
#define FP4IDX_PROTO_MAX_STATS_OPS 32u             /* entries of "requests" */
#define FP4IDX_PROTO_MAX_BUCKETS 64u               /* latency histogram */
#define FP4IDX_PROTO_LIST_COUNT 100u               /* "list" default count */
#define FP4IDX_PROTO_MAX_LIST_COUNT 10000u         /* "list" "count" bound */
#define FP4IDX_PROTO_MAX_REGIONS 16u               /* regions per connection */
#define FP4IDX_PROTO_MAX_REGION_BYTES ((uint64_t)64 << 30) /* their bytes */
#define FP4IDX_PROTO_CUDA_HANDLE 64u   /* bytes of a cudaIpcMemHandle_t */
#define FP4IDX_PROTO_MAX_CHANNEL_SLOTS 1024u /* "slots" of channel_open */
#define FP4IDX_PROTO_MAX_CHANNELS 4u   /* channels per connection */
#define FP4IDX_PROTO_MAX_STATUSES 64u /* "errors_by_status": codes 0..-63 */

/* Fixed sizes of the NUL-terminated strings of decoded responses; longer
 * strings on the wire are truncated (they are informational). */
#define FP4IDX_PROTO_NAME_CAP 64u   /* "server", stats op names */
#define FP4IDX_PROTO_SHORT_CAP 16u  /* "backend" */
#define FP4IDX_PROTO_DEVICE_CAP 128u
#define FP4IDX_PROTO_ERROR_CAP 256u /* "error" */

/* ---- operations ----------------------------------------------------------- */

/* Flags of an op (third column of FP4IDX_OP_MAP). */
#define FP4IDX_OPF_MUTATES 1u /* changes the cache: logged before the reply,
                                 replayed from the append log */
#define FP4IDX_OPF_PERSIST 2u /* needs the daemon's persistence (--data-dir) */
#define FP4IDX_OPF_LOOP 4u    /* reads no cache or engine state (info and
                                 stats read the counts the worker publishes
                                 after each mutation): the daemon's loop
                                 thread may answer it itself */

/* The op list, FP4IDX_OP_MAP: one row per operation of PROTOCOL.md
 * "Requests and responses", generated from the op table protocol/optable.py
 * (fp4idx_op_map.h, in the build tree) as
 *
 *   X(ID, name, flags, request fields, response fields)
 *
 * Everything per-op comes from it: the enum (FP4IDX_OP_<ID>), the names, the
 * field tables the codec matches maps against (fields are looked up by
 * name), the codec dispatch (protocol/ops.c: the generated functions
 * fp4idx__<name>_req_decode, _req_pack, _resp_decode, _resp_pack) and the
 * daemon's command table (daemon/commands.c: the handler fp4idx__cmd_<name>). Adding an op: its row in protocol/optable.py (fields
 * with their types, docs), its handler, its test; `protocol/gen_optable.py
 * docs --write` regenerates PROTOCOL.md's op reference. */
#include "fp4idx_op_map.h"

/* Most fields an op's request or response has (PROTOCOL.md), for the tables. */
#define FP4IDX_OP_MAX_FIELDS 32u

typedef enum fp4idx_op_e {
  FP4IDX_OP_NONE = 0, /* not decoded (decode failed before "op") */
#define FP4IDX__OP_ENUM(ID, name, flags, rq, rs) FP4IDX_OP_##ID,
  FP4IDX_OP_MAP(FP4IDX__OP_ENUM)
#undef FP4IDX__OP_ENUM
  FP4IDX_OP__COUNT
} fp4idx_op_t;

/* Returns the wire name of `op` ("append"), or "?" for NONE/unknown. */
const char *fp4idx_op_name(fp4idx_op_t op);

/* Returns the op named by the `len` bytes at `name` (not NUL-terminated), or
 * FP4IDX_OP_NONE if no op has that name. */
fp4idx_op_t fp4idx_op_from_name(const char *name, size_t len);

/* Returns the FP4IDX_OPF_* flags of `op` (0 for NONE/unknown). */
unsigned fp4idx_op_flags(fp4idx_op_t op);

/* ---- tensors -------------------------------------------------------------- */

/* Element types on the wire ("dtype"). Distinct from fp4idx_dtype_t of
 * kernels/fp4idx_format.h, which names key encodings, not wire types. */
typedef enum fp4idx_wire_dtype_e {
  FP4IDX_WIRE_NONE = 0, /* tensor absent (optional field not sent) */
  FP4IDX_WIRE_BF16 = 1, /* "bf16", 2 bytes, raw bf16 bit patterns */
  FP4IDX_WIRE_F32 = 2,  /* "f32", 4 bytes, IEEE binary32 */
  FP4IDX_WIRE_I32 = 3,  /* "i32", 4 bytes, two's complement */
  FP4IDX_WIRE_U8 = 4    /* "u8", 1 byte */
} fp4idx_wire_dtype_t;

/* Bytes per element of `dt` (0 for NONE or unknown). */
size_t fp4idx_wire_dtype_size(fp4idx_wire_dtype_t dt);

/* Wire name of `dt` ("bf16"), or "?" for NONE/unknown. */
const char *fp4idx_wire_dtype_name(fp4idx_wire_dtype_t dt);

/* A tensor: C-order, little-endian, `nbytes` == prod(shape) * itemsize.
 * Decoded tensors point into the frame body (see "Zero copy" above; data is
 * unaligned). For encoding, `data` points to the caller's bytes, which the
 * encoder copies into the output buffer. dtype NONE = absent.
 *
 * A region reference (PROTOCOL.md "Regions"): region != 0 names a region
 * the connection registered; the elements are at byte `offset` of it and
 * travel outside the frame. data is then NULL (the daemon resolves the
 * reference against its own mapping) and nbytes is still prod(shape) *
 * itemsize. On the wire: {"region", "offset", "dtype", "shape"}. */
typedef struct fp4idx_tensor_s {
  fp4idx_wire_dtype_t dtype;
  uint32_t ndim;                          /* 1..FP4IDX_PROTO_MAX_NDIM */
  uint64_t shape[FP4IDX_PROTO_MAX_NDIM];  /* unused dims are 0 */
  const void *data;                       /* may be NULL when nbytes == 0 */
  size_t nbytes;
  uint64_t region;                        /* 0: inline data; else a region id */
  uint64_t offset;                        /* byte offset in the region */
} fp4idx_tensor_t;

/* Makes *t a reference to `offset` of region `region` (>= 1) with the given
 * dtype and shape. Returns 0, FP4IDX_EINVAL (t NULL, region 0, ndim 0 or
 * > 4, NONE dtype) or FP4IDX_E2BIG (size overflows size_t). */
int fp4idx_tensor_ref(fp4idx_tensor_t *t, fp4idx_wire_dtype_t dtype,
                      uint32_t ndim, const uint64_t *shape, uint64_t region,
                      uint64_t offset);

/* Fills *t with a view of `data` (dtype, ndim dims from shape[]) and computes
 * nbytes. Returns 0, FP4IDX_EINVAL (t NULL, ndim 0 or > 4, NONE dtype, or
 * data NULL with nbytes > 0) or FP4IDX_E2BIG (size overflows size_t). */
int fp4idx_tensor_init(fp4idx_tensor_t *t, fp4idx_wire_dtype_t dtype,
                       uint32_t ndim, const uint64_t *shape, const void *data);

/* True when the tensor is present (dtype != NONE). */
static inline bool fp4idx_tensor_present(const fp4idx_tensor_t *t) {
  return t->dtype != FP4IDX_WIRE_NONE;
}

/* Unaligned-safe element loads from tensor data (element index i). */
static inline int32_t fp4idx_load_i32(const void *data, size_t i) {
  int32_t v;
  memcpy(&v, (const unsigned char *)data + i * 4u, 4);
  return v;
}
static inline float fp4idx_load_f32(const void *data, size_t i) {
  float v;
  memcpy(&v, (const unsigned char *)data + i * 4u, 4);
  return v;
}
static inline uint16_t fp4idx_load_bf16(const void *data, size_t i) {
  uint16_t v;
  memcpy(&v, (const unsigned char *)data + i * 2u, 2);
  return v;
}

/* ---- framing -------------------------------------------------------------- */

/* Writes the 4-byte big-endian body length `n` to out[0..3]. */
void fp4idx_frame_header_put(unsigned char out[4], uint32_t n);

/* Reads the 4-byte big-endian body length at in[0..3]. */
uint32_t fp4idx_frame_header_get(const unsigned char in[4]);

/* Incremental frame reader: one per connection. Feed it whatever the socket
 * gave; it assembles one frame body at a time in a buffer that the caller
 * then takes over as exactly N bytes (so a body can outlive the next reads,
 * e.g. while a worker thread scores from views into it). Fields are private.
 *
 * Memory follows the bytes that arrived, not the announced N: the buffer
 * starts at the body bytes in hand (at least FP4IDX_FRAME_GROW_MIN, at most
 * N) and grows geometrically (x2, capped at N) as more arrive, so it stays
 * within max(2 x bytes received, FP4IDX_FRAME_GROW_MIN). A peer announcing
 * max_frame and sending nothing costs 4 KiB, not max_frame. */
typedef struct fp4idx_frame_reader_s {
  uint32_t max_frame;      /* cap on N; a larger header is E2BIG */
  unsigned char hdr[4];
  uint32_t hdr_have;       /* header bytes seen, 0..4 */
  uint32_t body_len;       /* N, valid once hdr_have == 4 */
  uint32_t body_have;      /* body bytes seen */
  uint32_t body_cap;       /* bytes allocated at body, <= N (grows) */
  unsigned char *body;     /* body buffer (1 byte if N == 0), owned until taken */
  int error;               /* sticky error (E2BIG/ENOMEM) once hit */
} fp4idx_frame_reader_t;

/* Initialises *r with a cap of `max_frame` body bytes (0 = the default,
 * FP4IDX_MAX_FRAME_DEFAULT). Never allocates. Returns 0 or FP4IDX_EINVAL. */
int fp4idx_frame_reader_init(fp4idx_frame_reader_t *r, uint32_t max_frame);

/* Frees a partial body; *r may be re-initialised afterwards. */
void fp4idx_frame_reader_free(fp4idx_frame_reader_t *r);

/* Consumes bytes from data[0..len) up to the end of the current frame and sets
 * *consumed to how many it used (<= len; the caller feeds the rest after
 * taking the frame). Returns:
 *   1             a whole frame is ready: call fp4idx_frame_reader_take();
 *   0             all `len` bytes consumed, more are needed (normal);
 *   FP4IDX_E2BIG  the header announces N > max_frame (the connection is
 *                 unusable: reply with an error, id 0, and close);
 *   FP4IDX_ENOMEM the body buffer could not be allocated or grown;
 *   FP4IDX_EINVAL bad arguments.
 * While a completed frame has not been taken, feed consumes nothing and
 * returns 1 again. After E2BIG/ENOMEM every later call returns that error.
 * The body buffer is allocated when the header arrives, sized for the body
 * bytes given in the same call (see above), and grows as bytes arrive. */
int fp4idx_frame_reader_feed(fp4idx_frame_reader_t *r, const void *data,
                             size_t len, size_t *consumed);

/* Zero-copy alternative to feed, for read(2)/libuv alloc callbacks: when the
 * reader is inside a body, sets *buf and *len to the free room of the body
 * buffer (read straight into it, then call fp4idx_frame_reader_commit). The
 * room is never past the end of the body, but may be less than the rest of
 * it: when the buffer is full, this call grows it (x2, capped at N), so call
 * it again before each read. Otherwise sets *buf = NULL, *len = 0 (use feed
 * with your own buffer). Returns 0, FP4IDX_EINVAL (an argument NULL) or
 * FP4IDX_ENOMEM (the buffer could not grow: *buf = NULL, and the error is
 * sticky, so a later feed returns it as well). */
int fp4idx_frame_reader_space(fp4idx_frame_reader_t *r, void **buf,
                              size_t *len);

/* Records that `n` bytes were written into the space of the last
 * fp4idx_frame_reader_space call. Returns 1 when the frame is complete, 0 if
 * more is needed, FP4IDX_EINVAL if n exceeds that space. */
int fp4idx_frame_reader_commit(fp4idx_frame_reader_t *r, size_t n);

/* Whether data[0..len) is exactly one whole frame (header and body) that
 * the reader, between frames, accepts as it is: returns its body length N
 * (the body is at data + FP4IDX_FRAME_HEADER), or -1 when the reader is
 * inside a frame, the bytes are not one whole frame (fewer, or more: the
 * next frame's begin), or N is over max_frame. Consumes nothing and
 * changes nothing: a caller that keeps the bytes as the body (no copy)
 * skips feed for them; on -1 it feeds them as usual (feed reports the
 * errors). */
int64_t fp4idx_frame_reader_whole(const fp4idx_frame_reader_t *r, const void *data, size_t len);

/* Sets *cap to the bytes currently allocated for the body in progress (0
 * between frames). For tests and memory accounting. Returns 0 or
 * FP4IDX_EINVAL (an argument NULL). */
int fp4idx_frame_reader_capacity(const fp4idx_frame_reader_t *r, size_t *cap);

/* Hands the completed frame body to the caller: *body (free() it) and *len
 * (N, may be 0; *body is then a valid 1-byte allocation). Resets the reader
 * for the next frame. Returns 0, or FP4IDX_EINVAL if no frame is complete. */
int fp4idx_frame_reader_take(fp4idx_frame_reader_t *r, unsigned char **body,
                             size_t *len);

/* ---- requests ------------------------------------------------------------- */

/* Rounding modes of "append"; same numbers as fp4idx_rounding_t in
 * kernels/fp4idx_format.h (FP4IDX_ROUND_RNE / FP4IDX_ROUND_THRESHOLD). */
#define FP4IDX_WIRE_ROUND_RNE 0
#define FP4IDX_WIRE_ROUND_THRESHOLD 1

/* A string view into the frame body: NOT NUL-terminated. ptr NULL = absent. */
typedef struct fp4idx_strview_s {
  const char *ptr;
  size_t len;
} fp4idx_strview_t;

/* One entry of "score" "seqs". Checked by the decoder: q bf16 [R,H,128] with
 * R >= 1, w bf16 [R,H], lens (optional) i32 [R], mask (optional) u8 [R,W'].
 * NOT checked by the decoder (needs the sequence): lens values in
 * 0..keys(seq) and W' == W; see fp4idx_score_seq_check(). */
typedef struct fp4idx_score_seq_s {
  uint64_t seq;
  uint32_t rows;          /* R = q.shape[0] */
  fp4idx_tensor_t q;      /* bf16 [R,H,128] */
  fp4idx_tensor_t w;      /* bf16 [R,H] */
  fp4idx_tensor_t lens;   /* i32 [R], or absent (every row sees all keys) */
  fp4idx_tensor_t mask;   /* u8 [R,W], or absent (all visible) */
  /* "out" (optional): region references the results are written to instead
   * of the reply. Full logits: out_logits f32 [R,W]; top-k: out_positions
   * i32 [R,k], out_logits f32 [R,k], out_counts i32 [R]. The decoder checks
   * that they are references and which are present; dtype and shape against
   * the result are the daemon's check (fp4idx_score_out_check). */
  fp4idx_tensor_t out_logits;
  fp4idx_tensor_t out_positions;
  fp4idx_tensor_t out_counts;
} fp4idx_score_seq_t;

/* Kinds of "register" ("kind"). */
#define FP4IDX_REGION_HOST 1 /* "host": a sealed memfd passed with SCM_RIGHTS */
#define FP4IDX_REGION_CUDA 2 /* "cuda": a cudaIpcMemHandle_t */

/* One entry of "score" "results", in request order. Without topk: logits f32
 * [R,W]. With topk: positions i32 [R,k], logits f32 [R,k], counts i32 [R]. */
typedef struct fp4idx_score_result_s {
  uint64_t seq;
  bool topk;                  /* true: positions and counts are present */
  fp4idx_tensor_t logits;
  fp4idx_tensor_t positions;
  fp4idx_tensor_t counts;
} fp4idx_score_result_t;

/* Per-op counters of "stats" "requests". Buckets: le_us[i] is the upper
 * bound (microseconds, inclusive) of bucket i, the last one +inf; hist[i] is
 * the plain (non-cumulative) count of requests in bucket i. */
typedef struct fp4idx_op_stats_s {
  char op[FP4IDX_PROTO_NAME_CAP];
  uint64_t count;
  uint64_t errors;
  uint32_t nbuckets;                        /* <= MAX_BUCKETS */
  double le_us[FP4IDX_PROTO_MAX_BUCKETS];
  uint64_t hist[FP4IDX_PROTO_MAX_BUCKETS];
  double sum_us;
} fp4idx_op_stats_t;

/* The request and response struct of every op with fields,
 * fp4idx_<op>_req_t and fp4idx_<op>_resp_t (fp4idx_info_t, fp4idx_stats_t),
 * generated from protocol/optable.py (fp4idx_op_types.h, in the build tree:
 * the wire fields in a comment above each struct, optional ones marked `?`,
 * and what a member holds beside it), with the entries of arrays of maps
 * with integer fields (fp4idx_list_entry_t of "list" "seqs"). They use the
 * types above: tensors, string views, score entries and results, op
 * counters. */
#include "fp4idx_op_types.h"

/* A request. Ops without request fields (info, stats, save) have no member. */
typedef struct fp4idx_request_s {
  uint64_t id;    /* echoed by the response; 0 when it could not be read */
  fp4idx_op_t op; /* NONE when decode failed before the op was known */
  union {
    FP4IDX__REQ_UNION /* fp4idx_<op>_req_t <op>; ("register_" for register) */
  } u;
  void *owned_; /* private: what the decoder allocated (score seqs) */
} fp4idx_request_t;

/* Decodes and validates one frame body (the N bytes after the header) into
 * *req. Everything is checked before it returns 0: map at top level, no
 * trailing bytes, no duplicate or unknown keys, every field's msgpack type,
 * required fields, tensor dtype/shape/data length, heads 1..128, shape
 * consistency inside a score entry, counts against the caps.
 * req->id is set whenever an unsigned "id" could be read, even on failure
 * (0 otherwise: the msgpack bytes are invalid or over a cap, the body is not
 * a map, or "id" is missing or not a uint), and req->op once "op" was
 * recognised, so the caller can always send an error reply carrying it.
 * Tensors and strings are views into `body`; keep it alive while using *req.
 * Always call fp4idx_request_clear(req) afterwards (also after failure).
 * Returns 0 or:
 *   FP4IDX_EPROTO  not msgpack, not a map, trailing bytes, missing field,
 *                  wrong msgpack type, unknown field, bad enum string;
 *   FP4IDX_ETYPE   "op" is a string naming no operation;
 *   FP4IDX_ESHAPE  tensor dtype/shape/data length wrong, heads out of 1..128,
 *                  n or R of 0, shapes inconsistent inside a score entry;
 *   FP4IDX_E2BIG   over a cap (seqs, topk, ndim, objects, depth, string);
 *   FP4IDX_ENOMEM  allocation failed;
 *   FP4IDX_EINVAL  bad arguments (body NULL with len > 0, req NULL).
 * `msg` gets the detail, naming the field. */
int fp4idx_decode_request(const void *body, size_t len, fp4idx_request_t *req,
                          char *msg, size_t msgcap);

/* Frees what fp4idx_decode_request allocated and zeroes *req. Safe on a
 * zeroed request and twice. Never touches the caller's seqs arrays when the
 * request was built by hand for encoding. */
void fp4idx_request_clear(fp4idx_request_t *req);

/* Checks a decoded score entry against its sequence's key count `nkeys`
 * (daemon side, under the sequence lock): every value of q and w finite
 * (FP4IDX_ENONFINITE for a NaN or +-inf; the message names the first), every
 * lens[r] in 0..nkeys (FP4IDX_ERANGE otherwise), and the mask width equals W
 * (FP4IDX_ESHAPE). Sets *width to W = max(lens), or nkeys without lens (W of
 * the logits [R,W]). Returns 0, ENONFINITE, ERANGE, ESHAPE or EINVAL (NULL
 * arguments). */
int fp4idx_score_seq_check(const fp4idx_score_seq_t *s, uint64_t nkeys,
                           uint64_t *width, char *msg, size_t msgcap);

/* The two halves of fp4idx_score_seq_check, which runs them in this order:
 * fp4idx_score_seq_finite checks every value of q and w finite (0 or
 * FP4IDX_ENONFINITE naming the first; EINVAL for s NULL);
 * fp4idx_score_seq_check_shape checks lens and the mask against nkeys and
 * sets *width (0, ERANGE, ESHAPE or EINVAL). The daemon scans q and w that
 * came in the frame on its I/O loop and, when they are finite, checks the
 * rest on its worker with the second alone. */
int fp4idx_score_seq_finite(const fp4idx_score_seq_t *s, char *msg, size_t msgcap);
int fp4idx_score_seq_check_shape(const fp4idx_score_seq_t *s, uint64_t nkeys, uint64_t *width,
                                 char *msg, size_t msgcap);

/* Checks the "out" references of a decoded score entry against its result
 * (daemon side, once W is known from fp4idx_score_seq_check): without topk
 * out_logits must be f32 [R,W]; with topk out_positions i32 [R,k],
 * out_logits f32 [R,k] and out_counts i32 [R]. Returns 0 (also when the
 * entry has no "out"), FP4IDX_ESHAPE, or FP4IDX_EINVAL (s NULL). Bounds,
 * alignment and overlap inside the regions are the daemon's checks. */
int fp4idx_score_out_check(const fp4idx_score_seq_t *s, uint64_t width,
                           uint32_t topk, char *msg, size_t msgcap);
/* Checks the keys of a decoded append (daemon side, before anything is
 * stored): packed u8 keys must have every scale byte in 1..254, the range
 * the quantizer produces and where UE8M0 decoders agree (255 is NaN, 0 is
 * 2^-127 in torch and 0 in kernels/fp4idx_format.h). Returns 0 (also for
 * bf16/f32 keys, which the quantizer checks), FP4IDX_ENONFINITE with the
 * first bad key and byte in msg, or FP4IDX_EINVAL (NULL). */
int fp4idx_append_keys_check(const fp4idx_append_req_t *a, char *msg, size_t msgcap);

/* Appends one request frame (header + body) to `sb` (anything already in sb
 * is kept, so pipelined requests can be batched). Validates like the decoder
 * would (a request that encodes also decodes), and leaves sb unchanged on
 * failure. Returns 0, FP4IDX_EINVAL (bad struct: unknown op, missing tensor,
 * wrong shape; detail not reported), FP4IDX_E2BIG (body over 4 GiB - 1) or
 * FP4IDX_ENOMEM. */
int fp4idx_encode_request(msgpack_sbuffer *sb, const fp4idx_request_t *req);

/* A tensor payload left out of the encoded bytes by the split encoders
 * (fp4idx_encode_request_split, fp4idx_encode_response_split): its `len`
 * bytes from `data` belong at byte offset `at` of the sbuffer (before the
 * byte that is there now). */
typedef struct fp4idx_payload_s {
  size_t at;
  const void *data;
  size_t len;
} fp4idx_payload_t;

/* Like fp4idx_encode_request, but the data of every tensor of at least
 * `min_split` bytes (q, w, lens, mask of a score; an append's keys) is not
 * copied: sb gets the frame with those payloads left out (the frame header
 * counts them), and out[0..*n) says where each goes, in order. Sending sb's
 * bytes with the payloads spliced in at their offsets (writev) gives
 * exactly the bytes fp4idx_encode_request would have produced; the tensors'
 * memory must stay untouched until sent. min_split below 64 counts as 64
 * (smaller pieces cost more as iovecs than as copies).
 * Returns 0, FP4IDX_EINVAL (bad struct, or more than `cap` payloads would be
 * needed), FP4IDX_E2BIG or FP4IDX_ENOMEM; sb unchanged on failure. */
int fp4idx_encode_request_split(msgpack_sbuffer *sb, const fp4idx_request_t *req,
                                size_t min_split, fp4idx_payload_t *out, size_t cap,
                                size_t *n);

/* ---- responses ------------------------------------------------------------ */

/* A response. When status < 0 only id, status and error are meaningful.
 * Ops without response fields (drop, save, unregister) have no member. */
typedef struct fp4idx_response_s {
  uint64_t id;
  int status;                          /* 0 or a negative fp4idx code */
  char error[FP4IDX_PROTO_ERROR_CAP];  /* "" on success */
  fp4idx_op_t op;                      /* which union member; not on wire */
  union {
    FP4IDX__RESP_UNION /* fp4idx_<op>_resp_t <op>; */
  } u;
  void *owned_; /* private: what the decoder allocated */
} fp4idx_response_t;

/* Appends one success response frame for resp->op (resp->status must be 0)
 * to `sb`; unchanged on failure. Tensors are copied from their views
 * (checked: dtype/shape/nbytes consistent and as PROTOCOL.md says).
 * Returns 0, FP4IDX_EINVAL (bad struct), FP4IDX_E2BIG (body > 4 GiB - 1) or
 * FP4IDX_ENOMEM. */
int fp4idx_encode_response(msgpack_sbuffer *sb, const fp4idx_response_t *resp);

/* Like fp4idx_encode_response, but the data of every score-result tensor of
 * at least `min_split` bytes is not copied: sb gets the frame with those
 * payloads left out (the frame header counts them), and out[0..*n) says
 * where each goes, in order. Sending sb's bytes with the payloads spliced in
 * at their offsets (writev) gives exactly the bytes fp4idx_encode_response
 * would have produced; the payload memory must stay untouched until sent.
 * Other ops encode whole (*n = 0). Unlike fp4idx_encode_response the result
 * is not re-decoded (it is not contiguous); the tests compare both.
 * Returns 0, FP4IDX_EINVAL (bad struct, or more than `cap` payloads would be
 * needed), FP4IDX_E2BIG or FP4IDX_ENOMEM; sb unchanged on failure. */
int fp4idx_encode_response_split(msgpack_sbuffer *sb,
                                 const fp4idx_response_t *resp,
                                 size_t min_split, fp4idx_payload_t *out,
                                 size_t cap, size_t *n);

/* Appends an error response frame {"id", "status", "error"} to `sb`.
 * status must be negative; message may be NULL (then fp4idx_strerror's text
 * is sent) and is cut to FP4IDX_PROTO_ERROR_CAP - 1 bytes.
 * Returns 0, FP4IDX_EINVAL or FP4IDX_ENOMEM. */
int fp4idx_encode_error(msgpack_sbuffer *sb, uint64_t id, int status,
                        const char *message);

/* Decodes one response body, the answer to a request of kind `op` (the wire
 * does not name the op; responses come back in request order). Strict like
 * the request decoder, except that unknown keys are ignored (servers may add
 * fields). An error response (status < 0) decodes successfully: the function
 * returns 0 and resp->status / resp->error carry the server's error.
 * Tensors are views into `body`. Call fp4idx_response_clear afterwards.
 * Returns 0, FP4IDX_EPROTO / FP4IDX_ESHAPE / FP4IDX_E2BIG (malformed
 * response; detail in msg), FP4IDX_ENOMEM or FP4IDX_EINVAL. */
int fp4idx_decode_response(const void *body, size_t len, fp4idx_op_t op,
                           fp4idx_response_t *resp, char *msg, size_t msgcap);

/* Frees what fp4idx_decode_response allocated and zeroes *resp. */
void fp4idx_response_clear(fp4idx_response_t *resp);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_CODEC_H */
