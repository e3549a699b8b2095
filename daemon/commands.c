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
#include <unistd.h>

#include "daemon.h"
#include "fp4idx_codec.h"
#include "fp4idx_fail.h"
#include "fp4idx_wire_key.h"
#include "log.h"
#include "regions.h"

#define FP4IDX_CMD_MSG 320

/* Copies a tensor's bytes into malloc'd (aligned) memory: codec views point
 * into the frame at any byte offset, backends want naturally aligned arrays. */
static void *fp4idx__cmd_aligned(const fp4idx_tensor_t *t) {
  void *p = malloc(t->nbytes ? t->nbytes : 1);
  if (p && t->nbytes) memcpy(p, t->data, t->nbytes);
  return p;
}

/* One request in flight through its handler: what a connection is to a
 * Redis command (the append log replays through the same handlers with
 * replay = 1: no hooks, no reply). */
typedef struct fp4idx__cmd_s {
  fp4idx_daemon_t *d;
  const fp4idx_request_t *req;
  fp4idx_response_t *resp;
  char *msg;                     /* [FP4IDX_CMD_MSG] the error detail */
  int replay;                    /* from the append log: not logged again */
  fp4idx_regions_t *regions;     /* the connection's regions (NULL: none) */
  int fd;                        /* fd that came with the request, or -1 */
  void *scratch;                 /* what resp points into; freed by cleanup */
  void (*cleanup)(void *scratch); /* after the response is encoded */
} fp4idx__cmd_t;

/* ---- region references ------------------------------------------------------ */

/* One tensor an op reads or writes, for the overlap check. */
typedef struct fp4idx__cmd_ref_s {
  const fp4idx_tensor_t *t;
  int out;
} fp4idx__cmd_ref_t;

/* Checks every reference of a request before anything runs: each against
 * its region (fp4idx__regions_check), then no output overlaps another
 * reference in the same region (a score must not read what it overwrites,
 * nor write two results on top of each other). */
static int fp4idx__cmd_check_refs(fp4idx__cmd_t *c, const fp4idx__cmd_ref_t *refs, size_t n) {
  char what[32];
  const fp4idx_region_t *r;
  for (size_t i = 0; i < n; i++) {
    if (refs[i].t->region == 0) continue;
    snprintf(what, sizeof what, "%s %zu", refs[i].out ? "output" : "input", i);
    int rc = fp4idx__regions_check(c->regions, refs[i].t, what, &r, c->msg, FP4IDX_CMD_MSG);
    if (rc) return rc;
  }
  for (size_t i = 0; i < n; i++) {
    const fp4idx_tensor_t *a = refs[i].t;
    if (a->region == 0 || !refs[i].out || a->nbytes == 0) continue;
    for (size_t j = 0; j < n; j++) {
      const fp4idx_tensor_t *b = refs[j].t;
      if (j == i || b->region != a->region || b->nbytes == 0) continue;
      if (a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes)
        return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, FP4IDX_EREGION,
                            "output bytes [%" PRIu64 ", +%zu) of region %" PRIu64
                            " overlap the %s at [%" PRIu64 ", +%zu)",
                            a->offset, a->nbytes, a->region,
                            refs[j].out ? "output" : "input", b->offset, b->nbytes);
    }
  }
  return FP4IDX_OK;
}

/* A checked input tensor as an aligned host array in *ptr: inline data is
 * copied (codec views are unaligned); a host region is read in place (its
 * mapping is page-aligned and the offset a multiple of the item size)
 * unless `copy`; a CUDA region is copied to the host. *owned is what to
 * free (may be NULL). `copy` is for values that are checked and then used
 * (score inputs: lens are bounds, q and w must be finite; packed keys): the
 * client can rewrite its region at any time, so those are a private
 * snapshot. Only bf16/f32 keys are read in place (see the append). */
static int fp4idx__cmd_input(fp4idx__cmd_t *c, const fp4idx_tensor_t *t, int copy,
                             const void **ptr, void **owned) {
  const fp4idx_region_t *r = NULL;
  *owned = NULL;
  if (t->region == 0) {
    *ptr = *owned = fp4idx__cmd_aligned(t);
    return *ptr ? FP4IDX_OK : FP4IDX_ENOMEM;
  }
  int rc = fp4idx__regions_check(c->regions, t, "input", &r, c->msg, FP4IDX_CMD_MSG);
  if (rc) return rc;
  if (r->kind == FP4IDX_REGION_HOST && !copy) {
    *ptr = r->base + t->offset;
    return FP4IDX_OK;
  }
  if (!(*owned = malloc(t->nbytes ? t->nbytes : 1))) return FP4IDX_ENOMEM;
  *ptr = *owned;
  return fp4idx__region_read(r, t->offset, *owned, t->nbytes);
}

