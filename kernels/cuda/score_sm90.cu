/* score_sm90.cu -- the FP4 index scorer on Hopper: wgmma (sm_90a).
 *
 * Same contract as score.cu (PROTOCOL.md appendix, "Scorer"); the matrix engine and the
 * epilogue change. One warpgroup (4 warps, 128 threads) per block takes a
 * 64-key tile: warp w owns keys 16w..16w+15, and lane (g, t) decodes keys
 * 16w+g and 16w+g+8 (scale block t of each: one LDG.128 + one byte) straight
 * into the A-operand registers of wgmma -- the keys are decoded ONCE per
 * tile and used for all R*H query vectors of the sequence.
 *
 *   1. d = K_tile . Q^T: wgmma.m64n128k16, A = keys (registers), B = query
 *      vectors in shared memory, K-major with the 128-byte swizzle, read
 *      through a matrix descriptor; 8 k-steps, up to 2 chunks of 128
 *      vectors; f32 accumulators (64 per thread).
 *   2. p = bf16(relu(bf16(d)) * |w|): cvt.rn.bf16x2 + fma.rn.relu.bf16x2
 *      (rounding is monotone and odd, so relu commutes with it; the sign of
 *      w goes into step 3 exactly).
 *   3. head sum on the tensor core: the accumulator layout of n8 blocks
 *      2k, 2k+1 is the A-register layout of k-step k, so p feeds a second
 *      wgmma.m64n32k16 from registers against S^T [32 rows][256 vectors],
 *      S = sign(w_v) where vector v belongs to row r, else 0: the products
 *      p * (+-1) are exact and the f32 accumulation is exact whenever the
 *      row's terms fit 24 bits (always on dyadic data; on Gaussian data the
 *      CPU oracle, which sums in float64, agreed on every test) -- then one
 *      bf16 rounding and the -inf / mask rule per (row, key).
 * No exp2, no special-function unit (tests/sass_check.sh).
 *
 * Grid: 1-D, <= occupancy * SMs blocks; block b takes the contiguous 64-key
 * tile range [T*b/G, T*(b+1)/G) of the flattened work list (score.cu's
 * planner); per work segment it stages Q, |w|, S and the lengths once.
 * Keys of the next tile load while this one computes. Shared memory:
 * nq*256 B of queries (nq padded to 128) + 16 KB of S + weights, lengths and
 * a v/hp table, 1024-byte aligned for the swizzle.
 * Only compiled into the sm_90a image; the planner picks it on CC 9.0
 * (FP4IDX_CUDA_MMASYNC=1 forces the mma.sync kernel of score.cu).
 * FP4IDX_CUDA_SCORER=v1|v2|v3 picks this kernel (v1) or the pipelined ones
 * further down (v2, v3); FP4IDX_SM90_DEFAULT_SCORER says which runs unset.
 */
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_cuda.h"
#include "fp4idx_decode.cuh"
#include "score_work.cuh"

// The kernel body exists only in the sm_90a image (wgmma); elsewhere it is
// empty and the planner never launches it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP4IDX_SM90 1
#endif

namespace {

constexpr int kThreads = 128;
#ifdef FP4IDX_SM90
constexpr int kTileKeys = 64;
constexpr int kN = 128;  // query vectors per wgmma
#endif
constexpr int kRowsMax = 32;  // rows per work (256 query vectors / 8)
constexpr int kSumBytes = 4 * kRowsMax * 128;  // head-sum matrix, K = 256


#ifdef FP4IDX_SM90
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

// D[64x128] (+)= A[64x16] (registers) * B[16x128] (shared, K-major, SW128).
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint32_t a0, uint32_t a1,
                                                 uint32_t a2, uint32_t a3, uint64_t desc,
                                                 int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %69, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(scale_d), "l"(desc));
}

// D[64x32] (+)= A[64x16] (registers) * B[16x32] (shared, K-major, SW128).
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint32_t a0, uint32_t a1,
                                                uint32_t a2, uint32_t a3, uint64_t desc,
                                                int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %20, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %21, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(scale_d), "l"(desc));
}

// The same with scale-d = 0 and D as outputs only ("=f"): the compiler
// then knows D's old value is dead (no registers held for it before).
__device__ __forceinline__ void wgmma_m64n128k16_zero(float (&d)[64], uint32_t a0, uint32_t a1,
                                                      uint32_t a2, uint32_t a3, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}


template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}


// Descriptor: K-major, 128-byte swizzle, 8-row groups 1024 B apart.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}
#endif

