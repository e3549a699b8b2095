/* test_protocol_oom.c -- out-of-memory loops, the SQLite way: an allocator
 * that fails at its N-th call, N raised each pass until the operation
 * completes. Every pass must fail cleanly (ENOMEM, nothing leaked, buffers
 * unchanged) or succeed with the right result.
 *
 * The allocator is interposed with the linker's --wrap on malloc, calloc and
 * realloc (see tests/protocol.cmake), so it sees the calls made by the codec
 * (libfp4idx_protocol.a) and by msgpack-c's inline sbuffer; allocations
 * inside the shared libmsgpackc (msgpack_unpack_next's zone) are not
 * interposed. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_codec.h"
#include "test_protocol_util.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

static long fail_at = -1; /* -1: never fail */
static long calls;

static int should_fail(void) {
  if (fail_at < 0) return 0;
  return calls++ == fail_at;
}
void *__wrap_malloc(size_t n) { return should_fail() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t m) {
  return should_fail() ? NULL : __real_calloc(n, m);
}
void *__wrap_realloc(void *p, size_t n) {
  return should_fail() ? NULL : __real_realloc(p, n);
}

static void arm(long n) {
  calls = 0;
  fail_at = n;
}
static void disarm(void) { fail_at = -1; }

/* Its first q (32 KiB) is larger than a fresh msgpack_sbuffer, so that
 * encoding it has to grow the buffer (the allocation the OOM loop fails). */
static const char *const score_text =
    "{id: 6, op: 'score', heads: 2, seqs: [{seq: 1, q: T(bf16, [64, 2, 128]), "
    "w: T(bf16, [64, 2]), lens: T(i32, [64])}, {seq: 2, q: T(bf16, [1, 2, 128]), "
    "w: T(bf16, [1, 2])}]}";

Test(oom, decode_request) {
  unsigned char *body;
  size_t len;
  cr_assert_eq(mp_build_alloc(score_text, &body, &len), 0);
  int passes = 0;
  for (long n = 0;; n++) {
    fp4idx_request_t r;
    char msg[256];
    arm(n);
    int rc = fp4idx_decode_request(body, len, &r, msg, sizeof(msg));
    disarm();
    passes++;
    if (rc == 0) {
      cr_assert_eq(r.u.score.nseqs, 2u);
      cr_assert_eq(r.u.score.seqs[1].seq, 2u);
      fp4idx_request_clear(&r);
      break;
    }
    cr_assert_eq(rc, FP4IDX_ENOMEM, "pass %ld: %d %s", n, rc, msg);
    cr_assert_eq(r.id, 6u, "the id survives an allocation failure");
    fp4idx_request_clear(&r);
    cr_assert_lt(n, 100);
  }
  cr_assert_geq(passes, 2, "the loop must have failed at least once");
  free(body);
}

Test(oom, encode_request_and_response) {
  /* decode a valid request to get a struct to encode */
  unsigned char *body;
  size_t len;
  cr_assert_eq(mp_build_alloc(score_text, &body, &len), 0);
  fp4idx_request_t r;
  cr_assert_eq(fp4idx_decode_request(body, len, &r, NULL, 0), 0);
  int failures = 0;
  for (long n = 0;; n++) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    /* something already in the buffer must survive a failed encode */
    fp4idx_request_t info = {.id = 1, .op = FP4IDX_OP_INFO};
    cr_assert_eq(fp4idx_encode_request(&sb, &info), 0);
    size_t before = sb.size;
    char *snapshot = __real_malloc(before);
    memcpy(snapshot, sb.data, before);
    arm(n);
    int rc = fp4idx_encode_request(&sb, &r);
    disarm();
    if (rc == 0) {
      fp4idx_request_t back;
      cr_assert_eq(fp4idx_decode_request(sb.data + before + 4,
                                         sb.size - before - 4, &back, NULL, 0),
                   0);
      cr_assert_eq(back.u.score.nseqs, 2u);
      fp4idx_request_clear(&back);
      free(snapshot);
      msgpack_sbuffer_destroy(&sb);
      break;
    }
    failures++;
    cr_assert_eq(rc, FP4IDX_ENOMEM, "pass %ld: %d", n, rc);
    cr_assert_eq(sb.size, before, "failed encode left bytes behind");
    cr_assert(memcmp(sb.data, snapshot, before) == 0);
    free(snapshot);
    msgpack_sbuffer_destroy(&sb);
    cr_assert_lt(n, 200);
  }
  cr_assert_gt(failures, 0);
  fp4idx_request_clear(&r);
  free(body);

  /* error replies */
  for (long n = 0;; n++) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    arm(n);
    int rc = fp4idx_encode_error(&sb, 3, FP4IDX_ENOSEQ, "unknown sequence 3");
    disarm();
    if (rc == 0) {
      msgpack_sbuffer_destroy(&sb);
      break;
    }
    cr_assert_eq(rc, FP4IDX_ENOMEM);
    cr_assert_eq(sb.size, 0u);
    msgpack_sbuffer_destroy(&sb);
    cr_assert_lt(n, 50);
  }
}

