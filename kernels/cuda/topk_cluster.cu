/* topk_cluster.cu -- the top-k path for rows that fit in the shared memory
 * of one thread-block cluster (sm_90+): one cluster of 1..16 blocks per row,
 * everything in one kernel, no workspace, no memset.
 *
 * Order (protocol/PROTOCOL.md, "score" with topk): logit descending, ties by
 * lower position, only visible positions, fewer pairs when fewer are
 * visible, padding (-1, -inf). Keys as in topk_keys.cuh.
 *
 * Block q of a row's cluster holds positions [q * slice, (q + 1) * slice)
 * as keys in shared memory (read once from global memory, converted and
 * histogrammed on the way in). A radix select in up to three digit passes
 * (key bits 31-20, 19-8, 7-0) finds the k-th key T; it ends after the
 * first pass (usually) or the second when the k-th key's bin holds at most
 * kExtra keys more than needed: the whole bin joins the candidates then.
 * Distributed shared memory (DSMEM) is used sparingly, because it is slow
 * when many blocks read one block (every block reading every histogram of
 * a 16-block cluster costs ~2.4 us a pass): each block builds its own histogram, pushes its
 * non-zero bins with remote atomics to the bin's owner (block b * cs / NB
 * owns bin b) and the sums of its groups of 16 bins to every block; after
 * one cluster barrier every block scans the group sums locally and reads
 * only the k-th key's group of 16 summed bins from its owner, so every
 * block finds the same digit. A block's count of keys > T is the sum of
 * its pass-1 bins at or above the digit where the select ends in pass 1
 * (the usual row: no key == T is taken), else each warp counts its keys
 * > T and == T by ballots over a contiguous run of the slice. The blocks'
 * totals, pushed by remote atomics, give each block its run of slots in the
 * candidate list: keys > T first (inside a block's run in any order: from
 * a block cursor, 128 keys a warp at a time, or by the warps' counts),
 * then the first keys == T by position (the warps' counts in position
 * order). Each block writes its keys' slots locally and copies them to
 * every other block (all threads, 16-byte remote stores where two slots of
 * the run are aligned), and block q ranks the slots
 * [q * n / cs, (q + 1) * n / cs): a key == T's output index is its slot, a
 * key > T's the number of keys > T that order before it, counted inside
 * buckets of 12 key bits (keys with their positions are distinct, so
 * counting is the exact order; no sort, no single block doing the row's
 * finish); indices >= k drop.
 * No host synchronization: capturable in a CUDA graph.
 */
#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>
#include <atomic>
#include <limits.h>
#include <string.h>

#include "fp4idx_cuda.h"
#include "launch_args.cuh"
#include "topk_keys.cuh"

namespace cg = cooperative_groups;


