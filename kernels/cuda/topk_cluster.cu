/* topk_cluster.cu -- the top-k path for rows that fit in the shared memory
 * of one thread-block cluster (sm_90+): one cluster of 1..16 blocks per row,
 * everything in one kernel, no workspace, no memset.
 *
 * Order (protocol/PROTOCOL.md, "score" with topk): logit descending, ties by
 * lower position, only visible positions, fewer pairs when fewer are
 * visible, padding (-1, -inf). Keys as in topk_keys.cuh.
 *
 * Block q of a row's cluster holds positions [q * slice, (q + 1) * slice)
 * as keys in shared memory (read once from global memory). A radix select
 * in three digit passes (key bits 31-21, 20-10, 9-0) finds the k-th key T:
 * each block histograms its slice, the cluster barrier publishes it, and
 * every block sums the cluster's histograms through distributed shared
 * memory and finds the same digit. Then each block counts its keys > T and
 * == T; their prefix over the cluster's blocks (in position order) gives
 * every selected key a slot in block 0's candidate array: keys > T first,
 * then the first keys == T by position, so equal keys sit in position
 * order. Block 0 sorts the <= k candidates with a stable CUB block radix
 * sort (descending, only the key bits that differ) and writes the row.
 * No host synchronization: capturable in a CUDA graph.
 *
 * Measured on the H200 (bench/RESULTS.md, "Round 2"): bit-exact, faster
 * than the chunked path with clusters of 2 blocks, slower with 4 and 16
 * (a fixed per-cluster cost not yet explained), so the automatic plan uses
 * it only up to FP4IDX_CUDA_TOPK_AUTO_CLUSTER blocks (topk.cu).
 */
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <atomic>
#include <limits.h>
#include <string.h>

#include "fp4idx_cuda.h"
#include "topk_keys.cuh"

namespace cg = cooperative_groups;

