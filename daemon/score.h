/* score.h -- score requests from validation to results, many in one launch.
 *
 * The worker hands over the score requests that were queued back to back
 * (worker.h: job->batch); each is checked against the cache on its own
 * (unknown sequence, lens, mask: its own error, the others unaffected), and
 * the valid ones with the same head count and top-k go to the backend as
 * ONE call (fp4idx_backend_batch_t takes many sequences), whose outputs are
 * split back: each request's result tensors are views into the launch's
 * shared output buffer (engine host memory, pinned on CUDA), which lives
 * until the last of its responses is written. A request naming output
 * regions launches alone, so the backend can write straight into them
 * (refs.h). A launch takes requests up
 * to the backend's batch_work (its fixed cost amortized; beyond that a
 * request would only wait for its neighbours). Scores do not change the
 * cache, so running neighbours together gives each exactly the state it
 * would have seen alone (protocol/PROTOCOL.md: per-connection order and
 * per-request atomicity stay as they are).
 *
 * Worker thread only (it owns the cache), except fp4idx__score_out_release
 * (any thread).
 */
#ifndef FP4IDX_DAEMON_SCORE_H
#define FP4IDX_DAEMON_SCORE_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_backend.h"
#include "fp4idx_codec.h"
#include "regions.h"

struct fp4idx_daemon_s;

/* Largest output one launch writes (several requests together); a request
 * is refused with E2BIG above FP4IDX_CMD_MAX_RESULT alone. */
#define FP4IDX_SCORE_MAX_LAUNCH ((uint64_t)1 << 30)


typedef struct fp4idx_score_job_s {
  /* in */
  const fp4idx_request_t *req;   /* a decoded "score" */
  const fp4idx_regions_t *regions; /* the connection's (references), or NULL */
  char *msg;                     /* error detail, msgcap bytes */
  size_t msgcap;
  /* out: rc 0 and results[nresults] (views into out), or rc < 0 and msg */
  int rc;
  fp4idx_score_result_t *results;
  size_t nresults;
  void *out;                     /* a reference to the launch's output:
                                    fp4idx__score_out_release once sent */
  fp4idx_backend_timing_t timing; /* of the launch it was part of; without
                                     device timing, kernels_us = the host
                                     time of the backend call */
  int launch_size;               /* requests in that launch */
  /* private */
  fp4idx_backend_seq_t *eng;
  void **owned;
  uint64_t rows, cells;
  uint64_t work;                 /* sum of rows x heads x width */
  int group;
  int alone;                     /* writes into regions: launched by itself */
} fp4idx_score_job_t;

/* Runs jobs[0..n) (queue order) as described above; every job gets rc and
 * msg, or its results. */
void fp4idx__score_run(struct fp4idx_daemon_s *d, fp4idx_score_job_t *jobs, int n);

/* The same in two halves, so that the worker prepares what comes next while
 * the device runs these: fp4idx__score_start checks every job and queues
 * its launches (fp4idx__engine_score_submit; the jobs' inputs may go once
 * it returns); fp4idx__score_end waits for them and splits the results
 * back, after which every job has rc and msg or its results. The jobs must
 * stay in place in between. start returns NULL only when out of memory
 * (every job then failed with ENOMEM); end(NULL) does nothing. */
typedef struct fp4idx_score_pending_s fp4idx_score_pending_t;
fp4idx_score_pending_t *fp4idx__score_start(struct fp4idx_daemon_s *d, fp4idx_score_job_t *jobs,
                                            int n);
void fp4idx__score_end(struct fp4idx_daemon_s *d, fp4idx_score_pending_t *p);

/* fp4idx__score_end, handing the jobs of each launch to done(arg, jobs, n)
 * as soon as that launch is collected (each of them has rc and msg or its
 * results then), in launch order, so that their replies need not wait for
 * the launches after them. Jobs that never launched (their own checks
 * failed) are not passed, nor, when memory ran out, those of a launch
 * collected inside fp4idx__score_start: the caller answers every job not
 * passed once this returns. done may be NULL. */
typedef void (*fp4idx_score_done_fn)(void *arg, fp4idx_score_job_t *const *jobs, int n);
void fp4idx__score_end_each(struct fp4idx_daemon_s *d, fp4idx_score_pending_t *p,
                            fp4idx_score_done_fn done, void *arg);

/* Frees what a job holds except its output reference (results array,
 * input copies). */
void fp4idx__score_job_clear(fp4idx_score_job_t *j);

/* Drops one reference to a launch output (NULL: nothing); the last one
 * gives the memory back to the engine. Any thread. */
void fp4idx__score_out_release(void *out);

/* A reply of at least FP4IDX_SCORE_STREAM_MIN bytes of full logits (one
 * request, one sequence) is answered once the first part of them is back
 * from the device, and written as the rest lands (the server asks
 * fp4idx__score_out_ready before each write, and is told of each part by
 * fp4idx__server_stream_progress). */
#define FP4IDX_SCORE_STREAM_MIN ((uint64_t)1 << 20)

/* The leading bytes of launch output `out` that are final (UINT64_MAX: all
 * of it; also for NULL), its first byte in *base, and in *failed whether
 * the copy back failed part way (the rest will never come). Any thread. */
uint64_t fp4idx__score_out_ready(const void *out, const uint8_t **base, int *failed);

#endif /* FP4IDX_DAEMON_SCORE_H */
