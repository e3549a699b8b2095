/* test_service_daemon.c -- the real fp4idxd as a service: keys survive a
 * SIGTERM restart byte for byte, every acknowledged append survives kill -9
 * with --fsync always, the save op and SIGHUP, a corrupt snapshot or log
 * stops the start (a torn log tail does not), socket activation through
 * systemd-socket-activate, and READY/STOPPING/WATCHDOG read from a
 * NOTIFY_SOCKET the test owns. */
#include "persist_util.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "daemon_harness.h"
#include "fp4idx_codec.h"
#include "fp4idx_format.h"
#include "fp4idx_status.h"

static const char *daemon_path(void) {
  const char *e = getenv("FP4IDXD");
  return (e && *e) ? e : FP4IDXD_PATH;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Starts the daemon on the data dir; extra args after it (NULL-terminated,
 * at most 6). */
static void start(fp4idx_test_daemon_t *d, const char *data, const char *fsync,
                  const char *a1, const char *a2) {
  const char *args[] = {"--cache-bytes", "16M", "--data-dir", data, "--fsync", fsync,
                        a1, a2, NULL};
  memset(d, 0, sizeof *d);
  cr_assert_eq(fp4idx_test_daemon_start(d, args), 0, "daemon did not start");
}

static int connect_to(const fp4idx_test_daemon_t *d) {
  int fd = fp4idx_test_connect(d->sock);
  cr_assert_geq(fd, 0);
  return fd;
}

static void make_bf16(uint16_t *k, size_t n, uint64_t seed) {
  uint64_t s = seed | 1;
  for (size_t i = 0; i < n; i++) {
    float v = (float)((int64_t)(rng_next(&s) % 2001) - 1000) / 250.0f;
    k[i] = fp4idx_f32_to_bf16(v);
  }
}

/* The state of the test's sequences, as read back from a daemon. */
typedef struct seqs_s {
  uint64_t id[4];
  uint64_t len[4];
  unsigned char *bytes[4];
} seqs_t;

static void read_all(int fd, seqs_t *s) {
  for (int i = 0; i < 4; i++) {
    free(s->bytes[i]);
    s->bytes[i] = malloc(s->len[i] * 68 + 1);
    uint64_t got = 0;
    int rc = fp4idx_test_read(fd, s->id[i], 0, s->len[i], s->bytes[i], &got);
    cr_assert_eq(rc, 0, "read seq %llu: %d", (unsigned long long)s->id[i], rc);
    cr_assert_eq(got, s->len[i]);
  }
}

Test(service_daemon, restart_after_sigterm_keeps_every_key) {
  char data_root[64], data[128];
  tmpdir_make(data_root, sizeof data_root);
  snprintf(data, sizeof data, "%s/state", data_root); /* created by the daemon */
  fp4idx_test_daemon_t d;
  start(&d, data, "everysec", NULL, NULL);
  int fd = connect_to(&d);

  seqs_t s = {.id = {1, 2, 1ull << 40, 77}};
  /* bf16 keys (quantized by the daemon) and packed FP4 slots, several
   * appends, a truncate and a drop: the restart must keep exactly this. */
  uint16_t *bf = malloc(300 * 128 * 2);
  make_bf16(bf, 300 * 128, 11);
  unsigned char *fp4 = malloc(500 * 68);
  fill_random_keys(fp4, 500 * 68, 12);
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_BF16, 300, bf, &first, &len), 0);
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_U8, 100, fp4, &first, &len), 0);
  cr_assert_eq(fp4idx_test_truncate(fd, 1, 333), 0);
  cr_assert_eq(fp4idx_test_append(fd, 2, FP4IDX_WIRE_U8, 500, fp4, &first, &len), 0);
  cr_assert_eq(fp4idx_test_append(fd, 1ull << 40, FP4IDX_WIRE_U8, 1, fp4 + 68, &first, &len), 0);
  cr_assert_eq(fp4idx_test_append(fd, 77, FP4IDX_WIRE_BF16, 64, bf, &first, &len), 0);
  cr_assert_eq(fp4idx_test_append(fd, 99, FP4IDX_WIRE_BF16, 10, bf, &first, &len), 0);
  cr_assert_eq(fp4idx_test_drop(fd, 99), 0);
  s.len[0] = 333;
  s.len[1] = 500;
  s.len[2] = 1;
  s.len[3] = 64;
  read_all(fd, &s);
  cr_assert_eq(memcmp(s.bytes[1], fp4, 500 * 68), 0); /* packed slots verbatim */
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  uint64_t free_before = info.pages_free;
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0, "SIGTERM exit code");

  /* Restart: everything is there, byte for byte; 99 stays dropped. */
  seqs_t again = s;
  for (int i = 0; i < 4; i++) again.bytes[i] = NULL;
  start(&d, data, "everysec", NULL, NULL);
  fd = connect_to(&d);
  read_all(fd, &again);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(memcmp(again.bytes[i], s.bytes[i], s.len[i] * 68), 0, "seq %d differs", i);
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  cr_assert_eq(info.sequences, 4);
  cr_assert_eq(info.pages_free, free_before);
  cr_assert_eq(fp4idx_test_drop(fd, 99), FP4IDX_ENOSEQ);

  /* And once more through the log only: save, append more, kill -9. */
  fp4idx_request_t req = {.op = FP4IDX_OP_SAVE, .id = 5};
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0);
  fp4idx_response_clear(&resp);
  free(body);
  cr_assert_eq(fp4idx_test_append(fd, 2, FP4IDX_WIRE_U8, 50, fp4 + 68 * 7, &first, &len), 0);
  cr_assert_eq(first, 500);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGKILL), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 5000), 128 + SIGKILL);
  fp4idx_test_daemon_stop(&d);
  start(&d, data, "everysec", NULL, NULL);
  fd = connect_to(&d);
  unsigned char *tail = malloc(50 * 68);
  uint64_t got = 0;
  cr_assert_eq(fp4idx_test_read(fd, 2, 500, 50, tail, &got), 0);
  cr_assert_eq(memcmp(tail, fp4 + 68 * 7, 50 * 68), 0);
  read_all(fd, &again);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(memcmp(again.bytes[i], s.bytes[i], s.len[i] * 68), 0);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  for (int i = 0; i < 4; i++) {
    free(s.bytes[i]);
    free(again.bytes[i]);
  }
  free(tail);
  free(bf);
  free(fp4);
  tmpdir_rm(data_root);
}

