/* test_cuda.c -- the CUDA backend against the CPU backend (the oracle), the
 * float64 reference of tests/common and the golden files. Every test skips
 * cleanly when no GPU is present.
 *
 * Covered: device decode of all 16 E2M1 x 256 UE8M0 codes; quantize/store
 * bytes (bf16 and f32, RNE and threshold) == golden and CPU; all-or-nothing
 * on NaN/inf; FP4 passthrough and dequantized reads; scores bit-exact on the
 * golden cases and randomized dyadic cases (H 1, 32, 64, 128, odd H, rows
 * 1..8, contexts up to 400,000, shuffled pages, page sizes 1..256, visible
 * counts 0, 1, 63, 64, 65, n, masks, several sequences); top-k == CPU; a
 * CUDA graph replayed with changed lengths; the portable mma.sync scorer
 * launched by argument on any GPU (the backend runs it only off sm_90);
 * pages above byte offsets 2^32 and 2^36 of a > 64 GiB pool; batches whose
 * visible counts are all zero.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "fp4idx_backend.h"
#include "fp4idx_cuda.h"
#include "test_gpu.h"
#include "test_util.h"

static fp4idx_backend_t *mk_cuda(int64_t n_pages, int32_t P) {
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cuda_create(&b, 0), FP4IDX_OK);
  cr_assert_eq(b->ops->pool_create(b, n_pages, P), FP4IDX_OK);
  return b;
}

static fp4idx_backend_t *mk_cpu(int64_t n_pages, int32_t P) {
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cpu_create(&b, 0), FP4IDX_OK);
  cr_assert_eq(b->ops->pool_create(b, n_pages, P), FP4IDX_OK);
  return b;
}

/* ---- decode ------------------------------------------------------------- */

Test(cuda_decode, all_e2m1_and_ue8m0_codes_exact) {
  NEED_GPU();
  uint16_t *d = NULL, h[256 * 16];
  cr_assert_eq(cudaMalloc((void **)&d, sizeof h), cudaSuccess);
  cr_assert_eq(fp4idx_cuda_decode_table_launch(d, 0), FP4IDX_OK);
  cr_assert_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  int bad = 0;
  for (unsigned s = 0; s < 256; s++)
    for (unsigned c = 0; c < 16; c++) {
      double exact = fp4idx_test_e2m1_value(c) * fp4idx_test_ue8m0_value(s);
      uint16_t want = fp4idx_test_f64_to_bf16(exact);
      uint16_t got = h[s * 16 + c];
      int ok;
      if (exact != exact) ok = (got & 0x7f80) == 0x7f80 && (got & 0x7f);
      else ok = got == want || (exact == 0.0 && (got & 0x7fff) == 0 && (got >> 15) == (want >> 15));
      if (!ok && bad++ < 10)
        cr_log_error("code %u scale %u: got 0x%04x want 0x%04x (%g)", c, s, got, want, exact);
    }
  cr_assert_eq(bad, 0, "%d of 4096 decoded values wrong", bad);
}

/* ---- store / read ------------------------------------------------------- */

static void store_golden(fp4idx_rounding_t mode, const char *pay, const char *sc) {
  const int n = 512;
  uint16_t *keys = fp4idx_test_load_golden("quant_keys.bin", (size_t)n * 256, NULL);
  uint8_t *gp = fp4idx_test_load_golden(pay, (size_t)n * 64, NULL);
  uint8_t *gs = fp4idx_test_load_golden(sc, (size_t)n * 4, NULL);
  cr_assert(keys && gp && gs, "golden files in %s", fp4idx_test_golden_dir());
  const int32_t P = 64;
  fp4idx_backend_t *g = mk_cuda(n / P + 2, P), *c = mk_cpu(n / P + 2, P);
  int64_t *slots = malloc(sizeof *slots * n);
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 5);
  int32_t perm[512 + 128];
  for (int i = 0; i < n + 128; i++) perm[i] = i;
  fp4idx_test_shuffle_i32(&rng, perm, n + 128);
  for (int i = 0; i < n; i++) slots[i] = perm[i];
  /* bf16 keys, and the same keys as f32 (exact), must give the same bytes */
  float *kf = malloc(sizeof *kf * n * 128);
  for (int i = 0; i < n * 128; i++) kf[i] = (float)fp4idx_test_bf16_to_f64(keys[i]);
  uint8_t *rd = malloc((size_t)n * 68), *rc = malloc((size_t)n * 68);
  for (int pass = 0; pass < 2; pass++) {
    const void *src = pass ? (const void *)kf : (const void *)keys;
    fp4idx_dtype_t dt = pass ? FP4IDX_DTYPE_F32 : FP4IDX_DTYPE_BF16;
    cr_assert_eq(g->ops->store(g, src, dt, n, slots, mode), 0);
    cr_assert_eq(c->ops->store(c, src, dt, n, slots, mode), 0);
    cr_assert_eq(g->ops->read(g, slots, n, 0, rd), 0);
    cr_assert_eq(c->ops->read(c, slots, n, 0, rc), 0);
    int bad = 0;
    for (int i = 0; i < n; i++)
      bad += memcmp(rd + 68 * i, gp + 64 * i, 64) != 0 || memcmp(rd + 68 * i + 64, gs + 4 * i, 4) != 0;
    cr_assert_eq(bad, 0, "%d of %d keys differ from %s (dtype %d)", bad, n, pay, dt);
    cr_assert_eq(memcmp(rd, rc, (size_t)n * 68), 0, "GPU and CPU bytes differ");
  }
  /* pages: the raw pool equals the CPU's */
  size_t pb = (size_t)(n / P + 2) * P * 68;
  uint8_t *pg = malloc(pb), *pc = malloc(pb);
  cr_assert_eq(g->ops->read_pages(g, 0, n / P + 2, pg), 0);
  cr_assert_eq(c->ops->read_pages(c, 0, n / P + 2, pc), 0);
  cr_assert_eq(memcmp(pg, pc, pb), 0, "page bytes differ");
  /* dequantized read == CPU's */
  float *dg = malloc(sizeof *dg * n * 128), *dc = malloc(sizeof *dc * n * 128);
  cr_assert_eq(g->ops->read(g, slots, n, 1, dg), 0);
  cr_assert_eq(c->ops->read(c, slots, n, 1, dc), 0);
  cr_assert_eq(fp4idx_test_count_diff(dg, dc, (int64_t)n * 128), 0);
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  free(keys); free(gp); free(gs); free(slots); free(kf); free(rd); free(rc);
  free(pg); free(pc); free(dg); free(dc);
}

