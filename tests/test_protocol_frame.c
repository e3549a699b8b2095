/* test_protocol_frame.c -- the 4-byte header and the incremental reader. */
#include <criterion/criterion.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_codec.h"

Test(frame, header_is_big_endian) {
  unsigned char h[4];
  fp4idx_frame_header_put(h, 0x01020304u);
  cr_assert(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4);
  cr_assert_eq(fp4idx_frame_header_get(h), 0x01020304u);
  fp4idx_frame_header_put(h, 0xFFFFFFFFu);
  cr_assert_eq(fp4idx_frame_header_get(h), 0xFFFFFFFFu);
  fp4idx_frame_header_put(h, 0);
  cr_assert_eq(fp4idx_frame_header_get(h), 0u);
}

/* Three frames (bodies of 5, 0 and 300 bytes) back to back. */
static size_t make_stream(unsigned char *out) {
  size_t o = 0;
  const size_t lens[3] = {5, 0, 300};
  for (int f = 0; f < 3; f++) {
    fp4idx_frame_header_put(out + o, (uint32_t)lens[f]);
    o += 4;
    for (size_t i = 0; i < lens[f]; i++) out[o++] = (unsigned char)(f * 50 + i);
  }
  return o;
}

/* Feeds the stream in chunks of `chunk` bytes and checks the frames. */
static void feed_in_chunks(size_t chunk) {
  unsigned char stream[400];
  size_t n = make_stream(stream), off = 0;
  const size_t lens[3] = {5, 0, 300};
  fp4idx_frame_reader_t r;
  int got = 0;

  cr_assert_eq(fp4idx_frame_reader_init(&r, 1000), 0);
  while (off < n) {
    size_t len = n - off < chunk ? n - off : chunk, used;
    int rc = fp4idx_frame_reader_feed(&r, stream + off, len, &used);
    cr_assert(rc == 0 || rc == 1, "rc %d", rc);
    cr_assert_leq(used, len);
    off += used;
    if (rc == 0) cr_assert_eq(used, len, "need-more must consume everything");
    if (rc == 1) {
      unsigned char *body;
      size_t blen;
      cr_assert_eq(fp4idx_frame_reader_take(&r, &body, &blen), 0);
      cr_assert_eq(blen, lens[got], "frame %d: %zu bytes", got, blen);
      for (size_t i = 0; i < blen; i++)
        cr_assert_eq(body[i], (unsigned char)(got * 50 + i));
      cr_assert_not_null(body);
      free(body);
      got++;
    }
  }
  /* the empty frame completes with the header: may need one more call */
  size_t used;
  if (got < 3 && fp4idx_frame_reader_feed(&r, NULL, 0, &used) == 1) {
    unsigned char *body;
    size_t blen;
    fp4idx_frame_reader_take(&r, &body, &blen);
    free(body);
    got++;
  }
  cr_assert_eq(got, 3, "chunk %zu: %d frames", chunk, got);
  fp4idx_frame_reader_free(&r);
}

Test(frame, reader_any_chunking) {
  for (size_t c = 1; c <= 20; c++) feed_in_chunks(c);
  feed_in_chunks(301);
  feed_in_chunks(1000);
}

Test(frame, oversized_header_is_e2big_and_sticky) {
  fp4idx_frame_reader_t r;
  unsigned char h[4];
  size_t used;
  fp4idx_frame_reader_init(&r, 100);
  fp4idx_frame_header_put(h, 101);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, h, 4, &used), FP4IDX_E2BIG);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, h, 4, &used), FP4IDX_E2BIG);
  cr_assert_eq(used, 0u);
  fp4idx_frame_reader_free(&r);

  /* exactly the cap is fine */
  fp4idx_frame_reader_init(&r, 100);
  fp4idx_frame_header_put(h, 100);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, h, 4, &used), 0);
  fp4idx_frame_reader_free(&r);

  /* the largest header value with the default cap */
  fp4idx_frame_reader_init(&r, 0);
  cr_assert_eq(r.max_frame, FP4IDX_MAX_FRAME_DEFAULT);
  fp4idx_frame_header_put(h, 0xFFFFFFFFu);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, h, 4, &used), FP4IDX_E2BIG);
  fp4idx_frame_reader_free(&r);
}

Test(frame, completed_frame_must_be_taken) {
  fp4idx_frame_reader_t r;
  unsigned char s[12] = {0, 0, 0, 2, 'a', 'b', 0, 0, 0, 1, 'c'};
  size_t used;
  unsigned char *body;
  size_t blen;
  fp4idx_frame_reader_init(&r, 0);
  cr_assert_eq(fp4idx_frame_reader_take(&r, &body, &blen), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, s, 11, &used), 1);
  cr_assert_eq(used, 6u);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, s + 6, 5, &used), 1);
  cr_assert_eq(used, 0u, "nothing consumed before take");
  cr_assert_eq(fp4idx_frame_reader_take(&r, &body, &blen), 0);
  cr_assert(blen == 2 && memcmp(body, "ab", 2) == 0);
  free(body);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, s + 6, 5, &used), 1);
  cr_assert_eq(fp4idx_frame_reader_take(&r, &body, &blen), 0);
  cr_assert(blen == 1 && body[0] == 'c');
  free(body);
  fp4idx_frame_reader_free(&r);
}

