/* fp4idx_backend.h -- the interface every compute backend implements.
 *
 * A backend owns the page pool (device memory for CUDA, host memory for the
 * CPU backend) and runs the contract of PROTOCOL.md's appendix (key format, quantizer, scorer): quantize and
 * store keys at given slots, read slots back, and score verify rows against a
 * sequence's pages (full logits or top-k). It knows nothing of sequences,
 * sockets or allocation policy: the daemon's cache (daemon/cache.c) maps
 * sequence positions to slots and hands the backend page lists.
 *
 * Threading: a backend object is used by one thread at a time (the daemon
 * gives each device one worker thread). A backend may use threads of its own
 * inside a call (the CPU backend does).
 *
 * All pointers passed in and out are HOST pointers; a device backend stages
 * them. Every function returns FP4IDX_OK or a negative fp4idx_status_t.
 */
#ifndef FP4IDX_BACKEND_H
#define FP4IDX_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp4idx_backend_s fp4idx_backend_t;

/* What a backend reports about itself (for `info`). */
typedef struct fp4idx_backend_info_s {
  char name[16];         /* "cpu" or "cuda" */
  char device[128];      /* e.g. "NVIDIA H200" or "x86_64, 2 threads" */
  int device_index;      /* CUDA ordinal, -1 for the CPU */
  uint64_t mem_total;    /* bytes of device (or host) memory */
  uint64_t mem_free;     /* bytes free at the time of the call */
  /* Most work (sum over sequences of rows x heads x width) that is worth
   * putting in ONE score call when requests could share it: a launch's
   * fixed cost is amortized up to there, beyond it a request would only
   * wait for its neighbours' compute. 0: never combine requests. */
  uint64_t batch_work;
  /* 1: score accepts outputs in this backend's device memory
   * (fp4idx_backend_batch_t.outputs_on_device), e.g. a client's CUDA
   * region: results never cross to the host. */
  int device_outputs;
  /* Not 0: score accepts q, w and lens in this backend's device memory
   * (fp4idx_backend_seq_t.device_inputs) and checks them on the device;
   * a call with such inputs takes device outputs of at most this many
   * bytes (FP4IDX_EINVAL beyond), and is fastest with at most this many
   * bytes of device inputs a sequence. 0: host inputs only. */
  uint64_t device_inputs_max;
  /* GPU backends: 1 when the device's contexts are shared through MPS (the
   * process is an MPS client), 0 when not, -1 when the driver does not say;
   * 0 on the CPU. pci_bus: the device's PCI bus id ("0000:19:00.0"; "" on
   * the CPU), for NVML (daemon/sharing.h). */
  int mps;
  char pci_bus[32];
} fp4idx_backend_info_t;

/* One sequence of a score batch: R verify rows against the first keys of a
 * sequence whose keys live on `pages` (position l is at slot
 * pages[l / P] * P + l % P). */
typedef struct fp4idx_backend_seq_s {
  const int32_t *pages;  /* [ceil(n_keys / P)] page ids in position order */
  int64_t n_keys;        /* keys the sequence holds */
  int32_t rows;          /* R >= 1 */
  int64_t width;         /* logits columns; max(lens) <= width <= n_keys */
  const void *q;         /* [R, H, 128] bf16 bits, at any alignment (the
                            daemon passes them in place from the request's
                            frame): read with fp4idx_bf16_at */
  const void *w;         /* [R, H] bf16 bits, at any alignment */
  const int32_t *lens;   /* [R] visible counts, 0 <= lens[r] <= width */
  const uint8_t *mask;   /* [R, width] optional; 0 hides a position; NULL = none */
  uint64_t seq;          /* the sequence's id, meaningful when resident */
  int32_t resident;      /* 1: `pages` is what seq_pages_update last got for
                            `seq` (a device backend may use its own copy
                            instead of uploading the list); 0: upload */
  /* Which of q, w and lens are device addresses on the backend's device
   * (FP4IDX_BACKEND_DEV_*; only where info.device_inputs_max, 0
   * elsewhere): q
   * 16-byte aligned, w 2-byte, lens 4-byte, none of them read by the
   * caller. The call checks them on the device as the daemon checks host
   * inputs (q and w finite, 0 <= lens[r] <= width) and, when one fails,
   * writes no output to device outputs, stores the done word with the
   * failure's status and returns FP4IDX_ENONFINITE or FP4IDX_ERANGE (from
   * score, or score_wait) with the failure in batch.input_error. Full
   * logits of a sequence with device lens are -inf past lens[r] up to
   * `width`, which the caller chose (the caller has not seen max(lens)). */
  int32_t device_inputs;
} fp4idx_backend_seq_t;

