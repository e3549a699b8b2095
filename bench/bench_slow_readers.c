/* bench_slow_readers.c -- fp4idx-bench-slow-readers: what clients that never
 * read their replies cost the daemon and everyone else.
 *
 * For each N of -c (default 0,8,128,1000): spawns a fresh fp4idxd (CPU
 * backend), stores one sequence of -k keys (default 16384: a `read` of it is
 * a 1.1 MB reply), opens N "bad" connections that pipeline `read` requests of
 * the whole sequence as fast as their sockets take them and never read a
 * byte, lets that run -R seconds (default 3), then times -n `info` round trips
 * (after -w warm-up ones) on one more, well-behaved connection while the bad
 * ones keep writing. Reports the daemon's peak VmRSS (sampled every 50 ms
 * from the first bad connection to the last info) and the info latency
 * p50/p99/max. Every N runs -r times (default 3) with a fresh daemon; the
 * table shows the median of the runs, [min..max] after it.
 *
 *   fp4idx-bench-slow-readers [-d FP4IDXD] [-c 0,8,128,1000] [-k KEYS]
 *       [-n INFOS] [-w WARMUP] [-T SECONDS] [-R SECONDS] [-r RUNS] [-B BUDGET]
 *       [-t TIMEOUT]
 *       [--old]
 *
 * -B/-t pass --buffer-budget/--buffer-timeout (default timeout 600 s, so the
 * timeout does not close the bad connections inside a run); --old passes
 * neither (a daemon from before the budget). RLIMIT_NOFILE is raised to fit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fp4idx_codec.h"

#ifndef FP4IDXD_PATH
#define FP4IDXD_PATH "fp4idxd"
#endif

#define MAX_RUNS 9
#define MAX_COUNTS 16

typedef struct opts_s {
  const char *daemon;
  int counts[MAX_COUNTS], n_counts;
  long keys;
  int infos, warmup, runs;
  double secs, ramp_s;
  const char *budget, *timeout;
  int old;
} opts_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the daemon ------------------------------------------------------------ */

static pid_t g_pid;
static char g_dir[64], g_sock[100];

