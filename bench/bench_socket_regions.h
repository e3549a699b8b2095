/* bench_socket_regions.h -- section (e) of fp4idx-bench-socket: the region
 * (same-host zero copy) cases next to the socket path, in the same run. */
#ifndef FP4IDX_BENCH_SOCKET_REGIONS_H
#define FP4IDX_BENCH_SOCKET_REGIONS_H

#include <stdio.h>

#include "fp4idx_client.h"

typedef struct fp4idx_bench_regions_opts_s {
  long ctx;          /* keys of the scored sequence (400000 for the table) */
  int iters;         /* calls per case and run, after 2 warm-up calls */
  int reps;          /* runs; the median of the per-run p50s is reported */
  long append_keys;  /* keys per append run (1M-key requests from a region) */
  int cuda;          /* also CUDA regions (the daemon must run the CUDA backend) */
  FILE *csv;         /* raw samples (case,run,index,us) or NULL */
} fp4idx_bench_regions_opts_t;

/* Runs section (e) on connection c and prints its table. Returns 0 or -1
 * (a call failed; the message is on stderr). */
int fp4idx_bench_regions(fp4idx_client_t *c, const fp4idx_bench_regions_opts_t *o);

#endif
