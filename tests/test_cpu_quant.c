/* test_cpu_quant.c -- the CPU backend's fast quantizer (kernels/cpu/
 * cpu_quant.c) against the reference fp4idx_quantize_key, byte for byte:
 * golden keys, every bf16 value around every reachable scale, 200k random
 * keys of both dtypes whose blocks span the whole exponent range
 * (subnormals, -0, values on every threshold times every scale and one ulp
 * either side, clamps at 6, amax 0, the 1e-4 floor, the largest finite
 * values), each through every ISA path this CPU runs, one thread and a
 * pool, aligned and unaligned, and through the backend's store op onto
 * shuffled slots. Non-finite keys anywhere in a batch: ENONFINITE and no
 * slot changes. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_quant.h"
#include "fp4idx_backend.h"
#include "fp4idx_format.h"
#include "test_util.h"

enum { D = FP4IDX_HEAD_DIM, SLOT = FP4IDX_SLOT_BYTES, PAGE = 16 };

static const fp4idx_rounding_t modes[2] = {FP4IDX_ROUND_RNE, FP4IDX_ROUND_THRESHOLD};

static size_t esize(fp4idx_dtype_t dt) { return dt == FP4IDX_DTYPE_BF16 ? 2 : 4; }

/* fp4idx_quantize_key over n keys into packed [n,68]. */
static uint8_t *reference(const void *keys, fp4idx_dtype_t dt, int64_t n,
                          fp4idx_rounding_t mode) {
  uint8_t *ref = malloc((size_t)n * SLOT);
  cr_assert(ref);
  for (int64_t k = 0; k < n; k++) {
    const uint8_t *key = (const uint8_t *)keys + (size_t)k * D * esize(dt);
    cr_assert_eq(fp4idx_quantize_key(key, dt, mode, ref + k * SLOT,
                                     ref + k * SLOT + FP4IDX_PAYLOAD_BYTES),
                 FP4IDX_OK, "reference rejects key %lld", (long long)k);
  }
  return ref;
}

static void expect_same(const uint8_t *want, const uint8_t *got, int64_t n,
                        const char *what, int isa, int mode) {
  for (int64_t k = 0; k < n; k++)
    if (memcmp(want + k * SLOT, got + k * SLOT, SLOT)) {
      int i = 0;
      while (want[k * SLOT + i] == got[k * SLOT + i]) i++;
      cr_assert_fail("%s, isa %s, mode %d: key %lld byte %d is 0x%02x, reference 0x%02x",
                     what, fp4idx__cpu_isa_name(isa), mode, (long long)k, i,
                     got[k * SLOT + i], want[k * SLOT + i]);
    }
}

/* Every way in: each ISA, one thread / a 3-thread pool, an unaligned copy of
 * the keys; then the backend's store onto shuffled slots on each ISA. */
