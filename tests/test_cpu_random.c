/* test_cpu_random.c -- the CPU scorer against the float64 reference of
 * tests/common on generated cases: dyadic (exact in any precision) over
 * head counts, row counts, lengths around page boundaries, page sizes,
 * masks; wide-exponent inputs (the f64 path); top-k order, ties, fewer
 * than k; batches of several sequences. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_backend.h"
#include "test_util.h"

/* Runs one case through a fresh backend and the reference; asserts equal
 * logits and, if topk > 0, equal top-k. */
static void run_case(const fp4idx_test_case_t *c, int threads, int topk, const char *what) {
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cpu_create(&b, threads), 0);
  cr_assert_eq(b->ops->pool_create(b, c->n_pages, c->page_size), 0);
  cr_assert_eq(b->ops->store(b, c->keys, FP4IDX_DTYPE_BF16, c->n_keys, c->slots, FP4IDX_ROUND_RNE),
               0);
  int64_t n = (int64_t)c->rows * c->width;
  float *out = malloc(sizeof(float) * (size_t)(n ? n : 1));
  float *ref = malloc(sizeof(float) * (size_t)(n ? n : 1));
  fp4idx_backend_seq_t sq = {.pages = c->pages, .n_keys = c->n_keys, .rows = c->rows,
                           .width = c->width, .q = c->q, .w = c->w, .lens = c->lens,
                           .mask = c->mask};
  fp4idx_backend_batch_t bt = {.heads = c->heads, .n_seqs = 1, .seqs = &sq, .logits = out};
  cr_assert_eq(b->ops->score(b, &bt), 0, "%s", what);
  cr_assert_eq(fp4idx_test_ref_score(c->packed, c->n_keys, c->heads, c->rows, c->q, c->w,
                                     c->lens, c->mask, c->width, ref), 0);
  int64_t d = fp4idx_test_count_diff(out, ref, n);
  cr_assert_eq(d, 0, "%s: %lld of %lld logits differ", what, (long long)d, (long long)n);
  if (topk > 0) {
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)c->rows * topk);
    int32_t *rpos = malloc(sizeof(int32_t) * (size_t)c->rows * topk);
    float *val = malloc(sizeof(float) * (size_t)c->rows * topk);
    float *rval = malloc(sizeof(float) * (size_t)c->rows * topk);
    int32_t *cnt = malloc(sizeof(int32_t) * (size_t)c->rows);
    int32_t *rcnt = malloc(sizeof(int32_t) * (size_t)c->rows);
    fp4idx_backend_batch_t tb = {.heads = c->heads, .n_seqs = 1, .seqs = &sq, .topk = topk,
                               .topk_pos = pos, .topk_val = val, .topk_count = cnt};
    cr_assert_eq(b->ops->score(b, &tb), 0);
    cr_assert_eq(fp4idx_test_ref_topk(ref, c->rows, c->width, topk, rpos, rval, rcnt), 0);
    cr_assert_eq(memcmp(cnt, rcnt, sizeof(int32_t) * c->rows), 0, "%s: top-k counts", what);
    cr_assert_eq(memcmp(pos, rpos, sizeof(int32_t) * c->rows * topk), 0, "%s: top-k positions",
                 what);
    cr_assert_eq(fp4idx_test_count_diff(val, rval, (int64_t)c->rows * topk), 0, "%s: top-k values",
                 what);
    free(pos), free(rpos), free(val), free(rval), free(cnt), free(rcnt);
  }
  free(out);
  free(ref);
  fp4idx_backend_destroy(b);
}

/* Every page size x lengths around its boundaries, rows 1..8. */
static void sweep(int heads, uint64_t seed, int64_t big) {
  static const int32_t psz[] = {1, 16, 64, 256};
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  for (int pi = 0; pi < 4; pi++) {
    int32_t P = psz[pi];
    int64_t lengths[] = {0, 1, P - 1, P, P + 1, big};
    for (int li = 0; li < 6; li++) {
      int64_t L = lengths[li];
      int rows = (int)fp4idx_test_rng_range(&rng, 1, heads >= 128 ? 3 : 8);
      if (L == big && heads >= 64) rows = rows > 2 ? 2 : rows;
      int32_t lens[8];
      int random_lens = fp4idx_test_rng_below(&rng, 2);
      for (int r = 0; r < rows; r++)
        lens[r] = (int32_t)(random_lens ? fp4idx_test_rng_range(&rng, 0, L)
                                        : (L - r > 0 ? L - r : 0));
      fp4idx_test_case_t c;
      int with_mask = fp4idx_test_rng_below(&rng, 3) == 0;
      int64_t extra = (int64_t)fp4idx_test_rng_below(&rng, 5);
      cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, heads, rows, L, P,
                                           (L + P - 1) / P + extra, lens, with_mask), 0);
      char what[128];
      snprintf(what, sizeof what, "H=%d R=%d L=%lld P=%d mask=%d", heads, rows, (long long)L, P,
               with_mask);
      int topk = (int)fp4idx_test_rng_range(&rng, 0, 40);
      run_case(&c, (int)fp4idx_test_rng_range(&rng, 0, 3), topk, what);
      fp4idx_test_case_free(&c);
    }
  }
}

