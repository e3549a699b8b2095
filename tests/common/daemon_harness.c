/* daemon_harness.c -- spawn fp4idxd on a temporary socket and call it
 * through the codec (see daemon_harness.h). */
#define _GNU_SOURCE
#include "daemon_harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef FP4IDXD_PATH
#define FP4IDXD_PATH "fp4idxd"
#endif

static const char *fp4idx__harness_binary(void) {
  const char *e = getenv("FP4IDXD");
  return (e && *e) ? e : FP4IDXD_PATH;
}

static void fp4idx__harness_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Makes the temporary folder and the paths in it (once). */
int fp4idx_test_daemon_prepare(fp4idx_test_daemon_t *d) {
  if (d->dir[0]) return 0;
  snprintf(d->dir, sizeof d->dir, "/tmp/fp4idxd-test-XXXXXX");
  if (!mkdtemp(d->dir)) return -1;
  snprintf(d->sock, sizeof d->sock, "%s/d.sock", d->dir);
  snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
  return 0;
}

int fp4idx_test_daemon_spawn(fp4idx_test_daemon_t *d, const char *sock,
                             const char *const *args) {
  if (fp4idx_test_daemon_prepare(d)) return -1;
  d->pid = 0;
  d->collected = 0;
  const char *argv[64];
  int n = 0;
  argv[n++] = fp4idx__harness_binary();
  if (sock) {
    argv[n++] = "--socket";
    argv[n++] = sock;
  }
  for (int i = 0; args && args[i] && n < 62; i++) argv[n++] = args[i];
  argv[n] = NULL;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    /* The daemon must not outlive a crashed or failed test. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
      close(fd);
    }
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  d->pid = pid;
  return 0;
}

int fp4idx_test_daemon_start(fp4idx_test_daemon_t *d, const char *const *extra) {
  const char *args[48];
  int n = 0;
  args[n++] = "--backend";
  args[n++] = "cpu";
  args[n++] = "--log-level";
  args[n++] = "debug";
  args[n++] = "--cache-bytes"; /* small by default; extra may override */
  args[n++] = "8M";
  for (int i = 0; extra && extra[i] && n < 46; i++) args[n++] = extra[i];
  args[n] = NULL;
  return fp4idx_test_daemon_start_args(d, args);
}

int fp4idx_test_daemon_start_args(fp4idx_test_daemon_t *d, const char *const *args) {
  memset(d, 0, sizeof *d);
  if (fp4idx_test_daemon_prepare(d) || fp4idx_test_daemon_spawn(d, d->sock, args)) return -1;
  for (int waited = 0; waited < 10000; waited += 10) {
    int fd = fp4idx_test_connect(d->sock);
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    if (!fp4idx_test_daemon_alive(d)) break;
    fp4idx__harness_sleep_ms(10);
  }
  fp4idx_test_daemon_dump_log(d);
  fp4idx_test_daemon_stop(d);
  return -1;
}

int fp4idx_test_daemon_start_cuda(fp4idx_test_daemon_t *d, const char *cache_bytes,
                                  int *exit_code) {
  const char *args[] = {"--backend", "cuda", "--cache-bytes", cache_bytes, "--log-level",
                        "debug", NULL};
  memset(d, 0, sizeof *d);
  if (fp4idx_test_daemon_prepare(d) || fp4idx_test_daemon_spawn(d, d->sock, args)) return -1;
  for (int waited = 0; waited < 30000 && fp4idx_test_daemon_alive(d); waited += 10) {
    int fd = fp4idx_test_connect(d->sock);
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    fp4idx__harness_sleep_ms(10);
  }
  int code = fp4idx_test_daemon_stop(d);
  if (exit_code) *exit_code = code;
  return 1;
}

int fp4idx_test_daemon_kill(fp4idx_test_daemon_t *d, int sig) {
  if (d->pid <= 0 || d->collected) return -1;
  return kill(d->pid, sig);
}

static int fp4idx__harness_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int fp4idx_test_daemon_wait(fp4idx_test_daemon_t *d, int timeout_ms) {
  if (d->pid <= 0) return -1;
  if (d->collected) return fp4idx__harness_code(d->status);
  for (int waited = 0;; waited += 5) {
    int st;
    pid_t r = waitpid(d->pid, &st, WNOHANG);
    if (r == d->pid) {
      d->status = st;
      d->collected = 1;
      return fp4idx__harness_code(st);
    }
    if (r < 0 || waited >= timeout_ms) return -1;
    fp4idx__harness_sleep_ms(5);
  }
}

