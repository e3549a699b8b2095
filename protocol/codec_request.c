/* codec_request.c -- requests: the strict decoder (daemon side), the encoder
 * (client side) and the per-sequence score check that needs the key count.
 *
 * Decoding order, which fixes which error a bad request gets: msgpack bytes
 * (EPROTO/E2BIG), top-level map, "id" (read leniently first so that every
 * error reply can carry it), "op" (EPROTO missing/not str, ETYPE unknown),
 * then the op's fields in the order of its table below.
 */
#include <stdio.h>
#include <stdlib.h>

#include "codec_internal.h"

#define NF(a) (sizeof(a) / sizeof((a)[0]))

static int expect_shape(const fp4idx_tensor_t *t, const char *where,
                        const char *want, bool ok, char *msg, size_t cap) {
  char desc[96];
  if (ok) return 0;
  return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "%s: got %s, expected %s",
                      where, fp4idx__tensor_desc(t, desc, sizeof(desc)), want);
}

static int decode_hello(fp4idx__field_t *f, fp4idx_hello_req_t *h, char *msg,
                        size_t cap) {
  int rc = fp4idx__get_uint(f[2].val, "", "version", &h->version, msg, cap);
  if (rc == 0 && f[3].val != NULL) {
    rc = fp4idx__get_str(f[3].val, "", "client", &h->client, msg, cap);
    if (rc == 0 && h->client.len > FP4IDX_PROTO_MAX_STRING)
      rc = fp4idx__fail(msg, cap, FP4IDX_E2BIG,
                        "client: %zu bytes, at most %u", h->client.len,
                        FP4IDX_PROTO_MAX_STRING);
  }
  return rc;
}

static int decode_append(fp4idx__field_t *f, fp4idx_append_req_t *a,
                         char *msg, size_t cap) {
  int rc;
  if ((rc = fp4idx__get_uint(f[2].val, "", "seq", &a->seq, msg, cap)) != 0)
    return rc;
  if ((rc = fp4idx__get_tensor(f[3].val, "", "keys", true, &a->keys, msg,
                               cap)) != 0)
    return rc;
  const fp4idx_tensor_t *k = &a->keys;
  bool ok = k->ndim == 2 && k->shape[0] >= 1 &&
            (((k->dtype == FP4IDX_WIRE_BF16 || k->dtype == FP4IDX_WIRE_F32) &&
              k->shape[1] == FP4IDX_PROTO_HEAD_DIM) ||
             (k->dtype == FP4IDX_WIRE_U8 &&
              k->shape[1] == FP4IDX_PROTO_SLOT_BYTES));
  if ((rc = expect_shape(k, "keys",
                         "bf16 [n,128], f32 [n,128] or u8 [n,68] with n >= 1",
                         ok, msg, cap)) != 0)
    return rc;
  a->rounding = FP4IDX_WIRE_ROUND_RNE;
  if (f[4].val != NULL) {
    fp4idx_strview_t r;
    if ((rc = fp4idx__get_str(f[4].val, "", "rounding", &r, msg, cap)) != 0)
      return rc;
    if (r.len == 3 && memcmp(r.ptr, "rne", 3) == 0)
      a->rounding = FP4IDX_WIRE_ROUND_RNE;
    else if (r.len == 9 && memcmp(r.ptr, "threshold", 9) == 0)
      a->rounding = FP4IDX_WIRE_ROUND_THRESHOLD;
    else
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "rounding: '%.*s' is not \"rne\" or \"threshold\"",
                          r.len > 16 ? 16 : (int)r.len, r.ptr);
  }
  return 0;
}

