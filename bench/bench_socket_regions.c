/* bench_socket_regions.c -- fp4idx-bench-socket (e): the region cases of
 * PROTOCOL.md "Regions" beside the socket path, interleaved call by call in
 * one run so they see the same load: R=4 x H=32 rows at context o->ctx,
 *   full logits through the socket | into a host region | into a CUDA region
 *     | q, w and the outputs in a CUDA region (fp4idx_client_score_regions),
 *   top-2048 the same four ways,
 * p50 of o->iters calls after 2 warm-ups, median over o->reps runs; and the
 * append rate of bf16 keys from a host region (1M-key requests) next to the
 * socket's 8192-key requests. CUDA cases need a build with the CUDA backend
 * and a daemon running it (--region-cuda). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FP4IDX_BENCH_REGION_CUDA
/* first: fp4idx_client.h then declares fp4idx_client_region_register_device */
#include <cuda_runtime_api.h>
#endif

#include "bench_socket_regions.h"
#include "bench_time.h"

#define R_ROWS 4
#define R_HEADS 32
#define R_TOPK 2048
#define R_SOCKET_CHUNK 8192
#define R_REGION_CHUNK (1L << 20)
#define R_KINDS 4 /* socket, host region, CUDA region, CUDA region in and out */
#define R_CASES (2 * R_KINDS)

