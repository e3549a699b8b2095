/* test_notify.c -- sd_notify messages read from a NOTIFY_SOCKET the test
 * owns (path and abstract), the watchdog interval, and LISTEN_FDS handling
 * (run in a forked child, since it takes over fd 3). */
#include "persist_util.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "fp4idx_status.h"
#include "notify.h"

/* Binds a datagram socket at name ('@' = abstract) and exports NOTIFY_SOCKET. */
static int notify_listen(const char *name) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(name);
  memcpy(sa.sun_path, name, n);
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  if (name[0] == '@') sa.sun_path[0] = 0;
  else len++;
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, len), 0, "bind %s", name);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  cr_assert_eq(setenv("NOTIFY_SOCKET", name, 1), 0);
  return fd;
}

static void expect_msg(int fd, const char *want) {
  char buf[1024];
  ssize_t r = recv(fd, buf, sizeof buf - 1, 0);
  cr_assert_gt(r, 0, "no notification arrived");
  buf[r] = 0;
  cr_assert_str_eq(buf, want);
}

Test(notify, messages_on_a_path_socket) {
  char dir[64], sock[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(sock, sizeof sock, "%s/notify", dir);
  int fd = notify_listen(sock);
  cr_assert_eq(fp4idx_notify_ready("serving on /x.sock"), 1);
  expect_msg(fd, "READY=1\nSTATUS=serving on /x.sock");
  cr_assert_eq(fp4idx_notify_status("%d sequences\n%d keys", 3, 42), 1);
  expect_msg(fd, "STATUS=3 sequences 42 keys");
  cr_assert_eq(fp4idx_notify_watchdog(), 1);
  expect_msg(fd, "WATCHDOG=1");
  cr_assert_eq(fp4idx_notify_stopping(NULL), 1);
  expect_msg(fd, "STOPPING=1");
  close(fd);
  tmpdir_rm(dir);
}

Test(notify, messages_on_an_abstract_socket) {
  char name[64];
  snprintf(name, sizeof name, "@fp4idx-test-%d-%ld", (int)getpid(), (long)time(NULL));
  int fd = notify_listen(name);
  cr_assert_eq(fp4idx_notify_ready(NULL), 1);
  expect_msg(fd, "READY=1");
  close(fd);
}

Test(notify, without_notify_socket_is_a_no_op) {
  unsetenv("NOTIFY_SOCKET");
  cr_assert_eq(fp4idx_notify_ready("x"), 0);
  cr_assert_eq(fp4idx_notify_stopping("x"), 0);
  cr_assert_eq(fp4idx_notify_watchdog(), 0);
}

Test(notify, watchdog_interval) {
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  cr_assert_eq(fp4idx_notify_watchdog_usec(), 0);
  setenv("WATCHDOG_USEC", "30000000", 1);
  setenv("WATCHDOG_PID", pid, 1);
  cr_assert_eq(fp4idx_notify_watchdog_usec(), 30000000u);
  setenv("WATCHDOG_PID", "1", 1); /* meant for another process */
  cr_assert_eq(fp4idx_notify_watchdog_usec(), 0);
}

/* In a child: puts `fd` at 3, sets LISTEN_PID/LISTEN_FDS, calls
 * fp4idx_notify_listen_fd and exits with a code the parent checks:
 * 10 + return value + 100 * (LISTEN_FDS still set). nfds 0: no LISTEN_*. */
static int child_listen(int fd, int nfds) {
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    if (fd >= 0 && fd != 3) {
      dup2(fd, 3);
      close(fd);
    }
    char p[32], n[32];
    snprintf(p, sizeof p, "%d", (int)getpid());
    snprintf(n, sizeof n, "%d", nfds);
    if (nfds > 0) {
      setenv("LISTEN_PID", p, 1);
      setenv("LISTEN_FDS", n, 1);
    } else {
      unsetenv("LISTEN_PID");
      unsetenv("LISTEN_FDS");
    }
    int got = -1;
    char err[256] = "";
    int rc = fp4idx_notify_listen_fd(&got, err, sizeof err);
    int code = 10 + rc + (getenv("LISTEN_FDS") ? 100 : 0);
    if (rc == 1 && got != 3) code = 99;
    if (rc < 0 && !err[0]) code = 98;
    _exit(code);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st));
  return WEXITSTATUS(st);
}

Test(notify, listen_fds) {
  char dir[64], path[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/s.sock", dir);
  int ls = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  strcpy(sa.sun_path, path);
  cr_assert_eq(bind(ls, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(ls, 4), 0);
  /* One listening Unix stream socket: taken, LISTEN_* cleared. */
  cr_assert_eq(child_listen(ls, 1), 10 + 1);
  /* Not socket-activated (no LISTEN_* at all). */
  int none = child_listen(-1, 0);
  cr_assert_eq(none, 10 + 0, "code %d", none);
  /* Two fds: refused with a message. */
  cr_assert_eq(child_listen(ls, 2), 10 + FP4IDX_EINVAL);
  /* A stream socket that is not listening, and a datagram socket: refused. */
  int nl = socket(AF_UNIX, SOCK_STREAM, 0);
  cr_assert_eq(child_listen(nl, 1), 10 + FP4IDX_EINVAL);
  int dg = socket(AF_UNIX, SOCK_DGRAM, 0);
  cr_assert_eq(child_listen(dg, 1), 10 + FP4IDX_EINVAL);
  close(ls);
  close(nl);
  close(dg);
  tmpdir_rm(dir);
}