static int daemon_spawn(const opts_t *o) {
  snprintf(g_dir, sizeof g_dir, "/tmp/fp4idx-bench-slow.XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_sock, sizeof g_sock, "%s/d.sock", g_dir);
  const char *argv[24];
  int n = 0;
  argv[n++] = o->daemon;
  argv[n++] = "--socket";
  argv[n++] = g_sock;
  argv[n++] = "--backend";
  argv[n++] = "cpu";
  argv[n++] = "--cache-bytes";
  argv[n++] = "64M";
  argv[n++] = "--log-level";
  argv[n++] = "warn";
  if (!o->old) {
    if (o->budget) {
      argv[n++] = "--buffer-budget";
      argv[n++] = o->budget;
    }
    argv[n++] = "--buffer-timeout";
    argv[n++] = o->timeout ? o->timeout : "600";
  }
  argv[n] = NULL;
  pid_t parent = getpid();
  g_pid = fork();
  if (g_pid < 0) return -1;
  if (g_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* no daemon outlives the benchmark */
    if (getppid() != parent) _exit(127);
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  return 0;
}

static void daemon_stop(void) {
  if (g_pid > 0) {
    int st;
    kill(g_pid, SIGKILL); /* the bad connections would hold up a graceful stop */
    waitpid(g_pid, &st, 0);
    g_pid = 0;
  }
  unlink(g_sock);
  rmdir(g_dir);
}

static long vm_rss_kib(pid_t pid) {
  char path[64], line[256];
  long kib = -1;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  fclose(f);
  return kib;
}

/* ---- raw connections ------------------------------------------------------- */

/* A blocking connect (it waits while the daemon's backlog is full), then
 * non-blocking I/O when asked. */
static int sock_connect(int nonblock) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g_sock);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  if (nonblock) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

static int send_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static int recv_all(int fd, void *p, size_t n) {
  char *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

/* One request/response on a blocking fd; returns the response status. */
static int call(int fd, const fp4idx_request_t *req) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  int rc = fp4idx_encode_request(&sb, req);
  if (!rc) rc = send_all(fd, sb.data, sb.size) ? FP4IDX_EIO : 0;
  msgpack_sbuffer_destroy(&sb);
  if (rc) return rc;
  unsigned char hdr[4];
  if (recv_all(fd, hdr, 4)) return FP4IDX_EIO;
  size_t len = fp4idx_frame_header_get(hdr);
  unsigned char *body = malloc(len ? len : 1);
  if (!body || recv_all(fd, body, len)) {
    free(body);
    return FP4IDX_EIO;
  }
  fp4idx_response_t resp;
  char msg[256];
  rc = fp4idx_decode_response(body, len, req->op, &resp, msg, sizeof msg);
  if (!rc) rc = resp.status;
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

/* ---- the bad connections: pipeline reads, never read ------------------------ */

typedef struct pump_s {
  int *fds;
  size_t *off;     /* position in the repeated request stream */
  int n;
  const unsigned char *stream;  /* one request frame repeated */
  size_t frame_len, stream_len;
  volatile int stop;
} pump_t;

static void *pump_main(void *arg) {
  pump_t *p = arg;
  struct pollfd *pfd = calloc((size_t)p->n, sizeof *pfd);
  for (int i = 0; i < p->n; i++) pfd[i] = (struct pollfd){.fd = p->fds[i], .events = POLLOUT};
  while (!p->stop) {
    int r = poll(pfd, (nfds_t)p->n, 50);
    if (r <= 0) continue;
    for (int i = 0; i < p->n; i++) {
      if (!(pfd[i].revents & POLLOUT)) continue;
      if (pfd[i].revents & (POLLERR | POLLHUP)) {
        pfd[i].fd = -1; /* closed by the daemon */
        continue;
      }
      size_t at = p->off[i] % p->frame_len;
      ssize_t w = write(p->fds[i], p->stream + at, p->stream_len - at);
      if (w > 0) p->off[i] += (size_t)w;
      else if (w < 0 && errno != EAGAIN && errno != EINTR) pfd[i].fd = -1;
    }
  }
  free(pfd);
  return NULL;
}

/* ---- one run ----------------------------------------------------------------- */

typedef struct result_s {
  double rss_mib, calls, p50_us, p99_us, max_us;
} result_t;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int run_once(const opts_t *o, int n_bad, result_t *res) {
  if (daemon_spawn(o)) return -1;
  int good = -1;
  for (int i = 0; i < 1000 && good < 0; i++) {
    good = sock_connect(0);
    if (good < 0) usleep(10000);
  }
  if (good < 0) {
    daemon_stop();
    return -1;
  }
  /* The sequence the bad connections read. */
  long k = o->keys;
  unsigned char *keys = malloc((size_t)k * 68);
  for (long i = 0; i < k * 68; i++) keys[i] = (unsigned char)(i * 7 + 1);
  for (long i = 0; i < k; i++) memset(keys + i * 68 + 64, 127, 4);
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.id = 1;
  req.op = FP4IDX_OP_APPEND;
  req.u.append.seq = 1;
  uint64_t shape[2] = {(uint64_t)k, 68};
  fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_U8, 2, shape, keys);
  int rc = call(good, &req);
  free(keys);
  if (rc) {
    fprintf(stderr, "append: %s\n", fp4idx_strerror(rc));
    close(good);
    daemon_stop();
    return -1;
  }

  /* Warm-up infos before any bad connection. */
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_INFO;
  for (int i = 0; i < o->warmup; i++) {
    req.id = 10 + (uint64_t)i;
    if (call(good, &req) != 0) {
      close(good);
      daemon_stop();
      return -1;
    }
  }

  /* The read request, repeated, as the bad connections' byte stream. */
  memset(&req, 0, sizeof req);
  req.id = 2;
  req.op = FP4IDX_OP_READ;
  req.u.read.seq = 1;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  fp4idx_encode_request(&sb, &req);
  pump_t p = {.n = n_bad, .frame_len = sb.size};
  size_t reps = 65536 / sb.size + 1;
  unsigned char *stream = malloc(reps * sb.size);
  for (size_t i = 0; i < reps; i++) memcpy(stream + i * sb.size, sb.data, sb.size);
  p.stream = stream;
  p.stream_len = reps * sb.size;
  msgpack_sbuffer_destroy(&sb);
  p.fds = calloc((size_t)(n_bad ? n_bad : 1), sizeof *p.fds);
  p.off = calloc((size_t)(n_bad ? n_bad : 1), sizeof *p.off);
  for (int i = 0; i < n_bad; i++) {
    p.fds[i] = sock_connect(1);
    if (p.fds[i] < 0) {
      fprintf(stderr, "bad connection %d: %s\n", i, strerror(errno));
      p.n = i;
      break;
    }
  }
  pthread_t th;
  pthread_create(&th, NULL, pump_main, &p);

  long peak = vm_rss_kib(g_pid);
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_INFO;
  size_t cap = 1 << 16, n_lat = 0;
  double *lat = malloc(cap * sizeof *lat);
  double last_sample = now_s(), t_stop = now_s() + o->secs;
  int ok = 1;
  for (int i = 0; ok && (i < o->infos || now_s() < t_stop); i++) {
    req.id = 100000 + (uint64_t)i;
    double t0 = now_s();
    if (call(good, &req) != 0) ok = 0;
    double dt = now_s() - t0;
    if (n_lat == cap) lat = realloc(lat, (cap *= 2) * sizeof *lat);
    lat[n_lat++] = dt * 1e6;
    if (now_s() - last_sample > 0.05) {
      long r = vm_rss_kib(g_pid);
      if (r > peak) peak = r;
      last_sample = now_s();
    }
  }
  double t_end = now_s() + o->ramp_s;
  while (now_s() < t_end) {
    long r = vm_rss_kib(g_pid);
    if (r > peak) peak = r;
    usleep(50000);
  }
  long r = vm_rss_kib(g_pid);
  if (r > peak) peak = r;
  p.stop = 1;
  pthread_join(th, NULL);
  for (int i = 0; i < p.n; i++) close(p.fds[i]);
  free(p.fds);
  free(p.off);
  free(stream);
  close(good);
  daemon_stop();
  if (!ok) {
    fprintf(stderr, "info failed with %d bad connections\n", n_bad);
    free(lat);
    return -1;
  }
  qsort(lat, n_lat, sizeof *lat, cmp_double);
  res->rss_mib = (double)peak / 1024.0;
  res->calls = (double)n_lat;
  res->p50_us = lat[n_lat / 2];
  res->p99_us = lat[(size_t)((double)n_lat * 0.99)];
  res->max_us = lat[n_lat - 1];
  free(lat);
  return 0;
}

static void med3(double *v, int n, double *med, double *lo, double *hi) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  *med = v[n / 2];
  *lo = v[0];
  *hi = v[n - 1];
}

