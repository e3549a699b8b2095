/* bench_topk_old.cu -- the previous product top-k (kernels/cuda/topk.cu up
 * to the multi-block rewrite), kept only as the baseline that
 * fp4idx-bench-cuda --topk times beside the new one. Not in the product.
 *
 * One 1024-thread block per row. Logits map to order-preserving 32-bit keys
 * (negative: all bits flipped; positive: sign bit set), so unsigned order is
 * float order. -inf (invisible positions) and negative NaNs map at or below
 * 0x007FFFFF and are never selected.
 *   1. count the visible logits; if <= k, all of them are taken;
 *   2. otherwise a 4-pass radix select (8 bits a pass, shared-memory
 *      histogram) finds T, the key of the k-th largest, and how many equal
 *      to T are still needed;
 *   3. collect every key > T (any order) and, scanning positions in order
 *      with a block-wide ballot prefix, the first `need` keys == T -- so ties
 *      at the threshold keep the lower positions;
 *   4. bitonic sort of (key << 32 | ~position) descending: logit descending,
 *      ties by lower position; write k pairs, padding with (-1, -inf).
 * k <= kOldMaxK (the sort buffer lives in shared memory).
 */
#include <stdio.h>

#include "bench_cuda_topk.h"

namespace {

constexpr int kOldMaxK = FP4IDX_BENCH_TOPK_OLD_MAX;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ uint32_t ord_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_to_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
}

constexpr uint32_t kInvisibleMax = 0x007FFFFFu;  // ord_key(-inf)

__global__ void __launch_bounds__(kThreads)
    topk_kernel(const fp4idx_bench_old_row_t *rows, int32_t k, int32_t *pos, float *val,
                int32_t *count) {
  __shared__ unsigned long long sel[kOldMaxK];
  __shared__ uint32_t hist[256];
  __shared__ uint32_t warp_cnt[kWarps];
  __shared__ uint32_t s_cnt, s_nsel, s_prefix, s_rem, s_eqbase;

  const fp4idx_bench_old_row_t row = rows[blockIdx.x];
  const float *x = row.logits;
  const int64_t n = row.width;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  if (tid == 0) { s_cnt = 0; s_nsel = 0; }
  __syncthreads();
  uint32_t c = 0;
  for (int64_t i = tid; i < n; i += kThreads) c += ord_key(x[i]) > kInvisibleMax;
  for (int d = 16; d; d >>= 1) c += __shfl_xor_sync(0xffffffffu, c, d);
  if (lane == 0) atomicAdd(&s_cnt, c);
  __syncthreads();
  const uint32_t cnt = s_cnt;

  uint32_t T = kInvisibleMax, need = 0;
  if (cnt > (uint32_t)k) {
    uint32_t prefix = 0, pmask = 0, rem = (uint32_t)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += kThreads) hist[b] = 0;
      __syncthreads();
      for (int64_t i = tid; i < n; i += kThreads) {
        const uint32_t key = ord_key(x[i]);
        if (key > kInvisibleMax && (key & pmask) == prefix)
          atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        uint32_t cum = 0, b = 255;
        for (;; b--) {
          if (cum + hist[b] >= rem || b == 0) break;
          cum += hist[b];
        }
        s_prefix = prefix | (b << shift);
        s_rem = rem - cum;
      }
      __syncthreads();
      prefix = s_prefix;
      rem = s_rem;
      pmask |= 255u << shift;
      __syncthreads();
    }
    T = prefix;
    need = rem;
  }

  // Collect: > T anywhere, == T the first `need` by position.
  if (tid == 0) s_eqbase = 0;
  __syncthreads();
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t i = base + tid;
    const uint32_t key = i < n ? ord_key(x[i]) : 0u;
    if (key > T) {
      const uint32_t at = atomicAdd(&s_nsel, 1u);
      sel[at] = ((unsigned long long)key << 32) | (0xFFFFFFFFu - (uint32_t)i);
    }
    if (need) {
      const bool eq = i < n && key == T;
      const uint32_t ballot = __ballot_sync(0xffffffffu, eq);
      if (lane == 0) warp_cnt[warp] = __popc(ballot);
      __syncthreads();
      uint32_t before = s_eqbase;
      for (int w = 0; w < warp; w++) before += warp_cnt[w];
      before += __popc(ballot & ((1u << lane) - 1u));
      if (eq && before < need) {
        const uint32_t at = atomicAdd(&s_nsel, 1u);
        sel[at] = ((unsigned long long)key << 32) | (0xFFFFFFFFu - (uint32_t)i);
      }
      __syncthreads();
      if (tid == 0) {
        uint32_t tot = 0;
        for (int w = 0; w < kWarps; w++) tot += warp_cnt[w];
        s_eqbase += tot;
      }
      __syncthreads();
      if (s_eqbase >= need) need = 0;  // uniform: every thread reads the same value
    }
  }
  __syncthreads();
  const uint32_t m = s_nsel;  // == min(k, cnt)
  uint32_t P = 1;
  while (P < m) P <<= 1;
  for (uint32_t i = m + tid; i < P; i += kThreads) sel[i] = 0ull;
  __syncthreads();
  // Bitonic sort, descending.
  for (uint32_t size = 2; size <= P; size <<= 1) {
    for (uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (uint32_t i = tid; i < P / 2; i += kThreads) {
        const uint32_t lo = 2 * i - (i & (stride - 1));
        const uint32_t hi = lo + stride;
        const bool desc = (lo & size) == 0;
        const unsigned long long a = sel[lo], b = sel[hi];
        if ((a < b) == desc) { sel[lo] = b; sel[hi] = a; }
      }
      __syncthreads();
    }
  }
  const int64_t ob = (int64_t)blockIdx.x * k;
  for (int32_t i = tid; i < k; i += kThreads) {
    if ((uint32_t)i < m) {
      const unsigned long long e = sel[i];
      pos[ob + i] = (int32_t)(0xFFFFFFFFu - (uint32_t)(e & 0xFFFFFFFFull));
      val[ob + i] = key_to_float((uint32_t)(e >> 32));
    } else {
      pos[ob + i] = -1;
      val[ob + i] = -INFINITY;
    }
  }
  if (tid == 0) count[blockIdx.x] = (int32_t)m;
}

}  // namespace

extern "C" int fp4idx_bench_topk_old_launch(const fp4idx_bench_old_row_t *rows, int32_t n_rows,
                                       int32_t k, int32_t *pos, float *val, int32_t *count,
                                       cudaStream_t stream) {
  if (k < 1 || k > kOldMaxK || n_rows < 0 || (n_rows && (!rows || !pos || !val || !count)))
    return FP4IDX_EINVAL;
  if (n_rows == 0) return FP4IDX_OK;
  topk_kernel<<<n_rows, kThreads, 0, stream>>>(rows, k, pos, val, count);
  return fp4idx__cuda_check(cudaGetLastError(), "topk: launch");
}
