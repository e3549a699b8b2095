/* busypoll.c -- polling instead of sleeping while work is near (see
 * busypoll.h). */
#define _GNU_SOURCE
#include "busypoll.h"

#include "stats.h"

static void fp4idx__busypoll_idle_cb(uv_idle_t *h) {
  fp4idx_busypoll_t *bp = h->data;
  if (bp->busy && __atomic_load_n(bp->busy, __ATOMIC_RELAXED) > 0) return;
  double quiet = fp4idx__stats_now_us() - bp->last_us;
  if (quiet < bp->spin_us) return;
  if (bp->writing > 0 && quiet < FP4IDX_BUSYPOLL_WRITE_HOLD_US) return;
  uv_idle_stop(&bp->idle);
  __atomic_store_n(&bp->on, 0, __ATOMIC_RELEASE);
  if (bp->polling) __atomic_sub_fetch(bp->polling, 1, __ATOMIC_ACQ_REL);
}

int fp4idx__busypoll_init(fp4idx_busypoll_t *bp, uv_loop_t *loop, int spin_us,
                          const uint64_t *busy) {
  bp->spin_us = spin_us > 0 ? spin_us : 0;
  bp->on = 0;
  bp->writing = 0;
  bp->last_us = 0;
  bp->busy = busy;
  bp->polling = NULL;
  int rc = uv_idle_init(loop, &bp->idle);
  bp->idle.data = bp;
  return rc;
}

void fp4idx__busypoll_kick(fp4idx_busypoll_t *bp) {
  if (!bp || bp->spin_us == 0) return;
  bp->last_us = fp4idx__stats_now_us();
  if (!bp->on && uv_idle_start(&bp->idle, fp4idx__busypoll_idle_cb) == 0) {
    __atomic_store_n(&bp->on, 1, __ATOMIC_RELEASE);
    if (bp->polling) __atomic_add_fetch(bp->polling, 1, __ATOMIC_ACQ_REL);
  }
}

void fp4idx__busypoll_writing(fp4idx_busypoll_t *bp, int delta) {
  if (!bp) return;
  bp->writing += (uint64_t)(int64_t)delta;
  if (delta < 0) fp4idx__busypoll_kick(bp); /* the client's next request is near */
}