#define FP4IDX_BACKEND_DEV_Q 1
#define FP4IDX_BACKEND_DEV_W 2
#define FP4IDX_BACKEND_DEV_LENS 4

/* Where the device's check of inputs in device memory failed: seq (index
 * in the batch), tensor (0 q, 1 w, 2 lens) and element (flat index). */
typedef struct fp4idx_backend_input_error_s {
  int32_t seq;
  int32_t tensor;
  uint64_t index;
} fp4idx_backend_input_error_t;

/* Where a device backend's score call spent its time, in microseconds:
 * copies in, kernels, copies out. The CUDA backend measures them on the
 * device (CUDA events) for one timed call in 16, since the events cost
 * device time, and splits each other call's host-measured time (start to
 * end seen) in the shares of the last measured call of its kind (full
 * logits or top-k). timed = 0 (nothing measured) from a backend that does
 * not time itself (the CPU backend: its whole call is compute). */
typedef struct fp4idx_backend_timing_s {
  int32_t timed;
  double upload_us;
  double kernels_us;
  double download_us;
} fp4idx_backend_timing_t;

/* A whole score call: one launch on a device backend.
 * Outputs, rows numbered across sequences in order (row_base of sequence s =
 * sum of rows of sequences before it):
 *   topk == 0: logits, sequence s writing [R_s, width_s] f32 at
 *              logits + sum over earlier sequences of R*width; -inf where a
 *              position is invisible (l >= lens[r], or masked).
 *   topk  > 0: for each row, up to topk (position, logit) pairs sorted by
 *              logit descending, ties by lower position, among visible
 *              positions (-inf logits are not visible and never returned):
 *              topk_pos/topk_val [total_rows, topk], topk_count [total_rows];
 *              unused entries are pos -1, logit -inf. */
typedef struct fp4idx_backend_batch_s {
  int32_t heads;                    /* H, 1..128 */
  int32_t n_seqs;
  const fp4idx_backend_seq_t *seqs;   /* [n_seqs] */
  int32_t topk;
  float *logits;
  int32_t *topk_pos;
  float *topk_val;
  int32_t *topk_count;
  fp4idx_backend_timing_t *timing;  /* optional out: device time of the call */
  /* 1: logits / topk_* are device addresses on the backend's device (only
   * where info.device_outputs); the call writes them there and copies
   * nothing to the host. 0: host memory. */
  int32_t outputs_on_device;
  /* 1: topk_pos < topk_val < topk_count lie in ONE buffer of the caller,
   * and the bytes between them are the caller's too: a device backend may
   * bring all three back with one copy (gaps included). 0: three arrays. */
  int32_t topk_one_buffer;
  /* Optional (NULL: none): a 4-byte host word the backend's device can
   * write (pinned and mapped, e.g. cudaHostRegister'd), and the value to
   * store there once every output of the call is in place. A device
   * backend that takes it on enqueues the store after its kernels and
   * copies, so that whoever waits on the word (a client's CUDA stream) sees
   * the outputs with no host in between, and sets *done_written = 1; the
   * store then happens if and only if the call's device work completes.
   * *done_written = 0 (done_written may not be NULL when done_word is
   * not): the caller stores it. */
  volatile uint32_t *done_word;
  uint32_t done_value;
  int32_t *done_written;
  /* Optional out (NULL: not wanted): set when a sequence's device_inputs
   * failed their check (score or score_wait returned FP4IDX_ENONFINITE or
   * FP4IDX_ERANGE for them); a failed call's done word, when the device
   * stored it, holds done_value | -status in its low 16 bits. */
  fp4idx_backend_input_error_t *input_error;
} fp4idx_backend_batch_t;

