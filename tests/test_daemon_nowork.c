/* test_daemon_nowork.c -- fp4idxd-nowork (bench/fp4idxd_nowork.c, the daemon
 * with the benchmark-only no-work backend) answers every op it serves with
 * well-formed replies of the right shapes and values (bench/backend_nowork.h:
 * the cache of a daemon whose keys are all zero), through the real socket,
 * so that the benchmark binary does not rot. Behaviour only, no timing. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_format.h"

#ifndef FP4IDXD_NOWORK_PATH
#define FP4IDXD_NOWORK_PATH "fp4idxd-nowork"
#endif

enum { HEADS = 8, ROWS = 3 };

static fp4idx_test_daemon_t g_d;
static int g_fd = -1;

/* The binary: $FP4IDXD_NOWORK, else the build's (the harness spawns $FP4IDXD). */
static void use_nowork_binary(void) {
  const char *e = getenv("FP4IDXD_NOWORK");
  cr_assert_eq(setenv("FP4IDXD", e && *e ? e : FP4IDXD_NOWORK_PATH, 1), 0);
}

static void setup(void) {
  use_nowork_binary();
  const char *args[] = {"--backend", "nowork", "--cache-bytes", "8M", "--log-level", "debug",
                        NULL};
  cr_assert_eq(fp4idx_test_daemon_start_args(&g_d, args), 0);
  g_fd = fp4idx_test_connect(g_d.sock);
  cr_assert_geq(g_fd, 0);
}

static void teardown(void) {
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  cr_expect_eq(fp4idx_test_daemon_stop(&g_d), 0, "SIGTERM: exit 0");
}

/* n bf16 keys of pseudo-random finite values. */
static uint16_t *bf16_keys(uint64_t n, uint64_t seed) {
  uint16_t *k = malloc((size_t)n * 128 * 2);
  cr_assert_not_null(k);
  for (uint64_t i = 0; i < n * 128; i++)
    k[i] = fp4idx_f32_to_bf16((float)((int)((i * 7 + seed * 13) % 33) - 16) / 8.0f);
  return k;
}

static void append_bf16(uint64_t seq, uint64_t n, uint64_t want_first) {
  uint16_t *k = bf16_keys(n, seq);
  uint64_t first = 99, length = 0;
  cr_assert_eq(fp4idx_test_append(g_fd, seq, FP4IDX_WIRE_BF16, n, k, &first, &length), 0);
  cr_assert_eq(first, want_first);
  cr_assert_eq(length, want_first + n);
  free(k);
}

/* An aligned copy of a reply tensor's bytes (the views point into the
 * msgpack body, unaligned); free() it. */
static void *tensor_copy(const fp4idx_tensor_t *t) {
  void *p = malloc(t->nbytes ? t->nbytes : 1);
  cr_assert_not_null(p);
  if (t->nbytes) memcpy(p, t->data, t->nbytes);
  return p;
}

/* q, w for ROWS x HEADS (values do not matter to the no-work backend). */
static uint16_t g_q[ROWS * HEADS * 128], g_w[ROWS * HEADS];

static void fill_qw(void) {
  for (size_t i = 0; i < sizeof g_q / 2; i++) g_q[i] = fp4idx_f32_to_bf16(0.25f);
  for (size_t i = 0; i < sizeof g_w / 2; i++) g_w[i] = fp4idx_f32_to_bf16(1.0f);
}