static void check_all_paths(const void *keys, fp4idx_dtype_t dt, int64_t n) {
  cr_assert_eq(unsetenv("FP4IDX_CPU_ISA"), 0);
  int best = fp4idx__cpu_pick_isa();
  size_t kbytes = (size_t)n * D * esize(dt);
  uint8_t *odd = malloc(kbytes + 1), *got = malloc((size_t)n * SLOT);
  cr_assert(odd && got);
  memcpy(odd + 1, keys, kbytes);
  fp4idx__threads_t *pool = NULL;
  cr_assert_eq(fp4idx__threads_create(&pool, 3), FP4IDX_OK);
  for (int m = 0; m < 2; m++) {
    uint8_t *ref = reference(keys, dt, n, modes[m]);
    for (int isa = 0; isa <= best; isa++) {
      memset(got, 0xa5, (size_t)n * SLOT);
      cr_assert_eq(fp4idx__cpu_quant_store(NULL, isa, keys, dt, n, modes[m], got, 0, NULL),
                   FP4IDX_OK);
      expect_same(ref, got, n, "one thread", isa, m);
      memset(got, 0x5a, (size_t)n * SLOT);
      cr_assert_eq(fp4idx__cpu_quant_store(pool, isa, odd + 1, dt, n, modes[m], got, 0, NULL),
                   FP4IDX_OK);
      expect_same(ref, got, n, "3 threads, unaligned keys", isa, m);
    }
    /* the backend's store op, slots on shuffled pages */
    const char *names[] = {"generic", "avx2", "avx512"};
    int64_t n_pages = (n + PAGE - 1) / PAGE;
    int32_t *perm = malloc((size_t)n_pages * sizeof *perm);
    int64_t *slots = malloc((size_t)n * sizeof *slots);
    cr_assert(perm && slots);
    fp4idx_test_rng_t rng;
    fp4idx_test_rng_seed(&rng, 99);
    for (int64_t p = 0; p < n_pages; p++) perm[p] = (int32_t)p;
    fp4idx_test_shuffle_i32(&rng, perm, n_pages);
    for (int64_t k = 0; k < n; k++) slots[k] = (int64_t)perm[k / PAGE] * PAGE + k % PAGE;
    for (int isa = 0; isa <= best; isa++) {
      cr_assert_eq(setenv("FP4IDX_CPU_ISA", names[isa], 1), 0);
      fp4idx_backend_t *b = NULL;
      cr_assert_eq(fp4idx_backend_cpu_create(&b, 2), FP4IDX_OK);
      cr_assert_eq(b->ops->pool_create(b, n_pages, PAGE), FP4IDX_OK);
      cr_assert_eq(b->ops->store(b, keys, dt, n, slots, modes[m]), FP4IDX_OK);
      cr_assert_eq(b->ops->read(b, slots, n, 0, got), FP4IDX_OK);
      expect_same(ref, got, n, "backend store", isa, m);
      b->ops->destroy(b);
    }
    cr_assert_eq(unsetenv("FP4IDX_CPU_ISA"), 0);
    free(perm);
    free(slots);
    free(ref);
  }
  fp4idx__threads_destroy(pool);
  free(odd);
  free(got);
}

/* ---- golden keys ----------------------------------------------------------- */

Test(cpu_quant, golden_both_modes_both_dtypes) {
  enum { NQ = 512 };
  uint16_t *keys = fp4idx_test_load_golden("quant_keys.bin", NQ * D * 2, NULL);
  const char *pn[2] = {"quant_payload_rne.bin", "quant_payload_thr.bin"};
  const char *sn[2] = {"quant_scales_rne.bin", "quant_scales_thr.bin"};
  cr_assert(keys, "golden files in %s", fp4idx_test_golden_dir());
  float *kf = malloc(sizeof(float) * NQ * D);
  uint8_t *got = malloc(NQ * SLOT);
  cr_assert(kf && got);
  for (int i = 0; i < NQ * D; i++) kf[i] = fp4idx_bf16_to_f32(keys[i]);
  cr_assert_eq(unsetenv("FP4IDX_CPU_ISA"), 0);
  int best = fp4idx__cpu_pick_isa();
  for (int m = 0; m < 2; m++) {
    uint8_t *pay = fp4idx_test_load_golden(pn[m], NQ * 64, NULL);
    uint8_t *sc = fp4idx_test_load_golden(sn[m], NQ * 4, NULL);
    cr_assert(pay && sc);
    for (int dt = 0; dt < 2; dt++)
      for (int isa = 0; isa <= best; isa++) {
        const void *k = dt ? (const void *)kf : (const void *)keys;
        cr_assert_eq(fp4idx__cpu_quant_store(NULL, isa, k, dt ? FP4IDX_DTYPE_F32 : FP4IDX_DTYPE_BF16,
                                             NQ, modes[m], got, 0, NULL),
                     FP4IDX_OK);
        for (int n = 0; n < NQ; n++) {
          cr_assert_eq(memcmp(got + n * SLOT, pay + n * 64, 64), 0,
                       "%s key %d payload, dtype %d isa %d", pn[m], n, dt, isa);
          cr_assert_eq(memcmp(got + n * SLOT + 64, sc + n * 4, 4), 0,
                       "%s key %d scales, dtype %d isa %d", sn[m], n, dt, isa);
        }
      }
    free(pay);
    free(sc);
  }
  check_all_paths(keys, FP4IDX_DTYPE_BF16, NQ);
  check_all_paths(kf, FP4IDX_DTYPE_F32, NQ);
  free(got);
  free(kf);
  free(keys);
}

/* The tables built once in cpu_quant.c: the bf16 scale table equals the
 * header's scale rule on every finite block max (after one store has built
 * it). */