static int decode_score_seq(const msgpack_object *o, size_t i, uint32_t heads,
                            fp4idx_score_seq_t *s, char *msg, size_t cap) {
  char path[32], where[48], want[64];
  fp4idx__field_t f[] = {{"seq", NULL}, {"q", NULL}, {"w", NULL},
                         {"lens", NULL}, {"mask", NULL}};
  int rc;

  snprintf(path, sizeof(path), "seqs[%zu]", i);
  if (o->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: expected a map", path);
  if ((rc = fp4idx__map_fields(o, path, f, NF(f), true, msg, cap)) != 0)
    return rc;
  if ((rc = fp4idx__get_uint(f[0].val, path, "seq", &s->seq, msg, cap)) != 0)
    return rc;

  if ((rc = fp4idx__get_tensor(f[1].val, path, "q", true, &s->q, msg, cap)))
    return rc;
  const fp4idx_tensor_t *q = &s->q;
  snprintf(where, sizeof(where), "%s.q", path);
  snprintf(want, sizeof(want), "bf16 [R,%u,128] with R >= 1", heads);
  if ((rc = expect_shape(q, where, want,
                         q->dtype == FP4IDX_WIRE_BF16 && q->ndim == 3 &&
                             q->shape[0] >= 1 && q->shape[0] <= UINT32_MAX &&
                             q->shape[1] == heads &&
                             q->shape[2] == FP4IDX_PROTO_HEAD_DIM,
                         msg, cap)))
    return rc;
  s->rows = (uint32_t)q->shape[0];

  if ((rc = fp4idx__get_tensor(f[2].val, path, "w", true, &s->w, msg, cap)))
    return rc;
  snprintf(where, sizeof(where), "%s.w", path);
  snprintf(want, sizeof(want), "bf16 [%u,%u]", s->rows, heads);
  if ((rc = expect_shape(&s->w, where, want,
                         s->w.dtype == FP4IDX_WIRE_BF16 && s->w.ndim == 2 &&
                             s->w.shape[0] == s->rows &&
                             s->w.shape[1] == heads,
                         msg, cap)))
    return rc;

  if (f[3].val != NULL) {
    if ((rc = fp4idx__get_tensor(f[3].val, path, "lens", true, &s->lens, msg,
                                 cap)))
      return rc;
    snprintf(where, sizeof(where), "%s.lens", path);
    snprintf(want, sizeof(want), "i32 [%u]", s->rows);
    if ((rc = expect_shape(&s->lens, where, want,
                           s->lens.dtype == FP4IDX_WIRE_I32 &&
                               s->lens.ndim == 1 &&
                               s->lens.shape[0] == s->rows,
                           msg, cap)))
      return rc;
  }
  if (f[4].val != NULL) {
    if ((rc = fp4idx__get_tensor(f[4].val, path, "mask", true, &s->mask, msg,
                                 cap)))
      return rc;
    snprintf(where, sizeof(where), "%s.mask", path);
    snprintf(want, sizeof(want), "u8 [%u,W]", s->rows);
    if ((rc = expect_shape(&s->mask, where, want,
                           s->mask.dtype == FP4IDX_WIRE_U8 &&
                               s->mask.ndim == 2 &&
                               s->mask.shape[0] == s->rows,
                           msg, cap)))
      return rc;
  }
  return 0;
}

static int decode_score(fp4idx__field_t *f, fp4idx_request_t *req, char *msg,
                        size_t cap) {
  fp4idx_score_req_t *sc = &req->u.score;
  uint64_t v;
  int rc;

  if ((rc = fp4idx__get_uint(f[2].val, "", "heads", &v, msg, cap)) != 0)
    return rc;
  if (v < 1 || v > FP4IDX_PROTO_MAX_HEADS)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "heads: %llu, expected 1..%u",
                        (unsigned long long)v, FP4IDX_PROTO_MAX_HEADS);
  sc->heads = (uint32_t)v;
  if (f[3].val != NULL) {
    if ((rc = fp4idx__get_uint(f[3].val, "", "topk", &v, msg, cap)) != 0)
      return rc;
    if (v < 1)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "topk: 0, must be >= 1 (leave it out for logits)");
    if (v > FP4IDX_PROTO_MAX_TOPK)
      return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "topk: %llu, at most %u",
                          (unsigned long long)v, FP4IDX_PROTO_MAX_TOPK);
    sc->topk = (uint32_t)v;
  }
  const msgpack_object *a = f[4].val;
  if (a == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "seqs: missing field");
  if (a->type != MSGPACK_OBJECT_ARRAY)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "seqs: expected an array of maps");
  if (a->via.array.size == 0)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "seqs: empty");
  if (a->via.array.size > FP4IDX_PROTO_MAX_SCORE_SEQS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "seqs: %u entries, at most %u",
                        a->via.array.size, FP4IDX_PROTO_MAX_SCORE_SEQS);
  sc->seqs = calloc(a->via.array.size, sizeof(sc->seqs[0]));
  if (sc->seqs == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory");
  req->owned_ = sc->seqs;
  sc->nseqs = a->via.array.size;
  for (size_t i = 0; i < sc->nseqs; i++)
    if ((rc = decode_score_seq(&a->via.array.ptr[i], i, sc->heads,
                               &sc->seqs[i], msg, cap)) != 0)
      return rc;
  return 0;
}

