/* test_daemon_lifecycle.c -- truncate/drop semantics and page reuse, stats,
 * start-up rules (one daemon per socket, stale socket files, options) and
 * the graceful stop with requests in flight. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_format.h"

static uint16_t *make_keys(uint32_t n, uint32_t seed) {
  uint16_t *k = malloc((size_t)n * 128 * 2);
  for (size_t i = 0; i < (size_t)n * 128; i++) {
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)seed * 0xD1B54A32D192ED03ULL;
    h ^= h >> 31;
    k[i] = fp4idx_f32_to_bf16((float)((int)(h % 25) - 12) / 4.0f);
  }
  return k;
}

static fp4idx_info_t info_of(int fd) {
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  return info;
}

static int log_contains(const fp4idx_test_daemon_t *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  if (!f) return 0;
  char line[1024];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

Test(daemon_lifecycle, truncate_semantics) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "1M", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  uint16_t *keys = make_keys(203, 1);
  fp4idx_info_t i0 = info_of(fd);
  cr_assert_eq(fp4idx_test_append(fd, 9, FP4IDX_WIRE_BF16, 200, keys, NULL, NULL), 0);
  cr_assert_eq(info_of(fd).pages_free, i0.pages_free - 4);
  uint8_t *before = malloc(200 * 68), *after = malloc(200 * 68);
  cr_assert_eq(fp4idx_test_read(fd, 9, 0, 200, before, NULL), 0);

  cr_assert_eq(fp4idx_test_truncate(fd, 9, 65), 0);
  cr_assert_eq(info_of(fd).pages_free, i0.pages_free - 2, "truncate frees whole pages");
  cr_assert_eq(fp4idx_test_read(fd, 9, 0, 66, after, NULL), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx_test_read(fd, 9, 0, 65, after, NULL), 0);
  cr_assert_eq(memcmp(before, after, 65 * 68), 0, "kept keys unchanged");
  cr_assert_eq(fp4idx_test_truncate(fd, 9, 65), 0); /* same length: fine */
  cr_assert_eq(fp4idx_test_truncate(fd, 9, 66), FP4IDX_ERANGE);

  uint16_t q[2 * 4 * 128], w[2 * 4];
  for (int i = 0; i < 2 * 4 * 128; i++) q[i] = fp4idx_f32_to_bf16((float)(i % 5) - 2.0f);
  for (int i = 0; i < 8; i++) w[i] = fp4idx_f32_to_bf16(0.5f);
  float *logits = NULL;
  uint64_t width = 0;
  cr_assert_eq(fp4idx_test_score(fd, 9, 4, 2, q, w, NULL, &logits, &width), 0);
  cr_assert_eq(width, 65);
  free(logits);
  int32_t lens_hi[2] = {66, 1};
  cr_assert_eq(fp4idx_test_score(fd, 9, 4, 2, q, w, lens_hi, &logits, &width), FP4IDX_ERANGE);

  /* Appending after a truncate continues at the cut: new keys at 65.. */
  uint64_t first = 0, length = 0;
  cr_assert_eq(fp4idx_test_append(fd, 9, FP4IDX_WIRE_BF16, 3, keys + 200 * 128, &first, &length), 0);
  cr_assert_eq(first, 65);
  cr_assert_eq(length, 68);
  cr_assert_eq(fp4idx_test_read(fd, 9, 65, 3, after, NULL), 0);
  for (int i = 0; i < 3; i++) {
    uint8_t want[68];
    fp4idx_quantize_key(keys + (size_t)(200 + i) * 128, FP4IDX_DTYPE_BF16, FP4IDX_ROUND_RNE, want,
                        want + 64);
    cr_assert_eq(memcmp(after + i * 68, want, 68), 0);
  }
  /* Truncate to 0: the sequence stays, empty, and scores to width 0. */
  cr_assert_eq(fp4idx_test_truncate(fd, 9, 0), 0);
  fp4idx_info_t i1 = info_of(fd);
  cr_assert_eq(i1.pages_free, i0.pages_free);
  cr_assert_eq(i1.sequences, 1);
  cr_assert_eq(fp4idx_test_score(fd, 9, 4, 2, q, w, NULL, &logits, &width), 0);
  cr_assert_eq(width, 0);
  free(logits);
  free(before);
  free(after);
  free(keys);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