#ifdef FP4IDX_SM90
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t cvt_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
// bf16(relu(d) * |w|) as relu(bf16(d * |w| + -0)): one fma.relu (rounding
// is monotone and odd, so relu and rounding commute); w's sign is applied by
// the head-sum matrix S (entries +-1), exactly.
__device__ __forceinline__ uint32_t relu_mul_abs_bf16x2(uint32_t d, uint32_t wabs) {
  uint32_t r;
  asm("fma.rn.relu.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(d), "r"(wabs), "r"(0x80008000u));
  return r;
}

struct Keys2 {
  uint4 p[2];
  uint32_t s[2];
};

__device__ __forceinline__ void load_keys2(Keys2 &kr, const uint8_t *__restrict__ pool,
                                           const int32_t *__restrict__ pages, int32_t log2p,
                                           int32_t width, int32_t lbase, int t) {
  const uint32_t pmask = (1u << log2p) - 1u;
  const uint64_t page_bytes = (uint64_t)FP4IDX_SLOT_BYTES << log2p;
#pragma unroll
  for (int m = 0; m < 2; m++) {
    int32_t l = lbase + 8 * m;
    if (l > width - 1) l = width - 1;
    const uint32_t page = (uint32_t)__ldg(pages + (l >> log2p));
    const uint32_t o = (uint32_t)l & pmask;
    const uint8_t *base = pool + page * page_bytes;
    const uint8_t *src = base + o * 64 + t * 16;
    if (log2p >= 2) {
      kr.p[m] = __ldg(reinterpret_cast<const uint4 *>(src));
    } else {
      const uint32_t *s4 = reinterpret_cast<const uint32_t *>(src);
      kr.p[m] = make_uint4(__ldg(s4), __ldg(s4 + 1), __ldg(s4 + 2), __ldg(s4 + 3));
    }
    kr.s[m] = __ldg(base + (64u << log2p) + o * 4 + t);
  }
}

#endif  // FP4IDX_SM90

}  // namespace

