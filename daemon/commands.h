/* commands.h -- the request path, in a straight line:
 *   frame body -> fp4idx_decode_request (strict) -> validate against the
 *   cache (ENOSEQ, ERANGE, ESHAPE) -> cache -> engine -> response frame.
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

/* Executes the request in body[0..len) and returns its whole response frame
 * (4-byte length first) in *frame (malloc'd) / *frame_len. Records the
 * request in d->stats with latency measured from t0_us
 * (fp4idx__stats_now_us clock). Never fails: on out-of-memory while encoding
 * it returns a short error frame; if even that fails *frame is NULL (the
 * caller closes the connection). */
void fp4idx__cmd_execute(struct fp4idx_daemon_s *d, const uint8_t *body, size_t len,
                         double t0_us, uint8_t **frame, size_t *frame_len);

/* Encodes an error response frame {"id": 0, "status", "error"} (for frames
 * the server rejects before decoding). Returns FP4IDX_OK or FP4IDX_ENOMEM. */
int fp4idx__cmd_error_frame(int status, const char *msg, uint8_t **frame,
                            size_t *frame_len);

#endif /* FP4IDX_DAEMON_COMMANDS_H */
