/* cpu_quant_kern.c -- the two passes of the fast quantizer (cpu_quant.h),
 * written so that the compiler vectorizes them; compiled once per ISA
 * (cpu_quant_avx2.c, cpu_quant_avx512.c include this file with another
 * FP4IDX__QK_SUFFIX, see CMakeLists.txt). Plain C: the integer compares
 * below give the same bytes on every ISA. */
#include <string.h>

#include "cpu_quant.h"

#ifndef FP4IDX__QK_SUFFIX
#define FP4IDX__QK_SUFFIX generic
#endif
#define FP4IDX__QK_CAT2(a, b) a##_##b
#define FP4IDX__QK_CAT(a, b) FP4IDX__QK_CAT2(a, b)

/* Where key k's 64 payload bytes and 4 scale bytes go. */
static inline uint8_t *fp4idx__qk_pay(const fp4idx__qjob_t *j, int64_t k) {
  return j->slots ? j->base + fp4idx_payload_offset(j->slots[k], j->page_size)
                  : j->base + k * FP4IDX_SLOT_BYTES;
}
static inline uint8_t *fp4idx__qk_sc(const fp4idx__qjob_t *j, int64_t k) {
  return j->slots ? j->base + fp4idx_scale_offset(j->slots[k], j->page_size)
                  : j->base + k * FP4IDX_SLOT_BYTES + FP4IDX_PAYLOAD_BYTES;
}

/* The 7 thresholds of a block with scale byte s as f32 patterns of
 * thr[k] * 2^(s-127): j = s - 127 added to the exponent field. Exact while
 * the result stays a normal number; above the largest finite pattern the
 * true threshold exceeds FLT_MAX, so no finite |x| passes it, and the
 * +inf pattern (clamp) gives that same answer. Returns 0 when some pattern
 * would fall below the normal range (exp_min + j < 1; needs s < 3, which
 * the 1e-4 floor of the scale rule never produces); the caller then takes
 * the reference path for that block. */
static inline int fp4idx__qk_thr(const fp4idx__qthr_t *qt, uint32_t s, int32_t t[7]) {
  int32_t jx = (int32_t)s - 127;
  if (qt->exp_min + jx < 1) return 0;
  for (int k = 0; k < 7; k++) {
    int64_t v = (int64_t)qt->thr[k] + (int64_t)jx * (1 << 23);
    t[k] = v > 0x7f800000 ? 0x7f800000 : (int32_t)v;
  }
  return 1;
}

/* Reference path for one block (x: its 32 elements as f32): the header's
 * encoder on x / scale. */
static void fp4idx__qk_block_ref(const float *x, uint32_t s, fp4idx_rounding_t mode,
                                 uint8_t *pay) {
  float scale = fp4idx_ue8m0_to_f32(s);
  for (int i = 0; i < FP4IDX_BLOCK; i += 2)
    pay[i >> 1] = (uint8_t)(fp4idx_e2m1_encode(x[i] / scale, mode) |
                            (fp4idx_e2m1_encode(x[i + 1] / scale, mode) << 4));
}

int FP4IDX__QK_CAT(fp4idx__qscales, FP4IDX__QK_SUFFIX)(const fp4idx__qjob_t *j,
                                                      int64_t k0, int64_t k1) {
  if (j->dtype == FP4IDX_DTYPE_BF16) {
    for (int64_t k = k0; k < k1; k++) {
      int16_t x[FP4IDX_HEAD_DIM];
      memcpy(x, j->keys + k * 2 * FP4IDX_HEAD_DIM, sizeof x);
      int16_t m[4];
      for (int b = 0; b < 4; b++) {
        int16_t mx = 0;
        for (int i = 0; i < FP4IDX_BLOCK; i++) {
          int16_t a = (int16_t)(x[b * FP4IDX_BLOCK + i] & 0x7fff);
          mx = a > mx ? a : mx;
        }
        m[b] = mx;
      }
      /* exponent all ones (inf or NaN) <=> |x| pattern >= 0x7f80 */
      for (int b = 0; b < 4; b++)
        if (m[b] >= 0x7f80) return FP4IDX_ENONFINITE;
      for (int b = 0; b < 4; b++)
        j->scales[k * 4 + b] =
            (uint8_t)fp4idx_block_scale_code(fp4idx_bf16_to_f32((uint16_t)m[b]));
    }
  } else {
    for (int64_t k = k0; k < k1; k++) {
      int32_t x[FP4IDX_HEAD_DIM];
      memcpy(x, j->keys + k * 4 * FP4IDX_HEAD_DIM, sizeof x);
      int32_t m[4];
      for (int b = 0; b < 4; b++) {
        int32_t mx = 0;
        for (int i = 0; i < FP4IDX_BLOCK; i++) {
          int32_t a = x[b * FP4IDX_BLOCK + i] & 0x7fffffff;
          mx = a > mx ? a : mx;
        }
        m[b] = mx;
      }
      for (int b = 0; b < 4; b++)
        if (m[b] >= 0x7f800000) return FP4IDX_ENONFINITE;
      for (int b = 0; b < 4; b++)
        j->scales[k * 4 + b] =
            (uint8_t)fp4idx_block_scale_code(fp4idx_f32_from_bits((uint32_t)m[b]));
    }
  }
  return FP4IDX_OK;
}

