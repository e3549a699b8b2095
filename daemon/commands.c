/* commands.c -- one request from decoded frame to response frame (see
 * commands.h). Every check happens before anything changes: a bad request
 * gets a clear error and leaves the cache as it was. */
#define _GNU_SOURCE
#include "commands.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "fp4idx_codec.h"
#include "log.h"

#define FP4IDX_CMD_MSG 320

/* Formats an error message into msg and returns status. */
static int fp4idx__cmd_fail(char *msg, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fp4idx__cmd_fail(char *msg, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, FP4IDX_CMD_MSG, fmt, ap);
  va_end(ap);
  return status;
}

/* Copies a tensor's bytes into malloc'd (aligned) memory: codec views point
 * into the frame at any byte offset, backends want naturally aligned arrays. */
static void *fp4idx__cmd_aligned(const fp4idx_tensor_t *t) {
  void *p = malloc(t->nbytes ? t->nbytes : 1);
  if (p && t->nbytes) memcpy(p, t->data, t->nbytes);
  return p;
}

/* The tensor's bytes in place when they happen to sit at an address aligned
 * for their element type (*copy = NULL), else an aligned copy (*copy = it,
 * the caller frees it). NULL only when the copy fails. */
static const void *fp4idx__cmd_in_place(const fp4idx_tensor_t *t, void **copy) {
  size_t a = fp4idx_wire_dtype_size(t->dtype);
  *copy = NULL;
  if (t->nbytes && a && ((uintptr_t)t->data % a) == 0) return t->data;
  *copy = fp4idx__cmd_aligned(t);
  return *copy;
}

/* ---- ops ---------------------------------------------------------------- */

static int fp4idx__cmd_hello(fp4idx_daemon_t *d, const fp4idx_request_t *req,
                             fp4idx_response_t *resp, char *msg) {
  (void)d;
  if (req->u.hello.version != FP4IDX_PROTOCOL_VERSION)
    return fp4idx__cmd_fail(msg, FP4IDX_EVERSION,
                            "protocol version %" PRIu64 " not supported (server speaks %u)",
                            req->u.hello.version, FP4IDX_PROTOCOL_VERSION);
  resp->u.hello.version = FP4IDX_PROTOCOL_VERSION;
  snprintf(resp->u.hello.server, sizeof resp->u.hello.server, "fp4idxd %s",
           FP4IDXD_VERSION_STRING);
  return FP4IDX_OK;
}

static int fp4idx__cmd_info(fp4idx_daemon_t *d, fp4idx_response_t *resp) {
  fp4idx_info_t *in = &resp->u.info;
  in->version = FP4IDX_PROTOCOL_VERSION;
  snprintf(in->server, sizeof in->server, "fp4idxd %s", FP4IDXD_VERSION_STRING);
  snprintf(in->backend, sizeof in->backend, "%s", d->desc.name);
  snprintf(in->device, sizeof in->device, "%s", d->desc.device);
  in->page_size = (uint64_t)d->cache.page_size;
  in->pages_total = (uint64_t)d->cache.n_pages;
  in->pages_free = (uint64_t)d->cache.n_free;
  in->sequences = d->cache.n_seqs;
  in->max_frame = d->cfg.max_frame;
  return FP4IDX_OK;
}

