/* aof.c -- the append log; see aof.h for the format and the guarantees. */
#define _GNU_SOURCE
#include "aof.h"
#include "bytes.h"
#include "fp4idx_format.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "logmark.h"
#include "snapshot.h" /* fp4idx__fsync_parent */

#define AOF_MAGIC "FP4IDXLG"
#define REC_MAGIC 0x52344650u
#define REC_HEAD 36

struct fp4idx_aof_s {
  int fd;
  char *path;
  uint64_t gen;
  fp4idx_fsync_t policy;
  int64_t size;
  pthread_mutex_t mu; /* guards fd against the swap in rewrite */
  pthread_cond_t cv;
  pthread_t flusher;
  int flusher_on;
  int stop;
  int dirty;
  char *mark_path;    /* logmark.h: how far the log reached on disk */
  int mark_fd;        /* the mark, open for rewrites (-1: reopened on the next) */
  int64_t marked;     /* the length the mark holds */
};

/* (Re)opens the mark by its path, so that a mark file replaced or removed
 * while the log is open is written again from then on. */
static void aof_mark_reopen(fp4idx_aof_t *a) {
  int fd = fp4idx__logmark_open(a->mark_path);
  if (fd < 0) return; /* the old one, if any, stays in use */
  if (a->mark_fd >= 0) close(a->mark_fd);
  a->mark_fd = fd;
}

/* Records that `bytes` of the log are on disk (the caller synced them): one
 * pwrite and fdatasync of the open mark. The mark is advisory -- it can only
 * make a later start refuse a shorter log -- so a failure to write it is not
 * an error of the append. */
static void aof_mark(fp4idx_aof_t *a, uint64_t gen, int64_t bytes) {
  if (a->mark_fd < 0) aof_mark_reopen(a);
  if (a->mark_fd >= 0 && fp4idx__logmark_put(a->mark_fd, gen, (uint64_t)bytes) == FP4IDX_OK)
    a->marked = bytes;
}


int fp4idx__fsync_parse(const char *s, fp4idx_fsync_t *out) {
  if (!s || !out) return FP4IDX_EINVAL;
  if (!strcmp(s, "always")) *out = FP4IDX_FSYNC_ALWAYS;
  else if (!strcmp(s, "everysec")) *out = FP4IDX_FSYNC_EVERYSEC;
  else if (!strcmp(s, "no")) *out = FP4IDX_FSYNC_NO;
  else return FP4IDX_EINVAL;
  return FP4IDX_OK;
}

const char *fp4idx__fsync_name(fp4idx_fsync_t p) {
  switch (p) {
  case FP4IDX_FSYNC_ALWAYS: return "always";
  case FP4IDX_FSYNC_EVERYSEC: return "everysec";
  case FP4IDX_FSYNC_NO: return "no";
  }
  return "?";
}

/* ---- replay -------------------------------------------------------------- */

static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

