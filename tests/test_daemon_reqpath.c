/* test_daemon_reqpath.c -- the request path of the real daemon (CPU
 * backend): score requests from many connections at once give the same
 * bytes as the same requests sent one at a time (whatever the daemon
 * batches); an append pipelined behind a score on one connection is not
 * seen by that score and is seen by the next; a client that disconnects
 * with requests in flight harms no other request; the per-stage times of
 * "stats" add up to the op latencies. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

#include "daemon_harness.h"
#include "fp4idx_format.h"

enum { HEADS = 8, ROWS = 3, NSEQ = 6, KEYS = 300, NCONN = 12, PER_CONN = 6 };

static uint16_t dy(uint64_t i, uint64_t seed) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ULL ^ seed * 0xD1B54A32D192ED03ULL;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 32;
  return fp4idx_f32_to_bf16((float)((int)(h % 33) - 16) / 8.0f);
}

static void fill(uint16_t *v, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) v[i] = dy(i, seed);
}

/* One encoded score request frame (header included) into *out. Request j
 * of connection c: sequence, heads, topk, lens vary with (c, j). */
typedef struct frame_s {
  char *data;
  size_t len;
} frame_t;

/* req encoded as one frame (header included); free(f.data). */
static frame_t frame_of(const fp4idx_request_t *req) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_request(&sb, req), 0);
  return (frame_t){sb.data, sb.size};
}

static frame_t score_frame(uint64_t id, uint64_t seq, uint32_t heads, uint32_t topk,
                           uint32_t rows, const int32_t *lens, uint64_t seed) {
  uint16_t *q = malloc((size_t)rows * heads * 128 * 2), *w = malloc((size_t)rows * heads * 2);
  fill(q, (size_t)rows * heads * 128, seed);
  fill(w, (size_t)rows * heads, seed + 1);
  fp4idx_request_t req;
  fp4idx_score_seq_t s;
  cr_assert_eq(fp4idx_test_score_request(&req, &s, id, seq, heads, topk, rows, q, w, lens), 0);
  frame_t f = frame_of(&req);
  free(q);
  free(w);
  return f;
}

static frame_t append_frame(uint64_t id, uint64_t seq, uint64_t n, uint64_t seed) {
  uint16_t *k = malloc((size_t)n * 128 * 2);
  fill(k, (size_t)n * 128, seed);
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.id = id;
  req.op = FP4IDX_OP_APPEND;
  req.u.append.seq = seq;
  uint64_t shp[2] = {n, 128};
  fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_BF16, 2, shp, k);
  frame_t f = frame_of(&req);
  free(k);
  return f;
}

static void load_seqs(int fd) {
  for (uint64_t s = 1; s <= NSEQ; s++) {
    uint64_t n = KEYS + 17 * s;
    uint16_t *k = malloc((size_t)n * 128 * 2);
    fill(k, (size_t)n * 128, 500 + s);
    cr_assert_eq(fp4idx_test_append(fd, s, FP4IDX_WIRE_BF16, n, k, NULL, NULL), 0);
    free(k);
  }
}

/* A read of all of sequence seq, dequantized (f32 [n,128]): on either
 * backend the worker spends milliseconds on it, alone (a read is no score,
 * so no queued score joins its run). */
static frame_t read_frame(uint64_t id, uint64_t seq) {
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.id = id;
  req.op = FP4IDX_OP_READ;
  req.u.read.seq = seq;
  req.u.read.dequant = true;
  return frame_of(&req);
}

/* Sequence 9 with n keys, appended in requests of 8,192: a score of it
 * (64 heads, 8 rows) holds the worker while other requests queue. */
static void load_big(int fd, int n) {
  uint16_t *k = malloc((size_t)n * 128 * 2);
  fill(k, (size_t)n * 128, 5);
  for (int i = 0; i < n; i += 8192)
    cr_assert_eq(fp4idx_test_append(fd, 9, FP4IDX_WIRE_BF16, n - i < 8192 ? n - i : 8192,
                                    k + (size_t)i * 128, NULL, NULL), 0);
  free(k);
}

/* The request j of connection c (deterministic). */
static frame_t conn_request(int c, int j) {
  uint64_t seq = 1 + (uint64_t)((c + j) % NSEQ);
  uint32_t heads = (c + j) % 4 == 3 ? 4 : HEADS; /* a second head count */
  uint32_t topk = (uint32_t)((c * 7 + j) % 3 == 0 ? 0 : 5 + (c + j) % 40);
  int32_t lens[ROWS] = {(int32_t)(KEYS - c), (int32_t)(KEYS / 2 + j), 0};
  return score_frame((uint64_t)(1000 * c + j + 1), seq, heads, topk, ROWS,
                     (c + j) % 2 ? lens : NULL, (uint64_t)(c * 100 + j));
}

/* 1 when the daemon's log holds `what`. */
static int log_has(const fp4idx_test_daemon_t *d, const char *what) {
  FILE *f = fopen(d->log, "r");
  char line[512];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, what) != NULL;
  if (f) fclose(f);
  return found;
}

/* All PER_CONN requests of connection c, back to back, into *all (init'd
 * here; msgpack_sbuffer_destroy it). */
static void conn_requests(int c, msgpack_sbuffer *all) {
  msgpack_sbuffer_init(all);
  for (int j = 0; j < PER_CONN; j++) {
    frame_t f = conn_request(c, j);
    msgpack_sbuffer_write(all, f.data, f.len);
    free(f.data);
  }
}

typedef struct conn_run_s {
  const char *sock;
  int c;
  unsigned char *resp[PER_CONN];
  size_t len[PER_CONN];
  int failed;
} conn_run_t;

/* Sends all PER_CONN requests of connection c in one write (pipelined), then
 * reads the responses. */