typedef struct fp4idx_backend_ops_s {
  /* Frees everything the backend holds, pool included. */
  void (*destroy)(fp4idx_backend_t *b);

  /* Fills *info. */
  int (*describe)(fp4idx_backend_t *b, fp4idx_backend_info_t *info);

  /* Allocates a zeroed pool of n_pages pages of page_size slots. Called once.
   * FP4IDX_EINVAL (bad page size, n_pages < 1), FP4IDX_ENOMEM / FP4IDX_EFULL
   * (memory), FP4IDX_EDEVICE. */
  int (*pool_create)(fp4idx_backend_t *b, int64_t n_pages, int32_t page_size);

  /* Quantizes n bf16 or f32 keys ([n,128]) and writes them to slots[i].
   * All-or-nothing: any NaN/inf -> FP4IDX_ENONFINITE and no slot changes.
   * dtype FP4IDX_DTYPE_FP4 stores packed [n,68] slots verbatim. */
  int (*store)(fp4idx_backend_t *b, const void *keys, fp4idx_dtype_t dtype,
               int64_t n, const int64_t *slots, fp4idx_rounding_t mode);

  /* Reads n slots back: dequant == 0 gives packed [n,68] bytes (payload then
   * scales, the wire's fp4 layout); dequant != 0 gives [n,128] f32. */
  int (*read)(fp4idx_backend_t *b, const int64_t *slots, int64_t n,
              int dequant, void *out);

  /* Scores a batch (see fp4idx_backend_batch_t). Inputs are validated by the
   * caller; the backend still returns FP4IDX_EINVAL on inconsistent shapes. */
  int (*score)(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch);

  /* Raw page bytes, for snapshots: copies pages [first, first+count) of the
   * pool to/from host memory (count * P * 68 bytes). */
  int (*read_pages)(fp4idx_backend_t *b, int64_t first, int64_t count, void *out);
  int (*write_pages)(fp4idx_backend_t *b, int64_t first, int64_t count, const void *in);

  /* Optional (NULL: nothing to keep). Sequence `seq` now holds the n_pages
   * pages pages[0..n_pages); entries before `first` are unchanged since the
   * last call for `seq` (first = 0: all new). n_pages == 0 forgets the
   * sequence. A device backend keeps a device copy of the list so that
   * scores with fp4idx_backend_seq_t.resident need not upload it. On
   * failure (FP4IDX_ENOMEM, FP4IDX_EDEVICE) the backend forgets `seq`, and
   * resident scores of it upload the list again: never wrong, only slower.
   * The daemon calls it after every append, truncate, drop and restore. */
  int (*seq_pages_update)(fp4idx_backend_t *b, uint64_t seq, const int32_t *pages,
                          int64_t n_pages, int64_t first);

  /* Optional (NULL: the caller uses aligned malloc/free). Host memory for
   * score outputs that the backend writes fastest (CUDA: pinned, so that
   * results come back from the device straight into it), 64-byte aligned.
   * Unlike the other ops these two may be called from any thread at any
   * time (the daemon frees a response buffer on its event loop once it is
   * written). host_alloc: FP4IDX_OK or FP4IDX_ENOMEM. */
  int (*host_alloc)(fp4idx_backend_t *b, size_t bytes, void **out);
  void (*host_free)(fp4idx_backend_t *b, void *p);
  /* Copies pool pages [from, from+count) to [to, to+count) inside the pool,
   * without a round trip through the host: the daemon's copy-on-write of a
   * shared, partly filled page (daemon/cache.h). The ranges must not overlap;
   * count == 0 is a no-op. Returns FP4IDX_OK, FP4IDX_EINVAL (no pool, range
   * outside it, overlap), FP4IDX_EDEVICE. */
  int (*copy_pages)(fp4idx_backend_t *b, int64_t from, int64_t to, int64_t count);

  /* Optional (NULL: only the synchronous score). score in two halves, so
   * that the host prepares the next call while the device runs this one:
   * score_submit checks the batch, stages its inputs (the caller may reuse
   * them once it returns), queues the call and returns with *ticket;
   * score_wait(ticket) returns when the outputs are written (and
   * batch->timing filled), with the call's status. Calls run in submit
   * order. At most FP4IDX_BACKEND_INFLIGHT calls may be submitted and not
   * yet waited for, they are waited for in submit order, and no other op of
   * the backend runs meanwhile (the daemon's engine guarantees all three);
   * the batch struct and its outputs stay valid until the wait. submit:
   * FP4IDX_OK or score's errors (nothing is queued then); wait: FP4IDX_OK,
   * FP4IDX_EINVAL (no such call in flight), FP4IDX_EDEVICE. */
  int (*score_submit)(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch, int *ticket);
  int (*score_wait)(fp4idx_backend_t *b, int ticket);
  /* Optional (NULL: score_wait only). For the oldest submitted call: waits
   * until more of its full logits (topk == 0, host outputs) are on the host
   * than before, and sets *ready to the leading bytes of batch->logits now
   * there (all sequences in order); UINT64_MAX once all of the call's
   * outputs are, which is at once for a call that copies its results back
   * in one piece. So a caller may send the first bytes while the rest is
   * still coming (a device backend copies large logits back in parts).
   * The first return that is not an error fills batch->timing with the
   * parts done so far (download: the first part). score_wait must still
   * be called (it returns at once after UINT64_MAX). FP4IDX_OK,
   * FP4IDX_EINVAL (no such call in flight), FP4IDX_EDEVICE. */
  int (*score_wait_part)(fp4idx_backend_t *b, int ticket, uint64_t *ready);
} fp4idx_backend_ops_t;

