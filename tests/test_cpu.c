/* test_cpu.c -- the CPU backend: golden scorer cases bit for bit, store
 * (all-or-nothing, FP4 passthrough), read back, pages, top-k, arguments. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_backend.h"
#include "test_util.h"

static fp4idx_backend_t *mk(int threads, int64_t n_pages, int32_t P) {
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cpu_create(&b, threads), FP4IDX_OK);
  cr_assert_eq(b->ops->pool_create(b, n_pages, P), FP4IDX_OK);
  cr_assert_eq(b->n_pages, n_pages);
  cr_assert_eq(b->page_size, P);
  return b;
}

/* Scores one sequence into logits [rows, width]. */
static int score1(fp4idx_backend_t *b, int heads, const fp4idx_backend_seq_t *sq, float *out) {
  fp4idx_backend_batch_t bt = {.heads = heads, .n_seqs = 1, .seqs = sq, .logits = out};
  return b->ops->score(b, &bt);
}

/* ---- golden scorer cases ------------------------------------------------ */

static void golden_case(const char *name, int rows, int heads, int n, int threads, int32_t P) {
  char f[64];
#define LOAD(var, suffix, bytes)                                          \
  snprintf(f, sizeof f, "%s_%s.bin", name, suffix);                       \
  var = fp4idx_test_load_golden(f, (size_t)(bytes), NULL);                \
  cr_assert(var, "golden %s in %s", f, fp4idx_test_golden_dir());
  uint16_t *keys, *q, *w;
  int32_t *lens;
  float *ref;
  LOAD(keys, "keys", (size_t)n * 128 * 2);
  LOAD(q, "q", (size_t)rows * heads * 128 * 2);
  LOAD(w, "w", (size_t)rows * heads * 2);
  LOAD(lens, "lens", (size_t)rows * 4);
  LOAD(ref, "ref", (size_t)rows * n * 4);
#undef LOAD
  int64_t np = (n + P - 1) / P + 3;
  fp4idx_backend_t *b = mk(threads, np, P);
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 99);
  int32_t *pages = malloc(sizeof *pages * (size_t)np);
  int64_t *slots = malloc(sizeof *slots * (size_t)n);
  for (int64_t i = 0; i < np; i++) pages[i] = (int32_t)i;
  fp4idx_test_shuffle_i32(&rng, pages, np);
  for (int l = 0; l < n; l++) slots[l] = (int64_t)pages[l / P] * P + l % P;
  cr_assert_eq(b->ops->store(b, keys, FP4IDX_DTYPE_BF16, n, slots, FP4IDX_ROUND_RNE), 0);
  float *out = malloc(sizeof *out * (size_t)rows * n);
  fp4idx_backend_seq_t sq = {.pages = pages, .n_keys = n, .rows = rows, .width = n,
                           .q = q, .w = w, .lens = lens};
  cr_assert_eq(score1(b, heads, &sq, out), 0);
  int64_t diff = fp4idx_test_count_diff(out, ref, (int64_t)rows * n);
  cr_assert_eq(diff, 0, "%s: %lld of %d logits differ from the reference", name,
               (long long)diff, rows * n);
  /* and the -inf pattern is exactly the invisible positions */
  for (int r = 0; r < rows; r++)
    for (int l = 0; l < n; l++)
      cr_assert_eq(isinf(out[(int64_t)r * n + l]) && out[(int64_t)r * n + l] < 0, l >= lens[r]);
  /* the independent float64 reference of tests/common agrees as well */
  uint8_t *packed = malloc((size_t)n * 68);
  cr_assert_eq(b->ops->read(b, slots, n, 0, packed), 0);
  float *mine = malloc(sizeof *mine * (size_t)rows * n);
  cr_assert_eq(fp4idx_test_ref_score(packed, n, heads, rows, q, w, lens, NULL, n, mine), 0);
  cr_assert_eq(fp4idx_test_count_diff(mine, ref, (int64_t)rows * n), 0, "test_util reference");
  free(mine);
  free(packed);
  free(out);
  free(slots);
  free(pages);
  free(keys);
  free(q);
  free(w);
  free(lens);
  free(ref);
  fp4idx_backend_destroy(b);
}

