/* channel.c -- open channels, their watcher thread and the completion of
 * their calls (see channel.h, PROTOCOL.md "Channels"). */
#define _GNU_SOURCE
#include "channel.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fp4idx_fail.h"
#include "log.h"
#include "stats.h"

struct fp4idx_channel_s {
  uint64_t id;                  /* per connection, from 1 */
  fp4idx_channels_t *cs;
  fp4idx_regions_t *rs;         /* the connection's table (worker thread) */
  fp4idx_channel_t *next_conn;  /* the connection's list (worker thread) */
  fp4idx_channel_t *next;       /* the watched set (cs->mu) */
  uint8_t *block;
  size_t size;
  uint32_t nslots;
  int pinned;
  fp4idx_channel_bind_t bind;
  /* taken calls (cs->mu): ticket (0: none) and the descriptor as taken */
  uint32_t *taken;
  fp4idx_channel_desc_t *desc;
  uint32_t ntaken, cursor;
  int pending;                  /* calls taken since the job was queued (cs->mu) */
  int queued;                   /* the job is on the worker (cs->mu) */
  int closed;                   /* out of the set and unmapped (cs->mu) */
  uint64_t calls, errors;       /* completed (cs->mu) */
  fp4idx_job_t job;
};

/* ---- the watcher ---------------------------------------------------------- */

/* Takes the rung calls of ch (cs->mu held): copies each descriptor, writes
 * the doorbell back to 0 and `served`. A slot whose previous call is not
 * completed keeps its doorbell until it is. Returns how many. */
static int fp4idx__channel_take(fp4idx_channel_t *ch) {
  int n = 0;
  for (uint32_t i = 0; i < ch->nslots; i++) {
    fp4idx_channel_slot_t *s = fp4idx_channel_slot(ch->block, i);
    uint32_t t = __atomic_load_n(&s->doorbell, __ATOMIC_ACQUIRE);
    if (t == 0 || ch->taken[i]) continue;
    memcpy(&ch->desc[i], (const void *)&s->desc, sizeof ch->desc[i]);
    __atomic_store_n(&s->doorbell, 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&s->served, t, __ATOMIC_RELEASE);
    ch->taken[i] = t;
    ch->ntaken++;
    n++;
  }
  if (n) ch->pending = 1;
  return n;
}

/* Queues the job of each channel with taken calls and none queued (cs->mu
 * held); returns how many went into go[] (at most cap). The caller submits
 * them after unlocking: a queued channel is freed only by its job's done. */
static int fp4idx__channels_to_queue(fp4idx_channels_t *cs, fp4idx_channel_t **go, int cap) {
  int n = 0;
  for (fp4idx_channel_t *ch = cs->open; ch && n < cap; ch = ch->next)
    if (ch->pending && !ch->queued) {
      ch->pending = 0;
      ch->queued = 1;
      go[n++] = ch;
    }
  return n;
}

static void *fp4idx__channel_watch(void *arg) {
  fp4idx_channels_t *cs = arg;
  double last = fp4idx__stats_now_us();
  unsigned nap = FP4IDX_CHANNEL_NAP_MIN_US;
  fp4idx_channel_t *go[64];
  pthread_mutex_lock(&cs->mu);
  while (!cs->stopping) {
    if (!cs->open) {
      pthread_cond_wait(&cs->cv, &cs->mu);
      last = fp4idx__stats_now_us();
      continue;
    }
    int took = 0;
    for (fp4idx_channel_t *ch = cs->open; ch; ch = ch->next) took += fp4idx__channel_take(ch);
    const int n = fp4idx__channels_to_queue(cs, go, 64);
    pthread_mutex_unlock(&cs->mu);
    /* Straight onto the worker's queue: a call costs no wake of the loop
     * (tens of microseconds when it sleeps); channels past the 64th stay
     * pending for the next scan, which comes at once. */
    for (int i = 0; i < n; i++) fp4idx__worker_submit(cs->worker, &go[i]->job);
    double now = fp4idx__stats_now_us();
    if (took || n) {
      last = now;
      nap = FP4IDX_CHANNEL_NAP_MIN_US;
    } else if (now - last > FP4IDX_CHANNEL_SPIN_US) {
      usleep(nap); /* idle: back off */
      nap = nap * 2 > FP4IDX_CHANNEL_NAP_MAX_US ? FP4IDX_CHANNEL_NAP_MAX_US : nap * 2;
    } else {
      for (int i = 0; i < 64; i++) __asm__ __volatile__("" ::: "memory");
    }
    pthread_mutex_lock(&cs->mu);
  }
  pthread_mutex_unlock(&cs->mu);
  return NULL;
}