namespace {

using namespace fp4idx_topk;

// Threads per block: 512 where two blocks share an SM (batches of more
// blocks than SMs), 1024 where each block has an SM to itself (twice the
// warps for the load, the histograms and the rank; same 64 registers).
constexpr int kT = 512, kTWide = 1024;
constexpr int kMaxCluster = 16;         // the non-portable cluster size of sm_90
constexpr int64_t kSliceCap = 32000;    // keys one block holds (125 KiB)
constexpr int kMaxK = FP4IDX_CUDA_TOPK_CLUSTER_K;
// Keys past k the candidate list may hold: a digit pass whose bin would
// overflow k by at most this much ends the select (the bin is taken whole
// and the counting rank drops ranks >= k), so the usual row needs one pass.
constexpr int kExtra = 2048;
constexpr size_t kStatic = 2048;        // static shared memory the kernel may take
constexpr int kNB1 = 4096, kNB2 = 4096, kNB3 = 256;  // digits: key bits 31-20, 19-8, 7-0
// Warp-scan storage: a few hundred bytes of static shared memory, so the
// dynamic part may take nearly all of an SM's 227 KiB.
template <int NT> using Scan = cub::BlockScan<uint32_t, NT, cub::BLOCK_SCAN_WARP_SCANS>;

// Static shared state of a block. gt_base / eq_base are summed by remote
// atomics of the lower-ranked blocks of the cluster.
struct Head {
  uint32_t gt_base, eq_base;     // keys > T / == T in the blocks before this one
  uint32_t wgt[32], weq[32];     // keys > T / == T per warp of this block
  uint32_t digit, rem, cnt, total;  // cluster_find's answer
  uint32_t cursor;                  // slots taken so far in this block's run of keys > T
  uint32_t kor, kand;               // OR / AND of the cluster's keys > T (remote atomics)
  uint32_t bor, band;               // OR / AND of this block's keys > T
};
static_assert(sizeof(Head) + sizeof(Scan<kTWide>::TempStorage) <= kStatic,
              "static shared memory within its share");

// Dynamic shared memory of a block, in bytes from its start:
//   [0, 16 KiB)          h: this block's histogram of the current pass
//   then s1, s2, s3      the owned part of the cluster's summed histograms
//                        (NB / cs bins each)
//   then c1, c2, c3      the cluster's summed histograms in groups of 16
//                        bins (NB / 16 words each, every block a copy)
//   then list            [k + kExtra] candidates (key << 32 | ~position)
//   then keys            [slice + 3] the slice's keys (shifted so that the
//                        16-byte loads land on 16-byte shared stores), at
//                        the end the bucketed copy of the list
// The owned bins and the coarse histograms (groups of 16 bins) of a block.
constexpr size_t kCoarseWords = (size_t)(kNB1 + kNB2 + kNB3) / 16;
constexpr __host__ __device__ size_t owned_words(int cs) {
  return (size_t)(kNB1 + kNB2 + kNB3) / cs + kCoarseWords;
}
constexpr __host__ __device__ size_t off_list(int cs) { return (size_t)kNB1 * 4 + owned_words(cs) * 4; }
constexpr __host__ __device__ size_t off_keys(int cs, int32_t k) {
  return off_list(cs) + (((size_t)(k + kExtra) * 8 + 15) & ~(size_t)15);
}
constexpr size_t cluster_smem_bytes(int cs, int64_t slice, int32_t k) {
  const size_t words = (size_t)slice + 3 > (size_t)(k + kExtra) * 2 ? (size_t)slice + 3
                                                                    : (size_t)(k + kExtra) * 2;
  return off_keys(cs, k) + words * 4;
}
// The most dynamic shared memory a block may take: 227 KiB a block on
// sm_90, less kStatic for the kernel's static shared memory.
constexpr size_t kSmemMax = 227 * 1024 - kStatic;
static_assert(cluster_smem_bytes(1, kSliceCap, kMaxK) <= kSmemMax, "the largest block fits an SM");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Zeroes n words at p (16-byte aligned, n a multiple of 4) by a block of nt threads.
__device__ __forceinline__ void zero_words(uint32_t *p, int n, int nt) {
  uint4 *v = reinterpret_cast<uint4 *>(p);
  for (int i = threadIdx.x; i < n / 4; i += nt) v[i] = make_uint4(0u, 0u, 0u, 0u);
}

// The logit of a candidate, from its key (ord_key inverted: bit for bit for
// every visible logit but the zeros, -0 and +0 sharing one key), else read
// back from the row (saves an L2 round trip before each output's store).
__device__ __forceinline__ float logit_of(unsigned long long c, const float *logits) {
  const uint32_t key = (uint32_t)(c >> 32);
  if (key == 0x80000000u) return logits[cand_pos(c)];
  return __uint_as_float(key & 0x80000000u ? key & 0x7FFFFFFFu : ~key);
}

// A block's run of list slots [s0, s1) in units of copy: two slots (one
// 16-byte store; the list is 16-byte aligned) where both are in the run,
// else one (an odd first slot, an unpaired last one), so that no store
// reaches into another block's slots.
struct SlotRun {
  uint32_t s0, s1, head, pairs, units;
  // Unit j's first slot into *slot; returns whether it covers two slots.
  __device__ __forceinline__ bool unit(uint32_t j, uint32_t *slot) const {
    if (j < head) {
      *slot = s0;
      return false;
    }
    if (j - head < pairs) {
      *slot = s0 + head + 2u * (j - head);
      return true;
    }
    *slot = s1 - 1u;
    return false;
  }
};
__device__ __forceinline__ SlotRun slot_run(uint32_t s0, uint32_t s1) {
  const uint32_t head = (s0 & 1u) && s0 < s1 ? 1u : 0u, n = s1 - s0 - head;
  return SlotRun{s0, s1, head, n / 2u, head + n / 2u + (n & 1u)};
}

// One digit pass's cluster step. h holds this block's histogram of NB bins;
// own (this block's s1/s2/s3) and coarse (its c1/c2/c3: NB / 16 words) are
// zero. Pushes h's non-zero bins to their owners and the sums of its groups
// of 16 bins to every block's coarse copy, waits for the cluster, scans the
// coarse histogram locally (thread t: group NB/16-1-t) to the group where
// the count of keys above is < rem <= the count at or above, and reads only
// that group's 16 summed bins from their owner to find the digit d: s.digit
// = d, s.rem = rem minus the count above d, s.cnt = the count of bin d,
// s.total = the count of the pass. Every block computes the same answer.
// (Reading the whole summed histogram from the owners would be 16 KB of
// remote loads a block, more than the rest of the select.)
template <int NB, int NT>
__device__ void cluster_find(cg::cluster_group &cl, const uint32_t *h, uint32_t *own,
                             uint32_t *coarse, uint32_t rem, Head &s,
                             typename Scan<NT>::TempStorage &scan, int ph) {
  constexpr int NG = NB / 16;  // groups of 16 bins: 4 consecutive threads, 4 bins each
  static_assert(NB / 4 % 32 == 0, "whole warps take part in the push");
  const int tid = threadIdx.x, cs = (int)cl.num_blocks();
  const int per = NB / cs;  // bins a block owns: a multiple of 16
  for (int b4 = tid; b4 < NB / 4; b4 += NT) {
    const uint4 v = reinterpret_cast<const uint4 *>(h)[b4];
    uint32_t *dst = cl.map_shared_rank(own, (unsigned)(4 * b4 / per)) + (4 * b4 % per);
    if (v.x) atomicAdd(dst, v.x);
    if (v.y) atomicAdd(dst + 1, v.y);
    if (v.z) atomicAdd(dst + 2, v.z);
    if (v.w) atomicAdd(dst + 3, v.w);
    uint32_t g = v.x + v.y + v.z + v.w;
    g += __shfl_xor_sync(0xffffffffu, g, 1);
    g += __shfl_xor_sync(0xffffffffu, g, 2);
    if (g)  // the group's 4 threads share its cs destinations
      for (int o = tid & 3; o < cs; o += 4)
        atomicAdd(cl.map_shared_rank(coarse, (unsigned)o) + (b4 >> 2), g);
  }
  cl.sync();  // every push landed: the owners hold the sums, every block the group sums
  const int gi = NG - 1 - tid;  // this thread's group (descending)
  const uint32_t mine = gi >= 0 ? coarse[gi] : 0u;
  uint32_t above, total;
  Scan<NT>(scan).ExclusiveSum(mine, above, total);
  if (tid == 0) s.total = total;
  if (above < rem && above + mine >= rem) {
    const int b0 = gi * 16;  // the group's bins b0 .. b0 + 15, in one owner
    const uint4 *src =
        reinterpret_cast<const uint4 *>(cl.map_shared_rank(own, (unsigned)(b0 / per)) + (b0 % per));
    uint32_t v[16];
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const uint4 u = src[j];
      v[4 * j] = u.x;
      v[4 * j + 1] = u.y;
      v[4 * j + 2] = u.z;
      v[4 * j + 3] = u.w;
    }
    uint32_t c = above;
#pragma unroll
    for (int j = 15; j >= 0; j--) {
      if (c + v[j] >= rem) {
        s.digit = (uint32_t)(b0 + j);
        s.rem = rem - c;
        s.cnt = v[j];
        break;
      }
      c += v[j];
    }
  }
  __syncthreads();
}
#endif

