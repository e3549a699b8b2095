/* service.c -- systemd and persistence hooks of fp4idxd; see service.h. */
#define _GNU_SOURCE
#include "service.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "fp4idx_status.h"
#include "log.h"
#include "notify.h"
#include "snapshot.h"

#define SNAPSHOT_NAME "snapshot.fp4s"
#define LOG_NAME "appendonly.fp4log"
#define LOCK_NAME "fp4idxd.lock"
/* Auto-save when the log is above this and twice the live keys' bytes. */
#define AUTOSAVE_MIN_BYTES (64ll << 20)

static double fp4idx__service_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mkdir -p with mode for the folders it creates. */
static int fp4idx__service_mkdirs(const char *path, mode_t mode) {
  char buf[4200];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, mode) && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(buf, mode) && errno != EEXIST) return -1;
  return 0;
}

/* ---- socket activation ----------------------------------------------------- */

int fp4idx__service_listen_fd(int *fd) {
  char err[256] = "";
  int rc = fp4idx_notify_listen_fd(fd, err, sizeof err);
  if (rc < 0) fp4idx__log_error("%s", err);
  return rc;
}

/* ---- engine callbacks for the snapshot module ------------------------------- */

static int fp4idx__service_read_pages(void *ctx, int64_t first, int64_t count, void *out) {
  return fp4idx__engine_read_pages(ctx, first, count, out);
}

static int fp4idx__service_write_pages(void *ctx, int64_t first, int64_t count,
                                       const void *in) {
  return fp4idx__engine_write_pages(ctx, first, count, in);
}

/* ---- save: snapshot, then a fresh log ---------------------------------------- */

typedef struct fp4idx__collect_s {
  fp4idx_cache_t *cache;
  fp4idx_snap_seq_t *seqs;
  int64_t n, cap;
} fp4idx__collect_t;

static int fp4idx__service_collect(const fp4idx_cache_seq_t *s, void *arg) {
  fp4idx__collect_t *c = arg;
  const int32_t *pages;
  if (c->n >= c->cap) return FP4IDX_EINTERNAL; /* cannot happen: cap = n_seqs */
  /* (Fills the sequence's flat page list, a cache: no state changes.) */
  int rc = fp4idx__cache_pages(c->cache, s, &pages);
  if (rc) return rc;
  c->seqs[c->n].id = s->id;
  c->seqs[c->n].n_keys = s->n_keys;
  c->seqs[c->n].pages = (int32_t *)pages;
  c->n++;
  return 0;
}

/* Writes the snapshot and restarts the log. Worker thread, or the loop thread
 * once the worker has stopped. Returns FP4IDX_OK or a status, msg filled. */
static int fp4idx__service_save(fp4idx_service_t *svc, char *msg, size_t cap) {
  fp4idx_daemon_t *d = svc->d;
  fp4idx__collect_t c = {0};
  char err[512] = "";
  int rc;
  c.cap = (int64_t)d->cache.n_seqs;
  c.seqs = calloc((size_t)(c.cap ? c.cap : 1), sizeof *c.seqs);
  if (!c.seqs) {
    snprintf(msg, cap, "save: out of memory");
    return FP4IDX_ENOMEM;
  }
  c.cache = &d->cache;
  rc = fp4idx__cache_foreach(&d->cache, fp4idx__service_collect, &c);
  if (rc) {
    free(c.seqs);
    snprintf(msg, cap, "save: %s", fp4idx_strerror(rc));
    return rc;
  }
  uint64_t gen = fp4idx_aof_gen(svc->aof) + 1;
  fp4idx_snap_info_t info;
  double t0 = fp4idx__service_now();
  rc = fp4idx_snapshot_save(svc->snap_path, d->cache.page_size, d->cache.n_pages, c.seqs,
                            c.n, gen, fp4idx__service_read_pages, d->engine, &info, err,
                            sizeof err);
  double dt = fp4idx__service_now() - t0;
  free(c.seqs);
  if (rc) {
    fp4idx__log_error("save: %s", err);
    snprintf(msg, cap, "save: %s", err);
    return rc;
  }
  /* The snapshot (generation gen) now holds everything: start log gen. If
   * that fails, the old log would be skipped as stale on the next start, so
   * writes are refused until a save succeeds (rather than silently lost). */
  rc = fp4idx_aof_rewrite(svc->aof, gen);
  if (rc) {
    svc->broken = 1;
    fp4idx__log_error("save: snapshot written, but the append log %s could not be "
                      "restarted (%s): refusing writes until a save succeeds",
                      svc->log_path, strerror(errno));
    snprintf(msg, cap, "save: the append log could not be restarted; writes are refused");
    return FP4IDX_EIO;
  }
  svc->broken = 0;
  svc->autosave_asked = 0; /* (a failed save is not retried by itself) */
  fp4idx__log_info("snapshot saved: %" PRId64 " sequences, %" PRId64 " keys, %.1f MB in "
                   "%.3f s (%.2f GB/s) to %s",
                   info.n_seqs, info.n_keys, (double)info.file_bytes / 1e6, dt,
                   dt > 0 ? (double)info.file_bytes / 1e9 / dt : 0.0, svc->snap_path);
  fp4idx_notify_status("saved %" PRId64 " sequences, %" PRId64 " keys", info.n_seqs,
                       info.n_keys);
  return FP4IDX_OK;
}