/* The host address results for a checked output reference can be written
 * to directly (a host region), or NULL (stage, then fp4idx__cmd_output).
 * Safe because the backends only write their outputs (and the CUDA backend
 * copies them out at the end): nothing the client writes there meanwhile is
 * read back by the daemon. */
static void *fp4idx__cmd_direct(fp4idx__cmd_t *c, const fp4idx_tensor_t *t) {
  const fp4idx_region_t *r = NULL;
  if (fp4idx__regions_check(c->regions, t, "output", &r, NULL, 0) || r->kind != FP4IDX_REGION_HOST)
    return NULL;
  return r->base + t->offset;
}

/* Writes a staged result to a checked output reference (no-op when the
 * backend already wrote there). */
static int fp4idx__cmd_output(fp4idx__cmd_t *c, const fp4idx_tensor_t *t, const void *src) {
  const fp4idx_region_t *r = NULL;
  int rc = fp4idx__regions_check(c->regions, t, "output", &r, c->msg, FP4IDX_CMD_MSG);
  if (rc) return rc;
  if (r->kind == FP4IDX_REGION_HOST && r->base + t->offset == src) return FP4IDX_OK;
  return fp4idx__region_write(r, t->offset, src, t->nbytes);
}

/* ---- ops: one handler per row of FP4IDX_OP_MAP -------------------------- */

static int fp4idx__cmd_hello(fp4idx__cmd_t *c) {
  const fp4idx_request_t *req = c->req;
  fp4idx_response_t *resp = c->resp;
  char *msg = c->msg;
  if (req->u.hello.version != FP4IDX_PROTOCOL_VERSION)
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_EVERSION,
                        "protocol version %" PRIu64 " not supported (server speaks %u)",
                        req->u.hello.version, FP4IDX_PROTOCOL_VERSION);
  resp->u.hello.version = FP4IDX_PROTOCOL_VERSION;
  snprintf(resp->u.hello.server, sizeof resp->u.hello.server, "fp4idxd %s",
           FP4IDXD_VERSION_STRING);
  return FP4IDX_OK;
}

static int fp4idx__cmd_info(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  fp4idx_info_t *in = &c->resp->u.info;
  in->version = FP4IDX_PROTOCOL_VERSION;
  snprintf(in->server, sizeof in->server, "fp4idxd %s", FP4IDXD_VERSION_STRING);
  snprintf(in->backend, sizeof in->backend, "%s", d->desc.name);
  snprintf(in->device, sizeof in->device, "%s", d->desc.device);
  in->page_size = (uint64_t)d->cache.page_size;
  in->pages_total = (uint64_t)d->cache.n_pages;
  in->pages_free = (uint64_t)d->cache.n_free;
  in->sequences = d->cache.n_seqs;
  in->max_frame = d->cfg.max_frame;
  in->pages_shared = (uint64_t)fp4idx__cache_shared_pages(&d->cache);
  return FP4IDX_OK;
}

