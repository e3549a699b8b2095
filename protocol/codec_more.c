/* codec_more.c -- the escape hatch of the op table (protocol/optable.py):
 * the fields of kind `more`, whose wire form is nested (arrays of maps,
 * maps of counters) or depends on another field, with their codec written
 * by hand. Per op and direction, four functions (codec_gen.h): decode,
 * check (what a packer refuses), count (map entries written) and pack.
 * Everything else of these ops (heads, topk, kind, size, the stats scalars)
 * is generated into codec_gen.c, as are arrays of maps with integer fields
 * (kind `entries`: list's seqs).
 *
 *   score request   seqs (entries with q, w, lens, mask, out)
 *   score response  results (logits, or positions + logits + counts)
 *   stats response  errors_by_status, requests, stages
 *   register        handle and device, present exactly for kind "cuda" */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"

#define NF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- score request: seqs ------------------------------------------------------ */

/* fp4idx__expect_shape for field `field` of map `path`, the wanted shape formatted
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
  return fp4idx__expect_shape(t, where, want, false, msg, cap);
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

static int check_score_nseqs(uint64_t n, char *msg, size_t cap) {
  if (n == 0) return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "seqs: empty");
  if (n > FP4IDX_PROTO_MAX_SCORE_SEQS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "seqs: %llu entries, at most %u",
                        (unsigned long long)n, FP4IDX_PROTO_MAX_SCORE_SEQS);
  return 0;
}

int fp4idx__score_req_more_decode(const fp4idx__fields_t *f, fp4idx_score_req_t *sc,
                                  void **owned, char *msg, size_t cap) {
  int rc;
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
  *owned = sc->seqs;
  sc->nseqs = a->via.array.size;
  for (size_t i = 0; i < sc->nseqs; i++)
    if ((rc = decode_score_seq(&a->via.array.ptr[i], i, sc->heads,
                               sc->topk > 0, &sc->seqs[i], msg, cap)) != 0)
      return rc;
  return 0;
}

/* What the decoder would check of the entries of a score request built by
 * hand (heads and topk are the generated codec's). */
