/* worker.c -- the compute thread and its two FIFO lanes (see worker.h). */
#define _GNU_SOURCE
#include "worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp4idx_status.h"
#include "log.h"

/* The done callbacks of the finished jobs from j on, in order. */
static void fp4idx__worker_run_done(fp4idx_worker_t *w, fp4idx_job_t *j) {
  while (j) {
    fp4idx_job_t *next = j->next;
    __atomic_sub_fetch(&w->queued, 1, __ATOMIC_ACQ_REL);
    j->done(j); /* may free j */
    j = next;
  }
}

static void fp4idx__worker_drain_done(fp4idx_worker_t *w) {
  fp4idx__worker_drain_home(w, &w->done);
  if (__atomic_load_n(&w->queued, __ATOMIC_ACQUIRE) == 0 && w->on_idle) w->on_idle(w);
}

int fp4idx__jobq_init(fp4idx_jobq_t *q, uv_async_t *wake) {
  q->head = q->tail = NULL;
  q->wake = wake;
  return pthread_mutex_init(&q->mu, NULL) ? FP4IDX_ENOMEM : FP4IDX_OK;
}

void fp4idx__jobq_destroy(fp4idx_jobq_t *q) { pthread_mutex_destroy(&q->mu); }

void fp4idx__worker_drain_home(fp4idx_worker_t *w, fp4idx_jobq_t *q) {
  pthread_mutex_lock(&q->mu);
  fp4idx_job_t *j = q->head;
  q->head = q->tail = NULL;
  pthread_mutex_unlock(&q->mu);
  fp4idx__worker_run_done(w, j);
}

static void fp4idx__worker_async_cb(uv_async_t *h) {
  fp4idx_worker_t *w = h->data;
  fp4idx__worker_drain_done(w);
  if (w->on_wake) w->on_wake(w);
}

void fp4idx__worker_kick(fp4idx_worker_t *w) { uv_async_send(&w->async); }

/* Called with mu held and nothing to run: polls for a submission (or a
 * stop) for up to spin_us, and on while the loop polls (hold_spin), without
 * the lock (a sleeping thread is woken tens of us late, more from a deep
 * idle state of its core; busypoll.h). 1 when one came; mu is held again
 * either way and the caller looks at the queues again before it sleeps. */
