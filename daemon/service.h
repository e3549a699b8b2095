/* service.h -- fp4idxd as a service: systemd notification, socket
 * activation, the watchdog (service.c), and persistence (snapshot + append
 * log, service_persist.c) wired into the daemon through its hooks (daemon.h).
 *
 * main.c: fp4idx__service_listen_fd() first (before anything may touch fd 3
 * or the LISTEN_* variables), fp4idx__daemon_init, fp4idx__service_attach,
 * then listen on the inherited fd or the configured path, then run.
 *
 * What the hooks do:
 *   startup   with --data-dir: load DIR/snapshot.fp4s into the pool, replay
 *             DIR/appendonly.fp4log, open the log for appending. Any fault
 *             (corrupt snapshot or log, page size mismatch, pool too small)
 *             stops the start with a message: nothing is half-loaded and the
 *             files are left untouched.
 *   ready     READY=1 + STATUS, the watchdog timer, the SIGHUP handler.
 *   stopping  STOPPING=1; timer and SIGHUP handler closed.
 *   mutation  logs appends (packed slots), truncates, drops before the reply;
 *             when the log outgrows the data (above 64 MiB and twice the
 *             live keys' bytes: speculative decoding truncates a lot), asks
 *             the loop for a save, which compacts it (Redis' auto rewrite).
 *   save      the "save" op and SIGHUP: snapshot, then a fresh log.
 *   shutdown  final snapshot (worker stopped, cache and engine alive).
 */
#ifndef FP4IDX_DAEMON_SERVICE_H
#define FP4IDX_DAEMON_SERVICE_H

#include <stdint.h>
#include <uv.h>

#include "aof.h"
#include "daemon.h"

typedef struct fp4idx_service_s {
  fp4idx_daemon_t *d;
  char snap_path[4200], log_path[4200];
  int persist;             /* --data-dir given */
  int lock_fd;             /* DIR/fp4idxd.lock, flock'ed while we run; -1 */
  fp4idx_aof_t *aof;       /* open while persisting */
  int broken;              /* the log could not be restarted: refuse writes */
  uv_timer_t watchdog;     /* loop thread */
  uv_signal_t sighup;
  int watchdog_on, sighup_on;
  fp4idx_job_t save_job;   /* SIGHUP or auto-save -> worker */
  int save_pending;        /* loop thread */
  uv_async_t autosave;     /* worker -> loop: the log has grown, save */
  int autosave_on;         /* loop thread */
  int autosave_asked;      /* worker thread: asked, not yet saved */
} fp4idx_service_t;

/* Socket activation: 1 and *fd when systemd passed one listening socket, 0
 * when not activated, negative (logged) when what was passed is unusable. */
int fp4idx__service_listen_fd(int *fd);

/* Installs the hooks on d (call after fp4idx__daemon_init, before listening).
 * svc must live as long as d. */
void fp4idx__service_attach(fp4idx_service_t *svc, fp4idx_daemon_t *d);

/* Closes the append log (after fp4idx__daemon_run returned). */
void fp4idx__service_detach(fp4idx_service_t *svc);

#endif /* FP4IDX_DAEMON_SERVICE_H */
