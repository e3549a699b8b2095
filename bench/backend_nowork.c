/* backend_nowork.c -- the no-work backend (see backend_nowork.h). */
#define _GNU_SOURCE
#include "backend_nowork.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A submitted call, held until its wait. */
typedef struct fp4idx__nowork_call_s {
  int used;
  int ticket;
  int rc;
} fp4idx__nowork_call_t;

typedef struct fp4idx__nowork_s {
  fp4idx__nowork_call_t calls[FP4IDX_BACKEND_INFLIGHT];
  int next_ticket;
} fp4idx__nowork_t;

static double fp4idx__nowork_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void fp4idx__nowork_destroy(fp4idx_backend_t *b) {
  if (!b) return;
  free(b->impl);
  free(b);
}

static int fp4idx__nowork_describe(fp4idx_backend_t *b, fp4idx_backend_info_t *info) {
  if (!b || !info) return FP4IDX_EINVAL;
  memset(info, 0, sizeof *info);
  snprintf(info->name, sizeof info->name, "nowork");
  snprintf(info->device, sizeof info->device, "no compute (benchmark only)");
  info->device_index = -1;
  info->batch_work = (uint64_t)1 << 28; /* the CUDA backend's: batch as on the GPU */
  long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
  long psz = sysconf(_SC_PAGESIZE);
  if (pages > 0 && psz > 0) info->mem_total = (uint64_t)pages * (uint64_t)psz;
  if (avail > 0 && psz > 0) info->mem_free = (uint64_t)avail * (uint64_t)psz;
  return FP4IDX_OK;
}

/* Nothing is allocated: the pool is only its page count. */
static int fp4idx__nowork_pool_create(fp4idx_backend_t *b, int64_t n_pages,
                                      int32_t page_size) {
  if (!b || b->n_pages) return FP4IDX_EINVAL; /* called once */
  if (n_pages < 1 || !fp4idx_page_size_valid(page_size)) return FP4IDX_EINVAL;
  b->n_pages = n_pages;
  b->page_size = page_size;
  return FP4IDX_OK;
}

static int fp4idx__nowork_store(fp4idx_backend_t *b, const void *keys, fp4idx_dtype_t dtype,
                                int64_t n, const int64_t *slots, fp4idx_rounding_t mode) {
  (void)dtype, (void)mode;
  if (!b || n < 0 || (n > 0 && (!keys || !slots))) return FP4IDX_EINVAL;
  return FP4IDX_OK;
}

static int fp4idx__nowork_read(fp4idx_backend_t *b, const int64_t *slots, int64_t n,
                               int dequant, void *out) {
  if (!b || n < 0 || (n > 0 && (!slots || !out))) return FP4IDX_EINVAL;
  size_t each = dequant ? FP4IDX_HEAD_DIM * sizeof(float) : FP4IDX_SLOT_BYTES;
  if (n > 0) memset(out, 0, (size_t)n * each);
  return FP4IDX_OK;
}

/* 1 when [first, first + count) lies inside the pool and buf is there. */
static int fp4idx__nowork_pages_ok(const fp4idx_backend_t *b, int64_t first, int64_t count,
                                   const void *buf) {
  if (!b || first < 0 || count < 0 || first > b->n_pages || count > b->n_pages - first)
    return 0;
  return count == 0 || buf != NULL;
}

static int fp4idx__nowork_read_pages(fp4idx_backend_t *b, int64_t first, int64_t count,
                                     void *out) {
  if (!fp4idx__nowork_pages_ok(b, first, count, out)) return FP4IDX_EINVAL;
  if (count > 0) memset(out, 0, (size_t)(count * fp4idx_page_bytes(b->page_size)));
  return FP4IDX_OK;
}

static int fp4idx__nowork_write_pages(fp4idx_backend_t *b, int64_t first, int64_t count,
                                      const void *in) {
  return fp4idx__nowork_pages_ok(b, first, count, in) ? FP4IDX_OK : FP4IDX_EINVAL;
}

static int fp4idx__nowork_copy_pages(fp4idx_backend_t *b, int64_t from, int64_t to,
                                     int64_t count) {
  return fp4idx_backend_check_copy(b, from, to, count);
}

static int fp4idx__nowork_seq_pages(fp4idx_backend_t *b, uint64_t seq, const int32_t *pages,
                                    int64_t n_pages, int64_t first) {
  (void)seq;
  if (!b || n_pages < 0 || first < 0 || (n_pages > 0 && !pages)) return FP4IDX_EINVAL;
  return FP4IDX_OK;
}

/* Row r of sequence s, full logits: 0 where visible, -inf elsewhere. */
static void fp4idx__nowork_logits_row(const fp4idx_backend_seq_t *s, int32_t r, float *out) {
  const int64_t W = s->width, len = s->lens[r];
  const uint8_t *m = s->mask ? s->mask + (size_t)r * (size_t)W : NULL;
  if (!m) {
    memset(out, 0, (size_t)len * sizeof *out);
  } else {
    for (int64_t l = 0; l < len; l++) out[l] = m[l] ? 0.0f : -INFINITY;
  }
  for (int64_t l = len; l < W; l++) out[l] = -INFINITY;
}

