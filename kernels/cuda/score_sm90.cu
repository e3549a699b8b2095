/* score_sm90.cu -- the FP4 index scorer on Hopper (sm_90a): a persistent,
 * warp-specialised wgmma kernel.
 *
 * Same contract as score.cu (protocol/PROTOCOL.md appendix, key layout of
 * fp4idx_format.h) and the same arithmetic as the mma.sync kernel, so the
 * same bits; what changes is the schedule.
 *
 * Block: 4 warpgroups, one block per SM, a 1-D grid of <= SMs blocks; block
 * b takes the contiguous range [T*b/G, T*(b+1)/G) of the 64-key tiles of the
 * flattened work list (score.cu's planner: every sequence of the batch), so
 * long contexts and many sequences alike spread over every SM.
 *   - Producer (warpgroup 3, setmaxnreg down to 32 registers; one warp
 *     works): copies each key tile (64 keys x 68 bytes, page-indexed) into a
 *     kStages-deep shared-memory ring guarded by mbarriers: with the bulk
 *     copy engine (cp.async.bulk, 2 copies per tile: payload, scales) when a
 *     page holds >= 64 keys, else with per-lane cp.async. Page ids of 32
 *     tiles are fetched in one round trip.
 *   - Consumers (warpgroups 0..2, setmaxnreg up to 160): consumer c takes
 *     the block's visible tiles c, c+3, ...: waits for the tile's stage,
 *     decodes the keys (lane (g, t) of warp w: keys 16w+g and 16w+g+8, scale
 *     block t: one LDS.128 + one byte each) straight into the A registers of
 *     wgmma, frees the stage, then
 *       1. d = K_tile . Q^T: wgmma.m64n128k16, B = query vectors in shared
 *          memory (K-major, 128-byte swizzle), 8 k-steps per 128 vectors;
 *       2. p = bf16(relu(bf16(d)) * |w|): cvt.rn.bf16x2 + fma.rn.relu.bf16x2
 *          (rounding is monotone and odd, so relu commutes with it);
 *       3. head sum on the tensor core: p (the accumulator layout of n8
 *          blocks 2k, 2k+1 is the A layout of k-step k) times S^T [rows]
 *          [256 vectors], S = sign(w_v) where vector v belongs to row r:
 *          exact products, f32 sums exact on dyadic data (the CPU oracle
 *          sums in float64 and agreed on every test); m64n8k16 when no
 *          work has more than 8 rows, else m64n32k16; then one bf16
 *          rounding and the -inf / mask rule per (row, key).
 *     The three consumers' wgmma, decode and epilogue phases interleave on
 *     the SM (one's tensor-core work runs under another's ALU work); none
 *     of them waits for global memory.
 *   - Per work segment the 384 consumer threads stage Q (swizzled, whole
 *     16-byte units), |w|, S, the lengths and the output / mask row
 *     pointers ONCE for all three consumers; the producer reads the
 *     lengths itself and runs ahead, so the first tiles' keys load under
 *     the staging. Tiles past every row's visible count only get -inf.
 *     A plan of one work whose descriptor the caller copied into the
 *     parameters (has_seq0: the backend does for every one-work call)
 *     reads neither the work list nor the descriptors, and the producer's
 *     first page ids load beside the lengths: the first tile's keys are two
 *     dependent loads and a bulk copy away (four loads before).
 *   - Launched with programmatic stream serialization (PDL): barrier setup
 *     and the v/hp table run under the previous kernel's tail, every
 *     global access comes after griddepcontrol.wait.
 * No exp2, no special-function unit (tests/sass_check.sh). Shared memory:
 * nq*256 B of queries (nq = ntp*8, a multiple of 128) + 16 KB of S + the
 * ring (kStages x 4352 B) + barriers, weights, row pointers, lengths, a
 * v/hp table. Only compiled into the sm_90a image; plans for
 * FP4IDX_CUDA_SCORER_WGMMA (chosen once per device on CC 9.0) run it.
 * Measured: docs/RESULTS.md.
 */
#include <cuda_bf16.h>
#include <stdio.h>

#include "bf16x2_ops.cuh"
#include "fp4idx_cuda.h"
#include "fp4idx_decode.cuh"
#include "launch_args.cuh"
#include "score_work.cuh"

// The kernel body exists only in the sm_90a image (wgmma, setmaxnreg);
// elsewhere it is empty and the planner never launches it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FP4IDX_SM90 1
#endif

