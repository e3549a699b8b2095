/* topk_phases.cu -- an experiment build of the cluster top-k
 * (kernels/cuda/topk_cluster.cu) with a phase timeline: the kernel is
 * included here with FP4IDX_TOPK_PHASES, so thread 0 of every block stamps
 * clock64 at each phase boundary (the TOPK_PHASE marks; a mark that follows
 * no barrier of the kernel gets a __syncthreads first, so every mark is the
 * time the whole block ended that phase). `fp4idx-bench-cuda --topk
 * --phases` prints, per phase, the median and p90 over blocks and launches
 * of the cycles since the previous mark. Benchmark code only: the product
 * library compiles the kernel without the marks.
 */
#include <algorithm>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include <cuda_runtime_api.h>

namespace {
constexpr int kPhSlots = 32, kPhBlocks = 4096;
}
__device__ long long fp4idx__bench_ph[kPhBlocks * kPhSlots];

__device__ __forceinline__ void fp4idx_topk_phase(int i) {
  if (threadIdx.x == 0 && blockIdx.x < (unsigned)kPhBlocks) {
    long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    fp4idx__bench_ph[blockIdx.x * kPhSlots + i] = t;
    if (i == 0 || i == 18) {  // the block's start and end on the GPU-wide clock
      unsigned long long g;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g)::"memory");
      fp4idx__bench_ph[blockIdx.x * kPhSlots + (i == 0 ? 30 : 31)] = (long long)g;
    }
  }
}

// This copy's plan and launch description under their own names (the library's stay).
#define FP4IDX_TOPK_PHASES 1
#define fp4idx__cuda_topk_cluster_plan fp4idx__bench_phases_plan
#define fp4idx__cuda_topk_cluster_describe fp4idx__bench_phases_describe
#include "topk_cluster.cu"
#undef fp4idx__cuda_topk_cluster_plan
#undef fp4idx__cuda_topk_cluster_describe

#include "bench_cuda_topk.h"

namespace {

struct PhaseName {
  int mark, prev;  // cycles of the phase: mark minus prev
  const char *name;
};
const PhaseName kPhases[] = {
    {1, 0, "zero h + owned sums"},
    {2, 1, "load + convert + hist pass 1"},
    {3, 2, "cluster barrier (sums zero)"},
    {4, 3, "pass 1 push to owners"},
    {5, 4, "pass 1 cluster barrier"},
    {6, 5, "pass 1 read sums + scan + find"},
    {7, 6, "passes 2-3 (when taken)"},
    {8, 7, "count > T / == T + base push (+ zero h)"},
    {9, 8, "cluster barrier (bases)"},
    {10, 9, "list: local slots + copy to blocks"},
    {11, 10, "cluster barrier (list whole)"},
    {12, 11, "pad_row"},
    {13, 12, "(unused mark: OR/AND of list + zero h)"},
    {14, 13, "bucket histogram"},
    {15, 14, "bucket scan"},
    {16, 15, "bucket scatter"},
    {17, 16, "rank keys > T + write"},
    {18, 17, "write keys == T"},
    {18, 0, "TOTAL (block)"},
};

double pct(std::vector<long long> &v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return (double)v[(size_t)(p * (double)(v.size() - 1))];
}

}  // namespace

extern "C" int fp4idx_bench_topk_phases(const fp4idx_cuda_topk_row_t *rows, int32_t n_rows,
                                        int32_t k, const fp4idx_cuda_topk_row_t *d_rows,
                                        int32_t *pos, float *val, int32_t *count,
                                        cudaStream_t stream, const char *name) {
  fp4idx_cuda_topk_plan_t p;
  memset(&p, 0, sizeof p);
  p.n_rows = n_rows;
  p.k = k;
  int rc = fp4idx__bench_phases_plan(rows, n_rows, k, 16, &p);
  if (rc) return rc;
  const int blocks = n_rows * p.cluster;
  const int nb = blocks < kPhBlocks ? blocks : kPhBlocks;
  constexpr int kWarm = 3, kLaunches = 15;
  std::vector<long long> h((size_t)kPhBlocks * kPhSlots);
  std::vector<std::vector<long long>> d(sizeof kPhases / sizeof kPhases[0]);
  std::vector<long long> span, skew, pass2, pass3;
  for (int l = 0; l < kWarm + kLaunches; l++) {
    void *sym = nullptr;
    if (cudaGetSymbolAddress(&sym, fp4idx__bench_ph) != cudaSuccess ||
        cudaMemsetAsync(sym, 0, h.size() * sizeof(long long), stream) != cudaSuccess)
      return 1;
    fp4idx_cuda_launch_t desc;
    rc = fp4idx__bench_phases_describe(&p, d_rows, pos, val, count, &desc);
    if (!rc) rc = fp4idx_cuda_launch_run(&desc, stream);
    if (rc) return rc;
    if (cudaStreamSynchronize(stream) != cudaSuccess ||
        cudaMemcpyFromSymbol(h.data(), fp4idx__bench_ph, h.size() * sizeof(long long)) !=
            cudaSuccess)
      return 1;
    if (l < kWarm) continue;
    long long g0 = LLONG_MAX, g1 = 0, gs1 = 0;
    int n2 = 0, n3 = 0;
    for (int b = 0; b < nb; b++) {
      const long long *t = &h[(size_t)b * kPhSlots];
      for (size_t i = 0; i < d.size(); i++) d[i].push_back(t[kPhases[i].mark] - t[kPhases[i].prev]);
      g0 = std::min(g0, t[30]);
      gs1 = std::max(gs1, t[30]);
      g1 = std::max(g1, t[31]);
      n2 += t[20] != 0;
      n3 += t[24] != 0;
    }
    span.push_back(g1 - g0);
    skew.push_back(gs1 - g0);
    pass2.push_back(n2);
    pass3.push_back(n3);
  }
  const Caps *caps = caps_of();
  printf("phases %s k=%d: %d rows, cluster %d of %d threads, slice %lld, %d blocks x %d launches; "
         "blocks that ran pass 2 / 3 (median of launches): %.0f / %.0f\n",
         name, k, n_rows, p.cluster, caps ? threads_of(*caps, n_rows, p.cluster, p.slice) : 0,
         (long long)p.slice, nb, kLaunches, pct(pass2, 0.5), pct(pass3, 0.5));
  printf("  kernel span (globaltimer, first block start to last block end): median %.2f us; "
         "block start skew %.2f us\n",
         pct(span, 0.5) / 1e3, pct(skew, 0.5) / 1e3);
  printf("  %-38s %10s %10s %10s\n", "phase", "p50 cyc", "p90 cyc", "max cyc");
  for (size_t i = 0; i < d.size(); i++) {
    const double p50 = pct(d[i], 0.5), p90 = pct(d[i], 0.9), mx = pct(d[i], 1.0);
    printf("  %-38s %10.0f %10.0f %10.0f\n", kPhases[i].name, p50, p90, mx);
  }
  fflush(stdout);
  return 0;
}
