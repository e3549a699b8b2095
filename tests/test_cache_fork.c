/* test_cache_fork.c -- prefix sharing in the daemon's cache (daemon/cache.c,
 * fp4idx__cache_fork) over a real backend: keys are stored at the slots the
 * cache hands out, copy-on-write goes through the backend's copy_pages, and
 * everything is checked against a model that copies (each model sequence owns
 * its key bytes):
 *   - read-back bytes of every sequence == the model's;
 *   - pages: the model gives each page a token (new page, copy-on-write) that
 *     forks copy; the cache's pages must match the tokens one to one, so the
 *     pool's used pages == distinct tokens and a page is freed exactly when
 *     the last sequence holding its token lets go (a page is on the free list
 *     iff no sequence sees it); the shared-page figures (pool and per
 *     sequence) agree with the tokens that two sequences hold;
 *   - scores of every sequence == the same keys stored unshared in a fresh
 *     CPU backend, byte for byte.
 * Built twice: test_cache_fork (CPU backend) and, with CUDA, test_cache_fork_cuda
 * (FP4IDX_TEST_FORK_CUDA: the CUDA backend, so its copy_pages and scorer over
 * shared pages are covered; skips without a GPU).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "fp4idx_backend.h"
#include "fp4idx_status.h"

#ifdef FP4IDX_TEST_FORK_CUDA
#include <cuda_runtime_api.h>
#endif

enum { KB = FP4IDX_SLOT_BYTES, MAXSEQ = 48, HEADS = 4 };

typedef struct mseq_s {
  int known;
  int64_t n;       /* keys */
  uint8_t *keys;   /* [cap, 68] this sequence's own copy */
  int64_t cap;
  int64_t *tok;    /* [ceil(n / P)] page tokens */
  int64_t tcap;
} mseq_t;

typedef struct world_s {
  fp4idx_cache_t c;
  fp4idx_backend_t *b;
  int32_t P;
  int64_t pages;
  mseq_t m[MAXSEQ];
  int64_t next_tok;
  uint64_t rng;
  int64_t copies;  /* copy-on-write calls */
  int fail_copy;   /* the next copy fails with FP4IDX_EDEVICE */
} world_t;

static uint64_t sid(int k) { return (uint64_t)k * 0x9E3779B97F4A7C15ULL + 7; }

static uint64_t rnd(world_t *w) {
  w->rng = w->rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return w->rng >> 17;
}

static fp4idx_backend_t *mk_backend(int64_t pages, int32_t P, int oracle) {
  fp4idx_backend_t *b = NULL;
#ifdef FP4IDX_TEST_FORK_CUDA
  if (!oracle) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
      cudaGetLastError();
      cr_skip_test("no CUDA device");
    }
    cr_assert_eq(fp4idx_backend_cuda_create(&b, 0), FP4IDX_OK);
    cr_assert_eq(b->ops->pool_create(b, pages, P), FP4IDX_OK);
    return b;
  }
#endif
  (void)oracle;
  cr_assert_eq(fp4idx_backend_cpu_create(&b, 2), FP4IDX_OK);
  cr_assert_eq(b->ops->pool_create(b, pages, P), FP4IDX_OK);
  return b;
}

static int copy_cb(void *ctx, int32_t from, int32_t to) {
  world_t *w = ctx;
  if (w->fail_copy) {
    w->fail_copy = 0;
    return FP4IDX_EDEVICE;
  }
  w->copies++;
  return w->b->ops->copy_pages(w->b, from, to, 1);
}

static void w_init(world_t *w, int64_t pages, int32_t P) {
  memset(w, 0, sizeof *w);
  w->P = P;
  w->pages = pages;
  w->rng = 0x1234567ULL + (uint64_t)pages * 31 + (uint64_t)P;
  w->b = mk_backend(pages, P, 0);
  cr_assert_eq(fp4idx__cache_init(&w->c, pages, P), FP4IDX_OK);
  fp4idx__cache_set_copy(&w->c, copy_cb, w);
}

static void w_fini(world_t *w) {
  for (int k = 0; k < MAXSEQ; k++) {
    free(w->m[k].keys);
    free(w->m[k].tok);
  }
  fp4idx__cache_destroy(&w->c);
  fp4idx_backend_destroy(w->b);
}

static int64_t pages_for(const world_t *w, int64_t n) { return (n + w->P - 1) / w->P; }

static void ms_reserve(mseq_t *s, int64_t n, int64_t np) {
  if (n > s->cap) {
    s->cap = n * 2 + 8;
    s->keys = realloc(s->keys, (size_t)s->cap * KB);
    cr_assert_not_null(s->keys);
  }
  if (np > s->tcap) {
    s->tcap = np * 2 + 4;
    s->tok = realloc(s->tok, (size_t)s->tcap * sizeof *s->tok);
    cr_assert_not_null(s->tok);
  }
}

