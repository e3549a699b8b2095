/* fp4idxd_hold.c -- fp4idxd-hold: fp4idxd with the CPU backend, whose first
 * `read` of keys holds the worker until the test lets it go. Test only:
 * never installed or packaged. It lets a test order events on the worker
 * without sleeping: the worker is known to be busy (and stays so) while the
 * test queues requests behind it, and the test sees them queued (stats
 * queue_depth, answered by the loop) before it releases the hold.
 *
 * The hold, at the first backend read: one byte written to the FIFO
 * SOCKET.held (the test reads it: the worker is inside the read), then one
 * byte read from the FIFO SOCKET.release (the test writes it), SOCKET being
 * --socket. The test makes both FIFOs before the daemon starts. Every other
 * call, and every later read, is the CPU backend's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "fp4idx_backend.h"
#include "fp4idx_status.h"
#include "program.h"

static const fp4idx_backend_ops_t *g_cpu;  /* the CPU backend's own */
static fp4idx_backend_ops_t g_ops;         /* its, with read held once */
static char g_held[128], g_release[128];
static int g_holds = 1;                    /* reads still to hold (the worker's only) */

/* One byte through the FIFO at path (write: 1, read: 0); 0 or -1. */
static int fifo_byte(const char *path, int write_it) {
  int fd = open(path, write_it ? O_WRONLY | O_CLOEXEC : O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char b = 'h';
  ssize_t n;
  do n = write_it ? write(fd, &b, 1) : read(fd, &b, 1);
  while (n < 0 && errno == EINTR);
  close(fd);
  return n == 1 ? 0 : -1;
}

static int hold_read(fp4idx_backend_t *b, const int64_t *slots, int64_t n, int dequant,
                     void *out) {
  if (g_holds > 0) {
    g_holds--;
    if (fifo_byte(g_held, 1) || fifo_byte(g_release, 0))
      fprintf(stderr, "fp4idxd-hold: the hold's FIFOs %s / %s failed\n", g_held, g_release);
  }
  return g_cpu->read(b, slots, n, dequant, out);
}

static int hold_create(fp4idx_backend_t **out, const fp4idx_config_t *cfg) {
  if (snprintf(g_held, sizeof g_held, "%s.held", cfg->socket_path) >= (int)sizeof g_held ||
      snprintf(g_release, sizeof g_release, "%s.release", cfg->socket_path) >=
          (int)sizeof g_release)
    return FP4IDX_E2BIG;
  int rc = fp4idx_backend_cpu_create(out, cfg->threads);
  if (rc) return rc;
  g_cpu = (*out)->ops;
  g_ops = *g_cpu;
  g_ops.read = hold_read;
  (*out)->ops = &g_ops;
  return FP4IDX_OK;
}

int main(int argc, char **argv) {
  fp4idx__engine_set_backend(hold_create, "cpu (first read held)");
  return fp4idx__program_main(argc, argv);
}
