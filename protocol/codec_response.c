/* codec_response.c -- responses: encoders (daemon side) and the strict
 * decoder (client side). Response decoding ignores unknown keys so that a
 * newer daemon may add fields; everything the client reads is checked. */
#include <stdio.h>
#include <stdlib.h>

#include "codec_internal.h"

/* strnlen is POSIX, not C11 */
static size_t bounded_len(const char *s, size_t cap) {
  const char *z = memchr(s, 0, cap);
  return z ? (size_t)(z - s) : cap;
}

#define NF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- decoding ----------------------------------------------------------------- */

static int bad_shape(const fp4idx_tensor_t *t, const char *where,
                     const char *want, char *msg, size_t cap) {
  char desc[96];
  return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "%s: got %s, expected %s",
                      where, fp4idx__tensor_desc(t, desc, sizeof(desc)), want);
}

static int decode_result(const msgpack_object *o, size_t i,
                         fp4idx_score_result_t *r, char *msg, size_t cap) {
  char path[32], where[48];
  fp4idx__field_t f[] = {{"seq", NULL}, {"logits", NULL}, {"positions", NULL},
                         {"counts", NULL}};
  int rc;

  snprintf(path, sizeof(path), "results[%zu]", i);
  if ((rc = fp4idx__map_fields(o, path, f, NF(f), false, msg, cap)) != 0)
    return rc;
  if ((rc = fp4idx__get_uint(f[0].val, path, "seq", &r->seq, msg, cap)) != 0)
    return rc;
  if ((rc = fp4idx__get_tensor(f[1].val, path, "logits", false, &r->logits,
                               msg, cap)) != 0)
    return rc;
  snprintf(where, sizeof(where), "%s.logits", path);
  if (r->logits.dtype != FP4IDX_WIRE_F32 || r->logits.ndim != 2)
    return bad_shape(&r->logits, where, "f32 [R,W] or f32 [R,k]", msg, cap);
  if (f[2].val == NULL && f[3].val == NULL) return 0;

  r->topk = true;
  if ((rc = fp4idx__get_tensor(f[2].val, path, "positions", false,
                               &r->positions, msg, cap)) != 0)
    return rc;
  snprintf(where, sizeof(where), "%s.positions", path);
  if (r->positions.dtype != FP4IDX_WIRE_I32 || r->positions.ndim != 2 ||
      r->positions.shape[0] != r->logits.shape[0] ||
      r->positions.shape[1] != r->logits.shape[1])
    return bad_shape(&r->positions, where, "i32 [R,k] like logits", msg, cap);
  if ((rc = fp4idx__get_tensor(f[3].val, path, "counts", false, &r->counts,
                               msg, cap)) != 0)
    return rc;
  snprintf(where, sizeof(where), "%s.counts", path);
  if (r->counts.dtype != FP4IDX_WIRE_I32 || r->counts.ndim != 1 ||
      r->counts.shape[0] != r->logits.shape[0])
    return bad_shape(&r->counts, where, "i32 [R]", msg, cap);
  return 0;
}

static int decode_score(const msgpack_object *root, fp4idx_response_t *resp,
                        char *msg, size_t cap) {
  const msgpack_object *a = fp4idx__map_get(root, "results");
  fp4idx_score_resp_t *sc = &resp->u.score;
  int rc;

  if (a == NULL || a->type == MSGPACK_OBJECT_NIL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "results: missing field");
  if (a->type != MSGPACK_OBJECT_ARRAY)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "results: expected an array of maps");
  if (a->via.array.size > FP4IDX_PROTO_MAX_SCORE_SEQS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG,
                        "results: %u entries, at most %u", a->via.array.size,
                        FP4IDX_PROTO_MAX_SCORE_SEQS);
  if (a->via.array.size == 0) return 0;
  sc->results = calloc(a->via.array.size, sizeof(sc->results[0]));
  if (sc->results == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory");
  resp->owned_ = sc->results;
  sc->nresults = a->via.array.size;
  for (size_t i = 0; i < sc->nresults; i++)
    if ((rc = decode_result(&a->via.array.ptr[i], i, &sc->results[i], msg,
                            cap)) != 0)
      return rc;
  return 0;
}