int fp4idx_test_daemon_alive(fp4idx_test_daemon_t *d) {
  if (d->pid <= 0 || d->collected) return 0;
  int st;
  pid_t r = waitpid(d->pid, &st, WNOHANG);
  if (r == d->pid) {
    d->status = st;
    d->collected = 1;
    return 0;
  }
  return 1;
}

static void fp4idx__harness_rmdir(fp4idx_test_daemon_t *d) {
  if (!d->dir[0]) return;
  unlink(d->sock);
  unlink(d->log);
  rmdir(d->dir);
}

/* The first line of /proc/<pid>/task/<tid>/<what> into buf (newline
 * dropped), or "?". */
static void fp4idx__harness_proc_line(pid_t pid, const char *tid, const char *what, char *buf,
                                      size_t cap) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/task/%.24s/%s", (int)pid, tid, what);
  FILE *f = fopen(path, "r");
  if (!f || !fgets(buf, (int)cap, f)) snprintf(buf, cap, "?");
  if (f) fclose(f);
  buf[strcspn(buf, "\n")] = 0;
}

/* A daemon that does not stop: what each of its threads is doing (name,
 * state and kernel wait channel from /proc, then every thread's stack
 * from gdb where gdb is installed), on stderr, so that a hang seen once
 * in CI says where it was. */
static void fp4idx__harness_report_stuck(const fp4idx_test_daemon_t *d) {
  fprintf(stderr, "---- fp4idxd (pid %d) did not stop within 5 s of SIGTERM; its threads ----\n",
          (int)d->pid);
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)d->pid);
  DIR *dir = opendir(path);
  for (struct dirent *e; dir && (e = readdir(dir));) {
    if (e->d_name[0] == '.') continue;
    char comm[64], stat[256], wchan[64];
    fp4idx__harness_proc_line(d->pid, e->d_name, "comm", comm, sizeof comm);
    fp4idx__harness_proc_line(d->pid, e->d_name, "stat", stat, sizeof stat);
    fp4idx__harness_proc_line(d->pid, e->d_name, "wchan", wchan, sizeof wchan);
    const char *st = strrchr(stat, ')'); /* state follows "(comm) " */
    fprintf(stderr, "thread %s %-16s state %c wchan %s\n", e->d_name, comm,
            st && st[1] && st[2] ? st[2] : '?', wchan);
  }
  if (dir) closedir(dir);
  if (system("command -v gdb > /dev/null 2>&1") == 0) {
    char cmd[160];
    snprintf(cmd, sizeof cmd,
             "timeout 30 gdb -p %d -batch -nx -ex 'thread apply all bt 24' 2>&1 | "
             "grep -E '^(Thread|#)' >&2",
             (int)d->pid);
    if (system(cmd) != 0) fprintf(stderr, "(gdb gave no stacks)\n");
  }
  fprintf(stderr, "---- end of threads ----\n");
}

int fp4idx_test_daemon_stop(fp4idx_test_daemon_t *d) {
  int code = -1;
  if (d->pid > 0) {
    if (!d->collected) kill(d->pid, SIGTERM);
    code = fp4idx_test_daemon_wait(d, 5000);
    if (code < 0) {
      fp4idx__harness_report_stuck(d);
      kill(d->pid, SIGKILL);
      code = fp4idx_test_daemon_wait(d, 5000);
    }
  }
  if (code != 0) fp4idx_test_daemon_dump_log(d);
  fp4idx__harness_rmdir(d);
  return code;
}

void fp4idx_test_small_asan_quarantine(void) {
  const char *o = getenv("ASAN_OPTIONS");
  char buf[512];
  snprintf(buf, sizeof buf, "%s%squarantine_size_mb=4", o ? o : "", o && *o ? ":" : "");
  setenv("ASAN_OPTIONS", buf, 1);
}

int fp4idx_test_daemon_under_tsan(void) {
  const char *s = getenv("FP4IDX_TEST_DAEMON_SANITIZER");
  return s && !strcmp(s, "thread");
}

long fp4idx_test_proc_kib(pid_t pid, const char *field) {
  char path[64], line[256];
  long kib = -1;
  size_t len = strlen(field);
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, len) && line[len] == ':' && sscanf(line + len + 1, "%ld", &kib) == 1)
      break;
  fclose(f);
  return kib;
}

void fp4idx_test_daemon_dump_log(const fp4idx_test_daemon_t *d) {
  FILE *f = fopen(d->log, "r");
  if (!f) return;
  char line[1024];
  fprintf(stderr, "---- %s ----\n", d->log);
  while (fgets(line, sizeof line, f)) fputs(line, stderr);
  fprintf(stderr, "---- end of log ----\n");
  fclose(f);
}

/* ---- raw socket I/O ------------------------------------------------------ */

