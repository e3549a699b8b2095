/* snapshot.c -- see snapshot.h for the file layout and the guarantees. */
#define _GNU_SOURCE
#include "snapshot.h"
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"

#define SNAPSHOT_MAGIC "FP4IDXSN"
/* Pages are moved in batches of about this many bytes: large enough that a
 * device copy runs at full speed, small enough to stay cheap in host RAM. */
#define CHUNK_BYTES (32u << 20)

/* ---- little helpers ----------------------------------------------------- */


static int64_t pages_of(int64_t n_keys, int32_t page_size) {
  return (n_keys + page_size - 1) / page_size;
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

/* Reads exactly len bytes; returns len, or fewer at end of file, or -1. */
static ssize_t read_full(int fd, void *buf, size_t len) {
  char *p = buf;
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, p + got, len - got > (1u << 30) ? (1u << 30) : len - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* ---- double buffering --------------------------------------------------- */

/* Two buffers passed between the calling thread (page copies through the
 * callbacks, checksums) and an I/O thread (write() or read() of the file),
 * so that disk I/O overlaps the rest. writing = 1: the caller fills buffers
 * and the thread writes them; writing = 0: the thread reads `left` bytes of
 * the file into buffers and the caller drains them. Buffers alternate 0, 1,
 * 0, ... on both sides, so the order is kept. */
typedef struct iopipe_s {
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned char *buf[2];
  size_t cap;
  size_t len[2];
  int full[2];    /* 1: data waiting for the consumer */
  int fd;
  int writing;
  uint64_t left;  /* reading: bytes still to read */
  int eof;        /* writing: the caller has put its last buffer */
  int stop;       /* the caller gives up: the thread ends */
  int err;        /* errno of a failed write/read; EPIPE for a short read */
  int started;
} iopipe_t;

static void *iopipe_main(void *arg) {
  iopipe_t *p = arg;
  for (int i = 0;; i ^= 1) {
    pthread_mutex_lock(&p->mu);
    if (p->writing) {
      while (!p->full[i] && !p->eof && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
      if (p->stop || !p->full[i]) break; /* (eof with nothing left) */
    } else {
      while (p->full[i] && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
      if (p->stop || p->left == 0) break;
    }
    pthread_mutex_unlock(&p->mu);
    int e = 0;
    size_t n = p->writing ? p->len[i] : (p->left < p->cap ? (size_t)p->left : p->cap);
    if (p->writing) {
      if (write_all(p->fd, p->buf[i], n)) e = errno ? errno : EIO;
    } else {
      ssize_t got = read_full(p->fd, p->buf[i], n);
      if (got < 0) e = errno ? errno : EIO;
      else if ((size_t)got != n) e = EPIPE;
    }
    pthread_mutex_lock(&p->mu);
    if (e) {
      p->err = e;
      pthread_cond_broadcast(&p->cv);
      break;
    }
    if (p->writing) {
      p->full[i] = 0;
    } else {
      p->len[i] = n;
      p->left -= n;
      p->full[i] = 1;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* Allocates the buffers and starts the thread. 0, or -1 (errno). */
static int iopipe_start(iopipe_t *p, int fd, int writing, size_t cap, uint64_t left) {
  memset(p, 0, sizeof *p);
  p->fd = fd;
  p->writing = writing;
  p->cap = cap;
  p->left = left;
  p->buf[0] = malloc(cap);
  p->buf[1] = malloc(cap);
  if (!p->buf[0] || !p->buf[1]) {
    free(p->buf[0]);
    free(p->buf[1]);
    errno = ENOMEM;
    return -1;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (pthread_create(&p->th, NULL, iopipe_main, p) != 0) {
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->buf[0]);
    free(p->buf[1]);
    errno = EAGAIN;
    return -1;
  }
  p->started = 1;
  return 0;
}

/* Caller side. writing: waits until buffer i is free; reading: until it is
 * full. Returns the buffer, or NULL after an I/O error (errno set). */
static unsigned char *iopipe_wait(iopipe_t *p, int i) {
  pthread_mutex_lock(&p->mu);
  while (!p->err && (p->writing ? p->full[i] : !p->full[i])) pthread_cond_wait(&p->cv, &p->mu);
  int e = p->err;
  pthread_mutex_unlock(&p->mu);
  if (e) {
    errno = e;
    return NULL;
  }
  return p->buf[i];
}

/* writing: hands buffer i (len bytes) to the thread; reading: gives buffer i
 * back to it. */
static void iopipe_pass(iopipe_t *p, int i, size_t len) {
  pthread_mutex_lock(&p->mu);
  if (p->writing) {
    p->len[i] = len;
    p->full[i] = 1;
  } else {
    p->full[i] = 0;
  }
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* Ends the thread: writing and ok, after everything is written; otherwise at
 * once. Returns 0, or -1 with errno of the first I/O error. */
static int iopipe_finish(iopipe_t *p, int ok) {
  if (!p->started) return 0;
  pthread_mutex_lock(&p->mu);
  if (p->writing && ok) p->eof = 1;
  else p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->th, NULL);
  int e = p->err;
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->buf[0]);
  free(p->buf[1]);
  p->started = 0;
  if (e) {
    errno = e;
    return -1;
  }
  return 0;
}

int fp4idx__fsync_parent(const char *path) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (!slash) {
    strcpy(dir, ".");
  } else if (slash == path) {
    strcpy(dir, "/");
  } else {
    size_t n = (size_t)(slash - path);
    if (n >= sizeof dir) return FP4IDX_EIO;
    memcpy(dir, path, n);
    dir[n] = 0;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FP4IDX_EIO;
  int rc = fsync(fd) == 0 ? FP4IDX_OK : FP4IDX_EIO;
  close(fd);
  return rc;
}

/* ---- header ------------------------------------------------------------- */

typedef struct header_s {
  fp4idx_snap_info_t info;
  uint64_t table_bytes, pool_bytes;
  uint32_t table_crc, pool_crc;
} header_t;

static void header_encode(unsigned char *h, const header_t *hd) {
  memset(h, 0, FP4IDX_SNAPSHOT_HEADER_BYTES);
  memcpy(h, SNAPSHOT_MAGIC, 8);
  fp4idx__put32(h + 8, hd->info.version);
  fp4idx__put32(h + 12, FP4IDX_SNAPSHOT_HEADER_BYTES);
  fp4idx__put32(h + 16, (uint32_t)hd->info.page_size);
  fp4idx__put32(h + 20, FP4IDX_SLOT_BYTES);
  fp4idx__put64(h + 24, (uint64_t)hd->info.n_seqs);
  fp4idx__put64(h + 32, (uint64_t)hd->info.n_pages);
  fp4idx__put64(h + 40, hd->table_bytes);
  fp4idx__put64(h + 48, hd->pool_bytes);
  fp4idx__put64(h + 56, (uint64_t)hd->info.n_keys);
  fp4idx__put64(h + 64, hd->info.log_gen);
  fp4idx__put64(h + 72, hd->info.created_ns);
  fp4idx__put32(h + 80, hd->table_crc);
  fp4idx__put32(h + 84, hd->pool_crc);
  fp4idx__put32(h + 124, fp4idx__crc32c(0, h, 124));
}

/* Decodes and checks a header against the file size. */
static int header_decode(const unsigned char *h, uint64_t file_bytes,
                         const char *path, header_t *hd, char *err,
                         size_t errlen) {
  if (memcmp(h, SNAPSHOT_MAGIC, 8) != 0) {
    return fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: not an fp4idx snapshot (bad magic)", path);
  }
  if (fp4idx__get32(h + 124) != fp4idx__crc32c(0, h, 124)) {
    return fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: header checksum mismatch (corrupt header)", path);
  }
  memset(hd, 0, sizeof *hd);
  hd->info.version = fp4idx__get32(h + 8);
  if (hd->info.version < 1 || hd->info.version > FP4IDX_SNAPSHOT_VERSION) {
    return fp4idx__fail(err, errlen, FP4IDX_EVERSION, "%s: snapshot format version %u, this build reads %d",
                        path, hd->info.version, FP4IDX_SNAPSHOT_VERSION);
  }
  uint32_t hbytes = fp4idx__get32(h + 12), psize = fp4idx__get32(h + 16), slot = fp4idx__get32(h + 20);
  hd->info.n_seqs = (int64_t)fp4idx__get64(h + 24);
  hd->info.n_pages = (int64_t)fp4idx__get64(h + 32);
  hd->table_bytes = fp4idx__get64(h + 40);
  hd->pool_bytes = fp4idx__get64(h + 48);
  hd->info.n_keys = (int64_t)fp4idx__get64(h + 56);
  hd->info.log_gen = fp4idx__get64(h + 64);
  hd->info.created_ns = fp4idx__get64(h + 72);
  hd->table_crc = fp4idx__get32(h + 80);
  hd->pool_crc = fp4idx__get32(h + 84);
  hd->info.page_size = (int32_t)psize;
  hd->info.file_bytes = file_bytes;
  if (hbytes != FP4IDX_SNAPSHOT_HEADER_BYTES || slot != FP4IDX_SLOT_BYTES ||
      psize < 1 || psize > (1u << 16) || (psize & (psize - 1)) ||
      hd->info.n_seqs < 0 || hd->info.n_pages < 0 || hd->info.n_keys < 0 ||
      hd->info.n_pages > (int64_t)INT32_MAX ||
      hd->pool_bytes != (uint64_t)hd->info.n_pages * psize * FP4IDX_SLOT_BYTES ||
      hd->table_bytes < (uint64_t)hd->info.n_seqs * 16 ||
      hd->table_bytes > (UINT64_MAX >> 2)) {
    return fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: inconsistent snapshot header", path);
  }
  uint64_t want = FP4IDX_SNAPSHOT_HEADER_BYTES + hd->table_bytes + hd->pool_bytes;
  if (want != file_bytes) {
    return fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: snapshot is %s: header says %llu bytes, file has %llu", path,
                        file_bytes < want ? "truncated" : "longer than its header says",
                        (unsigned long long)want, (unsigned long long)file_bytes);
  }
  return FP4IDX_OK;
}

/* ---- save --------------------------------------------------------------- */

/* Save, first phase: marks the pages the sequences name (and catches ids
 * out of range or twice in a sequence), then numbers them in ascending
 * page order, the order in which they are copied out: file_index[p] is the
 * stored index of pool page p, -1 if unused. A page several sequences name
 * is stored once (version 2). Fills hd's counts; *n_stored gets the pages
 * to store. last[] is scratch of pool_pages entries. */
static int snapshot_number_pages(const fp4idx_snap_seq_t *seqs, int64_t n_seqs,
                                 int32_t page_size, int64_t pool_pages, int32_t *file_index,
                                 int64_t *last, header_t *hd, int64_t *n_stored, char *err,
                                 size_t errlen) {
  int shared = 0;
  memset(file_index, 0xff, sizeof *file_index * (size_t)pool_pages);
  memset(last, 0xff, sizeof *last * (size_t)pool_pages);
  for (int64_t s = 0; s < n_seqs; s++) {
    int64_t np = pages_of(seqs[s].n_keys, page_size);
    if (seqs[s].n_keys < 0 || (np && !seqs[s].pages)) {
      return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "snapshot save: sequence %llu: bad key count",
                          (unsigned long long)seqs[s].id);
    }
    for (int64_t i = 0; i < np; i++) {
      int32_t p = seqs[s].pages[i];
      if (p < 0 || p >= pool_pages || last[p] == s) {
        return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "snapshot save: sequence %llu: page %d out of range or listed twice",
                            (unsigned long long)seqs[s].id, (int)p);
      }
      shared |= file_index[p] == 0;
      file_index[p] = 0;
      last[p] = s;
    }
    hd->info.n_keys += seqs[s].n_keys;
    hd->table_bytes += 16 + 4 * (uint64_t)np;
  }
  *n_stored = 0;
  for (int64_t p = 0; p < pool_pages; p++)
    if (file_index[p] == 0) file_index[p] = (int32_t)(*n_stored)++;
  hd->info.version = shared ? 2 : 1;
  return FP4IDX_OK;
}

/* Save: the sequence table (id, key count, stored page indexes), through
 * tbuf (1 MiB); its checksum into hd->table_crc. 0, or -1 (errno). */
static int snapshot_write_table(int fd, const fp4idx_snap_seq_t *seqs, int64_t n_seqs,
                                int32_t page_size, const int32_t *file_index,
                                unsigned char *tbuf, header_t *hd) {
  size_t tlen = 0;
  for (int64_t s = 0; s < n_seqs; s++) {
    int64_t np = pages_of(seqs[s].n_keys, page_size);
    if (tlen + 16 > (1u << 20)) {
      hd->table_crc = fp4idx__crc32c(hd->table_crc, tbuf, tlen);
      if (write_all(fd, tbuf, tlen)) return -1;
      tlen = 0;
    }
    fp4idx__put64(tbuf + tlen, seqs[s].id);
    fp4idx__put64(tbuf + tlen + 8, (uint64_t)seqs[s].n_keys);
    tlen += 16;
    for (int64_t i = 0; i < np; i++) {
      if (tlen + 4 > (1u << 20)) {
        hd->table_crc = fp4idx__crc32c(hd->table_crc, tbuf, tlen);
        if (write_all(fd, tbuf, tlen)) return -1;
        tlen = 0;
      }
      fp4idx__put32(tbuf + tlen, (uint32_t)file_index[seqs[s].pages[i]]);
      tlen += 4;
    }
  }
  hd->table_crc = fp4idx__crc32c(hd->table_crc, tbuf, tlen);
  if (tlen && write_all(fd, tbuf, tlen)) return -1;
  return 0;
}

/* The failed I/O of a save (errno) as its error. */
static int snapshot_save_ioerr(const char *tmp, char *err, size_t errlen) {
  return fp4idx__fail(err, errlen, FP4IDX_EIO, "snapshot save: %s: %s", tmp, strerror(errno));
}

/* Save: the pool section of file tmp (fd), the used pages in ascending
 * order, copied run by run (one read_fn call per run of consecutive pages)
 * into a buffer that the I/O thread writes out while the next one fills;
 * its checksum into hd->pool_crc. Returns FP4IDX_OK, read_fn's status or
 * FP4IDX_EIO, with err filled. */
static int snapshot_write_pool(int fd, const char *tmp, int64_t pool_pages, size_t page_bytes,
                               const int32_t *file_index, fp4idx_snap_read_fn read_fn,
                               void *ctx, header_t *hd, char *err, size_t errlen) {
  size_t chunk_pages = CHUNK_BYTES / page_bytes;
  if (chunk_pages < 1) chunk_pages = 1;
  iopipe_t pipe;
  if (iopipe_start(&pipe, fd, 1, chunk_pages * page_bytes, 0))
    return snapshot_save_ioerr(tmp, err, errlen);
  int cur = 0;
  size_t fill = 0; /* pages in buffer cur */
  unsigned char *out = iopipe_wait(&pipe, cur);
  for (int64_t p = 0; p < pool_pages && out;) {
    if (file_index[p] < 0) {
      p++;
      continue;
    }
    int64_t n = 0;
    while (p + n < pool_pages && file_index[p + n] >= 0 && fill + (size_t)n < chunk_pages)
      n++;
    int rc = read_fn(ctx, p, n, out + fill * page_bytes);
    if (rc != FP4IDX_OK) {
      rc = fp4idx__fail(err, errlen, rc, "snapshot save: reading pages %lld..%lld: %s",
                        (long long)p, (long long)(p + n - 1), fp4idx_strerror(rc));
      iopipe_finish(&pipe, 0);
      return rc;
    }
    hd->pool_crc = fp4idx__crc32c(hd->pool_crc, out + fill * page_bytes,
                                  (size_t)n * page_bytes);
    fill += (size_t)n;
    p += n;
    if (fill == chunk_pages) {
      iopipe_pass(&pipe, cur, fill * page_bytes);
      cur ^= 1;
      fill = 0;
      out = iopipe_wait(&pipe, cur);
    }
  }
  if (out && fill) iopipe_pass(&pipe, cur, fill * page_bytes);
  if (iopipe_finish(&pipe, out != NULL)) return snapshot_save_ioerr(tmp, err, errlen);
  return FP4IDX_OK;
}

/* Save, last phase: the real header over the placeholder, the data on
 * disk, then the rename that makes the file the snapshot and the folder
 * fsync that makes the rename durable. Closes *fd (-1 after). 0, or -1
 * (errno). */
static int snapshot_commit(int *fd, const char *tmp, const char *path, const header_t *hd) {
  unsigned char h[FP4IDX_SNAPSHOT_HEADER_BYTES];
  header_encode(h, hd);
  if (pwrite(*fd, h, sizeof h, 0) != (ssize_t)sizeof h) return -1;
  if (fsync(*fd)) return -1;
  int closed = close(*fd);
  *fd = -1;
  if (closed) return -1;
  if (rename(tmp, path)) return -1;
  if (fp4idx__fsync_parent(path) != FP4IDX_OK) return -1;
  return 0;
}

int fp4idx__snapshot_save(const char *path, int32_t page_size, int64_t pool_pages,
                         const fp4idx_snap_seq_t *seqs, int64_t n_seqs,
                         uint64_t log_gen, fp4idx_snap_read_fn read_fn, void *ctx,
                         fp4idx_snap_info_t *info, char *err, size_t errlen) {
  int rc = FP4IDX_OK, fd = -1;
  int32_t *file_index = NULL; /* pool page -> stored index, -1 if unused */
  int64_t *last = NULL;       /* pool page -> the last sequence naming it */
  unsigned char *tbuf = NULL;
  char tmp[PATH_MAX];
  header_t hd;

  if (!path || !read_fn || page_size < 1 || page_size > (1 << 16) ||
      (page_size & (page_size - 1)) || pool_pages < 0 ||
      pool_pages > INT32_MAX || n_seqs < 0 || (n_seqs && !seqs)) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "snapshot save: invalid arguments");
  }
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "snapshot save: path too long");
  }
  memset(&hd, 0, sizeof hd);
  const size_t page_bytes = (size_t)page_size * FP4IDX_SLOT_BYTES;

  file_index = malloc(sizeof *file_index * (size_t)(pool_pages ? pool_pages : 1));
  last = malloc(sizeof *last * (size_t)(pool_pages ? pool_pages : 1));
  if (!file_index || !last) goto nomem;
  int64_t n_stored = 0;
  rc = snapshot_number_pages(seqs, n_seqs, page_size, pool_pages, file_index, last, &hd,
                             &n_stored, err, errlen);
  if (rc != FP4IDX_OK) goto out;
  tbuf = malloc(1u << 20);
  if (!tbuf) goto nomem;
  hd.info.page_size = page_size;
  hd.info.n_seqs = n_seqs;
  hd.info.n_pages = n_stored;
  hd.info.log_gen = log_gen;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  hd.info.created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  hd.pool_bytes = (uint64_t)n_stored * page_bytes;

  /* A placeholder header first; the real one (with checksums) goes in at
   * the end. */
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  memset(tbuf, 0, FP4IDX_SNAPSHOT_HEADER_BYTES);
  if (fd < 0 || write_all(fd, tbuf, FP4IDX_SNAPSHOT_HEADER_BYTES) ||
      snapshot_write_table(fd, seqs, n_seqs, page_size, file_index, tbuf, &hd))
    goto ioerr;
  rc = snapshot_write_pool(fd, tmp, pool_pages, page_bytes, file_index, read_fn, ctx, &hd, err,
                           errlen);
  if (rc != FP4IDX_OK) goto out;
  if (snapshot_commit(&fd, tmp, path, &hd)) goto ioerr;
  hd.info.file_bytes = FP4IDX_SNAPSHOT_HEADER_BYTES + hd.table_bytes + hd.pool_bytes;
  if (info) *info = hd.info;
  goto out;

