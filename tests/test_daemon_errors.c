/* test_daemon_errors.c -- malformed and invalid input against the real
 * daemon: each gets a clear error, the connection stays open where the frame
 * was well formed, the daemon stays up, and nothing is half-written. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_format.h"

static fp4idx_test_daemon_t g_d;
static int g_fd = -1;

static void start_with(const char *const *extra) {
  cr_assert_eq(fp4idx_test_daemon_start(&g_d, extra), 0);
  g_fd = fp4idx_test_connect(g_d.sock);
  cr_assert_geq(g_fd, 0);
}

static void setup(void) {
  start_with((const char *[]){"--cache-bytes", "43520", NULL}); /* 10 pages of 64 */
}

static void teardown(void) {
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  cr_assert_eq(fp4idx_test_daemon_stop(&g_d), 0, "daemon exit code after the test");
}

/* ---- raw message building ------------------------------------------------ */

typedef struct raw_s {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} raw_t;

static void raw_init(raw_t *r) {
  msgpack_sbuffer_init(&r->sb);
  msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}
static void raw_str(raw_t *r, const char *s) {
  msgpack_pack_str(&r->pk, strlen(s));
  msgpack_pack_str_body(&r->pk, s, strlen(s));
}
static void raw_kv_u(raw_t *r, const char *k, uint64_t v) {
  raw_str(r, k);
  msgpack_pack_uint64(&r->pk, v);
}
static void raw_kv_s(raw_t *r, const char *k, const char *v) {
  raw_str(r, k);
  raw_str(r, v);
}
/* A tensor map under key k. */
static void raw_tensor(raw_t *r, const char *k, const char *dtype, int ndim,
                       const uint64_t *shape, const void *data, size_t nbytes) {
  if (k) raw_str(r, k);
  msgpack_pack_map(&r->pk, 3);
  raw_kv_s(r, "dtype", dtype);
  raw_str(r, "shape");
  msgpack_pack_array(&r->pk, (size_t)ndim);
  for (int i = 0; i < ndim; i++) msgpack_pack_uint64(&r->pk, shape[i]);
  raw_str(r, "data");
  msgpack_pack_bin(&r->pk, nbytes);
  msgpack_pack_bin_body(&r->pk, data, nbytes);
}
static void raw_send(raw_t *r, int fd) {
  unsigned char hdr[4];
  fp4idx_frame_header_put(hdr, (uint32_t)r->sb.size);
  cr_assert_eq(fp4idx_test_send_all(fd, hdr, 4), 0);
  cr_assert_eq(fp4idx_test_send_all(fd, r->sb.data, r->sb.size), 0);
  msgpack_sbuffer_destroy(&r->sb);
}

/* Receives one response and checks it is an error with `status` for `id`. */
static void expect_error(int fd, uint64_t id, int status) {
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_recv_response(fd, FP4IDX_OP_INFO, &resp, &body), 0,
               "no decodable response");
  cr_assert_eq(resp.id, id, "response id %llu, expected %llu", (unsigned long long)resp.id,
               (unsigned long long)id);
  cr_assert_eq(resp.status, status, "status %d (%s: %s), expected %d (%s)", resp.status,
               fp4idx_status_name(resp.status), resp.error, status, fp4idx_status_name(status));
  cr_assert_gt(strlen(resp.error), 0, "error responses carry a message");
  cr_log_info("id %llu: %s: %s", (unsigned long long)id, fp4idx_status_name(status), resp.error);
  fp4idx_response_clear(&resp);
  free(body);
}

/* The connection and the daemon still work. */
static fp4idx_info_t still_fine(int fd) {
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0, "connection unusable after an error");
  cr_assert(fp4idx_test_daemon_alive(&g_d));
  return info;
}

static uint16_t *make_keys(uint32_t n, uint32_t seed) {
  uint16_t *k = malloc((size_t)n * 128 * 2);
  for (size_t i = 0; i < (size_t)n * 128; i++)
    k[i] = fp4idx_f32_to_bf16((float)((int)((i * 2654435761u + seed) % 17) - 8) / 4.0f);
  return k;
}

/* ---- framing ------------------------------------------------------------- */

