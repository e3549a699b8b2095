/* worker.h -- one compute thread per backend, with a FIFO job queue.
 *
 * The loop thread submits jobs; the worker runs job->work (or job->batch
 * over a run of neighbouring jobs of one kind) on its own thread in
 * submission order (one queue for every operation is what makes an
 * acknowledged append visible to the next score from any connection), then
 * hands the job back to the loop, which runs job->done. The loop is woken with
 * a uv_async_t and never waits for compute.
 */
#ifndef FP4IDX_DAEMON_WORKER_H
#define FP4IDX_DAEMON_WORKER_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

/* Most jobs one batch call takes (what is queued beyond waits its turn). */
#define FP4IDX_WORKER_MAX_BATCH 256

typedef struct fp4idx_job_s fp4idx_job_t;
struct fp4idx_job_s {
  void (*work)(fp4idx_job_t *job); /* on the worker thread */
  void (*done)(fp4idx_job_t *job); /* on the loop thread, after work; may free job */
  /* Optional. Jobs with the same non-NULL batch function that sit next to
   * each other in the queue when the worker takes the first of them run as
   * ONE call batch(jobs, n) (n >= 1, queue order) instead of work() each:
   * e.g. scores from many connections, one backend launch. Only what is
   * already queued is taken (nothing waits for a batch to fill), and a job
   * of another kind in between ends the batch, so the FIFO order of
   * everything else is kept. */
  void (*batch)(fp4idx_job_t **jobs, int n);
  fp4idx_job_t *next;              /* queue link, owned by the worker */
  void *data;                      /* the submitter's */
};

typedef struct fp4idx_worker_s {
  uv_loop_t *loop;
  uv_async_t async;        /* worker -> loop: "jobs are done" */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fp4idx_job_t *todo_head, *todo_tail;  /* guarded by mu */
  fp4idx_job_t *done_head, *done_tail;  /* guarded by mu */
  int stopping;            /* guarded by mu */
  int started;
  uint64_t queued;         /* jobs submitted and not yet done (loop thread) */
  uint64_t batches, batched_jobs; /* batch calls and the jobs in them (worker) */
  fp4idx_job_t **run;      /* the batch being run, and which of its jobs */
  uint8_t run_posted[FP4IDX_WORKER_MAX_BATCH]; /* were posted (worker) */
  int run_n;
  void (*on_idle)(struct fp4idx_worker_s *w); /* loop: queued dropped to 0 */
  void *data;              /* user's */
} fp4idx_worker_t;

/* Starts the thread and the async handle on `loop`. FP4IDX_OK, or
 * FP4IDX_ENOMEM / FP4IDX_EINTERNAL (thread or handle creation failed). */
int fp4idx__worker_start(fp4idx_worker_t *w, uv_loop_t *loop);

/* Queues a job (loop thread only). job->work and job->done must be set. */
void fp4idx__worker_submit(fp4idx_worker_t *w, fp4idx_job_t *job);

/* From inside a batch call (worker thread): job (one of the batch) is
 * finished, hand it to the loop now rather than when the whole batch
 * returns, so that it does not wait for its neighbours. The job may be
 * freed by its done callback from then on: do not touch it again. */
void fp4idx__worker_post(fp4idx_worker_t *w, fp4idx_job_t *job);

/* Runs the remaining jobs, joins the thread, delivers their done callbacks
 * and closes the async handle (loop thread only; the loop must still run to
 * finish the close). */
void fp4idx__worker_stop(fp4idx_worker_t *w);

#endif /* FP4IDX_DAEMON_WORKER_H */
