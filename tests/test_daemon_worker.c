/* test_daemon_worker.c -- the worker queue (daemon/worker.c) and the
 * latency histogram (daemon/stats.c), without a backend or a socket. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <unistd.h>

#include "stats.h"
#include "worker.h"

enum { NJOBS = 2000 };

typedef struct ctx_s {
  fp4idx_worker_t w;
  fp4idx_job_t jobs[NJOBS];
  int order[NJOBS];      /* work order, written by the worker thread */
  int n_work;
  int n_done;            /* loop thread */
  int done_in_order;     /* done callbacks came in submission order */
  pthread_t loop_thread;
  int done_on_loop;
  int idle_calls;
} ctx_t;

static void work_cb(fp4idx_job_t *j) {
  ctx_t *c = j->data;
  int i = (int)(j - c->jobs);
  if (i % 97 == 0) usleep(200); /* some slow jobs */
  c->order[c->n_work++] = i;
}

static void done_cb(fp4idx_job_t *j) {
  ctx_t *c = j->data;
  int i = (int)(j - c->jobs);
  if (i != c->n_done) c->done_in_order = 0;
  if (!pthread_equal(pthread_self(), c->loop_thread)) c->done_on_loop = 0;
  c->n_done++;
}

static void idle_cb(fp4idx_worker_t *w) {
  ctx_t *c = w->data;
  c->idle_calls++;
  if (c->n_done == NJOBS) fp4idx__worker_stop(w);
}

/* A fresh context: nothing run yet, both order flags true until broken. */
static void ctx_reset(ctx_t *c) {
  memset(c, 0, sizeof *c);
  c->done_in_order = 1;
  c->done_on_loop = 1;
  c->loop_thread = pthread_self();
}

Test(worker, fifo_order_and_done_on_the_loop) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  static ctx_t c;
  ctx_reset(&c);
  c.w.data = &c;
  c.w.on_idle = idle_cb;
  cr_assert_eq(fp4idx__worker_start(&c.w, &loop), 0);
  cr_assert_eq(c.w.data, &c, "start keeps the user's data");
  for (int i = 0; i < NJOBS; i++) {
    c.jobs[i].work = work_cb;
    c.jobs[i].done = done_cb;
    c.jobs[i].data = &c;
    fp4idx__worker_submit(&c.w, &c.jobs[i]);
  }
  cr_assert_eq(c.w.queued, NJOBS);
  uv_run(&loop, UV_RUN_DEFAULT); /* ends when idle_cb stopped the worker */
  cr_assert_eq(c.n_work, NJOBS);
  cr_assert_eq(c.n_done, NJOBS);
  for (int i = 0; i < NJOBS; i++) cr_assert_eq(c.order[i], i, "job %d ran out of order", i);
  cr_assert(c.done_in_order);
  cr_assert(c.done_on_loop);
  cr_assert_geq(c.idle_calls, 1);
  cr_assert_eq(c.w.queued, 0);
  cr_assert_eq(uv_loop_close(&loop), 0);
}

/* A polling worker (spin_us) runs the same jobs in the same order, and a
 * stop that comes while it polls an empty queue is not lost: the stop
 * returns (a lost wake-up hangs here, and the test times out). */
Test(worker, spinning_worker_keeps_order_and_stops, .timeout = 30) {
  for (int round = 0; round < 20; round++) {
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    static ctx_t c;
    ctx_reset(&c);
    c.w.data = &c;
    c.w.spin_us = round % 2 ? 200 : 100000; /* stop inside and after the window */
    cr_assert_eq(fp4idx__worker_start(&c.w, &loop), 0);
    cr_assert_eq(c.w.spin_us, round % 2 ? 200 : 100000, "start keeps spin_us");
    enum { N = 50 };
    for (int i = 0; i < N; i++) {
      c.jobs[i].work = work_cb;
      c.jobs[i].done = done_cb;
      c.jobs[i].data = &c;
      fp4idx__worker_submit(&c.w, &c.jobs[i]);
    }
    while (c.n_done < N) uv_run(&loop, UV_RUN_ONCE);
    if (round % 4 == 1) usleep(1000); /* now asleep on its condition */
    fp4idx__worker_stop(&c.w);
    uv_run(&loop, UV_RUN_DEFAULT);
    for (int i = 0; i < N; i++) cr_assert_eq(c.order[i], i, "job %d ran out of order", i);
    cr_assert(c.done_in_order);
    cr_assert_eq(uv_loop_close(&loop), 0);
  }
}

