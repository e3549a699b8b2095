/* daemon.c -- wires the loop, engine, cache, worker and server together;
 * signals and the graceful stop (see daemon.h). */
#define _GNU_SOURCE
#include "daemon.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "commands.h"
#include "server.h"
#include "fp4idx_status.h"
#include "log.h"

/* The cache changed a sequence's page list: keep the backend's copy. */
static void fp4idx__daemon_pages_changed(void *arg, uint64_t id, const int32_t *pages,
                                         int64_t n_pages, int64_t first) {
  fp4idx_daemon_t *d = arg;
  int rc = fp4idx__engine_seq_pages(d->engine, id, pages, n_pages, first);
  if (rc)
    fp4idx__log_debug("sequence %llu: device page table not updated (%s); scores upload it",
                      (unsigned long long)id, fp4idx_strerror(rc));
}

/* ---- server events ------------------------------------------------------ */

static void fp4idx__daemon_pressure(fp4idx_server_t *srv, int on) {
  fp4idx_daemon_t *d = srv->data;
  fp4idx__worker_pause_bulk(&d->worker, on && !__atomic_load_n(&srv->stopping, __ATOMIC_ACQUIRE));
}

static void fp4idx__daemon_conn_event(fp4idx_server_t *srv, int delta) {
  fp4idx_daemon_t *d = srv->data;
  fp4idx__stats_conn(&d->stats, delta);
}

/* The loop, woken by the worker: replies written in parts go on. */
static void fp4idx__daemon_worker_wake(fp4idx_worker_t *w) {
  fp4idx_daemon_t *d = w->data;
  fp4idx__server_flush_streams(d->server);
}

/* ---- stopping ----------------------------------------------------------- */

static void fp4idx__daemon_server_stopped(fp4idx_server_t *srv) {
  fp4idx_daemon_t *d = srv->data;
  /* Every connection is closed, so every request has been answered; jobs
   * from hooks may still be queued: stop runs them first. The channel
   * watcher queues jobs on the worker itself: it stops before the worker,
   * which then runs what is queued (the closes of the connections'
   * channels among it), and the set's lock goes last. */
  fp4idx__channels_stop(&d->channels);
  fp4idx__worker_stop(&d->worker);
  fp4idx__channels_fini(&d->channels); /* every channel closed with its connection */
  fp4idx__server_io_quit(srv); /* the other loops' threads end */
  if (d->hooks.shutdown) d->hooks.shutdown(d, d->hooks.arg);
  uv_close((uv_handle_t *)&d->sig_int, NULL);
  uv_close((uv_handle_t *)&d->sig_term, NULL);
  fp4idx__log_info("stopped");
}

void fp4idx__daemon_stop(fp4idx_daemon_t *d) {
  if (d->stopping) return;
  d->stopping = 1;
  fp4idx__log_info("stopping: finishing %llu queued request(s), %llu connection(s) open",
                   (unsigned long long)__atomic_load_n(&d->worker.queued, __ATOMIC_ACQUIRE),
                   (unsigned long long)__atomic_load_n(&d->server->n_conns, __ATOMIC_ACQUIRE));
  if (d->hooks.stopping) d->hooks.stopping(d, d->hooks.arg);
  fp4idx__server_stop(d->server);
}

static void fp4idx__daemon_signal_cb(uv_signal_t *h, int signum) {
  fp4idx_daemon_t *d = h->data;
  if (d->stopping) {
    /* A second signal: stop waiting for clients that do not read their
     * last replies (requests on the worker still finish). */
    fp4idx__log_warn("signal %d again: closing %llu connection(s) without flushing", signum,
                     (unsigned long long)__atomic_load_n(&d->server->n_conns, __ATOMIC_ACQUIRE));
    fp4idx__server_close_all(d->server);
    return;
  }
  fp4idx__log_info("signal %d (%s): graceful stop", signum, signum == SIGINT ? "SIGINT" : "SIGTERM");
  fp4idx__daemon_stop(d);
}

/* ---- GPU sharing (sharing.h) --------------------------------------------- */

#define FP4IDX_SHARING_FRESH_MS 1000u
#define FP4IDX_SHARING_PERIOD_MS 10000u
#define FP4IDX_SHARING_MAX_PROCS 64u