Test(cpu_random, dyadic_h1) { sweep(1, 101, 3001); }
Test(cpu_random, dyadic_h32) { sweep(32, 132, 2500); }
Test(cpu_random, dyadic_h64) { sweep(64, 164, 2100); }
Test(cpu_random, dyadic_h128) { sweep(128, 228, 2049); }
Test(cpu_random, dyadic_odd_heads) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 77);
  int hs[] = {2, 3, 7, 9, 15, 17, 33, 100, 127};
  for (int i = 0; i < 9; i++) {
    fp4idx_test_case_t c;
    cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, hs[i], 3, 333, 64, 0, NULL, i & 1), 0);
    run_case(&c, 2, 5, "odd heads");
    fp4idx_test_case_free(&c);
  }
}

/* Wide exponent ranges: q and w anywhere in 2^-12..2^12 with full bf16
 * mantissas and both signs, key scales 100..154 (FP4 passthrough of random
 * codes). Exercises the f64 kernel and the direct double->bf16 roundings. */
static void wide(int iters, uint64_t seed) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  for (int it = 0; it < iters; it++) {
    int heads = it < 3 ? 32 : 64, rows = 1 + it % 4;
    int64_t n = 300 + 97 * it;
    fp4idx_test_case_t c;
    cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, heads, rows, n, 64, 0, NULL, 0), 0);
    for (int64_t i = 0; i < n * 68; i++) {
      int in_scale = (i % 68) >= 64;
      c.packed[i] = (uint8_t)(in_scale ? (uint64_t)fp4idx_test_rng_range(&rng, 100, 154)
                                       : fp4idx_test_rng_next(&rng));
    }
    for (int64_t i = 0; i < (int64_t)rows * heads * 128; i++) {
      double m = 1.0 + (double)fp4idx_test_rng_below(&rng, 128) / 128.0;
      double v = ldexp(m, (int)fp4idx_test_rng_range(&rng, -12, 12));
      if (fp4idx_test_rng_below(&rng, 2)) v = -v;
      if (fp4idx_test_rng_below(&rng, 16) == 0) v = 0;
      c.q[i] = fp4idx_test_f64_to_bf16(v);
    }
    for (int64_t i = 0; i < (int64_t)rows * heads; i++)
      c.w[i] = fp4idx_test_f64_to_bf16(ldexp(1.0 + (double)fp4idx_test_rng_below(&rng, 128) / 128,
                                             (int)fp4idx_test_rng_range(&rng, -6, 6)) *
                                       (fp4idx_test_rng_below(&rng, 3) ? 1 : -1));
    fp4idx_backend_t *b = NULL;
    cr_assert_eq(fp4idx_backend_cpu_create(&b, 2), 0);
    cr_assert_eq(b->ops->pool_create(b, c.n_pages, c.page_size), 0);
    cr_assert_eq(b->ops->store(b, c.packed, FP4IDX_DTYPE_FP4, n, c.slots, 0), 0);
    float *out = malloc(sizeof(float) * rows * c.width);
    float *ref = malloc(sizeof(float) * rows * c.width);
    fp4idx_backend_seq_t sq = {.pages = c.pages, .n_keys = n, .rows = rows, .width = c.width,
                             .q = c.q, .w = c.w, .lens = c.lens};
    fp4idx_backend_batch_t bt = {.heads = heads, .n_seqs = 1, .seqs = &sq, .logits = out};
    cr_assert_eq(b->ops->score(b, &bt), 0);
    cr_assert_eq(fp4idx_test_ref_score(c.packed, n, heads, rows, c.q, c.w, c.lens, NULL, c.width,
                                       ref), 0);
    cr_assert_eq(fp4idx_test_count_diff(out, ref, rows * c.width), 0, "iteration %d", it);
    free(out);
    free(ref);
    fp4idx_backend_destroy(b);
    fp4idx_test_case_free(&c);
  }
}

