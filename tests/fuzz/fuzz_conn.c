/* fuzz_conn.c -- a connection fuzzer for a running fp4idxd.
 *
 * Drives real connections to the daemon's Unix socket: N fuzz connections
 * (poll(), non-blocking) each do random actions -- valid requests of every
 * op, pipelined bursts, mutated bytes inside well-framed requests, junk
 * bodies, length lies (a header larger or smaller than the body, 0,
 * 0xFFFFFFFF, just over or exactly max_frame, random), often in the same
 * write as valid frames before and after them, frames trickled a few bytes
 * at a time, truncated frames followed by close, shutdown(SHUT_WR)
 * half-closes, resets (SO_LINGER 0), closes with requests in flight,
 * connections that stop reading for a while -- and reconnect.
 *
 * Beside them one canary connection appends a known sequence at start and
 * then keeps scoring it (full logits and top-k) and reading it back: every
 * reply must be byte-identical to the first one of its kind, status 0, and
 * arrive within --canary-timeout seconds. A canary mismatch or timeout, a
 * lost canary connection, a refused connect (the daemon is gone), a reply
 * that is not a map frame or carries EINTERNAL, is a finding: the fuzzer
 * prints "fuzz_conn: FINDING: ..." and exits 1. The daemon's own sanitizer
 * report is for the driver (tests/fuzz/conn_run.sh) to collect.
 *
 *   fuzz_conn --socket PATH [--seconds S] [--seed N] [--conns N]
 *             [--mode mixed|lies] [--max-actions N] [--canary-timeout S]
 *
 * The seed (printed at start) fixes every random choice; the interleaving
 * with the daemon (which bytes one read of the daemon gets) still depends
 * on timing, so a replay with --seed takes the same actions but may cut
 * the stream differently. Only the given local socket is ever touched, and
 * the run is bounded by --seconds and --max-actions.
 *
 * Plain libc (C11 + POSIX): it writes its msgpack by hand, so it shares no
 * code with the daemon's codec and cannot share its bugs. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

/* ---- options and counters ----------------------------------------------- */

static const char *opt_socket;
static double opt_seconds = 60;
static uint64_t opt_seed;
static int opt_conns = 32;
static int opt_lies_mode;            /* --mode lies: length lies dominate */
static uint64_t opt_max_actions;     /* 0: bounded by time only */
static double opt_canary_timeout = 10;
static double opt_stall = 20;        /* --stall-timeout */
static uint32_t max_frame = 64u << 20; /* from info at start */

static struct {
  uint64_t actions, frames, valid, bursts, mutated, junk, lies, truncs, closes, resets,
      halfcloses, halfclose_slow, pauses, trickles, opened, refused_conn, replies,
      reply_ok, reply_err, eof, econnreset, bytes_out, bytes_in;
  uint64_t canary_checks;
  double canary_max_s;
} st;

static double t_start;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("fuzz_conn: ");
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
}

static void finding(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("fuzz_conn: FINDING at %.1f s (seed %" PRIu64 "): ", now_s() - t_start, opt_seed);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  exit(1);
}

/* ---- PRNG: xoshiro256**, seeded through splitmix64 ----------------------- */

static uint64_t rs[4];

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t rnd(void) {
  uint64_t r = ((rs[1] * 5) << 7 | (rs[1] * 5) >> 57) * 9;
  uint64_t t = rs[1] << 17;
  rs[2] ^= rs[0];
  rs[3] ^= rs[1];
  rs[1] ^= rs[2];
  rs[0] ^= rs[3];
  rs[2] ^= t;
  rs[3] = rs[3] << 45 | rs[3] >> 19;
  return r;
}

/* uniform in [0, n) (n >= 1; the tiny modulo bias does not matter here) */
static uint64_t rn(uint64_t n) { return n ? rnd() % n : 0; }
static int chance(int pct) { return (int)rn(100) < pct; }

/* ---- growable byte buffer and a hand-written msgpack encoder ----------- */

typedef struct {
  unsigned char *p;
  size_t len, cap;
} buf_t;

static void b_put(buf_t *b, const void *src, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
      fprintf(stderr, "fuzz_conn: out of memory\n");
      exit(2);
    }
    b->p = p;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, src, n);
  b->len += n;
}

static void b_u8(buf_t *b, unsigned v) {
  unsigned char c = (unsigned char)v;
  b_put(b, &c, 1);
}

static void b_be(buf_t *b, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; i--) b_u8(b, (unsigned)(v >> (8 * i)) & 0xff);
}

static void b_free(buf_t *b) {
  free(b->p);
  *b = (buf_t){0};
}

static void mp_uint(buf_t *b, uint64_t v) {
  if (v < 128) b_u8(b, (unsigned)v);
  else if (v < 256) b_u8(b, 0xcc), b_be(b, v, 1);
  else if (v < 65536) b_u8(b, 0xcd), b_be(b, v, 2);
  else if (v <= UINT32_MAX) b_u8(b, 0xce), b_be(b, v, 4);
  else b_u8(b, 0xcf), b_be(b, v, 8);
}

static void mp_int(buf_t *b, int64_t v) {
  if (v >= 0) mp_uint(b, (uint64_t)v);
  else if (v >= -32) b_u8(b, (unsigned)(v & 0xff));
  else if (v >= -128) b_u8(b, 0xd0), b_be(b, (uint64_t)v, 1);
  else if (v >= -32768) b_u8(b, 0xd1), b_be(b, (uint64_t)v, 2);
  else if (v >= INT32_MIN) b_u8(b, 0xd2), b_be(b, (uint64_t)v, 4);
  else b_u8(b, 0xd3), b_be(b, (uint64_t)v, 8);
}

static void mp_hdr(buf_t *b, size_t n, unsigned fix, size_t fixmax, unsigned c8, unsigned c16,
                   unsigned c32) {
  if (n <= fixmax) b_u8(b, fix | (unsigned)n);
  else if (c8 && n < 256) b_u8(b, c8), b_be(b, n, 1);
  else if (n < 65536) b_u8(b, c16), b_be(b, n, 2);
  else b_u8(b, c32), b_be(b, n, 4);
}

static void mp_map(buf_t *b, size_t n) { mp_hdr(b, n, 0x80, 15, 0, 0xde, 0xdf); }
static void mp_arr(buf_t *b, size_t n) { mp_hdr(b, n, 0x90, 15, 0, 0xdc, 0xdd); }
static void mp_strn(buf_t *b, const char *s, size_t n) {
  mp_hdr(b, n, 0xa0, 31, 0xd9, 0xda, 0xdb);
  b_put(b, s, n);
}
static void mp_str(buf_t *b, const char *s) { mp_strn(b, s, strlen(s)); }
static void mp_bin(buf_t *b, const void *p, size_t n) {
  if (n < 256) b_u8(b, 0xc4), b_be(b, n, 1);
  else if (n < 65536) b_u8(b, 0xc5), b_be(b, n, 2);
  else b_u8(b, 0xc6), b_be(b, n, 4);
  b_put(b, p, n);
}
static void mp_bool(buf_t *b, int v) { b_u8(b, v ? 0xc3 : 0xc2); }
static void mp_kv_uint(buf_t *b, const char *k, uint64_t v) { mp_str(b, k), mp_uint(b, v); }

