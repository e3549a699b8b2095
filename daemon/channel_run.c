/* channel_run.c -- today's compute side of a channel call (channel.h,
 * fp4idx__channel_run_fn): the checked call is encoded as the `score`
 * request it stands for and run through the command path
 * (fp4idx__cmd_execute_batch) with the connection's regions, so it gets
 * every check, the engine and the stats of a socket request; its status is
 * read back from the reply. A request path that takes a decoded request
 * needs neither step: it takes call->entry, heads and topk as they are. */
#define _GNU_SOURCE
#include <string.h>

#include "channel.h"
#include "commands.h"
#include "daemon.h"
#include "fp4idx_fail.h"
#include "stats.h"

int fp4idx__channel_run_score(struct fp4idx_daemon_s *d, fp4idx_regions_t *rs,
                              const fp4idx_channel_call_t *call, char *msg, size_t cap) {
  fp4idx_score_seq_t entry = call->entry;
  fp4idx_request_t req = {.id = 1, .op = FP4IDX_OP_SCORE};
  req.u.score.heads = call->heads;
  req.u.score.topk = call->topk;
  req.u.score.seqs = &entry;
  req.u.score.nseqs = 1;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  int rc = fp4idx_encode_request(&sb, &req);
  if (rc) {
    msgpack_sbuffer_destroy(&sb);
    return fp4idx__fail(msg, cap, rc, "encoding the call: %s", fp4idx_strerror(rc));
  }
  fp4idx_cmd_reply_t reply;
  fp4idx_stage_times_t times;
  memset(&reply, 0, sizeof reply);
  memset(&times, 0, sizeof times);
  double t = fp4idx__stats_now_us();
  fp4idx_cmd_job_t job = {.body = (const uint8_t *)sb.data + FP4IDX_FRAME_HEADER,
                          .len = sb.size - FP4IDX_FRAME_HEADER, .regions = rs, .fd = -1,
                          .t0_us = t, .tq_us = t, .times = &times, .reply = &reply};
  fp4idx__cmd_execute_batch(d, &job, 1);
  msgpack_sbuffer_destroy(&sb);
  if (!reply.frame || reply.frame_len < FP4IDX_FRAME_HEADER) {
    fp4idx__cmd_reply_free(d, &reply);
    return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory for the reply");
  }
  fp4idx_response_t resp;
  memset(&resp, 0, sizeof resp);
  rc = fp4idx_decode_response(reply.frame + FP4IDX_FRAME_HEADER,
                              reply.frame_len - FP4IDX_FRAME_HEADER, FP4IDX_OP_SCORE, &resp,
                              msg, cap);
  if (rc == FP4IDX_OK) {
    rc = resp.status;
    if (rc) fp4idx__fail(msg, cap, rc, "%s", resp.error);
  }
  fp4idx_response_clear(&resp);
  fp4idx__cmd_reply_free(d, &reply);
  return rc;
}