static void *conn_main(void *arg) {
  conn_run_t *r = arg;
  int fd = fp4idx_test_connect(r->sock);
  if (fd < 0) {
    r->failed = 1;
    return NULL;
  }
  msgpack_sbuffer all;
  conn_requests(r->c, &all);
  if (fp4idx_test_send_all(fd, all.data, all.size)) r->failed = 1;
  for (int j = 0; j < PER_CONN && !r->failed; j++)
    if (fp4idx_test_recv_frame(fd, &r->resp[j], &r->len[j])) r->failed = 1;
  msgpack_sbuffer_destroy(&all);
  close(fd);
  return NULL;
}

Test(reqpath, concurrent_scores_give_the_bytes_of_one_at_a_time) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "32M", "--page-size", "16", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  load_seqs(fd);
  static conn_run_t runs[NCONN];
  pthread_t th[NCONN];
  for (int c = 0; c < NCONN; c++) {
    memset(&runs[c], 0, sizeof runs[c]);
    runs[c].sock = d.sock;
    runs[c].c = c;
    cr_assert_eq(pthread_create(&th[c], NULL, conn_main, &runs[c]), 0);
  }
  for (int c = 0; c < NCONN; c++) pthread_join(th[c], NULL);
  /* Now each request alone, on one connection, one round trip at a time. */
  for (int c = 0; c < NCONN; c++) {
    cr_assert_not(runs[c].failed, "connection %d failed", c);
    for (int j = 0; j < PER_CONN; j++) {
      frame_t f = conn_request(c, j);
      unsigned char *body = NULL;
      size_t len = 0;
      cr_assert_eq(fp4idx_test_send_all(fd, f.data, f.len), 0);
      cr_assert_eq(fp4idx_test_recv_frame(fd, &body, &len), 0);
      cr_assert_eq(len, runs[c].len[j], "conn %d request %d: %zu bytes vs %zu", c, j,
                   runs[c].len[j], len);
      cr_assert(memcmp(body, runs[c].resp[j], len) == 0, "conn %d request %d: bytes differ", c,
                j);
      /* and it is a success, not the same error twice */
      fp4idx_response_t resp;
      cr_assert_eq(fp4idx_decode_response(body, len, FP4IDX_OP_SCORE, &resp, NULL, 0), 0);
      cr_assert_eq(resp.status, 0, "conn %d request %d: %s", c, j, resp.error);
      cr_assert_eq(resp.id, (uint64_t)(1000 * c + j + 1));
      fp4idx_response_clear(&resp);
      free(body);
      free(f.data);
      free(runs[c].resp[j]);
    }
  }
  /* and the daemon did batch (its debug log says so per launch) */
  cr_expect(log_has(&d, "one launch for "), "no score launch took more than one request");
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* Width of a decoded full-logits response (or -1). */
static int64_t resp_width(const unsigned char *body, size_t len) {
  fp4idx_response_t r;
  if (fp4idx_decode_response(body, len, FP4IDX_OP_SCORE, &r, NULL, 0) || r.status) return -1;
  int64_t w = (int64_t)r.u.score.results[0].logits.shape[1];
  fp4idx_response_clear(&r);
  return w;
}

Test(reqpath, pipelined_append_is_seen_by_the_next_score_only) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "32M", "--page-size", "16", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  load_seqs(fd);
  /* Other connections keep scoring sequence 2 meanwhile, so that the
   * daemon has scores of the same head count queued to batch with. */
  static conn_run_t runs[4];
  pthread_t th[4];
  for (int round = 0; round < 5; round++) {
    for (int c = 0; c < 4; c++) {
      memset(&runs[c], 0, sizeof runs[c]);
      runs[c].sock = d.sock;
      runs[c].c = c;
      cr_assert_eq(pthread_create(&th[c], NULL, conn_main, &runs[c]), 0);
    }
    uint64_t before = KEYS + 17 * 2 + (uint64_t)round * 20;
    /* score, append 20, score, in one write: nothing read in between */
    frame_t a = score_frame(1, 2, HEADS, 0, ROWS, NULL, 77);
    frame_t b = append_frame(2, 2, 20, 900 + (uint64_t)round);
    frame_t e = score_frame(3, 2, HEADS, 0, ROWS, NULL, 77);
    msgpack_sbuffer all;
    msgpack_sbuffer_init(&all);
    msgpack_sbuffer_write(&all, a.data, a.len);
    msgpack_sbuffer_write(&all, b.data, b.len);
    msgpack_sbuffer_write(&all, e.data, e.len);
    cr_assert_eq(fp4idx_test_send_all(fd, all.data, all.size), 0);
    unsigned char *r1, *r2, *r3;
    size_t l1, l2, l3;
    cr_assert_eq(fp4idx_test_recv_frame(fd, &r1, &l1), 0);
    cr_assert_eq(fp4idx_test_recv_frame(fd, &r2, &l2), 0);
    cr_assert_eq(fp4idx_test_recv_frame(fd, &r3, &l3), 0);
    cr_assert_eq(resp_width(r1, l1), (int64_t)before, "round %d: first score sees %lld keys",
                 round, (long long)resp_width(r1, l1));
    fp4idx_response_t ar;
    cr_assert_eq(fp4idx_decode_response(r2, l2, FP4IDX_OP_APPEND, &ar, NULL, 0), 0);
    cr_assert_eq(ar.status, 0);
    cr_assert_eq(ar.u.append.first, before);
    fp4idx_response_clear(&ar);
    cr_assert_eq(resp_width(r3, l3), (int64_t)before + 20, "round %d: second score", round);
    free(r1), free(r2), free(r3);
    free(a.data), free(b.data), free(e.data);
    msgpack_sbuffer_destroy(&all);
    for (int c = 0; c < 4; c++) {
      pthread_join(th[c], NULL);
      cr_assert_not(runs[c].failed);
      for (int j = 0; j < PER_CONN; j++) free(runs[c].resp[j]);
    }
  }
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* Connections that send requests and close at once, before any reply. */
static void *quitter_main(void *arg) {
  conn_run_t *r = arg;
  int fd = fp4idx_test_connect(r->sock);
  if (fd < 0) return NULL;
  msgpack_sbuffer all;
  conn_requests(r->c, &all);
  fp4idx_test_send_all(fd, all.data, all.size);
  msgpack_sbuffer_destroy(&all);
  close(fd);
  return NULL;
}

