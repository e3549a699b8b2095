/* cache.c -- page free list + sequence table (see cache.h). */
#include "cache.h"

#include <stdlib.h>
#include <string.h>

#include "fp4idx_format.h"
#include "fp4idx_status.h"

/* The allocator, replaceable by tests that fail the N-th allocation
 * (tests/test_daemon_cache_oom.c). */
#ifndef FP4IDX_CACHE_MALLOC
#define FP4IDX_CACHE_MALLOC malloc
#define FP4IDX_CACHE_CALLOC calloc
#define FP4IDX_CACHE_REALLOC realloc
#endif

static uint64_t fp4idx__cache_hash(uint64_t x) {
  /* splitmix64 finalizer: sequence ids are often small consecutive numbers. */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/* Index of id's table entry, or of the empty entry where it would go. */
static uint64_t fp4idx__cache_probe(const fp4idx_cache_t *c, uint64_t id) {
  uint64_t mask = c->table_cap - 1, i = fp4idx__cache_hash(id) & mask;
  while (c->table[i] && c->table[i]->id != id) i = (i + 1) & mask;
  return i;
}

static int fp4idx__cache_grow_table(fp4idx_cache_t *c) {
  uint64_t cap = c->table_cap * 2;
  fp4idx_cache_seq_t **t = FP4IDX_CACHE_CALLOC(cap, sizeof *t);
  if (!t) return FP4IDX_ENOMEM;
  fp4idx_cache_seq_t **old = c->table;
  uint64_t old_cap = c->table_cap;
  c->table = t;
  c->table_cap = cap;
  for (uint64_t i = 0; i < old_cap; i++)
    if (old[i]) c->table[fp4idx__cache_probe(c, old[i]->id)] = old[i];
  free(old);
  return FP4IDX_OK;
}

/* Removes table entry i with backward-shift deletion (no tombstones). */
static void fp4idx__cache_table_remove(fp4idx_cache_t *c, uint64_t i) {
  uint64_t mask = c->table_cap - 1, j = i;
  c->table[i] = NULL;
  for (;;) {
    j = (j + 1) & mask;
    if (!c->table[j]) break;
    uint64_t home = fp4idx__cache_hash(c->table[j]->id) & mask;
    /* Move j back to the hole i unless its home lies cyclically in (i, j]. */
    int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      c->table[i] = c->table[j];
      c->table[j] = NULL;
      i = j;
    }
  }
  c->n_seqs--;
}

int fp4idx__cache_init(fp4idx_cache_t *c, int64_t n_pages, int32_t page_size) {
  if (!c) return FP4IDX_EINVAL;
  memset(c, 0, sizeof *c);
  if (n_pages < 1 || n_pages > INT32_MAX || !fp4idx_page_size_valid(page_size))
    return FP4IDX_EINVAL;
  c->page_size = page_size;
  c->n_pages = n_pages;
  c->free_stack = FP4IDX_CACHE_MALLOC((size_t)n_pages * sizeof *c->free_stack);
  c->free_pos = FP4IDX_CACHE_MALLOC((size_t)n_pages * sizeof *c->free_pos);
  c->table_cap = 64;
  c->table = FP4IDX_CACHE_CALLOC(c->table_cap, sizeof *c->table);
  if (!c->free_stack || !c->free_pos || !c->table) goto err;
  /* Top of the stack is page 0, so a fresh pool hands out 0, 1, 2, ... */
  for (int64_t i = 0; i < n_pages; i++) {
    c->free_stack[i] = (int32_t)(n_pages - 1 - i);
    c->free_pos[n_pages - 1 - i] = i;
  }
  c->n_free = n_pages;
  return FP4IDX_OK;
err:
  fp4idx__cache_destroy(c);
  return FP4IDX_ENOMEM;
}

static void fp4idx__cache_seq_free(fp4idx_cache_seq_t *s) {
  if (s) free(s->pages);
  free(s);
}

void fp4idx__cache_destroy(fp4idx_cache_t *c) {
  if (!c) return;
  if (c->table)
    for (uint64_t i = 0; i < c->table_cap; i++) fp4idx__cache_seq_free(c->table[i]);
  free(c->table);
  free(c->free_stack);
  free(c->free_pos);
  memset(c, 0, sizeof *c);
}