static int fp4idx__cmd_append(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  fp4idx_response_t *resp = c->resp;
  char *msg = c->msg;
  const fp4idx_append_req_t *a = &c->req->u.append;
  fp4idx_dtype_t dtype = fp4idx_wire_key_dtype(a->keys.dtype);
  int64_t n = (int64_t)a->keys.shape[0];
  int64_t *slots = malloc((size_t)n * sizeof *slots);
  const void *keys = NULL;
  void *owned = NULL;
  uint8_t *packed = NULL;
  int64_t first = 0;
  int created = 0, rc;
  if (!slots) {
    rc = fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOMEM, "out of memory for %" PRId64 " keys", n);
    goto out;
  }
  /* keys may come from a region (bulk ingest): checked before anything
   * moves. Packed keys are copied: their scale bytes are checked (1..254,
   * PROTOCOL.md append) and then stored verbatim, so they must not change
   * in between; bf16/f32 keys are read in place (the quantizer derives the
   * scales once and never stores a value it did not check). */
  rc = fp4idx__cmd_input(c, &a->keys, a->keys.dtype == FP4IDX_WIRE_U8, &keys, &owned);
  if (rc == FP4IDX_ENOMEM)
    rc = fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "out of memory for %" PRId64 " keys", n);
  if (rc == FP4IDX_OK) {
    fp4idx_append_req_t view = *a;
    view.keys.data = keys;
    rc = fp4idx_append_keys_check(&view, msg, FP4IDX_CMD_MSG);
  }
  if (rc) goto out;
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&d->cache, a->seq);
  int64_t old_len = s ? s->n_keys : 0;
  rc = fp4idx__cache_append(&d->cache, a->seq, n, &first, slots, &created);
  if (rc == FP4IDX_EFULL) {
    int64_t need = (old_len + n + d->cache.page_size - 1) / d->cache.page_size -
                   (s ? s->n_pages : 0);
    rc = fp4idx__fail(msg, FP4IDX_CMD_MSG, rc,
                      "page pool is full: %" PRId64 " keys need %" PRId64
                      " new pages, %" PRId64 " of %" PRId64 " free",
                      n, need, d->cache.n_free, d->cache.n_pages);
    goto out;
  }
  if (rc) {
    rc = fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "append of %" PRId64 " keys to sequence %" PRIu64 ": %s",
                      n, a->seq, fp4idx_strerror(rc));
    goto out;
  }
  rc = fp4idx__engine_store(d->engine, keys, dtype, n, slots,
                              fp4idx_wire_rounding(a->rounding));
  if (rc == FP4IDX_OK && d->hooks.mutation && !c->replay) {
    packed = malloc((size_t)n * FP4IDX_SLOT_BYTES);
    rc = packed ? fp4idx__engine_read(d->engine, slots, n, 0, packed) : FP4IDX_ENOMEM;
    if (rc == FP4IDX_OK)
      rc = d->hooks.mutation(d, d->hooks.arg, FP4IDX_MUT_APPEND, a->seq, first, n, packed);
  }
  if (rc) {
    /* All-or-nothing: give the reserved positions back. */
    fp4idx__cache_append_undo(&d->cache, a->seq, old_len, created);
    if (rc == FP4IDX_ENONFINITE)
      rc = fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "keys: NaN or inf in a key; nothing was stored");
    else
      rc = fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "storing keys: %s; nothing was stored",
                        fp4idx_strerror(rc));
    goto out;
  }
  resp->u.append.first = (uint64_t)first;
  resp->u.append.length = (uint64_t)(first + n);
out:
  free(packed);
  free(owned);
  free(slots);
  return rc;
}

/* Buffers of one score call, freed together. */
typedef struct fp4idx__score_bufs_s {
  size_t n;
  fp4idx_backend_seq_t *eng;
  void **owned;            /* [4 * n] q, w, lens, mask copies (NULL: read in place) */
  fp4idx__cmd_ref_t *refs; /* [7 * n] every tensor, for the region checks */
  float *logits;
  int32_t *pos, *count;
  float *val;
  fp4idx_score_result_t *results;
} fp4idx__score_bufs_t;

static void fp4idx__score_bufs_free(void *arg) {
  fp4idx__score_bufs_t *b = arg;
  if (b->owned)
    for (size_t i = 0; i < 4 * b->n; i++) free(b->owned[i]);
  free(b->owned);
  free(b->refs);
  free(b->eng);
  free(b->logits);
  free(b->pos);
  free(b->val);
  free(b->count);
  free(b->results);
  free(b);
}

/* One entry's results written to its "out" references (after the backend
 * ran), and the reply's tensors turned into the same references. */
static int fp4idx__score_outputs(fp4idx__cmd_t *c, const fp4idx_score_seq_t *s,
                                 fp4idx_score_result_t *r) {
  const fp4idx_tensor_t *out[3] = {&s->out_logits, &s->out_positions, &s->out_counts};
  fp4idx_tensor_t *res[3] = {&r->logits, &r->positions, &r->counts};
  for (int j = 0; j < (r->topk ? 3 : 1); j++) {
    int rc = fp4idx__cmd_output(c, out[j], res[j]->data);
    if (rc) return rc;
    fp4idx_tensor_ref(res[j], out[j]->dtype, out[j]->ndim, out[j]->shape, out[j]->region,
                      out[j]->offset);
  }
  return FP4IDX_OK;
}

