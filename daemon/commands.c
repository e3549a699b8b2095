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
#include "refs.h"
#include "regions.h"
#include "score.h"



/* The reply encoder's first block (fp4idx__cmd_done). */
#define FP4IDX__CMD_FRAME_START 1024
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
  fp4idx_score_job_t *plan;      /* score: where its checked job goes (NULL: replay) */
  int inputs_finite;             /* fp4idx_cmd_call_t's */
  void *scratch;                 /* what resp points into; freed by cleanup */
  void (*cleanup)(void *scratch); /* after the response is encoded */
} fp4idx__cmd_t;
#include "channel_cmd.h" /* the channel ops' handlers, in channel.c */

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

/* src into dst (cap >= 1 bytes), cut at cap - 1 bytes and terminated:
 * snprintf's "%s" without the format's parsing, which cost ~600
 * instructions a string, four strings an `info` (callgrind). */
static void fp4idx__cmd_copy_str(char *dst, size_t cap, const char *src) {
  const size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

static int fp4idx__cmd_info(fp4idx__cmd_t *c) {
  fp4idx_daemon_t *d = c->d;
  fp4idx_info_t *in = &c->resp->u.info;
  in->version = FP4IDX_PROTOCOL_VERSION;
  fp4idx__cmd_copy_str(in->server, sizeof in->server, "fp4idxd " FP4IDXD_VERSION_STRING);
  fp4idx__cmd_copy_str(in->backend, sizeof in->backend, d->desc.name);
  fp4idx__cmd_copy_str(in->device, sizeof in->device, d->desc.device);
  in->page_size = (uint64_t)d->cache.page_size;
  in->pages_total = (uint64_t)d->cache.n_pages;
  in->pages_free = __atomic_load_n(&d->pub.pages_free, __ATOMIC_ACQUIRE);
  in->sequences = __atomic_load_n(&d->pub.sequences, __ATOMIC_ACQUIRE);
  in->max_frame = d->cfg.max_frame;
  in->pages_shared = __atomic_load_n(&d->pub.pages_shared, __ATOMIC_ACQUIRE);
  fp4idx_sharing_t sh;
  fp4idx__daemon_sharing(d, &sh);
  fp4idx__cmd_copy_str(in->gpu_sharing, sizeof in->gpu_sharing, fp4idx__sharing_name(sh.mode));
  in->gpu_other_processes = sh.other_processes;
  pthread_mutex_lock(&d->stats.mu); /* info may run on any I/O loop */
  in->channels = d->stats.channels;
  pthread_mutex_unlock(&d->stats.mu);
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
  rc = fp4idx__refs_input(c->regions, &a->keys, a->keys.dtype == FP4IDX_WIRE_U8, 0, &keys,
                          &owned, msg, FP4IDX_CMD_MSG);
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

/* "score": checked against the cache and its regions (score.c), not run:
 * the plan (c->plan, the checked job) goes back to the batcher, which
 * launches it with its queued neighbours (batch.c). */
static int fp4idx__cmd_score(fp4idx__cmd_t *c) {
  if (!c->plan)
    return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, FP4IDX_EINVAL, "score is not a logged op");
  *c->plan = (fp4idx_score_job_t){.req = c->req, .regions = c->regions,
                                  .inputs_finite = c->inputs_finite, .msg = c->msg,
                                  .msgcap = FP4IDX_CMD_MSG};
  return fp4idx__score_check(c->d, c->plan);
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
  st->sequences = __atomic_load_n(&d->pub.sequences, __ATOMIC_ACQUIRE);
  st->keys = __atomic_load_n(&d->pub.keys, __ATOMIC_ACQUIRE);
  st->pages_total = (uint64_t)d->cache.n_pages;
  st->pages_free = __atomic_load_n(&d->pub.pages_free, __ATOMIC_ACQUIRE);
  st->pages_shared = __atomic_load_n(&d->pub.pages_shared, __ATOMIC_ACQUIRE);
  snprintf(st->backend, sizeof st->backend, "%s", d->desc.name);
  snprintf(st->device, sizeof st->device, "%s", d->desc.device);
  fp4idx_sharing_t gs;
  fp4idx__daemon_sharing(d, &gs);
  snprintf(st->gpu_sharing, sizeof st->gpu_sharing, "%s", fp4idx__sharing_name(gs.mode));
  st->gpu_other_processes = gs.other_processes;
  st->buffered_bytes = __atomic_load_n(&d->buffered.held, __ATOMIC_ACQUIRE);
  st->buffered_bytes_peak = __atomic_load_n(&d->buffered.peak, __ATOMIC_ACQUIRE);
  st->buffer_budget = __atomic_load_n(&d->buffered.budget, __ATOMIC_ACQUIRE);
  fp4idx__stats_to_wire(&snap, st);
  fp4idx_engine_desc_t now; /* device memory at this moment */
  if (fp4idx__engine_describe(d->engine, &now) == FP4IDX_OK) {
    st->device_mem_total = now.mem_total;
    st->device_mem_free = now.mem_free;
  }
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

/* "length": the keys a sequence holds; reads the cache only. */
static int fp4idx__cmd_length(fp4idx__cmd_t *c) {
  uint64_t seq = c->req->u.length.seq;
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&c->d->cache, seq);
  if (!s) return fp4idx__fail(c->msg, FP4IDX_CMD_MSG, FP4IDX_ENOSEQ, "unknown sequence %" PRIu64, seq);
  c->resp->u.length.length = (uint64_t)s->n_keys;
  return FP4IDX_OK;
}

/* ---- the command table ---------------------------------------------------- */

typedef int (*fp4idx__cmd_fn)(fp4idx__cmd_t *c);

/* One row per op, from FP4IDX_OP_MAP: the handler and the op's flags. */
typedef struct fp4idx__command_s {
  fp4idx_op_t op;
  fp4idx__cmd_fn proc;
  unsigned flags;
} fp4idx__command_t;

#define FP4IDX__CMD_ROW(ID, name, flags, rq, rs) \
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

/* Splits one request's time into its stages (stages.h): the clock readings
 * t0 (frame complete) <= td (decoded, on the loop) <= tq (worker start) <=
 * te (executed) <= tf (encoded) bound decode, queue, execute + device,
 * encode, so they add up to the op latency tf - t0. The device stages come
 * from the backend's own timing; without it (CPU) the whole op is
 * "execute" except a score's backend call, which is "kernels". */
static void fp4idx__cmd_stage_times(fp4idx_stage_times_t *t, double t0, double td, double tq,
                                    double te, double tf,
                                    const fp4idx_backend_timing_t *dev) {
  t->us[FP4IDX_STAGE_DECODE] = td - t0;
  t->us[FP4IDX_STAGE_QUEUE] = tq - td;
  t->us[FP4IDX_STAGE_ENCODE] = tf - te;
  double exec = te - tq, up = 0, k = 0, down = 0;
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


/* The score reply: msgpack bytes with the result tensors left out (sent
 * from the launch's output buffer by writev). Other ops: one frame. */
static int fp4idx__cmd_encode(const fp4idx_response_t *resp, msgpack_sbuffer *out,
                              fp4idx_cmd_reply_t *reply) {
  if (resp->op != FP4IDX_OP_SCORE) return fp4idx_encode_response(out, resp);
  size_t cap = 3 * resp->u.score.nresults;
  reply->payloads = malloc((cap ? cap : 1) * sizeof *reply->payloads);
  if (!reply->payloads) return FP4IDX_ENOMEM;
  return fp4idx_encode_response_split(out, resp, FP4IDX_CMD_SPLIT_MIN, reply->payloads, cap,
                                      &reply->npayloads);
}

void fp4idx__cmd_publish(fp4idx_daemon_t *d) {
  __atomic_store_n(&d->pub.pages_free, (uint64_t)d->cache.n_free, __ATOMIC_RELEASE);
  __atomic_store_n(&d->pub.sequences, d->cache.n_seqs, __ATOMIC_RELEASE);
  __atomic_store_n(&d->pub.keys, (uint64_t)d->cache.n_keys, __ATOMIC_RELEASE);
  /* A walk of the table: only once a fork or a restore shared a page. */
  uint64_t shared = d->cache.forked || d->cache.n_multi > 0
                        ? (uint64_t)fp4idx__cache_shared_pages(&d->cache)
                        : 0;
  __atomic_store_n(&d->pub.pages_shared, shared, __ATOMIC_RELEASE);
}

int fp4idx__cmd_loop_op(const fp4idx_request_t *req, int rc, size_t len) {
  return len <= FP4IDX_CMD_LOOP_MAX && rc == FP4IDX_OK &&
         (fp4idx_op_flags(req->op) & FP4IDX_OPF_LOOP);
}

/* The reply of a call that ran (rc, resp) or failed: encoded (or its
 * error), recorded in stats and stages; what the call held is freed. */
static void fp4idx__cmd_done(fp4idx_daemon_t *d, fp4idx_cmd_call_t *call,
                             const fp4idx_response_t *resp, const fp4idx_backend_timing_t *timing) {
  fp4idx_cmd_reply_t *reply = call->reply;
  const fp4idx_request_t *req = call->req;
  int rc = call->rc;
  memset(reply, 0, sizeof *reply);
  msgpack_sbuffer out;
  msgpack_sbuffer_init(&out);
  /* A reply's frame (its tensors go as payloads beside it) is a few hundred
   * bytes: start the encoder at 1 KiB, a size malloc serves from its
   * per-thread cache, instead of msgpack's 8 KiB first block (a trip
   * through the allocator's bins, then a shrink: ~700 instructions a
   * reply); a larger frame grows by doubling as before. */
  if ((out.data = malloc(FP4IDX__CMD_FRAME_START))) out.alloc = FP4IDX__CMD_FRAME_START;
  int erc = rc;
  if (rc == FP4IDX_OK && !call->no_frame) {
    erc = fp4idx__cmd_encode(resp, &out, reply);
    if (erc) {
      rc = erc;
      fp4idx__fail(call->msg, FP4IDX_CMD_MSG, erc, "encoding the response: %s",
                   fp4idx_strerror(erc));
    }
  }
  if (rc != FP4IDX_OK) {
    if (!call->msg[0]) snprintf(call->msg, FP4IDX_CMD_MSG, "%s", fp4idx_strerror(rc));
    if (rc == FP4IDX_EDEVICE || rc == FP4IDX_EINTERNAL || rc == FP4IDX_ENOMEM)
      fp4idx__log_error("%s id %" PRIu64 ": %s", fp4idx_op_name(req->op), req->id, call->msg);
    else
      fp4idx__log_debug("%s id %" PRIu64 ": %s: %s", fp4idx_op_name(req->op), req->id,
                        fp4idx_status_name(rc), call->msg);
    msgpack_sbuffer_clear(&out);
    free(reply->payloads);
    reply->payloads = NULL;
    reply->npayloads = 0;
    erc = call->no_frame ? FP4IDX_OK : fp4idx_encode_error(&out, req->id, rc, call->msg);
  }
  if ((erc == FP4IDX_OK || rc != FP4IDX_OK) && out.size) {
    reply->frame_len = out.size;
    reply->frame = (uint8_t *)msgpack_sbuffer_release(&out);
  }
  msgpack_sbuffer_destroy(&out);
  reply->total_len = reply->frame_len;
  for (size_t p = 0; p < reply->npayloads; p++) reply->total_len += reply->payloads[p].len;
  /* the output stays only while the reply sends from it */
  if (reply->npayloads)
    reply->out = call->score->out;
  else
    fp4idx__score_out_release(call->score->out);
  call->score->out = NULL;

  double tf = fp4idx__stats_now_us();
  fp4idx__stats_record(&d->stats, req->op, rc, tf - call->t0_us);
  fp4idx__stats_request(&d->stats, req, rc,
                        call->no_frame ? 0 : call->len + FP4IDX_FRAME_HEADER, reply->total_len);
  fp4idx_stage_times_t t = {0};
  t.us[FP4IDX_STAGE_READ] = call->read_us;
  fp4idx__cmd_stage_times(&t, call->t0_us, call->td_us, call->tq_us, call->te_us, tf, timing);
  fp4idx__stages_record(&d->stages, &t,
                        fp4idx__stages_latency_mask() | (1u << FP4IDX_STAGE_READ));
  fp4idx__score_job_clear(call->score);
  /* The region (if any) holds its own mapping; an fd sent with another
   * request is not used. */
  if (call->fd >= 0) close(call->fd);
  call->fd = -1;
}

int fp4idx__cmd_exec(fp4idx_daemon_t *d, fp4idx_cmd_call_t *call) {
  fp4idx_response_t resp;
  memset(&resp, 0, sizeof resp);
  memset(call->score, 0, sizeof *call->score);
  fp4idx__cmd_t c = {.d = d, .req = call->req, .resp = &resp, .msg = call->msg,
                     .regions = call->regions, .fd = call->fd, .plan = call->score,
                     .inputs_finite = call->inputs_finite};
  if (call->rc == FP4IDX_OK) {
    call->rc = fp4idx__cmd_call(&c);
    if (call->rc == FP4IDX_OK && call->req->op == FP4IDX_OP_SCORE) return 1; /* a plan */
    if (call->rc == FP4IDX_OK && (fp4idx_op_flags(call->req->op) & FP4IDX_OPF_MUTATES))
      fp4idx__cmd_publish(d);
  }
  call->te_us = fp4idx__stats_now_us();
  fp4idx_backend_timing_t none = {0};
  fp4idx__cmd_done(d, call, &resp, &none);
  fp4idx__cmd_release(&c);
  return 0;
}

void fp4idx__cmd_finish(fp4idx_daemon_t *d, fp4idx_cmd_call_t *call) {
  fp4idx_response_t resp;
  memset(&resp, 0, sizeof resp);
  resp.id = call->req->id;
  resp.op = call->req->op;
  call->rc = call->score->rc;
  if (call->rc == FP4IDX_OK) {
    resp.u.score.results = call->score->results;
    resp.u.score.nresults = call->score->nresults;
  }
  call->te_us = fp4idx__stats_now_us();
  fp4idx_backend_timing_t timing = call->score->timing;
  fp4idx__cmd_done(d, call, &resp, &timing);
}

/* An upper bound of the reply frame of a decoded read or score, from the
 * cache as it is now (0 for every other op, and for a request that will
 * fail: its reply is an error). Results written into regions cost nothing;
 * each tensor's msgpack header is within the per-result allowance. */
#define FP4IDX_CMD_REPLY_HEADROOM 256u
uint64_t fp4idx__cmd_reply_bound(fp4idx_daemon_t *d, const fp4idx_request_t *req) {
  uint64_t bytes = 0;
  if (req->op == FP4IDX_OP_READ) {
    const fp4idx_read_req_t *r = &req->u.read;
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(&d->cache, r->seq);
    uint64_t n = s ? (uint64_t)s->n_keys : 0;
    if (!s || r->from > n) return 0;
    uint64_t count = r->has_count && r->count < n - r->from ? r->count : n - r->from;
    uint64_t each = r->dequant ? FP4IDX_HEAD_DIM * sizeof(float) : FP4IDX_SLOT_BYTES;
    if (count > FP4IDX_CMD_MAX_RESULT / each) return 0; /* E2BIG from the handler */
    bytes = count * each;
  } else if (req->op == FP4IDX_OP_SCORE) {
    const fp4idx_score_req_t *sr = &req->u.score;
    uint64_t k = sr->topk;
    for (size_t i = 0; i < sr->nseqs; i++) {
      const fp4idx_score_seq_t *q = &sr->seqs[i];
      const fp4idx_cache_seq_t *cs = fp4idx__cache_find(&d->cache, q->seq);
      if (!cs || fp4idx_tensor_present(&q->out_logits)) continue;
      /* full logits are [rows, W] with W <= the sequence's keys */
      uint64_t each = k ? k * 8u + 4u : (uint64_t)cs->n_keys * 4u;
      if (each && q->rows > FP4IDX_CMD_MAX_RESULT / each) return 0; /* E2BIG from score.c */
      bytes += (uint64_t)q->rows * each + FP4IDX_CMD_REPLY_HEADROOM;
      if (bytes > FP4IDX_CMD_MAX_RESULT) return 0;
    }
  } else {
    return 0;
  }
  return bytes + FP4IDX_CMD_REPLY_HEADROOM;
}