template <int NT>
__global__ void __launch_bounds__(NT, 1024 / NT)
    cluster_kernel(const fp4idx_cuda_topk_row_t *rows, int64_t slice, int32_t k, int32_t *pos,
                   float *val, int32_t *count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Head s;
  __shared__ typename Scan<NT>::TempStorage scan;
  cg::cluster_group cl = cg::this_cluster();
  const int tid = threadIdx.x;
  const int cs = (int)cl.num_blocks(), q = (int)cl.block_rank();
  const int r = (int)(blockIdx.x / (unsigned)cs);
  // Launched with programmatic dependent launch: the next kernel of the
  // stream may start its own prologue at once (it waits for this grid
  // before it reads anything).
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  uint32_t *h = reinterpret_cast<uint32_t *>(smem);
  uint32_t *s1 = h + kNB1, *s2 = s1 + kNB1 / cs, *s3 = s2 + kNB2 / cs;
  uint32_t *c1 = s3 + kNB3 / cs, *c2 = c1 + kNB1 / 16, *c3 = c2 + kNB2 / 16;
  unsigned long long *list = reinterpret_cast<unsigned long long *>(smem + off_list(cs));
  uint32_t *area = reinterpret_cast<uint32_t *>(smem + off_keys(cs, k));

  // Every block's owned sums are zero before anyone pushes into them: the
  // cluster barrier's arrive right after the zeroing, its wait after the
  // load. The logits loads are issued after the arrive: its release
  // semantics would wait for loads issued before it.
  zero_words(h, kNB1 + (int)owned_words(cs), NT);  // h, s1..s3 and c1..c3: contiguous
  if (tid == 0) {
    s.gt_base = 0;
    s.eq_base = 0;
    s.cursor = 0;
    s.kor = s.bor = 0;
    s.kand = s.band = 0xFFFFFFFFu;
  }
  __syncthreads();  // h is zero
  cl.barrier_arrive();
  // Until here nothing touched global memory, so the launch, the block
  // start and the zeroing ran under the previous kernel of the stream (the
  // scorer): the SMs it leaves are ours at once, not a co-tenant's. From
  // here on that kernel has completed and its writes are visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const fp4idx_cuda_topk_row_t row = rows[r];
  const int64_t b = (int64_t)q * slice;
  const int nn = (int)(row.width > b ? (row.width - b < slice ? row.width - b : slice) : 0);

  // The slice into shared memory as keys, histogram of the top 12 bits on
  // the way: 16-byte loads between a scalar head and tail, the key array
  // shifted so that the 16-byte loads are 16-byte stores too.
  const float *x = row.logits + b;
  int head = (int)(((16u - ((uintptr_t)x & 15u)) & 15u) / 4u);
  if (head > nn) head = nn;
  uint32_t *keys = area + ((4 - head) & 3);
  const int nv = (nn - head) / 4;
  const float4 *xv = reinterpret_cast<const float4 *>(x + head);
  uint4 *kv = reinterpret_cast<uint4 *>(keys + head);
  for (int v0 = 0; v0 < nv; v0 += 4 * NT) {
    float4 f[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {  // all loads first: four in flight per thread
      const int v = v0 + j * NT + tid;
      f[j] = v < nv ? __ldg(xv + v) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int v = v0 + j * NT + tid;
      const uint4 u = make_uint4(ord_key(f[j].x), ord_key(f[j].y), ord_key(f[j].z), ord_key(f[j].w));
      if (v < nv) kv[v] = u;
      hist_inc(h, u.x >> 20, v < nv && u.x > kInvisibleMax);
      hist_inc(h, u.y >> 20, v < nv && u.y > kInvisibleMax);
      hist_inc(h, u.z >> 20, v < nv && u.z > kInvisibleMax);
      hist_inc(h, u.w >> 20, v < nv && u.w > kInvisibleMax);
    }
  }
  {  // the scalar head and tail, both loads in flight at once
    const int tail0 = head + 4 * nv;
    const bool hd = tid < head, tl = tid < nn - tail0;
    const float xh = hd ? x[tid] : 0.f, xt = tl ? x[tail0 + tid] : 0.f;
    const uint32_t kh = ord_key(xh), kt = ord_key(xt);
    if (hd) keys[tid] = kh;
    if (tl) keys[tail0 + tid] = kt;
    hist_inc(h, kh >> 20, hd && kh > kInvisibleMax);
    hist_inc(h, kt >> 20, tl && kt > kInvisibleMax);
  }
  __syncthreads();  // the block's histogram is whole
  cl.barrier_wait();

  // Radix select: the list takes the G keys > T and the first rem_t keys
  // == T; G + rem_t = k, or fewer when fewer are visible, or up to kExtra
  // more when a pass's bin is taken whole (T just below the bin).
  // lo_bin: where the select ends in pass 1, the keys > T are the pass-1
  // bins >= lo_bin (h still holds this block's pass-1 histogram), else kNoBin.
  constexpr uint32_t kNoBin = 0xFFFFFFFFu;
  uint32_t T, rem_t, G, lo_bin = kNoBin;
  cluster_find<kNB1, NT>(cl, h, s1, c1, (uint32_t)k, s, scan, 4);
  if (s.total <= (uint32_t)k) {  // every visible key (-inf has key kInvisibleMax)
    T = kInvisibleMax;
    rem_t = 0;
    G = s.total;
    lo_bin = 0;
  } else if (s.cnt - s.rem <= (uint32_t)kExtra) {  // bin d1 whole: every key >= d1 << 20
    T = (s.digit << 20) - 1u;
    rem_t = 0;
    lo_bin = s.digit;
    G = (uint32_t)k - s.rem + s.cnt;
  } else {
    const uint32_t d1 = s.digit, r1 = s.rem;
    for (int i = tid; i < kNB2; i += NT) h[i] = 0;  // h was read by the push above
    __syncthreads();
    for (int i0 = 0; i0 < nn; i0 += NT) {
      const int i = i0 + tid;
      const uint32_t key = i < nn ? keys[i] : 0u;
      hist_inc(h, (key >> 8) & 4095u, i < nn && (key >> 20) == d1 && key > kInvisibleMax);
    }
    __syncthreads();
    cluster_find<kNB2, NT>(cl, h, s2, c2, r1, s, scan, 21);
    const uint32_t p2 = d1 << 12 | s.digit, r2 = s.rem;
    if (s.cnt - s.rem <= (uint32_t)kExtra) {  // bin p2 whole
      T = (p2 << 8) - 1u;
      rem_t = 0;
      G = (uint32_t)k - s.rem + s.cnt;
    } else {
      for (int i = tid; i < kNB3; i += NT) h[i] = 0;
      __syncthreads();
      for (int i0 = 0; i0 < nn; i0 += NT) {
        const int i = i0 + tid;
        const uint32_t key = i < nn ? keys[i] : 0u;
        hist_inc(h, key & 255u, i < nn && (key >> 8) == p2 && key > kInvisibleMax);
      }
      __syncthreads();
      cluster_find<kNB3, NT>(cl, h, s3, c3, r2, s, scan, 25);
      T = p2 << 8 | s.digit;
      rem_t = s.rem;
      G = (uint32_t)k - rem_t;
    }
  }
  const uint32_t n_list = G + rem_t, n_out = n_list < (uint32_t)k ? n_list : (uint32_t)k;

  // Warp w scans the keys [w0, w1) of the slice, 32 at a time (lane l the
  // l-th: conflict-free). Where the select ended in pass 1 (rem_t = 0) the
  // block's count of keys > T is the sum of its bins >= lo_bin, and each
  // warp takes its slots 128 keys at a time from the block's cursor: any
  // order inside the block's run, since the rank counts (no counting pass
  // over the keys). Else the warps count their
  // keys > T and == T by ballots, and their counts in position order give
  // each warp its first slots (keys == T must keep position order).
  constexpr int NW = NT / 32;
  const int lane = tid & 31, w = tid >> 5;
  const unsigned lt = (1u << lane) - 1u;  // the lanes below this one
  const int wc = (nn + 32 * NW - 1) / (32 * NW) * 32;
  const int w0 = w * wc < nn ? w * wc : nn, w1 = w0 + wc < nn ? w0 + wc : nn;
  const bool from_h = lo_bin != kNoBin;
  uint32_t wgt = 0, weq = 0, bgt = 0, beq = 0;  // keys > T / == T: warps before w; the block
  if (from_h) {
    uint32_t mine = 0;
    for (int i = tid; i < kNB1; i += NT) mine += (uint32_t)i >= lo_bin ? h[i] : 0u;
    Scan<NT>(scan).ExclusiveSum(mine, wgt, bgt);  // (wgt unused on this path)
    wgt = 0;
  } else {
    uint32_t ngt = 0, neq = 0;
    for (int i0 = w0; i0 < w1; i0 += 128) {  // four loads in flight before the ballots
      uint32_t kk[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int i = i0 + 32 * u + lane;
        kk[u] = i < w1 ? keys[i] : 0u;  // 0 is below every T
      }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        ngt += __popc(__ballot_sync(0xffffffffu, kk[u] > T));
        neq += __popc(__ballot_sync(0xffffffffu, kk[u] == T));
      }
    }
    if (lane == 0) {
      s.wgt[w] = ngt;
      s.weq[w] = neq;
    }
  }
  zero_words(h, kNB1, NT);  // dead since the last cluster_find (and the sum above): the rank's buckets
  __syncthreads();
  if (!from_h)
    for (int j = 0; j < NW; j++) {
      if (j == w) {
        wgt = bgt;
        weq = beq;
      }
      bgt += s.wgt[j];
      beq += s.weq[j];
    }
  // This block's counts into every later block's bases (their zeroing was
  // ordered before the first cluster barrier).
  if (tid > q && tid < cs) {
    if (bgt) atomicAdd(cl.map_shared_rank(&s.gt_base, (unsigned)tid), bgt);
    if (beq) atomicAdd(cl.map_shared_rank(&s.eq_base, (unsigned)tid), beq);
  }
  cl.sync();
  // Every selected key to its slot of this block's list (keys > T: slots
  // gt_base.., in position order or, from_h, as the cursor hands them out;
  // keys == T: G + eq_base.. while below rem_t, in position order), then the
  // block's two runs of slots copied to every other block.
  const uint32_t gt0 = s.gt_base, eq0 = s.eq_base;
  {
    uint32_t gt_at = gt0 + wgt, eq_at = eq0 + weq, kor = 0, kand = 0xFFFFFFFFu;
    for (int i00 = w0; i00 < w1; i00 += 128) {  // four loads in flight, then in order
      uint32_t kk[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int i = i00 + 32 * u + lane;
        kk[u] = i < w1 ? keys[i] : 0u;
      }
      unsigned mg[4], me[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        mg[u] = __ballot_sync(0xffffffffu, kk[u] > T);
        me[u] = rem_t ? __ballot_sync(0xffffffffu, kk[u] == T) : 0u;  // rem_t: uniform
      }
      if (from_h) {  // this iteration's slots from the block's cursor
        const uint32_t n = __popc(mg[0]) + __popc(mg[1]) + __popc(mg[2]) + __popc(mg[3]);
        uint32_t at = 0;
        if (lane == 0 && n) at = atomicAdd(&s.cursor, n);
        gt_at = gt0 + __shfl_sync(0xffffffffu, at, 0);
      }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int i = i00 + 32 * u + lane;
        const uint32_t key = kk[u];
        if (key > T) {
          list[gt_at + __popc(mg[u] & lt)] = cand_of(key, b + i);
          kor |= key;
          kand &= key;
        } else if (key == T) {
          const uint32_t e = eq_at + __popc(me[u] & lt);
          if (e < rem_t) list[G + e] = cand_of(key, b + i);
        }
        gt_at += __popc(mg[u]);
        eq_at += __popc(me[u]);
      }
    }
    kor = __reduce_or_sync(0xffffffffu, kor);
    kand = __reduce_and_sync(0xffffffffu, kand);
    if (lane == 0 && kor) atomicOr(&s.bor, kor);
    if (lane == 0 && kand != 0xFFFFFFFFu) atomicAnd(&s.band, kand);
  }
  __syncthreads();  // this block's slots are written
  if (tid < cs && bgt) {  // its keys' OR / AND into every block's (for the rank's buckets)
    atomicOr(cl.map_shared_rank(&s.kor, (unsigned)tid), s.bor);
    atomicAnd(cl.map_shared_rank(&s.kand, (unsigned)tid), s.band);
  }
  {
    const uint32_t e0 = eq0 < rem_t ? eq0 : rem_t, e1 = eq0 + beq < rem_t ? eq0 + beq : rem_t;
    const SlotRun rg = slot_run(gt0, gt0 + bgt), re = slot_run(G + e0, G + e1);
    const uint32_t mine = rg.units + re.units, sends = mine * (uint32_t)(cs - 1);
    for (uint32_t t = tid; t < sends; t += NT) {
      const uint32_t o = t / mine, j = t - o * mine;  // o: the o+1-th block after this one
      uint32_t slot;
      const bool two = j < rg.units ? rg.unit(j, &slot) : re.unit(j - rg.units, &slot);
      unsigned long long *dst = cl.map_shared_rank(list, (unsigned)((q + 1 + (int)o) % cs));
      if (two)
        reinterpret_cast<ulonglong2 *>(dst)[slot / 2] = reinterpret_cast<const ulonglong2 *>(list)[slot / 2];
      else
        dst[slot] = list[slot];
    }
  }
  cl.sync();  // every list is whole; no block touches another's memory after this

  int32_t *po = pos + (size_t)r * (size_t)k;
  float *vo = val + (size_t)r * (size_t)k;
  pad_row(po, vo, count + r, n_out, k, q, cs, NT);

  // Rank slots [a, e) of the list (the same list in every block). A slot
  // >= G holds a key == T, in position order after every key > T: its
  // output index is the slot. A key > T's index is the number of the G keys
  // > T larger than it (the whole candidate, so ties go by position);
  // indices >= k are dropped (a bin taken whole). To
  // compare only within a bucket, the G keys are counting-sorted (any order
  // inside a bucket) by the 12 key bits below the bits they all share, into
  // `sorted` (the dead key area); h[bucket] = first slot << 16 | count.
  unsigned long long *sorted = reinterpret_cast<unsigned long long *>(area);
  const uint32_t diff = s.kor ^ s.kand;
  const int hb = diff ? 31 - __clz((int)diff) : 0;
  const int sh = hb > 11 ? hb - 11 : 0;
  // Four list reads in flight per thread before their atomics (ties put
  // many candidates in one bucket: the atomics serialize, the reads need not).
  for (uint32_t i0 = tid; i0 < G; i0 += 4 * NT) {
    uint32_t bk[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const uint32_t i = i0 + (uint32_t)u * NT;
      bk[u] = i < G ? ((uint32_t)(list[i] >> 32) >> sh) & 4095u : 0u;
    }
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (i0 + (uint32_t)u * NT < G) atomicAdd(&h[bk[u]], 1u);
  }
  __syncthreads();
  {
    // Thread t: buckets 4095 - t * PT down to 4096 - (t + 1) * PT, read and
    // written as 16-byte words (a thread's PT consecutive words).
    constexpr int PT = kNB1 / NT;
    static_assert(PT % 4 == 0, "whole 16-byte words a thread");
    uint4 *hv = reinterpret_cast<uint4 *>(h + kNB1 - (tid + 1) * PT);
    uint32_t v[PT], mine = 0, at;
#pragma unroll
    for (int j = 0; j < PT / 4; j++) {
      const uint4 u = hv[j];
      v[PT - 1 - 4 * j] = u.x;  // v[j]: bucket 4095 - t * PT - j
      v[PT - 2 - 4 * j] = u.y;
      v[PT - 3 - 4 * j] = u.z;
      v[PT - 4 - 4 * j] = u.w;
    }
#pragma unroll
    for (int j = 0; j < PT; j++) mine += v[j];
    Scan<NT>(scan).ExclusiveSum(mine, at);
    uint32_t o[PT];
#pragma unroll
    for (int j = 0; j < PT; j++) {
      o[j] = at << 16;
      at += v[j];
    }
#pragma unroll
    for (int j = 0; j < PT / 4; j++)
      hv[j] = make_uint4(o[PT - 1 - 4 * j], o[PT - 2 - 4 * j], o[PT - 3 - 4 * j], o[PT - 4 - 4 * j]);
  }
  __syncthreads();
  for (uint32_t i0 = tid; i0 < G; i0 += 4 * NT) {
    unsigned long long c[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const uint32_t i = i0 + (uint32_t)u * NT;
      c[u] = i < G ? list[i] : 0ull;
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (i0 + (uint32_t)u * NT < G) {
        const uint32_t v = atomicAdd(&h[((uint32_t)(c[u] >> 32) >> sh) & 4095u], 1u);
        sorted[(v >> 16) + (v & 0xFFFFu)] = c[u];
      }
    }
  }
  __syncthreads();
  const uint32_t share = (n_list + (uint32_t)cs - 1) / (uint32_t)cs;
  const uint32_t a = (uint32_t)q * share < n_list ? (uint32_t)q * share : n_list;
  const uint32_t e = a + share < n_list ? a + share : n_list;
  const uint32_t ge = e < G ? e : G;
  for (uint32_t i = a + tid; i < ge; i += NT) {  // keys > T
    const unsigned long long c = list[i];
    const uint32_t u = h[((uint32_t)(c >> 32) >> sh) & 4095u];
    const uint32_t b0 = u >> 16, b1 = b0 + (u & 0xFFFFu);
    // A rank only grows along the walk: a candidate stops as soon as it
    // reaches k (dropped). The bin taken whole is often one bucket of up to
    // kExtra keys past k, walked in full by each of them otherwise.
    uint32_t rank = b0, j = b0;
    for (; j + 8 <= b1 && rank < (uint32_t)k; j += 8) {  // eight loads in flight
      unsigned long long y[8];
#pragma unroll
      for (int m = 0; m < 8; m++) y[m] = sorted[j + m];
#pragma unroll
      for (int m = 0; m < 8; m++) rank += y[m] > c;
    }
    if (rank >= (uint32_t)k) continue;
    for (; j < b1; j++) rank += sorted[j] > c;
    if (rank >= (uint32_t)k) continue;
    const int32_t p = cand_pos(c);
    po[rank] = p;
    vo[rank] = logit_of(c, row.logits);
  }
  for (uint32_t i = (ge > a ? ge : a) + tid; i < e; i += NT) {  // keys == T
    const unsigned long long c = list[i];
    po[i] = cand_pos(c);
    vo[i] = logit_of(c, row.logits);
  }
