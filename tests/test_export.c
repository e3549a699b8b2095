/* test_export.c -- one sequence in SGLang's page layout: the byte positions
 * match the page layout of fp4idx_format.h (checked against the offsets of fp4idx_format.h), pack
 * and unpack are inverse, files round-trip, corrupt files are refused. */
#include "persist_util.h"

#include "export.h"
#include "fp4idx_format.h"
#include "fp4idx_status.h"

Test(export, layout_matches_design) {
  int32_t sizes[] = {1, 2, 16, 64};
  int64_t counts[] = {0, 1, 63, 64, 65, 200};
  for (size_t a = 0; a < 4; a++) {
    for (size_t b = 0; b < 6; b++) {
      int32_t P = sizes[a];
      int64_t n = counts[b];
      int64_t bytes = fp4idx__export_pages_bytes(n, P);
      cr_assert_eq(bytes, (n + P - 1) / P * P * 68);
      unsigned char *slots = malloc((size_t)n * 68 + 1), *pages = malloc((size_t)bytes + 1);
      unsigned char *back = malloc((size_t)n * 68 + 1);
      fill_random(slots, (size_t)n * 68, (uint64_t)(P * 1000 + n));
      memset(pages, 0xAA, (size_t)bytes + 1);
      cr_assert_eq(fp4idx__export_pack(slots, n, P, pages), FP4IDX_OK);
      cr_assert_eq(pages[bytes], 0xAA, "wrote past the pages");
      for (int64_t i = 0; i < n; i++) {
        cr_assert_eq(memcmp(pages + fp4idx_payload_offset(i, P), slots + i * 68, 64), 0);
        cr_assert_eq(memcmp(pages + fp4idx_scale_offset(i, P), slots + i * 68 + 64, 4), 0);
      }
      /* Slots past n in the last page are zero. */
      for (int64_t i = n; i < (n + P - 1) / P * P; i++) {
        for (int k = 0; k < 64; k++) cr_assert_eq(pages[fp4idx_payload_offset(i, P) + k], 0);
        for (int k = 0; k < 4; k++) cr_assert_eq(pages[fp4idx_scale_offset(i, P) + k], 0);
      }
      cr_assert_eq(fp4idx__export_unpack(pages, n, P, back), FP4IDX_OK);
      cr_assert_eq(memcmp(back, slots, (size_t)n * 68), 0);
      free(slots);
      free(pages);
      free(back);
    }
  }
  cr_assert_eq(fp4idx__export_pack(NULL, 1, 64, NULL), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__export_pages_bytes(5, 48), -1);
}

Test(export, file_round_trip_and_refusals) {
  char dir[64], path[128], good[160];
  tmpdir_make(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/seq.fp4x", dir);
  snprintf(good, sizeof good, "%s/good", dir);
  int64_t n = 150;
  unsigned char *slots = malloc((size_t)n * 68);
  fill_random(slots, (size_t)n * 68, 5);
  char err[256] = "";
  cr_assert_eq(fp4idx__export_write(path, 77, slots, n, 64, 0, err, sizeof err),
               FP4IDX_OK, "%s", err);
  cr_assert_eq(file_size(path), 64 + 3 * 64 * 68);
  fp4idx_export_info_t info = {0};
  uint8_t *got = NULL;
  cr_assert_eq(fp4idx__export_read(path, 0, &info, &got, err, sizeof err), FP4IDX_OK,
               "%s", err);
  cr_assert_eq(info.seq, 77);
  cr_assert_eq(info.n_keys, n);
  cr_assert_eq(info.page_size, 64);
  cr_assert_eq(info.n_pages, 3);
  cr_assert_eq(memcmp(got, slots, (size_t)n * 68), 0);
  free(got);

  /* Flipped bytes anywhere: refused. */
  file_copy(path, good);
  off_t size = file_size(path);
  for (off_t off = 0; off < size; off += (off < 64 ? 1 : 311)) {
    file_copy(good, path);
    file_flip(path, off, 0x04);
    got = NULL;
    int rc = fp4idx__export_read(path, 0, &info, &got, err, sizeof err);
    cr_assert_eq(rc, FP4IDX_ECORRUPT, "flip at %lld: rc %d", (long long)off, rc);
    cr_assert_null(got);
  }
  /* Truncated: refused. */
  file_copy(good, path);
  file_truncate(path, size - 1);
  cr_assert_eq(fp4idx__export_read(path, 0, &info, &got, err, sizeof err),
               FP4IDX_ECORRUPT);
  cr_assert_not_null(strstr(err, "truncated"), "%s", err);

  /* Raw pages (SGLang's buffer bytes): no header, n and P from the caller. */
  cr_assert_eq(fp4idx__export_write(path, 77, slots, n, 16, FP4IDX_EXPORT_RAW, NULL, 0),
               FP4IDX_OK);
  cr_assert_eq(file_size(path), 10 * 16 * 68);
  fp4idx_export_info_t raw = {.n_keys = n, .page_size = 16};
  cr_assert_eq(fp4idx__export_read(path, FP4IDX_EXPORT_RAW, &raw, &got, NULL, 0),
               FP4IDX_OK);
  cr_assert_eq(memcmp(got, slots, (size_t)n * 68), 0);
  free(got);
  raw.n_keys = n + 100; /* needs more pages than the file has */
  cr_assert_eq(fp4idx__export_read(path, FP4IDX_EXPORT_RAW, &raw, &got, NULL, 0),
               FP4IDX_ECORRUPT);
  free(slots);
  tmpdir_rm(dir);
}
