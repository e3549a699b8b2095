/* stats.h -- per-op request counters and latency histograms, and the
 * daemon-wide counters and gauges of `stats` and the Prometheus output
 * (protocol/PROTOCOL.md "stats"): keys appended, rows scored, request and
 * response bytes, errors by status, requests waiting for the worker.
 *
 * Latency buckets (the wire schema's "stats"): bucket i < 25 counts requests
 * with latency <= 2^i us (and above the previous bound); bucket 25 is +inf.
 * Counts are per bucket, not cumulative. Updated from the worker thread and
 * read from any thread under a mutex.
 */
#ifndef FP4IDX_DAEMON_STATS_H
#define FP4IDX_DAEMON_STATS_H

#include <pthread.h>
#include <stdint.h>

#include "fp4idx_codec.h"

#define FP4IDX_STATS_BUCKETS 26 /* 2^0 .. 2^24 us, then +inf */
/* Errors by status: index -status for codes 0..-(N-1) (fp4idx_status.h
 * numbers are small and stable); anything beyond counts in the last. */
#define FP4IDX_STATS_STATUSES FP4IDX_PROTO_MAX_STATUSES

/* Ops are the codec's fp4idx_op_t; FP4IDX_OP_NONE counts requests that
 * could not be decoded far enough to name an op (reported as "unknown"). */
#define FP4IDX_STATS_OPS FP4IDX_OP__COUNT

typedef struct fp4idx_daemon_op_stats_s {
  uint64_t count;
  uint64_t errors;
  uint64_t hist[FP4IDX_STATS_BUCKETS];
  double sum_us;
} fp4idx_daemon_op_stats_t;

typedef struct fp4idx_daemon_stats_s {
  pthread_mutex_t mu;
  double start_s;               /* monotonic seconds at init */
  uint64_t connections;         /* open now */
  uint64_t connections_total;   /* accepted since start */
  fp4idx_daemon_op_stats_t ops[FP4IDX_STATS_OPS];
  uint64_t keys_appended;       /* keys of acknowledged appends */
  uint64_t rows_scored;         /* verify rows of answered scores */
  uint64_t request_bytes;       /* request frames, length prefix included */
  uint64_t response_bytes;      /* response frames, length prefix included */
  uint64_t status_errors[FP4IDX_STATS_STATUSES]; /* by -status; [0] unused */
  uint64_t queue_depth;         /* requests received, not yet on the worker */
  uint64_t channels;            /* channels open now */
  uint64_t channel_calls;       /* channel calls completed */
  uint64_t channel_errors;      /* of which with an error status */
} fp4idx_daemon_stats_t;

/* Wire name of an op, "unknown" for FP4IDX_OP_NONE. */
const char *fp4idx__stats_op_name(fp4idx_op_t op);

int fp4idx__stats_init(fp4idx_daemon_stats_t *s);
void fp4idx__stats_destroy(fp4idx_daemon_stats_t *s);

/* Monotonic clock in microseconds. */
double fp4idx__stats_now_us(void);

/* Records one request: status (0 or negative) and latency in us. */
void fp4idx__stats_record(fp4idx_daemon_stats_t *s, fp4idx_op_t op, int status, double us);

/* After a request was answered (worker thread): the keys it appended or
 * the rows it scored when status is 0, its error status otherwise, and the
 * bytes of its frame (req_bytes, prefix included) and of the reply frame
 * (resp_bytes). req may be a request that failed to decode (op NONE). */
void fp4idx__stats_request(fp4idx_daemon_stats_t *s, const fp4idx_request_t *req,
                           int status, uint64_t req_bytes, uint64_t resp_bytes);

/* The daemon-wide counters of a snapshot into the "stats" reply (the per-op
 * table and the cache/device fields are the caller's). */
void fp4idx__stats_to_wire(const fp4idx_daemon_stats_t *snap, fp4idx_stats_t *st);

/* +1 when a request is queued for the worker, -1 when the worker takes it. */
void fp4idx__stats_queue(fp4idx_daemon_stats_t *s, int delta);

/* Channels: open_delta +1 / -1 when one opens / closes; 0 for a call
 * (counted when it is taken up, before its completion can be seen),
 * with status nonzero for one that failed (counted as a call too). */
void fp4idx__stats_channel(fp4idx_daemon_stats_t *s, int open_delta, int status);

/* A call counted already (fp4idx__stats_channel) that then failed. */
void fp4idx__stats_channel_error(fp4idx_daemon_stats_t *s);

/* +1 / -1 open connections. */
void fp4idx__stats_conn(fp4idx_daemon_stats_t *s, int delta);

/* Bucket index for a latency. */
int fp4idx__stats_bucket(double us);

/* Consistent copy of everything (for the "stats" reply). */
void fp4idx__stats_snapshot(fp4idx_daemon_stats_t *s, fp4idx_daemon_stats_t *out_copy_no_mutex,
                            double *uptime_s);

/* The buffer budget's figures (budget.h) as the server last published
 * them, for the stats op and the metrics endpoint: bytes held, the most
 * held since start, the budget. Written by the loop, read by any thread
 * (__atomic). */
typedef struct fp4idx_buffered_s {
  uint64_t held, peak, budget;
} fp4idx_buffered_t;

#endif /* FP4IDX_DAEMON_STATS_H */
