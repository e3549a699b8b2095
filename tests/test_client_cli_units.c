/* test_client_cli_units.c -- fp4idx-cli internals without a daemon: .npy
 * parsing and writing, argument parsers, key file shape rules, --random key
 * generation, output formats, and the Prometheus text built from a stats
 * struct. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Builds a .npy (format version `ver`) with the given dict text and `data`
 * bytes of payload; returns a malloc'ed buffer and its length. */
static unsigned char *make_npy(int ver, const char *dict, size_t data,
                               size_t *len) {
  size_t pre = ver == 1 ? 10 : 12, dl = strlen(dict);
  size_t hlen = dl + 1, total = pre + hlen;
  size_t pad = (64 - total % 64) % 64;
  hlen += pad;
  *len = pre + hlen + data;
  unsigned char *b = calloc(1, *len);
  memcpy(b, "\x93NUMPY", 6);
  b[6] = (unsigned char)ver;
  b[7] = 0;
  b[8] = (unsigned char)(hlen & 0xff);
  b[9] = (unsigned char)(hlen >> 8);
  if (ver != 1) b[10] = b[11] = 0;
  memcpy(b + pre, dict, dl);
  memset(b + pre + dl, ' ', pad);
  b[pre + hlen - 1] = '\n';
  for (size_t i = 0; i < data; i++) b[pre + hlen + i] = (unsigned char)i;
  return b;
}

Test(npy, parses_v1_and_v2_headers) {
  fp4idx_cli_err_t e = {0};
  fp4idx_npy_t h;
  size_t len;
  unsigned char *b = make_npy(
      1, "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 128), }",
      3 * 128 * 2, &len);
  cr_assert(fp4idx__npy_is(b, len));
  cr_assert_eq(fp4idx__npy_parse(b, len, &h, &e), 0, "%s", e.msg);
  cr_assert_eq(h.kind, 'u');
  cr_assert_eq(h.itemsize, 2);
  cr_assert_eq(h.ndim, 2);
  cr_assert_eq(h.shape[0], 3);
  cr_assert_eq(h.shape[1], 128);
  cr_assert_eq(h.count, 384);
  cr_assert_eq(h.data_offset % 64, 0);
  free(b);

  b = make_npy(2, "{\"shape\": (7,), \"fortran_order\": False, \"descr\": \"<f4\"}",
               28, &len);
  cr_assert_eq(fp4idx__npy_parse(b, len, &h, &e), 0, "%s", e.msg);
  cr_assert_eq(h.kind, 'f');
  cr_assert_eq(h.ndim, 1);
  cr_assert_eq(h.shape[0], 7);
  cr_assert_eq(h.data_offset % 64, 0);
  cr_assert_eq(h.data_offset + 28, len);
  free(b);

  /* 0-d array: shape () holds one element. */
  b = make_npy(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (), }", 1,
               &len);
  cr_assert_eq(fp4idx__npy_parse(b, len, &h, &e), 0, "%s", e.msg);
  cr_assert_eq(h.ndim, 0);
  cr_assert_eq(h.count, 1);
  free(b);
}

Test(npy, rejects_bad_headers) {
  static const char *dicts[] = {
      "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 128), }",
      "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 128), }",
      "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
      "{'descr': '<f4', 'shape': (2, 128), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 128), 'x': 1}",
      "not a dict",
  };
  for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
    fp4idx_cli_err_t e = {0};
    fp4idx_npy_t h;
    size_t len;
    unsigned char *b = make_npy(1, dicts[i], 2 * 128 * 4, &len);
    cr_expect_eq(fp4idx__npy_parse(b, len, &h, &e), FP4IDX_EINVAL,
                 "accepted %s", dicts[i]);
    cr_expect_neq(e.msg[0], '\0');
    free(b);
  }
  /* Data size disagreeing with the shape, both ways. */
  for (int d = -1; d <= 1; d += 2) {
    fp4idx_cli_err_t e = {0};
    fp4idx_npy_t h;
    size_t len;
    unsigned char *b = make_npy(
        1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 128), }",
        (size_t)(2 * 128 * 4 + d), &len);
    cr_expect_eq(fp4idx__npy_parse(b, len, &h, &e), FP4IDX_EINVAL);
    cr_expect(strstr(e.msg, "data bytes") != NULL, "%s", e.msg);
    free(b);
  }
  /* Truncated header and a bad version. */
  fp4idx_cli_err_t e = {0};
  fp4idx_npy_t h;
  size_t len;
  unsigned char *b = make_npy(
      1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128), }", 0,
      &len);
  cr_expect_eq(fp4idx__npy_parse(b, 40, &h, &e), FP4IDX_EINVAL);
  b[6] = 9;
  cr_expect_eq(fp4idx__npy_parse(b, len, &h, &e), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx__npy_parse(b, 5, &h, &e), FP4IDX_EINVAL);
  free(b);
}

