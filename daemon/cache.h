/* cache.h -- the page pool's bookkeeping and the sequence table (DESIGN s4).
 *
 * Pure C, no backend: the cache decides which slots a sequence's keys live
 * in; the backend holds the bytes. A free list (a stack, so a dropped page is
 * the next one handed out) and a hash map seq id (uint64) -> {pages in
 * position order, key count}. Position l of a sequence is at slot
 * pages[l / P] * P + l % P.
 *
 * Prefix sharing (fork, protocol/PROTOCOL.md): a page may belong to several
 * sequences, always at the same index of each page list; refs[page] counts
 * its owners and a page goes back on the free list when the last one lets go
 * (truncate, drop). Keys are written only at a sequence's end, so the one
 * page that can be written while shared is a partly filled last page: the
 * first append into it copies it (copy-on-write, through the copy callback
 * the daemon points at the backend), which keeps every other owner's bytes.
 * Whole shared pages are never copied; fork itself copies no key.
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
  int64_t n_keys;         /* keys over all sequences (shared keys once per owner) */
  uint32_t *refs;         /* [n_pages]; owners of each page, 0 = free */
  int64_t n_shared;       /* pages with two owners or more */
  /* Copies pool page `from` to page `to` (copy-on-write); set with
   * fp4idx__cache_set_copy. Returns FP4IDX_OK or a negative status. */
  int (*copy_page)(void *ctx, int32_t from, int32_t to);
  void *copy_ctx;
  /* The copy-on-write of the last append, so append_undo can put the shared
   * page back: sequence, index in its page list, old and new page. */
  int cow_valid;
  uint64_t cow_seq;
  int64_t cow_index;
  int32_t cow_old, cow_new;
} fp4idx_cache_t;

/* Largest key count of one sequence: positions travel as int32. */
#define FP4IDX_CACHE_MAX_KEYS ((int64_t)INT32_MAX)

/* Makes an empty cache of n_pages pages (1..INT32_MAX) of page_size keys (a
 * power of two). Returns FP4IDX_OK, FP4IDX_EINVAL or FP4IDX_ENOMEM. */
int fp4idx__cache_init(fp4idx_cache_t *c, int64_t n_pages, int32_t page_size);

/* Sets the page copy used by copy-on-write appends (the daemon passes the
 * backend's copy_pages). Without one, an append that must copy a shared
 * page fails with FP4IDX_EINVAL and changes nothing. */
void fp4idx__cache_set_copy(fp4idx_cache_t *c,
                            int (*copy_page)(void *ctx, int32_t from, int32_t to),
                            void *ctx);

/* Frees everything the cache holds (not the struct itself). */
void fp4idx__cache_destroy(fp4idx_cache_t *c);

/* Returns the sequence or NULL when unknown. */
const fp4idx_cache_seq_t *fp4idx__cache_find(const fp4idx_cache_t *c, uint64_t id);

/* Reserves n >= 1 new positions at the end of sequence `id` (created when
 * unknown) and writes their slots to slots[0..n) (slots may be NULL).
 * *first = the first new position, *created = 1 when the sequence was made
 * now. When the last page is partly filled and shared, it is first copied to
 * a fresh page (one more page needed) through the copy callback.
 * All-or-nothing: FP4IDX_EFULL (not enough free pages), FP4IDX_ERANGE
 * (sequence would exceed FP4IDX_CACHE_MAX_KEYS), FP4IDX_EINVAL (also: a
 * copy is needed and no callback is set), FP4IDX_ENOMEM, or the callback's
 * error leave the cache exactly as it was. */
int fp4idx__cache_append(fp4idx_cache_t *c, uint64_t id, int64_t n,
                         int64_t *first, int64_t *slots, int *created);

/* Undoes the last append of `id` when the backend could not store the keys:
 * truncates back to old_len and drops the sequence if `created`; a page the
 * append copied-on-write is given back and the shared one put back. */
void fp4idx__cache_append_undo(fp4idx_cache_t *c, uint64_t id, int64_t old_len,
                               int created);

/* Keeps the first `len` keys of `id`, letting go of whole pages past them
 * (a page is freed when its last owner lets go).
 * FP4IDX_ENOSEQ, FP4IDX_ERANGE (len < 0 or len > keys held). */
int fp4idx__cache_truncate(fp4idx_cache_t *c, uint64_t id, int64_t len);

/* Removes sequence `id` and lets go of all its pages. FP4IDX_ENOSEQ. */
int fp4idx__cache_drop(fp4idx_cache_t *c, uint64_t id);

/* Makes the new sequence `dst` the first `length` keys of `src` without
 * copying a key: dst's page list is src's first ceil(length / P) pages, each
 * gaining an owner. Appends to either side later never show in the other
 * (copy-on-write of a shared, partly filled last page). Needs no free page,
 * so a full pool does not stop a fork. Costs O(ceil(length / P)) host work
 * (the page list and its owner counts), no device work.
 * Returns FP4IDX_OK; FP4IDX_ENOSEQ (src unknown), FP4IDX_EEXIST (dst known,
 * dst == src included), FP4IDX_ERANGE (length < 0 or > src's keys),
 * FP4IDX_EINVAL, FP4IDX_ENOMEM; nothing changes on error. */
int fp4idx__cache_fork(fp4idx_cache_t *c, uint64_t src, uint64_t dst, int64_t length);

/* Pages of s that other sequences hold too (refs >= 2). O(s->n_pages). */
int64_t fp4idx__cache_seq_shared(const fp4idx_cache_t *c, const fp4idx_cache_seq_t *s);

/* Pages in use (each counted once however many sequences hold it). */
static inline int64_t fp4idx__cache_used_pages(const fp4idx_cache_t *c) {
  return c->n_pages - c->n_free;
}

/* Slots of positions [from, from+count) of a sequence into slots[]. */
void fp4idx__cache_slots(const fp4idx_cache_t *c, const fp4idx_cache_seq_t *s,
                         int64_t from, int64_t count, int64_t *slots);

/* Calls fn(seq, arg) for every sequence (in table order) until fn returns
 * non-zero, which is then returned. For snapshots. The callback must not
 * change the cache. */
int fp4idx__cache_foreach(const fp4idx_cache_t *c,
                          int (*fn)(const fp4idx_cache_seq_t *s, void *arg),
                          void *arg);

/* Recreates sequence `id` with n_keys keys on the given pages (restoring a
 * snapshot): every page must be in range and listed once, and there must be
 * exactly ceil(n_keys / P) of them. A page that an earlier adopted sequence
 * holds is shared (it gains an owner), which is how a snapshot restores
 * forks. FP4IDX_EEXIST (id known), FP4IDX_EINVAL, FP4IDX_ENOMEM; nothing
 * changes on error. */
int fp4idx__cache_adopt(fp4idx_cache_t *c, uint64_t id, int64_t n_keys,
                        const int32_t *pages, int64_t n_pages);

/* Drops every sequence (all pages back on the free list). */
void fp4idx__cache_clear(fp4idx_cache_t *c);

#endif /* FP4IDX_DAEMON_CACHE_H */