namespace {

constexpr int kConsumers = 3;                     // consumer warpgroups
constexpr int kCThreads = kConsumers * 128;       // consumer threads
constexpr int kSm90Threads = kCThreads + 128;         // + the producer warpgroup
// setmaxnreg moves registers within the block's own pool only: what the
// producer releases must cover what the consumers take (512 threads x 128
// at entry under __launch_bounds__(512, 1)), or setmaxnreg.inc waits
// forever (2 consumers at 240 and a producer at 32 do not balance).
constexpr int kConsumerRegs = 160, kProducerRegs = 32;
static_assert(kConsumers * 128 * kConsumerRegs + 128 * kProducerRegs == kSm90Threads * 128,
              "register hand-over must balance");
constexpr int kStages = 8;                        // key-tile ring depth
constexpr int kSm90TileKeys = 64;
constexpr int kPayBytes = kSm90TileKeys * 64;         // payload of a tile: [64 keys][64 B]
constexpr int kStageBytes = kPayBytes + kSm90TileKeys * 4;  // + scales [64 keys][4 B]
constexpr int kRowsMax = 32;                      // rows per work (256 query vectors / 8)
constexpr int kSumBytes = 4 * kRowsMax * 128;     // head-sum matrix, K = 256
#ifdef FP4IDX_SM90
constexpr int kN = 128;  // query vectors per wgmma
constexpr uint32_t kCBarrier = 1;                 // named barrier of the consumers
#endif

#ifdef FP4IDX_SM90
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

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

// D[64x8] (+)= A[64x16] (registers) * B[16x8] (shared, K-major, SW128): the
// head sum when no work has more than 8 rows.
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint64_t desc,
                                               int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %8, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %9, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(scale_d), "l"(desc));
}

// D[64x32] (+)= A[64x16] (registers) * B[16x32] (shared, K-major, SW128).
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[16], uint32_t a0, uint32_t a1,
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
// An opaque copy: the compiler cannot hoist what is computed from it out of
// a loop (loop-invariant addresses held across the tile loop cost registers).
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  uint32_t y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

template <int N>
__device__ __forceinline__ void fence_u32(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}


// Descriptor: K-major, 128-byte swizzle, 8-row groups 1024 B apart.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}
#endif

#ifdef FP4IDX_SM90
// The row results of a tile rounded to bf16 once (RNE, as
// __float2bfloat16_rn), two per register: accb[2jr + e2] = {acc[4jr + 2e2],
// acc[4jr + 2e2 + 1]} -- rows 8jr + 2t and 8jr + 2t + 1 of key g + 8e2.
template <int N>
__device__ __forceinline__ void pack_rows(const float (&acc)[N], uint32_t (&accb)[N / 2]) {
#pragma unroll
  for (int j = 0; j < N / 2; j++) accb[j] = fp4idx__cvt_bf16x2(acc[2 * j], acc[2 * j + 1]);
}
// bf16(relu(d) * |w|) as relu(bf16(d * |w| + -0)): one fma.relu (rounding
// is monotone and odd, so relu and rounding commute); w's sign is applied by
// the head-sum matrix S (entries +-1), exactly.
__device__ __forceinline__ uint32_t relu_mul_abs_bf16x2(uint32_t d, uint32_t wabs) {
  uint32_t r;
  asm("fma.rn.relu.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(d), "r"(wabs), "r"(0x80008000u));
  return r;
}


// ---- mbarriers, copies, named barriers, register hand-over ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Returns once the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Bulk copy engine: global -> shared, completion counted on `bar` in bytes.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
// One arrival on `bar` once this thread's earlier cp.async are complete.
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"r"(kCBarrier), "r"(kCThreads) : "memory");
}

// Lengths of a work: the largest visible count of its rows, read by one warp.
__device__ __forceinline__ int32_t warp_maxlen(const int32_t *lens, int nrows, int lane) {
  int32_t L = 0;
  for (int r = lane; r < nrows; r += 32) L = max(L, __ldg(lens + r));
  return __reduce_max_sync(0xffffffffu, L);
}

// End of the segment's tiles that some row sees (maxlen = the largest
// visible count): [cur, result) get scores, [result, seg_end) only -inf.
// Never before cur: the producer and the consumers count the same tiles.
__device__ __forceinline__ int64_t visible_end(const fp4idx_cuda_work_t &wk, int32_t maxlen,
                                               int64_t cur, int64_t seg_end) {
  int64_t e = wk.tile_begin + ((int64_t)maxlen + kSm90TileKeys - 1) / kSm90TileKeys;
  e = e < seg_end ? e : seg_end;
  return e > cur ? e : cur;
}