/* ---- kill -9 in the middle of a stream of appends ------------------------- */

#define STREAM_REQS 400
#define STREAM_KEYS 8

typedef struct streamer_s {
  int fd;
  const unsigned char *keys;
  int sent;
} streamer_t;

static void *stream_send(void *arg) {
  streamer_t *st = arg;
  for (int i = 0; i < STREAM_REQS; i++) {
    fp4idx_request_t req;
    memset(&req, 0, sizeof req);
    req.id = (uint64_t)i + 1;
    req.op = FP4IDX_OP_APPEND;
    req.u.append.seq = 42;
    uint64_t shape[2] = {STREAM_KEYS, 68};
    fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_U8, 2, shape,
                       st->keys + (size_t)i * STREAM_KEYS * 68);
    if (fp4idx_test_send_request(st->fd, &req)) break; /* the daemon died */
    st->sent = i + 1;
  }
  return NULL;
}

Test(service_daemon, kill9_keeps_every_acknowledged_append_fsync_always) {
  char data[64];
  tmpdir_make(data, sizeof data);
  fp4idx_test_daemon_t d;
  start(&d, data, "always", NULL, NULL);
  int fd = connect_to(&d);
  unsigned char *keys = malloc((size_t)STREAM_REQS * STREAM_KEYS * 68);
  fill_random_keys(keys, (size_t)STREAM_REQS * STREAM_KEYS * 68, 2024);
  streamer_t st = {.fd = fd, .keys = keys};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, stream_send, &st), 0);
  int acked = 0, killed = 0;
  for (;;) {
    fp4idx_response_t resp;
    unsigned char *body = NULL;
    if (fp4idx_test_recv_response(fd, FP4IDX_OP_APPEND, &resp, &body) != 0) break;
    cr_assert_eq(resp.status, 0);
    cr_assert_eq(resp.id, (uint64_t)acked + 1, "responses come in request order");
    cr_assert_eq(resp.u.append.first, (uint64_t)acked * STREAM_KEYS);
    fp4idx_response_clear(&resp);
    free(body);
    acked++;
    if (acked == 60 && !killed) {
      cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGKILL), 0);
      killed = 1;
    }
    if (acked == STREAM_REQS) break;
  }
  shutdown(fd, SHUT_RDWR);
  pthread_join(th, NULL);
  close(fd);
  cr_assert(killed);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 5000), 128 + SIGKILL);
  fp4idx_test_daemon_stop(&d);
  cr_assert_lt(acked, STREAM_REQS, "the kill came after the whole stream");

  start(&d, data, "always", NULL, NULL);
  fd = connect_to(&d);
  /* Every acknowledged key, byte for byte. */
  size_t n = (size_t)acked * STREAM_KEYS;
  unsigned char *back = malloc(n * 68);
  uint64_t got = 0;
  cr_assert_eq(fp4idx_test_read(fd, 42, 0, n, back, &got), 0);
  cr_assert_eq(memcmp(back, keys, n * 68), 0);
  /* Beyond them: either nothing, or appends that reached the log before the
   * kill without their reply getting out: then exactly the next ones. */
  unsigned char more[STREAM_KEYS * 68];
  for (int i = acked; i < STREAM_REQS; i++) {
    int rc = fp4idx_test_read(fd, 42, (uint64_t)i * STREAM_KEYS, STREAM_KEYS, more, &got);
    if (rc == FP4IDX_ERANGE) break;
    cr_assert_eq(rc, 0);
    cr_assert_eq(memcmp(more, keys + (size_t)i * STREAM_KEYS * 68, sizeof more), 0);
  }
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  free(back);
  free(keys);
  tmpdir_rm(data);
}

