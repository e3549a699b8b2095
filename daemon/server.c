/* server.c -- connections, framing, dispatch to the worker, response order.
 * See server.h for the request path and the caps, budget.h for the buffer
 * budget, listener.c for the listening socket. */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "batch.h"
#include "budget.h"
#include "commands.h"
#include "daemon.h"
#include "direct_write.h"
#include "fp4idx_status.h"
#include "score.h"
#include "log.h"
#include "stats.h"

static void fp4idx__server_flush(fp4idx_conn_t *c);
static void fp4idx__server_conn_close(fp4idx_conn_t *c);
static void fp4idx__server_update_reading(fp4idx_conn_t *c);
static void fp4idx__server_pump(fp4idx_conn_t *c);
static void fp4idx__server_check_stopped(fp4idx_server_t *srv);

void fp4idx__server_init(fp4idx_server_t *srv, uv_loop_t *loop, uint64_t max_frame) {
  memset(srv, 0, sizeof *srv);
  srv->loop = loop;
  srv->max_frame = max_frame;
  srv->cuda_device = -1;
  srv->socket_mode = FP4IDX_SERVER_SOCKET_MODE;
  srv->socket_gid = -1;
  srv->spare_fd = -1;
  pthread_mutex_init(&srv->budget_mu, NULL);
  srv->budget = fp4idx__budget_default(0);
  srv->buffer_timeout_us = FP4IDX_BUDGET_TIMEOUT_DEFAULT_S * 1e6;
}

void fp4idx__server_req_free(fp4idx_req_t *req) {
  if (!req) return;
  if (req->fd >= 0) close(req->fd);
  if (req->call.fd >= 0) close(req->call.fd);
  fp4idx_request_clear(&req->dreq);
  free(req->dmsg);
  free(req->body_mem);
  free(req->resp);
  free(req->payloads);
  if (req->out && req->out_free) req->out_free(req->out_free_arg, req->out);
  free(req);
}

/* ---- connection lifetime ---------------------------------------------- */

/* The release job of a closed connection's regions: on the worker, after
 * every request that could still use them. */
static void fp4idx__server_regions_work(fp4idx_job_t *job) { fp4idx__regions_clear(job->data); }
static void fp4idx__server_regions_done(fp4idx_job_t *job) { free(job->data); }

/* Loop 0: an accepted connection counts from here (in stats too), whichever
 * loop it goes to, until fp4idx__server_conn_gone. */
static void fp4idx__server_conn_counted(fp4idx_server_t *srv) {
  __atomic_add_fetch(&srv->n_conns, 1, __ATOMIC_ACQ_REL);
  if (srv->conn_event) srv->conn_event(srv, +1);
}

