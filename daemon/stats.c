/* stats.c -- request counters and log2 latency histograms (see stats.h). */
#define _GNU_SOURCE
#include "stats.h"

#include <math.h>
#include <string.h>
#include <time.h>

#include "fp4idx_status.h"

const char *fp4idx__stats_op_name(fp4idx_op_t op) {
  return op == FP4IDX_OP_NONE ? "unknown" : fp4idx_op_name(op);
}

double fp4idx__stats_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int fp4idx__stats_init(fp4idx_daemon_stats_t *s) {
  memset(s, 0, sizeof *s);
  if (pthread_mutex_init(&s->mu, NULL)) return FP4IDX_ENOMEM;
  s->start_s = fp4idx__stats_now_us() / 1e6;
  return FP4IDX_OK;
}

void fp4idx__stats_destroy(fp4idx_daemon_stats_t *s) { pthread_mutex_destroy(&s->mu); }

int fp4idx__stats_bucket(double us) {
  /* the least i with us <= 2^i, from the exponent (frexp: us = m 2^e, m in
   * [0.5, 1), so 2^(e-1) < us <= 2^e, equal at m = 0.5) instead of a
   * comparison per bucket: it runs for every stage of every request */
  if (!(us > 1.0)) return us <= 1.0 ? 0 : FP4IDX_STATS_BUCKETS - 1; /* NaN: last */
  if (us > (double)(1u << (FP4IDX_STATS_BUCKETS - 2))) return FP4IDX_STATS_BUCKETS - 1;
  int e = 0;
  const double m = frexp(us, &e);
  return m == 0.5 ? e - 1 : e;
}

void fp4idx__stats_record(fp4idx_daemon_stats_t *s, fp4idx_op_t op, int status, double us) {
  if ((int)op < 0 || op >= FP4IDX_OP__COUNT) op = FP4IDX_OP_NONE;
  if (us < 0) us = 0;
  int b = fp4idx__stats_bucket(us);
  pthread_mutex_lock(&s->mu);
  fp4idx_daemon_op_stats_t *o = &s->ops[op];
  o->count++;
  if (status != FP4IDX_OK) o->errors++;
  o->hist[b]++;
  o->sum_us += us;
  pthread_mutex_unlock(&s->mu);
}

void fp4idx__stats_request(fp4idx_daemon_stats_t *s, const fp4idx_request_t *req,
                           int status, uint64_t req_bytes, uint64_t resp_bytes) {
  uint64_t keys = 0, rows = 0;
  if (status == FP4IDX_OK && req->op == FP4IDX_OP_APPEND) {
    keys = req->u.append.keys.shape[0];
  } else if (status == FP4IDX_OK && req->op == FP4IDX_OP_SCORE) {
    for (size_t i = 0; i < req->u.score.nseqs; i++) rows += req->u.score.seqs[i].rows;
  }
  int64_t k = status < 0 ? -(int64_t)status : 0;
  if (k >= FP4IDX_STATS_STATUSES) k = FP4IDX_STATS_STATUSES - 1;
  pthread_mutex_lock(&s->mu);
  s->keys_appended += keys;
  s->rows_scored += rows;
  s->request_bytes += req_bytes;
  s->response_bytes += resp_bytes;
  if (k) s->status_errors[k]++;
  pthread_mutex_unlock(&s->mu);
}

void fp4idx__stats_to_wire(const fp4idx_daemon_stats_t *snap, fp4idx_stats_t *st) {
  st->keys_appended = snap->keys_appended;
  st->rows_scored = snap->rows_scored;
  st->request_bytes = snap->request_bytes;
  st->response_bytes = snap->response_bytes;
  st->queue_depth = snap->queue_depth;
  memcpy(st->status_errors, snap->status_errors, sizeof st->status_errors);
  st->channels = snap->channels;
  st->channel_calls = snap->channel_calls;
  st->channel_errors = snap->channel_errors;
}

void fp4idx__stats_channel(fp4idx_daemon_stats_t *s, int open_delta, int status) {
  pthread_mutex_lock(&s->mu);
  if (open_delta > 0) s->channels++;
  else if (open_delta < 0 && s->channels > 0) s->channels--;
  if (open_delta == 0) {
    s->channel_calls++;
    if (status) s->channel_errors++;
  }
  pthread_mutex_unlock(&s->mu);
}

void fp4idx__stats_channel_error(fp4idx_daemon_stats_t *s) {
  pthread_mutex_lock(&s->mu);
  s->channel_errors++;
  pthread_mutex_unlock(&s->mu);
}

void fp4idx__stats_queue(fp4idx_daemon_stats_t *s, int delta) {
  pthread_mutex_lock(&s->mu);
  if (delta > 0) s->queue_depth++;
  else if (s->queue_depth > 0) s->queue_depth--;
  pthread_mutex_unlock(&s->mu);
}

void fp4idx__stats_conn(fp4idx_daemon_stats_t *s, int delta) {
  pthread_mutex_lock(&s->mu);
  if (delta > 0) {
    s->connections++;
    s->connections_total++;
  } else if (s->connections > 0) {
    s->connections--;
  }
  pthread_mutex_unlock(&s->mu);
}

void fp4idx__stats_snapshot(fp4idx_daemon_stats_t *s, fp4idx_daemon_stats_t *out, double *uptime_s) {
  pthread_mutex_lock(&s->mu);
  out->start_s = s->start_s;
  out->connections = s->connections;
  out->connections_total = s->connections_total;
  memcpy(out->ops, s->ops, sizeof s->ops);
  out->keys_appended = s->keys_appended;
  out->rows_scored = s->rows_scored;
  out->request_bytes = s->request_bytes;
  out->response_bytes = s->response_bytes;
  memcpy(out->status_errors, s->status_errors, sizeof s->status_errors);
  out->queue_depth = s->queue_depth;
  out->channels = s->channels;
  out->channel_calls = s->channel_calls;
  out->channel_errors = s->channel_errors;
  pthread_mutex_unlock(&s->mu);
  if (uptime_s) *uptime_s = fp4idx__stats_now_us() / 1e6 - s->start_s;
}
