/* test_client_e2e.c -- libfp4idx-client against the real fp4idxd (spawned on
 * a temporary socket by tests/common/daemon_harness): the golden scorer
 * cases bit for bit, top-k against a sort of the full logits, several
 * sequences in one request, the quantizer's two rounding modes through
 * append/read, f32 and fp4 appends, truncate/drop, stats, and the error
 * paths (ENOSEQ, ERANGE, ENONFINITE, E2BIG, daemon absent, timeout). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_check.h"
#include "daemon_harness.h"
#include "fp4idx_client.h"
#include "test_util.h"

static fp4idx_test_daemon_t daemon_;

static void start(void) {
  cr_assert_eq(fp4idx_test_daemon_start(&daemon_, NULL), 0,
               "fp4idxd did not start");
}

static void start_small_frame(void) {
  static const char *const extra[] = {"--max-frame", "1M", NULL};
  cr_assert_eq(fp4idx_test_daemon_start(&daemon_, extra), 0,
               "fp4idxd did not start");
}

static void stop(void) {
  if (daemon_.pid) fp4idx_test_daemon_stop(&daemon_);
}

static fp4idx_client_t *open_client(void) {
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_not_null(c);
  cr_assert_eq(fp4idx_client_set_timeout(c, 60000), FP4IDX_OK);
  cr_assert_eq(fp4idx_client_connect(c, daemon_.sock), FP4IDX_OK, "%s",
               fp4idx_client_last_error(c));
  return c;
}

/* A golden scorer case, loaded from tests/golden. */
typedef struct {
  int heads, rows;
  size_t n;           /* keys */
  uint16_t *keys, *q, *w;
  int32_t *lens;
  float *ref;         /* [rows, n] */
} golden_t;

static void golden_load(golden_t *g, const char *name, int heads) {
  char f[128];
  size_t sz;
  memset(g, 0, sizeof *g);
  g->heads = heads;
  snprintf(f, sizeof f, "%s_keys.bin", name);
  g->keys = fp4idx_test_load_golden(f, 0, &sz);
  cr_assert_not_null(g->keys, "missing golden %s", f);
  g->n = sz / 256;
  snprintf(f, sizeof f, "%s_lens.bin", name);
  g->lens = fp4idx_test_load_golden(f, 0, &sz);
  cr_assert_not_null(g->lens);
  g->rows = (int)(sz / 4);
  snprintf(f, sizeof f, "%s_q.bin", name);
  g->q = fp4idx_test_load_golden(f, (size_t)g->rows * heads * 128 * 2, NULL);
  snprintf(f, sizeof f, "%s_w.bin", name);
  g->w = fp4idx_test_load_golden(f, (size_t)g->rows * heads * 2, NULL);
  snprintf(f, sizeof f, "%s_ref.bin", name);
  g->ref = fp4idx_test_load_golden(f, (size_t)g->rows * g->n * 4, NULL);
  cr_assert(g->q && g->w && g->ref, "golden %s incomplete", name);
}

static void golden_free(golden_t *g) {
  free(g->keys);
  free(g->q);
  free(g->w);
  free(g->lens);
  free(g->ref);
}

static uint32_t max_len(const golden_t *g) {
  int32_t m = 0;
  for (int r = 0; r < g->rows; r++) m = g->lens[r] > m ? g->lens[r] : m;
  return (uint32_t)m;
}

/* Appends the golden keys in two requests (so positions continue). */
static void golden_append(fp4idx_client_t *c, uint64_t seq, const golden_t *g) {
  size_t half = g->n / 2;
  uint64_t first, len;
  CHECK(c, fp4idx_client_append_bf16(c, seq, g->keys, half,
                                     FP4IDX_ROUNDING_RNE, &first, &len));
  cr_assert_eq(first, 0);
  cr_assert_eq(len, half);
  CHECK(c, fp4idx_client_append_bf16(c, seq, g->keys + half * 128, g->n - half,
                                     FP4IDX_ROUNDING_RNE, &first, &len));
  cr_assert_eq(first, half);
  cr_assert_eq(len, g->n);
}

/* logits [rows, width] against ref [rows, n]: bit for bit over the width,
 * and the reference is -inf beyond it. */
static void expect_ref(const golden_t *g, const float *logits, uint32_t width,
                       const char *what) {
  cr_assert_eq(width, max_len(g), "%s: width", what);
  for (int r = 0; r < g->rows; r++) {
    int64_t d = fp4idx_test_count_diff(logits + (size_t)r * width,
                                       g->ref + (size_t)r * g->n, width);
    cr_expect_eq(d, 0, "%s: row %d: %lld logits differ from the reference",
                 what, r, (long long)d);
    for (size_t l = width; l < g->n; l++)
      cr_assert(g->ref[(size_t)r * g->n + l] == -INFINITY);
  }
}

static void golden_case(const char *name, int heads) {
  golden_t g;
  golden_load(&g, name, heads);
  fp4idx_client_t *c = open_client();
  golden_append(c, 7, &g);

  /* Library-allocated result. */
  fp4idx_client_seq_t s = {.seq = 7, .rows = (uint32_t)g.rows, .q = g.q,
                           .w = g.w, .lens = g.lens};
  fp4idx_client_result_t *res = NULL;
  CHECK(c, fp4idx_client_score(c, (uint32_t)heads, 0, &s, 1, &res));
  cr_assert_eq(res[0].seq, 7);
  cr_assert_eq(res[0].rows, (uint32_t)g.rows);
  cr_assert_null(res[0].positions);
  expect_ref(&g, res[0].logits, res[0].width, "score");
  fp4idx_client_free(res);

  /* Caller buffer; first too small (E2BIG, width still reported). */
  size_t cap = (size_t)g.rows * g.n;
  float *buf = malloc(cap * sizeof *buf);
  uint32_t width = 0;
  cr_expect_eq(fp4idx_client_score_into(c, 7, (uint32_t)heads, (uint32_t)g.rows,
                                        g.q, g.w, g.lens, buf, 3, &width),
               FP4IDX_E2BIG);
  cr_expect_eq(width, max_len(&g));
  CHECK(c, fp4idx_client_score_into(c, 7, (uint32_t)heads, (uint32_t)g.rows,
                                    g.q, g.w, g.lens, buf, cap, &width));
  expect_ref(&g, buf, width, "score_into");
  free(buf);
  fp4idx_client_close(c);
  golden_free(&g);
}

