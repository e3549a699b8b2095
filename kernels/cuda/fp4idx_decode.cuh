/* fp4idx_decode.cuh -- device decode of packed FP4 keys into bf16 pairs.
 *
 * No exp2 and no special-function unit: the E2M1 code goes into a bf16 bit
 * pattern with shifts and masks, the UE8M0 scale into a bf16 exponent field,
 * and two exact bf16x2 multiplies finish the job.
 *
 * Trick: the 3 magnitude bits of a code c, placed at bits 6..8 of a bf16,
 * read as (E2M1 value) * 2^-126 -- codes 0 and 1 land on the bf16 zero and
 * subnormal 2^-127, codes 2..7 on normal numbers with the right exponent and
 * mantissa bit. Multiplying by 2^126 (exact) gives the E2M1 value, then by
 * 2^(s-127) (exact unless the result leaves bf16's range) the key element.
 * The scale goes in through the exponent field: bf16 bits s << 7, so s = 0
 * gives +0 and s = 255 gives +inf, as protocol/PROTOCOL.md (appendix) and
 * fp4idx_format.h say (torch's e8m0fnu reads those two as 2^-127 and NaN; the quantizer never stores them).
 *
 * Pairing: a 32-bit payload word x holds codes c0..c7 (element 8w+i in
 * nibble i). Pair n (0..3) is the bf16x2 {element n (low half), element n+4
 * (high half)}: the two nibbles sit 16 bits apart, so one shift places both
 * magnitudes and one shift places both sign bits.
 */
#ifndef FP4IDX_DECODE_CUH
#define FP4IDX_DECODE_CUH

#include <stdint.h>

/* 2^126 in both bf16 halves (biased exponent 253). */
#define FP4IDX__BF16X2_2P126 0x7E807E80u

__device__ __forceinline__ uint32_t fp4idx__hmul2_bits(uint32_t a, uint32_t b) {
  uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#else
  // sm_80: a*b + (-0) is a*b with one rounding, zero signs included.
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#endif
  return d;
}

/* bf16x2 holding the scale 2^(s-127) twice; s = 0 -> 0, s = 255 -> inf. */
__device__ __forceinline__ uint32_t fp4idx__scale2(uint32_t s) {
  return (s << 7) | (s << 23);
}

/* Pair n (0..3) of word x: {element n, element n+4}, bf16x2, scaled. */
template <int N>
__device__ __forceinline__ uint32_t fp4idx__decode_pair(uint32_t x, uint32_t scale2) {
  static_assert(N >= 0 && N < 4, "pair index");
  uint32_t mag = (N < 2 ? (x << (6 - 4 * N)) : (x >> (4 * N - 6))) & 0x01C001C0u;
  uint32_t bits = ((x << (12 - 4 * N)) & 0x80008000u) | mag;
  return fp4idx__hmul2_bits(fp4idx__hmul2_bits(bits, FP4IDX__BF16X2_2P126), scale2);
}

/* Decodes 16 payload bytes (one 32-element scale block: 4 words) into 16
 * bf16x2 registers: out[4*w + n] = {element 8w+n, element 8w+n+4}. */
__device__ __forceinline__ void fp4idx__decode_block(const uint4 &p, uint32_t s,
                                                     uint32_t out[16]) {
  const uint32_t sc = fp4idx__scale2(s);
  const uint32_t x[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
  for (int w = 0; w < 4; w++) {
    out[4 * w + 0] = fp4idx__decode_pair<0>(x[w], sc);
    out[4 * w + 1] = fp4idx__decode_pair<1>(x[w], sc);
    out[4 * w + 2] = fp4idx__decode_pair<2>(x[w], sc);
    out[4 * w + 3] = fp4idx__decode_pair<3>(x[w], sc);
  }
}

/* Fast path for 1 <= s <= 128 (every scale of keys with amax <= 12): the
 * two multiplies by 2^126 and 2^(s-127) fold into one by 2^(s-1), which is
 * a normal bf16 exactly then (exponent field s + 126 <= 254). */
template <int N>
__device__ __forceinline__ uint32_t fp4idx__decode_pair_fast(uint32_t x, uint32_t scale2) {
  uint32_t mag = (N < 2 ? (x << (6 - 4 * N)) : (x >> (4 * N - 6))) & 0x01C001C0u;
  uint32_t bits = ((x << (12 - 4 * N)) & 0x80008000u) | mag;
  return fp4idx__hmul2_bits(bits, scale2);
}

__device__ __forceinline__ bool fp4idx__scale_fast(uint32_t s) { return s - 1u < 128u; }

__device__ __forceinline__ void fp4idx__decode_block_fast(const uint4 &p, uint32_t s,
                                                          uint32_t out[16]) {
  const uint32_t e = s + 126u;  /* 2^(s-1) */
  const uint32_t sc = (e << 7) | (e << 23);
  const uint32_t x[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
  for (int w = 0; w < 4; w++) {
    out[4 * w + 0] = fp4idx__decode_pair_fast<0>(x[w], sc);
    out[4 * w + 1] = fp4idx__decode_pair_fast<1>(x[w], sc);
    out[4 * w + 2] = fp4idx__decode_pair_fast<2>(x[w], sc);
    out[4 * w + 3] = fp4idx__decode_pair_fast<3>(x[w], sc);
  }
}

/* Either path by this thread's scale (the exhaustive test goes through here). */
__device__ __forceinline__ void fp4idx__decode_block_auto(const uint4 &p, uint32_t s,
                                                          uint32_t out[16]) {
  if (fp4idx__scale_fast(s)) fp4idx__decode_block_fast(p, s, out);
  else fp4idx__decode_block(p, s, out);
}

#endif /* FP4IDX_DECODE_CUH */