Test(npy, write_header_round_trips) {
  uint64_t shapes[3][2] = {{5, 68}, {1, 128}, {100000, 128}};
  const char *descr[3] = {"|u1", "<f4", "<u2"};
  int isz[3] = {1, 4, 2};
  for (int i = 0; i < 3; i++) {
    char *mem = NULL;
    size_t mlen = 0;
    FILE *f = open_memstream(&mem, &mlen);
    cr_assert_eq(fp4idx__npy_write_header(f, descr[i], 2, shapes[i]), 0);
    size_t data = (size_t)(shapes[i][0] * shapes[i][1]) * (size_t)isz[i];
    for (size_t k = 0; k < data; k++) fputc((int)(k & 0xff), f);
    fclose(f);
    cr_assert_eq((mlen - data) % 64, 0, "header not 64-aligned");
    fp4idx_npy_t h;
    fp4idx_cli_err_t e = {0};
    cr_assert_eq(fp4idx__npy_parse(mem, mlen, &h, &e), 0, "%s", e.msg);
    cr_expect_eq(h.ndim, 2);
    cr_expect_eq(h.shape[0], shapes[i][0]);
    cr_expect_eq(h.shape[1], shapes[i][1]);
    cr_expect_eq(h.itemsize, isz[i]);
    cr_expect_eq(h.kind, descr[i][1]);
    free(mem);
  }
  /* 1-d arrays get numpy's "(n,)". */
  char *mem = NULL;
  size_t mlen = 0;
  FILE *f = open_memstream(&mem, &mlen);
  uint64_t n = 4;
  fp4idx__npy_write_header(f, "<i4", 1, &n);
  fclose(f);
  cr_expect(strstr(mem + 10, "'shape': (4,)") != NULL, "%s", mem + 10);
  free(mem);
}

Test(keys, npy_dtype_and_shape_rules) {
  struct {
    const char *dict;
    size_t data;
    int want_dtype; /* 0: expect an error */
    size_t want_n;
  } cases[] = {
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (3, 128), }", 768, FP4IDX_KEYS_BF16, 3},
      {"{'descr': '<i2', 'fortran_order': False, 'shape': (2, 128), }", 512, FP4IDX_KEYS_BF16, 2},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 128), }", 1024, FP4IDX_KEYS_F32, 2},
      {"{'descr': '|u1', 'fortran_order': False, 'shape': (4, 68), }", 272, FP4IDX_KEYS_FP4, 4},
      {"{'descr': '<f2', 'fortran_order': False, 'shape': (2, 128), }", 512, 0, 0},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 128), }", 2048, 0, 0},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (2, 64), }", 256, 0, 0},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (256,), }", 512, 0, 0},
      {"{'descr': '|u1', 'fortran_order': False, 'shape': (2, 128), }", 256, 0, 0},
      {"{'descr': '<u2', 'fortran_order': False, 'shape': (0, 128), }", 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t len;
    unsigned char *b = make_npy(1, cases[i].dict, cases[i].data, &len);
    fp4idx_array_t a;
    fp4idx_cli_err_t e = {0};
    cr_assert_eq(fp4idx__array_from_buffer(b, len, &a, &e), 0, "%s", e.msg);
    cr_assert(a.is_npy);
    int dt = 0;
    const void *k = NULL;
    size_t n = 0;
    int rc = fp4idx__keys_from_array(&a, &dt, &k, &n, &e);
    if (cases[i].want_dtype) {
      cr_expect_eq(rc, 0, "case %zu: %s", i, e.msg);
      cr_expect_eq(dt, cases[i].want_dtype, "case %zu", i);
      cr_expect_eq(n, cases[i].want_n, "case %zu", i);
      cr_expect_eq(k, b + len - cases[i].data, "case %zu", i);
    } else {
      cr_expect_neq(rc, 0, "case %zu accepted", i);
      cr_expect_neq(e.msg[0], '\0');
    }
    free(b);
  }
}