/* Clients that send and leave at once, beside clients that read, over
 * io_threads I/O loops: every reader gets the bytes of one at a time. */
static void leaving_mid_batch(const char *io_threads) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "32M", "--page-size",
                                                             "16", "--io-threads", io_threads,
                                                             NULL}),
               0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  load_seqs(fd);
  /* The reference answers, one at a time. */
  static unsigned char *want[NCONN][PER_CONN];
  static size_t want_len[NCONN][PER_CONN];
  for (int c = 0; c < NCONN; c += 2)
    for (int j = 0; j < PER_CONN; j++) {
      frame_t f = conn_request(c, j);
      cr_assert_eq(fp4idx_test_send_all(fd, f.data, f.len), 0);
      cr_assert_eq(fp4idx_test_recv_frame(fd, &want[c][j], &want_len[c][j]), 0);
      free(f.data);
    }
  /* Even connections stay and read, odd ones send and leave. */
  static conn_run_t runs[NCONN];
  pthread_t th[NCONN];
  for (int round = 0; round < 3; round++) {
    for (int c = 0; c < NCONN; c++) {
      memset(&runs[c], 0, sizeof runs[c]);
      runs[c].sock = d.sock;
      runs[c].c = c;
      cr_assert_eq(pthread_create(&th[c], NULL, c % 2 ? quitter_main : conn_main, &runs[c]), 0);
    }
    for (int c = 0; c < NCONN; c++) pthread_join(th[c], NULL);
    for (int c = 0; c < NCONN; c += 2) {
      cr_assert_not(runs[c].failed, "round %d: connection %d", round, c);
      for (int j = 0; j < PER_CONN; j++) {
        cr_assert_eq(runs[c].len[j], want_len[c][j]);
        cr_assert(memcmp(runs[c].resp[j], want[c][j], want_len[c][j]) == 0,
                  "round %d: conn %d request %d differs", round, c, j);
        free(runs[c].resp[j]);
      }
    }
  }
  /* The daemon still answers, with the cache as it was. */
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  cr_assert_eq(info.sequences, (uint64_t)NSEQ);
  for (int c = 0; c < NCONN; c += 2)
    for (int j = 0; j < PER_CONN; j++) free(want[c][j]);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

Test(reqpath, a_client_leaving_mid_batch_harms_no_other) { leaving_mid_batch("1"); }

Test(reqpath, a_client_leaving_mid_batch_harms_no_other_on_four_io_loops) {
  leaving_mid_batch("4");
}

/* stats counters of op or stage `name` in a list (NULL if absent). */
static const fp4idx_op_stats_t *find(const fp4idx_op_stats_t *v, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(v[i].op, name) == 0) return &v[i];
  return NULL;
}

Test(reqpath, stats_stages_add_up_to_the_op_latency) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "32M", "--page-size", "16", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  load_seqs(fd);
  /* a mix: scores (full, top-k, two head counts), info, an error, a
   * truncate, pipelined from several connections too */
  for (int j = 0; j < PER_CONN; j++) {
    frame_t f = conn_request(3, j);
    unsigned char *body;
    size_t len;
    cr_assert_eq(fp4idx_test_send_all(fd, f.data, f.len), 0);
    cr_assert_eq(fp4idx_test_recv_frame(fd, &body, &len), 0);
    free(body);
    free(f.data);
  }
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  cr_assert_eq(fp4idx_test_drop(fd, 999), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_test_truncate(fd, 1, 10), 0);
  static conn_run_t runs[4];
  pthread_t th[4];
  for (int c = 0; c < 4; c++) {
    memset(&runs[c], 0, sizeof runs[c]);
    runs[c].sock = d.sock;
    runs[c].c = c + 4;
    cr_assert_eq(pthread_create(&th[c], NULL, conn_main, &runs[c]), 0);
  }
  for (int c = 0; c < 4; c++) {
    pthread_join(th[c], NULL);
    cr_assert_not(runs[c].failed);
    for (int j = 0; j < PER_CONN; j++) free(runs[c].resp[j]);
  }

  fp4idx_request_t req = {.id = 5, .op = FP4IDX_OP_STATS};
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0);
  const fp4idx_stats_t *st = &resp.u.stats;
  uint64_t n = 0;
  double lat = 0;
  for (size_t i = 0; i < st->nops; i++) {
    n += st->ops[i].count;
    lat += st->ops[i].sum_us;
  }
  /* NSEQ appends + 6 scores + info + drop + truncate + 4 x 6 scores */
  cr_assert_eq(n, (uint64_t)NSEQ + PER_CONN + 3 + 4 * PER_CONN);
  cr_assert_eq(st->nstages, 10u);
  static const char *const inside[] = {"queue", "decode", "execute", "upload",
                                       "kernels", "download", "encode"};
  double sum = 0;
  for (size_t i = 0; i < sizeof inside / sizeof inside[0]; i++) {
    const fp4idx_op_stats_t *g = find(st->stages, st->nstages, inside[i]);
    cr_assert_not_null(g, "stage %s missing", inside[i]);
    cr_expect_eq(g->count, n, "stage %s counted %llu of %llu requests", inside[i],
                 (unsigned long long)g->count, (unsigned long long)n);
    uint64_t h = 0;
    for (uint32_t b = 0; b < g->nbuckets; b++) h += g->hist[b];
    cr_expect_eq(h, g->count, "stage %s histogram", inside[i]);
    sum += g->sum_us;
  }
  /* Same clock readings at every boundary: equal up to rounding (1e-9
   * relative) -- 0.1% + 1 us is generous. */
  cr_expect(fabs(sum - lat) <= 1e-3 * lat + 1.0,
            "stages queue..encode sum to %.3f us, ops' latency to %.3f us", sum, lat);
  cr_expect_gt(find(st->stages, st->nstages, "kernels")->sum_us, 0.0,
               "the CPU scores count as kernels");
  cr_expect_eq(find(st->stages, st->nstages, "read")->count, n);
  /* every earlier response is booked by the loop, but one the worker sent
   * itself (daemon/direct_write.h) is booked when its request comes back
   * to the loop, which may be after this stats: at most the last one of
   * each of the 5 connections */
  const uint64_t wakes = find(st->stages, st->nstages, "wake")->count;
  cr_expect(wakes <= n && wakes + 5 >= n, "wake counted %llu of %llu requests",
            (unsigned long long)wakes, (unsigned long long)n);
  cr_expect_geq(find(st->stages, st->nstages, "write")->count + 5, n);
  fp4idx_response_clear(&resp);
  free(body);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* The "wake" stage of stats on connection fd: its count and its sum. */
