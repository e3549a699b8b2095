/* topk_rowsort.cu -- the top-k path for batches of many short rows (at
 * most FP4IDX_CUDA_TOPK_ROWSORT_WIDTH positions, k <=
 * FP4IDX_CUDA_TOPK_CLUSTER_K, sm_90+; the planner takes it for a quarter
 * to all of the SMs' count of rows): one block of 1,024 threads per row,
 * no cluster, no workspace, one kernel.
 *
 * Order (protocol/PROTOCOL.md, "score" with topk): logit descending, ties by
 * lower position, only visible positions, fewer pairs when fewer are
 * visible, padding (-1, -inf). Keys as in topk_keys.cuh.
 *
 * The block reads its row once into shared memory as keys, histogramming
 * their top 12 bits on the way. A radix select of up to three digit passes
 * (key bits 31-20, 19-8, 7-0; the later ones over the shared keys) stops at
 * the first digit bin whose keys, with every key above it, number at least
 * k and at most kCandMax (the usual row: after the first pass); where no
 * bin is that small (ties) the last pass gives the k-th key T exactly. The
 * candidates go to a list in position order (warp ballots, the warps'
 * counts scanned): the keys at or above the threshold, or with an exact T
 * the keys > T and then the first keys == T by position until k are
 * taken. The output order (ties by lower position) comes, for k <= kRankK,
 * from buckets of the candidates' top 16 key bits (a bf16 logit's whole
 * value) with a counting rank inside each bucket, where the buckets span
 * at most 4,096 values and none holds more than kRankMax candidates (a
 * rank's cost grows with the square of its bucket: on an H100 it wins at
 * k = 512, 64 x 9,295 keys 11.0 against 13.4 us, and loses at k = 2048,
 * 19.1 against 18.8, docs/RESULTS.md); else from a stable block radix sort of
 * the list (descending, only the key bits that differ; the upper 16 where
 * every candidate is a bf16 value, as the scorer writes them). The first
 * min(k, candidates) pairs are written, the rest padded.
 * No host synchronization: capturable in a CUDA graph.
 */
#include <cub/block/block_scan.cuh>
#include <atomic>
#include <string.h>

#include "fp4idx_cuda.h"
#include "launch_args.cuh"
#include "topk_keys.cuh"

