/* fp4idx_format.h -- the FP4 index-key format, in one place (PROTOCOL.md "Appendix: key format and scorer").
 *
 * Header-only and usable from host C and from CUDA device code alike. It holds:
 *   - the key and page layout (68-byte slots, SGLang-compatible pages);
 *   - exact decoders: E2M1 codes and UE8M0 scale bytes, built from integer ops
 *     on float/bf16 bit patterns -- no exp2, no special-function unit;
 *   - bf16 <-> f32 with round-to-nearest-even;
 *   - the quantizer (bf16 or f32 key -> 68 bytes), RNE and threshold modes.
 *
 * Key: D = 128 elements. Payload 64 bytes of E2M1 codes, byte i = element 2i
 * (low nibble) | element 2i+1 (high nibble). Then 4 UE8M0 scale bytes, byte j
 * scales elements 32j..32j+31 by 2^(s-127).
 *
 * Page of P keys: [P payloads of 64 B][P scale words of 4 B]; slot = page*P + o.
 */
#ifndef FP4IDX_FORMAT_H
#define FP4IDX_FORMAT_H

#include <stdint.h>
#include <string.h>

#include "fp4idx_status.h"

#ifdef __CUDACC__
#define FP4IDX_HD __host__ __device__ __forceinline__
#else
#define FP4IDX_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum {
  FP4IDX_HEAD_DIM = 128,      /* elements per key */
  FP4IDX_PAYLOAD_BYTES = 64,  /* E2M1 codes, two per byte */
  FP4IDX_SCALE_BYTES = 4,     /* one UE8M0 byte per 32-element block */
  FP4IDX_SLOT_BYTES = 68,     /* payload + scales */
  FP4IDX_BLOCK = 32,          /* elements per scale block */
  FP4IDX_DEFAULT_PAGE_SIZE = 64,
  FP4IDX_MAX_HEADS = 128
};

/* Element types of keys handed to the store path. */
typedef enum fp4idx_dtype_e {
  FP4IDX_DTYPE_BF16 = 1, /* [n,128] bf16 bit patterns, little-endian */
  FP4IDX_DTYPE_F32 = 2,  /* [n,128] float32 */
  FP4IDX_DTYPE_FP4 = 3   /* [n,68] already-packed slots */
} fp4idx_dtype_t;

typedef enum fp4idx_rounding_e {
  FP4IDX_ROUND_RNE = 0,      /* nearest, ties to the even code (default) */
  FP4IDX_ROUND_THRESHOLD = 1 /* code = number of thresholds strictly below */
} fp4idx_rounding_t;

/* ---- page layout ------------------------------------------------------- */

/* True when page_size is a power of two in [1, 1<<16]. */
FP4IDX_HD int fp4idx_page_size_valid(int64_t page_size) {
  return page_size >= 1 && page_size <= (1 << 16) &&
         (page_size & (page_size - 1)) == 0;
}

FP4IDX_HD int64_t fp4idx_page_bytes(int64_t page_size) {
  return page_size * FP4IDX_SLOT_BYTES;
}

/* Byte offset of slot's payload from the pool base. */
FP4IDX_HD int64_t fp4idx_payload_offset(int64_t slot, int64_t page_size) {
  int64_t page = slot / page_size, o = slot % page_size;
  return page * page_size * FP4IDX_SLOT_BYTES + o * FP4IDX_PAYLOAD_BYTES;
}

/* Byte offset of slot's 4 scale bytes from the pool base. */
FP4IDX_HD int64_t fp4idx_scale_offset(int64_t slot, int64_t page_size) {
  int64_t page = slot / page_size, o = slot % page_size;
  return page * page_size * FP4IDX_SLOT_BYTES +
         page_size * FP4IDX_PAYLOAD_BYTES + o * FP4IDX_SCALE_BYTES;
}

/* ---- bit casts and bf16 ------------------------------------------------ */

FP4IDX_HD float fp4idx_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

FP4IDX_HD uint32_t fp4idx_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* The bf16 bits of element i of an array at any alignment. */
FP4IDX_HD uint16_t fp4idx_bf16_at(const void *p, int64_t i) {
  uint16_t h;
  memcpy(&h, (const uint8_t *)p + 2 * i, 2);
  return h;
}

FP4IDX_HD float fp4idx_bf16_to_f32(uint16_t h) {
  return fp4idx_f32_from_bits((uint32_t)h << 16);
}

