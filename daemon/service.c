/* service.c -- fp4idxd under systemd: socket activation, READY/STOPPING,
 * the watchdog, SIGHUP; and the hook table that wires these and the
 * persistence of service_persist.c into the daemon. See service.h. */
#define _GNU_SOURCE
#include "service.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "fp4idx_status.h"
#include "log.h"
#include "notify.h"
#include "service_persist.h"

/* ---- socket activation ----------------------------------------------------- */

int fp4idx__service_listen_fd(int *fd) {
  char err[256] = "";
  int rc = fp4idx_notify_listen_fd(fd, err, sizeof err);
  if (rc < 0) fp4idx__log_error("%s", err);
  return rc;
}

/* ---- signals and the watchdog ------------------------------------------------ */

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

void fp4idx__service_attach(fp4idx_service_t *svc, fp4idx_daemon_t *d) {
  memset(svc, 0, sizeof *svc);
  svc->lock_fd = -1;
  /* SIGHUP (systemctl reload) before the handler exists -- e.g. while a
   * large snapshot loads -- must not kill the daemon. */
  signal(SIGHUP, SIG_IGN);
  svc->d = d;
  fp4idx__service_persist_init(svc);
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