int fp4idx_test_connect(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

int fp4idx_test_send_all(int fd, const void *buf, size_t len) {
  const unsigned char *p = buf;
  while (len) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static int fp4idx__harness_recv_all(int fd, void *buf, size_t len) {
  unsigned char *p = buf;
  while (len) {
    ssize_t r = recv(fd, p, len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

int fp4idx_test_recv_frame(int fd, unsigned char **body, size_t *len) {
  unsigned char hdr[4];
  *body = NULL;
  *len = 0;
  if (fp4idx__harness_recv_all(fd, hdr, 4)) return -1;
  size_t n = fp4idx_frame_header_get(hdr);
  unsigned char *b = malloc(n ? n : 1);
  if (!b) return -1;
  if (fp4idx__harness_recv_all(fd, b, n)) {
    free(b);
    return -1;
  }
  *body = b;
  *len = n;
  return 0;
}

int fp4idx_test_peer_closed(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int r = poll(&p, 1, timeout_ms);
  if (r == 0) return 0;
  if (r < 0) return -1;
  char c;
  ssize_t k = recv(fd, &c, 1, MSG_DONTWAIT);
  if (k == 0) return 1;
  if (k < 0 && (errno == ECONNRESET || errno == EPIPE)) return 1;
  return -1;
}

/* ---- calls through the codec --------------------------------------------- */

int fp4idx_test_send_request(int fd, const fp4idx_request_t *req) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  int rc = fp4idx_encode_request(&sb, req);
  if (rc == 0 && fp4idx_test_send_all(fd, sb.data, sb.size)) rc = FP4IDX_ECONN;
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

int fp4idx_test_recv_response(int fd, fp4idx_op_t op, fp4idx_response_t *resp,
                              unsigned char **body) {
  size_t len;
  char msg[256];
  memset(resp, 0, sizeof *resp);
  if (fp4idx_test_recv_frame(fd, body, &len)) return FP4IDX_ECONN;
  int rc = fp4idx_decode_response(*body, len, op, resp, msg, sizeof msg);
  if (rc) fprintf(stderr, "harness: bad response: %s\n", msg);
  return rc;
}

int fp4idx_test_call(int fd, const fp4idx_request_t *req, fp4idx_response_t *resp,
                     unsigned char **body) {
  *body = NULL;
  memset(resp, 0, sizeof *resp); /* a failed send leaves nothing to clear */
  int rc = fp4idx_test_send_request(fd, req);
  if (rc) return rc;
  return fp4idx_test_recv_response(fd, req->op, resp, body);
}

/* Runs req, keeps nothing but the status. */
static int fp4idx__harness_simple(int fd, fp4idx_request_t *req, fp4idx_response_t *resp,
                                  unsigned char **body) {
  static uint64_t next_id = 1000;
  if (!req->id) req->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
  int rc = fp4idx_test_call(fd, req, resp, body);
  if (rc) return rc;
  if (resp->id != req->id) return FP4IDX_EPROTO;
  return resp->status;
}

int fp4idx_test_append(int fd, uint64_t seq, fp4idx_wire_dtype_t dtype, uint64_t n,
                       const void *keys, uint64_t *first, uint64_t *length) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_APPEND;
  req.u.append.seq = seq;
  uint64_t shape[2] = {n, dtype == FP4IDX_WIRE_U8 ? 68u : 128u};
  int rc = fp4idx_tensor_init(&req.u.append.keys, dtype, 2, shape, keys);
  if (rc) return rc;
  rc = fp4idx__harness_simple(fd, &req, &resp, &body);
  if (rc == 0) {
    if (first) *first = resp.u.append.first;
    if (length) *length = resp.u.append.length;
  }
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

int fp4idx_test_info(int fd, fp4idx_info_t *info) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_INFO;
  int rc = fp4idx__harness_simple(fd, &req, &resp, &body);
  if (rc == 0) *info = resp.u.info;
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

/* One stats call: its response (fp4idx_response_clear and free(*body)
 * after, whatever it returns). */
static int fp4idx__harness_stats(int fd, fp4idx_response_t *resp, unsigned char **body) {
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_STATS;
  return fp4idx__harness_simple(fd, &req, resp, body);
}

int fp4idx_test_buffered(int fd, uint64_t *held, uint64_t *peak, uint64_t *budget) {
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  int rc = fp4idx__harness_stats(fd, &resp, &body);
  if (rc == 0) {
    *held = resp.u.stats.buffered_bytes;
    *peak = resp.u.stats.buffered_bytes_peak;
    *budget = resp.u.stats.buffer_budget;
  }
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

int fp4idx_test_connections(int fd, uint64_t *n) {
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  int rc = fp4idx__harness_stats(fd, &resp, &body);
  if (rc == 0) *n = resp.u.stats.connections;
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

/* Polls ioctl `what` on fd every 200 us until `ok(value)`, at most ms. */
static int fp4idx__harness_wait_ioctl(int fd, unsigned long what, int (*ok)(int, size_t),
                                      size_t arg, int ms) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int v = 0;
    if (ioctl(fd, what, &v) == 0 && ok(v, arg)) return 0;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > ms) return -1;
    usleep(200);
  }
}

static int fp4idx__harness_is_zero(int v, size_t arg) { return (void)arg, v == 0; }
static int fp4idx__harness_at_least(int v, size_t arg) { return v >= 0 && (size_t)v >= arg; }

int fp4idx_test_wait_sent(int fd, int ms) {
  return fp4idx__harness_wait_ioctl(fd, SIOCOUTQ, fp4idx__harness_is_zero, 0, ms);
}

int fp4idx_test_wait_unread(int fd, size_t bytes, int ms) {
  return fp4idx__harness_wait_ioctl(fd, FIONREAD, fp4idx__harness_at_least, bytes, ms);
}

int fp4idx_test_truncate(int fd, uint64_t seq, uint64_t length) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_TRUNCATE;
  req.u.truncate.seq = seq;
  req.u.truncate.length = length;
  int rc = fp4idx__harness_simple(fd, &req, &resp, &body);
  if (rc == 0 && resp.u.truncate.length != length) rc = FP4IDX_EPROTO;
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

int fp4idx_test_drop(int fd, uint64_t seq) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_DROP;
  req.u.drop.seq = seq;
  int rc = fp4idx__harness_simple(fd, &req, &resp, &body);
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

int fp4idx_test_read(int fd, uint64_t seq, uint64_t from, uint64_t count, void *out,
                     uint64_t *got) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_READ;
  req.u.read.seq = seq;
  req.u.read.from = from;
  req.u.read.count = count;
  req.u.read.has_count = true;
  int rc = fp4idx__harness_simple(fd, &req, &resp, &body);
  if (rc == 0) {
    const fp4idx_tensor_t *k = &resp.u.read.keys;
    if (k->dtype != FP4IDX_WIRE_U8 || k->shape[0] != count || k->shape[1] != 68)
      rc = FP4IDX_ESHAPE;
    else if (out && k->nbytes)
      memcpy(out, k->data, k->nbytes);
    if (got) *got = k->shape[0];
  }
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

int fp4idx_test_score_request(fp4idx_request_t *req, fp4idx_score_seq_t *s, uint64_t id,
                              uint64_t seq, uint32_t heads, uint32_t topk, uint32_t rows,
                              const uint16_t *q, const uint16_t *w, const int32_t *lens) {
  memset(req, 0, sizeof *req);
  memset(s, 0, sizeof *s);
  req->id = id;
  req->op = FP4IDX_OP_SCORE;
  req->u.score.heads = heads;
  req->u.score.topk = topk;
  req->u.score.seqs = s;
  req->u.score.nseqs = 1;
  s->seq = seq;
  s->rows = rows;
  uint64_t qs[3] = {rows, heads, 128}, ws[2] = {rows, heads}, ls[1] = {rows};
  int rc = fp4idx_tensor_init(&s->q, FP4IDX_WIRE_BF16, 3, qs, q);
  if (!rc) rc = fp4idx_tensor_init(&s->w, FP4IDX_WIRE_BF16, 2, ws, w);
  if (!rc && lens) rc = fp4idx_tensor_init(&s->lens, FP4IDX_WIRE_I32, 1, ls, lens);
  return rc;
}

int fp4idx_test_score(int fd, uint64_t seq, uint32_t heads, uint32_t rows,
                      const uint16_t *q, const uint16_t *w, const int32_t *lens,
                      float **logits, uint64_t *width) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  fp4idx_score_seq_t s;
  unsigned char *body = NULL;
  *logits = NULL;
  int rc = fp4idx_test_score_request(&req, &s, 0, seq, heads, 0, rows, q, w, lens);
  if (rc) return rc;
  rc = fp4idx__harness_simple(fd, &req, &resp, &body);
  if (rc == 0) {
    const fp4idx_tensor_t *t;
    if (resp.u.score.nresults != 1 || resp.u.score.results[0].seq != seq ||
        (t = &resp.u.score.results[0].logits)->dtype != FP4IDX_WIRE_F32 ||
        t->shape[0] != rows) {
      rc = FP4IDX_ESHAPE;
    } else {
      *width = t->shape[1];
      *logits = malloc(t->nbytes ? t->nbytes : 1);
      if (!*logits) rc = FP4IDX_ENOMEM;
      else if (t->nbytes) memcpy(*logits, t->data, t->nbytes);
    }
  }
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}
