/* backend_nowork.h -- a benchmark-only backend that does no work.
 *
 * It implements kernels/fp4idx_backend.h without computing or keeping
 * anything, so that a daemon linked with it (fp4idxd-nowork,
 * bench/fp4idxd_nowork.c) shows the daemon's own cost per request: socket,
 * framing, decode, cache, batching, encode, wake-ups, writes. It is never
 * installed or packaged and is not part of fp4idxd.
 *
 * What it answers: the backend of a cache in which every key is zero.
 *   - store accepts any keys (no quantization, no NaN/inf check: it never
 *     returns FP4IDX_ENONFINITE) and keeps nothing; sequence lengths are
 *     the daemon's cache's, so they stay exact.
 *   - read and read_pages answer zeros (packed or dequantized); write_pages
 *     and copy_pages change nothing (copy_pages still checks its ranges).
 *   - score checks the batch (fp4idx_backend_check_score), then writes
 *     outputs of the right shape: full logits 0 at every visible position
 *     and -inf elsewhere; top-k the first min(k, visible) visible positions
 *     in increasing order with logit 0 (what the scorer returns for zero
 *     keys: equal logits, ties by lower position), then pos -1 / -inf.
 *   - score_submit does the same and score_wait returns at once, so the
 *     daemon takes the pipelined path of a device backend; the timing it
 *     reports is upload 0, download 0, kernels = the host time of its own
 *     call (checks and output writes), so every other stage is the
 *     daemon's.
 *   - describe: name "nowork", no device (index -1), the CUDA backend's
 *     batch_work (2^28) so that requests are batched as on the GPU.
 */
#ifndef FP4IDX_BENCH_BACKEND_NOWORK_H
#define FP4IDX_BENCH_BACKEND_NOWORK_H

#include "fp4idx_backend.h"

/* Creates the no-work backend. FP4IDX_OK, FP4IDX_EINVAL (out NULL) or
 * FP4IDX_ENOMEM. */
int fp4idx_backend_nowork_create(fp4idx_backend_t **out);

#endif /* FP4IDX_BENCH_BACKEND_NOWORK_H */
