/* cpu_tile.c -- the CPU scorer's per-tile work: decode a tile of keys,
 * run the dot-product kernels, apply the prescribed roundings, emit logits
 * or top-k candidates. See cpu_score.c for the exactness argument.
 *
 * This file is compiled once per instruction set (cpu_tile_avx2.c and
 * cpu_tile_avx512.c include it with FP4IDX__TILE_NAME set and their own
 * -m flags); cpu_score.c picks one at backend creation. The code uses GCC
 * vector extensions (64-byte vectors), which each compile lowers to the
 * widest registers it has. */
#include "cpu_score.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#ifndef FP4IDX__TILE_NAME
#define FP4IDX__TILE_NAME fp4idx__score_tile_generic
#endif

/* ---- native vector width of this compile ------------------------------- */

#if defined(__AVX512F__)
#define FP4IDX__VL 16 /* f32 lanes */
#define FP4IDX__GS 8  /* query vectors per kernel pass */
#define FP4IDX__GSD 4 /* query vectors per f64 kernel pass */
#elif defined(__AVX__)
#define FP4IDX__VL 8
#define FP4IDX__GS 4
#define FP4IDX__GSD 2
#else
#define FP4IDX__VL 4
#define FP4IDX__GS 4
#define FP4IDX__GSD 2
#endif
#define FP4IDX__VLD (FP4IDX__VL / 2) /* f64 lanes */
#define FP4IDX__KV 2                 /* key vectors per f32 pass */
#define FP4IDX__KVD 4                /* key vectors per f64 pass */
typedef float fp4idx__vf __attribute__((vector_size(4 * FP4IDX__VL)));
typedef uint32_t fp4idx__vu __attribute__((vector_size(4 * FP4IDX__VL)));
typedef int32_t fp4idx__vi __attribute__((vector_size(4 * FP4IDX__VL)));
typedef double fp4idx__vd __attribute__((vector_size(4 * FP4IDX__VL)));
typedef uint64_t fp4idx__vu64 __attribute__((vector_size(4 * FP4IDX__VL)));
typedef int64_t fp4idx__vi64 __attribute__((vector_size(4 * FP4IDX__VL)));

/* RNE double -> bf16 on VLD lanes, kept as double, in place (drops 45 of the
 * 52 mantissa bits). Lanes this cannot round (|x| < 2^-126: bf16
 * subnormals; |x| >= 2^127: possible overflow, inf, NaN) are flagged in
 * `bad` for the scalar path. */
#define FP4IDX__ROUND_BF16_D(x, bad)                                           \
  do {                                                                         \
    fp4idx__vu64 u_ = (fp4idx__vu64)(x);                                       \
    fp4idx__vu64 a_ = u_ & 0x7fffffffffffffffull;                              \
    (bad) |= (fp4idx__vu64)(((a_ != 0) & (a_ < 0x3810000000000000ull)) |       \
                            (a_ >= 0x47e0000000000000ull));                    \
    u_ = (u_ + ((1ull << 44) - 1) + ((u_ >> 45) & 1)) & ~((1ull << 45) - 1);   \
    (x) = (fp4idx__vd)u_;                                                      \
  } while (0)

/* ---- kernels ------------------------------------------------------------ */

/* d[g][j] = q[g] . k_j in f32 for G vectors and TK keys: passes of GS query
 * vectors x KV*VL keys, whose GS*KV accumulators stay in registers. */
FP4IDX__INLINE void fp4idx__kern_f32(const float *restrict q,
                                     const float *restrict kt,
                                     float *restrict d) {
  for (int gs = 0; gs < FP4IDX__G; gs += FP4IDX__GS)
    for (int k0 = 0; k0 < FP4IDX__TK; k0 += FP4IDX__KV * FP4IDX__VL) {
      fp4idx__vf acc[FP4IDX__GS][FP4IDX__KV];
      for (int g = 0; g < FP4IDX__GS; g++)
        for (int v = 0; v < FP4IDX__KV; v++) acc[g][v] = (fp4idx__vf){0};
      for (int i = 0; i < FP4IDX__D; i++) {
        fp4idx__vf kv[FP4IDX__KV];
        for (int v = 0; v < FP4IDX__KV; v++)
          kv[v] = *(const fp4idx__vf *)(kt + i * FP4IDX__TK + k0 + v * FP4IDX__VL);
        for (int g = 0; g < FP4IDX__GS; g++) {
          float s = q[(gs + g) * FP4IDX__D + i];
          for (int v = 0; v < FP4IDX__KV; v++) acc[g][v] += s * kv[v];
        }
      }
      for (int g = 0; g < FP4IDX__GS; g++)
        for (int v = 0; v < FP4IDX__KV; v++)
          *(fp4idx__vf *)(d + (gs + g) * FP4IDX__TK + k0 + v * FP4IDX__VL) = acc[g][v];
    }
}