Test(daemon_lifecycle, drop_frees_pages_for_reuse) {
  fp4idx_test_daemon_t d;
  /* 10 pages of 64 keys */
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "43520", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  uint16_t *a = make_keys(640, 2), *b = make_keys(640, 3);
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_BF16, 640, a, NULL, NULL), 0);
  cr_assert_eq(info_of(fd).pages_free, 0);
  cr_assert_eq(fp4idx_test_append(fd, 2, FP4IDX_WIRE_BF16, 1, b, NULL, NULL), FP4IDX_EFULL);
  cr_assert_eq(fp4idx_test_drop(fd, 1), 0);
  fp4idx_info_t i1 = info_of(fd);
  cr_assert_eq(i1.pages_free, 10, "drop frees every page");
  cr_assert_eq(i1.sequences, 0);
  cr_assert_eq(fp4idx_test_drop(fd, 1), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_test_read(fd, 1, 0, 0, NULL, NULL), FP4IDX_ENOSEQ);
  /* The whole pool is usable again, by another sequence. */
  cr_assert_eq(fp4idx_test_append(fd, 2, FP4IDX_WIRE_BF16, 640, b, NULL, NULL), 0);
  cr_assert_eq(info_of(fd).pages_free, 0);
  uint8_t *got = malloc(640 * 68);
  cr_assert_eq(fp4idx_test_read(fd, 2, 0, 640, got, NULL), 0);
  for (int i = 0; i < 640; i++) {
    uint8_t want[68];
    fp4idx_quantize_key(b + (size_t)i * 128, FP4IDX_DTYPE_BF16, FP4IDX_ROUND_RNE, want, want + 64);
    cr_assert_eq(memcmp(got + i * 68, want, 68), 0, "reused page holds the new key %d", i);
  }
  /* Re-creating a dropped id starts from position 0. */
  cr_assert_eq(fp4idx_test_drop(fd, 2), 0);
  uint64_t first = 99;
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_BF16, 5, a, &first, NULL), 0);
  cr_assert_eq(first, 0);
  free(got);
  free(a);
  free(b);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

