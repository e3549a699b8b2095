/* client_internal.h -- the connection struct and the transport of
 * libfp4idx-client (not installed). conn.c moves frames; client.c builds
 * requests and reads responses. */
#ifndef FP4IDX_CLIENT_INTERNAL_H
#define FP4IDX_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_client.h"

struct fp4idx_client_s {
  int fd;                 /* -1 when not connected */
  int timeout_ms;         /* 0 = no limit */
  int busy_poll_us;       /* spin on recv this long before sleeping in poll */
  uint64_t next_id;       /* id of the next request */
  uint64_t max_frame;     /* daemon's request limit once known, else 0 */
  fp4idx_status_t last_status;
  char last_error[512];
};

/* Records status and a printf-style message as the call's result and
 * returns status. FP4IDX_OK clears the message. */
fp4idx_status_t fp4idx__client_fail(fp4idx_client_t *c, fp4idx_status_t st,
                                    const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Closes the socket (keeps the handle). */
void fp4idx__client_disconnect(fp4idx_client_t *c);

/* Absolute deadline in ms of CLOCK_MONOTONIC for a call starting now
 * (INT64_MAX without a timeout). */
int64_t fp4idx__client_deadline(const fp4idx_client_t *c);

/* Sends len bytes of an encoded frame (header included, as the codec's
 * encoders produce it). Handles short writes and EINTR; never raises
 * SIGPIPE. Returns OK; ETIMEDOUT (the connection is then closed); ECONN
 * (the peer went away; the socket is left open so that a reply the daemon
 * sent before closing can still be read -- the caller must disconnect). */
fp4idx_status_t fp4idx__client_send(fp4idx_client_t *c, const void *frame,
                                    size_t len, int64_t deadline);

/* Like fp4idx__client_send, with `fd` passed as SCM_RIGHTS on the frame's
 * first bytes (the same sendmsg), for "register" of a host region. */
fp4idx_status_t fp4idx__client_send_fd(fp4idx_client_t *c, const void *frame,
                                       size_t len, int fd, int64_t deadline);

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

#endif