Test(daemon_errors, truncated_frame_then_close, .init = setup, .fini = teardown) {
  int fd = fp4idx_test_connect(g_d.sock);
  unsigned char buf[14] = {0, 0, 0, 100, 0x82, 0xa2, 'i', 'd'};
  cr_assert_eq(fp4idx_test_send_all(fd, buf, sizeof buf), 0);
  close(fd);
  /* Also a header cut in half. */
  fd = fp4idx_test_connect(g_d.sock);
  cr_assert_eq(fp4idx_test_send_all(fd, buf, 2), 0);
  close(fd);
  still_fine(g_fd);
}

Test(daemon_errors, oversized_length_gets_e2big_then_close, .init = setup, .fini = teardown) {
  int fd = fp4idx_test_connect(g_d.sock);
  unsigned char hdr[4];
  fp4idx_frame_header_put(hdr, 0x7fffffffu);
  cr_assert_eq(fp4idx_test_send_all(fd, hdr, 4), 0);
  expect_error(fd, 0, FP4IDX_E2BIG);
  cr_assert_eq(fp4idx_test_peer_closed(fd, 5000), 1, "connection closed after E2BIG");
  close(fd);
  still_fine(g_fd);
}

/* Requests not yet run and a refused header in one write: the requests are
 * answered in order, then the E2BIG reply, then the close; the closing reply
 * never goes to the worker (it once did, and the daemon crashed). */
Test(daemon_errors, pipelined_requests_then_a_length_lie, .init = setup, .fini = teardown) {
  /* {"id": 1, "op": "info"} and {"id": 2, "op": "info"}, then 0xFFFFFFFF */
  static const unsigned char info1[] = {0, 0, 0, 13, 0x82, 0xa2, 'i', 'd', 1,
                                        0xa2, 'o', 'p', 0xa4, 'i', 'n', 'f', 'o'};
  for (int round = 0; round < 20; round++) {
    unsigned char buf[2 * sizeof info1 + 4];
    memcpy(buf, info1, sizeof info1);
    memcpy(buf + sizeof info1, info1, sizeof info1);
    buf[sizeof info1 + 8] = 2;
    memset(buf + 2 * sizeof info1, 0xff, 4);
    int fd = fp4idx_test_connect(g_d.sock);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fp4idx_test_send_all(fd, buf, sizeof buf), 0);
    for (uint64_t id = 1; id <= 2; id++) {
      fp4idx_response_t resp;
      unsigned char *body = NULL;
      cr_assert_eq(fp4idx_test_recv_response(fd, FP4IDX_OP_INFO, &resp, &body), 0);
      cr_assert_eq(resp.id, id);
      cr_assert_eq(resp.status, FP4IDX_OK);
      fp4idx_response_clear(&resp);
      free(body);
    }
    expect_error(fd, 0, FP4IDX_E2BIG);
    cr_assert_eq(fp4idx_test_peer_closed(fd, 5000), 1, "connection closed after E2BIG");
    close(fd);
    still_fine(g_fd);
  }
}

Test(daemon_errors, max_frame_option_is_enforced) {
  start_with((const char *[]){"--max-frame", "4K", NULL});
  uint16_t *keys = make_keys(100, 1); /* 25.6 KB > 4 KiB */
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.id = 9;
  req.op = FP4IDX_OP_APPEND;
  req.u.append.seq = 1;
  uint64_t shape[2] = {100, 128};
  fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_BF16, 2, shape, keys);
  cr_assert_eq(fp4idx_test_send_request(g_fd, &req), 0);
  expect_error(g_fd, 0, FP4IDX_E2BIG);
  cr_assert_eq(fp4idx_test_peer_closed(g_fd, 5000), 1);
  close(g_fd);
  g_fd = fp4idx_test_connect(g_d.sock);
  fp4idx_info_t info = still_fine(g_fd);
  cr_assert_eq(info.max_frame, 4096);
  cr_assert_eq(info.sequences, 0, "the rejected append stored nothing");
  free(keys);
  teardown();
}

