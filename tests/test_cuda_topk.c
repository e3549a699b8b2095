/* test_cuda_topk.c -- the GPU top-k (kernels/cuda/topk.cu) bit for bit
 * against the CPU: through the backend's score op with topk > 0 (CUDA vs the
 * CPU backend) and through fp4idx_cuda_topk_launch on synthetic logits
 * (vs fp4idx_test_ref_topk, a host sort). Order: logit descending, ties by
 * lower position, only visible positions, padding (-1, -inf).
 *
 * Covered: Gaussian and dyadic logits; every logit equal; all rows
 * invisible (-inf) and rows of width 0; lens < k; k = 1, k = the visible
 * count, k = 65,536 and k = 1,048,576; widths that are multiples of
 * nothing; 1,024 rows of different widths; a row of 4,000,000 positions;
 * NaN (never returned) and -0 (ties +0); a CUDA graph replayed on new
 * logits; argument errors. Every case runs through each path that can
 * take it (chunked; cluster on sm_90+, kernels/cuda/topk_cluster.cu), and
 * the automatic plan must follow its rule (the cluster path wherever it
 * can run). The cluster path's select and rank edges (a pass whose digit
 * bin is taken whole, every key above the threshold equal, all visible
 * keys fewer than k, buckets of one value) have their own test, and so
 * have bf16-valued Gaussian rows (ties in every rank bucket) and a small
 * 2-block case for compute-sanitizer. GPU tests skip cleanly without a GPU.
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

/* ---- through fp4idx_cuda_topk_launch ------------------------------------- */

/* Device copy of n_rows rows of logits (concatenated in lg, widths w), the
 * plan and its outputs. */
typedef struct {
  int32_t n_rows, k;
  float *d_lg;
  fp4idx_cuda_topk_row_t *h_rows, *d_rows;
  fp4idx_cuda_topk_plan_t plan;
  void *ws;
  int32_t *d_pos, *d_cnt;
  float *d_val;
} topk_run_t;

/* Plans with `path`: returns its status (FP4IDX_ENODEV: the cluster path
 * cannot run this shape here; nothing allocated then). */
static int run_setup_path(topk_run_t *t, int32_t n_rows, const int64_t *w, const float *lg,
                          int32_t k, fp4idx_cuda_topk_path_t path) {
  memset(t, 0, sizeof *t);
  t->n_rows = n_rows;
  t->k = k;
  int64_t total = 0;
  for (int32_t r = 0; r < n_rows; r++) total += w[r];
  cr_assert_eq(cudaMalloc((void **)&t->d_lg, sizeof(float) * (size_t)(total + 1)), cudaSuccess);
  cr_assert_eq(cudaMemcpy(t->d_lg, lg, sizeof(float) * (size_t)total, cudaMemcpyHostToDevice),
               cudaSuccess);
  t->h_rows = calloc((size_t)n_rows + 1, sizeof *t->h_rows);
  cr_assert(t->h_rows);
  int64_t at = 0;
  for (int32_t r = 0; r < n_rows; r++) {
    t->h_rows[r].logits = t->d_lg + at;
    t->h_rows[r].width = w[r];
    at += w[r];
  }
  const int prc = fp4idx_cuda_topk_plan_path(t->h_rows, n_rows, k, path, &t->plan);
  if (prc != FP4IDX_OK) {
    cr_assert((path == FP4IDX_CUDA_TOPK_CLUSTER || path == FP4IDX_CUDA_TOPK_ROWSORT) &&
                  prc == FP4IDX_ENODEV,
              "plan: %d", prc);
    cudaFree(t->d_lg);
    free(t->h_rows);
    return prc;
  }
  cr_assert_eq(cudaMalloc((void **)&t->d_rows, sizeof *t->h_rows * ((size_t)n_rows + 1)), cudaSuccess);
  cr_assert_eq(cudaMemcpy(t->d_rows, t->h_rows, sizeof *t->h_rows * (size_t)n_rows,
                          cudaMemcpyHostToDevice), cudaSuccess);
  cr_assert_eq(cudaMalloc(&t->ws, t->plan.ws_bytes), cudaSuccess);
  const size_t nk = (size_t)n_rows * (size_t)k;
  cr_assert_eq(cudaMalloc((void **)&t->d_pos, 4 * nk), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&t->d_val, 4 * nk), cudaSuccess);
  cr_assert_eq(cudaMalloc((void **)&t->d_cnt, 4 * (size_t)n_rows), cudaSuccess);
  /* Poison: every output must be written by the launch. */
  cr_assert_eq(cudaMemset(t->d_pos, 0x5a, 4 * nk), cudaSuccess);
  cr_assert_eq(cudaMemset(t->d_val, 0x5a, 4 * nk), cudaSuccess);
  cr_assert_eq(cudaMemset(t->d_cnt, 0x5a, 4 * (size_t)n_rows), cudaSuccess);
  return FP4IDX_OK;
}

static void run_setup(topk_run_t *t, int32_t n_rows, const int64_t *w, const float *lg, int32_t k) {
  cr_assert_eq(run_setup_path(t, n_rows, w, lg, k, FP4IDX_CUDA_TOPK_AUTO), FP4IDX_OK);
}

static void run_free(topk_run_t *t) {
  cudaFree(t->d_lg);
  cudaFree(t->d_rows);
  cudaFree(t->ws);
  cudaFree(t->d_pos);
  cudaFree(t->d_val);
  cudaFree(t->d_cnt);
  free(t->h_rows);
}