/* Stopping with jobs still queued runs them all and delivers every done. */
Test(worker, stop_drains_the_queue) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  static ctx_t c;
  ctx_reset(&c);
  cr_assert_eq(fp4idx__worker_start(&c.w, &loop), 0);
  for (int i = 0; i < 300; i++) {
    c.jobs[i].work = work_cb;
    c.jobs[i].done = done_cb;
    c.jobs[i].data = &c;
    fp4idx__worker_submit(&c.w, &c.jobs[i]);
  }
  fp4idx__worker_stop(&c.w); /* without running the loop first */
  cr_assert_eq(c.n_work, 300);
  cr_assert_eq(c.n_done, 300);
  cr_assert(c.done_in_order);
  uv_run(&loop, UV_RUN_DEFAULT); /* finishes closing the async handle */
  cr_assert_eq(uv_loop_close(&loop), 0);
}

/* Batches: neighbouring jobs of one batch kind run as one call, in order;
 * a plain job or one of another kind in between ends the batch. */
static int g_batch_sizes[NJOBS], g_nbatches, g_entered, g_brelease;

static void batch_a(fp4idx_job_t **jobs, int n) {
  ctx_t *c = jobs[0]->data;
  if (c->n_work == 0) { /* the first one holds the worker while the rest queue */
    __atomic_store_n(&g_entered, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&g_brelease, __ATOMIC_SEQ_CST)) usleep(100);
  }
  g_batch_sizes[g_nbatches++] = n;
  for (int i = 0; i < n; i++) {
    if (jobs[i]->batch != batch_a) c->done_in_order = 0; /* a foreign job got in */
    c->order[c->n_work++] = (int)(jobs[i] - c->jobs);
  }
}

static void batch_b(fp4idx_job_t **jobs, int n) {
  ctx_t *c = jobs[0]->data;
  g_batch_sizes[g_nbatches++] = -n;
  for (int i = 0; i < n; i++) c->order[c->n_work++] = (int)(jobs[i] - c->jobs);
}

Test(worker, neighbouring_jobs_of_a_kind_run_as_one_batch) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  static ctx_t c;
  memset(&c, 0, sizeof c);
  c.done_in_order = 1;
  c.done_on_loop = 1;
  c.loop_thread = pthread_self();
  g_nbatches = g_entered = g_brelease = 0;
  cr_assert_eq(fp4idx__worker_start(&c.w, &loop), 0);
  /* 0: A alone (slow); then 1..300 A, 301 plain, 302..310 A, 311..320 B,
   * 321..999 A (more than one batch can take) */
  for (int i = 0; i < 1000; i++) {
    c.jobs[i].work = work_cb;
    c.jobs[i].done = done_cb;
    c.jobs[i].data = &c;
    c.jobs[i].batch = i == 301 ? NULL : (i >= 311 && i <= 320) ? batch_b : batch_a;
    fp4idx__worker_submit(&c.w, &c.jobs[i]);
    if (i == 0) /* the worker takes job 0 alone */
      while (!__atomic_load_n(&g_entered, __ATOMIC_SEQ_CST)) usleep(100);
  }
  __atomic_store_n(&g_brelease, 1, __ATOMIC_SEQ_CST);
  fp4idx__worker_stop(&c.w);
  cr_assert_eq(c.n_work, 1000);
  cr_assert_eq(c.n_done, 1000);
  for (int i = 0; i < 1000; i++) cr_assert_eq(c.order[i], i, "job %d ran out of order", i);
  cr_assert(c.done_in_order, "done callbacks in order, batches never mixed kinds");
  /* job 0 alone, 1..300 as 256 + 44, 302..310 (9), B 311..320 (10), then
   * 321..999 (679) as 256 + 256 + 167 */
  static const int want[] = {1, 256, 44, 9, -10, 256, 256, 167};
  cr_assert_eq(g_nbatches, 8, "%d batches", g_nbatches);
  for (int i = 0; i < 8; i++)
    cr_assert_eq(g_batch_sizes[i], want[i], "batch %d: %d jobs", i, g_batch_sizes[i]);
  cr_assert_eq(c.w.batched_jobs, 999u);
  uv_run(&loop, UV_RUN_DEFAULT);
  cr_assert_eq(uv_loop_close(&loop), 0);
}

/* Two lanes: a blocker job holds the worker while bulk jobs 1..8 and normal
 * jobs 9..20 queue; bulk runs one per FP4IDX_WORKER_BULK_EVERY normal ones
 * while both wait, each lane in its own order; a paused bulk lane waits
 * until released; stop runs everything. */
static atomic_int g_release, g_started;