/* f32 -> bf16, round to nearest even; NaN stays a (quiet) NaN. */
FP4IDX_HD uint16_t fp4idx_f32_to_bf16(float f) {
  uint32_t u = fp4idx_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---- decoders (exact, no exp2) ----------------------------------------- */

/* E2M1 code (low 4 bits of c) -> bf16 bit pattern. sign = bit 3, e = bits
 * 2..1, m = bit 0; e = 0: m * 0.5; e > 0: (1 + m/2) * 2^(e-1). Built in the
 * exponent/mantissa fields directly: e > 0 has biased exponent 126 + e and
 * mantissa top bit m; e = 0, m = 1 is 0.5 (biased exponent 126). */
FP4IDX_HD uint16_t fp4idx_e2m1_to_bf16_bits(uint32_t c) {
  uint32_t e = (c >> 1) & 3u, m = c & 1u;
  uint32_t mag = e ? (((126u + e) << 7) | (m << 6)) : (m ? (126u << 7) : 0u);
  return (uint16_t)(mag | ((c & 8u) << 12));
}

FP4IDX_HD float fp4idx_e2m1_to_f32(uint32_t c) {
  return fp4idx_bf16_to_f32(fp4idx_e2m1_to_bf16_bits(c));
}

/* UE8M0 byte s -> 2^(s-127) by writing s into the fp32 exponent field.
 * s = 0 gives +0 and s = 255 gives +inf. NOTE: torch.float8_e8m0fnu decodes
 * 0 as 2^-127 and 255 as NaN; the quantizer only stores 1..254, where the two
 * agree, so the difference shows only on hand-made slots. */
FP4IDX_HD float fp4idx_ue8m0_to_f32(uint32_t s) {
  return fp4idx_f32_from_bits((s & 0xffu) << 23);
}

/* Element e (0..127) of a packed 68-byte key, as f32 (exact). */
FP4IDX_HD float fp4idx_slot_element(const uint8_t *payload,
                                    const uint8_t *scales, int e) {
  uint32_t byte = payload[e >> 1];
  uint32_t code = (e & 1) ? (byte >> 4) : (byte & 15u);
  return fp4idx_e2m1_to_f32(code) * fp4idx_ue8m0_to_f32(scales[e >> 5]);
}

/* ---- quantizer (PROTOCOL.md appendix, "Quantizer") ------------------------------------------ */

/* UE8M0 exponent for a block whose max |x| is amax: sf = max(amax/6, 1e-4),
 * ceil to a power of two through the fp32 fields, clamp to [1, 254]. */
FP4IDX_HD uint32_t fp4idx_block_scale_code(float amax) {
  float sf = amax / 6.0f;
  if (!(sf >= 1e-4f)) sf = 1e-4f;
  uint32_t u = fp4idx_f32_bits(sf);
  uint32_t s = ((u >> 23) & 0xffu) + ((u & 0x7fffffu) != 0u);
  return s < 1u ? 1u : (s > 254u ? 254u : s);
}

/* E2M1 code of v = x/scale. Magnitudes 0 .5 1 1.5 2 3 4 6; thresholds
 * .25 .75 1.25 1.75 2.5 3.5 5. RNE sends a tie to the even index. */
FP4IDX_HD uint32_t fp4idx_e2m1_encode(float v, fp4idx_rounding_t mode) {
  float a = v < 0.0f ? -v : v;
  if (a > 6.0f) a = 6.0f;
  uint32_t idx = (a > 0.25f) + (a > 0.75f) + (a > 1.25f) + (a > 1.75f) +
                 (a > 2.5f) + (a > 3.5f) + (a > 5.0f);
  if (mode == FP4IDX_ROUND_RNE && (idx & 1u)) {
    /* a == threshold idx is a tie between idx and idx+1, counted as idx;
     * RNE moves it up to the even neighbour. */
    float t = idx == 1u ? 0.75f : idx == 3u ? 1.75f : idx == 5u ? 3.5f : -1.0f;
    if (a == t) idx += 1u;
  }
  uint32_t sign = (v < 0.0f && idx != 0u) ? 8u : 0u;
  return idx | sign;
}

/* Element i of a bf16 or f32 key, as f32. */
FP4IDX_HD float fp4idx_key_element(const void *key, fp4idx_dtype_t dtype,
                                   int i) {
  if (dtype == FP4IDX_DTYPE_BF16) {
    uint16_t h;
    memcpy(&h, (const uint8_t *)key + 2 * i, 2);
    return fp4idx_bf16_to_f32(h);
  }
  float f;
  memcpy(&f, (const uint8_t *)key + 4 * i, 4);
  return f;
}

/* Quantizes one bf16 or f32 key (128 elements) into its 64 payload bytes and
 * 4 scale bytes. Returns FP4IDX_OK, or FP4IDX_ENONFINITE without writing
 * anything when an element is NaN or +-inf; FP4IDX_EINVAL for a dtype other
 * than BF16/F32. */
FP4IDX_HD int fp4idx_quantize_key(const void *key, fp4idx_dtype_t dtype,
                                  fp4idx_rounding_t mode, uint8_t *payload,
                                  uint8_t *scales) {
  if (dtype != FP4IDX_DTYPE_BF16 && dtype != FP4IDX_DTYPE_F32)
    return FP4IDX_EINVAL;
  for (int i = 0; i < FP4IDX_HEAD_DIM; i++) {
    uint32_t u = fp4idx_f32_bits(fp4idx_key_element(key, dtype, i));
    if ((u & 0x7f800000u) == 0x7f800000u) return FP4IDX_ENONFINITE;
  }
  for (int b = 0; b < FP4IDX_HEAD_DIM / FP4IDX_BLOCK; b++) {
    float amax = 0.0f;
    for (int i = 0; i < FP4IDX_BLOCK; i++) {
      float x = fp4idx_key_element(key, dtype, b * FP4IDX_BLOCK + i);
      float a = x < 0.0f ? -x : x;
      amax = a > amax ? a : amax;
    }
    uint32_t s = fp4idx_block_scale_code(amax);
    float scale = fp4idx_ue8m0_to_f32(s);
    scales[b] = (uint8_t)s;
    for (int i = 0; i < FP4IDX_BLOCK; i += 2) {
      int e = b * FP4IDX_BLOCK + i;
      uint32_t lo = fp4idx_e2m1_encode(fp4idx_key_element(key, dtype, e) / scale, mode);
      uint32_t hi = fp4idx_e2m1_encode(fp4idx_key_element(key, dtype, e + 1) / scale, mode);
      payload[e >> 1] = (uint8_t)(lo | (hi << 4));
    }
  }
  return FP4IDX_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_FORMAT_H */