static void fp4idx__service_autosave_cb(uv_async_t *h);

/* ---- startup: load + replay ------------------------------------------------- */

static int fp4idx__service_apply(void *ctx, const fp4idx_aof_record_t *r) {
  fp4idx_daemon_t *d = ctx;
  const fp4idx_cache_seq_t *s = fp4idx__cache_find(&d->cache, r->seq);
  switch (r->op) {
    case FP4IDX_AOF_APPEND: {
      int64_t have = s ? s->n_keys : 0, first = 0;
      int created = 0;
      if (r->pos != have) return FP4IDX_ECORRUPT; /* log and state disagree */
      int64_t *slots = malloc((size_t)r->count * sizeof *slots);
      if (!slots) return FP4IDX_ENOMEM;
      int rc = fp4idx__cache_append(&d->cache, r->seq, r->count, &first, slots, &created);
      if (rc == FP4IDX_OK) {
        rc = fp4idx__engine_store(d->engine, r->slots, FP4IDX_DTYPE_FP4, r->count, slots,
                                  FP4IDX_ROUND_RNE);
        if (rc) fp4idx__cache_append_undo(&d->cache, r->seq, have, created);
      }
      free(slots);
      return rc;
    }
    case FP4IDX_AOF_TRUNCATE:
      return fp4idx__cache_truncate(&d->cache, r->seq, r->pos);
    case FP4IDX_AOF_DROP:
      return fp4idx__cache_drop(&d->cache, r->seq);
  }
  return FP4IDX_ECORRUPT;
}

