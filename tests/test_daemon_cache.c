/* test_daemon_cache.c -- the daemon's page pool bookkeeping and sequence
 * table (daemon/cache.c), without a backend or a daemon. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "fp4idx_status.h"

/* Every page is either free or used by exactly one sequence; key counts and
 * page counts agree. */
static int check_cb(const fp4idx_cache_seq_t *s, void *arg) {
  int *seen = arg;
  for (int64_t i = 0; i < s->n_pages; i++) seen[fp4idx__cache_page(s, i)]++;
  return 0;
}

static void check_invariants(const fp4idx_cache_t *c) {
  int *seen = calloc((size_t)c->n_pages, sizeof *seen);
  cr_assert_not_null(seen);
  for (int64_t i = 0; i < c->n_free; i++) seen[c->free_stack[i]]++;
  cr_assert_eq(fp4idx__cache_foreach(c, check_cb, seen), 0);
  for (int64_t p = 0; p < c->n_pages; p++)
    cr_assert_eq(seen[p], 1, "page %lld seen %d times", (long long)p, seen[p]);
  free(seen);
}

Test(cache, init_rejects_bad_arguments) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 0, 64), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__cache_init(&c, 10, 48), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__cache_init(&c, 10, 0), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__cache_init(&c, (int64_t)INT32_MAX + 1, 64), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__cache_init(&c, 10, 64), FP4IDX_OK);
  cr_assert_eq(c.n_free, 10);
  fp4idx__cache_destroy(&c);
}