Test(cuda_store, golden_rne) {
  NEED_GPU();
  store_golden(FP4IDX_ROUND_RNE, "quant_payload_rne.bin", "quant_scales_rne.bin");
}

Test(cuda_store, golden_threshold) {
  NEED_GPU();
  store_golden(FP4IDX_ROUND_THRESHOLD, "quant_payload_thr.bin", "quant_scales_thr.bin");
}

Test(cuda_store, nonfinite_rejected_nothing_written) {
  NEED_GPU();
  const int n = 300;
  fp4idx_backend_t *g = mk_cuda(8, 64);
  uint16_t *k = malloc((size_t)n * 256);
  int64_t *slots = malloc(sizeof *slots * n);
  for (int i = 0; i < n * 128; i++) k[i] = (uint16_t)(0x3f80 + (i % 7));
  for (int i = 0; i < n; i++) slots[i] = i;
  cr_assert_eq(g->ops->store(g, k, FP4IDX_DTYPE_BF16, n, slots, FP4IDX_ROUND_RNE), 0);
  uint8_t *before = malloc((size_t)n * 68), *after = malloc((size_t)n * 68);
  cr_assert_eq(g->ops->read(g, slots, n, 0, before), 0);
  const uint16_t bad[3] = {0x7fc0, 0x7f80, 0xff80}; /* NaN, +inf, -inf */
  for (int j = 0; j < 3; j++) {
    for (int i = 0; i < n * 128; i++) k[i] = (uint16_t)(0x4000 + (i % 5));
    k[(n - 1 - 97 * j) * 128 + 17 * j] = bad[j];
    cr_assert_eq(g->ops->store(g, k, FP4IDX_DTYPE_BF16, n, slots, FP4IDX_ROUND_RNE),
                 FP4IDX_ENONFINITE);
    cr_assert_eq(g->ops->read(g, slots, n, 0, after), 0);
    cr_assert_eq(memcmp(before, after, (size_t)n * 68), 0, "a rejected store wrote bytes");
  }
  float *kf = malloc(sizeof *kf * 128);
  for (int i = 0; i < 128; i++) kf[i] = 1.0f;
  kf[5] = NAN;
  cr_assert_eq(g->ops->store(g, kf, FP4IDX_DTYPE_F32, 1, slots, FP4IDX_ROUND_RNE),
               FP4IDX_ENONFINITE);
  fp4idx_backend_destroy(g);
  free(k); free(slots); free(before); free(after); free(kf);
}

Test(cuda_store, fp4_passthrough) {
  NEED_GPU();
  const int n = 200;
  fp4idx_backend_t *g = mk_cuda(16, 32);
  uint8_t *p = malloc((size_t)n * 68), *r = malloc((size_t)n * 68);
  int64_t *slots = malloc(sizeof *slots * n);
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 3);
  for (int i = 0; i < n * 68; i++) p[i] = (uint8_t)fp4idx_test_rng_next(&rng);
  for (int i = 0; i < n; i++) slots[i] = (int64_t)(i * 7 % (16 * 32));
  cr_assert_eq(g->ops->store(g, p, FP4IDX_DTYPE_FP4, n, slots, FP4IDX_ROUND_RNE), 0);
  cr_assert_eq(g->ops->read(g, slots, n, 0, r), 0);
  cr_assert_eq(memcmp(p, r, (size_t)n * 68), 0);
  fp4idx_backend_destroy(g);
  free(p); free(r); free(slots);
}

Test(cuda_args, errors) {
  NEED_GPU();
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cuda_create(&b, 4096), FP4IDX_ENODEV);
  cr_assert_eq(fp4idx_backend_cuda_create(&b, 0), FP4IDX_OK);
  cr_assert_eq(b->ops->pool_create(b, 4, 48), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->pool_create(b, 4, 64), FP4IDX_OK);
  int64_t slot = 4 * 64;
  uint16_t k[128] = {0};
  cr_assert_eq(b->ops->store(b, k, FP4IDX_DTYPE_BF16, 1, &slot, FP4IDX_ROUND_RNE), FP4IDX_EINVAL);
  fp4idx_backend_info_t info;
  cr_assert_eq(b->ops->describe(b, &info), 0);
  cr_assert_str_eq(info.name, "cuda");
  cr_assert(info.mem_total > 0);
  fp4idx_backend_destroy(b);
}

/* ---- scores -------------------------------------------------------------- */

static void golden_score(const char *name, int rows, int heads, int n, int32_t P) {
  char f[64];
  uint16_t *keys, *q, *w;
  int32_t *lens;
  float *ref;
#define LOAD(var, suffix, bytes)                            \
  snprintf(f, sizeof f, "%s_%s.bin", name, suffix);         \
  var = fp4idx_test_load_golden(f, (size_t)(bytes), NULL);  \
  cr_assert(var, "golden %s", f);
  LOAD(keys, "keys", (size_t)n * 256);
  LOAD(q, "q", (size_t)rows * heads * 256);
  LOAD(w, "w", (size_t)rows * heads * 2);
  LOAD(lens, "lens", (size_t)rows * 4);
  LOAD(ref, "ref", (size_t)rows * n * 4);
#undef LOAD
  int64_t np = (n + P - 1) / P + 3;
  fp4idx_backend_t *g = mk_cuda(np, P);
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 77);
  int32_t *pages = malloc(sizeof *pages * np);
  int64_t *slots = malloc(sizeof *slots * n);
  for (int64_t i = 0; i < np; i++) pages[i] = (int32_t)i;
  fp4idx_test_shuffle_i32(&rng, pages, np);
  for (int l = 0; l < n; l++) slots[l] = (int64_t)pages[l / P] * P + l % P;
  cr_assert_eq(g->ops->store(g, keys, FP4IDX_DTYPE_BF16, n, slots, FP4IDX_ROUND_RNE), 0);
  float *out = malloc(sizeof *out * rows * n);
  fp4idx_backend_seq_t sq = {.pages = pages, .n_keys = n, .rows = rows, .width = n,
                           .q = q, .w = w, .lens = lens};
  fp4idx_backend_batch_t bt = {.heads = heads, .n_seqs = 1, .seqs = &sq, .logits = out};
  cr_assert_eq(g->ops->score(g, &bt), 0);
  int64_t diff = fp4idx_test_count_diff(out, ref, (int64_t)rows * n);
  cr_assert_eq(diff, 0, "%s: %lld of %d logits differ from the golden reference", name,
               (long long)diff, rows * n);
  fp4idx_backend_destroy(g);
  free(keys); free(q); free(w); free(lens); free(ref); free(pages); free(slots); free(out);
}