Test(daemon_nowork, hello_info_stats_name_the_backend, .init = setup, .fini = teardown) {
  fp4idx_request_t rq = {.id = 1, .op = FP4IDX_OP_HELLO};
  rq.u.hello.version = FP4IDX_PROTOCOL_VERSION;
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(g_fd, &rq, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_eq(rs.id, 1u);
  cr_assert(strncmp(rs.u.hello.server, "fp4idxd", 7) == 0, "server '%s'", rs.u.hello.server);
  fp4idx_response_clear(&rs);
  free(body);

  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(g_fd, &info), 0);
  cr_assert_str_eq(info.backend, "nowork");
  cr_assert_eq(info.page_size, 64u);
  cr_assert_eq(info.pages_total, (8u << 20) / (64u * FP4IDX_PROTO_SLOT_BYTES));
  cr_assert_eq(info.pages_free, info.pages_total);
  cr_assert_eq(info.sequences, 0u);

  append_bf16(5, 10, 0);
  rq = (fp4idx_request_t){.id = 2, .op = FP4IDX_OP_STATS};
  cr_assert_eq(fp4idx_test_call(g_fd, &rq, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_str_eq(rs.u.stats.backend, "nowork");
  cr_assert_eq(rs.u.stats.sequences, 1u);
  cr_assert_eq(rs.u.stats.keys, 10u);
  /* the per-stage times the benchmark reads: all ten stages, by name */
  static const char *const stages[] = {"read", "queue", "decode", "execute", "upload",
                                       "kernels", "download", "encode", "wake", "write"};
  cr_assert_eq(rs.u.stats.nstages, 10u);
  for (int i = 0; i < 10; i++) {
    int found = 0;
    for (size_t j = 0; j < rs.u.stats.nstages; j++)
      found |= strcmp(rs.u.stats.stages[j].op, stages[i]) == 0;
    cr_assert(found, "stage %s missing from stats", stages[i]);
  }
  fp4idx_response_clear(&rs);
  free(body);
}

Test(daemon_nowork, appends_count_and_reads_answer_zeros, .init = setup, .fini = teardown) {
  append_bf16(1, 100, 0);
  float *kf = calloc(30 * 128, sizeof *kf);
  for (int i = 0; i < 30 * 128; i++) kf[i] = (float)(i % 9) - 4.0f;
  uint64_t first = 0, length = 0;
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_F32, 30, kf, &first, &length), 0);
  cr_assert_eq(first, 100u);
  cr_assert_eq(length, 130u);
  unsigned char packed[10 * FP4IDX_PROTO_SLOT_BYTES];
  memset(packed, 0x5a, sizeof packed);
  for (int i = 0; i < 10; i++) memset(packed + i * FP4IDX_PROTO_SLOT_BYTES + 64, 127, 4);
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_U8, 10, packed, &first, &length), 0);
  cr_assert_eq(first, 130u);
  cr_assert_eq(length, 140u);

  /* packed read of the whole sequence: u8 [140, 68], every byte 0 */
  unsigned char *out = malloc(140 * FP4IDX_PROTO_SLOT_BYTES);
  memset(out, 0xff, 140 * FP4IDX_PROTO_SLOT_BYTES);
  uint64_t got = 0;
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 0, 140, out, &got), 0);
  cr_assert_eq(got, 140u);
  for (size_t i = 0; i < 140 * FP4IDX_PROTO_SLOT_BYTES; i++)
    cr_assert_eq(out[i], 0, "byte %zu", i);

  /* dequantized read of a slice: f32 [7, 128] zeros */
  fp4idx_request_t rq = {.id = 3, .op = FP4IDX_OP_READ};
  rq.u.read = (fp4idx_read_req_t){.seq = 1, .from = 5, .count = 7, .has_count = true,
                                  .dequant = true};
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(g_fd, &rq, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  const fp4idx_tensor_t *t = &rs.u.read.keys;
  cr_assert_eq(t->dtype, FP4IDX_WIRE_F32);
  cr_assert_eq(t->ndim, 2u);
  cr_assert_eq(t->shape[0], 7u);
  cr_assert_eq(t->shape[1], 128u);
  cr_assert_eq(t->nbytes, 7u * 128 * 4);
  float *f = tensor_copy(t);
  for (int i = 0; i < 7 * 128; i++) cr_assert_eq(f[i], 0.0f, "element %d", i);
  free(f);
  fp4idx_response_clear(&rs);
  free(body);
  free(out);
  free(kf);
}