TestSuite(e2e, .init = start, .fini = stop);

Test(e2e, golden_dyadic_h32) { golden_case("dyadic_h32", 32); }
Test(e2e, golden_gauss_h32) { golden_case("gauss_h32", 32); }
Test(e2e, golden_gauss_h64) { golden_case("gauss_h64", 64); }

Test(e2e, hello_and_info) {
  fp4idx_client_t *c = open_client();
  fp4idx_client_info_t in;
  CHECK(c, fp4idx_client_hello(c, &in));
  cr_expect_eq(in.version, 1);
  cr_expect(strncmp(in.server, "fp4idxd ", 8) == 0, "%s", in.server);
  CHECK(c, fp4idx_client_info(c, &in));
  cr_expect_str_eq(in.backend, "cpu");
  cr_expect_eq(in.page_size, 64);
  cr_expect(in.pages_total > 0);
  cr_expect_eq(in.pages_free, in.pages_total);
  cr_expect_eq(in.sequences, 0);
  cr_expect(in.max_frame > 0);
  fp4idx_client_close(c);
}

/* Top-k through the library equals sorting the full logits (same daemon). */
Test(e2e, topk_matches_sorted_full_logits) {
  golden_t g;
  golden_load(&g, "gauss_h64", 64);
  fp4idx_client_t *c = open_client();
  golden_append(c, 3, &g);
  uint32_t W = max_len(&g);
  float *full = malloc((size_t)g.rows * W * 4);
  uint32_t width;
  CHECK(c, fp4idx_client_score_into(c, 3, 64, (uint32_t)g.rows, g.q, g.w,
                                    g.lens, full, (size_t)g.rows * W, &width));
  /* the top-k replies read with busy polling, a fixed window and the
   * automatic one in turn: same results as the sleeping reads of the full
   * logits */
  static const uint32_t ks[] = {1, 16, 64, 500, 2048};
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
    uint32_t k = ks[i];
    CHECK(c, fp4idx_client_set_busy_poll(c, i % 2 ? FP4IDX_CLIENT_BUSY_POLL_AUTO : 200));
    size_t m = (size_t)g.rows * k;
    int32_t *pos = malloc(m * 4), *cnt = malloc((size_t)g.rows * 4);
    float *val = malloc(m * 4);
    int32_t *rpos = malloc(m * 4), *rcnt = malloc((size_t)g.rows * 4);
    float *rval = malloc(m * 4);
    CHECK(c, fp4idx_client_topk(c, 3, 64, (uint32_t)g.rows, g.q, g.w, g.lens,
                                k, pos, val, cnt));
    cr_assert_eq(fp4idx_test_ref_topk(full, g.rows, W, (int)k, rpos, rval, rcnt),
                 0);
    for (int r = 0; r < g.rows; r++) {
      int32_t want = g.lens[r] < (int32_t)k ? g.lens[r] : (int32_t)k;
      cr_expect_eq(cnt[r], want, "k %u row %d count", k, r);
      cr_expect_eq(cnt[r], rcnt[r]);
    }
    cr_expect_eq(memcmp(pos, rpos, m * 4), 0, "k %u: positions differ", k);
    cr_expect_eq(fp4idx_test_count_diff(val, rval, (int64_t)m), 0,
                 "k %u: logits differ", k);
    /* The multi-sequence form returns the same. */
    fp4idx_client_seq_t s = {.seq = 3, .rows = (uint32_t)g.rows, .q = g.q,
                             .w = g.w, .lens = g.lens};
    fp4idx_client_result_t *res;
    CHECK(c, fp4idx_client_score(c, 64, k, &s, 1, &res));
    cr_expect_eq(res[0].width, k);
    cr_expect_eq(memcmp(res[0].positions, pos, m * 4), 0);
    cr_expect_eq(memcmp(res[0].counts, cnt, (size_t)g.rows * 4), 0);
    fp4idx_client_free(res);
    free(pos), free(cnt), free(val), free(rpos), free(rcnt), free(rval);
  }
  free(full);
  fp4idx_client_close(c);
  golden_free(&g);
}

/* Two sequences in one score request: each equals its own reference. */
Test(e2e, several_sequences_in_one_request) {
  golden_t a, b;
  golden_load(&a, "dyadic_h32", 32);
  golden_load(&b, "gauss_h32", 32);
  fp4idx_client_t *c = open_client();
  golden_append(c, 100, &a);
  golden_append(c, 200, &b);
  fp4idx_client_seq_t s[2] = {
      {.seq = 200, .rows = (uint32_t)b.rows, .q = b.q, .w = b.w, .lens = b.lens},
      {.seq = 100, .rows = (uint32_t)a.rows, .q = a.q, .w = a.w, .lens = a.lens}};
  fp4idx_client_result_t *res;
  CHECK(c, fp4idx_client_score(c, 32, 0, s, 2, &res));
  cr_assert_eq(res[0].seq, 200);
  cr_assert_eq(res[1].seq, 100);
  expect_ref(&b, res[0].logits, res[0].width, "seqs[0]");
  expect_ref(&a, res[1].logits, res[1].width, "seqs[1]");
  fp4idx_client_free(res);
  /* Without lens every row sees every key. */
  s[0].lens = NULL;
  CHECK(c, fp4idx_client_score(c, 32, 0, s, 1, &res));
  cr_expect_eq(res[0].width, b.n);
  cr_expect_eq(fp4idx_test_count_diff(res[0].logits, b.ref, (int64_t)b.n), 0,
               "row 0 sees all keys in the reference too");
  fp4idx_client_free(res);
  fp4idx_client_close(c);
  golden_free(&a);
  golden_free(&b);
}

