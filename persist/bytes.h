/* bytes.h -- little helpers shared by the on-disk formats (snapshot.c,
 * aof.c, export.c) and notify.c: fixed little-endian integer fields, whatever
 * the host's byte order, and printf-style error messages into a caller's
 * buffer. */
#ifndef FP4IDX_PERSIST_BYTES_H
#define FP4IDX_PERSIST_BYTES_H

#include <stdarg.h>
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

/* Formats a message into err[errlen]; does nothing when err is NULL. */
static inline void fp4idx__seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void fp4idx__seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

#endif /* FP4IDX_PERSIST_BYTES_H */
