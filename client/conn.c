/* conn.c -- libfp4idx-client's transport: the handle, connect/close, the
 * default socket path, timeouts, and whole-frame send/receive on a
 * non-blocking Unix socket driven by poll(2).
 *
 * The socket is non-blocking so that every wait goes through poll() with the
 * time left to the call's deadline; that makes short reads/writes, EINTR and
 * timeouts one loop each. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "fp4idx_codec.h"
#include "spin.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "libfp4idx-client passes arrays through as little-endian");

#define FP4IDX__STR2(x) #x
#define FP4IDX__STR(x) FP4IDX__STR2(x)

const char *fp4idx_client_version(void) {
  return FP4IDX__STR(FP4IDX_CLIENT_VERSION_MAJOR) "." FP4IDX__STR(
      FP4IDX_CLIENT_VERSION_MINOR) "." FP4IDX__STR(FP4IDX_CLIENT_VERSION_PATCH);
}

fp4idx_status_t fp4idx__client_fail(fp4idx_client_t *c, fp4idx_status_t st,
                                    const char *fmt, ...) {
  c->last_status = st;
  if (st == FP4IDX_OK || fmt == NULL) {
    c->last_error[0] = '\0';
    if (st != FP4IDX_OK)
      snprintf(c->last_error, sizeof c->last_error, "%s", fp4idx_strerror(st));
    return st;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
  va_end(ap);
  return st;
}

/* strerror(3) without its shared buffer (GNU strerror_r returns the text,
 * in buf or static): connections used from several threads stay apart. */
#define ERRTEXT(e) strerror_r((e), (char[128]){0}, 128)

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t fp4idx__client_deadline(const fp4idx_client_t *c) {
  return c->timeout_ms > 0 ? now_ms() + c->timeout_ms : INT64_MAX;
}

/* Time left for poll(): -1 = forever, 0 = expired. */
static int time_left(int64_t deadline) {
  if (deadline == INT64_MAX) return -1;
  int64_t left = deadline - now_ms();
  if (left <= 0) return 0;
  return left > 1000000000 ? 1000000000 : (int)left;
}

/* Waits until fd is ready for `events`. Returns OK, ETIMEDOUT or ECONN. */
static fp4idx_status_t wait_fd(int fd, short events, int64_t deadline) {
  for (;;) {
    int left = time_left(deadline);
    if (left == 0) return FP4IDX_ETIMEDOUT;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, left);
    if (r > 0) return FP4IDX_OK; /* errors/hangup surface in read/write */
    if (r == 0) {
      if (deadline != INT64_MAX && now_ms() >= deadline)
        return FP4IDX_ETIMEDOUT;
      continue;
    }
    if (errno != EINTR) return FP4IDX_ECONN;
  }
}

fp4idx_client_t *fp4idx_client_new(void) {
  fp4idx_client_t *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->fd = -1;
  c->next_id = 1;
  /* Spin by default where a core can spare it, as long as this
   * connection's replies usually take: a reply that comes within the
   * window skips the scheduler's wake-up (10-13 us of an info round trip
   * on the H200 host, docs/RESULTS.md); on a machine of 1-3 cores the spin
   * would take the core the daemon needs. */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  c->busy_poll_us = ncpu >= 4 ? FP4IDX_CLIENT_BUSY_POLL_AUTO : 0;
  c->reply_min = FP4IDX_CLIENT_REPLY_REGION_DEFAULT;
  return c;
}

void fp4idx__client_disconnect(fp4idx_client_t *c) {
  /* with channels open, shutdown first: each channel's watcher holds a dup
   * of the socket, and the daemon must see this side close */
  if (c->fd >= 0 && c->channels > 0) shutdown(c->fd, SHUT_RDWR);
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->max_frame = 0;
  c->sent_us = 0; /* no reply awaited on the next connection */
  fp4idx__client_reply_forget(c); /* the daemon released it with the connection */
}

void fp4idx_client_close(fp4idx_client_t *c) {
  if (c == NULL) return;
  fp4idx__client_disconnect(c);
  free(c);
}

void fp4idx_client_free(void *p) { free(p); }

int fp4idx_client_connected(const fp4idx_client_t *c) {
  return c != NULL && c->fd >= 0;
}

const char *fp4idx_client_last_error(const fp4idx_client_t *c) {
  return c == NULL ? "no connection handle (NULL)" : c->last_error;
}

fp4idx_status_t fp4idx_client_last_status(const fp4idx_client_t *c) {
  return c == NULL ? FP4IDX_EINVAL : c->last_status;
}

fp4idx_status_t fp4idx_client_set_timeout(fp4idx_client_t *c,
                                          int timeout_ms) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (timeout_ms < 0)
    return fp4idx__client_fail(c, FP4IDX_EINVAL, "timeout %d ms is negative",
                               timeout_ms);
  c->timeout_ms = timeout_ms;
  return fp4idx__client_fail(c, FP4IDX_OK, NULL);
}