static void usage(void) {
  fprintf(stderr,
          "usage: fp4idx-bench-slow-readers [-d FP4IDXD] [-c 0,8,128,1000] [-k KEYS]\n"
          "       [-n INFOS] [-w WARMUP] [-T INFO_S] [-R AFTER_S] [-r RUNS] [-B BUDGET]\n"
          "       [-t TIMEOUT] [--old]\n");
}

int main(int argc, char **argv) {
  opts_t o = {.daemon = FP4IDXD_PATH, .keys = 16384, .infos = 2000, .warmup = 200,
              .runs = 3, .secs = 5.0, .ramp_s = 3.0};
  int defaults[] = {0, 8, 128, 1000};
  memcpy(o.counts, defaults, sizeof defaults);
  o.n_counts = 4;
  static const struct option lo[] = {{"old", no_argument, NULL, 'O'},
                                     {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "d:c:k:n:w:R:T:r:B:t:h", lo, NULL)) != -1;) {
    switch (c) {
      case 'd': o.daemon = optarg; break;
      case 'c': {
        o.n_counts = 0;
        for (char *s = strtok(optarg, ","); s && o.n_counts < MAX_COUNTS; s = strtok(NULL, ","))
          o.counts[o.n_counts++] = atoi(s);
        break;
      }
      case 'k': o.keys = atol(optarg); break;
      case 'n': o.infos = atoi(optarg); break;
      case 'w': o.warmup = atoi(optarg); break;
      case 'R': o.ramp_s = atof(optarg); break;
      case 'T': o.secs = atof(optarg); break;
      case 'r': o.runs = atoi(optarg); break;
      case 'B': o.budget = optarg; break;
      case 't': o.timeout = optarg; break;
      case 'O': o.old = 1; break;
      default: usage(); return c == 'h' ? 0 : 2;
    }
  }
  if (o.runs < 1 || o.runs > MAX_RUNS || o.infos < 10 || o.keys < 1) {
    usage();
    return 2;
  }
  int most = 0;
  for (int i = 0; i < o.n_counts; i++)
    if (o.counts[i] > most) most = o.counts[i];
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < (rlim_t)most + 64) {
    rl.rlim_cur = rl.rlim_max < (rlim_t)most + 64 ? rl.rlim_max : (rlim_t)most + 64;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  signal(SIGPIPE, SIG_IGN);
  printf("fp4idx-bench-slow-readers: %s, %ld keys per read reply (%.2f MB), info calls for "
         "%.1f s (at least %d), then %.1f s more, median of %d runs\n",
         o.daemon, o.keys, (double)o.keys * 68 / 1e6, o.secs, o.infos, o.ramp_s, o.runs);
  printf("%-6s %-22s %-22s %-20s %-24s %-24s\n", "bad", "peak VmRSS MiB", "info calls",
         "info p50 us", "info p99 us", "info max us");
  for (int ci = 0; ci < o.n_counts; ci++) {
    double rss[MAX_RUNS], calls[MAX_RUNS], p50[MAX_RUNS], p99[MAX_RUNS], mx[MAX_RUNS];
    int n = 0;
    for (int r = 0; r < o.runs; r++) {
      result_t res;
      if (run_once(&o, o.counts[ci], &res) == 0) {
        rss[n] = res.rss_mib, calls[n] = res.calls, p50[n] = res.p50_us, p99[n] = res.p99_us;
        mx[n] = res.max_us;
        n++;
      }
    }
    if (!n) {
      printf("%-6d failed\n", o.counts[ci]);
      continue;
    }
    double m, a, b;
    char cell[5][64];
    double *cols[5] = {rss, calls, p50, p99, mx};
    for (int k = 0; k < 5; k++) {
      med3(cols[k], n, &m, &a, &b);
      snprintf(cell[k], sizeof cell[k], "%.0f [%.0f..%.0f]", m, a, b);
    }
    printf("%-6d %-22s %-22s %-20s %-24s %-24s\n", o.counts[ci], cell[0], cell[1], cell[2],
           cell[3], cell[4]);
    fflush(stdout);
  }
  return 0;
}