/* A tensor {"dtype","shape","data"} of `nd` dims; data filled by the caller's
 * bytes. */
static void mp_tensor(buf_t *b, const char *dtype, const uint64_t *shape, int nd,
                      const void *data, size_t len) {
  mp_map(b, 3);
  mp_str(b, "dtype"), mp_str(b, dtype);
  mp_str(b, "shape"), mp_arr(b, (size_t)nd);
  for (int i = 0; i < nd; i++) mp_uint(b, shape[i]);
  mp_str(b, "data"), mp_bin(b, data, len);
}

/* ---- a small msgpack reader (replies) ----------------------------------- */

/* Skips one object; NULL when malformed, truncated or nested over 16. */
static const unsigned char *mp_skip(const unsigned char *p, const unsigned char *e, int depth) {
  if (p >= e || depth > 16) return NULL;
  unsigned c = *p++;
  uint64_t n = 0, items = 0;
#define NEED(k) do { if ((size_t)(e - p) < (size_t)(k)) return NULL; } while (0)
#define BE(k) do { NEED(k); n = 0; for (int i_ = 0; i_ < (k); i_++) n = n << 8 | *p++; } while (0)
  if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) return p;
  if ((c & 0xf0) == 0x80) { items = 2 * (uint64_t)(c & 0x0f); goto items; }
  if ((c & 0xf0) == 0x90) { items = c & 0x0f; goto items; }
  if ((c & 0xe0) == 0xa0) { n = c & 0x1f; goto bytes; }
  switch (c) {
  case 0xc4: case 0xd9: BE(1); goto bytes;
  case 0xc5: case 0xda: BE(2); goto bytes;
  case 0xc6: case 0xdb: BE(4); goto bytes;
  case 0xcc: case 0xd0: n = 1; goto bytes;
  case 0xcd: case 0xd1: n = 2; goto bytes;
  case 0xca: case 0xce: case 0xd2: n = 4; goto bytes;
  case 0xcb: case 0xcf: case 0xd3: n = 8; goto bytes;
  case 0xd4: n = 2; goto bytes;
  case 0xd5: n = 3; goto bytes;
  case 0xd6: n = 5; goto bytes;
  case 0xd7: n = 9; goto bytes;
  case 0xd8: n = 17; goto bytes;
  case 0xc7: BE(1); n += 1; goto bytes;
  case 0xc8: BE(2); n += 1; goto bytes;
  case 0xc9: BE(4); n += 1; goto bytes;
  case 0xdc: BE(2); items = n; goto items;
  case 0xdd: BE(4); items = n; goto items;
  case 0xde: BE(2); items = 2 * n; goto items;
  case 0xdf: BE(4); items = 2 * n; goto items;
  default: return NULL; /* 0xc1 */
  }
bytes:
  NEED(n);
  return p + n;
items:
  while (items--) {
    p = mp_skip(p, e, depth + 1);
    if (!p) return NULL;
  }
  return p;
#undef BE
#undef NEED
}

/* Reads an integer object at p (any encoding); 0 on success. */
static int mp_read_int(const unsigned char *p, const unsigned char *e, int64_t *out) {
  if (p >= e) return -1;
  unsigned c = *p++;
  int k;
  int sign;
  if (c <= 0x7f) return *out = c, 0;
  if (c >= 0xe0) return *out = (int8_t)c, 0;
  switch (c) {
  case 0xcc: k = 1, sign = 0; break;
  case 0xcd: k = 2, sign = 0; break;
  case 0xce: k = 4, sign = 0; break;
  case 0xcf: k = 8, sign = 0; break;
  case 0xd0: k = 1, sign = 1; break;
  case 0xd1: k = 2, sign = 1; break;
  case 0xd2: k = 4, sign = 1; break;
  case 0xd3: k = 8, sign = 1; break;
  default: return -1;
  }
  if (e - p < k) return -1;
  uint64_t v = 0;
  for (int i = 0; i < k; i++) v = v << 8 | p[i];
  if (sign && k < 8 && (v >> (8 * k - 1)) & 1) v |= ~0ull << (8 * k);
  *out = (int64_t)v;
  return 0;
}

/* The `status` of a reply body: 0 on success (*status set), -1 when the
 * body is not one map with an integer status filling it exactly. */
static int reply_status(const unsigned char *p, size_t len, int64_t *status) {
  const unsigned char *e = p + len, *end = mp_skip(p, e, 0);
  if (!end || end != e) return -1;
  uint64_t n;
  unsigned c = *p++;
  if ((c & 0xf0) == 0x80) n = c & 0x0f;
  else if (c == 0xde) n = (uint64_t)p[0] << 8 | p[1], p += 2;
  else if (c == 0xdf)
    n = (uint64_t)p[0] << 24 | (uint64_t)p[1] << 16 | (uint64_t)p[2] << 8 | p[3], p += 4;
  else return -1;
  int found = 0;
  while (n--) {
    const unsigned char *v = mp_skip(p, e, 1);
    if (!v) return -1;
    if (v - p == 7 && memcmp(p, "\xa6status", 7) == 0) {
      if (mp_read_int(v, e, status)) return -1;
      found = 1;
    }
    p = mp_skip(v, e, 1);
    if (!p) return -1;
  }
  return found ? 0 : -1;
}

/* ---- request generators ------------------------------------------------- */

#define NSEQ 48                   /* fuzz sequences are 1..NSEQ */
#define SEQ_SOFT_MAX 3000         /* past this many keys a sequence is cut */
#define CANARY_SEQ 0xC4A2A7C4A2A70001ull
static uint64_t est_len[NSEQ + 1]; /* what the fuzzer believes; races make it a guess */

static uint64_t pick_seq(void) {
  if (chance(3)) return rnd();           /* almost surely unknown */
  return 1 + rn(NSEQ);
}

static uint64_t est_of(uint64_t seq) { return seq >= 1 && seq <= NSEQ ? est_len[seq] : 0; }
static void est_set(uint64_t seq, uint64_t v) { if (seq >= 1 && seq <= NSEQ) est_len[seq] = v; }

/* A bf16 with a small dyadic value (exact in FP4 after scaling), or, rarely,
 * NaN / inf. */
