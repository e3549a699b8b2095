/* score.cu -- the FP4 index scorer (protocol/PROTOCOL.md, appendix "Key
 * format and scorer") on tensor cores: the portable mma.sync kernel (sm_80+), the planner and the launcher. The
 * backend picks the scorer once per device (fp4idx_cuda_scorer_for_device):
 * on compute capability 9.0 the plan is for score_sm90.cu (wgmma) and the
 * launcher runs that kernel instead.
 *
 * For each sequence: R verify rows x H heads = M query vectors against every
 * key position l < width:
 *   d[h] = bf16(q[r,h] . k_l); p[h] = bf16(relu(d[h]) * w[r,h]);
 *   logit[r,l] = bf16(sum_h p[h]), or -inf if l >= lens[r] or mask[r,l] == 0.
 *
 * Shape of the work. Keys are the MMA's M side (16 keys per m-tile, two
 * m-tiles = one 32-key tile per warp), the query vectors its N side (8 per
 * n-tile), K = 128 the head dim: mma.sync.m16n8k16 bf16 -> f32.
 *   - A (keys) is decoded straight from the packed bytes into registers,
 *     ONCE per tile, and reused for every query vector of the sequence.
 *     Lane (g = lane/4, t = lane%4) owns keys g, g+8, g+16, g+24 of the tile
 *     and, of each, scale block t (16 payload bytes, one LDG.128, one scale
 *     byte): the K dimension is permuted so that a lane's A elements are
 *     exactly one 32-element block. The dot product does not care about
 *     the order of K as long as Q uses the same one.
 *   - B (queries) sits in shared memory, staged once per (block, work) with
 *     the same K permutation, so one LDS.128 gives a lane the B fragments of
 *     two k-steps; a 16-byte XOR swizzle keeps the LDS.128 conflict-free.
 *   - Epilogue per n-tile in bf16x2: round (cvt.rn.bf16x2), relu (max),
 *     times w (mul.rn.bf16x2: one rounding of an exact product), then the
 *     head sum in f32 in registers; across the 4 lanes of a quad with a
 *     3-shuffle reduce-scatter that leaves lane t with key g+8t of the row.
 *     The f32 head sum is exact whenever the p[h] span < 2^24 / H in
 *     magnitude (always on dyadic data; its only effect otherwise is in the
 *     last place of the f32 before the final bf16 rounding).
 *
 * Grid: a 1-D grid of persistent-ish blocks (<= occupancy * SMs). The work
 * list (one entry per sequence and chunk of rows whose query vectors fit in
 * 256) is flattened into 32-key tiles; block b takes the contiguous tile
 * range [T*b/G, T*(b+1)/G), so long contexts split across all SMs and short
 * ones still fill the chip. Within a block the 4 warps interleave tiles.
 * Lengths and masks are read on the device: a tile past every row's length
 * only writes -inf, and the same launch can be replayed from a CUDA graph
 * with new lengths.
 *
 * Block: 128 threads (4 warps). Shared memory: ntp*8 query vectors * 256 B
 * (swizzled) + their weights + the rows' lengths.
 */
#include <atomic>

#include <cuda_bf16.h>
#include <stdio.h>

#include "bf16x2_ops.cuh"
#include "fp4idx_cuda.h"
#include "fp4idx_decode.cuh"
#include "launch_args.cuh"
#include "score_work.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int kMmaThreads = kWarps * 32;
constexpr int kMmaTileKeys = 32;
constexpr int kNG = 4;           // n-tiles in flight per warp
constexpr int kMaxQ = 256;       // query vectors per work
constexpr int kMaxRows = kMaxQ / 8;

static_assert(kMaxQ % (8 * kNG) == 0, "n-tile groups");

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Byte offset of 16-byte chunk c (0..15) of query vector v in shared memory.
// Chunk c of a vector holds dims 8c..8c+7 in the order 0,4,1,5,2,6,3,7.
__device__ __forceinline__ uint32_t q_chunk_offset(uint32_t v, uint32_t c) {
  uint32_t p = c ^ (((c >> 3) & 1u) << 1) ^ (v & 1u);
  return v * 256u + p * 16u;
}