Test(cpu_golden, dyadic_h32) { golden_case("dyadic_h32", 4, 32, 1000, 0, 64); }
Test(cpu_golden, gauss_h32) { golden_case("gauss_h32", 4, 32, 1000, 0, 64); }
Test(cpu_golden, gauss_h64) { golden_case("gauss_h64", 6, 64, 777, 0, 64); }
Test(cpu_golden, gauss_h64_one_thread_page16) { golden_case("gauss_h64", 6, 64, 777, 1, 16); }
Test(cpu_golden, gauss_h32_three_threads_page1) { golden_case("gauss_h32", 4, 32, 1000, 3, 1); }
Test(cpu_golden, every_isa) {
  const char *isas[] = {"generic", "avx2", "avx512"};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(setenv("FP4IDX_CPU_ISA", isas[i], 1), 0);
    golden_case("dyadic_h32", 4, 32, 1000, 2, 64);
    golden_case("gauss_h32", 4, 32, 1000, 2, 64);
    golden_case("gauss_h64", 6, 64, 777, 2, 16);
  }
}

/* ---- store / read --------------------------------------------------------- */

Test(cpu_store, quantize_matches_golden_and_reads_back) {
  uint16_t *keys = fp4idx_test_load_golden("quant_keys.bin", 512 * 256, NULL);
  uint8_t *pay = fp4idx_test_load_golden("quant_payload_thr.bin", 512 * 64, NULL);
  uint8_t *sc = fp4idx_test_load_golden("quant_scales_thr.bin", 512 * 4, NULL);
  cr_assert(keys && pay && sc);
  fp4idx_backend_t *b = mk(2, 20, 32);
  int64_t slots[512];
  for (int i = 0; i < 512; i++) slots[i] = (i * 7 + 3) % 640; /* scattered, distinct */
  cr_assert_eq(b->ops->store(b, keys, FP4IDX_DTYPE_BF16, 512, slots, FP4IDX_ROUND_THRESHOLD), 0);
  uint8_t *back = malloc(512 * 68);
  cr_assert_eq(b->ops->read(b, slots, 512, 0, back), 0);
  for (int i = 0; i < 512; i++) {
    cr_assert_eq(memcmp(back + i * 68, pay + i * 64, 64), 0, "payload %d", i);
    cr_assert_eq(memcmp(back + i * 68 + 64, sc + i * 4, 4), 0, "scales %d", i);
  }
  /* page bytes are where fp4idx_format.h says */
  uint8_t *page = malloc(32 * 68);
  int64_t s = slots[5];
  cr_assert_eq(b->ops->read_pages(b, s / 32, 1, page), 0);
  cr_assert_eq(memcmp(page + (s % 32) * 64, pay + 5 * 64, 64), 0);
  cr_assert_eq(memcmp(page + 32 * 64 + (s % 32) * 4, sc + 5 * 4, 4), 0);
  free(page);
  free(back);
  free(keys);
  free(pay);
  free(sc);
  fp4idx_backend_destroy(b);
}

Test(cpu_store, nonfinite_rejected_nothing_stored) {
  fp4idx_backend_t *b = mk(2, 4, 16);
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 5);
  enum { N = 10 };
  int64_t slots[N];
  for (int i = 0; i < N; i++) slots[i] = 3 + 5 * i;
  /* fill the slots with known bytes first */
  uint8_t before[N * 68];
  for (int i = 0; i < N * 68; i++) before[i] = (uint8_t)fp4idx_test_rng_next(&rng);
  cr_assert_eq(b->ops->store(b, before, FP4IDX_DTYPE_FP4, N, slots, FP4IDX_ROUND_RNE), 0);
  float bad[3] = {NAN, INFINITY, -INFINITY};
  for (int k = 0; k < 3; k++)
    for (int dt = 0; dt < 2; dt++) {
      float kf[N * 128];
      uint16_t kb[N * 128];
      for (int i = 0; i < N * 128; i++) kf[i] = (float)fp4idx_test_rng_range(&rng, -40, 40) / 8;
      kf[(N - 1) * 128 + 77] = bad[k]; /* only the LAST key is bad */
      for (int i = 0; i < N * 128; i++) kb[i] = fp4idx_f32_to_bf16(kf[i]);
      int rc = dt ? b->ops->store(b, kf, FP4IDX_DTYPE_F32, N, slots, FP4IDX_ROUND_RNE)
                  : b->ops->store(b, kb, FP4IDX_DTYPE_BF16, N, slots, FP4IDX_ROUND_RNE);
      cr_assert_eq(rc, FP4IDX_ENONFINITE, "bad %d dtype %d", k, dt);
      uint8_t after[N * 68];
      cr_assert_eq(b->ops->read(b, slots, N, 0, after), 0);
      cr_assert_eq(memcmp(before, after, sizeof before), 0, "no slot changed");
    }
  fp4idx_backend_destroy(b);
}

