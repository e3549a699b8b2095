/* codec_ops.c -- each op's fields on the wire <-> its C struct: the request
 * decoder and packer, the response decoder and packer, one section per op in
 * the order of FP4IDX_OP_MAP (fp4idx_codec.h), which names these functions.
 * The drivers around them (framing, "id"/"op"/"status", the field match)
 * are codec_request.c and codec_response.c.
 *
 * Requests are decoded strictly and in the order of the op's fields, which
 * fixes which error a bad request gets (PROTOCOL.md "Order of checks"). The
 * request packers check what the decoder would (shapes, ranges, caps) with
 * the same check functions, so that a request that encodes also decodes
 * without decoding it again. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"

#define NF(a) (sizeof(a) / sizeof((a)[0]))

/* strnlen is POSIX, not C11 */
static size_t bounded_len(const char *s, size_t cap) {
  const char *z = memchr(s, 0, cap);
  return z ? (size_t)(z - s) : cap;
}

static int expect_shape(const fp4idx_tensor_t *t, const char *where,
                        const char *want, bool ok, char *msg, size_t cap) {
  char desc[96];
  if (ok) return 0;
  return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "%s: got %s, expected %s",
                      where, fp4idx__tensor_desc(t, desc, sizeof(desc)), want);
}

/* A packer's verdict on a struct the decoder would refuse: E2BIG stays (a
 * cap), anything else is a bad struct. */
static int pack_refused(int rc) {
  return rc == FP4IDX_E2BIG ? FP4IDX_E2BIG : FP4IDX_EINVAL;
}

/* msgpack's -1 (the buffer did not grow) as a status. */
static int packed(int rc) { return rc != 0 ? FP4IDX_ENOMEM : 0; }

/* Strings of the fixed arrays are packed up to their NUL (or the array end,
 * if a caller forgot the NUL). */
static int kv_fixstr(msgpack_packer *pk, const char *k, const char *v,
                     size_t cap) {
  return fp4idx__pack_cstr(pk, k) |
         fp4idx__pack_strn(pk, v, bounded_len(v, cap));
}

static int get_uint(const fp4idx__fields_t *f, const char *name,
                    uint64_t *out, char *msg, size_t cap) {
  return fp4idx__get_uint(fp4idx__fv(f, name), "", name, out, msg, cap);
}

/* A response field added after version 1 shipped: 0 when absent. */
static int get_opt_uint(const fp4idx__fields_t *f, const char *name,
                        uint64_t *out, char *msg, size_t cap) {
  const msgpack_object *v = fp4idx__fv(f, name);
  *out = 0;
  return v ? fp4idx__get_uint(v, "", name, out, msg, cap) : 0;
}

static int get_fixstr(const fp4idx__fields_t *f, const char *name, char *out,
                      size_t outcap, char *msg, size_t cap) {
  return fp4idx__get_strcpy(fp4idx__fv(f, name), "", name, out, outcap, msg,
                            cap);
}

/* A string response field added after version 1 shipped: "" when absent. */
static int get_opt_fixstr(const fp4idx__fields_t *f, const char *name, char *out,
                          size_t outcap, char *msg, size_t cap) {
  out[0] = '\0';
  return fp4idx__fv(f, name) ? get_fixstr(f, name, out, outcap, msg, cap) : 0;
}

/* The entries of response field `name` (an array of maps, or a map when
 * is_map) at `a`: checks presence, type and at most `max` entries (0: only
 * the frame's own bound), then allocates that many zeroed entries of `size`
 * bytes, owned by resp (*out NULL and *n 0 when empty). */
static int decode_entries(const msgpack_object *a, const char *name,
                          bool is_map, uint32_t max, size_t size,
                          fp4idx_response_t *resp, void **out, size_t *n,
                          char *msg, size_t cap) {
  *out = NULL;
  *n = 0;
  if (a == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: missing field", name);
  if (a->type != (is_map ? MSGPACK_OBJECT_MAP : MSGPACK_OBJECT_ARRAY))
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: expected %s", name,
                        is_map ? "a map" : "an array of maps");
  uint32_t count = is_map ? a->via.map.size : a->via.array.size;
  if (max > 0 && count > max)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: %u entries, at most %u",
                        name, count, max);
  if (count == 0) return 0;
  /* the scan of the frame bounded count by the bytes it has */
  if ((*out = calloc(count, size)) == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory");
  resp->owned_ = *out;
  *n = count;
  return 0;
}

/* ---- ops without fields ------------------------------------------------------ */

int fp4idx__none_req_decode(const fp4idx__fields_t *f, fp4idx_request_t *req,
                            char *msg, size_t cap) {
  (void)f, (void)req, (void)msg, (void)cap;
  return 0;
}

int fp4idx__none_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  return packed(fp4idx__pack_req_head(pk, req, 0));
}

int fp4idx__none_resp_decode(const fp4idx__fields_t *f,
                             fp4idx_response_t *resp, char *msg, size_t cap) {
  (void)f, (void)resp, (void)msg, (void)cap;
  return 0;
}

int fp4idx__none_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  return packed(fp4idx__pack_resp_head(pk, r, 0));
}

/* ---- hello ----------------------------------------------------------------------- */

static int check_client(const fp4idx_strview_t *c, char *msg, size_t cap) {
  if (c->len > FP4IDX_PROTO_MAX_STRING)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "client: %zu bytes, at most %u",
                        c->len, FP4IDX_PROTO_MAX_STRING);
  return 0;
}

int fp4idx__hello_req_decode(const fp4idx__fields_t *f, fp4idx_request_t *req,
                             char *msg, size_t cap) {
  fp4idx_hello_req_t *h = &req->u.hello;
  int rc = get_uint(f, "version", &h->version, msg, cap);
  const msgpack_object *c = fp4idx__fv(f, "client");
  if (rc == 0 && c != NULL) {
    rc = fp4idx__get_str(c, "", "client", &h->client, msg, cap);
    if (rc == 0) rc = check_client(&h->client, msg, cap);
  }
  return rc;
}

int fp4idx__hello_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  const fp4idx_hello_req_t *h = &req->u.hello;
  int rc;
  if (h->client.ptr == NULL && h->client.len != 0) return FP4IDX_EINVAL;
  if ((rc = check_client(&h->client, NULL, 0)) != 0) return pack_refused(rc);
  rc = fp4idx__pack_req_head(pk, req, 1 + (h->client.ptr != NULL));
  rc |= fp4idx__pack_kv_uint(pk, "version", h->version);
  if (h->client.ptr != NULL)
    rc |= fp4idx__pack_cstr(pk, "client") |
          fp4idx__pack_strn(pk, h->client.ptr, h->client.len);
  return packed(rc);
}

int fp4idx__hello_resp_decode(const fp4idx__fields_t *f,
                              fp4idx_response_t *resp, char *msg, size_t cap) {
  fp4idx_hello_resp_t *h = &resp->u.hello;
  int rc;
  if ((rc = get_uint(f, "version", &h->version, msg, cap)) ||
      (rc = get_fixstr(f, "server", h->server, sizeof(h->server), msg, cap)))
    return rc;
  return 0;
}

int fp4idx__hello_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  int rc = fp4idx__pack_resp_head(pk, r, 2);
  rc |= fp4idx__pack_kv_uint(pk, "version", r->u.hello.version);
  rc |= kv_fixstr(pk, "server", r->u.hello.server, sizeof(r->u.hello.server));
  return packed(rc);
}

