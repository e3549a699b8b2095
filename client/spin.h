/* spin.h -- how long a wait for a reply polls the socket before the
 * thread sleeps (libfp4idx-client internal; conn.c applies it). */
#ifndef FP4IDX_CLIENT_SPIN_H
#define FP4IDX_CLIENT_SPIN_H

#include <stdint.h>

/* The automatic window's ceiling, and the longest recent wait it follows:
 * a connection whose replies take longer is waiting behind other clients'
 * work, where a spinning thread takes a core from the daemon (H100 host,
 * 64 clients: 42-45 % of one in-process launch with 1,000 us spins against
 * 50-57 % with 50 us) and a wake-up is a small part of the wait. */
#define FP4IDX__CLIENT_SPIN_AUTO_MAX_US 500

/* The spin window of the next wait, in us. setting: the client's busy poll
 * (fp4idx_client_set_busy_poll): >= 0 is the window itself;
 * FP4IDX_CLIENT_BUSY_POLL_AUTO follows recent_us (fp4idx__client_spin_learn):
 * one and a half times it plus 20 us, at least
 * FP4IDX_CLIENT_BUSY_POLL_DEFAULT_US and at most
 * FP4IDX__CLIENT_SPIN_AUTO_MAX_US; FP4IDX_CLIENT_BUSY_POLL_DEFAULT_US when
 * nothing is learned yet (recent_us 0) or recent_us is above that ceiling.
 * Returns the window (0: sleep at once). */
int fp4idx__client_spin_window(int setting, int64_t recent_us);

/* The recent wait after a reply whose first bytes came wait_us after its
 * request was sent: the longer of wait_us and recent_us less an eighth, so
 * that a run of short calls (info) between long ones (scores) keeps the
 * long ones' window for a while, and a connection whose waits shrink sees
 * its window follow within a few dozen calls. Returns it (>= 0). */
int64_t fp4idx__client_spin_learn(int64_t recent_us, int64_t wait_us);

#endif
