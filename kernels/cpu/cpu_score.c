/* cpu_score.c -- the CPU scorer, bit-exact to PROTOCOL.md's appendix ("Scorer").
 *
 * For a sequence with R verify rows and H heads, each key l and row r:
 *   k = bf16(decode(k_l));  d[h] = bf16(q[r,h] . k);
 *   p[h] = bf16(max(d[h], 0) * w[r,h]);  logit = f32(bf16(sum_h p[h])).
 *
 * Work split: keys are cut into tiles of FP4IDX__TK (32) keys; the threads of
 * a persistent pool take tiles from an atomic counter. A tile is decoded once
 * (element-major, so that one vector holds one element of 16 keys) and reused
 * by all R*H query vectors. Query vectors go in groups of FP4IDX__G (8)
 * heads; the kernel keeps a block of vector accumulators in registers. The
 * tile code (cpu_tile.c) is compiled for generic x86-64/other CPUs, AVX2 and
 * AVX-512 and picked at backend creation (FP4IDX_CPU_ISA may lower it).
 * Top-k: per thread and row a buffer of 2k candidates, compacted to the best
 * k by quickselect when full; at the end sorted per thread and merged.
 *
 * Performance (docs/RESULTS.md): the AVX-512 kernel does 16 FMAs per 10
 * loads and reaches about 75-80% of the fp32 FMA peak per core; the rest is
 * the decode and the rounding epilogue.
 *
 * Exactness. Two kernels compute the dot products:
 *  - f32, used when it is PROVABLY exact for a (group, tile) pair. Every term
 *    q_i * k_i and every partial sum is a multiple of 2^G with
 *    G = lo_q + s_min - 127 (lo_q: lowest set bit of any q element, minus one
 *    for the 0.5 step of E2M1; s_min: smallest scale byte in the tile) and is
 *    bounded by 6 * sum|q| * 2^(s_max - 127) < 2^(hi_q + s_max - 127).
 *    Numbers that are multiples of 2^G and at most 2^(G+24) in magnitude are
 *    f32 values when G >= -149, so if hi_q + s_max <= lo_q + s_min + 24 the
 *    f32 accumulation is exact in any order (FMA or not). (s_max <= 252
 *    also keeps the decoded keys finite in f32.) The same bounds
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
#include "cpu_score.h"

float fp4idx__f64_to_bf16f(double x) { return fp4idx__f64_to_bf16f_inl(x); }

static float fp4idx__e2m1_lut[16];

/* ---- instruction-set dispatch ---------------------------------------------- */

static const char *const fp4idx__isa_names[] = {"generic", "avx2", "avx512"};

int fp4idx__cpu_pick_isa(void) {
  int best = FP4IDX__ISA_GENERIC;
#if defined(FP4IDX_CPU_X86_DISPATCH)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    best = FP4IDX__ISA_AVX2;
  if (best == FP4IDX__ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    best = FP4IDX__ISA_AVX512;
#endif
  /* FP4IDX_CPU_ISA=generic|avx2|avx512 may lower (never raise) the choice:
   * the tests run every variant this machine can run. */
  const char *e = getenv("FP4IDX_CPU_ISA");
  if (e)
    for (int i = 0; i <= best; i++)
      if (!strcmp(e, fp4idx__isa_names[i])) return i;
  return best;
}

const char *fp4idx__cpu_isa_name(int isa) {
  return isa >= 0 && isa <= FP4IDX__ISA_AVX512 ? fp4idx__isa_names[isa] : "?";
}

static fp4idx__tile_fn fp4idx__tile_for(int isa) {
#if defined(FP4IDX_CPU_X86_DISPATCH)
  if (isa == FP4IDX__ISA_AVX512) return fp4idx__score_tile_avx512;
  if (isa == FP4IDX__ISA_AVX2) return fp4idx__score_tile_avx2;
#endif
  (void)isa;
  return fp4idx__score_tile_generic;
}

/* ---- top-k candidates ---------------------------------------------------- */

/* a is worse than b: lower logit, or the same logit at a higher position
 * (positions are unique, so this is a strict total order) */
FP4IDX__INLINE int fp4idx__worse(float va, int32_t pa, float vb, int32_t pb) {
  return va < vb || (va == vb && pa > pb);
}

/* Rearranges v/p[0..n) so that the best k come first (in any order):
 * Hoare's FIND / quickselect on the (logit, position) order. */
static void fp4idx__select_best(float *v, int32_t *p, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1, kk = k - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    float pv = v[mid];
    int32_t pp = p[mid];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (fp4idx__worse(pv, pp, v[i], p[i])) i++; /* v[i] better than pivot */
      while (fp4idx__worse(v[j], p[j], pv, pp)) j--; /* v[j] worse than pivot */
      if (i <= j) {
        float tv = v[i];
        int32_t tp = p[i];
        v[i] = v[j], p[i] = p[j];
        v[j] = tv, p[j] = tp;
        i++, j--;
      }
    }
    if (kk <= j) hi = j;
    else if (kk >= i) lo = i;
    else break;
  }
}