/* The host sort of lg (rows of widths w), k pairs a row. */
typedef struct {
  int32_t *pos, *cnt;
  float *val;
} topk_ref_t;

static void ref_make(topk_ref_t *ref, int32_t n_rows, const int64_t *w, const float *lg, int32_t k) {
  const size_t nk = (size_t)n_rows * (size_t)k;
  ref->pos = malloc(4 * nk + 4);
  ref->val = malloc(4 * nk + 4);
  ref->cnt = malloc(4 * (size_t)n_rows + 4);
  cr_assert(ref->pos && ref->val && ref->cnt);
  int64_t at = 0;
  for (int32_t r = 0; r < n_rows; r++) {
    cr_assert_eq(fp4idx_test_ref_topk(lg + at, 1, w[r], k, ref->pos + (size_t)r * (size_t)k,
                                      ref->val + (size_t)r * (size_t)k, &ref->cnt[r]), 0);
    at += w[r];
  }
}

static void ref_free(topk_ref_t *ref) {
  free(ref->pos);
  free(ref->val);
  free(ref->cnt);
}

/* Compares the device outputs of t with the reference, row by row. */
static void run_compare_ref(const topk_run_t *t, const char *what, const int64_t *w,
                            const topk_ref_t *ref) {
  const int32_t n_rows = t->n_rows, k = t->k;
  const size_t nk = (size_t)n_rows * (size_t)k;
  int32_t *pos = malloc(4 * nk + 4), *cnt = malloc(4 * (size_t)n_rows + 4);
  float *val = malloc(4 * nk + 4);
  cr_assert(pos && cnt && val);
  cr_assert_eq(cudaMemcpy(pos, t->d_pos, 4 * nk, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(cudaMemcpy(val, t->d_val, 4 * nk, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(cudaMemcpy(cnt, t->d_cnt, 4 * (size_t)n_rows, cudaMemcpyDeviceToHost), cudaSuccess);
  const char *path = t->plan.rowsort ? "row-sort" : t->plan.cluster ? "cluster" : "chunked";
  for (int32_t r = 0; r < n_rows; r++) {
    cr_assert_eq(cnt[r], ref->cnt[r], "%s (%s path): row %d (width %lld): count %d, want %d",
                 what, path, r, (long long)w[r], cnt[r], ref->cnt[r]);
    const int32_t *gp = pos + (size_t)r * (size_t)k, *rp = ref->pos + (size_t)r * (size_t)k;
    for (int32_t i = 0; i < k; i++)
      if (gp[i] != rp[i])
        cr_assert_fail("%s (%s path): row %d (width %lld) k=%d: pair %d has position %d, want %d",
                       what, path, r, (long long)w[r], k, i, gp[i], rp[i]);
    cr_assert_eq(fp4idx_test_count_diff(val + (size_t)r * (size_t)k,
                                        ref->val + (size_t)r * (size_t)k, k), 0,
                 "%s (%s path): row %d: logits differ", what, path, r);
  }
  free(pos); free(cnt); free(val);
}

static void run_compare(const topk_run_t *t, const char *what, const int64_t *w, const float *lg) {
  topk_ref_t ref;
  ref_make(&ref, t->n_rows, w, lg, t->k);
  run_compare_ref(t, what, w, &ref);
  ref_free(&ref);
}

/* Every path that can run the case (the chunked one always, the cluster
 * and row-sort ones where the shape and device allow), each against the
 * host sort. */
static void direct(const char *what, int32_t n_rows, const int64_t *w, const float *lg, int32_t k) {
  topk_ref_t ref;
  ref_make(&ref, n_rows, w, lg, k);
  const fp4idx_cuda_topk_path_t paths[3] = {FP4IDX_CUDA_TOPK_CHUNKED, FP4IDX_CUDA_TOPK_CLUSTER,
                                             FP4IDX_CUDA_TOPK_ROWSORT};
  for (int pi = 0; pi < 3; pi++) {
    topk_run_t t;
    if (run_setup_path(&t, n_rows, w, lg, k, paths[pi]) != FP4IDX_OK) continue;
    cr_assert_eq(t.plan.cluster > 0, pi == 1, "%s: plan took another path", what);
    cr_assert_eq(t.plan.rowsort > 0, pi == 2, "%s: plan took another path", what);
    cr_assert_eq(fp4idx_cuda_topk_launch(&t.plan, t.d_rows, t.ws, t.d_pos, t.d_val, t.d_cnt, 0),
                 FP4IDX_OK, "%s: launch", what);
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess, "%s: kernel error", what);
    run_compare_ref(&t, what, w, &ref);
    run_free(&t);
  }
  ref_free(&ref);
}

static double gauss(fp4idx_test_rng_t *g) {
  const double u = ((double)(fp4idx_test_rng_next(g) >> 11) + 0.5) / 9007199254740992.0;
  const double v = (double)(fp4idx_test_rng_next(g) >> 11) / 9007199254740992.0;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Fills n logits: kind 0 Gaussian f32, 1 dyadic k/8 (|k| <= 64, many
 * ties), 2 every logit 1.5; positions >= vis are -inf. */
static void fill(fp4idx_test_rng_t *g, float *x, int64_t n, int64_t vis, int kind) {
  for (int64_t i = 0; i < n; i++) {
    if (i >= vis) x[i] = -INFINITY;
    else if (kind == 0) x[i] = (float)gauss(g);
    else if (kind == 1) x[i] = (float)fp4idx_test_rng_range(g, -64, 64) / 8.0f;
    else x[i] = 1.5f;
  }
}

static float *rows_alloc(int32_t n_rows, const int64_t *w) {
  int64_t total = 0;
  for (int32_t r = 0; r < n_rows; r++) total += w[r];
  float *x = malloc(sizeof(float) * (size_t)(total + 1));
  cr_assert(x);
  return x;
}

Test(cuda_topk, gaussian_and_dyadic_r4_400k, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17001);
  const int64_t w[4] = {400000, 400000, 400000, 400000};
  float *x = rows_alloc(4, w);
  for (int kind = 0; kind < 2; kind++) {
    for (int r = 0; r < 4; r++) fill(&g, x + r * w[0], w[0], w[0] - r, kind);
    direct(kind ? "dyadic 4x400000 k=2048" : "gauss 4x400000 k=2048", 4, w, x, 2048);
    direct(kind ? "dyadic 4x400000 k=512" : "gauss 4x400000 k=512", 4, w, x, 512);
  }
  free(x);
}

Test(cuda_topk, odd_widths_k1_and_visible_count, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17002);
  const int64_t w[6] = {1, 3, 2049, 4097, 65537, 100003};
  float *x = rows_alloc(6, w);
  for (int kind = 0; kind < 2; kind++) {
    int64_t at = 0;
    for (int r = 0; r < 6; r++) { fill(&g, x + at, w[r], w[r], kind); at += w[r]; }
    direct("k=1", 6, w, x, 1);
    direct("k=7", 6, w, x, 7);
    direct("k=4097 (visible count of a row)", 6, w, x, 4097);
    direct("k=8192", 6, w, x, 8192);
    direct("k=8193 (large-k path)", 6, w, x, 8193);
  }
  /* k equal to the visible count of the only row, smem and large-k paths */
  const int64_t one = 5000;
  fill(&g, x, one, 3000, 0);
  direct("k=3000=visible of 5000", 1, &one, x, 3000);
  const int64_t big = 100000;
  float *y = rows_alloc(1, &big);
  fill(&g, y, big, 20000, 0);
  direct("k=20000=visible of 100000", 1, &big, y, 20000);
  free(x);
  free(y);
}

Test(cuda_topk, all_equal_ties_everywhere, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17003);
  const int64_t w[3] = {100000, 9295, 12289};
  float *x = rows_alloc(3, w);
  int64_t at = 0;
  for (int r = 0; r < 3; r++) { fill(&g, x + at, w[r], w[r] - 7 * r, 2); at += w[r]; }
  direct("ties k=2048", 3, w, x, 2048);   /* candidates > shared memory: read in place */
  direct("ties k=4096", 3, w, x, 4096);   /* the cluster path's largest k */
  direct("ties k=8192", 3, w, x, 8192);
  direct("ties k=65536", 3, w, x, 65536); /* large-k path */
  free(x);
}

Test(cuda_topk, invisible_rows_and_lens_below_k, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17004);
  const int64_t w[7] = {0, 1000, 0, 3000, 70000, 1, 0};
  const int64_t vis[7] = {0, 0, 0, 100, 0, 1, 0};
  float *x = rows_alloc(7, w);
  int64_t at = 0;
  for (int r = 0; r < 7; r++) { fill(&g, x + at, w[r], vis[r], 0); at += w[r]; }
  direct("invisible k=16", 7, w, x, 16);
  direct("invisible k=512", 7, w, x, 512);
  direct("invisible k=100000", 7, w, x, 100000);
  const int64_t z[3] = {0, 0, 0};
  direct("all widths 0", 3, z, x, 64);
  direct("all widths 0, large k", 3, z, x, 10000);
  free(x);
}

