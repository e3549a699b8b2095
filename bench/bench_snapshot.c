/* bench_snapshot.c -- snapshot save and load speed, GB/s.
 *
 *   bench_snapshot [GIB] [DIR] [--cold]
 *
 * Builds a host pool of GIB GiB (default 1) of 64-key pages filled with
 * random bytes, puts sequences of 4096 keys on shuffled pages, then times
 * fp4idx__snapshot_save (write, fsync, rename, folder fsync) and
 * fp4idx__snapshot_load into a fresh pool, three times each, and prints the
 * median. --cold drops the page cache before each load (root only), so the
 * load reads from the disk. Also prints the CRC-32C speed. The pool lives in
 * host memory: with the CUDA backend add the device copy (~20+ GB/s pinned).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "snapshot.h"

#define PS 64
#define PAGE_BYTES (PS * 68)

typedef struct pool_s {
  unsigned char *bytes;
  int64_t n_pages;
} pool_t;

static int rd(void *ctx, int64_t first, int64_t count, void *out) {
  pool_t *p = ctx;
  memcpy(out, p->bytes + (size_t)first * PAGE_BYTES, (size_t)count * PAGE_BYTES);
  return 0;
}
static int wr(void *ctx, int64_t first, int64_t count, const void *in) {
  pool_t *p = ctx;
  memcpy(p->bytes + (size_t)first * PAGE_BYTES, in, (size_t)count * PAGE_BYTES);
  return 0;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  double gib = 1.0;
  const char *dir = "/var/tmp";
  int cold = 0;
  int pos = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cold")) cold = 1;
    else if (pos++ == 0) gib = atof(argv[i]);
    else dir = argv[i];
  }
  int64_t n_pages = (int64_t)(gib * (1 << 30) / PAGE_BYTES);
  pool_t src = {malloc((size_t)n_pages * PAGE_BYTES), n_pages};
  pool_t dst = {malloc((size_t)n_pages * PAGE_BYTES), n_pages};
  if (!src.bytes || !dst.bytes) {
    fprintf(stderr, "bench_snapshot: out of memory\n");
    return 1;
  }
  uint64_t s = 88172645463325252ull;
  uint64_t *w = (uint64_t *)src.bytes;
  for (size_t i = 0; i < (size_t)n_pages * PAGE_BYTES / 8; i++) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    w[i] = s;
  }
  memset(dst.bytes, 0, (size_t)n_pages * PAGE_BYTES);

  /* Sequences of 64 pages (4096 keys) on shuffled pages. */
  int32_t *perm = malloc(sizeof *perm * (size_t)n_pages);
  for (int64_t i = 0; i < n_pages; i++) perm[i] = (int32_t)i;
  for (int64_t i = n_pages - 1; i > 0; i--) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    int64_t j = (int64_t)(s % (uint64_t)(i + 1));
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  int64_t n_seqs = n_pages / 64;
  fp4idx_snap_seq_t *seqs = calloc((size_t)n_seqs, sizeof *seqs);
  for (int64_t i = 0; i < n_seqs; i++) {
    seqs[i].id = (uint64_t)i;
    seqs[i].n_keys = 64 * PS;
    seqs[i].pages = perm + i * 64;
  }

  char path[512], err[512];
  snprintf(path, sizeof path, "%s/bench_snapshot.fp4s", dir);
  double t_save[3], t_load[3];
  fp4idx_snap_info_t info;
  for (int r = 0; r < 3; r++) {
    double t0 = now();
    int rc = fp4idx__snapshot_save(path, PS, n_pages, seqs, n_seqs, 1, rd, &src, &info,
                                  err, sizeof err);
    t_save[r] = now() - t0;
    if (rc) {
      fprintf(stderr, "save: %s\n", err);
      return 1;
    }
    if (cold) {
      sync();
      int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
      if (fd < 0 || write(fd, "1", 1) != 1) {
        fprintf(stderr, "--cold needs root (/proc/sys/vm/drop_caches)\n");
        return 1;
      }
      close(fd);
    }
    fp4idx_snap_seq_t *got = NULL;
    int64_t n = 0;
    t0 = now();
    rc = fp4idx__snapshot_load(path, PS, n_pages, wr, &dst, &got, &n, NULL, err,
                              sizeof err);
    t_load[r] = now() - t0;
    if (rc || n != n_seqs) {
      fprintf(stderr, "load: %s\n", err);
      return 1;
    }
    /* Spot-check: the first page of the last sequence came back. */
    if (memcmp(dst.bytes + (size_t)got[n - 1].pages[0] * PAGE_BYTES,
               src.bytes + (size_t)seqs[n - 1].pages[0] * PAGE_BYTES, PAGE_BYTES)) {
      fprintf(stderr, "load: bytes differ\n");
      return 1;
    }
    free(got);
  }
  qsort(t_save, 3, sizeof(double), cmp_d);
  qsort(t_load, 3, sizeof(double), cmp_d);
  double gb = (double)info.file_bytes / 1e9;

  double t0 = now();
  uint32_t c = fp4idx__crc32c(0, src.bytes, (size_t)n_pages * PAGE_BYTES);
  double t_crc = now() - t0;

  printf("snapshot: %.3f GB file (%lld pages, %lld sequences, %lld keys) in %s\n", gb,
         (long long)info.n_pages, (long long)info.n_seqs, (long long)info.n_keys, dir);
  printf("save (write+fsync+rename), median of 3: %.3f s = %.2f GB/s\n", t_save[1],
         gb / t_save[1]);
  printf("load (%s cache, checked), median of 3: %.3f s = %.2f GB/s\n",
         cold ? "cold" : "warm", t_load[1], gb / t_load[1]);
  printf("crc32c (%s): %.2f GB/s [%08x]\n", fp4idx__crc32c_hw() ? "sse4.2" : "table",
         (double)n_pages * PAGE_BYTES / 1e9 / t_crc, c);
  unlink(path);
  free(seqs);
  free(perm);
  free(src.bytes);
  free(dst.bytes);
  return 0;
}