__device__ __forceinline__ uint32_t relu_mul_bf16x2(uint32_t d, uint32_t w) {
  uint32_t r, z = 0;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(d), "r"(z));
  return fp4idx__hmul2_bits(r, w);
}

__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

struct KeyRegs {
  uint4 p[4];     // payload block t of keys g, g+8, g+16, g+24
  uint32_t s[4];  // their scale bytes
};

__device__ __forceinline__ void load_keys(KeyRegs &kr, const uint8_t *__restrict__ pool,
                                          const int32_t *__restrict__ pages, int32_t log2p,
                                          int64_t width, int64_t l0, int g, int t) {
  const int64_t psize = int64_t(1) << log2p;
#pragma unroll
  for (int m = 0; m < 4; m++) {
    int64_t l = l0 + g + 8 * m;
    if (l > width - 1) l = width - 1;  // past the end: any valid key, result unused
    const int64_t page = __ldg(pages + (l >> log2p));
    const int64_t o = l & (psize - 1);
    const uint8_t *base = pool + page * (psize * FP4IDX_SLOT_BYTES);
    const uint8_t *src = base + o * 64 + t * 16;
    if (log2p >= 2) {
      kr.p[m] = __ldg(reinterpret_cast<const uint4 *>(src));  // P*68 is a multiple of 16
    } else {  // pages of 1 or 2 keys: 4-byte alignment only
      const uint32_t *s4 = reinterpret_cast<const uint32_t *>(src);
      kr.p[m] = make_uint4(__ldg(s4), __ldg(s4 + 1), __ldg(s4 + 2), __ldg(s4 + 3));
    }
    kr.s[m] = __ldg(base + psize * 64 + o * 4 + t);
  }
}

