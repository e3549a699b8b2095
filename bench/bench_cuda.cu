/* bench_cuda.cu -- device-side timer of fp4idx-bench for the CUDA backend
 * (the seam in fp4idx_bench.h): the batch's inputs are staged once, then
 * `calls` scorer launches are captured in one CUDA graph; after `warmup`
 * replays, each of `reps` replays is timed with CUDA events and reported as
 * time per call. The full method of docs/RESULTS.md (median of 3 runs of 10
 * replays, hot and cold caches) is bench_cuda_scorer.cu (fp4idx-bench-cuda).
 * After the replays the staged logits are compared, bit for bit, with the
 * backend's own score call of the batch. */
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "bench_cuda_stage.h"
#include "fp4idx_bench.h"
#include "fp4idx_cuda.h"

/* The staged launch's logits against the backend's own score call of the
 * same batch, bit for bit: the replays timed the launch the product makes.
 * FP4IDX_OK, FP4IDX_EDEVICE (with a line on stderr) when they differ. */
static int fp4idx__bench_check_staged(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch,
                                      const fp4idx_bench_staged_t *staged) {
  if (!batch->logits) return FP4IDX_OK;
  int rc = b->ops->score(b, batch);
  if (rc) return rc;
  const float *want = batch->logits;
  std::vector<fp4idx_cuda_seq_t> descs((size_t)batch->n_seqs);
  if ((rc = fp4idx__cuda_check(cudaMemcpy(descs.data(), staged->prm.seqs,
                                          sizeof(fp4idx_cuda_seq_t) * descs.size(),
                                          cudaMemcpyDeviceToHost),
                               "bench: descriptors")))
    return rc;
  for (int32_t s = 0; s < batch->n_seqs; s++) {
    const size_t n = (size_t)batch->seqs[s].rows * (size_t)batch->seqs[s].width;
    std::vector<float> got(n);
    if ((rc = fp4idx__cuda_check(cudaMemcpy(got.data(), descs[s].out, n * 4,
                                            cudaMemcpyDeviceToHost),
                                 "bench: staged logits")))
      return rc;
    if (memcmp(got.data(), want, n * 4)) {
      fprintf(stderr, "fp4idx-bench: sequence %d: the staged launch's logits differ from the "
                      "backend's score call\n", s);
      return FP4IDX_EDEVICE;
    }
    want += n;
  }
  return FP4IDX_OK;
}

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
  rc = fp4idx__bench_check_staged(b, batch, &staged);
out:
  if (ge) cudaGraphExecDestroy(ge);
  if (g) cudaGraphDestroy(g);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  fp4idx_bench_cuda_unstage(&staged);
  return rc;
}