/* ---- refusals and tolerance at start ------------------------------------------ */

static int spawn_and_wait(const char *data, char *log, size_t logcap) {
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  const char *args[] = {"--backend", "cpu", "--cache-bytes", "16M", "--data-dir", data, NULL};
  char sock[160];
  snprintf(sock, sizeof sock, "%s/x.sock", data);
  cr_assert_eq(fp4idx_test_daemon_spawn(&d, sock, args), 0);
  int code = fp4idx_test_daemon_wait(&d, 10000);
  if (code < 0) {
    fp4idx_test_daemon_kill(&d, SIGKILL);
    fp4idx_test_daemon_wait(&d, 5000);
  }
  FILE *f = fopen(d.log, "r");
  size_t n = f ? fread(log, 1, logcap - 1, f) : 0;
  log[n] = 0;
  if (f) fclose(f);
  fp4idx_test_daemon_stop(&d);
  return code;
}

/* Fills a data dir: a snapshot of 2 sequences plus a log of 3 appends. */
static void fill_data(const char *data, unsigned char *keys) {
  fp4idx_test_daemon_t d;
  start(&d, data, "always", NULL, NULL);
  int fd = connect_to(&d);
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_U8, 100, keys, &first, &len), 0);
  cr_assert_eq(fp4idx_test_append(fd, 2, FP4IDX_WIRE_U8, 100, keys, &first, &len), 0);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0); /* snapshot */
  start(&d, data, "always", NULL, NULL);
  fd = connect_to(&d);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(fp4idx_test_append(fd, 3, FP4IDX_WIRE_U8, 10, keys + i * 680, &first, &len), 0);
  close(fd);
  fp4idx_test_daemon_kill(&d, SIGKILL); /* no snapshot: the log keeps them */
  fp4idx_test_daemon_wait(&d, 5000);
  fp4idx_test_daemon_stop(&d);
}

