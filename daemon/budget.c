/* budget.c -- the global buffer budget and its policy (see budget.h). */
#define _GNU_SOURCE
#include "budget.h"

#include <stdio.h>

#include "log.h"
#include "stats.h"

uint64_t fp4idx__budget_default(uint64_t ram_bytes) {
  const uint64_t lo = (uint64_t)64 << 20, hi = (uint64_t)2 << 30;
  uint64_t b = ram_bytes / 64;
  return b < lo ? lo : b > hi ? hi : b;
}

static uint64_t fp4idx__budget_of(const fp4idx_server_t *srv) {
  return srv->budget > FP4IDX_BUDGET_MIN ? srv->budget : FP4IDX_BUDGET_MIN;
}

size_t fp4idx__budget_conn_cap(const fp4idx_server_t *srv) {
  uint64_t cap = fp4idx__budget_of(srv) / 4;
  return cap < FP4IDX_SERVER_MAX_OUT_BYTES ? (size_t)cap : FP4IDX_SERVER_MAX_OUT_BYTES;
}

size_t fp4idx__budget_fair_share(const fp4idx_server_t *srv) {
  uint64_t n = __atomic_load_n(&srv->n_conns, __ATOMIC_ACQUIRE);
  if (!n) n = 1;
  return (size_t)(fp4idx__budget_of(srv) / n);
}

static size_t fp4idx__budget_held(const fp4idx_conn_t *c) { return c->held_in + c->held_out; }

/* Under pressure: one of the connections holding the most (at least the
 * fair share), or one whose peer leaves replies unread -- more work for it
 * would only be held too. */
static int fp4idx__budget_top_holder(const fp4idx_conn_t *c) {
  return __atomic_load_n(&c->srv->over_budget, __ATOMIC_ACQUIRE) &&
         (c->held_out > 0 || fp4idx__budget_held(c) >= fp4idx__budget_fair_share(c->srv));
}

static fp4idx_conn_t *fp4idx__budget_grant(const fp4idx_server_t *srv) {
  return __atomic_load_n(&srv->grant, __ATOMIC_ACQUIRE);
}

void fp4idx__budget_walk(fp4idx_ioloop_t *io, unsigned what, fp4idx_conn_t *skip) {
  fp4idx_server_t *srv = io->srv;
  if (what & FP4IDX_IO_RESUME) {
    /* Everyone paused by the pressure may go on. Resuming may read and
     * dispatch, which holds more and may bring the pressure back: stop the
     * walk then (the next release walks again). */
    for (fp4idx_conn_t *k = io->conns, *next;
         k && !__atomic_load_n(&srv->over_budget, __ATOMIC_ACQUIRE); k = next) {
      next = k->next;
      if (k != skip) fp4idx__server_resume(k);
    }
  }
  if (what & FP4IDX_IO_RETRY) {
    for (fp4idx_conn_t *k = io->conns, *next;
         k && __atomic_load_n(&srv->n_deferred, __ATOMIC_ACQUIRE); k = next) {
      next = k->next;
      if (k != skip && k->defer_bytes && fp4idx__budget_fits(srv, k->defer_bytes))
        fp4idx__server_resume(k);
    }
  }
  if (what & FP4IDX_IO_GRANT) {
    for (fp4idx_conn_t *k = io->conns, *next; k && !fp4idx__budget_grant(srv); k = next) {
      next = k->next;
      if (k != skip && k->fr_held) fp4idx__server_resume(k);
    }
  }
}

/* What a change of c's (on c's loop) lets every connection do: c's own
 * loop walks now (c resumes itself), the others are posted the walk. */
static void fp4idx__budget_everywhere(fp4idx_conn_t *c, unsigned what) {
  fp4idx_server_t *srv = c->srv;
  for (int i = 0; i < srv->n_io; i++)
    if (&srv->io[i] != c->io) fp4idx__server_io_post(&srv->io[i], what);
  fp4idx__budget_walk(c->io, what, c);
}

/* Under budget_mu: enters or leaves the pressure for `held` bytes held;
 * 1 when it lifted. */
static int fp4idx__budget_pressure(fp4idx_server_t *srv, uint64_t budget) {
  uint64_t held = __atomic_load_n(&srv->held, __ATOMIC_ACQUIRE);
  int over = __atomic_load_n(&srv->over_budget, __ATOMIC_ACQUIRE);
  if (!over && held >= budget) {
    __atomic_store_n(&srv->over_budget, 1, __ATOMIC_RELEASE);
    if (srv->pressure) srv->pressure(srv, 1);
    fp4idx__log_debug("buffer budget reached: %llu bytes held by %llu connections",
                      (unsigned long long)held,
                      (unsigned long long)__atomic_load_n(&srv->n_conns, __ATOMIC_ACQUIRE));
  } else if (over && held < budget - budget / 8) {
    __atomic_store_n(&srv->over_budget, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&srv->grant, NULL, __ATOMIC_RELEASE);
    if (srv->pressure) srv->pressure(srv, 0);
    return 1;
  }
  return 0;
}