/* ---- info ------------------------------------------------------------------------ */

int fp4idx__info_resp_decode(const fp4idx__fields_t *f,
                             fp4idx_response_t *resp, char *msg, size_t cap) {
  fp4idx_info_t *in = &resp->u.info;
  int rc;
  if ((rc = get_uint(f, "version", &in->version, msg, cap)) ||
      (rc = get_fixstr(f, "server", in->server, sizeof(in->server), msg, cap)) ||
      (rc = get_fixstr(f, "backend", in->backend, sizeof(in->backend), msg,
                       cap)) ||
      (rc = get_fixstr(f, "device", in->device, sizeof(in->device), msg,
                       cap)) ||
      (rc = get_uint(f, "page_size", &in->page_size, msg, cap)) ||
      (rc = get_uint(f, "pages_total", &in->pages_total, msg, cap)) ||
      (rc = get_uint(f, "pages_free", &in->pages_free, msg, cap)) ||
      (rc = get_uint(f, "sequences", &in->sequences, msg, cap)) ||
      (rc = get_uint(f, "max_frame", &in->max_frame, msg, cap)) ||
      (rc = get_opt_uint(f, "pages_shared", &in->pages_shared, msg, cap)) ||
      (rc = get_opt_fixstr(f, "gpu_sharing", in->gpu_sharing, sizeof(in->gpu_sharing), msg,
                           cap)) ||
      (rc = get_opt_uint(f, "gpu_other_processes", &in->gpu_other_processes, msg, cap)))
    return rc;
  return 0;
}

int fp4idx__info_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  const fp4idx_info_t *in = &r->u.info;
  int rc = fp4idx__pack_resp_head(pk, r, 12);
  rc |= fp4idx__pack_kv_uint(pk, "version", in->version);
  rc |= kv_fixstr(pk, "server", in->server, sizeof(in->server));
  rc |= kv_fixstr(pk, "backend", in->backend, sizeof(in->backend));
  rc |= kv_fixstr(pk, "device", in->device, sizeof(in->device));
  rc |= fp4idx__pack_kv_uint(pk, "page_size", in->page_size);
  rc |= fp4idx__pack_kv_uint(pk, "pages_total", in->pages_total);
  rc |= fp4idx__pack_kv_uint(pk, "pages_free", in->pages_free);
  rc |= fp4idx__pack_kv_uint(pk, "sequences", in->sequences);
  rc |= fp4idx__pack_kv_uint(pk, "max_frame", in->max_frame);
  rc |= fp4idx__pack_kv_uint(pk, "pages_shared", in->pages_shared);
  rc |= kv_fixstr(pk, "gpu_sharing", in->gpu_sharing, sizeof(in->gpu_sharing));
  rc |= fp4idx__pack_kv_uint(pk, "gpu_other_processes", in->gpu_other_processes);
  return packed(rc);
}

/* ---- append ---------------------------------------------------------------------- */

static int check_append_keys(const fp4idx_tensor_t *k, char *msg, size_t cap) {
  bool ok = k->ndim == 2 && k->shape[0] >= 1 &&
            (((k->dtype == FP4IDX_WIRE_BF16 || k->dtype == FP4IDX_WIRE_F32) &&
              k->shape[1] == FP4IDX_PROTO_HEAD_DIM) ||
             (k->dtype == FP4IDX_WIRE_U8 &&
              k->shape[1] == FP4IDX_PROTO_SLOT_BYTES));
  return expect_shape(k, "keys",
                      "bf16 [n,128], f32 [n,128] or u8 [n,68] with n >= 1", ok,
                      msg, cap);
}

int fp4idx__append_req_decode(const fp4idx__fields_t *f, fp4idx_request_t *req,
                              char *msg, size_t cap) {
  fp4idx_append_req_t *a = &req->u.append;
  int rc;
  if ((rc = get_uint(f, "seq", &a->seq, msg, cap)) != 0) return rc;
  if ((rc = fp4idx__get_tensor(fp4idx__fv(f, "keys"), "", "keys", true,
                               &a->keys, msg, cap)) != 0)
    return rc;
  if ((rc = check_append_keys(&a->keys, msg, cap)) != 0) return rc;
  a->rounding = FP4IDX_WIRE_ROUND_RNE;
  const msgpack_object *rv = fp4idx__fv(f, "rounding");
  if (rv != NULL) {
    fp4idx_strview_t r;
    if ((rc = fp4idx__get_str(rv, "", "rounding", &r, msg, cap)) != 0)
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

int fp4idx__append_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  const fp4idx_append_req_t *a = &req->u.append;
  if (!fp4idx__tensor_sane(&a->keys)) return FP4IDX_EINVAL;
  int rc = check_append_keys(&a->keys, NULL, 0);
  if (rc != 0) return pack_refused(rc);
  rc = fp4idx__pack_req_head(pk, req, 3);
  rc |= fp4idx__pack_kv_uint(pk, "seq", a->seq);
  rc |= fp4idx__pack_kv_tensor(pk, "keys", &a->keys);
  rc |= fp4idx__pack_cstr(pk, "rounding");
  rc |= fp4idx__pack_cstr(
      pk, a->rounding == FP4IDX_WIRE_ROUND_THRESHOLD ? "threshold" : "rne");
  return packed(rc);
}

int fp4idx__append_resp_decode(const fp4idx__fields_t *f,
                               fp4idx_response_t *resp, char *msg, size_t cap) {
  int rc;
  if ((rc = get_uint(f, "first", &resp->u.append.first, msg, cap)) ||
      (rc = get_uint(f, "length", &resp->u.append.length, msg, cap)))
    return rc;
  return 0;
}

int fp4idx__append_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  int rc = fp4idx__pack_resp_head(pk, r, 2);
  rc |= fp4idx__pack_kv_uint(pk, "first", r->u.append.first);
  rc |= fp4idx__pack_kv_uint(pk, "length", r->u.append.length);
  return packed(rc);
}

/* ---- score ----------------------------------------------------------------------- */

/* expect_shape for field `field` of map `path`, the wanted shape formatted
 * from fmt (it names the other dims: "bf16 [%u,%u]"). */
