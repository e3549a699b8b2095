/* codec_internal.h -- helpers shared by the codec's .c files (not installed).
 *
 * Decoding goes in two steps: fp4idx__mp_parse() first walks the raw msgpack
 * bytes without allocating (scan.c) to enforce the caps -- nesting depth,
 * object count, container counts no larger than the bytes left -- so that
 * msgpack-c never sizes an allocation from a hostile count; then msgpack-c
 * unpacks into a zone. A small sound message skips both: it is unpacked
 * into a fixed pool on the decoder's stack in one walk that makes the same
 * checks (unpack.c). str/bin objects point into the
 * input buffer either way (msgpack-c references, it does not copy, with
 * msgpack_unpack_next), which is what makes tensor views zero-copy.
 */
#ifndef FP4IDX_CODEC_INTERNAL_H
#define FP4IDX_CODEC_INTERNAL_H

#include <stdarg.h>

#include "fp4idx_codec.h"

#include "fp4idx_fail.h" /* fp4idx__fail: format the detail, return the status */

/* The n-byte big-endian number at p (msgpack's lengths, counts and
 * values). */
static inline uint64_t fp4idx__mp_be(const unsigned char *p, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

/* Walks one msgpack object spanning exactly body[0..len). Returns 0,
 * FP4IDX_EPROTO (truncated, invalid byte, trailing bytes) or FP4IDX_E2BIG
 * (depth or object caps). */
int fp4idx__mp_scan(const unsigned char *body, size_t len, char *msg,
                    size_t cap);

/* Objects under a message's root for fp4idx__mp_parse to unpack it into
 * the document's own pool (an array's items, a map's keys and values). */
#define FP4IDX__MP_POOL 192

/* A parsed message: `root` and every object under it live in the pool here
 * (a small message, unpack.c) or in msgpack-c's zone in `up` (a larger
 * one, or one with an ext value); str and bin point into the body either
 * way. fp4idx__mp_doc_init before fp4idx__mp_parse, fp4idx__mp_doc_destroy
 * after the last use of root. About 4.6 KiB: it lives on the decoder's
 * stack. */
typedef struct fp4idx__mp_doc_s {
  const msgpack_object *root;
  msgpack_unpacked up;
  msgpack_object small;                 /* root of a small message */
  msgpack_object obj[FP4IDX__MP_POOL];  /* the objects under it */
} fp4idx__mp_doc_t;

static inline void fp4idx__mp_doc_init(fp4idx__mp_doc_t *doc) {
  doc->root = NULL;
  msgpack_unpacked_init(&doc->up);
}

static inline void fp4idx__mp_doc_destroy(fp4idx__mp_doc_t *doc) {
  msgpack_unpacked_destroy(&doc->up);
  doc->root = NULL;
}

/* Unpacks body into doc (root): into its pool when small and sound, else
 * scanned and then unpacked by msgpack-c. Checks that the root is a map.
 * 0, or the scan's error. */
int fp4idx__mp_parse(const void *body, size_t len, fp4idx__mp_doc_t *doc, char *msg,
                     size_t cap);

/* Unpacks body into doc's pool, checking on the way what fp4idx__mp_scan
 * checks: 0 with doc->root set, or -1 when it does not fit the pool, holds
 * an ext, or is malformed (scan it then). */
int fp4idx__mp_unpack_small(const void *body, size_t len, fp4idx__mp_doc_t *doc);

/* ---- field access -------------------------------------------------------- */

/* One named field of a map; val is NULL when absent (a nil value counts as
 * absent: optional fields may be sent as nil). */
typedef struct fp4idx__field_s {
  const char *name;
  const msgpack_object *val;
} fp4idx__field_t;

/* Matches the keys of `map` against fields[0..n): every key must be a str,
 * no key twice; unknown keys are an EPROTO error when `strict`, ignored
 * otherwise. `path` names the map in messages ("" for the top level). */
int fp4idx__map_fields(const msgpack_object *map, const char *path,
                       fp4idx__field_t *fields, size_t n, bool strict,
                       char *msg, size_t cap);

/* The fields of one decoded map, matched against a name table. */
typedef struct fp4idx__fields_s {
  fp4idx__field_t *f;
  size_t n;
} fp4idx__fields_t;

/* Returns the value of field `name` (NULL when absent or nil). A name the
 * table does not hold is a bug in the codec: it is reported as absent. */
const msgpack_object *fp4idx__fv(const fp4idx__fields_t *fs, const char *name);

/* Returns the value of the field at position i of the name table (NULL when
 * absent, nil, or i is past it): the generated decoders know where each of
 * their fields is (gen_optable.py field_at), so they skip fp4idx__fv's
 * search by name. */
static inline const msgpack_object *fp4idx__fv_at(const fp4idx__fields_t *fs, size_t i) {
  return i < fs->n ? fs->f[i].val : NULL;
}

/* Returns the value of key `name` of map `map` (first match), or NULL. */
const msgpack_object *fp4idx__map_get(const msgpack_object *map,
                                      const char *name);

/* Typed getters. `v` NULL means absent: EPROTO "missing field" when
 * required, else 0 with *present = false (present may be NULL). */
int fp4idx__get_uint(const msgpack_object *v, const char *path,
                     const char *name, uint64_t *out, char *msg, size_t cap);
int fp4idx__get_int(const msgpack_object *v, const char *path,
                    const char *name, int64_t *out, char *msg, size_t cap);
int fp4idx__get_num(const msgpack_object *v, const char *path,
                    const char *name, double *out, char *msg, size_t cap);
int fp4idx__get_bool(const msgpack_object *v, const char *path,
                     const char *name, bool *out, char *msg, size_t cap);
int fp4idx__get_str(const msgpack_object *v, const char *path,
                    const char *name, fp4idx_strview_t *out, char *msg,
                    size_t cap);
/* Copies a str into a fixed char array, truncating, NUL-terminated. */
int fp4idx__get_strcpy(const msgpack_object *v, const char *path,
                       const char *name, char *out, size_t outcap, char *msg,
                       size_t cap);

/* Decodes a tensor map {"dtype","shape","data"} into *t (a view). Checks the
 * msgpack types (EPROTO), dtype name and data length against the shape
 * (ESHAPE), ndim 1..4 (0: ESHAPE, > 4: E2BIG). */
int fp4idx__get_tensor(const msgpack_object *v, const char *path,
                       const char *name, bool strict, fp4idx_tensor_t *t,
                       char *msg, size_t cap);

/* Formats t's dtype and shape as "bf16 [4,32,128]" into buf. */
const char *fp4idx__tensor_desc(const fp4idx_tensor_t *t, char *buf,
                                size_t cap);

/* prod(shape) * itemsize into *nbytes; false on overflow. */
bool fp4idx__tensor_bytes(fp4idx_wire_dtype_t dt, uint32_t ndim,
                          const uint64_t *shape, size_t *nbytes);

/* True when t is consistent: known dtype, ndim 1..4, nbytes matches, data
 * non-NULL if nbytes > 0 (what an encoder needs before copying). */
bool fp4idx__tensor_sane(const fp4idx_tensor_t *t);

/* ---- encoding -------------------------------------------------------------- */

/* Starts a frame: reserves the 4 header bytes at the end of sb and returns
 * their offset in *start. */
int fp4idx__frame_begin(msgpack_sbuffer *sb, size_t *start);

/* Patches the header at `start` with the body length. On failure (`rc` != 0
 * already, or body > 4 GiB - 1) rolls sb back to `start` and returns the
 * error. */
int fp4idx__frame_end(msgpack_sbuffer *sb, size_t start, int rc);

/* The split encoders' packer output: bytes go to sb, except the writes
 * of at least `min` bytes that is_payload accepts (NULL: all of them),
 * which are noted in out[] instead -- msgpack-c hands the callback the
 * caller's own pointer for str and bin bodies, and only those are that
 * long. */
typedef struct fp4idx__split_s {
  msgpack_sbuffer *sb;
  int (*is_payload)(const void *ctx, const char *buf, size_t len);
  const void *ctx;
  size_t min;
  fp4idx_payload_t *out;
  size_t cap, n, bytes;
  int overflow;
} fp4idx__split_t;

/* msgpack_packer write callback over an fp4idx__split_t. */
int fp4idx__split_write(void *data, const char *buf, size_t len);

/* Ends a split frame begun at `start` like fp4idx__frame_end (the header
 * counts sb's bytes and the payloads'); rc != 0 from an overflow of out[]
 * becomes FP4IDX_EINVAL. On success *n = the payloads noted. */
int fp4idx__split_end(fp4idx__split_t *sp, size_t start, int rc, size_t *n);

/* dst = a sep b, cut to cap - 1 bytes (NUL-terminated; cap > 0). The
 * decoders build a field path like this for every tensor and entry, on
 * success too, so without printf (snprintf was a quarter of a score
 * request's decode). */
void fp4idx__path_cat(char *dst, size_t cap, const char *a, const char *sep, const char *b);

/* dst = name[i], cut like fp4idx__path_cat. */
void fp4idx__path_index(char *dst, size_t cap, const char *name, size_t i);

/* Packing helpers; return msgpack's callback result (0 or -1). */
int fp4idx__pack_cstr(msgpack_packer *pk, const char *s);
int fp4idx__pack_strn(msgpack_packer *pk, const char *s, size_t n);
int fp4idx__pack_tensor(msgpack_packer *pk, const fp4idx_tensor_t *t);

/* Writes the head of a request map of 2 + nfields entries: its size, "id"
 * and "op". Returns msgpack's result (0 or -1). */
int fp4idx__pack_req_head(msgpack_packer *pk, const fp4idx_request_t *req,
                          size_t nfields);
/* The same for a success response: size, "id", "status": 0. */
int fp4idx__pack_resp_head(msgpack_packer *pk, const fp4idx_response_t *r,
                           size_t nfields);
int fp4idx__pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v);
int fp4idx__pack_kv_tensor(msgpack_packer *pk, const char *k,
                           const fp4idx_tensor_t *t);

