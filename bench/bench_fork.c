/* bench_fork.c -- fp4idx-bench-fork: prefix sharing (fork), in the daemon's
 * cache in process (CPU backend) and, with -s SOCKET, through a running
 * fp4idxd (bench/run_fork.sh starts one on the CPU backend).
 *
 * In process:
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
 * Through the socket (-s), with libfp4idx-client, one request in flight:
 *   (d) fork round trip p50/p90 at a prefix of 1,000 and 1,000,000 keys
 *       (fork, then an untimed drop of the fork);
 *   (e) 16 forks of a 100,000-key prompt, each extended by 1,000 keys of its
 *       own, next to 16 unshared sequences of the same keys: pool pages used
 *       (info), and a score of R=4 x H=32 of every fork compared byte for
 *       byte with its unshared twin.
 * Every measurement runs -r times (default 3); the table prints the median
 * of the per-run p50s.
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
#include "fp4idx_client.h"
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

/* ---- through the socket ------------------------------------------------------ */

#define CCHECK(c, x)                                                          \
  do {                                                                        \
    fp4idx_status_t st_ = (x);                                                \
    if (st_) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #x,         \
              fp4idx_client_last_error(c), fp4idx_status_name(st_));          \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

/* n packed keys of a pattern of `seed` to seq, in 8192-key requests. */
static void sock_put(fp4idx_client_t *c, uint64_t seq, int64_t n, uint32_t seed) {
  enum { CH = 8192 };
  static uint8_t keys[CH * FP4IDX_SLOT_BYTES];
  uint32_t x = seed * 2654435761u + 1;
  while (n > 0) {
    int64_t k = n < CH ? n : CH;
    for (int64_t i = 0; i < k * FP4IDX_SLOT_BYTES; i++) {
      x = x * 1664525u + 1013904223u;
      /* finite keys: any payload nibble, scales near 1.0 */
      keys[i] = (i % FP4IDX_SLOT_BYTES) >= FP4IDX_PAYLOAD_BYTES ? (uint8_t)(124 + (x >> 29))
                                                                : (uint8_t)(x >> 24);
    }
    CCHECK(c, fp4idx_client_append_fp4(c, seq, keys, (size_t)k, NULL, NULL));
    n -= k;
  }
}

static int64_t sock_used(fp4idx_client_t *c, int64_t *shared) {
  fp4idx_client_info_t in;
  CCHECK(c, fp4idx_client_info(c, &in));
  if (shared) {
    fp4idx_client_stats_t *st = NULL;
    CCHECK(c, fp4idx_client_stats(c, &st));
    *shared = (int64_t)st->pages_shared;
    fp4idx_client_free(st);
  }
  return (int64_t)(in.pages_total - in.pages_free);
}

static void sock_fork_latency(fp4idx_client_t *c, uint64_t src, int64_t len, int iters,
                              double *p50, double *p90) {
  double *t = malloc((size_t)iters * sizeof *t);
  for (int i = -iters / 10; i < iters; i++) {
    double t0 = now_ns();
    CCHECK(c, fp4idx_client_fork(c, src, 999, (uint64_t)len, NULL));
    double t1 = now_ns();
    CCHECK(c, fp4idx_client_drop(c, 999));
    if (i >= 0) t[i] = t1 - t0;
  }
  *p50 = pct(t, iters, 50);
  *p90 = pct(t, iters, 90);
  free(t);
}

