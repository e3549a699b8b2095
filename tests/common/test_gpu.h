/* test_gpu.h -- for the CUDA tests (test_cuda*.c): whether a CUDA device
 * answers, and NEED_GPU(), which skips the calling Criterion test cleanly
 * when none does (CI machines have no GPU). Include after criterion.h. */
#ifndef FP4IDX_TEST_GPU_H
#define FP4IDX_TEST_GPU_H

#include <cuda_runtime_api.h>

/* 1 when at least one CUDA device answers; clears the sticky "no device"
 * error otherwise and returns 0. */
static inline int fp4idx_test_have_gpu(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n > 0;
}

#define NEED_GPU()                                                \
  do {                                                            \
    if (!fp4idx_test_have_gpu()) cr_skip_test("no CUDA device"); \
  } while (0)

#endif
