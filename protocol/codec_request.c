/* codec_request.c -- requests: the strict decoder (daemon side), the encoder
 * (client side) and the per-sequence score check that needs the key count.
 * The op's own fields are the generated codec's (codec_gen.c, from the op
 * table protocol/optable.py), found through the op table (ops.c).
 *
 * Decoding order, which fixes which error a bad request gets: msgpack bytes
 * (EPROTO/E2BIG), top-level map, "id" (read leniently first so that every
 * error reply can carry it), "op" (EPROTO missing/not str, ETYPE unknown),
 * the field names against the op's row (unknown, twice), "id" strictly, then
 * the op's fields in the order its decoder reads them.
 */
#include <stdio.h>
#include <stdlib.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "codec_internal.h"

int fp4idx_decode_request(const void *body, size_t len, fp4idx_request_t *req,
                          char *msg, size_t cap) {
  fp4idx__mp_doc_t doc;
  int rc;

  if (msg != NULL && cap > 0) msg[0] = '\0';
  if (req == NULL) return FP4IDX_EINVAL;
  memset(req, 0, sizeof(*req));
  if (body == NULL && len > 0)
    return fp4idx__fail(msg, cap, FP4IDX_EINVAL, "no body");

  fp4idx__mp_doc_init(&doc);
  if ((rc = fp4idx__mp_parse(body, len, &doc, msg, cap)) != 0) goto out;
  const msgpack_object *root = doc.root;

  /* the id first and leniently, so that every later error can carry it */
  const msgpack_object *idv = fp4idx__map_get(root, "id");
  if (idv != NULL && idv->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
    req->id = idv->via.u64;

  const msgpack_object *opv = fp4idx__map_get(root, "op");
  if (opv == NULL || opv->type == MSGPACK_OBJECT_NIL) {
    rc = fp4idx__fail(msg, cap, FP4IDX_EPROTO, "op: missing field");
    goto out;
  }
  if (opv->type != MSGPACK_OBJECT_STR) {
    rc = fp4idx__fail(msg, cap, FP4IDX_EPROTO, "op: expected a str");
    goto out;
  }
  req->op = fp4idx_op_from_name(opv->via.str.ptr, opv->via.str.size);
  if (req->op == FP4IDX_OP_NONE) {
    rc = fp4idx__fail(msg, cap, FP4IDX_ETYPE, "op: unknown operation '%.*s'",
                      opv->via.str.size > 32 ? 32 : (int)opv->via.str.size,
                      opv->via.str.ptr);
    goto out;
  }

  const fp4idx__op_desc_t *od = fp4idx__op_desc(req->op);
  fp4idx__field_t f[FP4IDX_OP_MAX_FIELDS];
  fp4idx__fields_t fs;
  if ((rc = fp4idx__map_named(root, od->req_fields, true, f, &fs, msg, cap)))
    goto out;
  uint64_t id;
  if ((rc = fp4idx__get_uint(fp4idx__fv(&fs, "id"), "", "id", &id, msg, cap)))
    goto out;
  rc = od->req_decode(&fs, req, msg, cap);
out:
  fp4idx__mp_doc_destroy(&doc);
  return rc;
}

void fp4idx_request_clear(fp4idx_request_t *req) {
  if (req == NULL) return;
  free(req->owned_);
  memset(req, 0, sizeof(*req));
}

/* Index of the first bf16 NaN or +-inf (exponent bits all ones) among the n
 * values at data, or n. Four values per 64-bit word: a lane of
 * (word & E) ^ E is zero exactly where the exponent is all ones, and
 * (x - 0x0001..) & ~x & 0x8000.. is nonzero exactly when some lane is zero;
 * the index is then found value by value in that word. A score's q is
 * 16,384 values per 4 x 32 rows: the plain loop, one branch per value, took
 * ~16 us of a 60 us request on the H200 host (26 us vs 4 us word by word). */
#if defined(__x86_64__) && defined(__GNUC__)
/* The whole blocks of 128 values with AVX2 (16 lanes compared at once):
 * 0.9 us instead of 1.6 for a score's 16,384 (dev box). Returns the start
 * of the first block that holds a non-finite value, or the end of the
 * whole blocks. */
__attribute__((target("avx2"))) static size_t fp4idx__nonfinite_blocks_avx2(
    const unsigned char *p, size_t n) {
  const __m256i E = _mm256_set1_epi16(0x7f80);
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
      __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(p + i * 2u + (size_t)j * 32u));
      acc = _mm256_or_si256(acc, _mm256_cmpeq_epi16(_mm256_and_si256(x, E), E));
    }
    if (!_mm256_testz_si256(acc, acc)) break;
  }
  return i;
}
#endif

