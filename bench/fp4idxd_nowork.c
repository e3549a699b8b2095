/* fp4idxd_nowork.c -- fp4idxd-nowork: the daemon with the no-work backend
 * (backend_nowork.h), for measuring the daemon's own cost per stage on a
 * machine without a GPU (bench/run_nowork.sh). Benchmark only: never
 * installed or packaged.
 *
 *   fp4idxd-nowork [--backend nowork] [fp4idxd's other options]
 *
 * It is fp4idxd (daemon/program.h: same options, start, replies and stop)
 * with its backend choice replaced by the no-work backend; `--backend`
 * (also `--backend=`, `-b`) may only name `nowork`, any other value is a
 * usage error (exit 2), so a GPU figure can never come from this binary.
 * The defaults that follow the backend are the CPU backend's (no busy
 * polling unless --busy-poll-us; cache default min(25% of RAM, 4 GiB) of
 * page bookkeeping, no memory behind it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_nowork.h"
#include "engine.h"
#include "program.h"

static int nowork_create(fp4idx_backend_t **out, const fp4idx_config_t *cfg) {
  (void)cfg;
  return fp4idx_backend_nowork_create(out);
}

/* The value of a --backend / --backend=V / -b V / -bV at argv[*i] (and
 * *i moved past a separate value), or NULL when argv[*i] is not one;
 * *missing = 1 for a flag without its value. */
static const char *backend_value(int argc, char **argv, int *i, int *missing) {
  const char *a = argv[*i];
  *missing = 0;
  if (strcmp(a, "--backend") == 0 || strcmp(a, "-b") == 0) {
    if (*i + 1 >= argc) {
      *missing = 1;
      return NULL;
    }
    return argv[++*i];
  }
  if (strncmp(a, "--backend=", 10) == 0) return a + 10;
  if (strncmp(a, "-b", 2) == 0 && a[2]) return a + 2;
  return NULL;
}

int main(int argc, char **argv) {
  char **args = calloc((size_t)argc + 1, sizeof *args);
  if (!args) return 1;
  int n = 0;
  args[n++] = argv[0];
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) { /* the rest is not options */
      while (i < argc) args[n++] = argv[i++];
      break;
    }
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
      printf("fp4idxd-nowork: fp4idxd with the no-work backend (benchmark only:\n"
             "scores are outputs of the right shape, nothing is computed or kept).\n"
             "--backend may only be nowork. fp4idxd's options:\n\n");
    int missing;
    const char *v = backend_value(argc, argv, &i, &missing);
    if (missing) {
      fprintf(stderr, "fp4idxd-nowork: %s needs a value (nowork)\n", argv[i]);
      free(args);
      return 2;
    }
    if (!v) {
      args[n++] = argv[i];
    } else if (strcmp(v, "nowork") != 0) {
      fprintf(stderr, "fp4idxd-nowork: --backend '%s': this benchmark daemon runs the "
                      "nowork backend only (fp4idxd runs cpu and cuda)\n", v);
      free(args);
      return 2;
    }
  }
  args[n] = NULL;
  fp4idx__engine_set_backend(nowork_create, "nowork");
  int code = fp4idx__program_main(n, args);
  free(args);
  return code;
}