static int decode_read(fp4idx__field_t *f, fp4idx_read_req_t *r, char *msg,
                       size_t cap) {
  int rc;
  if ((rc = fp4idx__get_uint(f[2].val, "", "seq", &r->seq, msg, cap)) != 0)
    return rc;
  if (f[3].val != NULL &&
      (rc = fp4idx__get_uint(f[3].val, "", "from", &r->from, msg, cap)) != 0)
    return rc;
  if (f[4].val != NULL) {
    if ((rc = fp4idx__get_uint(f[4].val, "", "count", &r->count, msg, cap)))
      return rc;
    r->has_count = true;
  }
  if (f[5].val != NULL &&
      (rc = fp4idx__get_bool(f[5].val, "", "dequant", &r->dequant, msg, cap)))
    return rc;
  return 0;
}

int fp4idx_decode_request(const void *body, size_t len, fp4idx_request_t *req,
                          char *msg, size_t cap) {
  msgpack_unpacked up;
  int rc;

  if (msg != NULL && cap > 0) msg[0] = '\0';
  if (req == NULL) return FP4IDX_EINVAL;
  memset(req, 0, sizeof(*req));
  if (body == NULL && len > 0)
    return fp4idx__fail(msg, cap, FP4IDX_EINVAL, "no body");

  msgpack_unpacked_init(&up);
  if ((rc = fp4idx__mp_parse(body, len, &up, msg, cap)) != 0) goto out;
  const msgpack_object *root = &up.data;

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

  /* per-op field tables; [0] and [1] are always id and op */
  fp4idx__field_t f[8] = {{"id", NULL}, {"op", NULL}};
  size_t nf = 2;
  static const char *const names[FP4IDX_OP__COUNT][6] = {
      [FP4IDX_OP_HELLO] = {"version", "client"},
      [FP4IDX_OP_APPEND] = {"seq", "keys", "rounding"},
      [FP4IDX_OP_SCORE] = {"heads", "topk", "seqs"},
      [FP4IDX_OP_TRUNCATE] = {"seq", "length"},
      [FP4IDX_OP_DROP] = {"seq"},
      [FP4IDX_OP_READ] = {"seq", "from", "count", "dequant"},
  };
  for (size_t i = 0; i < 6 && names[req->op][i] != NULL; i++)
    f[nf++].name = names[req->op][i];
  if ((rc = fp4idx__map_fields(root, "", f, nf, true, msg, cap)) != 0)
    goto out;
  uint64_t id;
  if ((rc = fp4idx__get_uint(f[0].val, "", "id", &id, msg, cap)) != 0) goto out;

  switch (req->op) {
    case FP4IDX_OP_HELLO: rc = decode_hello(f, &req->u.hello, msg, cap); break;
    case FP4IDX_OP_APPEND: rc = decode_append(f, &req->u.append, msg, cap); break;
    case FP4IDX_OP_SCORE: rc = decode_score(f, req, msg, cap); break;
    case FP4IDX_OP_TRUNCATE:
      rc = fp4idx__get_uint(f[2].val, "", "seq", &req->u.truncate.seq, msg, cap);
      if (rc == 0)
        rc = fp4idx__get_uint(f[3].val, "", "length", &req->u.truncate.length,
                              msg, cap);
      break;
    case FP4IDX_OP_DROP:
      rc = fp4idx__get_uint(f[2].val, "", "seq", &req->u.drop.seq, msg, cap);
      break;
    case FP4IDX_OP_READ: rc = decode_read(f, &req->u.read, msg, cap); break;
    default: break; /* info, stats, save: no fields */
  }
out:
  msgpack_unpacked_destroy(&up);
  return rc;
}

void fp4idx_request_clear(fp4idx_request_t *req) {
  if (req == NULL) return;
  free(req->owned_);
  memset(req, 0, sizeof(*req));
}

/* Index of the first bf16 NaN or +-inf (exponent bits all ones) among the n
 * values at data, or n. */
static size_t fp4idx__first_nonfinite_bf16(const void *data, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((fp4idx_load_bf16(data, i) & 0x7f80u) == 0x7f80u) return i;
  return n;
}

