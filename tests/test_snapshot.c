/* test_snapshot.c -- snapshot files: round trip into pools of other sizes,
 * atomic replace, and refusal of every corrupt or truncated file (never a
 * half-load). Also CRC-32C (the checksum everything here relies on). */
#include "persist_util.h"

#include "crc32c.h"
#include "fp4idx_status.h"
#include "snapshot.h"

#define PS 16
#define POOL 300

/* ---- CRC-32C -------------------------------------------------------------- */

Test(crc32c, check_value) {
  /* The standard check value of CRC-32C (Castagnoli). */
  cr_assert_eq(fp4idx__crc32c(0, "123456789", 9), 0xE3069283u);
  cr_assert_eq(fp4idx__crc32c_sw(0, "123456789", 9), 0xE3069283u);
  cr_assert_eq(fp4idx__crc32c(0, NULL, 0), 0u);
}

Test(crc32c, hardware_equals_table_and_chains) {
  size_t n = 200000;
  unsigned char *buf = malloc(n + 8);
  fill_random(buf, n + 8, 7);
  /* Lengths around the interleaving block sizes (3 x 256, 3 x 8192) and odd
   * alignments exercise every path of the hardware version. */
  size_t lens[] = {0, 1, 7, 8, 9, 255, 767, 768, 769, 24575, 24576, 24577,
                   100003, 200000};
  for (size_t a = 0; a < 8; a++) {
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
      size_t len = lens[i];
      uint32_t hw = fp4idx__crc32c(0, buf + a, len);
      uint32_t sw = fp4idx__crc32c_sw(0, buf + a, len);
      cr_assert_eq(hw, sw, "align %zu len %zu: %08x vs %08x", a, len, hw, sw);
      size_t cut = len / 3;
      uint32_t chained = fp4idx__crc32c(fp4idx__crc32c(0, buf + a, cut), buf + a + cut,
                                       len - cut);
      cr_assert_eq(chained, hw);
    }
  }
  free(buf);
}

/* ---- a scenario: sequences on shuffled pages of a host pool ---------------- */

typedef struct scenario_s {
  host_pool_t pool;
  fp4idx_snap_seq_t seqs[6];
  int32_t pages[POOL];
  int64_t n_seqs;
  char dir[64], path[128];
} scenario_t;

static void scenario_init(scenario_t *s) {
  memset(s, 0, sizeof *s);
  host_pool_init(&s->pool, POOL, PS);
  fill_random(s->pool.bytes, (size_t)POOL * PS * 68, 42);
  for (int i = 0; i < POOL; i++) s->pages[i] = i;
  uint64_t r = 99;
  for (int i = POOL - 1; i > 0; i--) {
    int j = (int)(rng_next(&r) % (uint64_t)(i + 1));
    int32_t t = s->pages[i];
    s->pages[i] = s->pages[j];
    s->pages[j] = t;
  }
  int64_t keys[6] = {0, 1, 15, 16, 17, 500};
  int used = 0;
  for (int i = 0; i < 6; i++) {
    s->seqs[i].id = 1000 + (uint64_t)i * 7919 + ((uint64_t)i << 40);
    s->seqs[i].n_keys = keys[i];
    s->seqs[i].pages = s->pages + used;
    used += (int)((keys[i] + PS - 1) / PS);
  }
  s->n_seqs = 6;
  tmpdir_make(s->dir, sizeof s->dir);
  snprintf(s->path, sizeof s->path, "%s/snapshot.fp4s", s->dir);
}

static void scenario_fini(scenario_t *s) {
  free(s->pool.bytes);
  tmpdir_rm(s->dir);
}

static int save(scenario_t *s, uint64_t gen) {
  char err[256] = "";
  int rc = fp4idx__snapshot_save(s->path, PS, POOL, s->seqs, s->n_seqs, gen,
                                host_pool_read, &s->pool, NULL, err, sizeof err);
  return rc;
}

