/* test_format.c -- the key format of kernels/fp4idx_format.h: exhaustive
 * decoder checks, bf16 rounding, and the quantizer against the golden files
 * byte for byte (both rounding modes, bf16 and f32 inputs). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_format.h"
#include "test_util.h"

enum { NQ = 512 };

Test(format, e2m1_all_16_codes_exact) {
  /* Expected values written out, independent of both decoders. */
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (unsigned c = 0; c < 16; c++) {
    double want = (c & 8) ? -mag[c & 7] : mag[c & 7];
    float got = fp4idx_e2m1_to_f32(c);
    cr_assert_eq((double)got, want, "code %u: %g != %g", c, (double)got, want);
    cr_assert_eq(fp4idx_test_e2m1_value(c), want, "ref decoder, code %u", c);
    /* sign bit: code 8 is -0, and every code with bit 3 is negative */
    cr_assert_eq(signbit(got) != 0, (c & 8) != 0, "sign of code %u", c);
    /* the bf16 pattern is the f32 pattern's top half */
    uint32_t u = fp4idx_f32_bits(got);
    cr_assert_eq(u & 0xffffu, 0u);
    cr_assert_eq(fp4idx_e2m1_to_bf16_bits(c), (uint16_t)(u >> 16));
  }
}

Test(format, ue8m0_all_256_codes_exact) {
  for (unsigned s = 0; s < 256; s++) {
    float got = fp4idx_ue8m0_to_f32(s);
    double want = s == 0 ? 0.0 : s == 255 ? INFINITY : ldexp(1.0, (int)s - 127);
    cr_assert_eq((double)got, want, "byte %u: %a != %a", s, (double)got, want);
    cr_assert(!signbit(got), "byte %u is positive", s);
    cr_assert_eq(fp4idx_test_ue8m0_value(s), want);
  }
}

Test(format, slot_element_is_code_times_scale) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, 7);
  uint8_t slot[68];
  for (int it = 0; it < 200; it++) {
    for (int i = 0; i < 64; i++) slot[i] = (uint8_t)fp4idx_test_rng_next(&rng);
    for (int j = 0; j < 4; j++) slot[64 + j] = (uint8_t)fp4idx_test_rng_range(&rng, 1, 250);
    for (int e = 0; e < 128; e++) {
      unsigned code = (e & 1) ? slot[e / 2] >> 4 : slot[e / 2] & 15u;
      double want = fp4idx_test_e2m1_value(code) * ldexp(1.0, slot[64 + e / 32] - 127);
      cr_assert_eq((double)fp4idx_slot_element(slot, slot + 64, e), want);
    }
  }
}

Test(format, bf16_rounding_cases) {
  struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3f800000u, 0x3f80}, /* 1.0 */
      {0x3f808000u, 0x3f80}, /* tie, even stays */
      {0x3f818000u, 0x3f82}, /* tie, odd rounds up */
      {0x3f808001u, 0x3f81}, /* just above tie */
      {0x3f807fffu, 0x3f80}, /* just below tie */
      {0xbf818000u, 0xbf82}, /* negative tie */
      {0x7f7fffffu, 0x7f80}, /* max f32 -> inf */
      {0x7f7f7fffu, 0x7f7f}, /* below the overflow tie */
      {0x7f800000u, 0x7f80}, /* inf */
      {0xff800000u, 0xff80}, /* -inf */
      {0x00000001u, 0x0000}, /* tiny subnormal */
      {0x00008000u, 0x0000}, /* subnormal tie to even 0 */
      {0x00018000u, 0x0002}, /* subnormal tie to even 2 */
      {0x80000000u, 0x8000}, /* -0 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint16_t got = fp4idx_f32_to_bf16(fp4idx_f32_from_bits(cases[i].in));
    cr_assert_eq(got, cases[i].out, "case %zu: %#x -> %#x, want %#x", i, cases[i].in, got,
                 cases[i].out);
    /* the independent double rounding of the test helpers agrees */
    double x = fp4idx_f32_from_bits(cases[i].in);
    cr_assert_eq(fp4idx_test_f64_to_bf16(x), cases[i].out, "ref rounding case %zu", i);
  }
  uint16_t nan = fp4idx_f32_to_bf16(NAN);
  cr_assert((nan & 0x7f80) == 0x7f80 && (nan & 0x7f), "NaN stays NaN");
  /* double rounding: a double just above a bf16 tie must round up even
   * though its f32 rounding would land on the tie */
  double x = 1.0 + 0x1p-8 + 0x1p-40;
  cr_assert_eq(fp4idx_test_f64_to_bf16(x), 0x3f81);
  cr_assert_eq(fp4idx_f32_to_bf16((float)x), 0x3f80, "f32 path double-rounds");
  /* round trip of every finite bf16 pattern */
  for (uint32_t h = 0; h < 0x10000u; h++) {
    if ((h & 0x7f80u) == 0x7f80u) continue;
    cr_assert_eq(fp4idx_f32_to_bf16(fp4idx_bf16_to_f32((uint16_t)h)), (uint16_t)h);
    cr_assert_eq(fp4idx_test_f64_to_bf16(fp4idx_test_bf16_to_f64((uint16_t)h)), (uint16_t)h);
  }
}

