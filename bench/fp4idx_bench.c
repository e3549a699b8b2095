/* fp4idx_bench.c -- benchmark of the scorer (backend->ops->score) on the
 * cases of docs/RESULTS.md's method: exact dyadic inputs (values k/8), R verify rows of
 * one sequence seeing the context minus 0..R-1 keys, keys on shuffled
 * 64-key pages. Prints per case the median time per call, keys/s, achieved
 * GFLOP/s (2*R*H*128 FLOP per key) and, for the CPU backend, the ratio to
 * this machine's fp32 FMA peak.
 *
 *   fp4idx-bench [--backend cpu|cuda] [--threads N] [--device I]
 *                [--case NAME]... [--all] [--reps N] [--warmup N]
 *                [--calls N] [--topk K] [--check] [--inputs dyadic|gauss]
 *                [--ghz X] [--fma-units N]
 *
 * --inputs gauss: Gaussian bf16 keys, queries and weights (realistic data;
 * the CPU scorer then mostly needs its float64 kernel) instead of dyadic.
 *
 * --check scores every case once more on a fresh CPU backend (the oracle)
 * and compares all logits bit for bit (for --backend cuda this validates the
 * GPU against the CPU; for cpu it checks threads vs one thread).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fp4idx_bench.h"
#include "fp4idx_format.h"

static const fp4idx_bench_case_t fp4idx__cases[] = {
    {"h32_ctx16384", 1, 4, 32, 16384, 1},
    {"h32_ctx100000", 1, 4, 32, 100000, 1},
    {"h32_ctx400000", 1, 4, 32, 400000, 0},
    {"h64_ctx100000", 1, 4, 64, 100000, 0},
    {"s32_h32_ctx32768", 32, 4, 32, 32768, 0},
};
enum { FP4IDX__NCASES = sizeof fp4idx__cases / sizeof fp4idx__cases[0], PAGE = 64 };

typedef struct {
  const char *backend;
  int threads, device, reps, warmup, calls, topk, check, all;
  int gauss; /* --inputs gauss: Gaussian bf16 inputs instead of dyadic */
  double ghz;
  int fma_units;
  const char *only[16];
  int n_only;
} fp4idx__opts_t;

