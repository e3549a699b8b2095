/* bench_cuda_check.h -- the CUDA benchmarks' check of a runtime call: a
 * failed call prints where and why, and the benchmark exits (a benchmark
 * has nothing to recover; the product checks and returns instead). */
#ifndef FP4IDX_BENCH_CUDA_CHECK_H
#define FP4IDX_BENCH_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define TCK(x)                                                                           \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#endif /* FP4IDX_BENCH_CUDA_CHECK_H */