__global__ void __launch_bounds__(kMmaThreads, 3)
    fp4idx_score_kernel(const __grid_constant__ fp4idx_cuda_score_params_t prm) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t *q_s = smem;                                               // [ntp*8][256]
  uint32_t *w_s = reinterpret_cast<uint32_t *>(smem + prm.ntp * 8 * 256);  // [ntp*4] bf16x2
  int32_t *lens_s = reinterpret_cast<int32_t *>(smem + prm.ntp * 8 * 256 + prm.ntp * 16);
  __shared__ int32_t maxlen_s;
  __shared__ uint8_t row_of_v[kMaxQ];  // v / hp (integer division is ~20 instructions)

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t T = prm.total_tiles;
  const int64_t tb = T * blockIdx.x / gridDim.x;
  const int64_t te = T * (blockIdx.x + 1) / gridDim.x;

  int64_t cur = tb;
  while (cur < te) {
    int64_t seg_end;
    const fp4idx_cuda_work_t wk = fp4idx__segment_of(prm, cur, te, &seg_end);
    const fp4idx_cuda_seq_t sq = prm.seqs[wk.seq];
    const int nrows = wk.nrows;
    const int nt_valid = (nrows * prm.hp) >> 3;  // n-tiles holding real rows
    const int nt_per_row = prm.hp >> 3;

    __syncthreads();  // the previous segment is done with shared memory
    for (int v = threadIdx.x; v < kMaxQ; v += kMmaThreads) row_of_v[v] = (uint8_t)(v / prm.hp);
    __syncthreads();
    // Stage Q (permuted, swizzled, zero-padded), w and the lengths.
    const int nvec = prm.ntp * 8;
    // 8 loads in flight per thread before the first use (L2 latency, not
    // bandwidth, bounds this loop for short segments).
    for (int i0 = threadIdx.x; i0 < nvec * 16; i0 += 8 * kMmaThreads) {
      uint4 in[8];
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int i = i0 + u * kMmaThreads, v = (i >> 4) & (kMaxQ - 1), c = i & 15;
        const int r = row_of_v[v], h = v - r * prm.hp;
        in[u] = make_uint4(0, 0, 0, 0);
        if (i < nvec * 16 && r < nrows && h < prm.heads)
          in[u] = __ldg(reinterpret_cast<const uint4 *>(
              sq.q + ((int64_t)(wk.row0 + r) * prm.heads + h) * FP4IDX_HEAD_DIM + c * 8));
      }
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int i = i0 + u * kMmaThreads, v = i >> 4, c = i & 15;
        if (i >= nvec * 16) break;
        uint4 o;
        o.x = fp4idx__prmt(in[u].x, in[u].z, 0x5410);  // dims 0,4
        o.y = fp4idx__prmt(in[u].x, in[u].z, 0x7632);  // dims 1,5
        o.z = fp4idx__prmt(in[u].y, in[u].w, 0x5410);  // dims 2,6
        o.w = fp4idx__prmt(in[u].y, in[u].w, 0x7632);  // dims 3,7
        *reinterpret_cast<uint4 *>(q_s + q_chunk_offset(v, c)) = o;
      }
    }
    for (int i = threadIdx.x; i < nvec / 2; i += kMmaThreads) {
      uint32_t pair = 0;
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int v = 2 * i + e, r = row_of_v[v], h = v - r * prm.hp;
        uint32_t x = 0;
        if (r < nrows && h < prm.heads) x = sq.w[(int64_t)(wk.row0 + r) * prm.heads + h];
        pair |= x << (16 * e);
      }
      w_s[i] = pair;
    }
    if (threadIdx.x == 0) {
      int32_t mx = 0;
      for (int r = 0; r < nrows; r++) {
        int32_t L = sq.lens[wk.row0 + r];
        lens_s[r] = L;
        mx = L > mx ? L : mx;
      }
      maxlen_s = mx;
    }
    __syncthreads();
    const int32_t maxlen = maxlen_s;

    int64_t tile = cur + warp;
    KeyRegs kr;
    bool have = false;
    if (tile < seg_end) {
      const int64_t l0 = (tile - wk.tile_begin) * kMmaTileKeys;
      if (l0 < maxlen) {
        load_keys(kr, prm.pool, sq.pages, prm.log2_page, sq.width, l0, g, t);
        have = true;
      }
    }
    for (; tile < seg_end; tile += kWarps) {
      const int64_t l0 = (tile - wk.tile_begin) * kMmaTileKeys;
      if (!have) {
        // Every row's visible count ends before this tile: -inf only.
        const int64_t l = l0 + lane;
        if (l < sq.width)
          for (int r = 0; r < nrows; r++)
            sq.out[(int64_t)(wk.row0 + r) * sq.width + l] = -INFINITY;
      } else {
        // Decode this tile, then prefetch the next one of this warp.
        uint32_t a[4][16];
#pragma unroll
        for (int m = 0; m < 4; m++) fp4idx__decode_block(kr.p[m], kr.s[m], a[m]);
        const int64_t nxt = tile + kWarps;
        have = false;
        if (nxt < seg_end) {
          const int64_t nl0 = (nxt - wk.tile_begin) * kMmaTileKeys;
          if (nl0 < maxlen) {
            load_keys(kr, prm.pool, sq.pages, prm.log2_page, sq.width, nl0, g, t);
            have = true;
          }
        }

        float rs[4] = {0.f, 0.f, 0.f, 0.f};  // head sums of keys g+8m, current row
        int row_r = 0, row_left = nt_per_row;  // current row, its n-tiles still to come
        for (int j0 = 0; j0 < nt_valid; j0 += kNG) {
          float acc[kNG][2][4];
#pragma unroll
          for (int n = 0; n < kNG; n++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
              for (int e = 0; e < 4; e++) acc[n][mt][e] = 0.f;
#pragma unroll
          for (int kp = 0; kp < 4; kp++) {
            uint4 b[kNG];
#pragma unroll
            for (int n = 0; n < kNG; n++)
              b[n] = *reinterpret_cast<const uint4 *>(
                  q_s + q_chunk_offset((j0 + n) * 8 + g, 4 * t + kp));
#pragma unroll
            for (int n = 0; n < kNG; n++)
#pragma unroll
              for (int mt = 0; mt < 2; mt++) {
                // k-step 2kp: pairs 0,1 of word kp; k-step 2kp+1: pairs 2,3.
                mma_bf16_16816(acc[n][mt], a[2 * mt][4 * kp + 0], a[2 * mt + 1][4 * kp + 0],
                               a[2 * mt][4 * kp + 1], a[2 * mt + 1][4 * kp + 1], b[n].x, b[n].y);
                mma_bf16_16816(acc[n][mt], a[2 * mt][4 * kp + 2], a[2 * mt + 1][4 * kp + 2],
                               a[2 * mt][4 * kp + 3], a[2 * mt + 1][4 * kp + 3], b[n].z, b[n].w);
              }
          }
          // Epilogue of the kNG n-tiles, in head order.
#pragma unroll
          for (int n = 0; n < kNG; n++) {
            const int j = j0 + n;
            if (j < nt_valid) {
              const uint32_t w2 = w_s[j * 4 + t];  // w of q-vectors 8j+2t, 8j+2t+1
#pragma unroll
              for (int mt = 0; mt < 2; mt++) {
                const uint32_t pa = relu_mul_bf16x2(fp4idx__cvt_bf16x2(acc[n][mt][0], acc[n][mt][1]), w2);
                const uint32_t pb = relu_mul_bf16x2(fp4idx__cvt_bf16x2(acc[n][mt][2], acc[n][mt][3]), w2);
                rs[2 * mt] += bf16_lo(pa);
                rs[2 * mt] += bf16_hi(pa);
                rs[2 * mt + 1] += bf16_lo(pb);
                rs[2 * mt + 1] += bf16_hi(pb);
              }
              if (--row_left == 0) {
                // Row complete: reduce-scatter over the quad, lane t <- key g+8t.
                const bool up2 = (t & 2) != 0, up1 = (t & 1) != 0;
                const float s0 = up2 ? rs[0] : rs[2], s1 = up2 ? rs[1] : rs[3];
                const float k0 = (up2 ? rs[2] : rs[0]) + __shfl_xor_sync(0xffffffffu, s0, 2);
                const float k1 = (up2 ? rs[3] : rs[1]) + __shfl_xor_sync(0xffffffffu, s1, 2);
                const float s2 = up1 ? k0 : k1;
                const float tot = (up1 ? k1 : k0) + __shfl_xor_sync(0xffffffffu, s2, 1);
                const int r = row_r++;
                row_left = nt_per_row;
                const int64_t l = l0 + g + 8 * t;
                if (l < sq.width) {
                  const int64_t row = wk.row0 + r;
                  bool vis = l < lens_s[r];
                  if (vis && sq.mask) vis = sq.mask[row * sq.width + l] != 0;
                  sq.out[row * sq.width + l] = vis ? round_bf16(tot) : -INFINITY;
                }
                rs[0] = rs[1] = rs[2] = rs[3] = 0.f;
              }
            }
          }
        }
      }
    }
    cur = seg_end;
  }
}

