/* test_cuda_reqpath.c -- the CUDA backend's request-path machinery against
 * the CPU backend (the oracle): device-resident page tables
 * (seq_pages_update, scores with resident = 1) through append, truncate,
 * page reuse, drop and unknown ids; pinned outputs from host_alloc; the
 * per-call device timing; the two staging sets under calls of growing and
 * shrinking size. Every test skips cleanly when no GPU is present. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_backend.h"
#include "test_gpu.h"
#include "test_util.h"

static fp4idx_backend_t *mk(int cuda, int64_t n_pages, int32_t P) {
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(cuda ? fp4idx_backend_cuda_create(&b, 0) : fp4idx_backend_cpu_create(&b, 0),
               FP4IDX_OK);
  cr_assert_eq(b->ops->pool_create(b, n_pages, P), FP4IDX_OK);
  return b;
}

/* A dyadic case of n keys (heads H, R rows, pages of P) stored in a CUDA
 * backend *g and a CPU backend *c alike, keys in pool order. */
static void stored_pair(fp4idx_test_case_t *tc, fp4idx_backend_t **g, fp4idx_backend_t **c,
                        uint64_t seed, int H, int R, int64_t n, int32_t P) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  cr_assert_eq(fp4idx_test_case_dyadic(tc, &rng, H, R, n, P, (n + P - 1) / P, NULL, 0), 0);
  *g = mk(1, tc->n_pages, P);
  *c = mk(0, tc->n_pages, P);
  cr_assert_eq((*g)->ops->store(*g, tc->keys, FP4IDX_DTYPE_BF16, n, tc->slots, 0), 0);
  cr_assert_eq((*c)->ops->store(*c, tc->keys, FP4IDX_DTYPE_BF16, n, tc->slots, 0), 0);
}

/* Full logits of one sequence (n keys visible to every row) on g (CUDA,
 * resident flag as given, output from host_alloc) vs c (CPU). */
static void same_scores(fp4idx_backend_t *g, fp4idx_backend_t *c, const fp4idx_test_case_t *tc,
                        uint64_t seq, const int32_t *pages, int64_t n, int resident) {
  int32_t lens[8];
  for (int r = 0; r < tc->rows; r++) lens[r] = (int32_t)(n - r < 0 ? 0 : n - r);
  fp4idx_backend_seq_t s = {.pages = pages, .n_keys = n, .rows = tc->rows, .width = n,
                            .q = tc->q, .w = tc->w, .lens = lens, .seq = seq,
                            .resident = resident};
  size_t cells = (size_t)tc->rows * (size_t)n;
  void *og = NULL;
  cr_assert_eq(g->ops->host_alloc(g, cells * 4 + 4, &og), FP4IDX_OK);
  float *oc = malloc(cells * 4 + 4);
  fp4idx_backend_timing_t tm;
  memset(&tm, 0xff, sizeof tm);
  fp4idx_backend_batch_t bt = {.heads = tc->heads, .n_seqs = 1, .seqs = &s, .logits = og,
                               .timing = &tm};
  cr_assert_eq(g->ops->score(g, &bt), 0);
  cr_assert_eq(tm.timed, 1);
  cr_assert(tm.upload_us >= 0 && tm.kernels_us > 0 && tm.download_us >= 0,
            "timing %g %g %g", tm.upload_us, tm.kernels_us, tm.download_us);
  bt.logits = oc;
  bt.timing = NULL;
  cr_assert_eq(c->ops->score(c, &bt), 0);
  cr_assert_eq(fp4idx_test_count_diff(og, oc, (int64_t)cells), 0, "n %lld resident %d",
               (long long)n, resident);
  g->ops->host_free(g, og);
  free(oc);
}

