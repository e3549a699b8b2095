/* stats.c -- request counters and log2 latency histograms (see stats.h). */
#define _GNU_SOURCE
#include "stats.h"

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
  for (int i = 0; i < FP4IDX_STATS_BUCKETS - 1; i++)
    if (us <= (double)(1u << i)) return i;
  return FP4IDX_STATS_BUCKETS - 1;
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
  pthread_mutex_unlock(&s->mu);
  if (uptime_s) *uptime_s = fp4idx__stats_now_us() / 1e6 - s->start_s;
}