nomem:
  rc = fp4idx__fail(err, errlen, FP4IDX_ENOMEM, "snapshot save: out of memory");
  goto out;
ioerr:
  rc = snapshot_save_ioerr(tmp, err, errlen);
out:
  if (fd >= 0) close(fd);
  if (rc != FP4IDX_OK) unlink(tmp);
  free(file_index);
  free(last);
  free(tbuf);
  return rc;
}

/* ---- load --------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int open_and_header(const char *path, int *fd_out, header_t *hd,
                           char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return FP4IDX_SNAPSHOT_NONE;
    return fp4idx__fail(err, errlen, FP4IDX_EIO, "%s: %s", path, strerror(errno));
  }
  struct stat st;
  unsigned char h[FP4IDX_SNAPSHOT_HEADER_BYTES];
  if (fstat(fd, &st)) {
    (void)fp4idx__fail(err, errlen, FP4IDX_EIO, "%s: %s", path, strerror(errno));
    close(fd);
    return FP4IDX_EIO;
  }
  ssize_t got = read_full(fd, h, sizeof h);
  if (got < 0) {
    (void)fp4idx__fail(err, errlen, FP4IDX_EIO, "%s: %s", path, strerror(errno));
    close(fd);
    return FP4IDX_EIO;
  }
  if (got < (ssize_t)sizeof h) {
    (void)fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: snapshot is truncated (%lld bytes, header needs %d)",
                       path, (long long)got, FP4IDX_SNAPSHOT_HEADER_BYTES);
    close(fd);
    return FP4IDX_ECORRUPT;
  }
  int rc = header_decode(h, (uint64_t)st.st_size, path, hd, err, errlen);
  if (rc != FP4IDX_OK) {
    close(fd);
    return rc;
  }
  *fd_out = fd;
  return FP4IDX_OK;
}

int fp4idx__snapshot_probe(const char *path, fp4idx_snap_info_t *info, char *err,
                          size_t errlen) {
  header_t hd;
  int fd = -1;
  if (!path) return FP4IDX_EINVAL;
  int rc = open_and_header(path, &fd, &hd, err, errlen);
  if (rc != FP4IDX_OK) return rc;
  close(fd);
  if (info) *info = hd.info;
  return FP4IDX_OK;
}

/* Load: the file fits the daemon (same page size, enough pool pages). */
static int snapshot_check_fit(const char *path, const header_t *hd, int32_t page_size,
                              int64_t pool_pages, char *err, size_t errlen) {
  if (hd->info.page_size != page_size) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "%s: snapshot page size is %d, the daemon runs with %d "
                        "(start with --page-size %d to load it)",
                        path, (int)hd->info.page_size, (int)page_size, (int)hd->info.page_size);
  }
  if (hd->info.n_pages > pool_pages) {
    return fp4idx__fail(err, errlen, FP4IDX_EFULL, "%s: snapshot holds %lld pages, the pool has only %lld "
                        "(raise --cache-bytes)",
                        path, (long long)hd->info.n_pages, (long long)pool_pages);
  }
  return FP4IDX_OK;
}

