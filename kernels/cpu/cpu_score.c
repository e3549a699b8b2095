/* cpu_score.c -- the CPU scorer, bit-exact to DESIGN.md s3.
 *
 * For a sequence with R verify rows and H heads, each key l and row r:
 *   k = bf16(decode(k_l));  d[h] = bf16(q[r,h] . k);
 *   p[h] = bf16(max(d[h], 0) * w[r,h]);  logit = f32(bf16(sum_h p[h])).
 *
 * Work split: keys are cut into tiles of FP4IDX__TK keys; threads take tiles
 * from an atomic counter. A tile is decoded once (transposed, element-major,
 * so that one vector holds one element of 16 keys) and reused by all R*H
 * query vectors. Query vectors go in groups of FP4IDX__G heads; the kernel
 * keeps 2 x G vector accumulators in registers (16 keys per vector).
 *
 * Exactness. Two kernels compute the dot products:
 *  - f32, used when it is PROVABLY exact for a (group, tile) pair. Every term
 *    q_i * k_i and every partial sum is a multiple of 2^G with
 *    G = lo_q + s_min - 127 (lo_q: lowest set bit of any q element, minus one
 *    for the 0.5 step of E2M1; s_min: smallest scale byte in the tile) and is
 *    bounded by 6 * sum|q| * 2^(s_max - 127) < 2^(hi_q + s_max - 127).
 *    Numbers that are multiples of 2^G and at most 2^(G+24) in magnitude are
 *    f32 values when G >= -149, so if hi_q + s_max <= lo_q + s_min + 24 the
 *    f32 accumulation is exact in any order (FMA or not). The same bounds
 *    keep d finite and, with the smallest |w| exponent, keep d_bf16 * w out of
 *    the f32 subnormal range, so that product is exact too.
 *  - f64 otherwise (wide exponent spread, non-finite inputs), with the
 *    roundings done from double straight to bf16 (never through f32, which
 *    would round twice).
 * The head sum is accumulated in double in both cases (the contract's
 * "float64 on the CPU").
 *
 * NaN: max(NaN, 0) is NaN here (IEEE propagation, like torch.clamp_min);
 * NaN logits are left out of top-k. Only keys stored verbatim (FP4 dtype)
 * with scale byte 255, or non-finite q/w, can produce them.
 */
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

typedef float fp4idx__v16f __attribute__((vector_size(64)));
typedef float fp4idx__v8f __attribute__((vector_size(32)));
typedef uint32_t fp4idx__v16u __attribute__((vector_size(64)));
typedef int32_t fp4idx__v16i __attribute__((vector_size(64)));
typedef double fp4idx__v8d __attribute__((vector_size(64)));

/* Function multi-versioning: the hot tile function is compiled for AVX-512,
 * AVX2 and baseline x86-64 and picked at load time (GCC ifunc). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(FP4IDX_NO_CLONES)
#define FP4IDX__CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FP4IDX__CLONES
#endif
#define FP4IDX__INLINE static inline __attribute__((always_inline))

float fp4idx__f64_to_bf16f(double x) {
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

typedef struct fp4idx__heap_s {
  int32_t *pos;
  float *val;
  int64_t n;
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
  const fp4idx_score_seq_t *sq;
  int H, Hp, ngroups, R;
  const float *qf;          /* [R][Hp][128] */
  const float *wf;          /* [R][Hp] */
  const fp4idx__grp_t *gi;  /* [R][ngroups] */
  int64_t ntiles;
  atomic_llong next;
  float *logits;            /* [R][width] or NULL (topk mode) */
  int64_t topk;
  fp4idx__scratch_t *scr;   /* [threads] */
} fp4idx__ctx_t;

static float fp4idx__e2m1_lut[16];

/* ---- top-k heap: root = the worst kept pair --------------------------- */

/* a is worse than b: lower logit, or the same logit at a higher position */
FP4IDX__INLINE int fp4idx__worse(float va, int32_t pa, float vb, int32_t pb) {
  return va < vb || (va == vb && pa > pb);
}