static void blocker_cb(fp4idx_job_t *j) {
  atomic_store(&g_started, 1);
  while (!atomic_load(&g_release)) usleep(1000);
  work_cb(j);
}

static void lanes_run(int pause_bulk, int *order, int *n) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  static ctx_t c;
  ctx_reset(&c);
  atomic_store(&g_release, 0);
  atomic_store(&g_started, 0);
  cr_assert_eq(fp4idx__worker_start(&c.w, &loop), 0);
  if (pause_bulk) fp4idx__worker_pause_bulk(&c.w, 1);
  for (int i = 0; i <= 20; i++) {
    c.jobs[i].work = i == 0 ? blocker_cb : work_cb;
    c.jobs[i].done = done_cb;
    c.jobs[i].data = &c;
    c.jobs[i].bulk = i >= 1 && i <= 8;
    fp4idx__worker_submit(&c.w, &c.jobs[i]);
    while (i == 0 && !atomic_load(&g_started)) usleep(100); /* the worker holds it */
  }
  atomic_store(&g_release, 1);
  if (pause_bulk) {
    for (int t = 0; t < 2000 && c.n_done < 13; t++) {
      uv_run(&loop, UV_RUN_NOWAIT);
      usleep(1000);
    }
    cr_assert_eq(c.n_work, 13, "only the blocker and the 12 normal jobs ran while paused");
    fp4idx__worker_pause_bulk(&c.w, 0);
  }
  for (int t = 0; t < 2000 && c.n_done < 21; t++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  cr_assert_eq(c.n_done, 21);
  fp4idx__worker_stop(&c.w);
  uv_run(&loop, UV_RUN_DEFAULT);
  cr_assert_eq(uv_loop_close(&loop), 0);
  *n = c.n_work;
  memcpy(order, c.order, sizeof(int) * 21);
}

/* The pipeline (batch_begin / batch_end): a begun batch is ended after the
 * next one began, or at once when nothing else is queued, before a plain
 * job runs, and at stop; each job's done comes once, and in order. */
static char g_trace[4096];
static int g_tn, g_pipe_id, g_pipe_hold, g_pipe_in, g_pipe_hold3, g_pipe_in3;

typedef struct { int id; fp4idx_job_t *first; int n; } pipe_state_t;

static void trace(char what, int id) {
  g_tn += snprintf(g_trace + g_tn, sizeof g_trace - (size_t)g_tn, "%c%d ", what, id);
}

static void *pipe_begin(fp4idx_job_t **jobs, int n) {
  ctx_t *c = jobs[0]->data;
  int id = g_pipe_id++;
  if (id == 0) { /* hold the worker while the rest queue */
    __atomic_store_n(&g_pipe_in, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&g_pipe_hold, __ATOMIC_SEQ_CST)) usleep(100);
  }
  if (id == 3) {
    __atomic_store_n(&g_pipe_in3, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&g_pipe_hold3, __ATOMIC_SEQ_CST)) usleep(100);
  }
  trace('b', id);
  for (int i = 0; i < n; i++) c->order[c->n_work++] = (int)(jobs[i] - c->jobs);
  if (n == 5) return NULL; /* all done in begin: nothing to end */
  pipe_state_t *st = malloc(sizeof *st);
  st->id = id;
  st->first = jobs[0];
  st->n = n;
  return st;
}

static void pipe_end(void *p) {
  pipe_state_t *st = p;
  trace('e', st->id);
  free(st);
}

/* the one-call form (the worker uses the halves when they are set) */
static void pipe_batch(fp4idx_job_t **jobs, int n) {
  void *st = pipe_begin(jobs, n);
  if (st) pipe_end(st);
}

static void plain_work(fp4idx_job_t *j) {
  ctx_t *c = j->data;
  trace('p', (int)(j - c->jobs));
  c->order[c->n_work++] = (int)(j - c->jobs);
}