Test(service_daemon, corrupt_snapshot_or_log_stops_the_start) {
  char data[64], snap[128], logf[128], log[16384];
  unsigned char *keys = malloc(100 * 68);
  fill_random_keys(keys, 100 * 68, 3);
  tmpdir_make(data, sizeof data);
  snprintf(snap, sizeof snap, "%s/snapshot.fp4s", data);
  snprintf(logf, sizeof logf, "%s/appendonly.fp4log", data);
  fill_data(data, keys);
  off_t log_size = file_size(logf);
  cr_assert_eq(log_size, 32 + 3 * (40 + 680));

  /* A flipped byte in the snapshot's pool: refused, exit 1, files untouched. */
  file_flip(snap, file_size(snap) - 100, 0x01);
  off_t snap_size = file_size(snap);
  cr_assert_eq(spawn_and_wait(data, log, sizeof log), 1);
  cr_assert_not_null(strstr(log, "checksum"), "%s", log);
  cr_assert_eq(file_size(snap), snap_size);
  cr_assert_eq(file_size(logf), log_size);
  file_flip(snap, file_size(snap) - 100, 0x01); /* repair */

  /* A truncated snapshot: refused. */
  char keep[160];
  snprintf(keep, sizeof keep, "%s/keep", data);
  file_copy(snap, keep);
  file_truncate(snap, snap_size - 1);
  cr_assert_eq(spawn_and_wait(data, log, sizeof log), 1);
  cr_assert_not_null(strstr(log, "truncated"), "%s", log);
  file_copy(keep, snap);

  /* A corrupted middle log record: refused with ECORRUPT's message. */
  file_flip(logf, 32 + 40 + 100, 0x20);
  cr_assert_eq(spawn_and_wait(data, log, sizeof log), 1);
  cr_assert_not_null(strstr(log, "corrupt append log record at offset 32"), "%s", log);
  file_flip(logf, 32 + 40 + 100, 0x20);

  /* The last record cut inside: it was acknowledged (--fsync always: synced
   * and marked before its reply), so this is tail loss, refused. */
  file_copy(logf, keep);
  file_truncate(logf, log_size - 300);
  cr_assert_eq(spawn_and_wait(data, log, sizeof log), 1);
  cr_assert_not_null(strstr(log, "acknowledged writes are missing"), "%s", log);
  file_copy(keep, logf);

  /* A torn tail -- a crash inside the write of a record never acknowledged,
   * beyond the mark -- modeled by a partial fourth record (the first 420 of
   * the third's 720 bytes again): starts, warns, keeps all three. */
  {
    int lfd = open(logf, O_RDWR | O_APPEND);
    cr_assert_geq(lfd, 0);
    unsigned char part[420];
    cr_assert_eq(pread(lfd, part, sizeof part, log_size - 720), (ssize_t)sizeof part);
    cr_assert_eq(write(lfd, part, sizeof part), (ssize_t)sizeof part);
    close(lfd);
  }
  fp4idx_test_daemon_t d;
  start(&d, data, "always", NULL, NULL);
  int fd = connect_to(&d);
  unsigned char back[30 * 68];
  uint64_t got;
  cr_assert_eq(fp4idx_test_read(fd, 3, 0, 30, back, &got), 0);
  cr_assert_eq(memcmp(back, keys, sizeof back), 0);
  cr_assert_eq(fp4idx_test_read(fd, 3, 30, 1, back, &got), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx_test_read(fd, 1, 0, 100, NULL, &got), 0);
  close(fd);
  FILE *f = fopen(d.log, "r");
  size_t n = fread(log, 1, sizeof log - 1, f);
  log[n] = 0;
  fclose(f);
  cr_assert_not_null(strstr(log, "torn write"), "%s", log);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  free(keys);
  tmpdir_rm(data);
}

Test(service_daemon, save_without_data_dir_is_an_error) {
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  cr_assert_eq(fp4idx_test_daemon_start(&d, NULL), 0);
  int fd = connect_to(&d);
  fp4idx_request_t req = {.op = FP4IDX_OP_SAVE, .id = 9};
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, FP4IDX_EDISABLED); /* as PROTOCOL.md says */
  cr_assert_str_eq(resp.error, "persistence is not enabled: start fp4idxd with --data-dir");
  fp4idx_response_clear(&resp);
  free(body);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

