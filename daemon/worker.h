/* worker.h -- one compute thread per backend, with two FIFO job queues.
 *
 * The loop thread submits jobs; the worker runs job->work (or job->batch
 * over a run of jobs of one kind queued back to back in one lane, what is
 * there now: no waiting) on its own thread, then hands the job back to the
 * loop, which runs job->done. The loop is woken with a uv_async_t and never
 * waits for compute.
 *
 * Pipeline: jobs with batch_begin/batch_end (the server's requests) run in
 * two halves; the worker begins the next batch before it ends this one, so
 * the host prepares batch k+1 (decode, checks, staging, launch) while the
 * device runs batch k's scores, and ends a begun batch as soon as nothing
 * else is queued (a lone request waits for nothing).
 *
 * Order: jobs run in submission order within each of two lanes, the normal
 * one and the bulk one (job->bulk): the worker takes the normal lane first,
 * and one bulk job after every FP4IDX_WORKER_BULK_EVERY normal ones while
 * both wait, so bulk work never starves. The server puts the requests of a
 * connection that pipelines or leaves replies unread in the bulk lane (all
 * of a connection's requests in flight share one lane, so each connection's
 * requests still run in its order), so a client waiting for one reply is not
 * queued behind other clients' backlog. While the server is over its
 * buffer budget the bulk lane waits (fp4idx__worker_pause_bulk): its replies
 * would only be held. Any two requests of different
 * connections that are both unanswered may run in either order; a request
 * runs after every request answered before it arrived (an acknowledged
 * append is visible to the next score of any client).
 */
#ifndef FP4IDX_DAEMON_WORKER_H
#define FP4IDX_DAEMON_WORKER_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

/* Most jobs one batch call takes (what is queued beyond waits its turn). */
#define FP4IDX_WORKER_MAX_BATCH 256

typedef struct fp4idx_job_s fp4idx_job_t;

/* Where finished jobs wait for their done callback: a list under a lock and
 * the uv_async_t that wakes the loop that runs them. The worker has its
 * own (on the loop it was started on); a job may name another (job->home:
 * the I/O loop that owns a request's connection, server.h). */
typedef struct fp4idx_jobq_s {
  pthread_mutex_t mu;
  fp4idx_job_t *head, *tail;  /* guarded by mu */
  uv_async_t *wake;           /* sent after each push */
} fp4idx_jobq_t;

struct fp4idx_job_s {
  void (*work)(fp4idx_job_t *job); /* on the worker thread */
  /* on the loop of job->home (else the worker's), after work; may free job */
  void (*done)(fp4idx_job_t *job);
  /* Optional. Jobs with the same non-NULL batch function that sit next to
   * each other in the queue when the worker takes the first of them run as
   * ONE call batch(jobs, n) (n >= 1, queue order) instead of work() each:
   * e.g. scores from many connections, one backend launch. Only what is
   * already queued is taken (nothing waits for a batch to fill), and a job
   * of another kind in between ends the batch, so the FIFO order of
   * everything else is kept. */
  void (*batch)(fp4idx_job_t **jobs, int n);
  /* Optional, with batch: batch in two halves, so that the worker takes
   * and begins the next batch while this one's device work runs (a
   * pipeline of two): batch_begin(jobs, n) returns a state that
   * batch_end(state) completes (NULL: nothing left to end). The worker ends
   * a begun batch after beginning the next one, or at once when nothing is
   * queued, and before any job without batch_begin runs. */
  void *(*batch_begin)(fp4idx_job_t **jobs, int n);
  void (*batch_end)(void *state);
  fp4idx_job_t *next;              /* queue link, owned by the worker */
  void *data;                      /* the submitter's */
  int bulk;                        /* 1: the bulk lane (see above) */
  /* where done runs: NULL, the worker's own loop; else the loop whose
   * queue this is, which drains it with fp4idx__worker_drain_home */
  fp4idx_jobq_t *home;
};

#define FP4IDX_WORKER_BULK_EVERY 4
#define FP4IDX_WORKER_SPIN_MAX_US 50000