/* A score of one sequence; *rs / *body as fp4idx_test_call leaves them. */
static void score_one(uint64_t id, uint64_t seq, uint32_t topk, const int32_t *lens,
                      const uint8_t *mask, uint64_t mask_width, fp4idx_response_t *rs,
                      unsigned char **body) {
  fp4idx_request_t rq;
  fp4idx_score_seq_t s;
  cr_assert_eq(fp4idx_test_score_request(&rq, &s, id, seq, HEADS, topk, ROWS, g_q, g_w, lens),
               0);
  if (mask) {
    uint64_t shp[2] = {ROWS, mask_width};
    cr_assert_eq(fp4idx_tensor_init(&s.mask, FP4IDX_WIRE_U8, 2, shp, mask), 0);
  }
  cr_assert_eq(fp4idx_test_call(g_fd, &rq, rs, body), 0);
  cr_assert_eq(rs->id, id);
}

Test(daemon_nowork, full_logits_have_the_width_and_visibility, .init = setup,
     .fini = teardown) {
  fill_qw();
  append_bf16(1, 130, 0);
  const int32_t lens[ROWS] = {130, 64, 0};
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  score_one(10, 1, 0, lens, NULL, 0, &rs, &body);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_eq(rs.u.score.nresults, 1u);
  const fp4idx_score_result_t *r = &rs.u.score.results[0];
  cr_assert_eq(r->seq, 1u);
  cr_assert(!r->topk);
  cr_assert_eq(r->logits.dtype, FP4IDX_WIRE_F32);
  cr_assert_eq(r->logits.ndim, 2u);
  cr_assert_eq(r->logits.shape[0], (uint64_t)ROWS);
  cr_assert_eq(r->logits.shape[1], 130u, "W = max(lens)");
  float *lg = tensor_copy(&r->logits);
  for (int row = 0; row < ROWS; row++)
    for (int l = 0; l < 130; l++) {
      float v = lg[row * 130 + l];
      if (l < lens[row])
        cr_assert_eq(v, 0.0f, "row %d pos %d: %g", row, l, v);
      else
        cr_assert(isinf(v) && v < 0, "row %d pos %d: %g, want -inf", row, l, v);
    }
  free(lg);
  fp4idx_response_clear(&rs);
  free(body);

  /* with lens {100, 30, 7} and a mask hiding the odd positions of row 0 */
  const int32_t lens2[ROWS] = {100, 30, 7};
  uint8_t mask[ROWS * 100];
  for (int row = 0; row < ROWS; row++)
    for (int l = 0; l < 100; l++) mask[row * 100 + l] = row == 0 ? !(l & 1) : 1;
  score_one(11, 1, 0, lens2, mask, 100, &rs, &body);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  r = &rs.u.score.results[0];
  cr_assert_eq(r->logits.shape[1], 100u);
  lg = tensor_copy(&r->logits);
  for (int row = 0; row < ROWS; row++)
    for (int l = 0; l < 100; l++) {
      int visible = l < lens2[row] && mask[row * 100 + l];
      float v = lg[row * 100 + l];
      cr_assert(visible ? v == 0.0f : (isinf(v) && v < 0), "row %d pos %d: %g", row, l, v);
    }
  free(lg);
  fp4idx_response_clear(&rs);
  free(body);
}

