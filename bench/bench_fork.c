/* bench_fork.c -- fp4idx-bench-fork: prefix sharing (fork) measured in the
 * daemon's cache, in process, over the CPU backend (issue 15).
 *
 *   (a) fork latency p50/p90 at a prefix of 1,000 and 1,000,000 keys (plus
 *       one key, so the last page is partly filled and shared): the cache
 *       copies the page list and counts one more owner per page, no key;
 *   (b) what the partly filled last page costs: the copy-on-write of the
 *       first append into it (append of 1 key to a fresh fork, copy + store)
 *       next to the same append on an unshared sequence (store only), and one
 *       backend copy_pages of a page -- the price copy-at-fork would add to
 *       every fork instead;
 *   (c) pool pages for 16 forks of a 100,000-key prompt, each extended by
 *       1,000 keys, with fork vs with 16 separate copies of the prompt.
 * Every measurement runs -r times (default 3); the table prints the median
 * of the per-run p50s. The socket side (the fork op through fp4idxd) is
 * fp4idx-bench-socket's business once the op exists.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "fp4idx_backend.h"
#include "fp4idx_status.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  int k = (int)ceil(p / 100.0 * n);
  return v[k < 1 ? 0 : k - 1];
}

static double median3(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

#define CHECK(x)                                                              \
  do {                                                                        \
    int rc_ = (x);                                                            \
    if (rc_) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,              \
              fp4idx_strerror(rc_));                                          \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

typedef struct env_s {
  fp4idx_cache_t c;
  fp4idx_backend_t *b;
  int32_t P;
} env_t;

static int copy_cb(void *ctx, int32_t from, int32_t to) {
  fp4idx_backend_t *b = ctx;
  return b->ops->copy_pages(b, from, to, 1);
}

static void env_init(env_t *e, int64_t pages, int32_t P) {
  e->P = P;
  CHECK(fp4idx_backend_cpu_create(&e->b, 1));
  CHECK(e->b->ops->pool_create(e->b, pages, P));
  CHECK(fp4idx__cache_init(&e->c, pages, P));
  fp4idx__cache_set_copy(&e->c, copy_cb, e->b);
}

static void env_fini(env_t *e) {
  fp4idx__cache_destroy(&e->c);
  fp4idx_backend_destroy(e->b);
}

/* Appends n packed keys (bytes of a simple pattern) to seq. */
static void put(env_t *e, uint64_t seq, int64_t n) {
  enum { CH = 8192 };
  static uint8_t keys[CH * FP4IDX_SLOT_BYTES];
  static int64_t slots[CH];
  for (int64_t i = 0; i < CH * FP4IDX_SLOT_BYTES; i++)
    keys[i] = (i % FP4IDX_SLOT_BYTES) >= FP4IDX_PAYLOAD_BYTES ? 127 : (uint8_t)(i * 13);
  while (n > 0) {
    int64_t k = n < CH ? n : CH, first;
    int created;
    CHECK(fp4idx__cache_append(&e->c, seq, k, &first, slots, &created));
    CHECK(e->b->ops->store(e->b, keys, FP4IDX_DTYPE_FP4, k, slots, FP4IDX_ROUND_RNE));
    n -= k;
  }
}

/* (a) p50/p90 of fork(1 -> 2, len), dst dropped between calls (untimed). */
static void fork_latency(env_t *e, int64_t len, int iters, double *p50, double *p90) {
  double *t = malloc((size_t)iters * sizeof *t);
  for (int i = -iters / 10; i < iters; i++) {
    double t0 = now_ns();
    CHECK(fp4idx__cache_fork(&e->c, 1, 2, len));
    double t1 = now_ns();
    CHECK(fp4idx__cache_drop(&e->c, 2));
    if (i >= 0) t[i] = t1 - t0;
  }
  *p50 = pct(t, iters, 50);
  *p90 = pct(t, iters, 90);
  free(t);
}

/* (b) p50 of appending one key: into a fresh fork's shared partial page
 * (cow = 1) or into an unshared sequence of the same length (cow = 0). */
static double first_append(env_t *e, int64_t len, int cow, int iters) {
  double *t = malloc((size_t)iters * sizeof *t);
  uint8_t key[FP4IDX_SLOT_BYTES];
  memset(key, 0x11, sizeof key);
  for (int i = -iters / 10; i < iters; i++) {
    int64_t first, slot;
    int created;
    if (cow) CHECK(fp4idx__cache_fork(&e->c, 1, 2, len));
    else CHECK(fp4idx__cache_truncate(&e->c, 3, len));
    uint64_t seq = cow ? 2 : 3;
    double t0 = now_ns();
    CHECK(fp4idx__cache_append(&e->c, seq, 1, &first, &slot, &created));
    CHECK(e->b->ops->store(e->b, key, FP4IDX_DTYPE_FP4, 1, &slot, FP4IDX_ROUND_RNE));
    double t1 = now_ns();
    if (cow) CHECK(fp4idx__cache_drop(&e->c, 2));
    if (i >= 0) t[i] = t1 - t0;
  }
  double r = pct(t, iters, 50);
  free(t);
  return r;
}