/* Loads into a fresh pool of n_pages; returns the status, err filled. */
static int load(scenario_t *s, int64_t n_pages, int32_t ps, host_pool_t *into,
                fp4idx_snap_seq_t **seqs, int64_t *n, char *err, size_t errlen) {
  host_pool_init(into, n_pages, ps);
  return fp4idx__snapshot_load(s->path, ps, n_pages, host_pool_write, into, seqs, n,
                              NULL, err, errlen);
}

static void expect_same(const scenario_t *s, const host_pool_t *into,
                        const fp4idx_snap_seq_t *got, int64_t n) {
  cr_assert_eq(n, s->n_seqs);
  size_t pb = (size_t)PS * 68;
  for (int64_t i = 0; i < n; i++) {
    cr_assert_eq(got[i].id, s->seqs[i].id);
    cr_assert_eq(got[i].n_keys, s->seqs[i].n_keys);
    int64_t np = (got[i].n_keys + PS - 1) / PS;
    for (int64_t p = 0; p < np; p++) {
      cr_assert(got[i].pages[p] >= 0 && got[i].pages[p] < into->n_pages);
      cr_assert_eq(memcmp(into->bytes + (size_t)got[i].pages[p] * pb,
                          s->pool.bytes + (size_t)s->seqs[i].pages[p] * pb, pb),
                   0, "seq %lld page %lld differs", (long long)i, (long long)p);
    }
  }
}

Test(snapshot, round_trip_into_smaller_pool) {
  scenario_t s;
  scenario_init(&s);
  cr_assert_eq(save(&s, 5), FP4IDX_OK);
  /* 37 pages are used: the file holds those only. */
  cr_assert_eq(file_size(s.path), 128 + (6 * 16 + 37 * 4) + 37 * PS * 68);
  cr_assert_eq(access(s.dir, F_OK), 0);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp", s.path);
  cr_assert_neq(access(tmp, F_OK), 0, "temporary file left behind");

  fp4idx_snap_info_t info;
  cr_assert_eq(fp4idx__snapshot_probe(s.path, &info, NULL, 0), FP4IDX_OK);
  cr_assert_eq(info.n_seqs, 6);
  cr_assert_eq(info.n_pages, 37);
  cr_assert_eq(info.n_keys, 0 + 1 + 15 + 16 + 17 + 500);
  cr_assert_eq(info.log_gen, 5);
  cr_assert_eq(info.page_size, PS);

  host_pool_t into;
  fp4idx_snap_seq_t *got = NULL;
  int64_t n = 0;
  char err[256] = "";
  cr_assert_eq(load(&s, 37, PS, &into, &got, &n, err, sizeof err), FP4IDX_OK, "%s",
               err);
  expect_same(&s, &into, got, n);
  free(got);
  free(into.bytes);
  scenario_fini(&s);
}

Test(snapshot, round_trip_empty_and_missing) {
  scenario_t s;
  scenario_init(&s);
  host_pool_t into;
  fp4idx_snap_seq_t *got = (void *)1;
  int64_t n = 7;
  char err[256] = "";
  cr_assert_eq(load(&s, 10, PS, &into, &got, &n, err, sizeof err),
               FP4IDX_SNAPSHOT_NONE);
  free(into.bytes);
  s.n_seqs = 0;
  cr_assert_eq(save(&s, 1), FP4IDX_OK);
  cr_assert_eq(load(&s, 1, PS, &into, &got, &n, err, sizeof err), FP4IDX_OK, "%s", err);
  cr_assert_eq(n, 0);
  free(got);
  free(into.bytes);
  scenario_fini(&s);
}

Test(snapshot, refuses_wrong_page_size_and_small_pool) {
  scenario_t s;
  scenario_init(&s);
  cr_assert_eq(save(&s, 1), FP4IDX_OK);
  host_pool_t into;
  fp4idx_snap_seq_t *got = NULL;
  int64_t n = 0;
  char err[256] = "";
  cr_assert_eq(load(&s, 100, 32, &into, &got, &n, err, sizeof err), FP4IDX_EINVAL);
  cr_assert_not_null(strstr(err, "page size"), "%s", err);
  cr_assert_null(got);
  free(into.bytes);
  cr_assert_eq(load(&s, 36, PS, &into, &got, &n, err, sizeof err), FP4IDX_EFULL);
  cr_assert_null(got);
  free(into.bytes);
  scenario_fini(&s);
}