#endif
}

// The occupancy query's config of cluster_kernel: `grid` blocks of nt
// threads in clusters of cs, `smem` bytes of dynamic shared memory each,
// with programmatic dependent launch as the launch itself has it
// (fp4idx__cuda_topk_cluster_describe). at[0..2) receive the attributes the
// config points at (they must outlive the config).
cudaLaunchConfig_t launch_config(cudaLaunchAttribute *at, int cs, unsigned grid, size_t smem,
                                 int nt, cudaStream_t stream) {
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = (unsigned)cs;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3((unsigned)nt);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = at;
  cfg.numAttrs = 2;
  return cfg;
}

// Per device: the largest cluster size that can be resident at the largest
// shared memory this path asks for with it (0: no cluster path), whether
// the 1024-thread kernel can run such clusters too, and the SM count; the
// kernels' attributes are set here, once.
struct Caps {
  std::atomic<int> ready{0};
  int max_cs = 0, wide = 0, sms = 0;
};

// Sets one instantiation's attributes; returns whether clusters of cs blocks
// of it fit the device at the largest shared memory (0 also on an error).
template <int NT>
int fits(int cs) {
  if (cudaFuncSetAttribute(cluster_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           (int)cluster_smem_bytes(1, kSliceCap, kMaxK)) != cudaSuccess ||
      cudaFuncSetAttribute(cluster_kernel<NT>, cudaFuncAttributeNonPortableClusterSizeAllowed,
                           1) != cudaSuccess)
    return 0;
  cudaLaunchAttribute at[2];
  cudaLaunchConfig_t cfg =
      launch_config(at, cs, (unsigned)cs, cluster_smem_bytes(cs, kSliceCap, kMaxK), NT, 0);
  cfg.numAttrs = 1; /* the occupancy query takes the cluster shape only */
  int n = 0;
  return cudaOccupancyMaxActiveClusters(&n, cluster_kernel<NT>, &cfg) == cudaSuccess && n > 0;
}

