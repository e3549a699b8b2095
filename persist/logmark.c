/* logmark.c -- the append log's high-water mark (see logmark.h). */
#define _GNU_SOURCE
#include "logmark.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bytes.h"
#include "crc32c.h"
#include "snapshot.h" /* fp4idx__fsync_parent */

#define MARK_MAGIC "FP4IDXMK"

int fp4idx__logmark_path(const char *log_path, char *buf, size_t cap) {
  if (!log_path || !buf) return FP4IDX_EINVAL;
  int n = snprintf(buf, cap, "%s.mark", log_path);
  return n < 0 || (size_t)n >= cap ? FP4IDX_E2BIG : FP4IDX_OK;
}

int fp4idx__logmark_open(const char *mark_path) {
  if (!mark_path) {
    errno = EINVAL;
    return -1;
  }
  int created = access(mark_path, F_OK) != 0;
  int fd = open(mark_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return -1;
  /* A new file's name is durable only once its folder is synced. */
  if (created && fp4idx__fsync_parent(mark_path) != FP4IDX_OK) {
    int e = errno ? errno : EIO;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int fp4idx__logmark_put(int fd, uint64_t gen, uint64_t bytes) {
  if (fd < 0) return FP4IDX_EINVAL;
  unsigned char m[FP4IDX_LOGMARK_BYTES];
  memset(m, 0, sizeof m);
  memcpy(m, MARK_MAGIC, 8);
  fp4idx__put32(m + 8, 1);
  fp4idx__put32(m + 12, FP4IDX_LOGMARK_BYTES);
  fp4idx__put64(m + 16, gen);
  fp4idx__put64(m + 24, bytes);
  fp4idx__put32(m + 36, fp4idx__crc32c(0, m, 36));
  ssize_t w = pwrite(fd, m, sizeof m, 0);
  if (w != (ssize_t)sizeof m) {
    if (w >= 0) errno = EIO; /* short: nothing set errno */
    return FP4IDX_EIO;
  }
  return fdatasync(fd) ? FP4IDX_EIO : FP4IDX_OK;
}

int fp4idx__logmark_write(const char *mark_path, uint64_t gen, uint64_t bytes, char *err,
                         size_t errlen) {
  if (!mark_path) return FP4IDX_EINVAL;
  errno = 0;
  int fd = fp4idx__logmark_open(mark_path);
  int rc = fd < 0 ? FP4IDX_EIO : fp4idx__logmark_put(fd, gen, bytes);
  int e = errno;
  if (fd >= 0) close(fd);
  if (rc == FP4IDX_OK) return FP4IDX_OK;
  return fp4idx__fail(err, errlen, FP4IDX_EIO, "log mark %s: %s", mark_path,
                      strerror(e ? e : EIO));
}

int fp4idx__logmark_read(const char *mark_path, uint64_t *gen, uint64_t *bytes, char *err,
                        size_t errlen) {
  if (!mark_path || !gen || !bytes) return FP4IDX_EINVAL;
  int fd = open(mark_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return FP4IDX_LOGMARK_NONE;
    return fp4idx__fail(err, errlen, FP4IDX_EIO, "log mark %s: %s", mark_path, strerror(errno));
  }
  unsigned char m[FP4IDX_LOGMARK_BYTES + 1];
  ssize_t n = pread(fd, m, sizeof m, 0);
  close(fd);
  if (n != FP4IDX_LOGMARK_BYTES || memcmp(m, MARK_MAGIC, 8) != 0 ||
      fp4idx__get32(m + 8) != 1 || fp4idx__get32(m + 12) != (uint32_t)FP4IDX_LOGMARK_BYTES ||
      fp4idx__get32(m + 36) != fp4idx__crc32c(0, m, 36))
    return fp4idx__fail(err, errlen, FP4IDX_ECORRUPT,
                        "log mark %s: not a valid mark (%zd bytes, torn or damaged)", mark_path, n);
  *gen = fp4idx__get64(m + 16);
  *bytes = fp4idx__get64(m + 24);
  return FP4IDX_OK;
}