Test(cpu_store, fp4_passthrough_and_dequant) {
  fp4idx_backend_t *b = mk(1, 3, 8);
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 11);
  enum { N = 24 };
  uint8_t in[N * 68], out[N * 68];
  for (int i = 0; i < N * 68; i++) in[i] = (uint8_t)fp4idx_test_rng_next(&rng);
  for (int i = 0; i < N; i++) /* every scale byte but 0/255 occurs somewhere */
    for (int j = 0; j < 4; j++) in[i * 68 + 64 + j] = (uint8_t)(1 + (i * 4 + j) * 5 % 253);
  int64_t slots[N];
  for (int i = 0; i < N; i++) slots[i] = N - 1 - i;
  cr_assert_eq(b->ops->store(b, in, FP4IDX_DTYPE_FP4, N, slots, FP4IDX_ROUND_RNE), 0);
  cr_assert_eq(b->ops->read(b, slots, N, 0, out), 0);
  cr_assert_eq(memcmp(in, out, sizeof in), 0);
  float *deq = malloc(sizeof(float) * N * 128);
  cr_assert_eq(b->ops->read(b, slots, N, 1, deq), 0);
  for (int i = 0; i < N; i++)
    for (int e = 0; e < 128; e++) {
      unsigned byte = in[i * 68 + e / 2];
      unsigned code = (e & 1) ? byte >> 4 : byte & 15u;
      double want = fp4idx_test_e2m1_value(code) * fp4idx_test_ue8m0_value(in[i * 68 + 64 + e / 32]);
      cr_assert_eq((double)deq[i * 128 + e], want, "key %d elem %d", i, e);
    }
  free(deq);
  fp4idx_backend_destroy(b);
}

Test(cpu_store, pages_roundtrip) {
  fp4idx_backend_t *b = mk(2, 5, 4);
  uint8_t buf[5 * 4 * 68], back[5 * 4 * 68];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 31 + 7);
  cr_assert_eq(b->ops->write_pages(b, 0, 5, buf), 0);
  cr_assert_eq(b->ops->read_pages(b, 0, 5, back), 0);
  cr_assert_eq(memcmp(buf, back, sizeof buf), 0);
  memset(back, 0, sizeof back);
  cr_assert_eq(b->ops->read_pages(b, 2, 2, back), 0);
  cr_assert_eq(memcmp(buf + 2 * 4 * 68, back, 2 * 4 * 68), 0);
  cr_assert_eq(b->ops->read_pages(b, 4, 2, back), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->write_pages(b, -1, 1, buf), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->read_pages(b, 5, 0, back), 0);
  fp4idx_backend_destroy(b);
}

Test(cpu_misc, describe) {
  fp4idx_backend_t *b = mk(2, 1, 64);
  fp4idx_backend_info_t info;
  cr_assert_eq(b->ops->describe(b, &info), 0);
  cr_assert_str_eq(info.name, "cpu");
  cr_assert_eq(info.device_index, -1);
  cr_assert(strstr(info.device, "2 threads"), "device: %s", info.device);
  cr_assert(strstr(info.device, "generic") || strstr(info.device, "avx2") ||
                strstr(info.device, "avx512"),
            "device names the kernel ISA: %s", info.device);
  cr_assert(info.mem_total > 0 && info.mem_free <= info.mem_total);
  fp4idx_backend_destroy(b);
}

/* ---- argument errors -------------------------------------------------------- */

