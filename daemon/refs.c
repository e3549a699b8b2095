/* refs.c -- request tensors resolved to memory (see refs.h). */
#define _GNU_SOURCE
#include "refs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_fail.h"

int fp4idx__refs_check(const fp4idx_regions_t *rs, const fp4idx_ref_t *refs, size_t n, char *msg,
                       size_t cap) {
  char what[32];
  const fp4idx_region_t *r;
  for (size_t i = 0; i < n; i++) {
    if (refs[i].t->region == 0) continue;
    snprintf(what, sizeof what, "%s %zu", refs[i].out ? "output" : "input", i);
    int rc = fp4idx__regions_check(rs, refs[i].t, what, &r, msg, cap);
    if (rc) return rc;
  }
  for (size_t i = 0; i < n; i++) {
    const fp4idx_tensor_t *a = refs[i].t;
    if (a->region == 0 || !refs[i].out || a->nbytes == 0) continue;
    for (size_t j = 0; j < n; j++) {
      const fp4idx_tensor_t *b = refs[j].t;
      if (j == i || b->region != a->region || b->nbytes == 0) continue;
      if (a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes)
        return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                            "output bytes [%" PRIu64 ", +%zu) of region %" PRIu64
                            " overlap the %s at [%" PRIu64 ", +%zu)",
                            a->offset, a->nbytes, a->region, refs[j].out ? "output" : "input",
                            b->offset, b->nbytes);
    }
  }
  return FP4IDX_OK;
}

int fp4idx__refs_input(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t, int copy,
                       int any_align, const void **ptr, void **owned, char *msg, size_t cap) {
  const fp4idx_region_t *r = NULL;
  *owned = NULL;
  *ptr = NULL;
  if (t->region == 0) {
    size_t a = any_align ? 1 : fp4idx_wire_dtype_size(t->dtype);
    if (t->nbytes && a && ((uintptr_t)t->data % a) == 0) {
      *ptr = t->data;
      return FP4IDX_OK;
    }
    if (!(*owned = malloc(t->nbytes ? t->nbytes : 1))) return FP4IDX_ENOMEM;
    if (t->nbytes) memcpy(*owned, t->data, t->nbytes);
    *ptr = *owned;
    return FP4IDX_OK;
  }
  int rc = fp4idx__regions_check(rs, t, "input", &r, msg, cap);
  if (rc) return rc;
  if (r->kind == FP4IDX_REGION_HOST && !copy) {
    *ptr = r->base + t->offset;
    return FP4IDX_OK;
  }
  if (!(*owned = malloc(t->nbytes ? t->nbytes : 1))) return FP4IDX_ENOMEM;
  *ptr = *owned;
  return fp4idx__region_read(r, t->offset, *owned, t->nbytes);
}

static void *fp4idx__refs_addr(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t, int kind) {
  const fp4idx_region_t *r = NULL;
  if (t->region == 0 || fp4idx__regions_check(rs, t, "output", &r, NULL, 0) || r->kind != kind)
    return NULL;
  return r->base + t->offset;
}

void *fp4idx__refs_direct(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t) {
  return fp4idx__refs_addr(rs, t, FP4IDX_REGION_HOST);
}

void *fp4idx__refs_device(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t) {
  return fp4idx__refs_addr(rs, t, FP4IDX_REGION_CUDA);
}

int fp4idx__refs_output(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t, const void *src,
                        char *msg, size_t cap) {
  const fp4idx_region_t *r = NULL;
  int rc = fp4idx__regions_check(rs, t, "output", &r, msg, cap);
  if (rc) return rc;
  if (r->base + t->offset == src) return FP4IDX_OK;
  return fp4idx__region_write(r, t->offset, src, t->nbytes);
}
