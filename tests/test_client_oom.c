/* test_client_oom.c -- out-of-memory loops (the SQLite way) over the client
 * library: malloc/calloc/realloc in the library and codec objects fail at
 * call N, N = 1, 2, ... until the operation completes. Every failing pass
 * must return FP4IDX_ENOMEM (never crash, never report success with missing
 * data, never leak: run under ASan), and the daemon must stay usable.
 * The allocator hooks use the linker's --wrap on the static library. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_harness.h"
#include "fp4idx_client.h"
#include "test_util.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);

static int armed_;     /* count allocations only while armed */
static long fail_at_;  /* fail the fail_at_-th allocation (1-based) */
static long count_;

static int should_fail(void) {
  if (!armed_) return 0;
  return ++count_ == fail_at_;
}

void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n) { return should_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_calloc(size_t a, size_t b) {
  return should_fail() ? NULL : __real_calloc(a, b);
}
void *__wrap_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n) {
  return should_fail() ? NULL : __real_realloc(p, n);
}

static fp4idx_test_daemon_t daemon_;

static void start(void) {
  cr_assert_eq(fp4idx_test_daemon_start(&daemon_, NULL), 0,
               "fp4idxd did not start");
}

static void stop(void) {
  if (daemon_.pid) fp4idx_test_daemon_stop(&daemon_);
}

TestSuite(oom, .init = start, .fini = stop);

/* Runs op(c) with allocation N failing, N = 1.. until it succeeds; returns
 * how many passes failed. op must return a status and clean up itself. */
typedef int (*op_fn)(fp4idx_client_t *c, void *arg);

static long oom_loop(op_fn op, void *arg, const char *what) {
  for (long n = 1; n < 10000; n++) {
    fp4idx_client_t *c = fp4idx_client_new();
    cr_assert_not_null(c);
    cr_assert_eq(fp4idx_client_connect(c, daemon_.sock), FP4IDX_OK);
    count_ = 0;
    fail_at_ = n;
    armed_ = 1;
    int st = op(c, arg);
    armed_ = 0;
    fp4idx_client_close(c);
    if (count_ < n) {
      cr_expect_eq(st, FP4IDX_OK, "%s: no allocation failed but %s", what,
                   fp4idx_status_name(st));
      return n - 1;
    }
    cr_expect_eq(st, FP4IDX_ENOMEM, "%s: allocation %ld failed -> %s", what,
                 n, fp4idx_status_name(st));
  }
  cr_assert_fail("%s: never completed", what);
  return -1;
}

typedef struct {
  const uint16_t *keys, *q, *w;
  const int32_t *lens;
  const float *ref;
  size_t n;
  int rows;
} case_t;

static int op_score(fp4idx_client_t *c, void *arg) {
  const case_t *k = arg;
  fp4idx_client_seq_t s = {.seq = 1, .rows = (uint32_t)k->rows, .q = k->q,
                           .w = k->w, .lens = k->lens};
  fp4idx_client_result_t *res = (void *)1;
  int st = fp4idx_client_score(c, 32, 0, &s, 1, &res);
  if (st != FP4IDX_OK) {
    cr_expect_null(res, "output set on failure");
    return st;
  }
  int64_t d = fp4idx_test_count_diff(res->logits, k->ref,
                                     (int64_t)k->rows * (int64_t)k->n);
  cr_expect_eq(d, 0, "logits differ after OOM passes");
  fp4idx_client_free(res);
  return st;
}

static int op_topk(fp4idx_client_t *c, void *arg) {
  const case_t *k = arg;
  fp4idx_client_seq_t s = {.seq = 1, .rows = (uint32_t)k->rows, .q = k->q,
                           .w = k->w, .lens = k->lens};
  fp4idx_client_result_t *res = NULL;
  int st = fp4idx_client_score(c, 32, 8, &s, 1, &res);
  if (st == FP4IDX_OK) {
    cr_expect_eq(res->width, 8);
    fp4idx_client_free(res);
  }
  return st;
}

static int op_read(fp4idx_client_t *c, void *arg) {
  (void)arg;
  void *keys = (void *)1;
  size_t n = 7;
  int st = fp4idx_client_read(c, 1, 0, UINT64_MAX, 1, &keys, &n);
  if (st != FP4IDX_OK) {
    cr_expect(keys == NULL && n == 0, "output set on failure");
    return st;
  }
  cr_expect_eq(n, 1000);
  fp4idx_client_free(keys);
  return st;
}

static int op_stats(fp4idx_client_t *c, void *arg) {
  (void)arg;
  fp4idx_client_stats_t *s = (void *)1;
  int st = fp4idx_client_stats(c, &s);
  if (st != FP4IDX_OK) {
    cr_expect_null(s);
    return st;
  }
  cr_expect(s->nops > 0);
  fp4idx_client_free(s);
  return st;
}

static int op_append(fp4idx_client_t *c, void *arg) {
  const case_t *k = arg;
  return fp4idx_client_append_bf16(c, 2, k->keys, 10, FP4IDX_ROUNDING_RNE,
                                   NULL, NULL);
}

static int op_new(fp4idx_client_t *c, void *arg) {
  (void)c;
  (void)arg;
  fp4idx_client_t *d = fp4idx_client_new();
  if (d == NULL) return FP4IDX_ENOMEM;
  fp4idx_client_close(d);
  return FP4IDX_OK;
}

Test(oom, every_allocation_failure_is_enomem) {
  case_t k = {0};
  size_t sz;
  k.keys = fp4idx_test_load_golden("dyadic_h32_keys.bin", 0, &sz);
  k.n = sz / 256;
  k.q = fp4idx_test_load_golden("dyadic_h32_q.bin", 0, NULL);
  k.w = fp4idx_test_load_golden("dyadic_h32_w.bin", 0, NULL);
  k.lens = fp4idx_test_load_golden("dyadic_h32_lens.bin", 0, &sz);
  k.rows = (int)(sz / 4);
  k.ref = fp4idx_test_load_golden("dyadic_h32_ref.bin", 0, NULL);
  cr_assert(k.keys && k.q && k.w && k.lens && k.ref);
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_eq(fp4idx_client_connect(c, daemon_.sock), FP4IDX_OK);
  cr_assert_eq(fp4idx_client_append_bf16(c, 1, k.keys, k.n,
                                         FP4IDX_ROUNDING_RNE, NULL, NULL),
               FP4IDX_OK);
  fp4idx_client_close(c);

  cr_expect_gt(oom_loop(op_score, &k, "score"), 0);
  cr_expect_gt(oom_loop(op_topk, &k, "topk"), 0);
  cr_expect_gt(oom_loop(op_read, &k, "read"), 0);
  cr_expect_gt(oom_loop(op_stats, &k, "stats"), 0);
  oom_loop(op_append, &k, "append");
  cr_expect_gt(oom_loop(op_new, &k, "new"), 0);

  /* The daemon took all of that and still answers. */
  c = fp4idx_client_new();
  cr_assert_eq(fp4idx_client_connect(c, daemon_.sock), FP4IDX_OK);
  fp4idx_client_info_t in;
  cr_expect_eq(fp4idx_client_info(c, &in), FP4IDX_OK);
  fp4idx_client_close(c);
  free((void *)k.keys), free((void *)k.q), free((void *)k.w);
  free((void *)k.lens), free((void *)k.ref);
}