static void quant_vs_golden(fp4idx_rounding_t mode, int as_f32) {
  const char *pname = mode == FP4IDX_ROUND_RNE ? "quant_payload_rne.bin" : "quant_payload_thr.bin";
  const char *sname = mode == FP4IDX_ROUND_RNE ? "quant_scales_rne.bin" : "quant_scales_thr.bin";
  uint16_t *keys = fp4idx_test_load_golden("quant_keys.bin", NQ * 128 * 2, NULL);
  uint8_t *pay = fp4idx_test_load_golden(pname, NQ * 64, NULL);
  uint8_t *sc = fp4idx_test_load_golden(sname, NQ * 4, NULL);
  cr_assert(keys && pay && sc, "golden files in %s", fp4idx_test_golden_dir());
  float *kf = malloc(sizeof(float) * NQ * 128);
  cr_assert(kf);
  for (int i = 0; i < NQ * 128; i++) kf[i] = fp4idx_bf16_to_f32(keys[i]);
  int bad = 0;
  for (int n = 0; n < NQ; n++) {
    uint8_t p[64], s[4];
    const void *k = as_f32 ? (const void *)(kf + n * 128) : (const void *)(keys + n * 128);
    int rc = fp4idx_quantize_key(k, as_f32 ? FP4IDX_DTYPE_F32 : FP4IDX_DTYPE_BF16, mode, p, s);
    cr_assert_eq(rc, FP4IDX_OK, "key %d", n);
    bad += memcmp(p, pay + n * 64, 64) != 0 || memcmp(s, sc + n * 4, 4) != 0;
  }
  cr_assert_eq(bad, 0, "%d of %d keys differ from %s", bad, NQ, pname);
  free(kf);
  free(keys);
  free(pay);
  free(sc);
}

Test(format, quantizer_golden_rne_bf16) { quant_vs_golden(FP4IDX_ROUND_RNE, 0); }
Test(format, quantizer_golden_thr_bf16) { quant_vs_golden(FP4IDX_ROUND_THRESHOLD, 0); }
Test(format, quantizer_golden_rne_f32) { quant_vs_golden(FP4IDX_ROUND_RNE, 1); }
Test(format, quantizer_golden_thr_f32) { quant_vs_golden(FP4IDX_ROUND_THRESHOLD, 1); }

Test(format, quantizer_modes_differ_on_ties) {
  /* 0.75 * scale is a tie between codes 1 (0.5) and 2 (1.0): RNE -> 2,
   * threshold -> 1. amax 6 gives scale 1. */
  float k[128];
  for (int i = 0; i < 128; i++) k[i] = 0.0f;
  k[0] = 6.0f;
  k[1] = 0.75f;
  k[2] = -1.75f; /* tie 1.5|2 -> RNE 4 (2.0), thr 3 (1.5) */
  k[3] = -0.25f; /* tie 0|0.5 -> 0 in both, and no sign on zero */
  uint8_t p[64], s[4];
  cr_assert_eq(fp4idx_quantize_key(k, FP4IDX_DTYPE_F32, FP4IDX_ROUND_RNE, p, s), 0);
  cr_assert_eq(s[0], 127);
  cr_assert_eq(p[0], 7 | (2 << 4));
  cr_assert_eq(p[1], (8 | 4) | (0 << 4));
  cr_assert_eq(fp4idx_quantize_key(k, FP4IDX_DTYPE_F32, FP4IDX_ROUND_THRESHOLD, p, s), 0);
  cr_assert_eq(p[0], 7 | (1 << 4));
  cr_assert_eq(p[1], (8 | 3) | (0 << 4));
}

Test(format, quantizer_rejects_nonfinite_without_writing) {
  float bad[3] = {NAN, INFINITY, -INFINITY};
  for (int b = 0; b < 3; b++)
    for (int pos = 0; pos < 128; pos += 41) {
      float kf[128];
      uint16_t kb[128];
      for (int i = 0; i < 128; i++) kf[i] = (float)(i % 7) - 3.0f;
      kf[pos] = bad[b];
      for (int i = 0; i < 128; i++) kb[i] = fp4idx_f32_to_bf16(kf[i]);
      uint8_t p[64], s[4];
      memset(p, 0xa5, 64);
      memset(s, 0x5a, 4);
      cr_assert_eq(fp4idx_quantize_key(kf, FP4IDX_DTYPE_F32, FP4IDX_ROUND_RNE, p, s),
                   FP4IDX_ENONFINITE);
      cr_assert_eq(fp4idx_quantize_key(kb, FP4IDX_DTYPE_BF16, FP4IDX_ROUND_RNE, p, s),
                   FP4IDX_ENONFINITE);
      for (int i = 0; i < 64; i++) cr_assert_eq(p[i], 0xa5, "payload untouched");
      for (int i = 0; i < 4; i++) cr_assert_eq(s[i], 0x5a, "scales untouched");
    }
  uint8_t p[64], s[4];
  float kf[128] = {0};
  cr_assert_eq(fp4idx_quantize_key(kf, FP4IDX_DTYPE_FP4, FP4IDX_ROUND_RNE, p, s), FP4IDX_EINVAL);
}

Test(format, page_layout_offsets) {
  for (int64_t P = 1; P <= 256; P *= 2) {
    cr_assert(fp4idx_page_size_valid(P));
    for (int64_t slot = 0; slot < 4 * P; slot++) {
      int64_t page = slot / P, o = slot % P;
      cr_assert_eq(fp4idx_payload_offset(slot, P), page * P * 68 + o * 64);
      cr_assert_eq(fp4idx_scale_offset(slot, P), page * P * 68 + P * 64 + o * 4);
    }
  }
  cr_assert(!fp4idx_page_size_valid(0));
  cr_assert(!fp4idx_page_size_valid(3));
  cr_assert(!fp4idx_page_size_valid(-64));
  cr_assert(!fp4idx_page_size_valid(1 << 17));
}