/* Reads the mode now; logs a change, and the time-slice warning once. */
static void fp4idx__daemon_sharing_read(fp4idx_daemon_t *d) {
  fp4idx_gpu_proc_t procs[FP4IDX_SHARING_MAX_PROCS];
  int n = d->desc.gpu ? fp4idx__gpu_procs(d->desc.pci_bus, procs, FP4IDX_SHARING_MAX_PROCS)
                      : -1;
  fp4idx_sharing_in_t in = {.gpu = d->desc.gpu,
                            .mps = d->desc.mps,
                            .procs_known = n >= 0,
                            .procs = procs,
                            .nprocs = n > 0 ? (size_t)n : 0,
                            .self = (uint32_t)getpid(),
                            .device = d->desc.device,
                            .device_index = d->desc.device_index};
  fp4idx_sharing_t prev = d->sharing.now;
  int had = d->sharing.valid;
  fp4idx__sharing_decide(&in, &d->sharing.now);
  d->sharing.valid = 1;
  d->sharing.at_us = fp4idx__stats_now_us();
  const fp4idx_sharing_t *s = &d->sharing.now;
  __atomic_store_n(&d->sharing.published, s->other_processes << 8 | (uint64_t)s->mode,
                   __ATOMIC_RELEASE);
  if (s->mode == FP4IDX_SHARING_TIME_SLICE && !d->sharing.warned) {
    fp4idx__log_warn("%s", s->warning);
    d->sharing.warned = 1;
  }
  if (d->desc.gpu && (!had || prev.mode != s->mode || prev.other_processes != s->other_processes))
    fp4idx__log_info("GPU sharing: %s, %llu other process(es) on the device%s",
                     fp4idx__sharing_name(s->mode), (unsigned long long)s->other_processes,
                     s->mode == FP4IDX_SHARING_UNKNOWN ? " (NVML, libnvidia-ml.so.1, not usable)"
                                                       : "");
}

static void fp4idx__daemon_sharing_tick(uv_timer_t *t) {
  fp4idx_daemon_t *d = t->data;
  pthread_mutex_lock(&d->sharing.mu);
  fp4idx__daemon_sharing_read(d);
  pthread_mutex_unlock(&d->sharing.mu);
}

void fp4idx__daemon_sharing(fp4idx_daemon_t *d, fp4idx_sharing_t *out) {
  pthread_mutex_lock(&d->sharing.mu);
  if (!d->sharing.valid ||
      fp4idx__stats_now_us() - d->sharing.at_us >= FP4IDX_SHARING_FRESH_MS * 1e3)
    fp4idx__daemon_sharing_read(d);
  *out = d->sharing.now;
  pthread_mutex_unlock(&d->sharing.mu);
}

void fp4idx__daemon_sharing_published(fp4idx_daemon_t *d, fp4idx_sharing_mode_t *mode,
                                      uint64_t *other_processes) {
  uint64_t w = __atomic_load_n(&d->sharing.published, __ATOMIC_ACQUIRE);
  *mode = (fp4idx_sharing_mode_t)(w & 0xff);
  *other_processes = w >> 8;
}

/* ---- life cycle --------------------------------------------------------- */