Test(keys, npy_conflicting_dtype_option) {
  size_t len;
  unsigned char *b = make_npy(
      1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 128), }", 512,
      &len);
  fp4idx_array_t a;
  fp4idx_cli_err_t e = {0};
  fp4idx__array_from_buffer(b, len, &a, &e);
  int dt = FP4IDX_KEYS_BF16;
  const void *k;
  size_t n;
  cr_expect_eq(fp4idx__keys_from_array(&a, &dt, &k, &n, &e), FP4IDX_EINVAL);
  cr_expect(strstr(e.msg, "--dtype bf16") != NULL, "%s", e.msg);
  dt = FP4IDX_KEYS_F32;
  cr_expect_eq(fp4idx__keys_from_array(&a, &dt, &k, &n, &e), 0);
  free(b);
}

Test(keys, raw_sizes) {
  unsigned char buf[68 * 3 * 4] = {0};
  fp4idx_array_t a;
  fp4idx_cli_err_t e = {0};
  const void *k;
  size_t n;
  int dt;

  cr_assert_eq(fp4idx__array_from_buffer(buf, 256 * 3, &a, &e), 0);
  cr_expect(!a.is_npy);
  dt = 0; /* raw defaults to bf16 */
  cr_expect_eq(fp4idx__keys_from_array(&a, &dt, &k, &n, &e), 0);
  cr_expect_eq(dt, FP4IDX_KEYS_BF16);
  cr_expect_eq(n, 3);
  dt = FP4IDX_KEYS_F32; /* 768 bytes is 1.5 f32 keys */
  cr_expect_eq(fp4idx__keys_from_array(&a, &dt, &k, &n, &e), FP4IDX_ESHAPE);
  cr_expect(strstr(e.msg, "whole number") != NULL, "%s", e.msg);

  fp4idx__array_from_buffer(buf, 68 * 5, &a, &e);
  dt = FP4IDX_KEYS_FP4;
  cr_expect_eq(fp4idx__keys_from_array(&a, &dt, &k, &n, &e), 0);
  cr_expect_eq(n, 5);
  fp4idx__array_from_buffer(buf, 0, &a, &e);
  dt = FP4IDX_KEYS_FP4;
  cr_expect_eq(fp4idx__keys_from_array(&a, &dt, &k, &n, &e), FP4IDX_ESHAPE);
}

Test(keys, score_rows_for_q_and_w) {
  static unsigned char buf[2 * 4 * 32 * 128];
  fp4idx_array_t a;
  fp4idx_cli_err_t e = {0};
  uint32_t rows = 0;
  int el = 0;
  fp4idx__array_from_buffer(buf, sizeof buf, &a, &e);
  cr_expect_eq(fp4idx__score_rows(&a, 32, 128, 2, "--q", &rows, &el, &e), 0);
  cr_expect_eq(rows, 4);
  cr_expect_eq(el, 2);
  cr_expect_eq(fp4idx__score_rows(&a, 64, 128, 2, "--q", &rows, &el, &e), 0);
  cr_expect_eq(rows, 2);
  /* The same bytes as raw f32: half the values. */
  cr_expect_eq(fp4idx__score_rows(&a, 32, 128, 4, "--q", &rows, &el, &e), 0);
  cr_expect_eq(rows, 2);
  cr_expect_eq(el, 4);
  cr_expect_eq(fp4idx__score_rows(&a, 3, 128, 2, "--q", &rows, &el, &e), FP4IDX_ESHAPE);
  cr_expect(strstr(e.msg, "--q") != NULL, "%s", e.msg);
  fp4idx__array_from_buffer(buf, 3, &a, &e);
  cr_expect_eq(fp4idx__score_rows(&a, 1, 1, 2, "--w", &rows, &el, &e), FP4IDX_ESHAPE);

  size_t len;
  unsigned char *b = make_npy(
      1, "{'descr': '<u2', 'fortran_order': False, 'shape': (4, 32), }", 256,
      &len);
  fp4idx__array_from_buffer(b, len, &a, &e);
  cr_expect_eq(fp4idx__score_rows(&a, 32, 1, 4, "--w", &rows, &el, &e), 0);
  cr_expect_eq(rows, 4);
  cr_expect_eq(el, 2, "a .npy file's dtype wins over --dtype");
  cr_expect_eq(fp4idx__score_rows(&a, 64, 1, 2, "--w", &rows, &el, &e), FP4IDX_ESHAPE);
  cr_expect(strstr(e.msg, "--w has 32 heads") && strstr(e.msg, "--heads is 64"), "%s", e.msg);
  free(b);
}