/* Every byte of the file matters: flipping any one of them (sampled across
 * header, table and pool) makes the load fail, and nothing is returned. */
Test(snapshot, any_flipped_byte_is_refused) {
  scenario_t s;
  scenario_init(&s);
  cr_assert_eq(save(&s, 3), FP4IDX_OK);
  char good[160];
  snprintf(good, sizeof good, "%s/good", s.dir);
  file_copy(s.path, good);
  off_t size = file_size(s.path);
  int tried = 0;
  for (off_t off = 0; off < size; off += (off < 400 ? 1 : 997)) {
    file_copy(good, s.path);
    file_flip(s.path, off, (unsigned char)(1u << (off % 8)));
    host_pool_t into;
    fp4idx_snap_seq_t *got = NULL;
    int64_t n = -1;
    char err[256] = "";
    int rc = load(&s, POOL, PS, &into, &got, &n, err, sizeof err);
    cr_assert(rc == FP4IDX_ECORRUPT, "offset %lld: rc %d (%s)", (long long)off, rc,
              err);
    cr_assert_null(got);
    cr_assert_eq(n, 0);
    cr_assert_neq(err[0], 0);
    free(into.bytes);
    tried++;
  }
  cr_assert_gt(tried, 400);
  scenario_fini(&s);
}

Test(snapshot, truncated_or_extended_file_is_refused) {
  scenario_t s;
  scenario_init(&s);
  cr_assert_eq(save(&s, 3), FP4IDX_OK);
  char good[160];
  snprintf(good, sizeof good, "%s/good", s.dir);
  file_copy(s.path, good);
  off_t size = file_size(s.path);
  off_t cuts[] = {0, 1, 127, 128, 129, 300, size / 2, size - 68, size - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
    file_copy(good, s.path);
    file_truncate(s.path, cuts[i]);
    host_pool_t into;
    fp4idx_snap_seq_t *got = NULL;
    int64_t n = 0;
    char err[256] = "";
    int rc = load(&s, POOL, PS, &into, &got, &n, err, sizeof err);
    cr_assert_eq(rc, FP4IDX_ECORRUPT, "cut at %lld: rc %d", (long long)cuts[i], rc);
    cr_assert_not_null(strstr(err, "truncated"), "cut at %lld: %s",
                       (long long)cuts[i], err);
    cr_assert_null(got);
    free(into.bytes);
  }
  /* Extra bytes at the end are refused too. */
  file_copy(good, s.path);
  file_truncate(s.path, size + 1);
  host_pool_t into;
  fp4idx_snap_seq_t *got = NULL;
  int64_t n = 0;
  cr_assert_eq(load(&s, POOL, PS, &into, &got, &n, NULL, 0), FP4IDX_ECORRUPT);
  free(into.bytes);
  scenario_fini(&s);
}

/* A failing save leaves the previous snapshot in place and no temp file. */
Test(snapshot, failed_save_keeps_old_snapshot) {
  scenario_t s;
  scenario_init(&s);
  cr_assert_eq(save(&s, 1), FP4IDX_OK);
  fp4idx_snap_info_t before;
  cr_assert_eq(fp4idx__snapshot_probe(s.path, &before, NULL, 0), FP4IDX_OK);
  s.pool.fail_at = 2;
  s.seqs[5].n_keys = 400; /* a different content that must not land */
  char err[256] = "";
  int rc = fp4idx__snapshot_save(s.path, PS, POOL, s.seqs, s.n_seqs, 2,
                                host_pool_read, &s.pool, NULL, err, sizeof err);
  cr_assert_eq(rc, FP4IDX_EIO);
  cr_assert_not_null(strstr(err, "reading pages"), "%s", err);
  fp4idx_snap_info_t after;
  cr_assert_eq(fp4idx__snapshot_probe(s.path, &after, NULL, 0), FP4IDX_OK);
  cr_assert_eq(after.log_gen, 1);
  cr_assert_eq(after.n_keys, before.n_keys);
  cr_assert_eq(after.created_ns, before.created_ns);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp", s.path);
  cr_assert_neq(access(tmp, F_OK), 0);
  scenario_fini(&s);
}