/* Load: the sequence table of table_bytes (read whole and checksummed by
 * the caller) into one block, the structs then all page lists, with every
 * bound checked: each page once per sequence, in two sequences only in a
 * version 2 file, every stored page named, the key counts adding up.
 * seen[] is scratch of n_pages + 1 entries. Returns FP4IDX_OK with *out
 * (free() it), FP4IDX_ECORRUPT or FP4IDX_ENOMEM. */
static int snapshot_parse_table(const unsigned char *table, const header_t *hd,
                                int32_t page_size, int64_t *seen, fp4idx_snap_seq_t **out) {
  *out = NULL;
  memset(seen, 0xff, sizeof *seen * ((size_t)hd->info.n_pages + 1));
  uint64_t n_idx = (hd->table_bytes - 16 * (uint64_t)hd->info.n_seqs) / 4;
  size_t block = sizeof(fp4idx_snap_seq_t) * (size_t)hd->info.n_seqs + 4 * (size_t)n_idx + 1;
  fp4idx_snap_seq_t *seqs = malloc(block);
  if (!seqs) return FP4IDX_ENOMEM;
  int32_t *idx = (int32_t *)(seqs + hd->info.n_seqs);
  uint64_t off = 0, keys = 0, used = 0;
  for (int64_t s = 0; s < hd->info.n_seqs; s++) {
    if (off + 16 > hd->table_bytes) goto bad;
    seqs[s].id = fp4idx__get64(table + off);
    uint64_t nk = fp4idx__get64(table + off + 8);
    off += 16;
    if (nk > (uint64_t)INT64_MAX / 2) goto bad;
    int64_t np = pages_of((int64_t)nk, page_size);
    if (off + 4 * (uint64_t)np > hd->table_bytes) goto bad;
    seqs[s].n_keys = (int64_t)nk;
    seqs[s].pages = idx;
    for (int64_t i = 0; i < np; i++) {
      uint32_t p = fp4idx__get32(table + off);
      off += 4;
      if ((int64_t)p >= hd->info.n_pages || seen[p] == s ||
          (seen[p] >= 0 && hd->info.version < 2))
        goto bad;
      used += seen[p] < 0; /* distinct pages */
      seen[p] = s;
      *idx++ = (int32_t)p;
    }
    keys += nk;
  }
  if (off != hd->table_bytes || used != (uint64_t)hd->info.n_pages ||
      keys != (uint64_t)hd->info.n_keys)
    goto bad;
  *out = seqs;
  return FP4IDX_OK;
bad:
  free(seqs);
  return FP4IDX_ECORRUPT;
}

