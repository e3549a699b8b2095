/* bench_cuda.cu -- device-side timer of fp4idx-bench for the CUDA backend
 * (the seam in fp4idx_bench.h): the batch's inputs are staged once, then
 * `calls` scorer launches are captured in one CUDA graph; after `warmup`
 * replays, each of `reps` replays is timed with CUDA events and reported as
 * time per call. The full method of docs/RESULTS.md (median of 3 runs of 10
 * replays, hot and cold caches) is bench_cuda_scorer.cu (fp4idx-bench-cuda). */
#include <cuda_runtime_api.h>

#include "bench_cuda_stage.h"
#include "fp4idx_bench.h"
#include "fp4idx_cuda.h"

extern "C" int fp4idx_bench_cuda_time(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch,
                                      int calls, int warmup, int reps, double *us) {
  if (!b || !batch || calls < 1 || warmup < 0 || reps < 1 || !us) return FP4IDX_EINVAL;
  if (batch->topk) return FP4IDX_ENODEV;  // top-k: the driver's host timer
  fp4idx_bench_staged_t staged;
  int rc = fp4idx_bench_cuda_stage(b, batch, &staged);
  if (rc) return rc;
  const fp4idx_cuda_score_params_t prm = staged.prm;
  cudaStream_t st = staged.stream;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if ((rc = fp4idx__cuda_check(cudaEventCreate(&e0), "bench: event"))) goto out;
  if ((rc = fp4idx__cuda_check(cudaEventCreate(&e1), "bench: event"))) goto out;
  if ((rc = fp4idx__cuda_check(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed),
                               "bench: capture")))
    goto out;
  for (int i = 0; i < calls && !rc; i++) rc = fp4idx_cuda_score_launch(&prm, st);
  {
    int rc2 = fp4idx__cuda_check(cudaStreamEndCapture(st, &g), "bench: end capture");
    if (rc || (rc = rc2)) goto out;
  }
  if ((rc = fp4idx__cuda_check(cudaGraphInstantiate(&ge, g, 0), "bench: instantiate"))) goto out;
  for (int i = 0; i < warmup; i++)
    if ((rc = fp4idx__cuda_check(cudaGraphLaunch(ge, st), "bench: warm-up"))) goto out;
  for (int r = 0; r < reps; r++) {
    float ms = 0;
    if ((rc = fp4idx__cuda_check(cudaEventRecord(e0, st), "bench: record"))) goto out;
    if ((rc = fp4idx__cuda_check(cudaGraphLaunch(ge, st), "bench: replay"))) goto out;
    if ((rc = fp4idx__cuda_check(cudaEventRecord(e1, st), "bench: record"))) goto out;
    if ((rc = fp4idx__cuda_check(cudaEventSynchronize(e1), "bench: sync"))) goto out;
    if ((rc = fp4idx__cuda_check(cudaEventElapsedTime(&ms, e0, e1), "bench: elapsed"))) goto out;
    us[r] = 1e3 * ms / calls;
  }
out:
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  fp4idx_bench_cuda_unstage(&staged);
  return rc;
}