namespace {

using namespace fp4idx_topk;

constexpr int kT = 512;                 // threads per block (two blocks fit an SM)
constexpr int kMaxCluster = 16;         // the non-portable cluster size of sm_90
constexpr int64_t kSliceCap = 40960;    // keys one block holds (160 KiB)
constexpr int kMaxK = FP4IDX_CUDA_TOPK_CLUSTER_K;
constexpr int kB1 = 2048, kB2 = 2048, kB3 = 1024;  // digits: key bits 31-21, 20-10, 9-0
using Scan = cub::BlockScan<uint32_t, kT>;
using Scan64 = cub::BlockScan<unsigned long long, kT>;
using Sort8 = cub::BlockRadixSort<uint32_t, kT, 8, uint32_t>;  // the largest sort_write below
static_assert(kMaxK <= kT * 8, "block 0 sorts at most kT * 8 candidates");

struct Head {
  uint32_t h1[kB1], h2[kB2], h3[kB3];  // this block's histogram of each pass
  uint32_t n_gt, n_eq;                 // this block's keys > T and == T
  uint32_t digit, rem, total;          // cluster_find's answer
  uint32_t gt_base, eq_base;           // keys > T / == T in the blocks before this one
  uint32_t kor, kand;
};
constexpr size_t kHead = (sizeof(Head) + 15) & ~(size_t)15;

// Bytes of the key area: the slice's keys, later block 0's sort storage.
__host__ __device__ size_t area_bytes(int64_t slice) {
  const size_t a = (size_t)slice * 4, b = sizeof(typename Sort8::TempStorage);
  return ((a > b ? a : b) + 15) & ~(size_t)15;
}
size_t smem_bytes(int64_t slice, int32_t k) { return kHead + area_bytes(slice) + (size_t)k * 8; }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The digit d of an NB-bin pass where the cluster's count of keys above d is
// < rem <= the count at or above d: s.digit = d, s.rem = rem minus the
// count above, s.total = the cluster's count of keys in the pass. Every
// block computes the same answer from the cluster's histograms h.
template <int NB>
__device__ void cluster_find(cg::cluster_group &cl, uint32_t *h, uint32_t rem, Head &s,
                             typename Scan::TempStorage &scan) {
  constexpr int PT = NB / kT;
  const int tid = threadIdx.x, cs = (int)cl.num_blocks();
  uint32_t v[PT], mine = 0;
#pragma unroll
  for (int j = 0; j < PT; j++) v[j] = 0;
  // Four blocks' bins a step, all loads first: distributed shared memory
  // has a latency of some hundred cycles, so they must overlap.
  for (int q0 = 0; q0 < cs; q0 += 4) {
    uint32_t t[4][PT];
#pragma unroll
    for (int qq = 0; qq < 4; qq++) {
      const int q = q0 + qq < cs ? q0 + qq : 0;
      const uint32_t *hq = cl.map_shared_rank(h, (unsigned)q);
#pragma unroll
      for (int j = 0; j < PT; j++)  // thread t: bins in descending order
        t[qq][j] = q0 + qq < cs ? hq[NB - 1 - (tid * PT + j)] : 0u;
    }
#pragma unroll
    for (int qq = 0; qq < 4; qq++)
#pragma unroll
      for (int j = 0; j < PT; j++) v[j] += t[qq][j];
  }
#pragma unroll
  for (int j = 0; j < PT; j++) mine += v[j];
  uint32_t above, total;
  Scan(scan).ExclusiveSum(mine, above, total);
  if (tid == 0) s.total = total;
  if (above < rem && above + mine >= rem) {
    uint32_t c = above;
#pragma unroll
    for (int j = 0; j < PT; j++) {
      if (c + v[j] >= rem) {
        s.digit = (uint32_t)(NB - 1 - (tid * PT + j));
        s.rem = rem - c;
        break;
      }
      c += v[j];
    }
  }
  __syncthreads();
}
#endif

__global__ void __launch_bounds__(kT, 2)
    cluster_kernel(const fp4idx_cuda_topk_row_t *rows, int64_t slice, int32_t k, int32_t *pos,
                   float *val, int32_t *count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  Head &s = *reinterpret_cast<Head *>(smem);
  uint32_t *keys = reinterpret_cast<uint32_t *>(smem + kHead);
  unsigned long long *cand =
      reinterpret_cast<unsigned long long *>(smem + kHead + area_bytes(slice));
  __shared__ typename Scan::TempStorage scan;
  __shared__ typename Scan64::TempStorage scan64;
  cg::cluster_group cl = cg::this_cluster();
  const int tid = threadIdx.x;
  const int cs = (int)cl.num_blocks(), q = (int)cl.block_rank();
  const int r = (int)(blockIdx.x / (unsigned)cs);
  const fp4idx_cuda_topk_row_t row = rows[r];
  const int64_t b = (int64_t)q * slice;
  const int nn = (int)(row.width > b ? (row.width - b < slice ? row.width - b : slice) : 0);

  for (int i = tid; i < kB1; i += kT) { s.h1[i] = 0; s.h2[i] = 0; }
  for (int i = tid; i < kB3; i += kT) s.h3[i] = 0;

  // The slice into shared memory: 16-byte loads between a scalar head and tail.
  const float *x = row.logits + b;
  int head = (int)(((16u - ((uintptr_t)x & 15u)) & 15u) / 4u);
  if (head > nn) head = nn;
  if (tid < head) keys[tid] = __float_as_uint(x[tid]);
  const int nv = (nn - head) / 4;
  const float4 *xv = reinterpret_cast<const float4 *>(x + head);
  for (int v0 = 0; v0 < nv; v0 += 4 * kT) {
    float4 f[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {  // all loads first: four in flight per thread
      const int v = v0 + j * kT + tid;
      f[j] = v < nv ? __ldg(xv + v) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int v = v0 + j * kT + tid;
      if (v < nv) {
        uint32_t *o = keys + head + 4 * v;
        o[0] = __float_as_uint(f[j].x);
        o[1] = __float_as_uint(f[j].y);
        o[2] = __float_as_uint(f[j].z);
        o[3] = __float_as_uint(f[j].w);
      }
    }
  }
  const int tail0 = head + 4 * nv;
  if (tid < nn - tail0) keys[tail0 + tid] = __float_as_uint(x[tail0 + tid]);
  __syncthreads();

  // Pass 1: logits to keys, histogram of the top 11 bits (uniform trip count:
  // hist_add needs whole warps).
  for (int i0 = 0; i0 < nn; i0 += kT) {
    const int i = i0 + tid;
    uint32_t key = 0;
    if (i < nn) {
      key = ord_key(__uint_as_float(keys[i]));
      keys[i] = key;
    }
    hist_add(s.h1, key >> 21, key > kInvisibleMax);
  }
  cl.sync();
  cluster_find<kB1>(cl, s.h1, (uint32_t)k, s, scan);
  uint32_t T, rem_t, G;  // take keys > T (G of them) and the first rem_t keys == T
  if (s.total <= (uint32_t)k) {  // every visible key (-inf has key kInvisibleMax)
    T = kInvisibleMax;
    rem_t = 0;
    G = s.total;
  } else {
    const uint32_t d1 = s.digit, r1 = s.rem;
    for (int i0 = 0; i0 < nn; i0 += kT) {
      const int i = i0 + tid;
      const uint32_t key = i < nn ? keys[i] : 0u;
      hist_add(s.h2, (key >> 10) & 2047u, key > kInvisibleMax && (key >> 21) == d1);
    }
    cl.sync();
    cluster_find<kB2>(cl, s.h2, r1, s, scan);
    const uint32_t p2 = d1 << 11 | s.digit, r2 = s.rem;
    for (int i0 = 0; i0 < nn; i0 += kT) {
      const int i = i0 + tid;
      const uint32_t key = i < nn ? keys[i] : 0u;
      hist_add(s.h3, key & 1023u, key > kInvisibleMax && (key >> 10) == p2);
    }
    cl.sync();
    cluster_find<kB3>(cl, s.h3, r2, s, scan);
    T = p2 << 10 | s.digit;
    rem_t = s.rem;
    G = (uint32_t)k - rem_t;
  }

  // Thread t owns the run [t * per, t * per + per): per is odd, so the
  // lanes of a warp read distinct banks.
  const int per = (int)((slice + kT - 1) / kT) | 1;
  const int r0 = tid * per < nn ? tid * per : nn, r1 = r0 + per < nn ? r0 + per : nn;
  uint32_t ngt = 0, neq = 0;
  for (int i = r0; i < r1; i++) {
    const uint32_t key = keys[i];
    ngt += key > T;
    neq += key == T;
  }
  unsigned long long pre, tot;
  Scan64(scan64).ExclusiveSum((unsigned long long)ngt << 32 | neq, pre, tot);
  if (tid == 0) {
    s.n_gt = (uint32_t)(tot >> 32);
    s.n_eq = (uint32_t)tot;
  }
  cl.sync();
  if (tid < 32) {  // lane o < q: block o's counts, summed over the warp
    const bool on = tid < q;
    const uint32_t g = on ? *cl.map_shared_rank(&s.n_gt, (unsigned)tid) : 0u;
    const uint32_t e = on ? *cl.map_shared_rank(&s.n_eq, (unsigned)tid) : 0u;
    const uint32_t gs = __reduce_add_sync(0xffffffffu, g), es = __reduce_add_sync(0xffffffffu, e);
    if (tid == 0) {
      s.gt_base = gs;
      s.eq_base = es;
    }
  }
  __syncthreads();
  unsigned long long *c0 = cl.map_shared_rank(cand, 0u);
  uint32_t gt_at = s.gt_base + (uint32_t)(pre >> 32), eq_at = s.eq_base + (uint32_t)pre;
  for (int i = r0; i < r1; i++) {
    const uint32_t key = keys[i];
    if (key > T) {
      c0[gt_at++] = cand_of(key, b + i);
    } else if (key == T) {
      if (eq_at < rem_t) c0[G + eq_at] = cand_of(key, b + i);
      eq_at++;
    }
  }
  cl.sync();  // block 0 holds the candidates; no block reads another's memory after this

  const uint32_t n_out = G + rem_t;
  int32_t *po = pos + (size_t)r * (size_t)k;
  float *vo = val + (size_t)r * (size_t)k;
  for (int64_t i = (int64_t)n_out + (int64_t)q * kT + tid; i < k; i += (int64_t)cs * kT) {
    po[i] = -1;
    vo[i] = -INFINITY;
  }
  if (q != 0) return;

  // Sort only the key bits that differ among the candidates; the keys are
  // dead, so their area holds CUB's storage.
  const uint32_t diff = key_diff<kT>(cand, n_out, &s.kor, &s.kand);
  sort_write_n<kT>(smem + kHead, cand, n_out, diff, row.logits, po, vo);
  if (tid == 0) count[r] = (int32_t)n_out;
#endif
}

// Per device: the largest cluster size that can be resident at the largest
// shared memory this path asks for (0: no cluster path), and the SM count.
struct Caps {
  std::atomic<int> ready{0};
  int max_cs = 0, sms = 0;
};
Caps g_caps[64];

int caps_of(int *max_cs, int *sms) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return 0;
  }
  Caps &c = g_caps[dev];
  if (!c.ready.load(std::memory_order_acquire)) {
    int major = 0, n_sm = 0, best = 0;
    const size_t sm = smem_bytes(kSliceCap, kMaxK);
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        major >= 9 &&
        cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)sm) == cudaSuccess &&
        cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                             1) == cudaSuccess) {
      for (int cs = kMaxCluster; cs >= 1 && !best; cs /= 2) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeClusterDimension;
        at[0].val.clusterDim.x = (unsigned)cs;
        at[0].val.clusterDim.y = 1;
        at[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)cs);
        cfg.blockDim = dim3(kT);
        cfg.dynamicSmemBytes = sm;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, cluster_kernel, &cfg) == cudaSuccess && n > 0)
          best = cs;
      }
    }
    (void)cudaGetLastError();  // a failed query means: no cluster path
    c.max_cs = best;
    c.sms = n_sm;
    c.ready.store(1, std::memory_order_release);
  }
  *max_cs = c.max_cs;
  *sms = c.sms;
  return c.max_cs > 0;
}

}  // namespace