/* Load: duplicate ids would make two sequences of one; checked with a
 * sort. FP4IDX_OK, FP4IDX_ECORRUPT (a duplicate) or FP4IDX_ENOMEM. */
static int snapshot_check_ids(const fp4idx_snap_seq_t *seqs, int64_t n_seqs) {
  if (n_seqs <= 1) return FP4IDX_OK;
  uint64_t *ids = malloc(sizeof *ids * (size_t)n_seqs);
  if (!ids) return FP4IDX_ENOMEM;
  for (int64_t s = 0; s < n_seqs; s++) ids[s] = seqs[s].id;
  qsort(ids, (size_t)n_seqs, sizeof *ids, cmp_u64);
  int dup = 0;
  for (int64_t s = 1; s < n_seqs; s++) dup |= ids[s] == ids[s - 1];
  free(ids);
  return dup ? FP4IDX_ECORRUPT : FP4IDX_OK;
}

/* Load: the pool section. The I/O thread reads ahead into one buffer while
 * the pages of the other are checksummed and written into pool pages 0..
 * Returns FP4IDX_OK, or a status with err filled (nothing is loaded when
 * the checksum does not match, but pages may have been written). */
static int snapshot_read_pool(int fd, const char *path, const header_t *hd, int32_t page_size,
                              fp4idx_snap_write_fn write_fn, void *ctx, char *err,
                              size_t errlen) {
  const size_t page_bytes = (size_t)page_size * FP4IDX_SLOT_BYTES;
  size_t chunk_pages = CHUNK_BYTES / page_bytes;
  if (chunk_pages < 1) chunk_pages = 1;
#ifdef POSIX_FADV_SEQUENTIAL
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  iopipe_t pipe;
  if (iopipe_start(&pipe, fd, 0, chunk_pages * page_bytes, hd->pool_bytes))
    return fp4idx__fail(err, errlen, FP4IDX_EIO, "%s: %s", path, strerror(errno));
  uint32_t crc = 0;
  int cur = 0;
  for (int64_t p = 0; p < hd->info.n_pages; cur ^= 1) {
    unsigned char *in = iopipe_wait(&pipe, cur);
    if (!in) {
      int e = errno;
      iopipe_finish(&pipe, 0);
      if (e == EPIPE)
        return fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: snapshot is truncated in its pool section", path);
      return fp4idx__fail(err, errlen, FP4IDX_EIO, "%s: %s", path, strerror(e));
    }
    int64_t n = (int64_t)(pipe.len[cur] / page_bytes);
    crc = fp4idx__crc32c(crc, in, pipe.len[cur]);
    int rc = write_fn(ctx, p, n, in);
    if (rc != FP4IDX_OK) {
      iopipe_finish(&pipe, 0);
      return fp4idx__fail(err, errlen, rc, "%s: writing pages %lld..%lld into the pool: %s",
                          path, (long long)p, (long long)(p + n - 1), fp4idx_strerror(rc));
    }
    iopipe_pass(&pipe, cur, 0);
    p += n;
  }
  iopipe_finish(&pipe, 0);
  if (crc != hd->pool_crc) {
    return fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: pool checksum mismatch (corrupt page data); nothing loaded",
                        path);
  }
  return FP4IDX_OK;
}

