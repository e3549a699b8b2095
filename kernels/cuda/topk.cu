/* topk.cu -- per-row top-k of scorer logits, every row spread over the GPU:
 * the planner (which picks this file's chunked path, the cluster path of
 * topk_cluster.cu or the row-sort path of topk_rowsort.cu from the shape),
 * the launcher and the chunked path.
 *
 * Order (protocol/PROTOCOL.md, "score" with topk): logit descending, ties by
 * lower position, only visible positions (-inf is invisible), fewer pairs
 * when fewer are visible, padding (-1, -inf).
 *
 * Logits map to order-preserving 32-bit keys (negative: all bits flipped;
 * positive: sign bit set), so unsigned order is float order. -inf maps to
 * kInvisibleMax and is never selected. NaN (any sign) maps to 0 and is never
 * selected either, as in the CPU backend; -0 maps like +0, so -0 and +0 tie
 * and the lower position wins, as the CPU's float compare does. The value
 * written out is the logit read back at the chosen position (bit-exact).
 *
 * The row-sort path (topk_rowsort.cu) takes batches of (SMs / 4, SMs] rows
 * up to FP4IDX_CUDA_TOPK_ROWSORT_WIDTH, the cluster path the other shapes
 * that fit it; the chunked path takes what neither can (k > 4096, rows
 * wider than FP4IDX_CUDA_TOPK_CLUSTER_WIDTH, devices before sm_90).
 * Rows are cut into chunks of plan.chunk_len positions; one 256-thread block
 * per chunk, all rows of the batch in one grid:
 *   1. hist_kernel: a 4096-bin histogram of the top 12 key bits per row
 *      (shared memory per block, global atomics into the row's histogram);
 *   2. compact_kernel: each block finds from the row's histogram the bin lo
 *      of the k-th largest key (or bin 0 when at most k are visible); its
 *      keys in bin lo or above, as (key << 32 | ~position), are the row's
 *      candidates. k <= FP4IDX_CUDA_TOPK_SMEM_K and no bin >= lo holding
 *      more than plan.bucket_cap keys (decided per row from the histogram, the
 *      same in every block): each candidate goes to its bin's bucket of the
 *      row's area (bins descending, slots by a global cursor per bin, any
 *      order inside a bucket), and
 *   3. rank_kernel, many blocks per row, gives every candidate its output
 *      index by counting: the keys of the higher bins plus the larger keys
 *      of its own bucket (keys with positions are distinct, so this is the
 *      exact order); no sort. Other rows (a big bin: ties, dense logits):
 *      the block's candidates go to its chunk's area in position order,
 *      with its count, and
 *   3a. k <= FP4IDX_CUDA_TOPK_SMEM_K: finish_kernel, one block per row:
 *      gathers the row's candidates in position order (shared memory when
 *      they fit, else read in place), a radix select finds the k-th key T
 *      and keeps every key > T and the first keys == T by position, then a
 *      stable CUB block radix sort (descending, only the key bits that
 *      differ) gives the order;
 *   3b. larger k: every chunk area is zero-filled past its count, CUB's
 *      segmented radix sort orders each row's area (the position is in the
 *      key, so keys are distinct), write_kernel emits the first k.
 * No host synchronization: sizes come from fp4idx_cuda_topk_plan, so the
 * whole launch can be captured in a CUDA graph.
 */
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <atomic>
#include <limits.h>
#include <string.h>

#include "fp4idx_cuda.h"
#include "topk_keys.cuh"