static size_t fp4idx__first_nonfinite_bf16(const void *data, size_t n) {
  const uint64_t E = 0x7f807f807f807f80ull, ONE = 0x0001000100010001ull,
                 HI = 0x8000800080008000ull;
  const unsigned char *p = data;
  size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  static int avx2 = -1; /* decided once (threads that race store the same) */
  int has = __atomic_load_n(&avx2, __ATOMIC_RELAXED);
  if (has < 0) {
    has = __builtin_cpu_supports("avx2") ? 1 : 0;
    __atomic_store_n(&avx2, has, __ATOMIC_RELAXED);
  }
  if (has) i = fp4idx__nonfinite_blocks_avx2(p, n);
#endif
  /* Blocks of 128 values without a branch (the compiler vectorizes a
   * fixed trip count), then the block that holds one word by word. */
  for (; i + 128 <= n; i += 128) {
    uint64_t acc = 0;
    for (int j = 0; j < 32; j++) {
      uint64_t w;
      memcpy(&w, p + i * 2u + (size_t)j * 8u, 8);
      uint64_t x = (w & E) ^ E;
      acc |= (x - ONE) & ~x & HI;
    }
    if (acc) break;
  }
  for (; i + 4 <= n; i += 4) {
    uint64_t w;
    memcpy(&w, p + i * 2u, 8); /* data may be unaligned; little-endian lanes */
    uint64_t x = (w & E) ^ E;
    if ((x - ONE) & ~x & HI) break;
  }
  for (; i < n; i++)
    if ((fp4idx_load_bf16(data, i) & 0x7f80u) == 0x7f80u) return i;
  return n;
}

int fp4idx_score_seq_finite(const fp4idx_score_seq_t *s, char *msg, size_t cap) {
  if (s == NULL) return FP4IDX_EINVAL;
  /* A NaN or inf in q or w would make logits NaN, which no order of top-k
   * can rank (PROTOCOL.md, score). */
  size_t nq = (size_t)s->q.nbytes / 2, nw = (size_t)s->w.nbytes / 2;
  size_t bad = fp4idx__first_nonfinite_bf16(s->q.data, nq);
  if (bad < nq) {
    size_t heads = s->rows && s->q.ndim == 3 ? (size_t)s->q.shape[1] : 1;
    return fp4idx__fail(msg, cap, FP4IDX_ENONFINITE,
                        "seq %llu: q[%zu,%zu,%zu] is %s; q and w must be finite",
                        (unsigned long long)s->seq, bad / (heads * FP4IDX_PROTO_HEAD_DIM),
                        bad / FP4IDX_PROTO_HEAD_DIM % heads, bad % FP4IDX_PROTO_HEAD_DIM,
                        (fp4idx_load_bf16(s->q.data, bad) & 0x7fu) ? "NaN" : "inf");
  }
  bad = fp4idx__first_nonfinite_bf16(s->w.data, nw);
  if (bad < nw) {
    size_t heads = s->w.ndim == 2 ? (size_t)s->w.shape[1] : 1;
    return fp4idx__fail(msg, cap, FP4IDX_ENONFINITE,
                        "seq %llu: w[%zu,%zu] is %s; q and w must be finite",
                        (unsigned long long)s->seq, bad / heads, bad % heads,
                        (fp4idx_load_bf16(s->w.data, bad) & 0x7fu) ? "NaN" : "inf");
  }
  return 0;
}

int fp4idx_score_seq_check_shape(const fp4idx_score_seq_t *s, uint64_t nkeys, uint64_t *width,
                                 char *msg, size_t cap) {
  uint64_t w = nkeys;
  if (s == NULL || width == NULL) return FP4IDX_EINVAL;
  if (fp4idx_tensor_present(&s->lens)) {
    w = 0;
    for (uint32_t r = 0; r < s->rows; r++) {
      int32_t l = fp4idx_load_i32(s->lens.data, r);
      if (l < 0 || (uint64_t)l > nkeys)
        return fp4idx__fail(msg, cap, FP4IDX_ERANGE,
                            "seq %llu: lens[%u] = %d outside 0..%llu (keys)",
                            (unsigned long long)s->seq, r, (int)l,
                            (unsigned long long)nkeys);
      if ((uint64_t)l > w) w = (uint64_t)l;
    }
  }
  if (fp4idx_tensor_present(&s->mask) && s->mask.shape[1] != w)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE,
                        "seq %llu: mask is [%u,%llu], expected [%u,%llu] "
                        "(W = %s)",
                        (unsigned long long)s->seq, s->rows,
                        (unsigned long long)s->mask.shape[1], s->rows,
                        (unsigned long long)w,
                        fp4idx_tensor_present(&s->lens) ? "max(lens)"
                                                        : "keys of the seq");
  *width = w;
  return 0;
}

int fp4idx_score_seq_check(const fp4idx_score_seq_t *s, uint64_t nkeys,
                           uint64_t *width, char *msg, size_t cap) {
  if (s == NULL || width == NULL) return FP4IDX_EINVAL;
  int rc = fp4idx_score_seq_finite(s, msg, cap);
  return rc ? rc : fp4idx_score_seq_check_shape(s, nkeys, width, msg, cap);
}