/* One entry of "requests" or "stages" (`what`): the same counters. */
static int decode_op_stats(const msgpack_object_kv *kv, const char *what,
                           fp4idx_op_stats_t *s, char *msg, size_t cap) {
  char path[96];
  fp4idx__field_t f[] = {{"count", NULL},         {"errors", NULL},
                         {"latency_us_le", NULL}, {"latency_hist", NULL},
                         {"latency_sum_us", NULL}};
  int rc;

  if ((rc = fp4idx__get_strcpy(&kv->key, what, "<key>", s->op,
                               sizeof(s->op), msg, cap)) != 0)
    return rc;
  snprintf(path, sizeof(path), "%s.%s", what, s->op);
  if ((rc = fp4idx__map_fields(&kv->val, path, f, NF(f), false, msg, cap)))
    return rc;
  if ((rc = fp4idx__get_uint(f[0].val, path, "count", &s->count, msg, cap)) ||
      (rc = fp4idx__get_uint(f[1].val, path, "errors", &s->errors, msg, cap)) ||
      (rc = fp4idx__get_num(f[4].val, path, "latency_sum_us", &s->sum_us, msg,
                            cap)))
    return rc;
  const msgpack_object *le = f[2].val, *h = f[3].val;
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
                        path,
                        le->via.array.size, h->via.array.size);
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