/* The same in f64 (kt in double), passes of GSD vectors x KVD*VLD keys. */
FP4IDX__INLINE void fp4idx__kern_f64(const float *restrict q,
                                     const double *restrict kt,
                                     double *restrict d) {
  for (int gs = 0; gs < FP4IDX__G; gs += FP4IDX__GSD)
    for (int k0 = 0; k0 < FP4IDX__TK; k0 += FP4IDX__KVD * FP4IDX__VLD) {
      fp4idx__vd acc[FP4IDX__GSD][FP4IDX__KVD];
      for (int g = 0; g < FP4IDX__GSD; g++)
        for (int v = 0; v < FP4IDX__KVD; v++) acc[g][v] = (fp4idx__vd){0};
      for (int i = 0; i < FP4IDX__D; i++) {
        fp4idx__vd kv[FP4IDX__KVD];
        for (int v = 0; v < FP4IDX__KVD; v++)
          kv[v] = *(const fp4idx__vd *)(kt + i * FP4IDX__TK + k0 + v * FP4IDX__VLD);
        for (int g = 0; g < FP4IDX__GSD; g++) {
          double s = q[(gs + g) * FP4IDX__D + i];
          for (int v = 0; v < FP4IDX__KVD; v++) acc[g][v] += s * kv[v];
        }
      }
      for (int g = 0; g < FP4IDX__GSD; g++)
        for (int v = 0; v < FP4IDX__KVD; v++)
          *(fp4idx__vd *)(d + (gs + g) * FP4IDX__TK + k0 + v * FP4IDX__VLD) = acc[g][v];
    }
}

/* RNE f32 -> bf16 on VL lanes (finite inputs), kept as f32, in place.
 * (A macro: a function taking or returning a wide vector by value would
 * have a target-dependent ABI.) */
#define FP4IDX__ROUND_BF16_V(x)                                     \
  do {                                                              \
    fp4idx__vu u_ = (fp4idx__vu)(x);                                \
    u_ = (u_ + 0x7fffu + ((u_ >> 16) & 1u)) & 0xffff0000u;          \
    (x) = (fp4idx__vf)u_;                                           \
  } while (0)

#if defined(__AVX512F__)
/* 16x16 f32 transpose of rows[0..15] in registers: four stages that swap
 * the off-diagonal d x d blocks of every 2d x 2d block (d = 8, 4, 2, 1). */
#define FP4IDX__TSTAGE(d, m1, m2)                                  \
  for (int r_ = 0; r_ < 16; r_++)                                  \
    if (!(r_ & (d))) {                                             \
      fp4idx__v16f a_ = rows[r_], b_ = rows[r_ + (d)];             \
      rows[r_] = __builtin_shuffle(a_, b_, m1);                    \
      rows[r_ + (d)] = __builtin_shuffle(a_, b_, m2);              \
    }

/* Decodes keys t0 .. t0+nd-1 of the sequence into kt [128][TK] (element-
 * major, lanes = keys; columns nd.. are zero) and returns the smallest and
 * largest scale byte seen. Per key and 16 elements: one 16-byte load
 * widened to 16 lanes, a permute that duplicates each byte for its two
 * nibbles, a variable shift, the E2M1 lookup as a 16-lane permute of the
 * table (built from fp4idx_format.h's decoder), and a multiply by the
 * block's UE8M0 scale (exact: a power of two). 16 keys x 16 elements are
 * then transposed in registers. */