Test(cuda_topk, nan_never_returned_negative_zero_ties, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17005);
  const int64_t w[2] = {30000, 30000};
  float *x = rows_alloc(2, w);
  fill(&g, x, 60000, 60000, 1);
  for (int64_t i = 0; i < 60000; i += 5) x[i] = i % 2 ? NAN : -NAN;
  for (int64_t i = 1; i < 60000; i += 7) x[i] = (i / 7) % 2 ? -0.0f : 0.0f;
  direct("nan/-0 k=40000 (every visible)", 2, w, x, 40000);
  for (int64_t i = 0; i < 60000; i++)
    if (!isnan(x[i]) && x[i] > 0) x[i] = -x[i]; /* zeros become the best keys */
  direct("nan/-0 k=3000", 2, w, x, 3000);
  free(x);
}

Test(cuda_topk, rows_1024_of_different_widths, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17006);
  int64_t w[1024];
  for (int r = 0; r < 1024; r++) w[r] = fp4idx_test_rng_range(&g, 0, 20000);
  w[5] = 0;
  w[6] = 2048;
  float *x = rows_alloc(1024, w);
  int64_t at = 0;
  for (int r = 0; r < 1024; r++) {
    fill(&g, x + at, w[r], w[r] - fp4idx_test_rng_range(&g, 0, 3 < w[r] ? 3 : w[r]), r % 2);
    at += w[r];
  }
  direct("1024 rows k=2048", 1024, w, x, 2048);
  direct("1024 rows k=512", 1024, w, x, 512);
  direct("1024 rows k=9000", 1024, w, x, 9000);
  free(x);
}