fp4idx_status_t fp4idx_client_set_busy_poll(fp4idx_client_t *c, int us) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (us != FP4IDX_CLIENT_BUSY_POLL_AUTO && (us < 0 || us > 1000000))
    return fp4idx__client_fail(c, FP4IDX_EINVAL,
                               "busy poll of %d us outside 0..1000000 (or -1: automatic)", us);
  c->busy_poll_us = us;
  return fp4idx__client_fail(c, FP4IDX_OK, NULL);
}

fp4idx_status_t fp4idx_client_default_socket(char *buf, size_t size) {
  if (buf == NULL || size == 0) return FP4IDX_EINVAL;
  const char *env = getenv("FP4IDX_SOCKET");
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  if (env != NULL && env[0] != '\0')
    n = snprintf(buf, size, "%s", env);
  else if (geteuid() != 0 && xdg != NULL && xdg[0] != '\0')
    n = snprintf(buf, size, "%s/fp4idx/fp4idxd.sock", xdg);
  else /* root, or no runtime dir: the system daemon's socket (as fp4idxd) */
    n = snprintf(buf, size, "/run/fp4idx/fp4idxd.sock");
  return (n < 0 || (size_t)n >= size) ? FP4IDX_E2BIG : FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_connect(fp4idx_client_t *c,
                                      const char *socket_path) {
  if (c == NULL) return FP4IDX_EINVAL;
  fp4idx__client_disconnect(c);

  char def[sizeof(((struct sockaddr_un *)0)->sun_path) + 64];
  if (socket_path == NULL) {
    if (fp4idx_client_default_socket(def, sizeof def) != FP4IDX_OK)
      return fp4idx__client_fail(c, FP4IDX_EINVAL,
                                 "default socket path too long");
    socket_path = def;
  }
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  size_t plen = strlen(socket_path);
  if (plen == 0 || plen >= sizeof addr.sun_path)
    return fp4idx__client_fail(c, FP4IDX_EINVAL,
                               "socket path '%s' is empty or longer than %zu "
                               "bytes",
                               socket_path, sizeof addr.sun_path - 1);
  memcpy(addr.sun_path, socket_path, plen + 1);

  int64_t deadline = fp4idx__client_deadline(c);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return fp4idx__client_fail(c, errno == ENOMEM ? FP4IDX_ENOMEM : FP4IDX_ECONN,
                               "socket: %s", ERRTEXT(errno));
  for (;;) {
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) break;
    int e = errno;
    if (e == EINTR) continue;
    /* A Unix socket whose listen backlog is full answers EAGAIN at once
     * (never EINPROGRESS); retry until the deadline. */
    if (e == EAGAIN) {
      if (time_left(deadline) == 0) {
        close(fd);
        return fp4idx__client_fail(c, FP4IDX_ETIMEDOUT,
                                   "connect %s: backlog full, timed out",
                                   socket_path);
      }
      struct timespec ts = {0, 2 * 1000 * 1000};
      nanosleep(&ts, NULL);
      continue;
    }
    if (e == EINPROGRESS) {
      fp4idx_status_t st = wait_fd(fd, POLLOUT, deadline);
      int err = 0;
      socklen_t el = sizeof err;
      if (st == FP4IDX_OK &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)
        break;
      close(fd);
      if (st == FP4IDX_ETIMEDOUT)
        return fp4idx__client_fail(c, st, "connect %s: timed out",
                                   socket_path);
      return fp4idx__client_fail(c, FP4IDX_ECONN, "connect %s: %s",
                                 socket_path, ERRTEXT(err ? err : EIO));
    }
    close(fd);
    return fp4idx__client_fail(c, FP4IDX_ECONN,
                               "connect %s: %s (is fp4idxd running?)",
                               socket_path, ERRTEXT(e));
  }
  c->fd = fd;
  return fp4idx__client_fail(c, FP4IDX_OK, NULL);
}

/* One recv of 1..cap bytes into p (waiting for them): *got. `what`, `have`
 * and `total` only word the messages. On error the connection is closed. */
static fp4idx_status_t recv_chunk(fp4idx_client_t *c, char *p, size_t cap, size_t *got,
                                  int64_t deadline, const char *what, size_t have,
                                  size_t total) {
  int64_t spin_until = 0; /* busy poll: retry recv until then (us) */
  for (;;) {
    ssize_t r = recv(c->fd, p, cap, 0);
    if (r > 0) {
      if (c->sent_us) { /* a reply's first bytes: how long they took */
        c->spin_recent_us = fp4idx__client_spin_learn(c->spin_recent_us, now_us() - c->sent_us);
        c->sent_us = 0;
      }
      *got = (size_t)r;
      return FP4IDX_OK;
    }
    if (r == 0) {
      fp4idx__client_disconnect(c);
      return fp4idx__client_fail(
          c, FP4IDX_ECONN, "daemon closed the connection (%s, %zu of %zu bytes)",
          what, have, total);
    }
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && c->busy_poll_us != 0) {
      int64_t t = now_us();
      if (spin_until == 0)
        spin_until = t + fp4idx__client_spin_window(c->busy_poll_us, c->spin_recent_us);
      if (t < spin_until) {
        sched_yield(); /* a runnable thread of this CPU (the daemon's) goes first */
        continue;
      }
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      fp4idx_status_t st = wait_fd(c->fd, POLLIN, deadline);
      if (st == FP4IDX_OK) continue;
      fp4idx__client_disconnect(c);
      return fp4idx__client_fail(c, st,
                                 st == FP4IDX_ETIMEDOUT
                                     ? "timed out waiting for the response"
                                     : "poll failed while receiving");
    }
    int e = errno;
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_ECONN,
                               "connection lost while receiving: %s",
                               ERRTEXT(e));
  }
}

