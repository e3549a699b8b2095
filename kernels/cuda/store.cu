/* store.cu -- quantize + store, packed store, gather (packed or dequantized),
 * and the exhaustive decode table used by the tests.
 *
 * Quantize (PROTOCOL.md appendix, "Quantizer") runs the quantizer of fp4idx_format.h on the
 * device, so the bytes are the CPU's and the golden files' by construction.
 * All-or-nothing without a host round trip: a check kernel raises a device
 * flag when any element is NaN/inf; the store kernel, queued behind it on
 * the same stream, reads the flag and writes nothing when it is set. The
 * caller reads the flag back with its other results.
 *
 * Quantize grid: one warp per key (8 keys per 256-thread block). Lane i
 * holds elements 4i..4i+3 (block i/8), the block's amax comes from a 3-step
 * xor shuffle inside the 8 lanes, and lane i writes payload bytes 2i, 2i+1.
 */
#include <stdio.h>

#include "fp4idx_cuda.h"
#include "fp4idx_decode.cuh"

namespace {

constexpr int kStoreThreads = 256;

__device__ __forceinline__ float key_elem(const void *keys, fp4idx_dtype_t dtype, int64_t i) {
  if (dtype == FP4IDX_DTYPE_BF16)
    return __uint_as_float((uint32_t)(reinterpret_cast<const uint16_t *>(keys)[i]) << 16);
  return reinterpret_cast<const float *>(keys)[i];
}

__global__ void check_kernel(const void *keys, fp4idx_dtype_t dtype, int64_t n_elems,
                             int32_t *flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_elems;
       i += (int64_t)gridDim.x * blockDim.x) {
    const uint32_t u = __float_as_uint(key_elem(keys, dtype, i));
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicOr(flag, 1);
}

__global__ void quant_kernel(uint8_t *pool, int32_t log2p, const void *keys,
                             fp4idx_dtype_t dtype, int64_t n, const int64_t *slots,
                             fp4idx_rounding_t mode, const int32_t *flag) {
  if (*flag) return;  // a key was non-finite: store nothing
  const int64_t key = blockIdx.x * (int64_t)(kStoreThreads / 32) + (threadIdx.x >> 5);
  if (key >= n) return;
  const int lane = threadIdx.x & 31;
  float x[4];
#pragma unroll
  for (int i = 0; i < 4; i++) x[i] = key_elem(keys, dtype, key * FP4IDX_HEAD_DIM + lane * 4 + i);
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float a = fabsf(x[i]);
    amax = a > amax ? a : amax;
  }
#pragma unroll
  for (int d = 1; d < 8; d <<= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, amax, d);
    amax = o > amax ? o : amax;
  }
  const uint32_t s = fp4idx_block_scale_code(amax);
  const float scale = fp4idx_ue8m0_to_f32(s);
  uint32_t c[4];
#pragma unroll
  for (int i = 0; i < 4; i++) c[i] = fp4idx_e2m1_encode(x[i] / scale, mode);
  const int64_t slot = slots[key], psize = int64_t(1) << log2p;
  uint8_t *page = pool + (slot >> log2p) * psize * FP4IDX_SLOT_BYTES;
  const int64_t o = slot & (psize - 1);
  const uint16_t bytes = (uint16_t)((c[0] | (c[1] << 4)) | ((c[2] | (c[3] << 4)) << 8));
  *reinterpret_cast<uint16_t *>(page + o * 64 + lane * 2) = bytes;
  if ((lane & 7) == 0) page[psize * 64 + o * 4 + (lane >> 3)] = (uint8_t)s;
}

// One thread per (key, byte) of a 68-byte slot.
__global__ void store_packed_kernel(uint8_t *pool, int32_t log2p, const uint8_t *packed,
                                    int64_t n, const int64_t *slots) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n * FP4IDX_SLOT_BYTES) return;
  const int64_t key = i / FP4IDX_SLOT_BYTES;
  const int b = (int)(i - key * FP4IDX_SLOT_BYTES);
  const int64_t slot = slots[key], psize = int64_t(1) << log2p;
  uint8_t *page = pool + (slot >> log2p) * psize * FP4IDX_SLOT_BYTES;
  const int64_t o = slot & (psize - 1);
  if (b < 64) page[o * 64 + b] = packed[i];
  else page[psize * 64 + o * 4 + (b - 64)] = packed[i];
}

__global__ void read_packed_kernel(const uint8_t *pool, int32_t log2p, const int64_t *slots,
                                   int64_t n, uint8_t *out) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n * FP4IDX_SLOT_BYTES) return;
  const int64_t key = i / FP4IDX_SLOT_BYTES;
  const int b = (int)(i - key * FP4IDX_SLOT_BYTES);
  const int64_t slot = slots[key], psize = int64_t(1) << log2p;
  const uint8_t *page = pool + (slot >> log2p) * psize * FP4IDX_SLOT_BYTES;
  const int64_t o = slot & (psize - 1);
  out[i] = b < 64 ? page[o * 64 + b] : page[psize * 64 + o * 4 + (b - 64)];
}