const fp4idx_cache_seq_t *fp4idx__cache_find(const fp4idx_cache_t *c, uint64_t id) {
  if (!c || !c->table) return NULL;
  return c->table[fp4idx__cache_probe(c, id)];
}

static int32_t fp4idx__cache_page_pop(fp4idx_cache_t *c) {
  int32_t p = c->free_stack[--c->n_free];
  c->free_pos[p] = -1;
  return p;
}

static void fp4idx__cache_page_push(fp4idx_cache_t *c, int32_t p) {
  c->free_pos[p] = c->n_free;
  c->free_stack[c->n_free++] = p;
}

static int64_t fp4idx__cache_pages_for(const fp4idx_cache_t *c, int64_t keys) {
  return (keys + c->page_size - 1) / c->page_size;
}

static int fp4idx__cache_reserve_pages(fp4idx_cache_seq_t *s, int64_t need) {
  if (need <= s->cap_pages) return FP4IDX_OK;
  int64_t cap = s->cap_pages ? s->cap_pages : 4;
  while (cap < need) cap *= 2;
  int32_t *p = FP4IDX_CACHE_REALLOC(s->pages, (size_t)cap * sizeof *p);
  if (!p) return FP4IDX_ENOMEM;
  s->pages = p;
  s->cap_pages = cap;
  return FP4IDX_OK;
}

/* Finds or inserts sequence id (empty). *created tells which. */
static int fp4idx__cache_get_or_create(fp4idx_cache_t *c, uint64_t id,
                                       fp4idx_cache_seq_t **out, int *created) {
  uint64_t i = fp4idx__cache_probe(c, id);
  *created = 0;
  if (c->table[i]) {
    *out = c->table[i];
    return FP4IDX_OK;
  }
  /* Keep the load factor at or below 1/2 so probes stay short. */
  if ((c->n_seqs + 1) * 2 > c->table_cap) {
    int rc = fp4idx__cache_grow_table(c);
    if (rc) return rc;
    i = fp4idx__cache_probe(c, id);
  }
  fp4idx_cache_seq_t *s = FP4IDX_CACHE_CALLOC(1, sizeof *s);
  if (!s) return FP4IDX_ENOMEM;
  s->id = id;
  c->table[i] = s;
  c->n_seqs++;
  *out = s;
  *created = 1;
  return FP4IDX_OK;
}

void fp4idx__cache_set_pages_hook(fp4idx_cache_t *c,
                                  void (*fn)(void *arg, uint64_t id,
                                             const int32_t *pages, int64_t n_pages,
                                             int64_t first),
                                  void *arg) {
  c->pages_hook = fn;
  c->pages_hook_arg = arg;
}

static void fp4idx__cache_tell(const fp4idx_cache_t *c, uint64_t id,
                               const fp4idx_cache_seq_t *s, int64_t first) {
  if (!c->pages_hook) return;
  int64_t n = s ? s->n_pages : 0;
  c->pages_hook(c->pages_hook_arg, id, s ? s->pages : NULL, n, first < n ? first : n);
}

void fp4idx__cache_slots(const fp4idx_cache_t *c, const fp4idx_cache_seq_t *s,
                         int64_t from, int64_t count, int64_t *slots) {
  int64_t P = c->page_size;
  for (int64_t i = 0; i < count; i++) {
    int64_t l = from + i;
    slots[i] = (int64_t)s->pages[l / P] * P + l % P;
  }
}