static int expect_field_shape(const fp4idx_tensor_t *t, const char *path,
                              const char *field, bool ok, char *msg,
                              size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static int expect_field_shape(const fp4idx_tensor_t *t, const char *path,
                              const char *field, bool ok, char *msg,
                              size_t cap, const char *fmt, ...) {
  char where[48], want[64];
  va_list ap;
  if (ok) return 0;
  snprintf(where, sizeof(where), "%s.%s", path, field);
  va_start(ap, fmt);
  vsnprintf(want, sizeof(want), fmt, ap);
  va_end(ap);
  return expect_shape(t, where, want, false, msg, cap);
}

/* The shape checks of one "seqs" entry, each after its tensor is read (the
 * decoder) or all at once (the packer). rows = R of q. */
static int check_score_q(const fp4idx_tensor_t *q, const char *path,
                         uint32_t heads, char *msg, size_t cap) {
  return expect_field_shape(
      q, path, "q",
      q->dtype == FP4IDX_WIRE_BF16 && q->ndim == 3 && q->shape[0] >= 1 &&
          q->shape[0] <= UINT32_MAX && q->shape[1] == heads &&
          q->shape[2] == FP4IDX_PROTO_HEAD_DIM,
      msg, cap, "bf16 [R,%u,128] with R >= 1", heads);
}

static int check_score_w(const fp4idx_tensor_t *w, const char *path,
                         uint32_t rows, uint32_t heads, char *msg, size_t cap) {
  return expect_field_shape(w, path, "w",
                            w->dtype == FP4IDX_WIRE_BF16 && w->ndim == 2 &&
                                w->shape[0] == rows && w->shape[1] == heads,
                            msg, cap, "bf16 [%u,%u]", rows, heads);
}

static int check_score_lens(const fp4idx_tensor_t *l, const char *path,
                            uint32_t rows, char *msg, size_t cap) {
  return expect_field_shape(l, path, "lens",
                            l->dtype == FP4IDX_WIRE_I32 && l->ndim == 1 &&
                                l->shape[0] == rows,
                            msg, cap, "i32 [%u]", rows);
}

static int check_score_mask(const fp4idx_tensor_t *m, const char *path,
                            uint32_t rows, char *msg, size_t cap) {
  return expect_field_shape(m, path, "mask",
                            m->dtype == FP4IDX_WIRE_U8 && m->ndim == 2 &&
                                m->shape[0] == rows,
                            msg, cap, "u8 [%u,W]", rows);
}

/* The "out" map of a score entry: region references only, logits alone
 * without topk, positions + logits + counts with it. */
static int decode_score_out(const msgpack_object *o, const char *path,
                            bool topk, fp4idx_score_seq_t *s, char *msg,
                            size_t cap) {
  char where[48];
  fp4idx__field_t f[] = {{"logits", NULL}, {"positions", NULL},
                         {"counts", NULL}};
  fp4idx_tensor_t *t[] = {&s->out_logits, &s->out_positions, &s->out_counts};
  int rc;
  fp4idx__path_cat(where, sizeof(where), path, ".", "out");
  if (o->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "%s: expected a map of region references", where);
  if ((rc = fp4idx__map_fields(o, where, f, NF(f), true, msg, cap)) != 0)
    return rc;
  for (size_t j = 0; j < NF(f); j++) {
    if (f[j].val == NULL) {
      if (j == 0 || topk)
        return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s.%s: missing field%s",
                            where, f[j].name,
                            topk ? " (top-k writes positions, logits and "
                                   "counts)"
                                 : "");
      continue;
    }
    if (!topk && j > 0)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "%s.%s: only with topk (full logits write logits)",
                          where, f[j].name);
    if ((rc = fp4idx__get_tensor(f[j].val, where, f[j].name, true, t[j], msg,
                                 cap)) != 0)
      return rc;
    if (t[j]->region == 0)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "%s.%s: must be a region reference {region, "
                          "offset, dtype, shape}",
                          where, f[j].name);
  }
  return 0;
}

static int decode_score_seq(const msgpack_object *o, size_t i, uint32_t heads,
                            bool topk, fp4idx_score_seq_t *s, char *msg,
                            size_t cap) {
  char path[32];
  fp4idx__field_t f[] = {{"seq", NULL}, {"q", NULL},    {"w", NULL},
                         {"lens", NULL}, {"mask", NULL}, {"out", NULL}};
  fp4idx__fields_t fs = {f, NF(f)};
  int rc;

  fp4idx__path_index(path, sizeof(path), "seqs", i);
  if (o->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: expected a map", path);
  if ((rc = fp4idx__map_fields(o, path, f, NF(f), true, msg, cap)) != 0)
    return rc;
  if ((rc = fp4idx__get_uint(fp4idx__fv(&fs, "seq"), path, "seq", &s->seq, msg,
                             cap)) != 0)
    return rc;
  if ((rc = fp4idx__get_tensor(fp4idx__fv(&fs, "q"), path, "q", true, &s->q,
                               msg, cap)) ||
      (rc = check_score_q(&s->q, path, heads, msg, cap)))
    return rc;
  s->rows = (uint32_t)s->q.shape[0];
  if ((rc = fp4idx__get_tensor(fp4idx__fv(&fs, "w"), path, "w", true, &s->w,
                               msg, cap)) ||
      (rc = check_score_w(&s->w, path, s->rows, heads, msg, cap)))
    return rc;
  const msgpack_object *lv = fp4idx__fv(&fs, "lens");
  if (lv != NULL &&
      ((rc = fp4idx__get_tensor(lv, path, "lens", true, &s->lens, msg, cap)) ||
       (rc = check_score_lens(&s->lens, path, s->rows, msg, cap))))
    return rc;
  const msgpack_object *mv = fp4idx__fv(&fs, "mask");
  if (mv != NULL &&
      ((rc = fp4idx__get_tensor(mv, path, "mask", true, &s->mask, msg, cap)) ||
       (rc = check_score_mask(&s->mask, path, s->rows, msg, cap))))
    return rc;
  const msgpack_object *ov = fp4idx__fv(&fs, "out");
  if (ov != NULL && (rc = decode_score_out(ov, path, topk, s, msg, cap)) != 0)
    return rc;
  return 0;
}

static int check_score_heads(uint64_t heads, char *msg, size_t cap) {
  if (heads < 1 || heads > FP4IDX_PROTO_MAX_HEADS)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "heads: %llu, expected 1..%u",
                        (unsigned long long)heads, FP4IDX_PROTO_MAX_HEADS);
  return 0;
}

/* An optional count field `name` that is 1..max when given: 0 is EPROTO
 * (leaving the field out means `absent`), above max E2BIG. */
static int check_count(const char *name, uint64_t n, uint32_t max,
                       const char *absent, char *msg, size_t cap) {
  if (n < 1)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "%s: 0, must be >= 1 (leave it out for %s)", name,
                        absent);
  if (n > max)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: %llu, at most %u", name,
                        (unsigned long long)n, max);
  return 0;
}

static int check_score_topk(uint64_t k, char *msg, size_t cap) {
  return check_count("topk", k, FP4IDX_PROTO_MAX_TOPK, "logits", msg, cap);
}

static int check_score_nseqs(uint64_t n, char *msg, size_t cap) {
  if (n == 0) return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "seqs: empty");
  if (n > FP4IDX_PROTO_MAX_SCORE_SEQS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "seqs: %llu entries, at most %u",
                        (unsigned long long)n, FP4IDX_PROTO_MAX_SCORE_SEQS);
  return 0;
}

int fp4idx__score_req_decode(const fp4idx__fields_t *f, fp4idx_request_t *req,
                             char *msg, size_t cap) {
  fp4idx_score_req_t *sc = &req->u.score;
  uint64_t v;
  int rc;

  if ((rc = get_uint(f, "heads", &v, msg, cap)) ||
      (rc = check_score_heads(v, msg, cap)))
    return rc;
  sc->heads = (uint32_t)v;
  const msgpack_object *kv = fp4idx__fv(f, "topk");
  if (kv != NULL) {
    if ((rc = fp4idx__get_uint(kv, "", "topk", &v, msg, cap)) ||
        (rc = check_score_topk(v, msg, cap)))
      return rc;
    sc->topk = (uint32_t)v;
  }
  const msgpack_object *a = fp4idx__fv(f, "seqs");
  if (a == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "seqs: missing field");
  if (a->type != MSGPACK_OBJECT_ARRAY)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "seqs: expected an array of maps");
  if ((rc = check_score_nseqs(a->via.array.size, msg, cap)) != 0) return rc;
  sc->seqs = calloc(a->via.array.size, sizeof(sc->seqs[0]));
  if (sc->seqs == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory");
  req->owned_ = sc->seqs;
  sc->nseqs = a->via.array.size;
  for (size_t i = 0; i < sc->nseqs; i++)
    if ((rc = decode_score_seq(&a->via.array.ptr[i], i, sc->heads,
                               sc->topk > 0, &sc->seqs[i], msg, cap)) != 0)
      return rc;
  return 0;
}

