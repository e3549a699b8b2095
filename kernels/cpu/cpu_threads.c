/* cpu_threads.c -- a small persistent thread pool (see cpu_internal.h). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_internal.h"

struct fp4idx__threads_s {
  int n;                  /* threads including the caller */
  pthread_t *tids;        /* [n - 1] workers */
  pthread_mutex_t mu;
  pthread_cond_t wake;    /* a new generation of work, or stop */
  pthread_cond_t done;    /* pending reached 0 */
  uint64_t gen;           /* bumped by every run */
  int pending;            /* workers still inside the current run */
  int stop;
  int started;            /* workers actually created (cleanup) */
  fp4idx__thread_fn fn;
  void *arg;
};

typedef struct {
  fp4idx__threads_t *t;
  int tid;
} fp4idx__threads_main_arg_t;

static void *fp4idx__threads_main(void *p) {
  fp4idx__threads_main_arg_t wa = *(fp4idx__threads_main_arg_t *)p;
  free(p);
  fp4idx__threads_t *t = wa.t;
  uint64_t seen = 0;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->stop && t->gen == seen) pthread_cond_wait(&t->wake, &t->mu);
    if (t->stop) break;
    seen = t->gen;
    fp4idx__thread_fn fn = t->fn;
    void *arg = t->arg;
    pthread_mutex_unlock(&t->mu);
    fn(arg, wa.tid);
    pthread_mutex_lock(&t->mu);
    if (--t->pending == 0) pthread_cond_signal(&t->done);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

int fp4idx__threads_create(fp4idx__threads_t **out, int n) {
  if (!out || n < 1) return FP4IDX_EINVAL;
  fp4idx__threads_t *t = calloc(1, sizeof *t);
  if (!t) return FP4IDX_ENOMEM;
  t->n = n;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->wake, NULL);
  pthread_cond_init(&t->done, NULL);
  if (n > 1) {
    t->tids = calloc((size_t)n - 1, sizeof *t->tids);
    if (!t->tids) goto fail;
  }
  for (int i = 1; i < n; i++) {
    fp4idx__threads_main_arg_t *wa = malloc(sizeof *wa);
    if (!wa) goto fail;
    wa->t = t;
    wa->tid = i;
    if (pthread_create(&t->tids[i - 1], NULL, fp4idx__threads_main, wa) != 0) {
      free(wa);
      goto fail;
    }
    t->started++;
    char name[32];
    snprintf(name, sizeof name, "fp4idx-cpu%d", i);
    name[15] = '\0'; /* a thread's name holds 15 bytes */
    pthread_setname_np(t->tids[i - 1], name);
  }
  *out = t;
  return FP4IDX_OK;
fail:
  fp4idx__threads_destroy(t);
  return FP4IDX_ENOMEM;
}

int fp4idx__threads_count(const fp4idx__threads_t *t) { return t->started + 1; }

void fp4idx__threads_run(fp4idx__threads_t *t, fp4idx__thread_fn fn, void *arg) {
  if (t->started == 0) {
    fn(arg, 0);
    return;
  }
  pthread_mutex_lock(&t->mu);
  t->fn = fn;
  t->arg = arg;
  t->pending = t->started;
  t->gen++;
  pthread_cond_broadcast(&t->wake);
  pthread_mutex_unlock(&t->mu);
  fn(arg, 0);
  pthread_mutex_lock(&t->mu);
  while (t->pending > 0) pthread_cond_wait(&t->done, &t->mu);
  pthread_mutex_unlock(&t->mu);
}

void fp4idx__threads_destroy(fp4idx__threads_t *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->stop = 1;
  pthread_cond_broadcast(&t->wake);
  pthread_mutex_unlock(&t->mu);
  for (int i = 0; i < t->started; i++) pthread_join(t->tids[i], NULL);
  pthread_cond_destroy(&t->wake);
  pthread_cond_destroy(&t->done);
  pthread_mutex_destroy(&t->mu);
  free(t->tids);
  free(t);
}