/* Model sequences other than `self` holding token t. */
static int holders_besides(const world_t *w, int self, int64_t t) {
  int h = 0;
  for (int k = 0; k < MAXSEQ; k++) {
    if (k == self || !w->m[k].known) continue;
    for (int64_t i = 0; i < pages_for(w, w->m[k].n); i++) h += w->m[k].tok[i] == t;
  }
  return h;
}

/* Distinct tokens over all model sequences (the pages the pool should use). */
static int64_t model_used(const world_t *w, int64_t *shared) {
  int64_t *seen = calloc((size_t)w->next_tok + 1, sizeof *seen);
  cr_assert_not_null(seen);
  int64_t used = 0, sh = 0;
  for (int k = 0; k < MAXSEQ; k++) {
    if (!w->m[k].known) continue;
    for (int64_t i = 0; i < pages_for(w, w->m[k].n); i++) {
      int64_t t = w->m[k].tok[i];
      if (seen[t]++ == 0) used++;
      else if (seen[t] == 2) sh++;
    }
  }
  free(seen);
  if (shared) *shared = sh;
  return used;
}

/* Appends n generated keys to sequence k; checks the status the model
 * expects. Returns the status. */
static int w_append(world_t *w, int k, int64_t n) {
  mseq_t *s = &w->m[k];
  int64_t have = s->known ? s->n : 0;
  int64_t last = pages_for(w, have) - 1;
  int cow = s->known && have % w->P != 0 && holders_besides(w, k, s->tok[last]) > 0;
  int64_t need = pages_for(w, have + n) - pages_for(w, have) + cow;
  int64_t free_pages = w->pages - model_used(w, NULL);
  uint8_t *keys = malloc((size_t)n * KB);
  int64_t *slots = malloc((size_t)n * sizeof *slots);
  cr_assert(keys && slots);
  for (int64_t i = 0; i < n * KB; i++) {
    /* finite keys: any E2M1 payload nibble, UE8M0 scales near 1.0 */
    int in_scales = (i % KB) >= FP4IDX_PAYLOAD_BYTES;
    keys[i] = in_scales ? (uint8_t)(124 + rnd(w) % 7) : (uint8_t)rnd(w);
  }
  int64_t first = -1, copies = w->copies;
  int created = 0;
  int rc = fp4idx__cache_append(&w->c, sid(k), n, &first, slots, &created);
  if (need > free_pages) {
    cr_assert_eq(rc, FP4IDX_EFULL, "seq %d +%lld: need %lld of %lld free", k, (long long)n,
                 (long long)need, (long long)free_pages);
  } else {
    cr_assert_eq(rc, FP4IDX_OK, "seq %d +%lld: %s", k, (long long)n, fp4idx_strerror(rc));
    cr_assert_eq(first, have);
    cr_assert_eq(created, !s->known);
    cr_assert_eq(w->copies - copies, cow, "copy-on-write exactly when the page is shared");
    cr_assert_eq(w->b->ops->store(w->b, keys, FP4IDX_DTYPE_FP4, n, slots, FP4IDX_ROUND_RNE),
                 FP4IDX_OK);
    ms_reserve(s, have + n, pages_for(w, have + n));
    memcpy(s->keys + have * KB, keys, (size_t)n * KB);
    if (cow) s->tok[last] = w->next_tok++;
    for (int64_t p = last + 1; p < pages_for(w, have + n); p++) s->tok[p] = w->next_tok++;
    s->known = 1;
    s->n = have + n;
  }
  free(keys);
  free(slots);
  return rc;
}

static int w_fork(world_t *w, int src, int dst, int64_t len) {
  int rc = fp4idx__cache_fork(&w->c, sid(src), sid(dst), len);
  mseq_t *a = &w->m[src], *d = &w->m[dst];
  if (!a->known) {
    cr_assert_eq(rc, FP4IDX_ENOSEQ);
  } else if (len < 0 || len > a->n) {
    cr_assert_eq(rc, FP4IDX_ERANGE);
  } else if (d->known) {
    cr_assert_eq(rc, FP4IDX_EEXIST);
  } else {
    cr_assert_eq(rc, FP4IDX_OK, "fork %d -> %d at %lld: %s", src, dst, (long long)len,
                 fp4idx_strerror(rc));
    ms_reserve(d, len, pages_for(w, len));
    if (len) memcpy(d->keys, a->keys, (size_t)len * KB);
    if (len) memcpy(d->tok, a->tok, (size_t)pages_for(w, len) * sizeof *d->tok);
    d->known = 1;
    d->n = len;
  }
  return rc;
}

static int w_truncate(world_t *w, int k, int64_t len) {
  int rc = fp4idx__cache_truncate(&w->c, sid(k), len);
  mseq_t *s = &w->m[k];
  if (!s->known) cr_assert_eq(rc, FP4IDX_ENOSEQ);
  else if (len < 0 || len > s->n) cr_assert_eq(rc, FP4IDX_ERANGE);
  else {
    cr_assert_eq(rc, FP4IDX_OK);
    s->n = len;
  }
  return rc;
}