Test(daemon_errors, not_msgpack_and_not_a_map, .init = setup, .fini = teardown) {
  unsigned char bad1[] = {0, 0, 0, 1, 0xc1};             /* never-used byte */
  unsigned char bad2[] = {0, 0, 0, 1, 0x05};             /* an int, not a map */
  unsigned char bad3[] = {0, 0, 0, 3, 0x82, 0xa2, 'i'};  /* truncated map */
  unsigned char bad4[] = {0, 0, 0, 0};                   /* empty body */
  unsigned char bad5[] = {0, 0, 0, 2, 0x80, 0x80};       /* trailing bytes */
  cr_assert_eq(fp4idx_test_send_all(g_fd, bad1, sizeof bad1), 0);
  expect_error(g_fd, 0, FP4IDX_EPROTO);
  cr_assert_eq(fp4idx_test_send_all(g_fd, bad2, sizeof bad2), 0);
  expect_error(g_fd, 0, FP4IDX_EPROTO);
  cr_assert_eq(fp4idx_test_send_all(g_fd, bad3, sizeof bad3), 0);
  expect_error(g_fd, 0, FP4IDX_EPROTO);
  cr_assert_eq(fp4idx_test_send_all(g_fd, bad4, sizeof bad4), 0);
  expect_error(g_fd, 0, FP4IDX_EPROTO);
  cr_assert_eq(fp4idx_test_send_all(g_fd, bad5, sizeof bad5), 0);
  expect_error(g_fd, 0, FP4IDX_EPROTO);
  still_fine(g_fd);
}

/* ---- message-level errors: reply, connection stays ----------------------- */

Test(daemon_errors, unknown_op_and_wrong_types, .init = setup, .fini = teardown) {
  raw_t r;
  raw_init(&r);
  msgpack_pack_map(&r.pk, 2);
  raw_kv_u(&r, "id", 11);
  raw_kv_s(&r, "op", "frobnicate");
  raw_send(&r, g_fd);
  expect_error(g_fd, 11, FP4IDX_ETYPE);

  /* seq as a string */
  uint16_t *keys = make_keys(2, 3);
  uint64_t shp[2] = {2, 128};
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 12);
  raw_kv_s(&r, "op", "append");
  raw_kv_s(&r, "seq", "seven");
  raw_tensor(&r, "keys", "bf16", 2, shp, keys, 2 * 128 * 2);
  raw_send(&r, g_fd);
  expect_error(g_fd, 12, FP4IDX_EPROTO);

  /* missing keys */
  raw_init(&r);
  msgpack_pack_map(&r.pk, 3);
  raw_kv_u(&r, "id", 13);
  raw_kv_s(&r, "op", "append");
  raw_kv_u(&r, "seq", 1);
  raw_send(&r, g_fd);
  expect_error(g_fd, 13, FP4IDX_EPROTO);

  /* missing op */
  raw_init(&r);
  msgpack_pack_map(&r.pk, 1);
  raw_kv_u(&r, "id", 14);
  raw_send(&r, g_fd);
  expect_error(g_fd, 14, FP4IDX_EPROTO);

  /* truncate without length; length as a float */
  raw_init(&r);
  msgpack_pack_map(&r.pk, 3);
  raw_kv_u(&r, "id", 15);
  raw_kv_s(&r, "op", "truncate");
  raw_kv_u(&r, "seq", 1);
  raw_send(&r, g_fd);
  expect_error(g_fd, 15, FP4IDX_EPROTO);
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 16);
  raw_kv_s(&r, "op", "truncate");
  raw_kv_u(&r, "seq", 1);
  raw_str(&r, "length");
  msgpack_pack_double(&r.pk, 1.5);
  raw_send(&r, g_fd);
  expect_error(g_fd, 16, FP4IDX_EPROTO);

  /* hello with an unsupported version */
  raw_init(&r);
  msgpack_pack_map(&r.pk, 3);
  raw_kv_u(&r, "id", 17);
  raw_kv_s(&r, "op", "hello");
  raw_kv_u(&r, "version", 99);
  raw_send(&r, g_fd);
  expect_error(g_fd, 17, FP4IDX_EVERSION);

  fp4idx_info_t info = still_fine(g_fd);
  cr_assert_eq(info.sequences, 0, "nothing was created by the bad appends");
  cr_assert_eq(info.pages_free, info.pages_total);
  free(keys);
}

