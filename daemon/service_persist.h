/* service_persist.h -- the persistence half of the service module (snapshot
 * + append log through the daemon's hooks), for service.c, which installs
 * the hooks. What each hook does is in service.h. */
#ifndef FP4IDX_DAEMON_SERVICE_PERSIST_H
#define FP4IDX_DAEMON_SERVICE_PERSIST_H

#include <stddef.h>
#include <stdint.h>

#include "service.h"

/* Sets svc->persist and the file paths from d->cfg.data_dir (svc->d set). */
void fp4idx__service_persist_init(fp4idx_service_t *svc);

/* The startup hook: lock, load the snapshot, replay the log, open the log.
 * Returns FP4IDX_OK (also without --data-dir) or the status that stops the
 * start (logged; the cache is left empty). */
int fp4idx__service_startup(fp4idx_daemon_t *d, void *arg);

/* The mutation hook: logs the record; may ask the loop for an auto-save.
 * Returns FP4IDX_OK or FP4IDX_EIO (the caller undoes the mutation). */
int fp4idx__service_mutation(fp4idx_daemon_t *d, void *arg, fp4idx_mutation_t op,
                             uint64_t seq, int64_t pos, int64_t count,
                             const uint8_t *slots);

/* The "save" hook. Returns FP4IDX_OK, FP4IDX_ETYPE (no --data-dir) or the
 * save's error, with a message in msg. */
int fp4idx__service_save_hook(fp4idx_daemon_t *d, void *arg, char *msg, size_t cap);

/* Queues one save job on the worker (loop thread; folded into one already
 * queued). */
void fp4idx__service_request_save(fp4idx_service_t *svc);

/* The shutdown hook: final snapshot, log closed. */
void fp4idx__service_shutdown(fp4idx_daemon_t *d, void *arg);

#endif /* FP4IDX_DAEMON_SERVICE_PERSIST_H */