static void wake_stage(int fd, uint64_t *count, double *sum) {
  fp4idx_request_t req = {.id = 77, .op = FP4IDX_OP_STATS};
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0);
  const fp4idx_op_stats_t *g = find(resp.u.stats.stages, resp.u.stats.nstages, "wake");
  cr_assert_not_null(g);
  *count = g->count;
  *sum = g->sum_us;
  fp4idx_response_clear(&resp);
  free(body);
}

/* info/hello/stats from an idle connection are answered by the event loop
 * itself: no worker hop, so their "wake" stage (worker done -> loop) is
 * recorded as exactly 0, and so is one through the worker that the worker
 * sends itself (nothing ahead of it on the connection). An info pipelined behind an append on one connection is
 * not answered early: it sees the append. And B's info is answered while
 * A's long scores are queued or running (no order is assumed between the
 * two connections: how long A's scores take depends on the host). */
Test(reqpath, short_requests_are_answered_on_the_loop) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "64M", NULL}), 0);
  int a = fp4idx_test_connect(d.sock), b = fp4idx_test_connect(d.sock);
  cr_assert(a >= 0 && b >= 0);
  enum { BIG = 30000 };
  uint16_t *k = malloc((size_t)BIG * 128 * 2);
  fill(k, (size_t)BIG * 128, 5);
  for (int i = 0; i < BIG; i += 8192)
    cr_assert_eq(fp4idx_test_append(a, 9, FP4IDX_WIRE_BF16, BIG - i < 8192 ? BIG - i : 8192,
                                    k + (size_t)i * 128, NULL, NULL), 0);
  free(k);
  /* A's last append was sent by the worker and is booked by A's loop when
   * it comes back, which with several I/O loops may be after B's stats
   * below: an info on A is answered once A is idle, i.e. once it is booked */
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(a, &info), 0);
  /* 20 infos from an idle B: 21 wake samples (with the first stats), all 0 */
  uint64_t n0, n1;
  double s0, s1;
  wake_stage(b, &n0, &s0);
  for (int i = 0; i < 20; i++) cr_assert_eq(fp4idx_test_info(b, &info), 0);
  wake_stage(b, &n1, &s1);
  /* (at least: a sample of another connection could land in between) */
  cr_assert_geq(n1, n0 + 21, "wake samples %llu -> %llu", (unsigned long long)n0,
                (unsigned long long)n1);
  cr_assert_eq(s1, s0, "loop-answered requests added %.3f us of worker hand-off", s1 - s0);
  /* a request through the worker on an idle connection is sent by the
   * worker itself (daemon/direct_write.h): no hand-off to the loop either */
  uint64_t n2;
  double s2;
  cr_assert_eq(fp4idx_test_append(b, 11, FP4IDX_WIRE_BF16, 1, (uint16_t[128]){0}, NULL, NULL), 0);
  wake_stage(b, &n2, &s2);
  cr_assert_eq(n2, n1 + 2, "wake samples %llu -> %llu", (unsigned long long)n1,
               (unsigned long long)n2);
  cr_assert_eq(s2, s1, "the worker-sent append added %.3f us of hand-off", s2 - s1);
  /* A: two scores of 30,000 keys x 4 rows x 64 heads, pipelined; then B:
   * info, answered whatever A's scores are doing */
  msgpack_sbuffer all;
  msgpack_sbuffer_init(&all);
  for (int j = 0; j < 2; j++) {
    frame_t f = score_frame(10 + (uint64_t)j, 9, 64, 16, 4, NULL, 3);
    msgpack_sbuffer_write(&all, f.data, f.len);
    free(f.data);
  }
  cr_assert_eq(fp4idx_test_send_all(a, all.data, all.size), 0);
  msgpack_sbuffer_destroy(&all);
  cr_assert_eq(fp4idx_test_info(b, &info), 0);
  cr_assert_eq(info.sequences, 2u);
  for (int j = 0; j < 2; j++) {
    unsigned char *body;
    size_t len;
    cr_assert_eq(fp4idx_test_recv_frame(a, &body, &len), 0);
    free(body);
  }
  /* append + info in one write on B: the info counts the new sequence */
  frame_t ap = append_frame(50, 77, 3, 8);
  fp4idx_request_t ir = {.id = 51, .op = FP4IDX_OP_INFO};
  msgpack_sbuffer two;
  msgpack_sbuffer_init(&two);
  msgpack_sbuffer_write(&two, ap.data, ap.len);
  cr_assert_eq(fp4idx_encode_request(&two, &ir), 0);
  cr_assert_eq(fp4idx_test_send_all(b, two.data, two.size), 0);
  fp4idx_response_t r1, r2;
  unsigned char *b1, *b2;
  cr_assert_eq(fp4idx_test_recv_response(b, FP4IDX_OP_APPEND, &r1, &b1), 0);
  cr_assert_eq(fp4idx_test_recv_response(b, FP4IDX_OP_INFO, &r2, &b2), 0);
  cr_assert_eq(r1.status, 0);
  cr_assert_eq(r2.status, 0);
  cr_assert_eq(r2.u.info.sequences, 3u, "the pipelined info sees the append before it");
  fp4idx_response_clear(&r1);
  fp4idx_response_clear(&r2);
  free(b1), free(b2), free(ap.data);
  msgpack_sbuffer_destroy(&two);
  close(a);
  close(b);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* One append then scores (full logits and top-k) on a fresh daemon started
 * with `args`; the response bodies, concatenated, in *out. */