// Lane l's page id of tile tile0 + l of the work (whole-page tiles only;
// 0 past n tiles or for smaller pages): 32 tiles' ids in one round trip.
__device__ __forceinline__ int32_t page_ids(const fp4idx_cuda_score_params_t &prm,
                                            const fp4idx_cuda_seq_t &sq, int64_t tile0, int n,
                                            int lane) {
  if (prm.log2_page < 6 || lane >= n) return 0;
  return __ldg(sq.pages + ((((int32_t)(tile0 + lane)) * kSm90TileKeys) >> prm.log2_page));
}

// The producer warp: tiles [cur, cur + nact) of the work (block tile index
// j0..), each into stage j % kStages once the consumers freed it; pid0:
// page_ids of its first 32 tiles (or more: ids past nact are not used).
__device__ __forceinline__ void produce(const fp4idx_cuda_score_params_t &prm,
                                        const fp4idx_cuda_seq_t &sq, int64_t tile0, int nact,
                                        int32_t pid0, uint32_t j0, uint32_t ring, uint32_t full,
                                        uint32_t empty, int lane) {
  const int32_t log2p = prm.log2_page, width = (int32_t)sq.width;
  const uint32_t pmask = (1u << log2p) - 1u;
  const uint64_t page_bytes = (uint64_t)FP4IDX_SLOT_BYTES << log2p;
  for (int i0 = 0; i0 < nact; i0 += 32) {
    const int32_t pid = i0 == 0 ? pid0 : page_ids(prm, sq, tile0 + i0, nact - i0, lane);
    const int n = nact - i0 < 32 ? nact - i0 : 32;
    for (int k = 0; k < n; k++) {
      const uint32_t j = j0 + (uint32_t)(i0 + k), s = j % kStages;
      if (j >= (uint32_t)kStages) mbar_wait(empty + 8 * s, ((j / kStages) - 1) & 1);
      const int32_t l0 = (int32_t)(tile0 + i0 + k) * kSm90TileKeys;
      const uint32_t dst = ring + s * kStageBytes, bar = full + 8 * s;
      if (log2p >= 6) {
        // The tile is 64 consecutive slots of one page: payload and scales
        // are two contiguous runs (16-byte aligned: P*68 % 16 == 0).
        const uint32_t page = (uint32_t)__shfl_sync(0xffffffffu, pid, k);
        if (lane == 0) {
          const uint8_t *base = prm.pool + (uint64_t)page * page_bytes;  // 64-bit: pools > 4 GiB
          const uint32_t o = (uint32_t)l0 & pmask;
          mbar_expect_tx(bar, kStageBytes);
          bulk_copy(dst, base + (uint64_t)o * 64, kPayBytes, bar);
          bulk_copy(dst + kPayBytes, base + ((uint64_t)64 << log2p) + (uint64_t)o * 4,
                    kSm90TileKeys * 4, bar);
        }
      } else {
        // Pages of < 64 keys: lane takes keys lane and lane + 32 (clamped to
        // the sequence: a page past its end need not exist).
#pragma unroll
        for (int m = 0; m < 2; m++) {
          const int key = lane + 32 * m;
          int32_t l = l0 + key;
          if (l > width - 1) l = width - 1;
          const uint32_t page = (uint32_t)__ldg(sq.pages + (l >> log2p));
          const uint32_t o = (uint32_t)l & pmask;
          const uint8_t *base = prm.pool + (uint64_t)page * page_bytes;
          const uint8_t *src = base + (uint64_t)o * 64;
          if (log2p >= 2) {
#pragma unroll
            for (int c = 0; c < 4; c++) cp_async16(dst + key * 64 + 16 * c, src + 16 * c);
          } else {  // pages of 1 or 2 keys: 4-byte alignment only
#pragma unroll
            for (int c = 0; c < 16; c++) cp_async4(dst + key * 64 + 4 * c, src + 4 * c);
          }
          cp_async4(dst + kPayBytes + key * 4, base + ((uint64_t)64 << log2p) + (uint64_t)o * 4);
        }
        cp_async_arrive(bar);
      }
    }
  }
}
#endif  // FP4IDX_SM90

}  // namespace