int fp4idx__cache_append(fp4idx_cache_t *c, uint64_t id, int64_t n,
                         int64_t *first, int64_t *slots, int *created) {
  if (!c || !c->table || n < 1 || !first || !created) return FP4IDX_EINVAL;
  *created = 0;
  const fp4idx_cache_seq_t *known = fp4idx__cache_find(c, id);
  int64_t have = known ? known->n_keys : 0;
  if (n > FP4IDX_CACHE_MAX_KEYS - have) return FP4IDX_ERANGE;
  int64_t need = fp4idx__cache_pages_for(c, have + n);
  int64_t old_pages = known ? known->n_pages : 0;
  /* Check the pool before touching anything: EFULL changes nothing. */
  if (need - old_pages > c->n_free) return FP4IDX_EFULL;
  fp4idx_cache_seq_t *s;
  int rc = fp4idx__cache_get_or_create(c, id, &s, created);
  if (rc) return rc;
  rc = fp4idx__cache_reserve_pages(s, need);
  if (rc) {
    if (*created) fp4idx__cache_table_remove(c, fp4idx__cache_probe(c, id)), free(s);
    *created = 0;
    return rc;
  }
  for (int64_t p = old_pages; p < need; p++) s->pages[p] = fp4idx__cache_page_pop(c);
  s->n_pages = need;
  s->n_keys = have + n;
  c->n_keys += n;
  *first = have;
  if (slots) fp4idx__cache_slots(c, s, have, n, slots);
  fp4idx__cache_tell(c, id, s, old_pages);
  return FP4IDX_OK;
}

static void fp4idx__cache_shrink(fp4idx_cache_t *c, fp4idx_cache_seq_t *s, int64_t len) {
  int64_t keep = fp4idx__cache_pages_for(c, len);
  /* Free in reverse so the page freed last (the sequence's first freed page)
   * is the next one handed out; order is not a contract. */
  for (int64_t p = s->n_pages - 1; p >= keep; p--) fp4idx__cache_page_push(c, s->pages[p]);
  s->n_pages = keep;
  c->n_keys -= s->n_keys - len;
  s->n_keys = len;
}

int fp4idx__cache_truncate(fp4idx_cache_t *c, uint64_t id, int64_t len) {
  if (!c || !c->table) return FP4IDX_EINVAL;
  fp4idx_cache_seq_t *s = c->table[fp4idx__cache_probe(c, id)];
  if (!s) return FP4IDX_ENOSEQ;
  if (len < 0 || len > s->n_keys) return FP4IDX_ERANGE;
  int64_t before = s->n_pages;
  fp4idx__cache_shrink(c, s, len);
  if (s->n_pages != before) fp4idx__cache_tell(c, id, s, s->n_pages);
  return FP4IDX_OK;
}

int fp4idx__cache_drop(fp4idx_cache_t *c, uint64_t id) {
  if (!c || !c->table) return FP4IDX_EINVAL;
  uint64_t i = fp4idx__cache_probe(c, id);
  fp4idx_cache_seq_t *s = c->table[i];
  if (!s) return FP4IDX_ENOSEQ;
  fp4idx__cache_shrink(c, s, 0);
  fp4idx__cache_table_remove(c, i);
  fp4idx__cache_seq_free(s);
  fp4idx__cache_tell(c, id, NULL, 0);
  return FP4IDX_OK;
}

void fp4idx__cache_append_undo(fp4idx_cache_t *c, uint64_t id, int64_t old_len,
                               int created) {
  if (created)
    (void)fp4idx__cache_drop(c, id);
  else
    (void)fp4idx__cache_truncate(c, id, old_len);
}

int fp4idx__cache_foreach(const fp4idx_cache_t *c,
                          int (*fn)(const fp4idx_cache_seq_t *s, void *arg),
                          void *arg) {
  if (!c || !c->table || !fn) return FP4IDX_EINVAL;
  for (uint64_t i = 0; i < c->table_cap; i++) {
    if (!c->table[i]) continue;
    int rc = fn(c->table[i], arg);
    if (rc) return rc;
  }
  return FP4IDX_OK;
}

/* Bit reversal of a 64-bit cursor (the scan increments the reversed value,
 * which is what keeps it valid when the table doubles). */
static uint64_t fp4idx__cache_rev(uint64_t v) {
  v = ((v >> 1) & 0x5555555555555555ULL) | ((v & 0x5555555555555555ULL) << 1);
  v = ((v >> 2) & 0x3333333333333333ULL) | ((v & 0x3333333333333333ULL) << 2);
  v = ((v >> 4) & 0x0F0F0F0F0F0F0F0FULL) | ((v & 0x0F0F0F0F0F0F0F0FULL) << 4);
  v = ((v >> 8) & 0x00FF00FF00FF00FFULL) | ((v & 0x00FF00FF00FF00FFULL) << 8);
  v = ((v >> 16) & 0x0000FFFF0000FFFFULL) | ((v & 0x0000FFFF0000FFFFULL) << 16);
  return (v >> 32) | (v << 32);
}