static size_t busy_run(const char **args, unsigned char **out) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, args), 0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  size_t n = 0;
  *out = NULL;
  for (int j = 0; j < 7; j++) {
    frame_t f = j == 0 ? append_frame(1, 5, 300, 9)
                       : score_frame(2 + (uint64_t)j, 5, 8, j % 2 ? 16 : 0, 3, NULL, (uint64_t)j);
    unsigned char *body = NULL;
    size_t len = 0;
    cr_assert_eq(fp4idx_test_send_all(fd, f.data, f.len), 0);
    cr_assert_eq(fp4idx_test_recv_frame(fd, &body, &len), 0);
    *out = realloc(*out, n + len);
    memcpy(*out + n, body, len);
    n += len;
    free(body);
    free(f.data);
  }
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  cr_assert_eq(info.sequences, 1u);
  close(fd);
  /* the polling loop still stops on SIGTERM once its window has passed */
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  return n;
}

/* --busy-poll-us changes when the loop and the worker sleep, nothing else:
 * the same requests give the same bytes with it on and off, and the daemon
 * stops cleanly with it on. */
Test(reqpath, busy_polling_gives_the_same_bytes) {
  unsigned char *a, *b;
  size_t na = busy_run((const char *[]){"--cache-bytes", "8M", "--busy-poll-us", "0", NULL}, &a);
  size_t nb =
      busy_run((const char *[]){"--cache-bytes", "8M", "--busy-poll-us", "100000", NULL}, &b);
  cr_assert_eq(na, nb);
  cr_assert(memcmp(a, b, na) == 0, "busy polling changed a reply");
  free(a);
  free(b);
}

/* Many clients, half scoring and half appending at the same moment (decode
 * steps of different sequences), each get the right reply, however many
 * runs of scores one worker batch holds: connection C's long score holds
 * the worker while the others' requests queue score, append, score, ...,
 * so they run as one batch of NC/2 score runs (each run's launch used to
 * stay out until the batch ended: the engine's 16 calls ran out and the
 * later scores got ENOMEM). */
Test(reqpath, many_score_runs_in_one_batch_all_answered) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "64M", NULL}), 0);
  enum { BIG = 30000, NC = 48, STEPS = 2 };
  int cfd = fp4idx_test_connect(d.sock), fd[NC];
  cr_assert_geq(cfd, 0);
  load_big(cfd, BIG);
  for (int c = 0; c < NC; c++) {
    fd[c] = fp4idx_test_connect(d.sock);
    cr_assert_geq(fd[c], 0);
    cr_assert_eq(fp4idx_test_append(fd[c], 20 + (uint64_t)c, FP4IDX_WIRE_BF16, 2,
                                    (uint16_t[256]){0}, NULL, NULL), 0);
  }
  for (int step = 0; step < STEPS; step++) {
    frame_t big = score_frame(5, 9, 64, 0, 8, NULL, 3); /* holds the worker */
    cr_assert_eq(fp4idx_test_send_all(cfd, big.data, big.len), 0);
    free(big.data);
    for (int c = 0; c < NC; c++) { /* even: score, odd: append */
      frame_t f = c % 2 ? append_frame(101, 20 + (uint64_t)c, 3, (uint64_t)c)
                        : score_frame(100, 20 + (uint64_t)c, 8, 0, 2, NULL, (uint64_t)c);
      cr_assert_eq(fp4idx_test_send_all(fd[c], f.data, f.len), 0);
      free(f.data);
    }
    for (int c = 0; c < NC; c++) {
      unsigned char *body;
      size_t len;
      fp4idx_response_t r;
      cr_assert_eq(fp4idx_test_recv_frame(fd[c], &body, &len), 0);
      cr_assert_eq(fp4idx_decode_response(body, len, c % 2 ? FP4IDX_OP_APPEND : FP4IDX_OP_SCORE,
                                          &r, NULL, 0), 0);
      cr_assert_eq(r.status, 0, "step %d connection %d: %s", step, c, r.error);
      if (c % 2 == 0)
        cr_assert_eq(r.u.score.results[0].logits.shape[1], 2u, "connection %d: width", c);
      else
        cr_assert_eq(r.u.append.length, 2u + 3u * (uint64_t)(step + 1), "connection %d", c);
      fp4idx_response_clear(&r);
      free(body);
    }
    unsigned char *body;
    size_t len;
    cr_assert_eq(fp4idx_test_recv_frame(cfd, &body, &len), 0);
    free(body);
  }
  for (int c = 0; c < NC; c++) close(fd[c]);
  close(cfd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* The daemon's stats queue_depth: requests handed to the worker and not
 * yet begun (stats from an idle connection is answered by the loop, so
 * this answers while the worker is held). */
static uint64_t queue_depth(int fd) {
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_STATS;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0, "%s", resp.error);
  uint64_t n = resp.u.stats.queue_depth;
  fp4idx_response_clear(&resp);
  free(body);
  return n;
}

/* One byte through the FIFO at path (tests/fp4idxd_hold.c). */
static void fifo_byte(const char *path, int write_it) {
  int fd = open(path, write_it ? O_WRONLY : O_RDONLY);
  cr_assert_geq(fd, 0, "%s", path);
  char b = 'h';
  cr_assert_eq(write_it ? write(fd, &b, 1) : read(fd, &b, 1), 1, "%s", path);
  close(fd);
}