Test(cuda_topk, k_65536_and_1048576_row_of_4m, .timeout = 900) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17007);
  const int64_t w4[1] = {4000000};
  float *x = rows_alloc(1, w4);
  fill(&g, x, w4[0], w4[0], 0);
  direct("4M gauss k=2048", 1, w4, x, 2048);
  direct("4M gauss k=65536", 1, w4, x, 65536);
  direct("4M gauss k=1048576", 1, w4, x, 1048576);
  fill(&g, x, w4[0], w4[0], 1);
  direct("4M dyadic k=512", 1, w4, x, 512);
  direct("4M dyadic k=1048576", 1, w4, x, 1048576);
  free(x);
  const int64_t w2[2] = {300000, 700001};
  float *y = rows_alloc(2, w2);
  fill(&g, y, w2[0], 250000, 0);
  fill(&g, y + w2[0], w2[1], w2[1], 0);
  direct("2 rows k=1048576 (fewer visible)", 2, w2, y, 1048576);
  direct("2 rows k=65536", 2, w2, y, 65536);
  free(y);
}

Test(cuda_topk, graph_replay_on_new_logits, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17008);
  const int64_t w[3] = {65536, 65536, 9295};
  const int64_t total = 65536 * 2 + 9295;
  float *x = rows_alloc(3, w);
  for (int ks = 0; ks < 2; ks++) {
    const int32_t k = ks ? 20000 : 2048;
    topk_run_t t;
    fill(&g, x, total, total, 0);
    run_setup(&t, 3, w, x, k);
    cudaStream_t st;
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    cr_assert_eq(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    cr_assert_eq(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), cudaSuccess);
    cr_assert_eq(fp4idx_cuda_topk_launch(&t.plan, t.d_rows, t.ws, t.d_pos, t.d_val, t.d_cnt, st),
                 FP4IDX_OK);
    cr_assert_eq(cudaStreamEndCapture(st, &gr), cudaSuccess);
    cr_assert_eq(cudaGraphInstantiate(&ge, gr, 0), cudaSuccess);
    for (int rep = 0; rep < 2; rep++) {
      if (rep) {
        fill(&g, x, total, total, 1);
        /* on the graph's own stream: a pageable cudaMemcpy may return before
         * its DMA lands, and st does not wait for the legacy stream */
        cr_assert_eq(cudaMemcpyAsync(t.d_lg, x, sizeof(float) * total, cudaMemcpyHostToDevice, st),
                     cudaSuccess);
      }
      cr_assert_eq(cudaGraphLaunch(ge, st), cudaSuccess);
      cr_assert_eq(cudaStreamSynchronize(st), cudaSuccess);
      run_compare(&t, rep ? "graph replay 2" : "graph replay 1", w, x);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    cudaStreamDestroy(st);
    run_free(&t);
  }
  free(x);
}

/* The counting-rank finish (topk.cu: rank_kernel) takes a row when no
 * bucket of candidates (the keys of one level-1 bin, the top 12 key bits)
 * holds more than the plan's bucket_cap keys (4096 up to 32 rows, 2048
 * above); finish_kernel takes the others. Rows here sit on both sides of
 * both edges: 300 keys in high bins, then a bucket of 2048, 2049, 4096 or
 * 4097 keys in [1, 1.125) (one bin), distinct or tied in runs of 16, so
 * the k-th key lies in the big bucket (k = 512 / 2048), above it (k = 64)
 * or below it (k = 4500); also many small buckets (tiles span several) and
 * rows holding fewer than k keys. The batch runs as 8 rows and as 40. */
Test(cuda_topk, rank_finish_bucket_edges, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17010);
  enum { NR = 40 };
  int64_t w[NR];
  for (int r = 0; r < NR; r++) w[r] = r % 8 < 6 ? 20000 : r % 8 == 6 ? 9295 : 1500;
  float *x = rows_alloc(NR, w);
  static const int64_t bigs[6] = {2048, 2049, 4096, 4097, 4096, 2049};
  int64_t at = 0;
  for (int r = 0; r < NR; r++) {
    float *y = x + at;
    for (int64_t i = 0; i < w[r]; i++) y[i] = -1.0f - (float)fp4idx_test_rng_range(&g, 0, 1000) / 64.0f;
    if (r % 8 < 6) {
      for (int64_t i = 0; i < 300; i++) /* high bins: 2 .. 64 */
        y[fp4idx_test_rng_range(&g, 0, w[r] - 1)] = 2.0f + (float)fp4idx_test_rng_range(&g, 0, 62);
      for (int64_t i = 0; i < bigs[r % 8]; i++) /* r % 8 >= 4: runs of 16 equal keys */
        y[3000 + i * 4] = 1.0f + (float)(r % 8 < 4 ? i : i / 16) / 65536.0f;
    } else if (r % 8 == 6) {
      for (int64_t i = 0; i < w[r]; i++) y[i] = (float)fp4idx_test_rng_range(&g, -4096, 4096) / 8.0f;
    } /* r % 8 == 7: every key in (-16.7, -1], fewer than k = 2048 */
    at += w[r];
  }
  const int32_t ks[5] = {64, 512, 2048, 4500, 8192};
  for (int n = 8; n <= NR; n += NR - 8)
    for (int i = 0; i < 5; i++) {
      char what[64];
      snprintf(what, sizeof what, "bucket edges %d rows k=%d", n, ks[i]);
      direct(what, n, w, x, ks[i]);
    }
  free(x);
}