int fp4idx__aof_replay(const char *path, uint64_t expect_gen,
                      fp4idx_aof_apply_fn apply, void *ctx,
                      fp4idx_aof_replay_t *res, char *err, size_t errlen) {
  int rc = FP4IDX_OK, fd = -1;
  unsigned char *map = NULL;
  size_t size = 0;

  if (!path || !apply || !res) return FP4IDX_EINVAL;
  memset(res, 0, sizeof *res);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return FP4IDX_OK;
    return fp4idx__fail(err, errlen, FP4IDX_EIO, "%s: %s", path, strerror(errno));
  }
  res->exists = 1;
  struct stat st;
  if (fstat(fd, &st)) goto ioerr;
  size = (size_t)st.st_size;
  res->file_bytes = (int64_t)size;
  if (size < FP4IDX_AOF_HEADER_BYTES) {
    rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: append log is truncated inside its header", path);
    goto out;
  }
  map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    map = NULL;
    goto ioerr;
  }
  madvise(map, size, MADV_SEQUENTIAL);
  if (memcmp(map, AOF_MAGIC, 8) != 0 || fp4idx__get32(map + 28) != fp4idx__crc32c(0, map, 28) ||
      fp4idx__get32(map + 12) != FP4IDX_AOF_HEADER_BYTES) {
    rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: not an fp4idx append log or corrupt header", path);
    goto out;
  }
  if (fp4idx__get32(map + 8) != 1) {
    rc = fp4idx__fail(err, errlen, FP4IDX_EVERSION, "%s: append log version %u, this build reads 1", path,
                      fp4idx__get32(map + 8));
    goto out;
  }
  res->gen = fp4idx__get64(map + 16);
  res->valid_bytes = FP4IDX_AOF_HEADER_BYTES;
  if (res->gen < expect_gen) {
    res->stale = 1; /* contained in the snapshot already */
    goto out;
  }
  if (res->gen > expect_gen) {
    rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: append log generation %llu is newer than the snapshot's (%llu): "
                      "the snapshot it continues is missing; refusing to replay",
                      path, (unsigned long long)res->gen, (unsigned long long)expect_gen);
    goto out;
  }

  size_t off = FP4IDX_AOF_HEADER_BYTES;
  while (off < size) {
    size_t rem = size - off;
    const unsigned char *r = map + off;
    if (rem < REC_HEAD) {
      snprintf(res->warning, sizeof res->warning,
               "append log %s: dropped an incomplete record header at offset "
               "%zu (%zu bytes): torn write at the tail",
               path, off, rem);
      break;
    }
    if (fp4idx__get32(r + 32) != fp4idx__crc32c(0, r, 32)) {
      if (all_zero(r, rem)) {
        snprintf(res->warning, sizeof res->warning,
                 "append log %s: dropped %zu zero bytes at the tail (offset %zu)",
                 path, rem, off);
        break;
      }
      rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: corrupt append log record header at offset %zu (of %zu bytes)",
                        path, off, size);
      goto out;
    }
    uint32_t magic = fp4idx__get32(r), op = fp4idx__get32(r + 4);
    uint64_t count = fp4idx__get64(r + 24);
    if (magic != REC_MAGIC || op < FP4IDX_AOF_APPEND || op > FP4IDX_AOF_FORK ||
        (op == FP4IDX_AOF_APPEND ? (count < 1 || count > (uint64_t)INT64_MAX / 128)
                                 : op != FP4IDX_AOF_FORK && count != 0) ||
        fp4idx__get64(r + 16) > (uint64_t)INT64_MAX) {
      rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: invalid append log record at offset %zu", path, off);
      goto out;
    }
    uint64_t rlen = FP4IDX_AOF_RECORD_OVERHEAD +
                    (op == FP4IDX_AOF_APPEND ? count * FP4IDX_SLOT_BYTES : 0);
    if (rlen > rem) {
      snprintf(res->warning, sizeof res->warning,
               "append log %s: dropped an incomplete last record at offset %zu "
               "(%zu of %llu bytes): torn write at the tail",
               path, off, rem, (unsigned long long)rlen);
      break;
    }
    if (fp4idx__get32(r + rlen - 4) != fp4idx__crc32c(0, r, rlen - 4)) {
      if (off + rlen == size) {
        snprintf(res->warning, sizeof res->warning,
                 "append log %s: dropped the last record at offset %zu: "
                 "checksum mismatch (torn write at the tail)",
                 path, off);
        break;
      }
      rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: corrupt append log record at offset %zu (checksum mismatch, "
                        "%zu bytes follow it)",
                        path, off, (size_t)(size - off - rlen));
      goto out;
    }
    fp4idx_aof_record_t rec = {
        .op = (fp4idx_aof_op_t)op,
        .seq = fp4idx__get64(r + 8),
        .pos = (int64_t)fp4idx__get64(r + 16),
        .count = op == FP4IDX_AOF_FORK ? 0 : (int64_t)count,
        .src = op == FP4IDX_AOF_FORK ? count : 0,
        .slots = op == FP4IDX_AOF_APPEND ? r + REC_HEAD : NULL,
        .offset = (int64_t)off,
    };
    rc = apply(ctx, &rec);
    if (rc != FP4IDX_OK) {
      rc = fp4idx__fail(err, errlen, rc, "%s: record at offset %zu (op %u, seq %llu, pos %lld) does not "
                        "apply: %s",
                        path, off, op, (unsigned long long)rec.seq, (long long)rec.pos,
                        fp4idx_strerror(rc));
      goto out;
    }
    res->records++;
    if (op == FP4IDX_AOF_APPEND) {
      res->appends++;
      res->keys += (int64_t)count;
    } else if (op == FP4IDX_AOF_TRUNCATE) {
      res->truncates++;
    } else if (op == FP4IDX_AOF_FORK) {
      res->forks++;
    } else {
      res->drops++;
    }
    off += rlen;
    res->valid_bytes = (int64_t)off;
  }
  goto out;