/* A run of queued scores, each checked just before its launch takes it
 * and answered as soon as that launch is collected (score.h): every reply
 * is the one the request gets alone, a bad request among them fails alone,
 * and the valid ones went to the device as one launch. The worker is held
 * (fp4idxd-hold: its first backend read waits for the test) while the
 * scores queue behind it; the test sees the worker inside the read, sends
 * the scores, sees all of them queued (stats), then lets the worker go: the
 * order of events is the test's, whatever the scheduler does. */
static void queued_run(const char *io_threads) {
  fp4idx_test_daemon_t d;
  setenv("FP4IDXD", FP4IDXD_HOLD_PATH, 1);
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "64M",
                                                             "--io-threads", io_threads, NULL}),
               0);
  unsetenv("FP4IDXD");
  /* the hold's FIFOs (opened by the daemon at its first read) */
  char held[sizeof d.sock + 16], release[sizeof d.sock + 16];
  snprintf(held, sizeof held, "%s.held", d.sock);
  snprintf(release, sizeof release, "%s.release", d.sock);
  cr_assert_eq(mkfifo(held, 0600), 0);
  cr_assert_eq(mkfifo(release, 0600), 0);
  /* the hold reads BIG keys: a reply small enough to leave in one send */
  enum { BIG = 8, NC = 11, BAD = 4 };
  int cfd = fp4idx_test_connect(d.sock), qfd = fp4idx_test_connect(d.sock), fd[NC];
  cr_assert_geq(cfd, 0);
  cr_assert_geq(qfd, 0);
  load_big(cfd, BIG);
  load_seqs(cfd);
  for (int c = 0; c < NC; c++) {
    fd[c] = fp4idx_test_connect(d.sock);
    cr_assert_geq(fd[c], 0);
  }
  /* request c: sequence 1 + c % NSEQ, same heads and top-k for all (one
   * group); BAD names a sequence that does not exist */
  frame_t f[NC];
  for (int c = 0; c < NC; c++)
    f[c] = score_frame(200 + (uint64_t)c, c == BAD ? 777 : 1 + (uint64_t)(c % NSEQ), HEADS, 7,
                       ROWS, NULL, 40 + (uint64_t)c);
  /* The hold: a read, which no score joins; the worker is inside it once
   * the held byte comes. */
  frame_t hold = read_frame(5, 9);
  cr_assert_eq(fp4idx_test_send_all(cfd, hold.data, hold.len), 0);
  free(hold.data);
  fifo_byte(held, 0);
  for (int c = 0; c < NC; c++) cr_assert_eq(fp4idx_test_send_all(fd[c], f[c].data, f[c].len), 0);
  /* every score handed to the worker, none begun (the worker is held) */
  uint64_t q;
  while ((q = queue_depth(qfd)) < NC) cr_assert_leq(q, (uint64_t)NC);
  uint64_t wakes0, wakes1;
  double wake0, wake1;
  wake_stage(qfd, &wakes0, &wake0);
  fifo_byte(release, 1);
  unsigned char *body[NC];
  size_t len[NC];
  for (int c = 0; c < NC; c++) cr_assert_eq(fp4idx_test_recv_frame(fd[c], &body[c], &len[c]), 0);
  unsigned char *bb;
  size_t bl;
  cr_assert_eq(fp4idx_test_recv_frame(cfd, &bb, &bl), 0);
  free(bb);
  /* Who wrote the launch's replies: with one loop the worker (a wake of
   * exactly 0 each), with four the loops (each waking takes time). */
  wake_stage(qfd, &wakes1, &wake1);
  if (strcmp(io_threads, "1") == 0)
    cr_expect_eq(wake1, wake0, "one loop: %llu replies waited %.3f us for the loop", (unsigned long long)(wakes1 - wakes0), wake1 - wake0);
  else
    cr_expect_gt(wake1, wake0, "four loops: every reply was sent by the worker");
  /* each alone, one round trip at a time */
  for (int c = 0; c < NC; c++) {
    unsigned char *one;
    size_t n1;
    cr_assert_eq(fp4idx_test_send_all(cfd, f[c].data, f[c].len), 0);
    cr_assert_eq(fp4idx_test_recv_frame(cfd, &one, &n1), 0);
    fp4idx_response_t r;
    cr_assert_eq(fp4idx_decode_response(body[c], len[c], FP4IDX_OP_SCORE, &r, NULL, 0), 0);
    if (c == BAD)
      cr_assert_eq(r.status, FP4IDX_ENOSEQ, "request %d: %s", c, r.error);
    else
      cr_assert_eq(r.status, 0, "request %d: %s", c, r.error);
    fp4idx_response_clear(&r);
    cr_assert_eq(n1, len[c], "request %d: %zu bytes batched, %zu alone", c, len[c], n1);
    cr_assert(memcmp(one, body[c], n1) == 0, "request %d: bytes differ", c);
    free(one);
    free(body[c]);
    free(f[c].data);
  }
  /* 10 valid of 11 queued, one launch */
  cr_assert(log_has(&d, "one launch for 10 score requests"), "the 10 valid ones were not one launch");
  for (int c = 0; c < NC; c++) close(fd[c]);
  close(qfd);
  close(cfd);
  unlink(held);
  unlink(release);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

Test(reqpath, a_run_of_queued_scores_is_one_launch_a_bad_one_alone) { queued_run("1"); }

/* The same with the 11 connections spread over four I/O loops: the replies
 * of a launch of several requests are written by the loops that own their
 * connections (batch.c), not by the worker. */
Test(reqpath, a_run_of_queued_scores_on_four_io_loops_is_answered_by_their_loops) {
  queued_run("4");
}

/* Client c's STEPS appends and scores, back to back, on sequence 700 + c
 * (every third append carries a NaN: refused whole). */
