/* daemon.h -- the fp4idxd object: loop, engine, cache, worker, server, stats,
 * signals, and the seams other modules (systemd, persistence) hook into.
 *
 * Life cycle (main.c):
 *   fp4idx__daemon_init(d, cfg)        backend + pool + cache + loop
 *   [hooks->startup]                   e.g. restore a snapshot (runs inside
 *                                      fp4idx__daemon_start, before listening)
 *   fp4idx__daemon_listen_fd(d, fd)    inherited sockets (systemd), and/or
 *   fp4idx__daemon_listen_default(d)   --socket or the default path
 *   fp4idx__daemon_run(d)              worker + signals; [hooks->ready];
 *                                      runs until SIGINT/SIGTERM or
 *                                      fp4idx__daemon_stop; drains; then
 *                                      [hooks->shutdown] (worker stopped, cache
 *                                      and engine still alive)
 *   fp4idx__daemon_fini(d)
 */
#ifndef FP4IDX_DAEMON_DAEMON_H
#define FP4IDX_DAEMON_DAEMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cache.h"
#include "channel.h"
#include "config.h"
#include "engine.h"
#include "sharing.h"
#include "stages.h"
#include "stats.h"
#include "worker.h"

typedef struct fp4idx_daemon_s fp4idx_daemon_t;

/* What a mutation hook is told (worker thread, after validation). */
typedef enum fp4idx_mutation_e {
  FP4IDX_MUT_APPEND = 1,   /* pos = first position, count = keys, slots = packed [count, FP4IDX_SLOT_BYTES] */
  FP4IDX_MUT_TRUNCATE = 2, /* pos = new length */
  FP4IDX_MUT_DROP = 3,
  FP4IDX_MUT_FORK = 4      /* seq = the new sequence, pos = length, count = the source
                              sequence's id (as int64_t bits) */
} fp4idx_mutation_t;

/* Hooks for other modules; every member optional (NULL). All run with the
 * cache quiet: startup/ready/shutdown on the loop thread while no request
 * runs, mutation/save on the worker thread in request order. */
typedef struct fp4idx_daemon_hooks_s {
  /* After the pool and cache exist, before listening (restore a snapshot,
   * replay a log). A negative return aborts the start with that status. */
  int (*startup)(fp4idx_daemon_t *d, void *arg);
  /* Listening and serving (sd_notify READY=1). */
  void (*ready)(fp4idx_daemon_t *d, void *arg);
  /* Stopping was requested (sd_notify STOPPING=1). */
  void (*stopping)(fp4idx_daemon_t *d, void *arg);
  /* Every request answered, worker stopped, cache and engine still alive
   * (final snapshot). */
  void (*shutdown)(fp4idx_daemon_t *d, void *arg);
  /* A validated mutation, before the reply. APPEND: called after the keys
   * are stored (slots = what was stored, packed); a negative return undoes
   * the append and becomes the reply's status. TRUNCATE/DROP: called before
   * the change is applied; a negative return leaves the cache unchanged and
   * becomes the reply's status. FORK: called after the fork; a negative
   * return drops the new sequence and becomes the reply's status. */
  int (*mutation)(fp4idx_daemon_t *d, void *arg, fp4idx_mutation_t op, uint64_t seq,
                  int64_t pos, int64_t count, const uint8_t *slots);
  /* The "save" op. Returns FP4IDX_OK or a negative status with a message in
   * msg. Without this hook "save" answers EDISABLED. */
  int (*save)(fp4idx_daemon_t *d, void *arg, char *msg, size_t msgcap);
  void *arg;
} fp4idx_daemon_hooks_t;