Test(frame, space_and_commit_read_in_place) {
  fp4idx_frame_reader_t r;
  unsigned char h[4];
  size_t used, slen;
  void *space;
  fp4idx_frame_reader_init(&r, 0);
  /* no space before the header is known */
  cr_assert_eq(fp4idx_frame_reader_space(&r, &space, &slen), 0);
  cr_assert_null(space);
  fp4idx_frame_header_put(h, 10);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, h, 4, &used), 0);
  cr_assert_eq(fp4idx_frame_reader_space(&r, &space, &slen), 0);
  cr_assert_not_null(space);
  cr_assert_eq(slen, 10u);
  memcpy(space, "01234", 5);
  cr_assert_eq(fp4idx_frame_reader_commit(&r, 5), 0);
  fp4idx_frame_reader_space(&r, &space, &slen);
  cr_assert_eq(slen, 5u);
  cr_assert_eq(fp4idx_frame_reader_commit(&r, 6), FP4IDX_EINVAL);
  memcpy(space, "56789", 5);
  cr_assert_eq(fp4idx_frame_reader_commit(&r, 5), 1);
  unsigned char *body;
  size_t blen;
  cr_assert_eq(fp4idx_frame_reader_take(&r, &body, &blen), 0);
  cr_assert(blen == 10 && memcmp(body, "0123456789", 10) == 0);
  free(body);
  fp4idx_frame_reader_free(&r);
}

Test(frame, bad_arguments) {
  fp4idx_frame_reader_t r;
  size_t used;
  cr_assert_eq(fp4idx_frame_reader_init(NULL, 0), FP4IDX_EINVAL);
  fp4idx_frame_reader_init(&r, 0);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, NULL, 3, &used), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, "x", 1, NULL), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_frame_reader_commit(&r, 1), FP4IDX_EINVAL);
  /* a partial body is freed by free() (ASan would catch a leak) */
  unsigned char s[6] = {0, 0, 0, 9, 1, 2};
  cr_assert_eq(fp4idx_frame_reader_feed(&r, s, 6, &used), 0);
  fp4idx_frame_reader_free(&r);
  fp4idx_frame_reader_free(&r); /* twice is fine */
}

/* Regression: the reader used to malloc the whole announced body as soon as
 * the header arrived, so 1024 connections each announcing 64 MiB and sending
 * nothing made the daemon allocate 64 GiB. Now the buffer follows the bytes
 * that arrived. Checked twice: the reader's own accounting and what malloc
 * actually handed out (malloc_usable_size, glibc and ASan both answer). */
Test(frame, announced_length_is_not_allocated_up_front) {
  fp4idx_frame_reader_t r;
  unsigned char s[14] = {0};
  size_t used, cap;
  fp4idx_frame_reader_init(&r, 0);
  fp4idx_frame_header_put(s, FP4IDX_MAX_FRAME_DEFAULT); /* 64 MiB */
  memcpy(s + 4, "0123456789", 10);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, s, sizeof s, &used), 0);
  cr_assert_eq(used, sizeof s);
  cr_assert_eq(fp4idx_frame_reader_capacity(&r, &cap), 0);
  cr_assert_leq(cap, FP4IDX_FRAME_GROW_MIN, "64 MiB announced, 10 B sent: %zu B", cap);
  cr_assert_geq(cap, 10u);
  cr_assert_lt(malloc_usable_size(r.body), (size_t)64 << 10,
               "malloc gave %zu B", malloc_usable_size(r.body));
  fp4idx_frame_reader_free(&r);
  cr_assert_eq(fp4idx_frame_reader_capacity(&r, &cap), 0);
  cr_assert_eq(cap, 0u);

  /* the header alone: the floor, not the announced length */
  fp4idx_frame_reader_init(&r, 0);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, s, 4, &used), 0);
  fp4idx_frame_reader_capacity(&r, &cap);
  cr_assert_leq(cap, FP4IDX_FRAME_GROW_MIN);
  fp4idx_frame_reader_free(&r);
  cr_assert_eq(fp4idx_frame_reader_capacity(NULL, &cap), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_frame_reader_capacity(&r, NULL), FP4IDX_EINVAL);
}

/* A 1 MiB body through space/commit in reads of at most 3000 bytes (the
 * daemon's path): each space stays within the body, the buffer within twice
 * the bytes received (or the floor), growth is geometric (few reallocs), and
 * the body comes out exactly N bytes with the right contents. */
