/* test_daemon_length.c -- the "length" op against the real daemon, through
 * the codec and through the C client's generated call fp4idx_client_length:
 * the key count follows appends, truncates, forks and drops; an unknown
 * sequence is ENOSEQ and leaves the connection usable; malformed requests
 * are EPROTO; a length pipelined behind an append sees that append. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_client.h"
#include "fp4idx_codec.h"
#include "test_protocol_util.h"

static fp4idx_test_daemon_t g_d;
static int g_fd = -1;

static void setup(void) {
  cr_assert_eq(fp4idx_test_daemon_start(&g_d, (const char *[]){"--cache-bytes", "16M", NULL}),
               0);
  g_fd = fp4idx_test_connect(g_d.sock);
  cr_assert_geq(g_fd, 0);
}

static void teardown(void) {
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  fp4idx_test_daemon_stop(&g_d);
}

TestSuite(daemon_length, .init = setup, .fini = teardown);

static void append_keys(uint64_t seq, uint64_t n) {
  static unsigned char slots[300 * FP4IDX_PROTO_SLOT_BYTES];
  cr_assert_leq(n, 300u);
  /* zero payloads, scale bytes 127 (0 and 255 are refused) */
  for (int i = 0; i < 300; i++) memset(slots + i * FP4IDX_PROTO_SLOT_BYTES + 64, 127, 4);
  cr_assert_eq(fp4idx_test_append(g_fd, seq, FP4IDX_WIRE_U8, n, slots, NULL, NULL), 0);
}

/* The length of seq through the codec; returns the status, *len the length. */
static int length_of(uint64_t seq, uint64_t *len) {
  fp4idx_request_t rq = {.id = 77, .op = FP4IDX_OP_LENGTH};
  rq.u.length.seq = seq;
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(g_fd, &rq, &rs, &body), 0);
  cr_assert_eq(rs.id, 77u);
  int st = rs.status;
  *len = st == 0 ? rs.u.length.length : UINT64_MAX;
  fp4idx_response_clear(&rs);
  free(body);
  return st;
}

Test(daemon_length, follows_appends_truncates_forks_and_drops) {
  uint64_t n = 0;
  append_keys(5, 100);
  cr_assert_eq(length_of(5, &n), 0);
  cr_assert_eq(n, 100u);
  append_keys(5, 150);
  cr_assert_eq(length_of(5, &n), 0);
  cr_assert_eq(n, 250u);
  cr_assert_eq(fp4idx_test_truncate(g_fd, 5, 70), 0);
  cr_assert_eq(length_of(5, &n), 0);
  cr_assert_eq(n, 70u);

  fp4idx_request_t fk = {.id = 3, .op = FP4IDX_OP_FORK};
  fk.u.fork = (fp4idx_fork_req_t){.src = 5, .dst = 6, .length = 30};
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(g_fd, &fk, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  fp4idx_response_clear(&rs);
  free(body);
  cr_assert_eq(length_of(6, &n), 0);
  cr_assert_eq(n, 30u);
  cr_assert_eq(length_of(5, &n), 0);
  cr_assert_eq(n, 70u, "the fork leaves its source as it was");

  cr_assert_eq(fp4idx_test_truncate(g_fd, 6, 0), 0);
  cr_assert_eq(length_of(6, &n), 0);
  cr_assert_eq(n, 0u, "an emptied sequence still exists");
  cr_assert_eq(fp4idx_test_drop(g_fd, 5), 0);
  cr_assert_eq(length_of(5, &n), FP4IDX_ENOSEQ);
  cr_assert_eq(length_of(6, &n), 0);
}

Test(daemon_length, unknown_sequence_is_enoseq_and_the_connection_stays) {
  uint64_t n = 0;
  cr_assert_eq(length_of(1234, &n), FP4IDX_ENOSEQ);
  append_keys(1234, 1);
  cr_assert_eq(length_of(1234, &n), 0);
  cr_assert_eq(n, 1u);
}

/* A hand-made request body (test_protocol_util.h's notation), sent as one
 * frame; returns the status of its answer. */
static int raw_status(const char *notation) {
  unsigned char *b = NULL, hdr[FP4IDX_FRAME_HEADER];
  size_t blen = 0;
  cr_assert_eq(mp_build_alloc(notation, &b, &blen), 0, "%s", notation);
  fp4idx_frame_header_put(hdr, (uint32_t)blen);
  cr_assert_eq(fp4idx_test_send_all(g_fd, hdr, sizeof hdr), 0);
  cr_assert_eq(fp4idx_test_send_all(g_fd, b, blen), 0);
  free(b);
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_recv_response(g_fd, FP4IDX_OP_LENGTH, &rs, &body), 0);
  int st = rs.status;
  fp4idx_response_clear(&rs);
  free(body);
  return st;
}