Test(service_daemon, sighup_saves_a_snapshot) {
  char data[64], snap[128];
  tmpdir_make(data, sizeof data);
  snprintf(snap, sizeof snap, "%s/snapshot.fp4s", data);
  fp4idx_test_daemon_t d;
  start(&d, data, "no", NULL, NULL);
  int fd = connect_to(&d);
  unsigned char keys[5 * 68];
  fill_random_keys(keys, sizeof keys, 8);
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_append(fd, 4, FP4IDX_WIRE_U8, 5, keys, &first, &len), 0);
  cr_assert_neq(access(snap, F_OK), 0);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGHUP), 0);
  for (int i = 0; i < 500 && access(snap, F_OK) != 0; i++) sleep_ms(10);
  cr_assert_eq(access(snap, F_OK), 0, "no snapshot after SIGHUP");
  cr_assert_eq(file_size(snap), 128 + 16 + 4 + 64 * 68);
  /* Still serving. */
  cr_assert_eq(fp4idx_test_read(fd, 4, 0, 5, NULL, &len), 0);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  tmpdir_rm(data);
}

/* ---- systemd: socket activation and notifications --------------------------- */

static int notify_bind(const char *path) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  cr_assert_lt(strlen(path), sizeof sa.sun_path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

/* Waits up to ms for a datagram containing `want`; returns 1 when seen. */
static int notify_wait(int fd, const char *want, int ms, char *last, size_t lastcap) {
  for (int waited = 0; waited < ms; waited += 50) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 50) == 1) {
      char buf[1024];
      ssize_t r = recv(fd, buf, sizeof buf - 1, 0);
      if (r > 0) {
        buf[r] = 0;
        snprintf(last, lastcap, "%s", buf);
        if (strstr(buf, want)) return 1;
      }
    }
  }
  return 0;
}

static pid_t spawn_activated(const char *dir, const char *sock, const char *notify,
                             const char *data, const char *watchdog_usec) {
  char logp[160], env_notify[200], env_wd[64];
  snprintf(logp, sizeof logp, "%s/daemon.log", dir);
  snprintf(env_notify, sizeof env_notify, "NOTIFY_SOCKET=%s", notify);
  snprintf(env_wd, sizeof env_wd, "WATCHDOG_USEC=%s", watchdog_usec);
  pid_t parent = getpid();
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int fd = open(logp, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execlp("systemd-socket-activate", "systemd-socket-activate", "-l", sock, "-E",
           env_notify, "-E", env_wd, daemon_path(), "--backend", "cpu", "--cache-bytes",
           "16M", "--data-dir", data, "--log-level", "debug", (char *)NULL);
    _exit(127);
  }
  return pid;
}

Test(service_daemon, socket_activation_and_notify) {
  if (system("command -v systemd-socket-activate >/dev/null 2>&1") != 0)
    cr_skip_test("systemd-socket-activate is not installed (Debian package systemd)");
  char dir[64], sock[128], notify[128], data[128], last[1024] = "";
  tmpdir_make(dir, sizeof dir);
  snprintf(sock, sizeof sock, "%s/act.sock", dir);
  snprintf(notify, sizeof notify, "%s/notify", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  int nfd = notify_bind(notify);
  pid_t pid = spawn_activated(dir, sock, notify, data, "200000");
  /* systemd-socket-activate listens first and starts the daemon on the
   * first connection, handing it the socket as fd 3 (LISTEN_FDS=1). */
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; i++) {
    fd = fp4idx_test_connect(sock);
    if (fd < 0) sleep_ms(10);
  }
  cr_assert_geq(fd, 0, "socket never appeared");
  cr_assert(notify_wait(nfd, "READY=1", 10000, last, sizeof last), "no READY=1 (last: %s)",
            last);
  cr_assert_not_null(strstr(last, "STATUS=serving"), "%s", last);
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  cr_assert_gt(info.pages_total, 0);
  unsigned char keys[3 * 68];
  fill_random_keys(keys, sizeof keys, 1);
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_append(fd, 5, FP4IDX_WIRE_U8, 3, keys, &first, &len), 0);
  /* WATCHDOG_USEC=200000: pings every 100 ms. */
  cr_assert(notify_wait(nfd, "WATCHDOG=1", 3000, last, sizeof last), "no WATCHDOG=1");
  close(fd);

  cr_assert_eq(kill(pid, SIGTERM), 0);
  cr_assert(notify_wait(nfd, "STOPPING=1", 5000, last, sizeof last), "no STOPPING=1");
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
  /* The daemon did not own the socket file, so it did not remove it; and it
   * saved its snapshot on the way down. */
  cr_assert_eq(access(sock, F_OK), 0);
  char snap[160];
  snprintf(snap, sizeof snap, "%s/snapshot.fp4s", data);
  cr_assert_eq(access(snap, F_OK), 0);
  char logp[160], log[16384];
  snprintf(logp, sizeof logp, "%s/daemon.log", dir);
  FILE *f = fopen(logp, "r");
  size_t n = fread(log, 1, sizeof log - 1, f);
  log[n] = 0;
  fclose(f);
  cr_assert_not_null(strstr(log, "inherited socket"), "%s", log);
  close(nfd);
  tmpdir_rm(dir);
}

