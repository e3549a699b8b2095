/* cache.h -- the page pool's bookkeeping and the sequence table (DESIGN s4).
 *
 * Pure C, no backend: the cache decides which slots a sequence's keys live
 * in; the backend holds the bytes. A free list (a stack, so a dropped page is
 * the next one handed out) and a hash map seq id (uint64) -> {pages in
 * position order, key count}. Position l of a sequence is at slot
 * pages[l / P] * P + l % P.
 *
 * Not thread-safe: the daemon touches it only from its worker thread, in
 * request order, which is what makes every acknowledged append visible to the
 * next score.
 */
#ifndef FP4IDX_DAEMON_CACHE_H
#define FP4IDX_DAEMON_CACHE_H

#include <stdint.h>

typedef struct fp4idx_cache_seq_s {
  uint64_t id;
  int64_t n_keys;      /* keys held */
  int32_t *pages;      /* [n_pages] page ids in position order */
  int64_t n_pages;     /* = ceil(n_keys / P) */
  int64_t cap_pages;   /* allocated length of `pages` */
} fp4idx_cache_seq_t;

typedef struct fp4idx_cache_s {
  int32_t page_size;
  int64_t n_pages;        /* pool size in pages */
  int64_t n_free;         /* pages on the free list */
  int32_t *free_stack;    /* [n_pages]; free_stack[0..n_free) are free */
  int64_t *free_pos;      /* [n_pages]; index in free_stack or -1 if in use */
  fp4idx_cache_seq_t **table; /* open addressing, linear probing */
  uint64_t table_cap;     /* power of two */
  uint64_t n_seqs;
  int64_t n_keys;         /* keys over all sequences */
  /* Told about every change of a sequence's page list (see
   * fp4idx__cache_set_pages_hook); NULL: nobody listens. */
  void (*pages_hook)(void *arg, uint64_t id, const int32_t *pages, int64_t n_pages,
                     int64_t first);
  void *pages_hook_arg;
} fp4idx_cache_t;

/* Largest key count of one sequence: positions travel as int32. */
#define FP4IDX_CACHE_MAX_KEYS ((int64_t)INT32_MAX)

/* Makes an empty cache of n_pages pages (1..INT32_MAX) of page_size keys (a
 * power of two). Returns FP4IDX_OK, FP4IDX_EINVAL or FP4IDX_ENOMEM. */
int fp4idx__cache_init(fp4idx_cache_t *c, int64_t n_pages, int32_t page_size);

/* Frees everything the cache holds (not the struct itself). */
void fp4idx__cache_destroy(fp4idx_cache_t *c);

/* Returns the sequence or NULL when unknown. */
const fp4idx_cache_seq_t *fp4idx__cache_find(const fp4idx_cache_t *c, uint64_t id);

/* Reserves n >= 1 new positions at the end of sequence `id` (created when
 * unknown) and writes their slots to slots[0..n) (slots may be NULL).
 * *first = the first new position, *created = 1 when the sequence was made
 * now. All-or-nothing: FP4IDX_EFULL (not enough free pages), FP4IDX_ERANGE
 * (sequence would exceed FP4IDX_CACHE_MAX_KEYS), FP4IDX_EINVAL, FP4IDX_ENOMEM
 * leave the cache exactly as it was. */
int fp4idx__cache_append(fp4idx_cache_t *c, uint64_t id, int64_t n,
                         int64_t *first, int64_t *slots, int *created);

/* Undoes the last append of `id` when the backend could not store the keys:
 * truncates back to old_len and drops the sequence if `created`. */
void fp4idx__cache_append_undo(fp4idx_cache_t *c, uint64_t id, int64_t old_len,
                               int created);

/* Keeps the first `len` keys of `id`, freeing whole pages past them.
 * FP4IDX_ENOSEQ, FP4IDX_ERANGE (len < 0 or len > keys held). */
int fp4idx__cache_truncate(fp4idx_cache_t *c, uint64_t id, int64_t len);

/* Removes sequence `id` and frees all its pages. FP4IDX_ENOSEQ. */
int fp4idx__cache_drop(fp4idx_cache_t *c, uint64_t id);

/* Slots of positions [from, from+count) of a sequence into slots[]. */
void fp4idx__cache_slots(const fp4idx_cache_t *c, const fp4idx_cache_seq_t *s,
                         int64_t from, int64_t count, int64_t *slots);

/* Calls fn(seq, arg) for every sequence (in table order) until fn returns
 * non-zero, which is then returned. For snapshots. The callback must not
 * change the cache. */
int fp4idx__cache_foreach(const fp4idx_cache_t *c,
                          int (*fn)(const fp4idx_cache_seq_t *s, void *arg),
                          void *arg);

/* A SCAN-style step (Redis' dictScan) over the sequence table: calls
 * fn(seq, arg) for the sequences of the hash buckets visited from `cursor`
 * (0 starts a scan) and sets *next to the cursor of the next step (0: the
 * scan is complete). Bounded work: it stops after the bucket that brings it
 * to `count` sequences (so a few more may come, the collisions of that
 * bucket), or after 10 * count buckets. Buckets are visited in reverse-bit
 * order of their home index, so a scan that spans inserts, drops and table
 * growth returns every sequence present for its whole duration at least
 * once (once unless the table grew); sequences added or dropped meanwhile
 * may or may not come. fn must not change the cache; a non-zero return
 * stops the step and is returned (*next is then unchanged). Returns
 * FP4IDX_OK, FP4IDX_EINVAL or fn's value. */
int fp4idx__cache_scan(const fp4idx_cache_t *c, uint64_t cursor, uint64_t count,
                       int (*fn)(const fp4idx_cache_seq_t *s, void *arg), void *arg,
                       uint64_t *next);

/* Recreates sequence `id` with n_keys keys on the given pages (restoring a
 * snapshot): every page must be free and in range, and there must be exactly
 * ceil(n_keys / P) of them. FP4IDX_EEXIST (id known), FP4IDX_EINVAL,
 * FP4IDX_ENOMEM; nothing changes on error. */
int fp4idx__cache_adopt(fp4idx_cache_t *c, uint64_t id, int64_t n_keys,
                        const int32_t *pages, int64_t n_pages);

/* After every change of sequence `id`'s page list -- append, undo,
 * truncate, drop, adopt, clear -- calls fn(arg, id, pages, n_pages, first):
 * the list is now pages[0..n_pages) (n_pages 0: the sequence holds no page
 * or is gone), entries before `first` unchanged since the previous call.
 * The daemon forwards it to the backend's seq_pages_update (device-resident
 * page tables). Set after fp4idx__cache_init; fn NULL turns it off. */
void fp4idx__cache_set_pages_hook(fp4idx_cache_t *c,
                                  void (*fn)(void *arg, uint64_t id,
                                             const int32_t *pages, int64_t n_pages,
                                             int64_t first),
                                  void *arg);

/* Drops every sequence (all pages back on the free list). */
void fp4idx__cache_clear(fp4idx_cache_t *c);

#endif /* FP4IDX_DAEMON_CACHE_H */