ioerr:
  rc = fp4idx__fail(err, errlen, FP4IDX_EIO, "%s: %s", path, strerror(errno));
out:
  if (map) munmap(map, size);
  if (fd >= 0) close(fd);
  return rc;
}

/* ---- writing ------------------------------------------------------------- */

/* Creates a fresh log of generation gen at path atomically; returns an fd
 * open for appending, or -1 with errno set. */
static int create_fresh(const char *path, uint64_t gen) {
  char tmp[PATH_MAX];
  unsigned char h[FP4IDX_AOF_HEADER_BYTES];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memset(h, 0, sizeof h);
  memcpy(h, AOF_MAGIC, 8);
  fp4idx__put32(h + 8, 1);
  fp4idx__put32(h + 12, FP4IDX_AOF_HEADER_BYTES);
  fp4idx__put64(h + 16, gen);
  fp4idx__put32(h + 28, fp4idx__crc32c(0, h, 28));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) return -1;
  if (write(fd, h, sizeof h) != (ssize_t)sizeof h || fsync(fd) ||
      rename(tmp, path) || fp4idx__fsync_parent(path) != FP4IDX_OK) {
    int e = errno ? errno : EIO;
    close(fd);
    unlink(tmp);
    errno = e;
    return -1;
  }
  return fd;
}