Test(daemon_nowork, topk_returns_the_first_visible_positions, .init = setup,
     .fini = teardown) {
  fill_qw();
  append_bf16(2, 300, 0);
  const int32_t lens[ROWS] = {300, 5, 0};
  const uint32_t K = 16;
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  score_one(20, 2, K, lens, NULL, 0, &rs, &body);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_eq(rs.u.score.nresults, 1u);
  const fp4idx_score_result_t *r = &rs.u.score.results[0];
  cr_assert(r->topk);
  cr_assert_eq(r->positions.dtype, FP4IDX_WIRE_I32);
  cr_assert_eq(r->logits.dtype, FP4IDX_WIRE_F32);
  cr_assert_eq(r->counts.dtype, FP4IDX_WIRE_I32);
  cr_assert_eq(r->positions.shape[0], (uint64_t)ROWS);
  cr_assert_eq(r->positions.shape[1], (uint64_t)K);
  cr_assert_eq(r->logits.shape[0], (uint64_t)ROWS);
  cr_assert_eq(r->logits.shape[1], (uint64_t)K);
  cr_assert_eq(r->counts.ndim, 1u);
  cr_assert_eq(r->counts.shape[0], (uint64_t)ROWS);
  int32_t *pos = tensor_copy(&r->positions), *cnt = tensor_copy(&r->counts);
  float *val = tensor_copy(&r->logits);
  const int32_t want[ROWS] = {16, 5, 0};
  for (int row = 0; row < ROWS; row++) {
    cr_assert_eq(cnt[row], want[row], "row %d count %d", row, cnt[row]);
    for (uint32_t i = 0; i < K; i++) {
      if ((int32_t)i < want[row]) {
        cr_assert_eq(pos[row * K + i], (int32_t)i, "row %d slot %u", row, i);
        cr_assert_eq(val[row * K + i], 0.0f);
      } else {
        cr_assert_eq(pos[row * K + i], -1, "row %d slot %u unused", row, i);
        cr_assert(isinf(val[row * K + i]) && val[row * K + i] < 0);
      }
    }
  }
  free(pos);
  free(cnt);
  free(val);
  fp4idx_response_clear(&rs);
  free(body);

  /* a mask: the visible positions are the multiples of 3 below lens */
  const int32_t lens2[ROWS] = {200, 20, 1};
  uint8_t mask[ROWS * 200];
  for (int i = 0; i < ROWS * 200; i++) mask[i] = (i % 200) % 3 == 0;
  score_one(21, 2, K, lens2, mask, 200, &rs, &body);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  r = &rs.u.score.results[0];
  pos = tensor_copy(&r->positions);
  cnt = tensor_copy(&r->counts);
  const int32_t want2[ROWS] = {16, 7, 1}; /* 0,3,..,18 below 20; 0 below 1 */
  for (int row = 0; row < ROWS; row++) {
    cr_assert_eq(cnt[row], want2[row], "row %d count %d", row, cnt[row]);
    for (int32_t i = 0; i < want2[row]; i++) cr_assert_eq(pos[row * K + i], 3 * i);
  }
  free(pos);
  free(cnt);
  fp4idx_response_clear(&rs);
  free(body);
}