FP4IDX__INLINE void fp4idx__decode_tile(const fp4idx__ctx_t *c, int64_t t0, int nd,
                                        float *restrict kt, uint32_t *psmin,
                                        uint32_t *psmax) {
  const fp4idx_backend_seq_t *sq = c->sq;
  const uint8_t *pay[FP4IDX__TK];
  float scl[FP4IDX__TK][4];
  uint32_t smin = 255, smax = 0;
  for (int j = 0; j < nd; j++) {
    int64_t l = t0 + j;
    /* The page layout of fp4idx_format.h without a division: page base, then the
     * payload of slot o at o*64 and its scales at P*64 + o*4 */
    const uint8_t *page = c->pool + (int64_t)sq->pages[l >> c->pshift] * c->P * FP4IDX_SLOT_BYTES;
    int64_t o = l & (c->P - 1);
    pay[j] = page + o * FP4IDX_PAYLOAD_BYTES;
    const uint8_t *sc = page + c->P * FP4IDX_PAYLOAD_BYTES + o * FP4IDX_SCALE_BYTES;
    for (int blk = 0; blk < 4; blk++) {
      uint32_t sb = sc[blk];
      smin = sb < smin ? sb : smin;
      smax = sb > smax ? sb : smax;
      scl[j][blk] = fp4idx_ue8m0_to_f32(sb);
    }
  }
  *psmin = smin;
  *psmax = smax;
  fp4idx__v16f lut;
  memcpy(&lut, c->lut, sizeof lut);
  const fp4idx__v16i dup_a = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
  const fp4idx__v16i dup_b = {8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15};
  const fp4idx__v16i nib = {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4};
  const fp4idx__v16i m8a = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const fp4idx__v16i m8b = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const fp4idx__v16i m4a = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
  const fp4idx__v16i m4b = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
  const fp4idx__v16i m2a = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
  const fp4idx__v16i m2b = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
  const fp4idx__v16i m1a = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
  const fp4idx__v16i m1b = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
  for (int kb = 0; kb < FP4IDX__TK / 16; kb++) {
    int j0 = kb * 16;
    if (j0 >= nd) {
      for (int e = 0; e < FP4IDX__D; e++)
        *(fp4idx__v16f *)(kt + e * FP4IDX__TK + j0) = (fp4idx__v16f){0};
      continue;
    }
    for (int eb = 0; eb < FP4IDX__D / 16; eb++) {
      int m = eb >> 1;
      fp4idx__v16i dup = (eb & 1) ? dup_b : dup_a;
      fp4idx__v16f rows[16];
      for (int t = 0; t < 16; t++) {
        int j = j0 + t;
        if (j < nd) {
          /* vpmovzxbd, vpermd, vpsrlvd, vpand, vpermps, vmulps (GCC lowers
           * the vector-extension widening to scalar code, hence intrinsics) */
          __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(pay[j] + 16 * m)));
          x = _mm512_permutexvar_epi32((__m512i)dup, x);
          x = _mm512_and_si512(_mm512_srlv_epi32(x, (__m512i)nib), _mm512_set1_epi32(15));
          rows[t] = (fp4idx__v16f)_mm512_mul_ps(_mm512_permutexvar_ps(x, (__m512)lut),
                                                _mm512_set1_ps(scl[j][m]));
        } else {
          rows[t] = (fp4idx__v16f){0};
        }
      }
      FP4IDX__TSTAGE(8, m8a, m8b)
      FP4IDX__TSTAGE(4, m4a, m4b)
      FP4IDX__TSTAGE(2, m2a, m2b)
      FP4IDX__TSTAGE(1, m1a, m1b)
      for (int t = 0; t < 16; t++)
        *(fp4idx__v16f *)(kt + (eb * 16 + t) * FP4IDX__TK + j0) = rows[t];
    }
  }
}

#else
/* Decodes keys t0 .. t0+nd-1 of the sequence into kt [128][TK] (element-
 * major, lanes = keys; columns nd.. are zero) and returns the smallest and
 * largest scale byte seen. Portable version: a table lookup and a multiply
 * by the block's UE8M0 scale (exact: a power of two) per element. */