static int device_is_sm90(void) {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         major >= 9;
}

/* The request shapes of the benchmark and the row-sort and cluster paths'
 * edges: every path must agree with the host sort (direct runs each), and
 * on sm_90+ the automatic plan must pick the path its rule names. Rows of
 * odd widths start at logits that are not 16-byte aligned. */
Test(cuda_topk, cluster_path_shapes, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17009);
  static const struct { int32_t rows; int64_t w; int32_t k; } cs[] = {
      {4, 65536, 512}, {4, 65536, 2048}, {64, 9295, 2048}, {128, 32768, 512},
      {3, FP4IDX_CUDA_TOPK_CLUSTER_WIDTH, 4096}, /* the widest row, the largest k */
      {1, FP4IDX_CUDA_TOPK_CLUSTER_WIDTH + 1, 2048}, /* one position wider: chunked */
      {5, 32769, 1},     {2, 7, 4096}, {1000, 3001, 64}, {2, 400000, 2048},
      {4, FP4IDX_CUDA_TOPK_ROWSORT_WIDTH, 2048}, /* too few rows for the row sort */
      {100, FP4IDX_CUDA_TOPK_ROWSORT_WIDTH, 512}, /* the row sort's widest rows */
      {100, FP4IDX_CUDA_TOPK_ROWSORT_WIDTH + 1, 512}}; /* one wider: the cluster path */
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    int64_t *w = malloc(sizeof(int64_t) * (size_t)cs[c].rows);
    cr_assert(w);
    for (int32_t r = 0; r < cs[c].rows; r++) w[r] = cs[c].w - (r % 3 == 2 ? r % 5 : 0);
    float *x = rows_alloc(cs[c].rows, w);
    int64_t at = 0;
    for (int32_t r = 0; r < cs[c].rows; r++) {
      fill(&g, x + at, w[r], w[r] - r % 4, (int)(c % 2));
      at += w[r];
    }
    char what[96];
    snprintf(what, sizeof what, "%d x %lld k=%d", cs[c].rows, (long long)cs[c].w, cs[c].k);
    if (device_is_sm90()) {
      /* The automatic plan takes the row sort for (SMs / 4, SMs] rows of up
       * to FP4IDX_CUDA_TOPK_ROWSORT_WIDTH, else the cluster path exactly
       * where it can run (rows up to FP4IDX_CUDA_TOPK_CLUSTER_WIDTH on the
       * H200). */
      fp4idx_cuda_topk_row_t *hr = calloc((size_t)cs[c].rows, sizeof *hr);
      cr_assert(hr);
      for (int32_t r = 0; r < cs[c].rows; r++) hr[r].width = w[r];
      fp4idx_cuda_topk_plan_t p, pc;
      const int crc = fp4idx_cuda_topk_plan_path(hr, cs[c].rows, cs[c].k,
                                                 FP4IDX_CUDA_TOPK_CLUSTER, &pc);
      cr_assert_eq(crc == FP4IDX_OK, cs[c].w <= FP4IDX_CUDA_TOPK_CLUSTER_WIDTH,
                   "%s: cluster plan %d", what, crc);
      cr_assert_eq(fp4idx_cuda_topk_plan(hr, cs[c].rows, cs[c].k, &p), FP4IDX_OK);
      int sms = 0;
      cr_assert_eq(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
      const int rowsort = cs[c].w <= FP4IDX_CUDA_TOPK_ROWSORT_WIDTH && cs[c].k <= 4096 &&
                          cs[c].rows <= sms && cs[c].rows * 4 > sms;
      const int want = crc == FP4IDX_OK && !rowsort;
      cr_assert_eq(p.rowsort, rowsort, "%s: automatic plan's path (row sort)", what);
      cr_assert_eq(p.cluster > 0, want, "%s: automatic plan's path (cluster %d)", what,
                   pc.cluster);
      if (want) cr_assert_eq(p.cluster, pc.cluster, "%s: same cluster size", what);
      free(hr);
    }
    direct(what, cs[c].rows, w, x, cs[c].k);
    free(x);
    free(w);
  }
}

/* The cluster path's select and rank edges, as 4 rows of 65,536 (clusters
 * of 16), 64 rows of 9,295 (small clusters; the row sort) and 4 of 16,384
 * (the row sort's widest rows), against the host sort:
 * every key above the threshold equal (one bucket of ties ranked by
 * position), exactly k keys of one value (the first digit's bin taken
 * whole), 2,048 distinct keys in one level-1 bin (whole at k = 2048, three
 * passes at 1500), a 24-bit prefix taken whole (the second pass ends it),
 * fewer visible keys than k. */
