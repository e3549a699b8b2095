/* client_internal.h -- the connection struct and the transport of
 * libfp4idx-client (not installed). conn.c moves frames; client.c builds
 * requests and reads responses. */
#ifndef FP4IDX_CLIENT_INTERNAL_H
#define FP4IDX_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "fp4idx_client.h"
#include "fp4idx_codec.h"

/* Request tensors this long or longer are sent from the caller's memory
 * (writev) instead of being copied into the frame (client.c). */
#define FP4IDX__CLIENT_SPLIT_MIN 4096

struct fp4idx_client_s {
  int fd;                 /* -1 when not connected */
  int timeout_ms;         /* 0 = no limit */
  int busy_poll_us;       /* spin on recv this long before sleeping in poll,
                             or FP4IDX_CLIENT_BUSY_POLL_AUTO (spin.h) */
  int64_t sent_us;        /* when the last request went out, until its reply's
                             first bytes come (0: none awaited) */
  int64_t spin_recent_us; /* recent waits for a reply (fp4idx__client_spin_learn) */
  uint64_t next_id;       /* id of the next request */
  uint64_t max_frame;     /* daemon's request limit once known, else 0 */
  int channels;           /* channels open on this connection (channel.c) */
  /* The reply region (reply_region.c): fp4idx_client_topk's results of at
   * least reply_min bytes come back through it (0: always the socket). */
  size_t reply_min;
  uint64_t reply_id;      /* its id on the daemon (0: none on this connection) */
  void *reply_ptr;        /* this process's mapping of it */
  size_t reply_size;
  fp4idx_status_t last_status;
  char last_error[512];
};

/* Records status and a printf-style message as the call's result and
 * returns status. FP4IDX_OK clears the message. */
fp4idx_status_t fp4idx__client_fail(fp4idx_client_t *c, fp4idx_status_t st,
                                    const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Closes the socket (keeps the handle; the reply region is unmapped: the
 * daemon releases it with the connection). */
void fp4idx__client_disconnect(fp4idx_client_t *c);

/* Whether results of `bytes` bytes come back through the reply region. */
int fp4idx__client_reply_wanted(const fp4idx_client_t *c, size_t bytes);

/* The connection's reply region with room for `bytes`: *ptr its mapping
 * here, *id its region id; made (or replaced by a larger one) as needed.
 * Returns FP4IDX_OK, or the error of fp4idx_client_region_create /
 * _unregister (the region is then gone). */
fp4idx_status_t fp4idx__client_reply_region(fp4idx_client_t *c, size_t bytes, void **ptr,
                                            uint64_t *id);

/* Unmaps the reply region and forgets it (nothing sent to the daemon). */
void fp4idx__client_reply_forget(fp4idx_client_t *c);

/* A memfd of `size` bytes (named `name`), sealed with `seals` (F_SEAL_*),
 * mapped shared into *ptr: what a host region or a channel's control block
 * is. Returns the fd (the caller closes it once the daemon has it), or -1
 * with errno set and nothing left open or mapped. */
int fp4idx__client_memfd_map(const char *name, size_t size, unsigned seals, void **ptr);

/* Absolute deadline in ms of CLOCK_MONOTONIC for a call starting now
 * (INT64_MAX without a timeout). */
int64_t fp4idx__client_deadline(const fp4idx_client_t *c);

/* Sends an encoded frame given as n pieces (header included, as the
 * codec's split encoders lay it out; the iovecs are consumed), with `fd`
 * (>= 0) passed as SCM_RIGHTS on its first bytes (the same sendmsg; for
 * "register" of a host region). Handles short writes and EINTR; never
 * raises SIGPIPE. Returns OK; ETIMEDOUT (the connection is then closed);
 * ECONN (the peer went away; the socket is left open so that a reply the
 * daemon sent before closing can still be read -- the caller must
 * disconnect). */
fp4idx_status_t fp4idx__client_sendv(fp4idx_client_t *c, struct iovec *iov, int n, int fd,
                                     int64_t deadline);

/* Receives one frame; *body is malloc'ed (caller frees), *len its length.
 * Returns OK, ECONN (closed, even mid-frame), ETIMEDOUT, E2BIG (announced
 * length above FP4IDX_CLIENT_MAX_RESPONSE), ENOMEM; on error the connection
 * is closed and *body is NULL. */
fp4idx_status_t fp4idx__client_recv_frame(fp4idx_client_t *c, char **body,
                                          size_t *len, int64_t deadline);

/* Reads exactly len bytes of the response stream into dst (the caller's
 * array: tensors land there without an intermediate buffer). OK, or ECONN /
 * ETIMEDOUT with the connection closed. */
fp4idx_status_t fp4idx__client_recv_exact(fp4idx_client_t *c, void *dst, size_t len,
                                          int64_t deadline);

/* Reads what is there, 1..cap bytes (waits for at least one): *got. OK, or
 * ECONN / ETIMEDOUT with the connection closed. */
fp4idx_status_t fp4idx__client_recv_some(fp4idx_client_t *c, void *dst, size_t cap,
                                         size_t *got, int64_t deadline);

/* Receives the response to score request `id` (one sequence `seq`, `rows`
 * rows; topk 0: full logits into logits[0..logits_cap) floats and *width =
 * W; topk k: positions/logits [rows,k], counts [rows] (counts may be NULL))
 * straight from the socket into those arrays (recv_score.c). Returns OK; the
 * daemon's error (connection kept); E2BIG when the logits do not fit (they
 * are read and dropped; *width tells W; connection kept); EPROTO (malformed:
 * closed); connection errors. On EPROTO or a connection error the arrays
 * may hold part of the response. */
fp4idx_status_t fp4idx__client_recv_score(fp4idx_client_t *c, uint64_t id, uint64_t seq,
                                          uint32_t rows, uint32_t topk, float *logits,
                                          size_t logits_cap, int32_t *positions,
                                          int32_t *counts, uint32_t *width, int64_t deadline);

/* One round trip of req (its id assigned here) for an op whose response
 * fields are all integers: *resp gets the decoded response (nothing in it
 * points into the receive buffer, which is freed). The typed calls
 * generated from the op table (client_ops_gen.c) go through it.
 * Returns FP4IDX_OK, the daemon's status (the connection stays usable) or
 * a connection error, with the message recorded on c. */
fp4idx_status_t fp4idx__client_call(fp4idx_client_t *c, fp4idx_request_t *req,
                                    fp4idx_response_t *resp);

/* The same with `fd` (>= 0) passed as SCM_RIGHTS with the frame (host
 * regions, channel control blocks); -1: none. */
fp4idx_status_t fp4idx__client_call_fd(fp4idx_client_t *c, fp4idx_request_t *req, int fd,
                                       fp4idx_response_t *resp);

#endif
