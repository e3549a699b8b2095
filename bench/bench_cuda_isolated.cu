/* bench_cuda_isolated.cu -- the SM clock probe of bench_cuda_isolated.h. */
#include <cuda_runtime_api.h>

#include "bench_cuda_isolated.h"

namespace {

// One thread: SM cycles against the global timer (ns) over ~20,000 cycles.
__global__ void clock_probe_kernel(float *mhz) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  long long c1;
  do c1 = clock64();
  while (c1 - c0 < 20000);
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  *mhz = t1 > t0 ? (float)((double)(c1 - c0) * 1e3 / (double)(t1 - t0)) : 0.0f;
}

}  // namespace

cudaError_t fp4idx_bench_clock_probe(cudaStream_t st, float *mhz) {
  clock_probe_kernel<<<1, 1, 0, st>>>(mhz);
  return cudaGetLastError();
}