__global__ void __launch_bounds__(kThreads, 3)
    fp4idx_score_sm90_kernel(const __grid_constant__ fp4idx_cuda_score_params_t prm) {
#ifdef FP4IDX_SM90
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = (uint32_t)__cvta_generic_to_shared(smem_raw);
  uint8_t *smem = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  const int nq = prm.ntp * 8;                                      // query rows in smem
  uint8_t *q_s = smem;                                             // [2 kc][nq][128 B]
  uint8_t *s_s = smem + nq * 256;                                  // [4 kc][32 rows][128 B]
  uint32_t *w_s = reinterpret_cast<uint32_t *>(s_s + kSumBytes);   // [nq/2] bf16x2
  int32_t *lens_s = reinterpret_cast<int32_t *>(w_s + nq / 2);     // [32]
  int32_t *maxlen_s = lens_s + 32;
  uint8_t *row_of_v = reinterpret_cast<uint8_t *>(maxlen_s + 1);  // [256] v / hp
  const uint32_t q_addr = (uint32_t)__cvta_generic_to_shared(q_s);
  const uint32_t s_addr = (uint32_t)__cvta_generic_to_shared(s_s);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t T = prm.total_tiles;
  const int64_t tb = T * blockIdx.x / gridDim.x;
  const int64_t te = T * (blockIdx.x + 1) / gridDim.x;

  int64_t cur = tb;
  while (cur < te) {
    const int lo = fp4idx__work_of_tile(prm.works, prm.n_works, cur);
    const fp4idx_cuda_work_t wk = prm.works[lo];
    const int64_t wend = lo + 1 < prm.n_works ? prm.works[lo + 1].tile_begin : T;
    const int64_t seg_end = wend < te ? wend : te;
    const fp4idx_cuda_seq_t sq = prm.seqs[wk.seq];
    const int nrows = wk.nrows;
    const int nt_valid = (nrows * prm.hp) >> 3;  // n8 blocks holding real rows
    const int nchunks = (nt_valid * 8 + kN - 1) / kN;

    // The first tile's keys load under the staging below (maxlen is not known
    // yet; a tile past it just ignores them).
    const int32_t width = (int32_t)sq.width;
    Keys2 ka;
    load_keys2(ka, prm.pool, sq.pages, prm.log2_page, width,
               (int32_t)(cur - wk.tile_begin) * kTileKeys + 16 * warp + g, t);
    __syncthreads();
    // Integer division is ~20 instructions: one per thread, into a table.
    for (int v = threadIdx.x; v < 256; v += kThreads) row_of_v[v] = (uint8_t)(v / prm.hp);
    __syncthreads();
    // Stage the queries: input chunk (v, c) = dims 8c..8c+7 of vector v;
    // with c = 4t'+w', its word pairs (d0,d4) (d1,d5) (d2,d6) (d3,d7) sit at
    // logical K = 32w' + 2t' + {0,8,16,24} (the decoder's K order), in the
    // SW128 K-major layout: [kc = K/64][row v][16-byte unit u ^ (v & 7)].
    for (int i0 = threadIdx.x; i0 < nq * 16; i0 += 8 * kThreads) {
      uint4 in[8];
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int i = i0 + u * kThreads, v = (i >> 4) & 255, c = i & 15;
        const int r = row_of_v[v], h = v - r * prm.hp;
        in[u] = make_uint4(0, 0, 0, 0);
        if (i < nq * 16 && r < nrows && h < prm.heads)
          in[u] = __ldg(reinterpret_cast<const uint4 *>(
              sq.q + ((int64_t)(wk.row0 + r) * prm.heads + h) * FP4IDX_HEAD_DIM + c * 8));
      }
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int i = i0 + u * kThreads, v = i >> 4, c = i & 15;
        if (i >= nq * 16) break;
        const int tq = c >> 2, wq = c & 3;
        const uint32_t o[4] = {prmt(in[u].x, in[u].z, 0x5410), prmt(in[u].x, in[u].z, 0x7632),
                               prmt(in[u].y, in[u].w, 0x5410), prmt(in[u].y, in[u].w, 0x7632)};
#pragma unroll
        for (int m = 0; m < 4; m++) {
          const int unit = 4 * wq + m;  // (K/8) over both 64-element chunks
          const int kc = unit >> 3, uu = unit & 7;
          *reinterpret_cast<uint32_t *>(q_s + kc * (nq * 128) + v * 128 + ((uu ^ (v & 7)) << 4) +
                                        4 * tq) = o[m];
        }
      }
    }
    // Raw weights per query vector (one global load each), then |w| pairs
    // for the epilogue and the head-sum matrix S^T [32 rows r][256 vectors v]
    // = sign(w_v) where v belongs to row r: the tensor core sums each row's
    // H products (exact bf16 inputs, f32 accumulation) -- B of the 2nd wgmma.
    uint16_t *wraw = reinterpret_cast<uint16_t *>(row_of_v + 256);  // [256]
    for (int v = threadIdx.x; v < 256; v += kThreads) {
      const int r = row_of_v[v], h = v - r * prm.hp;
      wraw[v] = (v < nq && r < nrows && h < prm.heads)
                    ? sq.w[(int64_t)(wk.row0 + r) * prm.heads + h] : (uint16_t)0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kRowsMax * 32; i += kThreads) {
      const int r = i >> 5, unit = i & 31;  // unit: 8 consecutive v
      uint32_t wd[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        uint32_t x = 0;
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) {
          const int v = unit * 8 + 2 * e + h2;
          if (r < nrows && v < nq && row_of_v[v] == r)
            x |= ((wraw[v] & 0x8000u) ? 0xBF80u : 0x3F80u) << (16 * h2);  // sign(w) * 1.0
        }
        wd[e] = x;
      }
      const int kc = unit >> 3, uu = unit & 7;
      *reinterpret_cast<uint4 *>(s_s + kc * (kRowsMax * 128) + r * 128 + ((uu ^ (r & 7)) << 4)) =
          make_uint4(wd[0], wd[1], wd[2], wd[3]);
    }
    for (int i = threadIdx.x; i < nq / 2; i += kThreads)
      w_s[i] = ((uint32_t)wraw[2 * i] | ((uint32_t)wraw[2 * i + 1] << 16)) & 0x7fff7fffu;
    if (threadIdx.x == 0) {
      int32_t mx = 0;
      for (int r = 0; r < nrows; r++) {
        int32_t L = sq.lens[wk.row0 + r];
        lens_s[r] = L;
        mx = L > mx ? L : mx;
      }
      *maxlen_s = mx;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int32_t maxlen = *maxlen_s;

    // Tile loop, keys prefetched two tiles ahead (the page-id -> payload
    // chain is two dependent memory round trips).
    auto issue = [&](Keys2 &kr, int64_t tile) {
      const int32_t l0 = (int32_t)(tile - wk.tile_begin) * kTileKeys;
      if (tile < seg_end && l0 < maxlen)
        load_keys2(kr, prm.pool, sq.pages, prm.log2_page, width, l0 + 16 * warp + g, t);
    };
    for (int64_t tile = cur; tile < seg_end; tile++) {
      const int32_t l0 = (int32_t)(tile - wk.tile_begin) * kTileKeys;
      if (l0 >= maxlen) {
        // Past every row's visible count: -inf only.
        const int32_t l = l0 + (threadIdx.x & 63);
        if (l < width)
          for (int r = threadIdx.x >> 6; r < nrows; r += 2)
            sq.out[(int64_t)(wk.row0 + r) * width + l] = -INFINITY;
        continue;
      }
      uint32_t a[2][16];
      if (__all_sync(0xffffffffu, fp4idx__scale_fast(ka.s[0]) && fp4idx__scale_fast(ka.s[1]))) {
        fp4idx__decode_block_fast(ka.p[0], ka.s[0], a[0]);
        fp4idx__decode_block_fast(ka.p[1], ka.s[1], a[1]);
      } else {
        fp4idx__decode_block(ka.p[0], ka.s[0], a[0]);
        fp4idx__decode_block(ka.p[1], ka.s[1], a[1]);
      }
      issue(ka, tile + 1);  // next tile's keys load under this tile's MMAs

      float acc[16];  // [64 keys x 32 rows]: head sums
      fence_acc(acc);
      for (int ch = 0; ch < nchunks; ch++) {
        float d[64];
        fence_acc(d);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
          const int w4 = kk >> 1, n0 = 2 * (kk & 1);
          const uint32_t saddr = q_addr + (kk >> 2) * (nq * 128) + ch * (kN * 128) + (kk & 3) * 32;
          wgmma_m64n128k16(d, a[0][4 * w4 + n0], a[1][4 * w4 + n0], a[0][4 * w4 + n0 + 1],
                           a[1][4 * w4 + n0 + 1], make_desc(saddr), kk);
        }
        wgmma_commit();
        wgmma_wait0();
        fence_acc(d);
        // p = bf16(relu(bf16(d)) * w) in bf16x2; the accumulator layout of
        // n8 blocks 2k, 2k+1 is the A-register layout of k-step k, so p feeds
        // the head-sum wgmma straight from registers.
        uint32_t pr[32];
#pragma unroll
        for (int jj = 0; jj < kN / 8; jj++) {
          const uint32_t w2 = w_s[(ch * (kN / 8) + jj) * 4 + t];
          pr[2 * jj] = relu_mul_abs_bf16x2(cvt_bf16x2(d[4 * jj], d[4 * jj + 1]), w2);
          pr[2 * jj + 1] = relu_mul_abs_bf16x2(cvt_bf16x2(d[4 * jj + 2], d[4 * jj + 3]), w2);
        }
        wgmma_fence();
#pragma unroll
        for (int k2 = 0; k2 < 8; k2++) {
          const int kv = ch * 8 + k2;  // 16-vector step over K = 256
          const uint32_t saddr = s_addr + (kv >> 2) * (kRowsMax * 128) + (kv & 3) * 32;
          wgmma_m64n32k16(acc, pr[4 * k2], pr[4 * k2 + 1], pr[4 * k2 + 2], pr[4 * k2 + 3],
                          make_desc(saddr), ch | k2);
        }
        wgmma_commit();
        if (ch + 1 < nchunks) wgmma_wait0();  // pr and d are reused
      }
      wgmma_wait0();
      fence_acc(acc);
      // acc[4jr + e]: key g (e < 2) or g+8, row 8jr + 2t + (e & 1).
      const int32_t lk = l0 + 16 * warp + g;
#pragma unroll
      for (int jr = 0; jr < 4; jr++) {
        if (8 * jr >= nrows) break;
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) {
          const int r = 8 * jr + 2 * t + e1;
          if (r >= nrows) continue;
          const int64_t row = wk.row0 + r;
          float *orow = sq.out + row * width;
          const uint8_t *mrow = sq.mask ? sq.mask + row * width : nullptr;
          const int32_t len = lens_s[r];
#pragma unroll
          for (int e2 = 0; e2 < 2; e2++) {
            const int32_t l = lk + 8 * e2;
            if (l < width) {
              bool vis = l < len;
              if (vis && mrow) vis = mrow[l] != 0;
              orow[l] = vis ? __bfloat162float(__float2bfloat16_rn(acc[4 * jr + 2 * e2 + e1])) : -INFINITY;
            }
          }
        }
      }
    }
    cur = seg_end;
  }