static int fp4idx__cmd_append(fp4idx_daemon_t *d, const fp4idx_request_t *req,
                              fp4idx_response_t *resp, char *msg) {
  const fp4idx_append_req_t *a = &req->u.append;
  fp4idx_dtype_t dtype = a->keys.dtype == FP4IDX_WIRE_BF16  ? FP4IDX_DTYPE_BF16
              : a->keys.dtype == FP4IDX_WIRE_F32 ? FP4IDX_DTYPE_F32
                                                 : FP4IDX_DTYPE_FP4;
  int64_t n = (int64_t)a->keys.shape[0];
  int64_t *slots = malloc((size_t)n * sizeof *slots);
  void *kcopy;
  const void *keys = fp4idx__cmd_in_place(&a->keys, &kcopy);
  uint8_t *packed = NULL;
  int64_t first = 0;
  int created = 0, rc;
  if (!slots || !keys) {
    rc = fp4idx__cmd_fail(msg, FP4IDX_ENOMEM, "out of memory for %" PRId64 " keys", n);
    goto out;
  }
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&d->cache, a->seq);
  int64_t old_len = s ? s->n_keys : 0;
  rc = fp4idx__cache_append(&d->cache, a->seq, n, &first, slots, &created);
  if (rc == FP4IDX_EFULL) {
    int64_t need = (old_len + n + d->cache.page_size - 1) / d->cache.page_size -
                   (s ? s->n_pages : 0);
    rc = fp4idx__cmd_fail(msg, rc,
                          "page pool is full: %" PRId64 " keys need %" PRId64
                          " new pages, %" PRId64 " of %" PRId64 " free",
                          n, need, d->cache.n_free, d->cache.n_pages);
    goto out;
  }
  if (rc) {
    rc = fp4idx__cmd_fail(msg, rc, "append of %" PRId64 " keys to sequence %" PRIu64 ": %s",
                          n, a->seq, fp4idx_strerror(rc));
    goto out;
  }
  rc = fp4idx__engine_store(d->engine, keys, dtype, n, slots, a->rounding);
  if (rc == FP4IDX_OK && d->hooks.mutation) {
    packed = malloc((size_t)n * 68u);
    rc = packed ? fp4idx__engine_read(d->engine, slots, n, 0, packed) : FP4IDX_ENOMEM;
    if (rc == FP4IDX_OK)
      rc = d->hooks.mutation(d, d->hooks.arg, FP4IDX_MUT_APPEND, a->seq, first, n, packed);
  }
  if (rc) {
    /* All-or-nothing: give the reserved positions back. */
    fp4idx__cache_append_undo(&d->cache, a->seq, old_len, created);
    if (rc == FP4IDX_ENONFINITE)
      rc = fp4idx__cmd_fail(msg, rc, "keys: NaN or inf in a key; nothing was stored");
    else
      rc = fp4idx__cmd_fail(msg, rc, "storing keys: %s; nothing was stored",
                            fp4idx_strerror(rc));
    goto out;
  }
  resp->u.append.first = (uint64_t)first;
  resp->u.append.length = (uint64_t)(first + n);
out:
  free(packed);
  free(kcopy);
  free(slots);
  return rc;
}

/* Buffers of one score call, freed together. */
typedef struct fp4idx__score_bufs_s {
  size_t n;
  fp4idx_backend_seq_t *eng;
  void **owned;            /* [4 * n] q, w, lens, mask copies (or NULL) */
  fp4idx_score_result_t *results;
} fp4idx__score_bufs_t;

static void fp4idx__score_bufs_free(fp4idx__score_bufs_t *b) {
  if (b->owned)
    for (size_t i = 0; i < 4 * b->n; i++) free(b->owned[i]);
  free(b->owned);
  free(b->eng);
  /* results stay alive until the response is encoded: freed by the caller */
}

/* The score request's inputs are read in place from the frame when aligned;
 * its outputs go to one engine host buffer (*out: pinned on CUDA, so the
 * device writes results straight into it) that the response then sends from
 * where it is (fp4idx_encode_response_split): no copy of the logits between
 * the device and the socket. */
