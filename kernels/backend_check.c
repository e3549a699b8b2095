/* backend_check.c -- argument checks every backend's score and copy_pages
 * ops share.
 * The daemon validates requests before they reach a backend; these checks
 * keep a backend safe on its own (tests, benchmarks, other callers). */
#include "fp4idx_backend.h"

#include <stdint.h>

/* 1 when one of pages[0..n) lies outside 0..n_pages-1. One unsigned
 * compare per page (a negative page is a huge one), OR-ed without a branch
 * in blocks of a fixed length, which the compiler vectorizes: a
 * 400,000-key sequence names 6,250 pages, checked on every score, and the
 * loop of two compares and a branch per page takes ~5 us of the request on
 * the H200 host. */
static int fp4idx__pages_outside(const int32_t *pages, int64_t n, int64_t n_pages) {
  const uint32_t lim = n_pages > (int64_t)INT32_MAX ? (uint32_t)INT32_MAX + 1u : (uint32_t)n_pages;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    uint32_t bad = 0;
    for (int j = 0; j < 64; j++) bad |= (uint32_t)pages[i + j] >= lim;
    if (bad) return 1;
  }
  for (; i < n; i++)
    if ((uint32_t)pages[i] >= lim) return 1;
  return 0;
}

int fp4idx_backend_check_score(const fp4idx_backend_t *b,
                               const fp4idx_backend_batch_t *batch) {
  if (!b || !batch || b->n_pages < 1) return FP4IDX_EINVAL;
  if (batch->heads < 1 || batch->heads > FP4IDX_MAX_HEADS) return FP4IDX_EINVAL;
  if (batch->n_seqs < 0 || (batch->n_seqs > 0 && !batch->seqs)) return FP4IDX_EINVAL;
  if (batch->topk < 0) return FP4IDX_EINVAL;
  if (batch->done_word && !batch->done_written) return FP4IDX_EINVAL;
  if (batch->n_seqs > 0 &&
      (batch->topk == 0 ? !batch->logits
                        : (!batch->topk_pos || !batch->topk_val || !batch->topk_count)))
    return FP4IDX_EINVAL;
  const int64_t P = b->page_size;
  for (int32_t s = 0; s < batch->n_seqs; s++) {
    const fp4idx_backend_seq_t *sq = &batch->seqs[s];
    if (sq->rows < 1 || sq->n_keys < 0 || sq->width < 0 || sq->width > sq->n_keys)
      return FP4IDX_EINVAL;
    if (!sq->q || !sq->w || !sq->lens || (sq->n_keys > 0 && !sq->pages))
      return FP4IDX_EINVAL;
    if (sq->device_inputs & ~(FP4IDX_BACKEND_DEV_Q | FP4IDX_BACKEND_DEV_W |
                              FP4IDX_BACKEND_DEV_LENS))
      return FP4IDX_EINVAL;
    if ((sq->device_inputs & FP4IDX_BACKEND_DEV_Q) && ((uintptr_t)sq->q & 15u))
      return FP4IDX_EINVAL;
    if ((sq->device_inputs & FP4IDX_BACKEND_DEV_W) && ((uintptr_t)sq->w & 1u))
      return FP4IDX_EINVAL;
    if (sq->device_inputs & FP4IDX_BACKEND_DEV_LENS) {
      if ((uintptr_t)sq->lens & 3u) return FP4IDX_EINVAL;
    } else {
      for (int32_t r = 0; r < sq->rows; r++) /* device lens: checked on the device */
        if (sq->lens[r] < 0 || sq->lens[r] > sq->width) return FP4IDX_EINVAL;
    }
    /* Every page the sequence names must lie in the pool. */
    if (fp4idx__pages_outside(sq->pages, (sq->n_keys + P - 1) / P, b->n_pages))
      return FP4IDX_EINVAL;
  }
  return FP4IDX_OK;
}

int fp4idx_backend_check_copy(const fp4idx_backend_t *b, int64_t from, int64_t to,
                              int64_t count) {
  if (!b || b->n_pages < 1 || from < 0 || to < 0 || count < 0) return FP4IDX_EINVAL;
  if (from > b->n_pages - count || to > b->n_pages - count) return FP4IDX_EINVAL;
  if (count > 0 && from < to + count && to < from + count) return FP4IDX_EINVAL; /* overlap */
  return FP4IDX_OK;
}