/* A score of 600 entries, each one row whose q (8 KB) the client sends
 * from the caller's memory: 1,201 iovecs, more than one sendmsg takes
 * (IOV_MAX 1,024), so the send goes in pieces. Every entry's logits equal
 * those of the same row scored alone. */
Test(e2e, many_entries_sent_in_several_sendmsg_calls) {
  golden_t a;
  golden_load(&a, "dyadic_h32", 32);
  fp4idx_client_t *c = open_client();
  golden_append(c, 100, &a);
  enum { N = 600 };
  fp4idx_client_seq_t *s = calloc(N, sizeof *s);
  cr_assert_not_null(s);
  for (int i = 0; i < N; i++)
    s[i] = (fp4idx_client_seq_t){.seq = 100, .rows = 1, .q = a.q, .w = a.w, .lens = a.lens};
  fp4idx_client_result_t *one, *all;
  CHECK(c, fp4idx_client_score(c, 32, 0, s, 1, &one));
  CHECK(c, fp4idx_client_score(c, 32, 0, s, N, &all));
  for (int i = 0; i < N; i++) {
    cr_assert_eq(all[i].seq, 100);
    cr_assert_eq(all[i].width, one[0].width);
    cr_assert_eq(memcmp(all[i].logits, one[0].logits, (size_t)one[0].width * 4), 0,
                 "entry %d differs", i);
  }
  fp4idx_client_free(one);
  fp4idx_client_free(all);
  free(s);
  fp4idx_client_close(c);
  golden_free(&a);
}

/* The quantizer's golden bytes through append (bf16 and f32, both rounding
 * modes) and read (packed), fp4 round trip, and dequantized reads. */
Test(e2e, append_read_rounding_modes) {
  size_t n = 512;
  uint16_t *keys = fp4idx_test_load_golden("quant_keys.bin", n * 256, NULL);
  uint8_t *pay[2], *sc[2];
  pay[0] = fp4idx_test_load_golden("quant_payload_rne.bin", n * 64, NULL);
  sc[0] = fp4idx_test_load_golden("quant_scales_rne.bin", n * 4, NULL);
  pay[1] = fp4idx_test_load_golden("quant_payload_thr.bin", n * 64, NULL);
  sc[1] = fp4idx_test_load_golden("quant_scales_thr.bin", n * 4, NULL);
  cr_assert(keys && pay[0] && sc[0] && pay[1] && sc[1]);
  float *f32 = malloc(n * 128 * 4);
  for (size_t i = 0; i < n * 128; i++) {
    uint32_t u = (uint32_t)keys[i] << 16;
    memcpy(&f32[i], &u, 4);
  }
  fp4idx_client_t *c = open_client();
  for (int mode = 0; mode < 2; mode++) {
    fp4idx_client_rounding_t rd =
        mode ? FP4IDX_ROUNDING_THRESHOLD : FP4IDX_ROUNDING_RNE;
    uint64_t sb = 10 + (uint64_t)mode, sf = 20 + (uint64_t)mode;
    CHECK(c, fp4idx_client_append_bf16(c, sb, keys, n, rd, NULL, NULL));
    CHECK(c, fp4idx_client_append_f32(c, sf, f32, n, rd, NULL, NULL));
    for (int which = 0; which < 2; which++) {
      void *got;
      size_t m;
      CHECK(c, fp4idx_client_read(c, which ? sf : sb, 0, UINT64_MAX, 0, &got,
                                  &m));
      cr_assert_eq(m, n);
      const uint8_t *slots = got;
      size_t bad = 0;
      for (size_t k = 0; k < n; k++)
        bad += memcmp(slots + k * 68, pay[mode] + k * 64, 64) != 0 ||
               memcmp(slots + k * 68 + 64, sc[mode] + k * 4, 4) != 0;
      cr_expect_eq(bad, 0, "mode %d %s: %zu keys differ from golden", mode,
                   which ? "f32" : "bf16", bad);
      fp4idx_client_free(got);
    }
  }
  /* Packed keys appended as fp4 come back unchanged; a sub-range read. */
  void *packed;
  size_t m;
  CHECK(c, fp4idx_client_read(c, 10, 0, UINT64_MAX, 0, &packed, &m));
  CHECK(c, fp4idx_client_append_fp4(c, 30, packed, m, NULL, NULL));
  void *back;
  size_t m2;
  CHECK(c, fp4idx_client_read(c, 30, 100, 37, 0, &back, &m2));
  cr_assert_eq(m2, 37);
  cr_expect_eq(memcmp(back, (uint8_t *)packed + 100 * 68, 37 * 68), 0);
  fp4idx_client_free(back);
  /* Dequantized values equal the exact decode of the packed keys. */
  CHECK(c, fp4idx_client_read(c, 30, 5, 20, 1, &back, &m2));
  cr_assert_eq(m2, 20);
  const float *deq = back;
  size_t bad = 0;
  for (size_t k = 0; k < 20; k++)
    for (int e = 0; e < 128; e++)
      bad += (double)deq[k * 128 + (size_t)e] !=
             fp4idx_test_key_element((uint8_t *)packed + (5 + k) * 68, e);
  cr_expect_eq(bad, 0, "%zu dequantized values differ", bad);
  fp4idx_client_free(back);
  /* Empty range at the end. */
  CHECK(c, fp4idx_client_read(c, 30, m, UINT64_MAX, 0, &back, &m2));
  cr_expect_eq(m2, 0);
  fp4idx_client_free(back);
  fp4idx_client_free(packed);
  fp4idx_client_close(c);
  free(keys), free(f32);
  for (int i = 0; i < 2; i++) free(pay[i]), free(sc[i]);
}