Test(worker, pipeline_ends_each_batch_after_the_next_begins) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  static ctx_t c;
  ctx_reset(&c);
  g_tn = g_pipe_id = g_pipe_hold = g_pipe_in = g_pipe_hold3 = g_pipe_in3 = 0;
  g_trace[0] = 0;
  cr_assert_eq(fp4idx__worker_start(&c.w, &loop), 0);
  /* job 0 alone (held); then 1..3 (one batch), 4 plain, 5..9 (one batch
   * that begin finishes: no state); later 10 (held), 11..12 */
  for (int i = 0; i < 13; i++) {
    c.jobs[i].done = done_cb;
    c.jobs[i].data = &c;
    if (i == 4) {
      c.jobs[i].work = plain_work;
    } else {
      c.jobs[i].work = work_cb;
      c.jobs[i].batch = pipe_batch;
      c.jobs[i].batch_begin = pipe_begin;
      c.jobs[i].batch_end = pipe_end;
    }
  }
  for (int i = 0; i < 10; i++) {
    fp4idx__worker_submit(&c.w, &c.jobs[i]);
    if (i == 0)
      while (!__atomic_load_n(&g_pipe_in, __ATOMIC_SEQ_CST)) usleep(100);
  }
  __atomic_store_n(&g_pipe_hold, 1, __ATOMIC_SEQ_CST);
  while (c.n_done < 10) uv_run(&loop, UV_RUN_ONCE);
  /* b0 (held) -> b1 (1..3) ends 0 -> plain 4 ends 1 first -> b2 (5..9)
   * leaves nothing to end */
  cr_assert_str_eq(g_trace, "b0 b1 e0 e1 p4 b2 ", "%s", g_trace);
  /* 10 alone (held), then 11..12 behind it: b3 b4 e3, and nothing queued
   * behind 11..12: ended at once, before the stop */
  for (int i = 10; i < 13; i++) {
    fp4idx__worker_submit(&c.w, &c.jobs[i]);
    if (i == 10)
      while (!__atomic_load_n(&g_pipe_in3, __ATOMIC_SEQ_CST)) usleep(100);
  }
  __atomic_store_n(&g_pipe_hold3, 1, __ATOMIC_SEQ_CST);
  while (c.n_done < 13) uv_run(&loop, UV_RUN_ONCE);
  cr_assert_str_eq(g_trace, "b0 b1 e0 e1 p4 b2 b3 b4 e3 e4 ", "%s", g_trace);
  fp4idx__worker_stop(&c.w);
  uv_run(&loop, UV_RUN_DEFAULT);
  cr_assert(c.done_in_order, "done callbacks out of order");
  for (int i = 0; i < 13; i++) cr_assert_eq(c.order[i], i);
  cr_assert_eq(uv_loop_close(&loop), 0);
}

Test(worker, bulk_lane_runs_behind_the_normal_one) {
  int order[21], n;
  lanes_run(0, order, &n);
  cr_assert_eq(n, 21);
  /* blocker, 4 normal, 1 bulk, 4 normal, 1 bulk, 4 normal (9..20 done), then bulk */
  const int want[21] = {0, 9, 10, 11, 12, 1, 13, 14, 15, 16, 2, 17, 18, 19, 20, 3, 4, 5, 6, 7, 8};
  for (int i = 0; i < 21; i++) cr_assert_eq(order[i], want[i], "position %d: job %d", i, order[i]);
}

Test(worker, paused_bulk_lane_waits_until_released) {
  int order[21], n;
  lanes_run(1, order, &n);
  const int want[21] = {0, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 1, 2, 3, 4, 5, 6, 7, 8};
  for (int i = 0; i < 21; i++) cr_assert_eq(order[i], want[i], "position %d: job %d", i, order[i]);
}

Test(stats, latency_buckets) {
  cr_assert_eq(fp4idx__stats_bucket(0.0), 0);
  cr_assert_eq(fp4idx__stats_bucket(1.0), 0);
  cr_assert_eq(fp4idx__stats_bucket(1.5), 1);
  cr_assert_eq(fp4idx__stats_bucket(2.0), 1);
  cr_assert_eq(fp4idx__stats_bucket(3.0), 2);
  cr_assert_eq(fp4idx__stats_bucket(1024.0), 10);
  cr_assert_eq(fp4idx__stats_bucket(1025.0), 11);
  cr_assert_eq(fp4idx__stats_bucket((double)(1 << 24)), 24);
  cr_assert_eq(fp4idx__stats_bucket((double)(1 << 24) + 1), 25);
  cr_assert_eq(fp4idx__stats_bucket(1e12), 25);
  cr_assert_eq(fp4idx__stats_bucket(INFINITY), 25);
  cr_assert_eq(fp4idx__stats_bucket(NAN), 25);
  /* every power of two, just below and just above it, and values between,
   * against the definition: the least i with us <= 2^i (the last bucket
   * beyond 2^24) */
  for (int k = 0; k <= 26; k++)
    for (int j = -2; j <= 2; j++) {
      const double p = ldexp(1.0, k);
      const double us = j == 0 ? p : j == -1 ? nextafter(p, 0) : j == 1 ? nextafter(p, INFINITY)
                                   : j == -2 ? p * 0.75 : p * 1.5;
      int want = FP4IDX_STATS_BUCKETS - 1;
      for (int i = 0; i < FP4IDX_STATS_BUCKETS - 1; i++)
        if (us <= ldexp(1.0, i)) {
          want = i;
          break;
        }
      cr_assert_eq(fp4idx__stats_bucket(us), want, "%.17g", us);
    }
}