Test(cpu_random, wide_exponents) { wide(6, 4242); }

/* Extreme ranges: key scales near both ends (2^-126.., ..2^127), q and w
 * over +-2^60 / +-2^40: d and p land in the bf16 subnormal range, overflow
 * to inf, and inf - inf gives NaN; every such lane takes the scalar
 * rounding, and the result must still equal the reference. */
Test(cpu_random, extreme_ranges) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 31337);
  /* per iteration: scale bytes [lo, hi], q exponents [qlo, qhi], w [wlo, whi] */
  static const int rg[4][6] = {{1, 20, -30, 0, -20, 0},     /* bf16 subnormal d, p */
                               {230, 254, 0, 20, 0, 20},    /* overflow to inf */
                               {1, 254, -20, 20, -10, 10},  /* everything */
                               {90, 160, -60, 60, -40, 40}};
  for (int it = 0; it < 4; it++) {
    int heads = 16 + 16 * it, rows = 2;
    int64_t n = 257;
    fp4idx_test_case_t c;
    cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, heads, rows, n, 16, 0, NULL, 0), 0);
    for (int64_t i = 0; i < n * 68; i++) {
      if ((i % 68) < 64) {
        c.packed[i] = (uint8_t)fp4idx_test_rng_next(&rng);
      } else {
        c.packed[i] = (uint8_t)fp4idx_test_rng_range(&rng, rg[it][0], rg[it][1]);
      }
    }
    for (int64_t i = 0; i < (int64_t)rows * heads * 128; i++) {
      double v = ldexp(1.0 + (double)fp4idx_test_rng_below(&rng, 128) / 128.0,
                       (int)fp4idx_test_rng_range(&rng, rg[it][2], rg[it][3]));
      c.q[i] = fp4idx_test_f64_to_bf16(fp4idx_test_rng_below(&rng, 2) ? v : -v);
    }
    for (int64_t i = 0; i < (int64_t)rows * heads; i++)
      c.w[i] = fp4idx_test_f64_to_bf16(ldexp(fp4idx_test_rng_below(&rng, 4) ? 1.0 : -1.5,
                                             (int)fp4idx_test_rng_range(&rng, rg[it][4], rg[it][5])));
    fp4idx_backend_t *b = NULL;
    cr_assert_eq(fp4idx_backend_cpu_create(&b, 2), 0);
    cr_assert_eq(b->ops->pool_create(b, c.n_pages, c.page_size), 0);
    cr_assert_eq(b->ops->store(b, c.packed, FP4IDX_DTYPE_FP4, n, c.slots, 0), 0);
    float *out = malloc(sizeof(float) * rows * c.width);
    float *ref = malloc(sizeof(float) * rows * c.width);
    fp4idx_backend_seq_t sq = {.pages = c.pages, .n_keys = n, .rows = rows, .width = c.width,
                             .q = c.q, .w = c.w, .lens = c.lens};
    fp4idx_backend_batch_t bt = {.heads = heads, .n_seqs = 1, .seqs = &sq, .logits = out};
    cr_assert_eq(b->ops->score(b, &bt), 0);
    cr_assert_eq(fp4idx_test_ref_score(c.packed, n, heads, rows, c.q, c.w, c.lens, NULL, c.width,
                                       ref), 0);
    int64_t special = 0;
    for (int64_t i = 0; i < rows * c.width; i++)
      special += isnan(ref[i]) || isinf(ref[i]) || (ref[i] != 0 && fabsf(ref[i]) < 0x1p-126f);
    cr_log_info("iteration %d: %lld special logits", it, (long long)special);
    cr_assert_eq(fp4idx_test_count_diff(out, ref, rows * c.width), 0, "iteration %d", it);
    free(out);
    free(ref);
    fp4idx_backend_destroy(b);
    fp4idx_test_case_free(&c);
  }
}

/* Every compiled tile kernel (generic, AVX2, AVX-512) on this machine:
 * FP4IDX_CPU_ISA lowers the backend's choice (to what the CPU supports). */