static void fp4idx__heap_push(fp4idx__heap_t *h, int64_t k, float v, int32_t p) {
  int64_t i;
  if (h->n < k) {
    i = h->n++;
    while (i > 0) {
      int64_t up = (i - 1) / 2;
      if (!fp4idx__worse(v, p, h->val[up], h->pos[up])) break;
      h->val[i] = h->val[up];
      h->pos[i] = h->pos[up];
      i = up;
    }
    h->val[i] = v;
    h->pos[i] = p;
    return;
  }
  if (!fp4idx__worse(h->val[0], h->pos[0], v, p)) return;
  i = 0;
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && fp4idx__worse(h->val[c + 1], h->pos[c + 1], h->val[c], h->pos[c]))
      c++;
    if (!fp4idx__worse(h->val[c], h->pos[c], v, p)) break;
    h->val[i] = h->val[c];
    h->pos[i] = h->pos[c];
    i = c;
  }
  h->val[i] = v;
  h->pos[i] = p;
}

/* ---- kernels ------------------------------------------------------------ */

/* d[g][j] = q[g] . k_j in f32 for G vectors and TK keys. */
FP4IDX__INLINE void fp4idx__kern_f32(const float *restrict q,
                                     const float *restrict kt,
                                     float *restrict d) {
  fp4idx__v16f a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0},
               a30 = {0}, a31 = {0}, a40 = {0}, a41 = {0}, a50 = {0}, a51 = {0},
               a60 = {0}, a61 = {0}, a70 = {0}, a71 = {0};
  for (int i = 0; i < FP4IDX__D; i++) {
    fp4idx__v16f k0 = *(const fp4idx__v16f *)(kt + i * FP4IDX__TK);
    fp4idx__v16f k1 = *(const fp4idx__v16f *)(kt + i * FP4IDX__TK + 16);
#define FP4IDX__STEP(g)                          \
  {                                              \
    float s = q[(g) * FP4IDX__D + i];            \
    a##g##0 += s * k0;                           \
    a##g##1 += s * k1;                           \
  }
    FP4IDX__STEP(0) FP4IDX__STEP(1) FP4IDX__STEP(2) FP4IDX__STEP(3)
    FP4IDX__STEP(4) FP4IDX__STEP(5) FP4IDX__STEP(6) FP4IDX__STEP(7)
#undef FP4IDX__STEP
  }
#define FP4IDX__OUT(g)                                                   \
  *(fp4idx__v16f *)(d + (g) * FP4IDX__TK) = a##g##0;                    \
  *(fp4idx__v16f *)(d + (g) * FP4IDX__TK + 16) = a##g##1;
  FP4IDX__OUT(0) FP4IDX__OUT(1) FP4IDX__OUT(2) FP4IDX__OUT(3)
  FP4IDX__OUT(4) FP4IDX__OUT(5) FP4IDX__OUT(6) FP4IDX__OUT(7)
#undef FP4IDX__OUT
}

/* d[g][j] = q[g] . k_j in f64 for 4 vectors and TK keys (4 x 8 lanes). */
FP4IDX__INLINE void fp4idx__kern_f64x4(const float *restrict q,
                                       const double *restrict kt,
                                       double *restrict d) {
  fp4idx__v8d a[4][4];
  memset(a, 0, sizeof a);
  for (int i = 0; i < FP4IDX__D; i++) {
    const fp4idx__v8d *k = (const fp4idx__v8d *)(kt + i * FP4IDX__TK);
    fp4idx__v8d k0 = k[0], k1 = k[1], k2 = k[2], k3 = k[3];
    for (int g = 0; g < 4; g++) {
      double s = q[g * FP4IDX__D + i];
      a[g][0] += s * k0;
      a[g][1] += s * k1;
      a[g][2] += s * k2;
      a[g][3] += s * k3;
    }
  }
  for (int g = 0; g < 4; g++)
    for (int c = 0; c < 4; c++) *(fp4idx__v8d *)(d + g * FP4IDX__TK + 8 * c) = a[g][c];
}

/* RNE f32 -> bf16 on 16 lanes (finite inputs), kept as f32, in place.
 * (A macro: a function taking or returning a 64-byte vector by value would
 * have a target-dependent ABI.) */