/* Reads exactly len bytes into p; `what` names the part for messages. */
static fp4idx_status_t read_all(fp4idx_client_t *c, char *p, size_t len,
                                int64_t deadline, const char *what) {
  size_t got = 0;
  while (got < len) {
    size_t n = 0;
    fp4idx_status_t st = recv_chunk(c, p + got, len - got, &n, deadline, what, got, len);
    if (st != FP4IDX_OK) return st;
    got += n;
  }
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx__client_sendv(fp4idx_client_t *c, struct iovec *iov, int n, int fd,
                                     int64_t deadline) {
  if (c->fd < 0)
    return fp4idx__client_fail(c, FP4IDX_ECONN, "not connected");
  /* The fd rides on the first bytes of the frame (the daemon gives it to
   * the frame those bytes belong to); the rest, if the socket took only
   * part, follows without it. */
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct msghdr mh = {0};
  if (fd >= 0) {
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  }
  size_t left = (size_t)n; /* iov[0..left) still to send */
  for (;;) {
    while (left > 0 && iov[0].iov_len == 0) {
      iov++;
      left--;
    }
    if (left == 0) { /* a frame is >= 4 bytes: the fd went */
      c->sent_us = now_us(); /* the reply's wait starts */
      return FP4IDX_OK;
    }
    mh.msg_iov = iov;
    mh.msg_iovlen = left < IOV_MAX ? left : IOV_MAX; /* sendmsg takes at most IOV_MAX */
    ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    if (w > 0) {
      mh.msg_control = NULL; /* it went with these bytes */
      mh.msg_controllen = 0;
      for (size_t done = (size_t)w; done > 0;) {
        size_t k = done < iov[0].iov_len ? done : iov[0].iov_len;
        iov[0].iov_base = (char *)iov[0].iov_base + k;
        iov[0].iov_len -= k;
        done -= k;
        if (iov[0].iov_len == 0) {
          iov++;
          left--;
        }
      }
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      fp4idx_status_t st = wait_fd(c->fd, POLLOUT, deadline);
      if (st == FP4IDX_OK) continue;
      fp4idx__client_disconnect(c);
      return fp4idx__client_fail(c, st,
                                 st == FP4IDX_ETIMEDOUT
                                     ? "timed out sending the request"
                                     : "poll failed while sending");
    }
    /* Left open on purpose: the daemon may have answered (E2BIG, say)
     * before closing; the caller reads that reply, then disconnects. */
    int e = w < 0 ? errno : EPIPE;
    return fp4idx__client_fail(c, FP4IDX_ECONN,
                               "connection lost while sending: %s", ERRTEXT(e));
  }
}

fp4idx_status_t fp4idx__client_recv_frame(fp4idx_client_t *c, char **body,
                                          size_t *len, int64_t deadline) {
  *body = NULL;
  *len = 0;
  if (c->fd < 0)
    return fp4idx__client_fail(c, FP4IDX_ECONN, "not connected");
  unsigned char hdr[4];
  fp4idx_status_t st = read_all(c, (char *)hdr, 4, deadline, "frame header");
  if (st != FP4IDX_OK) return st;
  size_t n = fp4idx_frame_header_get(hdr);
  if (n > FP4IDX_CLIENT_MAX_RESPONSE) {
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_E2BIG,
                               "response frame of %zu bytes exceeds the "
                               "client limit %u",
                               n, FP4IDX_CLIENT_MAX_RESPONSE);
  }
  char *buf = malloc(n ? n : 1);
  if (buf == NULL) {
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_ENOMEM,
                               "no memory for a %zu-byte response", n);
  }
  st = read_all(c, buf, n, deadline, "frame body");
  if (st != FP4IDX_OK) {
    free(buf);
    return st;
  }
  *body = buf;
  *len = n;
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx__client_recv_exact(fp4idx_client_t *c, void *dst, size_t len,
                                          int64_t deadline) {
  if (c->fd < 0)
    return fp4idx__client_fail(c, FP4IDX_ECONN, "not connected");
  return read_all(c, dst, len, deadline, "response");
}

fp4idx_status_t fp4idx__client_recv_some(fp4idx_client_t *c, void *dst, size_t cap,
                                         size_t *got, int64_t deadline) {
  *got = 0;
  if (c->fd < 0)
    return fp4idx__client_fail(c, FP4IDX_ECONN, "not connected");
  return recv_chunk(c, dst, cap, got, deadline, "response", 0, cap);
}
