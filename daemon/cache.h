/* cache.h -- the page pool's bookkeeping and the sequence table (the
 * sequences of protocol/PROTOCOL.md, "Semantics").
 *
 * Pure C, no backend: the cache decides which slots a sequence's keys live
 * in; the backend holds the bytes. A free list (a stack, so a dropped page is
 * the next one handed out) and a hash map seq id (uint64) -> {page list, key
 * count}. Position l of a sequence is at slot page(l / P) * P + l % P.
 *
 * Prefix sharing (fork, protocol/PROTOCOL.md). A page list is cut into
 * chunks of FP4IDX_CACHE_CHUNK page ids, and chunks are shared: a fork holds
 * the first chunks of its source, so it costs O(pages / CHUNK) whatever the
 * prefix length, and copies no key. Each holder uses a prefix of a chunk
 * (use[u] counts the holders using its first u entries); a chunk lists
 * exactly as many entries as its largest user, and drops the rest when that
 * user shrinks or leaves. refs[page] counts the chunks that list the page;
 * it goes back on the free list at 0, i.e. exactly when the last sequence
 * that sees it lets go (truncate, drop).
 *
 * Keys are written only at a sequence's end, so the one page that can be
 * written while others see it is a partly filled last page: the first append
 * into it copies it to a fresh page (copy-on-write, through the copy callback
 * the daemon points at the backend's copy_pages). A chunk entry that others
 * see is never changed: a holder about to change one (that copy, or adding
 * entries past another holder's) first takes a private copy of the chunk.
 *
 * Not thread-safe: the daemon touches it only from its worker thread, in
 * request order, which is what makes every acknowledged append visible to the
 * next score.
 */
#ifndef FP4IDX_DAEMON_CACHE_H
#define FP4IDX_DAEMON_CACHE_H

#include <stdint.h>

/* Page ids per chunk of a page list (the unit forks share). Tests build
 * the cache with tiny chunks to reach every chunk boundary. */
#ifndef FP4IDX_CACHE_CHUNK
#define FP4IDX_CACHE_CHUNK 256
#endif

/* Sized to what it lists (a one-page sequence costs ~40 bytes, not 2 KiB),
 * grown by doubling while one sequence holds it. */
typedef struct fp4idx_cache_chunk_s {
  uint32_t rc;      /* sequences holding the chunk */
  int32_t n;        /* entries listed = largest use */
  int32_t cap;      /* room for page ids, <= FP4IDX_CACHE_CHUNK */
  uint64_t mark;    /* scratch for walks (shared_pages) */
  int32_t pages[];  /* [cap] page ids, then uint32_t use[cap + 1]: use[u] =
                       holders using the first u entries */
} fp4idx_cache_chunk_t;

typedef struct fp4idx_cache_seq_s {
  uint64_t id;
  int64_t n_keys;      /* keys held */
  int64_t n_pages;     /* = ceil(n_keys / P) */
  fp4idx_cache_chunk_t **chunks; /* [ceil(n_pages / CHUNK)]; page i is
                                    chunks[i / CHUNK]->pages[i % CHUNK] */
  int64_t cap_chunks;
  int32_t *flat;       /* the page list in one array (fp4idx__cache_pages),  */
  int64_t flat_ok;     /* valid for [0, flat_ok)                              */
  int64_t flat_cap;
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
  int64_t n_keys;         /* keys over all sequences (shared keys once per holder) */
  uint32_t *refs;         /* [n_pages]; chunks listing each page, 0 = free */
  int64_t n_multi;        /* pages listed by two chunks or more */
  uint64_t mark;          /* last walk's mark */
  int forked;             /* a fork happened (chunks may be shared) */
  /* Copies pool page `from` to page `to` (copy-on-write); set with
   * fp4idx__cache_set_copy. Returns FP4IDX_OK or a negative status. */
  int (*copy_page)(void *ctx, int32_t from, int32_t to);
  void *copy_ctx;
  /* The copy-on-write of the last append, for append_undo: sequence, page
   * index, the page it replaced and the copy. */
  int cow_valid;
  uint64_t cow_seq;
  int64_t cow_index;
  int32_t cow_old, cow_new;
  /* Told about every change of a sequence's page list (see
   * fp4idx__cache_set_pages_hook); NULL: nobody listens. */
  void (*pages_hook)(void *arg, uint64_t id, const int32_t *pages, int64_t n_pages,
                     int64_t first);
  void *pages_hook_arg;
} fp4idx_cache_t;

