/* batch.c -- the one batcher: queued requests from plan to reply (see
 * batch.h). */
#define _GNU_SOURCE
#include "batch.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "commands.h"
#include "daemon.h"
#include "direct_write.h"
#include "log.h"
#include "score.h"
#include "zalloc.h"

/* Groups of one head count and top-k open at once in a run of scores. */
#define FP4IDX_BATCH_GROUPS 8

/* One launch on the device and the requests it answers. */
typedef struct fp4idx__batch_launch_s {
  fp4idx_score_launch_t *l;
  fp4idx_req_t **reqs;     /* [n], owned */
  int n;
  struct fp4idx__batch_launch_s *next;
} fp4idx__batch_launch_t;

/* A request's room while it runs: its error detail, its score plan, its
 * reply until the request takes it. */
typedef struct fp4idx__batch_item_s {
  char msg[FP4IDX_CMD_MSG];
  fp4idx_score_job_t score;
  fp4idx_cmd_reply_t reply;
} fp4idx__batch_item_t;

/* A batch between begin and end: the launches out (oldest first), the run
 * of plans not launched yet, and each request's room. */
typedef struct fp4idx__batch_s {
  fp4idx_daemon_t *d;
  fp4idx__batch_launch_t *head, *tail;
  int out;                 /* launches in the list */
  /* the run's groups, one per head count and top-k, in the order of their
   * first plan; each group's request list is one of FP4IDX_BATCH_GROUPS
   * slices of n pointers after items[] (a batch of n requests puts at most
   * n in a group), so a batch's room grows with n, not with the most
   * requests a batch may take */
  struct fp4idx__batch_group_s {
    fp4idx_req_t **reqs;
    int n;
    uint64_t work, bytes;
  } groups[FP4IDX_BATCH_GROUPS];
  int ngroups;
  fp4idx__batch_item_t items[];
} fp4idx__batch_t;

static void fp4idx__batch_out_free(void *arg, void *p) {
  (void)arg;
  fp4idx__score_out_release(p);
}

/* The call's final reply goes to its request, and the request back to the
 * loop (worker, `direct`: sent from here first when nothing is ahead of
 * it). */
static void fp4idx__batch_reply(fp4idx_req_t *req, fp4idx_worker_t *w, int direct) {
  fp4idx_cmd_reply_t *reply = req->call.reply;
  fp4idx_cmd_reply_t none = {0};
  if (!reply) reply = &none; /* no room to run it: no reply, the connection closes */
  req->resp = reply->frame;
  req->resp_len = reply->frame_len;
  req->payloads = reply->payloads;
  req->npayloads = reply->npayloads;
  req->wire_len = reply->total_len;
  req->out = reply->out;
  req->out_free = fp4idx__batch_out_free;
  req->out_free_arg = NULL;
  memset(reply, 0, sizeof *reply);
  req->call.msg = NULL;
  req->call.score = NULL;
  req->call.reply = NULL;
  /* The body (and the decoded views into it) are not needed any more;
   * body_held stays, for the budget's release in req_done. */
  fp4idx_request_clear(&req->dreq);
  free(req->body_mem);
  req->body_mem = NULL;
  req->body = NULL;
  if (!req->resp) req->close_after = 1; /* could not even encode an error */
  /* The encoder's buffer grows by doubling: give back the slack, since the
   * reply may wait a long time for a client that does not read, and the
   * buffer budget counts it. Shrinking keeps the block in place. */
  uint8_t *fit = req->resp ? realloc(req->resp, req->resp_len) : NULL;
  if (fit) req->resp = fit;
  req->t_done_us = fp4idx__stats_now_us();
  if (w) {
    if (direct) fp4idx__direct_try(req); /* the reply leaves now when nothing is ahead of it */
    fp4idx__worker_post(w, &req->job); /* req may go now */
  }
}

/* The buffer budget's word on req's reply before it runs: 1 run it (its
 * call->rc is E2BIG when refused: answered with that), 0 it waits (handed
 * back unrun: the server dispatches it again once its reply fits). */
static int fp4idx__batch_admit(fp4idx__batch_t *b, fp4idx_req_t *req) {
  fp4idx_cmd_call_t *call = &req->call;
  if (call->rc != FP4IDX_OK) return 1;
  uint64_t bytes = fp4idx__cmd_reply_bound(b->d, call->req);
  if (!bytes) return 1;
  switch (fp4idx__budget_admit(req->conn->srv, bytes, &req->reserved, call->msg,
                               FP4IDX_CMD_MSG)) {
  case FP4IDX_BUDGET_ADMITTED:
    return 1;
  case FP4IDX_BUDGET_NEVER:
    call->rc = FP4IDX_E2BIG;
    return 1;
  default:
    break;
  }
  req->defer_bytes = bytes;
  req->deferred = 1;
  req->t_done_us = 0;
  if (call->fd >= 0) close(call->fd); /* a read or a score uses no fd */
  call->fd = -1;
  call->msg = NULL;
  call->score = NULL;
  call->reply = NULL;
  fp4idx__worker_post(&b->d->worker, &req->job);
  return 0;
}