enum { NC64 = 64, STEPS = 6, ADD = 3 };
static void send_steps(int fd, int c) {
  msgpack_sbuffer all;
  msgpack_sbuffer_init(&all);
  for (int j = 0; j < STEPS; j++) {
    uint64_t seq = 700 + (uint64_t)c, id = 10000u * (uint64_t)c + 2u * (uint64_t)j;
    frame_t a = append_frame(id + 1, seq, ADD, (uint64_t)(c * 31 + j));
    if (j % 3 == 2) { /* a NaN in the first key: refused whole */
      fp4idx_request_t req;
      uint16_t k[ADD * 128];
      fill(k, ADD * 128, (uint64_t)j);
      k[5] = 0x7FC0;
      memset(&req, 0, sizeof req);
      req.id = id + 1;
      req.op = FP4IDX_OP_APPEND;
      req.u.append.seq = seq;
      uint64_t shp[2] = {ADD, 128};
      fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_BF16, 2, shp, k);
      free(a.data);
      a = frame_of(&req);
    }
    frame_t sc = score_frame(id + 2, seq, (c % 2) ? 4 : HEADS, (c % 3) ? 0 : 2, 1, NULL,
                             (uint64_t)j);
    msgpack_sbuffer_write(&all, a.data, a.len);
    msgpack_sbuffer_write(&all, sc.data, sc.len);
    free(a.data);
    free(sc.data);
  }
  cr_assert_eq(fp4idx_test_send_all(fd, all.data, all.size), 0);
  msgpack_sbuffer_destroy(&all);
}

/* Reads client c's replies of steps [from, to), checking each: its order
 * (ids), the append's status and length, the score's width (exactly the
 * appends before it: all or nothing). *have: keys appended so far. With
 * until_eof the daemon may close after any reply (a stop answers what it
 * received: a frame not yet read is not); returns the steps read whole;
 * else every reply is required. */
static int recv_steps(int fd, int c, int from, int to, uint64_t *have, int until_eof) {
  int j = from;
  for (; j < to; j++) {
    uint64_t id = 10000u * (uint64_t)c + 2u * (uint64_t)j;
    unsigned char *body;
    size_t len;
    fp4idx_response_t r;
    if (until_eof && fp4idx_test_recv_frame(fd, &body, &len) != 0) break;
    if (!until_eof) cr_assert_eq(fp4idx_test_recv_frame(fd, &body, &len), 0);
    cr_assert_eq(fp4idx_decode_response(body, len, FP4IDX_OP_APPEND, &r, NULL, 0), 0);
    cr_assert_eq(r.id, id + 1, "client %d step %d: reply out of order", c, j);
    if (j % 3 == 2) {
      cr_assert_eq(r.status, FP4IDX_ENONFINITE, "client %d step %d: %s", c, j, r.error);
    } else {
      cr_assert_eq(r.status, 0, "client %d step %d: %s", c, j, r.error);
      *have += ADD;
      cr_assert_eq(r.u.append.length, *have, "client %d step %d", c, j);
    }
    fp4idx_response_clear(&r);
    free(body);
    if (until_eof && fp4idx_test_recv_frame(fd, &body, &len) != 0) break;
    if (!until_eof) cr_assert_eq(fp4idx_test_recv_frame(fd, &body, &len), 0);
    cr_assert_eq(fp4idx_decode_response(body, len, FP4IDX_OP_SCORE, &r, NULL, 0), 0);
    cr_assert_eq(r.id, id + 2, "client %d step %d: reply out of order", c, j);
    cr_assert_eq(r.status, 0, "client %d step %d: %s", c, j, r.error);
    uint64_t k = (c % 3) ? 0 : 2;
    if (k) {
      int32_t cnt = -1;
      cr_assert_eq(r.u.score.results[0].counts.shape[0], 1u);
      memcpy(&cnt, r.u.score.results[0].counts.data, sizeof cnt);
      cr_assert_eq((uint64_t)cnt, *have < k ? *have : k,
                   "client %d step %d: the score saw the wrong appends", c, j);
    } else
      cr_assert_eq(r.u.score.results[0].logits.shape[1], *have,
                   "client %d step %d: the score saw the wrong appends", c, j);
    fp4idx_response_clear(&r);
    free(body);
  }
  return j;
}

/* 64 clients pipeline at once, each on its own sequence: append, score,
 * append, score, ..., with every third append carrying a NaN key. Whatever
 * the daemon batches, and whichever I/O loop serves each connection, each
 * connection's replies come in its request order (ids), every score sees
 * exactly the appends before it on its connection (its width), and a
 * refused append (ENONFINITE) changes nothing (all or nothing: the widths
 * after it stay as they were). */
static void sixty_four_clients(const char *io_threads) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(
                   &d, (const char *[]){"--cache-bytes", "64M", "--io-threads", io_threads, NULL}),
               0);
  int fd[NC64];
  for (int c = 0; c < NC64; c++) {
    fd[c] = fp4idx_test_connect(d.sock);
    cr_assert_geq(fd[c], 0);
  }
  /* every request of every client first, then every reply */
  for (int c = 0; c < NC64; c++) send_steps(fd[c], c);
  for (int c = 0; c < NC64; c++) {
    uint64_t have = 0;
    recv_steps(fd[c], c, 0, STEPS, &have, 0);
  }
  for (int c = 0; c < NC64; c++) close(fd[c]);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

Test(reqpath, sixty_four_clients_keep_their_order_and_all_or_nothing) {
  sixty_four_clients("1");
}

Test(reqpath, sixty_four_clients_on_four_io_loops_keep_their_order_and_all_or_nothing) {
  sixty_four_clients("4");
}

/* SIGTERM with 64 clients spread over 4 I/O loops, each with requests in
 * flight: every loop stops reading, answers what it received and closes.
 * Each client sees its replies in order, correct, whole pairs (append and
 * the score received with it), then the end; the daemon exits 0. Every
 * client has its first pair back before the signal, so every loop is busy
 * when it comes. */