Test(cuda_reqpath, resident_page_tables_follow_the_sequence, .timeout = 600) {
  NEED_GPU();
  const int32_t P = 16;
  const int64_t N = 5000, NP = (N + P - 1) / P, POOL = 2 * NP;
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 4242);
  fp4idx_test_case_t tc;
  cr_assert_eq(fp4idx_test_case_dyadic(&tc, &rng, 32, 4, N, P, POOL, NULL, 0), 0);
  fp4idx_backend_t *g = mk(1, POOL, P), *c = mk(0, POOL, P);
  /* every slot of the pool holds a key, so that a wrong page list shows */
  int64_t *all = malloc(sizeof *all * (size_t)(POOL * P));
  uint16_t *keys = malloc((size_t)(POOL * P) * 256);
  for (int64_t i = 0; i < POOL * P; i++) {
    all[i] = i;
    memcpy(keys + i * 128, tc.keys + (i % N) * 128, 256);
  }
  for (int64_t i = 0; i < POOL * P; i++) keys[i * 128 + i % 128] ^= 0x0100; /* differ */
  cr_assert_eq(g->ops->store(g, keys, FP4IDX_DTYPE_BF16, POOL * P, all, 0), 0);
  cr_assert_eq(c->ops->store(c, keys, FP4IDX_DTYPE_BF16, POOL * P, all, 0), 0);
  int32_t *pages = malloc(sizeof *pages * (size_t)POOL);
  memcpy(pages, tc.pages, sizeof *pages * (size_t)POOL);
  const uint64_t S = 77;
  /* grow the sequence in steps, as appends do (first = the old count) */
  int64_t have = 0;
  for (int64_t n = 1; n <= N; n = n * 3 + 5) {
    int64_t np = (n + P - 1) / P, old = (have + P - 1) / P;
    cr_assert_eq(g->ops->seq_pages_update(g, S, pages, np, old), 0);
    have = n;
    same_scores(g, c, &tc, S, pages, n, 1);
  }
  /* truncate to 100 keys, then append onto other pages (the freed ones
   * reused in another order) */
  cr_assert_eq(g->ops->seq_pages_update(g, S, pages, (100 + P - 1) / P, (100 + P - 1) / P), 0);
  same_scores(g, c, &tc, S, pages, 100, 1);
  for (int64_t i = (100 + P - 1) / P; i < NP; i++) pages[i] = (int32_t)(POOL - 1 - i);
  cr_assert_eq(g->ops->seq_pages_update(g, S, pages, NP, (100 + P - 1) / P), 0);
  same_scores(g, c, &tc, S, pages, N, 1);
  same_scores(g, c, &tc, S, pages, N, 0);
  /* dropped: resident scores of it upload the list again (still right) */
  cr_assert_eq(g->ops->seq_pages_update(g, S, NULL, 0, 0), 0);
  same_scores(g, c, &tc, S, pages, N, 1);
  /* an id never registered, and another sequence with the same pages */
  same_scores(g, c, &tc, 12345, pages, 3000, 1);
  cr_assert_eq(g->ops->seq_pages_update(g, S + 1, tc.pages, NP, 0), 0);
  same_scores(g, c, &tc, S + 1, tc.pages, N, 1);
  /* many sequences: the table rehashes */
  for (uint64_t s = 1000; s < 1300; s++)
    cr_assert_eq(g->ops->seq_pages_update(g, s, tc.pages, 1 + (int64_t)(s % NP), 0), 0);
  same_scores(g, c, &tc, 1299, tc.pages, (1 + (1299 % NP)) * P > N ? N : (1 + (1299 % NP)) * P, 1);
  same_scores(g, c, &tc, S + 1, tc.pages, N, 1);
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  fp4idx_test_case_free(&tc);
  free(all);
  free(keys);
  free(pages);
}

Test(cuda_reqpath, staging_sets_under_changing_sizes, .timeout = 600) {
  NEED_GPU();
  const int64_t N = 40000;
  fp4idx_test_case_t tc;
  fp4idx_backend_t *g, *c;
  stored_pair(&tc, &g, &c, 99, 64, 6, N, 64);
  const int64_t sizes[] = {10, N, 65, N / 2, 1, N, 4097, 3};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    same_scores(g, c, &tc, 0, tc.pages, sizes[i], 0);
  /* top-k into pinned outputs, twice (both sets) */
  for (int rep = 0; rep < 2; rep++) {
    const int k = 333;
    int32_t lens[6];
    for (int r = 0; r < 6; r++) lens[r] = (int32_t)(N - 1000 * r);
    fp4idx_backend_seq_t s = {.pages = tc.pages, .n_keys = N, .rows = 6, .width = N,
                              .q = tc.q, .w = tc.w, .lens = lens};
    void *mem = NULL;
    cr_assert_eq(g->ops->host_alloc(g, 6 * k * 8 + 64, &mem), 0);
    int32_t *pg = mem, cg[6], pc[6 * 333], cc[6];
    float *vg = (float *)(pg + 6 * k), vc[6 * 333];
    fp4idx_backend_batch_t bt = {.heads = 64, .n_seqs = 1, .seqs = &s, .topk = k,
                                 .topk_pos = pg, .topk_val = vg, .topk_count = cg};
    cr_assert_eq(g->ops->score(g, &bt), 0);
    bt.topk_pos = pc, bt.topk_val = vc, bt.topk_count = cc;
    cr_assert_eq(c->ops->score(c, &bt), 0);
    cr_assert_eq(memcmp(cg, cc, sizeof cc), 0);
    cr_assert_eq(memcmp(pg, pc, sizeof pc), 0);
    cr_assert_eq(fp4idx_test_count_diff(vg, vc, 6 * k), 0);
    g->ops->host_free(g, mem);
  }
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  fp4idx_test_case_free(&tc);
}