/* Whether the worker itself sends the replies of a launch of n requests:
 * always with one I/O loop (a hand-off would only add the loop's wake);
 * with several, only a launch's lone reply, so that the sends of a batch
 * (a few microseconds each, on the one thread that also feeds the device)
 * are spread over the loops that own the connections. */
static int fp4idx__batch_direct(const fp4idx__batch_t *b, int n) {
  static int x_nodirect = -1; /* experiment: X_NODIRECT=1: a batch's replies go through the loop */
  if (x_nodirect < 0) x_nodirect = getenv("X_NODIRECT") != NULL;
  if (x_nodirect) return n == 1;
  return n == 1 || b->d->server->n_io == 1;
}

/* Collects the oldest launch and answers its requests. */
static void fp4idx__batch_collect(fp4idx__batch_t *b) {
  fp4idx__batch_launch_t *x = b->head;
  b->head = x->next;
  if (!b->head) b->tail = NULL;
  b->out--;
  fp4idx__score_collect(b->d, x->l);
  int direct = fp4idx__batch_direct(b, x->n);
  for (int i = 0; i < x->n; i++) {
    fp4idx__cmd_finish(b->d, &x->reqs[i]->call);
    fp4idx__batch_reply(x->reqs[i], &b->d->worker, direct);
  }
  /* a long full-logits reply streams: the rest of its logits after it left */
  fp4idx__score_launch_end(b->d, x->l);
  free(x->reqs);
  free(x);
}

static void fp4idx__batch_collect_all(fp4idx__batch_t *b) {
  while (b->head) fp4idx__batch_collect(b);
}

/* Group g of the run goes to the device as one launch; the groups after it
 * move up. */
static void fp4idx__batch_launch(fp4idx__batch_t *b, int g) {
  struct fp4idx__batch_group_s *G = &b->groups[g];
  int n = G->n;
  /* no more launches out than the device holds: collect the oldest */
  if (b->out >= FP4IDX_BACKEND_INFLIGHT) fp4idx__batch_collect(b);
  fp4idx__batch_launch_t *x = fp4idx__zalloc(1, sizeof *x);
  fp4idx_score_job_t *jobs[FP4IDX_WORKER_MAX_BATCH];
  for (int i = 0; i < n; i++) jobs[i] = G->reqs[i]->call.score;
  int rc = x && (x->reqs = malloc((size_t)n * sizeof *x->reqs)) ? FP4IDX_OK : FP4IDX_ENOMEM;
  if (rc == FP4IDX_OK) rc = fp4idx__score_launch(b->d, jobs, n, &x->l);
  if (rc) {
    if (x) free(x->reqs);
    free(x);
    for (int i = 0; i < n; i++) {
      snprintf(jobs[i]->msg, jobs[i]->msgcap, "scoring failed: %s", fp4idx_strerror(rc));
      jobs[i]->rc = rc;
      fp4idx__cmd_finish(b->d, &G->reqs[i]->call);
      fp4idx__batch_reply(G->reqs[i], &b->d->worker, fp4idx__batch_direct(b, n));
    }
  } else {
    memcpy(x->reqs, G->reqs, (size_t)n * sizeof *x->reqs);
    x->n = n;
    if (b->tail) b->tail->next = x; else b->head = x;
    b->tail = x;
    b->out++;
  }
  /* the groups after it move up; its slice goes to the slot freed at the end */
  fp4idx_req_t **slice = G->reqs;
  b->ngroups--;
  memmove(G, G + 1, (size_t)(b->ngroups - g) * sizeof *G);
  b->groups[b->ngroups].reqs = slice;
}

/* The run of scores ends: every group goes to the device, in order. */
static void fp4idx__batch_launch_all(fp4idx__batch_t *b) {
  while (b->ngroups) fp4idx__batch_launch(b, 0);
}

/* A checked score joins the run's group of its head count and top-k (a
 * launch takes up to the backend's batch_work and FP4IDX_SCORE_MAX_LAUNCH
 * bytes of output; beyond, the group launches and a new one starts); one
 * writing into regions launches alone. */
