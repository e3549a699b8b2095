/* cuda_seqpages.h -- device-resident page tables, one per sequence (the
 * backend's seq_pages_update).
 *
 * The daemon tells the backend every change of a sequence's page list
 * (append, truncate, drop, restore); the table keeps a device copy of each
 * list so that a score reads it in place instead of uploading it with every
 * request. Updates upload only the changed tail, through a pinned staging
 * buffer guarded by an event (no stream synchronization), and allocate with
 * the stream-ordered allocator (cudaMallocAsync / cudaFreeAsync: no device
 * synchronization either). Everything runs on the backend's stream, so a
 * score enqueued before an update reads the list as it was, one enqueued
 * after it the new one.
 *
 * Not thread-safe: the backend's one calling thread.
 */
#ifndef FP4IDX_CUDA_SEQPAGES_H
#define FP4IDX_CUDA_SEQPAGES_H

#include <stdint.h>

#include <cuda_runtime_api.h>

typedef struct fp4idx__seqpages_s fp4idx__seqpages_t;

/* An empty table. FP4IDX_OK, FP4IDX_ENOMEM or FP4IDX_EDEVICE (event). */
int fp4idx__seqpages_create(fp4idx__seqpages_t **out);

/* Frees every device list (stream-ordered on `stream`) and the table. */
void fp4idx__seqpages_destroy(fp4idx__seqpages_t *t, cudaStream_t stream);

/* Sequence `seq` holds pages[0..n) now, entries before `first` unchanged
 * since the last update (n == 0: forget it). On failure (FP4IDX_ENOMEM,
 * FP4IDX_EDEVICE) the sequence is forgotten, so get() misses. */
int fp4idx__seqpages_update(fp4idx__seqpages_t *t, cudaStream_t stream, uint64_t seq,
                            const int32_t *pages, int64_t n, int64_t first);

/* The device list of `seq` when it holds at least `need` pages, else NULL
 * (the caller uploads the list itself). */
const int32_t *fp4idx__seqpages_get(const fp4idx__seqpages_t *t, uint64_t seq, int64_t need);

#endif /* FP4IDX_CUDA_SEQPAGES_H */
