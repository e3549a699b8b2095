/* commands.h -- the command table and its handlers.
 *
 * A request arrives here decoded (the server decodes each frame once, on
 * the loop) as an fp4idx_cmd_call_t; fp4idx__cmd_exec looks up its op's
 * row of the command table (generated from FP4IDX_OP_MAP) and runs the
 * handler: it validates against the cache (ENOSEQ, ERANGE, ESHAPE), then
 * changes the cache or reads it, and the reply is encoded at once -- except
 * for a score, whose handler only checks it and returns the plan (the
 * checked job: sequences, shapes, where its outputs go) for the batcher
 * (batch.c) to launch with its neighbours; fp4idx__cmd_finish encodes its
 * reply once the launch is collected. Nothing here calls back up: every
 * result is a return value or the call's reply.
 * Worker thread (it owns the cache), in queue order; hello/info/stats may
 * run on the loop (fp4idx__cmd_loop_op).
 */
#ifndef FP4IDX_DAEMON_COMMANDS_H
#define FP4IDX_DAEMON_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_codec.h"
#include "score.h"
#include "stages.h"

struct fp4idx_daemon_s;

/* Largest response the daemon builds (score logits, read); a request whose
 * answer would be larger gets E2BIG. */
#define FP4IDX_CMD_MAX_RESULT ((uint64_t)1 << 30)

/* Result tensors at least this large are sent from the backend's output
 * buffer (writev), not copied into the response bytes. */
#define FP4IDX_CMD_SPLIT_MIN 4096u

/* A response ready to send: frame[0..frame_len) (4-byte length first) with
 * payloads[i] spliced in at frame offset payloads[i].at, in order; the
 * payloads point into `out` (engine host memory). total_len is what goes on
 * the wire. The server frees it once written (score.h: fp4idx__score_out_release
 * for `out`). */
typedef struct fp4idx_cmd_reply_s {
  uint8_t *frame;
  size_t frame_len;
  fp4idx_payload_t *payloads;
  size_t npayloads;
  void *out;
  size_t total_len;
} fp4idx_cmd_reply_t;

/* Error detail of a request, with its NUL. */
#define FP4IDX_CMD_MSG 320

struct fp4idx_regions_s;

/* One request on its way through the command layer. The caller sets req
 * (decoded; its views point into the frame body, which stays), len (the
 * body's bytes), regions (the connection's table: register/unregister
 * change it, references resolve against it; NULL: no regions), fd (came
 * with the frame by SCM_RIGHTS, or -1: "register" of a host region maps it;
 * closed once the call is answered), rc and msg (the decode's status, and
 * FP4IDX_CMD_MSG bytes for the detail), score and reply (its room for a
 * score's plan and for the answer) and the clock readings t0_us (frame
 * complete), td_us (decoded), tq_us (picked up by the worker) and read_us
 * (first byte to frame complete), for stats and stages
 * (fp4idx__stats_now_us clock). A reply is never missing: on out-of-memory
 * while encoding it is a short error frame; if even that fails
 * reply->frame is NULL (the caller closes the connection). */
typedef struct fp4idx_cmd_call_s {
  const fp4idx_request_t *req;
  size_t len;
  struct fp4idx_regions_s *regions;
  int fd;
  int rc;
  char *msg;
  double t0_us, td_us, tq_us, te_us, read_us;
  fp4idx_score_job_t *score;     /* a score's plan (fp4idx__cmd_exec returned 1) */
  fp4idx_cmd_reply_t *reply;     /* the answer, once final */
  /* 1: a call that came without a frame and wants none back (a channel
   * call, channel.h): its status is call->rc with call->msg, reply stays
   * empty, and stats count no wire bytes for it */
  int no_frame;
  /* 1: the loop found every q and w in the frame finite
   * (fp4idx__score_inputs_finite): the worker's check skips them */
  int inputs_finite;
} fp4idx_cmd_call_t;

/* Runs call's handler (worker thread; the loop for a loop op). Returns 0
 * when call->reply is final (the op ran or failed: its status is in
 * call->rc; a mutation is published, fp4idx__cmd_publish), or 1 for a
 * score that passed its checks: call->score is the plan to launch
 * (fp4idx__score_launch / _collect), answered by fp4idx__cmd_finish. A
 * failed decode (call->rc set) is answered with its error. */
int fp4idx__cmd_exec(struct fp4idx_daemon_s *d, fp4idx_cmd_call_t *call);

/* The reply of a score plan whose launch was collected (or never ran:
 * call->score.rc and msg say why): call->reply becomes final. */
void fp4idx__cmd_finish(struct fp4idx_daemon_s *d, fp4idx_cmd_call_t *call);

/* An upper bound of the reply frame of a decoded read or score, from the
 * cache as it is now: what the buffer budget admits before it runs (0 for
 * every other op, and for a request that will fail: its reply is an
 * error). Worker thread. */
uint64_t fp4idx__cmd_reply_bound(struct fp4idx_daemon_s *d, const fp4idx_request_t *req);

/* Requests at most this long may be answered on the loop. */
#define FP4IDX_CMD_LOOP_MAX 256u

/* 1 when a request decoded with status rc from a body of len bytes may be
 * answered on the loop: at most FP4IDX_CMD_LOOP_MAX bytes and an op with
 * FP4IDX_OPF_LOOP (hello, info, stats: they read nothing the worker
 * changes but d->pub and the stats, both safe from any thread), when its
 * connection has nothing else in flight -- no worker hop, and the reply
 * order is trivially kept. */
int fp4idx__cmd_loop_op(const fp4idx_request_t *req, int rc, size_t len);

/* Publishes the cache's counts into d->pub (worker thread, after a
 * mutation; and once before serving). */
void fp4idx__cmd_publish(struct fp4idx_daemon_s *d);

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