Test(daemon_lifecycle, info_and_stats) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "1M", "--page-size", "16", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  fp4idx_info_t info = info_of(fd);
  cr_assert_eq(info.page_size, 16);
  cr_assert_eq(info.pages_total, (1u << 20) / (16 * 68));
  cr_assert_str_eq(info.backend, "cpu");
  cr_assert_str_eq(info.server, "fp4idxd 0.1.0");
  cr_assert_eq(info.version, 1);
  {
    fp4idx_request_t h;
    fp4idx_response_t hr;
    unsigned char *hb = NULL;
    memset(&h, 0, sizeof h);
    h.id = 5;
    h.op = FP4IDX_OP_HELLO;
    h.u.hello.version = 1;
    h.u.hello.client = (fp4idx_strview_t){"test", 4};
    cr_assert_eq(fp4idx_test_call(fd, &h, &hr, &hb), 0);
    cr_assert_eq(hr.status, 0, "%s", hr.error);
    cr_assert_eq(hr.id, 5);
    cr_assert_eq(hr.u.hello.version, 1);
    cr_assert_str_eq(hr.u.hello.server, "fp4idxd 0.1.0");
    fp4idx_response_clear(&hr);
    free(hb);
  }
  /* three more connections, two closed again: the count follows */
  int extra[3];
  for (int i = 0; i < 3; i++) {
    extra[i] = fp4idx_test_connect(d.sock);
    info_of(extra[i]);
  }
  close(extra[0]);
  close(extra[1]);
  /* until the daemon has seen both closes */
  uint64_t conns = 0;
  for (int t = 0; t < 1000; t++) {
    cr_assert_eq(fp4idx_test_connections(fd, &conns), 0);
    if (conns == 2) break;
    usleep(10000);
  }
  cr_assert_eq(conns, 2, "the daemon still counts %llu connections", (unsigned long long)conns);
  uint16_t *keys = make_keys(20, 4);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(fp4idx_test_append(fd, 3, FP4IDX_WIRE_BF16, 20, keys, NULL, NULL), 0);
  cr_assert_eq(fp4idx_test_drop(fd, 77), FP4IDX_ENOSEQ);
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.id = 1;
  req.op = FP4IDX_OP_STATS;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0, "%s", resp.error);
  const fp4idx_stats_t *st = &resp.u.stats;
  cr_assert_eq(st->keys, 100);
  cr_assert_eq(st->sequences, 1);
  cr_assert_eq(st->connections, 2, "this one and extra[2]");
  cr_assert_gt(st->uptime_s, 0.0);
  cr_assert_str_eq(st->backend, "cpu");
  cr_assert_eq(st->pages_total - st->pages_free, 7); /* 100 keys / 16 */
  int seen_append = 0, seen_drop = 0;
  for (size_t i = 0; i < st->nops; i++) {
    const fp4idx_op_stats_t *o = &st->ops[i];
    uint64_t sum = 0;
    for (uint32_t j = 0; j < o->nbuckets; j++) sum += o->hist[j];
    cr_assert_eq(sum, o->count, "%s: histogram counts add up", o->op);
    cr_assert_eq(o->nbuckets, 26);
    cr_assert_eq(o->le_us[0], 1.0);
    cr_assert_eq(o->le_us[24], (double)(1 << 24));
    cr_assert(isinf(o->le_us[25]));
    if (!strcmp(o->op, "append")) {
      seen_append = 1;
      cr_assert_eq(o->count, 5);
      cr_assert_eq(o->errors, 0);
      cr_assert_gt(o->sum_us, 0.0);
    }
    if (!strcmp(o->op, "drop")) {
      seen_drop = 1;
      cr_assert_eq(o->count, 1);
      cr_assert_eq(o->errors, 1);
    }
  }
  cr_assert(seen_append && seen_drop);
  close(extra[2]);
  fp4idx_response_clear(&resp);
  free(body);
  free(keys);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void graceful_stop_with_inflight(int sig) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "64M", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  enum { N = 60000, H = 64, R = 16, NREQ = 6 };
  uint16_t *keys = make_keys(N, 5);
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_BF16, N, keys, NULL, NULL), 0);
  uint16_t *q = malloc(R * H * 128 * 2), *w = malloc(R * H * 2);
  for (int i = 0; i < R * H * 128; i++) q[i] = fp4idx_f32_to_bf16((float)(i % 7) - 3.0f);
  for (int i = 0; i < R * H; i++) w[i] = fp4idx_f32_to_bf16(0.25f);
  /* Big scores pipelined, then the signal while they run. */
  fp4idx_request_t req;
  fp4idx_score_seq_t s;
  memset(&req, 0, sizeof req);
  memset(&s, 0, sizeof s);
  req.op = FP4IDX_OP_SCORE;
  req.u.score.heads = H;
  req.u.score.seqs = &s;
  req.u.score.nseqs = 1;
  s.seq = 1;
  s.rows = R;
  uint64_t qs[3] = {R, H, 128}, ws[2] = {R, H};
  fp4idx_tensor_init(&s.q, FP4IDX_WIRE_BF16, 3, qs, q);
  fp4idx_tensor_init(&s.w, FP4IDX_WIRE_BF16, 2, ws, w);
  for (uint64_t id = 1; id <= NREQ; id++) {
    req.id = id;
    cr_assert_eq(fp4idx_test_send_request(fd, &req), 0);
  }
  /* the daemon has read the frames (a stopping daemon reads no more) */
  cr_assert_eq(fp4idx_test_wait_sent(fd, 10000), 0, "the daemon did not read the requests");
  double t_sig = now_s();
  cr_assert_eq(fp4idx_test_daemon_kill(&d, sig), 0);
  for (uint64_t id = 1; id <= NREQ; id++) {
    fp4idx_response_t resp;
    unsigned char *body = NULL;
    cr_assert_eq(fp4idx_test_recv_response(fd, FP4IDX_OP_SCORE, &resp, &body), 0,
                 "reply %llu lost in the shutdown", (unsigned long long)id);
    cr_assert_eq(resp.id, id);
    cr_assert_eq(resp.status, 0, "%s", resp.error);
    cr_assert_eq(resp.u.score.results[0].logits.shape[1], N);
    fp4idx_response_clear(&resp);
    free(body);
  }
  cr_log_info("replies arrived %.3f s after the signal", now_s() - t_sig);
  cr_assert_eq(fp4idx_test_peer_closed(fd, 5000), 1, "connection closed after the flush");
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 10000), 0, "exit code 0 after a graceful stop");
  struct stat st;
  cr_assert_neq(stat(d.sock, &st), 0, "socket file removed");
  cr_assert(log_contains(&d, "graceful stop"));
  /* The signal really came while work was queued. */
  cr_assert(!log_contains(&d, "finishing 0 queued"), "scores finished before the signal");
  cr_assert(log_contains(&d, "stopped"));
  close(fd);
  fp4idx_test_daemon_stop(&d);
  free(q);
  free(w);
  free(keys);
}