Test(cpu_quant, bf16_scale_table) {
  uint16_t k[D] = {0};
  uint8_t out[SLOT];
  cr_assert_eq(fp4idx__cpu_quant_store(NULL, 0, k, FP4IDX_DTYPE_BF16, 1, FP4IDX_ROUND_RNE, out, 0, NULL),
               FP4IDX_OK);
  for (uint32_t h = 0; h < 0x7f80; h++)
    cr_assert_eq(fp4idx__qscale_bf16[h], fp4idx_block_scale_code(fp4idx_bf16_to_f32((uint16_t)h)),
                 "max pattern 0x%04x", h);
}

/* ---- every bf16 value near every reachable scale ----------------------------- */

/* For each j with 6 * 2^j finite and 2^j >= 1e-4 (every scale byte the rule
 * gives a block whose max is 6 * 2^j, i.e. s = 127 + j exactly): blocks of
 * [6 * 2^j, 31 more], the 31 running over every bf16 magnitude from
 * 2^(j-4) to 6 * 2^j, both signs. Covers every threshold, tie and code
 * boundary at every scale the quantizer produces. */
Test(cpu_quant, every_bf16_value_every_scale) {
  size_t cap = 1 << 16, nb = 0; /* blocks */
  uint16_t *keys = calloc(cap * FP4IDX_BLOCK, 2);
  cr_assert(keys);
  for (int j = -13; j <= 125; j++) {
    uint16_t top = fp4idx_f32_to_bf16(ldexpf(6.0f, j));
    uint16_t lo = fp4idx_f32_to_bf16(ldexpf(1.0f, j - 4));
    int fill = FP4IDX_BLOCK; /* elements in the current block */
    for (uint32_t p = lo; p <= top; p++)
      for (uint32_t sg = 0; sg < 2; sg++) {
        if (fill == FP4IDX_BLOCK) { /* a new block starts with 6 * 2^j */
          cr_assert(nb < cap);
          keys[nb++ * FP4IDX_BLOCK] = top;
          fill = 1;
        }
        keys[(nb - 1) * FP4IDX_BLOCK + fill++] = (uint16_t)(p | (sg << 15));
      }
  }
  int64_t nk = (int64_t)(nb + 3) / 4; /* the calloc'd tail blocks are zeros */
  cr_assert((size_t)nk * 4 <= cap);
  check_all_paths(keys, FP4IDX_DTYPE_BF16, nk);
  free(keys);
}

/* ---- random keys ---------------------------------------------------------------- */

/* A value of the format with mb mantissa bits (bf16: 7, f32: 23) as a bit
 * pattern: sign, exponent field (0..254), mantissa. */
static uint32_t pat(int mb, uint32_t sign, uint32_t e, uint32_t mant) {
  return (sign << (mb + 8)) | (e << mb) | (mant & ((1u << mb) - 1));
}

/* The pattern of f in the format (bf16: RNE), exact for the grid values. */
static uint32_t pat_of(int mb, float f) {
  return mb == 7 ? fp4idx_f32_to_bf16(f) : fp4idx_f32_bits(f);
}

