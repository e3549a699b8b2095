/* test_util.c -- see test_util.h. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_format.h"

#ifndef FP4IDX_GOLDEN_DIR_DEFAULT
#define FP4IDX_GOLDEN_DIR_DEFAULT "tests/golden"
#endif

const char *fp4idx_test_golden_dir(void) {
  const char *e = getenv("FP4IDX_GOLDEN_DIR");
  return (e && *e) ? e : FP4IDX_GOLDEN_DIR_DEFAULT;
}

void *fp4idx_test_load_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  void *buf = NULL;
  if (fseek(f, 0, SEEK_END) != 0) goto fail;
  long n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET) != 0) goto fail;
  buf = malloc(n > 0 ? (size_t)n : 1);
  if (!buf) goto fail;
  if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) goto fail;
  fclose(f);
  if (size) *size = (size_t)n;
  return buf;
fail:
  free(buf);
  fclose(f);
  return NULL;
}

void *fp4idx_test_load_golden(const char *name, size_t expect_size, size_t *size) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", fp4idx_test_golden_dir(), name);
  size_t n = 0;
  void *buf = fp4idx_test_load_file(path, &n);
  if (!buf) return NULL;
  if (expect_size && n != expect_size) {
    free(buf);
    return NULL;
  }
  if (size) *size = n;
  return buf;
}

/* ---- RNG ---------------------------------------------------------------- */

void fp4idx_test_rng_seed(fp4idx_test_rng_t *rng, uint64_t seed) {
  rng->state = seed;
}

