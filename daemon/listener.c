/* listener.c -- the listening side of the server: binding the socket file
 * (mode and group set explicitly, never left to the umask), adopting a
 * systemd socket, and accepting within the process's fd limit.
 *
 * Connections and fds. Like Redis (adjustOpenFilesLimit), the soft
 * RLIMIT_NOFILE is raised at start towards what FP4IDX_SERVER_MAX_CONNS
 * connections need, and the connection cap is what the limit allows, read
 * again at every accept (a limit changed at run time, e.g. by prlimit,
 * counts at once): fds in use when listening started + connections +
 * FP4IDX_LISTENER_RESERVE_FDS (snapshot and log files, the spare fd, one
 * accept) stay below the limit. A connection over the cap is accepted and
 * closed at once, so the backlog never fills with connections nobody will
 * serve, and logged at most once a second with a count.
 * If accept(2) still fails with EMFILE/ENFILE (fds taken by something else),
 * libuv's own spare fd (uv__emfile_trick) usually absorbs it; when the error
 * does reach us, our spare fd is released, the pending connections are
 * accepted and closed, and the spare is taken again, so the listener never
 * stays readable with nothing able to drain it (a busy loop). */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <dirent.h>

#include "fp4idx_status.h"
#include "log.h"
#include "mkdirs.h"
#include "stats.h"

/* ---- fd budget ---------------------------------------------------------- */

/* fds this process has open now (the entries of /proc/self/fd, less the
 * one listing it), or 0 when that cannot be read. */
static uint64_t fp4idx__listener_open_fds(void) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return 0;
  uint64_t n = 0;
  for (struct dirent *e; (e = readdir(dir));)
    if (e->d_name[0] != '.') n++;
  closedir(dir);
  return n > 0 ? n - 1 : 0;
}

/* Once, before the first listener: counts the fds in use, raises the soft
 * limit towards what the connection cap needs, opens the spare fd. */
static void fp4idx__listener_plan_fds(fp4idx_server_t *srv) {
  if (srv->fds_planned) return;
  srv->fds_planned = 1;
  srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  srv->base_fds = fp4idx__listener_open_fds();
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl)) return;
  rlim_t want = (rlim_t)(srv->base_fds + FP4IDX_SERVER_MAX_CONNS + FP4IDX_LISTENER_RESERVE_FDS);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    if (rl.rlim_cur > old && setrlimit(RLIMIT_NOFILE, &rl) == 0)
      fp4idx__log_info("fd limit raised from %llu to %llu", (unsigned long long)old,
                       (unsigned long long)rl.rlim_cur);
  }
  uint64_t cap = fp4idx__listener_conn_cap(srv);
  if (cap < FP4IDX_SERVER_MAX_CONNS)
    fp4idx__log_warn("the fd limit (RLIMIT_NOFILE %llu) allows %llu connections, not %d",
                     (unsigned long long)rl.rlim_cur, (unsigned long long)cap,
                     FP4IDX_SERVER_MAX_CONNS);
}

uint64_t fp4idx__listener_conn_cap(const fp4idx_server_t *srv) {
  struct rlimit rl;
  uint64_t cap = FP4IDX_SERVER_MAX_CONNS;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    uint64_t used = srv->base_fds + FP4IDX_LISTENER_RESERVE_FDS;
    uint64_t room = (uint64_t)rl.rlim_cur > used ? (uint64_t)rl.rlim_cur - used : 0;
    if (room < cap) cap = room;
  }
  return cap;
}

/* At most one line a second; refusals in between are counted into it. */
static void fp4idx__listener_log_refusal(fp4idx_server_t *srv, uint64_t n, const char *why) {
  double now = fp4idx__stats_now_us();
  srv->refused_unlogged += n;
  if (srv->refused_log_us && now - srv->refused_log_us < 1e6) return;
  fp4idx__log_warn("refused %llu connection(s)%s: %s",
                   (unsigned long long)srv->refused_unlogged,
                   srv->refused_log_us ? " since the last report" : "", why);
  srv->refused_log_us = now;
  srv->refused_unlogged = 0;
}

/* ---- accepting ---------------------------------------------------------- */

static void fp4idx__listener_reject_close_cb(uv_handle_t *h) {
  fp4idx_server_t *srv = h->data;
  if (h == (uv_handle_t *)&srv->reject_pipe) srv->reject_busy = 0;
  else free(h);
}

/* Accepts the pending connection through libuv and closes it. Without
 * memory for a handle the server's own spare handle takes it: libuv stops
 * watching a listener whose accepted fd nobody took. */
static void fp4idx__listener_reject(fp4idx_server_t *srv, uv_stream_t *l, const char *why) {
  uv_pipe_t *p = malloc(sizeof *p);
  if (!p && !srv->reject_busy) {
    p = &srv->reject_pipe;
    srv->reject_busy = 1;
  }
  if (!p) return; /* both out of memory and the spare still closing: libuv holds the
                   * fd and pauses this listener until the next uv_accept */
  if (uv_pipe_init(srv->loop, p, 0)) {
    if (p == &srv->reject_pipe) srv->reject_busy = 0; else free(p);
    return;
  }
  p->data = srv;
  if (uv_accept(l, (uv_stream_t *)p) == 0) fp4idx__listener_log_refusal(srv, 1, why);
  uv_close((uv_handle_t *)p, fp4idx__listener_reject_close_cb);
}