Test(e2e, truncate_drop_and_errors) {
  golden_t g;
  golden_load(&g, "dyadic_h32", 32);
  fp4idx_client_t *c = open_client();
  golden_append(c, 5, &g);

  /* Unknown sequence: ENOSEQ with the daemon's message, connection kept. */
  fp4idx_client_seq_t s = {.seq = 999, .rows = (uint32_t)g.rows, .q = g.q,
                           .w = g.w, .lens = g.lens};
  fp4idx_client_result_t *res = (void *)1;
  cr_expect_eq(fp4idx_client_score(c, 32, 0, &s, 1, &res), FP4IDX_ENOSEQ);
  cr_expect_null(res);
  cr_expect(strstr(fp4idx_client_last_error(c), "999") != NULL, "%s",
            fp4idx_client_last_error(c));
  cr_expect_eq(fp4idx_client_last_status(c), FP4IDX_ENOSEQ);
  cr_expect(fp4idx_client_connected(c));
  cr_expect_eq(fp4idx_client_drop(c, 999), FP4IDX_ENOSEQ);
  cr_expect_neq(fp4idx_client_last_error(c)[0], '\0');
  cr_expect_eq(fp4idx_client_truncate(c, 999, 0, NULL), FP4IDX_ENOSEQ);
  void *keys = (void *)1;
  size_t n = 9;
  cr_expect_eq(fp4idx_client_read(c, 999, 0, UINT64_MAX, 0, &keys, &n),
               FP4IDX_ENOSEQ);
  cr_expect_null(keys);
  cr_expect_eq(n, 0);

  /* A visible count above the key count: ERANGE. */
  int32_t lens[4] = {1001, 1, 1, 1};
  s.seq = 5;
  s.lens = lens;
  cr_expect_eq(fp4idx_client_score(c, 32, 0, &s, 1, &res), FP4IDX_ERANGE);
  cr_expect_neq(fp4idx_client_last_error(c)[0], '\0');
  cr_expect_eq(fp4idx_client_truncate(c, 5, 1001, NULL), FP4IDX_ERANGE);

  /* A NaN key: ENONFINITE and nothing stored. */
  uint16_t bad[2 * 128];
  memcpy(bad, g.keys, sizeof bad);
  bad[128 + 17] = 0x7fc0;
  uint64_t len = 0;
  cr_expect_eq(fp4idx_client_append_bf16(c, 5, bad, 2, FP4IDX_ROUNDING_RNE,
                                         NULL, &len),
               FP4IDX_ENONFINITE);
  CHECK(c, fp4idx_client_truncate(c, 5, 1000, &len));
  cr_expect_eq(len, 1000, "a rejected append changed the length");

  /* Truncate, then the scores of the surviving prefix are unchanged. */
  CHECK(c, fp4idx_client_truncate(c, 5, 366, &len));
  cr_expect_eq(len, 366);
  int32_t l2[4] = {366, 366, 366, 65};
  s.lens = l2;
  CHECK(c, fp4idx_client_score(c, 32, 0, &s, 1, &res));
  cr_expect_eq(res[0].width, 366);
  cr_expect_eq(fp4idx_test_count_diff(res[0].logits + 2 * 366,
                                      g.ref + 2 * g.n, 366),
               0, "row 2 (366 visible) after truncate");
  fp4idx_client_free(res);
  /* Append continues at the truncated length. */
  uint64_t first;
  CHECK(c, fp4idx_client_append_bf16(c, 5, g.keys, 1, FP4IDX_ROUNDING_RNE,
                                     &first, &len));
  cr_expect_eq(first, 366);
  cr_expect_eq(len, 367);

  CHECK(c, fp4idx_client_drop(c, 5));
  cr_expect_eq(fp4idx_client_drop(c, 5), FP4IDX_ENOSEQ);
  fp4idx_client_info_t in;
  CHECK(c, fp4idx_client_info(c, &in));
  cr_expect_eq(in.sequences, 0);
  cr_expect_eq(in.pages_free, in.pages_total, "drop freed every page");
  fp4idx_client_close(c);
  golden_free(&g);
}

/* The integer-only ops as data (fp4idx_client_ops, generated from the op
 * table) and called by name: the same answers as their typed calls. */
