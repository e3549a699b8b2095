/* bench_store.c -- fp4idx-bench-store: the CPU backend's store op
 * (quantize + write into the page pool) timed in-process, no socket.
 *
 *   fp4idx-bench-store [-n KEYS] [-b BATCH] [-t THREADS] [-r REPS] [--check]
 *
 * Gaussian keys (sigma 1, a few blocks scaled by 2^-20..2^20 so that the
 * scales vary), stored in BATCH-key calls (default: all KEYS in one call;
 * the daemon's socket bench appends 8192-key requests) onto shuffled 64-key
 * pages. For bf16 and f32 keys and both roundings prints the median over
 * REPS runs (default 3) of the time for all KEYS, keys/s, and the median
 * process CPU time per key (all threads; robust to other load on the box). --check reads
 * every slot back and compares it with fp4idx_quantize_key byte for byte.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp4idx_backend.h"
#include "fp4idx_format.h"

enum { PAGE = 64 };

static uint64_t fp4idx__rng = 0x5eed5eed12345678ull;
static uint64_t fp4idx__next(void) {
  uint64_t z = (fp4idx__rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double fp4idx__normal(void) {
  double u1 = ((fp4idx__next() >> 11) + 1) * 0x1p-53, u2 = (fp4idx__next() >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static double fp4idx__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static double fp4idx__cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int fp4idx__cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void fp4idx__usage(void) {
  fprintf(stderr, "usage: fp4idx-bench-store [-n KEYS] [-b BATCH] [-t THREADS] "
                  "[-r REPS] [--check]\n");
}

int main(int argc, char **argv) {
  int64_t n = 1 << 20, batch = 0;
  int threads = 0, reps = 3, check = 0, rc = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--check")) { check = 1; continue; }
    if (i + 1 >= argc) { fp4idx__usage(); return 2; }
    if (!strcmp(a, "-n")) n = atoll(argv[++i]);
    else if (!strcmp(a, "-b")) batch = atoll(argv[++i]);
    else if (!strcmp(a, "-t")) threads = atoi(argv[++i]);
    else if (!strcmp(a, "-r")) reps = atoi(argv[++i]);
    else { fp4idx__usage(); return 2; }
  }
  if (n < 1 || reps < 1 || batch < 0 || threads < 0) { fp4idx__usage(); return 2; }
  if (batch == 0 || batch > n) batch = n;

  fp4idx_backend_t *b = NULL;
  float *kf = malloc((size_t)n * FP4IDX_HEAD_DIM * sizeof *kf);
  uint16_t *kb = malloc((size_t)n * FP4IDX_HEAD_DIM * sizeof *kb);
  int64_t n_pages = (n + PAGE - 1) / PAGE;
  int64_t *perm = malloc((size_t)n_pages * sizeof *perm);
  int64_t *slots = malloc((size_t)n * sizeof *slots);
  uint8_t *got = malloc((size_t)n * FP4IDX_SLOT_BYTES);
  double *t = malloc((size_t)reps * sizeof *t), *ct = malloc((size_t)reps * sizeof *ct);
  if (!kf || !kb || !perm || !slots || !got || !t || !ct) goto out;
  for (int64_t k = 0; k < n; k++)
    for (int blk = 0; blk < 4; blk++) {
      /* one block in 16 gets a scale far from 1 */
      double m = (fp4idx__next() & 15) ? 1.0 : ldexp(1.0, (int)(fp4idx__next() % 41) - 20);
      for (int e = 0; e < 32; e++) {
        size_t i = (size_t)k * FP4IDX_HEAD_DIM + blk * 32 + e;
        kb[i] = fp4idx_f32_to_bf16((float)(fp4idx__normal() * m));
        kf[i] = (float)(fp4idx__normal() * m);
      }
    }
  for (int64_t p = 0; p < n_pages; p++) perm[p] = p;
  for (int64_t p = n_pages - 1; p > 0; p--) {
    int64_t j = (int64_t)(fp4idx__next() % (uint64_t)(p + 1)), x = perm[p];
    perm[p] = perm[j];
    perm[j] = x;
  }
  for (int64_t k = 0; k < n; k++) slots[k] = perm[k / PAGE] * PAGE + k % PAGE;

  if (fp4idx_backend_cpu_create(&b, threads) != FP4IDX_OK ||
      b->ops->pool_create(b, n_pages, PAGE) != FP4IDX_OK) {
    fprintf(stderr, "fp4idx-bench-store: backend setup failed\n");
    goto out;
  }
  fp4idx_backend_info_t info;
  b->ops->describe(b, &info);
  printf("# fp4idx-bench-store: %lld keys in %lld-key calls, %d reps, device: %s\n",
         (long long)n, (long long)batch, reps, info.device);
  printf("%-6s %-10s %12s %14s %10s %14s\n", "dtype", "rounding", "median_ms", "keys/s",
         "ns/key", "cpu_ns/key");
  for (int dt = 0; dt < 2; dt++)
    for (int md = 0; md < 2; md++) {
      fp4idx_dtype_t dtype = dt ? FP4IDX_DTYPE_F32 : FP4IDX_DTYPE_BF16;
      fp4idx_rounding_t mode = md ? FP4IDX_ROUND_THRESHOLD : FP4IDX_ROUND_RNE;
      const uint8_t *keys = dt ? (const uint8_t *)kf : (const uint8_t *)kb;
      size_t kbytes = (dt ? 4u : 2u) * FP4IDX_HEAD_DIM;
      for (int r = 0; r < reps; r++) {
        double t0 = fp4idx__now(), c0 = fp4idx__cpu_now();
        for (int64_t s = 0; s < n; s += batch) {
          int64_t m = n - s < batch ? n - s : batch;
          int e = b->ops->store(b, keys + (size_t)s * kbytes, dtype, m, slots + s, mode);
          if (e != FP4IDX_OK) {
            fprintf(stderr, "store: %s\n", fp4idx_strerror(e));
            goto out;
          }
        }
        t[r] = fp4idx__now() - t0;
        ct[r] = fp4idx__cpu_now() - c0;
      }
      qsort(t, (size_t)reps, sizeof *t, fp4idx__cmpd);
      qsort(ct, (size_t)reps, sizeof *ct, fp4idx__cmpd);
      double med = t[reps / 2];
      printf("%-6s %-10s %12.2f %14.4g %10.1f %14.1f\n", dt ? "f32" : "bf16",
             md ? "threshold" : "rne", med * 1e3, n / med, med * 1e9 / n,
             ct[reps / 2] * 1e9 / n);
      fflush(stdout);
      if (check) {
        if (b->ops->read(b, slots, n, 0, got) != FP4IDX_OK) goto out;
        for (int64_t k = 0; k < n; k++) {
          uint8_t want[FP4IDX_SLOT_BYTES];
          fp4idx_quantize_key(keys + (size_t)k * kbytes, dtype, mode, want,
                              want + FP4IDX_PAYLOAD_BYTES);
          if (memcmp(want, got + k * FP4IDX_SLOT_BYTES, FP4IDX_SLOT_BYTES)) {
            fprintf(stderr, "check: key %lld differs from fp4idx_quantize_key\n",
                    (long long)k);
            goto out;
          }
        }
        printf("#   check: %lld keys equal fp4idx_quantize_key\n", (long long)n);
      }
    }
  rc = 0;
out:
  if (b) b->ops->destroy(b);
  free(kf);
  free(kb);
  free(perm);
  free(slots);
  free(got);
  free(t);
  free(ct);
  return rc;
}
