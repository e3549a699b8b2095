/* cuda_seqpages.c -- device page tables per sequence (see cuda_seqpages.h). */
#include "cuda_seqpages.h"

#include <stdlib.h>
#include <string.h>

#include "fp4idx_cuda.h"
#include "fp4idx_status.h"

typedef struct fp4idx__sp_entry_s {
  uint64_t seq;
  int32_t *d;      /* device [cap] */
  int64_t cap, n;
  struct fp4idx__sp_entry_s *next;
} fp4idx__sp_entry_t;

struct fp4idx__seqpages_s {
  fp4idx__sp_entry_t **buckets;
  uint64_t nb;       /* power of two */
  uint64_t count;
  int32_t *h;        /* pinned staging of the uploads */
  int64_t h_cap;     /* in entries */
  cudaEvent_t h_free; /* the last upload from h has been read */
};

static uint64_t fp4idx__sp_hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

int fp4idx__seqpages_create(fp4idx__seqpages_t **out) {
  fp4idx__seqpages_t *t = calloc(1, sizeof *t);
  if (!t) return FP4IDX_ENOMEM;
  t->nb = 64;
  t->buckets = calloc(t->nb, sizeof *t->buckets);
  if (!t->buckets) {
    free(t);
    return FP4IDX_ENOMEM;
  }
  if (fp4idx__cuda_check(cudaEventCreateWithFlags(&t->h_free, cudaEventDisableTiming),
                         "seq pages: event")) {
    free(t->buckets);
    free(t);
    return FP4IDX_EDEVICE;
  }
  *out = t;
  return FP4IDX_OK;
}

static fp4idx__sp_entry_t **fp4idx__sp_find(const fp4idx__seqpages_t *t, uint64_t seq) {
  fp4idx__sp_entry_t **pp = &t->buckets[fp4idx__sp_hash(seq) & (t->nb - 1)];
  while (*pp && (*pp)->seq != seq) pp = &(*pp)->next;
  return pp;
}

static void fp4idx__sp_forget(fp4idx__seqpages_t *t, cudaStream_t stream, uint64_t seq) {
  fp4idx__sp_entry_t **pp = fp4idx__sp_find(t, seq), *e = *pp;
  if (!e) return;
  *pp = e->next;
  if (e->d) cudaFreeAsync(e->d, stream);
  free(e);
  t->count--;
}

void fp4idx__seqpages_destroy(fp4idx__seqpages_t *t, cudaStream_t stream) {
  if (!t) return;
  for (uint64_t i = 0; i < t->nb; i++)
    for (fp4idx__sp_entry_t *e = t->buckets[i], *n; e; e = n) {
      n = e->next;
      if (e->d) cudaFreeAsync(e->d, stream);
      free(e);
    }
  cudaStreamSynchronize(stream);
  if (t->h) cudaFreeHost(t->h);
  cudaEventDestroy(t->h_free);
  free(t->buckets);
  free(t);
}

/* Doubles the bucket array at load 1 (a failure just keeps the chains). */
static void fp4idx__sp_rehash(fp4idx__seqpages_t *t) {
  uint64_t nb = t->nb * 2;
  fp4idx__sp_entry_t **b = calloc(nb, sizeof *b);
  if (!b) return;
  for (uint64_t i = 0; i < t->nb; i++)
    for (fp4idx__sp_entry_t *e = t->buckets[i], *n; e; e = n) {
      n = e->next;
      uint64_t h = fp4idx__sp_hash(e->seq) & (nb - 1);
      e->next = b[h];
      b[h] = e;
    }
  free(t->buckets);
  t->buckets = b;
  t->nb = nb;
}

static int fp4idx__sp_upload(fp4idx__seqpages_t *t, cudaStream_t stream, int32_t *dst,
                             const int32_t *src, int64_t n) {
  if (n <= 0) return FP4IDX_OK;
  /* h is reused: wait until the previous upload has read it (by now it
   * almost always has: the updates come one request apart). */
  int rc = fp4idx__cuda_check(cudaEventSynchronize(t->h_free), "seq pages: staging wait");
  if (rc) return rc;
  if (n > t->h_cap) {
    int64_t cap = t->h_cap ? t->h_cap : 1024;
    while (cap < n) cap *= 2;
    if (t->h) cudaFreeHost(t->h);
    t->h = NULL;
    t->h_cap = 0;
    if (cudaMallocHost((void **)&t->h, (size_t)cap * 4) != cudaSuccess) {
      cudaGetLastError();
      return FP4IDX_ENOMEM;
    }
    t->h_cap = cap;
  }
  memcpy(t->h, src, (size_t)n * 4);
  rc = fp4idx__cuda_check(
      cudaMemcpyAsync(dst, t->h, (size_t)n * 4, cudaMemcpyHostToDevice, stream),
      "seq pages: upload");
  if (!rc) rc = fp4idx__cuda_check(cudaEventRecord(t->h_free, stream), "seq pages: record");
  return rc;
}

int fp4idx__seqpages_update(fp4idx__seqpages_t *t, cudaStream_t stream, uint64_t seq,
                            const int32_t *pages, int64_t n, int64_t first) {
  if (n <= 0) {
    fp4idx__sp_forget(t, stream, seq);
    return FP4IDX_OK;
  }
  if (first < 0 || first > n) first = 0;
  fp4idx__sp_entry_t **pp = fp4idx__sp_find(t, seq), *e = *pp;
  int rc = FP4IDX_OK;
  if (!e) {
    if (t->count >= t->nb) fp4idx__sp_rehash(t), pp = fp4idx__sp_find(t, seq);
    e = calloc(1, sizeof *e);
    if (!e) return FP4IDX_ENOMEM;
    e->seq = seq;
    e->next = *pp;
    *pp = e;
    t->count++;
    first = 0;
  }
  if (first > e->n) first = e->n; /* entries past the old length are new */
  if (n > e->cap) {
    int64_t cap = e->cap ? e->cap : 16;
    while (cap < n) cap *= 2;
    int32_t *d = NULL;
    cudaError_t err = cudaMallocAsync((void **)&d, (size_t)cap * 4, stream);
    if (err != cudaSuccess) {
      fp4idx__cuda_check(err, "seq pages: alloc");
      rc = err == cudaErrorMemoryAllocation ? FP4IDX_ENOMEM : FP4IDX_EDEVICE;
      goto fail;
    }
    /* the unchanged head moves on the device; stream order keeps earlier
     * scores on the old copy */
    if (e->d && first > 0 &&
        (rc = fp4idx__cuda_check(cudaMemcpyAsync(d, e->d, (size_t)first * 4,
                                                 cudaMemcpyDeviceToDevice, stream),
                                 "seq pages: move")))
      goto fail_new;
    if (e->d) cudaFreeAsync(e->d, stream);
    e->d = d;
    e->cap = cap;
    goto upload;
  fail_new:
    cudaFreeAsync(d, stream);
    goto fail;
  }
upload:
  rc = fp4idx__sp_upload(t, stream, e->d + first, pages + first, n - first);
  if (rc) goto fail;
  e->n = n;
  return FP4IDX_OK;
fail:
  fp4idx__sp_forget(t, stream, seq);
  return rc;
}

const int32_t *fp4idx__seqpages_get(const fp4idx__seqpages_t *t, uint64_t seq, int64_t need) {
  fp4idx__sp_entry_t *e = *fp4idx__sp_find(t, seq);
  return e && e->n >= need ? e->d : NULL;
}