static void isa_suite(const char *isa) {
  cr_assert_eq(setenv("FP4IDX_CPU_ISA", isa, 1), 0);
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cpu_create(&b, 1), 0);
  fp4idx_backend_info_t info;
  cr_assert_eq(b->ops->pool_create(b, 1, 64), 0);
  cr_assert_eq(b->ops->describe(b, &info), 0);
  cr_log_info("FP4IDX_CPU_ISA=%s -> %s", isa, info.device);
  fp4idx_backend_destroy(b);
  sweep(32, 532, 700);
  sweep(1, 501, 300);
  wide(3, 77);
}

Test(cpu_isa, generic) { isa_suite("generic"); }
Test(cpu_isa, avx2) { isa_suite("avx2"); }
Test(cpu_isa, avx512) { isa_suite("avx512"); }

/* ---- top-k ---------------------------------------------------------------- */

/* Keys repeat with period 3, so logits tie in groups; the order must be
 * logit descending, then position ascending. Also all-equal keys. */
Test(cpu_topk, ties_by_lower_position) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 8);
  for (int period = 1; period <= 3; period += 2) {
    fp4idx_test_case_t c;
    int32_t lens[2] = {200, 131};
    cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, 8, 2, 200, 16, 0, lens, 0), 0);
    for (int64_t l = period; l < c.n_keys; l++) {
      memcpy(c.keys + l * 128, c.keys + (l % period) * 128, 256);
      memcpy(c.packed + l * 68, c.packed + (l % period) * 68, 68);
    }
    for (int h = 0; h < 16; h++) c.w[h] = fp4idx_test_f64_to_bf16(1.0); /* nonzero logits */
    fp4idx_backend_t *b = NULL;
    cr_assert_eq(fp4idx_backend_cpu_create(&b, 2), 0);
    cr_assert_eq(b->ops->pool_create(b, c.n_pages, c.page_size), 0);
    cr_assert_eq(b->ops->store(b, c.keys, FP4IDX_DTYPE_BF16, c.n_keys, c.slots, 0), 0);
    enum { K = 50 };
    int32_t pos[2 * K], cnt[2];
    float val[2 * K];
    fp4idx_backend_seq_t sq = {.pages = c.pages, .n_keys = c.n_keys, .rows = 2, .width = 200,
                             .q = c.q, .w = c.w, .lens = c.lens};
    fp4idx_backend_batch_t bt = {.heads = 8, .n_seqs = 1, .seqs = &sq, .topk = K,
                               .topk_pos = pos, .topk_val = val, .topk_count = cnt};
    cr_assert_eq(b->ops->score(b, &bt), 0);
    for (int r = 0; r < 2; r++) {
      cr_assert_eq(cnt[r], K);
      for (int i = 1; i < K; i++) {
        float v0 = val[r * K + i - 1], v1 = val[r * K + i];
        int32_t p0 = pos[r * K + i - 1], p1 = pos[r * K + i];
        cr_assert(v0 > v1 || (v0 == v1 && p0 < p1), "row %d entry %d: (%d,%g) then (%d,%g)", r,
                  i, p0, v0, p1, v1);
        cr_assert(p1 < lens[r]);
      }
    }
    if (period == 1) /* all equal: positions 0..K-1 in order */
      for (int i = 0; i < K; i++) cr_assert_eq(pos[i], i);
    else /* the best residue class first, in position order */
      for (int i = 1; i < K && val[i] == val[0]; i++) cr_assert_eq(pos[i], pos[i - 1] + 3);
    fp4idx_backend_destroy(b);
    fp4idx_test_case_free(&c);
  }
}

Test(cpu_topk, fewer_visible_than_k) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 9);
  fp4idx_test_case_t c;
  int32_t lens[4] = {0, 1, 5, 40};
  cr_assert_eq(fp4idx_test_case_dyadic(&c, &rng, 4, 4, 40, 16, 0, lens, 1), 0);
  run_case(&c, 2, 64, "fewer than k with mask");
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cpu_create(&b, 1), 0);
  cr_assert_eq(b->ops->pool_create(b, c.n_pages, c.page_size), 0);
  cr_assert_eq(b->ops->store(b, c.keys, FP4IDX_DTYPE_BF16, c.n_keys, c.slots, 0), 0);
  int32_t pos[4 * 8], cnt[4];
  float val[4 * 8];
  fp4idx_backend_seq_t sq = {.pages = c.pages, .n_keys = 40, .rows = 4, .width = 40,
                           .q = c.q, .w = c.w, .lens = c.lens};
  fp4idx_backend_batch_t bt = {.heads = 4, .n_seqs = 1, .seqs = &sq, .topk = 8,
                             .topk_pos = pos, .topk_val = val, .topk_count = cnt};
  cr_assert_eq(b->ops->score(b, &bt), 0);
  cr_assert_eq(cnt[0], 0);
  cr_assert_eq(cnt[1], 1);
  cr_assert_eq(pos[8], 0);
  cr_assert_eq(cnt[2], 5);
  cr_assert_eq(cnt[3], 8);
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(pos[i], -1);
    cr_assert(isinf(val[i]) && val[i] < 0);
  }
  for (int i = 5; i < 8; i++) cr_assert_eq(pos[16 + i], -1);
  fp4idx_backend_destroy(b);
  fp4idx_test_case_free(&c);
}