Test(stats, record_and_snapshot) {
  fp4idx_daemon_stats_t s, snap;
  cr_assert_eq(fp4idx__stats_init(&s), 0);
  fp4idx__stats_record(&s, FP4IDX_OP_APPEND, 0, 3.0);
  fp4idx__stats_record(&s, FP4IDX_OP_APPEND, -7, 100.0);
  fp4idx__stats_record(&s, FP4IDX_OP_NONE, -2, 1.0);
  fp4idx__stats_record(&s, (fp4idx_op_t)999, -2, 1.0); /* out of range: unknown */
  fp4idx__stats_conn(&s, +1);
  fp4idx__stats_conn(&s, +1);
  fp4idx__stats_conn(&s, -1);
  double up = -1;
  fp4idx__stats_snapshot(&s, &snap, &up);
  cr_assert_geq(up, 0.0);
  cr_assert_eq(snap.connections, 1);
  cr_assert_eq(snap.connections_total, 2);
  cr_assert_eq(snap.ops[FP4IDX_OP_APPEND].count, 2);
  cr_assert_eq(snap.ops[FP4IDX_OP_APPEND].errors, 1);
  cr_assert_eq(snap.ops[FP4IDX_OP_APPEND].hist[2], 1);
  cr_assert_eq(snap.ops[FP4IDX_OP_APPEND].hist[7], 1);
  cr_assert_eq(snap.ops[FP4IDX_OP_APPEND].sum_us, 103.0);
  cr_assert_eq(snap.ops[FP4IDX_OP_NONE].count, 2);
  cr_assert_str_eq(fp4idx__stats_op_name(FP4IDX_OP_NONE), "unknown");
  cr_assert_str_eq(fp4idx__stats_op_name(FP4IDX_OP_SCORE), "score");
  fp4idx__stats_destroy(&s);
}

/* ---- the loop's busy polling (daemon/busypoll.c) ------------------------- */

#include "busypoll.h"

/* Runs the loop (the idle handle keeps uv_run from blocking) for about
 * `us`, then returns whether busy polling is still on. */
static int bp_on_after(uv_loop_t *loop, fp4idx_busypoll_t *bp, double us) {
  double t0 = fp4idx__stats_now_us();
  while (fp4idx__stats_now_us() - t0 < us && bp->on) uv_run(loop, UV_RUN_NOWAIT);
  return __atomic_load_n(&bp->on, __ATOMIC_ACQUIRE);
}

Test(busypoll, stays_on_while_a_reply_is_written_then_stops) {
  uv_loop_t loop;
  cr_assert_eq(uv_loop_init(&loop), 0);
  fp4idx_busypoll_t bp;
  cr_assert_eq(fp4idx__busypoll_init(&bp, &loop, 1000, NULL), 0);
  /* nothing written: off again once spin_us passed without an event */
  fp4idx__busypoll_kick(&bp);
  cr_assert_eq(bp.on, 1);
  cr_assert_eq(bp_on_after(&loop, &bp, 200e3), 0, "busy polling did not stop");
  /* a write in flight holds it on well past spin_us ... */
  fp4idx__busypoll_kick(&bp);
  fp4idx__busypoll_writing(&bp, +1);
  cr_assert_eq(bp_on_after(&loop, &bp, 5000), 1, "stopped while a reply was written");
  /* ... and the end of the write is an event: spin_us more, then off */
  fp4idx__busypoll_writing(&bp, -1);
  cr_assert_eq(bp.writing, 0);
  cr_assert_eq(bp.on, 1);
  cr_assert_eq(bp_on_after(&loop, &bp, 200e3), 0, "busy polling did not stop after the write");
  /* a write that never ends (a client that does not read) holds it on for
   * at most FP4IDX_BUSYPOLL_WRITE_HOLD_US after the last event */
  fp4idx__busypoll_kick(&bp);
  fp4idx__busypoll_writing(&bp, +1);
  cr_assert_eq(bp_on_after(&loop, &bp, 10 * FP4IDX_BUSYPOLL_WRITE_HOLD_US), 0,
               "a stalled write kept the loop polling");
  uv_close((uv_handle_t *)&bp.idle, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  cr_assert_eq(uv_loop_close(&loop), 0);
}