static uint64_t fp4idx__rng = 0x1234567887654321ull;
static uint64_t fp4idx__next(void) {
  uint64_t z = (fp4idx__rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* standard normal (Box-Muller) */
static double fp4idx__normal(void) {
  double u1 = ((fp4idx__next() >> 11) + 1) * 0x1p-53, u2 = (fp4idx__next() >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static int fp4idx__gauss_inputs;
/* an input value as bf16 bits: k/8 (|k| <= lim), or N(0, 1) * lim / 16 */
static uint16_t fp4idx__value(int lim) {
  if (fp4idx__gauss_inputs) return fp4idx_f32_to_bf16((float)(fp4idx__normal() * lim / 16.0));
  int k = (int)(fp4idx__next() % (uint64_t)(2 * lim + 1)) - lim;
  return fp4idx_f32_to_bf16((float)k / 8.0f);
}

static double fp4idx__now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* CPU time of the whole process (all threads): on a shared machine the
 * wall clock includes time the scheduler gave to others, this does not. */
static double fp4idx__cpu_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int fp4idx__cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* ---- machine peak --------------------------------------------------------- */

typedef struct {
  char model[128];
  int cpus;
  double ghz;
  int lanes;      /* fp32 lanes of the widest FMA */
  int fma_units;  /* FMA pipes per core (assumed) */
  const char *isa;
} fp4idx__machine_t;

static void fp4idx__machine(fp4idx__machine_t *m, const fp4idx__opts_t *o) {
  memset(m, 0, sizeof *m);
  snprintf(m->model, sizeof m->model, "unknown");
  m->cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
  int avx512 = 0, avx2 = 0, fma = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[8192];
    while (fgets(line, sizeof line, f)) {
      char *p = strchr(line, ':');
      if (!p) continue;
      p++;
      while (*p == ' ') p++;
      p[strcspn(p, "\n")] = 0;
      if (!strncmp(line, "model name", 10) && !strcmp(m->model, "unknown"))
        snprintf(m->model, sizeof m->model, "%s", p);
      else if (!strncmp(line, "cpu MHz", 7) && m->ghz == 0)
        m->ghz = atof(p) / 1000.0;
      else if (!strncmp(line, "flags", 5) && !avx2 && !fma) {
        avx512 = strstr(p, " avx512f") != NULL;
        avx2 = strstr(p, " avx2") != NULL;
        fma = strstr(p, " fma") != NULL;
      }
    }
    fclose(f);
  }
  if (avx512) {
    m->lanes = 16, m->isa = "AVX-512 FMA", m->fma_units = 2;
  } else if (avx2 && fma) {
    m->lanes = 8, m->isa = "AVX2 FMA", m->fma_units = 2;
  } else {
    m->lanes = 4, m->isa = "SSE (no FMA: mul+add)", m->fma_units = 1;
  }
  if (o->ghz > 0) m->ghz = o->ghz;
  if (o->fma_units > 0) m->fma_units = o->fma_units;
}

static double fp4idx__peak_gflops(const fp4idx__machine_t *m, int threads) {
  int cores = threads > 0 && threads < m->cpus ? threads : m->cpus;
  return cores * m->ghz * m->lanes * m->fma_units * 2.0;
}

/* ---- one case ---------------------------------------------------------------- */

typedef struct {
  int64_t n_pages;
  uint8_t *packed;   /* [seqs*context, 68] in pool order of positions */
  int64_t *slots;    /* [seqs*context] */
  int32_t *pages;    /* [seqs][pages_per_seq] */
  uint16_t *q, *w;   /* [seqs][R,H,128], [seqs][R,H] */
  int32_t *lens;     /* [seqs][R] */
  fp4idx_backend_seq_t *sq;
  float *logits;
  int32_t *tpos, *tcnt;
  float *tval;
} fp4idx__data_t;

static void fp4idx__data_free(fp4idx__data_t *d) {
  free(d->packed), free(d->slots), free(d->pages), free(d->q), free(d->w);
  free(d->lens), free(d->sq), free(d->logits), free(d->tpos), free(d->tcnt), free(d->tval);
  memset(d, 0, sizeof *d);
}

static int fp4idx__data_make(fp4idx__data_t *d, const fp4idx_bench_case_t *c, int topk) {
  memset(d, 0, sizeof *d);
  int64_t pps = (c->context + PAGE - 1) / PAGE, nkeys = c->context * c->seqs;
  d->n_pages = pps * c->seqs;
  int64_t rh = (int64_t)c->rows * c->heads;
  d->packed = malloc((size_t)nkeys * 68);
  d->slots = malloc(sizeof *d->slots * (size_t)nkeys);
  d->pages = malloc(sizeof *d->pages * (size_t)d->n_pages);
  d->q = malloc(2 * (size_t)(rh * 128 * c->seqs));
  d->w = malloc(2 * (size_t)(rh * c->seqs));
  d->lens = malloc(4 * (size_t)(c->rows * c->seqs));
  d->sq = calloc((size_t)c->seqs, sizeof *d->sq);
  if (topk > 0) {
    d->tpos = malloc(4 * (size_t)c->rows * c->seqs * (size_t)topk);
    d->tval = malloc(4 * (size_t)c->rows * c->seqs * (size_t)topk);
    d->tcnt = malloc(4 * (size_t)c->rows * c->seqs);
  } else {
    d->logits = malloc(4 * (size_t)(c->rows * nkeys));
  }
  if (!d->packed || !d->slots || !d->pages || !d->q || !d->w || !d->lens || !d->sq ||
      (topk > 0 ? !d->tpos || !d->tval || !d->tcnt : !d->logits))
    return FP4IDX_ENOMEM;
  /* all pages of the pool shuffled, then dealt to the sequences */
  for (int64_t i = 0; i < d->n_pages; i++) d->pages[i] = (int32_t)i;
  for (int64_t i = d->n_pages - 1; i > 0; i--) {
    int64_t j = (int64_t)(fp4idx__next() % (uint64_t)(i + 1));
    int32_t t = d->pages[i];
    d->pages[i] = d->pages[j];
    d->pages[j] = t;
  }
  uint16_t key[128];
  for (int s = 0; s < c->seqs; s++) {
    const int32_t *pg = d->pages + s * pps;
    for (int64_t l = 0; l < c->context; l++) {
      int64_t i = s * c->context + l;
      for (int e = 0; e < 128; e++) key[e] = fp4idx__value(48);
      fp4idx_quantize_key(key, FP4IDX_DTYPE_BF16, FP4IDX_ROUND_RNE, d->packed + i * 68,
                          d->packed + i * 68 + 64);
      d->slots[i] = (int64_t)pg[l / PAGE] * PAGE + l % PAGE;
    }
    for (int64_t i = 0; i < rh * 128; i++) d->q[s * rh * 128 + i] = fp4idx__value(16);
    for (int64_t i = 0; i < rh; i++) d->w[s * rh + i] = fp4idx__value(16);
    for (int r = 0; r < c->rows; r++) {
      int64_t len = c->context - r;
      d->lens[s * c->rows + r] = (int32_t)(len > 0 ? len : 0);
    }
    d->sq[s] = (fp4idx_backend_seq_t){.pages = pg, .n_keys = c->context, .rows = c->rows,
                                    .width = c->context, .q = d->q + s * rh * 128,
                                    .w = d->w + s * rh, .lens = d->lens + s * c->rows};
  }
  return FP4IDX_OK;
}

static int fp4idx__make_backend(const fp4idx__opts_t *o, const char *name, int threads,
                                fp4idx_backend_t **b) {
  if (!strcmp(name, "cpu")) return fp4idx_backend_cpu_create(b, threads);
#ifdef FP4IDX_BENCH_CUDA
  if (!strcmp(name, "cuda")) return fp4idx_backend_cuda_create(b, o->device);
#else
  (void)o;
  if (!strcmp(name, "cuda")) return FP4IDX_ENODEV;
#endif
  return FP4IDX_EINVAL;
}

static int fp4idx__load(fp4idx_backend_t *b, const fp4idx__data_t *d, const fp4idx_bench_case_t *c) {
  int rc = b->ops->pool_create(b, d->n_pages, PAGE);
  if (rc) return rc;
  int64_t n = c->context * c->seqs, chunk = 65536;
  for (int64_t i = 0; i < n && rc == 0; i += chunk)
    rc = b->ops->store(b, d->packed + i * 68, FP4IDX_DTYPE_FP4, n - i < chunk ? n - i : chunk,
                       d->slots + i, FP4IDX_ROUND_RNE);
  return rc;
}

static int fp4idx__run_case(const fp4idx__opts_t *o, const fp4idx__machine_t *m,
                            const fp4idx_bench_case_t *c) {
  fp4idx__data_t d;
  fp4idx_backend_t *b = NULL, *oracle = NULL;
  double *us = NULL, *cus = NULL;
  int rc = fp4idx__data_make(&d, c, o->topk);
  if (rc) goto out;
  rc = fp4idx__make_backend(o, o->backend, o->threads, &b);
  if (rc) goto out;
  rc = fp4idx__load(b, &d, c);
  if (rc) goto out;
  fp4idx_backend_batch_t bt = {.heads = c->heads, .n_seqs = c->seqs, .seqs = d.sq,
                             .topk = o->topk, .logits = d.logits, .topk_pos = d.tpos,
                             .topk_val = d.tval, .topk_count = d.tcnt};
  us = calloc((size_t)o->reps, sizeof *us);
  cus = calloc((size_t)o->reps, sizeof *cus);
  if (!us || !cus) {
    rc = FP4IDX_ENOMEM;
    goto out;
  }
  int timed = 0;
#ifdef FP4IDX_BENCH_CUDA
  if (!strcmp(o->backend, "cuda")) {
    rc = fp4idx_bench_cuda_time(b, &bt, o->calls, o->warmup, o->reps, us);
    if (rc == 0) timed = 1;
    else if (rc != FP4IDX_ENODEV) goto out;
  }
#endif
  if (!timed) {
    for (int i = 0; i < o->warmup; i++)
      if ((rc = b->ops->score(b, &bt)) != 0) goto out;
    for (int r = 0; r < o->reps; r++) {
      double t0 = fp4idx__now_us(), c0 = fp4idx__cpu_us();
      for (int i = 0; i < o->calls; i++)
        if ((rc = b->ops->score(b, &bt)) != 0) goto out;
      us[r] = (fp4idx__now_us() - t0) / o->calls;
      cus[r] = (fp4idx__cpu_us() - c0) / o->calls;
    }
  }
  qsort(us, (size_t)o->reps, sizeof *us, fp4idx__cmp_d);
  double med = us[o->reps / 2];
  if (o->reps % 2 == 0) med = 0.5 * (us[o->reps / 2 - 1] + us[o->reps / 2]);
  double keys = (double)c->context * c->seqs;
  double gflops = 2.0 * c->rows * c->heads * 128 * keys / (med * 1e3);
  printf("%-5s %-18s S=%-2d R=%d H=%-3d ctx=%-7lld topk=%-4d median %10.1f us  (min %.1f, max %.1f)"
         "  %8.2f Mkeys/s  %7.1f GFLOP/s",
         o->backend, c->name, c->seqs, c->rows, c->heads, (long long)c->context, o->topk, med,
         us[0], us[o->reps - 1], keys / med, gflops);
  if (!strcmp(o->backend, "cpu")) {
    printf("  %5.1f%% of fp32 FMA peak", 100.0 * gflops / fp4idx__peak_gflops(m, o->threads));
    if (!timed) {
      /* per CPU-second: the efficiency of the code itself, robust to other
       * load on the machine (compare with ONE core's peak) */
      qsort(cus, (size_t)o->reps, sizeof *cus, fp4idx__cmp_d);
      double cmed = cus[o->reps / 2];
      double cg = 2.0 * c->rows * c->heads * 128 * keys / (cmed * 1e3);
      printf("\n      cpu time %10.1f us/call -> %7.1f GFLOP per CPU-s = %5.1f%% of one core's peak",
             cmed, cg, 100.0 * cg / fp4idx__peak_gflops(m, 1));
    }
  }
  printf("\n");
  fflush(stdout);

  if (o->check) {
    /* Score once more on a fresh single-thread CPU backend and compare. */
    rc = fp4idx_backend_cpu_create(&oracle, 1);
    if (!rc) rc = fp4idx__load(oracle, &d, c);
    if (rc) goto out;
    size_t n = o->topk > 0 ? (size_t)c->rows * c->seqs * (size_t)o->topk
                           : (size_t)c->rows * (size_t)(c->context * c->seqs);
    float *v2 = malloc(4 * n);
    int32_t *p2 = o->topk > 0 ? malloc(4 * n) : NULL;
    int32_t *c2 = o->topk > 0 ? malloc(4 * (size_t)c->rows * c->seqs) : NULL;
    if (!v2 || (o->topk > 0 && (!p2 || !c2))) {
      free(v2), free(p2), free(c2);
      rc = FP4IDX_ENOMEM;
      goto out;
    }
    fp4idx_backend_batch_t ob = bt;
    if (o->topk > 0) ob.topk_val = v2, ob.topk_pos = p2, ob.topk_count = c2;
    else ob.logits = v2;
    rc = oracle->ops->score(oracle, &ob);
    if (!rc) {
      const float *v1 = o->topk > 0 ? d.tval : d.logits;
      size_t bad = 0;
      for (size_t i = 0; i < n; i++) bad += memcmp(&v1[i], &v2[i], 4) != 0;
      if (o->topk > 0) bad += memcmp(d.tpos, p2, 4 * n) != 0;
      printf("      check vs CPU oracle: %zu of %zu outputs differ -> %s\n", bad, n,
             bad ? "MISMATCH" : "bit-exact");
      if (bad) rc = FP4IDX_EINTERNAL;
    }
    free(v2), free(p2), free(c2);
  }
out:
  if (rc) fprintf(stderr, "fp4idx-bench: case %s: %s\n", c->name, fp4idx_strerror(rc));
  free(us);
  free(cus);
  fp4idx_backend_destroy(b);
  fp4idx_backend_destroy(oracle);
  fp4idx__data_free(&d);
  return rc;
}

static void fp4idx__usage(FILE *f) {
  fprintf(f,
          "usage: fp4idx-bench [--backend cpu|cuda] [--threads N] [--device I]\n"
          "                    [--case NAME]... [--all] [--reps N] [--warmup N] [--calls N]\n"
          "                    [--topk K] [--check] [--inputs dyadic|gauss] [--ghz X]\n"
          "                    [--fma-units N]\n"
          "cases:");
  for (int i = 0; i < FP4IDX__NCASES; i++)
    fprintf(f, " %s%s", fp4idx__cases[i].name, fp4idx__cases[i].cpu_default ? "*" : "");
  fprintf(f, "\n(* = default on the CPU backend; every case by default on cuda)\n");
}

int main(int argc, char **argv) {
  fp4idx__opts_t o = {.backend = "cpu", .reps = 7, .warmup = 2, .calls = 1};
  int reps_set = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV \
  if (!v) { fp4idx__usage(stderr); return 2; } \
  i++;
    if (!strcmp(a, "--backend")) { NEEDV o.backend = v; }
    else if (!strcmp(a, "--threads")) { NEEDV o.threads = atoi(v); }
    else if (!strcmp(a, "--device")) { NEEDV o.device = atoi(v); }
    else if (!strcmp(a, "--reps")) { NEEDV o.reps = atoi(v); reps_set = 1; }
    else if (!strcmp(a, "--warmup")) { NEEDV o.warmup = atoi(v); }
    else if (!strcmp(a, "--calls")) { NEEDV o.calls = atoi(v); }
    else if (!strcmp(a, "--topk")) { NEEDV o.topk = atoi(v); }
    else if (!strcmp(a, "--ghz")) { NEEDV o.ghz = atof(v); }
    else if (!strcmp(a, "--fma-units")) { NEEDV o.fma_units = atoi(v); }
    else if (!strcmp(a, "--case")) { NEEDV if (o.n_only < 16) o.only[o.n_only++] = v; }
    else if (!strcmp(a, "--inputs")) {
      NEEDV
      if (!strcmp(v, "gauss")) o.gauss = 1;
      else if (strcmp(v, "dyadic")) { fp4idx__usage(stderr); return 2; }
    }
    else if (!strcmp(a, "--all")) o.all = 1;
    else if (!strcmp(a, "--check")) o.check = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fp4idx__usage(stdout); return 0; }
    else { fp4idx__usage(stderr); return 2; }
#undef NEEDV
  }
  int is_cpu = !strcmp(o.backend, "cpu");
  if (!is_cpu && !reps_set) o.reps = 10;
  if (!is_cpu && o.calls == 1) o.calls = 20; /* docs/RESULTS.md's method: 20 calls per replay */
  if (o.reps < 1 || o.calls < 1 || o.warmup < 0 || o.topk < 0 || o.threads < 0) {
    fp4idx__usage(stderr);
    return 2;
  }
  fp4idx__gauss_inputs = o.gauss;
  fp4idx__machine_t m;
  fp4idx__machine(&m, &o);
  if (is_cpu) {
    int t = o.threads > 0 ? o.threads : m.cpus;
    printf("# cpu: %s, %d online CPUs, %d threads; %.2f GHz (cpu MHz of /proc/cpuinfo), %s,\n"
           "# %d x %d fp32 lanes per core assumed -> fp32 FMA peak %.1f GFLOP/s\n"
           "# (peak = cores x GHz x lanes x FMA units x 2; override with --ghz/--fma-units)\n",
           m.model, m.cpus, t, m.ghz, m.isa, m.fma_units, m.lanes,
           fp4idx__peak_gflops(&m, o.threads));
  }
  printf("# reps %d (median), warm-up %d, calls per rep %d; %s inputs, shuffled %d-key pages,\n"
         "# row r sees context - r keys; FLOP = 2*R*H*128 per key\n",
         o.reps, o.warmup, o.calls, o.gauss ? "Gaussian bf16" : "dyadic", PAGE);
  int failed = 0, ran = 0;
  for (int i = 0; i < FP4IDX__NCASES; i++) {
    const fp4idx_bench_case_t *c = &fp4idx__cases[i];
    int want = o.n_only ? 0 : (o.all || !is_cpu || c->cpu_default);
    for (int j = 0; j < o.n_only; j++) want |= !strcmp(o.only[j], c->name);
    if (!want) continue;
    ran++;
    failed |= fp4idx__run_case(&o, &m, c) != 0;
  }
  if (!ran) {
    fprintf(stderr, "fp4idx-bench: no case matched\n");
    fp4idx__usage(stderr);
    return 2;
  }
  return failed ? 1 : 0;
}
