/* bench_cuda_graph.h -- the CUDA benchmarks' timing method (docs/RESULTS.md,
 * "Method"): `calls` launches captured in one CUDA graph; per run, one
 * warm-up replay, then `replays` replays timed with CUDA events; the time
 * per launch is elapsed / (calls x replays), and the result the median of
 * `runs` runs. launch() enqueues one launch on the stream it is given and
 * returns 0 (anything else: the benchmark says so and exits). */
#ifndef FP4IDX_BENCH_CUDA_GRAPH_H
#define FP4IDX_BENCH_CUDA_GRAPH_H

#include <algorithm>
#include <vector>

#include "bench_cuda_check.h"

/* `calls` launches captured on st and instantiated (a failed launch: the
 * benchmark says so and exits). */
template <typename F>
cudaGraphExec_t bench_capture_graph(cudaStream_t st, int calls, F launch) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  TCK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < calls; i++) {
    const int rc = (int)launch();
    if (rc) {
      fprintf(stderr, "bench_capture_graph: launch %d of the graph failed: status %d\n", i, rc);
      exit(1);
    }
  }
  TCK(cudaStreamEndCapture(st, &g));
  TCK(cudaGraphInstantiate(&ge, g, 0));
  TCK(cudaGraphDestroy(g));
  return ge;
}

template <typename F>
double bench_time_graph(cudaStream_t st, int calls, int replays, int runs, F launch) {
  cudaEvent_t e0, e1;
  TCK(cudaEventCreate(&e0));
  TCK(cudaEventCreate(&e1));
  cudaGraphExec_t ge = bench_capture_graph(st, calls, launch);
  std::vector<double> run((size_t)runs);
  for (int r = 0; r < runs; r++) {
    TCK(cudaGraphLaunch(ge, st));  // warm-up replay
    TCK(cudaEventRecord(e0, st));
    for (int i = 0; i < replays; i++) TCK(cudaGraphLaunch(ge, st));
    TCK(cudaEventRecord(e1, st));
    TCK(cudaEventSynchronize(e1));
    float ms;
    TCK(cudaEventElapsedTime(&ms, e0, e1));
    run[(size_t)r] = 1e3 * ms / ((double)calls * replays);
  }
  TCK(cudaGraphExecDestroy(ge));
  TCK(cudaEventDestroy(e0));
  TCK(cudaEventDestroy(e1));
  std::sort(run.begin(), run.end());
  return run[(size_t)runs / 2];
}

#endif /* FP4IDX_BENCH_CUDA_GRAPH_H */