Test(cache, append_creates_and_maps_positions_to_slots) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 8, 4), FP4IDX_OK);
  int64_t first = -1, slots[10];
  int created = 0;
  cr_assert_eq(fp4idx__cache_append(&c, 7, 3, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(first, 0);
  cr_assert_eq(created, 1);
  /* A fresh pool hands out page 0 first: slots 0, 1, 2. */
  for (int i = 0; i < 3; i++) cr_assert_eq(slots[i], i);
  cr_assert_eq(c.n_free, 7);
  cr_assert_eq(fp4idx__cache_append(&c, 7, 6, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(first, 3);
  cr_assert_eq(created, 0);
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&c, 7);
  cr_assert_not_null(s);
  cr_assert_eq(s->n_keys, 9);
  cr_assert_eq(s->n_pages, 3);
  cr_assert_eq(c.n_free, 5);
  /* position l -> pages[l/4]*4 + l%4 */
  for (int i = 0; i < 6; i++) {
    int64_t l = 3 + i;
    cr_assert_eq(slots[i], (int64_t)fp4idx__cache_page(s, l / 4) * 4 + l % 4);
  }
  cr_assert_eq(c.n_keys, 9);
  cr_assert_eq(c.n_seqs, 1);
  cr_assert_null(fp4idx__cache_find(&c, 8));
  cr_assert_eq(fp4idx__cache_append(&c, 7, 0, &first, slots, &created), FP4IDX_EINVAL);
  check_invariants(&c);
  fp4idx__cache_destroy(&c);
}

Test(cache, full_pool_changes_nothing) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 4, 8), FP4IDX_OK);
  int64_t first, slots[64];
  int created;
  cr_assert_eq(fp4idx__cache_append(&c, 1, 20, &first, slots, &created), FP4IDX_OK); /* 3 pages */
  int64_t free_before = c.n_free, keys_before = c.n_keys;
  /* 13 more keys for seq 1: 20+13 = 33 keys = 5 pages, 2 new needed, 1 free. */
  cr_assert_eq(fp4idx__cache_append(&c, 1, 13, &first, slots, &created), FP4IDX_EFULL);
  cr_assert_eq(fp4idx__cache_find(&c, 1)->n_keys, 20);
  cr_assert_eq(fp4idx__cache_find(&c, 1)->n_pages, 3);
  /* A new sequence that does not fit is not created. */
  cr_assert_eq(fp4idx__cache_append(&c, 2, 9, &first, slots, &created), FP4IDX_EFULL);
  cr_assert_null(fp4idx__cache_find(&c, 2));
  cr_assert_eq(c.n_free, free_before);
  cr_assert_eq(c.n_keys, keys_before);
  cr_assert_eq(c.n_seqs, 1);
  /* Filling the partial page needs no new page, even with the pool nearly full. */
  cr_assert_eq(fp4idx__cache_append(&c, 1, 4, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(c.n_free, free_before);
  /* Exactly the rest fits. */
  cr_assert_eq(fp4idx__cache_append(&c, 2, 8, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(c.n_free, 0);
  cr_assert_eq(fp4idx__cache_append(&c, 3, 1, &first, slots, &created), FP4IDX_EFULL);
  check_invariants(&c);
  fp4idx__cache_destroy(&c);
}

Test(cache, truncate_frees_whole_pages_only) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 16, 8), FP4IDX_OK);
  int64_t first, slots[64];
  int created;
  cr_assert_eq(fp4idx__cache_append(&c, 5, 30, &first, slots, &created), FP4IDX_OK); /* 4 pages */
  cr_assert_eq(c.n_free, 12);
  cr_assert_eq(fp4idx__cache_truncate(&c, 5, 31), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx__cache_truncate(&c, 5, -1), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx__cache_truncate(&c, 6, 0), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx__cache_truncate(&c, 5, 30), FP4IDX_OK);
  cr_assert_eq(c.n_free, 12);
  cr_assert_eq(fp4idx__cache_truncate(&c, 5, 17), FP4IDX_OK); /* 3 pages */
  cr_assert_eq(c.n_free, 13);
  cr_assert_eq(fp4idx__cache_truncate(&c, 5, 16), FP4IDX_OK); /* 2 pages */
  cr_assert_eq(c.n_free, 14);
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&c, 5);
  cr_assert_eq(s->n_keys, 16);
  cr_assert_eq(c.n_keys, 16);
  /* Appending after a truncate continues at the new length. */
  cr_assert_eq(fp4idx__cache_append(&c, 5, 1, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(first, 16);
  cr_assert_eq(fp4idx__cache_truncate(&c, 5, 0), FP4IDX_OK);
  cr_assert_eq(c.n_free, 16);
  cr_assert_not_null(fp4idx__cache_find(&c, 5)); /* still known, empty */
  cr_assert_eq(c.n_seqs, 1);
  check_invariants(&c);
  fp4idx__cache_destroy(&c);
}

Test(cache, drop_frees_all_and_pages_are_reused) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 6, 4), FP4IDX_OK);
  int64_t first, slots[32];
  int created;
  cr_assert_eq(fp4idx__cache_append(&c, 1, 8, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(fp4idx__cache_append(&c, 2, 16, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(c.n_free, 0);
  int32_t dropped[2];
  for (int i = 0; i < 2; i++) dropped[i] = fp4idx__cache_page(fp4idx__cache_find(&c, 1), i);
  cr_assert_eq(fp4idx__cache_drop(&c, 1), FP4IDX_OK);
  cr_assert_eq(fp4idx__cache_drop(&c, 1), FP4IDX_ENOSEQ);
  cr_assert_null(fp4idx__cache_find(&c, 1));
  cr_assert_eq(c.n_free, 2);
  cr_assert_eq(c.n_seqs, 1);
  cr_assert_eq(c.n_keys, 16);
  cr_assert_eq(fp4idx__cache_append(&c, 3, 8, &first, slots, &created), FP4IDX_OK);
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&c, 3);
  int hits = 0;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) hits += fp4idx__cache_page(s, i) == dropped[j];
  cr_assert_eq(hits, 2, "the dropped pages are reused");
  check_invariants(&c);
  fp4idx__cache_destroy(&c);
}

Test(cache, append_undo_restores_the_state) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 10, 4), FP4IDX_OK);
  int64_t first, slots[32];
  int created;
  cr_assert_eq(fp4idx__cache_append(&c, 1, 3, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(fp4idx__cache_append(&c, 1, 9, &first, slots, &created), FP4IDX_OK);
  fp4idx__cache_append_undo(&c, 1, 3, created);
  cr_assert_eq(fp4idx__cache_find(&c, 1)->n_keys, 3);
  cr_assert_eq(c.n_free, 9);
  cr_assert_eq(fp4idx__cache_append(&c, 2, 5, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(created, 1);
  fp4idx__cache_append_undo(&c, 2, 0, created);
  cr_assert_null(fp4idx__cache_find(&c, 2));
  cr_assert_eq(c.n_free, 9);
  cr_assert_eq(c.n_keys, 3);
  check_invariants(&c);
  fp4idx__cache_destroy(&c);
}

/* Random operations against a plain model (table growth, backward-shift
 * deletion, free list). */
Test(cache, random_ops_match_a_model) {
  enum { NSEQ = 300, PAGES = 2000, P = 8 };
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, PAGES, P), FP4IDX_OK);
  int64_t model[NSEQ];
  int known[NSEQ];
  memset(model, 0, sizeof model);
  memset(known, 0, sizeof known);
  uint64_t x = 12345;
  int64_t *slots = malloc(64 * sizeof *slots);
  for (int it = 0; it < 20000; it++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    int k = (int)((x >> 33) % NSEQ);
    uint64_t id = (uint64_t)k * 0x9E3779B97F4A7C15ULL; /* spread ids */
    int op = (int)((x >> 20) % 10);
    int64_t first;
    int created;
    if (op < 6) {
      int64_t n = 1 + (int64_t)((x >> 40) % 40);
      int64_t used = 0;
      for (int i = 0; i < NSEQ; i++) used += known[i] ? (model[i] + P - 1) / P : 0;
      int64_t need = (model[k] + n + P - 1) / P - (model[k] + P - 1) / P;
      int rc = fp4idx__cache_append(&c, id, n, &first, slots, &created);
      if (need > PAGES - used) {
        cr_assert_eq(rc, FP4IDX_EFULL);
      } else {
        cr_assert_eq(rc, FP4IDX_OK);
        cr_assert_eq(first, model[k]);
        cr_assert_eq(created, !known[k]);
        known[k] = 1;
        model[k] += n;
      }
    } else if (op < 8) {
      int64_t len = known[k] ? (int64_t)((x >> 40) % (uint64_t)(model[k] + 1)) : 0;
      int rc = fp4idx__cache_truncate(&c, id, len);
      cr_assert_eq(rc, known[k] ? FP4IDX_OK : FP4IDX_ENOSEQ);
      if (known[k]) model[k] = len;
    } else {
      int rc = fp4idx__cache_drop(&c, id);
      cr_assert_eq(rc, known[k] ? FP4IDX_OK : FP4IDX_ENOSEQ);
      known[k] = 0;
      model[k] = 0;
    }
    if (it % 1000 == 0) check_invariants(&c);
  }
  int64_t keys = 0;
  uint64_t seqs = 0;
  for (int i = 0; i < NSEQ; i++) {
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(&c, (uint64_t)i * 0x9E3779B97F4A7C15ULL);
    cr_assert_eq(s != NULL, known[i] != 0);
    if (s) cr_assert_eq(s->n_keys, model[i]);
    keys += model[i];
    seqs += (uint64_t)known[i];
  }
  cr_assert_eq(c.n_keys, keys);
  cr_assert_eq(c.n_seqs, seqs);
  check_invariants(&c);
  fp4idx__cache_clear(&c);
  cr_assert_eq(c.n_free, PAGES);
  cr_assert_eq(c.n_seqs, 0);
  free(slots);
  fp4idx__cache_destroy(&c);
}

Test(cache, adopt_claims_given_pages) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 10, 4), FP4IDX_OK);
  int32_t pages[3] = {7, 2, 9};
  cr_assert_eq(fp4idx__cache_adopt(&c, 42, 10, pages, 3), FP4IDX_OK);
  cr_assert_eq(c.n_free, 7);
  cr_assert_eq(fp4idx__cache_find(&c, 42)->n_keys, 10);
  cr_assert_eq(fp4idx__cache_adopt(&c, 42, 1, (int32_t[]){0}, 1), FP4IDX_EEXIST);
  cr_assert_eq(fp4idx__cache_adopt(&c, 43, 5, (int32_t[]){0}, 1), FP4IDX_EINVAL); /* count */
  cr_assert_eq(fp4idx__cache_adopt(&c, 43, 5, (int32_t[]){0, 0}, 2), FP4IDX_EINVAL); /* twice */
  cr_assert_eq(fp4idx__cache_adopt(&c, 43, 1, (int32_t[]){10}, 1), FP4IDX_EINVAL); /* range */
  cr_assert_eq(c.n_free, 7);
  cr_assert_null(fp4idx__cache_find(&c, 43));
  int64_t first, slots[8];
  int created;
  /* Appending continues on the adopted sequence's partial last page. */
  cr_assert_eq(fp4idx__cache_append(&c, 42, 2, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(first, 10);
  cr_assert_eq(slots[0], 9 * 4 + 2);
  check_invariants(&c);
  /* A page an adopted sequence holds is shared by the next one (a snapshot
   * restoring a fork); it is freed when both have let go. */
  cr_assert_eq(fp4idx__cache_adopt(&c, 43, 4, (int32_t[]){7}, 1), FP4IDX_OK);
  cr_assert_eq(c.n_free, 7);
  cr_assert_eq(fp4idx__cache_shared_pages(&c), 1);
  cr_assert_eq(fp4idx__cache_seq_shared(&c, fp4idx__cache_find(&c, 43)), 1);
  cr_assert_eq(fp4idx__cache_seq_shared(&c, fp4idx__cache_find(&c, 42)), 1);
  cr_assert_eq(fp4idx__cache_drop(&c, 42), FP4IDX_OK);
  cr_assert_eq(c.n_free, 9);
  cr_assert_eq(fp4idx__cache_shared_pages(&c), 0);
  cr_assert_eq(fp4idx__cache_drop(&c, 43), FP4IDX_OK);
  cr_assert_eq(c.n_free, 10);
  fp4idx__cache_destroy(&c);
}

/* ---- scan (the "list" op's cursor) ------------------------------------------- */

#define SCAN_IDS 40000u

typedef struct scan_seen_s {
  unsigned char *seen; /* [SCAN_IDS * 4] times each id came */
  uint64_t step;       /* sequences in this step */
} scan_seen_t;

static int scan_cb(const fp4idx_cache_seq_t *s, void *arg) {
  scan_seen_t *x = arg;
  cr_assert_lt(s->id, SCAN_IDS * 4);
  if (x->seen[s->id] < 255) x->seen[s->id]++;
  x->step++;
  return 0;
}

static void add_seq(fp4idx_cache_t *c, uint64_t id) {
  int64_t first;
  int created;
  cr_assert_eq(fp4idx__cache_append(c, id, 1, &first, NULL, &created), FP4IDX_OK);
}

Test(cache, scan_returns_each_sequence_once_in_bounded_steps) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 4000, 1), FP4IDX_OK);
  for (uint64_t id = 0; id < 3000; id++) add_seq(&c, id * 3 + 1);
  scan_seen_t x = {calloc(SCAN_IDS * 4, 1), 0};
  uint64_t cursor = 0, steps = 0;
  do {
    x.step = 0;
    cr_assert_eq(fp4idx__cache_scan(&c, cursor, 10, scan_cb, &x, &cursor), FP4IDX_OK);
    cr_assert_leq(x.step, 10 + 8, "a step returned %llu", (unsigned long long)x.step);
    steps++;
  } while (cursor != 0);
  for (uint64_t id = 0; id < 3000; id++)
    cr_assert_eq(x.seen[id * 3 + 1], 1, "id %llu seen %d times",
                 (unsigned long long)(id * 3 + 1), x.seen[id * 3 + 1]);
  cr_assert_geq(steps, 3000 / 18, "bounded steps: %llu", (unsigned long long)steps);
  /* emptied (the table keeps its size): nothing comes, and a step looks at
   * no more than 10 * count buckets, so it takes table_cap / 100 steps */
  fp4idx__cache_clear(&c);
  x.step = 0;
  steps = 0;
  do {
    cr_assert_eq(fp4idx__cache_scan(&c, cursor, 10, scan_cb, &x, &cursor), FP4IDX_OK);
    steps++;
  } while (cursor != 0);
  cr_assert_eq(x.step, 0u);
  cr_assert_eq(steps, c.table_cap / 100 + (c.table_cap % 100 != 0));
  cr_assert_eq(fp4idx__cache_scan(&c, 0, 10, NULL, &x, &cursor), FP4IDX_EINVAL);
  free(x.seen);
  fp4idx__cache_destroy(&c);
}