/* What the decoder would check of a score request built by hand. */
static int check_score_req(const fp4idx_score_req_t *sc) {
  int rc;
  if (sc->seqs == NULL && sc->nseqs > 0) return FP4IDX_EINVAL;
  if ((rc = check_score_heads(sc->heads, NULL, 0)) ||
      (sc->topk > 0 && (rc = check_score_topk(sc->topk, NULL, 0))) ||
      (rc = check_score_nseqs(sc->nseqs, NULL, 0)))
    return rc;
  for (size_t i = 0; i < sc->nseqs; i++) {
    const fp4idx_score_seq_t *x = &sc->seqs[i];
    bool hl = fp4idx_tensor_present(&x->lens);
    bool hm = fp4idx_tensor_present(&x->mask);
    if (!fp4idx__tensor_sane(&x->q) || !fp4idx__tensor_sane(&x->w) ||
        (hl && !fp4idx__tensor_sane(&x->lens)) ||
        (hm && !fp4idx__tensor_sane(&x->mask)))
      return FP4IDX_EINVAL;
    if ((rc = check_score_q(&x->q, "", sc->heads, NULL, 0)) != 0) return rc;
    bool ol = fp4idx_tensor_present(&x->out_logits);
    bool op = fp4idx_tensor_present(&x->out_positions);
    bool oc = fp4idx_tensor_present(&x->out_counts);
    if (ol && (sc->topk > 0 ? !(op && oc) : (op || oc))) return FP4IDX_EINVAL;
    if (!ol && (op || oc)) return FP4IDX_EINVAL;
    if ((ol && (x->out_logits.region == 0 ||
                !fp4idx__tensor_sane(&x->out_logits))) ||
        (op && (x->out_positions.region == 0 ||
                !fp4idx__tensor_sane(&x->out_positions))) ||
        (oc && (x->out_counts.region == 0 ||
                !fp4idx__tensor_sane(&x->out_counts))))
      return FP4IDX_EINVAL;
    uint32_t rows = (uint32_t)x->q.shape[0];
    if ((rc = check_score_w(&x->w, "", rows, sc->heads, NULL, 0)) ||
        (hl && (rc = check_score_lens(&x->lens, "", rows, NULL, 0))) ||
        (hm && (rc = check_score_mask(&x->mask, "", rows, NULL, 0))))
      return rc;
  }
  return 0;
}

int fp4idx__score_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  const fp4idx_score_req_t *sc = &req->u.score;
  int rc = check_score_req(sc);
  if (rc != 0) return pack_refused(rc);
  rc = fp4idx__pack_req_head(pk, req, 2 + (sc->topk > 0));
  rc |= fp4idx__pack_kv_uint(pk, "heads", sc->heads);
  if (sc->topk > 0) rc |= fp4idx__pack_kv_uint(pk, "topk", sc->topk);
  rc |= fp4idx__pack_cstr(pk, "seqs");
  rc |= msgpack_pack_array(pk, sc->nseqs);
  for (size_t i = 0; i < sc->nseqs && rc == 0; i++) {
    const fp4idx_score_seq_t *s = &sc->seqs[i];
    bool hl = fp4idx_tensor_present(&s->lens);
    bool hm = fp4idx_tensor_present(&s->mask);
    bool ho = fp4idx_tensor_present(&s->out_logits);
    rc |= msgpack_pack_map(pk, 3 + hl + hm + ho);
    rc |= fp4idx__pack_kv_uint(pk, "seq", s->seq);
    rc |= fp4idx__pack_kv_tensor(pk, "q", &s->q);
    rc |= fp4idx__pack_kv_tensor(pk, "w", &s->w);
    if (hl) rc |= fp4idx__pack_kv_tensor(pk, "lens", &s->lens);
    if (hm) rc |= fp4idx__pack_kv_tensor(pk, "mask", &s->mask);
    if (ho) {
      bool k = sc->topk > 0;
      rc |= fp4idx__pack_cstr(pk, "out");
      rc |= msgpack_pack_map(pk, k ? 3 : 1);
      rc |= fp4idx__pack_kv_tensor(pk, "logits", &s->out_logits);
      if (k) {
        rc |= fp4idx__pack_kv_tensor(pk, "positions", &s->out_positions);
        rc |= fp4idx__pack_kv_tensor(pk, "counts", &s->out_counts);
      }
    }
  }
  return packed(rc);
}

static int decode_result(const msgpack_object *o, size_t i,
                         fp4idx_score_result_t *r, char *msg, size_t cap) {
  char path[32], where[48];
  fp4idx__field_t f[] = {{"seq", NULL}, {"logits", NULL}, {"positions", NULL},
                         {"counts", NULL}};
  fp4idx__fields_t fs = {f, NF(f)};
  int rc;

  fp4idx__path_index(path, sizeof(path), "results", i);
  if ((rc = fp4idx__map_fields(o, path, f, NF(f), false, msg, cap)) != 0)
    return rc;
  if ((rc = fp4idx__get_uint(fp4idx__fv(&fs, "seq"), path, "seq", &r->seq, msg,
                             cap)) != 0)
    return rc;
  if ((rc = fp4idx__get_tensor(fp4idx__fv(&fs, "logits"), path, "logits",
                               false, &r->logits, msg, cap)) != 0)
    return rc;
  fp4idx__path_cat(where, sizeof(where), path, ".", "logits");
  if ((rc = expect_shape(&r->logits, where, "f32 [R,W] or f32 [R,k]",
                         r->logits.dtype == FP4IDX_WIRE_F32 &&
                             r->logits.ndim == 2,
                         msg, cap)))
    return rc;
  const msgpack_object *pv = fp4idx__fv(&fs, "positions");
  const msgpack_object *cv = fp4idx__fv(&fs, "counts");
  if (pv == NULL && cv == NULL) return 0;

  r->topk = true;
  if ((rc = fp4idx__get_tensor(pv, path, "positions", false, &r->positions,
                               msg, cap)) != 0)
    return rc;
  fp4idx__path_cat(where, sizeof(where), path, ".", "positions");
  if ((rc = expect_shape(&r->positions, where, "i32 [R,k] like logits",
                         r->positions.dtype == FP4IDX_WIRE_I32 &&
                             r->positions.ndim == 2 &&
                             r->positions.shape[0] == r->logits.shape[0] &&
                             r->positions.shape[1] == r->logits.shape[1],
                         msg, cap)))
    return rc;
  if ((rc = fp4idx__get_tensor(cv, path, "counts", false, &r->counts, msg,
                               cap)) != 0)
    return rc;
  fp4idx__path_cat(where, sizeof(where), path, ".", "counts");
  return expect_shape(&r->counts, where, "i32 [R]",
                      r->counts.dtype == FP4IDX_WIRE_I32 &&
                          r->counts.ndim == 1 &&
                          r->counts.shape[0] == r->logits.shape[0],
                      msg, cap);
}