static int decode_stats(fp4idx__field_t *f, fp4idx_response_t *resp,
                        char *msg, size_t cap) {
  fp4idx_stats_t *st = &resp->u.stats;
  int rc;
  if ((rc = fp4idx__get_num(f[0].val, "", "uptime_s", &st->uptime_s, msg,
                            cap)) ||
      (rc = fp4idx__get_uint(f[1].val, "", "connections", &st->connections,
                             msg, cap)) ||
      (rc = fp4idx__get_uint(f[2].val, "", "sequences", &st->sequences, msg,
                             cap)) ||
      (rc = fp4idx__get_uint(f[3].val, "", "keys", &st->keys, msg, cap)) ||
      (rc = fp4idx__get_strcpy(f[4].val, "", "backend", st->backend,
                               sizeof(st->backend), msg, cap)) ||
      (rc = fp4idx__get_strcpy(f[5].val, "", "device", st->device,
                               sizeof(st->device), msg, cap)) ||
      (rc = fp4idx__get_uint(f[6].val, "", "pages_total", &st->pages_total,
                             msg, cap)) ||
      (rc = fp4idx__get_uint(f[7].val, "", "pages_free", &st->pages_free, msg,
                             cap)))
    return rc;
  const msgpack_object *m = f[8].val, *g = f[9].val;
  if (m == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "requests: missing field");
  if (m->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "requests: expected a map");
  if (m->via.map.size > FP4IDX_PROTO_MAX_STATS_OPS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG,
                        "requests: %u entries, at most %u", m->via.map.size,
                        FP4IDX_PROTO_MAX_STATS_OPS);
  /* "stages" is optional (daemons before it did not send it) */
  if (g != NULL && g->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "stages: expected a map");
  size_t ng = g != NULL ? g->via.map.size : 0;
  if (ng > FP4IDX_PROTO_MAX_STATS_OPS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG,
                        "stages: %zu entries, at most %u", ng,
                        FP4IDX_PROTO_MAX_STATS_OPS);
  if (m->via.map.size + ng == 0) return 0;
  /* one block for both (owned_ holds one pointer) */
  fp4idx_op_stats_t *all = calloc(m->via.map.size + ng, sizeof(all[0]));
  if (all == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory");
  resp->owned_ = all;
  st->nops = m->via.map.size;
  st->ops = st->nops ? all : NULL;
  st->nstages = ng;
  st->stages = ng ? all + st->nops : NULL;
  for (size_t i = 0; i < st->nops; i++)
    if ((rc = decode_op_stats(&m->via.map.ptr[i], "requests", &st->ops[i],
                              msg, cap)))
      return rc;
  for (size_t i = 0; i < ng; i++)
    if ((rc = decode_op_stats(&g->via.map.ptr[i], "stages", &st->stages[i],
                              msg, cap)))
      return rc;
  return 0;
}

static int decode_body(const msgpack_object *root, fp4idx_response_t *resp,
                       char *msg, size_t cap) {
  int rc = 0;
  switch (resp->op) {
    case FP4IDX_OP_HELLO: {
      fp4idx__field_t f[] = {{"version", NULL}, {"server", NULL}};
      if ((rc = fp4idx__map_fields(root, "", f, NF(f), false, msg, cap)) ||
          (rc = fp4idx__get_uint(f[0].val, "", "version",
                                 &resp->u.hello.version, msg, cap)) ||
          (rc = fp4idx__get_strcpy(f[1].val, "", "server",
                                   resp->u.hello.server,
                                   sizeof(resp->u.hello.server), msg, cap)))
        return rc;
      return 0;
    }
    case FP4IDX_OP_INFO: {
      fp4idx_info_t *in = &resp->u.info;
      fp4idx__field_t f[] = {
          {"version", NULL},     {"server", NULL},     {"backend", NULL},
          {"device", NULL},      {"page_size", NULL},  {"pages_total", NULL},
          {"pages_free", NULL},  {"sequences", NULL},  {"max_frame", NULL}};
      if ((rc = fp4idx__map_fields(root, "", f, NF(f), false, msg, cap)) ||
          (rc = fp4idx__get_uint(f[0].val, "", "version", &in->version, msg,
                                 cap)) ||
          (rc = fp4idx__get_strcpy(f[1].val, "", "server", in->server,
                                   sizeof(in->server), msg, cap)) ||
          (rc = fp4idx__get_strcpy(f[2].val, "", "backend", in->backend,
                                   sizeof(in->backend), msg, cap)) ||
          (rc = fp4idx__get_strcpy(f[3].val, "", "device", in->device,
                                   sizeof(in->device), msg, cap)) ||
          (rc = fp4idx__get_uint(f[4].val, "", "page_size", &in->page_size,
                                 msg, cap)) ||
          (rc = fp4idx__get_uint(f[5].val, "", "pages_total",
                                 &in->pages_total, msg, cap)) ||
          (rc = fp4idx__get_uint(f[6].val, "", "pages_free", &in->pages_free,
                                 msg, cap)) ||
          (rc = fp4idx__get_uint(f[7].val, "", "sequences", &in->sequences,
                                 msg, cap)) ||
          (rc = fp4idx__get_uint(f[8].val, "", "max_frame", &in->max_frame,
                                 msg, cap)))
        return rc;
      return 0;
    }
    case FP4IDX_OP_APPEND: {
      fp4idx__field_t f[] = {{"first", NULL}, {"length", NULL}};
      if ((rc = fp4idx__map_fields(root, "", f, NF(f), false, msg, cap)) ||
          (rc = fp4idx__get_uint(f[0].val, "", "first", &resp->u.append.first,
                                 msg, cap)) ||
          (rc = fp4idx__get_uint(f[1].val, "", "length",
                                 &resp->u.append.length, msg, cap)))
        return rc;
      return 0;
    }
    case FP4IDX_OP_SCORE: return decode_score(root, resp, msg, cap);
    case FP4IDX_OP_TRUNCATE:
      return fp4idx__get_uint(fp4idx__map_get(root, "length"), "", "length",
                              &resp->u.truncate.length, msg, cap);
    case FP4IDX_OP_READ: {
      fp4idx_tensor_t *k = &resp->u.read.keys;
      const msgpack_object *v = fp4idx__map_get(root, "keys");
      if (v != NULL && v->type == MSGPACK_OBJECT_NIL) v = NULL;
      if ((rc = fp4idx__get_tensor(v, "", "keys", false, k, msg, cap)))
        return rc;
      if (k->ndim != 2 ||
          !((k->dtype == FP4IDX_WIRE_U8 &&
             k->shape[1] == FP4IDX_PROTO_SLOT_BYTES) ||
            (k->dtype == FP4IDX_WIRE_F32 &&
             k->shape[1] == FP4IDX_PROTO_HEAD_DIM)))
        return bad_shape(k, "keys", "u8 [n,68] or f32 [n,128]", msg, cap);
      return 0;
    }
    case FP4IDX_OP_STATS: {
      fp4idx__field_t f[] = {
          {"uptime_s", NULL},    {"connections", NULL}, {"sequences", NULL},
          {"keys", NULL},        {"backend", NULL},     {"device", NULL},
          {"pages_total", NULL}, {"pages_free", NULL},  {"requests", NULL},
          {"stages", NULL}};
      if ((rc = fp4idx__map_fields(root, "", f, NF(f), false, msg, cap)))
        return rc;
      return decode_stats(f, resp, msg, cap);
    }
    case FP4IDX_OP_DROP:
    case FP4IDX_OP_SAVE: return 0;
    default:
      return fp4idx__fail(msg, cap, FP4IDX_EINVAL, "unknown op %d",
                          (int)resp->op);
  }
}

int fp4idx_decode_response(const void *body, size_t len, fp4idx_op_t op,
                           fp4idx_response_t *resp, char *msg, size_t cap) {
  msgpack_unpacked up;
  int rc;

  if (msg != NULL && cap > 0) msg[0] = '\0';
  if (resp == NULL) return FP4IDX_EINVAL;
  memset(resp, 0, sizeof(*resp));
  resp->op = op;
  if ((body == NULL && len > 0) || (int)op <= FP4IDX_OP_NONE ||
      op >= FP4IDX_OP__COUNT)
    return fp4idx__fail(msg, cap, FP4IDX_EINVAL, "bad arguments");

  msgpack_unpacked_init(&up);
  if ((rc = fp4idx__mp_parse(body, len, &up, msg, cap)) != 0) goto out;
  const msgpack_object *root = &up.data;
  fp4idx__field_t f[] = {{"id", NULL}, {"status", NULL}, {"error", NULL}};
  int64_t status;
  if ((rc = fp4idx__map_fields(root, "", f, NF(f), false, msg, cap)) ||
      (rc = fp4idx__get_uint(f[0].val, "", "id", &resp->id, msg, cap)) ||
      (rc = fp4idx__get_int(f[1].val, "", "status", &status, msg, cap)))
    goto out;
  if (status > 0 || status < INT32_MIN) {
    rc = fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                      "status: %lld, expected 0 or a negative code",
                      (long long)status);
    goto out;
  }
  resp->status = (int)status;
  if (status < 0) {
    /* an error reply: only the message matters */
    if (f[2].val != NULL)
      rc = fp4idx__get_strcpy(f[2].val, "", "error", resp->error,
                              sizeof(resp->error), msg, cap);
    else
      snprintf(resp->error, sizeof(resp->error), "%s",
               fp4idx_strerror(resp->status));
    goto out;
  }
  rc = decode_body(root, resp, msg, cap);
out:
  msgpack_unpacked_destroy(&up);
  return rc;
}