Test(daemon_nowork, sequence_ops_keep_lengths, .init = setup, .fini = teardown) {
  fill_qw();
  append_bf16(1, 150, 0);
  fp4idx_request_t rq = {.id = 30, .op = FP4IDX_OP_FORK};
  rq.u.fork = (fp4idx_fork_req_t){.src = 1, .dst = 2, .length = 100};
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(g_fd, &rq, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_eq(rs.u.fork.length, 100u);
  fp4idx_response_clear(&rs);
  free(body);
  append_bf16(2, 10, 100); /* copy-on-write of the shared last page */
  cr_assert_eq(fp4idx_test_truncate(g_fd, 2, 50), 0);

  rq = (fp4idx_request_t){.id = 31, .op = FP4IDX_OP_LIST};
  cr_assert_eq(fp4idx_test_call(g_fd, &rq, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_eq(rs.u.list.nseqs, 2u);
  for (size_t i = 0; i < rs.u.list.nseqs; i++) {
    const fp4idx_list_entry_t *e = &rs.u.list.seqs[i];
    cr_assert(e->seq == 1 || e->seq == 2, "seq %llu", (unsigned long long)e->seq);
    cr_assert_eq(e->keys, e->seq == 1 ? 150u : 50u);
    cr_assert_eq(e->pages, (e->keys + 63) / 64);
  }
  fp4idx_response_clear(&rs);
  free(body);

  /* a score sees the truncated length */
  score_one(32, 2, 0, NULL, NULL, 0, &rs, &body);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_eq(rs.u.score.results[0].logits.shape[1], 50u);
  fp4idx_response_clear(&rs);
  free(body);

  cr_assert_eq(fp4idx_test_drop(g_fd, 2), 0);
  score_one(33, 2, 4, NULL, NULL, 0, &rs, &body);
  cr_assert_eq(rs.status, FP4IDX_ENOSEQ, "a dropped sequence: %d %s", rs.status, rs.error);
  cr_assert_neq(rs.error[0], '\0');
  fp4idx_response_clear(&rs);
  free(body);
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(g_fd, &info), 0);
  cr_assert_eq(info.sequences, 1u);
  cr_assert_eq(info.pages_total - info.pages_free, 3u, "seq 1's 150 keys: 3 pages");
}

/* Scores pipelined on several connections (the daemon batches what is
 * queued together): every reply comes, in request order per connection,
 * with its own shape. */
Test(daemon_nowork, pipelined_scores_from_many_connections, .init = setup,
     .fini = teardown) {
  enum { NCONN = 4, PER = 8 };
  fill_qw();
  for (uint64_t s = 1; s <= NCONN; s++) append_bf16(s, 64 * s + 3, 0);
  int fds[NCONN];
  for (int c = 0; c < NCONN; c++) {
    fds[c] = fp4idx_test_connect(g_d.sock);
    cr_assert_geq(fds[c], 0);
  }
  for (int j = 0; j < PER; j++)
    for (int c = 0; c < NCONN; c++) {
      fp4idx_request_t rq;
      fp4idx_score_seq_t s;
      uint32_t k = j % 2 ? (uint32_t)(8 * j) : 0;
      cr_assert_eq(fp4idx_test_score_request(&rq, &s, 100 * (uint64_t)c + (uint64_t)j,
                                             (uint64_t)c + 1, HEADS, k, ROWS, g_q, g_w, NULL),
                   0);
      cr_assert_eq(fp4idx_test_send_request(fds[c], &rq), 0);
    }
  for (int c = 0; c < NCONN; c++)
    for (int j = 0; j < PER; j++) {
      fp4idx_response_t rs;
      unsigned char *body = NULL;
      cr_assert_eq(fp4idx_test_recv_response(fds[c], FP4IDX_OP_SCORE, &rs, &body), 0);
      cr_assert_eq(rs.status, 0, "%s", rs.error);
      cr_assert_eq(rs.id, 100 * (uint64_t)c + (uint64_t)j, "order on connection %d", c);
      const fp4idx_score_result_t *r = &rs.u.score.results[0];
      uint64_t n = 64 * ((uint64_t)c + 1) + 3;
      cr_assert_eq(r->seq, (uint64_t)c + 1);
      if (j % 2) {
        uint64_t k = 8 * (uint64_t)j;
        cr_assert_eq(r->positions.shape[1], k);
        int32_t *cnt = tensor_copy(&r->counts);
        for (int row = 0; row < ROWS; row++) cr_assert_eq((uint64_t)cnt[row], k < n ? k : n);
        free(cnt);
      } else {
        cr_assert_eq(r->logits.shape[1], n);
      }
      fp4idx_response_clear(&rs);
      free(body);
    }
  for (int c = 0; c < NCONN; c++) close(fds[c]);
}

Test(daemon_nowork, refuses_another_backend) {
  use_nowork_binary();
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  const char *args[] = {"--backend", "cpu", NULL};
  cr_assert_eq(fp4idx_test_daemon_spawn(&d, NULL, args), 0);
  int code = fp4idx_test_daemon_wait(&d, 10000);
  cr_expect_eq(code, 2, "--backend cpu: usage error, got %d", code);
  fp4idx_test_daemon_stop(&d);
}