Test(reqpath, sigterm_drains_every_io_loop) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(
                   &d, (const char *[]){"--cache-bytes", "64M", "--io-threads", "4", NULL}),
               0);
  int fd[NC64];
  uint64_t have[NC64] = {0};
  for (int c = 0; c < NC64; c++) {
    fd[c] = fp4idx_test_connect(d.sock);
    cr_assert_geq(fd[c], 0);
  }
  for (int c = 0; c < NC64; c++) send_steps(fd[c], c);
  for (int c = 0; c < NC64; c++) recv_steps(fd[c], c, 0, 1, &have[c], 0);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGTERM), 0);
  for (int c = 0; c < NC64; c++) {
    recv_steps(fd[c], c, 1, STEPS, &have[c], 1);
    cr_assert_eq(fp4idx_test_peer_closed(fd[c], 10000), 1, "client %d: not closed after the stop", c);
    close(fd[c]);
  }
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 10000), 0, "the daemon did not drain and exit 0");
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* Big frames (4 rows x 32 heads: a 33 kB body, which a read of the scratch
 * buffer holds whole and the daemon takes as the body in place) give the
 * same replies whether each comes alone, cut in two writes, four in one
 * write, or followed in the same write by a small request; the budget's
 * count is back where it was idle after each way. */
static void recv_same(int fd, unsigned char *const *want, const size_t *want_len, int n,
                      const char *way) {
  for (int i = 0; i < n; i++) {
    unsigned char *body;
    size_t len;
    cr_assert_eq(fp4idx_test_recv_frame(fd, &body, &len), 0, "%s: reply %d", way, i);
    cr_assert_eq(len, want_len[i], "%s: reply %d is %zu bytes, alone %zu", way, i, len,
                 want_len[i]);
    cr_assert_eq(memcmp(body, want[i], len), 0, "%s: reply %d differs from alone", way, i);
    free(body);
  }
}

/* The budget's count of held bytes (the stats request's own included). */
static uint64_t buffered(int fd) {
  uint64_t held = 0, peak = 0, budget = 0;
  cr_assert_eq(fp4idx_test_buffered(fd, &held, &peak, &budget), 0);
  return held;
}

static void buffered_is_back(int fd, uint64_t idle, const char *way) {
  uint64_t held = buffered(fd);
  cr_assert_eq(held, idle, "%s: %llu bytes counted as held, %llu idle", way,
               (unsigned long long)held, (unsigned long long)idle);
}

Test(reqpath, big_frames_give_the_same_bytes_however_they_arrive) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "64M", NULL}), 0);
  enum { NF = 4 };
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  load_seqs(fd);
  const uint64_t idle = buffered(fd);
  frame_t f[NF];
  unsigned char *want[NF + 1];
  size_t want_len[NF + 1];
  int32_t lens[4] = {KEYS, KEYS / 2, 7, 0};
  for (int i = 0; i < NF; i++) {
    f[i] = score_frame((uint64_t)(i + 1), 1 + (uint64_t)i, 32, i % 2 ? 16 : 0, 4,
                       i == 2 ? lens : NULL, 40 + (uint64_t)i);
    cr_assert_gt(f[i].len, 16384 + 4u, "frame %d is %zu bytes: not a big one", i, f[i].len);
    cr_assert_lt(f[i].len, 65536u, "frame %d is %zu bytes: over one read", i, f[i].len);
    cr_assert_eq(fp4idx_test_send_all(fd, f[i].data, f[i].len), 0);
    cr_assert_eq(fp4idx_test_recv_frame(fd, &want[i], &want_len[i]), 0);
  }
  fp4idx_request_t info;
  memset(&info, 0, sizeof info);
  info.id = 77;
  info.op = FP4IDX_OP_INFO;
  frame_t small = frame_of(&info);
  cr_assert_eq(fp4idx_test_send_all(fd, small.data, small.len), 0);
  cr_assert_eq(fp4idx_test_recv_frame(fd, &want[NF], &want_len[NF]), 0);
  buffered_is_back(fd, idle, "alone");
  /* cut in two writes: header and 1000 bytes, then the rest */
  for (int i = 0; i < NF; i++) {
    cr_assert_eq(fp4idx_test_send_all(fd, f[i].data, 1004), 0);
    cr_assert_eq(fp4idx_test_send_all(fd, f[i].data + 1004, f[i].len - 1004), 0);
    recv_same(fd, &want[i], &want_len[i], 1, "cut in two");
  }
  buffered_is_back(fd, idle, "cut in two");
  /* four in one write */
  size_t all_len = 0;
  for (int i = 0; i < NF; i++) all_len += f[i].len;
  char *all = malloc(all_len + small.len);
  cr_assert_not_null(all);
  size_t at = 0;
  for (int i = 0; i < NF; i++) memcpy(all + at, f[i].data, f[i].len), at += f[i].len;
  cr_assert_eq(fp4idx_test_send_all(fd, all, all_len), 0);
  recv_same(fd, want, want_len, NF, "four in one write");
  buffered_is_back(fd, idle, "four in one write");
  /* each followed by the small request in the same write */
  for (int i = 0; i < NF; i++) {
    memcpy(all, f[i].data, f[i].len);
    memcpy(all + f[i].len, small.data, small.len);
    cr_assert_eq(fp4idx_test_send_all(fd, all, f[i].len + small.len), 0);
    recv_same(fd, &want[i], &want_len[i], 1, "followed by a small one");
    recv_same(fd, &want[NF], &want_len[NF], 1, "the small one after a big one");
  }
  buffered_is_back(fd, idle, "followed by a small one");
  free(all);
  for (int i = 0; i <= NF; i++) free(want[i]);
  for (int i = 0; i < NF; i++) free(f[i].data);
  free(small.data);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}
