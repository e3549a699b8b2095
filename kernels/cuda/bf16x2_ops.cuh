/* bf16x2_ops.cuh -- register-level helpers both scorers use on bf16 pairs.
 *
 * fp4idx__prmt: PTX prmt.b32 (byte permute of the pair {b, a} by selector
 * sel). fp4idx__cvt_bf16x2: two floats rounded to bf16 (RNE, as
 * __float2bfloat16_rn) in one register, lo in the low half.
 */
#ifndef FP4IDX_BF16X2_OPS_CUH
#define FP4IDX_BF16X2_OPS_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t fp4idx__prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ uint32_t fp4idx__cvt_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

#endif /* FP4IDX_BF16X2_OPS_CUH */