struct fp4idx_daemon_s {
  fp4idx_config_t cfg;
  uv_loop_t loop;
  fp4idx_engine_t *engine;
  fp4idx_engine_desc_t desc;
  fp4idx_cache_t cache;         /* worker thread only once running */
  fp4idx_worker_t worker;
  struct fp4idx_server_s *server; /* the socket side (server.h), owned */
  fp4idx_buffered_t buffered;   /* the buffer budget's figures, as the server publishes them */
  fp4idx_daemon_stats_t stats;
  fp4idx_stages_t stages;       /* time per stage of the request path */
  fp4idx_channels_t channels;   /* open channels and their watcher */
  /* The cache's counts as of the last request the worker finished, for
   * requests answered on the loop (info, stats) and for the metrics
   * endpoint's thread: written by the worker after each request, read
   * anywhere (__atomic). */
  struct {
    uint64_t pages_free, sequences, keys, pages_shared;
  } pub;
  /* How the GPU is shared (sharing.h), as last read: at start, every
   * FP4IDX_SHARING_PERIOD_MS by a timer, and by info and stats when older
   * than FP4IDX_SHARING_FRESH_MS (any loop, the worker): under mu, but
   * `published`. */
  struct {
    pthread_mutex_t mu;
    fp4idx_sharing_t now;
    double at_us;              /* fp4idx__stats_now_us of the reading */
    int valid, warned;         /* warned: the time-slice warning was logged */
    /* The mode and other_processes of `now` in one word (other_processes
     * << 8 | mode), so that any thread reads both of one reading
     * (__atomic; fp4idx__daemon_sharing_published). */
    uint64_t published;
  } sharing;
  uv_timer_t sharing_timer;
  fp4idx_daemon_hooks_t hooks;
  uv_signal_t sig_int, sig_term;
  int started;                  /* startup hook ran */
  int stopping;
  int exit_code;
  int loop_ok, stats_ok, cache_ok, stages_ok, sharing_ok;
};

/* Builds the daemon from cfg: engine (backend choice, pool), cache, stats,
 * loop. Logs why on failure. Returns FP4IDX_OK or a negative status. */
int fp4idx__daemon_init(fp4idx_daemon_t *d, const fp4idx_config_t *cfg);

/* Installs hooks (copied). Call before fp4idx__daemon_listen_*. */
void fp4idx__daemon_set_hooks(fp4idx_daemon_t *d, const fp4idx_daemon_hooks_t *hooks);

/* Runs the startup hook once (the listen functions call it first). */
int fp4idx__daemon_start(fp4idx_daemon_t *d);

/* Listens on an inherited, bound socket fd (systemd socket activation). */
int fp4idx__daemon_listen_fd(fp4idx_daemon_t *d, int fd);

/* Listens on cfg.socket_path, or the default path when it is "". */
int fp4idx__daemon_listen_default(fp4idx_daemon_t *d);

/* Serves until stopped. Returns the exit code (0 after a graceful stop). */
int fp4idx__daemon_run(fp4idx_daemon_t *d);

/* Graceful stop, as on SIGTERM (loop thread). */
void fp4idx__daemon_stop(fp4idx_daemon_t *d);

/* Queues work on the worker thread, in order with the requests (e.g. a
 * periodic snapshot; the job may touch d->cache and the engine). */
void fp4idx__daemon_submit(fp4idx_daemon_t *d, fp4idx_job_t *job);

/* The GPU sharing mode into *out, read again first when older than
 * FP4IDX_SHARING_FRESH_MS (an NVML query, tens of microseconds). Any
 * thread. */
void fp4idx__daemon_sharing(fp4idx_daemon_t *d, fp4idx_sharing_t *out);

/* The loop's last reading of the GPU sharing mode: at most 10 s old on a
 * GPU (the sharing timer's period), "none" on the CPU backend. Any thread,
 * after fp4idx__daemon_init. */
void fp4idx__daemon_sharing_published(fp4idx_daemon_t *d, fp4idx_sharing_mode_t *mode,
                                      uint64_t *other_processes);

/* Frees everything. */
void fp4idx__daemon_fini(fp4idx_daemon_t *d);

#endif /* FP4IDX_DAEMON_DAEMON_H */