Test(daemon_lifecycle, sigterm_finishes_inflight_requests) {
  graceful_stop_with_inflight(SIGTERM);
}

Test(daemon_lifecycle, sigint_finishes_inflight_requests) {
  graceful_stop_with_inflight(SIGINT);
}

Test(daemon_lifecycle, idle_stop_and_no_new_connections) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, NULL), 0);
  int fd = fp4idx_test_connect(d.sock); /* an idle client does not block the stop */
  cr_assert_geq(fd, 0);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGTERM), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 5000), 0);
  cr_assert_eq(fp4idx_test_peer_closed(fd, 2000), 1);
  cr_assert_lt(fp4idx_test_connect(d.sock), 0, "nobody listens after the stop");
  close(fd);
  fp4idx_test_daemon_stop(&d);
}

/* The busy socket is checked before the pool is sized and allocated: a
 * second daemon asking for a pool no machine has is refused for the socket,
 * not for memory, and never reaches the backend. */
Test(daemon_lifecycle, busy_socket_refused_before_the_pool_is_allocated) {
  fp4idx_test_daemon_t d1, d2;
  cr_assert_eq(fp4idx_test_daemon_start(&d1, NULL), 0);
  memset(&d2, 0, sizeof d2);
  cr_assert_eq(fp4idx_test_daemon_spawn(&d2, d1.sock, (const char *[]){"--backend", "cpu",
                                        "--cache-bytes", "64T", NULL}), 0);
  int code = fp4idx_test_daemon_wait(&d2, 10000);
  cr_assert_eq(code, 1, "second daemon: exit %d", code);
  cr_assert(log_contains(&d2, "another daemon is answering"));
  cr_assert_not(log_contains(&d2, "pool"), "the pool was sized or allocated first");
  cr_assert_not(log_contains(&d2, "backend"), "the backend was opened first");
  fp4idx_test_daemon_stop(&d2);
  cr_assert_eq(fp4idx_test_daemon_stop(&d1), 0);
}

