/* crc32c.c -- CRC-32C, hardware (SSE4.2, three interleaved streams) with a
 * slice-by-8 table fallback. The interleaving and the "shift by N zero bytes"
 * operator follow Mark Adler's public-domain crc32c.c: three independent CRCs
 * over adjacent blocks hide the 3-cycle latency of the crc32 instruction and
 * are then combined with precomputed zero-shift tables. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82f63b78u /* CRC-32C, reflected */
#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

static uint32_t sw_table[8][256];
static uint32_t long_shift[4][256];
static uint32_t short_shift[4][256];
static int have_hw;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* ---- GF(2) matrices for the zero-shift operators ----------------------- */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1u) sum ^= *mat;
    vec >>= 1;
    mat++;
  }
  return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
  for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* Operator that appends len zero bytes (len a power of two) to a raw CRC. */
static void zeros_op(uint32_t *even, size_t len) {
  uint32_t odd[32];
  uint32_t row = 1;
  odd[0] = POLY; /* one zero bit */
  for (int n = 1; n < 32; n++) {
    odd[n] = row;
    row <<= 1;
  }
  gf2_square(even, odd); /* two zero bits */
  gf2_square(odd, even); /* four zero bits */
  /* The next square gives one zero byte in even, the one after two bytes in
   * odd, and so on while len is shifted down to zero. */
  do {
    gf2_square(even, odd);
    len >>= 1;
    if (len == 0) return;
    gf2_square(odd, even);
    len >>= 1;
  } while (len);
  memcpy(even, odd, sizeof odd);
}

static void zeros_tables(uint32_t zeros[][256], size_t len) {
  uint32_t op[32];
  zeros_op(op, len);
  for (uint32_t n = 0; n < 256; n++) {
    zeros[0][n] = gf2_times(op, n);
    zeros[1][n] = gf2_times(op, n << 8);
    zeros[2][n] = gf2_times(op, n << 16);
    zeros[3][n] = gf2_times(op, n << 24);
  }
}

static uint32_t shift(uint32_t zeros[][256], uint32_t crc) {
  return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^
         zeros[2][(crc >> 16) & 0xff] ^ zeros[3][crc >> 24];
}

static void init(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = (c & 1u) ? (c >> 1) ^ POLY : c >> 1;
    sw_table[0][n] = c;
  }
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = sw_table[0][n];
    for (int k = 1; k < 8; k++) {
      c = sw_table[0][c & 0xff] ^ (c >> 8);
      sw_table[k][n] = c;
    }
  }
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  have_hw = __builtin_cpu_supports("sse4.2");
#endif
  if (have_hw) {
    zeros_tables(long_shift, LONG_BLOCK);
    zeros_tables(short_shift, SHORT_BLOCK);
  }
}

/* ---- software: slice-by-8 ---------------------------------------------- */

static uint32_t sw_raw(uint32_t crc, const unsigned char *p, size_t len) {
  while (len && ((uintptr_t)p & 7u)) {
    crc = sw_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    len--;
  }
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8); /* little-endian host assumed (x86-64, aarch64) */
    w ^= crc;
    crc = sw_table[7][w & 0xff] ^ sw_table[6][(w >> 8) & 0xff] ^
          sw_table[5][(w >> 16) & 0xff] ^ sw_table[4][(w >> 24) & 0xff] ^
          sw_table[3][(w >> 32) & 0xff] ^ sw_table[2][(w >> 40) & 0xff] ^
          sw_table[1][(w >> 48) & 0xff] ^ sw_table[0][w >> 56];
    p += 8;
    len -= 8;
  }
  while (len--) crc = sw_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

uint32_t fp4idx__crc32c_sw(uint32_t crc, const void *buf, size_t len) {
  pthread_once(&init_once, init);
  if (!buf) return crc;
  return ~sw_raw(~crc, buf, len);
}

/* ---- hardware: SSE4.2 crc32, three streams ----------------------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>

/* One round of three interleaved streams over 3 * block bytes: the crc32
 * instruction's latency is hidden by running three independent chains, then
 * the chains are combined with the shift table for `block` bytes. Always
 * inlined, so `block` stays a constant in each caller. */
__attribute__((target("sse4.2"), always_inline)) static inline uint64_t
hw_stripe3(uint64_t crc0, const unsigned char **pnext, size_t *plen, size_t block,
           uint32_t table[][256]) {
  const unsigned char *next = *pnext;
  const unsigned char *end = next + block;
  uint64_t crc1 = 0, crc2 = 0;
  do {
    uint64_t a, b, c;
    memcpy(&a, next, 8);
    memcpy(&b, next + block, 8);
    memcpy(&c, next + 2 * block, 8);
    crc0 = _mm_crc32_u64(crc0, a);
    crc1 = _mm_crc32_u64(crc1, b);
    crc2 = _mm_crc32_u64(crc2, c);
    next += 8;
  } while (next < end);
  crc0 = shift(table, (uint32_t)crc0) ^ crc1;
  crc0 = shift(table, (uint32_t)crc0) ^ crc2;
  *pnext = next + block * 2;
  *plen -= block * 3;
  return crc0;
}

__attribute__((target("sse4.2"))) static uint32_t
hw_raw(uint32_t crc, const unsigned char *next, size_t len) {
  uint64_t crc0 = crc;
  while (len && ((uintptr_t)next & 7u)) {
    crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
    len--;
  }
  while (len >= LONG_BLOCK * 3) crc0 = hw_stripe3(crc0, &next, &len, LONG_BLOCK, long_shift);
  while (len >= SHORT_BLOCK * 3) crc0 = hw_stripe3(crc0, &next, &len, SHORT_BLOCK, short_shift);
  while (len >= 8) {
    uint64_t a;
    memcpy(&a, next, 8);
    crc0 = _mm_crc32_u64(crc0, a);
    next += 8;
    len -= 8;
  }
  while (len--) crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
  return (uint32_t)crc0;
}
#endif

uint32_t fp4idx__crc32c(uint32_t crc, const void *buf, size_t len) {
  pthread_once(&init_once, init);
  if (!buf) return crc;
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_hw) return ~hw_raw(~crc, buf, len);
#endif
  return ~sw_raw(~crc, buf, len);
}

int fp4idx__crc32c_hw(void) {
  pthread_once(&init_once, init);
  return have_hw;
}
