/* backend_check.c -- argument checks every backend's score and copy_pages
 * ops share.
 * The daemon validates requests before they reach a backend; these checks
 * keep a backend safe on its own (tests, benchmarks, other callers). */
#include "fp4idx_backend.h"

int fp4idx_backend_check_score(const fp4idx_backend_t *b,
                               const fp4idx_backend_batch_t *batch) {
  if (!b || !batch || b->n_pages < 1) return FP4IDX_EINVAL;
  if (batch->heads < 1 || batch->heads > FP4IDX_MAX_HEADS) return FP4IDX_EINVAL;
  if (batch->n_seqs < 0 || (batch->n_seqs > 0 && !batch->seqs)) return FP4IDX_EINVAL;
  if (batch->topk < 0) return FP4IDX_EINVAL;
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
    for (int32_t r = 0; r < sq->rows; r++)
      if (sq->lens[r] < 0 || sq->lens[r] > sq->width) return FP4IDX_EINVAL;
    /* Every page the sequence names must lie in the pool. */
    const int64_t np = (sq->n_keys + P - 1) / P;
    for (int64_t p = 0; p < np; p++)
      if (sq->pages[p] < 0 || sq->pages[p] >= b->n_pages) return FP4IDX_EINVAL;
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
