/* zalloc.h -- zeroed allocations for the request path.
 *
 * glibc's calloc does not take blocks from malloc's per-thread cache: on
 * the worker, which allocates a handful of small zeroed blocks per score,
 * each calloc cost ~300 instructions where malloc and a memset of the same
 * block cost a fraction of that (callgrind, no-work daemon). The blocks
 * are freed with free() as calloc's are. */
#ifndef FP4IDX_DAEMON_ZALLOC_H
#define FP4IDX_DAEMON_ZALLOC_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* n zeroed elements of size bytes, or NULL (out of memory, or n * size
 * overflows). */
static inline void *fp4idx__zalloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  const size_t bytes = n * size;
  void *p = malloc(bytes > 0 ? bytes : 1);
  /* the empty asm keeps the compiler from folding malloc + memset back
   * into calloc (GCC does at -O2) */
  __asm__ volatile("" : : "r"(p) : "memory");
  if (p) memset(p, 0, bytes);
  return p;
}

#endif /* FP4IDX_DAEMON_ZALLOC_H */
