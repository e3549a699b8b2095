/* topk_keys.cuh -- device helpers of the top-k paths: order-preserving
 * keys and (key, position) candidates (topk.cu, topk_cluster.cu,
 * topk_rowsort.cu), the histogram increments and the stable block sort of
 * the chunked path's finish (topk.cu) and of the row-sort path.
 *
 * Order (protocol/PROTOCOL.md, "score" with topk): logit descending, ties by
 * lower position. Logits map to 32-bit keys (negative: all bits flipped;
 * positive: sign bit set) so unsigned order is float order; -inf maps to
 * kInvisibleMax and NaN to 0, both never selected; -0 maps like +0.
 */
#ifndef FP4IDX_TOPK_KEYS_CUH
#define FP4IDX_TOPK_KEYS_CUH

#include <cub/block/block_radix_sort.cuh>
#include <math.h>
#include <stdint.h>

namespace fp4idx_topk {

constexpr uint32_t kInvisibleMax = 0x007FFFFFu;  // key of -inf

__device__ __forceinline__ uint32_t ord_key(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN: never selected
  if (u == 0x80000000u) u = 0u;                       // -0 ties +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (key << 32 | ~position): unsigned order is the output order.
__device__ __forceinline__ unsigned long long cand_of(uint32_t key, int64_t pos) {
  return ((unsigned long long)key << 32) | (0xFFFFFFFFu - (uint32_t)pos);
}
__device__ __forceinline__ int32_t cand_pos(unsigned long long c) {
  return (int32_t)(0xFFFFFFFFu - (uint32_t)c);
}

// One output row's padding past its n_out pairs (position -1, logit -inf)
// and its count, written by block `part` of the `parts` blocks of nt
// threads that share the row (part 0's thread 0 writes the count).
__device__ __forceinline__ void pad_row(int32_t *po, float *vo, int32_t *count, uint32_t n_out,
                                        int32_t k, int part, int parts, int nt) {
  for (int64_t i = (int64_t)n_out + (int64_t)part * nt + threadIdx.x; i < k;
       i += (int64_t)parts * nt) {
    po[i] = -1;
    vo[i] = -INFINITY;
  }
  if (part == 0 && threadIdx.x == 0) *count = (int32_t)n_out;
}

// Shared-memory histogram increment, one atomic per distinct bin in the warp
// (the candidates of a row share their leading bits: lanes collide a lot).
// Every lane of the warp must call it.
__device__ __forceinline__ void hist_add(uint32_t *h, uint32_t bin, bool on) {
  const unsigned act = __ballot_sync(0xffffffffu, on);
  if (!on) return;
  const unsigned peers = __match_any_sync(act, bin);
  if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&h[bin], (uint32_t)__popc(peers));
}

// Histogram increment by a whole warp (every lane calls it): one atomic
// when every active lane has the same bin (ties, dense logits), else one
// per lane. (hist_add above waits on __match_any_sync: the top stall of
// the cluster path's histograms in ncu.)
__device__ __forceinline__ void hist_inc(uint32_t *h, uint32_t bin, bool on) {
  const unsigned act = __ballot_sync(0xffffffffu, on);
  if (!act) return;
  const int first = __ffs(act) - 1;
  const uint32_t b0 = __shfl_sync(0xffffffffu, bin, first);
  if (__all_sync(0xffffffffu, !on || bin == b0)) {
    if ((int)(threadIdx.x & 31) == first) atomicAdd(&h[b0], (uint32_t)__popc(act));
  } else if (on) {
    atomicAdd(&h[bin], 1u);
  }
}

// Sorts the n_out candidates sel[] (position order among equal keys) of one
// row by an NT-thread block, descending and stable on key bits
// [begin_bit, end_bit), and writes pos/val [0, n_write) (n_write <= n_out).
// smem holds the CUB storage (it may alias sel: sel is read into registers
// first).
template <int NT, int IPT>
__device__ void sort_write(unsigned char *smem, const unsigned long long *sel, uint32_t n_out,
                           uint32_t n_write, int begin_bit, int end_bit, const float *logits,
                           int32_t *pos, float *val) {
  using Sort = cub::BlockRadixSort<uint32_t, NT, IPT, uint32_t>;
  uint32_t key[IPT], low[IPT];
#pragma unroll
  for (int j = 0; j < IPT; j++) {
    const uint32_t i = threadIdx.x * IPT + j;
    const unsigned long long c = i < n_out ? sel[i] : 0ull;
    key[j] = (uint32_t)(c >> 32);
    low[j] = (uint32_t)c;
  }
  __syncthreads();  // the storage overwrites sel
  if (end_bit > begin_bit)  // stable: equal keys stay in position order
    Sort(*reinterpret_cast<typename Sort::TempStorage *>(smem))
        .SortDescending(key, low, begin_bit, end_bit);
#pragma unroll
  for (int j = 0; j < IPT; j++) {
    const uint32_t i = threadIdx.x * IPT + j;
    if (i < n_write) {
      const int32_t p = (int32_t)(0xFFFFFFFFu - low[j]);
      pos[i] = p;
      val[i] = logits[p];
    }
  }
}

// The key bits that differ among the n candidates c[] (OR ^ AND of their
// keys; 0 for n <= 1), computed by the whole NT-thread block with *s_or and
// *s_and as shared scratch. Every thread of the block must call it.
template <int NT>
__device__ uint32_t key_diff(const unsigned long long *c, uint32_t n, uint32_t *s_or,
                             uint32_t *s_and) {
  __syncthreads();  // the scratch may still be read by an earlier call
  if (threadIdx.x == 0) {
    *s_or = 0;
    *s_and = 0xFFFFFFFFu;
  }
  __syncthreads();
  uint32_t kor = 0, kand = 0xFFFFFFFFu;
  for (uint32_t i = threadIdx.x; i < n; i += NT) {
    const uint32_t key = (uint32_t)(c[i] >> 32);
    kor |= key;
    kand &= key;
  }
  if (kor) atomicOr(s_or, kor);
  if (kand != 0xFFFFFFFFu) atomicAnd(s_and, kand);
  __syncthreads();
  return n > 1 ? *s_or ^ *s_and : 0u;
}

// sort_write of n_out <= 8 * NT candidates, sorting the bits set in diff,
// with the fewest items per thread that hold them; writes the first n_write.
template <int NT>
__device__ void sort_write_n(unsigned char *smem, const unsigned long long *sel, uint32_t n_out,
                             uint32_t n_write, uint32_t diff, const float *logits, int32_t *pos,
                             float *val) {
  const int b = diff ? __ffs(diff) - 1 : 0, e = diff ? 32 - __clz(diff) : 0;
  if (n_out <= NT) sort_write<NT, 1>(smem, sel, n_out, n_write, b, e, logits, pos, val);
  else if (n_out <= 2 * NT) sort_write<NT, 2>(smem, sel, n_out, n_write, b, e, logits, pos, val);
  else if (n_out <= 4 * NT) sort_write<NT, 4>(smem, sel, n_out, n_write, b, e, logits, pos, val);
  else sort_write<NT, 8>(smem, sel, n_out, n_write, b, e, logits, pos, val);
}

}  // namespace fp4idx_topk

#endif /* FP4IDX_TOPK_KEYS_CUH */