// kHsN: columns of the head-sum wgmma = the most rows a work may have (8 or
// 32; the launcher picks 8 when the plan's works have <= 8 rows).
template <int kHsN>
__global__ void __launch_bounds__(kSm90Threads, 1)
    fp4idx_score_sm90_kernel(const __grid_constant__ fp4idx_cuda_score_params_t prm) {
#ifdef FP4IDX_SM90
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = (uint32_t)__cvta_generic_to_shared(smem_raw);
  uint8_t *smem = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  const int nq = prm.ntp * 8;                                      // query rows in smem
  uint8_t *q_s = smem;                                             // [2 kc][nq][128 B]
  uint8_t *s_s = smem + nq * 256;                                  // [4 kc][32 rows][128 B]
  uint8_t *ring_s = s_s + kSumBytes;                               // [kStages][4352 B]
  uint64_t *bars = reinterpret_cast<uint64_t *>(ring_s + kStages * kStageBytes);  // full, empty
  // |w| pairs: w_s[t * ws + c] = pair 4c + t (vectors 8c + 2t, 8c + 2t + 1),
  // so lane t reads its 16 pairs of a chunk with 4 LDS.128; rows padded by
  // 4 words (the four t rows land on distinct banks).
  const int ws = prm.ntp + 4;
  uint32_t *w_s = reinterpret_cast<uint32_t *>(bars + 2 * kStages);  // [4][ws] bf16x2
  float **orow_s = reinterpret_cast<float **>(w_s + 4 * ws);         // [32] output rows
  const uint8_t **mrow_s =  // [32] mask rows
      reinterpret_cast<const uint8_t **>(reinterpret_cast<void *>(orow_s + kRowsMax));
  int32_t *lens_s = reinterpret_cast<int32_t *>(mrow_s + kRowsMax);  // [32]
  uint8_t *row_of_v = reinterpret_cast<uint8_t *>(lens_s + 32);    // [256] v / hp
  uint16_t *wraw = reinterpret_cast<uint16_t *>(row_of_v + 256);   // [256]
  const uint32_t q_addr = (uint32_t)__cvta_generic_to_shared(q_s);
  const uint32_t s_addr = (uint32_t)__cvta_generic_to_shared(s_s);
  const uint32_t ring = (uint32_t)__cvta_generic_to_shared(ring_s);
  const uint32_t full = (uint32_t)__cvta_generic_to_shared(bars);
  const uint32_t empty = full + 8 * kStages;

  // Warpgroup index through a shuffle: visibly warp-uniform to ptxas.
  const int wg = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);
  const int lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; s++) {
      mbar_init(full + 8 * s, prm.log2_page >= 6 ? 1 : 32);  // expect_tx arrive / 32 lanes
      mbar_init(empty + 8 * s, 128);                            // the consuming warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // Integer division is ~20 instructions: one per thread, into a table.
  for (int v = threadIdx.x; v < 256; v += kSm90Threads) row_of_v[v] = (uint8_t)(v / prm.hp);
  // Programmatic dependent launch: the next kernel of the stream may start
  // its own prologue as this grid's blocks leave their SMs, and this one ran
  // the above (shared memory, parameters only) under the previous kernel's
  // tail. Every global access is past the wait: it returns once the
  // previous kernel has completed and its writes are visible, as ordinary
  // stream order would (a no-op when launched without the attribute).
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __syncthreads();

  const int64_t T = prm.total_tiles;
  const int64_t tb = T * blockIdx.x / gridDim.x;
  const int64_t te = T * (blockIdx.x + 1) / gridDim.x;

  if (wg == kConsumers) {
    // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    if ((threadIdx.x >> 5) == kConsumers * 4) {
      uint32_t j = 0;  // visible tiles of this block so far
      for (int64_t cur = tb; cur < te;) {
        int64_t seg_end;
        fp4idx_cuda_seq_t sq;
        const fp4idx_cuda_work_t wk = fp4idx__segment_seq(prm, cur, te, &seg_end, &sq);
        // The first 32 tiles' page ids load beside the lengths (tiles before
        // seg_end lie inside the sequence: their pages exist).
        const int64_t tile0 = cur - wk.tile_begin;
        const int32_t pid0 = page_ids(prm, sq, tile0, (int)(seg_end - cur), lane);
        const int32_t maxlen = warp_maxlen(sq.lens + wk.row0, wk.nrows, lane);
        const int nact = (int)(visible_end(wk, maxlen, cur, seg_end) - cur);
        produce(prm, sq, tile0, nact, pid0, j, ring, full, empty, lane);
        j += (uint32_t)nact;
        cur = seg_end;
      }
    }
  } else {
    // ---- consumer warpgroups ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    const int ct = threadIdx.x;  // 0 .. kCThreads-1
    const int warp = (ct >> 5) & 3;
    const int g = lane >> 2, t = lane & 3;
    uint32_t j = 0;
    for (int64_t cur = tb; cur < te;) {
      int64_t seg_end;
      fp4idx_cuda_seq_t sq;
      const fp4idx_cuda_work_t wk = fp4idx__segment_seq(prm, cur, te, &seg_end, &sq);
      const int nrows = wk.nrows;
      const int nt_valid = (nrows * prm.hp) >> 3;  // n8 blocks holding real rows
      const int nchunks = (nt_valid * 8 + kN - 1) / kN;
      const int32_t width = (int32_t)sq.width;

      // Weights and lengths: loads issued before the queries' stores.
      uint16_t wv = 0;
      if (ct < 256) {
        const int r = row_of_v[ct], h = ct - r * prm.hp;
        if (ct < nq && r < nrows && h < prm.heads)
          wv = __ldg(sq.w + (int64_t)(wk.row0 + r) * prm.heads + h);
      }
      const int32_t lenv = ct < nrows ? __ldg(sq.lens + wk.row0 + ct) : 0;
      consumers_sync();  // the previous segment's readers of q_s / s_s / w_s / lens_s are done
      // Stage the queries: input chunk (v, c) = dims 8c..8c+7 of vector v;
      // with c = 4t'+w', its word pairs (d0,d4) (d1,d5) (d2,d6) (d3,d7) sit at
      // logical K = 32w' + 2t' + {0,8,16,24} (the decoder's K order), in the
      // SW128 K-major layout: [kc = K/64][row v][16-byte unit u ^ (v & 7)].
      // One item = vector v and w': its chunks 4t'+w' (t' = 0..3) fill the
      // four whole units 4w'+m (word t' = pair m of chunk 4t'+w'): 4 loads,
      // 16 PRMT, 4 STS.128; two items per step for 8 loads in flight.
      for (int it0 = ct; it0 < nq * 4; it0 += 2 * kCThreads) {
        uint4 in[2][4];
#pragma unroll
        for (int u = 0; u < 2; u++) {
          const int it = it0 + u * kCThreads, v = (it >> 2) & 255, w = it & 3;
          const int r = row_of_v[v], h = v - r * prm.hp;
          const bool live = it < nq * 4 && r < nrows && h < prm.heads;
          const uint4 *src =
              reinterpret_cast<const uint4 *>(
                  sq.q + ((int64_t)(wk.row0 + r) * prm.heads + h) * FP4IDX_HEAD_DIM) + w;
#pragma unroll
          for (int t4 = 0; t4 < 4; t4++)
            in[u][t4] = live ? __ldg(src + 4 * t4) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
          const int it = it0 + u * kCThreads, v = it >> 2, w = it & 3;
          if (it >= nq * 4) break;
          uint8_t *dst = q_s + (w >> 1) * (nq * 128) + v * 128;
#pragma unroll
          for (int m = 0; m < 4; m++) {
            uint32_t o[4];
#pragma unroll
            for (int t4 = 0; t4 < 4; t4++) {
              const uint4 &x = in[u][t4];
              o[t4] = m == 0 ? fp4idx__prmt(x.x, x.z, 0x5410)
                      : m == 1 ? fp4idx__prmt(x.x, x.z, 0x7632)
                      : m == 2 ? fp4idx__prmt(x.y, x.w, 0x5410)
                               : fp4idx__prmt(x.y, x.w, 0x7632);
            }
            const int uu = 4 * (w & 1) + m;
            *reinterpret_cast<uint4 *>(dst + ((uu ^ (v & 7)) << 4)) =
                make_uint4(o[0], o[1], o[2], o[3]);
          }
        }
      }
      if (ct < 256) wraw[ct] = wv;
      if (ct < nrows) {
        lens_s[ct] = lenv;
        const int64_t row = wk.row0 + ct;
        orow_s[ct] = sq.out + row * sq.width;
        mrow_s[ct] = sq.mask ? sq.mask + row * sq.width : nullptr;
      }
      consumers_sync();
      // |w| pairs for the epilogue and the head-sum matrix S^T [32 rows r]
      // [256 vectors v] = sign(w_v) where v belongs to row r: the tensor
      // core sums each row's H products -- B of the second wgmma.
      // A unit (8 consecutive v) lies in one row's hp vectors (hp % 8 == 0):
      // sign(w_v) * 1.0 for all 8 when that row is r (padding heads have
      // w = 0 and q = 0: +1 times +0), else zeros.
      for (int i = ct; i < kRowsMax * 32; i += kCThreads) {
        const int r = i >> 5, unit = i & 31;
        uint4 wd = make_uint4(0, 0, 0, 0);
        const int v0 = unit * 8 - r * prm.hp;
        if (r < nrows && v0 >= 0 && v0 < prm.hp) {
          const uint4 w8 = *reinterpret_cast<const uint4 *>(wraw + unit * 8);
          wd = make_uint4((w8.x & 0x80008000u) | 0x3F803F80u, (w8.y & 0x80008000u) | 0x3F803F80u,
                          (w8.z & 0x80008000u) | 0x3F803F80u, (w8.w & 0x80008000u) | 0x3F803F80u);
        }
        const int kc = unit >> 3, uu = unit & 7;
        *reinterpret_cast<uint4 *>(s_s + kc * (kRowsMax * 128) + r * 128 + ((uu ^ (r & 7)) << 4)) =
            wd;
      }
      for (int i = ct; i < nq / 2; i += kCThreads)
        w_s[(i & 3) * ws + (i >> 2)] =
            ((uint32_t)wraw[2 * i] | ((uint32_t)wraw[2 * i + 1] << 16)) & 0x7fff7fffu;
      int32_t maxlen = 0;
      for (int r = 0; r < nrows; r++) maxlen = max(maxlen, lens_s[r]);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // Q, S -> wgmma
      consumers_sync();

      // Visible tiles [cur, act_end): this warpgroup's are those whose block
      // index j + i is wg mod kConsumers (the producer's numbering).
      const int64_t act_end = visible_end(wk, maxlen, cur, seg_end);
      const int nact = (int)(act_end - cur);
      const int ifirst = (int)((wg + kConsumers - (int)(j % kConsumers)) % kConsumers);
      // Software pipeline over this warpgroup's tiles: tile k's decode runs
      // while the head-sum wgmma of tile k-1 is on the tensor core, and the
      // row stores of tile k-1 while the QK wgmma of tile k is. wgmma and
      // waits sit in straight-line code and loops only (under an if ptxas
      // would serialize every wgmma of the kernel); registers a wgmma in
      // flight reads or writes stay live (fences after the wait).
      const int n_my = nact > ifirst ? (nact - ifirst + kConsumers - 1) / kConsumers : 0;
      const int k0 = 16 * warp + g;  // this thread's keys: k0 and k0 + 8 of a tile
      uint32_t a[2][16], pr[32], accb[kHsN / 4];
      float acc[kHsN / 2];  // [64 keys x kHsN rows]: head sums
      float d[64];
      // Tile i's rows: accb[2jr + e2] = key k0 + 8e2, rows 8jr + 2t + {0, 1}.
      auto store = [&](int i) {
        // Row pointers, masks and lengths come from shared memory (set once
        // per segment): no 64-bit row products per tile, no registers held.
        const int32_t lk = (int32_t)(cur + i - wk.tile_begin) * kSm90TileKeys + k0;
#pragma unroll
        for (int jr = 0; jr < kHsN / 8; jr++) {
          if (8 * jr >= nrows) break;
#pragma unroll
          for (int e1 = 0; e1 < 2; e1++) {
            const int r = 8 * jr + 2 * t + e1;
            if (r >= nrows) continue;
            float *orow = orow_s[r];
            const uint8_t *mrow = mrow_s[r];
            const int32_t len = lens_s[r];
            // The mask test per row (the same for every row of a sequence),
            // so that the common unmasked case is predicated stores only.
            if (!mrow) {
#pragma unroll
              for (int e2 = 0; e2 < 2; e2++) {
                const int32_t l = lk + 8 * e2;
                const uint32_t b = accb[2 * jr + e2];
                const float v = __uint_as_float(e1 ? (b & 0xffff0000u) : (b << 16));
                const float o = l < len ? v : -INFINITY;
                if (l < width) orow[l] = o;
              }
            } else {
#pragma unroll
              for (int e2 = 0; e2 < 2; e2++) {
                const int32_t l = lk + 8 * e2;
                if (l < width) {
                  const uint32_t b = accb[2 * jr + e2];
                  const bool vis = l < len && mrow[l] != 0;
                  orow[l] = vis ? __uint_as_float(e1 ? (b & 0xffff0000u) : (b << 16))
                                : -INFINITY;
                }
              }
            }
          }
        }
      };
      // Tile (block index) i's keys -> a; frees its stage.
      auto decode = [&](int i) {
        const uint32_t jt = j + (uint32_t)i, s = jt % kStages;
        mbar_wait(full + 8 * s, (jt / kStages) & 1);
        const uint8_t *st = ring_s + s * kStageBytes;
        const uint4 p0 = *reinterpret_cast<const uint4 *>(st + k0 * 64 + t * 16);
        const uint4 p1 = *reinterpret_cast<const uint4 *>(st + (k0 + 8) * 64 + t * 16);
        const uint32_t s0 = st[kPayBytes + k0 * 4 + t], s1 = st[kPayBytes + (k0 + 8) * 4 + t];
        if (__all_sync(0xffffffffu, fp4idx__scale_fast(s0) && fp4idx__scale_fast(s1))) {
          fp4idx__decode_block_fast(p0, s0, a[0]);
          fp4idx__decode_block_fast(p1, s1, a[1]);
        } else {
          fp4idx__decode_block(p0, s0, a[0]);
          fp4idx__decode_block(p1, s1, a[1]);
        }
        mbar_arrive(empty + 8 * s);  // the stage's bytes are in registers now
      };
      for (int k = 0; k < n_my; k++) {
        const int i = ifirst + k * kConsumers;
        if (k == 0) decode(i);
        // acc's old value is dead (the first head-sum k-step has scale-d 0);
        // zeros here end its live range before the QK (16 registers).
#pragma unroll
        for (int e = 0; e < kHsN / 2; e++) acc[e] = 0.f;
        auto chunk = [&](int ch) {
          // Descriptors of the 8 k-steps: an opaque base (not held across the
          // tile loop), the K 64..127 half nq * 128 bytes on, and the 32-byte
          // k-steps added to the address field in 16-byte units (no carry
          // out of it: shared addresses < 2^18) -- one uniform add each.
          const uint64_t qd0 = make_desc(opaque(q_addr + ch * (kN * 128)));
          const uint64_t qd1 = qd0 + (uint32_t)(nq * 8);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < 8; kk++) {
            const int w4 = kk >> 1, n0 = 2 * (kk & 1);
            const uint64_t desc = (kk < 4 ? qd0 : qd1) + (uint32_t)((kk & 3) * 2);
            if (kk == 0)  // D as outputs only: d's old value is dead
              wgmma_m64n128k16_zero(d, a[0][4 * w4 + n0], a[1][4 * w4 + n0],
                                    a[0][4 * w4 + n0 + 1], a[1][4 * w4 + n0 + 1], desc);
            else
              wgmma_m64n128k16(d, a[0][4 * w4 + n0], a[1][4 * w4 + n0], a[0][4 * w4 + n0 + 1],
                               a[1][4 * w4 + n0 + 1], desc, 1);
          }
          wgmma_commit();
          if (ch == 0 && k > 0) store(i - kConsumers);  // under this tile's QK
          wgmma_wait0();  // QK(ch) done
          fence_acc(d);
          fence_u32(a[0]);
          fence_u32(a[1]);
          fence_acc(acc);
          // p = bf16(relu(bf16(d)) * w) in bf16x2, straight into the A
          // registers of the head-sum wgmma.
          const uint4 *wp =
              reinterpret_cast<const uint4 *>(w_s + opaque((uint32_t)(t * ws + ch * (kN / 8))));
          uint32_t wv2[kN / 8];
#pragma unroll
          for (int q4 = 0; q4 < kN / 32; q4++) {
            const uint4 w4v = wp[q4];
            wv2[4 * q4] = w4v.x;
            wv2[4 * q4 + 1] = w4v.y;
            wv2[4 * q4 + 2] = w4v.z;
            wv2[4 * q4 + 3] = w4v.w;
          }
#pragma unroll
          for (int jj = 0; jj < kN / 8; jj++) {
            const uint32_t w2 = wv2[jj];
            pr[2 * jj] = relu_mul_abs_bf16x2(fp4idx__cvt_bf16x2(d[4 * jj], d[4 * jj + 1]), w2);
            pr[2 * jj + 1] = relu_mul_abs_bf16x2(fp4idx__cvt_bf16x2(d[4 * jj + 2], d[4 * jj + 3]), w2);
          }
          wgmma_fence();
          // K rows 128 ch .. 128 ch + 127 of S: its 64-row chunks 2ch, 2ch + 1.
          const uint64_t sd = make_desc(opaque(s_addr + ch * 2 * (kRowsMax * 128)));
#pragma unroll
          for (int k2 = 0; k2 < 8; k2++) {
            const uint64_t desc =
                sd + (uint32_t)(((k2 >> 2) * (kRowsMax * 128) + (k2 & 3) * 32) >> 4);
            wgmma_m64nNk16(acc, pr[4 * k2], pr[4 * k2 + 1], pr[4 * k2 + 2], pr[4 * k2 + 3],
                            desc, ch | k2);
          }
          wgmma_commit();
        };
        // Every chunk but the last waits for its head sums (pr is reused);
        // the last one's run under the next tile's decode. (Peeled: a wait
        // under an if would let ptxas see head sums in flight at the next
        // QK and serialize every wgmma.)
        for (int ch = 0; ch + 1 < nchunks; ch++) {
          chunk(ch);
          wgmma_wait0();
          fence_u32(pr);
          fence_acc(acc);
        }
        chunk(nchunks - 1);
        // The next tile's keys decode under this tile's head sums (a is
        // free: QK done).
        if (k + 1 < n_my) decode(i + kConsumers);
        wgmma_wait0();  // head sums done
        fence_u32(pr);
        fence_acc(acc);
        pack_rows(acc, accb);
      }
      if (n_my > 0) store(ifirst + (n_my - 1) * kConsumers);
      // Past every row's visible count: -inf only, all consumer threads.
      for (int64_t tile = act_end; tile < seg_end; tile++) {
        const int32_t l = (int32_t)(tile - wk.tile_begin) * kSm90TileKeys + (ct & 63);
        if (l < width)
          for (int r = ct >> 6; r < nrows; r += kCThreads / 64)
            sq.out[(int64_t)(wk.row0 + r) * width + l] = -INFINITY;
      }
      j += (uint32_t)nact;
      cur = seg_end;
    }
  }