static int fp4idx__service_startup(fp4idx_daemon_t *d, void *arg) {
  fp4idx_service_t *svc = arg;
  char err[768] = "";
  int rc;
  if (!svc->persist) return FP4IDX_OK;
  if (fp4idx__service_mkdirs(d->cfg.data_dir, 0750)) {
    fp4idx__log_error("--data-dir %s: %s", d->cfg.data_dir, strerror(errno));
    return FP4IDX_EIO;
  }
  /* Two daemons appending to one log would corrupt it: one owner at a time
   * (the kernel drops the lock when the process dies, kill -9 included). */
  char lock_path[4200];
  snprintf(lock_path, sizeof lock_path, "%s/%s", d->cfg.data_dir, LOCK_NAME);
  svc->lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (svc->lock_fd < 0) {
    fp4idx__log_error("%s: %s", lock_path, strerror(errno));
    return FP4IDX_EIO;
  }
  if (flock(svc->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = "";
    ssize_t n = pread(svc->lock_fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = 0;
    pid[strcspn(pid, "\n")] = 0;
    fp4idx__log_error("--data-dir %s is in use by another fp4idxd (pid %s)", d->cfg.data_dir,
                      pid[0] ? pid : "?");
    close(svc->lock_fd);
    svc->lock_fd = -1;
    return FP4IDX_EEXIST;
  }
  char pid[32];
  int pn = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(svc->lock_fd, 0) == 0 && pwrite(svc->lock_fd, pid, (size_t)pn, 0) < 0)
    fp4idx__log_warn("%s: cannot write the pid", lock_path);

  /* 1. The snapshot, into the still empty pool. */
  fp4idx_snap_seq_t *seqs = NULL;
  int64_t n = 0;
  fp4idx_snap_info_t info;
  uint64_t gen = 1;
  fp4idx_notify_status("loading %s", svc->snap_path);
  double t0 = fp4idx__service_now();
  rc = fp4idx_snapshot_load(svc->snap_path, d->cache.page_size, d->cache.n_pages,
                            fp4idx__service_write_pages, d->engine, &seqs, &n, &info, err,
                            sizeof err);
  double dt = fp4idx__service_now() - t0;
  if (rc == FP4IDX_SNAPSHOT_NONE) {
    fp4idx__log_info("no snapshot in %s: starting empty", d->cfg.data_dir);
  } else if (rc) {
    fp4idx__log_error("%s", err);
    fp4idx__log_error("refusing to start: fix or move the snapshot aside to start empty");
    return rc;
  } else {
    for (int64_t i = 0; i < n; i++) {
      int64_t np = (seqs[i].n_keys + d->cache.page_size - 1) / d->cache.page_size;
      rc = fp4idx__cache_adopt(&d->cache, seqs[i].id, seqs[i].n_keys, seqs[i].pages, np);
      if (rc) {
        fp4idx__log_error("%s: sequence %" PRIu64 " cannot be restored: %s", svc->snap_path,
                          seqs[i].id, fp4idx_strerror(rc));
        fp4idx__cache_clear(&d->cache);
        free(seqs);
        return FP4IDX_ECORRUPT;
      }
    }
    free(seqs);
    gen = info.log_gen;
    fp4idx__log_info("snapshot loaded: %" PRId64 " sequences, %" PRId64 " keys, %.1f MB "
                     "in %.3f s (%.2f GB/s)",
                     info.n_seqs, info.n_keys, (double)info.file_bytes / 1e6, dt,
                     dt > 0 ? (double)info.file_bytes / 1e9 / dt : 0.0);
  }

  /* 2. The log that continues it. */
  fp4idx_aof_replay_t res;
  fp4idx_notify_status("replaying %s", svc->log_path);
  rc = fp4idx_aof_replay(svc->log_path, gen, fp4idx__service_apply, d, &res, err,
                         sizeof err);
  if (rc) {
    fp4idx__log_error("%s", err);
    fp4idx__log_error("refusing to start: the append log cannot be replayed");
    fp4idx__cache_clear(&d->cache);
    return rc;
  }
  if (res.warning[0]) fp4idx__log_warn("%s", res.warning);
  if (res.stale)
    fp4idx__log_info("append log generation %" PRIu64 " is already in the snapshot "
                     "(generation %" PRIu64 "): starting a fresh log",
                     res.gen, gen);
  else if (res.records)
    fp4idx__log_info("append log replayed: %" PRId64 " records (%" PRId64 " appends, %" PRId64
                     " keys, %" PRId64 " truncates, %" PRId64 " drops)",
                     res.records, res.appends, res.keys, res.truncates, res.drops);
  int64_t keep = (res.exists && !res.stale) ? res.valid_bytes : 0;
  rc = fp4idx_aof_open(&svc->aof, svc->log_path, gen, (fp4idx_fsync_t)d->cfg.fsync_policy,
                       keep, err, sizeof err);
  if (rc) {
    fp4idx__log_error("%s", err);
    fp4idx__cache_clear(&d->cache);
    return rc;
  }
  if (uv_async_init(&d->loop, &svc->autosave, fp4idx__service_autosave_cb) == 0) {
    svc->autosave.data = svc;
    svc->autosave_on = 1;
  }
  fp4idx__log_info("persistence: %s (fsync %s), %" PRIu64 " sequences, %" PRId64 " keys",
                   d->cfg.data_dir, fp4idx_fsync_name((fp4idx_fsync_t)d->cfg.fsync_policy),
                   d->cache.n_seqs, d->cache.n_keys);
  return FP4IDX_OK;
}

/* ---- hooks on the request path ------------------------------------------------ */

static int fp4idx__service_mutation(fp4idx_daemon_t *d, void *arg, fp4idx_mutation_t op,
                                    uint64_t seq, int64_t pos, int64_t count,
                                    const uint8_t *slots) {
  fp4idx_service_t *svc = arg;
  int rc;
  if (!svc->aof) return FP4IDX_OK;
  if (svc->broken) return FP4IDX_EIO;
  switch (op) {
    case FP4IDX_MUT_APPEND: rc = fp4idx_aof_append(svc->aof, seq, pos, count, slots); break;
    case FP4IDX_MUT_TRUNCATE: rc = fp4idx_aof_truncate(svc->aof, seq, pos); break;
    case FP4IDX_MUT_DROP: rc = fp4idx_aof_drop(svc->aof, seq); break;
    default: rc = FP4IDX_EINVAL; break;
  }
  if (rc) {
    fp4idx__log_error("append log %s: write failed: %s", svc->log_path, strerror(errno));
    return rc;
  }
  int64_t size = fp4idx_aof_size(svc->aof);
  if (svc->autosave_on && !svc->autosave_asked && size > AUTOSAVE_MIN_BYTES &&
      size > 2 * (d->cache.n_keys * 68 + (1 << 20))) {
    svc->autosave_asked = 1;
    fp4idx__log_info("append log is %.1f MB for %.1f MB of keys: saving a snapshot",
                     (double)size / 1e6, (double)d->cache.n_keys * 68 / 1e6);
    uv_async_send(&svc->autosave);
  }
  return FP4IDX_OK;
}

static int fp4idx__service_save_hook(fp4idx_daemon_t *d, void *arg, char *msg, size_t cap) {
  (void)d;
  fp4idx_service_t *svc = arg;
  if (!svc->aof) {
    /* PROTOCOL.md: save without persistence is ETYPE. */
    snprintf(msg, cap, "save: persistence is not enabled (start fp4idxd with --data-dir)");
    return FP4IDX_ETYPE;
  }
  return fp4idx__service_save(svc, msg, cap);
}

/* SIGHUP: a save job on the worker, in order with the requests. */
static void fp4idx__service_sighup_work(fp4idx_job_t *job) {
  fp4idx_service_t *svc = job->data;
  char msg[512];
  fp4idx__service_save(svc, msg, sizeof msg);
}

static void fp4idx__service_sighup_done(fp4idx_job_t *job) {
  fp4idx_service_t *svc = job->data;
  svc->save_pending = 0;
}

/* Queues one save job (loop thread); a second request while one is queued
 * is folded into it. */
static void fp4idx__service_request_save(fp4idx_service_t *svc) {
  if (svc->save_pending || svc->d->stopping) return;
  svc->save_pending = 1;
  svc->save_job.work = fp4idx__service_sighup_work;
  svc->save_job.done = fp4idx__service_sighup_done;
  svc->save_job.data = svc;
  fp4idx__daemon_submit(svc->d, &svc->save_job);
}

static void fp4idx__service_sighup_cb(uv_signal_t *h, int signum) {
  (void)signum;
  fp4idx_service_t *svc = h->data;
  if (!svc->aof) {
    fp4idx__log_info("SIGHUP: no --data-dir, nothing to save");
    return;
  }
  fp4idx__log_info("SIGHUP: saving a snapshot");
  fp4idx__service_request_save(svc);
}

static void fp4idx__service_autosave_cb(uv_async_t *h) {
  fp4idx__service_request_save(h->data);
}

/* The watchdog ping comes from a loop timer: it proves the event loop turns.
 * (Long computations run on the worker thread and don't hold it up.) */
static void fp4idx__service_watchdog_cb(uv_timer_t *t) {
  (void)t;
  fp4idx_notify_watchdog();
}

/* ---- life cycle ----------------------------------------------------------------- */

static void fp4idx__service_ready(fp4idx_daemon_t *d, void *arg) {
  fp4idx_service_t *svc = arg;
  char status[256];
  snprintf(status, sizeof status,
           "serving: backend %s, %" PRIu64 " sequences, %" PRId64 " keys, %" PRId64
           " of %" PRId64 " pages free",
           d->desc.name, d->cache.n_seqs, d->cache.n_keys, d->cache.n_free, d->cache.n_pages);
  fp4idx_notify_ready(status);
  uint64_t usec = fp4idx_notify_watchdog_usec();
  if (usec && uv_timer_init(&d->loop, &svc->watchdog) == 0) {
    uint64_t ms = usec / 2000;
    if (ms < 1) ms = 1;
    svc->watchdog.data = svc;
    uv_timer_start(&svc->watchdog, fp4idx__service_watchdog_cb, 0, ms);
    svc->watchdog_on = 1;
    fp4idx__log_info("watchdog: pinging every %llu ms", (unsigned long long)ms);
  }
  if (uv_signal_init(&d->loop, &svc->sighup) == 0) {
    svc->sighup.data = svc;
    uv_signal_start(&svc->sighup, fp4idx__service_sighup_cb, SIGHUP);
    svc->sighup_on = 1;
  }
}

static void fp4idx__service_stopping(fp4idx_daemon_t *d, void *arg) {
  (void)d;
  fp4idx_service_t *svc = arg;
  fp4idx_notify_stopping(svc->aof ? "stopping: finishing requests, then saving" : "stopping");
  if (svc->watchdog_on) uv_close((uv_handle_t *)&svc->watchdog, NULL);
  if (svc->sighup_on) uv_close((uv_handle_t *)&svc->sighup, NULL);
  svc->watchdog_on = svc->sighup_on = 0;
}

static void fp4idx__service_shutdown(fp4idx_daemon_t *d, void *arg) {
  fp4idx_service_t *svc = arg;
  /* The worker has stopped, so nothing sends on the async handle any more. */
  if (svc->autosave_on) uv_close((uv_handle_t *)&svc->autosave, NULL);
  svc->autosave_on = 0;
  if (!svc->aof) return;
  char msg[512];
  if (fp4idx__service_save(svc, msg, sizeof msg) != FP4IDX_OK) {
    /* The log still holds every acknowledged write: the next start replays it. */
    fp4idx__log_error("final snapshot failed; the append log keeps the data");
    d->exit_code = 1;
  }
  fp4idx_aof_close(svc->aof);
  svc->aof = NULL;
}

void fp4idx__service_attach(fp4idx_service_t *svc, fp4idx_daemon_t *d) {
  memset(svc, 0, sizeof *svc);
  svc->lock_fd = -1;
  /* SIGHUP (systemctl reload) before the handler exists -- e.g. while a
   * large snapshot loads -- must not kill the daemon. */
  signal(SIGHUP, SIG_IGN);
  svc->d = d;
  if (d->cfg.data_dir[0]) {
    svc->persist = 1;
    snprintf(svc->snap_path, sizeof svc->snap_path, "%s/%s", d->cfg.data_dir, SNAPSHOT_NAME);
    snprintf(svc->log_path, sizeof svc->log_path, "%s/%s", d->cfg.data_dir, LOG_NAME);
  }
  fp4idx_daemon_hooks_t h = {
      .startup = fp4idx__service_startup,
      .ready = fp4idx__service_ready,
      .stopping = fp4idx__service_stopping,
      .shutdown = fp4idx__service_shutdown,
      .mutation = svc->persist ? fp4idx__service_mutation : NULL,
      .save = fp4idx__service_save_hook,
      .arg = svc,
  };
  fp4idx__daemon_set_hooks(d, &h);
}

void fp4idx__service_detach(fp4idx_service_t *svc) {
  if (!svc) return;
  fp4idx_aof_close(svc->aof);
  svc->aof = NULL;
  if (svc->lock_fd >= 0) close(svc->lock_fd); /* releases the flock */
  svc->lock_fd = -1;
}
