/* bench_backend_call.c -- fp4idx-bench-backend-call: one CUDA backend score
 * call as the daemon's worker makes it (score_submit + score_wait, outputs
 * from host_alloc), in this process, no socket: the host time of a call
 * (wall, submit to wait returned) and its device time by the backend's own
 * events, with and without the timing events (what the events cost).
 *
 * Cases (R=4 rows x H=32 heads): 64 keys full logits, 64 keys top-16,
 * 16,384 keys top-2048, 400,000 keys top-2048. Each variant: -w warm-up
 * calls, then -n calls; p50 and p90 of the wall time, means of the event
 * times; the variants of a case interleave run by run (-r runs, median of
 * the run p50s shown).
 *
 *   fp4idx-bench-backend-call [-n CALLS] [-w WARMUP] [-r RUNS]
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_time.h"
#include "fp4idx_backend.h"

#define ROWS 4
#define HEADS 32
#define P 64
#define MAX_KEYS 400000
#define MAX_RUNS 9

typedef struct case_s {
  const char *name;
  int64_t keys;
  int topk;
} case_t;

static const case_t kCases[] = {
    {"64 keys, full logits", 64, 0},
    {"64 keys, top-16", 64, 16},
    {"16,384 keys, top-2048", 16384, 2048},
    {"400,000 keys, top-2048", 400000, 2048},
};

typedef struct variant_s {
  const char *name;
  int timed;
} variant_t;

static const variant_t kVariants[] = {
    {"timed", 1},
    {"untimed", 0},
};
#define N_VAR ((int)(sizeof kVariants / sizeof kVariants[0]))

static uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* One run of n calls (after w warm-up ones): p50 / p90 wall and the mean
 * event times into out[0..4]. Returns 0, or the first failing status. */