// The block size of a launch: 1024 threads where every block has an SM to
// itself, holds at least kWideSlice keys and the device runs such
// clusters, else 512 (the wider block wins the load of 25,000 keys a block
// and loses on the barriers and scans of 4,096).
constexpr int64_t kWideSlice = 16384;
int threads_of(const Caps &c, int32_t n_rows, int cs, int64_t slice) {
  return c.wide && (int64_t)n_rows * cs <= (int64_t)c.sms && slice >= kWideSlice ? kTWide : kT;
}
Caps g_caps[64];

// The current device's Caps, or null where it has no cluster path.
const Caps *caps_of() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return nullptr;
  }
  Caps &c = g_caps[dev];
  if (!c.ready.load(std::memory_order_acquire)) {
    int major = 0, n_sm = 0, best = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        major >= 9) {
      for (int cs = kMaxCluster; cs >= 1 && !best; cs /= 2)
        if (fits<kT>(cs)) best = cs;
      c.wide = best && fits<kTWide>(best);
    }
    (void)cudaGetLastError();  // a failed query means: no cluster path
    c.max_cs = best;
    c.sms = n_sm;
    c.ready.store(1, std::memory_order_release);
  }
  return c.max_cs > 0 ? &c : nullptr;
}

}  // namespace

extern "C" int fp4idx__cuda_topk_cluster_plan(const fp4idx_cuda_topk_row_t *rows,
                                              int32_t n_rows, int32_t k, int32_t max_cluster,
                                              fp4idx_cuda_topk_plan_t *p) {
  const Caps *caps = k <= kMaxK && n_rows >= 1 ? caps_of() : nullptr;
  if (!caps) return FP4IDX_ENODEV;
  int max_cs = caps->max_cs;
  const int sms = caps->sms;
  if (max_cluster < max_cs) max_cs = max_cluster;
  int64_t max_w = 0;
  for (int32_t i = 0; i < n_rows; i++)
    if (rows[i].width > max_w) max_w = rows[i].width;
  // About one block per SM over the batch while a block keeps at least
  // kSliceMin keys (the cluster barriers and remote traffic grow with the
  // cluster), then wide enough for the slice.
  constexpr int64_t kSliceMin = 4096;
  int cs = 1;
  while (cs * 2 <= max_cs && (int64_t)n_rows * cs * 2 <= (int64_t)sms &&
         max_w / (cs * 2) >= kSliceMin)
    cs *= 2;
  while (cs * 2 <= max_cs && (max_w + cs - 1) / cs > kSliceCap) cs *= 2;
  int64_t slice = (max_w + cs - 1) / cs;
  slice = slice < 4 ? 4 : (slice + 3) & ~(int64_t)3;  // 16-byte steps between blocks
  if (slice > kSliceCap || cs > max_cs || (int64_t)n_rows * cs > INT_MAX) return FP4IDX_ENODEV;
  p->cluster = cs;
  p->slice = slice;
  p->cluster_smem = cluster_smem_bytes(cs, slice, k);
  p->ws_bytes = 256;  // unused; non-zero so every caller's allocation is valid
  return FP4IDX_OK;
}

