/* test_protocol_fuzz.c -- random mutations of valid frames into the frame
 * reader and both decoders. Must never crash or read out of bounds (the CI
 * sanitizer build runs this under ASan/UBSan; bodies are exact-size heap
 * copies so an overread is caught), and whatever decodes must re-encode and
 * decode to the same thing. FP4IDX_FUZZ_ITERS overrides the iteration count,
 * FP4IDX_FUZZ_SEED the seed. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_codec.h"
#include "test_protocol_util.h"

static uint64_t rng_state;
static uint64_t rnd(void) {
  /* xorshift64*: deterministic for a given seed */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}
static size_t rndn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
#define FNV_V(h, v) fnv((h), &(v), sizeof(v))

static uint64_t tensor_digest(uint64_t h, const fp4idx_tensor_t *t) {
  h = FNV_V(h, t->dtype);
  h = FNV_V(h, t->ndim);
  for (uint32_t i = 0; i < t->ndim; i++) h = FNV_V(h, t->shape[i]);
  h = FNV_V(h, t->nbytes);
  return t->nbytes ? fnv(h, t->data, t->nbytes) : h;
}

static uint64_t req_digest(const fp4idx_request_t *r) {
  uint64_t h = 1469598103934665603ull;
  h = FNV_V(h, r->id);
  h = FNV_V(h, r->op);
  switch (r->op) {
    case FP4IDX_OP_HELLO:
      h = FNV_V(h, r->u.hello.version);
      h = FNV_V(h, r->u.hello.client.len);
      if (r->u.hello.client.ptr) h = fnv(h, r->u.hello.client.ptr, r->u.hello.client.len);
      break;
    case FP4IDX_OP_APPEND:
      h = FNV_V(h, r->u.append.seq);
      h = FNV_V(h, r->u.append.rounding);
      h = tensor_digest(h, &r->u.append.keys);
      break;
    case FP4IDX_OP_SCORE:
      h = FNV_V(h, r->u.score.heads);
      h = FNV_V(h, r->u.score.topk);
      h = FNV_V(h, r->u.score.nseqs);
      for (size_t i = 0; i < r->u.score.nseqs; i++) {
        const fp4idx_score_seq_t *s = &r->u.score.seqs[i];
        h = FNV_V(h, s->seq);
        h = FNV_V(h, s->rows);
        h = tensor_digest(h, &s->q);
        h = tensor_digest(h, &s->w);
        h = tensor_digest(h, &s->lens);
        h = tensor_digest(h, &s->mask);
      }
      break;
    case FP4IDX_OP_TRUNCATE:
      h = FNV_V(h, r->u.truncate.seq);
      h = FNV_V(h, r->u.truncate.length);
      break;
    case FP4IDX_OP_DROP: h = FNV_V(h, r->u.drop.seq); break;
    case FP4IDX_OP_READ:
      h = FNV_V(h, r->u.read.seq);
      h = FNV_V(h, r->u.read.from);
      h = FNV_V(h, r->u.read.has_count);
      if (r->u.read.has_count) h = FNV_V(h, r->u.read.count);
      h = FNV_V(h, r->u.read.dequant);
      break;
    default: break;
  }
  return h;
}

/* ---- the seed corpus: valid bodies ---------------------------------------- */

static const char *const req_seeds[] = {
    "{id: 1, op: 'hello', version: 1, client: 'fuzz'}",
    "{id: 2, op: 'info'}",
    "{id: 3, op: 'append', seq: 7, keys: T(bf16, [2, 128]), rounding: 'rne'}",
    "{id: 4, op: 'append', seq: 7, keys: T(u8, [3, 68])}",
    "{id: 5, op: 'append', seq: 70000, keys: T(f32, [1, 128]), "
    "rounding: 'threshold'}",
    "{id: 6, op: 'score', heads: 2, seqs: [{seq: 1, q: T(bf16, [2, 2, 128]), "
    "w: T(bf16, [2, 2]), lens: T(i32, [2]), mask: T(u8, [2, 3])}, "
    "{seq: 2, q: T(bf16, [1, 2, 128]), w: T(bf16, [1, 2])}]}",
    "{id: 7, op: 'score', heads: 1, topk: 4, seqs: [{seq: 1, "
    "q: T(bf16, [1, 1, 128]), w: T(bf16, [1, 1])}]}",
    "{id: 8, op: 'truncate', seq: 1, length: 5}",
    "{id: 9, op: 'drop', seq: 1}",
    "{id: 10, op: 'read', seq: 1, from: 2, count: 3, dequant: true}",
    "{id: 11, op: 'stats'}",
    "{id: 12, op: 'save'}",
};

