/* test_daemon_nonfinite.c -- inputs that would make logits NaN are refused
 * by the real daemon with ENONFINITE and change nothing (PROTOCOL.md,
 * score and append): NaN or inf anywhere in q or w; packed u8 keys with a
 * scale byte outside 1..254. Before, the score answered NaN logits and
 * top-k left those positions out (counts 0 with keys visible). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_status.h"

#define H 4
#define R 2
#define N 8

static fp4idx_test_daemon_t g_d;
static int g_fd = -1;

static void setup(void) {
  cr_assert_eq(fp4idx_test_daemon_start(&g_d, NULL), 0);
  g_fd = fp4idx_test_connect(g_d.sock);
  cr_assert_geq(g_fd, 0);
}

static void teardown(void) {
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  cr_assert_eq(fp4idx_test_daemon_stop(&g_d), 0, "daemon exit code after the test");
}

static void packed_keys(unsigned char *k, int n) {
  for (int i = 0; i < n * 68; i++) k[i] = (unsigned char)(i * 29 + 3);
  for (int i = 0; i < n; i++) memset(k + i * 68 + 64, 127, 4);
}

/* q bf16 [R,H,128] and w bf16 [R,H] of small finite values. */
static void query(uint16_t *q, uint16_t *w) {
  for (int i = 0; i < R * H * 128; i++) q[i] = (uint16_t)(0x3c00 + (i % 97)); /* ~0.0078.. */
  for (int i = 0; i < R * H; i++) w[i] = 0x3f80;                             /* 1.0 */
}

/* A score request (full logits, or top-k) of sequence 1; returns its status
 * and, on error, the message. */
static int score(const uint16_t *q, const uint16_t *w, uint32_t topk, char *msg, size_t cap) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  fp4idx_score_seq_t s;
  memset(&req, 0, sizeof req);
  memset(&s, 0, sizeof s);
  req.id = 77;
  req.op = FP4IDX_OP_SCORE;
  req.u.score.heads = H;
  req.u.score.topk = topk;
  req.u.score.seqs = &s;
  req.u.score.nseqs = 1;
  s.seq = 1;
  s.rows = R;
  uint64_t qs[3] = {R, H, 128}, ws[2] = {R, H};
  cr_assert_eq(fp4idx_tensor_init(&s.q, FP4IDX_WIRE_BF16, 3, qs, q), 0);
  cr_assert_eq(fp4idx_tensor_init(&s.w, FP4IDX_WIRE_BF16, 2, ws, w), 0);
  cr_assert_eq(fp4idx_test_call(g_fd, &req, &resp, &body), 0);
  int rc = resp.status;
  if (rc == 0 && topk) {
    const fp4idx_score_result_t *res = &resp.u.score.results[0];
    for (int r = 0; r < R; r++)
      cr_assert_eq(fp4idx_load_i32(res->counts.data, (size_t)r), (int32_t)(topk < N ? topk : N),
                   "row %d: every visible key is counted", r);
  } else if (rc == 0) {
    const fp4idx_score_result_t *res = &resp.u.score.results[0];
    for (int i = 0; i < R * N; i++)
      cr_assert(isfinite(fp4idx_load_f32(res->logits.data, (size_t)i)), "logit %d finite", i);
  }
  if (msg) snprintf(msg, cap, "%s", rc ? resp.error : "");
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

TestSuite(daemon_nonfinite, .init = setup, .fini = teardown);

Test(daemon_nonfinite, nan_or_inf_in_q_or_w_is_refused) {
  unsigned char keys[N * 68];
  packed_keys(keys, N);
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_U8, N, keys, NULL, NULL), 0);
  static uint16_t q[R * H * 128], w[R * H];
  char msg[256];
  query(q, w);
  cr_assert_eq(score(q, w, 0, msg, sizeof msg), 0, "finite inputs: %s", msg);
  cr_assert_eq(score(q, w, 4, msg, sizeof msg), 0, "finite inputs, top-k: %s", msg);
  const struct {
    int in_q;
    int index;
    uint16_t v;
    const char *where;
  } bad[] = {
      {1, 5, 0x7fc0, "q[0,0,5] is NaN"},           {1, 1 * H * 128 + 2 * 128 + 9, 0x7f80, "q[1,2,9] is inf"},
      {1, R * H * 128 - 1, 0xff80, "q[1,3,127] is inf"}, {0, 3, 0xffc1, "w[0,3] is NaN"},
      {0, 1 * H + 1, 0x7f80, "w[1,1] is inf"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    for (uint32_t topk = 0; topk <= 4; topk += 4) {
      query(q, w);
      if (bad[i].in_q) q[bad[i].index] = bad[i].v; else w[bad[i].index] = bad[i].v;
      cr_assert_eq(score(q, w, topk, msg, sizeof msg), FP4IDX_ENONFINITE, "case %zu, topk %u", i,
                   topk);
      cr_assert_not_null(strstr(msg, bad[i].where), "message \"%s\" names %s", msg,
                         bad[i].where);
    }
  }
  /* Nothing changed and the connection still works. */
  query(q, w);
  cr_assert_eq(score(q, w, 4, msg, sizeof msg), 0);
}