/* Forks: two sequences name the same pages. Stored once, version 2, loaded
 * back shared; the same table in a version 1 file is refused. */
Test(snapshot, shared_pages_round_trip) {
  scenario_t s;
  scenario_init(&s);
  s.seqs[4].pages = s.seqs[3].pages; /* 17 keys: seq 3's page, then one more */
  cr_assert_eq(save(&s, 1), FP4IDX_OK);
  cr_assert_eq(file_size(s.path), 128 + (6 * 16 + 37 * 4) + 36 * PS * 68);
  fp4idx_snap_info_t info;
  cr_assert_eq(fp4idx__snapshot_probe(s.path, &info, NULL, 0), FP4IDX_OK);
  cr_assert_eq(info.version, 2);
  cr_assert_eq(info.n_pages, 36);
  host_pool_t into;
  fp4idx_snap_seq_t *got = NULL;
  int64_t n = 0;
  char err[256] = "";
  cr_assert_eq(load(&s, 36, PS, &into, &got, &n, err, sizeof err), FP4IDX_OK, "%s", err);
  expect_same(&s, &into, got, n);
  cr_assert_eq(got[3].pages[0], got[4].pages[0], "still one page");
  free(got);
  free(into.bytes);
  /* As version 1 (header re-sealed): a reader of version 1 saw no sharing. */
  FILE *f = fopen(s.path, "r+b");
  cr_assert_not_null(f);
  unsigned char h[128];
  cr_assert_eq(fread(h, 1, 128, f), 128u);
  h[8] = 1;
  uint32_t crc = fp4idx__crc32c(0, h, 124);
  memcpy(h + 124, &crc, 4); /* little-endian host */
  cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
  cr_assert_eq(fwrite(h, 1, 128, f), 128u);
  fclose(f);
  cr_assert_eq(load(&s, 36, PS, &into, &got, &n, err, sizeof err), FP4IDX_ECORRUPT, "%s", err);
  free(into.bytes);
  /* Without sharing the file stays version 1. */
  scenario_fini(&s);
  scenario_init(&s);
  cr_assert_eq(save(&s, 1), FP4IDX_OK);
  cr_assert_eq(fp4idx__snapshot_probe(s.path, &info, NULL, 0), FP4IDX_OK);
  cr_assert_eq(info.version, 1);
  scenario_fini(&s);
}

Test(snapshot, save_rejects_bad_tables) {
  scenario_t s;
  scenario_init(&s);
  /* A page twice in one sequence. */
  s.seqs[5].pages[1] = s.seqs[5].pages[0];
  cr_assert_eq(save(&s, 1), FP4IDX_EINVAL);
  scenario_fini(&s);
  scenario_init(&s);
  s.pages[0] = POOL; /* out of range */
  cr_assert_eq(save(&s, 1), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__snapshot_save(s.path, 3, POOL, s.seqs, 1, 1, host_pool_read,
                                    &s.pool, NULL, NULL, 0),
               FP4IDX_EINVAL); /* page size not a power of two */
  cr_assert_neq(access(s.path, F_OK), 0);
  scenario_fini(&s);
}

/* A write callback error during load is reported, nothing returned. */
Test(snapshot, load_write_error) {
  scenario_t s;
  scenario_init(&s);
  cr_assert_eq(save(&s, 1), FP4IDX_OK);
  host_pool_t into;
  host_pool_init(&into, POOL, PS);
  into.fail_at = 1;
  fp4idx_snap_seq_t *got = NULL;
  int64_t n = 0;
  char err[256] = "";
  cr_assert_eq(fp4idx__snapshot_load(s.path, PS, POOL, host_pool_write, &into, &got,
                                    &n, NULL, err, sizeof err),
               FP4IDX_EIO);
  cr_assert_null(got);
  free(into.bytes);
  scenario_fini(&s);
}

