/* budget.c -- the global buffer budget and its policy (see budget.h). */
#define _GNU_SOURCE
#include "budget.h"

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
  uint64_t n = srv->n_conns ? srv->n_conns : 1;
  return (size_t)(fp4idx__budget_of(srv) / n);
}

static size_t fp4idx__budget_held(const fp4idx_conn_t *c) { return c->held_in + c->held_out; }

/* Under pressure: one of the connections holding the most (at least the
 * fair share), or one whose peer leaves replies unread -- more work for it
 * would only be held too. */
static int fp4idx__budget_top_holder(const fp4idx_conn_t *c) {
  return c->srv->over_budget &&
         (c->held_out > 0 || fp4idx__budget_held(c) >= fp4idx__budget_fair_share(c->srv));
}

void fp4idx__budget_hold(fp4idx_conn_t *c, int64_t in, int64_t out) {
  fp4idx_server_t *srv = c->srv;
  c->held_in = (size_t)((int64_t)c->held_in + in);
  c->held_out = (size_t)((int64_t)c->held_out + out);
  srv->held = (uint64_t)((int64_t)srv->held + in + out);
  uint64_t budget = fp4idx__budget_of(srv);
  if (!srv->over_budget && srv->held >= budget) {
    srv->over_budget = 1;
    if (srv->pressure) srv->pressure(srv, 1);
    fp4idx__log_debug("buffer budget reached: %llu bytes held by %llu connections",
                      (unsigned long long)srv->held, (unsigned long long)srv->n_conns);
  } else if (srv->over_budget && srv->held < budget - budget / 8) {
    srv->over_budget = 0;
    srv->grant = NULL;
    if (srv->pressure) srv->pressure(srv, 0);
    /* Everyone paused by the pressure may go on. Resuming may read and
     * dispatch, which holds more and may bring the pressure back: stop the
     * walk then (the next release walks again). */
    for (fp4idx_conn_t *k = srv->conns, *next; k && !srv->over_budget; k = next) {
      next = k->next;
      if (k != c) fp4idx__server_resume(k);
    }
  }
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
  if (srv->grant == c) return 1;
  if (!srv->grant && only_frame && !c->inflight) {
    srv->grant = c;
    return 1;
  }
  return 0;
}

int fp4idx__budget_may_dispatch(const fp4idx_conn_t *c) {
  if (c->inflight >= FP4IDX_SERVER_MAX_INFLIGHT) return 0;
  /* With nothing else running or unread, running the request is the only
   * way to release its body: never hold it back then. */
  if (!c->inflight && !c->held_out) return 1;
  if (c->held_out >= fp4idx__budget_conn_cap(c->srv)) return 0;
  return !fp4idx__budget_top_holder(c);
}

void fp4idx__budget_release_grant(fp4idx_conn_t *c) {
  if (c->srv->grant != c) return;
  c->srv->grant = NULL;
  /* Let another partial frame take it. */
  for (fp4idx_conn_t *k = c->srv->conns, *next; k && !c->srv->grant; k = next) {
    next = k->next;
    if (k != c && k->fr_held) fp4idx__server_resume(k);
  }
}

/* Once a second: close the connections that hold their share of unwritten
 * replies and whose peer read nothing for the timeout. */
static void fp4idx__budget_reap_cb(uv_timer_t *t) {
  fp4idx_server_t *srv = t->data;
  double now = fp4idx__stats_now_us();
  size_t cap = fp4idx__budget_conn_cap(srv), share = fp4idx__budget_fair_share(srv);
  size_t full = share < cap ? share : cap;
  for (fp4idx_conn_t *c = srv->conns, *next; c; c = next) {
    next = c->next;
    if (c->closing || c->held_out < full || now - c->progress_us < srv->buffer_timeout_us)
      continue;
    fp4idx__log_warn("connection %llu closed: %zu bytes of replies unread for %.0f s "
                     "(its share of the buffer budget is %zu bytes)",
                     (unsigned long long)c->id, c->held_out, (now - c->progress_us) / 1e6,
                     full);
    srv->slow_closed++;
    fp4idx__server_drop(c);
  }
}

void fp4idx__budget_start(fp4idx_server_t *srv) {
  if (srv->reaper_on) return;
  if (srv->buffer_timeout_us <= 0) srv->buffer_timeout_us = FP4IDX_BUDGET_TIMEOUT_DEFAULT_S * 1e6;
  uv_timer_init(srv->loop, &srv->reaper);
  srv->reaper.data = srv;
  uint64_t period = (uint64_t)(srv->buffer_timeout_us / 1e3 / 4);
  if (period < 10) period = 10;
  if (period > 1000) period = 1000;
  uv_timer_start(&srv->reaper, fp4idx__budget_reap_cb, period, period);
  uv_unref((uv_handle_t *)&srv->reaper); /* never what keeps the loop alive */
  srv->reaper_on = 1;
}

void fp4idx__budget_stop(fp4idx_server_t *srv) {
  if (!srv->reaper_on) return;
  srv->reaper_on = 0;
  uv_close((uv_handle_t *)&srv->reaper, NULL);
}