/* Inserts (growing the table several times) and drops between the steps:
 * every sequence present for the whole scan still comes at least once. */
Test(cache, scan_is_stable_under_inserts_drops_and_growth) {
  fp4idx_cache_t c;
  cr_assert_eq(fp4idx__cache_init(&c, 60000, 1), FP4IDX_OK);
  /* stable: ids 4k (never dropped); volatile: 4k+1 (dropped while scanning) */
  for (uint64_t k = 0; k < 2000; k++) {
    add_seq(&c, 4 * k);
    add_seq(&c, 4 * k + 1);
  }
  scan_seen_t x = {calloc(SCAN_IDS * 4, 1), 0};
  uint64_t cursor = 0, next_new = 0, next_drop = 0;
  do {
    cr_assert_eq(fp4idx__cache_scan(&c, cursor, 5, scan_cb, &x, &cursor), FP4IDX_OK);
    /* new ids 4k+2 (up to SCAN_IDS of them: the table doubles several times) */
    for (int i = 0; i < 40 && next_new < SCAN_IDS / 2; i++, next_new++)
      add_seq(&c, 4 * next_new + 2);
    if (next_drop < 2000)
      cr_assert_eq(fp4idx__cache_drop(&c, 4 * next_drop++ + 1), FP4IDX_OK);
  } while (cursor != 0);
  cr_assert_gt(c.table_cap, 8192u, "the table grew during the scan");
  for (uint64_t k = 0; k < 2000; k++)
    cr_assert_geq(x.seen[4 * k], 1, "stable id %llu missed", (unsigned long long)(4 * k));
  free(x.seen);
  fp4idx__cache_destroy(&c);
}