/* Outputs in pinned memory (small full logits stored there by the kernels
 * themselves, the rest copied by DMA) and in pageable memory, over twelve
 * shapes (full logits and top-k at several widths and k), three rounds in
 * a changing order so both staging sets see every shape after another:
 * every result equal to the CPU backend's, the device timing present each
 * time (the end event closes the kernels when nothing is copied back). */
Test(cuda_reqpath, pinned_and_pageable_outputs_over_shapes, .timeout = 600) {
  NEED_GPU();
  const int64_t N = 9000;
  fp4idx_test_case_t tc;
  fp4idx_backend_t *g, *c;
  stored_pair(&tc, &g, &c, 1234, 32, 4, N, 64);
  const int64_t widths[] = {N, 129, 4096, 1};
  const int ks[] = {0, 16, 700};
  void *pin = NULL;
  const size_t cap = (size_t)4 * N * 4 + 4096;
  cr_assert_eq(g->ops->host_alloc(g, cap, &pin), 0);
  uint8_t *page = malloc(cap), *want = malloc(cap);
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < 12; i++) {
      const int shape = (i * (round + 1) * 5 + round) % 12; /* every shape, another order */
      const int64_t W = widths[shape % 4];
      const int k = ks[shape / 4];
      int32_t lens[4];
      for (int r = 0; r < 4; r++) lens[r] = (int32_t)(W - r > 0 ? W - r : 0);
      fp4idx_backend_seq_t s = {.pages = tc.pages, .n_keys = N, .rows = 4, .width = W,
                                .q = tc.q, .w = tc.w, .lens = lens};
      for (int pinned = 0; pinned < 2; pinned++) {
        uint8_t *out = pinned == (i + round) % 2 ? (uint8_t *)pin : page;
        fp4idx_backend_timing_t tm;
        memset(&tm, 0, sizeof tm);
        fp4idx_backend_batch_t bt = {.heads = 32, .n_seqs = 1, .seqs = &s, .topk = k,
                                     .timing = &tm};
        size_t bytes;
        if (k) {
          bt.topk_pos = (int32_t *)out;
          bt.topk_val = (float *)(out + (size_t)4 * k * 4);
          bt.topk_count = (int32_t *)(out + (size_t)8 * k * 4);
          bytes = (size_t)8 * k * 4 + 16;
        } else {
          bt.logits = (float *)out;
          bytes = (size_t)4 * W * 4;
        }
        memset(out, 0x5a, bytes);
        cr_assert_eq(g->ops->score(g, &bt), 0, "shape %d round %d", shape, round);
        cr_assert_eq(tm.timed, 1);
        cr_assert(tm.kernels_us > 0, "shape %d: kernels %g us", shape, tm.kernels_us);
        fp4idx_backend_batch_t bc = bt;
        bc.timing = NULL;
        if (k) {
          bc.topk_pos = (int32_t *)want;
          bc.topk_val = (float *)(want + (size_t)4 * k * 4);
          bc.topk_count = (int32_t *)(want + (size_t)8 * k * 4);
        } else {
          bc.logits = (float *)want;
        }
        cr_assert_eq(c->ops->score(c, &bc), 0);
        cr_assert_eq(memcmp(out, want, bytes), 0, "shape %d (W %lld, k %d) round %d %s", shape,
                     (long long)W, k, round, out == pin ? "pinned" : "pageable");
      }
    }
  g->ops->host_free(g, pin);
  free(page);
  free(want);
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  fp4idx_test_case_free(&tc);
}

Test(cuda_reqpath, pinned_blocks_are_reused_and_aligned) {
  NEED_GPU();
  fp4idx_backend_t *g = mk(1, 4, 64);
  void *a = NULL, *b = NULL, *a2 = NULL;
  cr_assert_eq(g->ops->host_alloc(g, 1000000, &a), 0);
  cr_assert_eq((uintptr_t)a % 64, 0u);
  memset(a, 1, 1000000);
  g->ops->host_free(g, a);
  cr_assert_eq(g->ops->host_alloc(g, 900000, &a2), 0);
  cr_assert_eq(a2, a, "a freed block of a fitting size comes back");
  cr_assert_eq(g->ops->host_alloc(g, 10, &b), 0);
  cr_assert_neq(b, a2);
  g->ops->host_free(g, a2);
  g->ops->host_free(g, b);
  g->ops->host_free(g, NULL);
  fp4idx_backend_destroy(g);
}