extern "C" int fp4idx__cuda_topk_cluster_plan(const fp4idx_cuda_topk_row_t *rows,
                                              int32_t n_rows, int32_t k, int32_t max_cluster,
                                              fp4idx_cuda_topk_plan_t *p) {
  int max_cs = 0, sms = 0;
  if (k > kMaxK || n_rows < 1 || !caps_of(&max_cs, &sms)) return FP4IDX_ENODEV;
  int64_t max_w = 0;
  for (int32_t i = 0; i < n_rows; i++)
    if (rows[i].width > max_w) max_w = rows[i].width;
  // About two blocks per SM over the batch, then wide enough for the slice.
  int cs = 1;
  while (cs * 2 <= max_cs && (int64_t)n_rows * cs * 2 <= 2 * (int64_t)sms) cs *= 2;
  while (cs * 2 <= max_cs && (max_w + cs - 1) / cs > kSliceCap) cs *= 2;
  int64_t slice = (max_w + cs - 1) / cs;
  slice = slice < 4 ? 4 : (slice + 3) & ~(int64_t)3;  // 16-byte steps between blocks
  if (slice > kSliceCap || cs > max_cluster || (int64_t)n_rows * cs > INT_MAX)
    return FP4IDX_ENODEV;
  p->cluster = cs;
  p->slice = slice;
  p->cluster_smem = smem_bytes(slice, k);
  p->ws_bytes = 256;  // unused; non-zero so every caller's allocation is valid
  return FP4IDX_OK;
}

extern "C" int fp4idx__cuda_topk_cluster_launch(const fp4idx_cuda_topk_plan_t *p,
                                                const fp4idx_cuda_topk_row_t *rows, int32_t *pos,
                                                float *val, int32_t *count, cudaStream_t stream) {
  int max_cs = 0, sms = 0;
  if (p->cluster < 1 || p->cluster > kMaxCluster || p->slice < 4 || p->slice > kSliceCap ||
      p->k > kMaxK || p->cluster_smem != smem_bytes(p->slice, p->k))
    return FP4IDX_EINVAL;
  if (!caps_of(&max_cs, &sms) || p->cluster > max_cs) return FP4IDX_ENODEV;
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = (unsigned)p->cluster;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3((unsigned)((int64_t)p->n_rows * p->cluster));
  cfg.blockDim = dim3(kT);
  cfg.dynamicSmemBytes = p->cluster_smem;
  cfg.stream = stream;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return fp4idx__cuda_check(
      cudaLaunchKernelEx(&cfg, cluster_kernel, rows, (int64_t)p->slice, p->k, pos, val, count),
      "topk: cluster kernel");
}
