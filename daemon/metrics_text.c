/* metrics_text.c -- the daemon's counters as Prometheus text (see
 * metrics_text.h). */
#define _GNU_SOURCE
#include "metrics_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "fp4idx_client.h"
#include "fp4idx_codec.h"
#include "fp4idx_status.h"
#include "prom.h"

_Static_assert(FP4IDX_CLIENT_MAX_STATUSES == FP4IDX_STATS_STATUSES,
               "errors by status: the client's table and the daemon's differ");

/* What one scrape reads, in the client's stats form; the rows point into
 * the copies here. */
typedef struct fp4idx__metrics_view_s {
  fp4idx_client_stats_t stats;
  fp4idx_client_info_t info;
  fp4idx_daemon_stats_t counters;                      /* copy; mutex unused */
  fp4idx_stage_hist_t stage_hists[FP4IDX_STAGE__COUNT];
  fp4idx_client_op_stats_t op_rows[FP4IDX_STATS_OPS];
  fp4idx_client_op_stats_t stage_rows[FP4IDX_STAGE__COUNT];
  double bounds_us[FP4IDX_STATS_BUCKETS];              /* 2^i us, then +inf */
} fp4idx__metrics_view_t;

static int fp4idx__metrics_row_cmp(const void *a, const void *b) {
  return strcmp(((const fp4idx_client_op_stats_t *)a)->op,
                ((const fp4idx_client_op_stats_t *)b)->op);
}

/* The request counters (stats.h): uptime, connections, bytes, errors. */
static void fp4idx__metrics_counters(fp4idx_daemon_t *d, fp4idx__metrics_view_t *v) {
  fp4idx_client_stats_t *s = &v->stats;
  fp4idx__stats_snapshot(&d->stats, &v->counters, &s->uptime_s);
  s->connections = v->counters.connections;
  s->keys_appended = v->counters.keys_appended;
  s->rows_scored = v->counters.rows_scored;
  s->request_bytes = v->counters.request_bytes;
  s->response_bytes = v->counters.response_bytes;
  s->queue_depth = v->counters.queue_depth;
  fp4idx_budget_view_t bv;
  fp4idx__budget_view(d->server, &bv);
  s->buffered_bytes = bv.held;
  s->buffered_bytes_peak = bv.peak;
  s->buffer_budget = bv.budget;
  memcpy(s->status_errors, v->counters.status_errors, sizeof s->status_errors);
}

/* The pool and the cache: sizes fixed at init, counts the worker
 * publishes (d->pub). */
static void fp4idx__metrics_cache(fp4idx_daemon_t *d, fp4idx__metrics_view_t *v) {
  fp4idx_client_stats_t *s = &v->stats;
  s->pages_total = (uint64_t)d->cache.n_pages;
  s->pages_free = __atomic_load_n(&d->pub.pages_free, __ATOMIC_ACQUIRE);
  s->pages_shared = __atomic_load_n(&d->pub.pages_shared, __ATOMIC_ACQUIRE);
  s->sequences = __atomic_load_n(&d->pub.sequences, __ATOMIC_ACQUIRE);
  s->keys = __atomic_load_n(&d->pub.keys, __ATOMIC_ACQUIRE);
}

/* Who answers: the info labels, the backend and its device (memory now),
 * and how the GPU is shared. */