/* EMFILE/ENFILE reached us: drain the backlog with the spare fd. */
static void fp4idx__listener_emfile(fp4idx_server_t *srv, uv_stream_t *l, int status) {
  uv_os_fd_t lfd;
  uint64_t n = 0;
  if (srv->spare_fd >= 0 && uv_fileno((uv_handle_t *)l, &lfd) == 0) {
    close(srv->spare_fd);
    srv->spare_fd = -1;
    for (int fd; (fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) >= 0 || errno == EINTR;)
      if (fd >= 0) {
        close(fd);
        n++;
      }
    srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  char why[128];
  snprintf(why, sizeof why, "accept: %s (fd limit reached)", uv_strerror(status));
  fp4idx__listener_log_refusal(srv, n ? n : 1, why);
}

static void fp4idx__listener_connection_cb(uv_stream_t *l, int status) {
  fp4idx_server_t *srv = l->data;
  if (status == UV_EMFILE || status == UV_ENFILE) {
    fp4idx__listener_emfile(srv, l, status);
    return;
  }
  if (status < 0) {
    fp4idx__listener_log_refusal(srv, 1, uv_strerror(status));
    return;
  }
  if (srv->stopping) {
    fp4idx__listener_reject(srv, l, "shutting down");
    return;
  }
  uint64_t cap = fp4idx__listener_conn_cap(srv);
  uint64_t open_now = __atomic_load_n(&srv->n_conns, __ATOMIC_ACQUIRE);
  if (open_now >= cap) {
    char why[160];
    if (cap < FP4IDX_SERVER_MAX_CONNS)
      snprintf(why, sizeof why, "%llu connections open, all that the fd limit allows",
               (unsigned long long)open_now);
    else
      snprintf(why, sizeof why, "too many connections (%d)", FP4IDX_SERVER_MAX_CONNS);
    fp4idx__listener_reject(srv, l, why);
    return;
  }
  if (fp4idx__server_conn_accept(srv, l) != FP4IDX_OK) {
    fp4idx__log_error("out of memory for a connection");
    fp4idx__listener_reject(srv, l, "out of memory");
  }
}

/* ---- binding ------------------------------------------------------------ */

/* 1 when a daemon accepts connections on `path`, 0 when nothing answers
 * (stale file removed, or no file). -1 when the path holds something else. */
static int fp4idx__listener_probe(const char *path) {
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

int fp4idx__server_check_path(const char *path) {
  int probe = fp4idx__listener_probe(path);
  if (probe == 1) {
    fp4idx__log_error("another daemon is answering on %s", path);
    return FP4IDX_EEXIST;
  }
  if (probe < 0) {
    fp4idx__log_error("%s exists and is not a socket", path);
    return FP4IDX_EEXIST;
  }
  return FP4IDX_OK;
}

static int fp4idx__listener_listen(fp4idx_server_t *srv, uv_pipe_t *p) {
  p->data = srv;
  fp4idx__listener_plan_fds(srv);
  int rc = uv_listen((uv_stream_t *)p, 128, fp4idx__listener_connection_cb);
  if (rc) {
    fp4idx__log_error("listen: %s", uv_strerror(rc));
    return FP4IDX_EIO;
  }
  srv->n_listeners++;
  srv->listeners_open++;
  return FP4IDX_OK;
}

/* Binds p to path with exactly srv->socket_mode: the umask is narrowed for
 * the bind (so the file never exists with wider rights, even for an
 * instant), then the mode is set outright and the group given. */
static int fp4idx__listener_bind(fp4idx_server_t *srv, uv_pipe_t *p, const char *path) {
  mode_t old = umask(0777 & ~(mode_t)srv->socket_mode);
  int rc = uv_pipe_bind(p, path);
  umask(old);
  if (rc) {
    fp4idx__log_error("bind %s: %s", path, uv_strerror(rc));
    return FP4IDX_EIO;
  }
  if (srv->socket_gid >= 0 && chown(path, (uid_t)-1, (gid_t)srv->socket_gid)) {
    fp4idx__log_error("--socket-group: chown %s to group %ld: %s", path, srv->socket_gid,
                      strerror(errno));
    unlink(path);
    return FP4IDX_EIO;
  }
  if (chmod(path, (mode_t)srv->socket_mode)) {
    fp4idx__log_error("chmod %s %04o: %s", path, srv->socket_mode, strerror(errno));
    unlink(path);
    return FP4IDX_EIO;
  }
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
  int rc = fp4idx__server_check_path(path);
  if (rc) return rc;
  uv_pipe_t *p = &srv->listeners[srv->n_listeners];
  rc = uv_pipe_init(srv->loop, p, 0);
  if (rc) return FP4IDX_EIO;
  rc = fp4idx__listener_bind(srv, p, path);
  if (rc) {
    uv_close((uv_handle_t *)p, NULL);
    return rc;
  }
  snprintf(srv->path, sizeof srv->path, "%s", path);
  rc = fp4idx__listener_listen(srv, p);
  if (rc) {
    unlink(path);
    srv->path[0] = '\0';
    uv_close((uv_handle_t *)p, NULL);
    return rc;
  }
  fp4idx__log_info("listening on %s (mode %04o)", path, srv->socket_mode);
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
  rc = fp4idx__listener_listen(srv, p);
  if (rc) {
    uv_close((uv_handle_t *)p, NULL);
    return rc;
  }
  fp4idx__log_info("listening on inherited socket fd %d", fd);
  return FP4IDX_OK;
}
