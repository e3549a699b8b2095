/* cpu_quant.c -- the fast quantizer of the CPU backend (cpu_quant.h):
 * threshold tables derived from the format header, ISA pick, and the two
 * passes spread over the thread pool.
 *
 * Why the integer compares give fp4idx_quantize_key's bytes exactly:
 *
 * 1. Thresholds. fp4idx_e2m1_encode's index (code & 7) is a non-decreasing
 *    function of |v| (a count of thresholds below |v|, plus the RNE tie
 *    moving up). So for each k = 1..7 the set of non-negative finite f32
 *    values whose index is < k is a prefix [0, T_k] of the non-negative
 *    patterns, whose integer order is their value order, and
 *    index(|v|) = #{k : pattern(|v|) > T_k}. T_k is found once per mode by
 *    bisection over the patterns, asking fp4idx_e2m1_encode itself: the
 *    tie rule and threshold values are never restated here. (For RNE, T_k
 *    lands one ulp below the ties 0.75, 1.75, 3.5.)
 * 2. Scale. s = fp4idx_block_scale_code(amax), scale = 2^j, j = s - 127.
 *    The reference's v = x / scale is exact unless it falls below the normal
 *    range, and then |v| < 2^-126 is below every T_k (index 0) while |x| <
 *    T_k * 2^j too. Otherwise |v| > T_k iff |x| > T_k * 2^j, and T_k * 2^j
 *    is T_k's pattern with j added to the exponent field (the ends of the
 *    range: fp4idx__qt_scale below).
 *    Clamping |v| to 6 does not change the count (6 and everything above it
 *    are past the last threshold).
 * 3. amax. Block max of |x| as integer max of sign-cleared patterns (same
 *    order as the values; -0 gives 0 like the reference's fabs), then
 *    converted back to f32 exactly (bf16 -> f32 is exact).
 * 4. Sign. Reference: v < 0 and index != 0; index != 0 means |v| > 0, so
 *    v < 0 iff x's sign bit is set.
 * tests/test_cpu_quant.c checks all of it byte for byte against
 * fp4idx_quantize_key, on every ISA path.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu_quant.h"

static fp4idx__qthr_t fp4idx__qt[2]; /* [FP4IDX_ROUND_RNE, _THRESHOLD] */
uint8_t fp4idx__qscale_bf16[0x7f80];
static pthread_once_t fp4idx__qt_once = PTHREAD_ONCE_INIT;

static uint32_t fp4idx__qidx(uint32_t pattern, fp4idx_rounding_t mode) {
  return fp4idx_e2m1_encode(fp4idx_f32_from_bits(pattern), mode) & 7u;
}

/* The thresholds T_k * 2^j of scale byte s (j = s - 127) from the base
 * patterns T_k: j added to the exponent field. Exact while the result stays
 * a normal number; above the largest finite pattern the true threshold
 * exceeds FLT_MAX, so no finite |x| passes it, and the +inf pattern (the
 * clamp) gives that same answer. Below the normal range (exp_min + j < 1)
 * the shortcut is not used (exact = 0). For bf16 keys: a bf16 pattern q is
 * > the f32 pattern t iff q << 16 > t iff q > t >> 16 (floor; the RNE
 * patterns, one f32 ulp below a tie, have non-zero low halves). */
static void fp4idx__qt_scale(fp4idx__qthr_t *q, const uint32_t base[7],
                             int32_t exp_min, uint32_t s) {
  int32_t jx = (int32_t)s - 127;
  q->exact[s] = exp_min + jx >= 1;
  for (int k = 0; k < 8; k++) {
    int64_t v = k < 7 ? (int64_t)base[k] + (int64_t)jx * (1 << 23) : 0x7f800000;
    if (v > 0x7f800000) v = 0x7f800000;
    if (v < 0) v = 0; /* only where exact == 0 */
    q->t32[s][k] = (int32_t)v;
    q->t16[s][k] = (int16_t)(v >> 16);
  }
}

/* Builds the threshold tables and the bf16 scale table (pthread_once). */
static void fp4idx__qt_init(void) {
  for (int m = 0; m < 2; m++) {
    fp4idx_rounding_t mode = m ? FP4IDX_ROUND_THRESHOLD : FP4IDX_ROUND_RNE;
    uint32_t base[7];
    int32_t exp_min = 255;
    for (uint32_t k = 1; k <= 7; k++) {
      /* largest finite non-negative pattern whose index is < k */
      uint32_t lo = 0, hi = 0x7f7fffffu;
      if (fp4idx__qidx(hi, mode) < k) {
        lo = hi;
      } else {
        while (hi - lo > 1) { /* idx(lo) < k <= idx(hi) */
          uint32_t mid = lo + (hi - lo) / 2;
          if (fp4idx__qidx(mid, mode) < k) lo = mid;
          else hi = mid;
        }
      }
      base[k - 1] = lo;
      int32_t e = (int32_t)(lo >> 23);
      if (e < exp_min) exp_min = e;
    }
    for (uint32_t s = 0; s < 256; s++) fp4idx__qt_scale(&fp4idx__qt[m], base, exp_min, s);
  }
  for (uint32_t h = 0; h < 0x7f80; h++)
    fp4idx__qscale_bf16[h] = (uint8_t)fp4idx_block_scale_code(fp4idx_bf16_to_f32((uint16_t)h));
}

