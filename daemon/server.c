/* server.c -- listening socket, connections, framing, response order.
 * See server.h for the request path and the caps. */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "commands.h"
#include "fp4idx_status.h"
#include "score.h"
#include "log.h"
#include "mkdirs.h"
#include "stats.h"

static void fp4idx__server_flush(fp4idx_conn_t *c);
static void fp4idx__server_conn_close(fp4idx_conn_t *c);
static void fp4idx__server_update_reading(fp4idx_conn_t *c);
static void fp4idx__server_check_stopped(fp4idx_server_t *srv);

void fp4idx__server_init(fp4idx_server_t *srv, uv_loop_t *loop, uint64_t max_frame) {
  memset(srv, 0, sizeof *srv);
  srv->loop = loop;
  srv->max_frame = max_frame;
}

void fp4idx__server_req_free(fp4idx_req_t *req) {
  if (!req) return;
  free(req->body);
  free(req->resp);
  free(req->payloads);
  if (req->out && req->out_free) req->out_free(req->out_free_arg, req->out);
  free(req);
}

/* ---- connection lifetime ---------------------------------------------- */

static void fp4idx__server_conn_free(fp4idx_conn_t *c) {
  fp4idx_server_t *srv = c->srv;
  if (c->prev) c->prev->next = c->next; else srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  srv->n_conns--;
  fp4idx_frame_reader_free(&c->fr);
  free(c->scratch);
  free(c);
  if (srv->conn_event) srv->conn_event(srv, -1);
  fp4idx__server_check_stopped(srv);
}