Test(cpu_args, create_and_pool) {
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cpu_create(NULL, 1), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_backend_cpu_create(&b, -1), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_backend_cpu_create(&b, 2), 0);
  uint8_t x[68] = {0};
  int64_t slot = 0;
  cr_assert_eq(b->ops->store(b, x, FP4IDX_DTYPE_FP4, 1, &slot, FP4IDX_ROUND_RNE), FP4IDX_EINVAL,
               "no pool yet");
  cr_assert_eq(b->ops->pool_create(b, 0, 64), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->pool_create(b, 4, 48), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->pool_create(b, 4, 0), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->pool_create(b, INT64_MAX / 4, 64), FP4IDX_ENOMEM);
  cr_assert_eq(b->ops->pool_create(b, 4, 64), 0);
  cr_assert_eq(b->ops->pool_create(b, 4, 64), FP4IDX_EINVAL, "only once");
  fp4idx_backend_destroy(b);
  fp4idx_backend_destroy(NULL);
}

Test(cpu_args, store_read) {
  fp4idx_backend_t *b = mk(1, 2, 4);
  uint16_t k[2 * 128] = {0};
  int64_t ok[2] = {0, 7}, bad[2] = {0, 8}, neg[1] = {-1};
  cr_assert_eq(b->ops->store(b, k, FP4IDX_DTYPE_BF16, 2, ok, FP4IDX_ROUND_RNE), 0);
  cr_assert_eq(b->ops->store(b, k, FP4IDX_DTYPE_BF16, 2, bad, FP4IDX_ROUND_RNE), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->store(b, k, FP4IDX_DTYPE_BF16, 1, neg, FP4IDX_ROUND_RNE), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->store(b, k, (fp4idx_dtype_t)9, 1, ok, FP4IDX_ROUND_RNE), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->store(b, k, FP4IDX_DTYPE_BF16, 1, ok, (fp4idx_rounding_t)5), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->store(b, NULL, FP4IDX_DTYPE_BF16, 1, ok, FP4IDX_ROUND_RNE), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->store(b, k, FP4IDX_DTYPE_BF16, -1, ok, FP4IDX_ROUND_RNE), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->store(b, k, FP4IDX_DTYPE_BF16, 0, NULL, FP4IDX_ROUND_RNE), 0);
  uint8_t out[2 * 68];
  cr_assert_eq(b->ops->read(b, bad, 2, 0, out), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->read(b, ok, 2, 0, NULL), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->read(b, ok, 2, 0, out), 0);
  fp4idx_backend_destroy(b);
}

Test(cpu_args, score) {
  fp4idx_backend_t *b = mk(2, 2, 4);
  int32_t pages[2] = {1, 0}, lens[2] = {8, 3}, badpages[2] = {0, 2};
  uint16_t q[2 * 2 * 128] = {0}, w[4] = {0};
  float out[16];
  fp4idx_backend_seq_t sq = {.pages = pages, .n_keys = 8, .rows = 2, .width = 8,
                           .q = q, .w = w, .lens = lens};
  fp4idx_backend_batch_t bt = {.heads = 2, .n_seqs = 1, .seqs = &sq, .logits = out};
  cr_assert_eq(b->ops->score(b, &bt), 0);
  fp4idx_backend_batch_t t = bt;
  t.heads = 0;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  t.heads = 129;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  t = bt;
  t.logits = NULL;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  t = bt;
  t.topk = 2; /* no top-k outputs */
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  t = bt;
  t.topk = -1;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  fp4idx_backend_seq_t s2 = sq;
  t = bt;
  t.seqs = &s2;
  s2.width = 9; /* wider than the sequence */
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  s2 = sq;
  s2.width = 7; /* lens[0] = 8 > width */
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  s2 = sq;
  s2.pages = badpages;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  s2 = sq;
  s2.rows = 0;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  s2 = sq;
  int32_t pages3[3] = {1, 0, 2}; /* a third page, beyond the 2-page pool */
  s2.n_keys = 9;
  s2.pages = pages3;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  s2 = sq;
  s2.q = NULL;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  s2 = sq;
  s2.lens = NULL;
  cr_assert_eq(b->ops->score(b, &t), FP4IDX_EINVAL);
  t = bt;
  t.n_seqs = 0;
  cr_assert_eq(b->ops->score(b, &t), 0, "empty batch is fine");
  fp4idx_backend_destroy(b);
}