static int fp4idx__cmd_score(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  fp4idx_response_t *resp = c->resp;
  char *msg = c->msg;
  const fp4idx_score_req_t *sr = &c->req->u.score;
  size_t n = sr->nseqs;
  char detail[FP4IDX_CMD_MSG];
  fp4idx__score_bufs_t *b = calloc(1, sizeof *b);
  if (!b)
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOMEM, "out of memory for a score of %zu sequences", n);
  c->scratch = b;
  c->cleanup = fp4idx__score_bufs_free;
  b->n = n;
  b->eng = calloc(n, sizeof *b->eng);
  b->owned = calloc(4 * n, sizeof *b->owned);
  b->refs = calloc(7 * n, sizeof *b->refs);
  b->results = calloc(n, sizeof *b->results);
  if (!b->eng || !b->owned || !b->refs || !b->results)
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOMEM, "out of memory for a score of %zu sequences", n);
  /* Region references first (bounds, alignment, overlap of outputs with
   * anything else): a bad one fails the request before it reads anything. */
  size_t nrefs = 0;
  for (size_t i = 0; i < n; i++) {
    const fp4idx_score_seq_t *s = &sr->seqs[i];
    const fp4idx_tensor_t *t[7] = {&s->q, &s->w, &s->lens, &s->mask,
                                   &s->out_logits, &s->out_positions, &s->out_counts};
    for (int j = 0; j < 7; j++)
      if (t[j]->region) b->refs[nrefs++] = (fp4idx__cmd_ref_t){t[j], j >= 4};
  }
  int rc = fp4idx__cmd_check_refs(c, b->refs, nrefs);
  if (rc) return rc;
  uint64_t rows_total = 0, cells = 0;
  for (size_t i = 0; i < n; i++) {
    const fp4idx_score_seq_t *s = &sr->seqs[i];
    const fp4idx_cache_seq_t *cs = fp4idx__cache_find(&d->cache, s->seq);
    if (!cs)
      return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOSEQ, "seqs[%zu]: unknown sequence %" PRIu64, i,
                          s->seq);
    void **o = &b->owned[4 * i];
    const void *in[4] = {NULL, NULL, NULL, NULL};
    fp4idx_score_seq_t view = *s; /* lens readable from the host for the check */
    for (int j = 0; j < 4; j++) {
      const fp4idx_tensor_t *t = j == 0 ? &s->q : j == 1 ? &s->w : j == 2 ? &s->lens : &s->mask;
      if (!fp4idx_tensor_present(t)) continue;
      rc = fp4idx__cmd_input(c, t, 1, &in[j], &o[j]); /* checked, then used: a snapshot */
      if (rc == FP4IDX_ENOMEM)
        return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "out of memory for seqs[%zu]", i);
      if (rc) return rc;
    }
    view.q.data = in[0];
    view.w.data = in[1];
    view.lens.data = in[2];
    view.mask.data = in[3];
    uint64_t width = 0;
    rc = fp4idx_score_seq_check(&view, (uint64_t)cs->n_keys, &width, detail, sizeof detail);
    if (rc == FP4IDX_OK) rc = fp4idx_score_out_check(s, width, sr->topk, detail, sizeof detail);
    if (rc)
      return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "seqs[%zu] (sequence %" PRIu64 ", %" PRId64 " keys): %s",
                          i, s->seq, cs->n_keys, detail);
    if (!fp4idx_tensor_present(&s->lens)) {
      int32_t *l = malloc((size_t)s->rows * sizeof *l);
      if (!l) return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOMEM, "out of memory for seqs[%zu]", i);
      for (uint32_t r = 0; r < s->rows; r++) l[r] = (int32_t)cs->n_keys;
      in[2] = o[2] = l;
    }
    const int32_t *pages = NULL; /* one array; forks hold shared chunks of it */
    if (fp4idx__cache_pages(&d->cache, cs, &pages) != FP4IDX_OK)
      return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOMEM, "out of memory for seqs[%zu]", i);
    b->eng[i] = (fp4idx_backend_seq_t){.pages = pages, .n_keys = cs->n_keys,
                                      .rows = (int32_t)s->rows, .width = (int64_t)width,
                                      .q = in[0], .w = in[1], .lens = in[2], .mask = in[3]};
    rows_total += s->rows;
    cells += (uint64_t)s->rows * width;
  }
  uint64_t k = sr->topk;
  uint64_t bytes = k ? rows_total * (k * 8u + 4u) : cells * 4u;
  if ((k && rows_total > FP4IDX_CMD_MAX_RESULT / (k * 8u + 4u)) || bytes > FP4IDX_CMD_MAX_RESULT)
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_E2BIG,
                        "result of %" PRIu64 " rows would exceed %" PRIu64 " bytes",
                        rows_total, FP4IDX_CMD_MAX_RESULT);
  /* One entry writing to a host region: the backend writes there directly
   * (on the CUDA backend, a pinned region takes the device-to-host copy
   * itself). Otherwise it writes to staging buffers, copied out below. */
  const fp4idx_score_seq_t *s0 = &sr->seqs[0];
  int direct = n == 1 && fp4idx_tensor_present(&s0->out_logits);
  fp4idx_backend_batch_t batch = {
      .heads = (int32_t)sr->heads, .n_seqs = (int32_t)n, .seqs = b->eng, .topk = (int32_t)k};
  if (direct) {
    batch.logits = k ? NULL : fp4idx__cmd_direct(c, &s0->out_logits);
    batch.topk_val = k ? fp4idx__cmd_direct(c, &s0->out_logits) : NULL;
    batch.topk_pos = k ? fp4idx__cmd_direct(c, &s0->out_positions) : NULL;
    batch.topk_count = k ? fp4idx__cmd_direct(c, &s0->out_counts) : NULL;
  }
  if (k) {
    if (!batch.topk_pos) batch.topk_pos = b->pos = malloc(rows_total * k * 4u + 1);
    if (!batch.topk_val) batch.topk_val = b->val = malloc(rows_total * k * 4u + 1);
    if (!batch.topk_count) batch.topk_count = b->count = malloc(rows_total * 4u + 1);
    if (!batch.topk_pos || !batch.topk_val || !batch.topk_count)
      return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOMEM, "out of memory for the top-k output");
  } else {
    if (!batch.logits) batch.logits = b->logits = malloc(cells * 4u + 1);
    if (!batch.logits)
      return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOMEM, "out of memory for %" PRIu64 " logits", cells);
  }
  rc = fp4idx__engine_score(d->engine, &batch);
  if (rc) return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "scoring failed: %s", fp4idx_strerror(rc));
  uint64_t row = 0, cell = 0;
  for (size_t i = 0; i < n; i++) {
    fp4idx_score_result_t *r = &b->results[i];
    uint64_t R = (uint64_t)b->eng[i].rows, W = (uint64_t)b->eng[i].width;
    r->seq = sr->seqs[i].seq;
    r->topk = k != 0;
    if (k) {
      uint64_t shp[2] = {R, k};
      fp4idx_tensor_init(&r->positions, FP4IDX_WIRE_I32, 2, shp, batch.topk_pos + row * k);
      fp4idx_tensor_init(&r->logits, FP4IDX_WIRE_F32, 2, shp, batch.topk_val + row * k);
      fp4idx_tensor_init(&r->counts, FP4IDX_WIRE_I32, 1, &R, batch.topk_count + row);
    } else {
      uint64_t shp[2] = {R, W};
      fp4idx_tensor_init(&r->logits, FP4IDX_WIRE_F32, 2, shp, batch.logits + cell);
    }
    if (fp4idx_tensor_present(&sr->seqs[i].out_logits) &&
        (rc = fp4idx__score_outputs(c, &sr->seqs[i], r)) != 0)
      return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "writing the results of seqs[%zu]: %s", i,
                          fp4idx_strerror(rc));
    row += R;
    cell += R * W;
  }
  resp->u.score.results = b->results;
  resp->u.score.nresults = n;
  return FP4IDX_OK;
}