/* One "out" reference against the result it receives: dtype, then shape. */
static int check_out(const fp4idx_tensor_t *t, const fp4idx_score_seq_t *s,
                     const char *field, fp4idx_wire_dtype_t dt, uint32_t ndim,
                     uint64_t cols, char *msg, size_t cap) {
  bool ok = t->dtype == dt && t->ndim == ndim && t->shape[0] == s->rows &&
            (ndim == 1 || t->shape[1] == cols);
  if (ok) return 0;
  char got[96];
  fp4idx__tensor_desc(t, got, sizeof(got));
  if (ndim == 1)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE,
                        "seq %llu: out.%s is %s, the result is %s [%u]",
                        (unsigned long long)s->seq, field, got,
                        fp4idx_wire_dtype_name(dt), s->rows);
  return fp4idx__fail(msg, cap, FP4IDX_ESHAPE,
                      "seq %llu: out.%s is %s, the result is %s [%u,%llu]",
                      (unsigned long long)s->seq, field, got,
                      fp4idx_wire_dtype_name(dt), s->rows,
                      (unsigned long long)cols);
}

int fp4idx_score_out_check(const fp4idx_score_seq_t *s, uint64_t width,
                           uint32_t topk, char *msg, size_t cap) {
  int rc;
  if (s == NULL) return FP4IDX_EINVAL;
  if (!fp4idx_tensor_present(&s->out_logits)) return 0;
  if (topk == 0)
    return check_out(&s->out_logits, s, "logits", FP4IDX_WIRE_F32, 2, width,
                     msg, cap);
  if ((rc = check_out(&s->out_positions, s, "positions", FP4IDX_WIRE_I32, 2,
                      topk, msg, cap)) ||
      (rc = check_out(&s->out_logits, s, "logits", FP4IDX_WIRE_F32, 2, topk,
                      msg, cap)) ||
      (rc = check_out(&s->out_counts, s, "counts", FP4IDX_WIRE_I32, 1, 0, msg,
                      cap)))
    return rc;
  return 0;
}

int fp4idx_append_keys_check(const fp4idx_append_req_t *a, char *msg, size_t cap) {
  if (a == NULL) return FP4IDX_EINVAL;
  if (a->keys.dtype != FP4IDX_WIRE_U8) return 0; /* bf16/f32: the quantizer checks */
  const unsigned char *k = a->keys.data;
  const unsigned scales = FP4IDX_PROTO_SLOT_BYTES - FP4IDX_PROTO_SCALE_BYTES; /* their offset */
  for (uint64_t i = 0; i < a->keys.shape[0]; i++)
    for (unsigned j = 0; j < FP4IDX_PROTO_SCALE_BYTES; j++) {
      unsigned s = k[i * FP4IDX_PROTO_SLOT_BYTES + scales + j];
      if (s == 0 || s == 255)
        return fp4idx__fail(msg, cap, FP4IDX_ENONFINITE,
                            "keys[%llu]: scale byte %u is %u; packed keys need scale "
                            "bytes 1..254 (255 is NaN in UE8M0)",
                            (unsigned long long)i, j, s);
    }
  return 0;
}

/* ---- encoding ---------------------------------------------------------------- */

int fp4idx_encode_request(msgpack_sbuffer *sb, const fp4idx_request_t *req) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (sb == NULL || req == NULL) return FP4IDX_EINVAL;
  const fp4idx__op_desc_t *od = fp4idx__op_desc(req->op);
  if (od == NULL) return FP4IDX_EINVAL;
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  /* the packer checks the struct as the decoder would (shapes, ranges,
   * caps) before it writes; the tests decode what it wrote */
  return fp4idx__frame_end(sb, start, od->req_pack(&pk, req));
}

int fp4idx_encode_request_split(msgpack_sbuffer *sb, const fp4idx_request_t *req,
                                size_t min_split, fp4idx_payload_t *out, size_t cap,
                                size_t *n) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (n != NULL) *n = 0;
  if (sb == NULL || req == NULL || n == NULL || (cap > 0 && out == NULL)) return FP4IDX_EINVAL;
  const fp4idx__op_desc_t *od = fp4idx__op_desc(req->op);
  if (od == NULL) return FP4IDX_EINVAL;
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  /* every write this long is a bin (or str) body, which msgpack-c passes
   * as the request's own pointer; its own pieces are headers of <= 9 bytes */
  fp4idx__split_t sp = {.sb = sb, .min = min_split < 64 ? 64 : min_split, .out = out,
                        .cap = cap};
  msgpack_packer_init(&pk, &sp, fp4idx__split_write);
  return fp4idx__split_end(&sp, start, od->req_pack(&pk, req), n);
}
