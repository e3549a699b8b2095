/* ioloop.c -- the I/O loops: connections spread over N event loops, loop 0
 * the daemon's main loop and each other loop on its own thread (see
 * server.h "I/O loops").
 *
 * One libuv loop per thread, each owning its connections outright, rather
 * than Redis 6's I/O threads (one thread owns every client and fans reads
 * and writes out to helpers, waiting for them at each turn): libuv's
 * handles belong to one loop, so a connection that lives on one loop needs
 * no lock for anything of its own, and a loop never waits for another. A
 * loop is woken by one uv_async_t for everything sent to it: connections
 * handed over (their fds), requests back from the worker (its job queue),
 * and the messages of server.h (FP4IDX_IO_*).
 */
#define _GNU_SOURCE
#include "server.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "fp4idx_status.h"
#include "log.h"

static void fp4idx__io_close_handles(fp4idx_ioloop_t *io);

static void fp4idx__io_wake_cb(uv_async_t *h) {
  fp4idx_ioloop_t *io = h->data;
  fp4idx__worker_drain_home(io->srv->worker, &io->done);
  pthread_mutex_lock(&io->mu);
  unsigned flags = io->flags;
  io->flags = 0;
  int *fds = io->fds;
  size_t nfds = io->nfds;
  io->fds = NULL;
  io->nfds = io->capfds = 0;
  pthread_mutex_unlock(&io->mu);
  for (size_t i = 0; i < nfds; i++) fp4idx__server_conn_open(io, fds[i]);
  free(fds);
  fp4idx__server_io_msg(io, flags);
  if (flags & FP4IDX_IO_QUIT) fp4idx__io_close_handles(io);
}

void fp4idx__server_io_post(fp4idx_ioloop_t *io, unsigned flags) {
  pthread_mutex_lock(&io->mu);
  io->flags |= flags;
  pthread_mutex_unlock(&io->mu);
  uv_async_send(&io->wake);
}

void fp4idx__server_io_handoff(fp4idx_ioloop_t *io, int fd) {
  pthread_mutex_lock(&io->mu);
  if (io->nfds == io->capfds) {
    size_t cap = io->capfds ? 2 * io->capfds : 16;
    int *n = realloc(io->fds, cap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&io->mu);
      fp4idx__log_error("out of memory handing a connection to I/O loop %d", io->index);
      close(fd);
      fp4idx__server_conn_gone(&io->srv->io[0]); /* loop 0's thread: this one */
      return;
    }
    io->fds = n;
    io->capfds = cap;
  }
  io->fds[io->nfds++] = fd;
  pthread_mutex_unlock(&io->mu);
  uv_async_send(&io->wake);
}

/* io's thread: closes the handles that keep its loop running. */
static void fp4idx__io_close_handles(fp4idx_ioloop_t *io) {
  fp4idx__budget_stop(io);
  if (!uv_is_closing((uv_handle_t *)&io->busypoll.idle))
    uv_close((uv_handle_t *)&io->busypoll.idle, NULL);
  if (io->wake_ok) uv_close((uv_handle_t *)&io->wake, NULL);
  io->wake_ok = 0;
}

static void *fp4idx__io_main(void *arg) {
  fp4idx_ioloop_t *io = arg;
  uv_run(io->loop, UV_RUN_DEFAULT);
  return NULL;
}

int fp4idx__server_io_init(fp4idx_server_t *srv, int n, int spin_us, const uint64_t *busy) {
  if (!srv || n < 1 || n > FP4IDX_SERVER_MAX_IO) return FP4IDX_EINVAL;
  srv->io = calloc((size_t)n, sizeof *srv->io);
  if (!srv->io) return FP4IDX_ENOMEM;
  for (int i = 0; i < n; i++) {
    fp4idx_ioloop_t *io = &srv->io[i];
    io->srv = srv;
    io->index = i;
    srv->n_io = i + 1;
    if (pthread_mutex_init(&io->mu, NULL) || fp4idx__jobq_init(&io->done, &io->wake))
      return FP4IDX_ENOMEM;
    if (i == 0) {
      io->loop = srv->loop;
    } else {
      if (uv_loop_init(&io->own)) return FP4IDX_EINTERNAL;
      io->loop = &io->own;
      io->loop_ok = 1;
    }
    if (uv_async_init(io->loop, &io->wake, fp4idx__io_wake_cb)) return FP4IDX_EINTERNAL;
    io->wake.data = io;
    io->wake_ok = 1;
    if (fp4idx__busypoll_init(&io->busypoll, io->loop, spin_us, busy)) return FP4IDX_EINTERNAL;
    io->busypoll.polling = &srv->polling;
  }
  return FP4IDX_OK;
}

int fp4idx__server_io_start(fp4idx_server_t *srv) {
  for (int i = 1; i < srv->n_io; i++) {
    fp4idx_ioloop_t *io = &srv->io[i];
    if (pthread_create(&io->thread, NULL, fp4idx__io_main, io)) {
      fp4idx__log_error("cannot start I/O thread %d", i);
      return FP4IDX_EINTERNAL;
    }
    io->thread_on = 1;
    char name[32]; /* loop 0 is the main thread's, named fp4idxd */
    snprintf(name, sizeof name, "fp4idx-io%d", i);
    name[15] = '\0'; /* a thread's name holds 15 bytes */
    pthread_setname_np(io->thread, name);
  }
  return FP4IDX_OK;
}

void fp4idx__server_io_quit(fp4idx_server_t *srv) {
  if (!srv->io) return;
  for (int i = 1; i < srv->n_io; i++) {
    fp4idx_ioloop_t *io = &srv->io[i];
    if (!io->thread_on) continue;
    fp4idx__server_io_post(io, FP4IDX_IO_QUIT);
    pthread_join(io->thread, NULL);
    io->thread_on = 0;
  }
  fp4idx__io_close_handles(&srv->io[0]);
}

static void fp4idx__io_walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

void fp4idx__server_loop_close_all(uv_loop_t *loop) {
  uv_walk(loop, fp4idx__io_walk_close, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
}

void fp4idx__server_io_fini(fp4idx_server_t *srv) {
  if (!srv->io) return;
  fp4idx__server_io_quit(srv);
  for (int i = 0; i < srv->n_io; i++) {
    fp4idx_ioloop_t *io = &srv->io[i];
    if (io->loop_ok) {
      fp4idx__server_loop_close_all(io->loop);
      uv_loop_close(io->loop);
      io->loop_ok = 0;
    }
    for (size_t k = 0; k < io->nfds; k++) close(io->fds[k]);
    free(io->fds);
    fp4idx__jobq_destroy(&io->done);
    pthread_mutex_destroy(&io->mu);
  }
  free(srv->io);
  srv->io = NULL;
  srv->n_io = 0;
}