static const struct {
  fp4idx_op_t op;
  const char *text;
} resp_seeds[] = {
    {FP4IDX_OP_HELLO, "{id: 1, status: 0, version: 1, server: 'fp4idxd 0.1.0'}"},
    {FP4IDX_OP_INFO,
     "{id: 2, status: 0, version: 1, server: 's', backend: 'cpu', device: 'd', "
     "page_size: 64, pages_total: 10, pages_free: 9, sequences: 1, "
     "max_frame: 67108864}"},
    {FP4IDX_OP_APPEND, "{id: 3, status: 0, first: 0, length: 2}"},
    {FP4IDX_OP_SCORE,
     "{id: 6, status: 0, results: [{seq: 1, logits: T(f32, [2, 3])}, "
     "{seq: 2, positions: T(i32, [1, 2]), logits: T(f32, [1, 2]), "
     "counts: T(i32, [1])}]}"},
    {FP4IDX_OP_TRUNCATE, "{id: 8, status: 0, length: 5}"},
    {FP4IDX_OP_DROP, "{id: 9, status: 0}"},
    {FP4IDX_OP_READ, "{id: 10, status: 0, keys: T(u8, [3, 68])}"},
    {FP4IDX_OP_STATS,
     "{id: 11, status: 0, uptime_s: 1.5, connections: 1, sequences: 0, keys: 0, "
     "backend: 'cpu', device: 'd', pages_total: 1, pages_free: 1, requests: "
     "{append: {count: 1, errors: 0, latency_us_le: [1, 2.0], "
     "latency_hist: [1, 0], latency_sum_us: 3}}}"},
    {FP4IDX_OP_SAVE, "{id: 12, status: -4, error: 'save is not implemented'}"},
};

#define NREQ (sizeof(req_seeds) / sizeof(req_seeds[0]))
#define NRESP (sizeof(resp_seeds) / sizeof(resp_seeds[0]))

static const unsigned char interesting[] = {
    0x00, 0x01, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1,
    0xc2, 0xc4, 0xc5, 0xc6, 0xc7, 0xca, 0xcb, 0xcc, 0xcf, 0xd0, 0xd3,
    0xd4, 0xd8, 0xd9, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0xe0, 0xff};

/* Mutates buf[0..*len) in place (cap bytes available). */
static void mutate(unsigned char *buf, size_t *len, size_t cap) {
  int n = 1 + (int)rndn(4);
  for (int k = 0; k < n; k++) {
    size_t L = *len;
    switch (rndn(8)) {
      case 0: if (L) buf[rndn(L)] ^= (unsigned char)(1u << rndn(8)); break;
      case 1: if (L) buf[rndn(L)] = (unsigned char)rnd(); break;
      case 2:
        if (L) buf[rndn(L)] = interesting[rndn(sizeof(interesting))];
        break;
      case 3: *len = rndn(L + 1); break; /* truncate */
      case 4:                            /* delete a range */
        if (L) {
          size_t a = rndn(L), b = a + rndn(L - a + 1);
          memmove(buf + a, buf + b, L - b);
          *len = L - (b - a);
        }
        break;
      case 5: /* insert a byte */
        if (L < cap) {
          size_t a = rndn(L + 1);
          memmove(buf + a + 1, buf + a, L - a);
          buf[a] = interesting[rndn(sizeof(interesting))];
          *len = L + 1;
        }
        break;
      case 6: /* duplicate a range */
        if (L) {
          size_t a = rndn(L), m = 1 + rndn(L - a);
          if (L + m <= cap) {
            size_t at = rndn(L + 1);
            unsigned char tmp[64];
            if (m > sizeof(tmp)) m = sizeof(tmp);
            memcpy(tmp, buf + a, m);
            memmove(buf + at + m, buf + at, L - at);
            memcpy(buf + at, tmp, m);
            *len = L + m;
          }
        }
        break;
      default: /* big-endian length fields: set 2 or 4 bytes to extremes */
        if (L >= 4) {
          size_t a = rndn(L - 3);
          memset(buf + a, rnd() & 1 ? 0xff : 0x00, 2 + 2 * rndn(2));
        }
        break;
    }
  }
}

static void check_request(const unsigned char *body, size_t len, int *ok) {
  fp4idx_request_t r, r2;
  char msg[256];
  int rc = fp4idx_decode_request(body, len, &r, msg, sizeof(msg));
  cr_assert(rc <= 0);
  cr_assert(msg[0] != '\0' || rc == 0, "an error without a message");
  if (rc == 0) {
    (*ok)++;
    if (r.op == FP4IDX_OP_SCORE)
      for (size_t i = 0; i < r.u.score.nseqs; i++) {
        uint64_t w;
        (void)fp4idx_score_seq_check(&r.u.score.seqs[i], rndn(40), &w, msg,
                                     sizeof(msg));
      }
    /* whatever decodes re-encodes and decodes to the same request */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    int erc = fp4idx_encode_request(&sb, &r);
    cr_assert_eq(erc, 0, "re-encode failed: %d", erc);
    unsigned char *copy = malloc(sb.size - 4);
    memcpy(copy, sb.data + 4, sb.size - 4);
    cr_assert_eq(fp4idx_decode_request(copy, sb.size - 4, &r2, msg, 256), 0,
                 "%s", msg);
    cr_assert_eq(req_digest(&r), req_digest(&r2), "round trip changed it");
    fp4idx_request_clear(&r2);
    free(copy);
    msgpack_sbuffer_destroy(&sb);
  }
  fp4idx_request_clear(&r);
}

