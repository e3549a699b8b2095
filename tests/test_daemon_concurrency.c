/* test_daemon_concurrency.c -- many clients at once against the real daemon:
 * 16 threads appending to their own sequences and scoring give the same
 * bits as a sequential run; an acknowledged append is visible to the next
 * score of another client; a client that never reads does not stall others. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_format.h"

enum { NCLIENTS = 16, STEPS = 6, HEADS = 8, ROWS = 4 };

/* Dyadic value in [-2, 2] in steps of 1/8, from a counter hash. */
static uint16_t dy(uint64_t i, uint64_t seed) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ULL ^ seed * 0xD1B54A32D192ED03ULL;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 32;
  return fp4idx_f32_to_bf16((float)((int)(h % 33) - 16) / 8.0f);
}

static uint32_t chunk_size(int client, int step) { return 1 + (uint32_t)((client * 37 + step * 53) % 150); }

/* What one client does; results[step] = logits [ROWS, width] (+ topk). */
typedef struct client_s {
  const char *sock;
  int index;
  uint64_t seq;
  float *logits[STEPS];
  uint64_t width[STEPS];
  int32_t topk_pos[STEPS][ROWS * 8];
  float topk_val[STEPS][ROWS * 8];
  int failed;
  char why[256];
} client_t;

static int topk_call(int fd, uint64_t seq, const uint16_t *q, const uint16_t *w,
                     const int32_t *lens, int32_t *pos, float *val) {
  fp4idx_request_t req;
  fp4idx_score_seq_t s;
  if (fp4idx_test_score_request(&req, &s, seq * 100 + 1, seq, HEADS, 8, ROWS, q, w, lens))
    return -1;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  int rc = fp4idx_test_call(fd, &req, &resp, &body);
  if (rc == 0) rc = resp.status;
  if (rc == 0) {
    memcpy(pos, resp.u.score.results[0].positions.data, ROWS * 8 * 4);
    memcpy(val, resp.u.score.results[0].logits.data, ROWS * 8 * 4);
  }
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

/* Runs client c's script on connection fd, with sequence id c->seq. */
static void run_script(client_t *c, int fd) {
  uint64_t have = 0, kctr = 0;
  uint16_t *q = malloc(ROWS * HEADS * 128 * 2), *w = malloc(ROWS * HEADS * 2);
  for (int step = 0; step < STEPS && !c->failed; step++) {
    uint32_t n = chunk_size(c->index, step);
    uint16_t *keys = malloc((size_t)n * 128 * 2);
    for (size_t i = 0; i < (size_t)n * 128; i++) keys[i] = dy(kctr++, 1000 + (uint64_t)c->index);
    uint64_t first = 0, length = 0;
    int rc = fp4idx_test_append(fd, c->seq, FP4IDX_WIRE_BF16, n, keys, &first, &length);
    free(keys);
    if (rc || first != have || length != have + n) {
      c->failed = 1;
      snprintf(c->why, sizeof c->why, "append step %d: rc %d first %llu", step, rc,
               (unsigned long long)first);
      break;
    }
    have += n;
    for (int i = 0; i < ROWS * HEADS * 128; i++) q[i] = dy((uint64_t)i, 7000 + (uint64_t)(c->index * 10 + step));
    for (int i = 0; i < ROWS * HEADS; i++) w[i] = dy((uint64_t)i, 9000 + (uint64_t)(c->index * 10 + step));
    int32_t lens[ROWS] = {(int32_t)have, (int32_t)have - 1, (int32_t)(have / 2), 0};
    rc = fp4idx_test_score(fd, c->seq, HEADS, ROWS, q, w, lens, &c->logits[step], &c->width[step]);
    if (rc == 0) rc = topk_call(fd, c->seq, q, w, lens, c->topk_pos[step], c->topk_val[step]);
    if (rc || c->width[step] != have) {
      c->failed = 1;
      snprintf(c->why, sizeof c->why, "score step %d: rc %d width %llu, expected %llu", step, rc,
               (unsigned long long)c->width[step], (unsigned long long)have);
    }
  }
  free(q);
  free(w);
}

static void *client_main(void *arg) {
  client_t *c = arg;
  int fd = fp4idx_test_connect(c->sock);
  if (fd < 0) {
    c->failed = 1;
    snprintf(c->why, sizeof c->why, "connect failed");
    return NULL;
  }
  run_script(c, fd);
  close(fd);
  return NULL;
}

Test(daemon_concurrency, sixteen_clients_equal_a_sequential_run) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "64M", "--page-size", "16", NULL}), 0);
  static client_t par[NCLIENTS], seq[NCLIENTS];
  pthread_t th[NCLIENTS];
  for (int i = 0; i < NCLIENTS; i++) {
    memset(&par[i], 0, sizeof par[i]);
    par[i].sock = d.sock;
    par[i].index = i;
    par[i].seq = 100 + (uint64_t)i;
    cr_assert_eq(pthread_create(&th[i], NULL, client_main, &par[i]), 0);
  }
  for (int i = 0; i < NCLIENTS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < NCLIENTS; i++) cr_assert_not(par[i].failed, "client %d: %s", i, par[i].why);

  /* The same scripts one after another on one connection, other seq ids. */
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  for (int i = 0; i < NCLIENTS; i++) {
    memset(&seq[i], 0, sizeof seq[i]);
    seq[i].index = i;
    seq[i].seq = 5000 + (uint64_t)i;
    run_script(&seq[i], fd);
    cr_assert_not(seq[i].failed, "sequential %d: %s", i, seq[i].why);
  }
  for (int i = 0; i < NCLIENTS; i++) {
    for (int s = 0; s < STEPS; s++) {
      cr_assert_eq(par[i].width[s], seq[i].width[s]);
      cr_assert_eq(memcmp(par[i].logits[s], seq[i].logits[s], ROWS * par[i].width[s] * 4), 0,
                   "client %d step %d: logits differ from the sequential run", i, s);
      cr_assert_eq(memcmp(par[i].topk_pos[s], seq[i].topk_pos[s], sizeof par[i].topk_pos[s]), 0);
      cr_assert_eq(memcmp(par[i].topk_val[s], seq[i].topk_val[s], sizeof par[i].topk_val[s]), 0);
      free(par[i].logits[s]);
      free(seq[i].logits[s]);
    }
  }
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  cr_assert_eq(info.sequences, 2 * NCLIENTS);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* A appends and gets the ack; B's very next score sees the keys. */
Test(daemon_concurrency, acknowledged_append_visible_to_other_client) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "8M", NULL}), 0);
  int a = fp4idx_test_connect(d.sock), b = fp4idx_test_connect(d.sock);
  cr_assert(a >= 0 && b >= 0);
  uint16_t key[128], q[128], w[1] = {fp4idx_f32_to_bf16(1.0f)};
  for (int i = 0; i < 128; i++) q[i] = fp4idx_f32_to_bf16(1.0f);
  for (int i = 0; i < 200; i++) {
    for (int j = 0; j < 128; j++) key[j] = fp4idx_f32_to_bf16((float)(i % 4));
    uint64_t length = 0;
    cr_assert_eq(fp4idx_test_append(a, 42, FP4IDX_WIRE_BF16, 1, key, NULL, &length), 0);
    float *logits = NULL;
    uint64_t width = 0;
    cr_assert_eq(fp4idx_test_score(b, 42, 1, 1, q, w, NULL, &logits, &width), 0);
    cr_assert_eq(width, length, "score after the ack sees every key");
    /* the last key is all i%4 (exact in FP4): dot with ones = 128 * that */
    cr_assert_eq(logits[width - 1], 128.0f * (float)(i % 4));
    free(logits);
  }
  close(a);
  close(b);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