void fp4idx__server_conn_gone(fp4idx_ioloop_t *io) {
  fp4idx_server_t *srv = io->srv;
  /* The last one tells loop 0, whatever this loop knows of a stop: the
   * stop may be on its way to it. */
  if (srv->conn_event) srv->conn_event(srv, -1);
  if (__atomic_sub_fetch(&srv->n_conns, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (io->index == 0) fp4idx__server_check_stopped(srv);
  else fp4idx__server_io_post(&srv->io[0], FP4IDX_IO_CHECK);
}

static void fp4idx__server_conn_free(fp4idx_conn_t *c) {
  fp4idx_server_t *srv = c->srv;
  fp4idx_ioloop_t *io = c->io;
  for (int i = 0; i < c->nfds; i++) close(c->fds[i]);
  if (c->regions) {
    fp4idx_job_t *job = &c->regions->release;
    *job = (fp4idx_job_t){.work = fp4idx__server_regions_work,
                          .done = fp4idx__server_regions_done,
                          .data = c->regions};
    if (srv->worker && srv->worker->started) {
      fp4idx__worker_submit(srv->worker, job);
    } else {
      fp4idx__regions_clear(c->regions);
      free(c->regions);
    }
  }
  fp4idx__budget_hold(c, -(int64_t)c->held_in, -(int64_t)c->held_out);
  fp4idx__budget_release_grant(c);
  if (c->prev) c->prev->next = c->next; else io->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  fp4idx_frame_reader_free(&c->fr);
  free(c->scratch);
  free(c);
  fp4idx__server_conn_gone(io);
}

/* Drops request r (unlinked by the caller) with what it held. */
static void fp4idx__server_req_drop(fp4idx_conn_t *c, fp4idx_req_t *r) {
  int64_t in = r->done ? 0 : (int64_t)r->body_held;
  /* a reply cut off while written in parts (no part left in flight) gives
   * back what its last part's callback would have */
  int64_t out = r->done && (!r->write_started || r->streaming) ? (int64_t)r->wire_len : 0;
  if (r->streaming) {
    r->streaming = 0;
    __atomic_sub_fetch(&c->io->streaming, 1, __ATOMIC_RELEASE);
    c->out_bytes -= r->wire_len;
    fp4idx__busypoll_writing(&c->io->busypoll, -1);
  }
  fp4idx__budget_hold(c, -in - (int64_t)FP4IDX_SERVER_REQ_BYTES, -out);
  c->pending--;
  fp4idx__server_req_free(r);
}

/* The connection's next request (the next to dispatch: it runs one at a
 * time) may only run once its reply fits; forgets that wait. */
static void fp4idx__server_defer_clear(fp4idx_conn_t *c) {
  if (!c->defer_bytes) return;
  c->defer_bytes = 0;
  __atomic_sub_fetch(&c->srv->n_deferred, 1, __ATOMIC_ACQ_REL);
}

static void fp4idx__server_close_cb(uv_handle_t *h) {
  fp4idx_conn_t *c = h->data;
  c->closed = 1;
  /* Every started write has had its callback (UV_ECANCELED at the latest);
   * finished responses that were never written, and requests never handed
   * to the worker, are dropped here. Requests still on the worker stay in
   * the list until their done callback. */
  fp4idx_req_t **pp = &c->head;
  c->tail = NULL;
  c->undispatched = NULL;
  while (*pp) {
    fp4idx_req_t *r = *pp;
    if (r->done || !r->dispatched) {
      *pp = r->next;
      fp4idx__server_req_drop(c, r);
    } else {
      c->tail = r;
      pp = &r->next;
    }
  }
  fp4idx__log_debug("connection %llu closed", (unsigned long long)c->id);
  if (!c->head) fp4idx__server_conn_free(c);
}

static void fp4idx__server_conn_close(fp4idx_conn_t *c) {
  if (c->closing) return;
  c->closing = 1;
  fp4idx__direct_disarm(c); /* no send of the worker's on the fd from here */
  fp4idx__server_defer_clear(c);
  if (c->reading) uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = 0;
  /* The partial frame goes now (close_cb may wait for the worker). */
  fp4idx__budget_hold(c, -(int64_t)c->fr_held, 0);
  c->fr_held = 0;
  fp4idx_frame_reader_free(&c->fr);
  fp4idx__budget_release_grant(c);
  uv_close((uv_handle_t *)&c->pipe, fp4idx__server_close_cb);
}

void fp4idx__server_drop(fp4idx_conn_t *c) {
  c->dead = 1;
  fp4idx__server_conn_close(c);
}

/* Closes a connection that has nothing left to do: the peer is done sending
 * (or the daemon is stopping) and every response is written. */
static void fp4idx__server_maybe_close(fp4idx_conn_t *c) {
  if (!c->closing && (c->eof || c->io->stopping) && c->pending == 0)
    fp4idx__server_conn_close(c);
}

/* ---- writing responses in order ----------------------------------------- */

/* Reply r is written (status 0) or its write failed: its completion. */
static void fp4idx__server_written(fp4idx_req_t *r, int status) {
  fp4idx_conn_t *c = r->conn;
  /* Writes start in list order and complete in order: r is the head. */
  c->head = r->next;
  if (!c->head) c->tail = NULL;
  c->pending--;
  c->out_bytes -= r->wire_len;
  c->progress_us = fp4idx__stats_now_us();
  if (status == 0 && c->srv->stages)
    fp4idx__stages_add(c->srv->stages, FP4IDX_STAGE_WRITE, c->progress_us - r->t_write_us);
  int close_after = r->close_after;
  fp4idx__budget_hold(c, -(int64_t)FP4IDX_SERVER_REQ_BYTES, -(int64_t)r->wire_len);
  fp4idx__busypoll_writing(&c->io->busypoll, -1);
  fp4idx__server_req_free(r);
  if (c->closing) {
    return; /* close_cb finishes the cleanup */
  }
  if (status < 0) {
    fp4idx__log_debug("connection %llu: write failed: %s", (unsigned long long)c->id,
                      uv_strerror(status));
    fp4idx__server_drop(c);
    return;
  }
  if (close_after) {
    fp4idx__server_conn_close(c);
    return;
  }
  fp4idx__server_resume(c);
}

static void fp4idx__server_write_cb(uv_write_t *wr, int status) {
  fp4idx__server_written(wr->data, status);
}

/* One part of a reply written in parts. */
typedef struct fp4idx__server_part_s {
  uv_write_t wr;
  fp4idx_req_t *r;
} fp4idx__server_part_t;

static void fp4idx__server_part_cb(uv_write_t *wr, int status) {
  fp4idx__server_part_t *part = wr->data;
  fp4idx_req_t *r = part->r;
  free(part);
  r->parts--;
  if (status < 0 && !r->part_status) r->part_status = status;
  /* complete after its last part; cut off (failed, or the connection is
   * closing) once no part is left in flight */
  if (r->parts > 0) return;
  if (r->sent < r->wire_len && !r->part_status && !r->conn->closing) return;
  r->streaming = 0;
  __atomic_sub_fetch(&r->conn->io->streaming, 1, __ATOMIC_RELEASE);
  fp4idx__server_written(r, r->part_status          ? r->part_status
                            : r->sent < r->wire_len ? UV_ECANCELED
                                                    : 0);
}

/* The wire bytes of r that may be written now: all of them, or, for a
 * reply whose payload is still coming back from the device (score.h), up
 * to the first byte not there yet. -1: that copy failed (the reply can
 * never be finished). */
int64_t fp4idx__server_wire_ready(const fp4idx_req_t *r) {
  if (!r->out) return (int64_t)r->wire_len;
  const uint8_t *base = NULL;
  int failed = 0;
  uint64_t ready = fp4idx__score_out_ready(r->out, &base, &failed);
  if (failed) return -1;
  if (ready == UINT64_MAX) return (int64_t)r->wire_len;
  size_t w = 0, at = 0;
  for (size_t i = 0; i < r->npayloads; i++) {
    const fp4idx_payload_t *p = &r->payloads[i];
    w += p->at - at;
    at = p->at;
    const uint8_t *d = p->data;
    uint64_t off = d >= base ? (uint64_t)(d - base) : 0;
    uint64_t have = ready > off ? ready - off : 0;
    if (have < p->len) return (int64_t)(w + have);
    w += p->len;
  }
  return (int64_t)r->wire_len;
}

/* uv bufs for wire bytes [from, to) of r (the frame's bytes with the
 * payloads spliced in at their offsets) into bufs, which has room for
 * 2 * npayloads + 1; returns how many. */
size_t fp4idx__server_wire_bufs(const fp4idx_req_t *r, size_t from, size_t to,
                                uv_buf_t *bufs) {
  size_t k = 0, w = 0, at = 0;
  for (size_t i = 0; i <= r->npayloads; i++) {
    /* frame bytes [at, end), then payload i (if any) */
    const int pl = i < r->npayloads;
    const size_t end = pl ? r->payloads[i].at : r->resp_len;
    const char *seg[2] = {(const char *)r->resp + at, pl ? r->payloads[i].data : NULL};
    const size_t len[2] = {end - at, pl ? r->payloads[i].len : 0};
    for (int s = 0; s < 2; s++) {
      size_t a = from > w ? from - w : 0, b = to - w < len[s] ? to - w : len[s];
      if (w < to && a < b) bufs[k++] = uv_buf_init((char *)seg[s] + a, (unsigned)(b - a));
      w += len[s];
    }
    at = end;
  }
  return k;
}

static void fp4idx__server_flush(fp4idx_conn_t *c) {
  if (c->closing || c->dead) return;
  for (fp4idx_req_t *r = c->head; r && r->done; r = r->next) {
    if (r->write_started && !r->streaming) {
      if (r->close_after) return; /* nothing goes out after a closing reply */
      continue;
    }
    int64_t ready = fp4idx__server_wire_ready(r);
    if (ready < 0) {
      fp4idx__log_warn("connection %llu: a reply's data failed to come back from the device; "
                       "closing", (unsigned long long)c->id);
      fp4idx__server_drop(c);
      return;
    }
    if ((size_t)ready <= r->sent) return; /* the rest later (stream progress) */
    /* One writev, no copy of the payloads (libuv copies the buf array); a
     * reply whose payload is not all there yet goes in parts. */
    uv_buf_t small[17], *bufs = small;
    size_t nb = 2 * r->npayloads + 1;
    fp4idx__server_part_t *part = NULL;
    const int whole = !r->write_started && (size_t)ready == r->wire_len;
    if ((nb > sizeof small / sizeof small[0] && !(bufs = malloc(nb * sizeof *bufs))) ||
        (!whole && !(part = malloc(sizeof *part)))) {
      if (bufs != small) free(bufs);
      c->dead = 1;
      fp4idx__server_conn_close(c);
      return;
    }
    size_t k = fp4idx__server_wire_bufs(r, r->sent, (size_t)ready, bufs);
    if (!r->write_started) r->t_write_us = fp4idx__stats_now_us();
    int rc;
    if (whole) {
      r->wr.data = r;
      rc = uv_write(&r->wr, (uv_stream_t *)&c->pipe, bufs, (unsigned)k, fp4idx__server_write_cb);
    } else {
      part->r = r;
      part->wr.data = part;
      rc = uv_write(&part->wr, (uv_stream_t *)&c->pipe, bufs, (unsigned)k,
                    fp4idx__server_part_cb);
      if (rc < 0) free(part);
    }
    if (bufs != small) free(bufs);
    if (rc < 0) {
      fp4idx__server_drop(c);
      return;
    }
    if (!r->write_started) {
      r->write_started = 1;
      fp4idx__busypoll_writing(&c->io->busypoll, +1);
      c->out_bytes += r->wire_len;
      if (!whole) {
        r->streaming = 1;
        __atomic_add_fetch(&c->io->streaming, 1, __ATOMIC_RELEASE);
      }
    }
    if (!whole) r->parts++;
    r->sent = (size_t)ready;
    if (r->sent < r->wire_len) return; /* the replies after it wait */
    if (r->close_after) return;
  }
}

/* io's thread: writes what has come of its replies written in parts. */
static void fp4idx__server_flush_streams_of(fp4idx_ioloop_t *io) {
  if (!io->streaming) return;
  for (fp4idx_conn_t *c = io->conns; c; c = c->next)
    if (c->head && c->head->streaming && c->head->sent < c->head->wire_len)
      fp4idx__server_flush(c);
}

void fp4idx__server_flush_streams(fp4idx_server_t *srv) {
  fp4idx__server_flush_streams_of(&srv->io[0]);
  for (int i = 1; i < srv->n_io; i++)
    if (__atomic_load_n(&srv->io[i].streaming, __ATOMIC_ACQUIRE))
      fp4idx__server_io_post(&srv->io[i], FP4IDX_IO_STREAMS);
}

/* Unlinks req from closed connection c and drops it (with what it holds);
 * the connection goes once its list is empty. */
static void fp4idx__server_req_orphan(fp4idx_conn_t *c, fp4idx_req_t *req) {
  fp4idx_req_t **pp = &c->head, *prev = NULL;
  while (*pp && *pp != req) prev = *pp, pp = &(*pp)->next;
  if (*pp) {
    *pp = req->next;
    if (c->tail == req) c->tail = prev;
  }
  fp4idx__server_req_drop(c, req);
  if (!c->head) fp4idx__server_conn_free(c);
}

/* A request the budget did not admit came back unrun: it is again the
 * connection's first undispatched request (everything before it is done,
 * as one request of a connection is in flight at a time), and is
 * dispatched once its reply fits (fp4idx__budget_may_dispatch). */
_Static_assert(FP4IDX_SERVER_MAX_INFLIGHT == 1,
               "a deferred request goes back to the head of its connection's queue");
static void fp4idx__server_req_deferred(fp4idx_req_t *req) {
  fp4idx_conn_t *c = req->conn;
  req->deferred = 0;
  req->dispatched = 0;
  c->inflight--;
  __atomic_add_fetch(&c->srv->deferred, 1, __ATOMIC_RELAXED);
  if (c->closed) {
    fp4idx__server_req_orphan(c, req); /* its body is still held: drop gives it back */
    return;
  }
  if (c->closing) return; /* close_cb drops it (never dispatched now) */
  c->undispatched = req;
  fp4idx__server_defer_clear(c);
  c->defer_bytes = req->defer_bytes ? req->defer_bytes : 1;
  __atomic_add_fetch(&c->srv->n_deferred, 1, __ATOMIC_ACQ_REL);
  fp4idx__log_debug("connection %llu: a reply of %llu bytes waits for the buffer budget",
                    (unsigned long long)c->id, (unsigned long long)c->defer_bytes);
  fp4idx__server_resume(c);
}

/* A reply the worker sent whole (direct_write.h) is written: it leaves the
 * list as fp4idx__server_written would take it (it was never counted in
 * out_bytes). */
static void fp4idx__server_direct_written(fp4idx_req_t *r) {
  fp4idx_conn_t *c = r->conn;
  c->head = r->next;
  if (!c->head) c->tail = NULL;
  c->pending--;
  c->progress_us = fp4idx__stats_now_us();
  if (c->srv->stages) {
    fp4idx__stages_add(c->srv->stages, FP4IDX_STAGE_WAKE, 0);
    fp4idx__stages_add(c->srv->stages, FP4IDX_STAGE_WRITE, r->direct_us);
  }
  fp4idx__budget_hold(c, -(int64_t)FP4IDX_SERVER_REQ_BYTES, -(int64_t)r->wire_len);
  fp4idx__server_req_free(r);
  fp4idx__server_resume(c);
}

void fp4idx__server_req_done(fp4idx_req_t *req) {
  fp4idx_conn_t *c = req->conn;
  int direct = __atomic_load_n(&c->direct, __ATOMIC_ACQUIRE) != FP4IDX_DIRECT_IDLE
                   ? fp4idx__direct_disarm(c)
                   : FP4IDX_DIRECT_IDLE;
  if (direct != FP4IDX_DIRECT_DONE) req->direct_sent = 0, req->direct_failed = 0;
  __atomic_sub_fetch(&c->srv->admitting, req->admitting, __ATOMIC_ACQ_REL);
  req->admitting = 0;
  if (req->deferred) {
    fp4idx__server_req_deferred(req);
    return;
  }
  req->done = 1;
  const int sent_whole = req->direct_sent == req->wire_len && c->head == req;
  if (req->t_done_us > 0 && c->srv->stages && !sent_whole)
    fp4idx__stages_add(c->srv->stages, FP4IDX_STAGE_WAKE,
                       fp4idx__stats_now_us() - req->t_done_us);
  c->inflight--;
  /* The body is gone (the worker freed it); the reply is held until it is
   * written out. */
  if (!c->held_out) c->progress_us = fp4idx__stats_now_us();
  fp4idx__budget_hold(c, -(int64_t)req->body_held, (int64_t)req->wire_len);
  /* The reply is held now: its reservation goes (after the hold, so that an
   * admission meanwhile sees it counted at least once). */
  uint64_t reserved = req->reserved;
  req->reserved = 0;
  fp4idx__budget_unreserve(c, reserved);
  if (c->closed) {
    /* The connection is gone: unlink and drop the response. */
    req->body_held = 0; /* already released above */
    fp4idx__server_req_orphan(c, req);
    return;
  }
  if (c->closing) return; /* close_cb frees it */
  if (req->direct_failed) { /* the worker's send found the peer gone */
    fp4idx__server_drop(c);
    return;
  }
  if (sent_whole) {
    fp4idx__server_direct_written(req);
    return;
  }
  req->sent = req->direct_sent; /* the loop writes the rest */
  fp4idx__server_resume(c);
}

/* ---- dispatch: parsed requests to the worker ---------------------------- */

/* The first request at or after r that still waits for the worker. The
 * list also holds entries that never go to it -- the closing error reply of
 * a refused frame is queued done -- so the walk skips every entry that is
 * dispatched or done. */
static fp4idx_req_t *fp4idx__server_next_undispatched(fp4idx_req_t *r) {
  while (r && (r->dispatched || r->done)) r = r->next;
  return r;
}

static void fp4idx__server_enqueue(fp4idx_conn_t *c, fp4idx_req_t *r) {
  r->conn = c;
  r->next = NULL;
  if (c->tail) c->tail->next = r; else c->head = r;
  c->tail = r;
  c->pending++;
  fp4idx__budget_hold(c, (int64_t)FP4IDX_SERVER_REQ_BYTES, 0); /* given back where it is freed */
  if (!c->undispatched) c->undispatched = fp4idx__server_next_undispatched(r);
}

/* Hands parsed requests to the worker, in order, while the budget allows.
 * c->undispatched is always the first entry of the list that is neither
 * dispatched nor done (fp4idx__server_next_undispatched), so only a parsed
 * request with its job functions set ever reaches the worker. */
/* Whether c's peer has closed its socket (POLLHUP: both directions; a
 * client that only shut down its sending side still reads its replies).
 * A connection not read from (paused by the budget) sees no EOF, so this
 * is asked before work is done for it after a wait. */
static int fp4idx__server_peer_gone(fp4idx_conn_t *c) {
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0) return 0;
  struct pollfd p = {.fd = fd, .events = 0};
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

static void fp4idx__server_pump(fp4idx_conn_t *c) {
  if (c->defer_bytes && c->undispatched && !c->closing && fp4idx__server_peer_gone(c)) {
    fp4idx__log_debug("connection %llu: the peer is gone while its reply waited for the "
                      "buffer budget; closing", (unsigned long long)c->id);
    fp4idx__server_drop(c);
    return;
  }
  while (c->undispatched && !c->closing && fp4idx__budget_may_dispatch(c)) {
    fp4idx_req_t *r = c->undispatched;
    c->undispatched = fp4idx__server_next_undispatched(r->next);
    r->dispatched = 1;
    if (c->defer_bytes) { /* a waiting reply tries again: its room is taken until it is back */
      r->admitting = c->defer_bytes;
      __atomic_add_fetch(&c->srv->admitting, r->admitting, __ATOMIC_ACQ_REL);
    }
    fp4idx__server_defer_clear(c);
    /* The bulk lane for a connection that pipelines (more requests wait
     * behind this one) or leaves replies unread; all its requests in flight
     * share one lane, so they run in its order (worker.h). */
    if (c->pending == 1 && fp4idx__cmd_loop_op(&r->dreq, r->call.rc, r->body_len)) {
      /* hello/info/stats with nothing else in flight or unwritten: answered
       * here, no worker hop (so no wake time and no queue), under the same
       * budget check as a dispatch; its reply is held like a worker's. */
      r->call.fd = r->fd;
      r->fd = -1;
      fp4idx__batch_on_loop(r);
      r->done = 1;
      if (!c->held_out) c->progress_us = fp4idx__stats_now_us();
      fp4idx__budget_hold(c, -(int64_t)r->body_held, (int64_t)r->wire_len);
      if (c->srv->stages) fp4idx__stages_add(c->srv->stages, FP4IDX_STAGE_WAKE, 0);
      fp4idx__server_flush(c);
      continue;
    }
    if (!c->inflight) c->bulk = c->held_out > 0 || c->pending > 1;
    r->job.bulk = c->bulk;
    c->inflight++;
    fp4idx__stats_queue(&((fp4idx_daemon_t *)c->srv->data)->stats, +1);
    r->call.fd = r->fd; /* closed by the command layer */
    r->fd = -1;
    fp4idx__direct_arm(c, r);
    fp4idx__worker_submit(c->srv->worker, &r->job);
  }
}

void fp4idx__server_resume(fp4idx_conn_t *c) {
  if (c->closing) return;
  fp4idx__server_flush(c);
  fp4idx__server_pump(c);
  fp4idx__server_update_reading(c);
  fp4idx__server_maybe_close(c);
}

/* ---- reading and framing ------------------------------------------------ */

/* A frame that cannot be a request (too long, empty): reply with `status`
 * and close after the reply; read nothing more. */
static void fp4idx__server_bad_frame(fp4idx_conn_t *c, int status, const char *msg) {
  fp4idx__log_info("connection %llu: %s; closing after the error reply",
                   (unsigned long long)c->id, msg);
  c->eof = 1;
  fp4idx_req_t *r = calloc(1, sizeof *r);
  if (r) r->fd = r->call.fd = -1;
  if (!r || fp4idx__cmd_error_frame(status, msg, &r->resp, &r->resp_len)) {
    free(r);
    fp4idx__server_conn_close(c);
    return;
  }
  r->wire_len = r->resp_len;
  r->done = 1;
  r->dispatched = 1;
  r->close_after = 1;
  fp4idx__server_enqueue(c, r);
  fp4idx__budget_hold(c, 0, (int64_t)r->wire_len);
  fp4idx__server_flush(c);
}

/* Gives the frame that ends at stream position `end` (its header starts
 * at end - 4 - body_len) the fd that came with it; fds of earlier bytes
 * that no frame took are closed. */
static void fp4idx__server_take_fd(fp4idx_conn_t *c, fp4idx_req_t *r, uint64_t end) {
  uint64_t start = end - FP4IDX_FRAME_HEADER - r->body_len;
  int k = 0;
  while (k < c->nfds && c->fd_pos[k] < end) {
    if (c->fd_pos[k] >= start && r->fd < 0)
      r->fd = c->fds[k];
    else
      close(c->fds[k]);
    k++;
  }
  memmove(c->fds, c->fds + k, (size_t)(c->nfds - k) * sizeof c->fds[0]);
  memmove(c->fd_pos, c->fd_pos + k, (size_t)(c->nfds - k) * sizeof c->fd_pos[0]);
  c->nfds -= k;
}

/* Takes the fds libuv received with the last read (ipc mode queues them on
 * the pipe) and tags them with the position of that read's last byte. */
static void fp4idx__server_pending_fd_close_cb(uv_handle_t *h) { free(h); }

static void fp4idx__server_collect_fds(fp4idx_conn_t *c) {
  while (uv_pipe_pending_count(&c->pipe) > 0) {
    uv_pipe_t *p = malloc(sizeof *p);
    int fd = -1;
    if (!p || uv_pipe_init(c->io->loop, p, 0)) {
      free(p);
      return; /* libuv closes what is still queued when the pipe closes */
    }
    uv_os_fd_t raw;
    if (uv_accept((uv_stream_t *)&c->pipe, (uv_stream_t *)p) == 0 &&
        uv_fileno((uv_handle_t *)p, &raw) == 0)
      fd = fcntl(raw, F_DUPFD_CLOEXEC, 3);
    uv_close((uv_handle_t *)p, fp4idx__server_pending_fd_close_cb);
    if (fd < 0) continue;
    if (c->nfds == FP4IDX_SERVER_MAX_FDS) {
      close(fd); /* more than a request can use: the client's loss */
      continue;
    }
    c->fds[c->nfds] = fd;
    c->fd_pos[c->nfds++] = c->rx_pos - 1;
  }
}

static void fp4idx__server_req_job_done(fp4idx_job_t *job) {
  fp4idx_req_t *req = job->data;
  fp4idx__busypoll_kick(&req->conn->io->busypoll);
  fp4idx__server_req_done(req);
}

/* The partial frame's memory, counted against the budget. */
static void fp4idx__server_track_frame(fp4idx_conn_t *c) {
  size_t cap = 0;
  fp4idx_frame_reader_capacity(&c->fr, &cap);
  if (cap == c->fr_held) return;
  fp4idx__budget_hold(c, (int64_t)cap - (int64_t)c->fr_held, 0);
  c->fr_held = cap;
}

/* Request r has its body (the frame that ends at stream position `end`):
 * give it the fd that came with it, decode it and queue it. */
static void fp4idx__server_queue_frame(fp4idx_conn_t *c, fp4idx_req_t *r, uint64_t end) {
  fp4idx__server_take_fd(c, r, end);
  /* The frame's bytes move from the reader to the request. */
  fp4idx__budget_hold(c, (int64_t)r->body_held - (int64_t)c->fr_held, 0);
  c->fr_held = 0;
  fp4idx__budget_release_grant(c);
  r->job.work = fp4idx__batch_work;
  r->job.batch = fp4idx__batch_run;
  r->job.batch_begin = fp4idx__batch_begin;
  r->job.batch_end = fp4idx__batch_end;
  r->job.done = fp4idx__server_req_job_done;
  r->job.data = r;
  r->job.home = &c->io->done; /* back to this loop */
  r->t0_us = fp4idx__stats_now_us();
  r->t_first_us = c->in_frame ? c->t_frame_us : r->t0_us;
  c->in_frame = 0;
  /* Decoded once, here: the batcher and the loop's own answer use it. */
  fp4idx_cmd_call_t *call = &r->call;
  char msg[FP4IDX_CMD_MSG] = "";
  call->rc = fp4idx_decode_request(r->body, r->body_len, &r->dreq, msg, sizeof msg);
  if (call->rc && msg[0]) r->dmsg = strdup(msg); /* without it the reply says the status */
  /* q and w scanned here, off the worker, which every loop feeds */
  if (call->rc == FP4IDX_OK) call->inputs_finite = fp4idx__score_inputs_finite(&r->dreq);
  call->req = &r->dreq;
  call->len = r->body_len;
  call->regions = c->regions;
  call->fd = -1;
  call->t0_us = r->t0_us;
  call->td_us = fp4idx__stats_now_us();
  call->read_us = r->t0_us - r->t_first_us;
  fp4idx__server_enqueue(c, r);
  /* No pump here: the caller parses every frame the read brought first, so
   * the lane choice sees whether more requests wait (pipelining). */
}

/* A whole frame is in the reader, ending at stream position `end`: its
 * body goes to a new request. */
static void fp4idx__server_take_frame(fp4idx_conn_t *c, uint64_t end) {
  fp4idx_req_t *r = calloc(1, sizeof *r);
  if (r) r->fd = r->call.fd = -1;
  if (!r || fp4idx_frame_reader_take(&c->fr, &r->body, &r->body_len)) {
    free(r);
    fp4idx__server_bad_frame(c, FP4IDX_ENOMEM, "out of memory for a request");
    return;
  }
  r->body_mem = r->body;
  r->body_held = r->body_len;
  fp4idx__server_queue_frame(c, r, end);
}

/* The unparsed bytes of the scratch buffer are one whole frame of at least
 * FP4IDX_SERVER_ADOPT_MIN body bytes (frame_reader_whole): the request
 * takes the buffer, shrunk to the frame's end, as its body, and the
 * connection reads into a fresh one. Returns 0 (nothing taken: feed the
 * bytes) when they are not such a frame or memory is short. */
static int fp4idx__server_adopt_frame(fp4idx_conn_t *c) {
  int64_t n = fp4idx_frame_reader_whole(&c->fr, c->scratch + c->in_off, c->in_len);
  if (n < FP4IDX_SERVER_ADOPT_MIN) return 0;
  uint8_t *fresh = malloc(FP4IDX_SERVER_SCRATCH);
  fp4idx_req_t *r = fresh ? calloc(1, sizeof *r) : NULL;
  if (!r) {
    free(fresh);
    return 0;
  }
  r->fd = r->call.fd = -1;
  const size_t at = c->in_off + FP4IDX_FRAME_HEADER, held = at + (size_t)n;
  const uint64_t end = c->scratch_pos + c->in_off + c->in_len;
  uint8_t *mem = realloc(c->scratch, held); /* shrinking: in place */
  r->body_held = mem ? held : FP4IDX_SERVER_SCRATCH;
  if (!mem) mem = c->scratch;
  r->body_mem = mem;
  r->body = mem + at;
  r->body_len = (size_t)n;
  c->scratch = fresh; /* its position is set by the read that fills it */
  c->in_off = c->in_len = 0;
  fp4idx__server_queue_frame(c, r, end);
  return 1;
}

/* The reader refused a frame header (E2BIG / ENOMEM): reply and close. */
static void fp4idx__server_frame_error(fp4idx_conn_t *c, int rc) {
  char msg[160];
  if (rc == FP4IDX_E2BIG)
    snprintf(msg, sizeof msg, "frame length exceeds max_frame (%llu bytes)",
             (unsigned long long)c->srv->max_frame);
  else
    snprintf(msg, sizeof msg, "frame refused: %s", fp4idx_strerror(rc));
  fp4idx__server_bad_frame(c, rc, msg);
}

/* Feeds the unparsed bytes of the scratch buffer to the frame reader, one
 * frame at a time. Stops where the budget says (budget.h) and leaves the
 * rest in scratch (in_off/in_len) for when the connection drains: a client
 * that pipelines more than the caps allow is simply read more slowly. */
static void fp4idx__server_parse(fp4idx_conn_t *c) {
  while (c->in_len > 0 && !c->eof && !c->closing && fp4idx__budget_may_read(c)) {
    size_t used = 0;
    if (!c->in_frame) { /* these bytes begin a frame */
      c->in_frame = 1;
      c->t_frame_us = fp4idx__stats_now_us();
    }
    if (fp4idx__server_adopt_frame(c)) break;
    int rc = fp4idx_frame_reader_feed(&c->fr, c->scratch + c->in_off, c->in_len, &used);
    c->in_off += used;
    c->in_len -= used;
    if (rc < 0) {
      fp4idx__server_frame_error(c, rc);
      break;
    }
    if (rc == 1) fp4idx__server_take_frame(c, c->scratch_pos + c->in_off);
    else fp4idx__server_track_frame(c);
  }
  if (c->in_len == 0 || c->eof || c->closing) c->in_off = c->in_len = 0;
  fp4idx__server_pump(c);
}

static void fp4idx__server_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  fp4idx_conn_t *c = h->data;
  void *space = NULL;
  size_t len = 0;
  (void)hint;
  /* Inside a body, read straight into it (never past its end, so the next
   * frame's bytes are not consumed); between frames, into the scratch. */
  fp4idx_frame_reader_space(&c->fr, &space, &len);
  if (space && len <= UINT32_MAX)
    *buf = uv_buf_init(space, (unsigned)len);
  else
    *buf = uv_buf_init((char *)c->scratch, FP4IDX_SERVER_SCRATCH);
}

static void fp4idx__server_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  fp4idx_conn_t *c = s->data;
  if (nread == 0) return; /* EAGAIN */
  if (nread < 0) {
    if (nread != UV_EOF)
      fp4idx__log_debug("connection %llu: read error: %s", (unsigned long long)c->id,
                        uv_strerror((int)nread));
    /* The peer is done sending; a partial frame is discarded. Responses to
     * complete requests are still written (a half-closed peer reads them). */
    c->eof = 1;
    if (nread != UV_EOF) {
      fp4idx__server_drop(c); /* e.g. ECONNRESET: nobody will read the responses */
      return;
    }
    fp4idx__server_update_reading(c);
    fp4idx__server_maybe_close(c);
    return;
  }
  fp4idx__busypoll_kick(&c->io->busypoll);
  c->rx_pos += (uint64_t)nread;
  fp4idx__server_collect_fds(c);
  if (buf->base == (char *)c->scratch) {
    c->scratch_pos = c->rx_pos - (uint64_t)nread;
    c->in_off = 0;
    c->in_len = (size_t)nread;
    fp4idx__server_parse(c);
  } else if (fp4idx_frame_reader_commit(&c->fr, (size_t)nread) == 1) {
    fp4idx__server_take_frame(c, c->rx_pos);
    fp4idx__server_pump(c);
  } else {
    fp4idx__server_track_frame(c);
  }
  fp4idx__server_update_reading(c);
}