/* Sorts v[n] and returns its median (upper middle). */
static double r_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static uint16_t r_bf16(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  float f = (float)((double)(*s >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

#define RCHECK(call)                                                                     \
  do {                                                                                   \
    fp4idx_status_t st_ = (call);                                                        \
    if (st_ != FP4IDX_OK) {                                                              \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,                 \
              fp4idx_strerror(st_), fp4idx_client_last_error(c));                        \
      goto fail;                                                                         \
    }                                                                                    \
  } while (0)

static const char *const r_name[R_CASES] = {
    "region_logits_socket",   "region_logits_host",   "region_logits_cuda",
    "region_logits_cuda_in",  "region_topk2048_socket", "region_topk2048_host",
    "region_topk2048_cuda",   "region_topk2048_cuda_in"};

int fp4idx_bench_regions(fp4idx_client_t *c, const fp4idx_bench_regions_opts_t *o) {
  const uint64_t seq = 11;
  const size_t W = (size_t)o->ctx, lbytes = (size_t)R_ROWS * W * 4;
  const size_t tk = (size_t)R_ROWS * R_TOPK * 4;
  const size_t hsize = lbytes + 3 * tk;
  const size_t qbytes = (size_t)R_ROWS * R_HEADS * 256; /* then w in the CUDA region */
  uint64_t rng = 0x51ED270B5A3C9E1Bull;
  uint16_t q[R_ROWS * R_HEADS * 128], w[R_ROWS * R_HEADS];
  int32_t *pos = malloc(tk), cnt[R_ROWS];
  float *val = malloc(tk), *logits = malloc(lbytes);
  double *s = malloc((size_t)R_CASES * (size_t)o->iters * sizeof *s);
  double per[R_CASES][16], res[R_CASES];
  uint64_t hreg = 0, dreg = 0, kreg = 0;
  void *hmem = NULL, *kmem = NULL;
#ifdef FP4IDX_BENCH_REGION_CUDA
  void *dmem = NULL;
#endif
  size_t ksize = 0;
  int rc = -1, ncuda = o->cuda;
  if (!pos || !val || !logits || !s || o->reps > 16) goto fail;
  for (size_t i = 0; i < sizeof q / 2; i++) q[i] = r_bf16(&rng);
  for (size_t i = 0; i < sizeof w / 2; i++) w[i] = r_bf16(&rng);

  /* the keys, through a host region (also the append case's warm-up) */
  ksize = (size_t)(o->ctx < R_REGION_CHUNK ? o->ctx : R_REGION_CHUNK) * 256;
  RCHECK(fp4idx_client_region_create(c, ksize, &kreg, &kmem));
  fp4idx_client_drop(c, seq);
  for (long done = 0; done < o->ctx;) {
    long m = o->ctx - done < (long)(ksize / 256) ? o->ctx - done : (long)(ksize / 256);
    uint16_t *k = kmem;
    for (size_t i = 0; i < (size_t)m * 128; i++) k[i] = r_bf16(&rng);
    RCHECK(fp4idx_client_append_region(c, seq, FP4IDX_KEYS_BF16, kreg, 0, (size_t)m,
                                       FP4IDX_ROUNDING_RNE, NULL, NULL));
    done += m;
  }
  RCHECK(fp4idx_client_region_create(c, hsize, &hreg, &hmem));
#ifdef FP4IDX_BENCH_REGION_CUDA
  if (ncuda) {
    /* the outputs, then q and w (the "in" cases read them there) */
    const size_t dbytes = hsize + qbytes + sizeof w;
    if (cudaMalloc(&dmem, dbytes) != cudaSuccess ||
        cudaMemcpy((uint8_t *)dmem + hsize, q, qbytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy((uint8_t *)dmem + hsize + qbytes, w, sizeof w, cudaMemcpyHostToDevice) !=
            cudaSuccess) {
      fprintf(stderr, "cudaMalloc or cudaMemcpy of %zu bytes failed\n", dbytes);
      goto fail;
    }
    RCHECK(fp4idx_client_region_register_device(c, dmem, dbytes, &dreg));
  }
#else
  if (ncuda) {
    fprintf(stderr, "--cuda: this fp4idx-bench-socket was built without CUDA\n");
    goto fail;
  }
#endif

  /* the "in" cases: q and w after the outputs in the CUDA region; full
   * logits at 0, top-k positions, logits, counts as the region case's */
  fp4idx_client_region_score_t in[2] = {
      {.seq = seq, .heads = R_HEADS, .rows = R_ROWS, .width = (uint32_t)W,
       .q = {dreg, hsize}, .w = {dreg, hsize + qbytes}, .logits = {dreg, 0}},
      {.seq = seq, .heads = R_HEADS, .rows = R_ROWS, .topk = R_TOPK,
       .q = {dreg, hsize}, .w = {dreg, hsize + qbytes}, .logits = {dreg, lbytes + tk},
       .positions = {dreg, lbytes}, .counts = {dreg, lbytes + 2 * tk}}};
  for (int rep = 0; rep < o->reps; rep++) {
    for (int i = -2; i < o->iters; i++) {
      for (int k = 0; k < R_CASES; k++) {
        int topk = k >= R_KINDS, kind = k % R_KINDS;
        if (kind >= 2 && !ncuda) continue;
        uint64_t reg = kind == 1 ? hreg : dreg;
        uint32_t width;
        double t0 = now_us();
        if (kind == 3)
          RCHECK(fp4idx_client_score_regions(c, &in[topk]));
        else if (!topk && kind == 0)
          RCHECK(fp4idx_client_score_into(c, seq, R_HEADS, R_ROWS, q, w, NULL, logits,
                                          (size_t)R_ROWS * W, &width));
        else if (!topk)
          RCHECK(fp4idx_client_score_region(c, seq, R_HEADS, R_ROWS, q, w, NULL,
                                            (uint32_t)W, reg, 0));
        else if (kind == 0)
          RCHECK(fp4idx_client_topk(c, seq, R_HEADS, R_ROWS, q, w, NULL, R_TOPK, pos, val,
                                    cnt));
        else
          RCHECK(fp4idx_client_topk_region(c, seq, R_HEADS, R_ROWS, q, w, NULL, R_TOPK, reg,
                                           lbytes, lbytes + tk, lbytes + 2 * tk));
        if (i >= 0) s[(size_t)k * (size_t)o->iters + (size_t)i] = now_us() - t0;
      }
    }
    for (int k = 0; k < R_CASES; k++) {
      double *v = s + (size_t)k * (size_t)o->iters;
      if (k % R_KINDS >= 2 && !ncuda) continue;
      if (o->csv)
        for (int i = 0; i < o->iters; i++)
          fprintf(o->csv, "%s,%d,%d,%.3f\n", r_name[k], rep, i, v[i]);
      per[k][rep] = r_median(v, o->iters);
    }
  }
  for (int k = 0; k < R_CASES; k++)
    res[k] = k % R_KINDS >= 2 && !ncuda ? NAN : r_median(per[k], o->reps);

  /* append rate: bf16 keys from the host region, 1M-key requests */
  double app[16];
  for (int rep = 0; rep < o->reps; rep++) {
    const uint64_t aseq = 12;
    fp4idx_client_drop(c, aseq);
    double t0 = now_us();
    for (long done = 0; done < o->append_keys;) {
      long m = o->append_keys - done < (long)(ksize / 256) ? o->append_keys - done
                                                           : (long)(ksize / 256);
      RCHECK(fp4idx_client_append_region(c, aseq, FP4IDX_KEYS_BF16, kreg, 0, (size_t)m,
                                         FP4IDX_ROUNDING_RNE, NULL, NULL));
      done += m;
    }
    app[rep] = (double)o->append_keys / ((now_us() - t0) * 1e-6);
    RCHECK(fp4idx_client_drop(c, aseq));
  }
  double app_rate = r_median(app, o->reps);

  printf("\n(e) regions: score R=%d H=%d, context %ld      socket us   host region us"
         "   cuda region us   q, w, out in cuda region us\n",
         R_ROWS, R_HEADS, o->ctx);
  printf("    %-40s %9.0f %16.0f %16.0f %29.0f\n", "full logits", res[0], res[1], res[2], res[3]);
  printf("    %-40s %9.0f %16.0f %16.0f %29.0f\n", "top-2048", res[4], res[5], res[6], res[7]);
  printf("    append bf16 from a host region (%ld-key requests): %.3g keys/s\n",
         (long)(ksize / 256), app_rate);
  printf("    (p50 of %d calls, median of %d runs, the four paths interleaved; nan: no\n"
         "     CUDA region case, run with --region-cuda against a CUDA daemon)\n",
         o->iters, o->reps);
  rc = 0;
fail:
  if (hreg) fp4idx_client_region_destroy(c, hreg, hmem, hsize);
  if (kreg) fp4idx_client_region_destroy(c, kreg, kmem, ksize);
  if (dreg) fp4idx_client_region_unregister(c, dreg);
#ifdef FP4IDX_BENCH_REGION_CUDA
  if (dmem) cudaFree(dmem);
#endif
  fp4idx_client_drop(c, seq);
  free(pos);
  free(val);
  free(logits);
  free(s);
  return rc;
}