typedef struct fp4idx_worker_s {
  uv_loop_t *loop;
  uv_async_t async;        /* worker -> loop: "jobs are done" */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fp4idx_job_t *todo_head, *todo_tail;  /* normal lane, guarded by mu */
  fp4idx_job_t *bulk_head, *bulk_tail;  /* bulk lane, guarded by mu */
  int normal_streak;       /* normal jobs run while bulk ones waited (mu) */
  int bulk_paused;         /* the bulk lane waits (mu) */
  fp4idx_jobq_t done;      /* finished jobs without a home, for the worker's loop */
  int stopping;            /* guarded by mu; set atomically (the spin reads it without) */
  int sleeping;            /* the worker waits on cv (mu) */
  int started;
  uint64_t queued;         /* jobs submitted and not yet done (atomic: loops submit and
                            * drain, busy polling reads it) */
  uint64_t batches, batched_jobs; /* batch calls and the jobs in them (worker) */
  /* the batches being run (two: one begun and not ended, one running),
   * and which of their jobs were posted (worker) */
  struct fp4idx_worker_run_s {
    fp4idx_job_t *jobs[FP4IDX_WORKER_MAX_BATCH];
    uint8_t posted[FP4IDX_WORKER_MAX_BATCH];
    int n;
    void *state;           /* batch_begin's, until batch_end */
    void (*end)(void *state); /* jobs[0]->batch_end (jobs[0] may be gone by then) */
  } runs[2];
  void (*on_idle)(struct fp4idx_worker_s *w); /* loop: queued dropped to 0 */
  /* loop: after every wake by fp4idx__worker_kick or a post (set before start) */
  void (*on_wake)(struct fp4idx_worker_s *w);
  int spin_us;             /* poll the queue this long before sleeping (set before start) */
  /* and on while *hold_spin is nonzero (atomic int; the loop's busy
   * polling, busypoll.h: a request is near while the loop expects one), at
   * most FP4IDX_WORKER_SPIN_MAX_US; NULL: spin_us only (set before start) */
  const int *hold_spin;
  uint64_t submitted;      /* jobs ever submitted (atomic: the spinning worker reads it) */
  void *data;              /* user's */
} fp4idx_worker_t;

/* Starts the thread and the async handle on `loop` (keeps data, on_idle and
 * spin_us). FP4IDX_OK, or
 * FP4IDX_ENOMEM / FP4IDX_EINTERNAL (thread or handle creation failed). */
int fp4idx__worker_start(fp4idx_worker_t *w, uv_loop_t *loop);

/* Queues a job on the lane job->bulk says (any loop thread: one that runs
 * done callbacks, the worker's own or a job's home). job->work and
 * job->done must be set. */
void fp4idx__worker_submit(fp4idx_worker_t *w, fp4idx_job_t *job);

/* From inside a batch call (worker thread): job (one of the batch) is
 * finished, hand it to the loop now rather than when the whole batch
 * returns, so that it does not wait for its neighbours. The job may be
 * freed by its done callback from then on: do not touch it again. */
void fp4idx__worker_post(fp4idx_worker_t *w, fp4idx_job_t *job);

/* Initialises q (empty), woken through `wake` (an initialised uv_async_t
 * whose callback calls fp4idx__worker_drain_home). FP4IDX_OK or
 * FP4IDX_ENOMEM. */
int fp4idx__jobq_init(fp4idx_jobq_t *q, uv_async_t *wake);
void fp4idx__jobq_destroy(fp4idx_jobq_t *q);

/* The loop of q: runs the done callback of every job finished into q, in
 * the order they finished. */
void fp4idx__worker_drain_home(fp4idx_worker_t *w, fp4idx_jobq_t *q);

/* Any thread: wakes the loop, which calls w->on_wake (coalesced with other
 * wakes, as uv_async_send is). */
void fp4idx__worker_kick(fp4idx_worker_t *w);

/* Holds (on = 1) or releases (0) the bulk lane (loop thread). Stopping runs
 * every job regardless. */
void fp4idx__worker_pause_bulk(fp4idx_worker_t *w, int on);

/* Runs the remaining jobs, joins the thread, delivers their done callbacks
 * and closes the async handle (loop thread only; the loop must still run to
 * finish the close). */
void fp4idx__worker_stop(fp4idx_worker_t *w);

#endif /* FP4IDX_DAEMON_WORKER_H */
