/* bench_time.h -- the clock and the percentiles of the socket benchmarks
 * (bench_socket.c, bench_calls.c), header-only. */
#ifndef FP4IDX_BENCH_TIME_H
#define FP4IDX_BENCH_TIME_H

#include <math.h>
#include <stddef.h>
#include <time.h>

/* Monotonic time in microseconds. */
static inline double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* qsort comparator for doubles, ascending. */
static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* p-th percentile (nearest rank) of sorted v[n], n >= 1. */
static inline double pct(const double *v, size_t n, double p) {
  size_t k = (size_t)ceil(p / 100.0 * (double)n);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return v[k - 1];
}

#endif /* FP4IDX_BENCH_TIME_H */