/* A known sequence holding at least `length` keys (truncate, fork), else
 * ENOSEQ / ERANGE with the message. */
static int fp4idx__cmd_check_length(fp4idx__cmd_t *c, uint64_t seq, uint64_t length) {
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&c->d->cache, seq);
  if (!s) return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, FP4IDX_ENOSEQ, "unknown sequence %" PRIu64, seq);
  if (length > (uint64_t)s->n_keys)
    return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, FP4IDX_ERANGE,
                        "length %" PRIu64 " is above the %" PRId64 " keys of sequence %" PRIu64,
                        length, s->n_keys, seq);
  return FP4IDX_OK;
}

static int fp4idx__cmd_truncate(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  char *msg = c->msg;
  const fp4idx_truncate_req_t *t = &c->req->u.truncate;
  int rc = fp4idx__cmd_check_length(c, t->seq, t->length);
  if (rc) return rc;
  if (d->hooks.mutation && !c->replay) {
    rc = d->hooks.mutation(d, d->hooks.arg, FP4IDX_MUT_TRUNCATE, t->seq,
                               (int64_t)t->length, 0, NULL);
    if (rc) return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "truncate not logged: %s", fp4idx_strerror(rc));
  }
  rc = fp4idx__cache_truncate(&d->cache, t->seq, (int64_t)t->length);
  if (rc) return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "truncate: %s", fp4idx_strerror(rc));
  c->resp->u.truncate.length = t->length;
  return FP4IDX_OK;
}