/* Several sequences in one batch: outputs land at the right offsets. */
Test(cpu_batch, three_sequences) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 10);
  enum { S = 3, H = 16, P = 16 };
  int rows[S] = {2, 1, 4};
  int64_t nk[S] = {100, 37, 250};
  fp4idx_test_case_t c[S];
  int64_t pool_pages = 0;
  for (int s = 0; s < S; s++) {
    cr_assert_eq(fp4idx_test_case_dyadic(&c[s], &rng, H, rows[s], nk[s], P, 0, NULL, s == 2), 0);
    pool_pages += c[s].n_pages;
  }
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(fp4idx_backend_cpu_create(&b, 2), 0);
  cr_assert_eq(b->ops->pool_create(b, pool_pages, P), 0);
  fp4idx_backend_seq_t sq[S];
  int64_t base = 0, total = 0, trows = 0;
  for (int s = 0; s < S; s++) {
    /* give each sequence its own page range of the pool */
    for (int64_t p = 0; p < c[s].n_pages; p++) c[s].pages[p] += (int32_t)base;
    for (int64_t l = 0; l < c[s].n_keys; l++) c[s].slots[l] += base * P;
    base += c[s].n_pages;
    cr_assert_eq(b->ops->store(b, c[s].keys, FP4IDX_DTYPE_BF16, c[s].n_keys, c[s].slots, 0), 0);
    sq[s] = (fp4idx_backend_seq_t){.pages = c[s].pages, .n_keys = c[s].n_keys, .rows = rows[s],
                                 .width = c[s].width, .q = c[s].q, .w = c[s].w,
                                 .lens = c[s].lens, .mask = c[s].mask};
    total += rows[s] * c[s].width;
    trows += rows[s];
  }
  float *out = malloc(sizeof(float) * total);
  fp4idx_backend_batch_t bt = {.heads = H, .n_seqs = S, .seqs = sq, .logits = out};
  cr_assert_eq(b->ops->score(b, &bt), 0);
  enum { K = 7 };
  int32_t *pos = malloc(sizeof(int32_t) * trows * K), *cnt = malloc(sizeof(int32_t) * trows);
  float *val = malloc(sizeof(float) * trows * K);
  fp4idx_backend_batch_t tb = {.heads = H, .n_seqs = S, .seqs = sq, .topk = K,
                             .topk_pos = pos, .topk_val = val, .topk_count = cnt};
  cr_assert_eq(b->ops->score(b, &tb), 0);
  int64_t off = 0, r0 = 0;
  for (int s = 0; s < S; s++) {
    int64_t n = rows[s] * c[s].width;
    float *ref = malloc(sizeof(float) * n);
    cr_assert_eq(fp4idx_test_ref_score(c[s].packed, c[s].n_keys, H, rows[s], c[s].q, c[s].w,
                                       c[s].lens, c[s].mask, c[s].width, ref), 0);
    cr_assert_eq(fp4idx_test_count_diff(out + off, ref, n), 0, "sequence %d", s);
    int32_t rpos[4 * K], rcnt[4];
    float rval[4 * K];
    cr_assert_eq(fp4idx_test_ref_topk(ref, rows[s], c[s].width, K, rpos, rval, rcnt), 0);
    cr_assert_eq(memcmp(pos + r0 * K, rpos, sizeof(int32_t) * rows[s] * K), 0, "topk seq %d", s);
    cr_assert_eq(memcmp(cnt + r0, rcnt, sizeof(int32_t) * rows[s]), 0);
    off += n;
    r0 += rows[s];
    free(ref);
  }
  free(out), free(pos), free(cnt), free(val);
  for (int s = 0; s < S; s++) fp4idx_test_case_free(&c[s]);
  fp4idx_backend_destroy(b);
}
