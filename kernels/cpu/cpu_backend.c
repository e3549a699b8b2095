/* cpu_backend.c -- the CPU backend: page pool in host memory, store (quantize
 * + write, all-or-nothing), read back, raw page copies, describe. The scorer
 * lives in cpu_score.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "cpu_quant.h"

static fp4idx__cpu_t *fp4idx__impl(fp4idx_backend_t *b) {
  return (fp4idx__cpu_t *)b->impl;
}

static void fp4idx__cpu_destroy(fp4idx_backend_t *b) {
  if (!b) return;
  fp4idx__cpu_t *c = fp4idx__impl(b);
  if (c) {
    fp4idx__threads_destroy(c->threads);
    free(c->pool);
    free(c);
  }
  free(b);
}

/* First "model name" line of /proc/cpuinfo, or the architecture. */
static void fp4idx__cpu_model(char *buf, size_t n) {
  snprintf(buf, n, "%s",
#if defined(__x86_64__)
           "x86_64"
#elif defined(__aarch64__)
           "aarch64"
#else
           "cpu"
#endif
  );
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      char *p = strchr(line, ':');
      if (p) {
        p++;
        while (*p == ' ' || *p == '\t') p++;
        p[strcspn(p, "\n")] = 0;
        snprintf(buf, n, "%s", p);
      }
      break;
    }
  }
  fclose(f);
}

static int fp4idx__cpu_describe(fp4idx_backend_t *b, fp4idx_backend_info_t *info) {
  if (!b || !info) return FP4IDX_EINVAL;
  fp4idx__cpu_t *c = fp4idx__impl(b);
  memset(info, 0, sizeof *info);
  snprintf(info->name, sizeof info->name, "cpu");
  char model[96];
  fp4idx__cpu_model(model, sizeof model);
  snprintf(info->device, sizeof info->device, "%s, %d threads, %s", model,
           fp4idx__threads_count(c->threads), fp4idx__cpu_isa_name(c->isa));
  info->device_index = -1;
  /* the CPU's fixed cost per call (waking its threads) matters only for
   * small scores; past that, combining requests just queues them */
  info->batch_work = (uint64_t)1 << 22;
  long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
  long psz = sysconf(_SC_PAGESIZE);
  if (pages > 0 && psz > 0) info->mem_total = (uint64_t)pages * (uint64_t)psz;
  if (avail > 0 && psz > 0) info->mem_free = (uint64_t)avail * (uint64_t)psz;
  return FP4IDX_OK;
}

static int fp4idx__cpu_pool_create(fp4idx_backend_t *b, int64_t n_pages,
                                   int32_t page_size) {
  if (!b) return FP4IDX_EINVAL;
  fp4idx__cpu_t *c = fp4idx__impl(b);
  if (c->pool) return FP4IDX_EINVAL; /* called once */
  if (n_pages < 1 || !fp4idx_page_size_valid(page_size)) return FP4IDX_EINVAL;
  /* n_pages * page_size * FP4IDX_SLOT_BYTES must fit in size_t and int64 */
  if (n_pages > INT64_MAX / fp4idx_page_bytes(page_size)) return FP4IDX_ENOMEM;
  int64_t bytes = n_pages * fp4idx_page_bytes(page_size);
  if ((uint64_t)bytes > (uint64_t)SIZE_MAX) return FP4IDX_ENOMEM;
  c->pool = calloc(1, (size_t)bytes);
  if (!c->pool) return FP4IDX_ENOMEM;
  c->pool_bytes = bytes;
  b->n_pages = n_pages;
  b->page_size = page_size;
  return FP4IDX_OK;
}

/* Checks slots[0..n) against the pool. */
static int fp4idx__slots_valid(const fp4idx_backend_t *b, const int64_t *slots,
                               int64_t n) {
  int64_t total = b->n_pages * (int64_t)b->page_size;
  for (int64_t i = 0; i < n; i++)
    if (slots[i] < 0 || slots[i] >= total) return 0;
  return 1;
}