void fp4idx__budget_hold(fp4idx_conn_t *c, int64_t in, int64_t out) {
  fp4idx_server_t *srv = c->srv;
  c->held_in = (size_t)((int64_t)c->held_in + in);
  c->held_out = (size_t)((int64_t)c->held_out + out);
  /* Every loop adds its connections' bytes; the worker reads the sums in
   * fp4idx__budget_admit. */
  uint64_t held = __atomic_add_fetch(&srv->held, (uint64_t)(in + out), __ATOMIC_ACQ_REL);
  uint64_t peak = __atomic_load_n(&srv->held_peak, __ATOMIC_ACQUIRE);
  while (held > peak && !__atomic_compare_exchange_n(&srv->held_peak, &peak, held, 0,
                                                      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
  if (out) __atomic_add_fetch(&srv->held_out, (uint64_t)out, __ATOMIC_ACQ_REL);
  uint64_t budget = fp4idx__budget_of(srv);
  if (srv->buffered) {
    __atomic_store_n(&srv->buffered->held, held, __ATOMIC_RELEASE);
    __atomic_store_n(&srv->buffered->peak, held > peak ? held : peak, __ATOMIC_RELEASE);
    __atomic_store_n(&srv->buffered->budget, budget, __ATOMIC_RELEASE);
  }
  int over = __atomic_load_n(&srv->over_budget, __ATOMIC_ACQUIRE);
  if (over ? held < budget - budget / 8 : held >= budget) {
    pthread_mutex_lock(&srv->budget_mu);
    int lifted = fp4idx__budget_pressure(srv, budget);
    pthread_mutex_unlock(&srv->budget_mu);
    if (lifted) {
      fp4idx__budget_everywhere(c, FP4IDX_IO_RESUME);
      return;
    }
  }
  if ((in < 0 || out < 0) && __atomic_load_n(&srv->n_deferred, __ATOMIC_ACQUIRE))
    fp4idx__budget_everywhere(c, FP4IDX_IO_RETRY);
}

/* Whether a reply of `bytes` fits beside held and reserved (see budget.h:
 * with no reply held or reserved anywhere, anything within the budget). */
static int fp4idx__budget_room(uint64_t budget, uint64_t held, uint64_t held_out,
                               uint64_t reserved, uint64_t bytes) {
  return held + reserved + bytes <= budget || held_out + reserved == 0;
}

void fp4idx__budget_view(const fp4idx_server_t *srv, fp4idx_budget_view_t *out) {
  out->held = __atomic_load_n(&srv->held, __ATOMIC_ACQUIRE);
  out->peak = __atomic_load_n(&srv->held_peak, __ATOMIC_ACQUIRE);
  out->budget = fp4idx__budget_of(srv);
}

int fp4idx__budget_fits(const fp4idx_server_t *srv, uint64_t bytes) {
  if (bytes < FP4IDX_BUDGET_SMALL_REPLY) return 1;
  /* Waiting replies already sent back to the worker count as reserved: they
   * are admitted there (or wait again) only later, and one release must not
   * send every waiting connection at the same room. */
  return fp4idx__budget_room(fp4idx__budget_of(srv), __atomic_load_n(&srv->held, __ATOMIC_ACQUIRE),
                             __atomic_load_n(&srv->held_out, __ATOMIC_ACQUIRE),
                             __atomic_load_n(&srv->reserved, __ATOMIC_ACQUIRE) +
                                 __atomic_load_n(&srv->admitting, __ATOMIC_ACQUIRE),
                             bytes);
}

fp4idx_budget_admit_t fp4idx__budget_admit(fp4idx_server_t *srv, uint64_t bytes,
                                           uint64_t *reserved, char *msg, size_t msgcap) {
  *reserved = 0;
  if (bytes < FP4IDX_BUDGET_SMALL_REPLY) return FP4IDX_BUDGET_ADMITTED;
  uint64_t budget = fp4idx__budget_of(srv);
  if (bytes > budget) {
    snprintf(msg, msgcap,
             "the reply would be %llu bytes, above the daemon's buffer budget of %llu bytes "
             "(--buffer-budget): ask for less at a time (read: from/count ranges; score: "
             "fewer rows or sequences, top-k, or out references into a region)",
             (unsigned long long)bytes, (unsigned long long)budget);
    return FP4IDX_BUDGET_NEVER;
  }
  uint64_t r = __atomic_load_n(&srv->reserved, __ATOMIC_ACQUIRE);
  do {
    uint64_t held = __atomic_load_n(&srv->held, __ATOMIC_ACQUIRE);
    uint64_t out = __atomic_load_n(&srv->held_out, __ATOMIC_ACQUIRE);
    if (!fp4idx__budget_room(budget, held, out, r, bytes)) return FP4IDX_BUDGET_LATER;
  } while (!__atomic_compare_exchange_n(&srv->reserved, &r, r + bytes, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE));
  *reserved = bytes;
  return FP4IDX_BUDGET_ADMITTED;
}

void fp4idx__budget_unreserve(fp4idx_conn_t *c, uint64_t bytes) {
  if (!bytes) return;
  __atomic_sub_fetch(&c->srv->reserved, bytes, __ATOMIC_ACQ_REL);
  if (__atomic_load_n(&c->srv->n_deferred, __ATOMIC_ACQUIRE))
    fp4idx__budget_everywhere(c, FP4IDX_IO_RETRY);
}

int fp4idx__budget_may_read(fp4idx_conn_t *c) {
  fp4idx_server_t *srv = c->srv;
  if (c->pending >= FP4IDX_SERVER_MAX_PENDING) return 0;
  /* Past the cap only to finish a frame that is all it holds (a frame may
   * be larger than the cap: it must still complete). */
  int only_frame = c->fr_held && c->held_in == c->fr_held && !c->held_out;
  if (fp4idx__budget_held(c) >= fp4idx__budget_conn_cap(srv) && !only_frame) return 0;
  if (!fp4idx__budget_top_holder(c)) return 1;
  /* A partial frame can only be released by finishing it: one connection at
   * a time may, when it waits on nothing else. */
  fp4idx_conn_t *g = fp4idx__budget_grant(srv);
  if (g == c) return 1;
  return !g && only_frame && !c->inflight &&
         __atomic_compare_exchange_n(&srv->grant, &g, c, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

int fp4idx__budget_may_dispatch(const fp4idx_conn_t *c) {
  if (c->inflight >= FP4IDX_SERVER_MAX_INFLIGHT) return 0;
  /* A request whose reply was not admitted waits until it fits. */
  if (c->defer_bytes && !fp4idx__budget_fits(c->srv, c->defer_bytes)) return 0;
  /* With nothing else running or unread, running the request is the only
   * way to release its body: never hold it back then. */
  if (!c->inflight && !c->held_out) return 1;
  if (c->held_out >= fp4idx__budget_conn_cap(c->srv)) return 0;
  return !fp4idx__budget_top_holder(c);
}

void fp4idx__budget_release_grant(fp4idx_conn_t *c) {
  fp4idx_conn_t *g = c;
  if (!__atomic_compare_exchange_n(&c->srv->grant, &g, NULL, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return;
  fp4idx__budget_everywhere(c, FP4IDX_IO_GRANT); /* another partial frame may take it */
}

/* Once a second: close the connections that hold their share of unwritten
 * replies and whose peer read nothing for the timeout. */
static void fp4idx__budget_reap_cb(uv_timer_t *t) {
  fp4idx_ioloop_t *io = t->data;
  fp4idx_server_t *srv = io->srv;
  double now = fp4idx__stats_now_us();
  size_t cap = fp4idx__budget_conn_cap(srv), share = fp4idx__budget_fair_share(srv);
  size_t full = share < cap ? share : cap;
  for (fp4idx_conn_t *c = io->conns, *next; c; c = next) {
    next = c->next;
    if (c->closing || c->held_out < full || now - c->progress_us < srv->buffer_timeout_us)
      continue;
    fp4idx__log_warn("connection %llu closed: %zu bytes of replies unread for %.0f s "
                     "(its share of the buffer budget is %zu bytes)",
                     (unsigned long long)c->id, c->held_out, (now - c->progress_us) / 1e6,
                     full);
    __atomic_add_fetch(&srv->slow_closed, 1, __ATOMIC_RELAXED);
    fp4idx__server_drop(c);
  }
}

void fp4idx__budget_start(fp4idx_ioloop_t *io) {
  fp4idx_server_t *srv = io->srv;
  if (io->reaper_on) return;
  uv_timer_init(io->loop, &io->reaper);
  io->reaper.data = io;
  double timeout_us =
      srv->buffer_timeout_us > 0 ? srv->buffer_timeout_us : FP4IDX_BUDGET_TIMEOUT_DEFAULT_S * 1e6;
  uint64_t period = (uint64_t)(timeout_us / 1e3 / 4);
  if (period < 10) period = 10;
  if (period > 1000) period = 1000;
  uv_timer_start(&io->reaper, fp4idx__budget_reap_cb, period, period);
  uv_unref((uv_handle_t *)&io->reaper); /* never what keeps the loop alive */
  io->reaper_on = 1;
}

void fp4idx__budget_stop(fp4idx_ioloop_t *io) {
  if (!io->reaper_on) return;
  io->reaper_on = 0;
  uv_close((uv_handle_t *)&io->reaper, NULL);
}