Test(e2e, integer_ops_by_name) {
  size_t n = 0;
  const fp4idx_client_op_t *ops = fp4idx_client_ops(&n);
  const fp4idx_client_op_t *tr = NULL;
  for (size_t i = 0; i < n; i++)
    if (strcmp(ops[i].name, "truncate") == 0) tr = &ops[i];
  cr_assert_not_null(tr, "truncate is an integer-only op");
  cr_assert_eq(tr->nrequest, 2u);
  cr_assert_str_eq(tr->request[0], "seq");
  cr_assert_str_eq(tr->request[1], "length");
  cr_assert_eq(tr->nresponse, 1u);
  cr_assert_str_eq(tr->response[0], "length");

  golden_t g;
  golden_load(&g, "dyadic_h32", 32);
  fp4idx_client_t *c = open_client();
  golden_append(c, 5, &g);
  uint64_t out[1] = {0};
  CHECK(c, fp4idx_client_call_ints(c, "truncate", (uint64_t[]){5, 300}, 2, out, 1));
  cr_expect_eq(out[0], 300);
  cr_expect_eq(fp4idx_client_call_ints(c, "truncate", (uint64_t[]){999, 0}, 2, out, 1),
               FP4IDX_ENOSEQ);
  cr_expect(strstr(fp4idx_client_last_error(c), "999") != NULL, "%s",
            fp4idx_client_last_error(c));
  cr_expect_eq(fp4idx_client_call_ints(c, "truncate", (uint64_t[]){5}, 1, out, 1),
               FP4IDX_EINVAL, "a field count other than the op's");
  cr_expect_eq(fp4idx_client_call_ints(c, "score", NULL, 0, NULL, 0), FP4IDX_EINVAL,
               "score has tensors: not an integer op");
  CHECK(c, fp4idx_client_call_ints(c, "drop", (uint64_t[]){5}, 1, NULL, 0));
  cr_expect_eq(fp4idx_client_drop(c, 5), FP4IDX_ENOSEQ, "the drop by name dropped it");
  fp4idx_client_close(c);
  golden_free(&g);
}

Test(e2e, stats_counts_requests) {
  fp4idx_client_t *c = open_client();
  uint16_t k[3 * 128] = {0};
  for (int i = 0; i < 3; i++)
    CHECK(c, fp4idx_client_append_bf16(c, 1, k, 3, FP4IDX_ROUNDING_RNE, NULL,
                                       NULL));
  cr_expect_eq(fp4idx_client_drop(c, 77), FP4IDX_ENOSEQ);
  fp4idx_client_stats_t *s = NULL;
  CHECK(c, fp4idx_client_stats(c, &s));
  cr_assert_not_null(s);
  cr_expect_str_eq(s->backend, "cpu");
  cr_expect_eq(s->sequences, 1);
  cr_expect_eq(s->keys, 9);
  cr_expect(s->connections >= 1);
  cr_expect(s->pages_free < s->pages_total);
  cr_expect(s->uptime_s >= 0);
  int seen_append = 0, seen_drop = 0;
  for (uint32_t i = 0; i < s->nops; i++) {
    const fp4idx_client_op_stats_t *o = &s->ops[i];
    if (i) cr_expect(strcmp(s->ops[i - 1].op, o->op) < 0, "ops not sorted");
    uint64_t sum = 0;
    for (uint32_t b = 0; b < o->nbuckets; b++) sum += o->hist[b];
    cr_expect_eq(sum, o->count, "op %s: histogram total", o->op);
    cr_expect(o->nbuckets > 0 && isinf(o->bounds_us[o->nbuckets - 1]),
              "op %s: last bound is +inf", o->op);
    if (strcmp(o->op, "append") == 0) {
      seen_append = 1;
      cr_expect_eq(o->count, 3);
      cr_expect_eq(o->errors, 0);
      cr_expect(o->latency_sum_us > 0);
    }
    if (strcmp(o->op, "drop") == 0) {
      seen_drop = 1;
      cr_expect_eq(o->count, 1);
      cr_expect_eq(o->errors, 1);
    }
  }
  cr_expect(seen_append && seen_drop);
  fp4idx_client_free(s);
  fp4idx_client_close(c);
}

Test(e2e, daemon_gone_is_econn) {
  fp4idx_client_t *c = open_client();
  fp4idx_client_info_t in;
  CHECK(c, fp4idx_client_info(c, &in));
  fp4idx_test_daemon_stop(&daemon_);
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_ECONN);
  cr_expect(!fp4idx_client_connected(c));
  cr_expect_eq(fp4idx_client_connect(c, daemon_.sock), FP4IDX_ECONN);
  cr_expect_neq(fp4idx_client_last_error(c)[0], '\0');
  fp4idx_client_close(c);
}

Test(e2e, timeout_on_a_stopped_daemon) {
  fp4idx_client_t *c = open_client();
  cr_assert_eq(fp4idx_client_set_timeout(c, 300), FP4IDX_OK);
  cr_assert_eq(fp4idx_test_daemon_kill(&daemon_, SIGSTOP), 0);
  fp4idx_client_info_t in;
  int st = fp4idx_client_info(c, &in);
  fp4idx_test_daemon_kill(&daemon_, SIGCONT);
  cr_expect_eq(st, FP4IDX_ETIMEDOUT, "%s", fp4idx_status_name(st));
  cr_expect(!fp4idx_client_connected(c));
  /* Reconnect on the same handle and carry on. */
  CHECK(c, fp4idx_client_connect(c, daemon_.sock));
  CHECK(c, fp4idx_client_info(c, &in));
  fp4idx_client_close(c);
}

/* Bytes the daemon has sent so far (its stats, this connection's stats
 * call included). */
static uint64_t response_bytes(fp4idx_client_t *c) {
  fp4idx_client_stats_t *st = NULL;
  CHECK(c, fp4idx_client_stats(c, &st));
  uint64_t b = st->response_bytes;
  fp4idx_client_free(st);
  return b;
}

/* fp4idx_client_topk through the connection's reply region (the default
 * for results of 16 KiB and more) gives the socket's bytes; the results
 * then do not cross the socket; the region grows for a larger k (released
 * and made again), comes back after a reconnect, and is given up with fp4idx_client_set_reply_region(0);
 * errors are the socket's. */
