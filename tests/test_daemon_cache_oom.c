/* test_daemon_cache_oom.c -- the cache under allocation failure, the SQLite
 * way: the N-th allocation fails, N raised each pass until a whole scenario
 * runs without a failure. Every operation either succeeds or returns
 * FP4IDX_ENOMEM leaving the cache exactly as it was (checked against a
 * model), and nothing leaks (ASan). cache.c is compiled in here with a
 * failing allocator. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static long g_calls, g_fail_at = -1;
static int g_failed;

static int should_fail(void) {
  if (g_fail_at >= 0 && g_calls++ == g_fail_at) {
    g_failed = 1;
    return 1;
  }
  return 0;
}
static void *t_malloc(size_t n) { return should_fail() ? NULL : malloc(n); }
static void *t_calloc(size_t n, size_t k) { return should_fail() ? NULL : calloc(n, k); }
static void *t_realloc(void *p, size_t n) { return should_fail() ? NULL : realloc(p, n); }

#define FP4IDX_CACHE_MALLOC t_malloc
#define FP4IDX_CACHE_CALLOC t_calloc
#define FP4IDX_CACHE_REALLOC t_realloc
#include "../daemon/cache.c"

enum { NSEQ = 150, PAGES = 400, P = 4 };

typedef struct model_s {
  int64_t keys[NSEQ];
  int known[NSEQ];
} model_t;

static uint64_t sid(int k) { return (uint64_t)k * 0x9E3779B97F4A7C15ULL + 1; }

/* (No bytes here: copy-on-write needs only a callback that succeeds.) */
static int copy_ok(void *ctx, int32_t from, int32_t to) {
  (void)ctx, (void)from, (void)to;
  return 0;
}

static void check_same(const fp4idx_cache_t *c, const model_t *m) {
  int64_t keys = 0, used = 0;
  uint64_t seqs = 0;
  static uint8_t seen[PAGES];
  memset(seen, 0, sizeof seen);
  for (int k = 0; k < NSEQ; k++) {
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(c, sid(k));
    cr_assert_eq(s != NULL, m->known[k] != 0, "seq %d presence", k);
    if (!s) continue;
    cr_assert_eq(s->n_keys, m->keys[k]);
    cr_assert_eq(s->n_pages, (m->keys[k] + P - 1) / P);
    keys += m->keys[k];
    for (int64_t i = 0; i < s->n_pages; i++) used += seen[fp4idx__cache_page(s, i)]++ == 0; /* forks share */
    seqs++;
  }
  cr_assert_eq(c->n_keys, keys);
  cr_assert_eq(c->n_seqs, seqs);
  cr_assert_eq(c->n_free, PAGES - used);
}

/* One scenario; returns 1 when it ran without an injected failure. */
static int scenario(long fail_at) {
  g_calls = 0;
  g_fail_at = fail_at;
  g_failed = 0;
  fp4idx_cache_t c;
  int rc = fp4idx__cache_init(&c, PAGES, P);
  if (rc) {
    cr_assert_eq(rc, FP4IDX_ENOMEM);
    return 0;
  }
  fp4idx__cache_set_copy(&c, copy_ok, NULL);
  model_t m;
  memset(&m, 0, sizeof m);
  uint64_t x = 99;
  int64_t slots[64];
  for (int it = 0; it < 1500; it++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    int k = (int)((x >> 33) % NSEQ), op = (int)((x >> 20) % 11);
    int64_t first;
    int created;
    if (op < 6) {
      int64_t n = 1 + (int64_t)((x >> 40) % 30);
      int64_t used = PAGES - c.n_free;
      int64_t need = (m.keys[k] + n + P - 1) / P - (m.keys[k] + P - 1) / P;
      const fp4idx_cache_seq_t *s = fp4idx__cache_find(&c, sid(k));
      if (s && s->n_keys % P) { /* a last page another sequence sees is copied first */
        int32_t last = fp4idx__cache_page(s, s->n_pages - 1);
        for (int o = 0; o < NSEQ; o++) {
          const fp4idx_cache_seq_t *t = o == k ? NULL : fp4idx__cache_find(&c, sid(o));
          if (t && t->n_pages >= s->n_pages && fp4idx__cache_page(t, s->n_pages - 1) == last) {
            need++;
            break;
          }
        }
      }
      rc = fp4idx__cache_append(&c, sid(k), n, &first, slots, &created);
      if (rc == FP4IDX_ENOMEM) {
        /* unchanged: checked below */
      } else if (need > PAGES - used) {
        cr_assert_eq(rc, FP4IDX_EFULL);
      } else {
        cr_assert_eq(rc, FP4IDX_OK);
        cr_assert_eq(first, m.keys[k]);
        m.known[k] = 1;
        m.keys[k] += n;
      }
    } else if (op < 8) {
      int64_t len = m.known[k] ? (int64_t)((x >> 40) % (uint64_t)(m.keys[k] + 1)) : 0;
      rc = fp4idx__cache_truncate(&c, sid(k), len);
      cr_assert_eq(rc, m.known[k] ? FP4IDX_OK : FP4IDX_ENOSEQ); /* never allocates */
      if (m.known[k]) m.keys[k] = len;
    } else if (op < 9) {
      rc = fp4idx__cache_drop(&c, sid(k));
      cr_assert_eq(rc, m.known[k] ? FP4IDX_OK : FP4IDX_ENOSEQ);
      m.known[k] = 0;
      m.keys[k] = 0;
    } else if (op == 10) {
      /* fork k into another id: a new table entry and page list, no page */
      int dst = (k + 1 + (int)((x >> 44) % (NSEQ - 1))) % NSEQ;
      int64_t len = m.known[k] ? (int64_t)((x >> 40) % (uint64_t)(m.keys[k] + 1)) : 0;
      int64_t free_before = c.n_free, shared_before = fp4idx__cache_shared_pages(&c);
      rc = fp4idx__cache_fork(&c, sid(k), sid(dst), len);
      if (rc == FP4IDX_ENOMEM) {
        cr_assert_eq(c.n_free, free_before);
        cr_assert_eq(fp4idx__cache_shared_pages(&c), shared_before);
      } else if (!m.known[k]) {
        cr_assert_eq(rc, FP4IDX_ENOSEQ);
      } else if (m.known[dst]) {
        cr_assert_eq(rc, FP4IDX_EEXIST);
      } else {
        cr_assert_eq(rc, FP4IDX_OK);
        cr_assert_eq(c.n_free, free_before);
        m.known[dst] = 1;
        m.keys[dst] = len;
      }
    } else if (!m.known[k] && c.n_free >= 2) {
      /* adopt two free pages (from the top of the free stack) */
      int32_t pages[2] = {c.free_stack[c.n_free - 1], c.free_stack[c.n_free - 2]};
      rc = fp4idx__cache_adopt(&c, sid(k), 5, pages, 2);
      if (rc != FP4IDX_ENOMEM) {
        cr_assert_eq(rc, FP4IDX_OK);
        m.known[k] = 1;
        m.keys[k] = 5;
      }
    }
    check_same(&c, &m);
  }
  fp4idx__cache_destroy(&c);
  return !g_failed;
}

Test(cache_oom, every_allocation_failure_changes_nothing) {
  long n = 0;
  while (!scenario(n)) {
    n++;
    cr_assert_lt(n, 100000, "scenario never completes");
  }
  cr_log_info("scenario completed after %ld injected failures", n);
  cr_assert_gt(n, 10, "the scenario allocates (table growth, page lists, sequences)");
}