Test(daemon_lifecycle, refuses_a_second_daemon_on_the_socket) {
  fp4idx_test_daemon_t d1, d2;
  cr_assert_eq(fp4idx_test_daemon_start(&d1, NULL), 0);
  memset(&d2, 0, sizeof d2);
  cr_assert_eq(fp4idx_test_daemon_spawn(&d2, d1.sock, (const char *[]){"--backend", "cpu", "--cache-bytes", "1M", NULL}), 0);
  int code = fp4idx_test_daemon_wait(&d2, 10000);
  cr_assert_neq(code, 0, "second daemon must refuse to start");
  cr_assert_neq(code, -1, "second daemon still running");
  cr_assert(log_contains(&d2, "another daemon"));
  int fd = fp4idx_test_connect(d1.sock);
  cr_assert_geq(fd, 0, "the first daemon's socket survived");
  info_of(fd);
  close(fd);
  fp4idx_test_daemon_stop(&d2);
  cr_assert_eq(fp4idx_test_daemon_stop(&d1), 0);
}

Test(daemon_lifecycle, removes_a_stale_socket_file) {
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  char dir[] = "/tmp/fp4idxd-stale-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[200];
  snprintf(path, sizeof path, "%s/nested/s.sock", dir);
  char sub[64];
  snprintf(sub, sizeof sub, "%s/nested", dir);
  mkdir(sub, 0700);
  /* a socket file nobody listens on */
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  cr_assert_lt(strlen(path), sizeof sa.sun_path);
  memcpy(sa.sun_path, path, strlen(path) + 1);
  cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
  close(s);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(fp4idx_test_daemon_spawn(&d, path, (const char *[]){"--backend", "cpu", "--cache-bytes", "1M", NULL}), 0);
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; i++) {
    fd = fp4idx_test_connect(path);
    if (fd < 0) usleep(10000);
  }
  cr_assert_geq(fd, 0, "daemon did not take over the stale socket");
  info_of(fd);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  cr_assert_neq(stat(path, &st), 0);
  rmdir(sub);
  rmdir(dir);
}

Test(daemon_lifecycle, creates_the_socket_folder) {
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  char dir[] = "/tmp/fp4idxd-mk-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[200], sub[64];
  snprintf(sub, sizeof sub, "%s/a/b", dir);
  snprintf(path, sizeof path, "%s/fp4idxd.sock", sub);
  cr_assert_eq(fp4idx_test_daemon_spawn(&d, path, (const char *[]){"--backend", "cpu", "--cache-bytes", "1M", NULL}), 0);
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; i++) {
    fd = fp4idx_test_connect(path);
    if (fd < 0) usleep(10000);
  }
  cr_assert_geq(fd, 0);
  struct stat st;
  cr_assert_eq(stat(sub, &st), 0);
  cr_assert(S_ISDIR(st.st_mode));
  cr_assert_eq(st.st_mode & 0777, geteuid() == 0 ? 0755 : 0700);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  rmdir(sub);
  snprintf(sub, sizeof sub, "%s/a", dir);
  rmdir(sub);
  rmdir(dir);
}

Test(daemon_lifecycle, command_line_exit_codes) {
  struct {
    const char *args[6];
    int code;
  } cases[] = {
      {{"--version", NULL}, 0},
      {{"--help", NULL}, 0},
      {{"--page-size", "3", NULL}, 2},
      {{"--nonsense", NULL}, 2},
      {{"--backend", "cpu", "--cache-bytes", "100", NULL}, 1}, /* smaller than a page */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    fp4idx_test_daemon_t d;
    memset(&d, 0, sizeof d);
    cr_assert_eq(fp4idx_test_daemon_spawn(&d, NULL, cases[i].args), 0);
    int code = fp4idx_test_daemon_wait(&d, 10000);
    cr_assert_eq(code, cases[i].code, "case %zu (%s): exit %d", i, cases[i].args[0], code);
    fp4idx_test_daemon_stop(&d);
  }
}