Test(e2e, topk_through_the_reply_region_equals_the_socket) {
  golden_t g;
  golden_load(&g, "gauss_h64", 64);
  fp4idx_client_t *c = open_client(), *plain = open_client();
  CHECK(plain, fp4idx_client_set_reply_region(plain, 0));
  golden_append(c, 5, &g);
  static const uint32_t ks[] = {16, 2048, 1200, 4096, 2048, 4096};
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
    uint32_t k = ks[i];
    size_t m = (size_t)g.rows * k, bytes = m * 8 + (size_t)g.rows * 4;
    int32_t *pos = malloc(m * 4), *cnt = malloc((size_t)g.rows * 4);
    int32_t *rpos = malloc(m * 4), *rcnt = malloc((size_t)g.rows * 4);
    float *val = malloc(m * 4), *rval = malloc(m * 4);
    memset(pos, 0x5a, m * 4);
    memset(val, 0x5a, m * 4);
    memset(cnt, 0x5a, (size_t)g.rows * 4);
    if (i == 4) { /* a new connection: a new region (k 4096 grew the last one) */
      fp4idx_client_close(c);
      c = open_client();
    }
    uint64_t b0 = response_bytes(c);
    CHECK(c, fp4idx_client_topk(c, 5, 64, (uint32_t)g.rows, g.q, g.w, g.lens, k, pos, val,
                                cnt));
    uint64_t sent = response_bytes(c) - b0;
    CHECK(plain, fp4idx_client_topk(plain, 5, 64, (uint32_t)g.rows, g.q, g.w, g.lens, k, rpos,
                                    rval, rcnt));
    cr_expect_eq(memcmp(pos, rpos, m * 4), 0, "k %u: positions differ", k);
    cr_expect_eq(memcmp(val, rval, m * 4), 0, "k %u: logits differ", k);
    cr_expect_eq(memcmp(cnt, rcnt, (size_t)g.rows * 4), 0, "k %u: counts differ", k);
    /* `sent` holds the first stats call's own reply too (~10 kB): the
     * results of these k take 38-131 kB */
    if (bytes >= FP4IDX_CLIENT_REPLY_REGION_DEFAULT)
      cr_expect_lt(sent, bytes / 2, "k %u: %llu bytes through the socket", k,
                   (unsigned long long)sent);
    else
      cr_expect_geq(sent, bytes, "k %u: small results come by the socket", k);
    free(pos), free(cnt), free(rpos), free(rcnt), free(val), free(rval);
  }
  /* errors as the socket gives them, and the connection stays usable */
  size_t m = (size_t)g.rows * 2048;
  int32_t *pos = malloc(m * 4);
  float *val = malloc(m * 4);
  cr_expect_eq(fp4idx_client_topk(c, 999, 64, (uint32_t)g.rows, g.q, g.w, g.lens, 2048, pos, val,
                                  NULL),
               FP4IDX_ENOSEQ);
  cr_expect_eq(fp4idx_client_topk(plain, 999, 64, (uint32_t)g.rows, g.q, g.w, g.lens, 2048, pos,
                                  val, NULL),
               FP4IDX_ENOSEQ);
  cr_expect_str_eq(fp4idx_client_last_error(c), fp4idx_client_last_error(plain));
  uint16_t bad = g.q[0];
  g.q[0] = 0x7fc0; /* a NaN in q */
  cr_expect_eq(fp4idx_client_topk(c, 5, 64, (uint32_t)g.rows, g.q, g.w, g.lens, 2048, pos, val,
                                  NULL),
               FP4IDX_ENONFINITE);
  g.q[0] = bad;
  /* no reply region: the results come by the socket again */
  CHECK(c, fp4idx_client_set_reply_region(c, 0));
  uint64_t b0 = response_bytes(c);
  CHECK(c, fp4idx_client_topk(c, 5, 64, (uint32_t)g.rows, g.q, g.w, g.lens, 2048, pos, val,
                              NULL));
  cr_expect_geq(response_bytes(c) - b0, m * 8, "set_reply_region(0): the socket");
  free(pos), free(val);
  fp4idx_client_close(c);
  fp4idx_client_close(plain);
  golden_free(&g);
}

/* A connection that already holds the daemon's 16 regions gets no reply
 * region: the top-k comes through the socket, right, and later calls stay
 * there (no new register attempt per call). */
Test(e2e, topk_without_room_for_a_reply_region_uses_the_socket) {
  golden_t g;
  golden_load(&g, "gauss_h64", 64);
  fp4idx_client_t *c = open_client(), *plain = open_client();
  CHECK(plain, fp4idx_client_set_reply_region(plain, 0));
  golden_append(c, 6, &g);
  uint64_t ids[16];
  void *ptrs[16];
  for (int i = 0; i < 16; i++) CHECK(c, fp4idx_client_region_create(c, 4096, &ids[i], &ptrs[i]));
  const uint32_t k = 2048;
  size_t m = (size_t)g.rows * k;
  int32_t *pos = malloc(m * 4), *rpos = malloc(m * 4);
  float *val = malloc(m * 4), *rval = malloc(m * 4);
  for (int call = 0; call < 2; call++) {
    uint64_t b0 = response_bytes(c);
    CHECK(c, fp4idx_client_topk(c, 6, 64, (uint32_t)g.rows, g.q, g.w, g.lens, k, pos, val, NULL));
    cr_expect_geq(response_bytes(c) - b0, m * 8, "call %d: the results by the socket", call);
  }
  CHECK(plain, fp4idx_client_topk(plain, 6, 64, (uint32_t)g.rows, g.q, g.w, g.lens, k, rpos, rval,
                                  NULL));
  cr_expect_eq(memcmp(pos, rpos, m * 4), 0, "positions differ");
  cr_expect_eq(memcmp(val, rval, m * 4), 0, "logits differ");
  /* the region refused, the client does not ask again: still 16 regions */
  fp4idx_client_stats_t *st = NULL;
  CHECK(c, fp4idx_client_stats(c, &st));
  cr_expect_eq(st->status_errors[-FP4IDX_E2BIG], 1, "one refused register, not one per call");
  fp4idx_client_free(st);
  for (int i = 0; i < 16; i++) CHECK(c, fp4idx_client_region_destroy(c, ids[i], ptrs[i], 4096));
  free(pos), free(rpos), free(val), free(rval);
  fp4idx_client_close(c);
  fp4idx_client_close(plain);
  golden_free(&g);
}