int fp4idx_score_seq_check(const fp4idx_score_seq_t *s, uint64_t nkeys,
                           uint64_t *width, char *msg, size_t cap) {
  uint64_t w = nkeys;
  if (s == NULL || width == NULL) return FP4IDX_EINVAL;
  /* A NaN or inf in q or w would make logits NaN, which no order of top-k
   * can rank (PROTOCOL.md, score). */
  size_t nq = (size_t)s->q.nbytes / 2, nw = (size_t)s->w.nbytes / 2;
  size_t bad = fp4idx__first_nonfinite_bf16(s->q.data, nq);
  if (bad < nq) {
    size_t heads = s->rows && s->q.ndim == 3 ? (size_t)s->q.shape[1] : 1;
    return fp4idx__fail(msg, cap, FP4IDX_ENONFINITE,
                        "seq %llu: q[%zu,%zu,%zu] is %s; q and w must be finite",
                        (unsigned long long)s->seq, bad / (heads * 128), bad / 128 % heads,
                        bad % 128,
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

int fp4idx_append_keys_check(const fp4idx_append_req_t *a, char *msg, size_t cap) {
  if (a == NULL) return FP4IDX_EINVAL;
  if (a->keys.dtype != FP4IDX_WIRE_U8) return 0; /* bf16/f32: the quantizer checks */
  const unsigned char *k = a->keys.data;
  for (uint64_t i = 0; i < a->keys.shape[0]; i++)
    for (int j = 0; j < 4; j++) {
      unsigned s = k[i * 68 + 64 + (uint64_t)j];
      if (s == 0 || s == 255)
        return fp4idx__fail(msg, cap, FP4IDX_ENONFINITE,
                            "keys[%llu]: scale byte %d is %u; packed keys need scale "
                            "bytes 1..254 (255 is NaN in UE8M0)",
                            (unsigned long long)i, j, s);
    }
  return 0;
}

/* ---- encoding ---------------------------------------------------------------- */

static int pack_uint_field(msgpack_packer *pk, const char *k, uint64_t v) {
  return fp4idx__pack_cstr(pk, k) | msgpack_pack_uint64(pk, v);
}

static int pack_tensor_field(msgpack_packer *pk, const char *k,
                             const fp4idx_tensor_t *t) {
  return fp4idx__pack_cstr(pk, k) | fp4idx__pack_tensor(pk, t);
}

/* What the packer relies on (the decoder re-checks the rest afterwards). */
static bool request_sane(const fp4idx_request_t *req) {
  switch (req->op) {
    case FP4IDX_OP_HELLO:
      return req->u.hello.client.ptr != NULL || req->u.hello.client.len == 0;
    case FP4IDX_OP_APPEND: return fp4idx__tensor_sane(&req->u.append.keys);
    case FP4IDX_OP_SCORE: {
      const fp4idx_score_req_t *sc = &req->u.score;
      if (sc->seqs == NULL && sc->nseqs > 0) return false;
      for (size_t i = 0; i < sc->nseqs; i++) {
        const fp4idx_score_seq_t *x = &sc->seqs[i];
        if (!fp4idx__tensor_sane(&x->q) || !fp4idx__tensor_sane(&x->w) ||
            (fp4idx_tensor_present(&x->lens) &&
             !fp4idx__tensor_sane(&x->lens)) ||
            (fp4idx_tensor_present(&x->mask) &&
             !fp4idx__tensor_sane(&x->mask)))
          return false;
      }
      return true;
    }
    case FP4IDX_OP_INFO: case FP4IDX_OP_TRUNCATE: case FP4IDX_OP_DROP:
    case FP4IDX_OP_READ: case FP4IDX_OP_STATS: case FP4IDX_OP_SAVE:
      return true;
    default: return false;
  }
}

static int pack_request(msgpack_packer *pk, const fp4idx_request_t *req) {
  int rc = 0;
  size_t n = 2;

  switch (req->op) { /* number of fields */
    case FP4IDX_OP_HELLO: n += 1 + (req->u.hello.client.ptr != NULL); break;
    case FP4IDX_OP_APPEND: n += 3; break;
    case FP4IDX_OP_SCORE: n += 2 + (req->u.score.topk > 0); break;
    case FP4IDX_OP_TRUNCATE: n += 2; break;
    case FP4IDX_OP_DROP: n += 1; break;
    case FP4IDX_OP_READ:
      n += 3 + req->u.read.has_count;
      break;
    case FP4IDX_OP_INFO: case FP4IDX_OP_STATS: case FP4IDX_OP_SAVE: break;
    default: return -1;
  }
  rc |= msgpack_pack_map(pk, n);
  rc |= pack_uint_field(pk, "id", req->id);
  rc |= fp4idx__pack_cstr(pk, "op") |
        fp4idx__pack_cstr(pk, fp4idx_op_name(req->op));
  switch (req->op) {
    case FP4IDX_OP_HELLO:
      rc |= pack_uint_field(pk, "version", req->u.hello.version);
      if (req->u.hello.client.ptr != NULL)
        rc |= fp4idx__pack_cstr(pk, "client") |
              fp4idx__pack_strn(pk, req->u.hello.client.ptr,
                                req->u.hello.client.len);
      break;
    case FP4IDX_OP_APPEND:
      rc |= pack_uint_field(pk, "seq", req->u.append.seq);
      rc |= pack_tensor_field(pk, "keys", &req->u.append.keys);
      rc |= fp4idx__pack_cstr(pk, "rounding");
      rc |= fp4idx__pack_cstr(pk, req->u.append.rounding ==
                                          FP4IDX_WIRE_ROUND_THRESHOLD
                                      ? "threshold"
                                      : "rne");
      break;
    case FP4IDX_OP_SCORE: {
      const fp4idx_score_req_t *sc = &req->u.score;
      rc |= pack_uint_field(pk, "heads", sc->heads);
      if (sc->topk > 0) rc |= pack_uint_field(pk, "topk", sc->topk);
      rc |= fp4idx__pack_cstr(pk, "seqs");
      rc |= msgpack_pack_array(pk, sc->nseqs);
      for (size_t i = 0; i < sc->nseqs && rc == 0; i++) {
        const fp4idx_score_seq_t *s = &sc->seqs[i];
        bool hl = fp4idx_tensor_present(&s->lens);
        bool hm = fp4idx_tensor_present(&s->mask);
        rc |= msgpack_pack_map(pk, 3 + hl + hm);
        rc |= pack_uint_field(pk, "seq", s->seq);
        rc |= pack_tensor_field(pk, "q", &s->q);
        rc |= pack_tensor_field(pk, "w", &s->w);
        if (hl) rc |= pack_tensor_field(pk, "lens", &s->lens);
        if (hm) rc |= pack_tensor_field(pk, "mask", &s->mask);
      }
      break;
    }
    case FP4IDX_OP_TRUNCATE:
      rc |= pack_uint_field(pk, "seq", req->u.truncate.seq);
      rc |= pack_uint_field(pk, "length", req->u.truncate.length);
      break;
    case FP4IDX_OP_DROP:
      rc |= pack_uint_field(pk, "seq", req->u.drop.seq);
      break;
    case FP4IDX_OP_READ:
      rc |= pack_uint_field(pk, "seq", req->u.read.seq);
      rc |= pack_uint_field(pk, "from", req->u.read.from);
      if (req->u.read.has_count)
        rc |= pack_uint_field(pk, "count", req->u.read.count);
      rc |= fp4idx__pack_cstr(pk, "dequant");
      rc |= req->u.read.dequant ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
      break;
    default: break;
  }
  return rc;
}

int fp4idx_encode_request(msgpack_sbuffer *sb, const fp4idx_request_t *req) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (sb == NULL || req == NULL || !request_sane(req)) return FP4IDX_EINVAL;
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  /* the struct was checked, so a packer failure is the buffer failing to
   * grow */
  rc = pack_request(&pk, req) != 0 ? FP4IDX_ENOMEM : 0;
  if ((rc = fp4idx__frame_end(sb, start, rc)) != 0) return rc;

  /* a request that encodes also decodes: check with the decoder itself */
  fp4idx_request_t chk;
  rc = fp4idx_decode_request(sb->data + start + 4, sb->size - start - 4, &chk,
                             NULL, 0);
  fp4idx_request_clear(&chk);
  if (rc != 0) {
    sb->size = start;
    return rc == FP4IDX_ENOMEM || rc == FP4IDX_E2BIG ? rc : FP4IDX_EINVAL;
  }
  return 0;
}