void fp4idx_response_clear(fp4idx_response_t *resp) {
  if (resp == NULL) return;
  free(resp->owned_);
  memset(resp, 0, sizeof(*resp));
}

/* ---- encoding ----------------------------------------------------------------- */

static int kv_uint(msgpack_packer *pk, const char *k, uint64_t v) {
  return fp4idx__pack_cstr(pk, k) | msgpack_pack_uint64(pk, v);
}
static int kv_tensor(msgpack_packer *pk, const char *k,
                     const fp4idx_tensor_t *t) {
  return fp4idx__pack_cstr(pk, k) | fp4idx__pack_tensor(pk, t);
}

/* What the packer relies on; the decoder re-checks the rest afterwards. */
static bool response_sane(const fp4idx_response_t *r) {
  switch (r->op) {
    case FP4IDX_OP_SCORE:
      if (r->u.score.results == NULL && r->u.score.nresults > 0) return false;
      for (size_t i = 0; i < r->u.score.nresults; i++) {
        const fp4idx_score_result_t *x = &r->u.score.results[i];
        if (!fp4idx__tensor_sane(&x->logits) ||
            (x->topk && (!fp4idx__tensor_sane(&x->positions) ||
                         !fp4idx__tensor_sane(&x->counts))))
          return false;
      }
      return true;
    case FP4IDX_OP_READ: return fp4idx__tensor_sane(&r->u.read.keys);
    case FP4IDX_OP_STATS:
      if (r->u.stats.ops == NULL && r->u.stats.nops > 0) return false;
      if (r->u.stats.stages == NULL && r->u.stats.nstages > 0) return false;
      for (size_t i = 0; i < r->u.stats.nops; i++)
        if (r->u.stats.ops[i].nbuckets > FP4IDX_PROTO_MAX_BUCKETS) return false;
      for (size_t i = 0; i < r->u.stats.nstages; i++)
        if (r->u.stats.stages[i].nbuckets > FP4IDX_PROTO_MAX_BUCKETS)
          return false;
      return true;
    case FP4IDX_OP_HELLO: case FP4IDX_OP_INFO: case FP4IDX_OP_APPEND:
    case FP4IDX_OP_TRUNCATE: case FP4IDX_OP_DROP: case FP4IDX_OP_SAVE:
      return true;
    default: return false;
  }
}