static void fp4idx__server_close_cb(uv_handle_t *h) {
  fp4idx_conn_t *c = h->data;
  c->closed = 1;
  /* Every started write has had its callback (UV_ECANCELED at the latest);
   * finished responses that were never written are dropped here. Requests
   * still on the worker stay in the list until their done callback. */
  fp4idx_req_t **pp = &c->head;
  c->tail = NULL;
  while (*pp) {
    fp4idx_req_t *r = *pp;
    if (r->done) {
      *pp = r->next;
      c->pending--;
      fp4idx__server_req_free(r);
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
  if (c->reading) uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = 0;
  uv_close((uv_handle_t *)&c->pipe, fp4idx__server_close_cb);
}

/* Closes a connection that has nothing left to do: the peer is done sending
 * (or the daemon is stopping) and every response is written. */
static void fp4idx__server_maybe_close(fp4idx_conn_t *c) {
  if (!c->closing && (c->eof || c->srv->stopping) && c->pending == 0)
    fp4idx__server_conn_close(c);
}

/* ---- writing responses in order ----------------------------------------- */

static void fp4idx__server_write_cb(uv_write_t *wr, int status) {
  fp4idx_req_t *r = wr->data;
  fp4idx_conn_t *c = r->conn;
  /* Writes start in list order and complete in order: r is the head. */
  c->head = r->next;
  if (!c->head) c->tail = NULL;
  c->pending--;
  c->out_bytes -= r->wire_len;
  if (status == 0 && c->srv->stages)
    fp4idx__stages_add(c->srv->stages, FP4IDX_STAGE_WRITE,
                       fp4idx__stats_now_us() - r->t_write_us);
  int close_after = r->close_after;
  fp4idx__server_req_free(r);
  if (c->closing) {
    return; /* close_cb finishes the cleanup */
  }
  if (status < 0) {
    fp4idx__log_debug("connection %llu: write failed: %s", (unsigned long long)c->id,
                      uv_strerror(status));
    c->dead = 1;
    fp4idx__server_conn_close(c);
    return;
  }
  if (close_after) {
    fp4idx__server_conn_close(c);
    return;
  }
  fp4idx__server_flush(c);
  fp4idx__server_update_reading(c);
  fp4idx__server_maybe_close(c);
}

static void fp4idx__server_flush(fp4idx_conn_t *c) {
  if (c->closing || c->dead) return;
  for (fp4idx_req_t *r = c->head; r && r->done; r = r->next) {
    if (r->write_started) {
      if (r->close_after) return; /* nothing goes out after a closing reply */
      continue;
    }
    /* The frame's bytes with the payloads spliced in at their offsets: one
     * writev, no copy of the payloads (libuv copies the buf array). */
    uv_buf_t small[17], *bufs = small;
    size_t nb = 2 * r->npayloads + 1;
    if (nb > sizeof small / sizeof small[0] && !(bufs = malloc(nb * sizeof *bufs))) {
      c->dead = 1;
      fp4idx__server_conn_close(c);
      return;
    }
    size_t at = 0, k = 0;
    for (size_t i = 0; i < r->npayloads; i++) {
      const fp4idx_payload_t *p = &r->payloads[i];
      bufs[k++] = uv_buf_init((char *)r->resp + at, (unsigned)(p->at - at));
      bufs[k++] = uv_buf_init((char *)p->data, (unsigned)p->len);
      at = p->at;
    }
    bufs[k++] = uv_buf_init((char *)r->resp + at, (unsigned)(r->resp_len - at));
    r->wr.data = r;
    r->t_write_us = fp4idx__stats_now_us();
    int rc = uv_write(&r->wr, (uv_stream_t *)&c->pipe, bufs, (unsigned)k,
                      fp4idx__server_write_cb);
    if (bufs != small) free(bufs);
    if (rc < 0) {
      c->dead = 1;
      fp4idx__server_conn_close(c);
      return;
    }
    r->write_started = 1;
    c->out_bytes += r->wire_len;
    if (r->close_after) return;
  }
}

void fp4idx__server_req_done(fp4idx_req_t *req) {
  fp4idx_conn_t *c = req->conn;
  req->done = 1;
  if (req->t_done_us > 0 && c->srv->stages)
    fp4idx__stages_add(c->srv->stages, FP4IDX_STAGE_WAKE,
                       fp4idx__stats_now_us() - req->t_done_us);
  if (c->closed) {
    /* The connection is gone: unlink and drop the response. */
    fp4idx_req_t **pp = &c->head, *prev = NULL;
    while (*pp && *pp != req) prev = *pp, pp = &(*pp)->next;
    if (*pp) {
      *pp = req->next;
      if (c->tail == req) c->tail = prev;
      c->pending--;
    }
    fp4idx__server_req_free(req);
    if (!c->head) fp4idx__server_conn_free(c);
    return;
  }
  if (c->closing) return; /* close_cb frees it */
  fp4idx__server_flush(c);
  fp4idx__server_update_reading(c);
  fp4idx__server_maybe_close(c);
}

/* ---- reading and framing ------------------------------------------------ */

static void fp4idx__server_update_reading(fp4idx_conn_t *c);

static void fp4idx__server_enqueue(fp4idx_conn_t *c, fp4idx_req_t *r) {
  r->conn = c;
  r->next = NULL;
  if (c->tail) c->tail->next = r; else c->head = r;
  c->tail = r;
  c->pending++;
}

/* A frame that cannot be a request (too long, empty): reply with `status`
 * and close after the reply; read nothing more. */
static void fp4idx__server_bad_frame(fp4idx_conn_t *c, int status, const char *msg) {
  fp4idx__log_info("connection %llu: %s; closing after the error reply",
                   (unsigned long long)c->id, msg);
  c->eof = 1;
  fp4idx_req_t *r = calloc(1, sizeof *r);
  if (!r || fp4idx__cmd_error_frame(status, msg, &r->resp, &r->resp_len)) {
    free(r);
    fp4idx__server_conn_close(c);
    return;
  }
  r->wire_len = r->resp_len;
  r->done = 1;
  r->close_after = 1;
  fp4idx__server_enqueue(c, r);
  fp4idx__server_flush(c);
}

static void fp4idx__server_out_free(void *arg, void *p) {
  (void)arg;
  fp4idx__score_out_release(p);
}

/* Hands a reply to its request (the server writes it). */
static void fp4idx__server_req_reply(fp4idx_req_t *req, fp4idx_cmd_reply_t *reply) {
  req->resp = reply->frame;
  req->resp_len = reply->frame_len;
  req->payloads = reply->payloads;
  req->npayloads = reply->npayloads;
  req->wire_len = reply->total_len;
  req->out = reply->out;
  req->out_free = fp4idx__server_out_free;
  req->out_free_arg = NULL;
  /* The body (and the views into it) are not needed any more. */
  free(req->body);
  req->body = NULL;
  if (!req->resp) req->close_after = 1; /* could not even encode an error */
  req->t_done_us = fp4idx__stats_now_us();
}

/* One finished request of a batch: its reply goes to the request, and
 * (on the worker) the request to the loop at once. */
typedef struct fp4idx__server_done_s {
  fp4idx_req_t *req;
  fp4idx_cmd_reply_t *reply;
  fp4idx_worker_t *worker;  /* NULL on the loop */
} fp4idx__server_done_t;

static void fp4idx__server_req_finished(void *arg) {
  fp4idx__server_done_t *f = arg;
  fp4idx__server_req_reply(f->req, f->reply);
  if (f->worker) fp4idx__worker_post(f->worker, &f->req->job); /* req may go now */
}

/* The requests queued back to back when the worker took them (worker.h),
 * or (on_loop) one the loop answers itself, from body to response frame;
 * neighbouring scores become one launch (fp4idx__cmd_execute_batch), and
 * each reply leaves as soon as it is ready. */
static void fp4idx__server_run(fp4idx_job_t **jobs, int n, int on_loop) {
  fp4idx_req_t *first = jobs[0]->data;
  struct fp4idx_daemon_s *d = first->conn->srv->data;
  double tq = fp4idx__stats_now_us();
  fp4idx_cmd_job_t cj[FP4IDX_WORKER_MAX_BATCH];
  fp4idx_cmd_reply_t replies[FP4IDX_WORKER_MAX_BATCH];
  fp4idx_stage_times_t times[FP4IDX_WORKER_MAX_BATCH];
  fp4idx__server_done_t done[FP4IDX_WORKER_MAX_BATCH];
  for (int i = 0; i < n; i++) {
    fp4idx_req_t *req = jobs[i]->data;
    memset(&times[i], 0, sizeof times[i]);
    times[i].us[FP4IDX_STAGE_READ] = req->t0_us - req->t_first_us;
    done[i] = (fp4idx__server_done_t){.req = req, .reply = &replies[i],
                                      .worker = on_loop ? NULL : first->conn->srv->worker};
    cj[i] = (fp4idx_cmd_job_t){.body = req->body, .len = req->body_len, .t0_us = req->t0_us,
                               .tq_us = tq, .times = &times[i], .reply = &replies[i],
                               .finished = fp4idx__server_req_finished, .arg = &done[i]};
  }
  fp4idx__cmd_execute_batch(d, cj, n);
}

static void fp4idx__server_req_batch(fp4idx_job_t **jobs, int n) {
  fp4idx__server_run(jobs, n, 0);
}

static void fp4idx__server_req_work(fp4idx_job_t *job) {
  fp4idx__server_run(&job, 1, 0);
}

static void fp4idx__server_req_job_done(fp4idx_job_t *job) {
  fp4idx__server_req_done(job->data);
}

/* A whole frame is in the reader: hand its body to a request and queue it. */
static void fp4idx__server_dispatch(fp4idx_conn_t *c) {
  fp4idx_req_t *r = calloc(1, sizeof *r);
  if (!r || fp4idx_frame_reader_take(&c->fr, &r->body, &r->body_len)) {
    free(r);
    fp4idx__server_bad_frame(c, FP4IDX_ENOMEM, "out of memory for a request");
    return;
  }
  r->job.work = fp4idx__server_req_work;
  r->job.batch = fp4idx__server_req_batch;
  r->job.done = fp4idx__server_req_job_done;
  r->job.data = r;
  r->t0_us = fp4idx__stats_now_us();
  r->t_first_us = c->in_frame ? c->t_frame_us : r->t0_us;
  c->in_frame = 0;
  fp4idx__server_enqueue(c, r);
  if (c->pending == 1 && fp4idx__cmd_loop_op(r->body, r->body_len)) {
    /* hello/info/stats with nothing else in flight: answered here, no
     * worker hop (so no wake time), written without re-entering the parser */
    fp4idx__server_run((fp4idx_job_t *[]){&r->job}, 1, 1);
    r->done = 1;
    if (c->srv->stages) fp4idx__stages_add(c->srv->stages, FP4IDX_STAGE_WAKE, 0);
    fp4idx__server_flush(c);
    return;
  }
  fp4idx__worker_submit(c->srv->worker, &r->job);
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

static int fp4idx__server_over_caps(const fp4idx_conn_t *c) {
  return c->pending >= FP4IDX_SERVER_MAX_PENDING || c->out_bytes >= FP4IDX_SERVER_MAX_OUT_BYTES;
}

/* Feeds the unparsed bytes of the scratch buffer to the frame reader, one
 * frame at a time. Stops at a cap and leaves the rest in scratch
 * (in_off/in_len) for when the connection drains: a client that pipelines
 * more than the caps allow is simply read more slowly. Callers enter only
 * below the caps; the check after each frame keeps it so. */
static void fp4idx__server_parse(fp4idx_conn_t *c) {
  while (c->in_len > 0 && !c->eof && !c->closing) {
    size_t used = 0;
    if (!c->in_frame) { /* these bytes begin a frame */
      c->in_frame = 1;
      c->t_frame_us = fp4idx__stats_now_us();
    }
    int rc = fp4idx_frame_reader_feed(&c->fr, c->scratch + c->in_off, c->in_len, &used);
    c->in_off += used;
    c->in_len -= used;
    if (rc < 0) {
      fp4idx__server_frame_error(c, rc);
      break;
    }
    if (rc == 1) {
      fp4idx__server_dispatch(c);
      if (fp4idx__server_over_caps(c)) break; /* resume from update_reading */
    }
  }
  if (c->in_len == 0 || c->eof || c->closing) c->in_off = c->in_len = 0;
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
      c->dead = 1; /* e.g. ECONNRESET: nobody will read the responses */
      fp4idx__server_conn_close(c);
      return;
    }
    fp4idx__server_update_reading(c);
    fp4idx__server_maybe_close(c);
    return;
  }
  if (buf->base == (char *)c->scratch) {
    c->in_off = 0;
    c->in_len = (size_t)nread;
    fp4idx__server_parse(c);
  } else if (fp4idx_frame_reader_commit(&c->fr, (size_t)nread) == 1) {
    fp4idx__server_dispatch(c);
  }
  fp4idx__server_update_reading(c);
}

static void fp4idx__server_update_reading(fp4idx_conn_t *c) {
  if (c->closing) return;
  /* Bytes left over from an earlier read go first (they may fill the caps
   * again); the socket is read only when none are left. */
  if (c->in_len > 0 && !c->eof && !c->srv->stopping && !fp4idx__server_over_caps(c))
    fp4idx__server_parse(c);
  if (c->closing) return;
  int want = !c->eof && !c->srv->stopping && c->in_len == 0 && !fp4idx__server_over_caps(c);
  if (want && !c->reading) {
    if (uv_read_start((uv_stream_t *)&c->pipe, fp4idx__server_alloc_cb,
                      fp4idx__server_read_cb) == 0)
      c->reading = 1;
  } else if (!want && c->reading) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = 0;
  }
}