static int fp4idx__cmd_score(fp4idx_daemon_t *d, const fp4idx_request_t *req,
                             fp4idx_response_t *resp, char *msg,
                             fp4idx__score_bufs_t *b, void **out,
                             fp4idx_backend_timing_t *timing) {
  const fp4idx_score_req_t *sr = &req->u.score;
  size_t n = sr->nseqs;
  char detail[FP4IDX_CMD_MSG];
  b->n = n;
  b->eng = calloc(n, sizeof *b->eng);
  b->owned = calloc(4 * n, sizeof *b->owned);
  b->results = calloc(n, sizeof *b->results);
  if (!b->eng || !b->owned || !b->results)
    return fp4idx__cmd_fail(msg, FP4IDX_ENOMEM, "out of memory for a score of %zu sequences", n);
  uint64_t rows_total = 0, cells = 0;
  for (size_t i = 0; i < n; i++) {
    const fp4idx_score_seq_t *s = &sr->seqs[i];
    const fp4idx_cache_seq_t *cs = fp4idx__cache_find(&d->cache, s->seq);
    if (!cs)
      return fp4idx__cmd_fail(msg, FP4IDX_ENOSEQ, "seqs[%zu]: unknown sequence %" PRIu64, i,
                              s->seq);
    uint64_t width = 0;
    int rc = fp4idx_score_seq_check(s, (uint64_t)cs->n_keys, &width, detail, sizeof detail);
    if (rc)
      return fp4idx__cmd_fail(msg, rc, "seqs[%zu] (sequence %" PRIu64 ", %" PRId64 " keys): %s",
                              i, s->seq, cs->n_keys, detail);
    void **o = &b->owned[4 * i];
    const void *q = fp4idx__cmd_in_place(&s->q, &o[0]);
    const void *w = fp4idx__cmd_in_place(&s->w, &o[1]);
    const void *lens = NULL, *mask = NULL;
    if (fp4idx_tensor_present(&s->lens)) {
      lens = fp4idx__cmd_in_place(&s->lens, &o[2]);
    } else {
      int32_t *l = malloc((size_t)s->rows * sizeof *l);
      if (l)
        for (uint32_t r = 0; r < s->rows; r++) l[r] = (int32_t)cs->n_keys;
      lens = o[2] = l;
    }
    if (fp4idx_tensor_present(&s->mask)) mask = fp4idx__cmd_in_place(&s->mask, &o[3]);
    if (!q || !w || !lens || (fp4idx_tensor_present(&s->mask) && !mask))
      return fp4idx__cmd_fail(msg, FP4IDX_ENOMEM, "out of memory for seqs[%zu]", i);
    b->eng[i] = (fp4idx_backend_seq_t){.pages = cs->pages, .seq = cs->id, .resident = 1,
                                      .n_keys = cs->n_keys, .rows = (int32_t)s->rows,
                                      .width = (int64_t)width, .q = q, .w = w,
                                      .lens = lens, .mask = mask};
    rows_total += s->rows;
    cells += (uint64_t)s->rows * width;
  }
  uint64_t k = sr->topk;
  uint64_t bytes = k ? rows_total * (k * 8u + 4u) : cells * 4u;
  if ((k && rows_total > FP4IDX_CMD_MAX_RESULT / (k * 8u + 4u)) || bytes > FP4IDX_CMD_MAX_RESULT)
    return fp4idx__cmd_fail(msg, FP4IDX_E2BIG,
                            "result of %" PRIu64 " rows would exceed %" PRIu64 " bytes",
                            rows_total, FP4IDX_CMD_MAX_RESULT);
  /* [logits] or [pos | val | count], each 64-byte aligned */
  size_t kk = (size_t)k * rows_total * 4u, at_val = (kk + 63) & ~(size_t)63;
  size_t at_cnt = at_val + ((kk + 63) & ~(size_t)63);
  uint8_t *mem = fp4idx__engine_host_alloc(d->engine, k ? at_cnt + rows_total * 4u
                                                        : (size_t)cells * 4u);
  if (!mem)
    return fp4idx__cmd_fail(msg, FP4IDX_ENOMEM, "out of memory for %" PRIu64 " bytes of results",
                            bytes);
  *out = mem;
  float *logits = k ? NULL : (float *)mem;
  int32_t *pos = k ? (int32_t *)mem : NULL, *count = k ? (int32_t *)(mem + at_cnt) : NULL;
  float *val = k ? (float *)(mem + at_val) : NULL;
  fp4idx_backend_batch_t batch = {.heads = (int32_t)sr->heads, .n_seqs = (int32_t)n,
                                  .seqs = b->eng, .topk = (int32_t)k, .logits = logits,
                                  .topk_pos = pos, .topk_val = val, .topk_count = count,
                                  .timing = timing};
  double t_call = fp4idx__stats_now_us();
  int rc = fp4idx__engine_score(d->engine, &batch);
  if (!timing->timed) timing->kernels_us = fp4idx__stats_now_us() - t_call;
  if (rc) return fp4idx__cmd_fail(msg, rc, "scoring failed: %s", fp4idx_strerror(rc));
  uint64_t row = 0, cell = 0;
  for (size_t i = 0; i < n; i++) {
    fp4idx_score_result_t *r = &b->results[i];
    uint64_t R = (uint64_t)b->eng[i].rows, W = (uint64_t)b->eng[i].width;
    r->seq = sr->seqs[i].seq;
    r->topk = k != 0;
    if (k) {
      uint64_t shp[2] = {R, k};
      fp4idx_tensor_init(&r->positions, FP4IDX_WIRE_I32, 2, shp, pos + row * k);
      fp4idx_tensor_init(&r->logits, FP4IDX_WIRE_F32, 2, shp, val + row * k);
      fp4idx_tensor_init(&r->counts, FP4IDX_WIRE_I32, 1, &R, count + row);
    } else {
      uint64_t shp[2] = {R, W};
      fp4idx_tensor_init(&r->logits, FP4IDX_WIRE_F32, 2, shp, logits + cell);
    }
    row += R;
    cell += R * W;
  }
  resp->u.score.results = b->results;
  resp->u.score.nresults = n;
  return FP4IDX_OK;
}