Test(keys, score_rows_name_the_head_mismatch) {
  /* q [4,32,128] against --heads 16: the message names both counts. */
  size_t len;
  fp4idx_array_t a;
  fp4idx_cli_err_t e = {0};
  uint32_t rows;
  int el;
  unsigned char *b = make_npy(
      1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 32, 128), }",
      4 * 4 * 32 * 128, &len);
  fp4idx__array_from_buffer(b, len, &a, &e);
  cr_assert_eq(fp4idx__score_rows(&a, 16, 128, 2, "--q", &rows, &el, &e), FP4IDX_ESHAPE);
  cr_expect_str_eq(e.msg, "--q has 32 heads (.npy shape [4,32,128]) but --heads is 16");
  cr_assert_eq(fp4idx__score_rows(&a, 32, 128, 2, "--q", &rows, &el, &e), 0);
  cr_expect_eq(rows, 4);
  cr_expect_eq(el, 4);
  free(b);
  b = make_npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 128), }",
               8 * 128, &len);
  fp4idx__array_from_buffer(b, len, &a, &e);
  cr_expect_eq(fp4idx__score_rows(&a, 1, 128, 2, "--q", &rows, &el, &e), FP4IDX_EINVAL);
  free(b);
}

Test(keys, f32_to_bf16_rounds_to_nearest_even) {
  /* 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1.0) wins; 1 + 3*2^-8
   * ties to 1 + 2^-6; just above a tie rounds up; NaN stays NaN. */
  float in[6] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f,
                 -2.5f, NAN};
  unsigned char raw[sizeof in + 1];
  memcpy(raw + 1, in, sizeof in); /* unaligned, as in a file buffer */
  uint16_t *h = fp4idx__to_bf16(raw + 1, 6, 4);
  cr_assert(h);
  cr_expect_eq(h[0], 0x3f80);
  cr_expect_eq(h[1], 0x3f80);
  cr_expect_eq(h[2], 0x3f82);
  cr_expect_eq(h[3], 0x3f81);
  cr_expect_eq(h[4], 0xc020);
  cr_expect((h[5] & 0x7f80) == 0x7f80 && (h[5] & 0x7f) != 0);
  free(h);
  uint16_t b16[2] = {0x1234, 0xabcd};
  h = fp4idx__to_bf16((const unsigned char *)b16, 2, 2);
  cr_expect(h[0] == 0x1234 && h[1] == 0xabcd);
  free(h);
}

Test(args, parse_u64) {
  uint64_t v;
  cr_expect_eq(fp4idx__parse_u64("0", &v), 0);
  cr_expect_eq(v, 0);
  cr_expect_eq(fp4idx__parse_u64("18446744073709551615", &v), 0);
  cr_expect_eq(v, UINT64_MAX);
  cr_expect_eq(fp4idx__parse_u64("18446744073709551616", &v), -1);
  cr_expect_eq(fp4idx__parse_u64("-1", &v), -1);
  cr_expect_eq(fp4idx__parse_u64("12x", &v), -1);
  cr_expect_eq(fp4idx__parse_u64("", &v), -1);
  cr_expect_eq(fp4idx__parse_u64(" 1", &v), -1);
  cr_expect_eq(fp4idx__parse_u64(NULL, &v), -1);
}

