/* cache.c -- page free list, sequence table and the shared chunks of page
 * lists (see cache.h). */
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

#define CH FP4IDX_CACHE_CHUNK

int fp4idx__cache_init(fp4idx_cache_t *c, int64_t n_pages, int32_t page_size) {
  if (!c) return FP4IDX_EINVAL;
  memset(c, 0, sizeof *c);
  if (n_pages < 1 || n_pages > INT32_MAX || !fp4idx_page_size_valid(page_size))
    return FP4IDX_EINVAL;
  c->page_size = page_size;
  c->n_pages = n_pages;
  c->free_stack = FP4IDX_CACHE_MALLOC((size_t)n_pages * sizeof *c->free_stack);
  c->free_pos = FP4IDX_CACHE_MALLOC((size_t)n_pages * sizeof *c->free_pos);
  c->refs = FP4IDX_CACHE_CALLOC((size_t)n_pages, sizeof *c->refs);
  c->table_cap = 64;
  c->table = FP4IDX_CACHE_CALLOC(c->table_cap, sizeof *c->table);
  if (!c->free_stack || !c->free_pos || !c->refs || !c->table) goto err;
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

void fp4idx__cache_set_copy(fp4idx_cache_t *c,
                            int (*copy_page)(void *ctx, int32_t from, int32_t to),
                            void *ctx) {
  if (!c) return;
  c->copy_page = copy_page;
  c->copy_ctx = ctx;
}

/* ---- pages: free stack and owner counts ------------------------------------- */

/* Takes the top free page; the caller's chunk is its one lister. */
static int32_t fp4idx__cache_page_pop(fp4idx_cache_t *c) {
  int32_t p = c->free_stack[--c->n_free];
  c->free_pos[p] = -1;
  c->refs[p] = 1;
  return p;
}

static void fp4idx__cache_page_push(fp4idx_cache_t *c, int32_t p) {
  c->free_pos[p] = c->n_free;
  c->free_stack[c->n_free++] = p;
}

/* One more chunk lists used page p. */
static void fp4idx__cache_page_ref(fp4idx_cache_t *c, int32_t p) {
  c->n_multi += c->refs[p]++ == 1;
}

/* One chunk stops listing page p: freed when it was the last. */
static void fp4idx__cache_page_release(fp4idx_cache_t *c, int32_t p) {
  uint32_t left = --c->refs[p];
  if (left == 1) c->n_multi--;
  else if (left == 0) fp4idx__cache_page_push(c, p);
}

/* ---- chunks ------------------------------------------------------------------- */

static int64_t fp4idx__cache_pages_for(const fp4idx_cache_t *c, int64_t keys) {
  return (keys + c->page_size - 1) / c->page_size;
}

static int64_t fp4idx__cache_chunks_for(int64_t pages) { return (pages + CH - 1) / CH; }

/* Entries of chunk j that a sequence of np pages uses (1..CH). */
static int32_t fp4idx__cache_use(int64_t np, int64_t j) {
  int64_t u = np - j * CH;
  return u > CH ? CH : (int32_t)u;
}

/* The holder counts of chunk k (after its page ids). */
#define USE(k) ((uint32_t *)((k)->pages + (k)->cap))

static size_t fp4idx__cache_chunk_bytes(int32_t cap) {
  return sizeof(fp4idx_cache_chunk_t) + (size_t)cap * 4 + ((size_t)cap + 1) * 4;
}

static fp4idx_cache_chunk_t *fp4idx__cache_chunk_new(int32_t cap) {
  fp4idx_cache_chunk_t *k = FP4IDX_CACHE_CALLOC(1, fp4idx__cache_chunk_bytes(cap));
  if (k) k->cap = cap;
  return k;
}

/* Room for `need` entries in a chunk one sequence holds (its pointer
 * changes: the caller stores the result). NULL (k untouched) on ENOMEM. */
static fp4idx_cache_chunk_t *fp4idx__cache_chunk_grow(fp4idx_cache_chunk_t *k, int32_t need) {
  int32_t old = k->cap, cap = old * 2 > CH ? CH : old * 2;
  if (cap < need) cap = need;
  fp4idx_cache_chunk_t *g = FP4IDX_CACHE_REALLOC(k, fp4idx__cache_chunk_bytes(cap));
  if (!g) return NULL;
  uint32_t *use = (uint32_t *)(g->pages + cap);
  memmove(use, g->pages + old, ((size_t)old + 1) * 4);
  memset(use + old + 1, 0, (size_t)(cap - old) * 4);
  g->cap = cap;
  return g;
}

/* Drops the entries past the largest use (in reverse: the lowest freed page
 * ends on top of the free stack); frees the chunk once nobody holds it. */
static void fp4idx__cache_chunk_trim(fp4idx_cache_t *c, fp4idx_cache_chunk_t *k) {
  int32_t m = k->n;
  while (m > 0 && USE(k)[m] == 0) m--;
  for (int32_t e = k->n - 1; e >= m; e--) fp4idx__cache_page_release(c, k->pages[e]);
  k->n = m;
  if (k->rc == 0) free(k);
}

/* A holder using u entries now uses nu (0: leaves). */
static void fp4idx__cache_chunk_reuse(fp4idx_cache_t *c, fp4idx_cache_chunk_t *k, int32_t u,
                                      int32_t nu) {
  USE(k)[u]--;
  if (nu) USE(k)[nu]++;
  else k->rc--;
  fp4idx__cache_chunk_trim(c, k);
}

/* ---- sequences ------------------------------------------------------------------ */

static void fp4idx__cache_seq_free(fp4idx_cache_seq_t *s) {
  if (s) {
    free(s->chunks);
    free(s->flat);
  }
  free(s);
}

/* Shrinks s to len keys, letting go of whole pages past them. Allocates
 * nothing. */
static void fp4idx__cache_shrink(fp4idx_cache_t *c, fp4idx_cache_seq_t *s, int64_t len) {
  int64_t keep = fp4idx__cache_pages_for(c, len);
  int64_t old_ch = fp4idx__cache_chunks_for(s->n_pages), new_ch = fp4idx__cache_chunks_for(keep);
  for (int64_t j = old_ch - 1; j >= new_ch; j--)
    fp4idx__cache_chunk_reuse(c, s->chunks[j], fp4idx__cache_use(s->n_pages, j), 0);
  if (new_ch > 0) {
    int32_t u = fp4idx__cache_use(s->n_pages, new_ch - 1), nu = fp4idx__cache_use(keep, new_ch - 1);
    if (nu != u) fp4idx__cache_chunk_reuse(c, s->chunks[new_ch - 1], u, nu);
  }
  if (s->flat_ok > keep) s->flat_ok = keep;
  s->n_pages = keep;
  c->n_keys -= s->n_keys - len;
  s->n_keys = len;
}

void fp4idx__cache_destroy(fp4idx_cache_t *c) {
  if (!c) return;
  if (c->table)
    for (uint64_t i = 0; i < c->table_cap; i++) {
      if (!c->table[i]) continue;
      fp4idx__cache_shrink(c, c->table[i], 0); /* frees the chunks */
      fp4idx__cache_seq_free(c->table[i]);
    }
  free(c->table);
  free(c->free_stack);
  free(c->free_pos);
  free(c->refs);
  memset(c, 0, sizeof *c);
}

const fp4idx_cache_seq_t *fp4idx__cache_find(const fp4idx_cache_t *c, uint64_t id) {
  if (!c || !c->table) return NULL;
  return c->table[fp4idx__cache_probe(c, id)];
}

static int fp4idx__cache_reserve_chunks(fp4idx_cache_seq_t *s, int64_t need) {
  if (need <= s->cap_chunks) return FP4IDX_OK;
  int64_t cap = s->cap_chunks ? s->cap_chunks : 4;
  while (cap < need) cap *= 2;
  fp4idx_cache_chunk_t **p = FP4IDX_CACHE_REALLOC(s->chunks, (size_t)cap * sizeof *p);
  if (!p) return FP4IDX_ENOMEM;
  s->chunks = p;
  s->cap_chunks = cap;
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

/* Tells the hook that s (NULL: gone) changed from page `first` on. The flat
 * list is what the hook reads; if it cannot be built (ENOMEM) the hook is
 * told the sequence is gone, which only costs the device copy (the backend
 * uploads the list again: fp4idx_backend.h seq_pages_update). */
static void fp4idx__cache_tell(fp4idx_cache_t *c, uint64_t id,
                               const fp4idx_cache_seq_t *s, int64_t first) {
  if (!c->pages_hook) return;
  const int32_t *pages = NULL;
  int64_t n = s ? s->n_pages : 0;
  if (n > 0 && fp4idx__cache_pages(c, s, &pages) != FP4IDX_OK) {
    n = 0;
    first = 0;
  }
  c->pages_hook(c->pages_hook_arg, id, pages, n, first < n ? first : n);
}

/* Takes a just-created sequence out again (an allocation after it failed). */
static void fp4idx__cache_uncreate(fp4idx_cache_t *c, fp4idx_cache_seq_t *s) {
  fp4idx__cache_table_remove(c, fp4idx__cache_probe(c, s->id));
  fp4idx__cache_seq_free(s);
}

void fp4idx__cache_slots(const fp4idx_cache_t *c, const fp4idx_cache_seq_t *s,
                         int64_t from, int64_t count, int64_t *slots) {
  int64_t P = c->page_size;
  for (int64_t i = 0; i < count; i++) {
    int64_t l = from + i;
    slots[i] = (int64_t)fp4idx__cache_page(s, l / P) * P + l % P;
  }
}

int fp4idx__cache_pages(fp4idx_cache_t *c, const fp4idx_cache_seq_t *s,
                        const int32_t **pages) {
  if (!c || !s || !pages) return FP4IDX_EINVAL;
  /* The flat list caches the chunks' ids: filling it changes no state. */
  fp4idx_cache_seq_t *m = (fp4idx_cache_seq_t *)s;
  *pages = NULL;
  if (m->n_pages == 0) return FP4IDX_OK;
  if (m->flat_cap < m->n_pages) {
    int64_t cap = m->flat_cap * 2 > m->n_pages ? m->flat_cap * 2 : m->n_pages;
    int32_t *f = FP4IDX_CACHE_REALLOC(m->flat, (size_t)cap * sizeof *f);
    if (!f) return FP4IDX_ENOMEM;
    m->flat = f;
    m->flat_cap = cap;
  }
  for (int64_t i = m->flat_ok; i < m->n_pages;) {
    int64_t j = i / CH, e = i % CH, n = fp4idx__cache_use(m->n_pages, j) - e;
    memcpy(m->flat + i, m->chunks[j]->pages + e, (size_t)n * sizeof *m->flat);
    i += n;
  }
  m->flat_ok = m->n_pages;
  *pages = m->flat;
  return FP4IDX_OK;
}

/* ---- append, truncate, drop, fork ---------------------------------------------- */

int fp4idx__cache_append(fp4idx_cache_t *c, uint64_t id, int64_t n,
                         int64_t *first, int64_t *slots, int *created) {
  if (!c || !c->table || n < 1 || !first || !created) return FP4IDX_EINVAL;
  *created = 0;
  c->cow_valid = 0;
  const fp4idx_cache_seq_t *known = fp4idx__cache_find(c, id);
  int64_t have = known ? known->n_keys : 0;
  if (n > FP4IDX_CACHE_MAX_KEYS - have) return FP4IDX_ERANGE;
  int64_t old_np = known ? known->n_pages : 0, need_np = fp4idx__cache_pages_for(c, have + n);
  int64_t old_ch = fp4idx__cache_chunks_for(old_np), need_ch = fp4idx__cache_chunks_for(need_np);
  fp4idx_cache_chunk_t *k = NULL;
  int32_t u = 0;
  int cow = 0, priv = 0, grow = 0;
  int32_t nu_last = 0;
  if (old_np) {
    /* The last chunk k, of which this sequence uses u entries: which of them
     * do other holders see? */
    k = known->chunks[old_ch - 1];
    u = fp4idx__cache_use(old_np, old_ch - 1);
    uint32_t see_last = 0, see_past = 0; /* others seeing entry u-1 / entries >= u */
    for (int32_t v = u + 1; v <= k->n; v++) see_past += USE(k)[v];
    see_last = see_past + USE(k)[u] - 1;
    /* A partly filled last page that another sequence sees is copied before
     * the first new key lands in it: they keep seeing their own bytes. */
    cow = have % c->page_size != 0 && (see_last > 0 || c->refs[k->pages[u - 1]] > 1);
    /* New entries into k? Entries others see are never changed, and a
     * shared chunk never moves (its holders point at it): in both cases this
     * sequence takes a private copy of k first. */
    grow = need_np > old_np && u < CH;
    nu_last = fp4idx__cache_use(need_np, old_ch - 1);
    priv = (cow && see_last > 0) || (grow && (see_past > 0 || (k->cap < nu_last && k->rc > 1)));
  }
  /* Check the pool before touching anything: EFULL changes nothing. */
  if (need_np - old_np + cow > c->n_free) return FP4IDX_EFULL;
  if (cow && !c->copy_page) return FP4IDX_EINVAL;
  fp4idx_cache_seq_t *s;
  int rc = fp4idx__cache_get_or_create(c, id, &s, created);
  if (rc) return rc;
  /* Every allocation before the first change. */
  fp4idx_cache_chunk_t *k2 = NULL;
  int64_t made = old_ch;
  int32_t fresh = -1;
  rc = fp4idx__cache_reserve_chunks(s, need_ch);
  if (rc == FP4IDX_OK && priv && !(k2 = fp4idx__cache_chunk_new(grow ? nu_last : u)))
    rc = FP4IDX_ENOMEM;
  for (; rc == FP4IDX_OK && made < need_ch; made++)
    if (!(s->chunks[made] = fp4idx__cache_chunk_new(fp4idx__cache_use(need_np, made))))
      rc = FP4IDX_ENOMEM;
  if (rc == FP4IDX_OK && grow && !priv && k->cap < nu_last) {
    /* (A larger chunk is no change: keep it even if a later step fails.) */
    fp4idx_cache_chunk_t *g = fp4idx__cache_chunk_grow(k, nu_last);
    if (g) s->chunks[old_ch - 1] = k = g;
    else rc = FP4IDX_ENOMEM;
  }
  if (rc == FP4IDX_OK && cow) {
    fresh = fp4idx__cache_page_pop(c);
    rc = c->copy_page(c->copy_ctx, k->pages[u - 1], fresh);
    if (rc) fp4idx__cache_page_release(c, fresh); /* back on top: the stack is as it was */
  }
  if (rc) {
    while (made > old_ch) free(s->chunks[--made]);
    free(k2);
    if (*created) fp4idx__cache_uncreate(c, s);
    *created = 0;
    return rc;
  }
  if (priv) {
    memcpy(k2->pages, k->pages, (size_t)u * sizeof *k2->pages);
    for (int32_t e = 0; e < u; e++) fp4idx__cache_page_ref(c, k2->pages[e]);
    k2->n = u;
    k2->rc = 1;
    USE(k2)[u] = 1;
    fp4idx__cache_chunk_reuse(c, k, u, 0); /* k keeps what its other holders see */
    s->chunks[old_ch - 1] = k = k2;
  }
  if (cow) {
    int32_t old = k->pages[u - 1];
    k->pages[u - 1] = fresh;
    fp4idx__cache_page_release(c, old);
    c->cow_valid = 1;
    c->cow_seq = id;
    c->cow_index = old_np - 1;
    c->cow_old = old;
    c->cow_new = fresh;
    if (s->flat_ok > old_np - 1) s->flat_ok = old_np - 1;
  }
  if (grow) {
    /* k grows in place: nobody else sees past its u entries (k->n == u). */
    for (int32_t e = u; e < nu_last; e++) k->pages[e] = fp4idx__cache_page_pop(c);
    k->n = nu_last;
    USE(k)[u]--;
    USE(k)[nu_last]++;
  }
  for (int64_t j = old_ch; j < need_ch; j++) {
    fp4idx_cache_chunk_t *kj = s->chunks[j];
    int32_t nu = fp4idx__cache_use(need_np, j);
    for (int32_t e = 0; e < nu; e++) kj->pages[e] = fp4idx__cache_page_pop(c);
    kj->n = nu;
    kj->rc = 1;
    USE(kj)[nu] = 1;
  }
  s->n_pages = need_np;
  s->n_keys = have + n;
  c->n_keys += n;
  *first = have;
  if (slots) fp4idx__cache_slots(c, s, have, n, slots);
  /* (a copy-on-write replaced page old_np - 1: it is told as changed) */
  fp4idx__cache_tell(c, id, s, cow ? old_np - 1 : old_np);
  return FP4IDX_OK;
}

int fp4idx__cache_truncate(fp4idx_cache_t *c, uint64_t id, int64_t len) {
  if (!c || !c->table) return FP4IDX_EINVAL;
  fp4idx_cache_seq_t *s = c->table[fp4idx__cache_probe(c, id)];
  if (!s) return FP4IDX_ENOSEQ;
  if (len < 0 || len > s->n_keys) return FP4IDX_ERANGE;
  int64_t before = s->n_pages;
  fp4idx__cache_shrink(c, s, len);
  c->cow_valid = 0;
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
  c->cow_valid = 0;
  fp4idx__cache_tell(c, id, NULL, 0);
  return FP4IDX_OK;
}

void fp4idx__cache_append_undo(fp4idx_cache_t *c, uint64_t id, int64_t old_len,
                               int created) {
  if (!c || !c->table) return;
  int cow = c->cow_valid && c->cow_seq == id; /* (truncate forgets it) */
  if (created) {
    (void)fp4idx__cache_drop(c, id);
  } else if (fp4idx__cache_truncate(c, id, old_len) == FP4IDX_OK && cow) {
    /* The copy is the last page again (old_len ends inside it), in a chunk
     * entry nobody else sees: put the shared page back. */
    fp4idx_cache_seq_t *s = c->table[fp4idx__cache_probe(c, id)];
    if (c->cow_index == s->n_pages - 1) {
      fp4idx_cache_chunk_t *k = s->chunks[c->cow_index / CH];
      int64_t e = c->cow_index % CH;
      if (k->pages[e] == c->cow_new) {
        fp4idx__cache_page_ref(c, c->cow_old);
        k->pages[e] = c->cow_old;
        fp4idx__cache_page_release(c, c->cow_new);
        if (s->flat_ok > c->cow_index) s->flat_ok = c->cow_index;
        fp4idx__cache_tell(c, id, s, c->cow_index);
      }
    }
  }
  c->cow_valid = 0;
}

int fp4idx__cache_fork(fp4idx_cache_t *c, uint64_t src, uint64_t dst, int64_t length) {
  if (!c || !c->table) return FP4IDX_EINVAL;
  const fp4idx_cache_seq_t *from = fp4idx__cache_find(c, src);
  if (!from) return FP4IDX_ENOSEQ;
  if (length < 0 || length > from->n_keys) return FP4IDX_ERANGE;
  if (fp4idx__cache_find(c, dst)) return FP4IDX_EEXIST;
  int64_t np = fp4idx__cache_pages_for(c, length), nch = fp4idx__cache_chunks_for(np);
  fp4idx_cache_seq_t *s;
  int created;
  /* (Sequences are allocated one by one: a table growth leaves `from` valid.) */
  int rc = fp4idx__cache_get_or_create(c, dst, &s, &created);
  if (rc) return rc;
  rc = fp4idx__cache_reserve_chunks(s, nch);
  if (rc) {
    fp4idx__cache_uncreate(c, s);
    return rc;
  }
  /* Hold src's chunks: src uses at least as many entries of each. */
  for (int64_t j = 0; j < nch; j++) {
    fp4idx_cache_chunk_t *k = from->chunks[j];
    k->rc++;
    USE(k)[fp4idx__cache_use(np, j)]++;
    s->chunks[j] = k;
  }
  s->n_pages = np;
  s->n_keys = length;
  c->n_keys += length;
  c->cow_valid = 0;
  c->forked = 1;
  fp4idx__cache_tell(c, dst, s, 0);
  return FP4IDX_OK;
}

/* ---- accounting ------------------------------------------------------------------ */

int64_t fp4idx__cache_shared_pages(fp4idx_cache_t *c) {
  if (!c || !c->table) return 0;
  /* Listed by two chunks: two holders. Listed by one: shared when two of
   * its holders use that entry. */
  int64_t n = c->n_multi;
  uint64_t mark = ++c->mark;
  for (uint64_t i = 0; i < c->table_cap; i++) {
    const fp4idx_cache_seq_t *s = c->table[i];
    if (!s) continue;
    for (int64_t j = 0; j < fp4idx__cache_chunks_for(s->n_pages); j++) {
      fp4idx_cache_chunk_t *k = s->chunks[j];
      if (k->rc < 2 || k->mark == mark) continue;
      k->mark = mark;
      uint32_t see = 0;
      for (int32_t e = k->n - 1; e >= 0; e--) {
        see += USE(k)[e + 1];
        n += see >= 2 && c->refs[k->pages[e]] == 1;
      }
    }
  }
  return n;
}

int64_t fp4idx__cache_seq_shared(const fp4idx_cache_t *c, const fp4idx_cache_seq_t *s) {
  if (!c || !s) return 0;
  int64_t n = 0;
  for (int64_t j = 0; j < fp4idx__cache_chunks_for(s->n_pages); j++) {
    const fp4idx_cache_chunk_t *k = s->chunks[j];
    int32_t u = fp4idx__cache_use(s->n_pages, j);
    uint32_t see = 0;
    for (int32_t e = k->n - 1; e >= 0; e--) {
      see += USE(k)[e + 1];
      n += e < u && (see >= 2 || c->refs[k->pages[e]] >= 2);
    }
  }
  return n;
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
    if (pages[i] < 0 || pages[i] >= c->n_pages) return FP4IDX_EINVAL;
    for (int64_t j = 0; j < i; j++)
      if (pages[j] == pages[i]) return FP4IDX_EINVAL; /* O(n^2), restore only */
  }
  fp4idx_cache_seq_t *s;
  int created;
  int rc = fp4idx__cache_get_or_create(c, id, &s, &created);
  if (rc) return rc;
  int64_t nch = fp4idx__cache_chunks_for(n_pages), made = 0;
  rc = fp4idx__cache_reserve_chunks(s, nch);
  for (; rc == FP4IDX_OK && made < nch; made++)
    if (!(s->chunks[made] = fp4idx__cache_chunk_new(fp4idx__cache_use(n_pages, made))))
      rc = FP4IDX_ENOMEM;
  if (rc) {
    while (made > 0) free(s->chunks[--made]);
    fp4idx__cache_uncreate(c, s);
    return rc;
  }
  for (int64_t i = 0; i < n_pages; i++) {
    int32_t p = pages[i];
    fp4idx_cache_chunk_t *k = s->chunks[i / CH];
    k->pages[i % CH] = p;
    if (c->refs[p]) { /* listed by a sequence adopted before: both see it */
      fp4idx__cache_page_ref(c, p);
      continue;
    }
    /* Swap-remove the page from the free stack. */
    int64_t at = c->free_pos[p];
    int32_t top = c->free_stack[c->n_free - 1];
    c->free_stack[at] = top;
    c->free_pos[top] = at;
    c->n_free--;
    c->free_pos[p] = -1;
    c->refs[p] = 1;
  }
  for (int64_t j = 0; j < nch; j++) {
    int32_t nu = fp4idx__cache_use(n_pages, j);
    s->chunks[j]->n = nu;
    s->chunks[j]->rc = 1;
    USE(s->chunks[j])[nu] = 1;
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
    uint64_t id = s->id;
    fp4idx__cache_shrink(c, s, 0);
    fp4idx__cache_seq_free(s);
    c->table[i] = NULL;
    fp4idx__cache_tell(c, id, NULL, 0);
  }
  c->n_seqs = 0;
  c->n_keys = 0;
  c->cow_valid = 0;
}