static int fp4idx__cmd_truncate(fp4idx_daemon_t *d, const fp4idx_request_t *req,
                                fp4idx_response_t *resp, char *msg) {
  const fp4idx_truncate_req_t *t = &req->u.truncate;
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&d->cache, t->seq);
  if (!s) return fp4idx__cmd_fail(msg, FP4IDX_ENOSEQ, "unknown sequence %" PRIu64, t->seq);
  if (t->length > (uint64_t)s->n_keys)
    return fp4idx__cmd_fail(msg, FP4IDX_ERANGE,
                            "length %" PRIu64 " is above the %" PRId64 " keys of sequence %" PRIu64,
                            t->length, s->n_keys, t->seq);
  if (d->hooks.mutation) {
    int rc = d->hooks.mutation(d, d->hooks.arg, FP4IDX_MUT_TRUNCATE, t->seq,
                               (int64_t)t->length, 0, NULL);
    if (rc) return fp4idx__cmd_fail(msg, rc, "truncate not logged: %s", fp4idx_strerror(rc));
  }
  int rc = fp4idx__cache_truncate(&d->cache, t->seq, (int64_t)t->length);
  if (rc) return fp4idx__cmd_fail(msg, rc, "truncate: %s", fp4idx_strerror(rc));
  resp->u.truncate.length = t->length;
  return FP4IDX_OK;
}

static int fp4idx__cmd_drop(fp4idx_daemon_t *d, const fp4idx_request_t *req, char *msg) {
  uint64_t id = req->u.drop.seq;
  if (!fp4idx__cache_find(&d->cache, id))
    return fp4idx__cmd_fail(msg, FP4IDX_ENOSEQ, "unknown sequence %" PRIu64, id);
  if (d->hooks.mutation) {
    int rc = d->hooks.mutation(d, d->hooks.arg, FP4IDX_MUT_DROP, id, 0, 0, NULL);
    if (rc) return fp4idx__cmd_fail(msg, rc, "drop not logged: %s", fp4idx_strerror(rc));
  }
  return fp4idx__cache_drop(&d->cache, id);
}