static int w_drop(world_t *w, int k) {
  int rc = fp4idx__cache_drop(&w->c, sid(k));
  cr_assert_eq(rc, w->m[k].known ? FP4IDX_OK : FP4IDX_ENOSEQ);
  w->m[k].known = 0;
  w->m[k].n = 0;
  return rc;
}

/* Everything the header comment lists, except scores (w_check_scores). */
static void w_check(world_t *w) {
  int64_t *tok2page = malloc(((size_t)w->next_tok + 1) * sizeof *tok2page);
  int64_t *page2tok = malloc((size_t)w->pages * sizeof *page2tok);
  int64_t *holders = calloc((size_t)w->next_tok + 1, sizeof *holders);
  cr_assert(tok2page && page2tok && holders);
  for (int64_t i = 0; i <= w->next_tok; i++) tok2page[i] = -1;
  for (int64_t i = 0; i < w->pages; i++) page2tok[i] = -1;
  int64_t keys = 0;
  uint64_t seqs = 0;
  for (int k = 0; k < MAXSEQ; k++) {
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(&w->c, sid(k));
    const mseq_t *m = &w->m[k];
    cr_assert_eq(s != NULL, m->known != 0, "seq %d presence", k);
    if (!s) continue;
    cr_assert_eq(s->n_keys, m->n, "seq %d keys", k);
    cr_assert_eq(s->n_pages, pages_for(w, m->n));
    keys += m->n;
    seqs++;
    for (int64_t i = 0; i < s->n_pages; i++) {
      int64_t p = fp4idx__cache_page(s, i), t = m->tok[i];
      cr_assert(p >= 0 && p < w->pages);
      if (tok2page[t] < 0) tok2page[t] = p;
      if (page2tok[p] < 0) page2tok[p] = t;
      cr_assert_eq(tok2page[t], p, "seq %d page %lld: token %lld on two pages", k,
                   (long long)i, (long long)t);
      cr_assert_eq(page2tok[p], t, "seq %d page %lld: page %lld holds two tokens", k,
                   (long long)i, (long long)p);
      holders[t]++;
    }
    if (m->n == 0) continue;
    int64_t *slots = malloc((size_t)m->n * sizeof *slots);
    uint8_t *back = malloc((size_t)m->n * KB);
    cr_assert(slots && back);
    fp4idx__cache_slots(&w->c, s, 0, m->n, slots);
    cr_assert_eq(w->b->ops->read(w->b, slots, m->n, 0, back), FP4IDX_OK);
    cr_assert_eq(memcmp(back, m->keys, (size_t)m->n * KB), 0, "seq %d read-back bytes", k);
    free(slots);
    free(back);
  }
  int64_t shared = 0, used = model_used(w, &shared);
  cr_assert_eq(fp4idx__cache_used_pages(&w->c), used, "pool pages in use");
  cr_assert_eq(fp4idx__cache_shared_pages(&w->c), shared, "shared pages");
  cr_assert_eq(w->c.n_keys, keys);
  cr_assert_eq(w->c.n_seqs, seqs);
  /* Exactly the pages no sequence sees are free. */
  for (int64_t p = 0; p < w->pages; p++)
    cr_assert_eq(w->c.refs[p] > 0, page2tok[p] >= 0, "page %lld: in use iff seen", (long long)p);
  for (int64_t i = 0; i < w->c.n_free; i++)
    cr_assert_eq(w->c.refs[w->c.free_stack[i]], 0u, "a free page is not in use");
  /* Per sequence: its pages that another sequence sees; its flat page list. */
  for (int k = 0; k < MAXSEQ; k++) {
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(&w->c, sid(k));
    if (!s) continue;
    int64_t sh = 0;
    for (int64_t i = 0; i < s->n_pages; i++) sh += holders[w->m[k].tok[i]] >= 2;
    cr_assert_eq(fp4idx__cache_seq_shared(&w->c, s), sh, "seq %d shared pages", k);
    const int32_t *flat = NULL;
    cr_assert_eq(fp4idx__cache_pages(&w->c, s, &flat), FP4IDX_OK);
    for (int64_t i = 0; i < s->n_pages; i++) cr_assert_eq(flat[i], fp4idx__cache_page(s, i));
  }
  free(tok2page);
  free(page2tok);
  free(holders);
}

/* Scores every sequence on the cache's (shared) pages and the same keys
 * stored unshared, in position order, in a fresh CPU backend. */