Test(cuda_topk, cluster_select_edges, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17011);
  static const struct { int32_t rows; int64_t w; } shapes[3] = {
      {4, 65536}, {64, 9295}, {4, FP4IDX_CUDA_TOPK_ROWSORT_WIDTH}};
  for (int sh = 0; sh < 3; sh++) {
    const int32_t nr = shapes[sh].rows;
    int64_t *w = malloc(sizeof(int64_t) * (size_t)nr);
    cr_assert(w);
    for (int32_t r = 0; r < nr; r++) w[r] = shapes[sh].w - r % 3;
    float *x = rows_alloc(nr, w);
    for (int kind = 0; kind < 5; kind++) {
      int64_t at = 0;
      for (int32_t r = 0; r < nr; r++) {
        float *y = x + at;
        const int64_t n = w[r];
        for (int64_t i = 0; i < n; i++) y[i] = kind == 4 ? -INFINITY : 1.0f;
        if (kind == 0) /* 1,000 keys of 3.0 above a threshold of ties */
          for (int64_t i = 0; i < 1000; i++) y[(i * 7919 + r) % n] = 3.0f;
        else if (kind == 1) /* exactly k = 2048 keys of 2.0 */
          for (int64_t i = 0; i < 2048; i++) y[(i * 4 + r) % n] = 2.0f;
        else if (kind == 2) /* 2,048 distinct keys in [2, 2.0039): one 12-bit bin */
          for (int64_t i = 0; i < 2048; i++) y[(i * 3 + 1) % n] = 2.0f + (float)i / 524288.0f;
        else if (kind == 3) /* 2,048 keys of one 24-bit prefix, 1,000 below in its 12-bit bin */
          for (int64_t i = 0; i < 3048; i++)
            y[(i * 3 + 2) % n] = i < 2048 ? 2.0f + 1.0f / 1024.0f + (float)(i % 2) / 4194304.0f : 2.0f;
        else /* kind 4: 10 visible keys, the rest -inf */
          for (int64_t i = 0; i < 10; i++)
            y[fp4idx_test_rng_range(&g, 0, n - 1)] = (float)fp4idx_test_rng_range(&g, -8, 8);
        at += n;
      }
      char what[96];
      snprintf(what, sizeof what, "select edge %d, %d x %lld k=2048", kind, nr,
               (long long)shapes[sh].w);
      direct(what, nr, w, x, 2048);
      snprintf(what, sizeof what, "select edge %d, %d x %lld k=1500", kind, nr,
               (long long)shapes[sh].w);
      direct(what, nr, w, x, 1500);
    }
    free(x);
    free(w);
  }
}

/* Gaussian logits rounded to bf16 (the values the scorer writes: ties in
 * every bucket of the cluster path's rank, dozens of keys deep near the
 * threshold), scaled by 64 so that the keys' low 16 bits are zero and
 * their high bits spread over several binades, with 1% NaN and 1% -inf;
 * shapes that take 512- and 1024-thread blocks (4 x 400,000: 25,000 keys
 * a block) and clusters of 16, 2 and 4 blocks. */
static void fill_bf16(fp4idx_test_rng_t *g, float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float f = (float)(64.0 * gauss(g));
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u; /* round to nearest even */
    memcpy(&x[i], &u, 4);
    const int64_t c = fp4idx_test_rng_range(g, 0, 99);
    if (c == 0) x[i] = NAN;
    else if (c == 1) x[i] = -INFINITY;
  }
}

Test(cuda_topk, cluster_bf16_ties, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17061);
  static const struct { int32_t rows; int64_t w; } shapes[4] = {
      {4, 65536}, {64, 9295}, {4, 400000}, {16, 30001}};
  for (int sh = 0; sh < 4; sh++) {
    const int32_t nr = shapes[sh].rows;
    int64_t *w = malloc(sizeof(int64_t) * (size_t)nr);
    cr_assert(w);
    for (int32_t r = 0; r < nr; r++) w[r] = shapes[sh].w - r % 4;
    float *x = rows_alloc(nr, w);
    int64_t at = 0;
    for (int32_t r = 0; r < nr; r++) {
      fill_bf16(&g, x + at, w[r]);
      at += w[r];
    }
    static const int32_t ks[3] = {512, 2048, 4096};
    for (int ki = 0; ki < 3; ki++) {
      char what[96];
      snprintf(what, sizeof what, "bf16 Gaussian, %d x %lld k=%d", nr, (long long)shapes[sh].w,
               ks[ki]);
      direct(what, nr, w, x, ks[ki]);
    }
    free(x);
    free(w);
  }
}

/* The row sort's orderings, 4 rows of 16,384 against the host sort: keys
 * over 120 binades of both signs (the sort takes every key bit; the
 * rank's buckets of 16 key bits hold keys that differ below them), bf16
 * Gaussian keys (the upper 16 bits only), each value 300 and 256 times
 * (ties deep in the list and at the threshold; at k = 64 a 300-deep bucket
 * sends the rank to the sort, a 256-deep one is the rank's largest), at
 * k = 64 (the counting rank where it can) and 2048 and 4096 (the block
 * sort); the other paths on the same rows. */
Test(cuda_topk, rowsort_orderings, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17063);
  const int64_t w[4] = {16384, 16383, 16384, 16001};
  float *x = rows_alloc(4, w);
  for (int kind = 0; kind < 4; kind++) {
    int64_t at = 0;
    for (int32_t r = 0; r < 4; r++) {
      float *y = x + at;
      if (kind == 1) fill_bf16(&g, y, w[r]);
      for (int64_t i = 0; kind != 1 && i < w[r]; i++) {
        if (kind == 0) {
          const double m = ldexp(1.0 + (double)fp4idx_test_rng_range(&g, 0, 1023) / 1024.0,
                                 (int)fp4idx_test_rng_range(&g, -60, 60));
          y[i] = (float)(fp4idx_test_rng_range(&g, 0, 1) ? m : -m);
        } else {
          const int64_t rep = kind == 2 ? 300 : 256;
          y[i] = (float)((i * 7919 + r) % w[r] / rep) / 4.0f;
        }
      }
      at += w[r];
    }
    static const int32_t ks[3] = {64, 2048, 4096};
    for (int ki = 0; ki < 3; ki++) {
      char what[96];
      snprintf(what, sizeof what, "row-sort ordering %d, 4 x 16384 k=%d", kind, ks[ki]);
      direct(what, 4, w, x, ks[ki]);
    }
  }
  free(x);
}

