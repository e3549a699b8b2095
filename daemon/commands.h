/* commands.h -- the request path, in a straight line:
 *   frame body -> fp4idx_decode_request (strict) -> the op's row of the
 *   command table (generated from FP4IDX_OP_MAP) -> its handler: validate
 *   against the cache (ENOSEQ, ERANGE, ESHAPE) -> cache -> engine ->
 *   response frame.
 * Runs on the worker thread (it owns the cache there), in arrival order; a
 * batch of queued requests runs in that order with neighbouring scores
 * launched together (fp4idx__cmd_execute_batch); hello/info/stats may run
 * on the loop (fp4idx__cmd_loop_op).
 */
#ifndef FP4IDX_DAEMON_COMMANDS_H
#define FP4IDX_DAEMON_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_codec.h"
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
 * the wire. Free with fp4idx__cmd_reply_free once written. */
typedef struct fp4idx_cmd_reply_s {
  uint8_t *frame;
  size_t frame_len;
  fp4idx_payload_t *payloads;
  size_t npayloads;
  void *out;
  size_t total_len;
  int deferred;  /* not run: the budget did not admit its reply yet (frame NULL) */
} fp4idx_cmd_reply_t;

/* The answers of a job's admit callback (fp4idx_cmd_job_t). */
typedef enum {
  FP4IDX_CMD_ADMIT_OK = 0, /* build the reply */
  FP4IDX_CMD_ADMIT_LATER,  /* not now: the request is not run (reply->deferred) */
  FP4IDX_CMD_ADMIT_NEVER   /* never: the request fails with E2BIG and the message */
} fp4idx_cmd_admit_t;

struct fp4idx_regions_s;

/* One request of a batch: its frame body; `regions`, the connection's
 * region table (register/unregister change it, references are resolved
 * against it; NULL: the request may not name regions); `fd`, the file
 * descriptor that came with the frame (SCM_RIGHTS) or -1 ("register" of a
 * host region maps it; it is closed in every case); t0_us, the frame
 * complete, and tq_us, picked up by the worker (fp4idx__stats_now_us
 * clock), for stats and stages (times->us[FP4IDX_STAGE_READ] preset by the
 * caller); and where its reply goes. A reply is never missing: on
 * out-of-memory while encoding it is a short error frame; if even that
 * fails reply->frame is NULL (the caller closes the connection). */
typedef struct fp4idx_cmd_job_s {
  const uint8_t *body;
  size_t len;
  struct fp4idx_regions_s *regions; /* the connection's, or NULL */
  int fd;                        /* came with the frame, or -1; closed once run */
  double t0_us, tq_us;
  fp4idx_stage_times_t *times;
  fp4idx_cmd_reply_t *reply;
  /* optional: called as soon as *reply is final (before later jobs run) */
  void (*finished)(void *arg);
  void *arg;
  /* optional: asked, just before a read or a score runs, whether a reply of
   * at most `bytes` bytes may be built now (the server's buffer budget);
   * on FP4IDX_CMD_ADMIT_NEVER it writes the reason into msg[0..msgcap).
   * NULL: every reply is built. */
  fp4idx_cmd_admit_t (*admit)(void *admit_arg, uint64_t bytes, char *msg, size_t msgcap);
  void *admit_arg;
} fp4idx_cmd_job_t;

/* Executes jobs[0..n) (queue order, as the worker took them) with the
 * result of running them one by one: each maximal run of neighbouring
 * score requests goes to daemon/score.c as one batch (one backend launch
 * per head count and top-k; a score writing into regions launches alone),
 * every other request runs alone in its place. A read or score whose
 * admit callback answers LATER is not run: it is finished at once with
 * reply->deferred set (no stats, no reply), and its caller runs it again
 * later; jobs of one connection must then not follow it in the batch.
 * Each job is recorded in stats and stages (see fp4idx_cmd_job_t). */
void fp4idx__cmd_execute_batch(struct fp4idx_daemon_s *d, fp4idx_cmd_job_t *jobs, int n);

/* The same in two halves, so that the worker takes and prepares the next
 * batch while the device runs this one's scores: begin decodes and runs
 * everything, replying to every request but the last run of scores, whose
 * launches it only queues (earlier runs are answered before the next other
 * request runs); end waits for them and replies to them. Between the two,
 * jobs[] and what they point to stay in place; later batches may begin
 * (their backend ops wait for these launches first, so each request sees
 * the state in queue order). begin returns NULL when there was not even
 * memory for the bookkeeping (every job was then finished without a reply:
 * its connection closes); end(NULL) does nothing. Worker thread. */
typedef struct fp4idx_cmd_batch_s fp4idx_cmd_batch_t;
fp4idx_cmd_batch_t *fp4idx__cmd_batch_begin(struct fp4idx_daemon_s *d, fp4idx_cmd_job_t *jobs,
                                            int n);
void fp4idx__cmd_batch_end(struct fp4idx_daemon_s *d, fp4idx_cmd_batch_t *b);

/* Requests at most this long may be answered on the loop. */
#define FP4IDX_CMD_LOOP_MAX 256u

/* 1 when the frame body is a well-formed request of at most
 * FP4IDX_CMD_LOOP_MAX bytes whose op has FP4IDX_OPF_LOOP (hello, info,
 * stats: they read nothing the worker changes but d->pub and the stats,
 * both safe from any thread), so the loop may answer it itself
 * (fp4idx__cmd_execute_batch) when the connection has nothing else in flight --
 * no worker hop, and the reply order is trivially kept. Loop thread. */
int fp4idx__cmd_loop_op(const uint8_t *body, size_t len);

/* Publishes the cache's counts into d->pub (worker thread, after a
 * mutation; and once before serving). */
void fp4idx__cmd_publish(struct fp4idx_daemon_s *d);

/* Frees what a reply holds (any thread: the output goes back to the engine). */
void fp4idx__cmd_reply_free(struct fp4idx_daemon_s *d, fp4idx_cmd_reply_t *reply);

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
