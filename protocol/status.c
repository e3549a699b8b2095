/* status.c -- names and messages of the codes in fp4idx_status.h, and
 * fp4idx__fail (fp4idx_fail.h), which pairs a status with its message. */
#include <stdarg.h>
#include <stdio.h>

#include "fp4idx_fail.h"
#include "fp4idx_status.h"

const char *fp4idx_strerror(int status) {
  switch (status) {
#define FP4IDX__STATUS_MSG(name, num, msg) \
  case num:                                \
    return msg;
    FP4IDX_STATUS_MAP(FP4IDX__STATUS_MSG)
#undef FP4IDX__STATUS_MSG
  }
  return "unknown status";
}

const char *fp4idx_status_name(int status) {
  switch (status) {
#define FP4IDX__STATUS_NAME(name, num, msg) \
  case num:                                 \
    return #name;
    FP4IDX_STATUS_MAP(FP4IDX__STATUS_NAME)
#undef FP4IDX__STATUS_NAME
  }
  return "UNKNOWN";
}

int fp4idx__fail(char *msg, size_t cap, int status, const char *fmt, ...) {
  if (msg != NULL && cap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
  }
  return status;
}
