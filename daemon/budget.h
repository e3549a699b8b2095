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
 *   - a reply of FP4IDX_BUDGET_SMALL_REPLY bytes or more is admitted before
 *     it is built (fp4idx__budget_admit, from the command layer, with the
 *     reply's upper bound): its bound is reserved while it is built and
 *     counted as held once it is done. A bound above the budget is refused
 *     (E2BIG, the message says how to ask for less); one that does not fit
 *     beside what is held and reserved now waits (the request goes back to
 *     its connection and is tried again as bytes are released). When no
 *     reply is held or reserved anywhere, a reply within the budget is
 *     admitted whatever bodies are held, so they can always drain.
 * What is held counts each request's own struct (FP4IDX_SERVER_REQ_BYTES)
 * beside its body and its reply, so many small pipelined requests count
 * what they cost. `stats` reports the count, its peak and the budget.
 * Bound: what is held stays under budget + one granted frame + a small
 * reply (< FP4IDX_BUDGET_SMALL_REPLY) per connection; only while the budget
 * is filled by request bodies alone may one admitted reply go beyond it.
 */
#ifndef FP4IDX_DAEMON_BUDGET_H
#define FP4IDX_DAEMON_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "server.h"

#define FP4IDX_BUDGET_MIN ((uint64_t)16 << 20)
#define FP4IDX_BUDGET_TIMEOUT_DEFAULT_S 30
/* Replies below this many bytes are built without admission: the most a
 * connection holds of them is bounded by its request cap, and admitting
 * them would cost every small request a round of atomics. */
#define FP4IDX_BUDGET_SMALL_REPLY ((uint64_t)16 << 10)

/* fp4idx__budget_admit's answers. */
typedef enum {
  FP4IDX_BUDGET_ADMITTED = 0, /* build it; the bound is reserved */
  FP4IDX_BUDGET_LATER = 1,    /* does not fit now: try again once bytes are released */
  FP4IDX_BUDGET_NEVER = 2     /* above the whole budget: refuse it (E2BIG) */
} fp4idx_budget_admit_t;

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

/* Any thread (the worker, before building a reply): admits a reply of at
 * most `bytes` bytes. FP4IDX_BUDGET_ADMITTED: bytes is now reserved (when
 * at least FP4IDX_BUDGET_SMALL_REPLY; *reserved says how much, 0 for a
 * small reply) and must be given back with fp4idx__budget_unreserve once
 * the reply is held (or was not built). FP4IDX_BUDGET_LATER: nothing
 * reserved; the request waits (server.c). FP4IDX_BUDGET_NEVER: nothing
 * reserved; msg[0..msgcap) says why and what to ask for instead. */
fp4idx_budget_admit_t fp4idx__budget_admit(fp4idx_server_t *srv, uint64_t bytes,
                                           uint64_t *reserved, char *msg, size_t msgcap);

/* c's loop: gives back `bytes` reserved by fp4idx__budget_admit and lets
 * the connections whose reply waits try again (c: the caller's own, which
 * resumes itself). */
void fp4idx__budget_unreserve(fp4idx_conn_t *c, uint64_t bytes);

/* Any loop: 1 when a reply of `bytes` would be admitted now. */
int fp4idx__budget_fits(const fp4idx_server_t *srv, uint64_t bytes);

/* c is gone or finished its frame: frees the grant for another connection. */
void fp4idx__budget_release_grant(fp4idx_conn_t *c);

/* Any thread: what the budget counts now (held, reserved replies not
 * included), the most it has counted since start, and the budget itself,
 * in bytes (the `stats` fields buffered_bytes, buffered_bytes_peak,
 * buffer_budget). */
typedef struct fp4idx_budget_view_s {
  uint64_t held;
  uint64_t peak;
  uint64_t budget;
} fp4idx_budget_view_t;
void fp4idx__budget_view(const fp4idx_server_t *srv, fp4idx_budget_view_t *out);

/* io's thread: starts / stops io's timer that closes its connections past
 * the timeout. */
void fp4idx__budget_start(fp4idx_ioloop_t *io);
void fp4idx__budget_stop(fp4idx_ioloop_t *io);

/* io's thread: the walks of io's connections (not skip) that a message asks
 * for (server.h FP4IDX_IO_RESUME, _RETRY, _GRANT; other bits ignored). */
void fp4idx__budget_walk(fp4idx_ioloop_t *io, unsigned what, fp4idx_conn_t *skip);

#endif /* FP4IDX_DAEMON_BUDGET_H */