extern "C" int fp4idx__cuda_topk_cluster_describe(const fp4idx_cuda_topk_plan_t *p,
                                                  const fp4idx_cuda_topk_row_t *rows,
                                                  int32_t *pos, float *val, int32_t *count,
                                                  fp4idx_cuda_launch_t *l) {
  if (p->cluster < 1 || p->cluster > kMaxCluster || (p->cluster & (p->cluster - 1)) ||
      p->slice < 4 || p->slice > kSliceCap || p->k > kMaxK ||
      p->cluster_smem != cluster_smem_bytes(p->cluster, p->slice, p->k))
    return FP4IDX_EINVAL;
  const Caps *caps = caps_of();
  if (!caps || p->cluster > caps->max_cs) return FP4IDX_ENODEV;
  // Programmatic dependent launch: the kernel waits with griddepcontrol.wait
  // before its first global access. Beside a co-tenant under MPS it is what
  // keeps the SMs the scorer leaves: score + top-k of 4 x 400,000 keys,
  // k = 2048, take 168 us with it and 486 us without beside a bf16 GEMM
  // load (the results page, "Sharing the GPU").
  const int nt = threads_of(*caps, p->n_rows, p->cluster, p->slice);
  const unsigned grid = (unsigned)((int64_t)p->n_rows * p->cluster);
  if (nt == kTWide)
    fp4idx__launch_begin(l, cluster_kernel<kTWide>, grid, kTWide, p->cluster_smem,
                         (unsigned)p->cluster, 1);
  else
    fp4idx__launch_begin(l, cluster_kernel<kT>, grid, kT, p->cluster_smem, (unsigned)p->cluster,
                         1);
  fp4idx__launch_arg(l, rows);
  fp4idx__launch_arg(l, (int64_t)p->slice);
  fp4idx__launch_arg(l, (int32_t)p->k);
  fp4idx__launch_arg(l, pos);
  fp4idx__launch_arg(l, val);
  fp4idx__launch_arg(l, count);
  return FP4IDX_OK;
}