int fp4idx__daemon_init(fp4idx_daemon_t *d, const fp4idx_config_t *cfg) {
  if (!d || !cfg) return FP4IDX_EINVAL;
  memset(d, 0, sizeof *d);
  d->cfg = *cfg;
  d->server = calloc(1, sizeof *d->server);
  if (!d->server) return FP4IDX_ENOMEM;
  int rc = uv_loop_init(&d->loop);
  if (rc) {
    fp4idx__log_error("uv_loop_init: %s", uv_strerror(rc));
    return FP4IDX_EINTERNAL;
  }
  d->loop_ok = 1;
  if (pthread_mutex_init(&d->sharing.mu, NULL)) {
    rc = FP4IDX_ENOMEM;
    goto err;
  }
  d->sharing_ok = 1;
  rc = fp4idx__stats_init(&d->stats);
  if (rc) goto err;
  d->stats_ok = 1;
  int64_t n_pages = 0;
  rc = fp4idx__engine_open(&d->engine, &d->cfg, &d->desc, &n_pages);
  if (rc) goto err;
  rc = fp4idx__cache_init(&d->cache, n_pages, d->cfg.page_size);
  if (rc) {
    fp4idx__log_error("cache of %lld pages: %s", (long long)n_pages, fp4idx_strerror(rc));
    goto err;
  }
  d->cache_ok = 1;
  fp4idx__daemon_sharing_read(d);
  /* A co-tenant that starts later is seen within a period (unref'd: the
   * timer never keeps a stopping loop alive). */
  if (d->desc.gpu && uv_timer_init(&d->loop, &d->sharing_timer) == 0) {
    d->sharing_timer.data = d;
    uv_timer_start(&d->sharing_timer, fp4idx__daemon_sharing_tick, FP4IDX_SHARING_PERIOD_MS,
                   FP4IDX_SHARING_PERIOD_MS);
    uv_unref((uv_handle_t *)&d->sharing_timer);
  }
  fp4idx__cache_set_copy(&d->cache, fp4idx__engine_copy_page, d->engine);
  fp4idx__cache_set_pages_hook(&d->cache, fp4idx__daemon_pages_changed, d);
  rc = fp4idx__stages_init(&d->stages);
  if (rc) goto err;
  d->stages_ok = 1;
  fp4idx__server_init(d->server, &d->loop, d->cfg.max_frame);
  d->server->stages = &d->stages;
  d->server->data = d;
  d->server->socket_mode = d->cfg.socket_mode;
  d->server->socket_gid = d->cfg.socket_gid;
  if (!d->cfg.buffer_budget) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    d->cfg.buffer_budget =
        fp4idx__budget_default(pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0);
  }
  d->server->budget = d->cfg.buffer_budget;
  d->server->buffered = &d->buffered;
  fp4idx_budget_view_t bv;
  fp4idx__budget_view(d->server, &bv);
  d->buffered.budget = bv.budget;
  d->server->buffer_timeout_us = d->cfg.buffer_timeout_s * 1e6;
  d->server->worker = &d->worker;
  /* host regions are pinned and CUDA regions opened on the backend's device */
  d->server->cuda_device = strcmp(d->desc.name, "cuda") == 0 ? d->cfg.device : -1;
  d->server->conn_event = fp4idx__daemon_conn_event;
  d->server->pressure = fp4idx__daemon_pressure;
  d->server->on_stopped = fp4idx__daemon_server_stopped;
  d->worker.data = d;
  d->worker.on_wake = fp4idx__daemon_worker_wake;
  /* Busy polling, chosen once from the backend (busypoll.h), on every I/O
   * loop (server.h): --io-threads of them, or FP4IDX_CONFIG_IO_THREADS_DEFAULT. */
  int spin = d->cfg.busy_poll_us >= 0 ? d->cfg.busy_poll_us
                                      : (strcmp(d->desc.name, "cuda") == 0 ? 200 : 0);
  int n_io = d->cfg.io_threads > 0 ? d->cfg.io_threads : FP4IDX_CONFIG_IO_THREADS_DEFAULT;
  d->cfg.io_threads = n_io;
  rc = fp4idx__server_io_init(d->server, n_io, spin, &d->worker.queued);
  if (rc) goto err;
  d->worker.spin_us = spin;
  d->worker.hold_spin = &d->server->polling;
  rc = fp4idx__channels_init(&d->channels, &d->worker, &d->stats, d,
                             fp4idx__channel_run_score);
  if (rc) goto err;
  /* Signals are caught from here on, before the socket exists: a SIGTERM
   * that comes as soon as a client can connect must stop gracefully, not
   * kill the process with the socket file left behind. */
  signal(SIGPIPE, SIG_IGN); /* a peer that closes early must not kill us */
  uv_signal_init(&d->loop, &d->sig_int);
  uv_signal_init(&d->loop, &d->sig_term);
  d->sig_int.data = d->sig_term.data = d;
  uv_signal_start(&d->sig_int, fp4idx__daemon_signal_cb, SIGINT);
  uv_signal_start(&d->sig_term, fp4idx__daemon_signal_cb, SIGTERM);
  return FP4IDX_OK;