static double copy_page_cost(env_t *e, int iters) {
  double *t = malloc((size_t)iters * sizeof *t);
  int64_t n = e->c.n_pages;
  for (int i = -iters / 10; i < iters; i++) {
    double t0 = now_ns();
    CHECK(e->b->ops->copy_pages(e->b, 0, n - 1 - (i & 7), 1));
    double t1 = now_ns();
    if (i >= 0) t[i] = t1 - t0;
  }
  double r = pct(t, iters, 50);
  free(t);
  return r;
}

int main(int argc, char **argv) {
  int reps = 3, iters = 2000, opt;
  int32_t P = 64;
  while ((opt = getopt(argc, argv, "r:n:p:h")) != -1) {
    switch (opt) {
      case 'r': reps = atoi(optarg); break;
      case 'n': iters = atoi(optarg); break;
      case 'p': P = atoi(optarg); break;
      default:
        fprintf(stderr, "usage: %s [-r RUNS] [-n CALLS] [-p PAGE_SIZE]\n", argv[0]);
        return opt == 'h' ? 0 : 2;
    }
  }
  if (reps < 1 || reps > 99 || iters < 10 || !fp4idx_page_size_valid(P)) {
    fprintf(stderr, "bad -r, -n or -p\n");
    return 2;
  }
  const int64_t lens[2] = {1000 + 1, 1000000 + 1};
  double fp50[2][99], fp90[2][99], cow[99], plain[99], copy[99];
  for (int r = 0; r < reps; r++) {
    for (int l = 0; l < 2; l++) {
      env_t e;
      env_init(&e, (lens[l] + 2 * P) / P * 2 + 8, P);
      put(&e, 1, lens[l]);
      fork_latency(&e, lens[l], iters, &fp50[l][r], &fp90[l][r]);
      if (l == 0) {
        put(&e, 3, lens[l]);
        cow[r] = first_append(&e, lens[l] - 1, 1, iters);
        plain[r] = first_append(&e, lens[l] - 1, 0, iters);
        copy[r] = copy_page_cost(&e, iters);
      }
      env_fini(&e);
    }
  }
  printf("fp4idx-bench-fork: cache + CPU backend in process, page size %d, %d runs x %d calls, "
         "median of the runs' p50 (ns)\n\n",
         P, reps, iters);
  printf("| prefix keys | pages shared | fork p50 | fork p90 |\n|---|---|---|---|\n");
  for (int l = 0; l < 2; l++)
    printf("| %lld | %lld | %.0f | %.0f |\n", (long long)lens[l],
           (long long)((lens[l] + P - 1) / P), median3(fp50[l], reps), median3(fp90[l], reps));
  printf("\n| append of 1 key after a fork of %lld keys | p50 |\n|---|---|\n",
         (long long)lens[0] - 1);
  printf("| into the shared partial page (copy-on-write + store) | %.0f |\n", median3(cow, reps));
  printf("| into an unshared page (store only) | %.0f |\n", median3(plain, reps));
  printf("| one backend copy_pages of a page (%lld bytes) | %.0f |\n",
         (long long)fp4idx_page_bytes(P), median3(copy, reps));

  /* (c) 16 forks of a 100,000-key prompt, each + 1,000 keys. */
  enum { FORKS = 16, PROMPT = 100000, EXTRA = 1000 };
  int64_t pool = (int64_t)(FORKS + 1) * (PROMPT + EXTRA) / P + 64;
  env_t e;
  env_init(&e, pool, P);
  put(&e, 1, PROMPT);
  for (int f = 0; f < FORKS; f++) {
    CHECK(fp4idx__cache_fork(&e.c, 1, 100 + f, PROMPT));
    put(&e, 100 + (uint64_t)f, EXTRA);
  }
  int64_t shared_used = fp4idx__cache_used_pages(&e.c), shared_pages = fp4idx__cache_shared_pages(&e.c);
  fp4idx__cache_clear(&e.c);
  for (int f = 0; f < FORKS; f++) put(&e, 100 + (uint64_t)f, PROMPT + EXTRA);
  int64_t copied_used = fp4idx__cache_used_pages(&e.c);
  env_fini(&e);
  printf("\n16 sequences of a 100,000-key prompt + 1,000 own keys each (page size %d):\n", P);
  printf("| layout | pool pages used | keys of pool (pages x P) | shared pages |\n|---|---|---|---|\n");
  printf("| fork (prompt stored once) | %lld | %lld | %lld |\n", (long long)shared_used,
         (long long)shared_used * P, (long long)shared_pages);
  printf("| 16 copies | %lld | %lld | 0 |\n", (long long)copied_used,
         (long long)copied_used * P);
  printf("| expected: 1 x prompt + 16 x (copied partial page + 1,000 keys) | %lld | %lld | |\n",
         (long long)((PROMPT + P - 1) / P + FORKS * ((EXTRA + P - 1) / P + 1)),
         (long long)(PROMPT + FORKS * EXTRA));
  return 0;
}