/* Speculative decoding appends and truncates all the time: the log must not
 * grow without bound. Past 64 MiB and twice the live data it is compacted by
 * a snapshot the daemon takes by itself. */
Test(service_daemon, log_growth_triggers_a_snapshot) {
  char data[64], snap[128], logf[128];
  tmpdir_make(data, sizeof data);
  snprintf(snap, sizeof snap, "%s/snapshot.fp4s", data);
  snprintf(logf, sizeof logf, "%s/appendonly.fp4log", data);
  fp4idx_test_daemon_t d;
  start(&d, data, "no", NULL, NULL);
  int fd = connect_to(&d);
  enum { N = 100000 };
  unsigned char *keys = malloc((size_t)N * 68);
  fill_random_keys(keys, (size_t)N * 68, 31);
  uint64_t first, len;
  int rounds = 0;
  while (access(snap, F_OK) != 0 && rounds < 20) {
    cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_U8, N, keys, &first, &len), 0);
    cr_assert_eq(fp4idx_test_truncate(fd, 1, 1000), 0);
    rounds++;
    for (int i = 0; i < 20 && rounds >= 10 && access(snap, F_OK) != 0; i++) sleep_ms(10);
  }
  /* 100000 * 68 bytes a round: the 10th round passes 64 MiB. */
  cr_assert_eq(access(snap, F_OK), 0, "no snapshot after %d rounds", rounds);
  cr_assert_geq(rounds, 10);
  cr_assert_lt(file_size(logf), 64 << 20);
  /* The state is intact: 1000 keys (the truncated prefix of the last round). */
  unsigned char *back = malloc(1000 * 68);
  cr_assert_eq(fp4idx_test_read(fd, 1, 0, 1000, back, &len), 0);
  cr_assert_eq(memcmp(back, keys, 1000 * 68), 0);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  free(back);
  free(keys);
  tmpdir_rm(data);
}

/* When the log cannot be written (file size limit: EFBIG), the append fails
 * with EIO and changes nothing; the daemon goes on, and a restart has every
 * acknowledged key. The limit is inherited by the spawned daemon. */
#include <sys/resource.h>

Test(service_daemon, log_write_failure_fails_the_request_cleanly) {
  char data[64];
  tmpdir_make(data, sizeof data);
  signal(SIGXFSZ, SIG_IGN); /* inherited: the daemon gets EFBIG, not a signal */
  struct rlimit rl = {.rlim_cur = 300000, .rlim_max = RLIM_INFINITY};
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
  fp4idx_test_daemon_t d;
  start(&d, data, "always", "--log-level", "info");
  int fd = connect_to(&d);
  unsigned char *keys = malloc(5000 * 68);
  fill_random_keys(keys, 5000 * 68, 17);
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_U8, 100, keys, &first, &len), 0);
  fp4idx_info_t before, after;
  cr_assert_eq(fp4idx_test_info(fd, &before), 0);
  /* 5000 keys = 340 KB of log: above the limit. */
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_U8, 5000, keys, &first, &len),
               FP4IDX_EIO);
  cr_assert_eq(fp4idx_test_append(fd, 2, FP4IDX_WIRE_U8, 5000, keys, &first, &len),
               FP4IDX_EIO);
  cr_assert_eq(fp4idx_test_info(fd, &after), 0);
  cr_assert_eq(after.pages_free, before.pages_free, "nothing stored");
  cr_assert_eq(after.sequences, 1, "the failed append did not create sequence 2");
  cr_assert_eq(fp4idx_test_read(fd, 1, 100, 1, NULL, &len), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_U8, 100, keys + 100 * 68, &first,
                                  &len),
               0);
  cr_assert_eq(first, 100);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGKILL), 0); /* the log alone */
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 5000), 128 + SIGKILL);
  fp4idx_test_daemon_stop(&d);
  start(&d, data, "always", "--log-level", "info");
  fd = connect_to(&d);
  unsigned char *back = malloc(200 * 68);
  cr_assert_eq(fp4idx_test_read(fd, 1, 0, 200, back, &len), 0);
  cr_assert_eq(memcmp(back, keys, 200 * 68), 0);
  cr_assert_eq(fp4idx_test_read(fd, 1, 200, 1, NULL, &len), FP4IDX_ERANGE);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  free(back);
  free(keys);
  tmpdir_rm(data);
}

