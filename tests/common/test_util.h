/* test_util.h -- shared helpers of the fp4idx tests (owned by the
 * foundation; CPU, CUDA, daemon and client tests all use them).
 *
 * Contents
 *   - golden files: directory resolution and loading;
 *   - a deterministic RNG (splitmix64), seeded explicitly by each test;
 *   - dyadic case generator: keys, queries and weights whose values are
 *     multiples of 1/8, keys on shuffled pages, so every scorer (f32 or f64
 *     accumulation) must agree with the reference bit for bit;
 *   - a float64 REFERENCE SCORER written independently of the backends (own
 *     decoders via ldexp, own bf16 rounding via frexp/nearbyint), and a
 *     reference top-k.
 *
 * Nothing here calls Criterion, so any test (or a benchmark) may link it.
 * Functions that allocate return NULL / negative on failure; tests assert.
 */
#ifndef FP4IDX_TEST_UTIL_H
#define FP4IDX_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- golden files ------------------------------------------------------- */

/* The directory holding the golden files: $FP4IDX_GOLDEN_DIR when set and
 * non-empty, else FP4IDX_GOLDEN_DIR_DEFAULT (compiled in by
 * fp4idx_add_test: tests/golden of the source tree). Never NULL. */
const char *fp4idx_test_golden_dir(void);

/* Reads a whole file into malloc'ed memory; *size gets its length (may be
 * NULL). Returns NULL if it cannot be read. Free with free(). */
void *fp4idx_test_load_file(const char *path, size_t *size);

/* Reads golden file `name` (e.g. "quant_keys.bin") from the golden dir.
 * If expect_size != 0 and the file has another size, returns NULL.
 * *size (may be NULL) gets the length. Free with free(). */
void *fp4idx_test_load_golden(const char *name, size_t expect_size, size_t *size);

/* ---- RNG (splitmix64) --------------------------------------------------- */

typedef struct fp4idx_test_rng_s {
  uint64_t state;
} fp4idx_test_rng_t;

void fp4idx_test_rng_seed(fp4idx_test_rng_t *rng, uint64_t seed);
uint64_t fp4idx_test_rng_next(fp4idx_test_rng_t *rng);
/* Uniform integer in [0, n); n >= 1. */
uint64_t fp4idx_test_rng_below(fp4idx_test_rng_t *rng, uint64_t n);
/* Uniform integer in [lo, hi] (inclusive). */
int64_t fp4idx_test_rng_range(fp4idx_test_rng_t *rng, int64_t lo, int64_t hi);
/* Fisher-Yates shuffle of a[0..n). */
void fp4idx_test_shuffle_i32(fp4idx_test_rng_t *rng, int32_t *a, int64_t n);

/* ---- bf16 helpers (independent of kernels/fp4idx_format.h) ---------------- */

/* bf16 bit pattern -> double (exact). */
double fp4idx_test_bf16_to_f64(uint16_t h);
/* double -> nearest bf16 (ties to even, subnormals, overflow to inf), as
 * the bit pattern. Written with frexp/ldexp/nearbyint, not bit tricks, so
 * it is an independent check of the backends' rounding. */
uint16_t fp4idx_test_f64_to_bf16(double x);
/* The same, returned as the double value of that bf16. */
double fp4idx_test_round_bf16(double x);

/* ---- reference decoders --------------------------------------------------- */

/* E2M1 code (0..15) -> exact value via ldexp (sign bit 3, e bits 2..1,
 * m bit 0). UE8M0 byte -> 2^(s-127) via ldexp, with the format's choices
 * s = 0 -> 0 and s = 255 -> +inf. */
double fp4idx_test_e2m1_value(unsigned code);
double fp4idx_test_ue8m0_value(unsigned s);
/* Element e (0..127) of a packed 68-byte key, as bf16(decode), in double. */
double fp4idx_test_key_element(const uint8_t *slot68, int e);

/* ---- reference scorer ------------------------------------------------------ */

/* The scorer of PROTOCOL.md's appendix in float64:
 *   keys   [n_keys, 68] packed slots in POSITION order (no pages);
 *   q      [rows, heads, 128] bf16, w [rows, heads] bf16;
 *   lens   [rows] visible counts (NULL: every row sees `width`);
 *   mask   [rows, width] u8 or NULL (0 hides a position);
 *   out    [rows, width] f32: logit, or -inf where l >= lens[r] or masked.
 * Requires width <= n_keys and lens[r] <= width. Returns 0, or -1 when an
 * argument is out of range (nothing written). */
int fp4idx_test_ref_score(const uint8_t *keys, int64_t n_keys, int heads,
                          int rows, const uint16_t *q, const uint16_t *w,
                          const int32_t *lens, const uint8_t *mask,
                          int64_t width, float *out);

/* Reference top-k over [rows, width] logits: per row the k largest
 * non-(-inf), non-NaN logits, logit descending then position ascending;
 * pos/val [rows, k] padded with -1 / -inf; count [rows]. Returns 0 or -1. */
int fp4idx_test_ref_topk(const float *logits, int rows, int64_t width, int k,
                         int32_t *pos, float *val, int32_t *count);

/* ---- dyadic case generator ------------------------------------------------- */

/* A scoring case, everything malloc'ed, ready for a backend and for the
 * reference. Keys are bf16 with values k/8 (|k| <= 48) quantized with the
 * RNE quantizer of fp4idx_format.h into `packed`. Page ids are a shuffled
 * subset of [0, n_pages); position l lives at slot pages[l/P]*P + l%P. */
typedef struct fp4idx_test_case_s {
  int heads, rows;
  int64_t n_keys;      /* keys of the sequence */
  int64_t width;       /* max(lens) */
  int32_t page_size;   /* P */
  int64_t n_pages;     /* pool pages the case assumes (>= ceil(n_keys/P)) */
  uint16_t *keys;      /* [n_keys, 128] bf16 */
  uint8_t *packed;     /* [n_keys, 68] quantized keys, position order */
  int32_t *pages;      /* [n_pages] shuffled page ids; the sequence uses the
                          first ceil(n_keys/P) of them */
  int64_t *slots;      /* [n_keys] slot of each position */
  uint16_t *q;         /* [rows, heads, 128] bf16, values k/8, |k| <= 16 */
  uint16_t *w;         /* [rows, heads] bf16, values k/8, |k| <= 16 */
  int32_t *lens;       /* [rows] */
  uint8_t *mask;       /* [rows, width] or NULL */
} fp4idx_test_case_t;

/* Fills *c. lens: [rows] visible counts, or NULL for n_keys, n_keys-1, ...
 * (clamped at 0), the shape of verify rows. with_mask: random mask with
 * about 1 in 4 positions hidden. n_pages: pool size to draw page ids from
 * (0: exactly the pages needed, shuffled). Returns 0 or -1 (memory/args). */
int fp4idx_test_case_dyadic(fp4idx_test_case_t *c, fp4idx_test_rng_t *rng,
                            int heads, int rows, int64_t n_keys,
                            int32_t page_size, int64_t n_pages,
                            const int32_t *lens, int with_mask);
void fp4idx_test_case_free(fp4idx_test_case_t *c);

/* Number of positions where two [n] float arrays differ bit-wise (so +0
 * and -0 differ, -inf equals -inf); any NaN equals any NaN. */
int64_t fp4idx_test_count_diff(const float *a, const float *b, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
