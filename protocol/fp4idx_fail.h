/* fp4idx_fail.h -- the one helper that formats an error message and returns
 * its status, shared by the codec, the daemon and persist/ (not installed).
 *
 *   return fp4idx__fail(msg, cap, FP4IDX_ERANGE, "length %llu > %llu", a, b);
 */
#ifndef FP4IDX_FAIL_H
#define FP4IDX_FAIL_H

#include <stddef.h>

/* Formats the detail into msg[cap] (nothing when msg is NULL or cap 0) and
 * returns `status`. */
int fp4idx__fail(char *msg, size_t cap, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* FP4IDX_FAIL_H */