Test(daemon_errors, shape_mismatches, .init = setup, .fini = teardown) {
  uint16_t *keys = make_keys(4, 5);
  raw_t r;
  /* keys [2,64] bf16 */
  uint64_t s1[2] = {2, 64};
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 21);
  raw_kv_s(&r, "op", "append");
  raw_kv_u(&r, "seq", 1);
  raw_tensor(&r, "keys", "bf16", 2, s1, keys, 2 * 64 * 2);
  raw_send(&r, g_fd);
  expect_error(g_fd, 21, FP4IDX_ESHAPE);
  /* data length does not match the shape */
  uint64_t s2[2] = {2, 128};
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 22);
  raw_kv_s(&r, "op", "append");
  raw_kv_u(&r, "seq", 1);
  raw_tensor(&r, "keys", "bf16", 2, s2, keys, 3 * 128 * 2);
  raw_send(&r, g_fd);
  expect_error(g_fd, 22, FP4IDX_ESHAPE);
  /* u8 keys must be [n,68] */
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 23);
  raw_kv_s(&r, "op", "append");
  raw_kv_u(&r, "seq", 1);
  raw_tensor(&r, "keys", "u8", 2, s2, keys, 2 * 128);
  raw_send(&r, g_fd);
  expect_error(g_fd, 23, FP4IDX_ESHAPE);
  /* zero keys */
  uint64_t s0[2] = {0, 128};
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 24);
  raw_kv_s(&r, "op", "append");
  raw_kv_u(&r, "seq", 1);
  raw_tensor(&r, "keys", "bf16", 2, s0, keys, 0);
  raw_send(&r, g_fd);
  expect_error(g_fd, 24, FP4IDX_ESHAPE);

  /* a real sequence, then a score whose q has 16 heads where heads = 32 */
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_BF16, 4, keys, NULL, NULL), 0);
  uint16_t *q = calloc(32 * 128, 2), *w = calloc(32, 2);
  uint64_t qs[3] = {1, 16, 128}, ws[2] = {1, 32};
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 25);
  raw_kv_s(&r, "op", "score");
  raw_kv_u(&r, "heads", 32);
  raw_str(&r, "seqs");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 3);
  raw_kv_u(&r, "seq", 1);
  raw_tensor(&r, "q", "bf16", 3, qs, q, 16 * 128 * 2);
  raw_tensor(&r, "w", "bf16", 2, ws, w, 32 * 2);
  raw_send(&r, g_fd);
  expect_error(g_fd, 25, FP4IDX_ESHAPE);

  /* heads out of range */
  uint64_t qs2[3] = {1, 32, 128};
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 26);
  raw_kv_s(&r, "op", "score");
  raw_kv_u(&r, "heads", 0);
  raw_str(&r, "seqs");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 3);
  raw_kv_u(&r, "seq", 1);
  raw_tensor(&r, "q", "bf16", 3, qs2, q, 32 * 128 * 2);
  raw_tensor(&r, "w", "bf16", 2, ws, w, 32 * 2);
  raw_send(&r, g_fd);
  expect_error(g_fd, 26, FP4IDX_ESHAPE);

  /* mask of the wrong width: lens [3] -> W = 3, mask [1,4] */
  int32_t lens[1] = {3};
  uint8_t mask[4] = {1, 1, 1, 1};
  uint64_t ls[1] = {1}, ms[2] = {1, 4};
  raw_init(&r);
  msgpack_pack_map(&r.pk, 4);
  raw_kv_u(&r, "id", 27);
  raw_kv_s(&r, "op", "score");
  raw_kv_u(&r, "heads", 32);
  raw_str(&r, "seqs");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 5);
  raw_kv_u(&r, "seq", 1);
  raw_tensor(&r, "q", "bf16", 3, qs2, q, 32 * 128 * 2);
  raw_tensor(&r, "w", "bf16", 2, ws, w, 32 * 2);
  raw_tensor(&r, "lens", "i32", 1, ls, lens, 4);
  raw_tensor(&r, "mask", "u8", 2, ms, mask, 4);
  raw_send(&r, g_fd);
  expect_error(g_fd, 27, FP4IDX_ESHAPE);

  fp4idx_info_t info = still_fine(g_fd);
  cr_assert_eq(info.sequences, 1);
  uint8_t back[4 * 68];
  uint64_t got = 0;
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 0, 4, back, &got), 0);
  cr_assert_eq(got, 4, "the sequence still holds exactly its 4 keys");
  free(q);
  free(w);
  free(keys);
}

