/* commands.h -- the request path, in a straight line:
 *   frame body -> fp4idx_decode_request (strict) -> the op's row of the
 *   command table (generated from FP4IDX_OP_MAP) -> its handler: validate
 *   against the cache (ENOSEQ, ERANGE, ESHAPE) -> cache -> engine ->
 *   response frame.
 * Runs on the worker thread only (it owns the cache there), so requests run
 * one at a time in arrival order.
 */
#ifndef FP4IDX_DAEMON_COMMANDS_H
#define FP4IDX_DAEMON_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

struct fp4idx_daemon_s;

/* Largest response the daemon builds (score logits, read); a request whose
 * answer would be larger gets E2BIG. */
#define FP4IDX_CMD_MAX_RESULT ((uint64_t)1 << 30)

struct fp4idx_regions_s;

/* Executes the request in body[0..len) and returns its whole response frame
 * (4-byte length first) in *frame (malloc'd) / *frame_len. `regions` is the
 * connection's region table (register/unregister change it, references are
 * resolved against it; NULL: the request may not name regions); `fd` the
 * file descriptor that came with the frame (SCM_RIGHTS) or -1: "register"
 * of a host region maps it, and it is closed in every case. Records the
 * request in d->stats with latency measured from t0_us
 * (fp4idx__stats_now_us clock). Never fails: on out-of-memory while encoding
 * it returns a short error frame; if even that fails *frame is NULL (the
 * caller closes the connection). */
void fp4idx__cmd_execute(struct fp4idx_daemon_s *d, struct fp4idx_regions_s *regions, int fd,
                         const uint8_t *body, size_t len, double t0_us, uint8_t **frame,
                         size_t *frame_len);

struct fp4idx_request_s;

/* Runs a logged op (FP4IDX_OPF_MUTATES: append, truncate, drop, fork) read back
 * from the append log through the same handler as a client's request, in a
 * replay context: same checks and effect, no mutation hook (it is not logged
 * again), no stats, no reply. Worker thread or startup (no request running).
 * Returns FP4IDX_OK or the handler's status with its message in msg;
 * FP4IDX_EINVAL for an op that is not logged. */
int fp4idx__cmd_replay(struct fp4idx_daemon_s *d, const struct fp4idx_request_s *req,
                       char *msg, size_t msgcap);

/* Encodes an error response frame {"id": 0, "status", "error"} (for frames
 * the server rejects before decoding). Returns FP4IDX_OK or FP4IDX_ENOMEM. */
int fp4idx__cmd_error_frame(int status, const char *msg, uint8_t **frame,
                            size_t *frame_len);

#endif /* FP4IDX_DAEMON_COMMANDS_H */