int fp4idx__score_resp_decode(const fp4idx__fields_t *f,
                              fp4idx_response_t *resp, char *msg, size_t cap) {
  const msgpack_object *a = fp4idx__fv(f, "results");
  fp4idx_score_resp_t *sc = &resp->u.score;
  int rc;

  void *p;
  if ((rc = decode_entries(a, "results", false, FP4IDX_PROTO_MAX_SCORE_SEQS,
                           sizeof(sc->results[0]), resp, &p, &sc->nresults,
                           msg, cap)) != 0)
    return rc;
  sc->results = p;
  for (size_t i = 0; i < sc->nresults; i++)
    if ((rc = decode_result(&a->via.array.ptr[i], i, &sc->results[i], msg,
                            cap)) != 0)
      return rc;
  return 0;
}

int fp4idx__score_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  const fp4idx_score_resp_t *sc = &r->u.score;
  if (sc->results == NULL && sc->nresults > 0) return FP4IDX_EINVAL;
  for (size_t i = 0; i < sc->nresults; i++) {
    const fp4idx_score_result_t *x = &sc->results[i];
    if (!fp4idx__tensor_sane(&x->logits) ||
        (x->topk && (!fp4idx__tensor_sane(&x->positions) ||
                     !fp4idx__tensor_sane(&x->counts))))
      return FP4IDX_EINVAL;
  }
  int rc = fp4idx__pack_resp_head(pk, r, 1);
  rc |= fp4idx__pack_cstr(pk, "results");
  rc |= msgpack_pack_array(pk, sc->nresults);
  for (size_t i = 0; i < sc->nresults && rc == 0; i++) {
    const fp4idx_score_result_t *x = &sc->results[i];
    rc |= msgpack_pack_map(pk, x->topk ? 4 : 2);
    rc |= fp4idx__pack_kv_uint(pk, "seq", x->seq);
    if (x->topk) rc |= fp4idx__pack_kv_tensor(pk, "positions", &x->positions);
    rc |= fp4idx__pack_kv_tensor(pk, "logits", &x->logits);
    if (x->topk) rc |= fp4idx__pack_kv_tensor(pk, "counts", &x->counts);
  }
  return packed(rc);
}

/* ---- truncate -------------------------------------------------------------------- */

int fp4idx__truncate_req_decode(const fp4idx__fields_t *f,
                                fp4idx_request_t *req, char *msg, size_t cap) {
  int rc = get_uint(f, "seq", &req->u.truncate.seq, msg, cap);
  if (rc == 0) rc = get_uint(f, "length", &req->u.truncate.length, msg, cap);
  return rc;
}

int fp4idx__truncate_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  int rc = fp4idx__pack_req_head(pk, req, 2);
  rc |= fp4idx__pack_kv_uint(pk, "seq", req->u.truncate.seq);
  rc |= fp4idx__pack_kv_uint(pk, "length", req->u.truncate.length);
  return packed(rc);
}

int fp4idx__truncate_resp_decode(const fp4idx__fields_t *f,
                                 fp4idx_response_t *resp, char *msg,
                                 size_t cap) {
  return get_uint(f, "length", &resp->u.truncate.length, msg, cap);
}

int fp4idx__truncate_resp_pack(msgpack_packer *pk,
                               const fp4idx_response_t *r) {
  int rc = fp4idx__pack_resp_head(pk, r, 1);
  rc |= fp4idx__pack_kv_uint(pk, "length", r->u.truncate.length);
  return packed(rc);
}

/* ---- drop ------------------------------------------------------------------------ */

int fp4idx__drop_req_decode(const fp4idx__fields_t *f, fp4idx_request_t *req,
                            char *msg, size_t cap) {
  return get_uint(f, "seq", &req->u.drop.seq, msg, cap);
}

int fp4idx__drop_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  int rc = fp4idx__pack_req_head(pk, req, 1);
  rc |= fp4idx__pack_kv_uint(pk, "seq", req->u.drop.seq);
  return packed(rc);
}

/* ---- fork ------------------------------------------------------------------------ */

int fp4idx__fork_req_decode(const fp4idx__fields_t *f, fp4idx_request_t *req,
                            char *msg, size_t cap) {
  int rc = get_uint(f, "src", &req->u.fork.src, msg, cap);
  if (rc == 0) rc = get_uint(f, "dst", &req->u.fork.dst, msg, cap);
  if (rc == 0) rc = get_uint(f, "length", &req->u.fork.length, msg, cap);
  return rc;
}

int fp4idx__fork_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  int rc = fp4idx__pack_req_head(pk, req, 3);
  rc |= fp4idx__pack_kv_uint(pk, "src", req->u.fork.src);
  rc |= fp4idx__pack_kv_uint(pk, "dst", req->u.fork.dst);
  rc |= fp4idx__pack_kv_uint(pk, "length", req->u.fork.length);
  return packed(rc);
}

int fp4idx__fork_resp_decode(const fp4idx__fields_t *f, fp4idx_response_t *resp,
                             char *msg, size_t cap) {
  return get_uint(f, "length", &resp->u.fork.length, msg, cap);
}

int fp4idx__fork_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  int rc = fp4idx__pack_resp_head(pk, r, 1);
  rc |= fp4idx__pack_kv_uint(pk, "length", r->u.fork.length);
  return packed(rc);
}

/* ---- read ------------------------------------------------------------------------ */

int fp4idx__read_req_decode(const fp4idx__fields_t *f, fp4idx_request_t *req,
                            char *msg, size_t cap) {
  fp4idx_read_req_t *r = &req->u.read;
  const msgpack_object *v;
  int rc;
  if ((rc = get_uint(f, "seq", &r->seq, msg, cap)) != 0) return rc;
  if ((v = fp4idx__fv(f, "from")) != NULL &&
      (rc = fp4idx__get_uint(v, "", "from", &r->from, msg, cap)) != 0)
    return rc;
  if ((v = fp4idx__fv(f, "count")) != NULL) {
    if ((rc = fp4idx__get_uint(v, "", "count", &r->count, msg, cap)) != 0)
      return rc;
    r->has_count = true;
  }
  if ((v = fp4idx__fv(f, "dequant")) != NULL &&
      (rc = fp4idx__get_bool(v, "", "dequant", &r->dequant, msg, cap)) != 0)
    return rc;
  return 0;
}

int fp4idx__read_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  const fp4idx_read_req_t *r = &req->u.read;
  int rc = fp4idx__pack_req_head(pk, req, 3 + r->has_count);
  rc |= fp4idx__pack_kv_uint(pk, "seq", r->seq);
  rc |= fp4idx__pack_kv_uint(pk, "from", r->from);
  if (r->has_count) rc |= fp4idx__pack_kv_uint(pk, "count", r->count);
  rc |= fp4idx__pack_cstr(pk, "dequant");
  rc |= r->dequant ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
  return packed(rc);
}

int fp4idx__read_resp_decode(const fp4idx__fields_t *f,
                             fp4idx_response_t *resp, char *msg, size_t cap) {
  fp4idx_tensor_t *k = &resp->u.read.keys;
  int rc;
  if ((rc = fp4idx__get_tensor(fp4idx__fv(f, "keys"), "", "keys", false, k,
                               msg, cap)))
    return rc;
  return expect_shape(k, "keys", "u8 [n,68] or f32 [n,128]",
                      k->ndim == 2 &&
                          ((k->dtype == FP4IDX_WIRE_U8 &&
                            k->shape[1] == FP4IDX_PROTO_SLOT_BYTES) ||
                           (k->dtype == FP4IDX_WIRE_F32 &&
                            k->shape[1] == FP4IDX_PROTO_HEAD_DIM)),
                      msg, cap);
}