Test(args, parse_lens) {
  int32_t *l;
  size_t n;
  cr_assert_eq(fp4idx__parse_lens("1000,683,366,65", &l, &n), 0);
  cr_expect_eq(n, 4);
  cr_expect_eq(l[0], 1000);
  cr_expect_eq(l[3], 65);
  free(l);
  cr_assert_eq(fp4idx__parse_lens("0", &l, &n), 0);
  cr_expect_eq(n, 1);
  cr_expect_eq(l[0], 0);
  free(l);
  cr_assert_eq(fp4idx__parse_lens("2147483647", &l, &n), 0);
  free(l);
  const char *bad[] = {"", ",", "1,", ",1", "1,,2", "1,-2", "2147483648",
                       "1;2", "a"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_expect_eq(fp4idx__parse_lens(bad[i], &l, &n), -1, "accepted '%s'",
                 bad[i]);
    cr_expect_null(l);
  }
}

Test(args, enums) {
  cr_expect_eq(fp4idx__parse_dtype("bf16"), FP4IDX_KEYS_BF16);
  cr_expect_eq(fp4idx__parse_dtype("f32"), FP4IDX_KEYS_F32);
  cr_expect_eq(fp4idx__parse_dtype("fp4"), FP4IDX_KEYS_FP4);
  cr_expect_eq(fp4idx__parse_dtype("BF16"), -1);
  cr_expect_eq(fp4idx__parse_dtype("f16"), -1);
  cr_expect_eq(fp4idx__parse_rounding("rne"), FP4IDX_ROUNDING_RNE);
  cr_expect_eq(fp4idx__parse_rounding("threshold"), FP4IDX_ROUNDING_THRESHOLD);
  cr_expect_eq(fp4idx__parse_rounding("nearest"), -1);
  cr_expect_eq(fp4idx__parse_format("text"), FP4IDX_FORMAT_TEXT);
  cr_expect_eq(fp4idx__parse_format("json"), FP4IDX_FORMAT_JSON);
  cr_expect_eq(fp4idx__parse_format("raw"), FP4IDX_FORMAT_RAW);
  cr_expect_eq(fp4idx__parse_format("csv"), -1);
}

Test(keygen, deterministic_and_chunk_independent) {
  enum { N = 40 };
  static uint16_t all[N * 128], part[N * 128];
  fp4idx__gen_keys(FP4IDX_KEYS_BF16, 7, 0, N, all);
  fp4idx__gen_keys(FP4IDX_KEYS_BF16, 7, 0, 13, part);
  fp4idx__gen_keys(FP4IDX_KEYS_BF16, 7, 13, N - 13, part + 13 * 128);
  cr_expect_eq(memcmp(all, part, sizeof all), 0, "chunks differ from one run");
  fp4idx__gen_keys(FP4IDX_KEYS_BF16, 8, 0, N, part);
  cr_expect_neq(memcmp(all, part, sizeof all), 0, "seed ignored");
  /* Roughly normal(0,1): finite bf16, mean near 0, variance near 1. */
  double s = 0, s2 = 0;
  for (int i = 0; i < N * 128; i++) {
    uint32_t u = (uint32_t)all[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    cr_assert(isfinite(f));
    s += f;
    s2 += (double)f * f;
  }
  double mean = s / (N * 128), var = s2 / (N * 128) - mean * mean;
  cr_expect(fabs(mean) < 0.1, "mean %g", mean);
  cr_expect(var > 0.8 && var < 1.2, "variance %g", var);

  static uint8_t slots[N * 68];
  fp4idx__gen_keys(FP4IDX_KEYS_FP4, 1, 0, N, slots);
  for (int k = 0; k < N; k++)
    for (int j = 0; j < 4; j++) {
      uint8_t sc = slots[k * 68 + 64 + j];
      cr_expect(sc >= 120 && sc <= 134, "scale byte %u", sc);
    }
}

/* ---- output formats ------------------------------------------------------- */

static char *render(fp4idx_format_t fmt, const fp4idx_client_result_t *r,
                    int topk, size_t *len) {
  char *mem = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&mem, &n);
  cr_assert_eq(fp4idx__write_result(f, fmt, r, topk), 0);
  fclose(f);
  if (len) *len = n;
  return mem;
}

