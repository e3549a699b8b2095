/* test_daemon_list.c -- the "list" op against the real daemon: a full scan
 * in bounded steps over thousands of sequences, stability while sequences
 * are appended and dropped between the steps, and bad requests. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_codec.h"

static fp4idx_test_daemon_t g_d;
static int g_fd = -1;

static void setup(void) {
  /* 7710 pages of 64 keys */
  cr_assert_eq(fp4idx_test_daemon_start(&g_d, (const char *[]){"--cache-bytes", "32M", NULL}),
               0);
  g_fd = fp4idx_test_connect(g_d.sock);
  cr_assert_geq(g_fd, 0);
}

static void teardown(void) {
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  fp4idx_test_daemon_stop(&g_d);
}

static void append_keys(uint64_t seq, uint64_t n) {
  static unsigned char slots[200 * FP4IDX_PROTO_SLOT_BYTES];
  cr_assert_leq(n, 200u);
  /* zero payloads, scale bytes 127 (PROTOCOL.md: 0 and 255 are refused) */
  for (int i = 0; i < 200; i++) memset(slots + i * FP4IDX_PROTO_SLOT_BYTES + 64, 127, 4);
  cr_assert_eq(fp4idx_test_append(g_fd, seq, FP4IDX_WIRE_U8, n, slots, NULL, NULL), 0,
               "append to %llu", (unsigned long long)seq);
}

/* One list step; returns the next cursor, entries into *out (malloc'd). */
static uint64_t list_step(uint64_t cursor, uint32_t count, fp4idx_list_entry_t **out,
                          size_t *n) {
  fp4idx_request_t rq = {.id = 42, .op = FP4IDX_OP_LIST};
  rq.u.list.cursor = cursor;
  rq.u.list.count = count;
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(g_fd, &rq, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_eq(rs.id, 42u);
  *n = rs.u.list.nseqs;
  *out = malloc(*n * sizeof **out + 1);
  if (*n) memcpy(*out, rs.u.list.seqs, *n * sizeof **out);
  uint64_t next = rs.u.list.cursor;
  fp4idx_response_clear(&rs);
  free(body);
  return next;
}

#define NSEQ 3000u

Test(daemon_list, full_scan_in_bounded_steps, .init = setup, .fini = teardown) {
  /* sequence 1000 + i holds 1 + i % 130 keys: 1..3 pages of 64 */
  for (uint64_t i = 0; i < NSEQ; i++) append_keys(1000 + i, 1 + i % 130);
  unsigned char *seen = calloc(NSEQ, 1);
  uint64_t cursor = 0, steps = 0, total = 0;
  do {
    fp4idx_list_entry_t *e;
    size_t n;
    cursor = list_step(cursor, 50, &e, &n);
    cr_assert_leq(n, 50u + 8u, "step %llu returned %zu", (unsigned long long)steps, n);
    for (size_t k = 0; k < n; k++) {
      cr_assert(e[k].seq >= 1000 && e[k].seq < 1000 + NSEQ, "seq %llu",
                (unsigned long long)e[k].seq);
      uint64_t i = e[k].seq - 1000;
      cr_assert_eq(e[k].keys, 1 + i % 130);
      cr_assert_eq(e[k].pages, (e[k].keys + 63) / 64);
      seen[i]++;
    }
    total += n;
    free(e);
    steps++;
    cr_assert_lt(steps, 100000u);
  } while (cursor != 0);
  for (uint64_t i = 0; i < NSEQ; i++)
    cr_assert_eq(seen[i], 1, "sequence %llu came %d times", (unsigned long long)(1000 + i),
                 seen[i]);
  cr_assert_eq(total, NSEQ);
  cr_assert_geq(steps, NSEQ / 58, "paginated: %llu steps", (unsigned long long)steps);
  /* the default count: one step holds about 100 */
  fp4idx_list_entry_t *e;
  size_t n;
  (void)list_step(0, 0, &e, &n);
  cr_assert_leq(n, 100u + 8u);
  free(e);
  free(seen);
}

Test(daemon_list, stable_under_appends_and_drops, .init = setup, .fini = teardown) {
  /* stable: 2i (never dropped); volatile: 2i + 1 (dropped during the scan);
   * new ones (10000 + j) are appended during the scan */
  for (uint64_t i = 0; i < 1000; i++) {
    append_keys(2 * i, 1);
    append_keys(2 * i + 1, 2);
  }
  unsigned char *seen = calloc(2000, 1);
  uint64_t cursor = 0, dropped = 0, added = 0;
  do {
    fp4idx_list_entry_t *e;
    size_t n;
    cursor = list_step(cursor, 20, &e, &n);
    for (size_t k = 0; k < n; k++)
      if (e[k].seq < 2000) seen[e[k].seq] = 1;
    free(e);
    for (int j = 0; j < 20 && added < 3000; j++) append_keys(10000 + added++, 1);
    if (dropped < 1000) cr_assert_eq(fp4idx_test_drop(g_fd, 2 * dropped++ + 1), 0);
  } while (cursor != 0);
  for (uint64_t i = 0; i < 1000; i++)
    cr_assert(seen[2 * i], "stable sequence %llu was missed", (unsigned long long)(2 * i));
  free(seen);
}

Test(daemon_list, empty_daemon_and_bad_requests, .init = setup, .fini = teardown) {
  uint64_t cursor = 0, total = 0, steps = 0;
  do {
    fp4idx_list_entry_t *e;
    size_t n;
    cursor = list_step(cursor, 10, &e, &n);
    total += n;
    free(e);
    cr_assert_lt(++steps, 10000u);
  } while (cursor != 0);
  cr_assert_eq(total, 0u);
  /* count 0 on the wire: EPROTO, the connection stays */
  unsigned char *body;
  size_t len;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  unsigned char hdr[4] = {0};
  msgpack_sbuffer_write(&sb, (const char *)hdr, 4);
  msgpack_pack_map(&pk, 3);
  msgpack_pack_str(&pk, 2), msgpack_pack_str_body(&pk, "id", 2), msgpack_pack_uint64(&pk, 3);
  msgpack_pack_str(&pk, 2), msgpack_pack_str_body(&pk, "op", 2);
  msgpack_pack_str(&pk, 4), msgpack_pack_str_body(&pk, "list", 4);
  msgpack_pack_str(&pk, 5), msgpack_pack_str_body(&pk, "count", 5), msgpack_pack_uint64(&pk, 0);
  fp4idx_frame_header_put((unsigned char *)sb.data, (uint32_t)(sb.size - 4));
  cr_assert_eq(fp4idx_test_send_all(g_fd, sb.data, sb.size), 0);
  msgpack_sbuffer_destroy(&sb);
  fp4idx_response_t rs;
  cr_assert_eq(fp4idx_test_recv_response(g_fd, FP4IDX_OP_LIST, &rs, &body), 0);
  cr_assert_eq(rs.status, FP4IDX_EPROTO);
  cr_assert_eq(rs.id, 3u);
  cr_assert(strstr(rs.error, "count") != NULL, "%s", rs.error);
  fp4idx_response_clear(&rs);
  free(body);
  (void)len;
  /* the connection still answers */
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(g_fd, &info), 0);
}