namespace {

using namespace fp4idx_topk;

constexpr int kRowT = 1024;                             // threads of the row's block
constexpr int kWidth = FP4IDX_CUDA_TOPK_ROWSORT_WIDTH;  // positions a block holds
constexpr int kCandMax = 8 * kRowT;                     // the largest list sort_write_n sorts
constexpr int kRowBins = 4096;                          // digit bins (the last pass uses 256)
static_assert(kRowBins == 4 * kRowT, "a thread scans four bins");
using RowScan = cub::BlockScan<uint32_t, kRowT, cub::BLOCK_SCAN_WARP_SCANS>;

// Dynamic shared memory: keys[kWidth] | hist[kRowBins] | list[kCandMax]
// (key << 32 | ~position; also the block sort's storage).
constexpr size_t kOffHist = (size_t)kWidth * 4;
constexpr size_t kOffList = kOffHist + (size_t)kRowBins * 4;
constexpr size_t kSmem = kOffList + (size_t)kCandMax * 8;
static_assert((size_t)kCandMax * 8 <= (size_t)kWidth * 4, "the bucketed list fits in the keys");
static_assert(sizeof(cub::BlockRadixSort<uint32_t, kRowT, 8, uint32_t>::TempStorage) <=
                  (size_t)kCandMax * 8,
              "the block sort's storage fits in the list");

constexpr uint32_t kRankMax = 256;  // the largest bucket the counting rank takes
constexpr int32_t kRankK = 512;     // the largest k the counting rank serves

struct RowHead {
  uint32_t bin, n_at, n_above;  // the select's bin, keys at or above it, keys above it
  uint32_t wgt[32], weq[32];    // candidates > / == the threshold per warp
  uint32_t kor, kand;           // key_diff's scratch
  uint32_t top16, low16, big;   // the candidates' top 16 key bits: largest, smallest; largest bucket
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The bin b of h[kRowBins] where `above` plus the keys in bins >= b first
// reach k, into s->bin, with the keys at or above it (s->n_at) and above it
// (s->n_above), both counting `above`; nothing where above plus the
// histogram's total stays below k. Returns the histogram's total.
__device__ uint32_t find_bin(const uint32_t *h, uint32_t above, uint32_t k,
                             RowScan::TempStorage &scan, RowHead *s) {
  const uint4 v = reinterpret_cast<const uint4 *>(h)[threadIdx.x];
  const uint32_t mine = v.x + v.y + v.z + v.w;
  uint32_t below = 0, total = 0;
  RowScan(scan).ExclusiveSum(mine, below, total);
  const uint32_t hi = above + (total - below - mine);  // keys in the higher threads' bins
  if (hi < k && hi + mine >= k) {
    const uint32_t c[4] = {v.x, v.y, v.z, v.w};
    uint32_t at = hi;
    for (int j = 3; j >= 0; j--) {
      if (at + c[j] >= k) {
        s->bin = threadIdx.x * 4u + (uint32_t)j;
        s->n_at = at + c[j];
        s->n_above = at;
        break;
      }
      at += c[j];
    }
  }
  __syncthreads();
  return total;
}
#endif

// The candidates list[0, n_cand) written in output order by a counting
// rank, where it is cheap: their top 16 key bits span at most kRowBins
// values (buckets, keys descending) and no bucket holds more than
// kRankMax. A candidate's index is its bucket's start plus the candidates
// of its bucket that order before it ((key, ~position) pairs are
// distinct, so the count is exact). h (kRowBins words) and keys (the row,
// done with; n_cand * 8 bytes) are scratch. Returns 0, writing nothing,
// where the buckets are too wide or too full (the caller sorts).
__device__ int bucket_rank_write(const unsigned long long *list, uint32_t n_cand, int32_t k,
                                 uint32_t *h, uint32_t *keys, RowScan::TempStorage &scan,
                                 RowHead *s, const float *logits, int32_t *po, float *vo) {
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid == 0) {
    s->top16 = 0;
    s->low16 = 0xFFFFFFFFu;
    s->big = 0;
  }
  __syncthreads();
  uint32_t mx = 0, mn = 0xFFFFu;
  for (uint32_t i = tid; i < n_cand; i += kRowT) {
    const uint32_t u = (uint32_t)(list[i] >> 48);
    mx = u > mx ? u : mx;
    mn = u < mn ? u : mn;
  }
  mx = __reduce_max_sync(0xffffffffu, mx);
  mn = __reduce_min_sync(0xffffffffu, mn);
  if (lane == 0) {
    atomicMax(&s->top16, mx);
    atomicMin(&s->low16, mn);
  }
  reinterpret_cast<uint4 *>(h)[tid] = make_uint4(0u, 0u, 0u, 0u);
  __syncthreads();
  const uint32_t top = s->top16, range = n_cand ? top - s->low16 + 1u : 0u;
  if (range > (uint32_t)kRowBins) return 0;  // uniform: every thread reads the same words
  for (uint32_t i = tid; i < n_cand; i += kRowT) atomicAdd(&h[top - (uint32_t)(list[i] >> 48)], 1u);
  __syncthreads();
  uint4 v = reinterpret_cast<const uint4 *>(h)[tid];
  uint32_t below = 0, total = 0;
  RowScan(scan).ExclusiveSum(v.x + v.y + v.z + v.w, below, total);
  uint32_t big = v.x > v.y ? v.x : v.y;
  big = big > v.z ? big : v.z;
  big = big > v.w ? big : v.w;
  big = __reduce_max_sync(0xffffffffu, big);
  if (lane == 0) atomicMax(&s->big, big);
  v.x += below;  // each bucket's end
  v.y += v.x;
  v.z += v.y;
  v.w += v.z;
  reinterpret_cast<uint4 *>(h)[tid] = v;
  __syncthreads();
  if (s->big > kRankMax) return 0;
  unsigned long long *bucketed = reinterpret_cast<unsigned long long *>(keys);
  for (uint32_t i = tid; i < n_cand; i += kRowT) {
    const unsigned long long c = list[i];
    bucketed[atomicSub(&h[top - (uint32_t)(c >> 48)], 1u) - 1u] = c;
  }
  __syncthreads();  // h[d]: the start of bucket d
  for (uint32_t i = tid; i < n_cand; i += kRowT) {
    const unsigned long long c = list[i];
    const uint32_t d = top - (uint32_t)(c >> 48);
    const uint32_t b0 = h[d], b1 = d + 1u < range ? h[d + 1u] : n_cand;
    uint32_t rank = b0, j = b0;
    for (; j + 4 <= b1 && rank < (uint32_t)k; j += 4) {
      const unsigned long long y0 = bucketed[j], y1 = bucketed[j + 1], y2 = bucketed[j + 2],
                               y3 = bucketed[j + 3];
      rank += (y0 > c) + (y1 > c) + (y2 > c) + (y3 > c);
    }
    for (; j < b1 && rank < (uint32_t)k; j++) rank += bucketed[j] > c;
    if (rank < (uint32_t)k) {
      const int32_t p = cand_pos(c);
      po[rank] = p;
      vo[rank] = logits[p];
    }
  }
  return 1;
}

__global__ void __launch_bounds__(kRowT, 1)
    rowsort_kernel(const fp4idx_cuda_topk_row_t *rows, int32_t k, int32_t *pos, float *val,
                   int32_t *count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ RowHead s;
  __shared__ RowScan::TempStorage scan;
  uint32_t *keys = reinterpret_cast<uint32_t *>(smem);
  uint32_t *h = reinterpret_cast<uint32_t *>(smem + kOffHist);
  unsigned long long *list = reinterpret_cast<unsigned long long *>(smem + kOffList);
  constexpr int kPer = kWidth / kRowT;  // positions a thread loads
  static_assert(kWidth % kRowT == 0, "whole loads per thread");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r = blockIdx.x;
  // Programmatic dependent launch: the next kernel may start its prologue
  // at once; this one touches global memory only after the wait, so its
  // start and the histogram's zeroing run under the previous kernel.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  reinterpret_cast<uint4 *>(h)[tid] = make_uint4(0u, 0u, 0u, 0u);
  __syncthreads();
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const fp4idx_cuda_topk_row_t row = rows[r];
  const int n = (int)row.width;  // <= kWidth (the planner's rule)
  int32_t *po = pos + (size_t)r * (size_t)k;
  float *vo = val + (size_t)r * (size_t)k;

  // The row into shared memory as keys (thread t: positions j * kRowT + t),
  // every load in flight before the first use; the top 12 bits counted.
  {
    float f[kPer];
#pragma unroll
    for (int j = 0; j < kPer; j++) {
      const int i = j * kRowT + tid;
      f[j] = i < n ? __ldg(row.logits + i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kPer; j++) {
      const int i = j * kRowT + tid;
      const uint32_t key = ord_key(f[j]);
      if (i < n) keys[i] = key;
      hist_inc(h, key >> 20, i < n && key > kInvisibleMax);
    }
  }
  __syncthreads();

  // The select: candidates are keys >= lo; with an exact T (exact != 0) the
  // keys > T (lo = T + 1) and the first `take` keys == T. At most k visible
  // keys: every one of them (lo just above the key of -inf).
  uint32_t lo = kInvisibleMax + 1, t_key = 0, take = 0, above = 0, prefix = 0;
  int exact = 0;
  for (int pass = 0; pass < 3; pass++) {
    const int shift = pass == 0 ? 20 : pass == 1 ? 8 : 0;
    if (pass > 0) {  // the next digit's bins inside the chosen bin
      reinterpret_cast<uint4 *>(h)[tid] = make_uint4(0u, 0u, 0u, 0u);
      __syncthreads();
      const int wide = pass == 1 ? 20 : 8;  // key bits above this digit
      const uint32_t mask = pass == 1 ? 4095u : 255u;
#pragma unroll 4
      for (int j = 0; j < kPer; j++) {
        const int i = j * kRowT + tid;
        const uint32_t key = i < n ? keys[i] : 0u;
        hist_inc(h, (key >> shift) & mask, i < n && (key >> wide) == prefix);
      }
      __syncthreads();
    }
    const uint32_t total = find_bin(h, above, (uint32_t)k, scan, &s);
    if (pass == 0 && total <= (uint32_t)k) break;
    const uint32_t bin = s.bin, n_at = s.n_at, n_above = s.n_above;
    __syncthreads();  // s is read before the next pass writes it
    prefix = (prefix << (pass == 2 ? 8 : 12)) | bin;
    if (n_at <= (uint32_t)kCandMax) {  // the whole bin joins the candidates
      lo = prefix << shift;
      break;
    }
    if (pass == 2) {  // ties: T, the k-th key, is the last digit's bin
      exact = 1;
      t_key = prefix;
      lo = prefix + 1;  // T <= 0xFF800000 (the key of +inf): no wrap
      take = (uint32_t)k - n_above;
      break;
    }
    above = n_above;
  }

  // The list in position order: warp w takes positions [w * per_w, (w + 1) * per_w).
  const int per_w = (n + 32 * 32 - 1) / (32 * 32) * 32;
  const int w0 = warp * per_w, w1 = w0 + per_w < n ? w0 + per_w : n;
  {
    uint32_t cgt = 0, ceq = 0;
    for (int b = w0; b < w1; b += 32) {
      const int i = b + lane;
      const uint32_t key = i < w1 ? keys[i] : 0u;
      cgt += __popc(__ballot_sync(0xffffffffu, i < w1 && key >= lo));
      ceq += __popc(__ballot_sync(0xffffffffu, exact && i < w1 && key == t_key));
    }
    if (lane == 0) {
      s.wgt[warp] = cgt;
      s.weq[warp] = ceq;
    }
  }
  __syncthreads();
  uint32_t gt_base = 0, eq_base = 0, n_gt = 0;
  for (int w = 0; w < 32; w++) {
    if (w < warp) {
      gt_base += s.wgt[w];
      eq_base += s.weq[w];
    }
    n_gt += s.wgt[w];
  }
  {
    const unsigned lt = (1u << lane) - 1u;
    for (int b = w0; b < w1; b += 32) {
      const int i = b + lane;
      const uint32_t key = i < w1 ? keys[i] : 0u;
      const bool gt = i < w1 && key >= lo, eq = exact && i < w1 && key == t_key;
      const unsigned bg = __ballot_sync(0xffffffffu, gt), be = __ballot_sync(0xffffffffu, eq);
      if (gt) list[gt_base + __popc(bg & lt)] = cand_of(key, i);
      const uint32_t er = eq_base + __popc(be & lt);
      if (eq && er < take) list[n_gt + er] = cand_of(key, i);
      gt_base += __popc(bg);
      eq_base += __popc(be);
    }
  }
  const uint32_t n_cand = n_gt + take;  // exact: n_gt + take == k; else n_gt (may pass k)
  __syncthreads();
  const uint32_t n_out = n_cand < (uint32_t)k ? n_cand : (uint32_t)k;
  if (k <= kRankK && bucket_rank_write(list, n_cand, k, h, keys, scan, &s, row.logits, po, vo)) {
    pad_row(po, vo, count + r, n_out, k, 0, 1, kRowT);
    return;
  }

  // The key bits to sort: those that differ; only the upper 16 where every
  // candidate's lower 16 follow from its sign (a bf16 value's key).
  uint32_t diff = key_diff<kRowT>(list, n_cand, &s.kor, &s.kand);
  int bf16 = 1;
  for (uint32_t i = tid; i < n_cand; i += kRowT) {
    const uint32_t key = (uint32_t)(list[i] >> 32);
    bf16 &= (key & 0xFFFFu) == (key & 0x80000000u ? 0u : 0xFFFFu);
  }
  if (__syncthreads_and(bf16)) diff &= 0xFFFF0000u;
  sort_write_n<kRowT>(reinterpret_cast<unsigned char *>(list), list, n_cand, n_out, diff,
                      row.logits, po, vo);
  pad_row(po, vo, count + r, n_out, k, 0, 1, kRowT);
#endif
}

// Per device: the kernel's shared memory limit set (once), whether the
// device runs it (sm_90+) and its SM count (0: no row-sort path).
struct RowCaps {
  std::atomic<int> ready{0};
  int sms = 0;
};
RowCaps g_row_caps[64];

int device_sms() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return 0;
  }
  RowCaps &c = g_row_caps[dev];
  if (!c.ready.load(std::memory_order_acquire)) {
    int major = 0, sms = 0;
    const int ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        major >= 9 &&
        cudaFuncSetAttribute(rowsort_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)kSmem) == cudaSuccess;
    (void)cudaGetLastError();  // a failed query means: no row-sort path
    c.sms = ok ? sms : 0;
    c.ready.store(1, std::memory_order_release);
  }
  return c.sms;
}

}  // namespace

