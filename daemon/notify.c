/* notify.c -- sd_notify and LISTEN_FDS, through libsystemd when available,
 * else a built-in implementation of the same protocols (see
 * sd_notify(3) and sd_listen_fds(3)). */
#define _GNU_SOURCE
#include "notify.h"
#include "fp4idx_fail.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fp4idx_status.h"

#ifdef FP4IDX_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#define LISTEN_FDS_START 3

/* ---- sending -------------------------------------------------------------- */

#ifndef FP4IDX_HAVE_SYSTEMD
static int builtin_notify(const char *state) {
  const char *e = getenv("NOTIFY_SOCKET");
  if (!e || !*e) return 0;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t n = strlen(e);
  if ((e[0] != '/' && e[0] != '@') || n >= sizeof sa.sun_path) return FP4IDX_EIO;
  memcpy(sa.sun_path, e, n);
  if (e[0] == '@') sa.sun_path[0] = 0; /* abstract namespace */
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
                              (e[0] == '/' ? 1 : 0));
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return FP4IDX_EIO;
  ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL,
                     (struct sockaddr *)&sa, len);
  close(fd);
  return w < 0 ? FP4IDX_EIO : 1;
}
#endif

int fp4idx_notify_raw(const char *state) {
  if (!state) return FP4IDX_EINVAL;
#ifdef FP4IDX_HAVE_SYSTEMD
  int r = sd_notify(0, state);
  return r < 0 ? FP4IDX_EIO : r;
#else
  return builtin_notify(state);
#endif
}

/* Joins a VAR=1 line and an optional STATUS line (newlines flattened). */
static int send_with_status(const char *first, const char *status) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "%s%s%s", first, status ? "\nSTATUS=" : "",
                   status ? status : "");
  if (n < 0) return FP4IDX_EINVAL;
  for (char *p = buf + strlen(first) + 1; status && *p; p++)
    if (*p == '\n') *p = ' ';
  return fp4idx_notify_raw(buf);
}

int fp4idx_notify_ready(const char *status) {
  return send_with_status("READY=1", status);
}

int fp4idx_notify_stopping(const char *status) {
  return send_with_status("STOPPING=1", status);
}

int fp4idx_notify_status(const char *fmt, ...) {
  char line[512];
  if (!fmt) return FP4IDX_EINVAL;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  for (char *p = line; *p; p++)
    if (*p == '\n') *p = ' ';
  char buf[600];
  snprintf(buf, sizeof buf, "STATUS=%s", line);
  return fp4idx_notify_raw(buf);
}

int fp4idx_notify_watchdog(void) { return fp4idx_notify_raw("WATCHDOG=1"); }

uint64_t fp4idx_notify_watchdog_usec(void) {
#ifdef FP4IDX_HAVE_SYSTEMD
  uint64_t usec = 0;
  return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
#else
  const char *u = getenv("WATCHDOG_USEC"), *p = getenv("WATCHDOG_PID");
  if (!u || !*u) return 0;
  if (p && *p && strtoll(p, NULL, 10) != (long long)getpid()) return 0;
  char *end;
  unsigned long long v = strtoull(u, &end, 10);
  return *end ? 0 : (uint64_t)v;
#endif
}

/* ---- socket activation ------------------------------------------------------ */

int fp4idx_notify_listen_fd(int *fd, char *err, size_t errlen) {
  if (!fd) return FP4IDX_EINVAL;
  int n;
#ifdef FP4IDX_HAVE_SYSTEMD
  n = sd_listen_fds(1); /* 1: unset LISTEN_* so children don't see them */
  if (n < 0) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "LISTEN_FDS: %s", strerror(-n));
  }
#else
  const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
  n = 0;
  if (pid && fds && strtoll(pid, NULL, 10) == (long long)getpid())
    n = (int)strtol(fds, NULL, 10);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  if (n < 0) n = 0;
#endif
  if (n == 0) return 0;
  if (n != 1) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "socket activation passed %d file descriptors; fp4idxd takes exactly "
                        "one listening Unix stream socket",
                        n);
  }
  int f = LISTEN_FDS_START;
  int type = 0, listening = 0, ok;
  socklen_t l = sizeof type;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  ok = getsockopt(f, SOL_SOCKET, SO_TYPE, &type, &l) == 0 && type == SOCK_STREAM;
  l = sizeof listening;
  ok = ok && getsockopt(f, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l) == 0 &&
       listening;
  ok = ok && getsockname(f, (struct sockaddr *)&ss, &sl) == 0 &&
       ss.ss_family == AF_UNIX;
  if (!ok) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "socket activation: fd 3 is not a listening Unix stream socket "
                        "(use ListenStream=/path in the .socket unit)");
  }
  fcntl(f, F_SETFD, FD_CLOEXEC);
  *fd = f;
  return 1;
}
