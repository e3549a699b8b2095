/* bench_cuda_isolated.h -- a launch timed alone, as the daemon makes it: one
 * call at a time on an otherwise idle stream, waited for, then the host
 * idle for a gap before the next (a request's round trip), instead of the
 * back-to-back graph replays of bench_cuda_graph.h, whose calls overlap
 * each other's launch, ramp and tail.
 *
 * Per call: event, the call, event, the SM clock probe, then a wait for the
 * probe and a host spin of gap_us. The call is either captured once in a
 * graph of one call (graph = 1: every operation reaches the device in one
 * submission, so the time is that submission's latency and the device's
 * work) or enqueued directly (graph = 0: the time also holds what the
 * device waits for the host's later launches). The probe is one thread
 * that counts SM cycles against the global timer for ~10 us right after
 * the call, so it reads the clock the call ran at without running inside
 * its window. */
#ifndef FP4IDX_BENCH_CUDA_ISOLATED_H
#define FP4IDX_BENCH_CUDA_ISOLATED_H

#include <algorithm>
#include <vector>

#include "bench_cuda_check.h"
#include "bench_cuda_graph.h"
#include "bench_time.h"

/* Enqueues the clock probe on st: it stores the SM clock in MHz, measured
 * over ~20,000 cycles, to *mhz (device memory). */
cudaError_t fp4idx_bench_clock_probe(cudaStream_t st, float *mhz);

struct bench_isolated_t {
  double p50_us, p90_us;  // the call's device time, between its events
  double mhz;             // the median SM clock right after a call
};

template <typename F>
bench_isolated_t bench_time_isolated(cudaStream_t st, int calls, int gap_us, int graph, F launch) {
  cudaGraphExec_t ge = graph ? bench_capture_graph(st, 1, launch) : nullptr;
  cudaEvent_t e0, e1;
  TCK(cudaEventCreate(&e0));
  TCK(cudaEventCreate(&e1));
  float *dmhz;
  TCK(cudaMalloc((void **)&dmhz, sizeof(float) * (size_t)calls));
  std::vector<double> t;
  const int warm = calls / 10 + 1;
  for (int i = -warm; i < calls; i++) {
    TCK(cudaEventRecord(e0, st));
    if (ge) {
      TCK(cudaGraphLaunch(ge, st));
    } else if (const int rc = (int)launch()) {
      fprintf(stderr, "bench_time_isolated: call %d failed: status %d\n", i, rc);
      exit(1);
    }
    TCK(cudaEventRecord(e1, st));
    TCK(fp4idx_bench_clock_probe(st, dmhz + (i < 0 ? 0 : i)));
    TCK(cudaStreamSynchronize(st));
    float ms;
    TCK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 0) t.push_back(1e3 * ms);
    for (const double until = now_us() + gap_us; now_us() < until;) {
    }
  }
  std::vector<float> mhz((size_t)calls);
  TCK(cudaMemcpy(mhz.data(), dmhz, sizeof(float) * (size_t)calls, cudaMemcpyDeviceToHost));
  TCK(cudaFree(dmhz));
  TCK(cudaEventDestroy(e0));
  TCK(cudaEventDestroy(e1));
  if (ge) TCK(cudaGraphExecDestroy(ge));
  std::sort(t.begin(), t.end());
  std::sort(mhz.begin(), mhz.end());
  return bench_isolated_t{t[t.size() / 2], t[t.size() * 9 / 10], mhz[mhz.size() / 2]};
}

#endif /* FP4IDX_BENCH_CUDA_ISOLATED_H */