Test(output, full_logits_text_json_raw) {
  float l[2 * 3] = {1.5f, -INFINITY, 0.1f, -INFINITY, -INFINITY, -INFINITY};
  fp4idx_client_result_t r = {.seq = 9, .rows = 2, .width = 3, .logits = l};
  char *t = render(FP4IDX_FORMAT_TEXT, &r, 0, NULL);
  cr_expect_str_eq(t, "row 0: 2 of 3 visible, max 1.5 at 0 | 1.5 -inf 0.100000001\n"
                      "row 1: 0 of 3 visible | -inf -inf -inf\n");
  free(t);
  char *j = render(FP4IDX_FORMAT_JSON, &r, 0, NULL);
  cr_expect_str_eq(j, "{\"seq\":9,\"rows\":2,\"width\":3,\"logits\":"
                      "[[1.5,null,0.100000001],[null,null,null]]}\n");
  free(j);
  size_t n;
  char *raw = render(FP4IDX_FORMAT_RAW, &r, 0, &n);
  cr_expect_eq(n, sizeof l);
  cr_expect_eq(memcmp(raw, l, sizeof l), 0);
  free(raw);
}

Test(output, topk_text_json_raw) {
  float l[2 * 2] = {3.0f, 2.0f, 7.25f, -INFINITY};
  int32_t p[2 * 2] = {10, 4, 0, -1}, cnt[2] = {2, 1};
  fp4idx_client_result_t r = {.seq = 1, .rows = 2, .width = 2, .logits = l,
                              .positions = p, .counts = cnt};
  char *t = render(FP4IDX_FORMAT_TEXT, &r, 1, NULL);
  cr_expect_str_eq(t, "row 0: 10:3 4:2\nrow 1: 0:7.25\n");
  free(t);
  char *j = render(FP4IDX_FORMAT_JSON, &r, 1, NULL);
  cr_expect_str_eq(j, "{\"seq\":1,\"rows\":2,\"k\":2,\"results\":["
                      "{\"count\":2,\"positions\":[10,4],\"logits\":[3,2]},"
                      "{\"count\":1,\"positions\":[0],\"logits\":[7.25]}]}\n");
  free(j);
  size_t n;
  char *raw = render(FP4IDX_FORMAT_RAW, &r, 1, &n);
  cr_assert_eq(n, sizeof p + sizeof l);
  cr_expect_eq(memcmp(raw, p, sizeof p), 0);
  cr_expect_eq(memcmp(raw + sizeof p, l, sizeof l), 0);
  free(raw);
}

Test(output, f32_text_round_trips) {
  float vals[] = {0.1f, 1e-38f, 3.4028235e38f, -2.5f, 1.0f / 3.0f, 1e-45f};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    char b[32];
    float back = strtof(fp4idx__fmt_f32(b, vals[i]), NULL);
    cr_expect_eq(memcmp(&back, &vals[i], 4), 0, "%s", b);
  }
  char b[32];
  cr_expect_str_eq(fp4idx__fmt_f32(b, -INFINITY), "-inf");
  cr_expect_str_eq(fp4idx__fmt_f32(b, NAN), "nan");
}

/* ---- Prometheus ----------------------------------------------------------- */

/* Value of the exposition line starting with `series` (exact text up to the
 * space); -1 when absent. */
static double series_value(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  }
  return -1;
}