/* Non-finite q stays confined to visible positions: invisible ones are -inf. */
Test(cpu_score, nonfinite_query_keeps_invisible_minus_inf) {
  fp4idx_backend_t *b = mk(2, 2, 64);
  fp4idx_test_case_t c;
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 3);
  int32_t lens[2] = {50, 10};
  cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, 4, 2, 100, 64, 2, lens, 0), 0);
  cr_assert_eq(b->ops->store(b, c.packed, FP4IDX_DTYPE_FP4, c.n_keys, c.slots, 0), 0);
  c.q[5] = 0x7fc0; /* NaN in row 0 */
  c.q[4 * 128 + 9] = 0x7f80; /* inf in row 1 */
  float *out = malloc(sizeof(float) * 2 * 100);
  fp4idx_backend_seq_t sq = {.pages = c.pages, .n_keys = 100, .rows = 2, .width = 100,
                           .q = c.q, .w = c.w, .lens = c.lens};
  cr_assert_eq(score1(b, 4, &sq, out), 0);
  for (int r = 0; r < 2; r++)
    for (int l = lens[r]; l < 100; l++) cr_assert(isinf(out[r * 100 + l]) && out[r * 100 + l] < 0);
  float *ref = malloc(sizeof(float) * 2 * 100);
  cr_assert_eq(fp4idx_test_ref_score(c.packed, 100, 4, 2, c.q, c.w, c.lens, NULL, 100, ref), 0);
  cr_assert_eq(fp4idx_test_count_diff(out, ref, 200), 0, "NaN/inf propagate like the reference");
  free(out);
  free(ref);
  fp4idx_test_case_free(&c);
  fp4idx_backend_destroy(b);
}

/* Many calls on one backend (the pool's workers are reused every call),
 * alternating logits and top-k, sizes from one tile to many: every result
 * equals the first one of its kind. Run under TSan/ASan in CI. */
Test(cpu_score, repeated_calls_reuse_the_pool) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 2024);
  fp4idx_test_case_t c;
  cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, 8, 3, 700, 16, 0, NULL, 0), 0);
  fp4idx_backend_t *b = mk(2, c.n_pages, 16);
  cr_assert_eq(b->ops->store(b, c.keys, FP4IDX_DTYPE_BF16, c.n_keys, c.slots, 0), 0);
  float *first = malloc(sizeof(float) * 3 * 700), *out = malloc(sizeof(float) * 3 * 700);
  float *ref = malloc(sizeof(float) * 3 * 700);
  int32_t pos[3 * 9], cnt[3];
  float val[3 * 9];
  for (int it = 0; it < 200; it++) {
    int32_t lens[3];
    int64_t width = 1 + (int64_t)fp4idx_test_rng_below(&rng, 700);
    if (it < 2) width = 700;
    for (int r = 0; r < 3; r++) lens[r] = (int32_t)(width - r > 0 ? width - r : 0);
    fp4idx_backend_seq_t sq = {.pages = c.pages, .n_keys = 700, .rows = 3, .width = width,
                             .q = c.q, .w = c.w, .lens = lens};
    if (it % 2 == 0) {
      fp4idx_backend_batch_t bt = {.heads = 8, .n_seqs = 1, .seqs = &sq, .logits = out};
      cr_assert_eq(b->ops->score(b, &bt), 0);
      if (it == 0) {
        memcpy(first, out, sizeof(float) * 3 * 700);
        cr_assert_eq(fp4idx_test_ref_score(c.packed, 700, 8, 3, c.q, c.w, lens, NULL, 700, ref), 0);
        cr_assert_eq(fp4idx_test_count_diff(first, ref, 3 * 700), 0);
      }
      /* a narrower call sees a prefix of the keys: same logits there */
      for (int r = 0; r < 3; r++)
        for (int64_t l = 0; l < lens[r]; l++)
          cr_assert_eq(memcmp(&out[r * width + l], &first[r * 700 + l], 4), 0, "it %d", it);
    } else {
      fp4idx_backend_batch_t bt = {.heads = 8, .n_seqs = 1, .seqs = &sq, .topk = 9,
                                 .topk_pos = pos, .topk_val = val, .topk_count = cnt};
      cr_assert_eq(b->ops->score(b, &bt), 0);
      {
        int32_t rpos[3 * 9], rcnt[3];
        float rval[3 * 9];
        /* reference top-k of the first full logits restricted to width */
        float *sub = malloc(sizeof(float) * 3 * (size_t)width);
        for (int r = 0; r < 3; r++)
          for (int64_t l = 0; l < width; l++)
            sub[r * width + l] = l < lens[r] ? first[r * 700 + l] : -INFINITY;
        cr_assert_eq(fp4idx_test_ref_topk(sub, 3, width, 9, rpos, rval, rcnt), 0);
        cr_assert_eq(memcmp(pos, rpos, sizeof pos), 0, "it %d", it);
        cr_assert_eq(memcmp(cnt, rcnt, sizeof cnt), 0, "it %d", it);
        cr_assert_eq(fp4idx_test_count_diff(val, rval, 3 * 9), 0, "it %d", it);
        free(sub);
      }
    }
  }
  free(first), free(out), free(ref);
  fp4idx_test_case_free(&c);
  fp4idx_backend_destroy(b);
}

