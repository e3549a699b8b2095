/* spin.c -- the busy poll's window (see spin.h). */
#include "spin.h"

#include "fp4idx_client.h"

int fp4idx__client_spin_window(int setting, int64_t recent_us) {
  if (setting != FP4IDX_CLIENT_BUSY_POLL_AUTO) return setting > 0 ? setting : 0;
  if (recent_us <= 0 || recent_us > FP4IDX__CLIENT_SPIN_AUTO_MAX_US)
    return FP4IDX_CLIENT_BUSY_POLL_DEFAULT_US;
  int64_t w = recent_us + recent_us / 2 + 20;
  if (w < FP4IDX_CLIENT_BUSY_POLL_DEFAULT_US) w = FP4IDX_CLIENT_BUSY_POLL_DEFAULT_US;
  if (w > FP4IDX__CLIENT_SPIN_AUTO_MAX_US) w = FP4IDX__CLIENT_SPIN_AUTO_MAX_US;
  return (int)w;
}

int64_t fp4idx__client_spin_learn(int64_t recent_us, int64_t wait_us) {
  if (wait_us < 0) wait_us = 0;
  if (recent_us < 0) recent_us = 0;
  const int64_t decayed = recent_us - recent_us / 8;
  return wait_us > decayed ? wait_us : decayed;
}