static int one_run(fp4idx_backend_t *b, fp4idx_backend_batch_t *bt, int n, int w, double *out) {
  double *t = malloc(sizeof *t * (size_t)n);
  double up = 0, k = 0, down = 0;
  fp4idx_backend_timing_t tm;
  for (int i = 0; i < w + n; i++) {
    const double t0 = now_us();
    int ticket = -1;
    int rc = b->ops->score_submit(b, bt, &ticket);
    if (!rc && ticket >= 0) rc = b->ops->score_wait(b, ticket);
    const double t1 = now_us();
    if (rc) {
      free(t);
      return rc;
    }
    if (i < w) continue;
    t[i - w] = t1 - t0;
    if (bt->timing) {
      tm = *bt->timing;
      up += tm.upload_us;
      k += tm.kernels_us;
      down += tm.download_us;
    }
  }
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  out[0] = pct(t, (size_t)n, 50);
  out[1] = pct(t, (size_t)n, 90);
  out[2] = up / n;
  out[3] = k / n;
  out[4] = down / n;
  free(t);
  return 0;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

int main(int argc, char **argv) {
  int n = 2000, w = 200, runs = 3, c;
  while ((c = getopt(argc, argv, "n:w:r:h")) != -1) {
    if (c == 'n') n = atoi(optarg);
    else if (c == 'w') w = atoi(optarg);
    else if (c == 'r') runs = atoi(optarg);
    else {
      fprintf(stderr, "usage: fp4idx-bench-backend-call [-n CALLS] [-w WARMUP] [-r RUNS]\n");
      return c == 'h' ? 0 : 2;
    }
  }
  if (n < 1 || w < 0 || runs < 1 || runs > MAX_RUNS) return 2;
  fp4idx_backend_t *b = NULL;
  int rc = fp4idx_backend_cuda_create(&b, 0);
  if (rc) {
    fprintf(stderr, "no CUDA backend: %s\n", fp4idx_status_name(rc));
    return 77;
  }
  const int64_t np = (MAX_KEYS + P - 1) / P;
  if ((rc = b->ops->pool_create(b, np, P))) goto fail;
  /* keys: small dyadic values in pool order */
  {
    const int64_t chunk = 65536;
    uint16_t *keys = malloc((size_t)chunk * 128 * 2);
    int64_t *slots = malloc(sizeof *slots * (size_t)chunk);
    for (int64_t at = 0; at < MAX_KEYS && !rc; at += chunk) {
      const int64_t m = MAX_KEYS - at < chunk ? MAX_KEYS - at : chunk;
      for (int64_t i = 0; i < m; i++) {
        slots[i] = at + i;
        for (int d = 0; d < 128; d++)
          keys[i * 128 + d] = bf16((float)((int)((at + i) * 7 + d * 3) % 13 - 6) / 4.0f);
      }
      rc = b->ops->store(b, keys, FP4IDX_DTYPE_BF16, m, slots, FP4IDX_ROUND_RNE);
    }
    free(keys);
    free(slots);
    if (rc) goto fail;
  }
  int32_t *pages = malloc(sizeof *pages * (size_t)np);
  for (int64_t i = 0; i < np; i++) pages[i] = (int32_t)i;
  uint16_t q[ROWS * HEADS * 128], wt[ROWS * HEADS];
  for (int i = 0; i < ROWS * HEADS * 128; i++) q[i] = bf16((float)(i % 9 - 4) / 8.0f);
  for (int i = 0; i < ROWS * HEADS; i++) wt[i] = bf16((float)(i % 5 + 1) / 8.0f);
  printf("fp4idx-bench-backend-call: R=%d H=%d, %d calls after %d warm-up, median of %d runs\n",
         ROWS, HEADS, n, w, runs);
  printf("%-24s %-16s %9s %9s | %9s %9s %9s\n", "case", "timing", "p50 us", "p90 us",
         "upload", "kernels", "download");
  for (size_t ci = 0; ci < sizeof kCases / sizeof kCases[0]; ci++) {
    const case_t *k = &kCases[ci];
    int32_t lens[ROWS];
    for (int r = 0; r < ROWS; r++) lens[r] = (int32_t)(k->keys - (ROWS - 1 - r));
    fp4idx_backend_seq_t sq = {.pages = pages, .n_keys = k->keys, .rows = ROWS,
                               .width = k->keys, .q = q, .w = wt, .lens = lens};
    const size_t bytes = k->topk ? (size_t)ROWS * k->topk * 8 + ROWS * 4
                                 : (size_t)ROWS * (size_t)k->keys * 4;
    void *out = NULL;
    if ((rc = b->ops->host_alloc(b, bytes, &out))) goto fail;
    fp4idx_backend_timing_t tm;
    fp4idx_backend_batch_t bt = {.heads = HEADS, .n_seqs = 1, .seqs = &sq, .topk = k->topk};
    if (k->topk) {
      bt.topk_pos = out;
      bt.topk_val = (float *)((uint8_t *)out + (size_t)ROWS * k->topk * 4);
      bt.topk_count = (int32_t *)((uint8_t *)out + (size_t)ROWS * k->topk * 8);
      bt.topk_one_buffer = 1;
    } else {
      bt.logits = out;
    }
    double res[N_VAR][5][MAX_RUNS];
    for (int r = 0; r < runs; r++)
      for (int v = 0; v < N_VAR; v++) {
        double o[5];
        bt.timing = kVariants[v].timed ? &tm : NULL;
        if ((rc = one_run(b, &bt, n, w, o))) goto fail;
        for (int j = 0; j < 5; j++) res[v][j][r] = o[j];
      }
    for (int v = 0; v < N_VAR; v++) {
      double m[5];
      for (int j = 0; j < 5; j++) m[j] = median(res[v][j], runs);
      if (kVariants[v].timed)
        printf("%-24s %-16s %9.1f %9.1f | %9.1f %9.1f %9.1f\n", k->name, kVariants[v].name, m[0],
               m[1], m[2], m[3], m[4]);
      else
        printf("%-24s %-16s %9.1f %9.1f | %9s %9s %9s\n", k->name, kVariants[v].name, m[0], m[1],
               "-", "-", "-");
    }
    b->ops->host_free(b, out);
  }
  printf("(wall: submit to wait returned; upload / kernels / download: the backend's events)\n");
  free(pages);
  fp4idx_backend_destroy(b);
  return 0;
fail:
  fprintf(stderr, "fp4idx-bench-backend-call: %s\n", fp4idx_status_name(rc));
  fp4idx_backend_destroy(b);
  return 1;
}
