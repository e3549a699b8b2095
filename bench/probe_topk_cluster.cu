/* probe_topk_cluster.cu -- experiment (issue 17 round 4), not the product:
 * the fixed cost of a thread-block cluster launch on this GPU, to explain
 * why topk_cluster.cu measured 110 us with 16-block clusters (bench/RESULTS.md,
 * "Round 2"). Standalone:
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a \
 *        -o fp4idx-probe-topk-cluster bench/probe_topk_cluster.cu
 * For each cluster size 1..16 and 4 or 64 clusters, a kernel of 512 threads
 * that (a) does one cluster barrier, (b) does 5 barriers and three rounds of
 * distributed shared memory reads of a 2048-bin histogram from every block
 * of the cluster (the cluster kernel's cluster_find), each with the dynamic
 * shared memory limit left at the size launched (16 KiB) or raised to
 * 212 KiB (what caps_of sets). Method: graph of 20 launches, 1 warm-up,
 * 10 timed replays, median of 3.
 */
#include <algorithm>
#include <cooperative_groups.h>
#include <stdio.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

template <int WHICH, int DSMEM>
__global__ void __launch_bounds__(512, 2) probe_kernel(unsigned *out) {
  extern __shared__ unsigned sm[];
  cg::cluster_group cl = cg::this_cluster();
  for (int i = threadIdx.x; i < 2048; i += 512) sm[i] = i ^ blockIdx.x;
  cl.sync();
  unsigned acc = 0;
  if (DSMEM) {
    const int cs = (int)cl.num_blocks();
    for (int pass = 0; pass < 3; pass++) {
      for (int q = 0; q < cs; q++) {
        const unsigned *h = cl.map_shared_rank(sm, (unsigned)q);
#pragma unroll
        for (int j = 0; j < 4; j++) acc += h[threadIdx.x * 4 + j];
      }
      cl.sync();
    }
    cl.sync();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = acc + WHICH;
}

template <typename K>
double time_one(K kern, int cs, int clusters, size_t smem, cudaStream_t st, unsigned *out) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = (unsigned)cs;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3((unsigned)(cs * clusters));
  cfg.blockDim = dim3(512);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  int n = 0;
  CK(cudaOccupancyMaxActiveClusters(&n, kern, &cfg));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < 20; i++) CK(cudaLaunchKernelEx(&cfg, kern, out));
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  double run[3];
  for (int r = 0; r < 3; r++) {
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < 10; i++) CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    run[r] = 1e3 * ms / 200;
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::sort(run, run + 3);
  printf("  cs %2d clusters %2d smem %6zu  max active clusters %3d  %7.2f us\n", cs, clusters, smem,
         n, run[1]);
  return run[1];
}

template <int WHICH, int DSMEM>
void sweep(const char *what, size_t attr, cudaStream_t st, unsigned *out) {
  auto kern = probe_kernel<WHICH, DSMEM>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)attr));
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  printf("%s (dynamic smem limit %zu):\n", what, attr);
  for (int clusters : {4, 64})
    for (int cs = 1; cs <= 16; cs *= 2) time_one(kern, cs, clusters, 16384, st, out);
}

int main() {
  cudaStream_t st;
  unsigned *out;
  CK(cudaStreamCreate(&st));
  CK(cudaMalloc((void **)&out, 4096 * sizeof(unsigned)));
  sweep<0, 0>("one barrier", 16384, st, out);
  sweep<1, 0>("one barrier", 212 * 1024, st, out);
  sweep<2, 1>("5 barriers + 3 DSMEM rounds", 16384, st, out);
  sweep<3, 1>("5 barriers + 3 DSMEM rounds", 212 * 1024, st, out);
  return 0;
}