/* A small case of the cluster path (2 rows x 9,000: clusters of 2 blocks),
 * bf16 ties and all-equal rows, for compute-sanitizer runs. */
Test(cuda_topk, cluster_small, .timeout = 600) {
  NEED_GPU();
  fp4idx_test_rng_t g;
  fp4idx_test_rng_seed(&g, 17062);
  const int64_t w[2] = {9000, 8999};
  float *x = rows_alloc(2, w);
  fill_bf16(&g, x, w[0]);
  for (int64_t i = 0; i < w[1]; i++) x[w[0] + i] = 1.0f;
  direct("small bf16 + all-equal, 2 x 9000 k=100", 2, w, x, 100);
  direct("small bf16 + all-equal, 2 x 9000 k=2048", 2, w, x, 2048);
  free(x);
}

/* Argument errors: no GPU needed (nothing reaches the device). */
Test(cuda_topk, plan_and_launch_errors) {
  fp4idx_cuda_topk_row_t rows[2] = {{NULL, 10, 0}, {NULL, 20, 0}};
  fp4idx_cuda_topk_plan_t p;
  cr_assert_eq(fp4idx_cuda_topk_plan(rows, 2, 0, &p), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_cuda_topk_plan(rows, 2, FP4IDX_CUDA_TOPK_MAX + 1, &p), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_cuda_topk_plan(rows, -1, 5, &p), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_cuda_topk_plan(NULL, 2, 5, &p), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_cuda_topk_plan(rows, 2, 5, NULL), FP4IDX_EINVAL);
  rows[1].width = -1;
  cr_assert_eq(fp4idx_cuda_topk_plan(rows, 2, 5, &p), FP4IDX_EINVAL);
  rows[1].width = (int64_t)INT32_MAX + 1;
  cr_assert_eq(fp4idx_cuda_topk_plan(rows, 2, 5, &p), FP4IDX_EINVAL);
  rows[1].width = 20;
  cr_assert_eq(fp4idx_cuda_topk_plan_path(rows, 2, 5, (fp4idx_cuda_topk_path_t)4, &p), FP4IDX_EINVAL);
  /* The row sort never takes k above the cluster cap, a row wider than its
   * width, nor an empty batch. */
  cr_assert_eq(fp4idx_cuda_topk_plan_path(rows, 2, FP4IDX_CUDA_TOPK_CLUSTER_K + 1,
                                          FP4IDX_CUDA_TOPK_ROWSORT, &p), FP4IDX_ENODEV);
  cr_assert_eq(fp4idx_cuda_topk_plan_path(rows, 0, 5, FP4IDX_CUDA_TOPK_ROWSORT, &p), FP4IDX_ENODEV);
  rows[1].width = FP4IDX_CUDA_TOPK_ROWSORT_WIDTH + 1;
  cr_assert_eq(fp4idx_cuda_topk_plan_path(rows, 2, 5, FP4IDX_CUDA_TOPK_ROWSORT, &p), FP4IDX_ENODEV);
  rows[1].width = 20;
  /* The cluster path never takes k above its cap, nor an empty batch. */
  cr_assert_eq(fp4idx_cuda_topk_plan_path(rows, 2, FP4IDX_CUDA_TOPK_CLUSTER_K + 1,
                                          FP4IDX_CUDA_TOPK_CLUSTER, &p), FP4IDX_ENODEV);
  cr_assert_eq(fp4idx_cuda_topk_plan_path(rows, 0, 5, FP4IDX_CUDA_TOPK_CLUSTER, &p), FP4IDX_ENODEV);
  const int crc = fp4idx_cuda_topk_plan_path(rows, 2, 5, FP4IDX_CUDA_TOPK_CLUSTER, &p);
  cr_assert(crc == FP4IDX_ENODEV ||
                (crc == FP4IDX_OK && p.cluster >= 1 && p.slice >= 4 && p.slice % 4 == 0 &&
                 p.slice * p.cluster >= 20),
            "cluster plan: %d", crc);
  cr_assert_eq(fp4idx_cuda_topk_plan_path(rows, 2, 5, FP4IDX_CUDA_TOPK_CHUNKED, &p), FP4IDX_OK);
  cr_assert_eq(p.cluster, 0);
  cr_assert_eq(rows[0].chunk0, 0);
  cr_assert_eq(rows[1].chunk0, 1, "one chunk per short row");
  cr_assert_eq(p.total_chunks, 2);
  cr_assert(p.ws_bytes > 0);
  int32_t dummy;
  float fd;
  cr_assert_eq(fp4idx_cuda_topk_launch(NULL, rows, &dummy, &dummy, &fd, &dummy, 0), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_cuda_topk_launch(&p, rows, NULL, &dummy, &fd, &dummy, 0), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_cuda_topk_launch(&p, rows, &dummy, NULL, &fd, &dummy, 0), FP4IDX_EINVAL);
  fp4idx_cuda_topk_plan_t bad = p;
  bad.k = 0;
  cr_assert_eq(fp4idx_cuda_topk_launch(&bad, rows, &dummy, &dummy, &fd, &dummy, 0), FP4IDX_EINVAL);
}