typedef struct {
  fp4idx__qjob_t job;
  fp4idx__qscales_fn scales_fn;
  fp4idx__qcodes_fn codes_fn;
  int64_t n;
  int nth;        /* threads taking part (<= the pool's) */
  int pass;       /* 1: scales, 2: codes */
  atomic_int bad; /* some key was non-finite: pass 1 stops early */
} fp4idx__qrun_t;

enum { FP4IDX__Q_CHUNK = 256 }; /* keys between checks of `bad` */

static void fp4idx__qrun_range(fp4idx__qrun_t *r, int64_t k0, int64_t k1) {
  if (r->pass == 2) {
    r->codes_fn(&r->job, k0, k1);
    return;
  }
  for (int64_t k = k0; k < k1; k += FP4IDX__Q_CHUNK) {
    if (atomic_load_explicit(&r->bad, memory_order_relaxed)) return;
    int64_t e = k1 - k < FP4IDX__Q_CHUNK ? k1 : k + FP4IDX__Q_CHUNK;
    if (r->scales_fn(&r->job, k, e) != FP4IDX_OK) {
      atomic_store_explicit(&r->bad, 1, memory_order_relaxed);
      return;
    }
  }
}

static void fp4idx__qrun_thread(void *arg, int tid) {
  fp4idx__qrun_t *r = arg;
  if (tid >= r->nth) return;
  int64_t k0 = r->n * tid / r->nth, k1 = r->n * (tid + 1) / r->nth;
  fp4idx__qrun_range(r, k0, k1);
}

/* Below this many keys per thread, waking workers costs more than it saves
 * (a pass over 1024 keys takes a few tens of us). */
enum { FP4IDX__Q_MIN_PER_THREAD = 1024 };

static void fp4idx__qrun_pass(fp4idx__threads_t *th, fp4idx__qrun_t *r, int pass) {
  r->pass = pass;
  if (r->nth > 1) fp4idx__threads_run(th, fp4idx__qrun_thread, r);
  else fp4idx__qrun_range(r, 0, r->n);
}

int fp4idx__cpu_quant_store(fp4idx__threads_t *threads, int isa,
                            const void *keys, fp4idx_dtype_t dtype, int64_t n,
                            fp4idx_rounding_t mode, uint8_t *base,
                            int32_t page_size, const int64_t *slots) {
  if (n < 0 || (dtype != FP4IDX_DTYPE_BF16 && dtype != FP4IDX_DTYPE_F32) ||
      (mode != FP4IDX_ROUND_RNE && mode != FP4IDX_ROUND_THRESHOLD))
    return FP4IDX_EINVAL;
  if (n == 0) return FP4IDX_OK;
  if (!keys || !base || (slots && !fp4idx_page_size_valid(page_size)))
    return FP4IDX_EINVAL;
  if ((uint64_t)n > SIZE_MAX / 4) return FP4IDX_ENOMEM;
  pthread_once(&fp4idx__qt_once, fp4idx__qt_init);

  int rc = FP4IDX_OK;
  /* pass 1's scale bytes, 4 per key; on the stack for small appends */
  uint8_t small[4 * 1024];
  uint8_t *scales = n <= 1024 ? small : malloc((size_t)n * 4);
  if (!scales) return FP4IDX_ENOMEM;
  fp4idx__qrun_t r = {
      .job = {.keys = keys, .dtype = dtype, .mode = mode,
              .qt = &fp4idx__qt[mode == FP4IDX_ROUND_THRESHOLD],
              .scales = scales, .base = base, .page_size = page_size,
              .slots = slots},
      .scales_fn = fp4idx__qscales_generic,
      .codes_fn = fp4idx__qcodes_generic,
      .n = n,
      .nth = 1};
  atomic_init(&r.bad, 0);
  while (slots && (1 << r.job.page_shift) < page_size) r.job.page_shift++;
#if defined(FP4IDX_CPU_X86_DISPATCH)
  if (isa == FP4IDX__ISA_AVX512) {
    r.scales_fn = fp4idx__qscales_avx512;
    r.codes_fn = fp4idx__qcodes_avx512;
  } else if (isa == FP4IDX__ISA_AVX2) {
    r.scales_fn = fp4idx__qscales_avx2;
    r.codes_fn = fp4idx__qcodes_avx2;
  }
#else
  (void)isa;
#endif
  if (threads) {
    int64_t most = n / FP4IDX__Q_MIN_PER_THREAD;
    int cnt = fp4idx__threads_count(threads);
    r.nth = most < cnt ? (int)(most < 1 ? 1 : most) : cnt;
  }
  /* pass 1 reads every key and writes only `scales`; the destination is
   * touched in pass 2, once every key is known finite (all-or-nothing) */
  fp4idx__qrun_pass(threads, &r, 1);
  if (atomic_load(&r.bad)) {
    rc = FP4IDX_ENONFINITE;
    goto out;
  }
  fp4idx__qrun_pass(threads, &r, 2);
out:
  if (scales != small) free(scales);
  return rc;
}