namespace {

using namespace fp4idx_topk;

constexpr int kBins = 4096, kBinShift = 20;  // top 12 bits of the key
constexpr int kCT = 256, kCI = 8, kTile = kCT * kCI;
constexpr int kMaxChunks = 2048;  // chunks of one row (finish keeps their offsets in smem)
constexpr int kFT = 1024, kFI = 8, kCap = FP4IDX_CUDA_TOPK_SMEM_K;
static_assert(kCap == kFT * kFI, "the block sort holds kCap items");
static_assert(sizeof(cub::BlockRadixSort<uint32_t, kFT, kFI, uint32_t>::TempStorage) <=
                  2 * kCap * sizeof(unsigned long long),
              "sort storage aliases the candidate arrays");
// Counting-rank finish (rank_kernel): a bucket (the candidates of one
// level-1 bin) holds at most plan.bucket_cap <= kBucketMax keys (the cost
// grows with the squared bucket sizes: the cap is smaller for batches of
// many rows); a block ranks kRC candidates, kRJ per thread, the range it
// compares them with split over kRS threads.
constexpr int kBucketMax = 4096, kRT = 256, kRJ = 4, kRS = kRT * kRJ / 64, kRC = 64;
constexpr int kStage = 2048;  // candidates rank_kernel stages in shared memory at a time
constexpr int kBucketFewRows = 32;  // batches up to this many rows take kBucketMax
static_assert(kRT / kRS * kRJ == kRC, "threads x candidates cover the tile");

// Per-row state written by the row's first compact block: the bin of the
// k-th key, the candidate count (keys in bins >= lo) and whether the row's
// candidates were laid out in buckets for rank_kernel (else finish_kernel).
struct RowInfo {
  uint32_t lo, n_cand, bucketed, pad;
};

__device__ __forceinline__ int pad(int i) { return i + (i >> 5); }

// The row owning global chunk `chunk`: the last row with chunk0 <= chunk
// (rows without chunks share the next row's chunk0 and are skipped).
__device__ int find_row(const fp4idx_cuda_topk_row_t *rows, int n_rows, int64_t chunk) {
  int lo = 0, hi = n_rows - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (rows[mid].chunk0 <= chunk) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The keys of tile [t0, t0 + kTile) of a row (0 past e), thread t holding
// positions t0 + j * kCT + t: every load is issued before the first use
// (one dependent load after another was the histogram's cost on the H200).
__device__ __forceinline__ void load_tile(const float *x, int64_t t0, int64_t e,
                                          uint32_t (&key)[kCI]) {
  float f[kCI];
#pragma unroll
  for (int j = 0; j < kCI; j++) {
    const int64_t i = t0 + j * kCT + threadIdx.x;
    f[j] = i < e ? __ldg(x + i) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kCI; j++) key[j] = t0 + j * kCT + threadIdx.x < e ? ord_key(f[j]) : 0u;
}

__global__ void __launch_bounds__(kCT)
    hist_kernel(const fp4idx_cuda_topk_row_t *rows, int n_rows, int64_t chunk_len,
                uint32_t *hist, int *seg_begin, int *seg_end) {
  __shared__ uint32_t h[kBins];
  const int r = find_row(rows, n_rows, blockIdx.x);
  const fp4idx_cuda_topk_row_t row = rows[r];
  const int64_t b = ((int64_t)blockIdx.x - row.chunk0) * chunk_len;
  const int64_t e = b + chunk_len < row.width ? b + chunk_len : row.width;
  if (seg_begin && b == 0 && threadIdx.x == 0) {  // segments of the large-k sort
    const int64_t nch = (row.width + chunk_len - 1) / chunk_len;
    seg_begin[r] = (int)(row.chunk0 * chunk_len);
    seg_end[r] = (int)((row.chunk0 + nch) * chunk_len);
  }
  for (int i = threadIdx.x; i < kBins; i += kCT) h[i] = 0;
  __syncthreads();
  const float *x = row.logits;
  for (int64_t t0 = b; t0 < e; t0 += kTile) {  // uniform trip count: whole warps
    uint32_t key[kCI];
    load_tile(x, t0, e, key);
#pragma unroll
    for (int j = 0; j < kCI; j++) hist_add(h, key[j] >> kBinShift, key[j] > kInvisibleMax);
  }
  __syncthreads();
  uint32_t *g = hist + (size_t)r * kBins;
  for (int i = threadIdx.x; i < kBins; i += kCT)
    if (h[i]) atomicAdd(&g[i], h[i]);
}

__global__ void __launch_bounds__(kCT)
    compact_kernel(const fp4idx_cuda_topk_row_t *rows, int n_rows, int64_t chunk_len, int32_t k,
                   const uint32_t *hist, uint32_t *ccount, unsigned long long *cand,
                   int zero_fill, RowInfo *info, uint32_t *cursor, uint32_t *bucket,
                   uint32_t bucket_cap) {
  using Scan = cub::BlockScan<uint32_t, kCT>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ uint32_t s_lo, s_n, s_max;
  // The row's histogram, then the first slot of each bin's bucket; index
  // pad(bin) (one word of padding per 32) so that thread t reading its bins
  // [t * PT, (t + 1) * PT) hits 32 distinct banks.
  __shared__ uint32_t s_h[kBins + kBins / 32];
  const int tid = threadIdx.x;
  const int r = find_row(rows, n_rows, blockIdx.x);
  const fp4idx_cuda_topk_row_t row = rows[r];

  // The bin holding the k-th largest key: thread t holds the PT bins
  // [t * PT, (t + 1) * PT); `above` counts the keys in the bins above them.
  // The histogram is read coalesced into shared memory first: each thread
  // reading its own bins from global memory costs 16 sectors a warp-load,
  // which makes this kernel 2.4x slower at 4 x 400,000 with 4096 bins.
  constexpr int PT = kBins / kCT;
  const uint32_t *g = hist + (size_t)r * kBins;
  for (int i = tid; i < kBins; i += kCT) s_h[pad(i)] = g[i];
  __syncthreads();
  uint32_t v[PT], mine = 0, below = 0, total = 0;
#pragma unroll
  for (int j = 0; j < PT; j++) mine += v[j] = s_h[pad(tid * PT + j)];
  Scan(scan).ExclusiveSum(mine, below, total);
  const uint32_t above = total - below - mine;
  if (tid == 0) {
    s_max = 0;
    if (total <= (uint32_t)k) {  // every visible key is a candidate
      s_lo = 0;
      s_n = total;
    }
  }
  if (total > (uint32_t)k && above < (uint32_t)k && above + mine >= (uint32_t)k) {
    uint32_t c = above;
    for (int j = PT - 1; j >= 0; j--) {  // bins descending
      if (c + v[j] >= (uint32_t)k) {
        s_lo = (uint32_t)(tid * PT + j);
        s_n = c + v[j];
        break;
      }
      c += v[j];
    }
  }
  __syncthreads();
  const uint32_t lo = s_lo;

  // The candidates (bins >= lo) as buckets, bins descending from slot 0:
  // bin b's keys take slots [base(b), base(b) + hist[b]). The row takes
  // that layout (and rank_kernel's finish) when no bucket exceeds
  // bucket_cap keys, so counting ranks inside a bucket stays cheap.
  {
    uint32_t at = above, m = 0;
#pragma unroll
    for (int j = PT - 1; j >= 0; j--) {  // only this thread reads these words
      const uint32_t bin = (uint32_t)(tid * PT + j);
      s_h[pad((int)bin)] = at;
      at += v[j];
      if (bin >= lo && v[j] > m) m = v[j];
    }
    if (m) atomicMax(&s_max, m);
  }
  __syncthreads();
  const bool bucketed = !zero_fill && s_max <= bucket_cap;

  const int64_t b = ((int64_t)blockIdx.x - row.chunk0) * chunk_len;
  const int64_t e = b + chunk_len < row.width ? b + chunk_len : row.width;
  if (b == 0 && info) {  // the row's first chunk publishes the row's state
    uint32_t *gb = bucket + (size_t)r * kBins;
    for (int i = tid; i < kBins; i += kCT) gb[i] = s_h[pad(i)];
    if (tid == 0) info[r] = RowInfo{lo, s_n, bucketed ? 1u : 0u, 0u};
  }
  if (bucketed) {  // each key to its bucket; the order inside a bucket is free
    uint32_t *cur = cursor + (size_t)r * kBins;
    unsigned long long *row_out = cand + (size_t)row.chunk0 * (size_t)chunk_len;
    const int lane = tid & 31;
    for (int64_t t0 = b; t0 < e; t0 += kTile) {
      uint32_t key[kCI];
      load_tile(row.logits, t0, e, key);
#pragma unroll
      for (int j = 0; j < kCI; j++) {
        const uint32_t bin = key[j] >> kBinShift;
        const bool on = key[j] > kInvisibleMax && bin >= lo;
        if (!__ballot_sync(0xffffffffu, on)) continue;  // warp-uniform
        // One atomic per distinct bin in the warp (off lanes share bin kBins).
        const unsigned peers = __match_any_sync(0xffffffffu, on ? bin : (uint32_t)kBins);
        const int leader = __ffs(peers) - 1;
        uint32_t got = 0;
        if (on && lane == leader) got = atomicAdd(&cur[bin], (uint32_t)__popc(peers));
        got = __shfl_sync(0xffffffffu, got, leader);
        if (on)
          row_out[s_h[pad((int)bin)] + got + (uint32_t)__popc(peers & ((1u << lane) - 1u))] =
              cand_of(key[j], t0 + j * kCT + tid);
      }
    }
    return;
  }
  // Else the keys in bin >= lo in position order, in the chunk's own area
  // (blocked: thread t owns 8 in a row), for finish_kernel or the large-k sort.
  unsigned long long *out = cand + (size_t)blockIdx.x * (size_t)chunk_len;
  uint32_t base = 0;
  for (int64_t t0 = b; t0 < e; t0 += kTile) {
    uint32_t key[kCI], n = 0;
#pragma unroll
    for (int j = 0; j < kCI; j++) {
      const int64_t i = t0 + tid * kCI + j;
      key[j] = i < e ? ord_key(row.logits[i]) : 0u;
      if (key[j] <= kInvisibleMax || (key[j] >> kBinShift) < lo) key[j] = 0;
      n += key[j] != 0;
    }
    uint32_t at, tile_n;
    __syncthreads();  // scan storage reuse
    Scan(scan).ExclusiveSum(n, at, tile_n);
#pragma unroll
    for (int j = 0; j < kCI; j++)
      if (key[j]) out[base + at++] = cand_of(key[j], t0 + tid * kCI + j);
    base += tile_n;
  }
  if (tid == 0) ccount[blockIdx.x] = base;
  if (zero_fill)  // the large-k sort reads whole areas: 0 sorts last
    for (int64_t i = base + tid; i < chunk_len; i += kCT) out[i] = 0ull;
}

// Warp 0 finds, in a 256-bin histogram, the digit d where the count of
// digits above d is < rem <= the count of digits >= d; *s_rem becomes rem
// minus the count above d.
__device__ void find_digit(const uint32_t *h, uint32_t rem, uint32_t *s_digit, uint32_t *s_rem) {
  const int lane = threadIdx.x & 31;
  uint32_t v[8], mine = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) mine += v[j] = h[255 - (lane * 8 + j)];
  uint32_t incl = mine;
  for (int d = 1; d < 32; d <<= 1) {
    const uint32_t o = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += o;
  }
  const uint32_t excl = incl - mine;
  if (excl < rem && incl >= rem) {
    uint32_t c = excl;
    for (int j = 0; j < 8; j++) {
      if (c + v[j] >= rem) {
        *s_digit = (uint32_t)(255 - (lane * 8 + j));
        *s_rem = rem - c;
        break;
      }
      c += v[j];
    }
  }
}

struct FinishSmem {
  uint32_t off[kMaxChunks + 1];  // candidate offset of each chunk of the row
  uint32_t hist[256];
  uint32_t digit, rem, kor, kand;
};

// Candidate i of the row in position order: shared memory when they fit,
// else a binary search over the chunk offsets and a read in place.
struct Cands {
  const unsigned long long *sm;  // gathered, or nullptr
  const unsigned long long *g;   // the row's first chunk area
  const uint32_t *off;
  int nch;
  int64_t chunk_len;
  __device__ unsigned long long operator()(uint32_t i) const {
    if (sm) return sm[i];
    int lo = 0, hi = nch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (off[mid] <= i) lo = mid;
      else hi = mid - 1;
    }
    return g[(size_t)lo * (size_t)chunk_len + (i - off[lo])];
  }
};

