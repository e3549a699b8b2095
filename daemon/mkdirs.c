/* mkdirs.c -- mkdir -p (see mkdirs.h). */
#include "mkdirs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int fp4idx__mkdirs(const char *path, mode_t mode, int parent_only) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (parent_only) {
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
  }
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(dir, mode) && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(dir, mode) && errno != EEXIST) return -1;
  return 0;
}