Test(daemon_length, malformed_requests_are_eproto) {
  cr_assert_eq(raw_status("{id: 1, op: 'length'}"), FP4IDX_EPROTO);
  cr_assert_eq(raw_status("{id: 2, op: 'length', seq: 'x'}"), FP4IDX_EPROTO);
  cr_assert_eq(raw_status("{id: 3, op: 'length', seq: -1}"), FP4IDX_EPROTO);
  cr_assert_eq(raw_status("{id: 4, op: 'length', seq: 1, from: 0}"), FP4IDX_EPROTO);
  uint64_t n = 0;
  cr_assert_eq(length_of(1, &n), FP4IDX_ENOSEQ, "still answering");
}

Test(daemon_length, pipelined_behind_an_append_sees_it) {
  static unsigned char slots[40 * FP4IDX_PROTO_SLOT_BYTES];
  for (int i = 0; i < 40; i++) memset(slots + i * FP4IDX_PROTO_SLOT_BYTES + 64, 127, 4);
  fp4idx_request_t ap = {.id = 1, .op = FP4IDX_OP_APPEND}, ln = {.id = 2, .op = FP4IDX_OP_LENGTH};
  ap.u.append.seq = 9;
  cr_assert_eq(fp4idx_tensor_init(&ap.u.append.keys, FP4IDX_WIRE_U8, 2,
                                  (uint64_t[]){40, FP4IDX_PROTO_SLOT_BYTES}, slots),
               0);
  ln.u.length.seq = 9;
  cr_assert_eq(fp4idx_test_send_request(g_fd, &ap), 0);
  cr_assert_eq(fp4idx_test_send_request(g_fd, &ln), 0);
  fp4idx_response_t rs;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_recv_response(g_fd, FP4IDX_OP_APPEND, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  fp4idx_response_clear(&rs);
  free(body);
  cr_assert_eq(fp4idx_test_recv_response(g_fd, FP4IDX_OP_LENGTH, &rs, &body), 0);
  cr_assert_eq(rs.status, 0, "%s", rs.error);
  cr_assert_eq(rs.id, 2u);
  cr_assert_eq(rs.u.length.length, 40u);
  fp4idx_response_clear(&rs);
  free(body);
}

Test(daemon_length, the_generated_client_call) {
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_not_null(c);
  cr_assert_eq(fp4idx_client_connect(c, g_d.sock), FP4IDX_OK, "%s", fp4idx_client_last_error(c));
  uint64_t n = 0;
  cr_assert_eq(fp4idx_client_length(c, 42, &n), FP4IDX_ENOSEQ);
  cr_assert(fp4idx_client_connected(c), "an error reply keeps the connection");
  cr_assert(strstr(fp4idx_client_last_error(c), "42") != NULL, "%s",
            fp4idx_client_last_error(c));
  append_keys(42, 3);
  cr_assert_eq(fp4idx_client_length(c, 42, &n), FP4IDX_OK);
  cr_assert_eq(n, 3u);
  cr_assert_eq(fp4idx_client_length(c, 42, NULL), FP4IDX_OK, "out may be NULL");
  cr_assert_eq(fp4idx_client_length(NULL, 42, &n), FP4IDX_EINVAL);
  fp4idx_client_close(c);
}