/* ---- accepting ---------------------------------------------------------- */

static void fp4idx__server_reject_close_cb(uv_handle_t *h) { free(h); }

static void fp4idx__server_connection_cb(uv_stream_t *l, int status) {
  fp4idx_server_t *srv = l->data;
  if (status < 0) {
    fp4idx__log_warn("accept: %s", uv_strerror(status));
    return;
  }
  if (srv->stopping || srv->n_conns >= FP4IDX_SERVER_MAX_CONNS) {
    uv_pipe_t *p = malloc(sizeof *p);
    if (!p || uv_pipe_init(srv->loop, p, 0)) {
      free(p);
      return;
    }
    if (uv_accept(l, (uv_stream_t *)p) == 0)
      fp4idx__log_warn("refusing a connection: %s",
                       srv->stopping ? "shutting down" : "too many connections");
    uv_close((uv_handle_t *)p, fp4idx__server_reject_close_cb);
    return;
  }
  fp4idx_conn_t *c = calloc(1, sizeof *c);
  if (!c || !(c->scratch = malloc(FP4IDX_SERVER_SCRATCH)) ||
      uv_pipe_init(srv->loop, &c->pipe, 0)) {
    fp4idx__log_error("out of memory for a connection");
    if (c) free(c->scratch);
    free(c);
    return;
  }
  c->srv = srv;
  c->pipe.data = c;
  c->id = ++srv->next_conn_id;
  fp4idx_frame_reader_init(&c->fr, (uint32_t)srv->max_frame);
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  srv->n_conns++;
  if (srv->conn_event) srv->conn_event(srv, +1);
  if (uv_accept(l, (uv_stream_t *)&c->pipe)) {
    fp4idx__server_conn_close(c);
    return;
  }
  fp4idx__log_debug("connection %llu opened", (unsigned long long)c->id);
  fp4idx__server_update_reading(c);
}