TestSuite(e2e_small_frame, .init = start_small_frame, .fini = stop);

Test(e2e_small_frame, oversized_request_is_e2big) {
  size_t n = 8192; /* 2 MiB of bf16 keys against --max-frame 1M */
  uint16_t *k = calloc(n * 128, 2);
  fp4idx_client_t *c = open_client();
  /* Not knowing the limit, the library sends; the daemon refuses. */
  int st = fp4idx_client_append_bf16(c, 1, k, n, FP4IDX_ROUNDING_RNE, NULL, NULL);
  cr_expect_eq(st, FP4IDX_E2BIG, "%s: %s", fp4idx_status_name(st),
               fp4idx_client_last_error(c));
  /* After info the library knows max_frame and refuses before sending. */
  CHECK(c, fp4idx_client_connect(c, daemon_.sock));
  fp4idx_client_info_t in;
  CHECK(c, fp4idx_client_info(c, &in));
  cr_expect_eq(in.max_frame, 1u << 20);
  cr_expect_eq(fp4idx_client_append_bf16(c, 1, k, n, FP4IDX_ROUNDING_RNE, NULL,
                                         NULL),
               FP4IDX_E2BIG);
  cr_expect(strstr(fp4idx_client_last_error(c), "max frame") != NULL, "%s",
            fp4idx_client_last_error(c));
  cr_expect(fp4idx_client_connected(c), "a local refusal keeps the connection");
  CHECK(c, fp4idx_client_append_bf16(c, 1, k, 1000, FP4IDX_ROUNDING_RNE, NULL,
                                     NULL));
  fp4idx_client_close(c);
  free(k);
}

/* ---- one connection per thread ------------------------------------------- */

typedef struct {
  const golden_t *g;
  uint64_t seq;
  int ok;
  char why[256];
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  const golden_t *g = w->g;
  fp4idx_client_t *c = fp4idx_client_new();
  fp4idx_client_result_t *res = NULL;
  int st = c ? fp4idx_client_connect(c, daemon_.sock) : FP4IDX_ENOMEM;
  for (size_t at = 0; st == 0 && at < g->n; at += 100) {
    size_t m = g->n - at < 100 ? g->n - at : 100;
    st = fp4idx_client_append_bf16(c, w->seq, g->keys + at * 128, m,
                                   FP4IDX_ROUNDING_RNE, NULL, NULL);
  }
  fp4idx_client_seq_t s = {.seq = w->seq, .rows = (uint32_t)g->rows,
                           .q = g->q, .w = g->w, .lens = g->lens};
  for (int rep = 0; st == 0 && rep < 5; rep++) {
    st = fp4idx_client_score(c, (uint32_t)g->heads, 0, &s, 1, &res);
    if (st) break;
    int64_t d = 0;
    for (int r = 0; r < g->rows; r++)
      d += fp4idx_test_count_diff(res->logits + (size_t)r * res->width,
                                  g->ref + (size_t)r * g->n, res->width);
    fp4idx_client_free(res);
    if (d) {
      snprintf(w->why, sizeof w->why, "seq %llu: %lld logits differ",
               (unsigned long long)w->seq, (long long)d);
      fp4idx_client_close(c);
      return NULL;
    }
  }
  if (st)
    snprintf(w->why, sizeof w->why, "seq %llu: %s: %s",
             (unsigned long long)w->seq, fp4idx_status_name(st),
             fp4idx_client_last_error(c));
  w->ok = st == 0;
  fp4idx_client_close(c);
  return NULL;
}

Test(e2e, one_connection_per_thread) {
  golden_t g;
  golden_load(&g, "dyadic_h32", 32);
  enum { T = 8 };
  pthread_t th[T];
  worker_t w[T];
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){.g = &g, .seq = 1000 + (uint64_t)i};
    cr_assert_eq(pthread_create(&th[i], NULL, worker, &w[i]), 0);
  }
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < T; i++) cr_expect(w[i].ok, "%s", w[i].why);
  fp4idx_client_t *c = open_client();
  fp4idx_client_info_t in;
  CHECK(c, fp4idx_client_info(c, &in));
  cr_expect_eq(in.sequences, T);
  fp4idx_client_close(c);
  golden_free(&g);
}

/* A candidate mask through the library equals the float64 reference with
 * the same mask (tests/common), computed from the keys as stored. */
Test(e2e, mask_matches_reference) {
  golden_t g;
  golden_load(&g, "gauss_h32", 32);
  fp4idx_client_t *c = open_client();
  golden_append(c, 9, &g);
  void *packed;
  size_t n;
  CHECK(c, fp4idx_client_read(c, 9, 0, UINT64_MAX, 0, &packed, &n));
  cr_assert_eq(n, g.n);
  uint32_t W = max_len(&g);
  uint8_t *mask = malloc((size_t)g.rows * W);
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 77);
  for (size_t i = 0; i < (size_t)g.rows * W; i++)
    mask[i] = fp4idx_test_rng_below(&rng, 4) != 0;
  float *ref = malloc((size_t)g.rows * W * 4);
  cr_assert_eq(fp4idx_test_ref_score(packed, (int64_t)n, 32, g.rows, g.q, g.w,
                                     g.lens, mask, W, ref),
               0);
  fp4idx_client_seq_t s = {.seq = 9, .rows = (uint32_t)g.rows, .q = g.q,
                           .w = g.w, .lens = g.lens, .mask = mask,
                           .mask_width = W};
  fp4idx_client_result_t *res;
  CHECK(c, fp4idx_client_score(c, 32, 0, &s, 1, &res));
  cr_assert_eq(res[0].width, W);
  cr_expect_eq(fp4idx_test_count_diff(res[0].logits, ref,
                                      (int64_t)g.rows * W),
               0, "masked logits differ from the reference");
  size_t hidden = 0;
  for (size_t i = 0; i < (size_t)g.rows * W; i++)
    hidden += !mask[i] && res[0].logits[i] == -INFINITY;
  cr_expect(hidden > 0, "the mask hid nothing");
  fp4idx_client_free(res);
  /* A mask of the wrong width: ESHAPE from the daemon. */
  s.mask_width = W - 1;
  cr_expect_eq(fp4idx_client_score(c, 32, 0, &s, 1, &res), FP4IDX_ESHAPE,
               "%s", fp4idx_client_last_error(c));
  free(mask);
  free(ref);
  fp4idx_client_free(packed);
  fp4idx_client_close(c);
  golden_free(&g);
}

