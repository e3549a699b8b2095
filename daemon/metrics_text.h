/* metrics_text.h -- the Prometheus text of fp4idxd's own counters, for the
 * scrape endpoint (metrics_http.h).
 *
 * The text is read straight from the daemon, never through its socket:
 *   - the request counters and latency histograms (stats.h) and the stage
 *     histograms (stages.h), under their mutexes;
 *   - the cache counts the worker publishes after each request (d->pub,
 *     __atomic);
 *   - the GPU sharing mode of the loop's last reading
 *     (fp4idx__daemon_sharing_published: at most 10 s old on a GPU);
 *   - the device memory at this moment (the engine's describe, which the
 *     loop calls for "stats" as well);
 *   - what init fixes and nothing changes later: backend, device, page
 *     size, pool pages.
 * Each is safe to read from any thread, so the HTTP thread neither waits
 * for the loop nor counts as a client: a scrape adds no request, byte or
 * connection to what it reports.
 *
 * The text is client/prom's (fp4idx__prom_write, the same writer as
 * `fp4idx-cli stats --prometheus`): the counters are laid out in the
 * client's stats form (fp4idx_client.h, header only), ops sorted by name as
 * fp4idx_client_stats returns them, so both print the same series.
 */
#ifndef FP4IDX_DAEMON_METRICS_TEXT_H
#define FP4IDX_DAEMON_METRICS_TEXT_H

#include <stddef.h>

#include "daemon.h"

/* Writes the daemon's metrics into a malloc'ed buffer: *text (free() it),
 * *len bytes. Any thread, once fp4idx__daemon_init has returned and until
 * fp4idx__daemon_fini. Returns FP4IDX_OK or FP4IDX_ENOMEM (*text NULL). */
int fp4idx__metrics_text(fp4idx_daemon_t *d, char **text, size_t *len);

#endif /* FP4IDX_DAEMON_METRICS_TEXT_H */
