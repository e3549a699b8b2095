/* mkdirs.h -- mkdir -p, for the socket's folder (server.c) and --data-dir
 * (service_persist.c). */
#ifndef FP4IDX_DAEMON_MKDIRS_H
#define FP4IDX_DAEMON_MKDIRS_H

#include <sys/types.h>

/* Creates `path` and every missing folder above it with `mode` (folders that
 * exist are left as they are). parent_only: stop at the folder that holds
 * `path` (for a file's folder). Returns 0, or -1 with errno set
 * (ENAMETOOLONG beyond 4095 bytes). */
int fp4idx__mkdirs(const char *path, mode_t mode, int parent_only);

#endif /* FP4IDX_DAEMON_MKDIRS_H */