static int run_socket(const char *sock, int reps, int iters) {
  fp4idx_client_t *c = fp4idx_client_new();
  if (!c || fp4idx_client_connect(c, sock) != FP4IDX_OK) {
    fprintf(stderr, "cannot connect to %s\n", sock);
    return 1;
  }
  fp4idx_client_info_t in;
  CCHECK(c, fp4idx_client_info(c, &in));
  const int64_t P = (int64_t)in.page_size;
  /* (d) */
  const int64_t lens[2] = {1000, 1000000};
  sock_put(c, 1, lens[0], 1);
  sock_put(c, 2, lens[1], 2);
  double p50[2][99], p90[2][99];
  for (int r = 0; r < reps; r++)
    for (int l = 0; l < 2; l++) sock_fork_latency(c, 1 + (uint64_t)l, lens[l], iters, &p50[l][r], &p90[l][r]);
  CCHECK(c, fp4idx_client_drop(c, 1));
  CCHECK(c, fp4idx_client_drop(c, 2));
  printf("fp4idx-bench-fork -s: %s (backend %s, page size %lld), one connection, %d runs x %d "
         "forks, median of the runs (us)\n\n",
         sock, in.backend, (long long)P, reps, iters);
  printf("| prefix keys | fork round trip p50 | p90 |\n|---|---|---|\n");
  for (int l = 0; l < 2; l++)
    printf("| %lld | %.1f | %.1f |\n", (long long)lens[l], median3(p50[l], reps) / 1e3,
           median3(p90[l], reps) / 1e3);

  /* (e) */
  enum { FORKS = 16, PROMPT = 100000, EXTRA = 1000, H = 32, R = 4 };
  int64_t base = sock_used(c, NULL), shared = 0;
  sock_put(c, 10, PROMPT, 10);
  for (int f = 0; f < FORKS; f++) {
    CCHECK(c, fp4idx_client_fork(c, 10, 100 + (uint64_t)f, PROMPT, NULL));
    sock_put(c, 100 + (uint64_t)f, EXTRA, 1000 + (uint32_t)f);
  }
  int64_t forked = sock_used(c, &shared) - base;
  for (int f = 0; f < FORKS; f++) {
    sock_put(c, 200 + (uint64_t)f, PROMPT, 10);
    sock_put(c, 200 + (uint64_t)f, EXTRA, 1000 + (uint32_t)f);
  }
  int64_t copies = sock_used(c, NULL) - base - forked;
  static uint16_t q[R * H * FP4IDX_HEAD_DIM], w[R * H];
  for (size_t i = 0; i < sizeof q / sizeof *q; i++) q[i] = (uint16_t)(0x3c00 + (i * 37) % 0x300);
  for (size_t i = 0; i < sizeof w / sizeof *w; i++) w[i] = 0x3f80;
  size_t cap = (size_t)R * (PROMPT + EXTRA);
  float *la = malloc(cap * sizeof *la), *lb = malloc(cap * sizeof *lb);
  int equal = 0;
  for (int f = 0; f < FORKS; f++) {
    uint32_t wa = 0, wb = 0;
    CCHECK(c, fp4idx_client_score_into(c, 100 + (uint64_t)f, H, R, q, w, NULL, la, cap, &wa));
    CCHECK(c, fp4idx_client_score_into(c, 200 + (uint64_t)f, H, R, q, w, NULL, lb, cap, &wb));
    equal += wa == wb && memcmp(la, lb, (size_t)R * wa * sizeof *la) == 0;
  }
  free(la);
  free(lb);
  printf("\n16 sequences of a %d-key prompt + %d keys each, through the socket:\n", PROMPT, EXTRA);
  printf("| layout | pool pages used | keys of pool (pages x P) | x the prompt |\n|---|---|---|---|\n");
  printf("| 16 forks of the prompt (prompt stored once) | %lld | %lld | %.2f |\n", (long long)forked,
         (long long)(forked * P), (double)(forked * P) / PROMPT);
  printf("| 16 unshared sequences | %lld | %lld | %.2f |\n", (long long)copies,
         (long long)(copies * P), (double)(copies * P) / PROMPT);
  printf("| 1 x prompt + 16 x %d keys | | %d | %.2f |\n", EXTRA, PROMPT + FORKS * EXTRA,
         (double)(PROMPT + FORKS * EXTRA) / PROMPT);
  printf("\npages_shared while forked: %lld; scores R=%d x H=%d of each fork == its unshared "
         "twin byte for byte: %d of %d\n",
         (long long)shared, R, H, equal, FORKS);
  for (int f = 0; f < FORKS; f++) {
    CCHECK(c, fp4idx_client_drop(c, 100 + (uint64_t)f));
    CCHECK(c, fp4idx_client_drop(c, 200 + (uint64_t)f));
  }
  CCHECK(c, fp4idx_client_drop(c, 10));
  fp4idx_client_close(c);
  return equal == FORKS ? 0 : 1;
}

int main(int argc, char **argv) {
  int reps = 3, iters = 2000, opt;
  int32_t P = 64;
  const char *sock = NULL;
  while ((opt = getopt(argc, argv, "r:n:p:s:h")) != -1) {
    switch (opt) {
      case 'r': reps = atoi(optarg); break;
      case 'n': iters = atoi(optarg); break;
      case 'p': P = atoi(optarg); break;
      case 's': sock = optarg; break;
      default:
        fprintf(stderr, "usage: %s [-r RUNS] [-n CALLS] [-p PAGE_SIZE] [-s SOCKET]\n", argv[0]);
        return opt == 'h' ? 0 : 2;
    }
  }
  if (reps < 1 || reps > 99 || iters < 10 || !fp4idx_page_size_valid(P)) {
    fprintf(stderr, "bad -r, -n or -p\n");
    return 2;
  }
  if (sock) return run_socket(sock, reps, iters);
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
