/* export.c -- SGLang page layout export/import; see export.h. */
#define _GNU_SOURCE
#include "export.h"
#include "bytes.h"
#include "fp4idx_format.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "snapshot.h" /* fp4idx__fsync_parent */

#define EXPORT_MAGIC "FP4IDXEX"


/* Page sizes follow the key format's rule (a power of two up to 2^16). */
static int psize_ok(int32_t p) { return fp4idx_page_size_valid(p); }

int64_t fp4idx__export_pages_bytes(int64_t n, int32_t page_size) {
  if (n < 0 || !psize_ok(page_size)) return -1;
  return (n + page_size - 1) / page_size * page_size * FP4IDX_SLOT_BYTES;
}

int fp4idx__export_pack(const uint8_t *slots, int64_t n, int32_t page_size,
                       uint8_t *pages) {
  if (n < 0 || !psize_ok(page_size) || (n > 0 && (!slots || !pages)))
    return FP4IDX_EINVAL;
  int64_t bytes = fp4idx__export_pages_bytes(n, page_size);
  memset(pages, 0, (size_t)bytes);
  /* Position i sits at slot i of the exported pages (pages in order). */
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *slot = slots + i * FP4IDX_SLOT_BYTES;
    memcpy(pages + fp4idx_payload_offset(i, page_size), slot,
           FP4IDX_PAYLOAD_BYTES);
    memcpy(pages + fp4idx_scale_offset(i, page_size),
           slot + FP4IDX_PAYLOAD_BYTES, FP4IDX_SCALE_BYTES);
  }
  return FP4IDX_OK;
}

int fp4idx__export_unpack(const uint8_t *pages, int64_t n, int32_t page_size,
                         uint8_t *slots) {
  if (n < 0 || !psize_ok(page_size) || (n > 0 && (!slots || !pages)))
    return FP4IDX_EINVAL;
  for (int64_t i = 0; i < n; i++) {
    uint8_t *slot = slots + i * FP4IDX_SLOT_BYTES;
    memcpy(slot, pages + fp4idx_payload_offset(i, page_size),
           FP4IDX_PAYLOAD_BYTES);
    memcpy(slot + FP4IDX_PAYLOAD_BYTES, pages + fp4idx_scale_offset(i, page_size),
           FP4IDX_SCALE_BYTES);
  }
  return FP4IDX_OK;
}

int fp4idx__export_write(const char *path, uint64_t seq, const uint8_t *slots,
                        int64_t n, int32_t page_size, int flags, char *err,
                        size_t errlen) {
  int rc = FP4IDX_OK, fd = -1;
  uint8_t *pages = NULL;
  char tmp[PATH_MAX];
  if (!path || n < 0 || !psize_ok(page_size) || (n > 0 && !slots) ||
      (flags & ~FP4IDX_EXPORT_RAW) ||
      snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "export: invalid arguments");
  }
  int64_t bytes = fp4idx__export_pages_bytes(n, page_size);
  pages = malloc(bytes ? (size_t)bytes : 1);
  if (!pages) {
    return fp4idx__fail(err, errlen, FP4IDX_ENOMEM, "export: out of memory");
  }
  fp4idx__export_pack(slots, n, page_size, pages);
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) goto ioerr;
  if (!(flags & FP4IDX_EXPORT_RAW)) {
    unsigned char h[FP4IDX_EXPORT_HEADER_BYTES];
    memset(h, 0, sizeof h);
    memcpy(h, EXPORT_MAGIC, 8);
    fp4idx__put32(h + 8, 1);
    fp4idx__put32(h + 12, FP4IDX_EXPORT_HEADER_BYTES);
    fp4idx__put32(h + 16, (uint32_t)page_size);
    fp4idx__put32(h + 20, FP4IDX_SLOT_BYTES);
    fp4idx__put64(h + 24, seq);
    fp4idx__put64(h + 32, (uint64_t)n);
    fp4idx__put64(h + 40, (uint64_t)(bytes / ((int64_t)page_size * FP4IDX_SLOT_BYTES)));
    fp4idx__put32(h + 48, fp4idx__crc32c(0, pages, (size_t)bytes));
    fp4idx__put32(h + 60, fp4idx__crc32c(0, h, 60));
    if (write(fd, h, sizeof h) != (ssize_t)sizeof h) goto ioerr;
  }
  for (int64_t off = 0; off < bytes;) {
    ssize_t w = write(fd, pages + off, (size_t)(bytes - off));
    if (w < 0) {
      if (errno == EINTR) continue;
      goto ioerr;
    }
    off += w;
  }
  if (fsync(fd)) goto ioerr;
  close(fd);
  fd = -1;
  if (rename(tmp, path)) goto ioerr;
  (void)fp4idx__fsync_parent(path);
  goto out;
