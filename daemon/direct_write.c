/* direct_write.c -- a reply written by the thread that built it (see
 * direct_write.h). */
#define _GNU_SOURCE
#include "direct_write.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "stats.h"

void fp4idx__direct_arm(fp4idx_conn_t *c, fp4idx_req_t *r) {
  uv_os_fd_t fd;
  if (c->head != r || c->out_bytes || c->closing || c->dead ||
      uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0)
    return;
  c->direct_fd = fd;
  __atomic_store_n(&c->direct, FP4IDX_DIRECT_ARMED, __ATOMIC_RELEASE);
}

void fp4idx__direct_try(fp4idx_req_t *r) {
  fp4idx_conn_t *c = r->conn;
  r->direct_sent = 0;
  r->direct_failed = 0;
  if (!r->resp || r->deferred || r->close_after) return;
  if (__atomic_load_n(&c->direct, __ATOMIC_ACQUIRE) != FP4IDX_DIRECT_ARMED) return;
  if (fp4idx__server_wire_ready(r) != (int64_t)r->wire_len) return; /* streams: the loop's */
  uv_buf_t small[17], *bufs = small;
  size_t nb = 2 * r->npayloads + 1;
  if (nb > sizeof small / sizeof small[0] && !(bufs = malloc(nb * sizeof *bufs))) return;
  int expect = FP4IDX_DIRECT_ARMED;
  if (__atomic_compare_exchange_n(&c->direct, &expect, FP4IDX_DIRECT_WRITING, 0,
                                  __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    double t0 = fp4idx__stats_now_us();
    size_t k = fp4idx__server_wire_bufs(r, 0, r->wire_len, bufs);
    /* uv_buf_t is laid out as struct iovec on Unix (uv.h) */
    struct msghdr m = {.msg_iov = (struct iovec *)bufs, .msg_iovlen = k};
    ssize_t n;
    do n = sendmsg(c->direct_fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n > 0) r->direct_sent = (size_t)n;
    else if (errno != EAGAIN && errno != EWOULDBLOCK) r->direct_failed = 1;
    r->direct_us = fp4idx__stats_now_us() - t0;
    __atomic_store_n(&c->direct, FP4IDX_DIRECT_DONE, __ATOMIC_RELEASE);
  }
  if (bufs != small) free(bufs);
}

int fp4idx__direct_disarm(fp4idx_conn_t *c) {
  int s;
  while ((s = __atomic_load_n(&c->direct, __ATOMIC_ACQUIRE)) == FP4IDX_DIRECT_WRITING)
    sched_yield(); /* one non-blocking sendmsg */
  int expect = s;
  while (!__atomic_compare_exchange_n(&c->direct, &expect, FP4IDX_DIRECT_IDLE, 0,
                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    if (expect == FP4IDX_DIRECT_WRITING) {
      sched_yield();
      expect = FP4IDX_DIRECT_DONE; /* what it becomes */
    }
  }
  return expect;
}
