/* channel_run.c -- the compute side of a channel call (channel.h,
 * fp4idx__channel_run_fn): the checked call is the decoded `score` request
 * of one entry it stands for, handed straight to the command layer's score
 * plan (fp4idx__cmd_exec: every check of a socket score against the cache
 * and the connection's regions), launched and collected through score.h on
 * the worker thread, and finished without a reply frame (the outputs are
 * in the regions; stats and stages record it as a `score`). The call's
 * completion word goes with the launch (fp4idx_score_job_t.done_word): the
 * backend's stream stores it right after the outputs, so the client's
 * stream goes on without waiting for this thread to see the end. It runs as a
 * worker job, so it is ordered with the socket's requests: the worker ends
 * any begun batch before a job without batch_begin runs, and an append
 * acknowledged before the doorbell rang ran before it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "channel.h"
#include "commands.h"
#include "daemon.h"
#include "score.h"
#include "stats.h"

int fp4idx__channel_run_score(struct fp4idx_daemon_s *d, fp4idx_regions_t *rs,
                              const fp4idx_channel_call_t *call, volatile uint32_t *done,
                              uint32_t done_value, int *done_written, char *msg, size_t cap) {
  *done_written = 0;
  fp4idx_score_seq_t entry = call->entry;
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_SCORE;
  req.u.score.heads = call->heads;
  req.u.score.topk = call->topk;
  req.u.score.seqs = &entry;
  req.u.score.nseqs = 1;
  char detail[FP4IDX_CMD_MSG] = "";
  fp4idx_score_job_t plan;
  fp4idx_cmd_reply_t reply;
  double t = fp4idx__stats_now_us();
  fp4idx_cmd_call_t c = {.req = &req, .regions = rs, .fd = -1, .msg = detail, .t0_us = t,
                         .td_us = t, .tq_us = t, .score = &plan, .reply = &reply,
                         .no_frame = 1};
  if (fp4idx__cmd_exec(d, &c)) { /* a plan: one launch of its own (it writes regions) */
    fp4idx_score_job_t *one = &plan;
    plan.done_word = done; /* the completion, stored by the device after the outputs */
    plan.done_value = done_value;
    fp4idx_score_launch_t *l = NULL;
    int rc = fp4idx__score_launch(d, &one, 1, &l);
    if (rc) {
      snprintf(plan.msg, plan.msgcap, "scoring failed: %s", fp4idx_strerror(rc));
      plan.rc = rc;
    } else {
      fp4idx__score_collect(d, l);
      *done_written = plan.done_written;
    }
    fp4idx__cmd_finish(d, &c);
    fp4idx__score_launch_end(d, l);
  }
  if (c.rc && msg && cap) snprintf(msg, cap, "%s", detail);
  return c.rc;
}