FP4IDX__INLINE void fp4idx__decode_tile(const fp4idx__ctx_t *c, int64_t t0, int nd,
                                        float *restrict kt, uint32_t *psmin,
                                        uint32_t *psmax) {
  const fp4idx_backend_seq_t *sq = c->sq;
  uint32_t smin = 255, smax = 0;
  for (int j = 0; j < nd; j++) {
    int64_t l = t0 + j;
    const uint8_t *page = c->pool + (int64_t)sq->pages[l >> c->pshift] * c->P * FP4IDX_SLOT_BYTES;
    int64_t o = l & (c->P - 1);
    const uint8_t *pay = page + o * FP4IDX_PAYLOAD_BYTES;
    const uint8_t *sc = page + c->P * FP4IDX_PAYLOAD_BYTES + o * FP4IDX_SCALE_BYTES;
    for (int blk = 0; blk < 4; blk++) {
      uint32_t sb = sc[blk];
      smin = sb < smin ? sb : smin;
      smax = sb > smax ? sb : smax;
      float scale = fp4idx_ue8m0_to_f32(sb);
      for (int e = blk * FP4IDX_BLOCK; e < (blk + 1) * FP4IDX_BLOCK; e += 2) {
        uint32_t byte = pay[e >> 1];
        kt[e * FP4IDX__TK + j] = c->lut[byte & 15u] * scale;
        kt[(e + 1) * FP4IDX__TK + j] = c->lut[byte >> 4] * scale;
      }
    }
  }
  for (int j = nd; j < FP4IDX__TK; j++)
    for (int e = 0; e < FP4IDX__D; e++) kt[e * FP4IDX__TK + j] = 0.0f;
  *psmin = smin;
  *psmax = smax;
}

#endif

/* ---- one tile ----------------------------------------------------------- */

void FP4IDX__TILE_NAME(fp4idx__ctx_t *c, fp4idx__scratch_t *s,
                               int64_t t0) {
  const fp4idx_backend_seq_t *sq = c->sq;
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
  fp4idx__decode_tile(c, t0, nd, kt, &smin, &smax);
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
          for (int cc = 0; cc < FP4IDX__TK; cc += FP4IDX__VL) {
            fp4idx__vf dv = *(fp4idx__vf *)(s->d32 + h * FP4IDX__TK + cc);
            FP4IDX__ROUND_BF16_V(dv);
            fp4idx__vi pos = dv > 0.0f;
            dv = (fp4idx__vf)((fp4idx__vu)dv & (fp4idx__vu)pos); /* max(d, 0) */
            fp4idx__vf p = dv * wv;                              /* exact */
            FP4IDX__ROUND_BF16_V(p);
            float pf[FP4IDX__VL];
            memcpy(pf, &p, sizeof pf);
            for (int l = 0; l < FP4IDX__VL; l++) sums[cc + l] += pf[l];
          }
        }
      } else {
        if (!have_ktd) {
          for (int e = 0; e < FP4IDX__D * FP4IDX__TK; e++) s->ktd[e] = kt[e];
          have_ktd = 1;
        }
        fp4idx__kern_f64(q, s->ktd, s->d64);
        for (int h = 0; h < ng; h++) {
          double wv = w[h];
          for (int cc = 0; cc < nd; cc += FP4IDX__VLD) {
            const double *dp = s->d64 + h * FP4IDX__TK + cc;
            fp4idx__vd dv = *(const fp4idx__vd *)dp;
            fp4idx__vu64 bad = {0};
            FP4IDX__ROUND_BF16_D(dv, bad);
            fp4idx__vi64 pos = dv > 0.0;
            dv = (fp4idx__vd)((fp4idx__vu64)dv & (fp4idx__vu64)pos); /* max(d, 0) */
            fp4idx__vd p = dv * wv;                                  /* exact */
            FP4IDX__ROUND_BF16_D(p, bad);
            uint64_t flagged = 0;
            for (int l = 0; l < FP4IDX__VLD; l++) flagged |= bad[l];
            if (!flagged) {
              *(fp4idx__vd *)(sums + cc) += p;
              continue;
            }
            /* a lane near the bf16 subnormal range, >= 2^127, inf or NaN:
             * the scalar roundings handle every case */
            for (int l = 0; l < FP4IDX__VLD && cc + l < nd; l++) {
              double db = fp4idx__f64_to_bf16f_inl(dp[l]);
              double dm = (db > 0.0 || db != db) ? db : 0.0;
              sums[cc + l] += fp4idx__f64_to_bf16f_inl(dm * wv);
            }
          }
        }
      }
    }
    /* logits of the row for this tile */
    const uint8_t *mask = sq->mask ? sq->mask + (int64_t)r * sq->width + t0 : NULL;
    int64_t vis = sq->lens[r] - t0; /* positions j < vis are visible */
    for (int j = 0; j < nk; j++) {
      float lg = -INFINITY;
      if (j < vis && (!mask || mask[j])) lg = fp4idx__f64_to_bf16f_inl(sums[j]);
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