static void w_check_scores(world_t *w) {
  static const uint16_t vals[5] = {0xbf80, 0xbf00, 0x0000, 0x3f00, 0x3f80};
  uint16_t q[HEADS * FP4IDX_HEAD_DIM], wt[HEADS];
  for (int i = 0; i < HEADS * FP4IDX_HEAD_DIM; i++) q[i] = vals[rnd(w) % 5];
  for (int i = 0; i < HEADS; i++) wt[i] = vals[rnd(w) % 5];
  for (int k = 0; k < MAXSEQ; k++) {
    const mseq_t *m = &w->m[k];
    if (!m->known || m->n == 0) continue;
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(&w->c, sid(k));
    int64_t np = pages_for(w, m->n);
    fp4idx_backend_t *o = mk_backend(np, w->P, 1);
    int32_t *opages = malloc((size_t)np * sizeof *opages);
    int64_t *slots = malloc((size_t)m->n * sizeof *slots);
    float *la = malloc((size_t)m->n * sizeof *la), *lb = malloc((size_t)m->n * sizeof *lb);
    cr_assert(opages && slots && la && lb);
    for (int64_t i = 0; i < np; i++) opages[i] = (int32_t)i;
    for (int64_t i = 0; i < m->n; i++) slots[i] = i;
    cr_assert_eq(o->ops->store(o, m->keys, FP4IDX_DTYPE_FP4, m->n, slots, FP4IDX_ROUND_RNE),
                 FP4IDX_OK);
    int32_t lens = (int32_t)m->n;
    const int32_t *pages = NULL;
    cr_assert_eq(fp4idx__cache_pages(&w->c, s, &pages), FP4IDX_OK);
    fp4idx_backend_seq_t sa = {.pages = pages, .n_keys = m->n, .rows = 1, .width = m->n,
                               .q = q, .w = wt, .lens = &lens};
    fp4idx_backend_seq_t sb = sa;
    sb.pages = opages;
    fp4idx_backend_batch_t ba = {.heads = HEADS, .n_seqs = 1, .seqs = &sa, .logits = la};
    fp4idx_backend_batch_t bb = {.heads = HEADS, .n_seqs = 1, .seqs = &sb, .logits = lb};
    cr_assert_eq(w->b->ops->score(w->b, &ba), FP4IDX_OK);
    cr_assert_eq(o->ops->score(o, &bb), FP4IDX_OK);
    cr_assert_eq(memcmp(la, lb, (size_t)m->n * sizeof *la), 0, "seq %d scores", k);
    fp4idx_backend_destroy(o);
    free(opages);
    free(slots);
    free(la);
    free(lb);
  }
}

/* How many sequences see page i of sequence k. */
static int seen_by(world_t *w, int k, int64_t i) {
  int32_t p = fp4idx__cache_page(fp4idx__cache_find(&w->c, sid(k)), i);
  int n = 0;
  for (int o = 0; o < MAXSEQ; o++) {
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(&w->c, sid(o));
    for (int64_t j = 0; s && j < s->n_pages; j++) n += fp4idx__cache_page(s, j) == p;
  }
  return n;
}

/* ---- the cases of issue 15, item 4 ----------------------------------------- */

Test(cache_fork, fork_then_append_to_both) {
  world_t w;
  w_init(&w, 16, 4);
  w_append(&w, 0, 10); /* pages 4 + 4 + 2 */
  cr_assert_eq(w_fork(&w, 0, 1, 10), FP4IDX_OK);
  w_check(&w);
  cr_assert_eq(fp4idx__cache_used_pages(&w.c), 3, "fork copies no page");
  cr_assert_eq(fp4idx__cache_shared_pages(&w.c), 3);
  cr_assert_eq(w.copies, 0);
  w_append(&w, 0, 1); /* the shared partial page is copied first */
  cr_assert_eq(w.copies, 1);
  cr_assert_eq(fp4idx__cache_used_pages(&w.c), 4);
  cr_assert_eq(fp4idx__cache_shared_pages(&w.c), 2);
  w_append(&w, 1, 1); /* now the fork's own page: no copy */
  cr_assert_eq(w.copies, 1);
  w_append(&w, 1, 7);
  w_append(&w, 0, 3);
  w_check(&w);
  w_check_scores(&w);
  w_fini(&w);
}

