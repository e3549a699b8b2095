/* bytes.h -- little helpers shared by the on-disk formats (snapshot.c,
 * aof.c, export.c): fixed little-endian integer fields, whatever the host's
 * byte order. */
#ifndef FP4IDX_PERSIST_BYTES_H
#define FP4IDX_PERSIST_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

static inline void fp4idx__put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void fp4idx__put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t fp4idx__get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t fp4idx__get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Error messages: fp4idx__fail (protocol/fp4idx_fail.h) formats one into a
 * caller's err[errlen] and returns the status. */
#include "fp4idx_fail.h"

#endif /* FP4IDX_PERSIST_BYTES_H */