__global__ void __launch_bounds__(kFT)
    finish_kernel(const fp4idx_cuda_topk_row_t *rows, int64_t chunk_len, int32_t k,
                  const uint32_t *ccount, const unsigned long long *cand, int32_t *pos,
                  float *val, int32_t *count, const RowInfo *info) {
  if (info[blockIdx.x].bucketed) return;  // rank_kernel's row
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned long long *A = reinterpret_cast<unsigned long long *>(smem);  // [kCap] gathered
  unsigned long long *B = A + kCap;                                      // [kCap] selected
  FinishSmem &s = *reinterpret_cast<FinishSmem *>(B + kCap);
  using Scan = cub::BlockScan<uint32_t, kFT>;
  __shared__ typename Scan::TempStorage scan;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const fp4idx_cuda_topk_row_t row = rows[blockIdx.x];
  const int nch = (int)((row.width + chunk_len - 1) / chunk_len);
  const unsigned long long *g = cand + (size_t)row.chunk0 * (size_t)chunk_len;
  const uint32_t *cc = ccount + row.chunk0;
  int32_t *po = pos + (size_t)blockIdx.x * (size_t)k;
  float *vo = val + (size_t)blockIdx.x * (size_t)k;

  // Chunk offsets (exclusive scan of the counts).
  uint32_t C = 0;
  for (int c0 = 0; c0 < nch; c0 += kFT) {
    const uint32_t n = c0 + tid < nch ? cc[c0 + tid] : 0u;
    uint32_t at, tot;
    Scan(scan).ExclusiveSum(n, at, tot);
    if (c0 + tid < nch) s.off[c0 + tid] = C + at;
    C += tot;
    __syncthreads();
  }
  if (tid == 0) s.off[nch] = C;
  __syncthreads();
  const uint32_t n_out = C < (uint32_t)k ? C : (uint32_t)k;
  const bool fits = C <= (uint32_t)kCap;
  if (fits)  // one warp per chunk: the candidates in position order
    for (int c = warp; c < nch; c += kFT / 32)
      for (uint32_t i = lane; i < s.off[c + 1] - s.off[c]; i += 32)
        A[s.off[c] + i] = g[(size_t)c * (size_t)chunk_len + i];
  __syncthreads();
  const Cands at{fits ? A : nullptr, g, s.off, nch, chunk_len};

  // Key bits that differ among the candidates: only those need a pass.
  if (tid == 0) { s.kor = 0; s.kand = 0xFFFFFFFFu; }
  __syncthreads();
  {
    uint32_t kor = 0, kand = 0xFFFFFFFFu;
    for (uint32_t i = tid; i < C; i += kFT) {
      const uint32_t key = (uint32_t)(at(i) >> 32);
      kor |= key;
      kand &= key;
    }
    if (kor) atomicOr(&s.kor, kor);
    if (kand != 0xFFFFFFFFu) atomicAnd(&s.kand, kand);
  }
  __syncthreads();
  const uint32_t all_or = s.kor, all_and = s.kand;
  const unsigned long long *sel = A;
  if (C > (uint32_t)k) {
    // Radix select of the k-th key T (8 bits a pass, digits that differ) ...
    uint32_t prefix = 0, pmask = 0, rem = (uint32_t)k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      if ((((all_or ^ all_and) >> shift) & 255u) == 0) {  // one digit for all: T has it
        prefix |= all_and & (255u << shift);
        pmask |= 255u << shift;
        continue;
      }
      for (int i = tid; i < 256; i += kFT) s.hist[i] = 0;
      __syncthreads();
      for (uint32_t i0 = 0; i0 < C; i0 += kFT) {
        const uint32_t i = i0 + tid;
        const uint32_t key = i < C ? (uint32_t)(at(i) >> 32) : 0u;
        hist_add(s.hist, (key >> shift) & 255u, i < C && (key & pmask) == prefix);
      }
      __syncthreads();
      if (warp == 0) find_digit(s.hist, rem, &s.digit, &s.rem);
      __syncthreads();
      prefix |= s.digit << shift;
      pmask |= 255u << shift;
      rem = s.rem;
      __syncthreads();
    }
    // ... then keys > T and the first `rem` keys == T, in position order.
    uint32_t eq_base = 0, out_base = 0;
    for (uint32_t t0 = 0; t0 < C; t0 += kCap) {
      unsigned long long c[kFI];
      uint32_t neq = 0;
#pragma unroll
      for (int j = 0; j < kFI; j++) {
        const uint32_t i = t0 + tid * kFI + j;
        c[j] = i < C ? at(i) : 0ull;
        neq += (uint32_t)(c[j] >> 32) == prefix && i < C;
      }
      uint32_t eq_at, eq_tot;
      Scan(scan).ExclusiveSum(neq, eq_at, eq_tot);
      eq_at += eq_base;
      uint32_t nsel = 0;
      bool take[kFI];
#pragma unroll
      for (int j = 0; j < kFI; j++) {
        const uint32_t key = (uint32_t)(c[j] >> 32);
        const bool eq = key == prefix && t0 + tid * kFI + j < C;
        take[j] = key > prefix || (eq && eq_at < rem);
        eq_at += eq;
        nsel += take[j];
      }
      uint32_t o_at, o_tot;
      __syncthreads();
      Scan(scan).ExclusiveSum(nsel, o_at, o_tot);
      o_at += out_base;
#pragma unroll
      for (int j = 0; j < kFI; j++)
        if (take[j]) B[o_at++] = c[j];
      eq_base += eq_tot;
      out_base += o_tot;
      __syncthreads();
    }
    sel = B;
  }
  // Sort only the key bits that differ among the selected.
  uint32_t diff = all_or ^ all_and;
  if (C > (uint32_t)k) diff = key_diff<kFT>(sel, n_out, &s.kor, &s.kand);
  if (n_out <= 1) diff = 0;
  sort_write_n<kFT>(smem, sel, n_out, n_out, diff, row.logits, po, vo);
  pad_row(po, vo, count + blockIdx.x, n_out, k, 0, 1, kFT);
}

