/* channel.h -- the daemon's side of channels (PROTOCOL.md "Channels"):
 * stream-ordered score calls rung by a client's CUDA stream in a shared
 * control block (protocol/fp4idx_channel.h).
 *
 *   channel_open (worker)  map and check the block, bind the connection's
 *                          regions, add the channel to the watched set
 *   watcher thread         spins on the doorbells of every open channel
 *                          (backs off to sleeping when none rang lately);
 *                          takes a rung call: copies its descriptor, writes
 *                          the doorbell back to 0, marks the slot taken,
 *                          and queues the channel's job on the worker
 *                          itself (in order with the socket's requests; no
 *                          loop in between)
 *   worker                 each taken call: fp4idx__channel_call_check (the
 *                          descriptor against the channel's regions -> a
 *                          score request of one entry), then the compute
 *                          side (fp4idx__channel_run_fn), then the
 *                          completion word, with the status, after the
 *                          outputs (stored by the device's stream right
 *                          after them when the launch took it on)
 *   channel_close, or the connection closing (worker): out of the watched
 *                          set, every taken call completed with ECONN, the
 *                          block unpinned and unmapped
 *
 * The seam for the request path: a checked call is an fp4idx_channel_call_t
 * (heads, topk and one fp4idx_score_seq_t whose tensors are references into
 * the connection's regions), exactly what the socket's decoder makes of a
 * `score` request naming regions; the compute side takes it with the
 * connection's region table and returns the status a `score` reply would
 * carry (fp4idx__channel_run_fn). channel_run.c is the compute side.
 *
 * Threads: the channel set's mutex guards the set, each channel's taken
 * slots and its job state; the block is touched by the watcher (doorbells,
 * descriptors) only while the channel is in the set, and by the worker.
 */
#ifndef FP4IDX_DAEMON_CHANNEL_H
#define FP4IDX_DAEMON_CHANNEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "fp4idx_channel.h"
#include "fp4idx_codec.h"
#include "regions.h"
#include "stats.h"
#include "worker.h"

struct fp4idx_daemon_s;

/* The watcher spins this long after the last call it took, then sleeps
 * between scans, from FP4IDX_CHANNEL_NAP_MIN_US doubling up to
 * FP4IDX_CHANNEL_NAP_MAX_US; with no channel open it waits for one. */
#define FP4IDX_CHANNEL_SPIN_US 50000
#define FP4IDX_CHANNEL_NAP_MIN_US 20
#define FP4IDX_CHANNEL_NAP_MAX_US 1000

typedef struct fp4idx_channel_s fp4idx_channel_t;

/* The compute side: runs a checked call on the worker thread against the
 * connection's regions rs, with the outputs in place when it returns.
 * `done` (the call's completion word, mapped) and done_value (its word for
 * success) may go with the launch: *done_written = 1 when the device
 * stored done_value there after the outputs, else 0 (the caller writes
 * the completion). Returns 0 or the status a socket `score` would have
 * answered, with the reason in msg. */
typedef int (*fp4idx__channel_run_fn)(struct fp4idx_daemon_s *d, fp4idx_regions_t *rs,
                                      const fp4idx_channel_call_t *call,
                                      volatile uint32_t *done, uint32_t done_value,
                                      int *done_written, char *msg, size_t cap);

/* Every open channel of the daemon. */
typedef struct fp4idx_channels_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;          /* the watcher waits here while no channel is open */
  fp4idx_channel_t *open;     /* the watched set (mu) */
  uint64_t nopen;             /* channels open now (mu) */
  fp4idx_daemon_stats_t *stats; /* the counts of `stats` */
  int thread_started, stopping; /* (mu) */
  pthread_t thread;
  int ready;                  /* initialised (fp4idx__channels_fini undoes it) */
  fp4idx_worker_t *worker;
  struct fp4idx_daemon_s *d;
  fp4idx__channel_run_fn run;
} fp4idx_channels_t;

/* Sets up the channel set (the watcher thread starts with the first
 * channel and queues jobs on `worker`). Returns FP4IDX_OK or
 * FP4IDX_EINTERNAL. Loop thread. */
int fp4idx__channels_init(fp4idx_channels_t *cs, fp4idx_worker_t *worker,
                          fp4idx_daemon_stats_t *stats, struct fp4idx_daemon_s *d,
                          fp4idx__channel_run_fn run);

/* Stops the watcher and waits for its thread to end: from here it queues
 * no job on the worker (a channel_open is refused). Before the worker
 * stops, so that the jobs it queued run (or are drained) while the worker
 * is there. Loop thread. */
void fp4idx__channels_stop(fp4idx_channels_t *cs);

/* Stops the watcher if it runs, then frees the set's lock and condition,
 * which channel jobs and closes use: after the worker has stopped (every
 * job run, every channel closed with its connection). Loop thread. */
void fp4idx__channels_fini(fp4idx_channels_t *cs);

/* The `channel_open` op: maps the block from fd (which the caller closes),
 * checks it and the regions, starts watching. Worker thread. Returns
 * FP4IDX_OK with *resp set; EREGION, ENOREGION, E2BIG, ENOMEM, EINTERNAL
 * with the reason in msg. */
int fp4idx__channel_open(fp4idx_channels_t *cs, fp4idx_regions_t *rs, int fd,
                         const fp4idx_channel_open_req_t *req,
                         fp4idx_channel_open_resp_t *resp, char *msg, size_t cap);

/* The `channel_close` op. Worker thread. FP4IDX_OK or FP4IDX_ENOREGION. */
int fp4idx__channel_close(fp4idx_regions_t *rs, uint64_t id, char *msg, size_t cap);

/* The compute side (channel_run.c): the call as the score plan of one
 * entry, checked, launched and collected on the worker, no reply frame. */
int fp4idx__channel_run_score(struct fp4idx_daemon_s *d, fp4idx_regions_t *rs,
                              const fp4idx_channel_call_t *call, volatile uint32_t *done,
                              uint32_t done_value, int *done_written, char *msg, size_t cap);

/* The check of one taken call: the descriptor copied at the ring against
 * the channel's bound regions (fp4idx_channel_desc_check). */
int fp4idx__channel_call_check(const fp4idx_channel_t *ch, uint32_t slot,
                               fp4idx_channel_call_t *call, char *msg, size_t cap);

#endif /* FP4IDX_DAEMON_CHANNEL_H */