int mma_blocks_per_sm(size_t smem) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fp4idx_score_kernel, kMmaThreads, smem) !=
          cudaSuccess ||
      n < 1) {
    (void)cudaGetLastError();
    n = 1;
  }
  return n;
}

size_t mma_smem_bytes(int ntp) { return (size_t)ntp * 8 * 256 + (size_t)ntp * 16 + kMaxRows * 4; }

}  // namespace

extern "C" size_t fp4idx__score_sm90_smem(int32_t ntp);
extern "C" int fp4idx__score_sm90_set_smem(size_t smem);
extern "C" int fp4idx__score_sm90_blocks_per_sm(size_t smem);
extern "C" void fp4idx__score_sm90_describe(const fp4idx_cuda_score_params_t *p,
                                            fp4idx_cuda_launch_t *l);

namespace {

// Per device and scorer, found once: the kernels' dynamic shared-memory
// limit raised to the largest plan's (attr: 1 set, -1 refused), and the
// blocks per SM of each ntp (0: not asked yet). A request's plan and
// launch then make no attribute or occupancy call.
struct ScorerCaps {
  std::atomic<int> attr{0};
  std::atomic<int> bps[kMaxQ / 8 + 1];
};
ScorerCaps g_scorer_caps[64][2];

ScorerCaps *scorer_caps(fp4idx_cuda_scorer_t scorer) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64 ||
      (scorer != FP4IDX_CUDA_SCORER_MMA && scorer != FP4IDX_CUDA_SCORER_WGMMA)) {
    (void)cudaGetLastError();
    return nullptr;
  }
  ScorerCaps *c = &g_scorer_caps[dev][scorer];
  if (c->attr.load(std::memory_order_acquire) == 0) {
    const int ok =
        scorer == FP4IDX_CUDA_SCORER_WGMMA
            ? fp4idx__score_sm90_set_smem(fp4idx__score_sm90_smem(kMaxQ / 8)) == FP4IDX_OK
            : fp4idx__cuda_check(cudaFuncSetAttribute(fp4idx_score_kernel,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      (int)mma_smem_bytes(kMaxQ / 8)),
                                 "score: set smem") == FP4IDX_OK;
    c->attr.store(ok ? 1 : -1, std::memory_order_release);
  }
  return c->attr.load(std::memory_order_acquire) == 1 ? c : nullptr;
}