/* Two calls in flight, as the daemon's worker holds them (score_submit,
 * then score_wait of the older one): batches of 4 sequences x 8 rows x 128
 * heads (1 MB of inputs, uploaded on the side stream while the kernels of
 * the call before run; full logits of 2.5 MB, copied back in parts, or
 * top-1024 results of 256 KB in one buffer) between one-row calls (all on
 * the main stream): every result equals the CPU backend's. */
Test(cuda_reqpath, uploads_overlapped_with_the_call_before, .timeout = 600) {
  NEED_GPU();
  enum { S = 4, CALLS = 12, K = 1024 };
  const int64_t N = 20000;
  fp4idx_test_case_t tc;
  fp4idx_backend_t *g, *c;
  stored_pair(&tc, &g, &c, 123, 128, 8, N, 64); /* q of 8 rows x 128 heads: 256 KB */
  fp4idx_backend_seq_t seqs[2][S];
  int32_t lens[2][S][8];
  fp4idx_backend_batch_t bt[2];
  void *out[2] = {NULL, NULL};
  size_t bytes[2] = {0, 0}, tkb[2] = {0, 0};
  int ticket[2] = {-1, -1};
  for (int i = 0; i < CALLS + 2; i++) {
    const int k = i % 2;
    if (i >= 2) { /* call i - 2 in slot k: wait, then the CPU's answer to it */
      if (ticket[k] >= 0)
        cr_assert_eq(g->ops->score_wait(g, ticket[k]), FP4IDX_OK, "call %d", i - 2);
      uint8_t *ref = malloc(bytes[k]);
      cr_assert_not_null(ref);
      memset(ref, 0, bytes[k]);
      fp4idx_backend_batch_t cb = bt[k];
      if (cb.topk) { /* the same layout in ref */
        cb.topk_pos = (int32_t *)ref;
        cb.topk_val = (float *)(ref + tkb[k]);
        cb.topk_count = (int32_t *)(ref + 2 * tkb[k]);
      } else {
        cb.logits = (float *)ref;
      }
      cr_assert_eq(c->ops->score(c, &cb), FP4IDX_OK);
      cr_assert_eq(memcmp(out[k], ref, bytes[k]), 0,
                   "call %d (%d sequences, top-%d): results differ from the CPU backend", i - 2,
                   bt[k].n_seqs, bt[k].topk);
      free(ref);
      g->ops->host_free(g, out[k]);
      out[k] = NULL;
    }
    if (i >= CALLS) continue;
    const int big = i % 3 != 2, ns = big ? S : 1, topk = big && i % 4 == 1 ? K : 0;
    size_t cells = 0, rows_all = 0;
    for (int j = 0; j < ns; j++) {
      const int rows = big ? 8 : 1;
      const int64_t width = N - 97 * (i + j);
      for (int r = 0; r < rows; r++) lens[k][j][r] = (int32_t)(width - 13 * r);
      seqs[k][j] = (fp4idx_backend_seq_t){.pages = tc.pages, .n_keys = N, .rows = rows,
                                          .width = width, .q = tc.q, .w = tc.w,
                                          .lens = lens[k][j]};
      cells += (size_t)rows * (size_t)width;
      rows_all += (size_t)rows;
    }
    /* top-k as the daemon lays it out: [positions | logits | counts] */
    const size_t tk = rows_all * K * 4;
    tkb[k] = tk;
    bytes[k] = topk ? 2 * tk + rows_all * 4 : cells * 4;
    cr_assert_eq(g->ops->host_alloc(g, bytes[k], &out[k]), FP4IDX_OK);
    memset(out[k], 0, bytes[k]);
    bt[k] = (fp4idx_backend_batch_t){.heads = tc.heads, .n_seqs = ns, .seqs = seqs[k]};
    if (topk) {
      bt[k].topk = topk;
      bt[k].topk_pos = out[k];
      bt[k].topk_val = (float *)((uint8_t *)out[k] + tk);
      bt[k].topk_count = (int32_t *)((uint8_t *)out[k] + 2 * tk);
      bt[k].topk_one_buffer = 1;
    } else {
      bt[k].logits = out[k];
    }
    cr_assert_eq(g->ops->score_submit(g, &bt[k], &ticket[k]), FP4IDX_OK, "call %d", i);
  }
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  fp4idx_test_case_free(&tc);
}