/* Score calls a backend with score_submit holds in flight at most. */
#define FP4IDX_BACKEND_INFLIGHT 2

struct fp4idx_backend_s {
  const fp4idx_backend_ops_t *ops;
  int64_t n_pages;    /* set by pool_create */
  int32_t page_size;  /* set by pool_create */
  void *impl;         /* the backend's own state */
};

/* Creates the CPU backend with `threads` worker threads (0 = one per core).
 * FP4IDX_ENOMEM on failure. */
int fp4idx_backend_cpu_create(fp4idx_backend_t **out, int threads);

/* Creates the CUDA backend on device ordinal `device`. FP4IDX_ENODEV when the
 * build has no CUDA, no GPU is present, or the ordinal does not exist. */
int fp4idx_backend_cuda_create(fp4idx_backend_t **out, int device);

/* Checks a score batch against the backend's pool and the shape rules of
 * fp4idx_backend_batch_t (heads 1..128, rows >= 1, max(lens) <= width <=
 * n_keys, every page of each sequence inside the pool, outputs present).
 * Returns FP4IDX_OK or FP4IDX_EINVAL. Both backends call it first. */
int fp4idx_backend_check_score(const fp4idx_backend_t *b,
                               const fp4idx_backend_batch_t *batch);

/* Checks a copy_pages request: pool present, both ranges inside it, no
 * overlap. Returns FP4IDX_OK or FP4IDX_EINVAL. Both backends call it first. */
int fp4idx_backend_check_copy(const fp4idx_backend_t *b, int64_t from, int64_t to,
                              int64_t count);

/* Convenience wrappers: b->ops->f(b, ...). */
static inline void fp4idx_backend_destroy(fp4idx_backend_t *b) {
  if (b) b->ops->destroy(b);
}

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_BACKEND_H */
