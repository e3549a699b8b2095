/* bench_cuda_stage.h -- a score batch staged on the device for benchmarks
 * that replay the scorer alone (fp4idx-bench's device timer, the top-k
 * benchmark of fp4idx-bench-cuda). The product backend keeps no staging
 * mode: this copies the backend's pool through its public read_pages op
 * and lays out the batch's inputs itself, with the planner of
 * fp4idx_cuda.h, so the launch is the one the backend would make. */
#ifndef FP4IDX_BENCH_CUDA_STAGE_H
#define FP4IDX_BENCH_CUDA_STAGE_H

#include <cuda_runtime_api.h>

#include "fp4idx_backend.h"
#include "fp4idx_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A staged batch: prm is ready for fp4idx_cuda_score_launch on `stream`
 * (device pointers throughout; logits stay on the device, sequence s's
 * rows at prm.seqs[s].out). */
typedef struct fp4idx_bench_staged_s {
  fp4idx_cuda_score_params_t prm;
  cudaStream_t stream;
  void *dev;   /* one device allocation holding pool copy, inputs, outputs */
} fp4idx_bench_staged_t;

/* Stages `batch` (full logits or top-k: only the scorer is staged) of
 * backend `b` (any backend with a pool: its pages are read back with
 * read_pages) on the current CUDA device, in a stream of its own.
 * Returns FP4IDX_OK, FP4IDX_EINVAL (no pool, malformed batch),
 * FP4IDX_ENOMEM, or FP4IDX_EDEVICE. Free with fp4idx_bench_cuda_unstage. */
int fp4idx_bench_cuda_stage(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch,
                            fp4idx_bench_staged_t *s);

/* Frees what fp4idx_bench_cuda_stage allocated; s may be zeroed. */
void fp4idx_bench_cuda_unstage(fp4idx_bench_staged_t *s);

#ifdef __cplusplus
}
#endif
#endif