/* ---- field kinds (codec_kinds.c) --------------------------------------------- */

/* The length of s up to its NUL or cap (strnlen is POSIX, not C11). */
size_t fp4idx__bounded_len(const char *s, size_t cap);

/* 0 when ok, else ESHAPE "where: got <t's dtype and shape>, expected want". */
int fp4idx__expect_shape(const fp4idx_tensor_t *t, const char *where, const char *want,
                         bool ok, char *msg, size_t cap);

/* An optional count that is 1..max when given: 0 is EPROTO ("leave it out
 * for `absent`"), above max E2BIG. */
int fp4idx__check_count(const char *name, uint64_t n, uint64_t max, const char *absent,
                        char *msg, size_t cap);

/* v in lo..hi, else ESHAPE ("heads: 0, expected 1..128"). */
int fp4idx__check_range_shape(const char *name, uint64_t v, uint64_t lo, uint64_t hi,
                              char *msg, size_t cap);

/* v >= min, else EPROTO. */
int fp4idx__check_min(const char *name, uint64_t v, uint64_t min, char *msg, size_t cap);

/* A string of at most max bytes, else E2BIG. */
int fp4idx__check_strlen(const char *name, size_t len, size_t max, char *msg, size_t cap);

/* The entries of response field `name` (an array of maps, or a map when
 * is_map) at `a`: checks presence, type and at most `max` entries (0: only
 * the frame's own bound), then allocates that many zeroed entries of `size`
 * bytes into *out, owned through *owned (*out NULL and *n 0 when empty).
 * Returns 0, EPROTO, E2BIG or ENOMEM with the detail in msg. */