static void fp4idx__put_slot(fp4idx_backend_t *b, int64_t slot,
                             const uint8_t *payload, const uint8_t *scales) {
  uint8_t *pool = fp4idx__impl(b)->pool;
  memcpy(pool + fp4idx_payload_offset(slot, b->page_size), payload,
         FP4IDX_PAYLOAD_BYTES);
  memcpy(pool + fp4idx_scale_offset(slot, b->page_size), scales,
         FP4IDX_SCALE_BYTES);
}

static int fp4idx__cpu_store(fp4idx_backend_t *b, const void *keys,
                             fp4idx_dtype_t dtype, int64_t n,
                             const int64_t *slots, fp4idx_rounding_t mode) {
  if (!b || n < 0) return FP4IDX_EINVAL;
  if (n == 0) return FP4IDX_OK;
  if (!keys || !slots || !fp4idx__impl(b)->pool) return FP4IDX_EINVAL;
  if (dtype != FP4IDX_DTYPE_BF16 && dtype != FP4IDX_DTYPE_F32 &&
      dtype != FP4IDX_DTYPE_FP4)
    return FP4IDX_EINVAL;
  if (mode != FP4IDX_ROUND_RNE && mode != FP4IDX_ROUND_THRESHOLD)
    return FP4IDX_EINVAL;
  if (!fp4idx__slots_valid(b, slots, n)) return FP4IDX_EINVAL;
  if (dtype == FP4IDX_DTYPE_FP4) {
    const uint8_t *k = keys;
    for (int64_t i = 0; i < n; i++)
      fp4idx__put_slot(b, slots[i], k + i * FP4IDX_SLOT_BYTES,
                       k + i * FP4IDX_SLOT_BYTES + FP4IDX_PAYLOAD_BYTES);
    return FP4IDX_OK;
  }
  /* All-or-nothing: cpu_quant.c checks every key (pass 1, scales only) before
   * it writes any slot (pass 2), threads split the keys of large batches. */
  fp4idx__cpu_t *c = fp4idx__impl(b);
  return fp4idx__cpu_quant_store(c->threads, c->isa, keys, dtype, n, mode,
                                 c->pool, b->page_size, slots);
}

static int fp4idx__cpu_read(fp4idx_backend_t *b, const int64_t *slots,
                            int64_t n, int dequant, void *out) {
  if (!b || n < 0) return FP4IDX_EINVAL;
  if (n == 0) return FP4IDX_OK;
  fp4idx__cpu_t *c = fp4idx__impl(b);
  if (!slots || !out || !c->pool) return FP4IDX_EINVAL;
  if (!fp4idx__slots_valid(b, slots, n)) return FP4IDX_EINVAL;
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *pay = c->pool + fp4idx_payload_offset(slots[i], b->page_size);
    const uint8_t *sc = c->pool + fp4idx_scale_offset(slots[i], b->page_size);
    if (!dequant) {
      uint8_t *o = (uint8_t *)out + i * FP4IDX_SLOT_BYTES;
      memcpy(o, pay, FP4IDX_PAYLOAD_BYTES);
      memcpy(o + FP4IDX_PAYLOAD_BYTES, sc, FP4IDX_SCALE_BYTES);
    } else {
      float *o = (float *)out + i * FP4IDX_HEAD_DIM;
      for (int e = 0; e < FP4IDX_HEAD_DIM; e++) o[e] = fp4idx_slot_element(pay, sc, e);
    }
  }
  return FP4IDX_OK;
}

static int fp4idx__pages_range(fp4idx_backend_t *b, int64_t first, int64_t count,
                               const void *buf) {
  if (!b || !fp4idx__impl(b)->pool) return 0;
  if (first < 0 || count < 0 || first > b->n_pages || count > b->n_pages - first)
    return 0;
  return count == 0 || buf != NULL;
}