static int fp4idx__cmd_read(fp4idx_daemon_t *d, const fp4idx_request_t *req,
                            fp4idx_response_t *resp, char *msg, void **out) {
  const fp4idx_read_req_t *r = &req->u.read;
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&d->cache, r->seq);
  if (!s) return fp4idx__cmd_fail(msg, FP4IDX_ENOSEQ, "unknown sequence %" PRIu64, r->seq);
  uint64_t n = (uint64_t)s->n_keys;
  if (r->from > n)
    return fp4idx__cmd_fail(msg, FP4IDX_ERANGE, "from %" PRIu64 " is above the %" PRIu64 " keys",
                            r->from, n);
  uint64_t count = r->has_count ? r->count : n - r->from;
  if (count > n - r->from)
    return fp4idx__cmd_fail(msg, FP4IDX_ERANGE,
                            "from %" PRIu64 " + count %" PRIu64 " is above the %" PRIu64 " keys",
                            r->from, count, n);
  uint64_t each = r->dequant ? 128u * 4u : 68u;
  if (count > FP4IDX_CMD_MAX_RESULT / each)
    return fp4idx__cmd_fail(msg, FP4IDX_E2BIG, "read of %" PRIu64 " keys exceeds %" PRIu64 " bytes",
                            count, FP4IDX_CMD_MAX_RESULT);
  int64_t *slots = malloc(count * sizeof *slots + 1);
  *out = malloc(count * each + 1);
  if (!slots || !*out) {
    free(slots);
    return fp4idx__cmd_fail(msg, FP4IDX_ENOMEM, "out of memory for %" PRIu64 " keys", count);
  }
  fp4idx__cache_slots(&d->cache, s, (int64_t)r->from, (int64_t)count, slots);
  int rc = count ? fp4idx__engine_read(d->engine, slots, (int64_t)count, r->dequant, *out) : 0;
  free(slots);
  if (rc) return fp4idx__cmd_fail(msg, rc, "reading keys: %s", fp4idx_strerror(rc));
  uint64_t shp[2] = {count, r->dequant ? 128u : 68u};
  fp4idx_tensor_init(&resp->u.read.keys, r->dequant ? FP4IDX_WIRE_F32 : FP4IDX_WIRE_U8, 2, shp,
                     *out);
  return FP4IDX_OK;
}

static int fp4idx__cmd_stats(fp4idx_daemon_t *d, fp4idx_response_t *resp,
                             fp4idx_op_stats_t **ops_out) {
  fp4idx_daemon_stats_t snap;
  double up = 0;
  fp4idx__stats_snapshot(&d->stats, &snap, &up);
  fp4idx_stats_t *st = &resp->u.stats;
  st->uptime_s = up;
  st->connections = snap.connections;
  st->sequences = d->cache.n_seqs;
  st->keys = (uint64_t)d->cache.n_keys;
  st->pages_total = (uint64_t)d->cache.n_pages;
  st->pages_free = (uint64_t)d->cache.n_free;
  snprintf(st->backend, sizeof st->backend, "%s", d->desc.name);
  snprintf(st->device, sizeof st->device, "%s", d->desc.device);
  fp4idx_op_stats_t *ops = calloc(FP4IDX_STATS_OPS + FP4IDX_STAGE__COUNT, sizeof *ops);
  if (!ops) return FP4IDX_ENOMEM;
  size_t k = 0;
  /* Every op, then "unknown" (undecodable requests) when there were any. */
  for (int op = 1; op <= FP4IDX_STATS_OPS; op++) {
    int i = op % FP4IDX_STATS_OPS; /* NONE (0) last */
    if (i == FP4IDX_OP_NONE && snap.ops[i].count == 0) continue;
    fp4idx_op_stats_t *o = &ops[k++];
    snprintf(o->op, sizeof o->op, "%s", fp4idx__stats_op_name((fp4idx_op_t)i));
    o->count = snap.ops[i].count;
    o->errors = snap.ops[i].errors;
    o->nbuckets = FP4IDX_STATS_BUCKETS;
    for (int j = 0; j < FP4IDX_STATS_BUCKETS; j++) {
      o->le_us[j] = j < FP4IDX_STATS_BUCKETS - 1 ? (double)(1u << j) : INFINITY;
      o->hist[j] = snap.ops[i].hist[j];
    }
    o->sum_us = snap.ops[i].sum_us;
  }
  st->ops = ops;
  st->nops = k;
  /* Then the stages, in path order, on the same buckets. */
  fp4idx_stage_hist_t sh[FP4IDX_STAGE__COUNT];
  fp4idx__stages_snapshot(&d->stages, sh);
  st->stages = ops + FP4IDX_STATS_OPS;
  st->nstages = FP4IDX_STAGE__COUNT;
  for (int i = 0; i < FP4IDX_STAGE__COUNT; i++) {
    fp4idx_op_stats_t *o = &st->stages[i];
    snprintf(o->op, sizeof o->op, "%s", fp4idx__stage_name((fp4idx_stage_t)i));
    o->count = sh[i].count;
    o->nbuckets = FP4IDX_STATS_BUCKETS;
    for (int j = 0; j < FP4IDX_STATS_BUCKETS; j++) {
      o->le_us[j] = j < FP4IDX_STATS_BUCKETS - 1 ? (double)(1u << j) : INFINITY;
      o->hist[j] = sh[i].hist[j];
    }
    o->sum_us = sh[i].sum_us;
  }
  *ops_out = ops;
  return FP4IDX_OK;
}