err:
  fp4idx__daemon_fini(d);
  return rc;
}

void fp4idx__daemon_set_hooks(fp4idx_daemon_t *d, const fp4idx_daemon_hooks_t *hooks) {
  if (hooks) d->hooks = *hooks; else memset(&d->hooks, 0, sizeof d->hooks);
}

int fp4idx__daemon_start(fp4idx_daemon_t *d) {
  if (d->started) return FP4IDX_OK;
  d->started = 1;
  if (d->hooks.startup) {
    int rc = d->hooks.startup(d, d->hooks.arg);
    if (rc < 0) {
      fp4idx__log_error("startup hook failed: %s", fp4idx_strerror(rc));
      return rc;
    }
  }
  fp4idx__cmd_publish(d); /* what a restore brought back */
  return FP4IDX_OK;
}

int fp4idx__daemon_listen_fd(fp4idx_daemon_t *d, int fd) {
  int rc = fp4idx__daemon_start(d);
  return rc ? rc : fp4idx__server_listen_fd(d->server, fd);
}

int fp4idx__daemon_listen_default(fp4idx_daemon_t *d) {
  int rc = fp4idx__daemon_start(d);
  if (rc) return rc;
  if (!d->cfg.socket_path[0]) {
    rc = fp4idx__config_default_socket(d->cfg.socket_path, sizeof d->cfg.socket_path);
    if (rc) {
      fp4idx__log_error("the default socket path is too long; use --socket");
      return rc;
    }
  }
  return fp4idx__server_listen_path(d->server, d->cfg.socket_path);
}

void fp4idx__daemon_submit(fp4idx_daemon_t *d, fp4idx_job_t *job) {
  fp4idx__worker_submit(&d->worker, job);
}

int fp4idx__daemon_run(fp4idx_daemon_t *d) {
  if (d->server->n_listeners == 0) {
    fp4idx__log_error("no listening socket");
    return 1;
  }
  int rc = fp4idx__worker_start(&d->worker, &d->loop);
  if (rc) {
    fp4idx__log_error("cannot start the worker thread");
    return 1;
  }
  if (fp4idx__server_io_start(d->server)) return 1; /* fini joins what started */
  fp4idx__log_info("fp4idxd %s ready: backend %s, page size %d, %lld pages, max frame %llu, "
                   "buffer budget %llu MiB, %d I/O loop(s)",
                   FP4IDXD_VERSION_STRING, d->desc.name, d->cfg.page_size,
                   (long long)d->cache.n_pages, (unsigned long long)d->cfg.max_frame,
                   (unsigned long long)(d->cfg.buffer_budget >> 20), d->cfg.io_threads);
  if (d->hooks.ready) d->hooks.ready(d, d->hooks.arg);
  uv_run(&d->loop, UV_RUN_DEFAULT);
  return d->exit_code;
}

void fp4idx__daemon_fini(fp4idx_daemon_t *d) {
  if (!d) return;
  fp4idx__channels_stop(&d->channels); /* as in fp4idx__daemon_server_stopped */
  if (d->worker.started) fp4idx__worker_stop(&d->worker);
  fp4idx__channels_fini(&d->channels);
  if (d->server) fp4idx__server_io_fini(d->server);
  if (d->loop_ok) {
    /* Close whatever is left (listeners that never served, etc). */
    fp4idx__server_loop_close_all(&d->loop);
    if (d->server && d->server->path[0]) unlink(d->server->path);
    uv_loop_close(&d->loop);
    d->loop_ok = 0;
  }
  if (d->cache_ok) fp4idx__cache_destroy(&d->cache);
  d->cache_ok = 0;
  fp4idx__engine_close(d->engine);
  d->engine = NULL;
  if (d->stats_ok) fp4idx__stats_destroy(&d->stats);
  d->stats_ok = 0;
  if (d->stages_ok) fp4idx__stages_destroy(&d->stages);
  d->stages_ok = 0;
  if (d->server) pthread_mutex_destroy(&d->server->budget_mu);
  free(d->server);
  d->server = NULL;
  if (d->sharing_ok) pthread_mutex_destroy(&d->sharing.mu);
  d->sharing_ok = 0;
}
