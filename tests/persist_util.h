/* persist_util.h -- small helpers shared by the persistence tests:
 * temporary folders, a host-memory page pool with snapshot callbacks, file
 * byte surgery. Header-only (static functions) to stay out of tests/common. */
#ifndef FP4IDX_TESTS_PERSIST_UTIL_H
#define FP4IDX_TESTS_PERSIST_UTIL_H

#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A temporary folder, removed (with its files) by tmpdir_rm. */
static inline void tmpdir_make(char *dir, size_t cap) {
  snprintf(dir, cap, "/tmp/fp4idx-test-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static inline void tmpdir_rm(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

/* xorshift64*: deterministic test bytes. */
static inline uint64_t rng_next(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static inline void fill_random(void *buf, size_t n, uint64_t seed) {
  uint64_t s = seed | 1;
  unsigned char *p = buf;
  for (size_t i = 0; i < n; i++) {
    if ((i & 7) == 0) s = rng_next(&s) | 1;
    p[i] = (unsigned char)(s >> (8 * (i & 7)));
  }
}

/* n_bytes / 68 random packed keys the daemon accepts: random payloads,
 * scale bytes in 1..254 (PROTOCOL.md, append: 0 and 255 are refused). */
static inline void fill_random_keys(void *buf, size_t n_bytes, uint64_t seed) {
  unsigned char *p = buf;
  fill_random(buf, n_bytes, seed);
  for (size_t k = 0; k + 68 <= n_bytes; k += 68)
    for (int j = 64; j < 68; j++) p[k + (size_t)j] = (unsigned char)(1 + p[k + (size_t)j] % 254);
}

/* A pool in host memory, with the snapshot module's callbacks. */
typedef struct host_pool_s {
  unsigned char *bytes;
  int64_t n_pages;
  int32_t page_size;
  int fail_at; /* > 0: the fail_at-th callback call fails (EIO) */
  int calls;
} host_pool_t;

static inline size_t pool_page_bytes(const host_pool_t *p) {
  return (size_t)p->page_size * 68;
}

static inline void host_pool_init(host_pool_t *p, int64_t n_pages, int32_t ps) {
  memset(p, 0, sizeof *p);
  p->n_pages = n_pages;
  p->page_size = ps;
  p->bytes = calloc((size_t)n_pages, (size_t)ps * 68);
  cr_assert_not_null(p->bytes);
}

static inline int host_pool_read(void *ctx, int64_t first, int64_t count,
                                 void *out) {
  host_pool_t *p = ctx;
  if (p->fail_at && ++p->calls == p->fail_at) return -16; /* FP4IDX_EIO */
  cr_assert(first >= 0 && count >= 1 && first + count <= p->n_pages);
  memcpy(out, p->bytes + (size_t)first * pool_page_bytes(p),
         (size_t)count * pool_page_bytes(p));
  return 0;
}

static inline int host_pool_write(void *ctx, int64_t first, int64_t count,
                                  const void *in) {
  host_pool_t *p = ctx;
  if (p->fail_at && ++p->calls == p->fail_at) return -16;
  cr_assert(first >= 0 && count >= 1 && first + count <= p->n_pages);
  memcpy(p->bytes + (size_t)first * pool_page_bytes(p), in,
         (size_t)count * pool_page_bytes(p));
  return 0;
}

static inline off_t file_size(const char *path) {
  struct stat st;
  cr_assert_eq(stat(path, &st), 0, "stat %s", path);
  return st.st_size;
}

/* XORs byte `off` of the file with `mask`. */
static inline void file_flip(const char *path, off_t off, unsigned char mask) {
  int fd = open(path, O_RDWR);
  cr_assert_geq(fd, 0);
  unsigned char b;
  cr_assert_eq(pread(fd, &b, 1, off), 1);
  b ^= mask;
  cr_assert_eq(pwrite(fd, &b, 1, off), 1);
  close(fd);
}

static inline void file_truncate(const char *path, off_t size) {
  cr_assert_eq(truncate(path, size), 0);
}

static inline void file_copy(const char *from, const char *to) {
  char cmd[1100];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
  cr_assert_eq(system(cmd), 0);
}

#endif