extern "C" int fp4idx__cuda_topk_rowsort_plan(const fp4idx_cuda_topk_row_t *rows, int32_t n_rows,
                                              int32_t k, int automatic,
                                              fp4idx_cuda_topk_plan_t *p) {
  if (n_rows < 1 || k > FP4IDX_CUDA_TOPK_CLUSTER_K) return FP4IDX_ENODEV;
  for (int32_t i = 0; i < n_rows; i++)
    if (rows[i].width > kWidth) return FP4IDX_ENODEV;
  const int sms = device_sms();
  if (!sms) return FP4IDX_ENODEV;
  // The planner's rule: one wave of blocks (a block per row, one per SM),
  // and more rows than a quarter of the SMs, where the cluster path gets
  // at most two blocks a row. Measured (H100, docs/RESULTS.md): 64 rows of
  // 9,295 keys, k = 2048, 18.9 us against the cluster path's 23.0 (k = 512,
  // with the counting rank, 11.1 against 13.7); 4 rows of 16,384 (clusters
  // of 4) 18.4 against 14.1.
  if (automatic && !(n_rows <= sms && (int64_t)n_rows * 4 > sms)) return FP4IDX_ENODEV;
  p->rowsort = 1;
  p->ws_bytes = 256;  // unused; non-zero so every caller's allocation is valid
  return FP4IDX_OK;
}

extern "C" int fp4idx__cuda_topk_rowsort_describe(const fp4idx_cuda_topk_plan_t *p,
                                                  const fp4idx_cuda_topk_row_t *rows,
                                                  int32_t *pos, float *val, int32_t *count,
                                                  fp4idx_cuda_launch_t *l) {
  if (p->rowsort != 1 || p->k > FP4IDX_CUDA_TOPK_CLUSTER_K) return FP4IDX_EINVAL;
  if (!device_sms()) return FP4IDX_ENODEV;
  // Programmatic dependent launch, as the cluster path's: the block's start
  // and zeroing run under the scorer's tail.
  fp4idx__launch_begin(l, rowsort_kernel, (unsigned)p->n_rows, kRowT, kSmem, 0, 1);
  fp4idx__launch_arg(l, rows);
  fp4idx__launch_arg(l, (int32_t)p->k);
  fp4idx__launch_arg(l, pos);
  fp4idx__launch_arg(l, val);
  fp4idx__launch_arg(l, count);
  return FP4IDX_OK;
}