Test(cuda_golden, dyadic_h32) { NEED_GPU(); golden_score("dyadic_h32", 4, 32, 1000, 64); }
Test(cuda_golden, gauss_h32) { NEED_GPU(); golden_score("gauss_h32", 4, 32, 1000, 64); }
Test(cuda_golden, gauss_h64) { NEED_GPU(); golden_score("gauss_h64", 6, 64, 777, 64); }
Test(cuda_golden, gauss_h64_page16) { NEED_GPU(); golden_score("gauss_h64", 6, 64, 777, 16); }
Test(cuda_golden, gauss_h32_page1) { NEED_GPU(); golden_score("gauss_h32", 4, 32, 1000, 1); }

/* One randomized case: CUDA vs CPU backend (and vs the float64 reference
 * when small), logits and top-k. */
static void random_case(uint64_t seed, int heads, int rows, int64_t n, int32_t P,
                        const int32_t *lens, int with_mask, int topk) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  fp4idx_test_case_t tc;
  int64_t np = (n + P - 1) / P + 5;
  cr_assert_eq(fp4idx_test_case_dyadic(&tc, &rng, heads, rows, n, P, np, lens, with_mask), 0);
  fp4idx_backend_t *g = mk_cuda(np, P), *c = mk_cpu(np, P);
  cr_assert_eq(g->ops->store(g, tc.keys, FP4IDX_DTYPE_BF16, n, tc.slots, FP4IDX_ROUND_RNE), 0);
  cr_assert_eq(c->ops->store(c, tc.keys, FP4IDX_DTYPE_BF16, n, tc.slots, FP4IDX_ROUND_RNE), 0);
  const int64_t W = tc.width;
  fp4idx_backend_seq_t sq = {.pages = tc.pages, .n_keys = n, .rows = rows, .width = W,
                           .q = tc.q, .w = tc.w, .lens = tc.lens, .mask = tc.mask};
  float *og = malloc(sizeof(float) * (size_t)(rows * W + 1));
  float *oc = malloc(sizeof(float) * (size_t)(rows * W + 1));
  fp4idx_backend_batch_t bt = {.heads = heads, .n_seqs = 1, .seqs = &sq, .logits = og};
  cr_assert_eq(g->ops->score(g, &bt), 0);
  bt.logits = oc;
  cr_assert_eq(c->ops->score(c, &bt), 0);
  int64_t diff = fp4idx_test_count_diff(og, oc, rows * W);
  cr_assert_eq(diff, 0, "seed %llu H=%d R=%d n=%lld P=%d: %lld of %lld logits differ from CPU",
               (unsigned long long)seed, heads, rows, (long long)n, P, (long long)diff,
               (long long)(rows * W));
  if ((int64_t)rows * W * heads <= 4000000) {
    cr_assert_eq(fp4idx_test_ref_score(tc.packed, n, heads, rows, tc.q, tc.w, tc.lens, tc.mask,
                                       W, oc), 0);
    diff = fp4idx_test_count_diff(og, oc, rows * W);
    cr_assert_eq(diff, 0, "seed %llu: %lld logits differ from the float64 reference",
                 (unsigned long long)seed, (long long)diff);
  }
  if (topk) {
    int32_t *pg = malloc(sizeof(int32_t) * rows * topk), *pc = malloc(sizeof(int32_t) * rows * topk);
    float *vg = malloc(sizeof(float) * rows * topk), *vc = malloc(sizeof(float) * rows * topk);
    int32_t cg[8], cc[8];
    fp4idx_backend_batch_t tb = {.heads = heads, .n_seqs = 1, .seqs = &sq, .topk = topk,
                               .topk_pos = pg, .topk_val = vg, .topk_count = cg};
    cr_assert_eq(g->ops->score(g, &tb), 0);
    tb.topk_pos = pc; tb.topk_val = vc; tb.topk_count = cc;
    cr_assert_eq(c->ops->score(c, &tb), 0);
    cr_assert_eq(memcmp(cg, cc, sizeof(int32_t) * rows), 0, "top-k counts differ");
    cr_assert_eq(memcmp(pg, pc, sizeof(int32_t) * rows * topk), 0, "top-k positions differ (k=%d)", topk);
    cr_assert_eq(fp4idx_test_count_diff(vg, vc, (int64_t)rows * topk), 0, "top-k logits differ");
    /* again into the backend's pinned memory (as the daemon's replies):
     * small results are stored there by the kernel itself, larger ones
     * copied; the same bytes either way */
    void *pin = NULL;
    const size_t tk = sizeof(int32_t) * (size_t)rows * (size_t)topk;
    cr_assert_eq(g->ops->host_alloc(g, 2 * tk + sizeof(int32_t) * (size_t)rows, &pin), 0);
    memset(pin, 0x5A, 2 * tk + sizeof(int32_t) * (size_t)rows);
    tb.topk_pos = pin;
    tb.topk_val = (float *)((uint8_t *)pin + tk);
    tb.topk_count = (int32_t *)((uint8_t *)pin + 2 * tk);
    cr_assert_eq(g->ops->score(g, &tb), 0);
    cr_assert_eq(memcmp(tb.topk_count, cc, sizeof(int32_t) * rows), 0, "pinned: top-k counts differ");
    cr_assert_eq(memcmp(tb.topk_pos, pc, tk), 0, "pinned: top-k positions differ (k=%d)", topk);
    cr_assert_eq(fp4idx_test_count_diff(tb.topk_val, vc, (int64_t)rows * topk), 0,
                 "pinned: top-k logits differ");
    g->ops->host_free(g, pin);
    free(pg); free(pc); free(vg); free(vc);
  }
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  fp4idx_test_case_free(&tc);
  free(og); free(oc);
}