/* ---- dispatch ----------------------------------------------------------- */

/* Splits one request's time into its stages (stages.h): the clock readings
 * t0 (frame complete) <= tq (worker start) <= td (decoded) <= te (executed)
 * <= tf (encoded) bound queue, decode, execute + device, encode, so they
 * add up to the op latency tf - t0. The device stages come from the
 * backend's own timing; without it (CPU) the whole op is "execute" except a
 * score's backend call, which is "kernels". */
static void fp4idx__cmd_stage_times(fp4idx_stage_times_t *t, double t0, double tq, double td,
                                    double te, double tf,
                                    const fp4idx_backend_timing_t *dev) {
  t->us[FP4IDX_STAGE_QUEUE] = tq - t0;
  t->us[FP4IDX_STAGE_DECODE] = td - tq;
  t->us[FP4IDX_STAGE_ENCODE] = tf - te;
  double exec = te - td, up = 0, k = 0, down = 0;
  if (dev->timed) {
    up = dev->upload_us;
    k = dev->kernels_us;
    down = dev->download_us;
  } else {
    k = dev->kernels_us; /* the host time of the backend call, if any */
  }
  double in_dev = up + k + down;
  if (in_dev > exec && in_dev > 0) {
    /* device clocks vs host clock: keep the sum exact */
    double f = exec / in_dev;
    up *= f, k *= f, down *= f, in_dev = exec;
  }
  t->us[FP4IDX_STAGE_EXECUTE] = exec - in_dev;
  t->us[FP4IDX_STAGE_UPLOAD] = up;
  t->us[FP4IDX_STAGE_KERNELS] = k;
  t->us[FP4IDX_STAGE_DOWNLOAD] = down;
}

static int fp4idx__cmd_take(msgpack_sbuffer *sb, uint8_t **frame, size_t *frame_len) {
  *frame_len = sb->size;
  *frame = (uint8_t *)msgpack_sbuffer_release(sb);
  return *frame ? FP4IDX_OK : FP4IDX_ENOMEM;
}

int fp4idx__cmd_error_frame(int status, const char *msg, uint8_t **frame,
                            size_t *frame_len) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  int rc = fp4idx_encode_error(&sb, 0, status, msg);
  if (rc == FP4IDX_OK) rc = fp4idx__cmd_take(&sb, frame, frame_len);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

void fp4idx__cmd_reply_free(struct fp4idx_daemon_s *d, fp4idx_cmd_reply_t *r) {
  free(r->frame);
  free(r->payloads);
  fp4idx__engine_host_free(d->engine, r->out);
  memset(r, 0, sizeof *r);
}

/* The score reply: msgpack bytes with the result tensors left out (sent
 * from the output buffer by writev). Other ops: one contiguous frame. */
static int fp4idx__cmd_encode(const fp4idx_response_t *resp, msgpack_sbuffer *out,
                              fp4idx_cmd_reply_t *reply) {
  if (resp->op != FP4IDX_OP_SCORE) return fp4idx_encode_response(out, resp);
  size_t cap = 3 * resp->u.score.nresults;
  reply->payloads = malloc((cap ? cap : 1) * sizeof *reply->payloads);
  if (!reply->payloads) return FP4IDX_ENOMEM;
  return fp4idx_encode_response_split(out, resp, FP4IDX_CMD_SPLIT_MIN, reply->payloads, cap,
                                      &reply->npayloads);
}