Test(oom, decode_stats_response) {
  unsigned char *body;
  size_t len;
  cr_assert_eq(mp_build_alloc(
                   "{id: 11, status: 0, uptime_s: 1.5, connections: 1, "
                   "sequences: 0, keys: 0, backend: 'cpu', device: 'd', "
                   "pages_total: 1, pages_free: 1, requests: {append: "
                   "{count: 1, errors: 0, latency_us_le: [1, 2.0], "
                   "latency_hist: [1, 0], latency_sum_us: 3}}}",
                   &body, &len),
               0);
  for (long n = 0;; n++) {
    fp4idx_response_t r;
    arm(n);
    int rc = fp4idx_decode_response(body, len, FP4IDX_OP_STATS, &r, NULL, 0);
    disarm();
    if (rc == 0) {
      cr_assert_eq(r.u.stats.nops, 1u);
      cr_assert_str_eq(r.u.stats.ops[0].op, "append");
      fp4idx_response_clear(&r);
      break;
    }
    cr_assert_eq(rc, FP4IDX_ENOMEM);
    fp4idx_response_clear(&r);
    cr_assert_lt(n, 50);
  }
  free(body);
}

Test(oom, frame_reader) {
  unsigned char s[8] = {0, 0, 0, 4, 'a', 'b', 'c', 'd'};
  fp4idx_frame_reader_t fr;
  size_t used;
  fp4idx_frame_reader_init(&fr, 0);
  arm(0);
  int rc = fp4idx_frame_reader_feed(&fr, s, 8, &used);
  disarm();
  cr_assert_eq(rc, FP4IDX_ENOMEM);
  cr_assert_eq(fp4idx_frame_reader_feed(&fr, s + used, 8 - used, &used),
               FP4IDX_ENOMEM, "sticky");
  fp4idx_frame_reader_free(&fr);
  /* a fresh reader works */
  fp4idx_frame_reader_init(&fr, 0);
  cr_assert_eq(fp4idx_frame_reader_feed(&fr, s, 8, &used), 1);
  unsigned char *b;
  size_t bl;
  cr_assert_eq(fp4idx_frame_reader_take(&fr, &b, &bl), 0);
  cr_assert(bl == 4 && memcmp(b, "abcd", 4) == 0);
  free(b);
  fp4idx_frame_reader_free(&fr);
}

/* The reader grows its body buffer as bytes arrive (frame.c): a failed
 * growth, through feed or through space, is a sticky ENOMEM that keeps the
 * old buffer owned (freed by fp4idx_frame_reader_free: ASan checks). */
Test(oom, frame_reader_growth) {
  const uint32_t n = 3 * FP4IDX_FRAME_GROW_MIN;
  unsigned char *s = malloc(4 + n);
  fp4idx_frame_reader_t fr;
  size_t used;
  cr_assert_not_null(s);
  fp4idx_frame_header_put(s, n);
  memset(s + 4, 'x', n);

  /* feed: header + 10 bytes fit the first buffer, the next piece does not */
  fp4idx_frame_reader_init(&fr, 0);
  cr_assert_eq(fp4idx_frame_reader_feed(&fr, s, 14, &used), 0);
  arm(0);
  int rc = fp4idx_frame_reader_feed(&fr, s + 14, n - 10, &used);
  disarm();
  cr_assert_eq(rc, FP4IDX_ENOMEM);
  cr_assert_eq(used, 0u);
  cr_assert_eq(fp4idx_frame_reader_feed(&fr, s + 14, 1, &used), FP4IDX_ENOMEM, "sticky");
  fp4idx_frame_reader_free(&fr);

  /* space: the first buffer is full, growing it fails */
  void *space;
  size_t slen;
  fp4idx_frame_reader_init(&fr, 0);
  cr_assert_eq(fp4idx_frame_reader_feed(&fr, s, 4 + FP4IDX_FRAME_GROW_MIN, &used), 0);
  arm(0);
  rc = fp4idx_frame_reader_space(&fr, &space, &slen);
  disarm();
  cr_assert_eq(rc, FP4IDX_ENOMEM);
  cr_assert(space == NULL && slen == 0);
  cr_assert_eq(fp4idx_frame_reader_feed(&fr, s + 4, 1, &used), FP4IDX_ENOMEM, "sticky");
  fp4idx_frame_reader_free(&fr);
  free(s);
}