static uint16_t rand_bf16(int nonfinite_pct) {
  if (nonfinite_pct && chance(nonfinite_pct)) return chance(50) ? 0x7fc0 : 0xff80;
  float f = (float)((int)rn(17) - 8) / 8.0f;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

static unsigned char *rand_bytes_bf16(size_t count, int nonfinite_pct) {
  unsigned char *d = malloc(count * 2 + 1);
  if (!d) exit(2);
  for (size_t i = 0; i < count; i++) {
    uint16_t v = rand_bf16(i == 0 ? nonfinite_pct : 0);
    d[2 * i] = (unsigned char)(v & 0xff);
    d[2 * i + 1] = (unsigned char)(v >> 8);
  }
  return d;
}

static void gen_append(buf_t *b, uint64_t id) {
  uint64_t seq = pick_seq();
  uint64_t n = chance(90) ? 1 + rn(32) : 1 + rn(600);
  if (est_of(seq) > SEQ_SOFT_MAX) n = 1;
  int kind = (int)rn(3);
  if (rn(1000) < 5) n = 4000 + rn(12000), kind = 2; /* fills the pool: EFULL, copy-on-write */
  int rounding = chance(30);
  mp_map(b, 4 + (size_t)rounding);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "append");
  mp_kv_uint(b, "seq", seq);
  mp_str(b, "keys");
  if (kind == 0) { /* bf16 [n,128] */
    unsigned char *d = rand_bytes_bf16(n * 128, 2);
    mp_tensor(b, "bf16", (uint64_t[]){n, 128}, 2, d, n * 256);
    free(d);
  } else if (kind == 1) { /* f32 [n,128] */
    unsigned char *d = malloc(n * 512);
    if (!d) exit(2);
    for (uint64_t i = 0; i < n * 128; i++) {
      float f = (float)((int)rn(33) - 16) / 4.0f;
      if (i == 0 && chance(2)) f = (float)NAN;
      memcpy(d + 4 * i, &f, 4);
    }
    mp_tensor(b, "f32", (uint64_t[]){n, 128}, 2, d, n * 512);
    free(d);
  } else { /* packed u8 [n,68] */
    unsigned char *d = malloc(n * 68);
    if (!d) exit(2);
    for (uint64_t i = 0; i < n * 68; i++) d[i] = (unsigned char)rnd();
    for (uint64_t k = 0; k < n; k++)
      for (int j = 0; j < 4; j++) d[k * 68 + 64 + j] = (unsigned char)(110 + rn(30));
    if (chance(2)) d[64] = chance(50) ? 0 : 255;
    mp_tensor(b, "u8", (uint64_t[]){n, 68}, 2, d, n * 68);
    free(d);
  }
  if (rounding) mp_str(b, "rounding"), mp_str(b, chance(50) ? "rne" : "threshold");
  est_set(seq, est_of(seq) + n);
}

static void gen_score(buf_t *b, uint64_t id) {
  static const uint64_t heads_choice[] = {1, 1, 2, 4, 4, 8, 16};
  uint64_t H = chance(1) ? 128 : heads_choice[rn(sizeof heads_choice / sizeof heads_choice[0])];
  int topk = chance(50);
  uint64_t k = chance(2) ? 2000000 : 1 + rn(64);
  size_t nent = chance(80) ? 1 : 2 + rn(3);
  uint64_t seqs[4];
  for (size_t e = 0; e < nent; e++) {
    seqs[e] = pick_seq();
    if (est_of(seqs[e]) > SEQ_SOFT_MAX && H > 8) H = 8; /* keeps long scores short */
  }
  mp_map(b, 4 + (size_t)topk);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "score");
  mp_kv_uint(b, "heads", H);
  if (topk) mp_kv_uint(b, "topk", k);
  mp_str(b, "seqs"), mp_arr(b, nent);
  for (size_t e = 0; e < nent; e++) {
    uint64_t seq = seqs[e];
    uint64_t L = est_of(seq);
    uint64_t R = H >= 16 || L > SEQ_SOFT_MAX ? 1 : 1 + rn(3);
    int lens = chance(40), mask = chance(15);
    mp_map(b, 3 + (size_t)lens + (size_t)mask);
    mp_kv_uint(b, "seq", seq);
    unsigned char *q = rand_bytes_bf16(R * H * 128, 1);
    mp_str(b, "q"), mp_tensor(b, "bf16", (uint64_t[]){R, H, 128}, 3, q, R * H * 256);
    free(q);
    unsigned char *w = rand_bytes_bf16(R * H, 1);
    mp_str(b, "w"), mp_tensor(b, "bf16", (uint64_t[]){R, H}, 2, w, R * H * 2);
    free(w);
    uint64_t W = L;
    if (lens) {
      unsigned char d[16];
      uint64_t mx = 0;
      for (uint64_t r = 0; r < R; r++) {
        int32_t v = (int32_t)(chance(3) ? (int64_t)L + 1 - (int64_t)rn(3) * (int64_t)(L + 2)
                                        : (int64_t)rn(L + 1));
        if (v > 0 && (uint64_t)v > mx) mx = (uint64_t)v;
        memcpy(d + 4 * r, &v, 4);
      }
      W = mx;
      mp_str(b, "lens"), mp_tensor(b, "i32", (uint64_t[]){R}, 1, d, R * 4);
    }
    if (mask) {
      if (chance(5)) W += 1;
      unsigned char *m = malloc(R * W + 1);
      if (!m) exit(2);
      for (uint64_t i = 0; i < R * W; i++) m[i] = (unsigned char)(chance(70));
      mp_str(b, "mask"), mp_tensor(b, "u8", (uint64_t[]){R, W}, 2, m, R * W);
      free(m);
    }
  }
}

static void gen_read(buf_t *b, uint64_t id) {
  uint64_t seq = pick_seq(), L = est_of(seq);
  int from = chance(50), count = chance(50), dq = chance(40);
  uint64_t f = chance(5) ? L + 1 : rn(L + 1);
  uint64_t n = chance(5) ? L + 5 : rn(L + 1 - (from && f <= L ? f : 0));
  mp_map(b, 3 + (size_t)from + (size_t)count + (size_t)dq);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "read");
  mp_kv_uint(b, "seq", seq);
  if (from) mp_kv_uint(b, "from", f);
  if (count) mp_kv_uint(b, "count", n);
  if (dq) mp_str(b, "dequant"), mp_bool(b, chance(50));
}

static void gen_truncate(buf_t *b, uint64_t id) {
  uint64_t seq = pick_seq(), L = est_of(seq);
  uint64_t n = chance(5) ? L + 1 + rn(4) : rn(L + 1);
  mp_map(b, 4);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "truncate");
  mp_kv_uint(b, "seq", seq);
  mp_kv_uint(b, "length", n);
  if (n <= L) est_set(seq, n);
}

static void gen_drop(buf_t *b, uint64_t id) {
  uint64_t seq = pick_seq();
  mp_map(b, 3);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "drop");
  mp_kv_uint(b, "seq", seq);
  est_set(seq, 0);
}