/* Code of one element: index = thresholds strictly below |x| (as patterns),
 * sign bit when x is negative and the index non-zero (then x / scale is
 * non-zero and has x's sign, which is the reference's v < 0). */
void FP4IDX__QK_CAT(fp4idx__qcodes, FP4IDX__QK_SUFFIX)(const fp4idx__qjob_t *j,
                                                      int64_t k0, int64_t k1) {
  for (int64_t k = k0; k < k1; k++) {
    const uint8_t *sc = j->scales + k * 4;
    uint8_t pay[FP4IDX_PAYLOAD_BYTES];
    if (j->dtype == FP4IDX_DTYPE_BF16) {
      int16_t x[FP4IDX_HEAD_DIM];
      memcpy(x, j->keys + k * 2 * FP4IDX_HEAD_DIM, sizeof x);
      for (int b = 0; b < 4; b++) {
        const int16_t *xb = x + b * FP4IDX_BLOCK;
        int32_t t[7];
        if (!fp4idx__qk_thr(j->qt, sc[b], t)) {
          float f[FP4IDX_BLOCK];
          for (int i = 0; i < FP4IDX_BLOCK; i++) f[i] = fp4idx_bf16_to_f32((uint16_t)xb[i]);
          fp4idx__qk_block_ref(f, sc[b], j->mode, pay + b * 16);
          continue;
        }
        /* a bf16 pattern q (as f32: q << 16) is > the f32 pattern t iff
         * q > t >> 16 (floor; t's low half may be non-zero for the RNE
         * thresholds, which sit one f32 ulp below a tie) */
        const int16_t t0 = (int16_t)(t[0] >> 16), t1 = (int16_t)(t[1] >> 16),
                      t2 = (int16_t)(t[2] >> 16), t3 = (int16_t)(t[3] >> 16),
                      t4 = (int16_t)(t[4] >> 16), t5 = (int16_t)(t[5] >> 16),
                      t6 = (int16_t)(t[6] >> 16);
        uint8_t code[FP4IDX_BLOCK];
        for (int i = 0; i < FP4IDX_BLOCK; i++) {
          int16_t v = xb[i], a = (int16_t)(v & 0x7fff);
          int16_t idx = (int16_t)((a > t0) + (a > t1) + (a > t2) + (a > t3) +
                                  (a > t4) + (a > t5) + (a > t6));
          int16_t neg = (int16_t)((v < 0) & (idx != 0));
          code[i] = (uint8_t)(idx | (neg << 3));
        }
        for (int p = 0; p < 16; p++)
          pay[b * 16 + p] = (uint8_t)(code[2 * p] | (code[2 * p + 1] << 4));
      }
    } else {
      int32_t x[FP4IDX_HEAD_DIM];
      memcpy(x, j->keys + k * 4 * FP4IDX_HEAD_DIM, sizeof x);
      for (int b = 0; b < 4; b++) {
        const int32_t *xb = x + b * FP4IDX_BLOCK;
        int32_t t[7];
        if (!fp4idx__qk_thr(j->qt, sc[b], t)) {
          float f[FP4IDX_BLOCK];
          memcpy(f, xb, sizeof f);
          fp4idx__qk_block_ref(f, sc[b], j->mode, pay + b * 16);
          continue;
        }
        const int32_t t0 = t[0], t1 = t[1], t2 = t[2], t3 = t[3], t4 = t[4],
                      t5 = t[5], t6 = t[6];
        uint8_t code[FP4IDX_BLOCK];
        for (int i = 0; i < FP4IDX_BLOCK; i++) {
          int32_t v = xb[i], a = v & 0x7fffffff;
          int32_t idx = (a > t0) + (a > t1) + (a > t2) + (a > t3) + (a > t4) +
                        (a > t5) + (a > t6);
          int32_t neg = (v < 0) & (idx != 0);
          code[i] = (uint8_t)(idx | (neg << 3));
        }
        for (int p = 0; p < 16; p++)
          pay[b * 16 + p] = (uint8_t)(code[2 * p] | (code[2 * p + 1] << 4));
      }
    }
    memcpy(fp4idx__qk_pay(j, k), pay, FP4IDX_PAYLOAD_BYTES);
    memcpy(fp4idx__qk_sc(j, k), sc, FP4IDX_SCALE_BYTES);
  }
}