/* Several I/O buffers (32 MiB each) with every other page used: the copy
 * runs are one page long and each buffer gathers many of them; failures in a
 * later buffer still leave nothing behind. */
Test(snapshot, multi_buffer_round_trip_and_late_failure) {
  const int64_t pool = 24000; /* 24000 * 64 * 68 = 104 MB */
  host_pool_t src;
  host_pool_init(&src, pool, 64);
  fill_random(src.bytes, (size_t)pool * 64 * 68, 77);
  /* Sequence i takes pages 2i*... so that used pages alternate with holes. */
  enum { NS = 150 };
  static int32_t pages[12000];
  fp4idx_snap_seq_t seqs[NS];
  int64_t used = 0;
  for (int i = 0; i < NS; i++) {
    seqs[i].id = (uint64_t)i * 3 + 1;
    seqs[i].n_keys = 80 * 64 - (i % 64); /* 80 pages, last one partial */
    seqs[i].pages = pages + used;
    for (int k = 0; k < 80; k++) pages[used + k] = (int32_t)(2 * (used + k) + (i & 1));
    used += 80;
  }
  char dir[64], path[128];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/big.fp4s", dir);
  char err[256] = "";
  cr_assert_eq(fp4idx__snapshot_save(path, 64, pool, seqs, NS, 9, host_pool_read, &src,
                                    NULL, err, sizeof err),
               FP4IDX_OK, "%s", err);
  host_pool_t dst;
  host_pool_init(&dst, used, 64);
  fp4idx_snap_seq_t *got = NULL;
  int64_t n = 0;
  cr_assert_eq(fp4idx__snapshot_load(path, 64, used, host_pool_write, &dst, &got, &n, NULL,
                                    err, sizeof err),
               FP4IDX_OK, "%s", err);
  cr_assert_eq(n, NS);
  size_t pb = 64 * 68;
  for (int i = 0; i < NS; i++) {
    cr_assert_eq(got[i].id, seqs[i].id);
    cr_assert_eq(got[i].n_keys, seqs[i].n_keys);
    for (int k = 0; k < 80; k++)
      cr_assert_eq(memcmp(dst.bytes + (size_t)got[i].pages[k] * pb,
                          src.bytes + (size_t)seqs[i].pages[k] * pb, pb),
                   0, "seq %d page %d", i, k);
  }
  free(got);

  /* A read failure deep into the pool: EIO, the old snapshot stays. */
  off_t size = file_size(path);
  src.fail_at = 9000;
  src.calls = 0;
  cr_assert_eq(fp4idx__snapshot_save(path, 64, pool, seqs, NS, 10, host_pool_read, &src,
                                    NULL, err, sizeof err),
               FP4IDX_EIO);
  cr_assert_eq(file_size(path), size);
  fp4idx_snap_info_t info;
  cr_assert_eq(fp4idx__snapshot_probe(path, &info, NULL, 0), FP4IDX_OK);
  cr_assert_eq(info.log_gen, 9);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  cr_assert_neq(access(tmp, F_OK), 0);

  /* A write failure deep into the load: reported, nothing returned. */
  dst.fail_at = 2; /* the second of the two buffers */
  dst.calls = 0;
  got = NULL;
  cr_assert_eq(fp4idx__snapshot_load(path, 64, used, host_pool_write, &dst, &got, &n, NULL,
                                    err, sizeof err),
               FP4IDX_EIO);
  cr_assert_null(got);
  /* A flipped byte in the last buffer: refused. */
  file_flip(path, size - 5, 0x40);
  dst.fail_at = 0;
  cr_assert_eq(fp4idx__snapshot_load(path, 64, used, host_pool_write, &dst, &got, &n, NULL,
                                    err, sizeof err),
               FP4IDX_ECORRUPT);
  cr_assert_null(got);
  free(src.bytes);
  free(dst.bytes);
  tmpdir_rm(dir);
}