Test(prometheus, counters_cumulative_histogram_and_gauges) {
  double bounds[4] = {1, 2, 4, INFINITY};
  uint64_t hist_a[4] = {3, 0, 5, 2}, hist_b[4] = {0, 0, 0, 0};
  fp4idx_client_op_stats_t ops[2] = {
      {.op = "append", .count = 10, .errors = 1, .latency_sum_us = 25.0,
       .nbuckets = 4, .bounds_us = bounds, .hist = hist_a},
      {.op = "score", .count = 0, .errors = 0, .latency_sum_us = 0,
       .nbuckets = 4, .bounds_us = bounds, .hist = hist_b}};
  fp4idx_client_stats_t s = {.uptime_s = 12.5, .connections = 3,
                             .sequences = 2, .keys = 1000, .pages_total = 100,
                             .pages_free = 80, .backend = "cpu",
                             .device = "Xeon \"8\" \\ x", .nops = 2, .ops = ops};
  fp4idx_client_info_t in = {.version = 1, .server = "fp4idxd 0.1.0",
                             .page_size = 64};
  char *mem = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&mem, &n);
  cr_assert_eq(fp4idx__prom_write(f, &s, &in), 0);
  fclose(f);

  cr_expect_eq(series_value(mem, "fp4idx_requests_total{op=\"append\"}"), 10);
  cr_expect_eq(series_value(mem, "fp4idx_request_errors_total{op=\"append\"}"), 1);
  cr_expect_eq(series_value(mem, "fp4idx_requests_total{op=\"score\"}"), 0);
  /* Cumulative buckets in seconds, +Inf == _count. */
  cr_expect_eq(series_value(mem, "fp4idx_request_latency_seconds_bucket{op=\"append\",le=\"1e-06\"}"), 3);
  cr_expect_eq(series_value(mem, "fp4idx_request_latency_seconds_bucket{op=\"append\",le=\"2e-06\"}"), 3);
  cr_expect_eq(series_value(mem, "fp4idx_request_latency_seconds_bucket{op=\"append\",le=\"4e-06\"}"), 8);
  cr_expect_eq(series_value(mem, "fp4idx_request_latency_seconds_bucket{op=\"append\",le=\"+Inf\"}"), 10);
  cr_expect_eq(series_value(mem, "fp4idx_request_latency_seconds_count{op=\"append\"}"), 10);
  cr_expect_float_eq(series_value(mem, "fp4idx_request_latency_seconds_sum{op=\"append\"}"), 25e-6, 1e-15);
  cr_expect_eq(series_value(mem, "fp4idx_request_latency_seconds_bucket{op=\"score\",le=\"+Inf\"}"), 0);
  cr_expect_eq(series_value(mem, "fp4idx_pool_pages"), 100);
  cr_expect_eq(series_value(mem, "fp4idx_pool_pages_free"), 80);
  cr_expect_eq(series_value(mem, "fp4idx_sequences"), 2);
  cr_expect_eq(series_value(mem, "fp4idx_keys"), 1000);
  cr_expect_eq(series_value(mem, "fp4idx_connections"), 3);
  cr_expect_eq(series_value(mem, "fp4idx_uptime_seconds"), 12.5);
  /* Label values escaped. */
  cr_expect(strstr(mem, "device=\"Xeon \\\"8\\\" \\\\ x\"") != NULL, "%s", mem);
  cr_expect(strstr(mem, "server=\"fp4idxd 0.1.0\"") != NULL);
  /* Each metric family typed exactly once, before its samples. */
  const char *types[] = {"# TYPE fp4idx_requests_total counter",
                         "# TYPE fp4idx_request_errors_total counter",
                         "# TYPE fp4idx_request_latency_seconds histogram",
                         "# TYPE fp4idx_pool_pages gauge",
                         "# TYPE fp4idx_info gauge"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    const char *a = strstr(mem, types[i]);
    cr_expect(a != NULL, "missing %s", types[i]);
    if (a) cr_expect_null(strstr(a + 1, types[i]), "twice: %s", types[i]);
  }
  /* Every non-comment line is "name{labels} value" with a parseable value. */
  for (char *line = strtok(mem, "\n"); line; line = strtok(NULL, "\n")) {
    if (line[0] == '#') continue;
    char *sp = strrchr(line, ' ');
    cr_assert(sp != NULL, "%s", line);
    char *end;
    strtod(sp + 1, &end);
    cr_expect_eq(*end, '\0', "bad value in %s", line);
    cr_expect(strncmp(line, "fp4idx_", 7) == 0, "%s", line);
  }
  free(mem);
}

Test(prometheus, histogram_without_inf_bound_gets_one) {
  double bounds[2] = {1, 2};
  uint64_t hist[2] = {1, 1};
  fp4idx_client_op_stats_t op = {.op = "read", .count = 4, .nbuckets = 2,
                                 .bounds_us = bounds, .hist = hist};
  fp4idx_client_stats_t s = {.backend = "cpu", .nops = 1, .ops = &op};
  char *mem = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&mem, &n);
  cr_assert_eq(fp4idx__prom_write(f, &s, NULL), 0);
  fclose(f);
  cr_expect_eq(series_value(mem, "fp4idx_request_latency_seconds_bucket{op=\"read\",le=\"+Inf\"}"), 4);
  cr_expect_eq(series_value(mem, "fp4idx_request_latency_seconds_count{op=\"read\"}"), 4);
  free(mem);
}

