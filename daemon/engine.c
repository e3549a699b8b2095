/* engine.c -- backend choice, pool sizing and calls (see engine.h). */
#define _GNU_SOURCE
#include "engine.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp4idx_backend.h"
#include "fp4idx_status.h"
#include "log.h"

/* Score calls submitted and not yet waited for by their owner: the ones
 * still on the device (ticket >= 0) and the ones already finished, kept
 * with their status (done) until their own wait. */
#define FP4IDX__ENGINE_CALLS 16

typedef struct fp4idx__engine_slot_s {
  uint64_t id;     /* 0: free */
  int ticket;      /* the backend's, -1 once finished */
  int rc;          /* status once finished */
} fp4idx__engine_slot_t;

struct fp4idx_engine_s {
  fp4idx_backend_t *b;
  fp4idx__engine_slot_t calls[FP4IDX__ENGINE_CALLS];
  uint64_t next_id;
  int on_device;   /* calls with ticket >= 0 */
};

/* fp4idx__engine_set_backend's choice (NULL: --backend decides). */
static fp4idx_engine_backend_create_fn fp4idx__engine_own_create;
static const char *fp4idx__engine_own_name;

void fp4idx__engine_set_backend(fp4idx_engine_backend_create_fn create, const char *name) {
  fp4idx__engine_own_create = create;
  fp4idx__engine_own_name = name ? name : "own";
}

#ifndef FP4IDX_HAVE_CUDA_BACKEND
/* Built without the CUDA backend: a cuda request has no device. */
static int fp4idx__engine_cuda_create(fp4idx_backend_t **out, int device) {
  (void)device;
  *out = NULL;
  return FP4IDX_ENODEV;
}
#else
static int fp4idx__engine_cuda_create(fp4idx_backend_t **out, int device) {
  return fp4idx_backend_cuda_create(out, device);
}
#endif

int fp4idx__engine_describe(fp4idx_engine_t *e, fp4idx_engine_desc_t *desc) {
  fp4idx_backend_info_t info;
  memset(&info, 0, sizeof info);
  int rc = e->b->ops->describe(e->b, &info);
  if (rc) return rc;
  memset(desc, 0, sizeof *desc);
  snprintf(desc->name, sizeof desc->name, "%.15s", info.name);
  snprintf(desc->device, sizeof desc->device, "%.127s", info.device);
  desc->mem_total = info.mem_total;
  desc->mem_free = info.mem_free;
  desc->batch_work = info.batch_work;
  desc->device_outputs = info.device_outputs;
  desc->device_inputs_max = info.device_inputs_max;
  desc->gpu = info.device_index >= 0;
  desc->device_index = info.device_index;
  desc->mps = info.mps;
  snprintf(desc->pci_bus, sizeof desc->pci_bus, "%.31s", info.pci_bus);
  return FP4IDX_OK;
}