Test(cache_fork, fork_at_zero_full_length_boundary_and_one_past) {
  world_t w;
  w_init(&w, 32, 8);
  w_append(&w, 0, 20); /* 8 + 8 + 4 */
  cr_assert_eq(w_fork(&w, 0, 1, 0), FP4IDX_OK);
  cr_assert_eq(fp4idx__cache_find(&w.c, sid(1))->n_pages, 0);
  cr_assert_eq(w_fork(&w, 0, 2, 20), FP4IDX_OK);
  cr_assert_eq(w_fork(&w, 0, 3, 16), FP4IDX_OK); /* page boundary: whole pages only */
  cr_assert_eq(w_fork(&w, 0, 4, 17), FP4IDX_OK); /* one key past it: shares a partial page */
  w_check(&w);
  cr_assert_eq(fp4idx__cache_used_pages(&w.c), 3);
  cr_assert_eq(seen_by(&w, 0, 0), 4);
  cr_assert_eq(seen_by(&w, 0, 2), 3);
  int64_t copies = w.copies;
  w_append(&w, 3, 5); /* boundary fork: a new page, no copy */
  cr_assert_eq(w.copies, copies);
  w_append(&w, 4, 1); /* one past: copy-on-write */
  cr_assert_eq(w.copies, copies + 1);
  w_append(&w, 1, 9); /* fork at 0: fresh pages */
  w_append(&w, 2, 1); /* full length: shared partial page, copied */
  cr_assert_eq(w.copies, copies + 2);
  w_append(&w, 0, 12);
  w_check(&w);
  w_check_scores(&w);
  w_fini(&w);
}

Test(cache_fork, truncate_below_and_above_the_fork_point) {
  world_t w;
  w_init(&w, 32, 4);
  w_append(&w, 0, 12); /* 3 full pages */
  cr_assert_eq(w_fork(&w, 0, 1, 12), FP4IDX_OK);
  /* Below: the source lets go of nothing the fork holds... */
  w_truncate(&w, 0, 5);
  w_check(&w);
  cr_assert_eq(fp4idx__cache_used_pages(&w.c), 3, "page 2 still held by the fork");
  /* ...and its next append must not write into the fork's page 1. */
  int64_t copies = w.copies;
  w_append(&w, 0, 6);
  cr_assert_eq(w.copies, copies + 1);
  w_check(&w);
  /* The fork truncated below, then appending: its page is its own again. */
  w_truncate(&w, 1, 6);
  w_check(&w);
  w_append(&w, 1, 3);
  w_check(&w);
  /* Above the fork point: only the source's own pages go. */
  cr_assert_eq(w_fork(&w, 0, 2, 6), FP4IDX_OK);
  w_append(&w, 0, 9); /* source 20 keys */
  int64_t used = fp4idx__cache_used_pages(&w.c);
  w_truncate(&w, 0, 8); /* above 6: frees pages 2..4 of the source */
  cr_assert_eq(fp4idx__cache_used_pages(&w.c), used - 3);
  w_check(&w);
  w_truncate(&w, 2, 0);
  w_truncate(&w, 0, 0);
  w_check(&w);
  w_append(&w, 2, 5);
  w_append(&w, 0, 2);
  w_check(&w);
  w_check_scores(&w);
  w_fini(&w);
}

Test(cache_fork, drop_the_source_first_and_the_fork_first) {
  world_t w;
  w_init(&w, 16, 4);
  w_append(&w, 0, 9);
  cr_assert_eq(w_fork(&w, 0, 1, 9), FP4IDX_OK);
  w_append(&w, 1, 4);
  int64_t used = fp4idx__cache_used_pages(&w.c);
  w_drop(&w, 0); /* source first: the fork keeps every shared page */
  w_check(&w);
  cr_assert_eq(fp4idx__cache_used_pages(&w.c), used - 1, "only the source's own copy goes");
  cr_assert_eq(fp4idx__cache_shared_pages(&w.c), 0);
  w_check_scores(&w);
  w_drop(&w, 1);
  cr_assert_eq(w.c.n_free, 16);
  w_append(&w, 2, 9);
  cr_assert_eq(w_fork(&w, 2, 3, 9), FP4IDX_OK);
  w_drop(&w, 3); /* fork first: nothing freed */
  w_check(&w);
  cr_assert_eq(fp4idx__cache_used_pages(&w.c), 3);
  cr_assert_eq(fp4idx__cache_shared_pages(&w.c), 0);
  w_append(&w, 2, 1); /* no copy: the page is the source's alone again */
  cr_assert_eq(w.copies, 1);
  w_drop(&w, 2);
  cr_assert_eq(w.c.n_free, 16);
  w_check(&w);
  w_fini(&w);
}

Test(cache_fork, fork_of_a_fork) {
  world_t w;
  w_init(&w, 32, 4);
  w_append(&w, 0, 14);
  cr_assert_eq(w_fork(&w, 0, 1, 11), FP4IDX_OK);
  w_append(&w, 1, 2);
  cr_assert_eq(w_fork(&w, 1, 2, 13), FP4IDX_OK); /* its last page is the fork's copy */
  cr_assert_eq(w_fork(&w, 2, 3, 4), FP4IDX_OK);
  w_check(&w);
  cr_assert_eq(seen_by(&w, 0, 0), 4);
  w_append(&w, 2, 6);
  w_append(&w, 3, 1);
  w_drop(&w, 1);
  w_check(&w);
  w_truncate(&w, 0, 3);
  w_append(&w, 0, 3);
  w_check(&w);
  w_check_scores(&w);
  w_drop(&w, 0);
  w_drop(&w, 2);
  w_drop(&w, 3);
  cr_assert_eq(w.c.n_free, 32);
  w_check(&w);
  w_fini(&w);
}

