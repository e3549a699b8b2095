/* cpu_quant_kern.c -- the two passes of the fast quantizer (cpu_quant.h),
 * compiled once per ISA (cpu_quant_avx2.c, cpu_quant_avx512.c include this
 * file with another FP4IDX__QK_SUFFIX, see CMakeLists.txt). C11 plus the
 * GCC/Clang vector extensions (vector_size, __builtin_convertvector) and a
 * statement expression; integer operations only, so every ISA gives the
 * same bytes (tests/test_cpu_quant.c runs each). */
#include <string.h>

#include "cpu_quant.h"

#ifndef FP4IDX__QK_SUFFIX
#define FP4IDX__QK_SUFFIX generic
#endif
#define FP4IDX__QK_CAT2(a, b) a##_##b
#define FP4IDX__QK_CAT(a, b) FP4IDX__QK_CAT2(a, b)

/* Where key k's 64 payload bytes and 4 scale bytes go: fp4idx_payload_offset
 * and fp4idx_scale_offset, with the division by the (power of two) page
 * size done as a shift -- a 64-bit divide per key showed in profiles. */
static inline void fp4idx__qk_dst(const fp4idx__qjob_t *j, int64_t k, uint8_t **pay,
                                  uint8_t **sc) {
  if (!j->slots) {
    *pay = j->base + k * FP4IDX_SLOT_BYTES;
    *sc = *pay + FP4IDX_PAYLOAD_BYTES;
    return;
  }
  int64_t P = j->page_size, slot = j->slots[k];
  int64_t page = slot >> j->page_shift, o = slot & (P - 1);
  uint8_t *pg = j->base + page * P * FP4IDX_SLOT_BYTES;
  *pay = pg + o * FP4IDX_PAYLOAD_BYTES;
  *sc = pg + P * FP4IDX_PAYLOAD_BYTES + o * FP4IDX_SCALE_BYTES;
}

/* Pass 2 works on whole blocks in GCC/Clang vector types (plain C loops
 * here vectorized badly: the byte-sized output made the compiler narrow
 * the compares early, and the nibble packing went scalar). The generic copy
 * lowers them to SSE2, the others to AVX2 / AVX-512. Lane order below
 * assumes a little-endian host, like the wire format's raw arrays. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "cpu_quant_kern.c assumes a little-endian host"
#endif
/* Vectors of the native width only: wider ones are split lane by lane
 * (scalar compares) when the ISA lacks them. */
#if defined(__AVX512BW__)
#define FP4IDX__QV 64
#elif defined(__AVX2__)
#define FP4IDX__QV 32
#else
#define FP4IDX__QV 16
#endif
typedef int16_t fp4idx__qv_s16 __attribute__((vector_size(FP4IDX__QV)));
typedef uint32_t fp4idx__qv_u32 __attribute__((vector_size(FP4IDX__QV)));
typedef int32_t fp4idx__qv_s32 __attribute__((vector_size(FP4IDX__QV)));
typedef uint64_t fp4idx__qv_u64 __attribute__((vector_size(FP4IDX__QV)));
typedef uint8_t fp4idx__qv_b4 __attribute__((vector_size(FP4IDX__QV / 4)));
typedef uint8_t fp4idx__qv_b8 __attribute__((vector_size(FP4IDX__QV / 8)));

/* Code of each lane from its pattern x and the block's thresholds t:
 * index = thresholds strictly below |x|'s pattern (a compare is -1 or 0,
 * so the index is minus their sum); sign bit 8 when x is negative and the
 * index non-zero (then x / scale is non-zero and has x's sign, which is the
 * reference's v < 0). */
#define FP4IDX__QV_CODE(VT, x, absmask, t)                                     \
  ({                                                                           \
    VT a_ = (x) & (absmask);                                                   \
    VT g0_ = (VT)(a_ > (t)[0]);                                                \
    VT idx_ = -(g0_ + (VT)(a_ > (t)[1]) + (VT)(a_ > (t)[2]) +                  \
                (VT)(a_ > (t)[3]) + (VT)(a_ > (t)[4]) + (VT)(a_ > (t)[5]) +    \
                (VT)(a_ > (t)[6]));                                            \
    idx_ | ((VT)((x) < 0) & g0_ & 8);                                          \
  })