int fp4idx__read_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  if (!fp4idx__tensor_sane(&r->u.read.keys)) return FP4IDX_EINVAL;
  int rc = fp4idx__pack_resp_head(pk, r, 1);
  rc |= fp4idx__pack_kv_tensor(pk, "keys", &r->u.read.keys);
  return packed(rc);
}

/* ---- stats ----------------------------------------------------------------------- */

/* One entry of "requests" or "stages" (`what`): the same counters. */
static int decode_op_stats(const msgpack_object_kv *kv, const char *what,
                           fp4idx_op_stats_t *s, char *msg, size_t cap) {
  char path[96];
  fp4idx__field_t f[] = {{"count", NULL},         {"errors", NULL},
                         {"latency_us_le", NULL}, {"latency_hist", NULL},
                         {"latency_sum_us", NULL}};
  fp4idx__fields_t fs = {f, NF(f)};
  int rc;

  if ((rc = fp4idx__get_strcpy(&kv->key, what, "<key>", s->op,
                               sizeof(s->op), msg, cap)) != 0)
    return rc;
  fp4idx__path_cat(path, sizeof(path), what, ".", s->op);
  if ((rc = fp4idx__map_fields(&kv->val, path, f, NF(f), false, msg, cap)))
    return rc;
  if ((rc = fp4idx__get_uint(fp4idx__fv(&fs, "count"), path, "count",
                             &s->count, msg, cap)) ||
      (rc = fp4idx__get_uint(fp4idx__fv(&fs, "errors"), path, "errors",
                             &s->errors, msg, cap)) ||
      (rc = fp4idx__get_num(fp4idx__fv(&fs, "latency_sum_us"), path,
                            "latency_sum_us", &s->sum_us, msg, cap)))
    return rc;
  const msgpack_object *le = fp4idx__fv(&fs, "latency_us_le");
  const msgpack_object *h = fp4idx__fv(&fs, "latency_hist");
  if (le == NULL || h == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s.%s: missing field", path,
                        le == NULL ? "latency_us_le" : "latency_hist");
  if (le->type != MSGPACK_OBJECT_ARRAY || h->type != MSGPACK_OBJECT_ARRAY)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "%s: latency_us_le and latency_hist must be arrays",
                        path);
  if (le->via.array.size != h->via.array.size)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "%s: latency_us_le has %u entries, latency_hist %u",
                        path, le->via.array.size, h->via.array.size);
  if (le->via.array.size > FP4IDX_PROTO_MAX_BUCKETS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: %u buckets, at most %u",
                        path, le->via.array.size, FP4IDX_PROTO_MAX_BUCKETS);
  s->nbuckets = le->via.array.size;
  for (uint32_t b = 0; b < s->nbuckets; b++)
    if ((rc = fp4idx__get_num(&le->via.array.ptr[b], path,
                              "latency_us_le[]", &s->le_us[b], msg, cap)) ||
        (rc = fp4idx__get_uint(&h->via.array.ptr[b], path, "latency_hist[]",
                               &s->hist[b], msg, cap)))
      return rc;
  return 0;
}

/* "errors_by_status" {name: count} -> st->status_errors[-code]; names this
 * build does not know are skipped. */
static int decode_status_errors(const msgpack_object *m, fp4idx_stats_t *st,
                                char *msg, size_t cap) {
  if (m == NULL) return 0;
  if (m->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "errors_by_status: expected a map");
  if (m->via.map.size > FP4IDX_PROTO_MAX_STATUSES)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "errors_by_status: %u entries, at most %u",
                        m->via.map.size, FP4IDX_PROTO_MAX_STATUSES);
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    char name[FP4IDX_PROTO_NAME_CAP];
    uint64_t n;
    int rc;
    if ((rc = fp4idx__get_strcpy(&m->via.map.ptr[i].key, "errors_by_status", "<key>",
                                 name, sizeof name, msg, cap)) ||
        (rc = fp4idx__get_uint(&m->via.map.ptr[i].val, "errors_by_status", name, &n,
                               msg, cap)))
      return rc;
    for (int64_t k = 1; k < FP4IDX_PROTO_MAX_STATUSES; k++)
      if (strcmp(fp4idx_status_name((int)-k), name) == 0) {
        st->status_errors[k] = n;
        break;
      }
  }
  return 0;
}

int fp4idx__stats_resp_decode(const fp4idx__fields_t *f,
                              fp4idx_response_t *resp, char *msg, size_t cap) {
  fp4idx_stats_t *st = &resp->u.stats;
  int rc;
  if ((rc = fp4idx__get_num(fp4idx__fv(f, "uptime_s"), "", "uptime_s",
                            &st->uptime_s, msg, cap)) ||
      (rc = get_uint(f, "connections", &st->connections, msg, cap)) ||
      (rc = get_uint(f, "sequences", &st->sequences, msg, cap)) ||
      (rc = get_uint(f, "keys", &st->keys, msg, cap)) ||
      (rc = get_fixstr(f, "backend", st->backend, sizeof(st->backend), msg,
                       cap)) ||
      (rc = get_fixstr(f, "device", st->device, sizeof(st->device), msg,
                       cap)) ||
      (rc = get_uint(f, "pages_total", &st->pages_total, msg, cap)) ||
      (rc = get_uint(f, "pages_free", &st->pages_free, msg, cap)) ||
      (rc = get_opt_uint(f, "pages_shared", &st->pages_shared, msg, cap)) ||
      (rc = get_opt_fixstr(f, "gpu_sharing", st->gpu_sharing, sizeof(st->gpu_sharing), msg,
                           cap)) ||
      (rc = get_opt_uint(f, "gpu_other_processes", &st->gpu_other_processes, msg, cap)))
    return rc;
  /* Counters and gauges: optional (absent from older daemons), 0 then. */
  static const char *const opt_names[] = {"keys_appended",  "rows_scored",
                                          "request_bytes",  "response_bytes",
                                          "queue_depth",    "device_mem_total",
                                          "device_mem_free"};
  uint64_t *opt[] = {&st->keys_appended, &st->rows_scored, &st->request_bytes,
                     &st->response_bytes, &st->queue_depth,
                     &st->device_mem_total, &st->device_mem_free};
  for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
    if (fp4idx__fv(f, opt_names[i]) && (rc = get_uint(f, opt_names[i], opt[i], msg, cap)))
      return rc;
  if ((rc = decode_status_errors(fp4idx__fv(f, "errors_by_status"), st, msg, cap)))
    return rc;
  const msgpack_object *m = fp4idx__fv(f, "requests");
  const msgpack_object *g = fp4idx__fv(f, "stages"); /* optional: newer daemons */
  if (m == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "requests: missing field");
  if (m->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "requests: expected a map");
  if (g != NULL && g->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "stages: expected a map");
  size_t nr = m->via.map.size, ng = g ? g->via.map.size : 0;
  if (nr > FP4IDX_PROTO_MAX_STATS_OPS || ng > FP4IDX_PROTO_MAX_STATS_OPS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: %zu entries, at most %u",
                        nr > FP4IDX_PROTO_MAX_STATS_OPS ? "requests" : "stages",
                        nr > FP4IDX_PROTO_MAX_STATS_OPS ? nr : ng, FP4IDX_PROTO_MAX_STATS_OPS);
  if (nr + ng == 0) return 0;
  /* one block for both (owned_ holds one pointer) */
  fp4idx_op_stats_t *all = calloc(nr + ng, sizeof(all[0]));
  if (all == NULL) return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory");
  resp->owned_ = all;
  st->nops = nr;
  st->ops = nr ? all : NULL;
  st->nstages = ng;
  st->stages = ng ? all + nr : NULL;
  for (size_t i = 0; i < nr; i++)
    if ((rc = decode_op_stats(&m->via.map.ptr[i], "requests", &st->ops[i], msg, cap)))
      return rc;
  for (size_t i = 0; i < ng; i++)
    if ((rc = decode_op_stats(&g->via.map.ptr[i], "stages", &st->stages[i], msg, cap)))
      return rc;
  return 0;
}