/* 1 when a daemon accepts connections on `path`, 0 when nothing answers
 * (stale file removed, or no file). -1 when the path holds something else. */
static int fp4idx__server_probe(const char *path) {
  struct stat st;
  if (lstat(path, &st) != 0) return 0;
  if (!S_ISSOCK(st.st_mode)) return -1;
  /* Non-blocking: a live daemon with a full backlog answers EAGAIN instead
   * of stalling our start. */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path));
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  int err = errno;
  close(fd);
  if (rc == 0) return 1;
  if (err == ECONNREFUSED || err == ENOENT) {
    fp4idx__log_info("removing stale socket %s", path);
    unlink(path);
    return 0;
  }
  return 1; /* e.g. EAGAIN: a live daemon with a full backlog */
}

static int fp4idx__server_listen_handle(fp4idx_server_t *srv, uv_pipe_t *p) {
  p->data = srv;
  int rc = uv_listen((uv_stream_t *)p, 128, fp4idx__server_connection_cb);
  if (rc) {
    fp4idx__log_error("listen: %s", uv_strerror(rc));
    return FP4IDX_EIO;
  }
  srv->n_listeners++;
  srv->listeners_open++;
  return FP4IDX_OK;
}

int fp4idx__server_listen_path(fp4idx_server_t *srv, const char *path) {
  if (!srv || !path || !*path) return FP4IDX_EINVAL;
  if (strlen(path) >= sizeof srv->path) return FP4IDX_E2BIG;
  if (srv->n_listeners >= FP4IDX_SERVER_MAX_LISTENERS) return FP4IDX_E2BIG;
  if (fp4idx__mkdirs(path, geteuid() == 0 ? 0755 : 0700, 1)) {
    fp4idx__log_error("cannot create the folder of %s: %s", path, strerror(errno));
    return FP4IDX_EIO;
  }
  int probe = fp4idx__server_probe(path);
  if (probe == 1) {
    fp4idx__log_error("another daemon is answering on %s", path);
    return FP4IDX_EEXIST;
  }
  if (probe < 0) {
    fp4idx__log_error("%s exists and is not a socket", path);
    return FP4IDX_EEXIST;
  }
  uv_pipe_t *p = &srv->listeners[srv->n_listeners];
  int rc = uv_pipe_init(srv->loop, p, 0);
  if (rc) return FP4IDX_EIO;
  rc = uv_pipe_bind(p, path);
  if (rc) {
    fp4idx__log_error("bind %s: %s", path, uv_strerror(rc));
    uv_close((uv_handle_t *)p, NULL);
    return FP4IDX_EIO;
  }
  snprintf(srv->path, sizeof srv->path, "%s", path);
  rc = fp4idx__server_listen_handle(srv, p);
  if (rc) {
    unlink(path);
    srv->path[0] = '\0';
    uv_close((uv_handle_t *)p, NULL);
    return rc;
  }
  fp4idx__log_info("listening on %s", path);
  return FP4IDX_OK;
}