Test(daemon_nonfinite, packed_keys_need_scale_bytes_1_to_254) {
  unsigned char keys[N * 68];
  fp4idx_info_t info;
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_info(g_fd, &info), 0);
  uint64_t free_before = info.pages_free;
  const unsigned char bad_bytes[2] = {0, 255};
  for (int b = 0; b < 2; b++)
    for (int j = 0; j < 4; j++) {
      packed_keys(keys, N);
      keys[5 * 68 + 64 + j] = bad_bytes[b];
      int rc = fp4idx_test_append(g_fd, 9, FP4IDX_WIRE_U8, N, keys, &first, &len);
      cr_assert_eq(rc, FP4IDX_ENONFINITE, "scale byte %u at key 5, block %d: %s", bad_bytes[b],
                   j, fp4idx_strerror(rc));
    }
  /* Refused whole: no sequence was created, no page taken. */
  cr_assert_eq(fp4idx_test_info(g_fd, &info), 0);
  cr_assert_eq(info.sequences, 0);
  cr_assert_eq(info.pages_free, free_before);
  /* The edges of the range are fine. */
  packed_keys(keys, N);
  keys[64] = 1;
  keys[N * 68 - 1] = 254;
  cr_assert_eq(fp4idx_test_append(g_fd, 9, FP4IDX_WIRE_U8, N, keys, &first, &len), 0);
  cr_assert_eq(len, N);
  unsigned char back[N * 68];
  uint64_t got;
  cr_assert_eq(fp4idx_test_read(g_fd, 9, 0, N, back, &got), 0);
  cr_assert_eq(memcmp(back, keys, sizeof keys), 0, "stored as sent");
}

/* The order of a score's checks does not depend on where q and w are
 * scanned (the daemon scans those of the frame on its I/O loop): an unknown
 * sequence is told before a NaN; a NaN before a length out of range in the
 * same entry; an entry's length out of range before a NaN in a later
 * entry. */
static int score_two(uint64_t seq0, const int32_t *lens0, const uint16_t *q0, const uint16_t *q1,
                     const uint16_t *w, char *msg, size_t cap) {
  fp4idx_request_t req;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  fp4idx_score_seq_t s[2];
  memset(&req, 0, sizeof req);
  memset(s, 0, sizeof s);
  req.id = 78;
  req.op = FP4IDX_OP_SCORE;
  req.u.score.heads = H;
  req.u.score.seqs = s;
  req.u.score.nseqs = 2;
  uint64_t qs[3] = {R, H, 128}, ws[2] = {R, H}, ls[1] = {R};
  const uint16_t *qv[2] = {q0, q1};
  for (int i = 0; i < 2; i++) {
    s[i].seq = i ? 1 : seq0;
    s[i].rows = R;
    cr_assert_eq(fp4idx_tensor_init(&s[i].q, FP4IDX_WIRE_BF16, 3, qs, qv[i]), 0);
    cr_assert_eq(fp4idx_tensor_init(&s[i].w, FP4IDX_WIRE_BF16, 2, ws, w), 0);
  }
  if (lens0) cr_assert_eq(fp4idx_tensor_init(&s[0].lens, FP4IDX_WIRE_I32, 1, ls, lens0), 0);
  cr_assert_eq(fp4idx_test_call(g_fd, &req, &resp, &body), 0);
  int rc = resp.status;
  snprintf(msg, cap, "%s", rc ? resp.error : "");
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

Test(daemon_nonfinite, the_checks_keep_their_order) {
  unsigned char keys[N * 68];
  packed_keys(keys, N);
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_U8, N, keys, NULL, NULL), 0);
  static uint16_t q[R * H * 128], nan_q[R * H * 128], w[R * H];
  char msg[256];
  query(q, w);
  query(nan_q, w);
  nan_q[7] = 0x7fc0;
  const int32_t long_lens[R] = {N + 1, 1}, ok_lens[R] = {N, 1};
  cr_assert_eq(score_two(1, ok_lens, q, q, w, msg, sizeof msg), 0, "%s", msg);
  cr_assert_eq(score_two(99, NULL, nan_q, q, w, msg, sizeof msg), FP4IDX_ENOSEQ, "%s", msg);
  cr_assert_eq(score_two(1, long_lens, nan_q, q, w, msg, sizeof msg), FP4IDX_ENONFINITE, "%s",
               msg);
  cr_assert_eq(score_two(1, long_lens, q, nan_q, w, msg, sizeof msg), FP4IDX_ERANGE, "%s", msg);
  cr_assert_eq(score_two(1, ok_lens, q, nan_q, w, msg, sizeof msg), FP4IDX_ENONFINITE, "%s", msg);
  cr_assert_not_null(strstr(msg, "seqs[1]"), "the NaN of the second entry: \"%s\"", msg);
}
