/* service_persist.c -- fp4idxd's persistence through the daemon's hooks:
 * lock the data folder, load the snapshot and replay the append log on
 * start, log every mutation before its reply, save on request, on SIGHUP, when
 * the log outgrows the data and at shutdown. See service.h. */
#define _GNU_SOURCE
#include "service_persist.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "engine.h"
#include "fp4idx_codec.h"
#include "fp4idx_format.h"
#include "fp4idx_status.h"
#include "log.h"
#include "logmark.h"
#include "mkdirs.h"
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

void fp4idx__service_persist_init(fp4idx_service_t *svc) {
  const char *dir = svc->d->cfg.data_dir;
  if (!dir[0]) return;
  svc->persist = 1;
  snprintf(svc->snap_path, sizeof svc->snap_path, "%s/%s", dir, SNAPSHOT_NAME);
  snprintf(svc->log_path, sizeof svc->log_path, "%s/%s", dir, LOG_NAME);
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
  uint64_t gen = fp4idx__aof_gen(svc->aof) + 1;
  fp4idx_snap_info_t info;
  double t0 = fp4idx__service_now();
  rc = fp4idx__snapshot_save(svc->snap_path, d->cache.page_size, d->cache.n_pages, c.seqs,
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
  rc = fp4idx__aof_rewrite(svc->aof, gen);
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

/* One log record -> the request it acknowledged, run through the same
 * handler (fp4idx__cmd_replay), so an op's effect is written once. */
static int fp4idx__service_apply(void *ctx, const fp4idx_aof_record_t *r) {
  fp4idx_daemon_t *d = ctx;
  fp4idx_request_t req;
  char msg[320];
  memset(&req, 0, sizeof req);
  switch (r->op) {
    case FP4IDX_AOF_APPEND: {
      const fp4idx_cache_seq_t *s = fp4idx__cache_find(&d->cache, r->seq);
      if (r->pos != (s ? s->n_keys : 0)) return FP4IDX_ECORRUPT; /* log and state disagree */
      uint64_t shape[2] = {(uint64_t)r->count, FP4IDX_SLOT_BYTES};
      req.op = FP4IDX_OP_APPEND;
      req.u.append.seq = r->seq;
      if (fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_U8, 2, shape, r->slots))
        return FP4IDX_ECORRUPT;
      break;
    }
    case FP4IDX_AOF_TRUNCATE:
      req.op = FP4IDX_OP_TRUNCATE;
      req.u.truncate.seq = r->seq;
      req.u.truncate.length = (uint64_t)r->pos;
      break;
    case FP4IDX_AOF_DROP:
      req.op = FP4IDX_OP_DROP;
      req.u.drop.seq = r->seq;
      break;
    case FP4IDX_AOF_FORK:
      req.op = FP4IDX_OP_FORK;
      req.u.fork.src = r->src;
      req.u.fork.dst = r->seq;
      req.u.fork.length = (uint64_t)r->pos;
      break;
    default: return FP4IDX_ECORRUPT;
  }
  int rc = fp4idx__cmd_replay(d, &req, msg, sizeof msg);
  if (rc) fp4idx__log_error("append log record at byte %" PRId64 ": %s", r->offset, msg);
  return rc;
}

/* Tail loss (logmark.h): after the replay, compares what is on disk with
 * what the snapshot and the log's mark say existed. A shorter or missing log
 * is refused with ECORRUPT naming what is missing, or, with
 * --allow-data-loss, logged as an ERROR and accepted. */
static int fp4idx__service_check_tail(fp4idx_service_t *svc, int have_snapshot, uint64_t gen,
                                      const fp4idx_aof_replay_t *res) {
  char mark_path[4300], err[4400] = "", what[9000] = "";
  uint64_t mgen = 0, mbytes = 0;
  if (fp4idx__logmark_path(svc->log_path, mark_path, sizeof mark_path)) return FP4IDX_OK;
  int mrc = fp4idx__logmark_read(mark_path, &mgen, &mbytes, err, sizeof err);
  if (mrc == FP4IDX_ECORRUPT || mrc == FP4IDX_EIO)
    fp4idx__log_warn("%s; ignoring it (it can only tell of a loss, never cause one)", err);
  int have_mark = mrc == FP4IDX_OK;
  if (have_mark && mgen > gen)
    snprintf(what, sizeof what,
             "%s says append log generation %" PRIu64 " existed, but %s: the snapshot that "
             "generation continued is missing",
             mark_path, mgen,
             have_snapshot ? "the snapshot continues an older generation" : "there is no snapshot");
  else if (!res->exists && have_snapshot)
    snprintf(what, sizeof what,
             "the snapshot %s is continued by append log generation %" PRIu64
             ", but the log %s is missing",
             svc->snap_path, gen, svc->log_path);
  else if (!res->exists && have_mark && mgen == gen && mbytes > FP4IDX_AOF_HEADER_BYTES)
    snprintf(what, sizeof what,
             "the append log %s is missing; it had reached %" PRIu64
             " bytes (generation %" PRIu64 ") by its last checkpoint (%s)",
             svc->log_path, mbytes, mgen, mark_path);
  else if (res->exists && !res->stale && have_mark && mgen == res->gen &&
           (uint64_t)res->valid_bytes < mbytes)
    snprintf(what, sizeof what,
             "the append log %s ends at byte %" PRId64 " (%" PRId64 " records replayed), but it "
             "had reached byte %" PRIu64 " by its last checkpoint (%s): the last %" PRIu64
             " bytes of acknowledged writes are missing",
             svc->log_path, res->valid_bytes, res->records, mbytes, mark_path,
             mbytes - (uint64_t)res->valid_bytes);
  if (!what[0]) return FP4IDX_OK;
  if (svc->d->cfg.allow_data_loss) {
    fp4idx__log_error("DATA LOSS: %s", what);
    fp4idx__log_error("starting anyway (--allow-data-loss): those writes are gone");
    return FP4IDX_OK;
  }
  fp4idx__log_error("%s", what);
  fp4idx__log_error("refusing to start (ECORRUPT): restore the missing data, or start with "
                    "--allow-data-loss to accept the loss");
  return FP4IDX_ECORRUPT;
}

int fp4idx__service_startup(fp4idx_daemon_t *d, void *arg) {
  fp4idx_service_t *svc = arg;
  char err[768] = "";
  int rc;
  if (!svc->persist) return FP4IDX_OK;
  if (fp4idx__mkdirs(d->cfg.data_dir, 0750, 0)) {
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
  int have_snapshot = 0;
  fp4idx_notify_status("loading %s", svc->snap_path);
  double t0 = fp4idx__service_now();
  rc = fp4idx__snapshot_load(svc->snap_path, d->cache.page_size, d->cache.n_pages,
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
    have_snapshot = 1;
    fp4idx__log_info("snapshot loaded: %" PRId64 " sequences, %" PRId64 " keys, %.1f MB "
                     "in %.3f s (%.2f GB/s)",
                     info.n_seqs, info.n_keys, (double)info.file_bytes / 1e6, dt,
                     dt > 0 ? (double)info.file_bytes / 1e9 / dt : 0.0);
  }

  /* 2. The log that continues it. */
  fp4idx_aof_replay_t res;
  fp4idx_notify_status("replaying %s", svc->log_path);
  rc = fp4idx__aof_replay(svc->log_path, gen, fp4idx__service_apply, d, &res, err,
                         sizeof err);
  if (rc) {
    fp4idx__log_error("%s", err);
    fp4idx__log_error("refusing to start: the append log cannot be replayed");
    fp4idx__cache_clear(&d->cache);
    return rc;
  }
  if (res.warning[0]) fp4idx__log_warn("%s", res.warning);
  rc = fp4idx__service_check_tail(svc, have_snapshot, gen, &res);
  if (rc) {
    fp4idx__cache_clear(&d->cache);
    return rc;
  }
  if (res.stale)
    fp4idx__log_info("append log generation %" PRIu64 " is already in the snapshot "
                     "(generation %" PRIu64 "): starting a fresh log",
                     res.gen, gen);
  else if (res.records)
    fp4idx__log_info("append log replayed: %" PRId64 " records (%" PRId64 " appends, %" PRId64
                     " keys, %" PRId64 " truncates, %" PRId64 " drops, %" PRId64 " forks)",
                     res.records, res.appends, res.keys, res.truncates, res.drops, res.forks);
  int64_t keep = (res.exists && !res.stale) ? res.valid_bytes : 0;
  rc = fp4idx__aof_open(&svc->aof, svc->log_path, gen, (fp4idx_fsync_t)d->cfg.fsync_policy,
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
                   d->cfg.data_dir, fp4idx__fsync_name((fp4idx_fsync_t)d->cfg.fsync_policy),
                   d->cache.n_seqs, d->cache.n_keys);
  return FP4IDX_OK;
}

/* ---- hooks on the request path ------------------------------------------------ */

int fp4idx__service_mutation(fp4idx_daemon_t *d, void *arg, fp4idx_mutation_t op,
                                    uint64_t seq, int64_t pos, int64_t count,
                                    const uint8_t *slots) {
  fp4idx_service_t *svc = arg;
  int rc;
  if (!svc->aof) return FP4IDX_OK;
  if (svc->broken) return FP4IDX_EIO;
  switch (op) {
    case FP4IDX_MUT_APPEND: rc = fp4idx__aof_append(svc->aof, seq, pos, count, slots); break;
    case FP4IDX_MUT_TRUNCATE: rc = fp4idx__aof_truncate(svc->aof, seq, pos); break;
    case FP4IDX_MUT_DROP: rc = fp4idx__aof_drop(svc->aof, seq); break;
    case FP4IDX_MUT_FORK: rc = fp4idx__aof_fork(svc->aof, (uint64_t)count, seq, pos); break;
    default: rc = FP4IDX_EINVAL; break;
  }
  if (rc) {
    fp4idx__log_error("append log %s: write failed: %s", svc->log_path, strerror(errno));
    return rc;
  }
  int64_t size = fp4idx__aof_size(svc->aof);
  if (svc->autosave_on && !svc->autosave_asked && size > AUTOSAVE_MIN_BYTES &&
      size > 2 * (d->cache.n_keys * FP4IDX_SLOT_BYTES + (1 << 20))) {
    svc->autosave_asked = 1;
    fp4idx__log_info("append log is %.1f MB for %.1f MB of keys: saving a snapshot",
                     (double)size / 1e6, (double)d->cache.n_keys * FP4IDX_SLOT_BYTES / 1e6);
    uv_async_send(&svc->autosave);
  }
  return FP4IDX_OK;
}

int fp4idx__service_save_hook(fp4idx_daemon_t *d, void *arg, char *msg, size_t cap) {
  (void)d;
  fp4idx_service_t *svc = arg;
  if (!svc->aof) {
    /* PROTOCOL.md: save without persistence is EDISABLED. */
    snprintf(msg, cap, "persistence is not enabled: start fp4idxd with --data-dir");
    return FP4IDX_EDISABLED;
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
void fp4idx__service_request_save(fp4idx_service_t *svc) {
  if (svc->save_pending || svc->d->stopping) return;
  svc->save_pending = 1;
  svc->save_job.work = fp4idx__service_sighup_work;
  svc->save_job.done = fp4idx__service_sighup_done;
  svc->save_job.data = svc;
  fp4idx__daemon_submit(svc->d, &svc->save_job);
}

static void fp4idx__service_autosave_cb(uv_async_t *h) {
  fp4idx__service_request_save(h->data);
}

void fp4idx__service_shutdown(fp4idx_daemon_t *d, void *arg) {
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
  fp4idx__aof_close(svc->aof);
  svc->aof = NULL;
}

void fp4idx__service_detach(fp4idx_service_t *svc) {
  if (!svc) return;
  fp4idx__aof_close(svc->aof);
  svc->aof = NULL;
  if (svc->lock_fd >= 0) close(svc->lock_fd); /* releases the flock */
  svc->lock_fd = -1;
}