static void fp4idx__server_update_reading(fp4idx_conn_t *c) {
  if (c->closing) return;
  /* Bytes left over from an earlier read go first (they may fill the caps
   * again); the socket is read only when none are left. */
  if (c->in_len > 0 && !c->eof && !c->io->stopping) fp4idx__server_parse(c);
  if (c->closing) return;
  int want = !c->eof && !c->io->stopping && c->in_len == 0 && fp4idx__budget_may_read(c);
  if (want && !c->reading) {
    if (uv_read_start((uv_stream_t *)&c->pipe, fp4idx__server_alloc_cb,
                      fp4idx__server_read_cb) == 0)
      c->reading = 1;
  } else if (!want && c->reading) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = 0;
  }
}

/* ---- accepting (the listener side is in listener.c) --------------------- */

/* A new connection of io, its pipe initialised on io's loop (not yet
 * open); NULL without memory. */
static fp4idx_conn_t *fp4idx__server_conn_new(fp4idx_ioloop_t *io) {
  fp4idx_server_t *srv = io->srv;
  fp4idx_conn_t *c = calloc(1, sizeof *c);
  /* ipc mode: libuv reads with recvmsg and keeps SCM_RIGHTS fds for us */
  if (!c || !(c->scratch = malloc(FP4IDX_SERVER_SCRATCH)) ||
      !(c->regions = calloc(1, sizeof *c->regions)) || uv_pipe_init(io->loop, &c->pipe, 1)) {
    if (c) free(c->scratch), free(c->regions);
    free(c);
    return NULL;
  }
  c->srv = srv;
  c->io = io;
  c->pipe.data = c;
  c->id = __atomic_add_fetch(&srv->next_conn_id, 1, __ATOMIC_RELAXED);
  c->progress_us = fp4idx__stats_now_us();
  fp4idx_frame_reader_init(&c->fr, (uint32_t)srv->max_frame);
  c->next = io->conns;
  if (io->conns) io->conns->prev = c;
  io->conns = c;
  fp4idx__regions_init(c->regions, c->id, srv->cuda_device);
  fp4idx__budget_start(io);
  return c;
}