// The counting-rank finish of the bucketed rows: block p of row r ranks the
// row's candidates [p * kRC, (p + 1) * kRC). Keys with their positions are
// distinct, so a candidate's output index is exactly the number of
// candidates ordered before it. The buckets run bins descending, so every
// candidate before the first slot U0 of the tile's first bucket is larger
// than the tile's candidates and every one past the end U1 of its last
// bucket smaller: rank = U0 + the larger ones in [U0, U1), a range of at
// most two buckets and the tile (<= 2 * bucket_cap + kRC). That range is
// staged through shared memory; kRS threads split it and hold kRJ
// candidates each. Only a few dependent loads per block (ncu measured 7.5
// us for a loop over the tile's buckets, three dependent loads each).
// Ranks >= k are dropped. Blocks past the row's candidates write padding.
__global__ void __launch_bounds__(kRT)
    rank_kernel(const fp4idx_cuda_topk_row_t *rows, int rank_blocks, int64_t chunk_len, int32_t k,
                const RowInfo *info, const uint32_t *hist, const uint32_t *bucket,
                const unsigned long long *cand, int32_t *pos, float *val, int32_t *count) {
  __shared__ unsigned long long sm[kStage];
  __shared__ uint32_t cnt[kRC];
  const int tid = threadIdx.x;
  const int r = (int)(blockIdx.x / (unsigned)rank_blocks), p = (int)(blockIdx.x % (unsigned)rank_blocks);
  const RowInfo in = info[r];
  if (!in.bucketed) return;  // finish_kernel's row
  const fp4idx_cuda_topk_row_t row = rows[r];
  const uint32_t C = in.n_cand, n_out = C < (uint32_t)k ? C : (uint32_t)k;
  int32_t *po = pos + (size_t)r * (size_t)k;
  float *vo = val + (size_t)r * (size_t)k;
  pad_row(po, vo, count + r, n_out, k, p, rank_blocks, kRT);
  const uint32_t a = (uint32_t)p * kRC;
  if (a >= C) return;
  const uint32_t te = a + kRC < C ? a + kRC : C;
  const unsigned long long *base = cand + (size_t)row.chunk0 * (size_t)chunk_len;
  const uint32_t *h = hist + (size_t)r * kBins, *bb = bucket + (size_t)r * kBins;
  const int g = tid % (kRT / kRS), sp = tid / (kRT / kRS);  // candidate group, range split
  unsigned long long c[kRJ];
  uint32_t n[kRJ];
#pragma unroll
  for (int q = 0; q < kRJ; q++) {
    const uint32_t i = a + g * kRJ + q;
    c[q] = i < te ? base[i] : ~0ull;  // past the tile: counts nothing
    n[q] = 0;
  }
  if (tid < kRC) cnt[tid] = 0;
  const uint32_t b_hi = (uint32_t)(base[a] >> (32 + kBinShift));
  const uint32_t b_lo = (uint32_t)(base[te - 1] >> (32 + kBinShift));
  const uint32_t U0 = bb[b_hi], U1 = bb[b_lo] + h[b_lo];
  for (uint32_t u0 = U0; u0 < U1; u0 += kStage) {
    const uint32_t m = U1 - u0 < (uint32_t)kStage ? U1 - u0 : (uint32_t)kStage;
    __syncthreads();  // the previous stage is no longer read
    for (uint32_t j = tid; j < m; j += kRT) sm[j] = base[u0 + j];
    __syncthreads();
    for (uint32_t j = sp; j < m; j += kRS) {
      const unsigned long long o = sm[j];
#pragma unroll
      for (int q = 0; q < kRJ; q++) n[q] += o > c[q];
    }
  }
#pragma unroll
  for (int q = 0; q < kRJ; q++)
    if (n[q]) atomicAdd(&cnt[g * kRJ + q], n[q]);
  __syncthreads();
  if (a + tid < te) {
    const uint32_t rank = U0 + cnt[tid];
    if (rank < (uint32_t)k) {
      const int32_t ps = cand_pos(base[a + tid]);
      po[rank] = ps;
      vo[rank] = row.logits[ps];
    }
  }
}