/* Strings of the fixed arrays are packed up to their NUL (or the array end,
 * if a caller forgot the NUL). */
static int kv_fixstr(msgpack_packer *pk, const char *k, const char *v,
                     size_t cap) {
  return fp4idx__pack_cstr(pk, k) | fp4idx__pack_strn(pk, v, bounded_len(v, cap));
}

/* A map of counters (stats "requests" or "stages"): name -> {count, errors,
 * latency_us_le, latency_hist, latency_sum_us}. */
static int pack_counters(msgpack_packer *pk, const fp4idx_op_stats_t *v,
                         size_t n) {
  int rc = msgpack_pack_map(pk, n);
  for (size_t i = 0; i < n && rc == 0; i++) {
    const fp4idx_op_stats_t *o = &v[i];
    rc |= fp4idx__pack_strn(pk, o->op, bounded_len(o->op, sizeof(o->op)));
    rc |= msgpack_pack_map(pk, 5);
    rc |= kv_uint(pk, "count", o->count);
    rc |= kv_uint(pk, "errors", o->errors);
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

static int pack_response(msgpack_packer *pk, const fp4idx_response_t *r) {
  static const unsigned nfields[FP4IDX_OP__COUNT] = {
      [FP4IDX_OP_HELLO] = 2,    [FP4IDX_OP_INFO] = 9, [FP4IDX_OP_APPEND] = 2,
      [FP4IDX_OP_SCORE] = 1,    [FP4IDX_OP_TRUNCATE] = 1,
      [FP4IDX_OP_READ] = 1,     [FP4IDX_OP_STATS] = 9};
  int rc = 0;
  unsigned extra = r->op == FP4IDX_OP_STATS && r->u.stats.nstages > 0;

  rc |= msgpack_pack_map(pk, 2 + nfields[r->op] + extra);
  rc |= kv_uint(pk, "id", r->id);
  rc |= fp4idx__pack_cstr(pk, "status") | msgpack_pack_int(pk, 0);
  switch (r->op) {
    case FP4IDX_OP_HELLO:
      rc |= kv_uint(pk, "version", r->u.hello.version);
      rc |= kv_fixstr(pk, "server", r->u.hello.server,
                      sizeof(r->u.hello.server));
      break;
    case FP4IDX_OP_INFO: {
      const fp4idx_info_t *in = &r->u.info;
      rc |= kv_uint(pk, "version", in->version);
      rc |= kv_fixstr(pk, "server", in->server, sizeof(in->server));
      rc |= kv_fixstr(pk, "backend", in->backend, sizeof(in->backend));
      rc |= kv_fixstr(pk, "device", in->device, sizeof(in->device));
      rc |= kv_uint(pk, "page_size", in->page_size);
      rc |= kv_uint(pk, "pages_total", in->pages_total);
      rc |= kv_uint(pk, "pages_free", in->pages_free);
      rc |= kv_uint(pk, "sequences", in->sequences);
      rc |= kv_uint(pk, "max_frame", in->max_frame);
      break;
    }
    case FP4IDX_OP_APPEND:
      rc |= kv_uint(pk, "first", r->u.append.first);
      rc |= kv_uint(pk, "length", r->u.append.length);
      break;
    case FP4IDX_OP_SCORE:
      rc |= fp4idx__pack_cstr(pk, "results");
      rc |= msgpack_pack_array(pk, r->u.score.nresults);
      for (size_t i = 0; i < r->u.score.nresults && rc == 0; i++) {
        const fp4idx_score_result_t *x = &r->u.score.results[i];
        rc |= msgpack_pack_map(pk, x->topk ? 4 : 2);
        rc |= kv_uint(pk, "seq", x->seq);
        if (x->topk) rc |= kv_tensor(pk, "positions", &x->positions);
        rc |= kv_tensor(pk, "logits", &x->logits);
        if (x->topk) rc |= kv_tensor(pk, "counts", &x->counts);
      }
      break;
    case FP4IDX_OP_TRUNCATE:
      rc |= kv_uint(pk, "length", r->u.truncate.length);
      break;
    case FP4IDX_OP_READ:
      rc |= kv_tensor(pk, "keys", &r->u.read.keys);
      break;
    case FP4IDX_OP_STATS: {
      const fp4idx_stats_t *st = &r->u.stats;
      rc |= fp4idx__pack_cstr(pk, "uptime_s") |
            msgpack_pack_double(pk, st->uptime_s);
      rc |= kv_uint(pk, "connections", st->connections);
      rc |= kv_uint(pk, "sequences", st->sequences);
      rc |= kv_uint(pk, "keys", st->keys);
      rc |= kv_fixstr(pk, "backend", st->backend, sizeof(st->backend));
      rc |= kv_fixstr(pk, "device", st->device, sizeof(st->device));
      rc |= kv_uint(pk, "pages_total", st->pages_total);
      rc |= kv_uint(pk, "pages_free", st->pages_free);
      rc |= fp4idx__pack_cstr(pk, "requests") |
            pack_counters(pk, st->ops, st->nops);
      if (st->nstages > 0)
        rc |= fp4idx__pack_cstr(pk, "stages") |
              pack_counters(pk, st->stages, st->nstages);
      break;
    }
    default: break; /* drop, save: no fields */
  }
  return rc;
}

int fp4idx_encode_response(msgpack_sbuffer *sb,
                           const fp4idx_response_t *resp) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (sb == NULL || resp == NULL || resp->status != 0 ||
      !response_sane(resp))
    return FP4IDX_EINVAL;
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  /* the struct was checked: a packer failure means the buffer did not grow */
  rc = pack_response(&pk, resp) != 0 ? FP4IDX_ENOMEM : 0;
  if ((rc = fp4idx__frame_end(sb, start, rc)) != 0) return rc;

  /* what we send must decode: run the client's decoder over it */
  fp4idx_response_t chk;
  rc = fp4idx_decode_response(sb->data + start + 4, sb->size - start - 4,
                              resp->op, &chk, NULL, 0);
  fp4idx_response_clear(&chk);
  if (rc != 0) {
    sb->size = start;
    return rc == FP4IDX_ENOMEM || rc == FP4IDX_E2BIG ? rc : FP4IDX_EINVAL;
  }
  return 0;
}

/* The split encoder's packer output: bytes go to the sbuffer, except the
 * bin bodies of the score-result tensors (msgpack-c hands the packer's
 * callback the caller's own pointer for them), which are noted instead. */
typedef struct split_s {
  msgpack_sbuffer *sb;
  const fp4idx_score_resp_t *sc;
  size_t min;
  fp4idx_payload_t *out;
  size_t cap, n, bytes;
  int overflow;
} split_t;

static int split_is_result(const split_t *sp, const char *buf, size_t len) {
  for (size_t i = 0; i < sp->sc->nresults; i++) {
    const fp4idx_score_result_t *x = &sp->sc->results[i];
    const fp4idx_tensor_t *t[3] = {&x->logits, &x->positions, &x->counts};
    for (int k = 0; k < (x->topk ? 3 : 1); k++)
      if (t[k]->data == (const void *)buf && t[k]->nbytes == len) return 1;
  }
  return 0;
}

static int split_write(void *data, const char *buf, size_t len) {
  split_t *sp = data;
  if (len == 0 || len < sp->min || !split_is_result(sp, buf, len))
    return msgpack_sbuffer_write(sp->sb, buf, len);
  if (sp->n == sp->cap) {
    sp->overflow = 1;
    return -1;
  }
  sp->out[sp->n++] = (fp4idx_payload_t){sp->sb->size, buf, len};
  sp->bytes += len;
  return 0;
}

int fp4idx_encode_response_split(msgpack_sbuffer *sb,
                                 const fp4idx_response_t *resp,
                                 size_t min_split, fp4idx_payload_t *out,
                                 size_t cap, size_t *n) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (n != NULL) *n = 0;
  if (sb == NULL || resp == NULL || n == NULL || (cap > 0 && out == NULL) ||
      resp->status != 0 || !response_sane(resp))
    return FP4IDX_EINVAL;
  if (resp->op != FP4IDX_OP_SCORE) return fp4idx_encode_response(sb, resp);
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  split_t sp = {.sb = sb, .sc = &resp->u.score, .min = min_split ? min_split : 1,
                .out = out, .cap = cap};
  msgpack_packer_init(&pk, &sp, split_write);
  rc = pack_response(&pk, resp) != 0 ? (sp.overflow ? FP4IDX_EINVAL : FP4IDX_ENOMEM) : 0;
  size_t body = sb->size - start - 4 + sp.bytes;
  if (rc == 0 && (body < sp.bytes || body > FP4IDX_MAX_FRAME_LIMIT))
    rc = FP4IDX_E2BIG;
  if (rc != 0) {
    sb->size = start;
    return rc;
  }
  fp4idx_frame_header_put((unsigned char *)sb->data + start, (uint32_t)body);
  *n = sp.n;
  return 0;
}

int fp4idx_encode_error(msgpack_sbuffer *sb, uint64_t id, int status,
                        const char *message) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (sb == NULL || status >= 0) return FP4IDX_EINVAL;
  if (message == NULL) message = fp4idx_strerror(status);
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  rc = msgpack_pack_map(&pk, 3);
  rc |= kv_uint(&pk, "id", id);
  rc |= fp4idx__pack_cstr(&pk, "status") | msgpack_pack_int(&pk, status);
  /* messages may quote client bytes (an unknown op name) and get cut at the
   * cap: send printable ASCII only, so the str is always valid UTF-8 (Python
   * clients decode str as UTF-8 and would fail on a cut sequence) */
  char clean[FP4IDX_PROTO_ERROR_CAP];
  size_t n = bounded_len(message, FP4IDX_PROTO_ERROR_CAP - 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)message[i];
    clean[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  rc |= fp4idx__pack_cstr(&pk, "error");
  rc |= fp4idx__pack_strn(&pk, clean, n);
  return fp4idx__frame_end(sb, start, rc != 0 ? FP4IDX_ENOMEM : 0);
}