static int fp4idx__cmd_drop(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  char *msg = c->msg;
  uint64_t id = c->req->u.drop.seq;
  if (!fp4idx__cache_find(&d->cache, id))
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOSEQ, "unknown sequence %" PRIu64, id);
  if (d->hooks.mutation && !c->replay) {
    int rc = d->hooks.mutation(d, d->hooks.arg, FP4IDX_MUT_DROP, id, 0, 0, NULL);
    if (rc) return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "drop not logged: %s", fp4idx_strerror(rc));
  }
  return fp4idx__cache_drop(&d->cache, id);
}

/* Forked first, then logged (a fork can fail for memory, a logged record
 * must not): a log failure drops dst again, which lets go of exactly what
 * the fork took. */
static int fp4idx__cmd_fork(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  char *msg = c->msg;
  const fp4idx_fork_req_t *f = &c->req->u.fork;
  int rc = fp4idx__cmd_check_length(c, f->src, f->length);
  if (rc) return rc;
  if (fp4idx__cache_find(&d->cache, f->dst))
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_EEXIST, "sequence %" PRIu64 " already exists",
                        f->dst);
  rc = fp4idx__cache_fork(&d->cache, f->src, f->dst, (int64_t)f->length);
  if (rc) return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "fork: %s", fp4idx_strerror(rc));
  if (d->hooks.mutation && !c->replay) {
    rc = d->hooks.mutation(d, d->hooks.arg, FP4IDX_MUT_FORK, f->dst, (int64_t)f->length,
                           (int64_t)f->src, NULL);
    if (rc) {
      (void)fp4idx__cache_drop(&d->cache, f->dst);
      return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "fork not logged: %s", fp4idx_strerror(rc));
    }
  }
  c->resp->u.fork.length = f->length;
  return FP4IDX_OK;
}

static int fp4idx__cmd_read(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  fp4idx_response_t *resp = c->resp;
  char *msg = c->msg;
  const fp4idx_read_req_t *r = &c->req->u.read;
  void **out = &c->scratch;
  c->cleanup = free;
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&d->cache, r->seq);
  if (!s) return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOSEQ, "unknown sequence %" PRIu64, r->seq);
  uint64_t n = (uint64_t)s->n_keys;
  if (r->from > n)
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ERANGE, "from %" PRIu64 " is above the %" PRIu64 " keys",
                        r->from, n);
  uint64_t count = r->has_count ? r->count : n - r->from;
  if (count > n - r->from)
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ERANGE,
                        "from %" PRIu64 " + count %" PRIu64 " is above the %" PRIu64 " keys",
                        r->from, count, n);
  uint64_t each = r->dequant ? FP4IDX_HEAD_DIM * sizeof(float) : FP4IDX_SLOT_BYTES;
  if (count > FP4IDX_CMD_MAX_RESULT / each)
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_E2BIG, "read of %" PRIu64 " keys exceeds %" PRIu64 " bytes",
                        count, FP4IDX_CMD_MAX_RESULT);
  int64_t *slots = malloc(count * sizeof *slots + 1);
  *out = malloc(count * each + 1);
  if (!slots || !*out) {
    free(slots);
    return fp4idx__fail(msg, FP4IDX_CMD_MSG, FP4IDX_ENOMEM, "out of memory for %" PRIu64 " keys", count);
  }
  fp4idx__cache_slots(&d->cache, s, (int64_t)r->from, (int64_t)count, slots);
  int rc = count ? fp4idx__engine_read(d->engine, slots, (int64_t)count, r->dequant, *out) : 0;
  free(slots);
  if (rc) return fp4idx__fail(msg, FP4IDX_CMD_MSG, rc, "reading keys: %s", fp4idx_strerror(rc));
  uint64_t shp[2] = {count, r->dequant ? FP4IDX_HEAD_DIM : FP4IDX_SLOT_BYTES};
  fp4idx_tensor_init(&resp->u.read.keys, r->dequant ? FP4IDX_WIRE_F32 : FP4IDX_WIRE_U8, 2, shp,
                     *out);
  return FP4IDX_OK;
}

