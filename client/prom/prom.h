/* prom.h -- the Prometheus text form of the daemon's stats (prom.c), shared
 * by `fp4idx-cli stats --prometheus` (stats from fp4idx_client_stats) and
 * fp4idxd's scrape endpoint (daemon/metrics_text.c: the daemon's own
 * counters in the same structs). Only the structs of fp4idx_client.h are
 * used, no client function. Not installed. */
#ifndef FP4IDX_PROM_H
#define FP4IDX_PROM_H

#include <stdio.h>

#include "fp4idx_client.h"

/* Writes the stats (and the info labels, info may be NULL) in the
 * Prometheus text exposition format 0.0.4: counters
 * fp4idx_requests_total{op}, fp4idx_request_errors_total{op}, histogram
 * fp4idx_request_latency_seconds{op} (cumulative _bucket{le}, _sum,
 * _count), gauges for the pool, sequences, keys, connections, uptime, and
 * fp4idx_info{...} 1. Returns 0 or -1 (write error). */
int fp4idx__prom_write(FILE *f, const fp4idx_client_stats_t *s,
                       const fp4idx_client_info_t *info);

#endif /* FP4IDX_PROM_H */