int fp4idx__snapshot_load(const char *path, int32_t page_size, int64_t pool_pages,
                         fp4idx_snap_write_fn write_fn, void *ctx,
                         fp4idx_snap_seq_t **seqs_out, int64_t *n_seqs_out,
                         fp4idx_snap_info_t *info, char *err, size_t errlen) {
  int rc, fd = -1;
  header_t hd;
  unsigned char *table = NULL;
  int64_t *seen = NULL; /* stored page -> the last sequence naming it, -1 */
  fp4idx_snap_seq_t *seqs = NULL;

  if (!path || !write_fn || !seqs_out || !n_seqs_out || pool_pages < 0) {
    return fp4idx__fail(err, errlen, FP4IDX_EINVAL, "snapshot load: invalid arguments");
  }
  *seqs_out = NULL;
  *n_seqs_out = 0;
  rc = open_and_header(path, &fd, &hd, err, errlen);
  if (rc != FP4IDX_OK) return rc;
  rc = snapshot_check_fit(path, &hd, page_size, pool_pages, err, errlen);
  if (rc != FP4IDX_OK) goto out;

  /* Table: read whole (its size is bounded by the file size, checked), its
   * checksum checked, then parsed. */
  table = malloc(hd.table_bytes ? hd.table_bytes : 1);
  seen = malloc(sizeof *seen * ((size_t)hd.info.n_pages + 1));
  if (!table || !seen) goto nomem;
  ssize_t got = read_full(fd, table, hd.table_bytes);
  if (got < 0) {
    rc = fp4idx__fail(err, errlen, FP4IDX_EIO, "%s: %s", path, strerror(errno));
    goto out;
  }
  if ((uint64_t)got != hd.table_bytes ||
      fp4idx__crc32c(0, table, hd.table_bytes) != hd.table_crc) {
    rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: sequence table checksum mismatch (corrupt)", path);
    goto out;
  }
  rc = snapshot_parse_table(table, &hd, page_size, seen, &seqs);
  if (rc == FP4IDX_OK) rc = snapshot_check_ids(seqs, hd.info.n_seqs);
  if (rc == FP4IDX_ENOMEM) goto nomem;
  if (rc != FP4IDX_OK) {
    rc = fp4idx__fail(err, errlen, FP4IDX_ECORRUPT, "%s: inconsistent sequence table (corrupt)", path);
    goto out;
  }
  rc = snapshot_read_pool(fd, path, &hd, page_size, write_fn, ctx, err, errlen);
  if (rc != FP4IDX_OK) goto out;
  *seqs_out = seqs;
  *n_seqs_out = hd.info.n_seqs;
  seqs = NULL;
  if (info) *info = hd.info;
  goto out;

nomem:
  rc = fp4idx__fail(err, errlen, FP4IDX_ENOMEM, "snapshot load: out of memory");
out:
  if (fd >= 0) close(fd);
  free(table);
  free(seen);
  free(seqs);
  return rc;
}