void fp4idx__topk_add(fp4idx__heap_t *h, int64_t k, float v, int32_t p) {
  h->val[h->n] = v;
  h->pos[h->n] = p;
  if (++h->n < 2 * k) return;
  fp4idx__select_best(h->val, h->pos, h->n, k);
  h->n = k;
  int64_t w = 0;
  for (int64_t i = 1; i < k; i++)
    if (fp4idx__worse(h->val[i], h->pos[i], h->val[w], h->pos[w])) w = i;
  h->have_thr = 1;
  h->thr_v = h->val[w];
  h->thr_p = h->pos[w];
}

static void fp4idx__score_tiles_worker(void *arg, int tid) {
  fp4idx__ctx_t *c = arg;
  fp4idx__scratch_t *s = &c->scr[tid];
  for (;;) {
    long long t = atomic_fetch_add(&c->next, FP4IDX__CHUNK);
    if (t >= c->ntiles) break;
    long long end = t + FP4IDX__CHUNK < c->ntiles ? t + FP4IDX__CHUNK : c->ntiles;
    for (; t < end; t++) c->tile(c, s, t * FP4IDX__TK);
  }
}

/* Sift-down of a heap whose root is its worst pair. */
static void fp4idx__sift(float *val, int32_t *pos, int64_t i, int64_t m) {
  float v = val[i];
  int32_t p = pos[i];
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= m) break;
    if (c + 1 < m && fp4idx__worse(val[c + 1], pos[c + 1], val[c], pos[c])) c++;
    if (!fp4idx__worse(val[c], pos[c], v, p)) break;
    val[i] = val[c];
    pos[i] = pos[c];
    i = c;
  }
  val[i] = v;
  pos[i] = p;
}

/* Keeps the best k candidates and sorts them best first (heapsort: the
 * worst goes to the end first). */
static void fp4idx__topk_finish(fp4idx__heap_t *h, int64_t k) {
  if (h->n > k) {
    fp4idx__select_best(h->val, h->pos, h->n, k);
    h->n = k;
  }
  for (int64_t i = h->n / 2 - 1; i >= 0; i--) fp4idx__sift(h->val, h->pos, i, h->n);
  for (int64_t n = h->n; n > 1; n--) {
    float tv = h->val[0];
    int32_t tp = h->pos[0];
    h->val[0] = h->val[n - 1], h->pos[0] = h->pos[n - 1];
    h->val[n - 1] = tv, h->pos[n - 1] = tp;
    fp4idx__sift(h->val, h->pos, 0, n - 1);
  }
}

static void fp4idx__sort_worker(void *arg, int tid) {
  fp4idx__ctx_t *c = arg;
  for (int r = 0; r < c->R; r++) fp4idx__topk_finish(&c->scr[tid].heaps[r], c->topk);
}

/* ---- setup -------------------------------------------------------------- */

/* Lowest set bit exponent of a nonzero finite bf16 value. */
static int fp4idx__bf16_grid(uint16_t h) {
  uint32_t E = (h >> 7) & 0xffu, M = h & 0x7fu;
  uint32_t sig = E ? (0x80u | M) : M;
  int e = E ? (int)E - 134 : -133;
  return e + __builtin_ctz(sig);
}