/* One block of 32 patterns, kind chosen at random (see the file comment). */
static void random_block(fp4idx_test_rng_t *r, int mb, uint32_t *out) {
  static const float grid[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
                               0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 0.0f};
  uint32_t maxpat = pat(mb, 0, 254, ~0u), mmask = (1u << mb) - 1;
  int kind = (int)fp4idx_test_rng_below(r, 7);
  if (kind == 0) { /* random finite patterns in a random exponent window */
    uint32_t emax = (uint32_t)fp4idx_test_rng_below(r, 255);
    uint32_t w = (uint32_t)fp4idx_test_rng_below(r, 31);
    for (int i = 0; i < 32; i++) {
      uint32_t e = emax - (uint32_t)fp4idx_test_rng_below(r, (emax < w ? emax : w) + 1);
      out[i] = pat(mb, (uint32_t)fp4idx_test_rng_below(r, 2), e,
                   (uint32_t)fp4idx_test_rng_next(r));
    }
  } else if (kind <= 2) { /* grid: thresholds, codes, 6 x 2^j, +-1 ulp */
    int j = (int)fp4idx_test_rng_range(r, -150, 125);
    for (int i = 0; i < 32; i++) {
      float g = i == 0 ? 6.0f : grid[fp4idx_test_rng_below(r, sizeof grid / sizeof grid[0])];
      uint32_t p = pat_of(mb, ldexpf(g, j)); /* rounds where 2^j is too small */
      int d = (int)fp4idx_test_rng_range(r, -1, 1);
      if (d < 0 && p > 0) p--;
      if (d > 0 && p < maxpat) p++;
      out[i] = p | ((uint32_t)fp4idx_test_rng_below(r, 2) << (mb + 8));
    }
  } else if (kind == 3) { /* tiny: amax under 6e-4 (the 1e-4 floor), subnormals, zeros */
    for (int i = 0; i < 32; i++) {
      uint32_t e = (uint32_t)fp4idx_test_rng_below(r, 117);
      if (fp4idx_test_rng_below(r, 4) == 0) e = 0;
      out[i] = pat(mb, (uint32_t)fp4idx_test_rng_below(r, 2), e,
                   fp4idx_test_rng_below(r, 8) ? (uint32_t)fp4idx_test_rng_next(r) : 0);
    }
  } else if (kind == 4) { /* amax 0: +0 and -0 */
    for (int i = 0; i < 32; i++)
      out[i] = pat(mb, (uint32_t)fp4idx_test_rng_below(r, 2), 0, 0);
  } else if (kind == 5) { /* the largest finite values (scale codes 252..253) */
    for (int i = 0; i < 32; i++)
      out[i] = fp4idx_test_rng_below(r, 8) == 0
                   ? maxpat | ((uint32_t)fp4idx_test_rng_below(r, 2) << (mb + 8))
                   : pat(mb, (uint32_t)fp4idx_test_rng_below(r, 2),
                         250 + (uint32_t)fp4idx_test_rng_below(r, 5),
                         (uint32_t)fp4idx_test_rng_next(r) & mmask);
  } else { /* Gaussian at a random power-of-two scale */
    int j = (int)fp4idx_test_rng_range(r, -30, 30);
    for (int i = 0; i < 32; i++) {
      double u1 = ((fp4idx_test_rng_next(r) >> 11) + 1) * 0x1p-53;
      double u2 = (fp4idx_test_rng_next(r) >> 11) * 0x1p-53;
      double g = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
      out[i] = pat_of(mb, (float)ldexp(g, j));
    }
  }
}

static void random_keys(fp4idx_dtype_t dt, int64_t n, uint64_t seed) {
  fp4idx_test_rng_t r;
  fp4idx_test_rng_seed(&r, seed);
  int mb = dt == FP4IDX_DTYPE_BF16 ? 7 : 23;
  void *keys = malloc((size_t)n * D * esize(dt));
  cr_assert(keys);
  for (int64_t k = 0; k < n; k++)
    for (int b = 0; b < 4; b++) {
      uint32_t blk[32];
      random_block(&r, mb, blk);
      for (int i = 0; i < 32; i++) {
        size_t e = (size_t)k * D + b * 32 + i;
        if (mb == 7) ((uint16_t *)keys)[e] = (uint16_t)blk[i];
        else ((uint32_t *)keys)[e] = blk[i];
      }
    }
  check_all_paths(keys, dt, n);
  free(keys);
}

Test(cpu_quant, random_200k_bf16, .timeout = 600) { random_keys(FP4IDX_DTYPE_BF16, 200000, 1); }
Test(cpu_quant, random_200k_f32, .timeout = 600) { random_keys(FP4IDX_DTYPE_F32, 200000, 2); }

/* ---- non-finite ---------------------------------------------------------------- */

/* A batch large enough for the thread pool to split it; one NaN/inf at the
 * first, a middle or the last key: ENONFINITE, and no slot changes. */
