/* stages.h -- where a request's time goes: per-stage latency histograms.
 *
 * Every request records the time it spent in each stage of the request path
 * (protocol/PROTOCOL.md, "stats" "stages"). The stages in path order:
 *
 *   read      loop: first byte of the frame seen -> whole frame in memory
 *   queue     loop -> worker: frame decoded -> the worker picks it up
 *   decode    loop: strict decode of the frame body, once, as it completes
 *   execute   worker: the op's host work (checks, cache, staging, and for a
 *             backend that does not time itself, all of its compute)
 *   upload    device backend: host-to-device copies (CUDA events)
 *   kernels   device backend: scorer + top-k kernels (CUDA events); the CPU
 *             backend's score call
 *   download  device backend: device-to-host copies (CUDA events); for a
 *             reply written while its logits come back (score.h,
 *             FP4IDX_SCORE_STREAM_MIN) the first part, the rest in write
 *   encode    worker: response frame built
 *   wake      worker -> loop: response built -> the loop has it
 *   write     loop: response handed to the socket -> written
 *
 * queue + decode + execute + upload + kernels + download + encode is exactly
 * the op latency of "requests" (same clock readings at each boundary), so
 * the two sums agree; read, wake and write lie outside it (a request's time
 * in the daemon from its first byte to its last is the sum of all ten).
 *
 * One histogram per stage, the buckets of stats.h (1 us .. 2^24 us, +inf).
 * Thread-safe (mutex): the worker and the loop both record.
 */
#ifndef FP4IDX_DAEMON_STAGES_H
#define FP4IDX_DAEMON_STAGES_H

#include <pthread.h>
#include <stdint.h>

#include "stats.h"

/* X(enum suffix, wire name, part of the op latency) */
#define FP4IDX_STAGE_MAP(X)       \
  X(READ, "read", 0)              \
  X(QUEUE, "queue", 1)            \
  X(DECODE, "decode", 1)          \
  X(EXECUTE, "execute", 1)        \
  X(UPLOAD, "upload", 1)          \
  X(KERNELS, "kernels", 1)        \
  X(DOWNLOAD, "download", 1)      \
  X(ENCODE, "encode", 1)          \
  X(WAKE, "wake", 0)              \
  X(WRITE, "write", 0)

typedef enum fp4idx_stage_e {
#define FP4IDX__STAGE_ENUM(e, name, in_latency) FP4IDX_STAGE_##e,
  FP4IDX_STAGE_MAP(FP4IDX__STAGE_ENUM)
#undef FP4IDX__STAGE_ENUM
  FP4IDX_STAGE__COUNT
} fp4idx_stage_t;

/* The time one request spent in each stage, us; recorded at once. */
typedef struct fp4idx_stage_times_s {
  double us[FP4IDX_STAGE__COUNT];
} fp4idx_stage_times_t;

typedef struct fp4idx_stage_hist_s {
  uint64_t count;                       /* requests that passed the stage */
  uint64_t hist[FP4IDX_STATS_BUCKETS];
  double sum_us;
} fp4idx_stage_hist_t;

typedef struct fp4idx_stages_s {
  pthread_mutex_t mu;
  fp4idx_stage_hist_t st[FP4IDX_STAGE__COUNT];
} fp4idx_stages_t;

/* Wire name of a stage ("kernels"), "?" when out of range. */
const char *fp4idx__stage_name(fp4idx_stage_t s);

/* 1 when the stage is part of the op latency of "requests". */
int fp4idx__stage_in_latency(fp4idx_stage_t s);

/* Zeroed histograms. FP4IDX_OK or FP4IDX_ENOMEM (mutex). */
int fp4idx__stages_init(fp4idx_stages_t *s);
void fp4idx__stages_destroy(fp4idx_stages_t *s);

/* Adds one request: every stage i with mask bit i set gets t->us[i] (< 0
 * counts as 0). One lock for the whole request. */
void fp4idx__stages_record(fp4idx_stages_t *s, const fp4idx_stage_times_t *t,
                           uint32_t mask);

/* Adds `us` to one stage (the loop's read/wake/write). */
void fp4idx__stages_add(fp4idx_stages_t *s, fp4idx_stage_t stage, double us);

/* Consistent copy of every histogram into out[FP4IDX_STAGE__COUNT]. */
void fp4idx__stages_snapshot(fp4idx_stages_t *s, fp4idx_stage_hist_t *out);

/* Mask of the stages inside the op latency (queue .. encode). */
uint32_t fp4idx__stages_latency_mask(void);

#endif /* FP4IDX_DAEMON_STAGES_H */
