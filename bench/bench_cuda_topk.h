/* bench_cuda_topk.h -- the top-k benchmark of fp4idx-bench-cuda
 * (bench_cuda_topk.cu) and the phase timeline it can print instead
 * (topk_phases.cu). Benchmark code only, not the product. */
#ifndef FP4IDX_BENCH_CUDA_TOPK_H
#define FP4IDX_BENCH_CUDA_TOPK_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "fp4idx_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The phase timeline of the cluster top-k (topk_phases.cu, an
 * instrumented copy of kernels/cuda/topk_cluster.cu): plans rows (host) for
 * k, launches 3 + 15 times on d_rows (device) into pos/val/count, prints
 * per phase the median / p90 / max cycles over blocks and launches. Returns
 * 0, an FP4IDX_ status of the plan or launch, or 1 on a CUDA error. */
int fp4idx_bench_topk_phases(const fp4idx_cuda_topk_row_t *rows, int32_t n_rows, int32_t k,
                             const fp4idx_cuda_topk_row_t *d_rows, int32_t *pos, float *val,
                             int32_t *count, cudaStream_t stream, const char *name);

/* `fp4idx-bench-cuda --topk [--check] [--csv FILE] [--only CASE]`: the top-k table
 * (argv[0] is "--topk"). Returns the process exit status. */
int fp4idx_bench_topk_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