Test(cpu_quant, nonfinite_anywhere_nothing_stored) {
  enum { N = 5000 };
  static const uint16_t bad16[] = {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff};
  static const uint32_t bad32[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                   0xffffffffu};
  const char *names[] = {"generic", "avx2", "avx512"};
  cr_assert_eq(unsetenv("FP4IDX_CPU_ISA"), 0);
  int best = fp4idx__cpu_pick_isa();
  fp4idx_test_rng_t r;
  fp4idx_test_rng_seed(&r, 7);
  int64_t n_pages = N / PAGE + 2;
  int64_t *slots = malloc(N * sizeof *slots);
  uint8_t *before = malloc((size_t)n_pages * PAGE * SLOT), *after = malloc((size_t)n_pages * PAGE * SLOT);
  uint16_t *kb = malloc((size_t)N * D * 2);
  uint32_t *kf = malloc((size_t)N * D * 4);
  cr_assert(slots && before && after && kb && kf);
  for (int64_t k = 0; k < N; k++) slots[k] = (k * 37 + 5) % (n_pages * PAGE);
  for (size_t i = 0; i < (size_t)n_pages * PAGE * SLOT; i++)
    before[i] = (uint8_t)fp4idx_test_rng_next(&r);
  for (int isa = 0; isa <= best; isa++) {
    cr_assert_eq(setenv("FP4IDX_CPU_ISA", names[isa], 1), 0);
    fp4idx_backend_t *b = NULL;
    cr_assert_eq(fp4idx_backend_cpu_create(&b, 2), FP4IDX_OK);
    cr_assert_eq(b->ops->pool_create(b, n_pages, PAGE), FP4IDX_OK);
    cr_assert_eq(b->ops->write_pages(b, 0, n_pages, before), FP4IDX_OK);
    for (int where = 0; where < 3; where++)
      for (int v = 0; v < 5; v++)
        for (int dt = 0; dt < 2; dt++) {
          for (size_t i = 0; i < (size_t)N * D; i++) {
            float x = (float)fp4idx_test_rng_range(&r, -4000, 4000) / 64;
            kf[i] = fp4idx_f32_bits(x);
            kb[i] = fp4idx_f32_to_bf16(x);
          }
          int64_t k = where == 0 ? 0 : where == 1 ? N / 2 + 3 : N - 1;
          size_t e = (size_t)k * D + fp4idx_test_rng_below(&r, D);
          kf[e] = bad32[v];
          kb[e] = bad16[v];
          for (int m = 0; m < 2; m++) {
            int rc = dt ? b->ops->store(b, kf, FP4IDX_DTYPE_F32, N, slots, modes[m])
                        : b->ops->store(b, kb, FP4IDX_DTYPE_BF16, N, slots, modes[m]);
            cr_assert_eq(rc, FP4IDX_ENONFINITE, "isa %s key %lld value %d dtype %d",
                         names[isa], (long long)k, v, dt);
            const void *keys = dt ? (const void *)kf : (const void *)kb;
            rc = fp4idx__cpu_quant_store(NULL, isa, keys, dt ? FP4IDX_DTYPE_F32 : FP4IDX_DTYPE_BF16,
                                         N, modes[m], after, 0, NULL);
            cr_assert_eq(rc, FP4IDX_ENONFINITE, "direct call, isa %s", names[isa]);
          }
          cr_assert_eq(b->ops->read_pages(b, 0, n_pages, after), FP4IDX_OK);
          cr_assert_eq(memcmp(before, after, (size_t)n_pages * PAGE * SLOT), 0,
                       "isa %s: the pool changed", names[isa]);
        }
    b->ops->destroy(b);
  }
  cr_assert_eq(unsetenv("FP4IDX_CPU_ISA"), 0);
  free(slots);
  free(before);
  free(after);
  free(kb);
  free(kf);
}

Test(cpu_quant, arguments) {
  uint16_t k[D] = {0};
  uint8_t out[SLOT];
  int64_t slot = 0;
  cr_assert_eq(fp4idx__cpu_quant_store(NULL, 0, k, FP4IDX_DTYPE_FP4, 1, FP4IDX_ROUND_RNE, out, 0, NULL),
               FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__cpu_quant_store(NULL, 0, k, FP4IDX_DTYPE_BF16, 1, (fp4idx_rounding_t)7, out, 0, NULL),
               FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__cpu_quant_store(NULL, 0, NULL, FP4IDX_DTYPE_BF16, 1, FP4IDX_ROUND_RNE, out, 0, NULL),
               FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__cpu_quant_store(NULL, 0, k, FP4IDX_DTYPE_BF16, 1, FP4IDX_ROUND_RNE, out, 0, &slot),
               FP4IDX_EINVAL, "slots need a page size");
  cr_assert_eq(fp4idx__cpu_quant_store(NULL, 0, k, FP4IDX_DTYPE_BF16, -1, FP4IDX_ROUND_RNE, out, 0, NULL),
               FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__cpu_quant_store(NULL, 0, NULL, FP4IDX_DTYPE_BF16, 0, FP4IDX_ROUND_RNE, NULL, 0, NULL),
               FP4IDX_OK);
}