/* A map of counters (stats "requests" or "stages"): name -> {count, errors,
 * latency_us_le, latency_hist, latency_sum_us}. */
static int pack_counters(msgpack_packer *pk, const fp4idx_op_stats_t *v, size_t n) {
  int rc = msgpack_pack_map(pk, n);
  for (size_t i = 0; i < n && rc == 0; i++) {
    const fp4idx_op_stats_t *o = &v[i];
    rc |= fp4idx__pack_strn(pk, o->op, bounded_len(o->op, sizeof(o->op)));
    rc |= msgpack_pack_map(pk, 5);
    rc |= fp4idx__pack_kv_uint(pk, "count", o->count);
    rc |= fp4idx__pack_kv_uint(pk, "errors", o->errors);
    rc |= fp4idx__pack_cstr(pk, "latency_us_le");
    rc |= msgpack_pack_array(pk, o->nbuckets);
    for (uint32_t b = 0; b < o->nbuckets; b++)
      rc |= msgpack_pack_double(pk, o->le_us[b]);
    rc |= fp4idx__pack_cstr(pk, "latency_hist");
    rc |= msgpack_pack_array(pk, o->nbuckets);
    for (uint32_t b = 0; b < o->nbuckets; b++)
      rc |= msgpack_pack_uint64(pk, o->hist[b]);
    rc |= fp4idx__pack_cstr(pk, "latency_sum_us") |
          msgpack_pack_double(pk, o->sum_us);
  }
  return rc;
}

int fp4idx__stats_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  const fp4idx_stats_t *st = &r->u.stats;
  if ((st->ops == NULL && st->nops > 0) || (st->stages == NULL && st->nstages > 0))
    return FP4IDX_EINVAL;
  for (size_t i = 0; i < st->nops; i++)
    if (st->ops[i].nbuckets > FP4IDX_PROTO_MAX_BUCKETS) return FP4IDX_EINVAL;
  for (size_t i = 0; i < st->nstages; i++)
    if (st->stages[i].nbuckets > FP4IDX_PROTO_MAX_BUCKETS) return FP4IDX_EINVAL;
  int rc = fp4idx__pack_resp_head(pk, r, 20 + (st->nstages > 0));
  rc |= fp4idx__pack_cstr(pk, "uptime_s") |
        msgpack_pack_double(pk, st->uptime_s);
  rc |= fp4idx__pack_kv_uint(pk, "connections", st->connections);
  rc |= fp4idx__pack_kv_uint(pk, "sequences", st->sequences);
  rc |= fp4idx__pack_kv_uint(pk, "keys", st->keys);
  rc |= kv_fixstr(pk, "backend", st->backend, sizeof(st->backend));
  rc |= kv_fixstr(pk, "device", st->device, sizeof(st->device));
  rc |= fp4idx__pack_kv_uint(pk, "pages_total", st->pages_total);
  rc |= fp4idx__pack_kv_uint(pk, "pages_free", st->pages_free);
  rc |= fp4idx__pack_kv_uint(pk, "pages_shared", st->pages_shared);
  rc |= fp4idx__pack_kv_uint(pk, "keys_appended", st->keys_appended);
  rc |= fp4idx__pack_kv_uint(pk, "rows_scored", st->rows_scored);
  rc |= fp4idx__pack_kv_uint(pk, "request_bytes", st->request_bytes);
  rc |= fp4idx__pack_kv_uint(pk, "response_bytes", st->response_bytes);
  rc |= fp4idx__pack_kv_uint(pk, "queue_depth", st->queue_depth);
  rc |= fp4idx__pack_kv_uint(pk, "device_mem_total", st->device_mem_total);
  rc |= fp4idx__pack_kv_uint(pk, "device_mem_free", st->device_mem_free);
  rc |= kv_fixstr(pk, "gpu_sharing", st->gpu_sharing, sizeof(st->gpu_sharing));
  rc |= fp4idx__pack_kv_uint(pk, "gpu_other_processes", st->gpu_other_processes);
  uint32_t nerr = 0;
  for (uint32_t k = 1; k < FP4IDX_PROTO_MAX_STATUSES; k++)
    nerr += st->status_errors[k] != 0;
  rc |= fp4idx__pack_cstr(pk, "errors_by_status");
  rc |= msgpack_pack_map(pk, nerr);
  for (uint32_t k = 1; k < FP4IDX_PROTO_MAX_STATUSES; k++)
    if (st->status_errors[k])
      rc |= fp4idx__pack_cstr(pk, fp4idx_status_name(-(int)k)) |
            msgpack_pack_uint64(pk, st->status_errors[k]);
  rc |= fp4idx__pack_cstr(pk, "requests") | pack_counters(pk, st->ops, st->nops);
  if (st->nstages > 0)
    rc |= fp4idx__pack_cstr(pk, "stages") | pack_counters(pk, st->stages, st->nstages);
  return packed(rc);
}

/* ---- list ------------------------------------------------------------------------ */

static int check_list_count(uint64_t n, char *msg, size_t cap) {
  return check_count("count", n, FP4IDX_PROTO_MAX_LIST_COUNT, "the default",
                     msg, cap);
}

int fp4idx__list_req_decode(const fp4idx__fields_t *f, fp4idx_request_t *req,
                            char *msg, size_t cap) {
  fp4idx_list_req_t *l = &req->u.list;
  const msgpack_object *v;
  uint64_t n;
  int rc;
  if ((v = fp4idx__fv(f, "cursor")) != NULL &&
      (rc = fp4idx__get_uint(v, "", "cursor", &l->cursor, msg, cap)) != 0)
    return rc;
  if ((v = fp4idx__fv(f, "count")) != NULL) {
    if ((rc = fp4idx__get_uint(v, "", "count", &n, msg, cap)) ||
        (rc = check_list_count(n, msg, cap)))
      return rc;
    l->count = (uint32_t)n;
  }
  return 0;
}

int fp4idx__list_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  const fp4idx_list_req_t *l = &req->u.list;
  int rc;
  if (l->count > 0 && (rc = check_list_count(l->count, NULL, 0)) != 0)
    return pack_refused(rc);
  rc = fp4idx__pack_req_head(pk, req, 1 + (l->count > 0));
  rc |= fp4idx__pack_kv_uint(pk, "cursor", l->cursor);
  if (l->count > 0) rc |= fp4idx__pack_kv_uint(pk, "count", l->count);
  return packed(rc);
}

