/* cpu_quant.h -- the CPU backend's fast quantizer (PROTOCOL.md appendix, "Quantizer"), private.
 *
 * Output is byte for byte that of fp4idx_quantize_key (kernels/
 * fp4idx_format.h), which stays the one definition of the format: the scale
 * byte comes from fp4idx_block_scale_code, and the E2M1 thresholds are
 * derived once from fp4idx_e2m1_encode itself (see cpu_quant.c). What is
 * faster is how the same answers are reached:
 *
 *  - per dtype code, no per-element switch; keys are read by memcpy into a
 *    local array (wire data may be unaligned);
 *  - pass 1 (amax): |x| as the bit pattern with the sign cleared, block max
 *    as an integer max (the order of non-negative IEEE patterns is the order
 *    of their values); a block max >= the +inf pattern means NaN/inf, so the
 *    non-finite check costs nothing extra;
 *  - pass 2 (codes): the scale is 2^j (j = s - 127), so |x|/scale > T iff
 *    |x| > T * 2^j, and T * 2^j is T's bit pattern with j added to the
 *    exponent field. The code index is then a count of integer compares of
 *    |x|'s pattern against 7 per-block thresholds -- no division, no float
 *    op, vectorizable for bf16 in 16-bit lanes. Exactness argument in
 *    cpu_quant.c (fp4idx__qthr_block).
 *
 * Both passes split the keys over the backend's thread pool for large
 * batches. Nothing is written to the destination unless every key is finite
 * (all-or-nothing, like the reference).
 */
#ifndef FP4IDX_CPU_QUANT_H
#define FP4IDX_CPU_QUANT_H

#include <stdint.h>

#include "cpu_internal.h"
#include "fp4idx_format.h"

/* Quantizes n (>= 0) bf16 or f32 keys ([n,128], any alignment) and writes
 * them to the page pool `base` of page_size-key pages at slots[i], or, when
 * slots is NULL, as n packed 68-byte slots (payload then scales) at base.
 * threads may be NULL (run on the caller only); isa is an FP4IDX__ISA_*
 * value this CPU can run (fp4idx__cpu_pick_isa); page_size must be a power
 * of two (fp4idx_page_size_valid) when slots are given. Slots within one call must
 * be distinct (the daemon allocates them so); with duplicates, which key
 * ends up in the slot is unspecified.
 * Returns FP4IDX_OK; FP4IDX_ENONFINITE (some element NaN/inf: nothing
 * written); FP4IDX_EINVAL (bad dtype/mode/pointers); FP4IDX_ENOMEM. */
int fp4idx__cpu_quant_store(fp4idx__threads_t *threads, int isa,
                            const void *keys, fp4idx_dtype_t dtype, int64_t n,
                            fp4idx_rounding_t mode, uint8_t *base,
                            int32_t page_size, const int64_t *slots);

/* ---- between cpu_quant.c and the per-ISA kernels (cpu_quant_kern.c) ---- */

/* Thresholds of one rounding mode, per scale byte s: element index idx =
 * number of k with pattern(|x|) > t32[s][k] (f32 keys) or > t16[s][k]
 * (bf16 keys), which is fp4idx_e2m1_encode's index of |x| / 2^(s-127);
 * exact[s] == 0 where that shortcut does not hold (s < 3, never produced by
 * the scale rule): the kernels then take the reference path. Built once,
 * see cpu_quant.c. */
typedef struct fp4idx__qthr_s {
  int32_t t32[256][8];
  int16_t t16[256][8];
  uint8_t exact[256];
} fp4idx__qthr_t;

/* fp4idx_block_scale_code of every bf16 block max (sign-cleared finite
 * pattern 0..0x7f7f), tabulated once from the header's function. */
extern uint8_t fp4idx__qscale_bf16[0x7f80];

typedef struct fp4idx__qjob_s {
  const uint8_t *keys;
  fp4idx_dtype_t dtype;
  fp4idx_rounding_t mode;
  const fp4idx__qthr_t *qt;   /* thresholds of `mode` */
  uint8_t *scales;            /* [n,4] scale bytes from pass 1 */
  uint8_t *base;
  int32_t page_size;          /* a power of two (with slots) */
  int page_shift;             /* log2(page_size) */
  const int64_t *slots;       /* NULL: packed output at base */
} fp4idx__qjob_t;

/* Pass 1 over keys [k0, k1): scale bytes into job->scales. Returns
 * FP4IDX_OK or FP4IDX_ENONFINITE (at the first non-finite key). */
typedef int (*fp4idx__qscales_fn)(const fp4idx__qjob_t *j, int64_t k0, int64_t k1);
/* Pass 2 over keys [k0, k1): payload and scales into the destination. */
typedef void (*fp4idx__qcodes_fn)(const fp4idx__qjob_t *j, int64_t k0, int64_t k1);

int fp4idx__qscales_generic(const fp4idx__qjob_t *j, int64_t k0, int64_t k1);
void fp4idx__qcodes_generic(const fp4idx__qjob_t *j, int64_t k0, int64_t k1);
#if defined(FP4IDX_CPU_X86_DISPATCH)
int fp4idx__qscales_avx2(const fp4idx__qjob_t *j, int64_t k0, int64_t k1);
void fp4idx__qcodes_avx2(const fp4idx__qjob_t *j, int64_t k0, int64_t k1);
int fp4idx__qscales_avx512(const fp4idx__qjob_t *j, int64_t k0, int64_t k1);
void fp4idx__qcodes_avx512(const fp4idx__qjob_t *j, int64_t k0, int64_t k1);
#endif

#endif