static long rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long v = -1;
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &v) == 1) break;
  fclose(f);
  return v;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A client pipelines thousands of big reads and never reads the answers:
 * the daemon stops reading from it, other clients are served promptly, and
 * the daemon's memory stays bounded. */
Test(daemon_concurrency, slow_reader_does_not_harm_others) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "16M", NULL}), 0);
  int slow = fp4idx_test_connect(d.sock), other = fp4idx_test_connect(d.sock);
  cr_assert(slow >= 0 && other >= 0);
  enum { N = 4096 };
  uint16_t *keys = calloc((size_t)N * 128, 2);
  for (size_t i = 0; i < (size_t)N * 128; i++) keys[i] = dy(i, 5);
  cr_assert_eq(fp4idx_test_append(other, 1, FP4IDX_WIRE_BF16, N, keys, NULL, NULL), 0);
  /* Each read answer is 4096 * 512 B = 2 MiB dequantized; 3000 of them
   * would be 6 GiB if the daemon buffered them all. */
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  for (int i = 0; i < 3000; i++) {
    fp4idx_request_t req;
    memset(&req, 0, sizeof req);
    req.id = (uint64_t)i + 1;
    req.op = FP4IDX_OP_READ;
    req.u.read.seq = 1;
    req.u.read.dequant = true;
    cr_assert_eq(fp4idx_encode_request(&sb, &req), 0);
  }
  int fl = fcntl(slow, F_GETFL);
  fcntl(slow, F_SETFL, fl | O_NONBLOCK);
  size_t off = 0;
  double t_end = now_s() + 3.0;
  while (off < sb.size && now_s() < t_end) {
    ssize_t k = send(slow, sb.data + off, sb.size - off, MSG_NOSIGNAL);
    if (k > 0) off += (size_t)k;
    else usleep(1000);
  }
  msgpack_sbuffer_destroy(&sb);
  /* The other client gets quick answers meanwhile. */
  for (int i = 0; i < 20; i++) {
    double t0 = now_s();
    fp4idx_info_t info;
    cr_assert_eq(fp4idx_test_info(other, &info), 0);
    cr_assert_lt(now_s() - t0, 2.0, "info took %.3f s behind a slow reader", now_s() - t0);
    usleep(20000);
  }
  long rss = rss_kib(d.pid);
  cr_log_info("daemon RSS with a stalled reader: %ld KiB", rss);
  cr_assert_gt(rss, 0);
  cr_assert_lt(rss, 600 * 1024, "daemon RSS %ld KiB: output to a slow reader is not capped", rss);
  close(slow); /* never read a byte */
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(other, &info), 0);
  close(other);
  free(keys);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}