#define FP4IDX__ROUND_BF16_V(x)                                     \
  do {                                                              \
    fp4idx__v16u u_ = (fp4idx__v16u)(x);                            \
    u_ = (u_ + 0x7fffu + ((u_ >> 16) & 1u)) & 0xffff0000u;          \
    (x) = (fp4idx__v16f)u_;                                         \
  } while (0)

/* ---- one tile ----------------------------------------------------------- */

FP4IDX__CLONES
static void fp4idx__score_tile(fp4idx__ctx_t *c, fp4idx__scratch_t *s,
                               int64_t t0) {
  const fp4idx_score_seq_t *sq = c->sq;
  int64_t nk = sq->width - t0; /* keys of this tile that exist in the output */
  if (nk > FP4IDX__TK) nk = FP4IDX__TK;

  /* Rows that see at least one key of the tile. */
  int any = 0;
  for (int r = 0; r < c->R; r++) any |= sq->lens[r] > t0;
  if (!any) goto invisible_only;

  /* Decode the tile (the keys past the last visible one of every row are
   * never read: the scorer must not touch pages it was not given). */
  int64_t lim = 0;
  for (int r = 0; r < c->R; r++) lim = sq->lens[r] > lim ? sq->lens[r] : lim;
  int nd = (int)((lim - t0) < nk ? (lim - t0) : nk);
  uint32_t smin = 255, smax = 0;
  float *kt = s->ktf;
  for (int j = 0; j < nd; j++) {
    int64_t l = t0 + j;
    int64_t slot = (int64_t)sq->pages[l >> c->pshift] * c->P + (l & (c->P - 1));
    const uint8_t *pay = c->pool + fp4idx_payload_offset(slot, c->P);
    const uint8_t *sc = c->pool + fp4idx_scale_offset(slot, c->P);
    for (int blk = 0; blk < 4; blk++) {
      uint32_t sb = sc[blk];
      smin = sb < smin ? sb : smin;
      smax = sb > smax ? sb : smax;
      float scale = fp4idx_ue8m0_to_f32(sb);
      for (int e = blk * 32; e < blk * 32 + 32; e += 2) {
        uint32_t byte = pay[e >> 1];
        kt[e * FP4IDX__TK + j] = fp4idx__e2m1_lut[byte & 15u] * scale;
        kt[(e + 1) * FP4IDX__TK + j] = fp4idx__e2m1_lut[byte >> 4] * scale;
      }
    }
  }
  for (int j = nd; j < FP4IDX__TK; j++)
    for (int e = 0; e < FP4IDX__D; e++) kt[e * FP4IDX__TK + j] = 0.0f;
  int have_ktd = 0;

  for (int r = 0; r < c->R; r++) {
    float *out = c->logits ? c->logits + (int64_t)r * sq->width + t0 : NULL;
    if (sq->lens[r] <= t0) {
      if (out)
        for (int j = 0; j < nk; j++) out[j] = -INFINITY;
      continue;
    }
    double *sums = s->sums;
    for (int j = 0; j < FP4IDX__TK; j++) sums[j] = 0.0;
    for (int g = 0; g < c->ngroups; g++) {
      const fp4idx__grp_t *gi = &c->gi[r * c->ngroups + g];
      if (gi->zero) continue;
      const float *q = c->qf + ((int64_t)r * c->Hp + g * FP4IDX__G) * FP4IDX__D;
      const float *w = c->wf + (int64_t)r * c->Hp + g * FP4IDX__G;
      int ng = c->H - g * FP4IDX__G;
      if (ng > FP4IDX__G) ng = FP4IDX__G;
      int lo = gi->lo + (int)smin - 127;
      int f32ok = !gi->f64_only && smax <= 252 && lo >= -149 &&
                  gi->hi + (int)smax <= gi->lo + (int)smin + 24 &&
                  gi->hi + (int)smax - 127 <= 126 && lo + gi->wlo >= -126;
      if (f32ok) {
        fp4idx__kern_f32(q, kt, s->d32);
        for (int h = 0; h < ng; h++) {
          float wv = w[h];
          for (int half = 0; half < 2; half++) {
            fp4idx__v16f dv = *(fp4idx__v16f *)(s->d32 + h * FP4IDX__TK + 16 * half);
            FP4IDX__ROUND_BF16_V(dv);
            fp4idx__v16i pos = dv > 0.0f;
            dv = (fp4idx__v16f)((fp4idx__v16u)dv & (fp4idx__v16u)pos);
            fp4idx__v16f p = dv * wv;
            FP4IDX__ROUND_BF16_V(p);
            fp4idx__v8f plo, phi;
            memcpy(&plo, &p, 32);
            memcpy(&phi, (const char *)&p + 32, 32);
            fp4idx__v8d *sv = (fp4idx__v8d *)(sums + 16 * half);
            sv[0] += __builtin_convertvector(plo, fp4idx__v8d);
            sv[1] += __builtin_convertvector(phi, fp4idx__v8d);
          }
        }
      } else {
        if (!have_ktd) {
          for (int e = 0; e < FP4IDX__D * FP4IDX__TK; e++) s->ktd[e] = kt[e];
          have_ktd = 1;
        }
        fp4idx__kern_f64x4(q, s->ktd, s->d64);
        fp4idx__kern_f64x4(q + 4 * FP4IDX__D, s->ktd, s->d64 + 4 * FP4IDX__TK);
        for (int h = 0; h < ng; h++) {
          double wv = w[h];
          for (int j = 0; j < nd; j++) {
            double db = fp4idx__f64_to_bf16f(s->d64[h * FP4IDX__TK + j]);
            double dm = (db > 0.0 || db != db) ? db : 0.0;
            sums[j] += fp4idx__f64_to_bf16f(dm * wv);
          }
        }
      }
    }
    /* logits of the row for this tile */
    const uint8_t *mask = sq->mask ? sq->mask + (int64_t)r * sq->width + t0 : NULL;
    int64_t vis = sq->lens[r] - t0; /* positions j < vis are visible */
    for (int j = 0; j < nk; j++) {
      float lg = -INFINITY;
      if (j < vis && (!mask || mask[j])) lg = fp4idx__f64_to_bf16f(sums[j]);
      if (out) {
        out[j] = lg;
      } else if (lg != -INFINITY && lg == lg) {
        fp4idx__heap_push(&s->heaps[r], c->topk, lg, (int32_t)(t0 + j));
      }
    }
  }
  return;

invisible_only:
  if (c->logits)
    for (int r = 0; r < c->R; r++)
      for (int j = 0; j < nk; j++) c->logits[(int64_t)r * sq->width + t0 + j] = -INFINITY;
}

