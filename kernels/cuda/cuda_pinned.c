/* cuda_pinned.c -- the pinned host block cache (see cuda_pinned.h). */
#include "cuda_pinned.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "fp4idx_cuda.h"
#include "fp4idx_status.h"

/* Each block starts with this header; the caller gets base + 64. */
typedef struct fp4idx__pblock_s {
  size_t cap;                    /* usable bytes after the header */
  struct fp4idx__pblock_s *next; /* free list */
} fp4idx__pblock_t;

#define FP4IDX__PIN_HDR 64u
#define FP4IDX__PIN_MIN ((size_t)64 << 10)

struct fp4idx__pinned_s {
  pthread_mutex_t mu;
  fp4idx__pblock_t *free_list;
  size_t cached, keep;
};

int fp4idx__pinned_create(fp4idx__pinned_t **out, size_t keep_bytes) {
  fp4idx__pinned_t *p = calloc(1, sizeof *p);
  if (!p) return FP4IDX_ENOMEM;
  if (pthread_mutex_init(&p->mu, NULL)) {
    free(p);
    return FP4IDX_ENOMEM;
  }
  p->keep = keep_bytes;
  *out = p;
  return FP4IDX_OK;
}

void fp4idx__pinned_destroy(fp4idx__pinned_t *p) {
  if (!p) return;
  for (fp4idx__pblock_t *b = p->free_list, *n; b; b = n) {
    n = b->next;
    cudaFreeHost(b);
  }
  pthread_mutex_destroy(&p->mu);
  free(p);
}

int fp4idx__pinned_alloc(fp4idx__pinned_t *p, size_t bytes, void **out) {
  *out = NULL;
  pthread_mutex_lock(&p->mu);
  fp4idx__pblock_t **best = NULL;
  for (fp4idx__pblock_t **pp = &p->free_list; *pp; pp = &(*pp)->next)
    if ((*pp)->cap >= bytes && (*pp)->cap <= 2 * bytes + ((size_t)1 << 20) &&
        (!best || (*pp)->cap < (*best)->cap))
      best = pp;
  if (best) {
    fp4idx__pblock_t *b = *best;
    *best = b->next;
    p->cached -= b->cap;
    pthread_mutex_unlock(&p->mu);
    *out = (uint8_t *)b + FP4IDX__PIN_HDR;
    return FP4IDX_OK;
  }
  pthread_mutex_unlock(&p->mu);
  size_t cap = FP4IDX__PIN_MIN;
  while (cap < bytes && cap < ((size_t)1 << 62)) cap <<= 1;
  void *base = NULL;
  /* Portable: usable whatever device the calling thread has set. */
  cudaError_t e = cudaHostAlloc(&base, cap + FP4IDX__PIN_HDR, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    fp4idx__cuda_check(e, "alloc pinned output");
    return FP4IDX_ENOMEM;
  }
  fp4idx__pblock_t *b = base;
  b->cap = cap;
  b->next = NULL;
  *out = (uint8_t *)base + FP4IDX__PIN_HDR;
  return FP4IDX_OK;
}

void fp4idx__pinned_free(fp4idx__pinned_t *p, void *ptr) {
  if (!ptr) return;
  fp4idx__pblock_t *b = (fp4idx__pblock_t *)((uint8_t *)ptr - FP4IDX__PIN_HDR);
  pthread_mutex_lock(&p->mu);
  if (p->cached + b->cap <= p->keep) {
    b->next = p->free_list;
    p->free_list = b;
    p->cached += b->cap;
    b = NULL;
  }
  pthread_mutex_unlock(&p->mu);
  if (b) cudaFreeHost(b); /* over the budget: really free it */
}