/* Visible counts 0, 1, 63, 64, 65 and n across rows, for H in {1,32,64,128}. */
static void sweep(int heads, uint64_t seed, int64_t n) {
  const int32_t special[6] = {0, 1, 63, 64, 65, (int32_t)n};
  int32_t lens[8];
  for (int rows = 1; rows <= 8; rows++) {
    for (int r = 0; r < rows; r++) lens[r] = special[(r + rows) % 6];
    lens[rows - 1] = (int32_t)n;
    const int32_t P = rows % 3 == 0 ? 16 : rows % 3 == 1 ? 64 : 256;
    random_case(seed + (uint64_t)rows, heads, rows, n, P, lens, rows % 2, rows == 4 ? 64 : 0);
  }
}

Test(cuda_random, dyadic_h1, .timeout = 600) { NEED_GPU(); sweep(1, 1000, 3001); }
Test(cuda_random, dyadic_h32, .timeout = 600) { NEED_GPU(); sweep(32, 2000, 2500); }
Test(cuda_random, dyadic_h64, .timeout = 600) { NEED_GPU(); sweep(64, 3000, 2100); }
Test(cuda_random, dyadic_h128, .timeout = 600) { NEED_GPU(); sweep(128, 4000, 2049); }
Test(cuda_random, odd_heads_and_pages, .timeout = 600) {
  NEED_GPU();
  const int hs[5] = {3, 17, 40, 100, 127};
  for (int i = 0; i < 5; i++) random_case(5000 + i, hs[i], 1 + i, 1500 + 37 * i, 1 << (i * 2), NULL, i & 1, 0);
}
/* Contexts of at most one tile (64 keys: the scorer's grid is 1) read
 * inputs of up to 64 KB where the host wrote them (backend_cuda.c,
 * FP4IDX__CUDA_ZERO_COPY_MAX), larger ones are uploaded: both give the CPU
 * backend's bytes, with lens, masks, small pages and top-k. */
Test(cuda_random, one_block_contexts, .timeout = 600) {
  NEED_GPU();
  const int hs[6] = {1, 8, 32, 64, 100, 128};
  for (int i = 0; i < 6; i++) {
    const int rows = 1 + (i * 3) % 8;
    const int64_t n = i == 0 ? 1 : 64 - 9 * (i % 3);
    int32_t lens[8];
    for (int r = 0; r < rows; r++) lens[r] = (int32_t)(r == 0 ? n : (n * r) / rows);
    random_case(7000 + (uint64_t)i, hs[i], rows, n, 1 << (i % 4 * 2), i % 2 ? lens : NULL, i & 1,
                i % 3 ? 16 : 0);
  }
}

Test(cuda_random, long_context_400k, .timeout = 600) {
  NEED_GPU();
  random_case(6001, 32, 4, 400000, 64, NULL, 0, 512);
  random_case(6002, 64, 2, 100000, 64, NULL, 1, 0);
  random_case(6003, 128, 3, 65537, 32, NULL, 0, 2048);
}
/* Works of 9..32 rows (the sm_90a head sum is 8, 16 or 32 columns wide:
 * each width once; H <= 8 puts up to 32 rows in one work). */
Test(cuda_random, many_rows_per_work, .timeout = 600) {
  NEED_GPU();
  random_case(7101, 1, 12, 3000, 64, NULL, 1, 0);   /* 12 rows: 16 wide */
  random_case(7102, 16, 16, 2000, 16, NULL, 0, 0);  /* 16 rows of 16 heads */
  random_case(7103, 1, 32, 2500, 64, NULL, 0, 0);   /* 32 rows: 32 wide */
  random_case(7104, 8, 20, 1500, 4, NULL, 1, 0);    /* 20 rows */
  random_case(7105, 3, 40, 1200, 64, NULL, 0, 0);   /* 2 works: 32 + 8 rows */
}

Test(cuda_random, topk_k5000_above_the_old_kernel_limit, .timeout = 600) {
  NEED_GPU();
  random_case(7001, 32, 2, 20000, 64, NULL, 1, 5000);
}

/* Puts case s of tc[0..S) on pages after those of cases < s (one pool) and
 * stores its keys in both backends. */
static void batch_store(fp4idx_backend_t *g, fp4idx_backend_t *c, fp4idx_test_case_t *tc, int S,
                        int32_t P) {
  int64_t base = 0;
  for (int s = 0; s < S; s++) {
    const int64_t n = tc[s].n_keys, np = (n + P - 1) / P;
    for (int64_t i = 0; i < np; i++) tc[s].pages[i] += (int32_t)base;
    for (int64_t l = 0; l < n; l++) tc[s].slots[l] += base * P;
    cr_assert_eq(g->ops->store(g, tc[s].keys, FP4IDX_DTYPE_BF16, n, tc[s].slots, 0), 0);
    cr_assert_eq(c->ops->store(c, tc[s].keys, FP4IDX_DTYPE_BF16, n, tc[s].slots, 0), 0);
    base += np;
  }
}