int fp4idx__server_listen_fd(fp4idx_server_t *srv, int fd) {
  if (!srv || fd < 0) return FP4IDX_EINVAL;
  if (srv->n_listeners >= FP4IDX_SERVER_MAX_LISTENERS) return FP4IDX_E2BIG;
  uv_pipe_t *p = &srv->listeners[srv->n_listeners];
  int rc = uv_pipe_init(srv->loop, p, 0);
  if (rc) return FP4IDX_EIO;
  rc = uv_pipe_open(p, fd);
  if (rc) {
    fp4idx__log_error("adopting socket fd %d: %s", fd, uv_strerror(rc));
    uv_close((uv_handle_t *)p, NULL);
    return FP4IDX_EIO;
  }
  rc = fp4idx__server_listen_handle(srv, p);
  if (rc) {
    uv_close((uv_handle_t *)p, NULL);
    return rc;
  }
  fp4idx__log_info("listening on inherited socket fd %d", fd);
  return FP4IDX_OK;
}

/* ---- stopping ----------------------------------------------------------- */

void fp4idx__server_close_all(fp4idx_server_t *srv) {
  for (fp4idx_conn_t *c = srv->conns; c; c = c->next) {
    c->dead = 1;
    fp4idx__server_conn_close(c);
  }
}

static void fp4idx__server_check_stopped(fp4idx_server_t *srv) {
  if (srv->stopping == 1 && srv->listeners_open == 0 && srv->n_conns == 0) {
    srv->stopping = 2; /* report once */
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
  srv->stopping = 1;
  /* Unlink before close: from here on a new daemon may bind the path. */
  if (srv->path[0]) {
    unlink(srv->path);
    srv->path[0] = '\0';
  }
  for (int i = 0; i < srv->n_listeners; i++) {
    srv->listeners[i].data = srv;
    uv_close((uv_handle_t *)&srv->listeners[i], fp4idx__server_listener_close_cb);
  }
  for (fp4idx_conn_t *c = srv->conns, *next; c; c = next) {
    next = c->next;
    fp4idx__server_update_reading(c); /* stops reading: stopping is set */
    fp4idx__server_maybe_close(c);    /* idle ones close now */
  }
  fp4idx__server_check_stopped(srv);
}