Test(daemon_errors, unknown_sequence_and_ranges, .init = setup, .fini = teardown) {
  uint16_t *keys = make_keys(10, 7);
  uint16_t *q = calloc(2 * 4 * 128, 2), *w = calloc(2 * 4, 2);
  float *logits = NULL;
  uint64_t width;
  cr_assert_eq(fp4idx_test_score(g_fd, 404, 4, 2, q, w, NULL, &logits, &width), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_test_truncate(g_fd, 404, 0), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_test_drop(g_fd, 404), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_test_read(g_fd, 404, 0, 0, NULL, NULL), FP4IDX_ENOSEQ);

  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_BF16, 10, keys, NULL, NULL), 0);
  int32_t lens_hi[2] = {10, 11}, lens_neg[2] = {-1, 3}, lens_ok[2] = {10, 0};
  cr_assert_eq(fp4idx_test_score(g_fd, 1, 4, 2, q, w, lens_hi, &logits, &width), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx_test_score(g_fd, 1, 4, 2, q, w, lens_neg, &logits, &width), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx_test_score(g_fd, 1, 4, 2, q, w, lens_ok, &logits, &width), 0);
  cr_assert_eq(width, 10);
  /* row 1 sees nothing: all -inf */
  for (int l = 0; l < 10; l++) cr_assert(isinf(logits[10 + l]) && logits[10 + l] < 0);
  free(logits);
  cr_assert_eq(fp4idx_test_truncate(g_fd, 1, 11), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 11, 0, NULL, NULL), FP4IDX_ERANGE);
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 5, 6, NULL, NULL), FP4IDX_ERANGE);
  uint64_t got = 99;
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 10, 0, NULL, &got), 0);
  cr_assert_eq(got, 0);
  /* A multi-sequence score with one unknown entry fails as a whole. */
  fp4idx_request_t req;
  fp4idx_score_seq_t ss[2];
  memset(&req, 0, sizeof req);
  memset(ss, 0, sizeof ss);
  req.id = 31;
  req.op = FP4IDX_OP_SCORE;
  req.u.score.heads = 4;
  req.u.score.seqs = ss;
  req.u.score.nseqs = 2;
  uint64_t qs[3] = {2, 4, 128}, ws[2] = {2, 4};
  for (int i = 0; i < 2; i++) {
    ss[i].seq = i ? 405 : 1;
    ss[i].rows = 2;
    fp4idx_tensor_init(&ss[i].q, FP4IDX_WIRE_BF16, 3, qs, q);
    fp4idx_tensor_init(&ss[i].w, FP4IDX_WIRE_BF16, 2, ws, w);
  }
  cr_assert_eq(fp4idx_test_send_request(g_fd, &req), 0);
  expect_error(g_fd, 31, FP4IDX_ENOSEQ);
  still_fine(g_fd);
  free(q);
  free(w);
  free(keys);
}

Test(daemon_errors, nan_key_changes_nothing, .init = setup, .fini = teardown) {
  uint16_t *keys = make_keys(70, 9);
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_BF16, 5, keys, NULL, NULL), 0);
  fp4idx_info_t before = still_fine(g_fd);
  uint8_t snap[5 * 68];
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 0, 5, snap, NULL), 0);
  /* 65 keys (crossing into a new page), one NaN deep inside */
  keys[64 * 128 + 77] = 0x7fc0;
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_BF16, 65, keys, NULL, NULL),
               FP4IDX_ENONFINITE);
  /* +inf as f32, on a new sequence */
  float *f = calloc(3 * 128, 4);
  f[2 * 128 + 5] = INFINITY;
  cr_assert_eq(fp4idx_test_append(g_fd, 2, FP4IDX_WIRE_F32, 3, f, NULL, NULL), FP4IDX_ENONFINITE);
  fp4idx_info_t after = still_fine(g_fd);
  cr_assert_eq(after.pages_free, before.pages_free);
  cr_assert_eq(after.sequences, before.sequences, "the failed append created no sequence");
  cr_assert_eq(fp4idx_test_read(g_fd, 2, 0, 0, NULL, NULL), FP4IDX_ENOSEQ);
  uint8_t again[6 * 68];
  uint64_t got;
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 0, 6, again, &got), FP4IDX_ERANGE, "still 5 keys");
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 0, 5, again, &got), 0);
  cr_assert_eq(memcmp(again, snap, sizeof snap), 0);
  uint64_t first;
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_BF16, 1, keys, &first, NULL), 0);
  cr_assert_eq(first, 5);
  free(f);
  free(keys);
}