/* NaN logits in top-k. The daemon refuses what can produce them (NaN/inf in
 * q or w, scale bytes outside 1..254: ENONFINITE), but the kernel's order
 * stays defined anyway: NaN positions are left out (like -inf ones), the
 * others come in (logit desc, position asc), counts say how many -- the same
 * for every thread count, ISA and call. Keys with scale byte 255 (UE8M0 NaN,
 * +inf in the exact decoder) give NaN or inf logits at their positions. */
Test(cpu_score, topk_orders_nan_logits_deterministically) {
  fp4idx_test_case_t c;
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 1313);
  const int R = 3, H = 4, N = 300, K = 16;
  cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, H, R, N, 64, 0, NULL, 0), 0);
  for (int i = 0; i < N; i += 7) c.packed[(size_t)i * 68 + 64 + (i % 4)] = 255;
  float *ref = malloc(sizeof(float) * (size_t)R * N);
  int32_t rlens[3] = {N, N, N - 5};
  cr_assert_eq(fp4idx_test_ref_score(c.packed, N, H, R, c.q, c.w, rlens, NULL, N, ref), 0);
  int nan_seen = 0;
  for (int i = 0; i < R * N; i++) nan_seen += isnan(ref[i]);
  cr_assert_gt(nan_seen, 0, "the case has NaN logits");
  int32_t rpos[3 * 16], rcnt[3];
  float rval[3 * 16];
  cr_assert_eq(fp4idx_test_ref_topk(ref, R, N, K, rpos, rval, rcnt), 0);
  const char *isas[] = {"generic", "avx2", "avx512"};
  for (int isa = 0; isa < 3; isa++) {
    setenv("FP4IDX_CPU_ISA", isas[isa], 1); /* lowers the choice only */
    for (int threads = 1; threads <= 3; threads += 2) {
      fp4idx_backend_t *b = mk(threads, c.n_pages, 64);
      cr_assert_eq(b->ops->store(b, c.packed, FP4IDX_DTYPE_FP4, c.n_keys, c.slots, 0), 0);
      int32_t lens[3] = {N, N, N - 5};
      fp4idx_backend_seq_t sq = {.pages = c.pages, .n_keys = N, .rows = R, .width = N,
                                 .q = c.q, .w = c.w, .lens = lens};
      for (int call = 0; call < 3; call++) {
        int32_t pos[3 * 16], cnt[3];
        float val[3 * 16];
        fp4idx_backend_batch_t bt = {.heads = H, .n_seqs = 1, .seqs = &sq, .topk = K,
                                     .topk_pos = pos, .topk_val = val, .topk_count = cnt};
        cr_assert_eq(b->ops->score(b, &bt), 0);
        cr_assert_eq(memcmp(pos, rpos, sizeof pos), 0, "%s, %d threads, call %d: positions",
                     isas[isa], threads, call);
        cr_assert_eq(memcmp(cnt, rcnt, sizeof cnt), 0, "%s, %d threads: counts", isas[isa],
                     threads);
        cr_assert_eq(fp4idx_test_count_diff(val, rval, R * K), 0);
        for (int i = 0; i < R * K; i++) cr_assert(!isnan(val[i]), "no NaN is returned");
      }
      fp4idx_backend_destroy(b);
    }
  }
  unsetenv("FP4IDX_CPU_ISA");
  free(ref);
  fp4idx_test_case_free(&c);
}
