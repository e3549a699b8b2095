/* config.h -- fp4idxd command line -> configuration. */
#ifndef FP4IDX_DAEMON_CONFIG_H
#define FP4IDX_DAEMON_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "log.h"

/* The project version, which CMake defines for every target. */
#define FP4IDXD_VERSION_STRING FP4IDX_VERSION_STRING

typedef enum fp4idx_backend_kind_e {
  FP4IDX_BACKEND_AUTO = 0,
  FP4IDX_BACKEND_CUDA = 1,
  FP4IDX_BACKEND_CPU = 2
} fp4idx_backend_kind_t;

typedef struct fp4idx_config_s {
  char socket_path[108];          /* sun_path size; "" = default */
  fp4idx_backend_kind_t backend;  /* --backend */
  int device;                     /* --device N (CUDA ordinal) */
  uint64_t cache_bytes;           /* --cache-bytes; 0 = default share */
  int32_t page_size;              /* --page-size, power of two */
  uint64_t max_frame;             /* --max-frame bytes */
  int threads;                    /* --threads for the CPU backend (0 = cores) */
  fp4idx_log_level_t log_level;   /* --log-level */
  fp4idx_log_format_t log_format; /* --log-format (auto: journal if stderr is) */
  char data_dir[4096];            /* --data-dir; "" = no persistence */
  int fsync_policy;               /* --fsync: fp4idx_fsync_t (persist/aof.h) */
  char metrics_listen[64];        /* --metrics-listen ADDR:PORT; "" = off */
  int socket_mode;                /* --socket-mode, octal (default 0660) */
  long socket_gid;                /* --socket-group, resolved; -1 = none */
  uint64_t buffer_budget;         /* --buffer-budget bytes; 0 = from RAM */
  double buffer_timeout_s;        /* --buffer-timeout (default 30) */
  int allow_data_loss;            /* --allow-data-loss: start on a short log */
  int busy_poll_us;               /* --busy-poll-us; -1 = by backend (busypoll.h) */
  int io_threads;                 /* --io-threads; 0 = FP4IDX_CONFIG_IO_THREADS_DEFAULT */
} fp4idx_config_t;

/* Fills the defaults (socket "" = resolved later, backend auto, device 0,
 * cache 0 = default share, page size 64, max frame 64 MiB, threads 0, info,
 * socket mode 0660, no socket group, buffer budget 0 = sized from RAM,
 * buffer timeout 30 s). */
void fp4idx__config_defaults(fp4idx_config_t *cfg);

/* Parses argv (getopt_long). Returns 0 to run, 1 when --help or --version was
 * printed to `out` (exit 0), or FP4IDX_EINVAL after printing a one-line reason
 * to `err` (exit 2). */
int fp4idx__config_parse(fp4idx_config_t *cfg, int argc, char **argv,
                         FILE *out, FILE *err);

/* The event loops that serve connections when --io-threads is not given:
 * one. On the H200 host (16 cores) four loops served 32 and 64 clients
 * that poll their sockets no faster than one loop did (48 % of one
 * in-process launch against 55-56 %): the loops' busy polling takes cores
 * from the worker, which does every request's host work. More loops are a
 * choice for hosts with cores to spare (docs/RESULTS.md). */
#define FP4IDX_CONFIG_IO_THREADS_DEFAULT 1

/* Parses a byte count with an optional K/M/G/T suffix (binary units, an
 * optional trailing "B" or "iB"): "64M" = 64 MiB. Returns 0 or -1. */
int fp4idx__config_parse_size(const char *s, uint64_t *out);

/* The default socket path: $XDG_RUNTIME_DIR/fp4idx/fp4idxd.sock, or
 * /run/fp4idx/fp4idxd.sock when running as root or when XDG_RUNTIME_DIR is
 * unset. Returns 0, or FP4IDX_E2BIG if it does not fit in `cap` bytes. */
int fp4idx__config_default_socket(char *buf, size_t cap);

#endif /* FP4IDX_DAEMON_CONFIG_H */