/* Row r of sequence s, top-k: the first k visible positions, logit 0. */
static int32_t fp4idx__nowork_topk_row(const fp4idx_backend_seq_t *s, int32_t r, int32_t k,
                                       int32_t *pos, float *val) {
  const int64_t len = s->lens[r];
  const uint8_t *m = s->mask ? s->mask + (size_t)r * (size_t)s->width : NULL;
  int32_t n = 0;
  if (!m) {
    n = len < k ? (int32_t)len : k;
    for (int32_t i = 0; i < n; i++) pos[i] = i;
    memset(val, 0, (size_t)n * sizeof *val);
  } else {
    for (int64_t l = 0; l < len && n < k; l++)
      if (m[l]) {
        pos[n] = (int32_t)l;
        val[n++] = 0.0f;
      }
  }
  for (int32_t i = n; i < k; i++) {
    pos[i] = -1;
    val[i] = -INFINITY;
  }
  return n;
}

/* Checks the batch and writes its outputs; the call's host time is its
 * "kernels" time. */
static int fp4idx__nowork_score(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch) {
  double t0 = fp4idx__nowork_now_us();
  int rc = fp4idx_backend_check_score(b, batch);
  if (rc == FP4IDX_OK && batch->outputs_on_device) rc = FP4IDX_EINVAL; /* host memory only */
  if (rc != FP4IDX_OK) return rc;
  const int32_t k = batch->topk;
  size_t row = 0, cell = 0;
  for (int32_t si = 0; si < batch->n_seqs; si++) {
    const fp4idx_backend_seq_t *s = &batch->seqs[si];
    for (int32_t r = 0; r < s->rows; r++, row++) {
      if (k == 0) {
        fp4idx__nowork_logits_row(s, r, batch->logits + cell);
        cell += (size_t)s->width;
      } else {
        batch->topk_count[row] = fp4idx__nowork_topk_row(
            s, r, k, batch->topk_pos + row * (size_t)k, batch->topk_val + row * (size_t)k);
      }
    }
  }
  if (batch->timing) {
    memset(batch->timing, 0, sizeof *batch->timing);
    batch->timing->timed = 1;
    batch->timing->kernels_us = fp4idx__nowork_now_us() - t0;
  }
  return FP4IDX_OK;
}

static int fp4idx__nowork_submit(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch,
                                 int *ticket) {
  if (!b || !ticket) return FP4IDX_EINVAL;
  fp4idx__nowork_t *nw = b->impl;
  fp4idx__nowork_call_t *c = NULL;
  for (int i = 0; i < FP4IDX_BACKEND_INFLIGHT && !c; i++)
    if (!nw->calls[i].used) c = &nw->calls[i];
  if (!c) return FP4IDX_EINVAL; /* more in flight than the interface allows */
  int rc = fp4idx__nowork_score(b, batch);
  if (rc) return rc; /* nothing queued */
  c->used = 1;
  c->rc = FP4IDX_OK;
  c->ticket = nw->next_ticket;
  nw->next_ticket = nw->next_ticket == INT32_MAX ? 0 : nw->next_ticket + 1;
  *ticket = c->ticket;
  return FP4IDX_OK;
}

static int fp4idx__nowork_wait(fp4idx_backend_t *b, int ticket) {
  if (!b) return FP4IDX_EINVAL;
  fp4idx__nowork_t *nw = b->impl;
  for (int i = 0; i < FP4IDX_BACKEND_INFLIGHT; i++) {
    fp4idx__nowork_call_t *c = &nw->calls[i];
    if (c->used && c->ticket == ticket) {
      c->used = 0;
      return c->rc;
    }
  }
  return FP4IDX_EINVAL;
}

static const fp4idx_backend_ops_t fp4idx__nowork_ops = {
    .destroy = fp4idx__nowork_destroy,
    .describe = fp4idx__nowork_describe,
    .pool_create = fp4idx__nowork_pool_create,
    .store = fp4idx__nowork_store,
    .read = fp4idx__nowork_read,
    .score = fp4idx__nowork_score,
    .read_pages = fp4idx__nowork_read_pages,
    .write_pages = fp4idx__nowork_write_pages,
    .seq_pages_update = fp4idx__nowork_seq_pages,
    .copy_pages = fp4idx__nowork_copy_pages,
    .score_submit = fp4idx__nowork_submit,
    .score_wait = fp4idx__nowork_wait,
};

int fp4idx_backend_nowork_create(fp4idx_backend_t **out) {
  if (!out) return FP4IDX_EINVAL;
  *out = NULL;
  fp4idx_backend_t *b = calloc(1, sizeof *b);
  fp4idx__nowork_t *nw = calloc(1, sizeof *nw);
  if (!b || !nw) {
    free(b);
    free(nw);
    return FP4IDX_ENOMEM;
  }
  b->ops = &fp4idx__nowork_ops;
  b->impl = nw;
  *out = b;
  return FP4IDX_OK;
}