/* A fingerprint of what the cache's state means (for "nothing changes"):
 * counts, the free stack in order, and every sequence's page list. */
typedef struct fp_s {
  int64_t n_free, n_shared, n_keys;
  uint64_t n_seqs;
  uint64_t refs_hash;
} fp_t;

static fp_t fingerprint(fp4idx_cache_t *c) {
  fp_t f = {c->n_free, fp4idx__cache_shared_pages(c), c->n_keys, c->n_seqs,
            1469598103934665603ULL};
  for (int64_t i = 0; i < c->n_free; i++)
    f.refs_hash = (f.refs_hash ^ (uint64_t)c->free_stack[i]) * 1099511628211ULL;
  for (int k = 0; k < MAXSEQ; k++) {
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(c, sid(k));
    f.refs_hash = (f.refs_hash ^ (s ? (uint64_t)s->n_keys + 1 : 0)) * 1099511628211ULL;
    for (int64_t i = 0; s && i < s->n_pages; i++)
      f.refs_hash = (f.refs_hash ^ (uint64_t)fp4idx__cache_page(s, i)) * 1099511628211ULL;
  }
  return f;
}

static void same_fp(fp_t a, fp_t b) {
  cr_assert_eq(a.n_free, b.n_free);
  cr_assert_eq(a.n_shared, b.n_shared);
  cr_assert_eq(a.n_keys, b.n_keys);
  cr_assert_eq(a.n_seqs, b.n_seqs);
  cr_assert_eq(a.refs_hash, b.refs_hash);
}

Test(cache_fork, bad_forks_change_nothing) {
  world_t w;
  w_init(&w, 8, 4);
  w_append(&w, 0, 6);
  w_append(&w, 1, 2);
  fp_t f = fingerprint(&w.c);
  cr_assert_eq(w_fork(&w, 5, 6, 0), FP4IDX_ENOSEQ);
  cr_assert_eq(w_fork(&w, 0, 0, 3), FP4IDX_EEXIST); /* dst == src */
  cr_assert_eq(w_fork(&w, 0, 1, 3), FP4IDX_EEXIST);
  cr_assert_eq(w_fork(&w, 0, 2, 7), FP4IDX_ERANGE);
  cr_assert_eq(w_fork(&w, 0, 2, -1), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx__cache_fork(NULL, sid(0), sid(2), 1), FP4IDX_EINVAL);
  same_fp(f, fingerprint(&w.c));
  cr_assert_null(fp4idx__cache_find(&w.c, sid(2)));
  w_check(&w);
  w_fini(&w);
}

Test(cache_fork, full_pool_during_a_fork) {
  world_t w;
  w_init(&w, 4, 4);
  w_append(&w, 0, 10); /* 3 pages */
  w_append(&w, 1, 4);  /* the 4th: pool full */
  cr_assert_eq(w.c.n_free, 0);
  /* A fork needs no page: it succeeds on a full pool and takes none. */
  cr_assert_eq(w_fork(&w, 0, 2, 10), FP4IDX_OK);
  cr_assert_eq(w_fork(&w, 0, 3, 8), FP4IDX_OK);
  cr_assert_eq(w.c.n_free, 0);
  w_check(&w);
  /* What would need a page -- the copy-on-write of the shared partial page, a
   * new page after the boundary fork -- is EFULL and changes nothing. */
  fp_t f = fingerprint(&w.c);
  int64_t copies = w.copies;
  cr_assert_eq(w_append(&w, 2, 1), FP4IDX_EFULL);
  cr_assert_eq(w_append(&w, 0, 1), FP4IDX_EFULL);
  cr_assert_eq(w_append(&w, 3, 1), FP4IDX_EFULL);
  cr_assert_eq(w.copies, copies, "no copy was made");
  same_fp(f, fingerprint(&w.c));
  w_check(&w);
  /* Dropping the fork's source does not free the shared pages. */
  w_drop(&w, 1);
  cr_assert_eq(w.c.n_free, 1);
  cr_assert_eq(w_append(&w, 2, 1), FP4IDX_OK); /* the copy takes that page */
  cr_assert_eq(w.c.n_free, 0);
  w_check(&w);
  w_check_scores(&w);
  w_fini(&w);
}