#endif
}

extern "C" size_t fp4idx__score_sm90_smem(int32_t ntp) {
  return (size_t)ntp * 8 * 256 + kSumBytes + (size_t)kStages * kStageBytes + 2 * kStages * 8 +
         (size_t)(ntp + 4) * 4 * 4 + 2 * kRowsMax * 8 + 32 * 4 + 256 + 512 + 1024;
}

typedef void (*sm90_kernel_t)(fp4idx_cuda_score_params_t);

// The instantiation whose head-sum width holds every work's rows: a work
// has nrows * hp <= ntp * 8 query vectors, so ntp <= hp means <= 8 rows.
static sm90_kernel_t sm90_kernel(int32_t ntp, int32_t hp) {
  return ntp <= hp ? fp4idx_score_sm90_kernel<8> : fp4idx_score_sm90_kernel<32>;
}

// Raises both instantiations' dynamic shared-memory limit to smem (once
// per device, from score.cu). FP4IDX_OK or FP4IDX_EDEVICE.
extern "C" int fp4idx__score_sm90_set_smem(size_t smem) {
  int rc = fp4idx__cuda_check(cudaFuncSetAttribute(fp4idx_score_sm90_kernel<8>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)smem),
                              "score sm90: set smem");
  if (rc) return rc;
  return fp4idx__cuda_check(cudaFuncSetAttribute(fp4idx_score_sm90_kernel<32>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem),
                            "score sm90: set smem");
}

// Blocks per SM at smem (after fp4idx__score_sm90_set_smem); 1 where the
// query fails. Both instantiations have the same threads, registers at
// entry and shared memory: the same occupancy.
extern "C" int fp4idx__score_sm90_blocks_per_sm(size_t smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fp4idx_score_sm90_kernel<32>,
                                                    kSm90Threads, smem) != cudaSuccess ||
      n < 1) {
    cudaGetLastError();
    n = 1;
  }
  return n;
}

// The launch of a checked plan. Programmatic stream serialization (PDL):
// the launch may begin before the previous kernel in the stream ends; the
// kernel waits for it (griddepcontrol.wait) before its first global
// access. Captured into a graph as a programmatic edge.
extern "C" void fp4idx__score_sm90_describe(const fp4idx_cuda_score_params_t *p,
                                            fp4idx_cuda_launch_t *l) {
  fp4idx__launch_begin(l, sm90_kernel(p->ntp, p->hp), (unsigned)p->grid, kSm90Threads,
                       fp4idx__score_sm90_smem(p->ntp), 0, 1);
  fp4idx__launch_arg(l, *p);
}