Test(cuda_batch, several_sequences, .timeout = 600) {
  NEED_GPU();
  const int H = 32, S = 5, P = 64;
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 8080);
  fp4idx_test_case_t tc[5];
  int64_t total_pages = 0;
  const int64_t ns[5] = {100, 4097, 0 + 64, 20000, 333};
  for (int s = 0; s < S; s++) {
    int64_t np = (ns[s] + P - 1) / P;
    cr_assert_eq(fp4idx_test_case_dyadic(&tc[s], &rng, H, 1 + s, ns[s], P, np, NULL, s == 3), 0);
    total_pages += np;
  }
  fp4idx_backend_t *g = mk_cuda(total_pages, P), *c = mk_cpu(total_pages, P);
  batch_store(g, c, tc, S, P);
  fp4idx_backend_seq_t sq[5];
  int64_t tot = 0, trows = 0;
  for (int s = 0; s < S; s++) {
    sq[s] = (fp4idx_backend_seq_t){.pages = tc[s].pages, .n_keys = ns[s], .rows = tc[s].rows,
                                 .width = tc[s].width, .q = tc[s].q, .w = tc[s].w,
                                 .lens = tc[s].lens, .mask = tc[s].mask};
    tot += tc[s].rows * tc[s].width;
    trows += tc[s].rows;
  }
  float *og = malloc(sizeof(float) * tot), *oc = malloc(sizeof(float) * tot);
  fp4idx_backend_batch_t bt = {.heads = H, .n_seqs = S, .seqs = sq, .logits = og};
  cr_assert_eq(g->ops->score(g, &bt), 0);
  bt.logits = oc;
  cr_assert_eq(c->ops->score(c, &bt), 0);
  cr_assert_eq(fp4idx_test_count_diff(og, oc, tot), 0);
  const int k = 100;
  int32_t *pg = malloc(4 * trows * k), *pc = malloc(4 * trows * k), cg[64], cc[64];
  float *vg = malloc(4 * trows * k), *vc = malloc(4 * trows * k);
  fp4idx_backend_batch_t tb = {.heads = H, .n_seqs = S, .seqs = sq, .topk = k,
                             .topk_pos = pg, .topk_val = vg, .topk_count = cg};
  cr_assert_eq(g->ops->score(g, &tb), 0);
  tb.topk_pos = pc; tb.topk_val = vc; tb.topk_count = cc;
  cr_assert_eq(c->ops->score(c, &tb), 0);
  cr_assert_eq(memcmp(cg, cc, 4 * trows), 0);
  cr_assert_eq(memcmp(pg, pc, 4 * trows * k), 0);
  cr_assert_eq(fp4idx_test_count_diff(vg, vc, trows * k), 0);
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  for (int s = 0; s < S; s++) fp4idx_test_case_free(&tc[s]);
  free(og); free(oc); free(pg); free(pc); free(vg); free(vc);
}

/* ---- graph replay with changed lengths ---------------------------------- */