uint64_t fp4idx_test_rng_next(fp4idx_test_rng_t *rng) {
  uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fp4idx_test_rng_below(fp4idx_test_rng_t *rng, uint64_t n) {
  if (n <= 1) return 0;
  /* rejection sampling: no modulo bias */
  uint64_t lim = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = fp4idx_test_rng_next(rng);
  while (x >= lim);
  return x % n;
}

int64_t fp4idx_test_rng_range(fp4idx_test_rng_t *rng, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return lo + (int64_t)fp4idx_test_rng_below(rng, (uint64_t)(hi - lo) + 1);
}

void fp4idx_test_shuffle_i32(fp4idx_test_rng_t *rng, int32_t *a, int64_t n) {
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)fp4idx_test_rng_below(rng, (uint64_t)i + 1);
    int32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* ---- bf16 ----------------------------------------------------------------- */

double fp4idx_test_bf16_to_f64(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

double fp4idx_test_round_bf16(double x) {
  if (isnan(x) || isinf(x) || x == 0.0) return x;
  int e;
  frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
  int lead = e - 1;
  if (lead < -126) lead = -126; /* subnormal bf16: fixed step 2^-133 */
  double ulp = ldexp(1.0, lead - 7);
  double r = nearbyint(x / ulp) * ulp; /* scaling by 2^k is exact */
  if (fabs(r) >= ldexp(1.0, 128)) return copysign(INFINITY, x);
  return r;
}

uint16_t fp4idx_test_f64_to_bf16(double x) {
  if (isnan(x)) return 0x7fc0;
  float f = (float)fp4idx_test_round_bf16(x); /* exact */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* ---- decoders --------------------------------------------------------------- */

double fp4idx_test_e2m1_value(unsigned code) {
  unsigned e = (code >> 1) & 3u, m = code & 1u;
  double mag = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, (int)e - 1);
  return (code & 8u) ? -mag : mag;
}

double fp4idx_test_ue8m0_value(unsigned s) {
  s &= 0xffu;
  if (s == 0) return 0.0;
  if (s == 255) return INFINITY;
  return ldexp(1.0, (int)s - 127);
}

double fp4idx_test_key_element(const uint8_t *slot68, int e) {
  unsigned byte = slot68[e / 2];
  unsigned code = (e % 2) ? (byte >> 4) : (byte & 15u);
  double v = fp4idx_test_e2m1_value(code) * fp4idx_test_ue8m0_value(slot68[64 + e / 32]);
  return fp4idx_test_round_bf16(v);
}

/* ---- reference scorer ----------------------------------------------------------- */

int fp4idx_test_ref_score(const uint8_t *keys, int64_t n_keys, int heads,
                          int rows, const uint16_t *q, const uint16_t *w,
                          const int32_t *lens, const uint8_t *mask,
                          int64_t width, float *out) {
  if (heads < 1 || heads > 128 || rows < 1 || width < 0 || width > n_keys ||
      !q || !w || !out || (n_keys > 0 && !keys))
    return -1;
  for (int r = 0; r < rows; r++)
    if (lens && (lens[r] < 0 || lens[r] > width)) return -1;
  double k[128];
  for (int64_t l = 0; l < width; l++) {
    for (int e = 0; e < 128; e++) k[e] = fp4idx_test_key_element(keys + l * 68, e);
    for (int r = 0; r < rows; r++) {
      int64_t len = lens ? lens[r] : width;
      float *o = &out[(int64_t)r * width + l];
      if (l >= len || (mask && !mask[(int64_t)r * width + l])) {
        *o = -INFINITY;
        continue;
      }
      double sum = 0.0;
      for (int h = 0; h < heads; h++) {
        const uint16_t *qh = q + ((int64_t)r * heads + h) * 128;
        double d = 0.0;
        for (int e = 0; e < 128; e++) d += fp4idx_test_bf16_to_f64(qh[e]) * k[e];
        d = fp4idx_test_round_bf16(d);
        double dm = isnan(d) ? d : (d > 0.0 ? d : 0.0);
        double p = fp4idx_test_round_bf16(dm * fp4idx_test_bf16_to_f64(w[(int64_t)r * heads + h]));
        sum += p;
      }
      *o = (float)fp4idx_test_round_bf16(sum);
    }
  }
  return 0;
}

typedef struct {
  float v;
  int32_t p;
} fp4idx__test_pair_t;

static int fp4idx__test_pair_cmp(const void *a, const void *b) {
  const fp4idx__test_pair_t *x = a, *y = b;
  if (x->v > y->v) return -1;
  if (x->v < y->v) return 1;
  return x->p < y->p ? -1 : x->p > y->p;
}

int fp4idx_test_ref_topk(const float *logits, int rows, int64_t width, int k,
                         int32_t *pos, float *val, int32_t *count) {
  if (rows < 1 || width < 0 || k < 1 || !pos || !val || !count) return -1;
  fp4idx__test_pair_t *buf = malloc(sizeof *buf * (size_t)(width > 0 ? width : 1));
  if (!buf) return -1;
  for (int r = 0; r < rows; r++) {
    int64_t m = 0;
    for (int64_t l = 0; l < width; l++) {
      float v = logits[(int64_t)r * width + l];
      if (isnan(v) || v == -INFINITY) continue;
      buf[m].v = v;
      buf[m].p = (int32_t)l;
      m++;
    }
    qsort(buf, (size_t)m, sizeof *buf, fp4idx__test_pair_cmp);
    int64_t keep = m < k ? m : k;
    for (int i = 0; i < k; i++) {
      pos[(int64_t)r * k + i] = i < keep ? buf[i].p : -1;
      val[(int64_t)r * k + i] = i < keep ? buf[i].v : -INFINITY;
    }
    count[r] = (int32_t)keep;
  }
  free(buf);
  return 0;
}

/* ---- dyadic cases --------------------------------------------------------------- */

static uint16_t fp4idx__test_eighths(fp4idx_test_rng_t *rng, int lim) {
  return fp4idx_test_f64_to_bf16((double)fp4idx_test_rng_range(rng, -lim, lim) / 8.0);
}

void fp4idx_test_case_free(fp4idx_test_case_t *c) {
  if (!c) return;
  free(c->keys);
  free(c->packed);
  free(c->pages);
  free(c->slots);
  free(c->q);
  free(c->w);
  free(c->lens);
  free(c->mask);
  memset(c, 0, sizeof *c);
}

int fp4idx_test_case_dyadic(fp4idx_test_case_t *c, fp4idx_test_rng_t *rng,
                            int heads, int rows, int64_t n_keys,
                            int32_t page_size, int64_t n_pages,
                            const int32_t *lens, int with_mask) {
  if (!c) return -1;
  memset(c, 0, sizeof *c);
  if (!rng || heads < 1 || heads > 128 || rows < 1 || n_keys < 0 ||
      page_size < 1 || (page_size & (page_size - 1)))
    return -1;
  int64_t need = (n_keys + page_size - 1) / page_size;
  if (n_pages == 0) n_pages = need > 0 ? need : 1;
  if (n_pages < need || n_pages > INT32_MAX) return -1;
  c->heads = heads;
  c->rows = rows;
  c->n_keys = n_keys;
  c->page_size = page_size;
  c->n_pages = n_pages;
  size_t nk = (size_t)(n_keys > 0 ? n_keys : 1);
  c->keys = malloc(nk * 128 * sizeof *c->keys);
  c->packed = malloc(nk * 68);
  c->pages = malloc((size_t)n_pages * sizeof *c->pages);
  c->slots = malloc(nk * sizeof *c->slots);
  c->q = malloc((size_t)rows * heads * 128 * sizeof *c->q);
  c->w = malloc((size_t)rows * heads * sizeof *c->w);
  c->lens = malloc((size_t)rows * sizeof *c->lens);
  if (!c->keys || !c->packed || !c->pages || !c->slots || !c->q || !c->w || !c->lens)
    goto fail;
  for (int64_t i = 0; i < n_keys * 128; i++) c->keys[i] = fp4idx__test_eighths(rng, 48);
  for (int64_t i = 0; i < n_keys; i++)
    if (fp4idx_quantize_key(c->keys + i * 128, FP4IDX_DTYPE_BF16, FP4IDX_ROUND_RNE,
                            c->packed + i * 68, c->packed + i * 68 + 64) != 0)
      goto fail;
  for (int64_t i = 0; i < n_pages; i++) c->pages[i] = (int32_t)i;
  fp4idx_test_shuffle_i32(rng, c->pages, n_pages);
  for (int64_t l = 0; l < n_keys; l++)
    c->slots[l] = (int64_t)c->pages[l / page_size] * page_size + l % page_size;
  for (int64_t i = 0; i < (int64_t)rows * heads * 128; i++) c->q[i] = fp4idx__test_eighths(rng, 16);
  for (int64_t i = 0; i < (int64_t)rows * heads; i++) c->w[i] = fp4idx__test_eighths(rng, 16);
  c->width = 0;
  for (int r = 0; r < rows; r++) {
    int64_t len = lens ? lens[r] : n_keys - r;
    if (len < 0) len = 0;
    if (len > n_keys) goto fail;
    c->lens[r] = (int32_t)len;
    if (len > c->width) c->width = len;
  }
  if (with_mask && c->width > 0) {
    c->mask = malloc((size_t)rows * (size_t)c->width);
    if (!c->mask) goto fail;
    for (int64_t i = 0; i < rows * c->width; i++)
      c->mask[i] = fp4idx_test_rng_below(rng, 4) != 0;
  }
  return 0;
fail:
  fp4idx_test_case_free(c);
  return -1;
}

int64_t fp4idx_test_count_diff(const float *a, const float *b, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(a[i]) && isnan(b[i])) continue;
    d += memcmp(&a[i], &b[i], 4) != 0;
  }
  return d;
}