int fp4idx__score_req_more_check(const fp4idx_score_req_t *sc) {
  int rc;
  if (sc->seqs == NULL && sc->nseqs > 0) return FP4IDX_EINVAL;
  if ((rc = check_score_nseqs(sc->nseqs, NULL, 0))) return rc;
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

size_t fp4idx__score_req_more_count(const fp4idx_score_req_t *sc) {
  (void)sc;
  return 1;
}

int fp4idx__score_req_more_pack(msgpack_packer *pk, const fp4idx_score_req_t *sc) {
  int rc = fp4idx__pack_cstr(pk, "seqs");
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
  return rc;
}

/* ---- score response: results ---------------------------------------------------- */

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
  if ((rc = fp4idx__expect_shape(&r->logits, where, "f32 [R,W] or f32 [R,k]",
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
  if ((rc = fp4idx__expect_shape(&r->positions, where, "i32 [R,k] like logits",
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
  return fp4idx__expect_shape(&r->counts, where, "i32 [R]",
                              r->counts.dtype == FP4IDX_WIRE_I32 &&
                                  r->counts.ndim == 1 &&
                                  r->counts.shape[0] == r->logits.shape[0],
                              msg, cap);
}

int fp4idx__score_resp_more_decode(const fp4idx__fields_t *f, fp4idx_score_resp_t *sc,
                                   void **owned, char *msg, size_t cap) {
  const msgpack_object *a = fp4idx__fv(f, "results");
  int rc;
  void *p;
  if ((rc = fp4idx__decode_entries(a, "results", false, FP4IDX_PROTO_MAX_SCORE_SEQS,
                           sizeof(sc->results[0]), owned, &p, &sc->nresults,
                           msg, cap)) != 0)
    return rc;
  sc->results = p;
  for (size_t i = 0; i < sc->nresults; i++)
    if ((rc = decode_result(&a->via.array.ptr[i], i, &sc->results[i], msg,
                            cap)) != 0)
      return rc;
  return 0;
}

int fp4idx__score_resp_more_check(const fp4idx_score_resp_t *sc) {
  if (sc->results == NULL && sc->nresults > 0) return FP4IDX_EINVAL;
  for (size_t i = 0; i < sc->nresults; i++) {
    const fp4idx_score_result_t *x = &sc->results[i];
    if (!fp4idx__tensor_sane(&x->logits) ||
        (x->topk && (!fp4idx__tensor_sane(&x->positions) ||
                     !fp4idx__tensor_sane(&x->counts))))
      return FP4IDX_EINVAL;
  }
  return 0;
}

size_t fp4idx__score_resp_more_count(const fp4idx_score_resp_t *sc) {
  (void)sc;
  return 1;
}

int fp4idx__score_resp_more_pack(msgpack_packer *pk, const fp4idx_score_resp_t *sc) {
  int rc = fp4idx__pack_cstr(pk, "results");
  rc |= msgpack_pack_array(pk, sc->nresults);
  for (size_t i = 0; i < sc->nresults && rc == 0; i++) {
    const fp4idx_score_result_t *x = &sc->results[i];
    rc |= msgpack_pack_map(pk, x->topk ? 4 : 2);
    rc |= fp4idx__pack_kv_uint(pk, "seq", x->seq);
    if (x->topk) rc |= fp4idx__pack_kv_tensor(pk, "positions", &x->positions);
    rc |= fp4idx__pack_kv_tensor(pk, "logits", &x->logits);
    if (x->topk) rc |= fp4idx__pack_kv_tensor(pk, "counts", &x->counts);
  }
  return rc;
}

/* ---- stats response: errors_by_status, requests, stages ---------------------------- */

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

int fp4idx__stats_resp_more_decode(const fp4idx__fields_t *f, fp4idx_stats_t *st,
                                   void **owned, char *msg, size_t cap) {
  int rc;
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
  /* one block for both (owned holds one pointer) */
  fp4idx_op_stats_t *all = calloc(nr + ng, sizeof(all[0]));
  if (all == NULL) return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory");
  *owned = all;
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

int fp4idx__stats_resp_more_check(const fp4idx_stats_t *st) {
  if ((st->ops == NULL && st->nops > 0) || (st->stages == NULL && st->nstages > 0))
    return FP4IDX_EINVAL;
  for (size_t i = 0; i < st->nops; i++)
    if (st->ops[i].nbuckets > FP4IDX_PROTO_MAX_BUCKETS) return FP4IDX_EINVAL;
  for (size_t i = 0; i < st->nstages; i++)
    if (st->stages[i].nbuckets > FP4IDX_PROTO_MAX_BUCKETS) return FP4IDX_EINVAL;
  return 0;
}

size_t fp4idx__stats_resp_more_count(const fp4idx_stats_t *st) {
  return 2 + (st->nstages > 0);
}

/* A map of counters (stats "requests" or "stages"): name -> {count, errors,
 * latency_us_le, latency_hist, latency_sum_us}. */
static int pack_counters(msgpack_packer *pk, const fp4idx_op_stats_t *v, size_t n) {
  int rc = msgpack_pack_map(pk, n);
  for (size_t i = 0; i < n && rc == 0; i++) {
    const fp4idx_op_stats_t *o = &v[i];
    rc |= fp4idx__pack_strn(pk, o->op, fp4idx__bounded_len(o->op, sizeof(o->op)));
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

int fp4idx__stats_resp_more_pack(msgpack_packer *pk, const fp4idx_stats_t *st) {
  uint32_t nerr = 0;
  for (uint32_t k = 1; k < FP4IDX_PROTO_MAX_STATUSES; k++)
    nerr += st->status_errors[k] != 0;
  int rc = fp4idx__pack_cstr(pk, "errors_by_status");
  rc |= msgpack_pack_map(pk, nerr);
  for (uint32_t k = 1; k < FP4IDX_PROTO_MAX_STATUSES; k++)
    if (st->status_errors[k])
      rc |= fp4idx__pack_cstr(pk, fp4idx_status_name(-(int)k)) |
            msgpack_pack_uint64(pk, st->status_errors[k]);
  rc |= fp4idx__pack_cstr(pk, "requests") | pack_counters(pk, st->ops, st->nops);
  if (st->nstages > 0)
    rc |= fp4idx__pack_cstr(pk, "stages") | pack_counters(pk, st->stages, st->nstages);
  return rc;
}

/* ---- register request: handle and device --------------------------------------------- */

int fp4idx__register_req_more_decode(const fp4idx__fields_t *f, fp4idx_register_req_t *r,
                                     void **owned, char *msg, size_t cap) {
  (void)owned;
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
  return fp4idx__get_uint(d, "", "device", &r->device, msg, cap);
}

int fp4idx__register_req_more_check(const fp4idx_register_req_t *r) {
  if (r->kind == FP4IDX_REGION_CUDA &&
      (r->handle == NULL || r->handle_len != FP4IDX_PROTO_CUDA_HANDLE))
    return FP4IDX_EINVAL;
  return 0;
}

size_t fp4idx__register_req_more_count(const fp4idx_register_req_t *r) {
  return r->kind == FP4IDX_REGION_CUDA ? 2 : 0;
}

int fp4idx__register_req_more_pack(msgpack_packer *pk, const fp4idx_register_req_t *r) {
  if (r->kind != FP4IDX_REGION_CUDA) return 0;
  int rc = fp4idx__pack_cstr(pk, "handle");
  rc |= msgpack_pack_bin(pk, r->handle_len);
  rc |= msgpack_pack_bin_body(pk, r->handle, r->handle_len);
  rc |= fp4idx__pack_kv_uint(pk, "device", r->device);
  return rc;
}