Test(frame, space_grows_geometrically_to_exactly_n) {
  const uint32_t n = 1u << 20;
  fp4idx_frame_reader_t r;
  unsigned char h[4];
  size_t used, cap, prev_cap = 0;
  int grows = 0, rc = 0;
  fp4idx_frame_reader_init(&r, 0);
  fp4idx_frame_header_put(h, n);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, h, 4, &used), 0);
  for (uint32_t have = 0; have < n;) {
    void *space;
    size_t slen;
    cr_assert_eq(fp4idx_frame_reader_space(&r, &space, &slen), 0);
    cr_assert_not_null(space);
    cr_assert_gt(slen, 0u);
    cr_assert_leq(have + slen, n, "space past the body end");
    fp4idx_frame_reader_capacity(&r, &cap);
    cr_assert_leq(cap, 2 * (size_t)have > FP4IDX_FRAME_GROW_MIN ? 2 * (size_t)have
                                                                : FP4IDX_FRAME_GROW_MIN,
                  "cap %zu for %u bytes received", cap, have);
    if (cap != prev_cap) grows++, prev_cap = cap;
    size_t k = slen < 3000 ? slen : 3000;
    for (size_t i = 0; i < k; i++) ((unsigned char *)space)[i] = (unsigned char)((have + i) * 7);
    rc = fp4idx_frame_reader_commit(&r, k);
    have += (uint32_t)k;
    cr_assert_eq(rc, have == n ? 1 : 0);
  }
  cr_assert_leq(grows, 10, "%d growth steps for 1 MiB from 4 KiB", grows);
  unsigned char *body;
  size_t blen;
  cr_assert_eq(fp4idx_frame_reader_take(&r, &body, &blen), 0);
  cr_assert_eq(blen, n);
  cr_assert_geq(malloc_usable_size(body), (size_t)n);
  for (uint32_t i = 0; i < n; i++)
    if (body[i] != (unsigned char)(i * 7)) cr_assert_fail("byte %u differs", i);
  free(body);
  fp4idx_frame_reader_free(&r);
}

/* feed in 1-byte pieces of a 100 KB body: amortized growth, exact result,
 * and the buffer never more than twice what arrived (or the floor). */
Test(frame, feed_small_pieces_bounded_buffer) {
  const uint32_t n = 100000;
  unsigned char *s = malloc(4 + n);
  fp4idx_frame_reader_t r;
  size_t used, cap;
  cr_assert_not_null(s);
  fp4idx_frame_header_put(s, n);
  for (uint32_t i = 0; i < n; i++) s[4 + i] = (unsigned char)(i ^ (i >> 8));
  fp4idx_frame_reader_init(&r, 0);
  int rc = 0;
  for (size_t off = 0; off < 4 + (size_t)n; off++) {
    rc = fp4idx_frame_reader_feed(&r, s + off, 1, &used);
    cr_assert_eq(used, 1u);
    fp4idx_frame_reader_capacity(&r, &cap);
    size_t got = off >= 4 ? off - 3 : 0;
    cr_assert_leq(cap, 2 * got > FP4IDX_FRAME_GROW_MIN ? 2 * got : FP4IDX_FRAME_GROW_MIN);
  }
  cr_assert_eq(rc, 1);
  unsigned char *body;
  size_t blen;
  cr_assert_eq(fp4idx_frame_reader_take(&r, &body, &blen), 0);
  cr_assert(blen == n && memcmp(body, s + 4, n) == 0);
  free(body);
  free(s);
  fp4idx_frame_reader_free(&r);
}

/* frame_reader_whole: exactly one whole frame the reader accepts as it is,
 * and only between frames; it changes nothing. */
Test(frame, whole_names_exactly_one_whole_frame_between_frames) {
  unsigned char s[400];
  size_t n = make_stream(s); /* frames of 5, 0 and 300 bytes */
  fp4idx_frame_reader_t r;
  cr_assert_eq(fp4idx_frame_reader_init(&r, 1000), 0);
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s, 9), 5);       /* the first frame */
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s + 9, 4), 0);   /* the empty one */
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s + 13, 304), 300);
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s, 8), -1);      /* short of its end */
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s, 10), -1);     /* the next frame begins */
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s, n), -1);
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s, 3), -1);      /* no whole header */
  cr_assert_eq(fp4idx_frame_reader_whole(NULL, s, 9), -1);
  cr_assert_eq(fp4idx_frame_reader_whole(&r, NULL, 9), -1);
  /* over max_frame: left to feed, which says E2BIG */
  fp4idx_frame_reader_t small;
  cr_assert_eq(fp4idx_frame_reader_init(&small, 299), 0);
  cr_assert_eq(fp4idx_frame_reader_whole(&small, s + 13, 304), -1);
  size_t used;
  cr_assert_eq(fp4idx_frame_reader_feed(&small, s + 13, 304, &used), FP4IDX_E2BIG);
  /* inside a frame: the reader's bytes come first */
  cr_assert_eq(fp4idx_frame_reader_feed(&r, s, 2, &used), 0);
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s + 9, 4), -1);
  cr_assert_eq(fp4idx_frame_reader_feed(&r, s + 2, 7, &used), 1);
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s + 9, 4), -1); /* a frame not taken */
  unsigned char *body;
  size_t blen;
  cr_assert_eq(fp4idx_frame_reader_take(&r, &body, &blen), 0);
  cr_assert_eq(blen, 5u);
  free(body);
  cr_assert_eq(fp4idx_frame_reader_whole(&r, s + 9, 4), 0); /* between frames again */
  fp4idx_frame_reader_free(&r);
  fp4idx_frame_reader_free(&small);
}
