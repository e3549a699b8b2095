/* cpu_score.h -- private to the CPU scorer: shared by cpu_score.c (setup,
 * threads, top-k merge, dispatch) and cpu_tile.c (the per-tile kernels, which
 * are compiled once per instruction set: generic, AVX2, AVX-512). */
#ifndef FP4IDX_CPU_SCORE_H
#define FP4IDX_CPU_SCORE_H

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

enum {
  FP4IDX__TK = 32,   /* keys per tile: two 16-lane f32 vectors */
  FP4IDX__G = 8,     /* query vectors (heads) per kernel call */
  FP4IDX__CHUNK = 4  /* tiles taken per atomic increment */
};
#define FP4IDX__D FP4IDX_HEAD_DIM

/* 16-lane vectors: the AVX-512 decode (cpu_tile.c). */
typedef float fp4idx__v16f __attribute__((vector_size(64)));
typedef int32_t fp4idx__v16i __attribute__((vector_size(64)));
typedef uint8_t fp4idx__v16u8 __attribute__((vector_size(16)));

#define FP4IDX__INLINE static inline __attribute__((always_inline))

/* Double -> nearest bf16 (ties to even), as the f32 of that bf16 (exact);
 * bf16 subnormals and overflow to inf included. Never rounds through f32
 * (that would round twice). */
FP4IDX__INLINE float fp4idx__f64_to_bf16f_inl(double x) {
  if (x != x) return (float)x;
  double a = fabs(x);
  if (a < 0x1p-126) {
    /* bf16 subnormals: a fixed grid of 2^-133; x * 2^133 is exact and
     * nearbyint rounds half to even in the default rounding mode. */
    return (float)(nearbyint(x * 0x1p133) * 0x1p-133);
  }
  uint64_t u;
  memcpy(&u, &x, 8);
  if ((u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) return (float)x;
  /* keep 1 + 7 mantissa bits: drop 45 bits with round-half-even */
  u += ((1ull << 44) - 1) + ((u >> 45) & 1);
  u &= ~((1ull << 45) - 1);
  double r;
  memcpy(&r, &u, 8);
  return (float)r; /* exact, or +-inf when r >= 2^128 (bf16 overflow) */
}

/* Exponent bounds of one group of query vectors (see the header). */
typedef struct fp4idx__grp_s {
  int f64_only;  /* non-finite q or w: never the f32 kernel */
  int zero;      /* every q and w of the group is 0: contributes exactly 0 */
  int hi;        /* 6 * sum|q| < 2^hi for each vector of the group */
  int lo;        /* every q_i * e2m1 is a multiple of 2^(lo + scale exp) */
  int wlo;       /* every nonzero |w| >= 2^wlo */
} fp4idx__grp_t;

/* Top-k candidates of one row in one thread: a buffer of up to 2k pairs.
 * When it fills, the best k are kept (quickselect) and the worst of them
 * becomes a threshold that rejects most later candidates with one compare:
 * amortized O(1) per candidate. */
typedef struct fp4idx__heap_s {
  int32_t *pos;  /* [2k] */
  float *val;    /* [2k] */
  int64_t n;
  int have_thr;  /* thr = the k-th best pair seen so far */
  float thr_v;
  int32_t thr_p;
} fp4idx__heap_t;

typedef struct fp4idx__scratch_s {
  float *ktf;     /* [128][TK] decoded tile, element-major */
  double *ktd;    /* [128][TK] the same in double (f64 kernel), lazily */
  float *d32;     /* [G][TK] */
  double *d64;    /* [G][TK] */
  double *sums;   /* [TK] */
  fp4idx__heap_t *heaps; /* [R] when topk */
} fp4idx__scratch_t;

typedef struct fp4idx__ctx_s {
  const uint8_t *pool;
  int64_t P;
  int pshift;               /* log2(P) */
  const fp4idx_backend_seq_t *sq;
  int H, Hp, ngroups, R;
  const float *qf;          /* [R][Hp][128] */
  const float *wf;          /* [R][Hp] */
  const fp4idx__grp_t *gi;  /* [R][ngroups] */
  int64_t ntiles;
  atomic_llong next;
  float *logits;            /* [R][width] or NULL (topk mode) */
  int64_t topk;
  fp4idx__scratch_t *scr;   /* [threads] */
  const float *lut;         /* [16] E2M1 values (fp4idx_format.h decoder) */
  void (*tile)(struct fp4idx__ctx_s *c, struct fp4idx__scratch_s *s, int64_t t0);
} fp4idx__ctx_t;

/* Offers (v, p) to a row's top-k candidates (k = topk). */
void fp4idx__topk_add(fp4idx__heap_t *h, int64_t k, float v, int32_t p);
FP4IDX__INLINE void fp4idx__heap_push(fp4idx__heap_t *h, int64_t k, float v, int32_t p) {
  /* not better than the k-th best so far: cannot make the top k */
  if (h->have_thr && !(v > h->thr_v || (v == h->thr_v && p < h->thr_p))) return;
  fp4idx__topk_add(h, k, v, p);
}

/* Scores one tile of TK keys starting at position t0 for every row of the
 * context's sequence: logits or heap pushes (cpu_tile.c, one per ISA). */
typedef void (*fp4idx__tile_fn)(fp4idx__ctx_t *c, fp4idx__scratch_t *s, int64_t t0);
void fp4idx__score_tile_generic(fp4idx__ctx_t *c, fp4idx__scratch_t *s, int64_t t0);
#if defined(FP4IDX_CPU_X86_DISPATCH)
void fp4idx__score_tile_avx2(fp4idx__ctx_t *c, fp4idx__scratch_t *s, int64_t t0);
void fp4idx__score_tile_avx512(fp4idx__ctx_t *c, fp4idx__scratch_t *s, int64_t t0);
#endif

#endif