static int fp4idx__worker_spin(fp4idx_worker_t *w) {
  uint64_t seen = __atomic_load_n(&w->submitted, __ATOMIC_ACQUIRE);
  pthread_mutex_unlock(&w->mu);
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int got = 0;
  for (;;) {
    if (__atomic_load_n(&w->submitted, __ATOMIC_ACQUIRE) != seen ||
        __atomic_load_n(&w->stopping, __ATOMIC_ACQUIRE)) {
      got = 1;
      break;
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    long us = (t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000;
    if (us >= w->spin_us &&
        (!w->hold_spin || !__atomic_load_n(w->hold_spin, __ATOMIC_ACQUIRE) ||
         us >= FP4IDX_WORKER_SPIN_MAX_US))
      break;
  }
  pthread_mutex_lock(&w->mu);
  return got;
}

/* Hands the jobs of a finished run that its batch did not post to the
 * loop, in order (posted ones may be gone already: not touched). */
static void fp4idx__worker_post_rest(fp4idx_worker_t *w, struct fp4idx_worker_run_s *R) {
  int n = R->n;
  R->n = 0;
  for (int i = 0; i < n; i++)
    if (!R->posted[i]) fp4idx__worker_post(w, R->jobs[i]);
}

/* Ends the begun run *prev (mu not held). */
static void fp4idx__worker_end(fp4idx_worker_t *w, struct fp4idx_worker_run_s **prev) {
  struct fp4idx_worker_run_s *P = *prev;
  *prev = NULL;
  P->end(P->state);
  P->state = NULL;
  fp4idx__worker_post_rest(w, P);
}

static void *fp4idx__worker_main(void *arg) {
  fp4idx_worker_t *w = arg;
  struct fp4idx_worker_run_s *prev = NULL; /* begun, not ended */
  int cur = 0;
  pthread_mutex_lock(&w->mu);
  int spun = 0;
  for (;;) {
    int bulk = w->bulk_head && (!w->bulk_paused || w->stopping);
    if (prev && !w->todo_head && !bulk) {
      /* nothing to overlap with: finish the begun batch now */
      pthread_mutex_unlock(&w->mu);
      fp4idx__worker_end(w, &prev);
      pthread_mutex_lock(&w->mu);
      continue;
    }
    while (!w->todo_head && !(bulk = w->bulk_head && (!w->bulk_paused || w->stopping)) &&
           !w->stopping) {
      /* Poll once before sleeping, then look again under the lock: a stop
       * (or a job) that came meanwhile sent its signal to nobody. */
      if (w->spin_us > 0 && !spun) {
        spun = 1;
        fp4idx__worker_spin(w);
        continue;
      }
      w->sleeping = 1;
      pthread_cond_wait(&w->cv, &w->mu);
      w->sleeping = 0;
    }
    spun = 0;
    bulk = w->bulk_head && (!w->bulk_paused || w->stopping);
    /* The lane: normal first, one bulk run after every BULK_EVERY normal
     * jobs while both wait. */
    fp4idx_job_t **head, **tail;
    int from_normal = w->todo_head && (!bulk || w->normal_streak < FP4IDX_WORKER_BULK_EVERY);
    if (from_normal) {
      head = &w->todo_head;
      tail = &w->todo_tail;
    } else if (bulk) {
      head = &w->bulk_head;
      tail = &w->bulk_tail;
    } else {
      break; /* stopping and nothing left */
    }
    /* The job, and with a batch function its neighbours of the same kind
     * queued behind it in the same lane (what is there now: no waiting). */
    struct fp4idx_worker_run_s *R = &w->runs[cur];
    cur ^= 1;
    fp4idx_job_t *j = *head;
    int n = 0;
    do {
      R->jobs[n++] = j;
      j = j->next;
    } while (R->jobs[0]->batch && j && j->batch == R->jobs[0]->batch &&
             n < FP4IDX_WORKER_MAX_BATCH);
    *head = j;
    if (!*head) *tail = NULL;
    w->normal_streak = from_normal && bulk ? w->normal_streak + n : 0;
    pthread_mutex_unlock(&w->mu);
    memset(R->posted, 0, (size_t)n);
    R->n = n;
    fp4idx_job_t *first = R->jobs[0];
    if (first->batch) {
      w->batches++;
      w->batched_jobs += (uint64_t)n;
    }
    static int x_collect_first = -1; /* experiment: X_COLLECT_FIRST=1 ends the previous run first */
    if (x_collect_first < 0) x_collect_first = getenv("X_COLLECT_FIRST") != NULL;
    if (first->batch && first->batch_begin) {
      /* begin this one, then end the previous: its device work ran under
       * this one's preparation */
      R->end = first->batch_end;
      if (x_collect_first && prev) fp4idx__worker_end(w, &prev);
      R->state = first->batch_begin(R->jobs, n);
      if (prev) fp4idx__worker_end(w, &prev);
      if (R->state)
        prev = R;
      else
        fp4idx__worker_post_rest(w, R);
    } else {
      if (prev) fp4idx__worker_end(w, &prev);
      if (first->batch)
        first->batch(R->jobs, n);
      else
        first->work(first);
      fp4idx__worker_post_rest(w, R);
    }
    pthread_mutex_lock(&w->mu);
  }
  pthread_mutex_unlock(&w->mu);
  if (prev) fp4idx__worker_end(w, &prev);
  return NULL;
}

void fp4idx__worker_post(fp4idx_worker_t *w, fp4idx_job_t *job) {
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < w->runs[r].n; i++)
      if (w->runs[r].jobs[i] == job) w->runs[r].posted[i] = 1;
  job->next = NULL;
  fp4idx_jobq_t *q = job->home ? job->home : &w->done;
  /* read before the push: from then on the job may be gone */
  uv_async_t *wake = q->wake;
  pthread_mutex_lock(&q->mu);
  if (q->tail) q->tail->next = job; else q->head = job;
  q->tail = job;
  pthread_mutex_unlock(&q->mu);
  /* Outside the lock, so the loop's drain never waits on us; the send
   * coalesces and the loop takes the whole list. */
  uv_async_send(wake);
}

int fp4idx__worker_start(fp4idx_worker_t *w, uv_loop_t *loop) {
  void *data = w->data;
  void (*on_idle)(fp4idx_worker_t *) = w->on_idle;
  void (*on_wake)(fp4idx_worker_t *) = w->on_wake;
  int spin_us = w->spin_us;
  const int *hold_spin = w->hold_spin;
  memset(w, 0, sizeof *w);
  w->data = data;
  w->on_idle = on_idle;
  w->on_wake = on_wake;
  w->spin_us = spin_us;
  w->hold_spin = hold_spin;
  w->loop = loop;
  if (pthread_mutex_init(&w->mu, NULL)) return FP4IDX_ENOMEM;
  if (pthread_cond_init(&w->cv, NULL)) goto err_mu;
  if (fp4idx__jobq_init(&w->done, &w->async)) goto err_cv;
  if (uv_async_init(loop, &w->async, fp4idx__worker_async_cb)) goto err_done;
  w->async.data = w;
  if (pthread_create(&w->thread, NULL, fp4idx__worker_main, w)) goto err_async;
  /* named by its creator, so that the name is there once start returns
   * (top -H, ps -L, /proc/PID/task/TID/comm) */
  pthread_setname_np(w->thread, "fp4idx-worker");
  w->started = 1;
  return FP4IDX_OK;
err_async:
  uv_close((uv_handle_t *)&w->async, NULL);
err_done:
  fp4idx__jobq_destroy(&w->done);
err_cv:
  pthread_cond_destroy(&w->cv);
err_mu:
  pthread_mutex_destroy(&w->mu);
  return FP4IDX_EINTERNAL;
}

void fp4idx__worker_submit(fp4idx_worker_t *w, fp4idx_job_t *job) {
  job->next = NULL;
  __atomic_add_fetch(&w->queued, 1, __ATOMIC_ACQ_REL);
  pthread_mutex_lock(&w->mu);
  fp4idx_job_t **head = job->bulk ? &w->bulk_head : &w->todo_head;
  fp4idx_job_t **tail = job->bulk ? &w->bulk_tail : &w->todo_tail;
  if (*tail) (*tail)->next = job; else *head = job;
  *tail = job;
  int sleeping = w->sleeping;
  pthread_mutex_unlock(&w->mu);
  /* The count after the unlock, so that a spinning worker that sees it
   * finds the lock free rather than sleeping on it (which would cost this
   * unlock a futex wake); the signal only when the worker sleeps (read
   * under mu: one not asleep then looks at the queue under mu before it
   * would). On the development box, worker asleep, the futex calls per
   * score went from ~4 to ~3. */
  __atomic_add_fetch(&w->submitted, 1, __ATOMIC_RELEASE);
  if (sleeping) pthread_cond_signal(&w->cv);
}

void fp4idx__worker_pause_bulk(fp4idx_worker_t *w, int on) {
  if (!w->started) return;
  pthread_mutex_lock(&w->mu);
  w->bulk_paused = on;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void fp4idx__worker_stop(fp4idx_worker_t *w) {
  if (!w->started) return;
  pthread_mutex_lock(&w->mu);
  /* atomic: the spinning worker reads it without mu (ThreadSanitizer) */
  __atomic_store_n(&w->stopping, 1, __ATOMIC_RELEASE);
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  if (getenv("X_BATCH_LOG")) /* experiment: the runs' mean size */
    fprintf(stderr, "X worker batches %llu jobs %llu\n", (unsigned long long)w->batches,
            (unsigned long long)w->batched_jobs);
  w->started = 0;
  fp4idx__worker_drain_done(w);
  uv_close((uv_handle_t *)&w->async, NULL);
  fp4idx__jobq_destroy(&w->done);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
}