static void fp4idx__worker(void *arg, int tid) {
  fp4idx__ctx_t *c = arg;
  fp4idx__scratch_t *s = &c->scr[tid];
  for (;;) {
    long long t = atomic_fetch_add(&c->next, FP4IDX__CHUNK);
    if (t >= c->ntiles) break;
    long long end = t + FP4IDX__CHUNK < c->ntiles ? t + FP4IDX__CHUNK : c->ntiles;
    for (; t < end; t++) fp4idx__score_tile(c, s, t * FP4IDX__TK);
  }
}

/* ---- setup -------------------------------------------------------------- */

/* Lowest set bit exponent of a nonzero finite bf16 value. */
static int fp4idx__bf16_grid(uint16_t h) {
  uint32_t E = (h >> 7) & 0xffu, M = h & 0x7fu;
  uint32_t sig = E ? (0x80u | M) : M;
  int e = E ? (int)E - 134 : -133;
  return e + __builtin_ctz(sig);
}

static void fp4idx__group_info(const fp4idx_score_seq_t *sq, int H, int r, int g,
                               fp4idx__grp_t *gi) {
  memset(gi, 0, sizeof *gi);
  int zero = 1, hi = -100000, lo = 100000, wlo = 100000;
  for (int hh = g * FP4IDX__G; hh < (g + 1) * FP4IDX__G && hh < H; hh++) {
    const uint16_t *q = sq->q + ((int64_t)r * H + hh) * FP4IDX__D;
    uint16_t w = sq->w[(int64_t)r * H + hh];
    if (((w >> 7) & 0xffu) == 0xffu) gi->f64_only = 1;
    if (w & 0x7fffu) {
      zero = 0;
      int E = (w >> 7) & 0xff;
      int we = E ? E - 127 : -133 + (31 - __builtin_clz(w & 0x7fu));
      wlo = we < wlo ? we : wlo;
    }
    double s1 = 0;
    for (int i = 0; i < FP4IDX__D; i++) {
      uint16_t h = q[i];
      if (((h >> 7) & 0xffu) == 0xffu) gi->f64_only = 1;
      if (!(h & 0x7fffu)) continue;
      zero = 0;
      int gr = fp4idx__bf16_grid(h) - 1;
      lo = gr < lo ? gr : lo;
      s1 += fabs((double)fp4idx_bf16_to_f32(h));
    }
    if (s1 > 0) {
      int e;
      frexp(6.0 * s1 * (1.0 + 0x1p-40), &e); /* 6*s1 < 2^e */
      hi = e > hi ? e : hi;
    }
  }
  gi->zero = zero && !gi->f64_only;
  if (lo == 100000) lo = 0;   /* all-zero q: every d is exactly 0 */
  if (hi == -100000) hi = -100000 / 2;
  if (wlo == 100000) wlo = 0;
  gi->hi = hi;
  gi->lo = lo;
  gi->wlo = wlo;
}

