/* reply_region.c -- the connection's reply region: results of
 * fp4idx_client_topk of at least c->reply_min bytes come back through a
 * host region that the client creates for its connection (a sealed memfd
 * both processes map, PROTOCOL.md "Regions") instead of the socket. The
 * daemon's device-to-host copy lands in it, the socket carries only the
 * reply's header, and the caller's arrays are filled by one memcpy: the
 * socket's two copies of the results through the kernel, and the daemon's
 * write of them, are gone (H100, 400,000 keys top-2048, two runs: 110 and
 * 121 us into a host region against 125 and 141 through the socket,
 * docs/RESULTS.md). */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "client_internal.h"

/* Results above this many bytes stay on the socket (no region that large
 * is kept for one connection); regions grow in steps of the grain. */
#define FP4IDX__CLIENT_REPLY_REGION_MAX ((size_t)64 << 20)
#define FP4IDX__CLIENT_REPLY_REGION_GRAIN ((size_t)64 << 10)

int fp4idx__client_reply_wanted(const fp4idx_client_t *c, size_t bytes) {
  return c->reply_min > 0 && bytes >= c->reply_min && bytes <= FP4IDX__CLIENT_REPLY_REGION_MAX;
}

void fp4idx__client_reply_forget(fp4idx_client_t *c) {
  if (c->reply_ptr != NULL) munmap(c->reply_ptr, c->reply_size);
  c->reply_ptr = NULL;
  c->reply_size = 0;
  c->reply_id = 0;
}

fp4idx_status_t fp4idx__client_reply_region(fp4idx_client_t *c, size_t bytes, void **ptr,
                                            uint64_t *id) {
  if (c->reply_id == 0 || c->reply_size < bytes) {
    size_t size = c->reply_size * 2 > bytes ? c->reply_size * 2 : bytes;
    size = (size + FP4IDX__CLIENT_REPLY_REGION_GRAIN - 1) & ~(FP4IDX__CLIENT_REPLY_REGION_GRAIN - 1);
    if (size > FP4IDX__CLIENT_REPLY_REGION_MAX) size = FP4IDX__CLIENT_REPLY_REGION_MAX;
    if (c->reply_id != 0) { /* too small: released before the larger one is made */
      const uint64_t old = c->reply_id;
      void *op = c->reply_ptr;
      const size_t os = c->reply_size;
      /* forgotten first: an unregister that loses the connection must not
       * unmap it a second time (disconnect forgets the reply region) */
      c->reply_id = 0;
      c->reply_ptr = NULL;
      c->reply_size = 0;
      fp4idx_status_t st = fp4idx_client_region_unregister(c, old);
      munmap(op, os);
      if (st != FP4IDX_OK) return st;
    }
    uint64_t rid = 0;
    void *p = NULL;
    fp4idx_status_t st = fp4idx_client_region_create(c, size, &rid, &p);
    if (st != FP4IDX_OK) return st;
    c->reply_id = rid;
    c->reply_ptr = p;
    c->reply_size = size;
  }
  *ptr = c->reply_ptr;
  *id = c->reply_id;
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_set_reply_region(fp4idx_client_t *c, size_t min_bytes) {
  if (c == NULL) return FP4IDX_EINVAL;
  c->reply_min = min_bytes;
  fp4idx_status_t st = FP4IDX_OK;
  if (min_bytes == 0 && c->reply_id != 0) {
    if (fp4idx_client_connected(c)) st = fp4idx_client_region_unregister(c, c->reply_id);
    fp4idx__client_reply_forget(c);
  }
  return st == FP4IDX_OK ? fp4idx__client_fail(c, FP4IDX_OK, NULL) : st;
}
