/* test_protocol_util.h -- helpers for the protocol tests.
 *
 * mp_build(): a tiny text notation for msgpack, so that each malformed-input
 * case of the rejection table is one readable line:
 *   {k: v, 'k': v}     map (bare or quoted keys, always packed as str)
 *   [v, v]             array
 *   12  -3  1.5        positive int (smallest encoding), negative int, float64
 *   u8(7) u16(7) u32(7) u64(7) i8(7) i16(7) i32(7) i64(7) f32(1.5)
 *                      fixed-width encodings (msgpack_pack_fix_*)
 *   'text'             str          nil true false
 *   bin(N)             bin of N bytes (pattern)
 *   T(dtype, [d0,..])  tensor map {dtype, shape, data} with exactly the bytes
 *                      the shape needs; T(dtype, [..], +k) / (.., -k) gives
 *                      k bytes more / fewer; T(dtype, [..], s) sends data as
 *                      str instead of bin.
 *   rawkey(N)          a map key that is the positive int N (not a str)
 * Spaces are ignored. mp_build aborts the test on a syntax error.
 */
#ifndef FP4IDX_TEST_PROTOCOL_UTIL_H
#define FP4IDX_TEST_PROTOCOL_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "fp4idx_codec.h"

/* Packs `text` into sb (body only, no frame header). Returns 0 or -1. */
int mp_build(msgpack_sbuffer *sb, const char *text);

/* Same, into a fresh malloc'd buffer: *out, *len. */
int mp_build_alloc(const char *text, unsigned char **out, size_t *len);

/* Fills `n` bytes at p with a deterministic pattern from `seed`. */
void fill_pattern(void *p, size_t n, unsigned seed);

/* The example conversation of PROTOCOL.md ("Transcript"), built with the
 * real encoders: each message one whole frame (header + body). */
typedef struct transcript_msg_s {
  int from_client;     /* 1: client -> daemon, 0: daemon -> client */
  char title[128];     /* e.g. "hello (id 1)" */
  msgpack_sbuffer sb;  /* the frame */
} transcript_msg_t;

#define TRANSCRIPT_MAX 24

/* Builds the transcript into msgs[0..cap); returns the count or -1. */
int transcript_build(transcript_msg_t *msgs, int cap);
void transcript_free(transcript_msg_t *msgs, int n);

/* Formats a frame as the hex dump used in PROTOCOL.md: 16 bytes a line,
 * "xx xx ..." with no offsets, into a malloc'd string. */
char *hex_dump(const void *p, size_t n);

#endif