Test(daemon_errors, full_pool_changes_nothing, .init = setup, .fini = teardown) {
  uint16_t *keys = make_keys(640, 11);
  fp4idx_info_t info = still_fine(g_fd);
  cr_assert_eq(info.pages_total, 10);
  cr_assert_eq(info.page_size, 64);
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_BF16, 600, keys, NULL, NULL), 0);
  info = still_fine(g_fd);
  cr_assert_eq(info.pages_free, 0);
  uint8_t *snap = malloc(600 * 68);
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 0, 600, snap, NULL), 0);
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_BF16, 41, keys, NULL, NULL), FP4IDX_EFULL);
  cr_assert_eq(fp4idx_test_append(g_fd, 2, FP4IDX_WIRE_BF16, 1, keys, NULL, NULL), FP4IDX_EFULL);
  fp4idx_info_t after = still_fine(g_fd);
  cr_assert_eq(after.sequences, 1);
  cr_assert_eq(after.pages_free, 0);
  uint8_t *again = malloc(600 * 68);
  cr_assert_eq(fp4idx_test_read(g_fd, 1, 0, 600, again, NULL), 0);
  cr_assert_eq(memcmp(again, snap, 600 * 68), 0);
  /* The last page's free slots are still usable: exactly 40 fit. */
  uint64_t first, length;
  cr_assert_eq(fp4idx_test_append(g_fd, 1, FP4IDX_WIRE_BF16, 40, keys, &first, &length), 0);
  cr_assert_eq(first, 600);
  cr_assert_eq(length, 640);
  free(snap);
  free(again);
  free(keys);
}

/* Many requests in one write: answers in order, ids echoed. */
Test(daemon_errors, pipelined_mixed_requests_answer_in_order, .init = setup, .fini = teardown) {
  uint16_t *keys = make_keys(3, 13);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  fp4idx_op_t ops[120];
  for (int i = 0; i < 120; i++) {
    fp4idx_request_t req;
    memset(&req, 0, sizeof req);
    req.id = 1000 + (uint64_t)i;
    switch (i % 4) {
      case 0: {
        req.op = FP4IDX_OP_APPEND;
        req.u.append.seq = 1;
        uint64_t shape[2] = {3, 128};
        fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_BF16, 2, shape, keys);
        break;
      }
      case 1: req.op = FP4IDX_OP_INFO; break;
      case 2:
        req.op = FP4IDX_OP_READ;
        req.u.read.seq = (i % 8 == 2) ? 1 : 999; /* every other one fails */
        break;
      default: req.op = FP4IDX_OP_STATS; break;
    }
    ops[i] = req.op;
    cr_assert_eq(fp4idx_encode_request(&sb, &req), 0);
  }
  cr_assert_eq(fp4idx_test_send_all(g_fd, sb.data, sb.size), 0);
  msgpack_sbuffer_destroy(&sb);
  uint64_t appended = 0;
  for (int i = 0; i < 120; i++) {
    fp4idx_response_t resp;
    unsigned char *body = NULL;
    cr_assert_eq(fp4idx_test_recv_response(g_fd, ops[i], &resp, &body), 0);
    cr_assert_eq(resp.id, 1000 + (uint64_t)i, "response %d out of order", i);
    if (ops[i] == FP4IDX_OP_READ && i % 8 != 2) {
      cr_assert_eq(resp.status, FP4IDX_ENOSEQ);
    } else {
      cr_assert_eq(resp.status, 0, "%d: %s", i, resp.error);
    }
    if (ops[i] == FP4IDX_OP_APPEND) {
      cr_assert_eq(resp.u.append.first, appended);
      appended += 3;
    }
    if (ops[i] == FP4IDX_OP_READ && i % 8 == 2)
      cr_assert_eq(resp.u.read.keys.shape[0], appended, "read sees every earlier append");
    fp4idx_response_clear(&resp);
    free(body);
  }
  free(keys);
}

