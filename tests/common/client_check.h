/* client_check.h -- the client tests' assertion on a libfp4idx-client call:
 * CHECK(c, call) fails the test unless `call` returns FP4IDX_OK, naming the
 * call, the connection's last error message and the status. */
#ifndef FP4IDX_TEST_CLIENT_CHECK_H
#define FP4IDX_TEST_CLIENT_CHECK_H

#include <criterion/criterion.h>

#include "fp4idx_client.h"

#define CHECK(c, call)                                                                   \
  do {                                                                                   \
    int st_ = (call);                                                                    \
    cr_assert_eq(st_, FP4IDX_OK, "%s: %s (%s)", #call, fp4idx_client_last_error(c),      \
                 fp4idx_status_name(st_));                                               \
  } while (0)

#endif /* FP4IDX_TEST_CLIENT_CHECK_H */