// Large k: the first k of each sorted row area (zeros mark the end).
__global__ void write_kernel(const fp4idx_cuda_topk_row_t *rows, int64_t chunk_len, int32_t k,
                             const unsigned long long *sorted, int32_t *pos, float *val,
                             int32_t *count) {
  const int64_t per_row = (k + 255) / 256;
  const int r = (int)(blockIdx.x / per_row);
  const fp4idx_cuda_topk_row_t row = rows[r];
  const unsigned long long *g = sorted + (size_t)row.chunk0 * (size_t)chunk_len;
  const int64_t cap = (row.width + chunk_len - 1) / chunk_len * chunk_len;
  const int64_t i = (int64_t)(blockIdx.x % per_row) * 256 + threadIdx.x;
  if (i >= k) return;
  const unsigned long long c = i < cap ? g[i] : 0ull;
  const size_t o = (size_t)r * (size_t)k + (size_t)i;
  pos[o] = c ? cand_pos(c) : -1;
  val[o] = c ? row.logits[cand_pos(c)] : -INFINITY;
  // count: the first zero (or the end) -- exactly one thread sees the edge.
  const unsigned long long next = i + 1 < cap && i + 1 < k ? g[i + 1] : 0ull;
  if (i == 0 && !c) count[r] = 0;
  if (c && !next) count[r] = (int32_t)(i + 1);
}

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