int fp4idx__decode_entries(const msgpack_object *a, const char *name, bool is_map,
                           uint32_t max, size_t size, void **owned, void **out,
                           size_t *n, char *msg, size_t cap);

/* A packer's verdict on a struct the decoder would refuse: E2BIG stays (a
 * cap), anything else is a bad struct (EINVAL). */
int fp4idx__pack_refused(int rc);

/* msgpack's -1 (the buffer did not grow) as a status: ENOMEM, else 0. */
int fp4idx__packed(int rc);

/* Key k and the string of the fixed array v[cap], up to its NUL (or the
 * array end when a caller forgot the NUL). Returns msgpack's 0 or -1. */
int fp4idx__pack_kv_fixstr(msgpack_packer *pk, const char *k, const char *v, size_t cap);

/* ---- the op table (ops.c), generated from FP4IDX_OP_MAP -------------------- */

/* Per-op codec functions (codec_gen.c, generated from protocol/optable.py),
 * fp4idx__<name>_req_decode, _req_pack, _resp_decode and _resp_pack.
 * decode: the map's fields (top-level names of the op's row, plus "id", "op"
 * / "id", "status", "error") into the op's union member; returns 0 or a
 * status with the detail in msg. pack: the whole map of a request or success
 * response; returns 0, FP4IDX_EINVAL (the struct breaks PROTOCOL.md) or
 * FP4IDX_ENOMEM (the buffer did not grow). */
typedef int (*fp4idx__req_decode_fn)(const fp4idx__fields_t *f,
                                     fp4idx_request_t *req, char *msg,
                                     size_t cap);
typedef int (*fp4idx__req_pack_fn)(msgpack_packer *pk,
                                   const fp4idx_request_t *req);
typedef int (*fp4idx__resp_decode_fn)(const fp4idx__fields_t *f,
                                      fp4idx_response_t *resp, char *msg,
                                      size_t cap);
typedef int (*fp4idx__resp_pack_fn)(msgpack_packer *pk,
                                    const fp4idx_response_t *resp);

/* The four functions of every op: codec_gen.h (included at the end). */

/* One row of the op table. Field names are NULL-terminated; requests start
 * with "id", "op", responses with "id", "status", "error". */
typedef struct fp4idx__op_desc_s {
  const char *name;
  unsigned flags;
  const char *req_fields[FP4IDX_OP_MAX_FIELDS];
  const char *resp_fields[FP4IDX_OP_MAX_FIELDS];
  fp4idx__req_decode_fn req_decode;
  fp4idx__req_pack_fn req_pack;
  fp4idx__resp_decode_fn resp_decode;
  fp4idx__resp_pack_fn resp_pack;
} fp4idx__op_desc_t;

/* Indexed by fp4idx_op_t; row FP4IDX_OP_NONE is all zero. */
extern const fp4idx__op_desc_t fp4idx__ops[FP4IDX_OP__COUNT];

/* The row of `op`, or NULL for NONE/unknown. */
const fp4idx__op_desc_t *fp4idx__op_desc(fp4idx_op_t op);

/* Matches the top-level map against `names` (NULL-terminated) into the
 * caller's storage f[FP4IDX_OP_MAX_FIELDS]; fs then looks them up by name. */
int fp4idx__map_named(const msgpack_object *map, const char *const *names,
                      bool strict, fp4idx__field_t *f, fp4idx__fields_t *fs,
                      char *msg, size_t cap);

/* The per-op codec functions, the hooks of the `more` fields (codec_more.c)
 * and fp4idx__op_plain. */
#include "codec_gen.h"

#endif /* FP4IDX_CODEC_INTERNAL_H */