/* 32 bf16 elements at src (64 bytes, any alignment) -> 16 payload bytes. */
static inline void fp4idx__qk_codes_bf16(const uint8_t *src, const int16_t *t16,
                                         uint8_t *out) {
  fp4idx__qv_s16 t[7];
  for (int k = 0; k < 7; k++) t[k] = (fp4idx__qv_s16){0} + t16[k];
  for (int h = 0; h < 64 / FP4IDX__QV; h++) {
    fp4idx__qv_s16 x;
    memcpy(&x, src + h * sizeof x, sizeof x);
    fp4idx__qv_s16 code = FP4IDX__QV_CODE(fp4idx__qv_s16, x, (int16_t)0x7fff, t);
    /* pair (2p, 2p+1) as one 32-bit lane lo | hi << 16 -> lo | hi << 4 */
    fp4idx__qv_u32 w = (fp4idx__qv_u32)code;
    w = (w | (w >> 12)) & 0xffu;
    fp4idx__qv_b4 b = __builtin_convertvector(w, fp4idx__qv_b4);
    memcpy(out + h * sizeof b, &b, sizeof b);
  }
}

/* 32 f32 elements at src (128 bytes, any alignment) -> 16 payload bytes. */
static inline void fp4idx__qk_codes_f32(const uint8_t *src, const int32_t *t32,
                                        uint8_t *out) {
  fp4idx__qv_s32 t[7];
  for (int k = 0; k < 7; k++) t[k] = (fp4idx__qv_s32){0} + t32[k];
  for (int h = 0; h < 128 / FP4IDX__QV; h++) {
    fp4idx__qv_s32 x;
    memcpy(&x, src + h * sizeof x, sizeof x);
    fp4idx__qv_s32 code = FP4IDX__QV_CODE(fp4idx__qv_s32, x, 0x7fffffff, t);
    /* pair as one 64-bit lane lo | hi << 32 -> lo | hi << 4 */
    fp4idx__qv_u64 w = (fp4idx__qv_u64)code;
    w = (w | (w >> 28)) & 0xffu;
    fp4idx__qv_b8 b = __builtin_convertvector(w, fp4idx__qv_b8);
    memcpy(out + h * sizeof b, &b, sizeof b);
  }
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
      for (int b = 0; b < 4; b++) j->scales[k * 4 + b] = fp4idx__qscale_bf16[m[b]];
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

/* Pass 2: per block its thresholds (from the scale byte of pass 1), then
 * one payload byte per element pair. */
void FP4IDX__QK_CAT(fp4idx__qcodes, FP4IDX__QK_SUFFIX)(const fp4idx__qjob_t *j,
                                                      int64_t k0, int64_t k1) {
  const int esz = j->dtype == FP4IDX_DTYPE_BF16 ? 2 : 4;
  for (int64_t k = k0; k < k1; k++) {
    const uint8_t *sc = j->scales + k * 4;
    uint8_t pay[FP4IDX_PAYLOAD_BYTES];
    const uint8_t *key = j->keys + k * (int64_t)esz * FP4IDX_HEAD_DIM;
    for (int b = 0; b < 4; b++) {
      const uint8_t *src = key + b * esz * FP4IDX_BLOCK;
      if (!j->qt->exact[sc[b]]) {
        float f[FP4IDX_BLOCK];
        for (int i = 0; i < FP4IDX_BLOCK; i++) {
          if (esz == 2) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            f[i] = fp4idx_bf16_to_f32(h);
          } else {
            memcpy(&f[i], src + 4 * i, 4);
          }
        }
        fp4idx__qk_block_ref(f, sc[b], j->mode, pay + b * 16);
      } else if (esz == 2) {
        fp4idx__qk_codes_bf16(src, j->qt->t16[sc[b]], pay + b * 16);
      } else {
        fp4idx__qk_codes_f32(src, j->qt->t32[sc[b]], pay + b * 16);
      }
    }
    uint8_t *dpay, *dsc;
    fp4idx__qk_dst(j, k, &dpay, &dsc);
    memcpy(dpay, pay, FP4IDX_PAYLOAD_BYTES);
    memcpy(dsc, sc, FP4IDX_SCALE_BYTES);
  }
}