// finish_kernel's dynamic shared memory limit, raised once per device (a
// cudaFuncSetAttribute per launch is one more host call on the request path).
constexpr size_t kFinishSmem = 2 * kCap * sizeof(unsigned long long) + sizeof(FinishSmem);
std::atomic<int> g_finish_ready[64];

int finish_smem_once() {
  int dev = 0;
  int rc = fp4idx__cuda_check(cudaGetDevice(&dev), "topk: device");
  if (rc) return rc;
  if (dev >= 0 && dev < 64 && g_finish_ready[dev].load(std::memory_order_acquire)) return FP4IDX_OK;
  rc = fp4idx__cuda_check(cudaFuncSetAttribute(finish_kernel,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)kFinishSmem),
                          "topk: shared memory");
  if (!rc && dev >= 0 && dev < 64) g_finish_ready[dev].store(1, std::memory_order_release);
  return rc;
}

}  // namespace

extern "C" int fp4idx_cuda_topk_plan(fp4idx_cuda_topk_row_t *rows, int32_t n_rows, int32_t k,
                                     fp4idx_cuda_topk_plan_t *p) {
  return fp4idx_cuda_topk_plan_path(rows, n_rows, k, FP4IDX_CUDA_TOPK_AUTO, p);
}

extern "C" int fp4idx_cuda_topk_plan_path(fp4idx_cuda_topk_row_t *rows, int32_t n_rows, int32_t k,
                                          fp4idx_cuda_topk_path_t path,
                                          fp4idx_cuda_topk_plan_t *p) {
  if (!p || n_rows < 0 || (n_rows && !rows) || k < 1 || k > FP4IDX_CUDA_TOPK_MAX ||
      (path != FP4IDX_CUDA_TOPK_AUTO && path != FP4IDX_CUDA_TOPK_CHUNKED &&
       path != FP4IDX_CUDA_TOPK_CLUSTER && path != FP4IDX_CUDA_TOPK_ROWSORT))
    return FP4IDX_EINVAL;
  memset(p, 0, sizeof *p);
  int64_t max_w = 0;
  for (int32_t i = 0; i < n_rows; i++) {
    if (rows[i].width < 0 || rows[i].width > INT32_MAX) return FP4IDX_EINVAL;
    if (rows[i].width > max_w) max_w = rows[i].width;
  }
  p->n_rows = n_rows;
  p->k = k;
  // The row-sort path for rows up to FP4IDX_CUDA_TOPK_ROWSORT_WIDTH (sm_90+,
  // k <= 4096) in batches of (SMs / 4, SMs] rows: one block per row, no
  // cluster barriers and no counting rank.
  if (path == FP4IDX_CUDA_TOPK_AUTO || path == FP4IDX_CUDA_TOPK_ROWSORT) {
    const int rc =
        fp4idx__cuda_topk_rowsort_plan(rows, n_rows, k, path == FP4IDX_CUDA_TOPK_AUTO, p);
    if (rc == FP4IDX_OK) {
      for (int32_t i = 0; i < n_rows; i++) rows[i].chunk0 = 0;  // unused by the row sort
      return FP4IDX_OK;
    }
    if (path == FP4IDX_CUDA_TOPK_ROWSORT) return rc;
  }
  // The cluster path wherever it fits (sm_90+, k <= 4096, rows up to
  // FP4IDX_CUDA_TOPK_CLUSTER_WIDTH): one kernel node, faster than the
  // chunked path on every shape of docs/RESULTS.md's top-k table.
  if (path == FP4IDX_CUDA_TOPK_AUTO || path == FP4IDX_CUDA_TOPK_CLUSTER) {
    const int rc = fp4idx__cuda_topk_cluster_plan(rows, n_rows, k, 16, p);
    if (rc == FP4IDX_OK) {
      for (int32_t i = 0; i < n_rows; i++) rows[i].chunk0 = 0;  // unused by the cluster path
      return FP4IDX_OK;
    }
    if (path == FP4IDX_CUDA_TOPK_CLUSTER) return rc;
  }
  // Chunks of whole tiles; at most kMaxChunks of them in one row.
  const int64_t span = (int64_t)kTile * kMaxChunks;
  const int64_t chunk_len = (int64_t)kTile * ((max_w + span - 1) / span > 0 ? (max_w + span - 1) / span : 1);
  int64_t total = 0;
  for (int32_t i = 0; i < n_rows; i++) {
    rows[i].chunk0 = total;
    total += (rows[i].width + chunk_len - 1) / chunk_len;
  }
  p->chunk_len = chunk_len;
  p->total_chunks = total;
  p->large_k = k > FP4IDX_CUDA_TOPK_SMEM_K;
  const size_t cand_n = (size_t)total * (size_t)chunk_len;
  if (total > INT_MAX || (p->large_k && cand_n > (size_t)INT_MAX)) return FP4IDX_E2BIG;
  size_t off = 0;
  p->o_hist = off; off = align256(off + (size_t)n_rows * kBins * 4);
  if (p->large_k) {  // zeroed too: a row without chunks is an empty segment
    p->o_seg = off; off = align256(off + (size_t)n_rows * 8);
  } else {  // zeroed too: a row without chunks is finish_kernel's (not bucketed)
    p->o_info = off; off = align256(off + (size_t)n_rows * sizeof(RowInfo));
    p->o_cursor = off; off = align256(off + (size_t)n_rows * kBins * 4);
  }
  p->memset_bytes = off;
  if (!p->large_k) {
    p->o_bucket = off; off = align256(off + (size_t)n_rows * kBins * 4);
    p->bucket_cap = n_rows <= kBucketFewRows ? kBucketMax : kBucketMax / 2;
    // A bucketed row has < k + bucket_cap candidates, and at most its width.
    const int64_t most = max_w < (int64_t)k + p->bucket_cap ? max_w : (int64_t)k + p->bucket_cap;
    p->rank_blocks = (int32_t)(most > 0 ? (most + kRC - 1) / kRC : 1);
    if ((int64_t)p->rank_blocks * n_rows > INT_MAX) return FP4IDX_E2BIG;
  }
  p->o_ccount = off; off = align256(off + (size_t)total * 4);
  p->o_cand = off; off = align256(off + cand_n * 8);
  if (p->large_k) {
    p->o_sorted = off; off = align256(off + cand_n * 8);
    size_t tmp = 0;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortKeysDescending(
        nullptr, tmp, (const unsigned long long *)nullptr, (unsigned long long *)nullptr,
        (int)cand_n, n_rows, (const int *)nullptr, (const int *)nullptr);
    if (e != cudaSuccess) return fp4idx__cuda_check(e, "topk: sort size");
    p->o_cub = off; off = align256(off + tmp);
    p->cub_bytes = tmp;
  }
  p->ws_bytes = off;
  return FP4IDX_OK;
}