static int fp4idx__cmd_stats(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  fp4idx_response_t *resp = c->resp;
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
  st->pages_shared = (uint64_t)fp4idx__cache_shared_pages(&d->cache);
  snprintf(st->backend, sizeof st->backend, "%s", d->desc.name);
  snprintf(st->device, sizeof st->device, "%s", d->desc.device);
  fp4idx__stats_to_wire(&snap, st);
  fp4idx_engine_desc_t now; /* device memory at this moment */
  if (fp4idx__engine_describe(d->engine, &now) == FP4IDX_OK) {
    st->device_mem_total = now.mem_total;
    st->device_mem_free = now.mem_free;
  }
  fp4idx_op_stats_t *ops = calloc(FP4IDX_STATS_OPS, sizeof *ops);
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
  c->scratch = ops;
  c->cleanup = free;
  return FP4IDX_OK;
}

static int fp4idx__cmd_save(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  if (!d->hooks.save)
    return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, FP4IDX_EDISABLED,
                        "persistence is not enabled: start fp4idxd with --data-dir");
  return d->hooks.save(d, d->hooks.arg, c->msg, FP4IDX_CMD_MSG);
}

/* The sequences of one "list" step, collected by the cache scan. */
typedef struct fp4idx__list_s {
  const fp4idx_cache_t *cache;
  fp4idx_list_entry_t *seqs;
  size_t n, cap;
} fp4idx__list_t;

static int fp4idx__list_add(const fp4idx_cache_seq_t *s, void *arg) {
  fp4idx__list_t *l = arg;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    fp4idx_list_entry_t *p = realloc(l->seqs, cap * sizeof *p);
    if (!p) return FP4IDX_ENOMEM;
    l->seqs = p;
    l->cap = cap;
  }
  l->seqs[l->n++] = (fp4idx_list_entry_t){
      .seq = s->id, .keys = (uint64_t)s->n_keys, .pages = (uint64_t)s->n_pages,
      .pages_shared = (uint64_t)fp4idx__cache_seq_shared(l->cache, s)};
  return 0;
}

/* "list": one SCAN step over the sequence table (fp4idx__cache_scan): bounded
 * work per call, stable under inserts and drops between the calls. */
static int fp4idx__cmd_list(fp4idx__cmd_t *c) {
  const fp4idx_list_req_t *r = &c->req->u.list;
  fp4idx__list_t l = {.cache = &c->d->cache};
  uint64_t next = 0;
  int rc = fp4idx__cache_scan(&c->d->cache, r->cursor,
                              r->count ? r->count : FP4IDX_PROTO_LIST_COUNT,
                              fp4idx__list_add, &l, &next);
  c->scratch = l.seqs;
  c->cleanup = free;
  if (rc)
    return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, rc, "list: %s", fp4idx_strerror(rc));
  c->resp->u.list = (fp4idx_list_resp_t){.cursor = next, .seqs = l.seqs, .nseqs = l.n};
  return FP4IDX_OK;
}

/* "register": a host region from the fd that came with the request, or a
 * CUDA region from IPC handle bytes; owned by this connection. */
static int fp4idx__cmd_register(fp4idx__cmd_t *c) {
  const fp4idx_register_req_t *r = &c->req->u.register_;
  uint64_t id = 0;
  int rc;
  if (!c->regions)
    return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, FP4IDX_EREGION, "regions need a connection");
  if (r->kind == FP4IDX_REGION_HOST) {
    rc = fp4idx__regions_add_host(c->regions, c->fd, r->size, &id, c->msg, FP4IDX_CMD_MSG);
  } else {
    rc = fp4idx__regions_add_cuda(c->regions, r->handle, r->handle_len, r->device, r->size, &id,
                                  c->msg, FP4IDX_CMD_MSG);
  }
  if (rc) return rc;
  c->resp->u.register_ = (fp4idx_register_resp_t){.region = id, .size = r->size};
  return FP4IDX_OK;
}

static int fp4idx__cmd_unregister(fp4idx__cmd_t *c) {
  return fp4idx__regions_remove(c->regions, c->req->u.unregister.region, c->msg, FP4IDX_CMD_MSG);
}

/* ---- the command table ---------------------------------------------------- */