void fp4idx__cmd_execute(fp4idx_daemon_t *d, const uint8_t *body, size_t len,
                         double t0_us, double tq_us, fp4idx_stage_times_t *times,
                         fp4idx_cmd_reply_t *reply) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  char msg[FP4IDX_CMD_MSG] = "";
  fp4idx__score_bufs_t sb_score;
  fp4idx_op_stats_t *stat_ops = NULL;
  fp4idx_backend_timing_t timing;
  void *read_buf = NULL;
  memset(&req, 0, sizeof req);
  memset(&resp, 0, sizeof resp);
  memset(&sb_score, 0, sizeof sb_score);
  memset(&timing, 0, sizeof timing);
  memset(reply, 0, sizeof *reply);

  int rc = fp4idx_decode_request(body, len, &req, msg, sizeof msg);
  double td_us = fp4idx__stats_now_us();
  if (rc == FP4IDX_OK) {
    resp.id = req.id;
    resp.op = req.op;
    switch (req.op) {
      case FP4IDX_OP_HELLO: rc = fp4idx__cmd_hello(d, &req, &resp, msg); break;
      case FP4IDX_OP_INFO: rc = fp4idx__cmd_info(d, &resp); break;
      case FP4IDX_OP_APPEND: rc = fp4idx__cmd_append(d, &req, &resp, msg); break;
      case FP4IDX_OP_SCORE:
        rc = fp4idx__cmd_score(d, &req, &resp, msg, &sb_score, &reply->out, &timing);
        break;
      case FP4IDX_OP_TRUNCATE: rc = fp4idx__cmd_truncate(d, &req, &resp, msg); break;
      case FP4IDX_OP_DROP: rc = fp4idx__cmd_drop(d, &req, msg); break;
      case FP4IDX_OP_READ: rc = fp4idx__cmd_read(d, &req, &resp, msg, &read_buf); break;
      case FP4IDX_OP_STATS: rc = fp4idx__cmd_stats(d, &resp, &stat_ops); break;
      case FP4IDX_OP_SAVE:
        if (d->hooks.save)
          rc = d->hooks.save(d, d->hooks.arg, msg, sizeof msg);
        else
          rc = fp4idx__cmd_fail(msg, FP4IDX_ETYPE, "save: persistence is not enabled");
        break;
      default:
        rc = fp4idx__cmd_fail(msg, FP4IDX_ETYPE, "unknown op");
        break;
    }
  }
  double te_us = fp4idx__stats_now_us();

  msgpack_sbuffer out;
  msgpack_sbuffer_init(&out);
  int erc = rc;
  if (rc == FP4IDX_OK) {
    erc = fp4idx__cmd_encode(&resp, &out, reply);
    if (erc) {
      rc = erc;
      fp4idx__cmd_fail(msg, erc, "encoding the response: %s", fp4idx_strerror(erc));
    }
  }
  if (rc != FP4IDX_OK) {
    if (!msg[0]) snprintf(msg, sizeof msg, "%s", fp4idx_strerror(rc));
    if (rc == FP4IDX_EDEVICE || rc == FP4IDX_EINTERNAL || rc == FP4IDX_ENOMEM)
      fp4idx__log_error("%s id %" PRIu64 ": %s", fp4idx_op_name(req.op), req.id, msg);
    else
      fp4idx__log_debug("%s id %" PRIu64 ": %s: %s", fp4idx_op_name(req.op), req.id,
                        fp4idx_status_name(rc), msg);
    msgpack_sbuffer_clear(&out);
    reply->npayloads = 0;
    erc = fp4idx_encode_error(&out, req.id, rc, msg);
  }
  if (erc == FP4IDX_OK || rc != FP4IDX_OK) {
    if (out.size) {
      reply->frame_len = out.size;
      reply->frame = (uint8_t *)msgpack_sbuffer_release(&out);
    }
  }
  msgpack_sbuffer_destroy(&out);
  reply->total_len = reply->frame_len;
  for (size_t i = 0; i < reply->npayloads; i++) reply->total_len += reply->payloads[i].len;
  if (!reply->npayloads) {
    /* nothing is sent from the output buffer: give it back now */
    fp4idx__engine_host_free(d->engine, reply->out);
    reply->out = NULL;
  }

  double tf_us = fp4idx__stats_now_us();
  fp4idx__stats_record(&d->stats, req.op, rc, tf_us - t0_us);
  fp4idx__cmd_stage_times(times, t0_us, tq_us, td_us, te_us, tf_us, &timing);
  fp4idx__stages_record(&d->stages, times,
                        fp4idx__stages_latency_mask() | (1u << FP4IDX_STAGE_READ));
  fp4idx__score_bufs_free(&sb_score);
  free(sb_score.results);
  free(stat_ops);
  free(read_buf);
  fp4idx_request_clear(&req);
}