extern "C" int fp4idx_cuda_topk_describe(const fp4idx_cuda_topk_plan_t *p,
                                         const fp4idx_cuda_topk_row_t *rows, int32_t *pos,
                                         float *val, int32_t *count, fp4idx_cuda_launch_t *l) {
  if (!l) return FP4IDX_EINVAL;
  memset(l, 0, sizeof *l);
  if (!p || p->n_rows < 1 || p->k < 1 || p->k > FP4IDX_CUDA_TOPK_MAX || !rows || !pos || !val ||
      !count)
    return FP4IDX_EINVAL;
  if (p->rowsort) return fp4idx__cuda_topk_rowsort_describe(p, rows, pos, val, count, l);
  if (!p->cluster) return FP4IDX_ENODEV;
  return fp4idx__cuda_topk_cluster_describe(p, rows, pos, val, count, l);
}

extern "C" int fp4idx_cuda_topk_launch(const fp4idx_cuda_topk_plan_t *p,
                                       const fp4idx_cuda_topk_row_t *rows, void *ws,
                                       int32_t *pos, float *val, int32_t *count,
                                       cudaStream_t stream) {
  if (!p || p->n_rows < 0 || p->k < 1 || p->k > FP4IDX_CUDA_TOPK_MAX ||
      (p->n_rows && (!rows || !ws || !pos || !val || !count)))
    return FP4IDX_EINVAL;
  if (p->n_rows == 0) return FP4IDX_OK;
  int rc;
  if (p->rowsort || p->cluster) {
    fp4idx_cuda_launch_t l;
    rc = p->rowsort ? fp4idx__cuda_topk_rowsort_describe(p, rows, pos, val, count, &l)
                    : fp4idx__cuda_topk_cluster_describe(p, rows, pos, val, count, &l);
    return rc ? rc : fp4idx_cuda_launch_run(&l, stream);
  }
  uint8_t *w = (uint8_t *)ws;
  uint32_t *hist = (uint32_t *)(w + p->o_hist), *ccount = (uint32_t *)(w + p->o_ccount);
  unsigned long long *cand = (unsigned long long *)(w + p->o_cand);
  int *seg = p->large_k ? (int *)(w + p->o_seg) : nullptr;
  RowInfo *info = p->large_k ? nullptr : (RowInfo *)(w + p->o_info);
  uint32_t *bucket = p->large_k ? nullptr : (uint32_t *)(w + p->o_bucket);
  if ((rc = fp4idx__cuda_check(cudaMemsetAsync(w, 0, p->memset_bytes, stream), "topk: zero")))
    return rc;
  if (p->total_chunks > 0) {
    hist_kernel<<<(unsigned)p->total_chunks, kCT, 0, stream>>>(
        rows, p->n_rows, p->chunk_len, hist, seg, seg ? seg + p->n_rows : nullptr);
    if ((rc = fp4idx__cuda_check(cudaGetLastError(), "topk: histogram"))) return rc;
    compact_kernel<<<(unsigned)p->total_chunks, kCT, 0, stream>>>(
        rows, p->n_rows, p->chunk_len, p->k, hist, ccount, cand, p->large_k, info,
        info ? (uint32_t *)(w + p->o_cursor) : nullptr, bucket, (uint32_t)p->bucket_cap);
    if ((rc = fp4idx__cuda_check(cudaGetLastError(), "topk: compact"))) return rc;
  }
  if (!p->large_k) {
    if (p->rank_blocks < 1 || (int64_t)p->rank_blocks * p->n_rows > INT_MAX ||
        p->bucket_cap < 0 || p->bucket_cap > kBucketMax)
      return FP4IDX_EINVAL;
    rank_kernel<<<(unsigned)((int64_t)p->rank_blocks * p->n_rows), kRT, 0, stream>>>(
        rows, p->rank_blocks, p->chunk_len, p->k, info, hist, bucket, cand, pos, val, count);
    if ((rc = fp4idx__cuda_check(cudaGetLastError(), "topk: rank"))) return rc;
    const size_t sm = kFinishSmem;
    if ((rc = finish_smem_once())) return rc;
    finish_kernel<<<p->n_rows, kFT, sm, stream>>>(rows, p->chunk_len, p->k, ccount, cand, pos,
                                                  val, count, info);
    return fp4idx__cuda_check(cudaGetLastError(), "topk: finish");
  }
  unsigned long long *sorted = (unsigned long long *)(w + p->o_sorted);
  const size_t cand_n = (size_t)p->total_chunks * (size_t)p->chunk_len;
  if (cand_n) {
    size_t tmp = p->cub_bytes;
    if ((rc = fp4idx__cuda_check(cub::DeviceSegmentedRadixSort::SortKeysDescending(
                                     w + p->o_cub, tmp, cand, sorted, (int)cand_n, p->n_rows, seg,
                                     seg + p->n_rows, 0, 64, stream),
                                 "topk: segmented sort")))
      return rc;
  }
  const int64_t blocks = (int64_t)((p->k + 255) / 256) * p->n_rows;
  if (blocks > INT_MAX) return FP4IDX_E2BIG;
  write_kernel<<<(unsigned)blocks, 256, 0, stream>>>(rows, p->chunk_len, p->k, sorted, pos, val, count);
  return fp4idx__cuda_check(cudaGetLastError(), "topk: write");
}
