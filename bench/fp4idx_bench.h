/* fp4idx_bench.h -- the seam between the benchmark driver (fp4idx_bench.c)
 * and backend-specific timers (bench_cuda.cu, owned by the CUDA backend).
 *
 * The driver builds each case (dyadic keys on shuffled 64-key pages, R verify
 * rows seeing the context minus 0..R-1 keys), stores the keys through the
 * backend, and times backend->ops->score. By default it times on the host
 * (clock_gettime around `calls` back-to-back synchronous calls). A backend
 * may provide a device-side timer instead (e.g. a CUDA graph of `calls`
 * calls replayed `reps` times, docs/RESULTS.md's method). */
#ifndef FP4IDX_BENCH_H
#define FP4IDX_BENCH_H

#include "fp4idx_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One benchmark case (the table in fp4idx_bench.c). */
typedef struct fp4idx_bench_case_s {
  const char *name;  /* e.g. "h32_ctx100000" */
  int seqs;          /* sequences in the batch */
  int rows;          /* R verify rows per sequence */
  int heads;         /* H */
  int64_t context;   /* keys per sequence; row r sees context - r */
  int cpu_default;   /* run by default on the CPU backend (the rest: --all) */
} fp4idx_bench_case_t;

#ifdef FP4IDX_BENCH_CUDA
/* Device-side timer (bench_cuda.cu). Times `calls` score calls of `batch`
 * on backend `b` per replay, `reps` replays after `warmup` untimed ones, and
 * writes the time PER CALL in microseconds of each replay to us[reps].
 * Returns FP4IDX_OK, or a negative status (the driver then reports the
 * error; FP4IDX_ENODEV makes it fall back to host timing). */
int fp4idx_bench_cuda_time(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch,
                           int calls, int warmup, int reps, double *us);
#endif

#ifdef __cplusplus
}
#endif
#endif