/* c's pipe is open: who connected (for the log line of each register),
 * then reading starts. */
static void fp4idx__server_conn_ready(fp4idx_conn_t *c) {
  uv_os_fd_t sfd;
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (uv_fileno((uv_handle_t *)&c->pipe, &sfd) == 0 &&
      getsockopt(sfd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) {
    c->regions->pid = cred.pid;
    c->regions->uid = cred.uid;
    c->regions->gid = cred.gid;
  }
  fp4idx__log_debug("connection %llu opened on I/O loop %d", (unsigned long long)c->id,
                    c->io->index);
  fp4idx__server_resume(c); /* reads; or, on a stopping loop, closes at once */
}

void fp4idx__server_conn_open(fp4idx_ioloop_t *io, int fd) {
  fp4idx_conn_t *c = fp4idx__server_conn_new(io);
  if (!c) {
    fp4idx__log_error("out of memory for a connection");
    close(fd);
    fp4idx__server_conn_gone(io);
    return;
  }
  if (uv_pipe_open(&c->pipe, fd)) {
    close(fd);
    fp4idx__server_conn_close(c);
    return;
  }
  fp4idx__server_conn_ready(c);
}

int fp4idx__server_conn_accept(fp4idx_server_t *srv, uv_stream_t *l) {
  fp4idx_ioloop_t *io = &srv->io[srv->next_io++ % (unsigned)srv->n_io];
  if (io->index != 0) {
    /* Another loop's: taken here, its fd handed over (a libuv handle
     * belongs to one loop; the fd is the only thing that moves). */
    uv_pipe_t *p = malloc(sizeof *p);
    if (!p || uv_pipe_init(srv->loop, p, 0)) {
      free(p);
      return FP4IDX_ENOMEM;
    }
    uv_os_fd_t raw;
    int fd = -1;
    if (uv_accept(l, (uv_stream_t *)p) == 0 && uv_fileno((uv_handle_t *)p, &raw) == 0)
      fd = fcntl(raw, F_DUPFD_CLOEXEC, 3);
    uv_close((uv_handle_t *)p, fp4idx__server_pending_fd_close_cb);
    if (fd < 0) return FP4IDX_OK; /* the peer left before we took it: nothing to report */
    fp4idx__server_conn_counted(srv);
    fp4idx__server_io_handoff(io, fd);
    return FP4IDX_OK;
  }
  fp4idx_conn_t *c = fp4idx__server_conn_new(io);
  if (!c) return FP4IDX_ENOMEM;
  fp4idx__server_conn_counted(srv);
  if (uv_accept(l, (uv_stream_t *)&c->pipe)) {
    fp4idx__server_conn_close(c);
    return FP4IDX_OK; /* the peer left before we took it: nothing to report */
  }
  fp4idx__server_conn_ready(c);
  return FP4IDX_OK;
}

/* ---- stopping ----------------------------------------------------------- */

/* io's thread: a message's walk over its connections. */
static void fp4idx__server_io_stop(fp4idx_ioloop_t *io) {
  io->stopping = 1;
  for (fp4idx_conn_t *c = io->conns, *next; c; c = next) {
    next = c->next;
    fp4idx__server_resume(c); /* stops reading (stopping is set); idle ones close */
  }
}

static void fp4idx__server_io_close_all(fp4idx_ioloop_t *io) {
  for (fp4idx_conn_t *c = io->conns; c; c = c->next) fp4idx__server_drop(c);
}

void fp4idx__server_io_msg(fp4idx_ioloop_t *io, unsigned flags) {
  fp4idx__budget_walk(io, flags, NULL);
  if (flags & FP4IDX_IO_STOP) fp4idx__server_io_stop(io);
  if (flags & FP4IDX_IO_CLOSE_ALL) fp4idx__server_io_close_all(io);
  if (flags & FP4IDX_IO_CHECK) fp4idx__server_check_stopped(io->srv);
  fp4idx__server_flush_streams_of(io); /* streams, and parts that came with a reply */
}

void fp4idx__server_close_all(fp4idx_server_t *srv) {
  fp4idx__server_io_close_all(&srv->io[0]);
  for (int i = 1; i < srv->n_io; i++) fp4idx__server_io_post(&srv->io[i], FP4IDX_IO_CLOSE_ALL);
}

static void fp4idx__server_check_stopped(fp4idx_server_t *srv) {
  if (srv->stopping == 1 && srv->listeners_open == 0 &&
      __atomic_load_n(&srv->n_conns, __ATOMIC_ACQUIRE) == 0) {
    __atomic_store_n(&srv->stopping, 2, __ATOMIC_RELEASE); /* report once */
    fp4idx__budget_stop(&srv->io[0]);
    if (srv->on_stopped) srv->on_stopped(srv);
  }
}

static void fp4idx__server_listener_close_cb(uv_handle_t *h) {
  fp4idx_server_t *srv = h->data;
  srv->listeners_open--;
  fp4idx__server_check_stopped(srv);
}

void fp4idx__server_stop(fp4idx_server_t *srv) {
  if (srv->stopping) return;
  __atomic_store_n(&srv->stopping, 1, __ATOMIC_RELEASE);
  /* What was received is answered: no lane waits from here on. */
  if (srv->pressure) srv->pressure(srv, 0);
  if (srv->spare_fd >= 0) close(srv->spare_fd);
  srv->spare_fd = -1;
  /* Unlink before close: from here on a new daemon may bind the path. */
  if (srv->path[0]) {
    unlink(srv->path);
    srv->path[0] = '\0';
  }
  for (int i = 0; i < srv->n_listeners; i++) {
    srv->listeners[i].data = srv;
    uv_close((uv_handle_t *)&srv->listeners[i], fp4idx__server_listener_close_cb);
  }
  fp4idx__server_io_stop(&srv->io[0]);
  for (int i = 1; i < srv->n_io; i++) fp4idx__server_io_post(&srv->io[i], FP4IDX_IO_STOP);
  fp4idx__server_check_stopped(srv);
}