static uint64_t fp4idx__engine_host_ram(void) {
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  return (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : 0;
}

int fp4idx__engine_open(fp4idx_engine_t **out, const fp4idx_config_t *cfg,
                        fp4idx_engine_desc_t *desc, int64_t *n_pages) {
  if (!out || !cfg || !desc || !n_pages) return FP4IDX_EINVAL;
  *out = NULL;
  fp4idx_engine_t *e = calloc(1, sizeof *e);
  if (!e) return FP4IDX_ENOMEM;
  int rc;
  int cuda = 0;
  const char *what = "cpu";
  if (fp4idx__engine_own_create) {
    what = fp4idx__engine_own_name;
    rc = fp4idx__engine_own_create(&e->b, cfg);
  } else if (cfg->backend == FP4IDX_BACKEND_CPU) {
    rc = fp4idx_backend_cpu_create(&e->b, cfg->threads);
  } else {
    rc = fp4idx__engine_cuda_create(&e->b, cfg->device);
    if (rc == FP4IDX_OK) {
      cuda = 1;
      what = "cuda";
    } else if (cfg->backend == FP4IDX_BACKEND_CUDA) {
      fp4idx__log_error("CUDA backend unavailable (device %d): %s", cfg->device,
                        fp4idx_strerror(rc));
      goto err;
    } else {
      fp4idx__log_info("no usable GPU (%s): using the CPU backend", fp4idx_strerror(rc));
      rc = fp4idx_backend_cpu_create(&e->b, cfg->threads);
    }
  }
  if (rc) {
    fp4idx__log_error("cannot create the %s backend: %s", what, fp4idx_strerror(rc));
    goto err;
  }
  rc = fp4idx__engine_describe(e, desc);
  if (rc) goto err;
  uint64_t bytes = cfg->cache_bytes;
  if (bytes == 0) {
    if (cuda) {
      bytes = desc->mem_free / 2;
    } else {
      uint64_t ram = desc->mem_total ? desc->mem_total : fp4idx__engine_host_ram();
      bytes = ram / 4;
      if (bytes > (4ull << 30)) bytes = 4ull << 30;
    }
  }
  uint64_t page_bytes = (uint64_t)cfg->page_size * FP4IDX_SLOT_BYTES;
  uint64_t pages = bytes / page_bytes;
  if (pages > INT32_MAX) pages = INT32_MAX; /* page ids are int32 */
  if (pages < 1) {
    fp4idx__log_error("cache of %llu bytes holds no page of %llu bytes",
                      (unsigned long long)bytes, (unsigned long long)page_bytes);
    rc = FP4IDX_EINVAL;
    goto err;
  }
  rc = e->b->ops->pool_create(e->b, (int64_t)pages, cfg->page_size);
  if (rc) {
    fp4idx__log_error("cannot allocate a pool of %llu pages (%llu bytes): %s",
                      (unsigned long long)pages, (unsigned long long)(pages * page_bytes),
                      fp4idx_strerror(rc));
    goto err;
  }
  *n_pages = (int64_t)pages;
  fp4idx__log_info("backend %s (%s): pool of %llu pages x %d keys = %llu bytes",
                   desc->name, desc->device, (unsigned long long)pages, cfg->page_size,
                   (unsigned long long)(pages * page_bytes));
  *out = e;
  return FP4IDX_OK;
err:
  fp4idx__engine_close(e);
  return rc;
}

void fp4idx__engine_close(fp4idx_engine_t *e) {
  if (!e) return;
  fp4idx__engine_drain(e);
  fp4idx_backend_destroy(e->b);
  free(e);
}

/* The oldest call still on the device, or NULL (calls run and are waited
 * for in submit order). */
static fp4idx__engine_slot_t *fp4idx__engine_oldest(fp4idx_engine_t *e) {
  fp4idx__engine_slot_t *old = NULL;
  for (int i = 0; i < FP4IDX__ENGINE_CALLS; i++) {
    fp4idx__engine_slot_t *s = &e->calls[i];
    if (s->id && s->ticket >= 0 && (!old || s->id < old->id)) old = s;
  }
  return old;
}

/* The slot of call, or NULL. */
static fp4idx__engine_slot_t *fp4idx__engine_find(fp4idx_engine_t *e, fp4idx_engine_call_t call) {
  for (int i = 0; i < FP4IDX__ENGINE_CALLS && call.id; i++)
    if (e->calls[i].id == call.id) return &e->calls[i];
  return NULL;
}

/* Finishes the oldest call still on the device. */
static void fp4idx__engine_finish_oldest(fp4idx_engine_t *e) {
  fp4idx__engine_slot_t *old = fp4idx__engine_oldest(e);
  if (!old) return;
  old->rc = e->b->ops->score_wait(e->b, old->ticket);
  old->ticket = -1;
  e->on_device--;
}

void fp4idx__engine_drain(fp4idx_engine_t *e) {
  while (e->on_device > 0) fp4idx__engine_finish_oldest(e);
}

int fp4idx__engine_score_submit(fp4idx_engine_t *e, const fp4idx_backend_batch_t *batch,
                                fp4idx_engine_call_t *call) {
  fp4idx__engine_slot_t *s = NULL;
  for (int i = 0; i < FP4IDX__ENGINE_CALLS && !s; i++)
    if (!e->calls[i].id) s = &e->calls[i];
  if (!s) return FP4IDX_ENOMEM; /* owners that never wait: a daemon bug */
  s->id = ++e->next_id;
  s->ticket = -1;
  call->id = s->id;
  if (!e->b->ops->score_submit) {
    s->rc = e->b->ops->score(e->b, batch);
    return FP4IDX_OK;
  }
  while (e->on_device >= FP4IDX_BACKEND_INFLIGHT) fp4idx__engine_finish_oldest(e);
  int t = -1;
  s->rc = e->b->ops->score_submit(e->b, batch, &t);
  if (s->rc == FP4IDX_OK && t >= 0) { /* t < 0: finished already */
    s->ticket = t;
    e->on_device++;
  }
  return FP4IDX_OK;
}

int fp4idx__engine_score_wait(fp4idx_engine_t *e, fp4idx_engine_call_t call) {
  fp4idx__engine_slot_t *s = fp4idx__engine_find(e, call);
  if (!s) return FP4IDX_EINVAL;
  while (s->ticket >= 0) fp4idx__engine_finish_oldest(e); /* in submit order */
  int rc = s->rc;
  s->id = 0;
  return rc;
}

int fp4idx__engine_score_wait_part(fp4idx_engine_t *e, fp4idx_engine_call_t call,
                                   uint64_t *ready) {
  *ready = UINT64_MAX;
  fp4idx__engine_slot_t *s = fp4idx__engine_find(e, call);
  if (!s) return FP4IDX_EINVAL;
  if (s->ticket < 0 || !e->b->ops->score_wait_part) {
    while (s->ticket >= 0) fp4idx__engine_finish_oldest(e);
    return s->rc;
  }
  /* the older calls first: the device runs them in submit order */
  while (fp4idx__engine_oldest(e) != s) fp4idx__engine_finish_oldest(e);
  int rc = e->b->ops->score_wait_part(e->b, s->ticket, ready);
  if (rc) { /* the call failed: finished now (s is the oldest), its wait returns the error */
    fp4idx__engine_finish_oldest(e);
    if (s->rc == FP4IDX_OK) s->rc = rc;
    *ready = UINT64_MAX;
  }
  return rc;
}

/* Every op but score waits for the score calls in flight first: they must
 * not overlap (fp4idx_backend.h, score_submit). */
int fp4idx__engine_store(fp4idx_engine_t *e, const void *keys, fp4idx_dtype_t dtype,
                         int64_t n, const int64_t *slots, fp4idx_rounding_t rounding) {
  fp4idx__engine_drain(e);
  return e->b->ops->store(e->b, keys, dtype, n, slots, rounding);
}

int fp4idx__engine_read(fp4idx_engine_t *e, const int64_t *slots, int64_t n,
                        int dequant, void *out) {
  fp4idx__engine_drain(e);
  return e->b->ops->read(e->b, slots, n, dequant, out);
}

int fp4idx__engine_read_pages(fp4idx_engine_t *e, int64_t first, int64_t count, void *out) {
  fp4idx__engine_drain(e);
  return e->b->ops->read_pages(e->b, first, count, out);
}

int fp4idx__engine_write_pages(fp4idx_engine_t *e, int64_t first, int64_t count,
                               const void *in) {
  fp4idx__engine_drain(e);
  return e->b->ops->write_pages(e->b, first, count, in);
}

int fp4idx__engine_copy_page(void *ctx, int32_t from, int32_t to) {
  fp4idx_engine_t *e = ctx;
  fp4idx__engine_drain(e);
  return e->b->ops->copy_pages(e->b, from, to, 1);
}

int fp4idx__engine_seq_pages(fp4idx_engine_t *e, uint64_t seq, const int32_t *pages,
                             int64_t n_pages, int64_t first) {
  if (!e->b->ops->seq_pages_update) return FP4IDX_OK;
  fp4idx__engine_drain(e);
  return e->b->ops->seq_pages_update(e->b, seq, pages, n_pages, first);
}

void *fp4idx__engine_host_alloc(fp4idx_engine_t *e, size_t bytes) {
  void *p = NULL;
  if (bytes == 0) bytes = 1;
  if (e->b->ops->host_alloc) return e->b->ops->host_alloc(e->b, bytes, &p) ? NULL : p;
  return posix_memalign(&p, 64, bytes) ? NULL : p;
}

void fp4idx__engine_host_free(fp4idx_engine_t *e, void *p) {
  if (!p) return;
  if (e->b->ops->host_free)
    e->b->ops->host_free(e->b, p);
  else
    free(p);
}