/* ---- through the backend's score op ------------------------------------- */

static fp4idx_backend_t *mk(int cuda, int64_t n_pages, int32_t P) {
  fp4idx_backend_t *b = NULL;
  cr_assert_eq(cuda ? fp4idx_backend_cuda_create(&b, 0) : fp4idx_backend_cpu_create(&b, 0), FP4IDX_OK);
  cr_assert_eq(b->ops->pool_create(b, n_pages, P), FP4IDX_OK);
  return b;
}

/* Two sequences over the same keys (the second a prefix of width w2 with
 * its own rows), scored with topk on the CUDA and the CPU backend. */
static void score_case(uint64_t seed, int64_t n, int rows, const int32_t *lens, int64_t w2,
                       const int32_t *lens2, int with_mask, int32_t k) {
  const int H = 32, P = 64;
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  fp4idx_test_case_t a, b2;
  const int64_t np = (n + P - 1) / P + 3;
  cr_assert_eq(fp4idx_test_case_dyadic(&a, &rng, H, rows, n, P, np, lens, with_mask), 0);
  cr_assert_eq(fp4idx_test_case_dyadic(&b2, &rng, H, rows, w2, P, np, lens2, 0), 0);
  fp4idx_backend_t *g = mk(1, np, P), *c = mk(0, np, P);
  cr_assert_eq(g->ops->store(g, a.keys, FP4IDX_DTYPE_BF16, n, a.slots, FP4IDX_ROUND_RNE), 0);
  cr_assert_eq(c->ops->store(c, a.keys, FP4IDX_DTYPE_BF16, n, a.slots, FP4IDX_ROUND_RNE), 0);
  fp4idx_backend_seq_t sq[2] = {
      {.pages = a.pages, .n_keys = n, .rows = rows, .width = a.width, .q = a.q, .w = a.w,
       .lens = a.lens, .mask = a.mask},
      {.pages = a.pages, .n_keys = n, .rows = rows, .width = b2.width, .q = b2.q, .w = b2.w,
       .lens = b2.lens, .mask = NULL}};
  const size_t nk = (size_t)2 * rows * (size_t)k;
  int32_t *pg = malloc(4 * nk), *pc = malloc(4 * nk), cg[16], cc[16];
  float *vg = malloc(4 * nk), *vc = malloc(4 * nk);
  cr_assert(pg && pc && vg && vc && rows <= 8);
  fp4idx_backend_batch_t bt = {.heads = H, .n_seqs = 2, .seqs = sq, .topk = k,
                               .topk_pos = pg, .topk_val = vg, .topk_count = cg};
  cr_assert_eq(g->ops->score(g, &bt), 0);
  bt.topk_pos = pc; bt.topk_val = vc; bt.topk_count = cc;
  cr_assert_eq(c->ops->score(c, &bt), 0);
  cr_assert_eq(memcmp(cg, cc, sizeof(int32_t) * 2 * rows), 0, "seed %llu k=%d: counts differ",
               (unsigned long long)seed, k);
  for (size_t i = 0; i < nk; i++)
    if (pg[i] != pc[i])
      cr_assert_fail("seed %llu n=%lld k=%d: pair %zu (row %zu): GPU position %d, CPU %d",
                     (unsigned long long)seed, (long long)n, k, i % (size_t)k, i / (size_t)k,
                     pg[i], pc[i]);
  cr_assert_eq(fp4idx_test_count_diff(vg, vc, (int64_t)nk), 0, "seed %llu: logits differ",
               (unsigned long long)seed);
  free(pg); free(pc); free(vg); free(vc);
  fp4idx_backend_destroy(g);
  fp4idx_backend_destroy(c);
  fp4idx_test_case_free(&a);
  fp4idx_test_case_free(&b2);
}

Test(cuda_topk_score, dyadic_vs_cpu_backend, .timeout = 600) {
  NEED_GPU();
  const int32_t l1[4] = {20011, 20010, 19000, 5}, l2[4] = {7001, 7000, 0, 6999};
  const int32_t ks[6] = {1, 16, 512, 2048, 7001, 9000};
  for (int i = 0; i < 6; i++) score_case(17100 + i, 20011, 4, l1, 7001, l2, i & 1, ks[i]);
}

Test(cuda_topk_score, lens_zero_and_below_k, .timeout = 600) {
  NEED_GPU();
  const int32_t z[3] = {0, 0, 0}, small[3] = {3, 0, 100};
  score_case(17200, 5000, 3, z, 300, z, 0, 64);        /* every length 0 */
  score_case(17201, 5000, 3, small, 4000, z, 1, 512);  /* lens < k */
  score_case(17202, 5000, 3, small, 4000, z, 0, 10000);
}

Test(cuda_topk_score, k_65536_long_context, .timeout = 900) {
  NEED_GPU();
  const int32_t l1[2] = {200000, 150000}, l2[2] = {65536, 60000};
  score_case(17300, 200000, 2, l1, 65536, l2, 0, 65536);
  score_case(17301, 200000, 2, l1, 65536, l2, 1, 2048);
}