static void gen_fork(buf_t *b, uint64_t id) {
  uint64_t src = pick_seq(), dst = chance(10) ? src : 1 + rn(NSEQ), L = est_of(src);
  uint64_t n = chance(5) ? L + 1 : rn(L + 1);
  mp_map(b, 5);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "fork");
  mp_kv_uint(b, "src", src);
  mp_kv_uint(b, "dst", dst);
  mp_kv_uint(b, "length", n);
  if (est_of(dst) == 0 && n <= L) est_set(dst, n);
}

static void gen_list(buf_t *b, uint64_t id) {
  int cur = chance(50), cnt = chance(70);
  mp_map(b, 2 + (size_t)cur + (size_t)cnt);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "list");
  if (cur) mp_kv_uint(b, "cursor", chance(50) ? 0 : rnd() >> rn(64));
  if (cnt) mp_kv_uint(b, "count", chance(3) ? (chance(50) ? 0 : 10001) : 1 + rn(100));
}

static void gen_hello(buf_t *b, uint64_t id) {
  int client = chance(60);
  mp_map(b, 3 + (size_t)client);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "hello");
  mp_str(b, "version");
  if (chance(90)) mp_uint(b, 1);
  else mp_int(b, (int64_t)rn(4) - 2); /* 2, 3: EVERSION; negative: EPROTO */
  if (client) {
    char name[300];
    size_t n = chance(5) ? 257 : rn(40);
    memset(name, 'f', n);
    mp_str(b, "client"), mp_strn(b, name, n);
  }
}

static void gen_plain(buf_t *b, uint64_t id, const char *op) {
  mp_map(b, 2);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, op);
}

static void gen_region_op(buf_t *b, uint64_t id) {
  if (chance(50)) { /* unregister of a region never registered: ENOREGION */
    mp_map(b, 3);
    mp_kv_uint(b, "id", id);
    mp_str(b, "op"), mp_str(b, "unregister");
    mp_kv_uint(b, "region", rn(4));
  } else { /* register without its fd: EREGION (or EPROTO for size 0) */
    mp_map(b, 4);
    mp_kv_uint(b, "id", id);
    mp_str(b, "op"), mp_str(b, "register");
    mp_str(b, "kind"), mp_str(b, chance(80) ? "host" : "cuda");
    mp_kv_uint(b, "size", rn(3) * 4096);
  }
}

/* channel_open without the control block's fd (the fuzzer passes none): a
 * refusal (ENOREGION for regions it never registered, EREGION for the
 * missing fd or a short size, ESHAPE for slots out of range), or
 * channel_close of a channel never opened (ENOREGION). */
static void gen_channel_op(buf_t *b, uint64_t id) {
  if (chance(50)) {
    mp_map(b, 3);
    mp_kv_uint(b, "id", id);
    mp_str(b, "op"), mp_str(b, "channel_close");
    mp_kv_uint(b, "channel", rn(3));
    return;
  }
  int lens = chance(50);
  mp_map(b, 7 + lens);
  mp_kv_uint(b, "id", id);
  mp_str(b, "op"), mp_str(b, "channel_open");
  mp_kv_uint(b, "slots", chance(10) ? 2000 : rn(9));
  mp_kv_uint(b, "size", chance(50) ? 64 + 128 * rn(9) : rn(4) * 4096);
  mp_kv_uint(b, "q_region", rn(3));
  mp_kv_uint(b, "w_region", rn(3));
  mp_kv_uint(b, "out_region", rn(3));
  if (lens) mp_kv_uint(b, "lens_region", rn(3));
}

/* One valid request body (valid msgpack; the daemon may still refuse it). */
static void gen_request(buf_t *b, uint64_t id) {
  switch (rn(20)) {
  case 0: gen_hello(b, id); break;
  case 1: gen_plain(b, id, "info"); break;
  case 2: gen_plain(b, id, "stats"); break;
  case 3: case 4: case 5: case 6: gen_append(b, id); break;
  case 7: case 8: case 9: case 10: gen_score(b, id); break;
  case 11: case 12: gen_read(b, id); break;
  case 13: gen_truncate(b, id); break;
  case 14: gen_drop(b, id); break;
  case 15: gen_fork(b, id); break;
  case 16: gen_list(b, id); break;
  case 17: gen_plain(b, id, chance(50) ? "save" : "frobnicate"); break;
  case 18: gen_region_op(b, id); break;
  case 19: gen_channel_op(b, id); break;
  default: gen_plain(b, id, "info"); break;
  }
}

static void put_header(buf_t *b, uint32_t n) { b_be(b, n, 4); }

static void put_frame(buf_t *out, const buf_t *body) {
  put_header(out, (uint32_t)body->len);
  b_put(out, body->p, body->len);
}

/* ---- mutations ------------------------------------------------------------ */

static const unsigned char interesting[] = {0x00, 0x01, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0,
                                            0xbf, 0xc0, 0xc1, 0xc2, 0xc4, 0xc5, 0xc6, 0xc7,
                                            0xca, 0xcb, 0xcc, 0xcf, 0xd3, 0xd9, 0xda, 0xdb,
                                            0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff};

static void mutate(buf_t *b) {
  int rounds = 1 + (int)rn(4);
  for (int i = 0; i < rounds && b->len > 0; i++) {
    size_t at = rn(b->len);
    switch (rn(8)) {
    case 0: b->p[at] ^= (unsigned char)(1u << rn(8)); break;
    case 1: b->p[at] = interesting[rn(sizeof interesting)]; break;
    case 2: b->p[at] = (unsigned char)rnd(); break;
    case 3: b->len = at; break; /* cut short */
    case 4: { /* trailing bytes */
      size_t n = 1 + rn(8);
      for (size_t k = 0; k < n; k++) b_u8(b, (unsigned)rnd());
      break;
    }
    case 5: { /* a large 16/32-bit big-endian number over 4 bytes */
      static const uint32_t big[] = {0xffffffffu, 0x7fffffffu, 0x80000000u, 0x0000ffffu,
                                     0x00010000u, 0x04000001u};
      uint32_t v = big[rn(sizeof big / sizeof big[0])];
      for (int k = 0; k < 4 && at + (size_t)k < b->len; k++)
        b->p[at + (size_t)k] = (unsigned char)(v >> (24 - 8 * k));
      break;
    }
    case 6: { /* insert a byte */
      b_u8(b, 0);
      memmove(b->p + at + 1, b->p + at, b->len - at - 1);
      b->p[at] = interesting[rn(sizeof interesting)];
      break;
    }
    default: { /* delete a run */
      size_t n = 1 + rn(b->len - at);
      memmove(b->p + at, b->p + at + n, b->len - at - n);
      b->len -= n;
      break;
    }
    }
  }
}

/* ---- connections ---------------------------------------------------------- */

enum { AFTER_NONE, AFTER_CLOSE, AFTER_RST, AFTER_SHUTWR };

