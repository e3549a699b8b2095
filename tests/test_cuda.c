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
 * CUDA graph replayed with changed lengths; the pipelined sm_90a scorers
 * (FP4IDX_CUDA_SCORER=v2, v3) on the golden, random and long cases.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
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
Test(cuda_random, long_context_400k, .timeout = 600) {
  NEED_GPU();
  random_case(6001, 32, 4, 400000, 64, NULL, 0, 512);
  random_case(6002, 64, 2, 100000, 64, NULL, 1, 0);
  random_case(6003, 128, 3, 65537, 32, NULL, 0, 2048);
}
Test(cuda_random, topk_k5000_above_the_old_kernel_limit, .timeout = 600) {
  NEED_GPU();
  random_case(7001, 32, 2, 20000, 64, NULL, 1, 5000);
}

Test(cuda_batch, several_sequences, .timeout = 600) {
  NEED_GPU();
  const int H = 32, S = 5, P = 64;
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 8080);
  fp4idx_test_case_t tc[5];
  int64_t total_pages = 0, base[5];
  const int64_t ns[5] = {100, 4097, 0 + 64, 20000, 333};
  for (int s = 0; s < S; s++) {
    int64_t np = (ns[s] + P - 1) / P;
    cr_assert_eq(fp4idx_test_case_dyadic(&tc[s], &rng, H, 1 + s, ns[s], P, np, NULL, s == 3), 0);
    base[s] = total_pages;
    total_pages += np;
  }
  fp4idx_backend_t *g = mk_cuda(total_pages, P), *c = mk_cpu(total_pages, P);
  fp4idx_backend_seq_t sq[5];
  int64_t tot = 0, trows = 0;
  for (int s = 0; s < S; s++) {
    for (int64_t i = 0; i < (ns[s] + P - 1) / P; i++) tc[s].pages[i] += (int32_t)base[s];
    for (int64_t l = 0; l < ns[s]; l++) tc[s].slots[l] += base[s] * P;
    cr_assert_eq(g->ops->store(g, tc[s].keys, FP4IDX_DTYPE_BF16, ns[s], tc[s].slots, 0), 0);
    cr_assert_eq(c->ops->store(c, tc[s].keys, FP4IDX_DTYPE_BF16, ns[s], tc[s].slots, 0), 0);
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
  cr_assert_eq(fp4idx_cuda_score_plan(H, 1, &rows, &width, 132, works, 8, &prm), 1);
  cudaMemcpy(dworks, works, sizeof works[0], cudaMemcpyHostToDevice);
  prm.pool = pool; prm.seqs = dseq; prm.works = dworks; prm.log2_page = 6;
  cr_assert_eq(cudaStreamSynchronize(st), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cr_assert_eq(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), cudaSuccess);
  cr_assert_eq(fp4idx_cuda_score_launch(&prm, st), 0);
  cr_assert_eq(cudaStreamEndCapture(st, &graph), cudaSuccess);
  cr_assert_eq(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  float *got = malloc(sizeof(float) * R * W), *want = malloc(sizeof(float) * R * W);
  const int32_t sets[3][4] = {{5000, 4999, 4998, 4997}, {0, 1, 64, 65}, {63, 2500, 4096, 5000}};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(cudaMemcpyAsync(dlens, sets[i], R * 4, cudaMemcpyHostToDevice, st), cudaSuccess);
    cr_assert_eq(cudaMemsetAsync(dout, 0x7f, (size_t)R * W * 4, st), cudaSuccess); /* poison */
    cr_assert_eq(cudaGraphLaunch(exec, st), cudaSuccess);
    cr_assert_eq(cudaMemcpyAsync(got, dout, (size_t)R * W * 4, cudaMemcpyDeviceToHost, st), cudaSuccess);
    cr_assert_eq(cudaStreamSynchronize(st), cudaSuccess);
    cr_assert_eq(fp4idx_test_ref_score(tc.packed, n, H, R, tc.q, tc.w, sets[i], NULL, W, want), 0);
    int64_t diff = fp4idx_test_count_diff(got, want, R * W);
    cr_assert_eq(diff, 0, "replay %d: %lld logits differ", i, (long long)diff);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(pool); cudaFree(dpacked); cudaFree(dslots); cudaFree(dpages); cudaFree(dlens);
  cudaFree(dq); cudaFree(dw); cudaFree(dout); cudaFree(dseq); cudaFree(dworks);
  cudaStreamDestroy(st);
  fp4idx_test_case_free(&tc);
  free(got); free(want);
}

/* ---- scorer variants (FP4IDX_CUDA_SCORER=v2|v3, score_sm90.cu) ----------
 * The pipelined sm_90a scorers must give the same bits as v1 and the CPU
 * backend. Criterion runs each test in its own process, so setenv here
 * only changes that test. (The device run also runs this whole binary with
 * the variable set.) */
int fp4idx__score_sm90_variant(void);

static void use_scorer(const char *v) {
  cr_assert_eq(setenv("FP4IDX_CUDA_SCORER", v, 1), 0);
  cr_assert_eq(fp4idx__score_sm90_variant(), v[1] - '0', "scorer %s not selected", v);
}

static void variant_golden(const char *v) {
  use_scorer(v);
  golden_score("dyadic_h32", 4, 32, 1000, 64);
  golden_score("gauss_h32", 4, 32, 1000, 64);
  golden_score("gauss_h64", 6, 64, 777, 64);
  golden_score("gauss_h64", 6, 64, 777, 16);
  golden_score("gauss_h32", 4, 32, 1000, 1);
}

static void variant_random(const char *v) {
  use_scorer(v);
  sweep(1, 1100, 3001);
  sweep(32, 2100, 2500);
  sweep(64, 3100, 2100);
  sweep(128, 4100, 2049);
  const int hs[5] = {3, 17, 40, 100, 127};
  for (int i = 0; i < 5; i++)
    random_case(5100 + i, hs[i], 1 + i, 1500 + 37 * i, 1 << (i * 2), NULL, i & 1, 0);
  /* 1..5 tiles per warpgroup: the odd-tile path and the pairs */
  for (int n = 1; n <= 700; n += 63) random_case(5200 + n, 32, 4, n, 64, NULL, n & 1, 0);
}

static void variant_long(const char *v) {
  use_scorer(v);
  random_case(6101, 32, 4, 400000, 64, NULL, 0, 512);
  random_case(6102, 64, 2, 100000, 64, NULL, 1, 0);
  random_case(6103, 128, 3, 65537, 32, NULL, 0, 2048);
  const int32_t lens[4] = {16384, 100, 0, 9000};
  random_case(6104, 32, 4, 16384, 64, lens, 0, 0);
}

Test(cuda_scorer, v2_golden, .timeout = 600) { NEED_GPU(); variant_golden("v2"); }
Test(cuda_scorer, v2_random, .timeout = 600) { NEED_GPU(); variant_random("v2"); }
Test(cuda_scorer, v2_long_context, .timeout = 600) { NEED_GPU(); variant_long("v2"); }
Test(cuda_scorer, v3_golden, .timeout = 600) { NEED_GPU(); variant_golden("v3"); }
Test(cuda_scorer, v3_random, .timeout = 600) { NEED_GPU(); variant_random("v3"); }
Test(cuda_scorer, v3_long_context, .timeout = 600) { NEED_GPU(); variant_long("v3"); }