Test(cuda_graph, replay_with_new_lengths, .timeout = 600) {
  NEED_GPU();
  const int H = 32, R = 4, P = 64;
  const int64_t n = 5000;
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 4242);
  fp4idx_test_case_t tc;
  const int64_t np = (n + P - 1) / P;
  cr_assert_eq(fp4idx_test_case_dyadic(&tc, &rng, H, R, n, P, np, NULL, 0), 0);
  const int64_t W = n; /* columns fixed at capture; lengths vary below */
  uint8_t *pool, *dpacked;
  int64_t *dslots;
  int32_t *dpages, *dlens;
  uint16_t *dq, *dw;
  float *dout;
  fp4idx_cuda_seq_t *dseq;
  fp4idx_cuda_work_t *dworks, works[8];
  cudaStream_t st;
  cr_assert_eq(cudaStreamCreate(&st), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&pool, (size_t)np * P * 68), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dpacked, (size_t)n * 68), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dslots, (size_t)n * 8), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dpages, (size_t)np * 4), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dlens, R * 4), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dq, (size_t)R * H * 256), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dw, (size_t)R * H * 2), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dout, (size_t)R * W * 4), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dseq, sizeof(fp4idx_cuda_seq_t)), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dworks, sizeof works), cudaSuccess);
  cudaMemcpy(dpacked, tc.packed, (size_t)n * 68, cudaMemcpyHostToDevice);
  cudaMemcpy(dslots, tc.slots, (size_t)n * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(dpages, tc.pages, (size_t)np * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dq, tc.q, (size_t)R * H * 256, cudaMemcpyHostToDevice);
  cudaMemcpy(dw, tc.w, (size_t)R * H * 2, cudaMemcpyHostToDevice);
  cr_assert_eq(fp4idx_cuda_store_packed_launch(pool, 6, dpacked, n, dslots, st), 0);
  fp4idx_cuda_seq_t hs = {.pages = dpages, .q = dq, .w = dw, .lens = dlens, .mask = NULL,
                          .out = dout, .width = W, .rows = R};
  cudaMemcpy(dseq, &hs, sizeof hs, cudaMemcpyHostToDevice);
  fp4idx_cuda_score_params_t prm;
  int32_t rows = R;
  int64_t width = W;
  fp4idx_cuda_scorer_t scorer;
  cr_assert_eq(fp4idx_cuda_scorer_for_device(0, &scorer), FP4IDX_OK);
  cr_assert_eq(fp4idx_cuda_score_plan(scorer, H, 1, &rows, &width, 132, works, 8, &prm), 1);
  cudaMemcpy(dworks, works, sizeof works[0], cudaMemcpyHostToDevice);
  prm.pool = pool; prm.seqs = dseq; prm.works = dworks; prm.log2_page = 6;
  cr_assert_eq(prm.has_seq0, 0, "the planner leaves the descriptor in memory");
  cr_assert_eq(cudaStreamSynchronize(st), cudaSuccess);
  float *got = malloc(sizeof(float) * R * W), *want = malloc(sizeof(float) * R * W);
  const int32_t sets[3][4] = {{5000, 4999, 4998, 4997}, {0, 1, 64, 65}, {63, 2500, 4096, 5000}};
  /* Twice: the descriptor read from memory, then from the parameters
   * (has_seq0); there the sm_90a kernel must not read the works or the
   * descriptors, which are poisoned (the mma.sync kernel reads them). */
  for (int from_params = 0; from_params < 2; from_params++) {
  if (from_params) {
    prm.has_seq0 = 1;
    prm.seq0 = hs;
    if (scorer == FP4IDX_CUDA_SCORER_WGMMA) {
      cr_assert_eq(cudaMemset(dseq, 0xff, sizeof hs), cudaSuccess);
      cr_assert_eq(cudaMemset(dworks, 0xff, sizeof works[0]), cudaSuccess);
    }
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cr_assert_eq(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), cudaSuccess);
  cr_assert_eq(fp4idx_cuda_score_launch(&prm, st), 0);
  cr_assert_eq(cudaStreamEndCapture(st, &graph), cudaSuccess);
  cr_assert_eq(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(cudaMemcpyAsync(dlens, sets[i], R * 4, cudaMemcpyHostToDevice, st), cudaSuccess);
    cr_assert_eq(cudaMemsetAsync(dout, 0x7f, (size_t)R * W * 4, st), cudaSuccess); /* poison */
    cr_assert_eq(cudaGraphLaunch(exec, st), cudaSuccess);
    cr_assert_eq(cudaMemcpyAsync(got, dout, (size_t)R * W * 4, cudaMemcpyDeviceToHost, st), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(st), cudaSuccess);
    cr_assert_eq(fp4idx_test_ref_score(tc.packed, n, H, R, tc.q, tc.w, sets[i], NULL, W, want), 0);
    int64_t diff = fp4idx_test_count_diff(got, want, R * W);
    cr_assert_eq(diff, 0, "descriptor from %s, replay %d: %lld logits differ",
                 from_params ? "the parameters" : "memory", i, (long long)diff);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  }
  cudaFree(pool); cudaFree(dpacked); cudaFree(dslots); cudaFree(dpages); cudaFree(dlens);
  cudaFree(dq); cudaFree(dw); cudaFree(dout); cudaFree(dseq); cudaFree(dworks);
  cudaStreamDestroy(st);
  fp4idx_test_case_free(&tc);
  free(got); free(want);
}


/* ---- the mma.sync scorer by argument (score.cu) -------------------------
 * The backend runs the scorer of its device (wgmma on sm_90); the portable
 * kernel is the product elsewhere, so it is launched here directly, by
 * argument, on whatever GPU runs the tests, and compared with the CPU
 * backend. */

static void direct_case(fp4idx_cuda_scorer_t scorer, uint64_t seed, int heads, int rows,
                        int64_t n, int32_t P, const int32_t *lens, int with_mask) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  fp4idx_test_case_t tc;
  const int64_t np = (n + P - 1) / P + 2;
  cr_assert_eq(fp4idx_test_case_dyadic(&tc, &rng, heads, rows, n, P, np, lens, with_mask), 0);
  const int64_t W = tc.width;
  int32_t log2p = 0;
  while ((1 << log2p) < P) log2p++;
  uint8_t *pool, *dpacked, *dmask = NULL;
  int64_t *dslots;
  int32_t *dpages, *dlens;
  uint16_t *dq, *dw;
  float *dout;
  fp4idx_cuda_seq_t *dseq;
  fp4idx_cuda_work_t *dworks, works[64];
  cr_assert_eq(cudaMalloc((void **)&pool, (size_t)np * P * 68), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dpacked, (size_t)n * 68 + 1), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dslots, (size_t)n * 8 + 8), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dpages, (size_t)np * 4), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dlens, (size_t)rows * 4), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dq, (size_t)rows * heads * 256), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dw, (size_t)rows * heads * 2), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dout, (size_t)rows * W * 4 + 4), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dseq, sizeof(fp4idx_cuda_seq_t)), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&dworks, sizeof works), cudaSuccess);
  if (tc.mask) {
    cr_assert_eq(cudaMalloc((void **)&dmask, (size_t)rows * W), cudaSuccess);
    cr_assert_eq(cudaMemcpy(dmask, tc.mask, (size_t)rows * W, cudaMemcpyHostToDevice), cudaSuccess);
  }
  cr_assert_eq(cudaMemset(pool, 0, (size_t)np * P * 68), cudaSuccess);
  cr_assert_eq(cudaMemcpy(dpacked, tc.packed, (size_t)n * 68, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMemcpy(dslots, tc.slots, (size_t)n * 8, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMemcpy(dpages, tc.pages, (size_t)np * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMemcpy(dlens, tc.lens, (size_t)rows * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMemcpy(dq, tc.q, (size_t)rows * heads * 256, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMemcpy(dw, tc.w, (size_t)rows * heads * 2, cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMemset(dout, 0x7f, (size_t)rows * W * 4 + 4), cudaSuccess); /* poison */
  if (n) cr_assert_eq(fp4idx_cuda_store_packed_launch(pool, log2p, dpacked, n, dslots, 0), 0);
  fp4idx_cuda_seq_t hs = {.pages = dpages, .q = dq, .w = dw, .lens = dlens, .mask = dmask,
                          .out = dout, .width = W, .rows = rows};
  cr_assert_eq(cudaMemcpy(dseq, &hs, sizeof hs, cudaMemcpyHostToDevice), cudaSuccess);
  int sms = 0;
  cr_assert_eq(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  fp4idx_cuda_score_params_t prm;
  int32_t rr = rows;
  int64_t width = W;
  const int nw = fp4idx_cuda_score_plan(scorer, heads, 1, &rr, &width, sms, works, 64, &prm);
  cr_assert(nw >= 0 && nw <= 64, "plan: %d", nw);
  cr_assert_eq(prm.scorer, (int32_t)scorer);
  cr_assert_eq(cudaMemcpy(dworks, works, sizeof works[0] * (size_t)(nw ? nw : 1),
                          cudaMemcpyHostToDevice), cudaSuccess);
  prm.pool = pool; prm.seqs = dseq; prm.works = dworks; prm.log2_page = log2p;
  cr_assert_eq(fp4idx_cuda_score_launch(&prm, 0), 0);
  float *got = malloc(sizeof(float) * (size_t)(rows * W + 1));
  float *want = malloc(sizeof(float) * (size_t)(rows * W + 1));
  cr_assert_eq(cudaMemcpy(got, dout, (size_t)rows * W * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  fp4idx_backend_t *c = mk_cpu(np, P);
  cr_assert_eq(c->ops->store(c, tc.keys, FP4IDX_DTYPE_BF16, n, tc.slots, FP4IDX_ROUND_RNE), 0);
  fp4idx_backend_seq_t sq = {.pages = tc.pages, .n_keys = n, .rows = rows, .width = W,
                             .q = tc.q, .w = tc.w, .lens = tc.lens, .mask = tc.mask};
  fp4idx_backend_batch_t bt = {.heads = heads, .n_seqs = 1, .seqs = &sq, .logits = want};
  cr_assert_eq(c->ops->score(c, &bt), 0);
  const int64_t diff = fp4idx_test_count_diff(got, want, rows * W);
  cr_assert_eq(diff, 0, "scorer %d seed %llu H=%d R=%d n=%lld P=%d: %lld of %lld logits differ",
               (int)scorer, (unsigned long long)seed, heads, rows, (long long)n, P,
               (long long)diff, (long long)(rows * W));
  fp4idx_backend_destroy(c);
  cudaFree(pool); cudaFree(dpacked); cudaFree(dslots); cudaFree(dpages); cudaFree(dlens);
  cudaFree(dq); cudaFree(dw); cudaFree(dout); cudaFree(dseq); cudaFree(dworks); cudaFree(dmask);
  fp4idx_test_case_free(&tc);
  free(got); free(want);
}

Test(cuda_mma, random_by_argument, .timeout = 600) {
  NEED_GPU();
  const int32_t lens[4] = {0, 1, 65, 3001};
  direct_case(FP4IDX_CUDA_SCORER_MMA, 9001, 1, 4, 3001, 16, lens, 1);
  direct_case(FP4IDX_CUDA_SCORER_MMA, 9002, 32, 4, 2500, 64, NULL, 0);
  direct_case(FP4IDX_CUDA_SCORER_MMA, 9003, 64, 3, 2100, 256, NULL, 1);
  direct_case(FP4IDX_CUDA_SCORER_MMA, 9004, 128, 2, 2049, 1, NULL, 0);
  direct_case(FP4IDX_CUDA_SCORER_MMA, 9005, 17, 5, 1537, 4, NULL, 1);
  direct_case(FP4IDX_CUDA_SCORER_MMA, 9006, 32, 4, 100000, 64, NULL, 0);
  direct_case(FP4IDX_CUDA_SCORER_MMA, 9007, 8, 20, 1500, 64, NULL, 1);
}

Test(cuda_mma, device_scorer_by_argument, .timeout = 600) {
  NEED_GPU();
  fp4idx_cuda_scorer_t s;
  cr_assert_eq(fp4idx_cuda_scorer_for_device(0, &s), FP4IDX_OK);
  direct_case(s, 9101, 32, 4, 4097, 64, NULL, 1);
  direct_case(s, 9102, 64, 6, 777, 16, NULL, 0);
  direct_case(s, 9103, 1, 32, 999, 64, NULL, 1);
}

Test(cuda_mma, plan_rejects_unknown_scorer) {
  fp4idx_cuda_score_params_t prm;
  fp4idx_cuda_work_t works[1];
  int32_t rows = 1;
  int64_t width = 10;
  cr_assert_eq(fp4idx_cuda_score_plan((fp4idx_cuda_scorer_t)7, 32, 1, &rows, &width, 1, works, 1,
                                      &prm), FP4IDX_EINVAL);
}

/* ---- big pools: pages above byte offsets 2^32 and 2^36 ------------------
 * The default pool is half of the device (~70 GB on an H200): offsets past
 * 4 GiB and 64 GiB must stay 64-bit in every kernel (page * page bytes).
 * The sequence's pages sit around and above those offsets of a > 64 GiB
 * pool; the CPU backend holds the same keys on low pages (the results do
 * not depend on where a page is). Skips only when the GPU lacks memory. */

static void big_pool_case(int32_t P, uint64_t seed, int heads, int rows, int64_t n) {
  const int64_t page_bytes = (int64_t)P * FP4IDX_SLOT_BYTES;
  const int64_t at32 = ((int64_t)1 << 32) / page_bytes, at36 = ((int64_t)1 << 36) / page_bytes;
  const int64_t np = (n + P - 1) / P;
  const int64_t pool_pages = at36 + np + 8;
  size_t fr = 0, tot = 0;
  cr_assert_eq(cudaMemGetInfo(&fr, &tot), cudaSuccess);
  if ((double)fr < (double)pool_pages * (double)page_bytes + 2e9)
    cr_skip_test("GPU has %.1f GiB free, the pool needs %.1f GiB", fr / 1073741824.0,
                 pool_pages * (double)page_bytes / 1073741824.0);
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  fp4idx_test_case_t tc;
  cr_assert_eq(fp4idx_test_case_dyadic(&tc, &rng, heads, rows, n, P, np, NULL, 1), 0);
  /* CPU page p -> a GPU page: near 2^32 (page at32, which straddles it,
   * among them), above 2^36, or low, by p % 3. */
  int32_t *gpages = malloc(sizeof *gpages * (size_t)np);
  int64_t *gslots = malloc(sizeof *gslots * (size_t)(n ? n : 1));
  int64_t *where = malloc(sizeof *where * (size_t)np);
  for (int64_t i = 0; i < np; i++) {
    const int32_t p = tc.pages[i];  /* a permutation of 0..np-1 */
    where[p] = p % 3 == 0 ? at32 - 3 * (np / 6) + p : p % 3 == 1 ? at36 + p : p;
  }
  for (int64_t i = 0; i < np; i++) gpages[i] = (int32_t)where[tc.pages[i]];
  for (int64_t l = 0; l < n; l++) gslots[l] = (int64_t)gpages[l / P] * P + l % P;
  int above32 = 0, above36 = 0;
  for (int64_t i = 0; i < np; i++) {
    above32 += (gpages[i] + 1) * page_bytes > ((int64_t)1 << 32);
    above36 += (int64_t)gpages[i] * page_bytes >= ((int64_t)1 << 36);
  }
  cr_assert(above32 > 0 && above36 > 0, "pages above 2^32: %d, above 2^36: %d", above32, above36);
  fp4idx_backend_t *g = mk_cuda(pool_pages, P), *c = mk_cpu(np, P);
  cr_assert_eq(g->ops->store(g, tc.keys, FP4IDX_DTYPE_BF16, n, gslots, FP4IDX_ROUND_RNE), 0);
  cr_assert_eq(c->ops->store(c, tc.keys, FP4IDX_DTYPE_BF16, n, tc.slots, FP4IDX_ROUND_RNE), 0);
  /* the stored bytes read back from the high slots */
  uint8_t *rg = malloc((size_t)n * 68), *rc = malloc((size_t)n * 68);
  cr_assert_eq(g->ops->read(g, gslots, n, 0, rg), 0);
  cr_assert_eq(c->ops->read(c, tc.slots, n, 0, rc), 0);
  cr_assert_eq(memcmp(rg, rc, (size_t)n * 68), 0, "bytes read from high slots differ");
  const int64_t W = tc.width;
  fp4idx_backend_seq_t sg = {.pages = gpages, .n_keys = n, .rows = rows, .width = W,
                             .q = tc.q, .w = tc.w, .lens = tc.lens, .mask = tc.mask};
  fp4idx_backend_seq_t sc = sg;
  sc.pages = tc.pages;
  float *og = malloc(sizeof(float) * (size_t)(rows * W)), *oc = malloc(sizeof(float) * (size_t)(rows * W));
  fp4idx_backend_batch_t bg = {.heads = heads, .n_seqs = 1, .seqs = &sg, .logits = og};
  fp4idx_backend_batch_t bc = {.heads = heads, .n_seqs = 1, .seqs = &sc, .logits = oc};
  cr_assert_eq(g->ops->score(g, &bg), 0);
  cr_assert_eq(c->ops->score(c, &bc), 0);
  const int64_t diff = fp4idx_test_count_diff(og, oc, rows * W);
  cr_assert_eq(diff, 0, "P=%d: %lld of %lld logits differ from CPU", P, (long long)diff,
               (long long)(rows * W));
  const int k = 100;
  int32_t pg[8 * 100], pc[8 * 100], cg[8], cc[8];
  float vg[8 * 100], vc[8 * 100];
  cr_assert(rows <= 8);
  bg = (fp4idx_backend_batch_t){.heads = heads, .n_seqs = 1, .seqs = &sg, .topk = k,
                                .topk_pos = pg, .topk_val = vg, .topk_count = cg};
  bc = (fp4idx_backend_batch_t){.heads = heads, .n_seqs = 1, .seqs = &sc, .topk = k,
                                .topk_pos = pc, .topk_val = vc, .topk_count = cc};
  cr_assert_eq(g->ops->score(g, &bg), 0);
  cr_assert_eq(c->ops->score(c, &bc), 0);
  cr_assert_eq(memcmp(cg, cc, sizeof(int32_t) * rows), 0, "top-k counts differ");
  cr_assert_eq(memcmp(pg, pc, sizeof(int32_t) * rows * k), 0, "top-k positions differ");
  cr_assert_eq(fp4idx_test_count_diff(vg, vc, (int64_t)rows * k), 0, "top-k logits differ");
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  fp4idx_test_case_free(&tc);
  free(gpages); free(gslots); free(where); free(rg); free(rc); free(og); free(oc);
}

/* One test (one process) for both pools: tests run in parallel processes,
 * and two 64 GiB pools at once would not fit. */
Test(cuda_bigpool, pages_above_2p32_and_2p36, .timeout = 600) {
  NEED_GPU();
  big_pool_case(64, 9201, 32, 4, 20000);  /* bulk-copy path of the sm_90a producer */
  big_pool_case(1, 9202, 64, 3, 3000);    /* per-key path, 68-byte pages */
}

/* ---- a batch whose visible counts are all zero -------------------------- */

Test(cuda_batch, all_lengths_zero, .timeout = 600) {
  NEED_GPU();
  const int H = 32, P = 64, S = 3;
  const int64_t ns[3] = {100, 0, 5000};
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 9301);
  fp4idx_test_case_t tc[3];
  int64_t total_pages = 0;
  const int32_t zeros[4] = {0, 0, 0, 0};
  for (int s = 0; s < S; s++) {
    const int64_t np = (ns[s] + P - 1) / P;
    cr_assert_eq(fp4idx_test_case_dyadic(&tc[s], &rng, H, 2 + s % 2, ns[s], P, np, zeros, 0), 0);
    total_pages += np;
  }
  fp4idx_backend_t *g = mk_cuda(total_pages, P), *c = mk_cpu(total_pages, P);
  batch_store(g, c, tc, S, P);
  fp4idx_backend_seq_t sq[3];
  int64_t tot = 0, trows = 0;
  for (int s = 0; s < S; s++) {
    /* columns up to n_keys although nothing is visible */
    sq[s] = (fp4idx_backend_seq_t){.pages = tc[s].pages, .n_keys = ns[s], .rows = tc[s].rows,
                                   .width = ns[s], .q = tc[s].q, .w = tc[s].w,
                                   .lens = tc[s].lens};
    tot += tc[s].rows * ns[s];
    trows += tc[s].rows;
  }
  float *og = malloc(sizeof(float) * (size_t)tot), *oc = malloc(sizeof(float) * (size_t)tot);
  for (int64_t i = 0; i < tot; i++) og[i] = 1.0f;
  fp4idx_backend_batch_t bt = {.heads = H, .n_seqs = S, .seqs = sq, .logits = og};
  cr_assert_eq(g->ops->score(g, &bt), 0);
  bt.logits = oc;
  cr_assert_eq(c->ops->score(c, &bt), 0);
  cr_assert_eq(fp4idx_test_count_diff(og, oc, tot), 0);
  for (int64_t i = 0; i < tot; i++) cr_assert(isinf(og[i]) && og[i] < 0, "logit %lld", (long long)i);
  const int k = 16;
  int32_t pg[8 * 16], pc[8 * 16], cg[8], cc[8];
  float vg[8 * 16], vc[8 * 16];
  cr_assert(trows <= 8);
  fp4idx_backend_batch_t tb = {.heads = H, .n_seqs = S, .seqs = sq, .topk = k,
                               .topk_pos = pg, .topk_val = vg, .topk_count = cg};
  cr_assert_eq(g->ops->score(g, &tb), 0);
  tb.topk_pos = pc; tb.topk_val = vc; tb.topk_count = cc;
  cr_assert_eq(c->ops->score(c, &tb), 0);
  cr_assert_eq(memcmp(cg, cc, sizeof(int32_t) * (size_t)trows), 0);
  cr_assert_eq(memcmp(pg, pc, sizeof(int32_t) * (size_t)trows * k), 0);
  cr_assert_eq(fp4idx_test_count_diff(vg, vc, trows * k), 0);
  for (int64_t r = 0; r < trows; r++) cr_assert_eq(cg[r], 0);
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  for (int s = 0; s < S; s++) fp4idx_test_case_free(&tc[s]);
  free(og); free(oc);
}