/* Largest key count of one sequence: positions travel as int32. */
#define FP4IDX_CACHE_MAX_KEYS ((int64_t)INT32_MAX)

/* Page i (0 <= i < s->n_pages) of a sequence. */
static inline int32_t fp4idx__cache_page(const fp4idx_cache_seq_t *s, int64_t i) {
  return s->chunks[i / FP4IDX_CACHE_CHUNK]->pages[i % FP4IDX_CACHE_CHUNK];
}

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

/* The page list of sequence s in one array of s->n_pages ids (what a backend
 * score takes), valid until the cache changes. Kept between calls, so a
 * sequence that only grew costs its new pages. Sets *pages (NULL for an empty
 * sequence). Returns FP4IDX_OK, FP4IDX_EINVAL, FP4IDX_ENOMEM. */
int fp4idx__cache_pages(fp4idx_cache_t *c, const fp4idx_cache_seq_t *s,
                        const int32_t **pages);

/* Reserves n >= 1 new positions at the end of sequence `id` (created when
 * unknown) and writes their slots to slots[0..n) (slots may be NULL).
 * *first = the first new position, *created = 1 when the sequence was made
 * now. When the last page is partly filled and another sequence sees it, it
 * is first copied to a fresh page (one more page needed) through the copy
 * callback. All-or-nothing: FP4IDX_EFULL (not enough free pages),
 * FP4IDX_ERANGE (sequence would exceed FP4IDX_CACHE_MAX_KEYS), FP4IDX_EINVAL
 * (also: a copy is needed and no callback is set), FP4IDX_ENOMEM, or the
 * callback's error leave the cache exactly as it was. */
int fp4idx__cache_append(fp4idx_cache_t *c, uint64_t id, int64_t n,
                         int64_t *first, int64_t *slots, int *created);

/* Undoes the last append of `id` when the backend could not store the keys:
 * truncates back to old_len and drops the sequence if `created`; a page the
 * append copied-on-write is given back and the shared one put back (the
 * sequence may keep a private copy of a chunk: same pages, same holders). */
void fp4idx__cache_append_undo(fp4idx_cache_t *c, uint64_t id, int64_t old_len,
                               int created);

/* Keeps the first `len` keys of `id`, letting go of whole pages past them
 * (a page is freed when the last sequence that sees it lets go). Never
 * allocates. FP4IDX_ENOSEQ, FP4IDX_ERANGE (len < 0 or len > keys held). */
int fp4idx__cache_truncate(fp4idx_cache_t *c, uint64_t id, int64_t len);

/* Removes sequence `id` and lets go of all its pages. FP4IDX_ENOSEQ. */
int fp4idx__cache_drop(fp4idx_cache_t *c, uint64_t id);

/* Makes the new sequence `dst` the first `length` keys of `src` without
 * copying a key or a page: dst holds src's first ceil(length / P / CHUNK)
 * chunks. Appends to either side later never show in the other. Needs no
 * free page, so a full pool does not stop a fork. O(length / (P * CHUNK))
 * host work, no device work.
 * Returns FP4IDX_OK; FP4IDX_ENOSEQ (src unknown), FP4IDX_EEXIST (dst known,
 * dst == src included), FP4IDX_ERANGE (length < 0 or > src's keys),
 * FP4IDX_EINVAL, FP4IDX_ENOMEM; nothing changes on error. */
int fp4idx__cache_fork(fp4idx_cache_t *c, uint64_t src, uint64_t dst, int64_t length);

/* Pages of the pool that two sequences or more see (each counted once).
 * O(shared chunks * CHUNK). */
int64_t fp4idx__cache_shared_pages(fp4idx_cache_t *c);

/* Pages of s that another sequence sees too. O(s->n_pages). */
int64_t fp4idx__cache_seq_shared(const fp4idx_cache_t *c, const fp4idx_cache_seq_t *s);

/* Pages in use (each counted once however many sequences see it). */
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
 * snapshot): every page must be in range and listed once, and there must be
 * exactly ceil(n_keys / P) of them. A page that an earlier adopted sequence
 * holds is shared (seen by both), which is how a snapshot restores forks.
 * FP4IDX_EEXIST (id known), FP4IDX_EINVAL, FP4IDX_ENOMEM; nothing changes on
 * error. */
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