int fp4idx__list_resp_decode(const fp4idx__fields_t *f,
                             fp4idx_response_t *resp, char *msg, size_t cap) {
  fp4idx_list_resp_t *l = &resp->u.list;
  int rc;
  if ((rc = get_uint(f, "cursor", &l->cursor, msg, cap)) != 0) return rc;
  const msgpack_object *a = fp4idx__fv(f, "seqs");
  void *p;
  if ((rc = decode_entries(a, "seqs", false, 0, sizeof(l->seqs[0]), resp, &p,
                           &l->nseqs, msg, cap)) != 0)
    return rc;
  l->seqs = p;
  for (size_t i = 0; i < l->nseqs; i++) {
    char path[32];
    fp4idx__field_t ef[] = {{"seq", NULL}, {"keys", NULL}, {"pages", NULL},
                            {"pages_shared", NULL}};
    fp4idx__fields_t es = {ef, NF(ef)};
    fp4idx_list_entry_t *e = &l->seqs[i];
    fp4idx__path_index(path, sizeof(path), "seqs", i);
    if ((rc = fp4idx__map_fields(&a->via.array.ptr[i], path, ef, NF(ef), false,
                                 msg, cap)) ||
        (rc = fp4idx__get_uint(fp4idx__fv(&es, "seq"), path, "seq", &e->seq,
                               msg, cap)) ||
        (rc = fp4idx__get_uint(fp4idx__fv(&es, "keys"), path, "keys", &e->keys,
                               msg, cap)) ||
        (rc = fp4idx__get_uint(fp4idx__fv(&es, "pages"), path, "pages",
                               &e->pages, msg, cap)) ||
        (rc = get_opt_uint(&es, "pages_shared", &e->pages_shared, msg, cap)))
      return rc;
  }
  return 0;
}

int fp4idx__list_resp_pack(msgpack_packer *pk, const fp4idx_response_t *r) {
  const fp4idx_list_resp_t *l = &r->u.list;
  if (l->seqs == NULL && l->nseqs > 0) return FP4IDX_EINVAL;
  int rc = fp4idx__pack_resp_head(pk, r, 2);
  rc |= fp4idx__pack_kv_uint(pk, "cursor", l->cursor);
  rc |= fp4idx__pack_cstr(pk, "seqs");
  rc |= msgpack_pack_array(pk, l->nseqs);
  for (size_t i = 0; i < l->nseqs && rc == 0; i++) {
    rc |= msgpack_pack_map(pk, 4);
    rc |= fp4idx__pack_kv_uint(pk, "seq", l->seqs[i].seq);
    rc |= fp4idx__pack_kv_uint(pk, "keys", l->seqs[i].keys);
    rc |= fp4idx__pack_kv_uint(pk, "pages", l->seqs[i].pages);
    rc |= fp4idx__pack_kv_uint(pk, "pages_shared", l->seqs[i].pages_shared);
  }
  return packed(rc);
}

/* ---- register -------------------------------------------------------------------- */

int fp4idx__register_req_decode(const fp4idx__fields_t *f,
                                fp4idx_request_t *req, char *msg, size_t cap) {
  fp4idx_register_req_t *r = &req->u.register_;
  fp4idx_strview_t kind;
  int rc;
  if ((rc = fp4idx__get_str(fp4idx__fv(f, "kind"), "", "kind", &kind, msg,
                            cap)) != 0)
    return rc;
  if (kind.len == 4 && memcmp(kind.ptr, "host", 4) == 0)
    r->kind = FP4IDX_REGION_HOST;
  else if (kind.len == 4 && memcmp(kind.ptr, "cuda", 4) == 0)
    r->kind = FP4IDX_REGION_CUDA;
  else
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "kind: '%.*s' is not \"host\" or \"cuda\"",
                        kind.len > 16 ? 16 : (int)kind.len, kind.ptr);
  if ((rc = get_uint(f, "size", &r->size, msg, cap)) != 0) return rc;
  if (r->size == 0)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "size: 0, must be >= 1");
  const msgpack_object *h = fp4idx__fv(f, "handle");
  const msgpack_object *d = fp4idx__fv(f, "device");
  if (r->kind == FP4IDX_REGION_HOST) {
    if (h != NULL || d != NULL)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "%s: only for kind \"cuda\" (a host region's fd "
                          "travels as SCM_RIGHTS)",
                          h != NULL ? "handle" : "device");
    return 0;
  }
  if (h == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "handle: missing field");
  if (h->type != MSGPACK_OBJECT_BIN)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "handle: expected bin");
  if (h->via.bin.size != FP4IDX_PROTO_CUDA_HANDLE)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "handle: %u bytes, a cudaIpcMemHandle_t has %u",
                        h->via.bin.size, FP4IDX_PROTO_CUDA_HANDLE);
  r->handle = h->via.bin.ptr;
  r->handle_len = h->via.bin.size;
  return get_uint(f, "device", &r->device, msg, cap);
}

int fp4idx__register_req_pack(msgpack_packer *pk, const fp4idx_request_t *req) {
  const fp4idx_register_req_t *r = &req->u.register_;
  bool cuda = r->kind == FP4IDX_REGION_CUDA;
  if ((r->kind != FP4IDX_REGION_HOST && !cuda) || r->size == 0 ||
      (cuda && (r->handle == NULL ||
                r->handle_len != FP4IDX_PROTO_CUDA_HANDLE)))
    return FP4IDX_EINVAL;
  int rc = fp4idx__pack_req_head(pk, req, cuda ? 4 : 2);
  rc |= fp4idx__pack_cstr(pk, "kind");
  rc |= fp4idx__pack_cstr(pk, cuda ? "cuda" : "host");
  rc |= fp4idx__pack_kv_uint(pk, "size", r->size);
  if (cuda) {
    rc |= fp4idx__pack_cstr(pk, "handle");
    rc |= msgpack_pack_bin(pk, r->handle_len);
    rc |= msgpack_pack_bin_body(pk, r->handle, r->handle_len);
    rc |= fp4idx__pack_kv_uint(pk, "device", r->device);
  }
  return packed(rc);
}

int fp4idx__register_resp_decode(const fp4idx__fields_t *f,
                                 fp4idx_response_t *resp, char *msg,
                                 size_t cap) {
  int rc;
  if ((rc = get_uint(f, "region", &resp->u.register_.region, msg, cap)) ||
      (rc = get_uint(f, "size", &resp->u.register_.size, msg, cap)))
    return rc;
  return 0;
}

int fp4idx__register_resp_pack(msgpack_packer *pk,
                               const fp4idx_response_t *r) {
  int rc = fp4idx__pack_resp_head(pk, r, 2);
  rc |= fp4idx__pack_kv_uint(pk, "region", r->u.register_.region);
  rc |= fp4idx__pack_kv_uint(pk, "size", r->u.register_.size);
  return packed(rc);
}

/* ---- unregister ------------------------------------------------------------------ */

int fp4idx__unregister_req_decode(const fp4idx__fields_t *f,
                                  fp4idx_request_t *req, char *msg,
                                  size_t cap) {
  return get_uint(f, "region", &req->u.unregister.region, msg, cap);
}

int fp4idx__unregister_req_pack(msgpack_packer *pk,
                                const fp4idx_request_t *req) {
  int rc = fp4idx__pack_req_head(pk, req, 1);
  rc |= fp4idx__pack_kv_uint(pk, "region", req->u.unregister.region);
  return packed(rc);
}
