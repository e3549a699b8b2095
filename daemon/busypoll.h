/* busypoll.h -- the event loop polls instead of sleeping while work is near.
 *
 * A thread that sleeps in epoll_wait or on a condition variable is woken by
 * the scheduler in tens of microseconds on a busy or virtualized host: on
 * the GPU that is more than a short request's whole compute. While busy
 * polling is on, a uv_idle_t handle keeps uv_run from blocking (libuv then
 * polls with a zero timeout), so the loop sees a frame or a worker's reply
 * as soon as it is there. It stays on while the worker holds requests, while
 * a reply is being written (up to FP4IDX_BUSYPOLL_WRITE_HOLD_US after the
 * last event: a client that stops reading does not keep it on), and for
 * spin_us after the last event, then the loop sleeps again. A long reply
 * (6.4 MB of logits take ~1 ms) would otherwise be written by a loop woken
 * from epoll for each socket buffer's worth, and the worker, which also
 * polls while the loop does (worker.h hold_spin), would sleep through it
 * and be woken late for the client's next request.
 *
 * Chosen once at start from the backend (daemon.c: on for the CUDA backend,
 * whose compute does not need the host's cores; off for the CPU backend,
 * whose threads do), or by --busy-poll-us. One per event loop (server.h:
 * each I/O loop has its own); each is used by its loop's thread only, and
 * all of them count in one shared `polling` word while they poll, which the
 * worker reads (worker.h hold_spin).
 */
#ifndef FP4IDX_DAEMON_BUSYPOLL_H
#define FP4IDX_DAEMON_BUSYPOLL_H

#include <stdint.h>
#include <uv.h>

/* The longest a reply being written keeps the loop polling after the last
 * event (a read, a reply, a write finished). */
#define FP4IDX_BUSYPOLL_WRITE_HOLD_US 20000

typedef struct fp4idx_busypoll_s {
  uv_idle_t idle;
  int spin_us;             /* 0: off (kick does nothing) */
  int on;                  /* the idle handle is active (atomic: the worker reads it) */
  uint64_t writing;        /* replies handed to uv_write, not yet written */
  double last_us;          /* the last kick (fp4idx__stats_now_us clock) */
  const uint64_t *busy;    /* nonzero while work is out (the worker's queued) */
  int *polling;            /* loops polling now (atomic, shared by all loops); may be NULL */
} fp4idx_busypoll_t;

/* Initialises bp on loop (inactive; polling NULL: set it after). spin_us 0
 * disables it. busy may be NULL. Returns 0 or a libuv error. */
int fp4idx__busypoll_init(fp4idx_busypoll_t *bp, uv_loop_t *loop, int spin_us,
                          const uint64_t *busy);

/* Something happened (a read, a reply ready, a write done): poll for the
 * next spin_us. */
void fp4idx__busypoll_kick(fp4idx_busypoll_t *bp);

/* A reply's write started (+1) or ended (-1); NULL bp: nothing. */
void fp4idx__busypoll_writing(fp4idx_busypoll_t *bp, int delta);

#endif /* FP4IDX_DAEMON_BUSYPOLL_H */