/* A snapshot that cannot be written (file size limit) fails `save` with EIO
 * and the final save on SIGTERM with exit status 1; the append log keeps
 * every key, so the next start has them all. */
Test(service_daemon, failed_snapshot_keeps_the_log) {
  char data[64], snap[128];
  tmpdir_make(data, sizeof data);
  snprintf(snap, sizeof snap, "%s/snapshot.fp4s", data);
  signal(SIGXFSZ, SIG_IGN);
  /* 60 one-key sequences: 60 * 108 B of log, but 60 pages = 261 KB of
   * snapshot, above the 100 KB limit. */
  struct rlimit rl = {.rlim_cur = 100000, .rlim_max = RLIM_INFINITY};
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
  fp4idx_test_daemon_t d;
  start(&d, data, "always", "--log-level", "info");
  int fd = connect_to(&d);
  unsigned char keys[60 * 68];
  fill_random_keys(keys, sizeof keys, 23);
  uint64_t first, len;
  for (int i = 0; i < 60; i++)
    cr_assert_eq(fp4idx_test_append(fd, 100 + i, FP4IDX_WIRE_U8, 1, keys + i * 68, &first,
                                    &len),
                 0);
  fp4idx_request_t req = {.op = FP4IDX_OP_SAVE, .id = 77};
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, FP4IDX_EIO);
  fp4idx_response_clear(&resp);
  free(body);
  cr_assert_neq(access(snap, F_OK), 0);
  /* Still serving and still logging. */
  cr_assert_eq(fp4idx_test_append(fd, 100, FP4IDX_WIRE_U8, 1, keys, &first, &len), 0);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGTERM), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 10000), 1, "final save failed: exit 1");
  fp4idx_test_daemon_stop(&d);

  start(&d, data, "always", "--log-level", "info");
  fd = connect_to(&d);
  unsigned char k[2 * 68];
  for (int i = 0; i < 60; i++) {
    uint64_t n = i == 0 ? 2 : 1;
    cr_assert_eq(fp4idx_test_read(fd, 100 + i, 0, n, k, &len), 0, "seq %d", 100 + i);
    cr_assert_eq(memcmp(k, keys + i * 68, 68), 0);
  }
  /* The append logged after the failed save is there too. */
  cr_assert_eq(fp4idx_test_read(fd, 100, 0, 2, k, &len), 0);
  cr_assert_eq(memcmp(k + 68, keys, 68), 0);
  close(fd);
  fp4idx_test_daemon_kill(&d, SIGKILL);
  fp4idx_test_daemon_wait(&d, 5000);
  fp4idx_test_daemon_stop(&d);
  tmpdir_rm(data);
}

/* One data dir, one daemon: a second one on the same folder refuses to
 * start (it would interleave its log records with the first one's). */
Test(service_daemon, data_dir_is_locked) {
  char data[64], log[16384];
  tmpdir_make(data, sizeof data);
  fp4idx_test_daemon_t d;
  start(&d, data, "everysec", NULL, NULL);
  cr_assert_eq(spawn_and_wait(data, log, sizeof log), 1);
  char want[64];
  snprintf(want, sizeof want, "in use by another fp4idxd (pid %d)", (int)d.pid);
  cr_assert_not_null(strstr(log, want), "%s", log);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  /* Free again once the first one has stopped (or died). */
  start(&d, data, "everysec", NULL, NULL);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGKILL), 0);
  fp4idx_test_daemon_wait(&d, 5000);
  fp4idx_test_daemon_stop(&d);
  start(&d, data, "everysec", NULL, NULL);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  tmpdir_rm(data);
}