ioerr:
  rc = fp4idx__fail(err, errlen, FP4IDX_EIO, "export: %s: %s", tmp, strerror(errno));
  unlink(tmp);
out:
  if (fd >= 0) close(fd);
  free(pages);
  return rc;
}

int fp4idx__export_read(const char *path, int flags, fp4idx_export_info_t *info,
                       uint8_t **slots_out, char *err, size_t errlen) {
  int rc = FP4IDX_OK, fd = -1;
  uint8_t *pages = NULL, *slots = NULL;
  if (!path || !info || !slots_out || (flags & ~FP4IDX_EXPORT_RAW)) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "import: invalid arguments");
  }
  *slots_out = NULL;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st)) goto ioerr;
  uint64_t size = (uint64_t)st.st_size, hbytes = 0;
  uint32_t crc = 0;
  fp4idx_export_info_t in = *info;
  if (!(flags & FP4IDX_EXPORT_RAW)) {
    unsigned char h[FP4IDX_EXPORT_HEADER_BYTES];
    ssize_t got = pread(fd, h, sizeof h, 0);
    if (got < 0) goto ioerr;
    if (got < (ssize_t)sizeof h || memcmp(h, EXPORT_MAGIC, 8) ||
        fp4idx__get32(h + 60) != fp4idx__crc32c(0, h, 60)) {
      rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: not an fp4idx export file or corrupt header", path);
      goto out;
    }
    if (fp4idx__get32(h + 8) != 1) {
      rc = fp4idx__fail(err, errlen, FP4IDX_EVERSION, "%s: export format version %u, this build reads 1",
                        path, fp4idx__get32(h + 8));
      goto out;
    }
    in.page_size = (int32_t)fp4idx__get32(h + 16);
    in.seq = fp4idx__get64(h + 24);
    in.n_keys = (int64_t)fp4idx__get64(h + 32);
    in.n_pages = (int64_t)fp4idx__get64(h + 40);
    crc = fp4idx__get32(h + 48);
    hbytes = FP4IDX_EXPORT_HEADER_BYTES;
    if (!psize_ok(in.page_size) || fp4idx__get32(h + 20) != FP4IDX_SLOT_BYTES ||
        in.n_keys < 0 || in.n_keys > (INT64_MAX >> 8) ||
        in.n_pages != (in.n_keys + in.page_size - 1) / in.page_size) {
      rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: inconsistent export header", path);
      goto out;
    }
  } else {
    if (!psize_ok(in.page_size) || in.n_keys < 0 || in.n_keys > (INT64_MAX >> 8)) {
      rc = fp4idx__fail(err, errlen, FP4IDX_EINVAL, "import: raw file needs a key count and a page size");
      goto out;
    }
    in.n_pages = (in.n_keys + in.page_size - 1) / in.page_size;
  }
  int64_t bytes = fp4idx__export_pages_bytes(in.n_keys, in.page_size);
  if (size != hbytes + (uint64_t)bytes) {
    rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: %s: expected %llu bytes, file has %llu", path,
                      size < hbytes + (uint64_t)bytes ? "truncated" : "wrong size",
                      (unsigned long long)(hbytes + (uint64_t)bytes),
                      (unsigned long long)size);
    goto out;
  }
  pages = malloc(bytes ? (size_t)bytes : 1);
  slots = malloc(in.n_keys ? (size_t)in.n_keys * FP4IDX_SLOT_BYTES : 1);
  if (!pages || !slots) {
    rc = fp4idx__fail(err, errlen, FP4IDX_ENOMEM, "import: out of memory");
    goto out;
  }
  for (int64_t off = 0; off < bytes;) {
    ssize_t r = pread(fd, pages + off, (size_t)(bytes - off), (off_t)(hbytes + (uint64_t)off));
    if (r < 0) {
      if (errno == EINTR) continue;
      goto ioerr;
    }
    if (r == 0) break;
    off += r;
  }
  if (!(flags & FP4IDX_EXPORT_RAW) && fp4idx__crc32c(0, pages, (size_t)bytes) != crc) {
    rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: page checksum mismatch (corrupt)", path);
    goto out;
  }
  fp4idx__export_unpack(pages, in.n_keys, in.page_size, slots);
  *info = in;
  *slots_out = slots;
  slots = NULL;
  goto out;
ioerr:
  rc = fp4idx__fail(err, errlen, FP4IDX_EIO, "import: %s: %s", path, strerror(errno));
out:
  if (fd >= 0) close(fd);
  free(pages);
  free(slots);
  return rc;
}