// One thread per element; exact f32 value (code value times 2^(s-127)).
__global__ void read_dequant_kernel(const uint8_t *pool, int32_t log2p, const int64_t *slots,
                                    int64_t n, float *out) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n * FP4IDX_HEAD_DIM) return;
  const int64_t key = i / FP4IDX_HEAD_DIM;
  const int e = (int)(i - key * FP4IDX_HEAD_DIM);
  const int64_t slot = slots[key], psize = int64_t(1) << log2p;
  const uint8_t *page = pool + (slot >> log2p) * psize * FP4IDX_SLOT_BYTES;
  const int64_t o = slot & (psize - 1);
  out[i] = fp4idx_slot_element(page + o * 64, page + psize * 64 + o * 4, e);
}

// Thread (s, c): code c in every nibble of a word, scale s, through the
// scorer's decoder; all 8 decoded elements must agree.
__global__ void decode_table_kernel(uint16_t *out) {
  const int s = blockIdx.x, c = threadIdx.x;  // 256 x 16
  uint32_t x = 0;
  for (int i = 0; i < 8; i++) x |= (uint32_t)c << (4 * i);
  uint4 p = make_uint4(x, x, x, x);
  uint32_t d[16];
  fp4idx__decode_block_auto(p, (uint32_t)s, d);
  uint16_t v = (uint16_t)(d[0] & 0xffffu);
  for (int i = 0; i < 16; i++)
    if ((uint16_t)(d[i] & 0xffffu) != v || (uint16_t)(d[i] >> 16) != v) v = 0x7fff;  // NaN marker
  out[s * 16 + c] = v;
}

int blocks_for(int64_t n, int threads) { return (int)((n + threads - 1) / threads); }

}  // namespace

extern "C" int fp4idx_cuda_store_launch(uint8_t *pool, int32_t log2_page, const void *keys,
                                        fp4idx_dtype_t dtype, int64_t n, const int64_t *slots,
                                        fp4idx_rounding_t mode, int32_t *flag,
                                        cudaStream_t stream) {
  if (!pool || !keys || !slots || !flag || n < 0 ||
      (dtype != FP4IDX_DTYPE_BF16 && dtype != FP4IDX_DTYPE_F32) ||
      (mode != FP4IDX_ROUND_RNE && mode != FP4IDX_ROUND_THRESHOLD))
    return FP4IDX_EINVAL;
  int rc = fp4idx__cuda_check(cudaMemsetAsync(flag, 0, sizeof(int32_t), stream), "store: flag");
  if (rc || n == 0) return rc;
  const int64_t ne = n * FP4IDX_HEAD_DIM;
  int cb = blocks_for(ne, kStoreThreads);
  if (cb > 4096) cb = 4096;
  check_kernel<<<cb, kStoreThreads, 0, stream>>>(keys, dtype, ne, flag);
  rc = fp4idx__cuda_check(cudaGetLastError(), "store: check launch");
  if (rc) return rc;
  quant_kernel<<<blocks_for(n, kStoreThreads / 32), kStoreThreads, 0, stream>>>(pool, log2_page, keys,
                                                                     dtype, n, slots, mode, flag);
  return fp4idx__cuda_check(cudaGetLastError(), "store: quantize launch");
}

extern "C" int fp4idx_cuda_store_packed_launch(uint8_t *pool, int32_t log2_page,
                                               const uint8_t *packed, int64_t n,
                                               const int64_t *slots, cudaStream_t stream) {
  if (!pool || !packed || !slots || n < 0) return FP4IDX_EINVAL;
  if (n == 0) return FP4IDX_OK;
  store_packed_kernel<<<blocks_for(n * FP4IDX_SLOT_BYTES, kStoreThreads), kStoreThreads, 0, stream>>>(
      pool, log2_page, packed, n, slots);
  return fp4idx__cuda_check(cudaGetLastError(), "store packed: launch");
}

extern "C" int fp4idx_cuda_read_launch(const uint8_t *pool, int32_t log2_page,
                                       const int64_t *slots, int64_t n, int dequant, void *out,
                                       cudaStream_t stream) {
  if (!pool || !slots || !out || n < 0) return FP4IDX_EINVAL;
  if (n == 0) return FP4IDX_OK;
  if (dequant)
    read_dequant_kernel<<<blocks_for(n * FP4IDX_HEAD_DIM, kStoreThreads), kStoreThreads, 0, stream>>>(
        pool, log2_page, slots, n, (float *)out);
  else
    read_packed_kernel<<<blocks_for(n * FP4IDX_SLOT_BYTES, kStoreThreads), kStoreThreads, 0, stream>>>(
        pool, log2_page, slots, n, (uint8_t *)out);
  return fp4idx__cuda_check(cudaGetLastError(), "read: launch");
}

extern "C" int fp4idx_cuda_decode_table_launch(uint16_t *out, cudaStream_t stream) {
  if (!out) return FP4IDX_EINVAL;
  decode_table_kernel<<<256, 16, 0, stream>>>(out);
  return fp4idx__cuda_check(cudaGetLastError(), "decode table: launch");
}