static void fp4idx__group_info(const fp4idx_backend_seq_t *sq, int H, int r, int g,
                               fp4idx__grp_t *gi) {
  memset(gi, 0, sizeof *gi);
  int zero = 1, hi = -100000, lo = 100000, wlo = 100000;
  for (int hh = g * FP4IDX__G; hh < (g + 1) * FP4IDX__G && hh < H; hh++) {
    const int64_t q0 = ((int64_t)r * H + hh) * FP4IDX__D;
    uint16_t w = fp4idx_bf16_at(sq->w, (int64_t)r * H + hh);
    if (((w >> 7) & 0xffu) == 0xffu) gi->f64_only = 1;
    if (w & 0x7fffu) {
      zero = 0;
      int E = (w >> 7) & 0xff;
      int we = E ? E - 127 : -133 + (31 - __builtin_clz(w & 0x7fu));
      wlo = we < wlo ? we : wlo;
    }
    double s1 = 0;
    for (int i = 0; i < FP4IDX__D; i++) {
      uint16_t h = fp4idx_bf16_at(sq->q, q0 + i);
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

static void fp4idx__init_lut(void) {
  for (uint32_t code = 0; code < 16; code++)
    fp4idx__e2m1_lut[code] = fp4idx_e2m1_to_f32(code);
}

/* Scores one sequence; rows' outputs start at logits/topk row `row0`. */
static int fp4idx__score_seq(fp4idx_backend_t *b, const fp4idx_backend_batch_t *bt,
                             const fp4idx_backend_seq_t *sq, int64_t logit_off,
                             int64_t row0) {
  fp4idx__cpu_t *cpu = b->impl;
  int T = fp4idx__threads_count(cpu->threads);
  int H = bt->heads, R = sq->rows;
  int ngroups = (H + FP4IDX__G - 1) / FP4IDX__G, Hp = ngroups * FP4IDX__G;
  int64_t topk = bt->topk;
  int rc = FP4IDX_ENOMEM;
  fp4idx__ctx_t c;
  memset(&c, 0, sizeof c);
  float *qf = calloc((size_t)R * Hp * FP4IDX__D, sizeof *qf);
  float *wf = calloc((size_t)R * Hp, sizeof *wf);
  fp4idx__grp_t *gi = calloc((size_t)R * ngroups, sizeof *gi);
  fp4idx__scratch_t *scr = calloc((size_t)T, sizeof *scr);
  if (!qf || !wf || !gi || !scr) goto out;
  for (int r = 0; r < R; r++)
    for (int h = 0; h < H; h++) {
      for (int i = 0; i < FP4IDX__D; i++)
        qf[((int64_t)r * Hp + h) * FP4IDX__D + i] =
            fp4idx_bf16_to_f32(fp4idx_bf16_at(sq->q, ((int64_t)r * H + h) * FP4IDX__D + i));
      wf[(int64_t)r * Hp + h] = fp4idx_bf16_to_f32(fp4idx_bf16_at(sq->w, (int64_t)r * H + h));
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
        s->heaps[r].pos = malloc(sizeof(int32_t) * 2 * (size_t)topk);
        s->heaps[r].val = malloc(sizeof(float) * 2 * (size_t)topk);
        if (!s->heaps[r].pos || !s->heaps[r].val) goto out;
      }
    }
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
  c.lut = fp4idx__e2m1_lut;
  c.tile = fp4idx__tile_for(cpu->isa);
  /* A call of one or two tiles runs on the calling thread: waking the pool
   * would cost more than the work. */
  int inline_only = c.ntiles <= 2;
  if (inline_only) {
    if (c.ntiles > 0) fp4idx__score_tiles_worker(&c, 0);
  } else {
    fp4idx__threads_run(cpu->threads, fp4idx__score_tiles_worker, &c);
  }

  if (topk > 0) {
    /* Each thread sorts its own heaps (in parallel), then the T sorted
     * lists of a row are merged: O(T * k) here instead of a full sort. */
    if (inline_only) fp4idx__sort_worker(&c, 0); /* the other heaps are empty */
    else fp4idx__threads_run(cpu->threads, fp4idx__sort_worker, &c);
    for (int r = 0; r < R; r++) {
      int64_t at[256] = {0}; /* read position in each thread's list */
      int32_t *pos = bt->topk_pos + (row0 + r) * topk;
      float *val = bt->topk_val + (row0 + r) * topk;
      int64_t keep = 0;
      for (; keep < topk; keep++) {
        int best = -1;
        for (int t = 0; t < T; t++) {
          const fp4idx__heap_t *h = &scr[t].heaps[r];
          if (at[t] >= h->n) continue;
          if (best < 0 || fp4idx__worse(scr[best].heaps[r].val[at[best]],
                                        scr[best].heaps[r].pos[at[best]], h->val[at[t]],
                                        h->pos[at[t]]))
            best = t;
        }
        if (best < 0) break;
        pos[keep] = scr[best].heaps[r].pos[at[best]];
        val[keep] = scr[best].heaps[r].val[at[best]];
        at[best]++;
      }
      for (int64_t i = keep; i < topk; i++) {
        pos[i] = -1;
        val[i] = -INFINITY;
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
  free(gi);
  free(wf);
  free(qf);
  return rc;
}

int fp4idx__cpu_score(fp4idx_backend_t *b, const fp4idx_backend_batch_t *bt) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fp4idx__init_lut);
  int64_t logit_off = 0, row0 = 0;
  for (int32_t s = 0; s < bt->n_seqs; s++) {
    const fp4idx_backend_seq_t *sq = &bt->seqs[s];
    int rc = fp4idx__score_seq(b, bt, sq, logit_off, row0);
    if (rc != FP4IDX_OK) return rc;
    logit_off += (int64_t)sq->rows * sq->width;
    row0 += sq->rows;
  }
  return FP4IDX_OK;
}