/* ---- a pool of two pages --------------------------------------------------- */

static void start_tiny_pool(void) {
  static const char *const extra[] = {"--cache-bytes", "8704", NULL}; /* 2x64x68 */
  cr_assert_eq(fp4idx_test_daemon_start(&daemon_, extra), 0,
               "fp4idxd did not start");
}

TestSuite(e2e_tiny_pool, .init = start_tiny_pool, .fini = stop);

Test(e2e_tiny_pool, full_pool_is_efull_and_changes_nothing) {
  fp4idx_client_t *c = open_client();
  fp4idx_client_info_t in;
  CHECK(c, fp4idx_client_info(c, &in));
  cr_assert_eq(in.pages_total, 2);
  uint16_t *k = calloc(129 * 128, 2);
  uint64_t len;
  CHECK(c, fp4idx_client_append_bf16(c, 1, k, 100, FP4IDX_ROUNDING_RNE, NULL,
                                     &len));
  cr_expect_eq(fp4idx_client_append_bf16(c, 1, k, 29, FP4IDX_ROUNDING_RNE,
                                         NULL, NULL),
               FP4IDX_EFULL);
  cr_expect_neq(fp4idx_client_last_error(c)[0], '\0');
  cr_expect(fp4idx_client_connected(c));
  cr_expect_eq(fp4idx_client_append_bf16(c, 2, k, 129, FP4IDX_ROUNDING_RNE,
                                         NULL, NULL),
               FP4IDX_EFULL);
  CHECK(c, fp4idx_client_truncate(c, 1, 100, &len));
  cr_expect_eq(len, 100, "the refused append stored keys");
  CHECK(c, fp4idx_client_append_bf16(c, 1, k, 28, FP4IDX_ROUNDING_RNE, NULL,
                                     &len));
  cr_expect_eq(len, 128);
  /* Dropping frees the pages for another sequence. */
  CHECK(c, fp4idx_client_drop(c, 1));
  CHECK(c, fp4idx_client_append_bf16(c, 2, k, 128, FP4IDX_ROUNDING_RNE, NULL,
                                     &len));
  cr_expect_eq(len, 128);
  free(k);
  fp4idx_client_close(c);
}

/* fp4idx_client_list: a full walk of the cursors sees every sequence with
 * its keys and pages; bad arguments change nothing on the connection. */
Test(e2e, list_walks_every_sequence) {
  fp4idx_client_t *c = open_client();
  static uint8_t slots[70 * FP4IDX_CLIENT_SLOT_BYTES];
  /* zero payloads, scale bytes 127 (0 and 255 are refused) */
  for (int i = 0; i < 70; i++) memset(slots + i * FP4IDX_CLIENT_SLOT_BYTES + 64, 127, 4);
  for (uint64_t s = 1; s <= 30; s++) {
    uint64_t first, len;
    cr_assert_eq(fp4idx_client_append_fp4(c, 500 + s, slots, (size_t)(s * 2 + 1), &first, &len),
                 FP4IDX_OK, "%s", fp4idx_client_last_error(c));
  }
  int seen[31] = {0};
  uint64_t cursor = 0;
  int steps = 0;
  do {
    fp4idx_client_seq_info_t *v;
    size_t n;
    cr_assert_eq(fp4idx_client_list(c, cursor, 4, &cursor, &v, &n), FP4IDX_OK, "%s",
                 fp4idx_client_last_error(c));
    for (size_t i = 0; i < n; i++) {
      cr_assert(v[i].seq > 500 && v[i].seq <= 530);
      uint64_t s = v[i].seq - 500;
      cr_assert_eq(v[i].keys, s * 2 + 1);
      cr_assert_eq(v[i].pages, (s * 2 + 1 + 63) / 64);
      seen[s]++;
    }
    fp4idx_client_free(v);
    cr_assert_lt(++steps, 10000);
  } while (cursor != 0);
  for (int s = 1; s <= 30; s++) cr_expect_eq(seen[s], 1, "sequence %d", 500 + s);
  /* arguments */
  fp4idx_client_seq_info_t *v = (void *)1;
  size_t n = 7;
  uint64_t next = 9;
  cr_expect_eq(fp4idx_client_list(c, 0, 10001, &next, &v, &n), FP4IDX_E2BIG);
  cr_expect_null(v);
  cr_expect_eq(n, 0u);
  cr_expect_eq(next, 0u);
  cr_expect_eq(fp4idx_client_list(c, 0, 1, NULL, &v, &n), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_client_list(NULL, 0, 1, &next, &v, &n), FP4IDX_EINVAL);
  cr_expect(fp4idx_client_connected(c));
  fp4idx_client_close(c);
}