static void fp4idx__batch_plan(fp4idx__batch_t *b, fp4idx_req_t *req) {
  const fp4idx_score_job_t *j = req->call.score;
  const fp4idx_score_req_t *rj = &j->req->u.score;
  uint64_t bytes = fp4idx__score_out_bytes(j);
  int g = 0;
  for (; g < b->ngroups; g++) {
    const fp4idx_score_job_t *a = b->groups[g].reqs[0]->call.score;
    if (a->req->u.score.heads == rj->heads && a->req->u.score.topk == rj->topk && !a->alone &&
        !j->alone)
      break;
  }
  if (g < b->ngroups && (b->groups[g].work + j->work > b->d->desc.batch_work ||
                         b->groups[g].bytes + bytes > FP4IDX_SCORE_MAX_LAUNCH)) {
    fp4idx__batch_launch(b, g);
    g = b->ngroups;
  }
  if (g == b->ngroups) {
    if (b->ngroups == FP4IDX_BATCH_GROUPS) fp4idx__batch_launch(b, 0);
    g = b->ngroups++;
    b->groups[g].n = 0;
    b->groups[g].work = b->groups[g].bytes = 0;
  }
  struct fp4idx__batch_group_s *G = &b->groups[g];
  G->reqs[G->n++] = req;
  G->work += j->work;
  G->bytes += bytes;
  if (j->alone) fp4idx__batch_launch(b, g);
}

/* Gives request i of b its room: the detail of a failed decode, a score's
 * plan, its reply. */
static void fp4idx__batch_room(fp4idx_req_t *req, fp4idx__batch_item_t *it) {
  fp4idx_cmd_call_t *call = &req->call;
  memset(it, 0, sizeof *it);
  if (req->dmsg) snprintf(it->msg, sizeof it->msg, "%s", req->dmsg);
  call->msg = it->msg;
  call->score = &it->score;
  call->reply = &it->reply;
}

/* Runs jobs[0..n) in queue order into b; the last launches stay out. */
static void fp4idx__batch_go(fp4idx__batch_t *b, fp4idx_job_t **jobs, int n) {
  double tq = fp4idx__stats_now_us();
  for (int i = 0; i < n; i++) {
    fp4idx_req_t *req = jobs[i]->data;
    fp4idx_cmd_call_t *call = &req->call;
    fp4idx__stats_queue(&b->d->stats, -1); /* running now */
    call->tq_us = tq;
    fp4idx__batch_room(req, &b->items[i]);
    if (!fp4idx__batch_admit(b, req)) continue;
    if (call->rc == FP4IDX_OK && call->req->op != FP4IDX_OP_SCORE) {
      /* another op ends the run: what is out is answered first (its
       * backend ops would wait for it, and the launches out stay few) */
      fp4idx__batch_launch_all(b);
      fp4idx__batch_collect_all(b);
    }
    if (fp4idx__cmd_exec(b->d, call))
      fp4idx__batch_plan(b, req);
    else
      fp4idx__batch_reply(req, &b->d->worker, 1);
  }
  fp4idx__batch_launch_all(b);
}

void *fp4idx__batch_begin(fp4idx_job_t **jobs, int n) {
  fp4idx_req_t *first = jobs[0]->data;
  fp4idx_daemon_t *d = first->conn->srv->data;
  const size_t items = (sizeof(fp4idx__batch_t) + (size_t)n * sizeof(fp4idx__batch_item_t) +
                        sizeof(void *) - 1) & ~(sizeof(void *) - 1);
  fp4idx__batch_t *b =
      malloc(items + (size_t)FP4IDX_BATCH_GROUPS * (size_t)n * sizeof(fp4idx_req_t *));
  if (!b) { /* not even the room: no reply, the connections close */
    fp4idx__log_error("out of memory for a batch of %d requests", n);
    for (int i = 0; i < n; i++) {
      fp4idx__stats_queue(&d->stats, -1);
      fp4idx__batch_reply(jobs[i]->data, &d->worker, 1);
    }
    return NULL;
  }
  b->d = d;
  b->head = b->tail = NULL;
  b->out = b->ngroups = 0;
  fp4idx_req_t **slices = (fp4idx_req_t **)((uint8_t *)b + items);
  for (int g = 0; g < FP4IDX_BATCH_GROUPS; g++) b->groups[g].reqs = slices + (size_t)g * n;
  fp4idx__batch_go(b, jobs, n);
  if (b->head) return b;
  free(b);
  return NULL;
}

void fp4idx__batch_end(void *state) {
  fp4idx__batch_t *b = state;
  if (!b) return;
  fp4idx__batch_collect_all(b);
  free(b);
}

void fp4idx__batch_run(fp4idx_job_t **jobs, int n) {
  fp4idx__batch_end(fp4idx__batch_begin(jobs, n));
}

void fp4idx__batch_work(fp4idx_job_t *job) { fp4idx__batch_run(&job, 1); }

void fp4idx__batch_on_loop(fp4idx_req_t *req) {
  fp4idx_daemon_t *d = req->conn->srv->data;
  fp4idx__batch_item_t it;
  fp4idx__batch_room(req, &it);
  req->call.tq_us = req->call.td_us; /* no queue */
  (void)fp4idx__cmd_exec(d, &req->call); /* a loop op is never a score */
  fp4idx__batch_reply(req, NULL, 0);
}