#endif
}


/* ---- v2 / v3: two tiles in flight per warpgroup (FP4IDX_CUDA_SCORER) -----
 *
 * Same arithmetic as the kernel above, in the same order per (row, key), so
 * the same bits; what changes is the schedule of a warpgroup:
 *   - The tiles of a work segment that some row can see ([cur, act_end); the
 *     -inf-only tail is a separate loop) run as a software pipeline. Two
 *     A-register sets alternate (tile i+2 is decoded into tile i's set while
 *     tile i+1's QK wgmma reads the other), so the row stores and the decode
 *     of one tile run under the tensor core's QK of the next:
 *       wait 0 (QK(i) done) -> epilogue d -> p -> issue HS(i), commit ->
 *       issue QK(i+1), commit -> wait 1 (HS(i) done, QK(i+1) in flight) ->
 *       store tile i -> decode tile i+2 into the free set -> load tile i+3.
 *     Every register a wgmma in flight reads or writes stays live (an empty
 *     asm "+r"/"+f" after the wait that completes it), so the compiler cannot
 *     hand it to other code meanwhile; wgmma and waits are never under an if
 *     (see the tile loop).
 *   - Per-block fixed cost: the v/hp table is built once per block; the
 *     queries, weights and lengths of a segment load in one round trip.
 * v2: one warpgroup per block, 2 blocks per SM (~255 registers: two key sets
 * + the 64 QK accumulators + p). v3: two warpgroups per block sharing the
 * staged queries (warpgroup w takes the segment's tiles w, w+2, ...), one
 * block per SM: half the staging per tile for small contexts.
 */