#ifndef FP4IDX_TEST_HAVE_CUDA
Test(daemon_lifecycle, cuda_without_cuda_build) {
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  cr_assert_eq(fp4idx_test_daemon_prepare(&d), 0);
  cr_assert_eq(fp4idx_test_daemon_spawn(&d, d.sock, (const char *[]){"--backend", "cuda", NULL}), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 10000), 1, "--backend cuda without CUDA exits 1");
  cr_assert(log_contains(&d, "CUDA backend unavailable"));
  fp4idx_test_daemon_stop(&d);
  /* auto falls back to the CPU with one log line */
  fp4idx_test_daemon_t a;
  cr_assert_eq(fp4idx_test_daemon_start(&a, (const char *[]){"--backend", "auto", "--cache-bytes", "1M", NULL}), 0);
  cr_assert(log_contains(&a, "using the CPU backend"));
  int fd = fp4idx_test_connect(a.sock);
  cr_assert_str_eq(info_of(fd).backend, "cpu");
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&a), 0);
}
#endif

/* A second SIGTERM does not wait for a client that never reads. */
Test(daemon_lifecycle, second_signal_closes_without_flushing) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "16M", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  enum { N = 4096 };
  uint16_t *keys = make_keys(N, 6);
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_BF16, N, keys, NULL, NULL), 0);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  for (int i = 0; i < 200; i++) {
    fp4idx_request_t req;
    memset(&req, 0, sizeof req);
    req.id = (uint64_t)i + 1;
    req.op = FP4IDX_OP_READ;
    req.u.read.seq = 1;
    req.u.read.dequant = true; /* 2 MiB per answer */
    cr_assert_eq(fp4idx_encode_request(&sb, &req), 0);
  }
  cr_assert_eq(fp4idx_test_send_all(fd, sb.data, sb.size), 0);
  msgpack_sbuffer_destroy(&sb);
  /* replies are coming and this client reads none: each is 2 MiB, more
   * than the socket holds, so the daemon has one it cannot finish writing */
  cr_assert_eq(fp4idx_test_wait_unread(fd, 65536, 10000), 0, "no reply arrived");
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGTERM), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 500), -1, "waits for the unread replies");
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGTERM), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 10000), 0, "second signal: prompt, clean exit");
  cr_assert(log_contains(&d, "without flushing"));
  struct stat st;
  cr_assert_neq(stat(d.sock, &st), 0);
  close(fd);
  free(keys);
  fp4idx_test_daemon_stop(&d);
}

/* How many threads of pid are named `name` (/proc/PID/task/TID/comm). */
static int threads_named(pid_t pid, const char *name) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  cr_assert_not_null(dir, "%s", path);
  int n = 0;
  for (struct dirent *e; (e = readdir(dir));) {
    if (e->d_name[0] == '.') continue;
    char p[128], comm[32] = "";
    snprintf(p, sizeof p, "%s/%.24s/comm", path, e->d_name);
    FILE *f = fopen(p, "r");
    if (f && fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
    if (f) fclose(f);
    n += strcmp(comm, name) == 0;
  }
  closedir(dir);
  return n;
}

/* The daemon's threads say what they are (top -H, ps -L, a benchmark's
 * per-thread CPU): one worker, each I/O loop past the main one. */
Test(daemon_lifecycle, threads_are_named) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--io-threads", "3", NULL}), 0);
  /* The socket accepts as soon as it listens; a reply says the main loop
   * runs, and the worker and the other loops start (named) before it. */
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  close(fd);
  cr_expect_eq(threads_named(d.pid, "fp4idx-worker"), 1);
  cr_expect_eq(threads_named(d.pid, "fp4idx-io1"), 1);
  cr_expect_eq(threads_named(d.pid, "fp4idx-io2"), 1);
  cr_expect_eq(threads_named(d.pid, "fp4idx-io3"), 0, "three loops: the main one, io1, io2");
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}
