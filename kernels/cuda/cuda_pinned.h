/* cuda_pinned.h -- a cache of pinned (page-locked) host blocks for score
 * outputs (the backend's host_alloc / host_free).
 *
 * cudaHostAlloc costs about a millisecond per few MB and cudaFreeHost
 * synchronizes the device, so blocks are kept once freed (up to a byte
 * budget) and handed out again to a request of a similar size. Results come
 * back from the device with one cudaMemcpyAsync straight into such a block,
 * which the daemon then writes to the socket from where it is.
 *
 * Thread-safe (one mutex): the worker allocates, the event loop frees.
 */
#ifndef FP4IDX_CUDA_PINNED_H
#define FP4IDX_CUDA_PINNED_H

#include <stddef.h>

typedef struct fp4idx__pinned_s fp4idx__pinned_t;

/* An empty cache keeping at most keep_bytes of freed blocks. FP4IDX_OK or
 * FP4IDX_ENOMEM. */
int fp4idx__pinned_create(fp4idx__pinned_t **out, size_t keep_bytes);

/* Frees every cached block; blocks still handed out must have come back. */
void fp4idx__pinned_destroy(fp4idx__pinned_t *p);

/* A 64-byte aligned pinned block of at least `bytes`: a cached one when one
 * fits (at most 2x + 1 MiB larger), else a new one (sizes rounded up to a
 * power of two, at least 64 KiB, so that they fit later requests).
 * FP4IDX_OK or FP4IDX_ENOMEM. */
int fp4idx__pinned_alloc(fp4idx__pinned_t *p, size_t bytes, void **out);

/* Gives a block back (NULL: nothing). */
void fp4idx__pinned_free(fp4idx__pinned_t *p, void *ptr);

#endif /* FP4IDX_CUDA_PINNED_H */