#ifdef FP4IDX_SM90
template <int N>
__device__ __forceinline__ void fence_u32(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

// The row results of a tile, rounded to bf16 once (the same rounding as
// __float2bfloat16_rn), two per register: accb[2jr + e2] = {acc[4jr + 2e2],
// acc[4jr + 2e2 + 1]} -- rows 8jr + 2t and 8jr + 2t + 1 of key g + 8e2.
__device__ __forceinline__ void pack_rows(const float (&acc)[16], uint32_t (&accb)[8]) {
#pragma unroll
  for (int j = 0; j < 8; j++) accb[j] = cvt_bf16x2(acc[2 * j], acc[2 * j + 1]);
}

__device__ __forceinline__ void decode_keys2(const Keys2 &k, uint32_t (&a)[2][16]) {
  if (__all_sync(0xffffffffu, fp4idx__scale_fast(k.s[0]) && fp4idx__scale_fast(k.s[1]))) {
    fp4idx__decode_block_fast(k.p[0], k.s[0], a[0]);
    fp4idx__decode_block_fast(k.p[1], k.s[1], a[1]);
  } else {
    fp4idx__decode_block(k.p[0], k.s[0], a[0]);
    fp4idx__decode_block(k.p[1], k.s[1], a[1]);
  }
}

// Descriptor low word of shared address a (make_desc's fields); the high
// word is the constant kDescHi. The tile loop takes the base through an
// opaque move each step so that the compiler adds the k-step offsets there
// instead of keeping 24 64-bit descriptors live across the loop (spills).
constexpr uint32_t kDescHi = (1024u >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t desc_lo(uint32_t saddr) {
  return ((saddr & 0x3FFFFu) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  uint32_t y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}
__device__ __forceinline__ uint64_t desc_at(uint32_t lo, uint32_t byte_off) {
  return ((uint64_t)kDescHi << 32) | (uint64_t)(lo + (byte_off >> 4));
}

// d = K_tile . Q^T for query chunk ch (8 k-steps), not committed; qlo =
// desc_lo of the queries' shared address.
__device__ __forceinline__ void issue_qk(float (&d)[64], const uint32_t (&a)[2][16],
                                         uint32_t qlo, int nq, int ch) {
  // Two bases (K chunk 0 and 1 of the queries: nq * 128 bytes apart), the
  // rest are immediates.
  const uint32_t lo0 = opaque(qlo + ((uint32_t)(ch * (kN * 128)) >> 4));
  const uint32_t lo1 = opaque(qlo + ((uint32_t)(ch * (kN * 128) + nq * 128) >> 4));
#pragma unroll
  for (int kk = 0; kk < 8; kk++) {
    const int w4 = kk >> 1, n0 = 2 * (kk & 1);
    const uint32_t lo = kk < 4 ? lo0 : lo1, off = (kk & 3) * 32;
    if (kk == 0)
      wgmma_m64n128k16_zero(d, a[0][4 * w4 + n0], a[1][4 * w4 + n0], a[0][4 * w4 + n0 + 1],
                            a[1][4 * w4 + n0 + 1], desc_at(lo, off));
    else
      wgmma_m64n128k16(d, a[0][4 * w4 + n0], a[1][4 * w4 + n0], a[0][4 * w4 + n0 + 1],
                       a[1][4 * w4 + n0 + 1], desc_at(lo, off), 1);
  }
}
#endif

template <int kWG, int kMinBlocks>
__global__ void __launch_bounds__(kWG * kThreads, kMinBlocks)
    fp4idx_score_sm90_v2_kernel(const __grid_constant__ fp4idx_cuda_score_params_t prm) {
#ifdef FP4IDX_SM90
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = (uint32_t)__cvta_generic_to_shared(smem_raw);
  uint8_t *smem = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  const int nq = prm.ntp * 8;
  uint8_t *q_s = smem;                                             // [2 kc][nq][128 B]
  uint8_t *s_s = smem + nq * 256;                                  // [4 kc][32 rows][128 B]
  uint32_t *w_s = reinterpret_cast<uint32_t *>(s_s + kSumBytes);   // [nq/2] bf16x2
  int32_t *lens_s = reinterpret_cast<int32_t *>(w_s + nq / 2);     // [32]
  int32_t *maxlen_s = lens_s + 32;
  uint8_t *row_of_v = reinterpret_cast<uint8_t *>(maxlen_s + 1);  // [256] v / hp
  uint16_t *wraw = reinterpret_cast<uint16_t *>(row_of_v + 256);  // [256]
  const uint32_t q_lo = desc_lo((uint32_t)__cvta_generic_to_shared(q_s));
  const uint32_t s_lo = desc_lo((uint32_t)__cvta_generic_to_shared(s_s));

  constexpr int kTB = kWG * kThreads;  // threads per block
  constexpr int kQBatch = 16 / kWG;     // query loads in flight per thread
  const int wg = threadIdx.x >> 7;      // warpgroup: tiles wg, wg + kWG, ...
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int32_t kstride = kWG * kTileKeys;  // key distance of a warpgroup's tiles
  const int64_t T = prm.total_tiles;
  const int64_t tb = T * blockIdx.x / gridDim.x;
  const int64_t te = T * (blockIdx.x + 1) / gridDim.x;
  // Integer division is ~20 instructions: one per thread, once per block.
  for (int v = threadIdx.x; v < 256; v += kTB) row_of_v[v] = (uint8_t)(v / prm.hp);

  int64_t cur = tb;
  while (cur < te) {
    const int lo = fp4idx__work_of_tile(prm.works, prm.n_works, cur);
    const fp4idx_cuda_work_t wk = prm.works[lo];
    const int64_t wend = lo + 1 < prm.n_works ? prm.works[lo + 1].tile_begin : T;
    const int64_t seg_end = wend < te ? wend : te;
    const fp4idx_cuda_seq_t sq = prm.seqs[wk.seq];
    const int nrows = wk.nrows;
    const int nt_valid = (nrows * prm.hp) >> 3;
    const int nchunks = (nt_valid * 8 + kN - 1) / kN;
    const int32_t width = (int32_t)sq.width;
    // This thread's first key (in this warpgroup's first tile).
    const int32_t lfirst = (int32_t)(cur - wk.tile_begin + wg) * kTileKeys + 16 * warp + g;

    // The first two tiles' keys load under the staging (clamped to the
    // sequence; tiles nobody sees just ignore them).
    Keys2 ka, kb;
    load_keys2(ka, prm.pool, sq.pages, prm.log2_page, width, lfirst, t);
    load_keys2(kb, prm.pool, sq.pages, prm.log2_page, width, lfirst + kstride, t);
    // Weights and lengths: loads issued before the queries' stores.
    uint16_t wv[256 / kTB];
#pragma unroll
    for (int j = 0; j < 256 / kTB; j++) {
      const int v = threadIdx.x + j * kTB;
      const int r = v / prm.hp, h = v - r * prm.hp;  // table not yet visible
      wv[j] = (v < nq && r < nrows && h < prm.heads)
                  ? __ldg(sq.w + (int64_t)(wk.row0 + r) * prm.heads + h) : (uint16_t)0;
    }
    const int32_t lenv = threadIdx.x < nrows ? __ldg(sq.lens + wk.row0 + threadIdx.x) : 0;
    __syncthreads();  // row_of_v visible; the previous segment's readers are done
    for (int i0 = threadIdx.x; i0 < nq * 16; i0 += kQBatch * kTB) {
      uint4 in[kQBatch];
#pragma unroll
      for (int u = 0; u < kQBatch; u++) {
        const int i = i0 + u * kTB, v = (i >> 4) & 255, c = i & 15;
        const int r = row_of_v[v], h = v - r * prm.hp;
        in[u] = make_uint4(0, 0, 0, 0);
        if (i < nq * 16 && r < nrows && h < prm.heads)
          in[u] = __ldg(reinterpret_cast<const uint4 *>(
              sq.q + ((int64_t)(wk.row0 + r) * prm.heads + h) * FP4IDX_HEAD_DIM + c * 8));
      }
#pragma unroll
      for (int u = 0; u < kQBatch; u++) {
        const int i = i0 + u * kTB, v = i >> 4, c = i & 15;
        if (i >= nq * 16) break;
        const int tq = c >> 2, wq = c & 3;
        const uint32_t o[4] = {prmt(in[u].x, in[u].z, 0x5410), prmt(in[u].x, in[u].z, 0x7632),
                               prmt(in[u].y, in[u].w, 0x5410), prmt(in[u].y, in[u].w, 0x7632)};
#pragma unroll
        for (int m = 0; m < 4; m++) {
          const int unit = 4 * wq + m;
          const int kc = unit >> 3, uu = unit & 7;
          *reinterpret_cast<uint32_t *>(q_s + kc * (nq * 128) + v * 128 + ((uu ^ (v & 7)) << 4) +
                                        4 * tq) = o[m];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 256 / kTB; j++) wraw[threadIdx.x + j * kTB] = wv[j];
    if (threadIdx.x < nrows) lens_s[threadIdx.x] = lenv;
    __syncthreads();
    for (int i = threadIdx.x; i < kRowsMax * 32; i += kTB) {
      const int r = i >> 5, unit = i & 31;
      uint32_t wd[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        uint32_t x = 0;
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) {
          const int v = unit * 8 + 2 * e + h2;
          if (r < nrows && v < nq && row_of_v[v] == r)
            x |= ((wraw[v] & 0x8000u) ? 0xBF80u : 0x3F80u) << (16 * h2);
        }
        wd[e] = x;
      }
      const int kc = unit >> 3, uu = unit & 7;
      *reinterpret_cast<uint4 *>(s_s + kc * (kRowsMax * 128) + r * 128 + ((uu ^ (r & 7)) << 4)) =
          make_uint4(wd[0], wd[1], wd[2], wd[3]);
    }
    for (int i = threadIdx.x; i < nq / 2; i += kTB)
      w_s[i] = ((uint32_t)wraw[2 * i] | ((uint32_t)wraw[2 * i + 1] << 16)) & 0x7fff7fffu;
    int32_t maxlen = 0;
    for (int r = 0; r < nrows; r++) maxlen = max(maxlen, lens_s[r]);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    // Tiles some row sees: [cur, act_end); the rest of the segment is -inf.
    int64_t act_end = wk.tile_begin + ((int64_t)maxlen + kTileKeys - 1) / kTileKeys;
    if (act_end > seg_end) act_end = seg_end;
    // This warpgroup's tiles: cur + wg + kWG * i, i < n.
    const int64_t nseg = act_end > cur ? act_end - cur : 0;
    const int n = nseg > wg ? (int)((nseg - wg + kWG - 1) / kWG) : 0;

    if (n > 0) {
      uint32_t a0[2][16], a1[2][16];
      float d[64], acc[16];
      uint32_t accb[8];  // bf16(head sum) pairs {row 2t, row 2t+1}
      // Epilogue of query chunk ch and its head-sum wgmma (not committed):
      // p = bf16(relu(bf16(d)) * |w|) from registers, acc (+)= p . S.
      auto epi_hs = [&](int ch, uint32_t (&pr)[32]) {
        // Opaque: the compiler would hoist these 16 loads out of the tile
        // loop and hold 16 more registers.
        const uint32_t *wp = w_s + opaque((uint32_t)(ch * (kN / 8) * 4 + t));
#pragma unroll
        for (int jj = 0; jj < kN / 8; jj++) {
          const uint32_t w2 = wp[jj * 4];
          pr[2 * jj] = relu_mul_abs_bf16x2(cvt_bf16x2(d[4 * jj], d[4 * jj + 1]), w2);
          pr[2 * jj + 1] = relu_mul_abs_bf16x2(cvt_bf16x2(d[4 * jj + 2], d[4 * jj + 3]), w2);
        }
        wgmma_fence();
        // K rows 128 ch .. 128 ch + 127 of S: chunks 2ch and 2ch + 1.
        const uint32_t slo = opaque(s_lo + ((uint32_t)(ch * 2 * kRowsMax * 128) >> 4));
#pragma unroll
        for (int k2 = 0; k2 < 8; k2++) {
          const uint32_t off = (k2 >> 2) * (kRowsMax * 128) + (k2 & 3) * 32;
          wgmma_m64n32k16(acc, pr[4 * k2], pr[4 * k2 + 1], pr[4 * k2 + 2], pr[4 * k2 + 3],
                          desc_at(slo, off), ch | k2);
        }
      };
      // Tile i's rows: accb[2jr + e2] = key g + 8e2, rows 8jr + 2t + {0, 1}.
      auto store = [&](int i) {
        const int32_t lk = lfirst + i * kstride;
        // Opaque: row pointers recomputed per tile (8 IMADs) instead of up
        // to 16 64-bit pointers held (and spilled) across the tile loop.
        const int64_t wd = (int32_t)opaque((uint32_t)width);
#pragma unroll
        for (int jr = 0; jr < 4; jr++) {
          if (8 * jr >= nrows) break;
#pragma unroll
          for (int e1 = 0; e1 < 2; e1++) {
            const int r = 8 * jr + 2 * t + e1;
            if (r >= nrows) continue;
            const int64_t row = wk.row0 + r;
            float *orow = sq.out + row * wd;
            const uint8_t *mrow = sq.mask ? sq.mask + row * wd : nullptr;
            const int32_t len = lens_s[r];
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {
              const int32_t l = lk + 8 * e2;
              if (l < width) {
                bool vis = l < len;
                if (vis && mrow) vis = mrow[l] != 0;
                const uint32_t b = accb[2 * jr + e2];
                orow[l] = vis ? __uint_as_float(e1 ? (b & 0xffff0000u) : (b << 16)) : -INFINITY;
              }
            }
          }
        }
      };

      // wgmma issue and waits sit in straight-line code or in loops only,
      // never under an if on (to ptxas) divergent data: ptxas would
      // serialize every wgmma of the kernel (C7518/C7520). Hence the odd
      // tile runs alone first (nothing in flight before or after it) and
      // the pipeline takes tiles in pairs, its last step issuing a QK of a
      // tile past the end (keys clamped to the sequence, result unused).
      int i0 = 0;
      if (n & 1) {
        decode_keys2(ka, a0);
#pragma unroll
        for (int j = 0; j < 16; j++) acc[j] = 0.f;
        for (int ch = 0; ch < nchunks; ch++) {
          fence_acc(d);
          wgmma_fence();
          issue_qk(d, a0, q_lo, nq, ch);
          wgmma_commit();
          wgmma_wait0();
          fence_acc(d);
          uint32_t pr[32];
          epi_hs(ch, pr);
          wgmma_commit();
          wgmma_wait0();
          fence_u32(pr);
          fence_acc(acc);
        }
        fence_u32(a0[0]);
        fence_u32(a0[1]);
        pack_rows(acc, accb);
        store(0);
        ka = kb;
        load_keys2(kb, prm.pool, sq.pages, prm.log2_page, width, lfirst + 2 * kstride, t);
        i0 = 1;
      }
      if (i0 < n) {
        decode_keys2(ka, a0);  // tile i0
        fence_acc(d);
        wgmma_fence();
        issue_qk(d, a0, q_lo, nq, 0);
        wgmma_commit();
        decode_keys2(kb, a1);  // tile i0 + 1
        load_keys2(ka, prm.pool, sq.pages, prm.log2_page, width, lfirst + (i0 + 2) * kstride, t);

        // One pipeline step: this warpgroup's tile i, whose keys are in ac
        // (QK(i, 0) in flight); an holds tile i+1, ka the loads of i+2.
        auto step = [&](uint32_t (&ac)[2][16], uint32_t (&an)[2][16], int i) {
          uint32_t pr[32];
          // acc's old value is dead (the first head-sum wgmma has scale-d 0),
          // but "+f" would keep 16 registers for it through the stores and
          // the decode; assigning it here ends that.
#pragma unroll
          for (int j = 0; j < 16; j++) acc[j] = 0.f;
          for (int ch = 0; ch + 1 < nchunks; ch++) {
            wgmma_wait0();  // QK(i, ch) done
            fence_acc(d);
            fence_u32(ac[0]);
            fence_u32(ac[1]);
            epi_hs(ch, pr);
            wgmma_commit();
            issue_qk(d, ac, q_lo, nq, ch + 1);
            wgmma_commit();
            wgmma_wait1();  // HS(i, ch) done
            fence_u32(pr);
            fence_acc(acc);
          }
          wgmma_wait0();  // QK(i, last chunk) done
          fence_acc(d);
          fence_u32(ac[0]);
          fence_u32(ac[1]);
          epi_hs(nchunks - 1, pr);
          wgmma_commit();
          // The next tile's QK goes in before HS(i) is waited for: the
          // tensor core has it while this warpgroup stores and decodes.
          issue_qk(d, an, q_lo, nq, 0);
          wgmma_commit();
          wgmma_wait1();  // HS(i) done
          fence_u32(pr);
          fence_acc(acc);
          pack_rows(acc, accb);
          store(i);
          // ac is free (QK(i, *) done): tile i+2 goes there, i+3 loads.
          decode_keys2(ka, ac);
          load_keys2(ka, prm.pool, sq.pages, prm.log2_page, width, lfirst + (i + 3) * kstride, t);
        };
#pragma unroll 1
        for (int i = i0; i < n; i += 2) {
          step(a0, a1, i);
          step(a1, a0, i + 1);
        }
        wgmma_wait0();  // the QK past the end
        fence_acc(d);
        fence_u32(a0[0]);
        fence_u32(a0[1]);
      }
    }
    for (int64_t tile = act_end > cur ? act_end : cur; tile < seg_end; tile++) {
      // Past every row's visible count: -inf only.
      const int32_t l = (int32_t)(tile - wk.tile_begin) * kTileKeys + (threadIdx.x & 63);
      if (l < width)
        for (int r = threadIdx.x >> 6; r < nrows; r += kTB / 64)
          sq.out[(int64_t)(wk.row0 + r) * width + l] = -INFINITY;
    }
    cur = seg_end;
  }
#endif
}

extern "C" size_t fp4idx__score_sm90_smem(int32_t ntp) {
  return (size_t)ntp * 8 * 256 + kSumBytes + (size_t)ntp * 4 * 4 + 33 * 4 + 256 + 512 + 1024;
}

// FP4IDX_CUDA_SCORER: "v1" the kernel above, "v2" the pipelined kernel with
// one warpgroup per block (2 blocks per SM), "v3" the same with two
// warpgroups sharing one block's staged queries (1 block per SM); unset or
// anything else: FP4IDX_SM90_DEFAULT_SCORER. Read on every plan and launch
// so that a test can switch it.
// The scorer used when FP4IDX_CUDA_SCORER is unset (or unknown).
#define FP4IDX_SM90_DEFAULT_SCORER 1

extern "C" int fp4idx__score_sm90_variant(void) {
  const char *e = getenv("FP4IDX_CUDA_SCORER");
  if (e && !strcmp(e, "v1")) return 1;
  if (e && !strcmp(e, "v2")) return 2;
  if (e && !strcmp(e, "v3")) return 3;
  return FP4IDX_SM90_DEFAULT_SCORER;
}

typedef void (*sm90_kernel_t)(fp4idx_cuda_score_params_t);

static sm90_kernel_t sm90_kernel(int variant, int *threads) {
  *threads = variant == 3 ? 2 * kThreads : kThreads;
  return variant == 2 ? fp4idx_score_sm90_v2_kernel<1, 2>
         : variant == 3 ? fp4idx_score_sm90_v2_kernel<2, 1>
                        : fp4idx_score_sm90_kernel;
}

extern "C" int fp4idx__score_sm90_blocks_per_sm(size_t smem) {
  int threads = 0;
  const sm90_kernel_t k = sm90_kernel(fp4idx__score_sm90_variant(), &threads);
  int n = 0;
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, smem) != cudaSuccess ||
      n < 1) {
    cudaGetLastError();
    n = 1;
  }
  return n;
}

extern "C" int fp4idx__score_sm90_launch(const fp4idx_cuda_score_params_t *p, cudaStream_t stream) {
  const size_t smem = fp4idx__score_sm90_smem(p->ntp);
  int threads = 0;
  const sm90_kernel_t k = sm90_kernel(fp4idx__score_sm90_variant(), &threads);
  int rc = fp4idx__cuda_check(
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
      "score sm90: set smem");
  if (rc) return rc;
  k<<<p->grid, threads, smem, stream>>>(*p);
  return fp4idx__cuda_check(cudaGetLastError(), "score sm90: launch");
}