static int fp4idx__cpu_read_pages(fp4idx_backend_t *b, int64_t first,
                                  int64_t count, void *out) {
  if (!fp4idx__pages_range(b, first, count, out)) return FP4IDX_EINVAL;
  if (count == 0) return FP4IDX_OK;
  int64_t pb = fp4idx_page_bytes(b->page_size);
  memcpy(out, fp4idx__impl(b)->pool + first * pb, (size_t)(count * pb));
  return FP4IDX_OK;
}

static int fp4idx__cpu_write_pages(fp4idx_backend_t *b, int64_t first,
                                   int64_t count, const void *in) {
  if (!fp4idx__pages_range(b, first, count, in)) return FP4IDX_EINVAL;
  if (count == 0) return FP4IDX_OK;
  int64_t pb = fp4idx_page_bytes(b->page_size);
  memcpy(fp4idx__impl(b)->pool + first * pb, in, (size_t)(count * pb));
  return FP4IDX_OK;
}

static int fp4idx__cpu_copy_pages(fp4idx_backend_t *b, int64_t from, int64_t to,
                                  int64_t count) {
  if (!b || !fp4idx__impl(b)->pool) return FP4IDX_EINVAL;
  int rc = fp4idx_backend_check_copy(b, from, to, count);
  if (rc != FP4IDX_OK || count == 0) return rc;
  int64_t pb = fp4idx_page_bytes(b->page_size);
  uint8_t *pool = fp4idx__impl(b)->pool;
  memcpy(pool + to * pb, pool + from * pb, (size_t)(count * pb));
  return FP4IDX_OK;
}

/* Validates a whole batch (the daemon validates too; this keeps the backend
 * safe on its own) and runs the scorer. */
static int fp4idx__cpu_score_entry(fp4idx_backend_t *b,
                                   const fp4idx_backend_batch_t *batch) {
  if (!b || !fp4idx__impl(b)->pool) return FP4IDX_EINVAL;
  int rc = fp4idx_backend_check_score(b, batch);
  if (rc == FP4IDX_OK && batch->outputs_on_device) rc = FP4IDX_EINVAL; /* host memory only */
  for (int32_t i = 0; rc == FP4IDX_OK && i < batch->n_seqs; i++)
    if (batch->seqs[i].device_inputs) rc = FP4IDX_EINVAL; /* (info.device_inputs = 0) */
  if (rc != FP4IDX_OK) return rc;
  return fp4idx__cpu_score(b, batch);
}

static const fp4idx_backend_ops_t fp4idx__cpu_ops = {
    .destroy = fp4idx__cpu_destroy,
    .describe = fp4idx__cpu_describe,
    .pool_create = fp4idx__cpu_pool_create,
    .store = fp4idx__cpu_store,
    .read = fp4idx__cpu_read,
    .score = fp4idx__cpu_score_entry,
    .read_pages = fp4idx__cpu_read_pages,
    .write_pages = fp4idx__cpu_write_pages,
    .copy_pages = fp4idx__cpu_copy_pages,
};

int fp4idx_backend_cpu_create(fp4idx_backend_t **out, int threads) {
  if (!out || threads < 0) return FP4IDX_EINVAL;
  *out = NULL;
  if (threads == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    threads = n > 0 ? (int)(n > 256 ? 256 : n) : 1;
  }
  if (threads > 256) threads = 256; /* the top-k merge keeps one cursor per thread */
  fp4idx_backend_t *b = calloc(1, sizeof *b);
  fp4idx__cpu_t *c = calloc(1, sizeof *c);
  if (!b || !c) goto fail;
  if (fp4idx__threads_create(&c->threads, threads) != FP4IDX_OK) goto fail;
  c->isa = fp4idx__cpu_pick_isa();
  b->ops = &fp4idx__cpu_ops;
  b->impl = c;
  *out = b;
  return FP4IDX_OK;
fail:
  free(c);
  free(b);
  return FP4IDX_ENOMEM;
}