static void check_responses(const unsigned char *body, size_t len, int *ok) {
  for (int op = FP4IDX_OP_NONE + 1; op < FP4IDX_OP__COUNT; op++) {
    fp4idx_response_t r;
    char msg[256];
    int rc = fp4idx_decode_response(body, len, (fp4idx_op_t)op, &r, msg, 256);
    cr_assert(rc <= 0);
    if (rc == 0) {
      (*ok)++;
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      int erc = r.status == 0
                    ? fp4idx_encode_response(&sb, &r)
                    : fp4idx_encode_error(&sb, r.id, r.status, r.error);
      cr_assert_eq(erc, 0, "re-encode of a decoded %s response: %d",
                   fp4idx_op_name((fp4idx_op_t)op), erc);
      msgpack_sbuffer_destroy(&sb);
    }
    fp4idx_response_clear(&r);
  }
}

/* Frames (header + possibly mutated body) through a reader in random
 * chunks: it must report only 0, 1 or E2BIG and return exact bodies. */
static void check_reader(const unsigned char *body, size_t len) {
  unsigned char *stream = malloc(len + 8);
  fp4idx_frame_header_put(stream, (uint32_t)len);
  memcpy(stream + 4, body, len);
  size_t total = len + 4;
  if (rnd() & 1) stream[rndn(4)] ^= (unsigned char)rnd(); /* bad header */
  fp4idx_frame_reader_t fr;
  fp4idx_frame_reader_init(&fr, 4096);
  size_t off = 0;
  while (off < total) {
    size_t used, chunk = 1 + rndn(total - off);
    int rc = fp4idx_frame_reader_feed(&fr, stream + off, chunk, &used);
    cr_assert(rc == 0 || rc == 1 || rc == FP4IDX_E2BIG, "reader rc %d", rc);
    if (rc == FP4IDX_E2BIG) {
      cr_assert_gt(fp4idx_frame_header_get(stream), 4096u);
      break;
    }
    off += used;
    if (rc == 1) {
      unsigned char *b;
      size_t bl;
      cr_assert_eq(fp4idx_frame_reader_take(&fr, &b, &bl), 0);
      cr_assert_eq(bl, (size_t)fp4idx_frame_header_get(stream));
      cr_assert(memcmp(b, stream + 4, bl) == 0);
      free(b);
      break;
    }
  }
  fp4idx_frame_reader_free(&fr);
  free(stream);
}

Test(fuzz, mutated_frames_never_crash, .timeout = 300) {
  const char *it = getenv("FP4IDX_FUZZ_ITERS");
  const char *sd = getenv("FP4IDX_FUZZ_SEED");
  long iters = it ? atol(it) : 50000;
  rng_state = sd ? strtoull(sd, NULL, 0) : 0x9E3779B97F4A7C15ull;
  if (rng_state == 0) rng_state = 1;

  unsigned char *seeds[NREQ + NRESP];
  size_t seed_len[NREQ + NRESP];
  for (size_t i = 0; i < NREQ; i++)
    cr_assert_eq(mp_build_alloc(req_seeds[i], &seeds[i], &seed_len[i]), 0);
  for (size_t i = 0; i < NRESP; i++)
    cr_assert_eq(mp_build_alloc(resp_seeds[i].text, &seeds[NREQ + i],
                                &seed_len[NREQ + i]),
                 0);

  /* the seeds themselves are valid */
  int ok = 0;
  for (size_t i = 0; i < NREQ; i++) check_request(seeds[i], seed_len[i], &ok);
  cr_assert_eq(ok, (int)NREQ, "all request seeds decode");
  for (size_t i = 0; i < NRESP; i++) {
    fp4idx_response_t r;
    char msg[256];
    cr_assert_eq(fp4idx_decode_response(seeds[NREQ + i], seed_len[NREQ + i],
                                        resp_seeds[i].op, &r, msg, 256),
                 0, "response seed %zu: %s", i, msg);
    fp4idx_response_clear(&r);
  }

  int req_ok = 0, resp_ok = 0;
  enum { CAP = 8192 };
  unsigned char *work = malloc(CAP);
  for (long n = 0; n < iters; n++) {
    size_t s = rndn(NREQ + NRESP), len = seed_len[s];
    memcpy(work, seeds[s], len);
    mutate(work, &len, CAP);
    /* exact-size heap copy, so ASan sees any read past the end */
    unsigned char *body = malloc(len ? len : 1);
    memcpy(body, work, len);
    check_request(body, len, &req_ok);
    check_responses(body, len, &resp_ok);
    if ((n & 7) == 0) check_reader(body, len);
    free(body);
  }
  free(work);
  for (size_t i = 0; i < NREQ + NRESP; i++) free(seeds[i]);
  cr_log_info("%ld mutations: %d decoded as requests, %d as responses", iters,
              req_ok, resp_ok);
  /* the mutations must also produce some valid messages, or the round-trip
   * check above tested nothing */
  cr_assert_gt(req_ok, 0);
  cr_assert_gt(resp_ok, 0);
}