Test(cache_fork, failed_copy_and_undone_append_change_nothing) {
  world_t w;
  w_init(&w, 8, 4);
  w_append(&w, 0, 6);
  cr_assert_eq(w_fork(&w, 0, 1, 6), FP4IDX_OK);
  fp_t f = fingerprint(&w.c);
  int64_t first, slots[4];
  int created;
  w.fail_copy = 1;
  cr_assert_eq(fp4idx__cache_append(&w.c, sid(1), 1, &first, slots, &created), FP4IDX_EDEVICE);
  same_fp(f, fingerprint(&w.c));
  w_check(&w);
  /* An append whose store fails (ENONFINITE in the daemon) is undone: the
   * copy goes back and the sequence holds the shared page again. */
  cr_assert_eq(fp4idx__cache_append(&w.c, sid(1), 3, &first, slots, &created), FP4IDX_OK);
  cr_assert_eq(fp4idx__cache_used_pages(&w.c), 4);
  fp4idx__cache_append_undo(&w.c, sid(1), 6, created);
  same_fp(f, fingerprint(&w.c));
  w_check(&w);
  /* Without a copy callback a copy-on-write append is refused cleanly. */
  fp4idx__cache_set_copy(&w.c, NULL, NULL);
  cr_assert_eq(fp4idx__cache_append(&w.c, sid(0), 1, &first, slots, &created), FP4IDX_EINVAL);
  same_fp(f, fingerprint(&w.c));
  fp4idx__cache_set_copy(&w.c, copy_cb, &w);
  w_append(&w, 0, 1);
  w_check(&w);
  w_fini(&w);
}

/* Random append / fork / truncate / drop over many sequences against the
 * copying model, every state checked. */
static void random_run(int32_t P, int64_t pages, int iters, uint64_t seed) {
  world_t w;
  w_init(&w, pages, P);
  w.rng = seed;
  int forks = 0, cows = 0;
  for (int it = 0; it < iters; it++) {
    uint64_t x = rnd(&w);
    int k = (int)(x % MAXSEQ), op = (int)((x >> 8) % 20);
    if (op < 8) {
      w_append(&w, k, 1 + (int64_t)((x >> 16) % (uint64_t)(3 * P)));
    } else if (op < 13) {
      int dst = (int)((x >> 24) % MAXSEQ);
      /* mostly a free id (a fork), sometimes a known one (EEXIST) */
      for (int t = 0; t < MAXSEQ && ((x >> 44) & 7) != 0 && w.m[dst].known; t++)
        dst = (dst + 1) % MAXSEQ;
      int64_t n = w.m[k].n;
      /* lengths around page boundaries, the ends, and anywhere */
      int64_t len;
      switch ((x >> 32) % 5) {
        case 0: len = n; break;
        case 1: len = (n / P) * P; break;
        case 2: len = (n / P) * P + 1; break;
        case 3: len = (int64_t)((x >> 40) % (uint64_t)(n + 2)) - 1 + ((x >> 45) & 1); break;
        default: len = 0; break;
      }
      if (w.m[k].known && !w.m[dst].known && len >= 0 && len <= n) forks++;
      w_fork(&w, k, dst, len);
    } else if (op < 17) {
      int64_t n = w.m[k].n;
      w_truncate(&w, k, n ? (int64_t)((x >> 20) % (uint64_t)(n + 1)) : 0);
    } else {
      w_drop(&w, k);
      w_drop(&w, (k + 1) % MAXSEQ); /* keep free ids for forks */
    }
    w_check(&w);
    if (it % 500 == 499) w_check_scores(&w);
  }
  cows = (int)w.copies;
  cr_log_info("P=%d: %d forks, %d copy-on-writes, %lld of %lld pages used at the end", P,
              forks, cows, (long long)fp4idx__cache_used_pages(&w.c), (long long)pages);
  cr_assert_gt(forks, iters / 10, "the run forks");
  if (P > 1) cr_assert_gt(cows, 10, "the run copies on write");
  else cr_assert_eq(cows, 0, "pages of one key are never partly filled");
  w_check_scores(&w);
  for (int k = 0; k < MAXSEQ; k++)
    if (w.m[k].known) w_drop(&w, k);
  cr_assert_eq(w.c.n_free, pages);
  cr_assert_eq(fp4idx__cache_shared_pages(&w.c), 0);
  w_fini(&w);
}

Test(cache_fork, random_ops_match_a_copying_model) {
  random_run(4, 300, 8000, 11);
  random_run(1, 400, 4000, 12); /* every page a boundary */
  random_run(16, 120, 4000, 13);
}

/* The backend op behind copy-on-write: whole pages, bytes exact, ranges
 * checked (outside the pool, overlapping) with nothing written. */