typedef struct {
  float v;
  int32_t p;
} fp4idx__pair_t;

/* qsort order of top-k: logit descending, then position ascending */
static int fp4idx__cmp_pair(const void *a, const void *b) {
  const fp4idx__pair_t *x = a, *y = b;
  if (x->v != y->v) return x->v > y->v ? -1 : 1;
  return (x->p > y->p) - (x->p < y->p);
}

static void fp4idx__init_lut(void) {
  for (uint32_t code = 0; code < 16; code++)
    fp4idx__e2m1_lut[code] = fp4idx_e2m1_to_f32(code);
}

/* Scores one sequence; rows' outputs start at logits/topk row `row0`. */
static int fp4idx__score_seq(fp4idx_backend_t *b, const fp4idx_score_batch_t *bt,
                             const fp4idx_score_seq_t *sq, int64_t logit_off,
                             int64_t row0) {
  fp4idx__cpu_t *cpu = b->impl;
  int T = fp4idx__threads_count(cpu->threads);
  int H = bt->heads, R = sq->rows;
  int ngroups = (H + FP4IDX__G - 1) / FP4IDX__G, Hp = ngroups * FP4IDX__G;
  int64_t topk = bt->topk;
  int rc = FP4IDX_ENOMEM;
  fp4idx__ctx_t c;
  memset(&c, 0, sizeof c);
  fp4idx__pair_t *merge = NULL;
  float *qf = calloc((size_t)R * Hp * FP4IDX__D, sizeof *qf);
  float *wf = calloc((size_t)R * Hp, sizeof *wf);
  fp4idx__grp_t *gi = calloc((size_t)R * ngroups, sizeof *gi);
  fp4idx__scratch_t *scr = calloc((size_t)T, sizeof *scr);
  if (!qf || !wf || !gi || !scr) goto out;
  for (int r = 0; r < R; r++)
    for (int h = 0; h < H; h++) {
      for (int i = 0; i < FP4IDX__D; i++)
        qf[((int64_t)r * Hp + h) * FP4IDX__D + i] =
            fp4idx_bf16_to_f32(sq->q[((int64_t)r * H + h) * FP4IDX__D + i]);
      wf[(int64_t)r * Hp + h] = fp4idx_bf16_to_f32(sq->w[(int64_t)r * H + h]);
    }
  for (int r = 0; r < R; r++)
    for (int g = 0; g < ngroups; g++) fp4idx__group_info(sq, H, r, g, &gi[r * ngroups + g]);
  for (int t = 0; t < T; t++) {
    fp4idx__scratch_t *s = &scr[t];
    s->ktf = aligned_alloc(64, sizeof(float) * FP4IDX__D * FP4IDX__TK);
    s->ktd = aligned_alloc(64, sizeof(double) * FP4IDX__D * FP4IDX__TK);
    s->d32 = aligned_alloc(64, sizeof(float) * FP4IDX__G * FP4IDX__TK);
    s->d64 = aligned_alloc(64, sizeof(double) * FP4IDX__G * FP4IDX__TK);
    s->sums = aligned_alloc(64, sizeof(double) * FP4IDX__TK);
    if (!s->ktf || !s->ktd || !s->d32 || !s->d64 || !s->sums) goto out;
    if (topk > 0) {
      s->heaps = calloc((size_t)R, sizeof *s->heaps);
      if (!s->heaps) goto out;
      for (int r = 0; r < R; r++) {
        s->heaps[r].pos = malloc(sizeof(int32_t) * (size_t)topk);
        s->heaps[r].val = malloc(sizeof(float) * (size_t)topk);
        if (!s->heaps[r].pos || !s->heaps[r].val) goto out;
      }
    }
  }
  if (topk > 0) {
    merge = malloc(sizeof *merge * (size_t)T * (size_t)topk);
    if (!merge) goto out;
  }
  int pshift = 0;
  while ((1ll << pshift) < b->page_size) pshift++;
  c.pool = cpu->pool;
  c.P = b->page_size;
  c.pshift = pshift;
  c.sq = sq;
  c.H = H;
  c.Hp = Hp;
  c.ngroups = ngroups;
  c.R = R;
  c.qf = qf;
  c.wf = wf;
  c.gi = gi;
  c.ntiles = (sq->width + FP4IDX__TK - 1) / FP4IDX__TK;
  atomic_init(&c.next, 0);
  c.logits = topk > 0 ? NULL : bt->logits + logit_off;
  c.topk = topk;
  c.scr = scr;
  if (c.ntiles > 0) fp4idx__threads_run(cpu->threads, fp4idx__worker, &c);

  if (topk > 0) {
    for (int r = 0; r < R; r++) {
      int64_t m = 0;
      for (int t = 0; t < T; t++)
        for (int64_t i = 0; i < scr[t].heaps[r].n; i++) {
          merge[m].v = scr[t].heaps[r].val[i];
          merge[m].p = scr[t].heaps[r].pos[i];
          m++;
        }
      qsort(merge, (size_t)m, sizeof *merge, fp4idx__cmp_pair);
      int64_t keep = m < topk ? m : topk;
      int32_t *pos = bt->topk_pos + (row0 + r) * topk;
      float *val = bt->topk_val + (row0 + r) * topk;
      for (int64_t i = 0; i < topk; i++) {
        pos[i] = i < keep ? merge[i].p : -1;
        val[i] = i < keep ? merge[i].v : -INFINITY;
      }
      bt->topk_count[row0 + r] = (int32_t)keep;
    }
  }
  rc = FP4IDX_OK;
out:
  if (scr)
    for (int t = 0; t < T; t++) {
      free(scr[t].ktf);
      free(scr[t].ktd);
      free(scr[t].d32);
      free(scr[t].d64);
      free(scr[t].sums);
      if (scr[t].heaps) {
        for (int r = 0; r < R; r++) {
          free(scr[t].heaps[r].pos);
          free(scr[t].heaps[r].val);
        }
        free(scr[t].heaps);
      }
    }
  free(scr);
  free(merge);
  free(gi);
  free(wf);
  free(qf);
  return rc;
}

int fp4idx__cpu_score(fp4idx_backend_t *b, const fp4idx_score_batch_t *bt) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fp4idx__init_lut);
  int64_t logit_off = 0, row0 = 0;
  for (int32_t s = 0; s < bt->n_seqs; s++) {
    const fp4idx_score_seq_t *sq = &bt->seqs[s];
    int rc = fp4idx__score_seq(b, bt, sq, logit_off, row0);
    if (rc != FP4IDX_OK) return rc;
    logit_off += (int64_t)sq->rows * sq->width;
    row0 += sq->rows;
  }
  return FP4IDX_OK;
}