/* Random garbage and bit-flipped valid frames: every frame answered, in
 * order, and the daemon stays up. */
Test(daemon_errors, fuzzed_frames_never_crash, .init = setup, .fini = teardown) {
  uint16_t *keys = make_keys(2, 17);
  uint64_t x = 0x1234567;
  for (int i = 0; i < 400; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    unsigned char body[2048];
    size_t len;
    if (i % 2) {
      len = (size_t)((x >> 33) % 200);
      for (size_t j = 0; j < len; j++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        body[j] = (unsigned char)(x >> 56);
      }
    } else {
      fp4idx_request_t req;
      memset(&req, 0, sizeof req);
      req.id = 7;
      req.op = FP4IDX_OP_APPEND;
      req.u.append.seq = 3;
      uint64_t shape[2] = {2, 128};
      fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_BF16, 2, shape, keys);
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      cr_assert_eq(fp4idx_encode_request(&sb, &req), 0);
      len = sb.size - 4;
      cr_assert_leq(len, sizeof body);
      memcpy(body, sb.data + 4, len);
      msgpack_sbuffer_destroy(&sb);
      /* flip 1..3 bytes, mostly in the header part of the message */
      for (int k = 0; k < 1 + (int)(x % 3); k++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t at = (size_t)((x >> 33) % (k ? len : 60));
        body[at] ^= (unsigned char)(1u << ((x >> 20) % 8));
      }
    }
    unsigned char hdr[4];
    fp4idx_frame_header_put(hdr, (uint32_t)len);
    cr_assert_eq(fp4idx_test_send_all(g_fd, hdr, 4), 0);
    cr_assert_eq(fp4idx_test_send_all(g_fd, body, len), 0);
    unsigned char *resp = NULL;
    size_t rlen;
    cr_assert_eq(fp4idx_test_recv_frame(g_fd, &resp, &rlen), 0, "frame %d not answered", i);
    free(resp);
  }
  still_fine(g_fd);
  free(keys);
}

/* Frames cut at every byte (header and body across many reads), and two
 * frames sharing one write, are reassembled. */
Test(daemon_errors, frames_split_anywhere, .init = setup, .fini = teardown) {
  uint16_t *keys = make_keys(3, 19);
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.id = 61;
  req.op = FP4IDX_OP_APPEND;
  req.u.append.seq = 8;
  uint64_t shape[2] = {3, 128};
  fp4idx_tensor_init(&req.u.append.keys, FP4IDX_WIRE_BF16, 2, shape, keys);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_request(&sb, &req), 0);
  fp4idx_request_t info;
  memset(&info, 0, sizeof info);
  info.id = 62;
  info.op = FP4IDX_OP_INFO;
  cr_assert_eq(fp4idx_encode_request(&sb, &info), 0);
  for (size_t i = 0; i < sb.size; i++) {
    cr_assert_eq(fp4idx_test_send_all(g_fd, sb.data + i, 1), 0);
    if (i % 97 == 0) usleep(1000); /* let some bytes arrive alone */
  }
  msgpack_sbuffer_destroy(&sb);
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_recv_response(g_fd, FP4IDX_OP_APPEND, &resp, &body), 0);
  cr_assert_eq(resp.id, 61);
  cr_assert_eq(resp.status, 0, "%s", resp.error);
  cr_assert_eq(resp.u.append.length, 3);
  fp4idx_response_clear(&resp);
  free(body);
  cr_assert_eq(fp4idx_test_recv_response(g_fd, FP4IDX_OP_INFO, &resp, &body), 0);
  cr_assert_eq(resp.id, 62);
  cr_assert_eq(resp.u.info.sequences, 1);
  fp4idx_response_clear(&resp);
  free(body);
  free(keys);
}
