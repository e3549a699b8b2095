/* status.c -- names and messages of the codes in fp4idx_status.h. */
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