// Blocks per SM of the scorer's kernel at ntp (1 where it cannot be asked).
int scorer_blocks_per_sm(fp4idx_cuda_scorer_t scorer, int32_t ntp) {
  ScorerCaps *c = scorer_caps(scorer);
  if (!c || ntp < 0 || ntp > kMaxQ / 8) return 1;
  int n = c->bps[ntp].load(std::memory_order_relaxed);
  if (n == 0) {
    n = scorer == FP4IDX_CUDA_SCORER_WGMMA
            ? fp4idx__score_sm90_blocks_per_sm(fp4idx__score_sm90_smem(ntp))
            : mma_blocks_per_sm(mma_smem_bytes(ntp));
    c->bps[ntp].store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace

extern "C" int fp4idx__cuda_check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return FP4IDX_OK;
  fprintf(stderr, "fp4idx cuda: %s: %s (%s)\n", what, cudaGetErrorString(err),
          cudaGetErrorName(err));
  return FP4IDX_EDEVICE;
}

static int32_t rows_per_work(int32_t hp, int32_t rows) {
  int32_t rpc = kMaxQ / hp;
  if (rpc < 1) rpc = 1;
  return rpc < rows ? rpc : rows;
}

// The sm_90a image (wgmma) exists only for compute capability 9.0 exactly.
extern "C" int fp4idx_cuda_scorer_for_device(int device, fp4idx_cuda_scorer_t *out) {
  if (!out) return FP4IDX_EINVAL;
  *out = FP4IDX_CUDA_SCORER_MMA;
  int major = 0, minor = 0;
  int rc = fp4idx__cuda_check(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
      "scorer: capability");
  if (!rc)
    rc = fp4idx__cuda_check(
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
        "scorer: capability");
  if (!rc && major == 9 && minor == 0) *out = FP4IDX_CUDA_SCORER_WGMMA;
  return rc;
}

extern "C" int32_t fp4idx_cuda_score_max_works(int32_t heads, int32_t n_seqs,
                                               const int32_t *rows) {
  const int32_t hp = (heads + 7) & ~7;
  int32_t n = 0;
  for (int32_t i = 0; i < n_seqs; i++) {
    if (rows[i] < 1) continue;
    const int32_t rpc = rows_per_work(hp, rows[i]);
    n += (rows[i] + rpc - 1) / rpc;
  }
  return n;
}

extern "C" int fp4idx_cuda_score_plan(fp4idx_cuda_scorer_t scorer, int32_t heads,
                                      int32_t n_seqs, const int32_t *rows,
                                      const int64_t *width, int sms,
                                      fp4idx_cuda_work_t *works, int32_t max_works,
                                      fp4idx_cuda_score_params_t *p) {
  if ((scorer != FP4IDX_CUDA_SCORER_MMA && scorer != FP4IDX_CUDA_SCORER_WGMMA) || heads < 1 ||
      heads > FP4IDX_MAX_HEADS || n_seqs < 0 || !p || (n_seqs && (!rows || !width)))
    return FP4IDX_EINVAL;
  const int32_t hp = (heads + 7) & ~7;
  int32_t nw = 0, max_rows = 1;
  int64_t tiles = 0;
  for (int32_t i = 0; i < n_seqs; i++) {
    if (rows[i] < 0 || width[i] < 0) return FP4IDX_EINVAL;
    if (rows[i] == 0 || width[i] == 0) continue;
    const int32_t rpc = rows_per_work(hp, rows[i]);
    const int64_t nt = (width[i] + kMmaTileKeys - 1) / kMmaTileKeys;
    for (int32_t r0 = 0; r0 < rows[i]; r0 += rpc) {
      const int32_t nr = rows[i] - r0 < rpc ? rows[i] - r0 : rpc;
      if (nw < max_works) {
        works[nw].tile_begin = tiles;
        works[nw].seq = i;
        works[nw].row0 = r0;
        works[nw].nrows = nr;
        works[nw]._pad = 0;
      }
      max_rows = nr > max_rows ? nr : max_rows;
      nw++;
      tiles += nt;
    }
  }
  const int32_t nt_valid = (max_rows * hp) / 8;
  const int sm90 = scorer == FP4IDX_CUDA_SCORER_WGMMA;
  p->n_works = nw;
  p->has_seq0 = 0;  // the caller's to set (fp4idx_cuda.h)
  p->_pad0 = 0;
  memset(&p->seq0, 0, sizeof p->seq0);
  p->heads = heads;
  p->hp = hp;
  p->tile_keys = sm90 ? 64 : kMmaTileKeys;
  p->scorer = scorer;
  if (sm90) {
    // Tiles of 64 keys; each work's tiles were counted in 32s above.
    int64_t t64 = 0;
    for (int32_t i = 0, wi = 0; i < n_seqs; i++) {
      if (rows[i] == 0 || width[i] == 0) continue;
      const int32_t rpc = rows_per_work(hp, rows[i]);
      const int64_t nt = (width[i] + 63) / 64;
      for (int32_t r0 = 0; r0 < rows[i]; r0 += rpc, wi++) {
        if (wi < max_works) works[wi].tile_begin = t64;
        t64 += nt;
      }
    }
    tiles = t64;
    p->ntp = (nt_valid + 15) / 16 * 16;
  } else {
    p->ntp = (nt_valid + kNG - 1) / kNG * kNG;
  }
  p->total_tiles = tiles;
  const int64_t want = sm90 ? tiles : (tiles + kWarps - 1) / kWarps;
  const int bps = scorer_blocks_per_sm(scorer, p->ntp);
  const int64_t cap = (int64_t)(sms > 0 ? sms : 1) * bps;
  p->grid = (int32_t)(want < cap ? want : cap);
  return nw;
}

extern "C" void fp4idx_cuda_score_use_seq0(fp4idx_cuda_score_params_t *p,
                                          const fp4idx_cuda_work_t *works,
                                          const fp4idx_cuda_seq_t *descs) {
  if (p->n_works != 1) return;
  p->has_seq0 = 1;
  p->seq0 = descs[works[0].seq];
}

extern "C" int fp4idx_cuda_score_describe(const fp4idx_cuda_score_params_t *p,
                                          fp4idx_cuda_launch_t *l) {
  if (!l) return FP4IDX_EINVAL;
  memset(l, 0, sizeof *l);
  if (!p || !p->pool || !p->seqs || !p->works || p->hp < 8 || p->ntp < kNG ||
      p->ntp * 8 > kMaxQ || p->log2_page < 0 || p->log2_page > 16)
    return FP4IDX_EINVAL;
  if (p->scorer == FP4IDX_CUDA_SCORER_WGMMA) {
    if (p->tile_keys != 64 || p->ntp % 16) return FP4IDX_EINVAL;
  } else if (p->scorer != FP4IDX_CUDA_SCORER_MMA || p->tile_keys != kMmaTileKeys) {
    return FP4IDX_EINVAL;
  }
  if (p->total_tiles == 0 || p->grid < 1) return FP4IDX_OK;
  if (!scorer_caps((fp4idx_cuda_scorer_t)p->scorer)) return FP4IDX_EDEVICE;
  if (p->scorer == FP4IDX_CUDA_SCORER_WGMMA) {
    fp4idx__score_sm90_describe(p, l);
    return FP4IDX_OK;
  }
  fp4idx__launch_begin(l, fp4idx_score_kernel, (unsigned)p->grid, kMmaThreads,
                       mma_smem_bytes(p->ntp), 0, 0);
  fp4idx__launch_arg(l, *p);
  return FP4IDX_OK;
}

extern "C" int fp4idx_cuda_score_launch(const fp4idx_cuda_score_params_t *p,
                                        cudaStream_t stream) {
  fp4idx_cuda_launch_t l;
  const int rc = fp4idx_cuda_score_describe(p, &l);
  return rc ? rc : fp4idx_cuda_launch_run(&l, stream);
}
