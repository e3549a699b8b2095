/* score.h -- score requests from their check to their results, many in one
 * launch.
 *
 * The command handler checks each score against the cache on its own
 * (fp4idx__score_check: unknown sequence, lens, mask, region references:
 * its own error, the others unaffected); the batcher (batch.c) hands the
 * checked ones with the same head count and top-k that were queued side by
 * side to ONE backend call (fp4idx__score_launch: fp4idx_backend_batch_t
 * takes many sequences), whose outputs are split back by
 * fp4idx__score_collect: each request's result tensors are views into the
 * launch's shared output buffer (engine host memory, pinned on CUDA), which
 * lives until the last of its responses is written. A request naming output
 * regions launches alone, so the backend can write straight into them
 * (refs.h). Scores do not change the cache, so running neighbours together
 * gives each exactly the state it would have seen alone
 * (protocol/PROTOCOL.md: per-connection order and per-request atomicity
 * stay as they are).
 *
 * Worker thread only (it owns the cache), except fp4idx__score_out_release
 * and fp4idx__score_out_ready (any thread).
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
  int inputs_finite;             /* fp4idx__score_inputs_finite said 1 for req */
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
  /* in, optional: a mapped word for the launch to store done_value into
   * once the job's outputs are in place (a channel's completion word;
   * fp4idx_backend_batch_t.done_word), only for a job launched alone;
   * out: done_written, 1 when the device took the store on (it happens iff
   * the launch completes), else 0 and the caller stores it */
  volatile uint32_t *done_word;
  uint32_t done_value;
  int32_t done_written;
  /* private */
  fp4idx_backend_seq_t *eng;
  void **owned;                  /* [4 per entry] malloc'd input snapshots */
  void **pinned;                 /* [4 per entry] CUDA-region snapshots, pinned */
  struct fp4idx_engine_s *engine; /* whose host_alloc the pinned ones are */
  uint64_t rows, cells;
  uint64_t work;                 /* sum of rows x heads x width */
  int alone;                     /* writes into regions: launched by itself */
} fp4idx_score_job_t;

/* Checks j (req, regions, msg and msgcap set, inputs_finite, the rest
 * zero) against the cache and its regions and points its backend sequences
 * at its inputs. Returns and sets j->rc: FP4IDX_OK, or the request's error
 * with j->msg. */
int fp4idx__score_check(struct fp4idx_daemon_s *d, fp4idx_score_job_t *j);

/* 1 when every q and w that decoded "score" request req carries in its
 * frame (not in a region) is finite, else 0. Reads only the frame, so the
 * I/O loop runs it after the decode: the worker's fp4idx__score_check
 * then scans only what comes from regions. A 0 changes nothing: the check
 * finds the same error at the same place as without it. */
int fp4idx__score_inputs_finite(const fp4idx_request_t *req);

/* The bytes a checked job's results take in a launch's output buffer. */
uint64_t fp4idx__score_out_bytes(const fp4idx_score_job_t *j);

/* Starts ONE backend call for the checked jobs[0..n) (same heads and topk;
 * a job writing into regions alone) and returns at once where the backend
 * can (fp4idx__engine_score_submit): their inputs may go on return, their
 * results come with fp4idx__score_collect. FP4IDX_OK with *out, or
 * FP4IDX_ENOMEM / the backend's status (nothing launched; the jobs fail
 * with it). */
typedef struct fp4idx_score_launch_s fp4idx_score_launch_t;
int fp4idx__score_launch(struct fp4idx_daemon_s *d, fp4idx_score_job_t *const *jobs, int n,
                         fp4idx_score_launch_t **out);

/* Waits for launch l and splits its results back into its jobs (each has
 * rc and msg, or its results, then; a failed launch of several runs them
 * one by one, so one bad request fails alone). A long full-logits reply
 * (FP4IDX_SCORE_STREAM_MIN) returns with only the first part back. */
void fp4idx__score_collect(struct fp4idx_daemon_s *d, fp4idx_score_launch_t *l);

/* After the replies of l's jobs were handed on: waits for the rest of a
 * streaming launch (each part published, fp4idx__score_out_ready, and the
 * loop woken) and frees l. NULL: nothing. */
void fp4idx__score_launch_end(struct fp4idx_daemon_s *d, fp4idx_score_launch_t *l);

/* Frees what a job holds except its output reference (results array,
 * input copies). */
void fp4idx__score_job_clear(fp4idx_score_job_t *j);

/* Drops one reference to a launch output (NULL: nothing); the last one
 * gives the memory back to the engine. Any thread. */
void fp4idx__score_out_release(void *out);

/* A reply of at least FP4IDX_SCORE_STREAM_MIN bytes of full logits (one
 * request, one sequence) is answered once the first part of them is back
 * from the device, and written as the rest lands (the server asks
 * fp4idx__score_out_ready before each write; each part wakes the loop
 * through the worker's async handle). */
#define FP4IDX_SCORE_STREAM_MIN ((uint64_t)1 << 20)

/* The leading bytes of launch output `out` that are final (UINT64_MAX: all
 * of it; also for NULL), its first byte in *base, and in *failed whether
 * the copy back failed part way (the rest will never come). Any thread. */
uint64_t fp4idx__score_out_ready(const void *out, const uint8_t **base, int *failed);

#endif /* FP4IDX_DAEMON_SCORE_H */