int fp4idx__cache_scan(const fp4idx_cache_t *c, uint64_t cursor, uint64_t count,
                       int (*fn)(const fp4idx_cache_seq_t *s, void *arg), void *arg,
                       uint64_t *next) {
  if (!c || !c->table || !fn || !next) return FP4IDX_EINVAL;
  if (count < 1) count = 1;
  uint64_t mask = c->table_cap - 1, v = cursor, emitted = 0;
  uint64_t budget = count > UINT64_MAX / 10 ? UINT64_MAX : count * 10;
  do {
    /* Linear probing keeps every entry whose home is h in the run of full
     * entries from h on: the bucket is that run, filtered by home. Entries
     * are reported by home, not by where they sit, so the shifts of a
     * backward-shift delete never move one across the cursor. */
    uint64_t h = v & mask;
    for (uint64_t i = h; c->table[i]; i = (i + 1) & mask) {
      if ((fp4idx__cache_hash(c->table[i]->id) & mask) != h) continue;
      int rc = fn(c->table[i], arg);
      if (rc) return rc;
      emitted++;
    }
    v |= ~mask;
    v = fp4idx__cache_rev(fp4idx__cache_rev(v) + 1);
  } while (v != 0 && emitted < count && --budget > 0);
  *next = v;
  return FP4IDX_OK;
}

int fp4idx__cache_adopt(fp4idx_cache_t *c, uint64_t id, int64_t n_keys,
                        const int32_t *pages, int64_t n_pages) {
  if (!c || !c->table || n_keys < 0 || n_keys > FP4IDX_CACHE_MAX_KEYS ||
      n_pages != fp4idx__cache_pages_for(c, n_keys) || (n_pages && !pages))
    return FP4IDX_EINVAL;
  if (fp4idx__cache_find(c, id)) return FP4IDX_EEXIST;
  for (int64_t i = 0; i < n_pages; i++) {
    if (pages[i] < 0 || pages[i] >= c->n_pages || c->free_pos[pages[i]] < 0)
      return FP4IDX_EINVAL;
    for (int64_t j = 0; j < i; j++)
      if (pages[j] == pages[i]) return FP4IDX_EINVAL; /* O(n^2), restore only */
  }
  fp4idx_cache_seq_t *s;
  int created;
  int rc = fp4idx__cache_get_or_create(c, id, &s, &created);
  if (rc) return rc;
  rc = fp4idx__cache_reserve_pages(s, n_pages);
  if (rc) {
    fp4idx__cache_table_remove(c, fp4idx__cache_probe(c, id));
    free(s);
    return rc;
  }
  for (int64_t i = 0; i < n_pages; i++) {
    /* Swap-remove the page from the free stack. */
    int32_t p = pages[i];
    int64_t at = c->free_pos[p];
    int32_t top = c->free_stack[c->n_free - 1];
    c->free_stack[at] = top;
    c->free_pos[top] = at;
    c->n_free--;
    c->free_pos[p] = -1;
    s->pages[i] = p;
  }
  s->n_pages = n_pages;
  s->n_keys = n_keys;
  c->n_keys += n_keys;
  fp4idx__cache_tell(c, id, s, 0);
  return FP4IDX_OK;
}

void fp4idx__cache_clear(fp4idx_cache_t *c) {
  if (!c || !c->table) return;
  for (uint64_t i = 0; i < c->table_cap; i++) {
    fp4idx_cache_seq_t *s = c->table[i];
    if (!s) continue;
    for (int64_t p = s->n_pages - 1; p >= 0; p--) fp4idx__cache_page_push(c, s->pages[p]);
    uint64_t id = s->id;
    fp4idx__cache_seq_free(s);
    c->table[i] = NULL;
    fp4idx__cache_tell(c, id, NULL, 0);
  }
  c->n_seqs = 0;
  c->n_keys = 0;
}