static void *flusher_main(void *arg) {
  fp4idx_aof_t *a = arg;
  pthread_mutex_lock(&a->mu);
  while (!a->stop) {
    /* A wake every second whether records arrive or not: after the last
     * record of a burst the next wake syncs and marks it, so the mark
     * trails the acknowledged writes by about a second at most, idle or
     * not. (CLOCK_MONOTONIC: a clock step does not stretch the second.) */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    /* acquire pairs with the writer's release of dirty (after its size):
     * the size read below includes the record that set dirty. */
    if (__atomic_exchange_n(&a->dirty, 0, __ATOMIC_ACQ_REL)) {
      /* fdatasync under the lock only guards against the fd being swapped by
       * rewrite; the writer does not take the lock for plain writes. Every
       * record counted in size before the sync is on disk after it. */
      int64_t size = __atomic_load_n(&a->size, __ATOMIC_ACQUIRE);
      if (fdatasync(a->fd) != 0)
        __atomic_store_n(&a->dirty, 1, __ATOMIC_RELAXED); /* again next second */
      else if (size > a->marked)
        aof_mark(a, a->gen, size);
    }
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

int fp4idx__aof_open(fp4idx_aof_t **out, const char *path, uint64_t gen,
                    fp4idx_fsync_t policy, int64_t keep_bytes, char *err,
                    size_t errlen) {
  if (!out || !path || keep_bytes < 0 ||
      (keep_bytes > 0 && keep_bytes < FP4IDX_AOF_HEADER_BYTES) ||
      policy > FP4IDX_FSYNC_NO) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "append log open: invalid arguments");
  }
  *out = NULL;
  fp4idx_aof_t *a = calloc(1, sizeof *a);
  if (!a || !(a->path = strdup(path))) {
    free(a);
    return fp4idx__fail(err, errlen, FP4IDX_ENOMEM, "append log open: out of memory");
  }
  a->gen = gen;
  a->policy = policy;
  a->fd = -1;
  a->mark_fd = -1;
  size_t mlen = strlen(path) + 8;
  if (!(a->mark_path = malloc(mlen)) || fp4idx__logmark_path(path, a->mark_path, mlen)) {
    free(a->mark_path);
    free(a->path);
    free(a);
    return fp4idx__fail(err, errlen, FP4IDX_ENOMEM, "append log open: out of memory");
  }
  if (keep_bytes > 0) {
    a->fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (a->fd < 0 || ftruncate(a->fd, keep_bytes) || fsync(a->fd)) goto ioerr;
    a->size = keep_bytes;
  } else {
    a->fd = create_fresh(path, gen);
    if (a->fd < 0) goto ioerr;
    a->size = FP4IDX_AOF_HEADER_BYTES;
  }
  /* What is on disk now (synced above) is what the log reached: a mark
   * claiming more (a loss accepted with --allow-data-loss) is replaced. */
  aof_mark(a, gen, a->size);
  pthread_mutex_init(&a->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&a->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (policy == FP4IDX_FSYNC_EVERYSEC) {
    if (pthread_create(&a->flusher, NULL, flusher_main, a) != 0) {
      errno = EAGAIN;
      goto ioerr_sync;
    }
    a->flusher_on = 1;
  }
  *out = a;
  return FP4IDX_OK;

ioerr_sync:
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
ioerr:
  (void)fp4idx__fail(err, errlen, FP4IDX_EIO, "append log %s: %s", path, strerror(errno));
  if (a->fd >= 0) close(a->fd);
  if (a->mark_fd >= 0) close(a->mark_fd);
  free(a->mark_path);
  free(a->path);
  free(a);
  return FP4IDX_EIO;
}

/* Writes one record (header fields, optional slots) and applies the policy. */
static int put_record(fp4idx_aof_t *a, uint32_t op, uint64_t seq, uint64_t pos,
                      uint64_t count, const uint8_t *slots) {
  unsigned char head[REC_HEAD], tail[4];
  fp4idx__put32(head, REC_MAGIC);
  fp4idx__put32(head + 4, op);
  fp4idx__put64(head + 8, seq);
  fp4idx__put64(head + 16, pos);
  fp4idx__put64(head + 24, count);
  fp4idx__put32(head + 32, fp4idx__crc32c(0, head, 32));
  size_t plen = op == FP4IDX_AOF_APPEND ? (size_t)count * FP4IDX_SLOT_BYTES : 0;
  uint32_t crc = fp4idx__crc32c(0, head, REC_HEAD);
  if (op == FP4IDX_AOF_APPEND) crc = fp4idx__crc32c(crc, slots, plen);
  fp4idx__put32(tail, crc);

  struct iovec iov[3] = {{head, REC_HEAD}, {(void *)slots, plen}, {tail, 4}};
  struct iovec *v = iov;
  int nv = 3;
  size_t left = REC_HEAD + plen + 4;
  while (left) {
    ssize_t w = writev(a->fd, v, nv);
    if (w < 0) {
      if (errno == EINTR) continue;
      goto fail;
    }
    left -= (size_t)w;
    while (w > 0 && nv) {
      if ((size_t)w >= v->iov_len) {
        w -= (ssize_t)v->iov_len;
        v++;
        nv--;
      } else {
        v->iov_base = (char *)v->iov_base + w;
        v->iov_len -= (size_t)w;
        w = 0;
      }
    }
  }
  if (a->policy == FP4IDX_FSYNC_ALWAYS) {
    if (fdatasync(a->fd)) goto fail;
  }
  __atomic_store_n(&a->size, a->size + (int64_t)(REC_HEAD + plen + 4), __ATOMIC_RELEASE);
  if (a->policy == FP4IDX_FSYNC_EVERYSEC) __atomic_store_n(&a->dirty, 1, __ATOMIC_RELEASE);
  /* always: the record is on disk, and the mark moves to cover it before the
   * reply (a second fdatasync, of the 40-byte mark), so no acknowledged
   * record can go missing later without the next start refusing. */
  if (a->policy == FP4IDX_FSYNC_ALWAYS) aof_mark(a, a->gen, a->size);
  return FP4IDX_OK;

fail:
  /* Cut the partial record off so that the log stays replayable. */
  if (ftruncate(a->fd, a->size) == 0) (void)fdatasync(a->fd);
  return FP4IDX_EIO;
}

int fp4idx__aof_append(fp4idx_aof_t *a, uint64_t seq, int64_t pos, int64_t n,
                      const uint8_t *slots) {
  if (!a || pos < 0 || n < 1 || !slots) return FP4IDX_EINVAL;
  return put_record(a, FP4IDX_AOF_APPEND, seq, (uint64_t)pos, (uint64_t)n, slots);
}

int fp4idx__aof_truncate(fp4idx_aof_t *a, uint64_t seq, int64_t length) {
  if (!a || length < 0) return FP4IDX_EINVAL;
  return put_record(a, FP4IDX_AOF_TRUNCATE, seq, (uint64_t)length, 0, NULL);
}

int fp4idx__aof_drop(fp4idx_aof_t *a, uint64_t seq) {
  if (!a) return FP4IDX_EINVAL;
  return put_record(a, FP4IDX_AOF_DROP, seq, 0, 0, NULL);
}

int fp4idx__aof_fork(fp4idx_aof_t *a, uint64_t src, uint64_t dst, int64_t length) {
  if (!a || length < 0) return FP4IDX_EINVAL;
  return put_record(a, FP4IDX_AOF_FORK, dst, (uint64_t)length, src, NULL);
}

int fp4idx__aof_sync(fp4idx_aof_t *a) {
  if (!a) return FP4IDX_EINVAL;
  if (fdatasync(a->fd)) return FP4IDX_EIO;
  pthread_mutex_lock(&a->mu);
  aof_mark(a, a->gen, a->size);
  pthread_mutex_unlock(&a->mu);
  return FP4IDX_OK;
}

int fp4idx__aof_rewrite(fp4idx_aof_t *a, uint64_t new_gen) {
  if (!a) return FP4IDX_EINVAL;
  int fd = create_fresh(a->path, new_gen);
  if (fd < 0) return FP4IDX_EIO;
  pthread_mutex_lock(&a->mu);
  int old = a->fd;
  a->fd = fd;
  a->gen = new_gen;
  a->size = FP4IDX_AOF_HEADER_BYTES;
  __atomic_store_n(&a->dirty, 0, __ATOMIC_RELAXED);
  /* Under the lock: the flusher never marks the old generation after this. */
  aof_mark_reopen(a);
  aof_mark(a, new_gen, a->size);
  pthread_mutex_unlock(&a->mu);
  close(old);
  return FP4IDX_OK;
}

uint64_t fp4idx__aof_gen(const fp4idx_aof_t *a) { return a ? a->gen : 0; }
int64_t fp4idx__aof_size(const fp4idx_aof_t *a) { return a ? a->size : 0; }

void fp4idx__aof_close(fp4idx_aof_t *a) {
  if (!a) return;
  if (a->flusher_on) {
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->flusher, NULL);
  }
  if (fdatasync(a->fd) == 0) aof_mark(a, a->gen, a->size);
  close(a->fd);
  if (a->mark_fd >= 0) close(a->mark_fd);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  free(a->mark_path);
  free(a->path);
  free(a);
}