/* ---- calls on the worker ---------------------------------------------------- */

/* Counts one call of ch, before its completion can be seen (cs->mu held). */
static void fp4idx__channel_count_call(fp4idx_channel_t *ch) {
  ch->calls++;
  fp4idx__stats_channel(ch->cs->stats, 0, 0);
}

/* Writes slot i's completion word, unless the device already did
 * (`written`: then the client may have reset it for its next call on the
 * slot, and a store now would answer that one); counts the call unless
 * `counted`, and its failure (cs->mu held, block mapped). */
static void fp4idx__channel_complete(fp4idx_channel_t *ch, uint32_t i, int status, int written,
                                     int counted) {
  fp4idx_channel_slot_t *s = fp4idx_channel_slot(ch->block, i);
  /* only over the pending word (0): a client that lost its connection has
   * released the call with ECONN itself, and keeps that answer */
  uint32_t pending = 0;
  if (!written)
    __atomic_compare_exchange_n(&s->completion, &pending,
                                fp4idx_channel_completion(ch->taken[i], status), 0,
                                __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  ch->taken[i] = 0;
  ch->ntaken--;
  if (!counted) fp4idx__channel_count_call(ch);
  if (status) {
    ch->errors++;
    fp4idx__stats_channel_error(ch->cs->stats);
  }
}

int fp4idx__channel_call_check(const fp4idx_channel_t *ch, uint32_t slot,
                               fp4idx_channel_call_t *call, char *msg, size_t cap) {
  return fp4idx_channel_desc_check(&ch->desc[slot], ch->taken[slot], &ch->bind, call, msg, cap);
}

/* The next taken slot from the cursor, or nslots (cs->mu held). */
static uint32_t fp4idx__channel_next_taken(fp4idx_channel_t *ch) {
  for (uint32_t k = 0; ch->ntaken && k < ch->nslots; k++) {
    uint32_t i = (ch->cursor + k) % ch->nslots;
    if (ch->taken[i]) {
      ch->cursor = (i + 1) % ch->nslots;
      return i;
    }
  }
  return ch->nslots;
}

/* Runs every taken call of the channel, in ring order from the cursor. The
 * channel closes on this thread too, so it stays mapped throughout. */
static void fp4idx__channel_work(fp4idx_job_t *job) {
  fp4idx_channel_t *ch = job->data;
  fp4idx_channels_t *cs = ch->cs;
  char msg[320];
  for (;;) {
    pthread_mutex_lock(&cs->mu);
    uint32_t i = ch->closed ? ch->nslots : fp4idx__channel_next_taken(ch);
    if (i < ch->nslots) fp4idx__channel_count_call(ch); /* seen in stats once its stream goes on */
    pthread_mutex_unlock(&cs->mu);
    if (i == ch->nslots) break;
    fp4idx_channel_call_t call;
    msg[0] = '\0';
    int rc = fp4idx__channel_call_check(ch, i, &call, msg, sizeof msg), written = 0;
    /* released by the client already (its connection went while the call
     * waited here): not run, its ECONN stays */
    if (__atomic_load_n(&fp4idx_channel_slot(ch->block, i)->completion, __ATOMIC_ACQUIRE) &
        FP4IDX_CHANNEL_DONE)
      rc = FP4IDX_ECONN;
    /* the device's completion store goes only to a mapped (pinned) block */
    if (rc == FP4IDX_OK)
      rc = cs->run(cs->d, ch->rs, &call,
                   ch->pinned ? &fp4idx_channel_slot(ch->block, i)->completion : NULL,
                   fp4idx_channel_completion(ch->taken[i], FP4IDX_OK), &written, msg, sizeof msg);
    if (rc)
      fp4idx__log_debug("connection %" PRIu64 " channel %" PRIu64 " slot %u ticket %u: %s: %s",
                        ch->rs->conn_id, ch->id, i, ch->taken[i], fp4idx_status_name(rc), msg);
    pthread_mutex_lock(&cs->mu);
    /* a failure after the device stored success (a fault later in the
     * launch's wait) still completes with its error: a stream must not hang */
    fp4idx__channel_complete(ch, i, rc, written && rc == FP4IDX_OK, 1);
    pthread_mutex_unlock(&cs->mu);
  }
}

static void fp4idx__channel_free(fp4idx_channel_t *ch) {
  free(ch->taken);
  free(ch->desc);
  free(ch);
}

/* The job is back on the loop: again if calls were taken meanwhile; the
 * channel is freed here when it closed while the job was queued. */
static void fp4idx__channel_done(fp4idx_job_t *job) {
  fp4idx_channel_t *ch = job->data;
  fp4idx_channels_t *cs = ch->cs;
  pthread_mutex_lock(&cs->mu);
  ch->queued = 0;
  int gone = ch->closed, again = !gone && ch->pending && !cs->stopping;
  if (again) ch->pending = 0, ch->queued = 1;
  pthread_mutex_unlock(&cs->mu);
  if (gone) fp4idx__channel_free(ch);
  if (again) fp4idx__worker_submit(cs->worker, &ch->job);
}

/* ---- the set ---------------------------------------------------------------- */

int fp4idx__channels_init(fp4idx_channels_t *cs, fp4idx_worker_t *worker,
                          fp4idx_daemon_stats_t *stats, struct fp4idx_daemon_s *d,
                          fp4idx__channel_run_fn run) {
  memset(cs, 0, sizeof *cs);
  cs->stats = stats;
  cs->worker = worker;
  cs->d = d;
  cs->run = run;
  if (pthread_mutex_init(&cs->mu, NULL) != 0) return FP4IDX_EINTERNAL;
  if (pthread_cond_init(&cs->cv, NULL) != 0) {
    pthread_mutex_destroy(&cs->mu);
    return FP4IDX_EINTERNAL;
  }
  cs->ready = 1;
  return FP4IDX_OK;
}

void fp4idx__channels_stop(fp4idx_channels_t *cs) {
  if (!cs->ready) return;
  pthread_mutex_lock(&cs->mu);
  cs->stopping = 1;
  int started = cs->thread_started;
  pthread_cond_broadcast(&cs->cv);
  pthread_mutex_unlock(&cs->mu);
  if (started) pthread_join(cs->thread, NULL);
  cs->thread_started = 0;
}

void fp4idx__channels_fini(fp4idx_channels_t *cs) {
  if (!cs->ready) return;
  fp4idx__channels_stop(cs);
  cs->ready = 0;
  pthread_cond_destroy(&cs->cv);
  pthread_mutex_destroy(&cs->mu);
}

/* Out of the set, every taken call completed with ECONN, unmapped; freed
 * now or by the job's done. Worker thread. */
static void fp4idx__channel_shut(fp4idx_channel_t *ch, const char *why) {
  fp4idx_channels_t *cs = ch->cs;
  pthread_mutex_lock(&cs->mu);
  for (fp4idx_channel_t **p = &cs->open; *p; p = &(*p)->next)
    if (*p == ch) {
      *p = ch->next;
      cs->nopen--;
      fp4idx__stats_channel(cs->stats, -1, 0);
      break;
    }
  uint32_t pending = ch->ntaken;
  for (uint32_t i = 0; i < ch->nslots; i++)
    if (ch->taken[i]) fp4idx__channel_complete(ch, i, FP4IDX_ECONN, 0, 0);
  uint64_t calls = ch->calls, errors = ch->errors;
  pthread_mutex_unlock(&cs->mu);
  if (ch->pinned) fp4idx__region_cuda_unpin(ch->rs->cuda_device, ch->block);
  munmap(ch->block, ch->size);
  fp4idx__log_info("connection %" PRIu64 ": channel %" PRIu64 " closed (%s): %" PRIu64
                   " calls, %" PRIu64 " errors, %u pending completed with ECONN",
                   ch->rs->conn_id, ch->id, why, calls, errors, pending);
  pthread_mutex_lock(&cs->mu);
  ch->closed = 1;
  int now = !ch->queued;
  pthread_mutex_unlock(&cs->mu);
  if (now) fp4idx__channel_free(ch);
}

/* regions' on_clear: the connection closed. */
static void fp4idx__channels_conn_closed(fp4idx_regions_t *rs) {
  while (rs->channels) {
    fp4idx_channel_t *ch = rs->channels;
    rs->channels = ch->next_conn;
    fp4idx__channel_shut(ch, "connection closed");
  }
}

int fp4idx__channel_close(fp4idx_regions_t *rs, uint64_t id, char *msg, size_t cap) {
  for (fp4idx_channel_t **p = rs ? &rs->channels : NULL; p && *p; p = &(*p)->next_conn)
    if ((*p)->id == id) {
      fp4idx_channel_t *ch = *p;
      *p = ch->next_conn;
      fp4idx__channel_shut(ch, "channel_close");
      return FP4IDX_OK;
    }
  return fp4idx__fail(msg, cap, FP4IDX_ENOREGION,
                      "channel %" PRIu64 " is not open on this connection", id);
}

/* The regions of req, resolved on rs into ch->bind. */
static int fp4idx__channel_bind(const fp4idx_regions_t *rs, const fp4idx_channel_open_req_t *req,
                                fp4idx_channel_bind_t *b, char *msg, size_t cap) {
  const struct {
    const char *what;
    uint64_t id, *size;
  } want[4] = {{"q_region", req->q_region, &b->q_size},
               {"w_region", req->w_region, &b->w_size},
               {"out_region", req->out_region, &b->out_size},
               {"lens_region", req->lens_region, &b->lens_size}};
  *b = (fp4idx_channel_bind_t){.q_region = req->q_region, .w_region = req->w_region,
                               .out_region = req->out_region, .lens_region = req->lens_region};
  for (int i = 0; i < 4; i++) {
    if (i == 3 && want[i].id == 0) break; /* no lens region */
    const fp4idx_region_t *r = fp4idx__regions_find(rs, want[i].id);
    *want[i].size = r ? r->size : 0;
    if (!r)
      return fp4idx__fail(msg, cap, FP4IDX_ENOREGION,
                          "%s: region %" PRIu64 " is not registered on this connection",
                          want[i].what, want[i].id);
  }
  return FP4IDX_OK;
}

/* Adds ch to the watched set, starting the watcher with the first. */
static int fp4idx__channels_add(fp4idx_channels_t *cs, fp4idx_channel_t *ch, char *msg,
                                size_t cap) {
  int rc = FP4IDX_OK;
  pthread_mutex_lock(&cs->mu);
  if (cs->stopping) {
    rc = fp4idx__fail(msg, cap, FP4IDX_EINTERNAL, "the daemon is stopping: no new channel");
  } else if (!cs->thread_started) {
    if (pthread_create(&cs->thread, NULL, fp4idx__channel_watch, cs) != 0)
      rc = fp4idx__fail(msg, cap, FP4IDX_EINTERNAL, "cannot start the channel watcher");
    else
      cs->thread_started = 1, pthread_setname_np(cs->thread, "fp4idx-channel");
  }
  if (rc == FP4IDX_OK) {
    ch->next = cs->open;
    cs->open = ch;
    cs->nopen++;
    fp4idx__stats_channel(cs->stats, 1, 0);
    pthread_cond_signal(&cs->cv);
  }
  pthread_mutex_unlock(&cs->mu);
  return rc;
}

static int fp4idx__channel_count(const fp4idx_regions_t *rs) {
  int n = 0;
  for (const fp4idx_channel_t *c = rs->channels; c; c = c->next_conn) n++;
  return n;
}

int fp4idx__channel_open(fp4idx_channels_t *cs, fp4idx_regions_t *rs, int fd,
                         const fp4idx_channel_open_req_t *req,
                         fp4idx_channel_open_resp_t *resp, char *msg, size_t cap) {
  fp4idx_channel_bind_t bind;
  void *base = NULL;
  if (!rs || !cs->ready)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION, "channels need a connection");
  if (fp4idx__channel_count(rs) >= (int)FP4IDX_PROTO_MAX_CHANNELS)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "the connection already holds %u channels",
                        FP4IDX_PROTO_MAX_CHANNELS);
  int rc = fp4idx__channel_bind(rs, req, &bind, msg, cap);
  if (rc) return rc;
  if (req->size < fp4idx_channel_block_bytes(req->slots))
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "control block of %" PRIu64 " bytes, %u slots need %zu", req->size,
                        req->slots, fp4idx_channel_block_bytes(req->slots));
  rc = fp4idx__memfd_map(fd, req->size, &base, msg, cap);
  if (rc) return rc;
  rc = fp4idx_channel_block_check(base, (size_t)req->size, req->slots, msg, cap);
  fp4idx_channel_t *ch = rc ? NULL : calloc(1, sizeof *ch);
  if (ch) {
    ch->taken = calloc(req->slots, sizeof *ch->taken);
    ch->desc = calloc(req->slots, sizeof *ch->desc);
  }
  if (!rc && (!ch || !ch->taken || !ch->desc))
    rc = fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory for the channel");
  if (rc) goto fail;
  *ch = (fp4idx_channel_t){.id = rs->next_channel_id + 1,
                           .cs = cs, .rs = rs, .block = base, .size = (size_t)req->size,
                           .nslots = req->slots, .bind = bind, .taken = ch->taken,
                           .desc = ch->desc};
  ch->job = (fp4idx_job_t){.work = fp4idx__channel_work, .done = fp4idx__channel_done,
                           .data = ch};
  /* pinned, the block can take the daemon's stream writes; the CPU stores
   * of today's completions work either way */
  if (rs->cuda_device >= 0 && fp4idx__region_cuda_pin(rs->cuda_device, base, req->size) == 0)
    ch->pinned = 1;
  rc = fp4idx__channels_add(cs, ch, msg, cap);
  if (rc) {
    if (ch->pinned) fp4idx__region_cuda_unpin(rs->cuda_device, base);
    goto fail;
  }
  rs->next_channel_id = ch->id;
  ch->next_conn = rs->channels;
  rs->channels = ch;
  rs->on_clear = fp4idx__channels_conn_closed;
  fp4idx__log_info("connection %" PRIu64 " (pid %ld uid %ld gid %ld): channel %" PRIu64
                   " open, %u slots, regions q %" PRIu64 " w %" PRIu64 " lens %" PRIu64
                   " out %" PRIu64 "%s",
                   rs->conn_id, (long)rs->pid, (long)rs->uid, (long)rs->gid, ch->id, ch->nslots,
                   bind.q_region, bind.w_region, bind.lens_region, bind.out_region,
                   ch->pinned ? ", pinned" : "");
  *resp = (fp4idx_channel_open_resp_t){.channel = ch->id, .slots = ch->nslots};
  return FP4IDX_OK;
fail:
  if (ch) fp4idx__channel_free(ch);
  munmap(base, (size_t)req->size);
  return rc;
}
