/* engine.h -- the daemon's view of a compute backend.
 *
 * It holds the backend choice (--backend auto|cuda|cpu), the default pool
 * size and the calls the worker makes; the rest of the daemon reaches the
 * backend only through it.
 *
 * Threading: after fp4idx__engine_open, only the worker thread calls in
 * (fp4idx__engine_host_alloc / _free excepted: any thread).
 */
#ifndef FP4IDX_DAEMON_ENGINE_H
#define FP4IDX_DAEMON_ENGINE_H

#include <stdint.h>

#include "config.h"
#include "fp4idx_backend.h"

typedef struct fp4idx_engine_s fp4idx_engine_t;

/* What info/stats report. */
typedef struct fp4idx_engine_desc_s {
  char name[16];      /* "cpu" | "cuda" */
  char device[128];
  uint64_t mem_total, mem_free;
  uint64_t batch_work;  /* fp4idx_backend_info_t.batch_work */
  int device_outputs;   /* fp4idx_backend_info_t.device_outputs */
  uint64_t device_inputs_max; /* fp4idx_backend_info_t.device_inputs_max */
  int gpu;              /* 1: a GPU backend */
  int device_index;     /* CUDA ordinal, -1 for the CPU */
  int mps;              /* fp4idx_backend_info_t.mps */
  char pci_bus[32];     /* fp4idx_backend_info_t.pci_bus */
} fp4idx_engine_desc_t;

/* Opens the backend `cfg` asks for: cuda (FP4IDX_ENODEV when not built in or
 * no device), cpu, or auto (CUDA when built in and a GPU answers, else the
 * CPU, with one log line saying so). Then sizes the pool (cfg->cache_bytes,
 * or the default: CUDA 50% of free device memory, CPU min(25% of RAM, 4 GiB))
 * and creates it. Returns FP4IDX_OK, FP4IDX_ENODEV, FP4IDX_EINVAL (cache
 * smaller than a page), FP4IDX_ENOMEM, FP4IDX_EFULL, FP4IDX_EDEVICE. */
int fp4idx__engine_open(fp4idx_engine_t **out, const fp4idx_config_t *cfg,
                        fp4idx_engine_desc_t *desc, int64_t *n_pages);

/* A backend of the program's own, created in place of --backend's choice:
 * how a program other than fp4idxd links the daemon's core with another
 * backend (bench/fp4idxd_nowork.c, the benchmark-only no-work backend).
 * `create` makes the backend for cfg (FP4IDX_OK or an fp4idx status);
 * `name` is what the start-up logs call it. Set before the daemon starts
 * (fp4idx__daemon_init); create == NULL: --backend decides (the default). */
typedef int (*fp4idx_engine_backend_create_fn)(fp4idx_backend_t **out,
                                               const fp4idx_config_t *cfg);
void fp4idx__engine_set_backend(fp4idx_engine_backend_create_fn create, const char *name);

void fp4idx__engine_close(fp4idx_engine_t *e);

/* Refreshes desc (memory figures). */
int fp4idx__engine_describe(fp4idx_engine_t *e, fp4idx_engine_desc_t *desc);

/* backend->store / read / read_pages / write_pages; see fp4idx_backend.h. */
int fp4idx__engine_store(fp4idx_engine_t *e, const void *keys, fp4idx_dtype_t dtype,
                         int64_t n, const int64_t *slots, fp4idx_rounding_t rounding);
int fp4idx__engine_read(fp4idx_engine_t *e, const int64_t *slots, int64_t n,
                        int dequant, void *out);
int fp4idx__engine_read_pages(fp4idx_engine_t *e, int64_t first, int64_t count, void *out);
int fp4idx__engine_write_pages(fp4idx_engine_t *e, int64_t first, int64_t count,
                               const void *in);

/* backend->copy_pages of one page (the cache's copy-on-write callback:
 * ctx is the engine). Returns FP4IDX_OK or the backend's status. */
int fp4idx__engine_copy_page(void *ctx, int32_t from, int32_t to);


/* A score call in flight (fp4idx__engine_score_submit). */
typedef struct fp4idx_engine_call_s {
  uint64_t id;      /* engine-wide, increasing */
} fp4idx_engine_call_t;

/* Starts batch on the device and returns at once where the backend can
 * (score_submit); otherwise runs it to the end. Either way the inputs may
 * be reused on return; the outputs are final only after
 * fp4idx__engine_score_wait(call), which returns the call's status. When
 * FP4IDX_BACKEND_INFLIGHT calls are out already, the oldest is waited for
 * first (its status kept for its own wait). Every call must be waited for
 * once, in any order. Returns FP4IDX_OK or FP4IDX_ENOMEM (no room to track
 * the call; nothing ran). */
int fp4idx__engine_score_submit(fp4idx_engine_t *e, const fp4idx_backend_batch_t *batch,
                                fp4idx_engine_call_t *call);
int fp4idx__engine_score_wait(fp4idx_engine_t *e, fp4idx_engine_call_t call);

/* Before fp4idx__engine_score_wait: waits until more of the call's full
 * logits are on the host and sets *ready to the leading bytes there
 * (backend->score_wait_part), UINT64_MAX once all are (at once where the
 * backend has no parts, or after the whole call ran). Calls before it are
 * finished first. Returns FP4IDX_OK or the call's error (then
 * fp4idx__engine_score_wait returns it too). */
int fp4idx__engine_score_wait_part(fp4idx_engine_t *e, fp4idx_engine_call_t call,
                                   uint64_t *ready);

/* Waits for every score call in flight (their statuses kept for their own
 * waits): called before any other backend op, which must not overlap them. */
void fp4idx__engine_drain(fp4idx_engine_t *e);

/* backend->seq_pages_update when the backend has it (else FP4IDX_OK). */
int fp4idx__engine_seq_pages(fp4idx_engine_t *e, uint64_t seq, const int32_t *pages,
                             int64_t n_pages, int64_t first);

/* Host memory for score outputs (backend->host_alloc: pinned on CUDA; else
 * 64-byte aligned malloc). Any thread. NULL on failure; free with
 * fp4idx__engine_host_free (NULL is a no-op). */
void *fp4idx__engine_host_alloc(fp4idx_engine_t *e, size_t bytes);
void fp4idx__engine_host_free(fp4idx_engine_t *e, void *p);

#endif /* FP4IDX_DAEMON_ENGINE_H */