typedef struct {
  int fd;
  buf_t out;
  size_t out_off;
  unsigned char hdr[4];
  size_t hdr_have;
  uint64_t body_left, body_len;
  unsigned char body_first; /* first byte of the reply body being read */
  buf_t body;               /* the body (up to 64 KiB is kept) for the status */
  double pause_until;       /* not reading until then */
  double next_action;       /* idle until then */
  double close_at;          /* forced close (after a lie, a half-close) */
  int trickle;              /* send 1..7 bytes per turn */
  int after;                /* what to do once `out` is sent */
  int shut;                 /* SHUT_WR done, reading until end of stream */
  uint64_t next_id;
} conn_t;

static conn_t *conns;

static int connect_unix(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    perror("fuzz_conn: socket");
    exit(2);
  }
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", opt_socket);
  /* Blocking connect: a full backlog waits instead of failing with EAGAIN. */
  while (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    if (errno == EINTR) continue;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static void conn_reset_state(conn_t *c) {
  buf_t out = c->out, body = c->body;
  out.len = 0;
  body.len = 0;
  *c = (conn_t){.fd = -1, .out = out, .body = body, .next_id = 1 + rn(1000)};
}

static void conn_close(conn_t *c, int rst) {
  if (c->fd >= 0) {
    if (rst) {
      struct linger l = {.l_onoff = 1, .l_linger = 0};
      setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    close(c->fd);
  }
  conn_reset_state(c);
}

static void conn_open(conn_t *c) {
  int fd = connect_unix();
  if (fd < 0) {
    st.refused_conn++;
    finding("connect(%s): %s: the daemon no longer accepts connections", opt_socket,
            strerror(errno));
  }
  set_nonblock(fd);
  conn_reset_state(c);
  c->fd = fd;
  st.opened++;
}

/* A complete reply frame on a fuzz connection. */
static void conn_reply(conn_t *c) {
  st.replies++;
  int is_map = (c->body_first >= 0x80 && c->body_first <= 0x8f) || c->body_first == 0xde ||
               c->body_first == 0xdf;
  if (c->body_len == 0 || !is_map)
    finding("a reply that is not a map: %" PRIu64 " bytes, first byte 0x%02x", c->body_len,
            c->body_first);
  if (c->body_len == c->body.len) {
    int64_t status;
    if (reply_status(c->body.p, c->body.len, &status))
      finding("a reply body that is not one map with a status (%zu bytes)", c->body.len);
    if (status == 0) st.reply_ok++;
    else st.reply_err++;
    if (status == -20) finding("an EINTERNAL reply (a daemon bug by its own account)");
  }
}

static void conn_on_bytes(conn_t *c, const unsigned char *p, size_t n) {
  while (n > 0) {
    if (c->hdr_have < 4) {
      size_t k = 4 - c->hdr_have < n ? 4 - c->hdr_have : n;
      memcpy(c->hdr + c->hdr_have, p, k);
      c->hdr_have += k, p += k, n -= k;
      if (c->hdr_have == 4) {
        c->body_len = c->body_left = (uint64_t)c->hdr[0] << 24 | (uint64_t)c->hdr[1] << 16 |
                                     (uint64_t)c->hdr[2] << 8 | c->hdr[3];
        if (c->body_len > (1ull << 30) + (64u << 10))
          finding("a reply frame of %" PRIu64 " bytes (above 1 GiB + 64 KiB)", c->body_len);
        c->body.len = 0;
        if (c->body_len == 0) {
          conn_reply(c);
          c->hdr_have = 0;
        }
      }
      continue;
    }
    size_t k = c->body_left < n ? (size_t)c->body_left : n;
    if (c->body_left == c->body_len) c->body_first = p[0];
    if (c->body.len + k <= (64u << 10)) b_put(&c->body, p, k);
    c->body_left -= k, p += k, n -= k;
    if (c->body_left == 0) {
      conn_reply(c);
      c->hdr_have = 0;
    }
  }
}

/* ---- actions ---------------------------------------------------------------- */

static void add_valid(conn_t *c, buf_t *tmp) {
  tmp->len = 0;
  gen_request(tmp, c->next_id++);
  put_frame(&c->out, tmp);
  st.frames++;
}

/* A length lie: a header that does not match what follows. */
static void add_lie(conn_t *c, buf_t *tmp) {
  tmp->len = 0;
  gen_request(tmp, c->next_id++);
  uint32_t h;
  size_t send_body = tmp->len;
  switch (rn(9)) {
  case 0: h = (uint32_t)(tmp->len + 1 + rn(chance(50) ? 8 : 100000)); break; /* larger */
  case 1: h = tmp->len ? (uint32_t)rn(tmp->len) : 0; break;                  /* smaller */
  case 2: h = 0; send_body = chance(50) ? tmp->len : 0; break;
  case 3: h = 0xffffffffu; send_body = rn(3) ? 0 : tmp->len; break;
  case 4: /* just over max_frame */
    h = max_frame + 1 + (uint32_t)rn(chance(50) ? 1 : 4096);
    send_body = rn(tmp->len + 1);
    break;
  case 5: h = max_frame; send_body = rn(tmp->len + 1); break; /* allowed, never completed */
  case 6: h = 0x80000000u + (uint32_t)rn(0x7fffffff); send_body = rn(tmp->len + 1); break;
  case 7: h = (uint32_t)rnd(); send_body = rn(tmp->len + 1); break;
  default: /* a header cut short, then the stream goes on or ends */
    b_put(&c->out, (unsigned char[]){0, 0, 0}, 1 + rn(3));
    st.lies++;
    c->close_at = now_s() + (double)rn(2000) / 1000.0;
    return;
  }
  put_header(&c->out, h);
  b_put(&c->out, tmp->p, send_body);
  st.lies++;
  /* the stream is out of step from here: end it before long */
  c->close_at = now_s() + (double)rn(3000) / 1000.0;
}

static void conn_action(conn_t *c, buf_t *tmp, double now) {
  st.actions++;
  int w_valid = 30, w_burst = 10, w_mut = 12, w_junk = 3, w_lie = 12, w_trunc = 5, w_inflight = 4,
      w_rst = 4, w_half = 4, w_pause = 3, w_trickle = 2, w_idle = 5;
  if (opt_lies_mode) w_lie = 60;
  int total = w_valid + w_burst + w_mut + w_junk + w_lie + w_trunc + w_inflight + w_rst +
              w_half + w_pause + w_trickle + w_idle;
  int r = (int)rn((uint64_t)total);
  if ((r -= w_valid) < 0) {
    add_valid(c, tmp);
    st.valid++;
  } else if ((r -= w_burst) < 0) {
    int n = 2 + (int)rn(40);
    for (int i = 0; i < n; i++) add_valid(c, tmp);
    st.bursts++;
  } else if ((r -= w_mut) < 0) {
    tmp->len = 0;
    gen_request(tmp, c->next_id++);
    mutate(tmp);
    put_frame(&c->out, tmp);
    st.mutated++, st.frames++;
  } else if ((r -= w_junk) < 0) {
    tmp->len = 0;
    size_t n = rn(chance(90) ? 64 : 5000);
    for (size_t i = 0; i < n; i++) b_u8(tmp, (unsigned)rnd());
    if (chance(30) && n > 0) tmp->p[0] = 0x80 | (unsigned char)rn(16);
    put_frame(&c->out, tmp);
    st.junk++, st.frames++;
  } else if ((r -= w_lie) < 0) {
    /* valid frames, the lie and more frames, all in one write when the
     * buffer was empty: the daemon reads them in one go */
    int before = chance(70) ? 1 + (int)rn(3) : 0, after = chance(40) ? 1 + (int)rn(2) : 0;
    for (int i = 0; i < before; i++) add_valid(c, tmp);
    add_lie(c, tmp);
    for (int i = 0; i < after; i++) add_valid(c, tmp);
    if (chance(30)) c->after = chance(50) ? AFTER_CLOSE : AFTER_SHUTWR;
  } else if ((r -= w_trunc) < 0) {
    int before = (int)rn(3);
    for (int i = 0; i < before; i++) add_valid(c, tmp);
    tmp->len = 0;
    gen_request(tmp, c->next_id++);
    size_t keep = rn(tmp->len + 4); /* of header + body */
    buf_t fr = {0};
    put_frame(&fr, tmp);
    b_put(&c->out, fr.p, keep);
    b_free(&fr);
    c->after = chance(70) ? AFTER_CLOSE : chance(50) ? AFTER_RST : AFTER_SHUTWR;
    st.truncs++;
  } else if ((r -= w_inflight) < 0) {
    int n = 1 + (int)rn(20);
    for (int i = 0; i < n; i++) add_valid(c, tmp);
    c->after = AFTER_CLOSE;
  } else if ((r -= w_rst) < 0) {
    int n = (int)rn(10);
    for (int i = 0; i < n; i++) add_valid(c, tmp);
    if (chance(50)) { /* at once, maybe with bytes unsent */
      if (c->out.len > c->out_off)
        (void)!send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
      conn_close(c, 1);
      st.resets++;
    } else {
      c->after = AFTER_RST;
    }
  } else if ((r -= w_half) < 0) {
    int n = (int)rn(8);
    for (int i = 0; i < n; i++) add_valid(c, tmp);
    c->after = AFTER_SHUTWR;
  } else if ((r -= w_pause) < 0) {
    int n = (int)rn(40);
    for (int i = 0; i < n; i++) add_valid(c, tmp);
    c->pause_until = now + (double)rn(chance(80) ? 2000 : 8000) / 1000.0;
    st.pauses++;
  } else if ((r -= w_trickle) < 0) {
    c->trickle = !c->trickle;
    add_valid(c, tmp);
    st.trickles++;
  } else {
    c->next_action = now + (double)rn(200) / 1000.0;
  }
}

/* Sends what `out` holds (a few bytes when trickling); then the `after`
 * action once it is all gone. */
static void conn_write(conn_t *c) {
  while (c->fd >= 0 && c->out_off < c->out.len) {
    size_t n = c->out.len - c->out_off;
    if (c->trickle && n > 7) n = 1 + rn(7);
    ssize_t k = send(c->fd, c->out.p + c->out_off, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      /* the daemon closed it (after a bad frame, the buffer timeout...) */
      if (errno == ECONNRESET) st.econnreset++;
      conn_close(c, 0);
      return;
    }
    st.bytes_out += (uint64_t)k;
    c->out_off += (size_t)k;
    if (c->trickle) break;
  }
  if (c->fd < 0 || c->out_off < c->out.len) return;
  c->out.len = c->out_off = 0;
  switch (c->after) {
  case AFTER_CLOSE: conn_close(c, 0), st.closes++; break;
  case AFTER_RST: conn_close(c, 1), st.resets++; break;
  case AFTER_SHUTWR:
    shutdown(c->fd, SHUT_WR);
    c->after = AFTER_NONE;
    c->shut = 1;
    c->pause_until = 0;
    c->close_at = now_s() + 20; /* every reply and the end of stream by then */
    st.halfcloses++;
    break;
  default: break;
  }
}

static void conn_read(conn_t *c) {
  unsigned char buf[65536];
  for (int rounds = 0; rounds < 8 && c->fd >= 0; rounds++) {
    ssize_t k = recv(c->fd, buf, sizeof buf, 0);
    if (k > 0) {
      st.bytes_in += (uint64_t)k;
      conn_on_bytes(c, buf, (size_t)k);
      continue;
    }
    if (k == 0) {
      st.eof++;
      conn_close(c, 0);
      return;
    }
    if (errno == EAGAIN || errno == EINTR) return;
    if (errno == ECONNRESET) st.econnreset++;
    conn_close(c, 0);
    return;
  }
}

/* ---- the canary ----------------------------------------------------------- */

#define CANARY_KEYS 300
#define CANARY_KINDS 4

static struct {
  int fd;
  buf_t req[CANARY_KINDS]; /* the request frames, fixed */
  buf_t ref[CANARY_KINDS]; /* the first reply of each kind */
  buf_t in;                /* reply bytes being gathered */
  int kind;                /* the kind in flight, -1: none */
  double sent_at, next_at;
  uint64_t n;
} can;

static void canary_frames(void) {
  /* a fixed pseudo-random pattern, independent of the seed */
  uint64_t x = 0x5eed;
  unsigned char q[2 * 2 * 4 * 128], w[2 * 2 * 4];
  for (size_t i = 0; i < sizeof q / 2; i++) {
    float f = (float)((int)(splitmix(&x) % 17) - 8) / 8.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    q[2 * i] = (unsigned char)(u >> 16), q[2 * i + 1] = (unsigned char)(u >> 24);
  }
  for (size_t i = 0; i < sizeof w / 2; i++) w[2 * i] = 0x80, w[2 * i + 1] = 0x3f; /* 1.0 */
  for (int k = 0; k < CANARY_KINDS; k++) {
    buf_t body = {0};
    if (k < 2) { /* score: full logits, then top-16; R 2, H 4 */
      mp_map(&body, 4 + (k == 1));
      mp_kv_uint(&body, "id", 900001 + (uint64_t)k);
      mp_str(&body, "op"), mp_str(&body, "score");
      mp_kv_uint(&body, "heads", 4);
      if (k == 1) mp_kv_uint(&body, "topk", 16);
      mp_str(&body, "seqs"), mp_arr(&body, 1), mp_map(&body, 3);
      mp_kv_uint(&body, "seq", CANARY_SEQ);
      mp_str(&body, "q"), mp_tensor(&body, "bf16", (uint64_t[]){2, 4, 128}, 3, q, sizeof q);
      mp_str(&body, "w"), mp_tensor(&body, "bf16", (uint64_t[]){2, 4}, 2, w, sizeof w);
    } else { /* read: packed, and a dequantized slice */
      mp_map(&body, k == 2 ? 3 : 6);
      mp_kv_uint(&body, "id", 900001 + (uint64_t)k);
      mp_str(&body, "op"), mp_str(&body, "read");
      mp_kv_uint(&body, "seq", CANARY_SEQ);
      if (k == 3) {
        mp_kv_uint(&body, "from", 17);
        mp_kv_uint(&body, "count", 40);
        mp_str(&body, "dequant"), mp_bool(&body, 1);
      }
    }
    put_frame(&can.req[k], &body);
    b_free(&body);
  }
}

/* Sends a whole frame on the (blocking) canary socket and reads one whole
 * reply within the timeout; the reply body is left in can.in. */
static void canary_call(const buf_t *frame, const char *what) {
  double t0 = now_s();
  size_t off = 0;
  while (off < frame->len) {
    ssize_t k = send(can.fd, frame->p + off, frame->len - off, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      finding("canary: send (%s): %s", what, strerror(errno));
    }
    off += (size_t)k;
  }
  can.in.len = 0;
  size_t want = 4;
  while (can.in.len < want) {
    double left = opt_canary_timeout - (now_s() - t0);
    if (left <= 0) finding("canary: no reply to %s within %.0f s", what, opt_canary_timeout);
    struct pollfd p = {.fd = can.fd, .events = POLLIN};
    int r = poll(&p, 1, (int)(left * 1000) + 1);
    if (r <= 0) continue;
    unsigned char buf[65536];
    size_t room = want - can.in.len < sizeof buf ? want - can.in.len : sizeof buf;
    ssize_t k = recv(can.fd, buf, room, 0);
    if (k == 0)
      finding("canary: end of stream waiting for %s (the daemon closed it or died)", what);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      finding("canary: recv (%s): %s", what, strerror(errno));
    }
    b_put(&can.in, buf, (size_t)k);
    if (want == 4 && can.in.len == 4)
      want = 4 + ((size_t)can.in.p[0] << 24 | (size_t)can.in.p[1] << 16 |
                  (size_t)can.in.p[2] << 8 | can.in.p[3]);
  }
  double dt = now_s() - t0;
  if (dt > st.canary_max_s) st.canary_max_s = dt;
}

static void canary_expect_ok(const char *what) {
  int64_t status;
  if (reply_status(can.in.p + 4, can.in.len - 4, &status))
    finding("canary: the %s reply is not a map with a status", what);
  if (status != 0) finding("canary: %s answered status %" PRId64, what, status);
}

static void canary_start(void) {
  can.fd = connect_unix();
  if (can.fd < 0) {
    fprintf(stderr, "fuzz_conn: connect(%s): %s\n", opt_socket, strerror(errno));
    exit(2);
  }
  buf_t body = {0}, fr = {0};
  mp_map(&body, 2);
  mp_kv_uint(&body, "id", 900000);
  mp_str(&body, "op"), mp_str(&body, "info");
  put_frame(&fr, &body);
  canary_call(&fr, "info");
  canary_expect_ok("info");
  /* max_frame, for the lies just above it */
  const unsigned char *p = can.in.p + 4, *e = can.in.p + can.in.len;
  for (const unsigned char *s = p; s + 10 < e; s++)
    if (memcmp(s, "\xa9max_frame", 10) == 0) {
      int64_t v;
      if (mp_read_int(s + 10, e, &v) == 0 && v > 0 && v <= UINT32_MAX) max_frame = (uint32_t)v;
      break;
    }
  /* the known sequence: CANARY_KEYS bf16 keys, a fixed pattern */
  body.len = fr.len = 0;
  uint64_t x = 0xca4a;
  unsigned char *keys = malloc(CANARY_KEYS * 256);
  if (!keys) exit(2);
  for (size_t i = 0; i < CANARY_KEYS * 128; i++) {
    float f = (float)((int)(splitmix(&x) % 33) - 16) / 4.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    keys[2 * i] = (unsigned char)(u >> 16), keys[2 * i + 1] = (unsigned char)(u >> 24);
  }
  mp_map(&body, 4);
  mp_kv_uint(&body, "id", 900000);
  mp_str(&body, "op"), mp_str(&body, "append");
  mp_kv_uint(&body, "seq", CANARY_SEQ);
  mp_str(&body, "keys"), mp_tensor(&body, "bf16", (uint64_t[]){CANARY_KEYS, 128}, 2, keys,
                                   CANARY_KEYS * 256);
  free(keys);
  put_frame(&fr, &body);
  canary_call(&fr, "the canary append");
  canary_expect_ok("the canary append");
  b_free(&body);
  b_free(&fr);
  canary_frames();
  static const char *names[] = {"score", "score topk", "read", "read dequant"};
  for (int k = 0; k < CANARY_KINDS; k++) {
    canary_call(&can.req[k], names[k]);
    canary_expect_ok(names[k]);
    b_put(&can.ref[k], can.in.p, can.in.len);
  }
  can.kind = 0;
  can.next_at = now_s();
}

/* One canary check: the next kind, compared with its first reply. */
static void canary_check(void) {
  static const char *names[] = {"score", "score topk", "read", "read dequant"};
  int k = (int)(can.n++ % CANARY_KINDS);
  canary_call(&can.req[k], names[k]);
  if (can.in.len != can.ref[k].len || memcmp(can.in.p, can.ref[k].p, can.in.len) != 0) {
    int64_t status = 0;
    reply_status(can.in.p + 4, can.in.len - 4, &status);
    finding("canary: the %s reply changed (%zu bytes, status %" PRId64 "; first reply %zu bytes)",
            names[k], can.in.len, status, can.ref[k].len);
  }
  st.canary_checks++;
}

/* ---- main loop -------------------------------------------------------------- */

static void progress(double now, const char *tag) {
  int live = 0;
  for (int i = 0; i < opt_conns; i++) live += conns[i].fd >= 0;
  say("%s t=%.0fs actions=%" PRIu64 " frames=%" PRIu64 " lies=%" PRIu64 " mutated=%" PRIu64
      " junk=%" PRIu64 " truncated=%" PRIu64 " resets=%" PRIu64 " closes=%" PRIu64
      " halfcloses=%" PRIu64 " (%" PRIu64 " without end of stream in 20 s) pauses=%" PRIu64
      " conns=%d opened=%" PRIu64 " replies=%" PRIu64
      " (ok %" PRIu64 ", err %" PRIu64 ") eof=%" PRIu64 " out=%.1fMB in=%.1fMB canary=%" PRIu64
      " checks (max %.3f s)",
      tag, now - t_start, st.actions, st.frames, st.lies, st.mutated, st.junk, st.truncs,
      st.resets, st.closes, st.halfcloses, st.halfclose_slow, st.pauses, live, st.opened,
      st.replies, st.reply_ok,
      st.reply_err, st.eof, (double)st.bytes_out / 1e6, (double)st.bytes_in / 1e6,
      st.canary_checks, st.canary_max_s);
}

/* What each fuzz connection is doing (printed when they all stall). */
static void dump_conns(double now) {
  for (int i = 0; i < opt_conns; i++) {
    const conn_t *c = &conns[i];
    say("  conn %d: fd %d, %zu bytes unsent, after %d, shut %d, trickle %d, paused %.1f s more, "
        "close in %.1f s, reply %zu/4 header bytes, %" PRIu64 " body bytes to come",
        i, c->fd, c->out.len - c->out_off, c->after, c->shut, c->trickle,
        c->pause_until > now ? c->pause_until - now : 0.0,
        c->close_at > 0 ? c->close_at - now : -1.0, c->hdr_have, c->body_left);
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: fuzz_conn --socket PATH [--seconds S] [--seed N] [--conns N]\n"
          "                 [--mode mixed|lies] [--max-actions N] [--canary-timeout S]\n");
  exit(2);
}

int main(int argc, char **argv) {
  int have_seed = 0;
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    if (!strcmp(a, "--socket")) opt_socket = v;
    else if (!strcmp(a, "--seconds")) opt_seconds = atof(v);
    else if (!strcmp(a, "--seed")) opt_seed = strtoull(v, NULL, 0), have_seed = 1;
    else if (!strcmp(a, "--conns")) opt_conns = atoi(v);
    else if (!strcmp(a, "--mode")) {
      if (!strcmp(v, "lies")) opt_lies_mode = 1;
      else if (strcmp(v, "mixed")) usage();
    } else if (!strcmp(a, "--max-actions")) opt_max_actions = strtoull(v, NULL, 0);
    else if (!strcmp(a, "--canary-timeout")) opt_canary_timeout = atof(v);
    else if (!strcmp(a, "--stall-timeout")) opt_stall = atof(v);
    else usage();
  }
  if (!opt_socket || opt_conns < 1 || opt_conns > 512 || opt_seconds <= 0) usage();
  if (!have_seed) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    opt_seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32;
  }
  uint64_t x = opt_seed;
  for (int i = 0; i < 4; i++) rs[i] = splitmix(&x);
  signal(SIGPIPE, SIG_IGN);
  t_start = now_s();
  say("seed %" PRIu64 " (replay: --seed %" PRIu64 "), %d connections, %.0f s, mode %s",
      opt_seed, opt_seed, opt_conns, opt_seconds, opt_lies_mode ? "lies" : "mixed");

  canary_start();
  say("canary: sequence of %d keys appended, max_frame %" PRIu32, CANARY_KEYS, max_frame);

  conns = calloc((size_t)opt_conns, sizeof *conns);
  struct pollfd *pfd = calloc((size_t)opt_conns, sizeof *pfd);
  if (!conns || !pfd) exit(2);
  for (int i = 0; i < opt_conns; i++) conns[i].fd = -1;
  buf_t tmp = {0};
  double end = t_start + opt_seconds, next_progress = t_start + 5, last_move_at = t_start;
  uint64_t last_moved = 0;
  for (;;) {
    double now = now_s();
    if (now >= end || (opt_max_actions && st.actions >= opt_max_actions)) break;
    for (int i = 0; i < opt_conns; i++) {
      conn_t *c = &conns[i];
      if (c->fd < 0) conn_open(c);
      if (c->close_at > 0 && now >= c->close_at) {
        if (c->shut) st.halfclose_slow++;
        conn_close(c, chance(30));
        st.closes++;
        continue;
      }
      if (!c->shut && c->after == AFTER_NONE && now >= c->next_action &&
          c->out.len - c->out_off < (256u << 10))
        conn_action(c, &tmp, now);
      /* a fresh buffer goes out at once (its frames in one write); an
       * `after` with nothing left to send runs now */
      if (c->fd >= 0 && ((c->out.len > c->out_off && c->out_off == 0) ||
                         (c->out.len == c->out_off && c->after != AFTER_NONE)))
        conn_write(c);
    }
    for (int i = 0; i < opt_conns; i++) {
      conn_t *c = &conns[i];
      pfd[i] = (struct pollfd){.fd = c->fd, .events = 0};
      if (c->fd < 0) continue;
      if (now >= c->pause_until) pfd[i].events |= POLLIN;
      if (c->out.len > c->out_off) pfd[i].events |= POLLOUT;
    }
    if (poll(pfd, (nfds_t)opt_conns, 5) < 0 && errno != EINTR) {
      perror("fuzz_conn: poll");
      exit(2);
    }
    now = now_s();
    for (int i = 0; i < opt_conns; i++) {
      conn_t *c = &conns[i];
      if (c->fd < 0 || pfd[i].fd != c->fd) continue;
      short re = pfd[i].revents;
      if (re & POLLOUT) conn_write(c);
      if (c->fd >= 0 && (re & (POLLIN | POLLHUP | POLLERR))) {
        if (now < c->pause_until && !(re & POLLIN)) c->pause_until = 0; /* closed: see it */
        conn_read(c);
      }
    }
    if (now >= can.next_at) {
      canary_check();
      can.next_at = now_s() + 0.05;
    }
    uint64_t moved = st.bytes_out + st.bytes_in + st.actions + st.opened;
    if (moved != last_moved) last_moved = moved, last_move_at = now;
    if (now - last_move_at > opt_stall) {
      progress(now, "stalled:");
      dump_conns(now);
      finding("no fuzz connection sent, received, opened or acted for %.0f s while the canary "
              "is answered: the daemon reads none of them",
              opt_stall);
    }
    if (now >= next_progress) {
      progress(now, "progress");
      next_progress = now + 5;
    }
  }
  /* Stop fuzzing; the canary must still be answered the same, and a new
   * connection must still be served. */
  for (int i = 0; i < opt_conns; i++) conn_close(&conns[i], 0);
  for (int k = 0; k < CANARY_KINDS; k++) canary_check();
  int fd = connect_unix();
  if (fd < 0) finding("connect after the run: %s", strerror(errno));
  close(fd);
  progress(now_s(), "summary:");
  say("done: seed %" PRIu64 ", %.0f s, %" PRIu64 " actions, %" PRIu64 " lies, %" PRIu64
      " canary checks, no finding",
      opt_seed, now_s() - t_start, st.actions, st.lies, st.canary_checks);
  close(can.fd);
  for (int k = 0; k < CANARY_KINDS; k++) b_free(&can.req[k]), b_free(&can.ref[k]);
  b_free(&can.in);
  for (int i = 0; i < opt_conns; i++) b_free(&conns[i].out), b_free(&conns[i].body);
  b_free(&tmp);
  free(conns);
  free(pfd);
  return 0;
}
