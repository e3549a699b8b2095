/* batch.h -- the one batcher: the requests the worker took, from plan to
 * reply (worker thread).
 *
 * The worker (worker.h) hands over the requests queued back to back in one
 * lane when it takes them (what is there now: nothing waits for a batch to
 * fill). The batcher runs them in queue order: each is admitted by the
 * buffer budget when its reply may be large (budget.h: it waits, or fails
 * E2BIG), then its command handler runs (commands.h) and returns a reply
 * or, for a score, a plan; neighbouring plans with the same head count and
 * top-k form one launch (score.h) up to the backend's batch_work and
 * FP4IDX_SCORE_MAX_LAUNCH bytes; any other request ends the run, and the
 * launches before it are collected and answered before it runs (its
 * backend ops wait for them anyway). Every request is handed back to the
 * loop the moment its reply is final (fp4idx__worker_post), sent first by
 * this thread when nothing of its connection is ahead of it
 * (direct_write.h).
 *
 * Pipeline (worker.h batch_begin / batch_end): begin answers everything
 * but the last launches, which it leaves on the device; end collects them.
 * The worker begins the next batch before it ends this one, so the host
 * prepares batch k+1 while the device runs batch k. At most
 * FP4IDX_BACKEND_INFLIGHT launches are out: the oldest is collected first.
 */
#ifndef FP4IDX_DAEMON_BATCH_H
#define FP4IDX_DAEMON_BATCH_H

#include "server.h"

/* The worker's job functions of a request (job.data = the fp4idx_req_t):
 * begin runs jobs[0..n) and returns the launches still out (NULL: none);
 * end(state) collects and answers them; run is begin then end, and work
 * one job alone. */
void *fp4idx__batch_begin(fp4idx_job_t **jobs, int n);
void fp4idx__batch_end(void *state);
void fp4idx__batch_run(fp4idx_job_t **jobs, int n);
void fp4idx__batch_work(fp4idx_job_t *job);

/* Loop thread: answers req (a loop op, fp4idx__cmd_loop_op) here; its
 * reply is set on return (the caller writes it). */
void fp4idx__batch_on_loop(fp4idx_req_t *req);

#endif /* FP4IDX_DAEMON_BATCH_H */
