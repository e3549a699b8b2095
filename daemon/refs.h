/* refs.h -- the tensors of a request resolved to memory the daemon can use:
 * inline bytes from the frame (read in place when aligned) or references
 * {region, offset, dtype, shape} into the connection's regions (regions.h;
 * protocol/PROTOCOL.md "Regions"): checked against their region, read into
 * a private copy where a value is checked and then used, written after the
 * backend ran. Worker thread (the region table lives there).
 */
#ifndef FP4IDX_DAEMON_REFS_H
#define FP4IDX_DAEMON_REFS_H

#include <stddef.h>

#include "fp4idx_codec.h"
#include "regions.h"

/* One tensor an op reads (out 0) or writes (out 1), for fp4idx__refs_check. */
typedef struct fp4idx_ref_s {
  const fp4idx_tensor_t *t;
  int out;
} fp4idx_ref_t;

/* Checks refs[0..n) before anything runs: every reference (t->region != 0)
 * against its region (fp4idx__regions_check: ENOREGION, EREGION), then that
 * no output overlaps another reference in the same region (a score must not
 * read what it overwrites, nor write two results on top of each other:
 * EREGION). Inline tensors are skipped. rs may be NULL (then any reference
 * is ENOREGION). FP4IDX_OK or the error, with the reason in msg. */
int fp4idx__refs_check(const fp4idx_regions_t *rs, const fp4idx_ref_t *refs, size_t n, char *msg,
                       size_t cap);

/* An input tensor as a host array in *ptr, aligned for its dtype unless
 * `any_align` (a consumer that reads it bytewise: q and w of a score).
 * Inline bytes are read in place when the frame holds them so aligned
 * (codec views lie at any byte offset), else copied. A host region is
 * read in place (its mapping is page-aligned, the offset a multiple of the
 * item size) unless `copy`; a CUDA region is copied to the host. `copy` is for values
 * that are checked and then used (lens are bounds, q and w must be finite,
 * packed keys' scales): the client can rewrite its region at any time, so
 * those are a private snapshot. *owned is what to free (may be NULL).
 * FP4IDX_OK, FP4IDX_ENOMEM, ENOREGION / EREGION (msg says why), EDEVICE. */
int fp4idx__refs_input(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t, int copy,
                       int any_align, const void **ptr, void **owned, char *msg, size_t cap);

/* Where the backend may write the results for a checked output reference
 * itself: a host region's address, or NULL (stage them, then
 * fp4idx__refs_output). Safe because the backends only write their outputs:
 * nothing the client writes there meanwhile is read back by the daemon. */
void *fp4idx__refs_direct(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t);

/* The device address of a checked output reference into a CUDA region, or
 * NULL (not a CUDA region). */
void *fp4idx__refs_device(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t);

/* Writes t->nbytes staged bytes at src to a checked output reference (a
 * no-op when the backend already wrote there). FP4IDX_OK, ENOREGION,
 * EREGION, EDEVICE. */
int fp4idx__refs_output(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t, const void *src,
                        char *msg, size_t cap);

#endif /* FP4IDX_DAEMON_REFS_H */