static void fp4idx__metrics_identity(fp4idx_daemon_t *d, fp4idx__metrics_view_t *v) {
  fp4idx_client_stats_t *s = &v->stats;
  fp4idx_client_info_t *in = &v->info;
  in->version = FP4IDX_PROTOCOL_VERSION;
  snprintf(in->server, sizeof in->server, "fp4idxd %s", FP4IDXD_VERSION_STRING);
  snprintf(in->backend, sizeof in->backend, "%s", d->desc.name);
  snprintf(in->device, sizeof in->device, "%s", d->desc.device);
  in->page_size = (uint64_t)d->cache.page_size;
  in->pages_total = s->pages_total;
  in->pages_free = s->pages_free;
  in->sequences = s->sequences;
  in->max_frame = d->cfg.max_frame;
  snprintf(s->backend, sizeof s->backend, "%s", d->desc.name);
  snprintf(s->device, sizeof s->device, "%s", d->desc.device);
  fp4idx_engine_desc_t now;
  if (fp4idx__engine_describe(d->engine, &now) == FP4IDX_OK) {
    s->device_mem_total = now.mem_total;
    s->device_mem_free = now.mem_free;
  }
  fp4idx_sharing_mode_t mode;
  fp4idx__daemon_sharing_published(d, &mode, &s->gpu_other_processes);
  snprintf(s->gpu_sharing, sizeof s->gpu_sharing, "%s", fp4idx__sharing_name(mode));
}

/* One row per op, "unknown" only when a request could not be decoded;
 * sorted by name. */
static void fp4idx__metrics_ops(fp4idx__metrics_view_t *v) {
  uint32_t n = 0;
  for (int op = 0; op < FP4IDX_STATS_OPS; op++) {
    const fp4idx_daemon_op_stats_t *c = &v->counters.ops[op];
    if (op == FP4IDX_OP_NONE && c->count == 0) continue;
    fp4idx_client_op_stats_t *r = &v->op_rows[n++];
    snprintf(r->op, sizeof r->op, "%s", fp4idx__stats_op_name((fp4idx_op_t)op));
    r->count = c->count;
    r->errors = c->errors;
    r->latency_sum_us = c->sum_us;
    r->nbuckets = FP4IDX_STATS_BUCKETS;
    r->bounds_us = v->bounds_us;
    r->hist = c->hist;
  }
  qsort(v->op_rows, n, sizeof *v->op_rows, fp4idx__metrics_row_cmp);
  v->stats.ops = v->op_rows;
  v->stats.nops = n;
}

/* One row per stage of the request path, in path order. */
static void fp4idx__metrics_stages(fp4idx_daemon_t *d, fp4idx__metrics_view_t *v) {
  fp4idx__stages_snapshot(&d->stages, v->stage_hists);
  for (int i = 0; i < FP4IDX_STAGE__COUNT; i++) {
    const fp4idx_stage_hist_t *h = &v->stage_hists[i];
    fp4idx_client_op_stats_t *r = &v->stage_rows[i];
    snprintf(r->op, sizeof r->op, "%s", fp4idx__stage_name((fp4idx_stage_t)i));
    r->count = h->count;
    r->latency_sum_us = h->sum_us;
    r->nbuckets = FP4IDX_STATS_BUCKETS;
    r->bounds_us = v->bounds_us;
    r->hist = h->hist;
  }
  v->stats.stages = v->stage_rows;
  v->stats.nstages = FP4IDX_STAGE__COUNT;
}

int fp4idx__metrics_text(fp4idx_daemon_t *d, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  fp4idx__metrics_view_t *v = calloc(1, sizeof *v);
  if (!v) return FP4IDX_ENOMEM;
  for (int j = 0; j < FP4IDX_STATS_BUCKETS; j++)
    v->bounds_us[j] = j < FP4IDX_STATS_BUCKETS - 1 ? (double)(1u << j) : INFINITY;
  fp4idx__metrics_counters(d, v);
  fp4idx__metrics_cache(d, v);
  fp4idx__metrics_identity(d, v);
  fp4idx__metrics_ops(v);
  fp4idx__metrics_stages(d, v);
  int rc = FP4IDX_OK;
  FILE *f = open_memstream(text, len);
  if (!f || fp4idx__prom_write(f, &v->stats, &v->info) != 0) rc = FP4IDX_ENOMEM;
  if (f && fclose(f) != 0) rc = FP4IDX_ENOMEM;
  free(v);
  if (rc != FP4IDX_OK) {
    free(*text);
    *text = NULL;
    *len = 0;
  }
  return rc;
}