typedef int (*fp4idx__cmd_fn)(fp4idx__cmd_t *c);

/* One row per op, from FP4IDX_OP_MAP: the handler and the op's flags. */
typedef struct fp4idx__command_s {
  fp4idx_op_t op;
  fp4idx__cmd_fn proc;
  unsigned flags;
} fp4idx__command_t;

#define FP4IDX__CMD_ROW(ID, name, flags, rq, rs, REQ, RESP) \
  [FP4IDX_OP_##ID] = {FP4IDX_OP_##ID, fp4idx__cmd_##name, (flags)},
static const fp4idx__command_t fp4idx__commands[FP4IDX_OP__COUNT] = {
    FP4IDX_OP_MAP(FP4IDX__CMD_ROW)};
#undef FP4IDX__CMD_ROW

/* Runs req's handler; resp->id/op set. The caller frees c->scratch. */
static int fp4idx__cmd_call(fp4idx__cmd_t *c) {
  fp4idx_op_t op = c->req->op;
  c->resp->id = c->req->id;
  c->resp->op = op;
  if ((int)op <= FP4IDX_OP_NONE || op >= FP4IDX_OP__COUNT || !fp4idx__commands[op].proc)
    return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, FP4IDX_ETYPE, "unknown op");
  return fp4idx__commands[op].proc(c);
}

static void fp4idx__cmd_release(fp4idx__cmd_t *c) {
  if (c->cleanup) c->cleanup(c->scratch);
  c->scratch = NULL;
  c->cleanup = NULL;
}

int fp4idx__cmd_replay(fp4idx_daemon_t *d, const fp4idx_request_t *req, char *msg,
                       size_t msgcap) {
  fp4idx_response_t resp;
  char detail[FP4IDX_CMD_MSG] = "";
  memset(&resp, 0, sizeof resp);
  fp4idx__cmd_t c = {.d = d, .req = req, .resp = &resp, .msg = detail, .replay = 1, .fd = -1};
  int rc;
  if (!(fp4idx_op_flags(req->op) & FP4IDX_OPF_MUTATES))
    rc = fp4idx__fail(detail, FP4IDX_CMD_MSG, FP4IDX_EINVAL, "%s is not a logged op", fp4idx_op_name(req->op));
  else
    rc = fp4idx__cmd_call(&c);
  fp4idx__cmd_release(&c);
  if (rc && msg && msgcap) snprintf(msg, msgcap, "%s", detail[0] ? detail : fp4idx_strerror(rc));
  return rc;
}

/* ---- dispatch ----------------------------------------------------------- */

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

void fp4idx__cmd_execute(fp4idx_daemon_t *d, fp4idx_regions_t *regions, int fd,
                         const uint8_t *body, size_t len, double t0_us, uint8_t **frame,
                         size_t *frame_len) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  char msg[FP4IDX_CMD_MSG] = "";
  memset(&req, 0, sizeof req);
  memset(&resp, 0, sizeof resp);
  fp4idx__cmd_t c = {.d = d, .req = &req, .resp = &resp, .msg = msg, .regions = regions,
                     .fd = fd};
  *frame = NULL;
  *frame_len = 0;

  int rc = fp4idx_decode_request(body, len, &req, msg, sizeof msg);
  if (rc == FP4IDX_OK) rc = fp4idx__cmd_call(&c);
  /* The region (if any) holds its own mapping; an fd sent with another
   * request is not used. */
  if (fd >= 0) close(fd);

  msgpack_sbuffer out;
  msgpack_sbuffer_init(&out);
  int erc = rc;
  if (rc == FP4IDX_OK) {
    erc = fp4idx_encode_response(&out, &resp);
    if (erc) {
      rc = erc;
      fp4idx__fail(msg, FP4IDX_CMD_MSG, erc, "encoding the response: %s", fp4idx_strerror(erc));
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
    erc = fp4idx_encode_error(&out, req.id, rc, msg);
  }
  if (erc == FP4IDX_OK || rc != FP4IDX_OK) {
    if (out.size) fp4idx__cmd_take(&out, frame, frame_len);
  }
  msgpack_sbuffer_destroy(&out);

  fp4idx__stats_record(&d->stats, req.op, rc, fp4idx__stats_now_us() - t0_us);
  fp4idx__stats_request(&d->stats, &req, rc, len + FP4IDX_FRAME_HEADER, *frame_len);
  fp4idx__cmd_release(&c);
  fp4idx_request_clear(&req);
}