Test(progress, line_fits_every_width_and_shows_rate_and_eta) {
  char buf[512];
  for (int cols = 1; cols <= 300; cols++) {
    size_t n = fp4idx__progress_line(buf, sizeof buf, cols, 420000, 1000000, 2.0);
    cr_assert_eq(n, strlen(buf));
    cr_assert_leq(n, cols > 1 ? (size_t)cols - 1 : 0, "cols %d: %s", cols, buf);
    if (cols >= 40) {
      cr_expect(strchr(buf, '[') && strchr(buf, ']'), "cols %d: no bar: %s", cols, buf);
      /* 210k keys/s, 580000 left: 2.76 s -> ETA 0:03. */
      cr_expect(strstr(buf, " 42% ") && strstr(buf, "210.0k") && strstr(buf, "ETA 0:03"),
                "cols %d: %s", cols, buf);
    }
    if (cols >= 80)
      cr_expect(strncmp(buf, "append [", 8) == 0 && strstr(buf, "420.0k/1.0M keys"),
                "cols %d: %s", cols, buf);
  }
  /* The bar's fill follows the fraction: 42% of the bar is '#'. */
  fp4idx__progress_line(buf, sizeof buf, 120, 420000, 1000000, 2.0);
  const char *o = strchr(buf, '['), *c = strchr(buf, ']');
  size_t w = (size_t)(c - o - 1), hash = 0;
  for (const char *p = o + 1; p < c; p++) hash += *p == '#';
  cr_expect_eq(hash, w * 42 / 100, "%zu of %zu: %s", hash, w, buf);
  fp4idx__progress_line(buf, sizeof buf, 120, 10, 10, 1.5);
  cr_expect(strstr(buf, "100%") && strstr(buf, "in 1.5s"), "%s", buf);
  fp4idx__progress_line(buf, sizeof buf, 120, 0, 10, 0.0);
  cr_expect(strstr(buf, "ETA --:--"), "%s", buf);
  fp4idx__progress_line(buf, sizeof buf, 120, 1000, 10000000, 1.0);
  cr_expect(strstr(buf, "ETA 2:46:39"), "%s", buf);
  fp4idx__progress_line(buf, sizeof buf, 120, 1, 100000000, 1.0); /* capped */
  cr_expect(strstr(buf, "ETA 99:59:59"), "%s", buf);
}

Test(progress, terminal_width_from_columns_when_not_a_tty) {
  int fd = open("/dev/null", O_WRONLY);
  setenv("COLUMNS", "57", 1);
  cr_expect_eq(fp4idx__term_cols(fd), 57);
  setenv("COLUMNS", "wide", 1);
  cr_expect_eq(fp4idx__term_cols(fd), 80);
  unsetenv("COLUMNS");
  cr_expect_eq(fp4idx__term_cols(fd), 80);
  close(fd);
}

Test(json, info_and_stats_escape_strings) {
  fp4idx_client_info_t in = {0};
  snprintf(in.server, sizeof in.server, "fp4idxd \"x\"\\");
  snprintf(in.backend, sizeof in.backend, "cpu");
  snprintf(in.device, sizeof in.device, "a\tb");
  in.page_size = 64;
  fp4idx_client_sharing_t sh = {.mode = "time_slice", .other_processes = 2};
  char *mem = NULL;
  size_t mlen = 0;
  FILE *f = open_memstream(&mem, &mlen);
  cr_assert_eq(fp4idx__write_info_json(f, &in, &sh, 3), 0);
  fclose(f);
  cr_expect(strstr(mem, "\"server\":\"fp4idxd \\\"x\\\"\\\\\"") != NULL, "%s", mem);
  cr_expect(strstr(mem, "\"device\":\"a\\u0009b\"") != NULL, "%s", mem);
  cr_expect(strstr(mem, "\"page_size\":64,") != NULL, "%s", mem);
  cr_expect(strstr(mem, "\"gpu_sharing\":\"time_slice\",\"gpu_other_processes\":2,"
                       "\"channels\":3}") != NULL,
            "%s", mem);
  free(mem);
}
