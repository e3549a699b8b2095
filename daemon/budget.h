/* budget.h -- the global budget for what connections make the daemon buffer:
 * replies done and not yet written out, and requests read and not yet run
 * (a partial frame, parsed bodies). --buffer-budget sets it (default
 * fp4idx__budget_default: a 64th of RAM, 64 MiB .. 2 GiB: what the
 * daemon may have to build before it says no is work others wait behind).
 *
 * The policy, in the order it applies (server.c asks at each step):
 *   - per connection: reading stops while it holds its cap,
 *     min(FP4IDX_SERVER_MAX_OUT_BYTES, budget / 4); its requests go to the
 *     worker one at a time (FP4IDX_SERVER_MAX_INFLIGHT), and none while its
 *     unwritten replies reach the cap; those of a connection with replies
 *     unwritten go to the worker's bulk lane, behind everyone else's;
 *   - when everything held reaches the budget (pressure, until it is back
 *     under 7/8 of it), the connections holding the most -- at least their
 *     fair share, budget / open connections -- and those with replies unread
 *     are neither read nor given to the worker, and the bulk lane waits;
 *     the others go on. One connection at a time (the grant) may
 *     still read the rest of a partial frame, so frames always complete;
 *   - a connection whose unwritten replies reach min(cap, fair share) and
 *     whose peer has read nothing for --buffer-timeout is closed, with a WARN.
 * Bound: what is held stays under budget + the reply of one normal-lane
 * request per connection (its first with replies unread) + one granted
 * frame.
 */
#ifndef FP4IDX_DAEMON_BUDGET_H
#define FP4IDX_DAEMON_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "server.h"

#define FP4IDX_BUDGET_MIN ((uint64_t)16 << 20)
#define FP4IDX_BUDGET_TIMEOUT_DEFAULT_S 30

/* The default budget for a host with ram_bytes of memory: ram / 64, clamped
 * to 64 MiB .. 2 GiB (64 MiB when ram_bytes is 0, i.e. unknown). */
uint64_t fp4idx__budget_default(uint64_t ram_bytes);

/* The per-connection cap and the fair share of srv's budget. */
size_t fp4idx__budget_conn_cap(const fp4idx_server_t *srv);
size_t fp4idx__budget_fair_share(const fp4idx_server_t *srv);

/* Adds (or, negative, removes) bytes c holds: `in` to held_in, `out` to
 * held_out, both to the server's total; enters or leaves pressure and, when
 * pressure lifts, resumes every connection. */
void fp4idx__budget_hold(fp4idx_conn_t *c, int64_t in, int64_t out);

/* 1 when c may be read now (its request count, cap and the pressure rule;
 * not eof/stopping, which server.c checks). */
int fp4idx__budget_may_read(fp4idx_conn_t *c);

/* 1 when c's next parsed request may go to the worker now. */
int fp4idx__budget_may_dispatch(const fp4idx_conn_t *c);

/* c is gone or finished its frame: frees the grant for another connection. */
void fp4idx__budget_release_grant(fp4idx_conn_t *c);

/* Starts / stops the timer that closes connections past the timeout. */
void fp4idx__budget_start(fp4idx_server_t *srv);
void fp4idx__budget_stop(fp4idx_server_t *srv);

#endif /* FP4IDX_DAEMON_BUDGET_H */