Test(cache_fork, backend_copy_pages) {
  enum { PG = 6, PS = 8 };
  fp4idx_backend_t *b = mk_backend(PG, PS, 0);
  const int64_t pb = fp4idx_page_bytes(PS);
  uint8_t *in = malloc((size_t)(PG * pb)), *out = malloc((size_t)(PG * pb));
  cr_assert(in && out);
  for (int64_t i = 0; i < PG * pb; i++) in[i] = (uint8_t)(i * 7 + 3);
  cr_assert_eq(b->ops->write_pages(b, 0, PG, in), FP4IDX_OK);
  cr_assert_eq(b->ops->copy_pages(b, 1, 4, 2), FP4IDX_OK);
  memcpy(in + 4 * pb, in + 1 * pb, (size_t)(2 * pb));
  cr_assert_eq(b->ops->read_pages(b, 0, PG, out), FP4IDX_OK);
  cr_assert_eq(memcmp(in, out, (size_t)(PG * pb)), 0);
  cr_assert_eq(b->ops->copy_pages(b, 0, 1, 2), FP4IDX_EINVAL); /* overlap */
  cr_assert_eq(b->ops->copy_pages(b, 5, 0, 2), FP4IDX_EINVAL); /* past the pool */
  cr_assert_eq(b->ops->copy_pages(b, 0, 5, 2), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->copy_pages(b, -1, 3, 1), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->copy_pages(b, 0, 3, -1), FP4IDX_EINVAL);
  cr_assert_eq(b->ops->copy_pages(b, 2, 2, 0), FP4IDX_OK);
  cr_assert_eq(b->ops->read_pages(b, 0, PG, out), FP4IDX_OK);
  cr_assert_eq(memcmp(in, out, (size_t)(PG * pb)), 0, "a refused copy writes nothing");
  free(in);
  free(out);
  fp4idx_backend_destroy(b);
}

/* The page hook (daemon/cache.h fp4idx__cache_set_pages_hook) keeps a
 * device-side copy of each page list: after fork, copy-on-write appends,
 * truncates, an undone append and drops, the copy a listener keeps from
 * the calls alone equals the cache's lists, and entries before `first`
 * were indeed unchanged. */
typedef struct hook_mirror_s {
  int32_t pages[MAXSEQ][64];
  int64_t n[MAXSEQ];
  int stale; /* an entry before `first` differed from the last call's */
  int calls;
} hook_mirror_t;

static void mirror_hook(void *arg, uint64_t id, const int32_t *pages, int64_t n_pages,
                        int64_t first) {
  hook_mirror_t *h = arg;
  int k = -1;
  for (int i = 0; i < MAXSEQ; i++)
    if (sid(i) == id) k = i;
  cr_assert(k >= 0 && n_pages <= 64);
  h->calls++;
  for (int64_t i = 0; i < first && i < h->n[k]; i++) h->stale |= h->pages[k][i] != pages[i];
  for (int64_t i = 0; i < n_pages; i++) h->pages[k][i] = pages[i];
  h->n[k] = n_pages;
}

static void mirror_check(world_t *w, const hook_mirror_t *h) {
  cr_assert(!h->stale, "an entry before `first` changed");
  for (int k = 0; k < 4; k++) {
    const fp4idx_cache_seq_t *s = fp4idx__cache_find(&w->c, sid(k));
    cr_assert_eq(h->n[k], s ? s->n_pages : 0, "seq %d", k);
    const int32_t *p = NULL;
    if (s) cr_assert_eq(fp4idx__cache_pages(&w->c, s, &p), FP4IDX_OK);
    for (int64_t i = 0; i < h->n[k]; i++)
      cr_assert_eq(h->pages[k][i], p[i], "seq %d page %lld", k, (long long)i);
  }
}

Test(cache_fork, page_hook_follows_fork_cow_truncate_undo_drop) {
  world_t w;
  static hook_mirror_t h;
  memset(&h, 0, sizeof h);
  w_init(&w, 64, 4);
  fp4idx__cache_set_pages_hook(&w.c, mirror_hook, &h);
  w_append(&w, 0, 10);
  cr_assert_eq(w_fork(&w, 0, 1, 10), FP4IDX_OK);
  mirror_check(&w, &h);
  w_append(&w, 1, 1); /* copy-on-write of the shared last page */
  cr_assert_eq(w.copies, 1);
  mirror_check(&w, &h);
  w_append(&w, 0, 5);
  cr_assert_eq(w_fork(&w, 1, 2, 6), FP4IDX_OK);
  w_append(&w, 2, 3); /* copy-on-write again, in the fork of a fork */
  mirror_check(&w, &h);
  cr_assert_eq(w_truncate(&w, 0, 3), FP4IDX_OK);
  w_append(&w, 0, 9);
  mirror_check(&w, &h);
  /* an append that copies and is undone puts the shared page back */
  cr_assert_eq(w_fork(&w, 0, 3, 7), FP4IDX_OK);
  int64_t first = 0;
  int cr = 0;
  cr_assert_eq(fp4idx__cache_append(&w.c, sid(3), 2, &first, NULL, &cr), FP4IDX_OK);
  fp4idx__cache_append_undo(&w.c, sid(3), 7, cr);
  mirror_check(&w, &h);
  w_check_scores(&w);
  cr_assert_eq(w_drop(&w, 0), FP4IDX_OK);
  mirror_check(&w, &h);
  cr_assert(h.calls > 8);
  w_fini(&w);
}
