/* test_protocol_reject.c -- strict rejection of malformed input: one table
 * line per case (msgpack notation of test_protocol_util.h, or raw bytes),
 * each with the status, the id the error reply must carry and a word the
 * message must contain (the field it names). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_codec.h"
#include "test_protocol_util.h"

typedef struct {
  const char *text; /* msgpack notation */
  int status;
  uint64_t id;
  const char *word; /* must occur in the message */
} reject_case_t;

#define SEQ1 "{seq: 1, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4])}"
#define SCORE(extra, seq) \
  "{id: 8, op: 'score', heads: 4" extra ", seqs: [" SEQ1 ", " seq "]}"
#define APPEND(keys) "{id: 7, op: 'append', seq: 1, keys: " keys "}"

static const reject_case_t cases[] = {
    /* id and op */
    {"{op: 'info'}", FP4IDX_EPROTO, 0, "id"},
    {"{id: -1, op: 'info'}", FP4IDX_EPROTO, 0, "id"},
    {"{id: 'x', op: 'info'}", FP4IDX_EPROTO, 0, "id"},
    {"{id: 1.0, op: 'info'}", FP4IDX_EPROTO, 0, "id"},
    {"{id: nil, op: 'info'}", FP4IDX_EPROTO, 0, "id"},
    {"{id: 5}", FP4IDX_EPROTO, 5, "op"},
    {"{id: 5, op: 3}", FP4IDX_EPROTO, 5, "op"},
    {"{id: 5, op: nil}", FP4IDX_EPROTO, 5, "op"},
    {"{id: 5, op: 'frobnicate'}", FP4IDX_ETYPE, 5, "frobnicate"},
    {"{id: 5, op: 'INFO'}", FP4IDX_ETYPE, 5, "INFO"},
    {"{id: 5, op: ''}", FP4IDX_ETYPE, 5, "op"},
    {"{}", FP4IDX_EPROTO, 0, "op"},
    {"{id: 5, op: 'info', extra: 1}", FP4IDX_EPROTO, 5, "extra"},
    {"{id: 5, op: 'info', id: 6}", FP4IDX_EPROTO, 5, "twice"},
    {"{id: 5, op: 'info', op: 'info'}", FP4IDX_EPROTO, 5, "twice"},
    {"{rawkey(1): 2, id: 5, op: 'info'}", FP4IDX_EPROTO, 5, "not a string"},
    {"{id: 5, op: 'stats', seq: 1}", FP4IDX_EPROTO, 5, "seq"},
    {"{id: 5, op: 'save', x: nil}", FP4IDX_EPROTO, 5, "x"},
    /* hello */
    {"{id: 1, op: 'hello'}", FP4IDX_EPROTO, 1, "version"},
    {"{id: 1, op: 'hello', version: 'one'}", FP4IDX_EPROTO, 1, "version"},
    {"{id: 1, op: 'hello', version: -1}", FP4IDX_EPROTO, 1, "version"},
    {"{id: 1, op: 'hello', version: 1, client: 5}", FP4IDX_EPROTO, 1, "client"},
    {"{id: 1, op: 'hello', version: 1, client: bin(3)}", FP4IDX_EPROTO, 1, "client"},
    /* append: fields */
    {"{id: 7, op: 'append', keys: T(u8, [1, 68])}", FP4IDX_EPROTO, 7, "seq"},
    {"{id: 7, op: 'append', seq: -1, keys: T(u8, [1, 68])}", FP4IDX_EPROTO, 7, "seq"},
    {"{id: 7, op: 'append', seq: 'a', keys: T(u8, [1, 68])}", FP4IDX_EPROTO, 7, "seq"},
    {"{id: 7, op: 'append', seq: 1.5, keys: T(u8, [1, 68])}", FP4IDX_EPROTO, 7, "seq"},
    {"{id: 7, op: 'append', seq: 1}", FP4IDX_EPROTO, 7, "keys"},
    {APPEND("bin(256)"), FP4IDX_EPROTO, 7, "keys"},
    {APPEND("[1, 2]"), FP4IDX_EPROTO, 7, "keys"},
    {"{id: 7, op: 'append', seq: 1, keys: T(u8, [1, 68]), rounding: 'up'}",
     FP4IDX_EPROTO, 7, "rounding"},
    {"{id: 7, op: 'append', seq: 1, keys: T(u8, [1, 68]), rounding: 1}",
     FP4IDX_EPROTO, 7, "rounding"},
    {"{id: 7, op: 'append', seq: 1, keys: T(u8, [1, 68]), rounding: 'RNE'}",
     FP4IDX_EPROTO, 7, "rounding"},
    /* append: tensor structure */
    {APPEND("{dtype: 'u8', shape: [1, 68], data: bin(68), x: 1}"),
     FP4IDX_EPROTO, 7, "x"},
    {APPEND("{dtype: 'u8', shape: [1, 68]}"), FP4IDX_EPROTO, 7, "data"},
    {APPEND("{dtype: 'u8', data: bin(68)}"), FP4IDX_EPROTO, 7, "shape"},
    {APPEND("{shape: [1, 68], data: bin(68)}"), FP4IDX_EPROTO, 7, "dtype"},
    {APPEND("{dtype: 4, shape: [1, 68], data: bin(68)}"), FP4IDX_EPROTO, 7, "dtype"},
    {APPEND("{dtype: 'u8', shape: 'x', data: bin(68)}"), FP4IDX_EPROTO, 7, "shape"},
    {APPEND("{dtype: 'u8', shape: [1, -68], data: bin(68)}"), FP4IDX_EPROTO, 7,
     "shape[1]"},
    {APPEND("{dtype: 'u8', shape: [1, 68.0], data: bin(68)}"), FP4IDX_EPROTO, 7,
     "shape[1]"},
    {APPEND("{dtype: 'u8', shape: [1, 68], data: 68}"), FP4IDX_EPROTO, 7, "data"},
    {APPEND("{dtype: 'u8', shape: [1, 68], data: [1]}"), FP4IDX_EPROTO, 7, "data"},
    {APPEND("{dtype: 'u8', shape: [], data: bin(1)}"), FP4IDX_ESHAPE, 7, "shape"},
    {APPEND("{dtype: 'u8', shape: [4611686018427387904, 4], data: bin(1)}"),
     FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(f16, [1, 128])"), FP4IDX_ESHAPE, 7, "f16"},
    {APPEND("T(bf16, [1, 2, 3, 4, 5])"), FP4IDX_E2BIG, 7, "dims"},
    /* append: shapes against dtypes, data lengths off by one */
    {APPEND("T(bf16, [2, 64])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(bf16, [2, 68])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(f32, [2, 129])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(u8, [2, 128])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(u8, [1, 67])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(i32, [2, 128])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(bf16, [0, 128])"), FP4IDX_ESHAPE, 7, "n >= 1"},
    {APPEND("T(u8, [0, 68])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(bf16, [128])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(bf16, [1, 1, 128])"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(bf16, [2, 128], +1)"), FP4IDX_ESHAPE, 7, "512"},
    {APPEND("T(bf16, [2, 128], -1)"), FP4IDX_ESHAPE, 7, "511"},
    {APPEND("T(f32, [1, 128], -4)"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(u8, [3, 68], +1)"), FP4IDX_ESHAPE, 7, "keys"},
    {APPEND("T(u8, [3, 68], -68)"), FP4IDX_ESHAPE, 7, "keys"},
    /* score: top level */
    {"{id: 8, op: 'score', seqs: [" SEQ1 "]}", FP4IDX_EPROTO, 8, "heads"},
    {"{id: 8, op: 'score', heads: 0, seqs: [" SEQ1 "]}", FP4IDX_ESHAPE, 8, "heads"},
    {"{id: 8, op: 'score', heads: 129, seqs: [" SEQ1 "]}", FP4IDX_ESHAPE, 8, "heads"},
    {"{id: 8, op: 'score', heads: 4294967300, seqs: [" SEQ1 "]}", FP4IDX_ESHAPE,
     8, "heads"},
    {"{id: 8, op: 'score', heads: -4, seqs: [" SEQ1 "]}", FP4IDX_EPROTO, 8, "heads"},
    {"{id: 8, op: 'score', heads: '4', seqs: [" SEQ1 "]}", FP4IDX_EPROTO, 8, "heads"},
    {"{id: 8, op: 'score', heads: 4, topk: 0, seqs: [" SEQ1 "]}", FP4IDX_EPROTO,
     8, "topk"},
    {"{id: 8, op: 'score', heads: 4, topk: 1048577, seqs: [" SEQ1 "]}",
     FP4IDX_E2BIG, 8, "topk"},
    {"{id: 8, op: 'score', heads: 4, topk: -1, seqs: [" SEQ1 "]}", FP4IDX_EPROTO,
     8, "topk"},
    {"{id: 8, op: 'score', heads: 4, topk: true, seqs: [" SEQ1 "]}", FP4IDX_EPROTO,
     8, "topk"},
    {"{id: 8, op: 'score', heads: 4}", FP4IDX_EPROTO, 8, "seqs"},
    {"{id: 8, op: 'score', heads: 4, seqs: []}", FP4IDX_EPROTO, 8, "empty"},
    {"{id: 8, op: 'score', heads: 4, seqs: " SEQ1 "}", FP4IDX_EPROTO, 8, "seqs"},
    {"{id: 8, op: 'score', heads: 4, seqs: [1]}", FP4IDX_EPROTO, 8, "seqs[0]"},
    {"{id: 8, op: 'score', heads: 4, seqs: [" SEQ1 "], lens: T(i32, [2])}",
     FP4IDX_EPROTO, 8, "lens"},
    /* score: entries (the bad one is seqs[1]) */
    {SCORE("", "{q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4])}"), FP4IDX_EPROTO, 8,
     "seqs[1].seq"},
    {SCORE("", "{seq: -2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4])}"),
     FP4IDX_EPROTO, 8, "seqs[1].seq"},
    {SCORE("", "{seq: 2, w: T(bf16, [2, 4])}"), FP4IDX_EPROTO, 8, "seqs[1].q"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128])}"), FP4IDX_EPROTO, 8, "seqs[1].w"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), k: 1}"),
     FP4IDX_EPROTO, 8, "k"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 3, 128]), w: T(bf16, [2, 3])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].q"},
    {SCORE("", "{seq: 2, q: T(f32, [2, 4, 128]), w: T(bf16, [2, 4])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].q"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 64]), w: T(bf16, [2, 4])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].q"},
    {SCORE("", "{seq: 2, q: T(bf16, [0, 4, 128]), w: T(bf16, [0, 4])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].q"},
    {SCORE("", "{seq: 2, q: T(bf16, [8, 128]), w: T(bf16, [2, 4])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].q"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128], -1), w: T(bf16, [2, 4])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].q"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [3, 4])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].w"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 5])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].w"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(f32, [2, 4])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].w"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [8])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].w"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4], +1)}"),
     FP4IDX_ESHAPE, 8, "seqs[1].w"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "lens: T(i32, [3])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].lens"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "lens: T(i32, [2, 1])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].lens"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "lens: T(u8, [2])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].lens"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "lens: T(f32, [2])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].lens"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "lens: T(i32, [2], -1)}"),
     FP4IDX_ESHAPE, 8, "seqs[1].lens"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "lens: [3, 4]}"),
     FP4IDX_EPROTO, 8, "seqs[1].lens"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "mask: T(u8, [3, 5])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].mask"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "mask: T(i32, [2, 5])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].mask"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "mask: T(u8, [10])}"),
     FP4IDX_ESHAPE, 8, "seqs[1].mask"},
    {SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
               "mask: T(u8, [2, 5], +1)}"),
     FP4IDX_ESHAPE, 8, "seqs[1].mask"},
    /* truncate, drop, read */
    {"{id: 9, op: 'truncate', seq: 1}", FP4IDX_EPROTO, 9, "length"},
    {"{id: 9, op: 'truncate', length: 1}", FP4IDX_EPROTO, 9, "seq"},
    {"{id: 9, op: 'truncate', seq: 1, length: -1}", FP4IDX_EPROTO, 9, "length"},
    {"{id: 9, op: 'truncate', seq: 1, length: '3'}", FP4IDX_EPROTO, 9, "length"},
    {"{id: 9, op: 'drop'}", FP4IDX_EPROTO, 9, "seq"},
    {"{id: 9, op: 'drop', seq: [1]}", FP4IDX_EPROTO, 9, "seq"},
    {"{id: 9, op: 'drop', seq: 1, length: 0}", FP4IDX_EPROTO, 9, "length"},
    {"{id: 9, op: 'read'}", FP4IDX_EPROTO, 9, "seq"},
    {"{id: 9, op: 'read', seq: 1, from: -1}", FP4IDX_EPROTO, 9, "from"},
    {"{id: 9, op: 'read', seq: 1, count: 'all'}", FP4IDX_EPROTO, 9, "count"},
    {"{id: 9, op: 'read', seq: 1, dequant: 1}", FP4IDX_EPROTO, 9, "dequant"},
    {"{id: 9, op: 'read', seq: 1, dequant: 'yes'}", FP4IDX_EPROTO, 9, "dequant"},
    /* list */
    {"{id: 4, op: 'list', cursor: -1}", FP4IDX_EPROTO, 4, "cursor"},
    {"{id: 4, op: 'list', cursor: 'x'}", FP4IDX_EPROTO, 4, "cursor"},
    {"{id: 4, op: 'list', count: 0}", FP4IDX_EPROTO, 4, "count"},
    {"{id: 4, op: 'list', count: 10001}", FP4IDX_E2BIG, 4, "count"},
    {"{id: 4, op: 'list', count: 1.5}", FP4IDX_EPROTO, 4, "count"},
    {"{id: 4, op: 'list', seq: 1}", FP4IDX_EPROTO, 4, "seq"},
    /* nesting */
    /* msgpack-level errors come before the id is read: id 0 */
    {"{id: 3, op: 'info', x: [[[[[[[[1]]]]]]]]}", FP4IDX_E2BIG, 0, "nesting"},
};

static int run_case(const reject_case_t *c, size_t i) {
  unsigned char *body;
  size_t len;
  char msg[256] = "";
  fp4idx_request_t r;
  cr_assert_eq(mp_build_alloc(c->text, &body, &len), 0, "case %zu notation", i);
  int rc = fp4idx_decode_request(body, len, &r, msg, sizeof(msg));
  cr_expect_eq(rc, c->status, "case %zu %s: status %d (%s), want %d (%s): %s",
               i, c->text, rc, fp4idx_status_name(rc), c->status,
               fp4idx_status_name(c->status), msg);
  cr_expect_eq(r.id, c->id, "case %zu %s: id %llu, want %llu", i, c->text,
               (unsigned long long)r.id, (unsigned long long)c->id);
  cr_expect(strstr(msg, c->word) != NULL,
            "case %zu %s: message \"%s\" lacks \"%s\"", i, c->text, msg,
            c->word);
  fp4idx_request_clear(&r);
  cr_assert_null(r.owned_);
  free(body);
  return rc == c->status;
}

Test(reject, table) {
  size_t n = sizeof(cases) / sizeof(cases[0]), ok = 0;
  for (size_t i = 0; i < n; i++) ok += (size_t)run_case(&cases[i], i);
  cr_log_info("%zu of %zu rejection cases", ok, n);
  cr_assert_eq(ok, n);
}

/* The base requests of the table decode, so each failure above is caused by
 * the one thing that case changes. */
Test(reject, table_bases_are_valid) {
  const char *ok[] = {
      APPEND("T(bf16, [2, 128])"), APPEND("T(f32, [1, 128])"),
      APPEND("T(u8, [3, 68])"),
      "{id: 4, op: 'list'}", "{id: 4, op: 'list', cursor: 0, count: 10000}",
      "{id: 4, op: 'list', cursor: nil, count: 1}",
      SCORE("", "{seq: 2, q: T(bf16, [2, 4, 128]), w: T(bf16, [2, 4]), "
                "lens: T(i32, [2]), mask: T(u8, [2, 5])}"),
      SCORE(", topk: 1048576", SEQ1),
      "{id: 8, op: 'score', heads: 128, seqs: [{seq: 1, "
      "q: T(bf16, [1, 128, 128]), w: T(bf16, [1, 128])}]}",
      "{id: 8, op: 'score', heads: 1, seqs: [{seq: 1, "
      "q: T(bf16, [1, 1, 128]), w: T(bf16, [1, 1])}]}",
      "{id: 9, op: 'truncate', seq: 1, length: 0}",
      "{id: 9, op: 'read', seq: 1, from: 3, count: 4, dequant: true}",
      "{id: 1, op: 'hello', version: 1, client: 'x'}",
      "{id: 3, op: 'info', x: [[[[[[[1]]]]]]]}" /* depth 8: the cap */
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    unsigned char *body;
    size_t len;
    char msg[256] = "";
    fp4idx_request_t r;
    cr_assert_eq(mp_build_alloc(ok[i], &body, &len), 0);
    int rc = fp4idx_decode_request(body, len, &r, msg, sizeof(msg));
    /* the depth case is valid msgpack but has an unknown field */
    if (strstr(ok[i], "x: [") != NULL)
      cr_expect(rc == FP4IDX_EPROTO && strstr(msg, "'x'"), "%s: %s", ok[i], msg);
    else
      cr_expect_eq(rc, 0, "%s: %d %s", ok[i], rc, msg);
    fp4idx_request_clear(&r);
    free(body);
  }
}

/* ---- raw bytes: broken msgpack ------------------------------------------ */

typedef struct {
  const char *name;
  const unsigned char *bytes;
  size_t len;
  int status;
  const char *word;
} raw_case_t;

#define RAW(name, st, word, ...)                                          \
  {name, (const unsigned char[]){__VA_ARGS__},                            \
   sizeof((const unsigned char[]){__VA_ARGS__}), st, word}

/* {"id": 1, "op": "info"} = 82 a2 69 64 01 a2 6f 70 a4 69 6e 66 6f */
static const raw_case_t raws[] = {
    RAW("array body", FP4IDX_EPROTO, "not a msgpack map", 0x91, 0x01),
    RAW("int body", FP4IDX_EPROTO, "not a msgpack map", 0x07),
    RAW("str body", FP4IDX_EPROTO, "not a msgpack map", 0xa2, 'h', 'i'),
    RAW("nil body", FP4IDX_EPROTO, "not a msgpack map", 0xc0),
    RAW("reserved 0xc1", FP4IDX_EPROTO, "0xc1", 0xc1),
    RAW("map missing values", FP4IDX_EPROTO, "announces", 0x81),
    RAW("map missing last value", FP4IDX_EPROTO, "truncated", 0x82, 0xa2, 'i',
        'd', 0x01, 0xa2, 'o', 'p'),
    RAW("str cut short", FP4IDX_EPROTO, "truncated", 0x82, 0xa2, 'i', 'd',
        0x01, 0xa2, 'o', 'p', 0xa4, 'i', 'n', 'f'),
    RAW("uint64 cut short", FP4IDX_EPROTO, "truncated", 0x81, 0xa2, 'i', 'd',
        0xcf, 0, 0, 0),
    RAW("trailing byte", FP4IDX_EPROTO, "trailing", 0x82, 0xa2, 'i', 'd', 0x01,
        0xa2, 'o', 'p', 0xa4, 'i', 'n', 'f', 'o', 0x00),
    RAW("two maps", FP4IDX_EPROTO, "trailing", 0x80, 0x80),
    RAW("map32 of 2^31 pairs", FP4IDX_EPROTO, "announces", 0xdf, 0x80, 0, 0, 0,
        0xa2, 'i', 'd', 0x01),
    RAW("array32 of 2^32-1", FP4IDX_EPROTO, "announces", 0x81, 0xa1, 'x', 0xdd,
        0xff, 0xff, 0xff, 0xff, 0x01),
    RAW("bin32 of 4 GiB", FP4IDX_EPROTO, "truncated", 0x81, 0xa1, 'x', 0xc6,
        0xff, 0xff, 0xff, 0xff, 0x01),
    RAW("str16 cut", FP4IDX_EPROTO, "truncated", 0x81, 0xda, 0x01),
    RAW("ext8 cut", FP4IDX_EPROTO, "truncated", 0x81, 0xa1, 'x', 0xc7, 0x05,
        0x01, 0x00),
    RAW("ext value", FP4IDX_EPROTO, "id", 0x82, 0xa2, 'i', 'd', 0xd4, 0x01,
        0x00, 0xa2, 'o', 'p', 0xa4, 'i', 'n', 'f', 'o'),
};

Test(reject, raw_bytes) {
  size_t n = sizeof(raws) / sizeof(raws[0]);
  for (size_t i = 0; i < n; i++) {
    char msg[256] = "";
    fp4idx_request_t r;
    int rc = fp4idx_decode_request(raws[i].bytes, raws[i].len, &r, msg, 256);
    cr_expect_eq(rc, raws[i].status, "%s: %d (%s): %s", raws[i].name, rc,
                 fp4idx_status_name(rc), msg);
    cr_expect(strstr(msg, raws[i].word) != NULL, "%s: \"%s\" lacks \"%s\"",
              raws[i].name, msg, raws[i].word);
    fp4idx_request_clear(&r);
  }
  /* an empty body */
  char msg[256];
  fp4idx_request_t r;
  cr_expect_eq(fp4idx_decode_request("", 0, &r, msg, 256), FP4IDX_EPROTO);
  cr_expect_eq(fp4idx_decode_request(NULL, 0, &r, msg, 256), FP4IDX_EPROTO);
  cr_expect_eq(fp4idx_decode_request(NULL, 5, &r, msg, 256), FP4IDX_EINVAL);
  cr_expect_eq(fp4idx_decode_request("x", 1, NULL, msg, 256), FP4IDX_EINVAL);
  /* every prefix of a valid request is rejected, never crashes */
  static const unsigned char good[] = {0x82, 0xa2, 'i', 'd', 0x01, 0xa2, 'o',
                                       'p',  0xa4, 'i', 'n', 'f', 'o'};
  for (size_t k = 0; k < sizeof(good); k++) {
    int rc = fp4idx_decode_request(good, k, &r, msg, 256);
    cr_expect_eq(rc, FP4IDX_EPROTO, "prefix of %zu bytes: %d", k, rc);
    fp4idx_request_clear(&r);
  }
  cr_expect_eq(fp4idx_decode_request(good, sizeof(good), &r, msg, 256), 0);
  cr_expect_eq(r.op, FP4IDX_OP_INFO);
}

/* ---- caps that need big inputs ------------------------------------------ */

Test(reject, too_many_score_seqs) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  for (int n = 1024; n <= 1025; n++) {
    /* each entry is the same small valid entry */
    size_t cap = 64 + (size_t)n * 128;
    char *text = malloc(cap), *p = text;
    p += sprintf(p, "{id: 4, op: 'score', heads: 1, seqs: [");
    for (int i = 0; i < n; i++)
      p += sprintf(p, "%s{seq: %d, q: T(bf16, [1, 1, 128]), w: T(bf16, [1, 1])}",
                   i ? "," : "", i);
    sprintf(p, "]}");
    unsigned char *body;
    size_t len;
    char msg[256];
    fp4idx_request_t r;
    cr_assert_eq(mp_build_alloc(text, &body, &len), 0);
    int rc = fp4idx_decode_request(body, len, &r, msg, 256);
    if (n == 1024) {
      cr_expect_eq(rc, 0, "%s", msg);
      cr_expect_eq(r.u.score.nseqs, 1024u);
    } else {
      cr_expect_eq(rc, FP4IDX_E2BIG, "%d %s", rc, msg);
      cr_expect_eq(r.id, 4u);
    }
    fp4idx_request_clear(&r);
    free(body);
    free(text);
  }
  msgpack_sbuffer_destroy(&sb);
}

Test(reject, too_many_objects_and_long_client) {
  /* {"id": 2, "op": "info", "x": [0 x (2^20)]}: over the object cap */
  size_t n = FP4IDX_PROTO_MAX_OBJECTS;
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  msgpack_pack_str_with_body(&pk, "id", 2);
  msgpack_pack_uint8(&pk, 2);
  msgpack_pack_str_with_body(&pk, "op", 2);
  msgpack_pack_str_with_body(&pk, "info", 4);
  msgpack_pack_str_with_body(&pk, "x", 1);
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) msgpack_pack_uint8(&pk, 0);
  char msg[256];
  fp4idx_request_t r;
  int rc = fp4idx_decode_request(sb.data, sb.size, &r, msg, 256);
  cr_expect_eq(rc, FP4IDX_E2BIG, "%d %s", rc, msg);
  cr_expect(strstr(msg, "objects") != NULL, "%s", msg);
  cr_expect_eq(r.id, 0u, "caps are checked before the id is read");
  fp4idx_request_clear(&r);
  msgpack_sbuffer_destroy(&sb);

  /* hello "client" over FP4IDX_PROTO_MAX_STRING bytes */
  for (size_t len = FP4IDX_PROTO_MAX_STRING; len <= FP4IDX_PROTO_MAX_STRING + 1;
       len++) {
    char *text = malloc(len + 64);
    int o = sprintf(text, "{id: 1, op: 'hello', version: 1, client: '");
    memset(text + o, 'c', len);
    strcpy(text + o + len, "'}");
    unsigned char *body;
    size_t blen;
    cr_assert_eq(mp_build_alloc(text, &body, &blen), 0);
    rc = fp4idx_decode_request(body, blen, &r, msg, 256);
    cr_expect_eq(rc, len > FP4IDX_PROTO_MAX_STRING ? FP4IDX_E2BIG : 0, "%zu: %s",
                 len, msg);
    fp4idx_request_clear(&r);
    free(body);
    free(text);
  }
}

/* ---- responses -------------------------------------------------------------- */

typedef struct {
  fp4idx_op_t op;
  const char *text;
  int status;
  const char *word;
} resp_case_t;

static const resp_case_t resp_cases[] = {
    {FP4IDX_OP_DROP, "{status: 0}", FP4IDX_EPROTO, "id"},
    {FP4IDX_OP_DROP, "{id: 1}", FP4IDX_EPROTO, "status"},
    {FP4IDX_OP_DROP, "{id: 1, status: 1}", FP4IDX_EPROTO, "status"},
    {FP4IDX_OP_DROP, "{id: 1, status: '0'}", FP4IDX_EPROTO, "status"},
    {FP4IDX_OP_DROP, "{id: 1, status: -3000000000}", FP4IDX_EPROTO, "status"},
    {FP4IDX_OP_DROP, "{id: 1, status: -7, error: 5}", FP4IDX_EPROTO, "error"},
    {FP4IDX_OP_DROP, "[1, 0]", FP4IDX_EPROTO, "map"},
    {FP4IDX_OP_HELLO, "{id: 1, status: 0, version: 1}", FP4IDX_EPROTO, "server"},
    {FP4IDX_OP_INFO,
     "{id: 1, status: 0, version: 1, server: 's', backend: 'cpu', device: 'd', "
     "page_size: 64, pages_total: 1, pages_free: 1, sequences: -1, "
     "max_frame: 1}",
     FP4IDX_EPROTO, "sequences"},
    {FP4IDX_OP_APPEND, "{id: 1, status: 0, first: 0, length: 'x'}", FP4IDX_EPROTO,
     "length"},
    {FP4IDX_OP_TRUNCATE, "{id: 1, status: 0}", FP4IDX_EPROTO, "length"},
    {FP4IDX_OP_SCORE, "{id: 1, status: 0}", FP4IDX_EPROTO, "results"},
    {FP4IDX_OP_SCORE, "{id: 1, status: 0, results: [{seq: 1}]}", FP4IDX_EPROTO,
     "results[0].logits"},
    {FP4IDX_OP_SCORE, "{id: 1, status: 0, results: [{seq: 1, logits: T(i32, [1, 4])}]}",
     FP4IDX_ESHAPE, "results[0].logits"},
    {FP4IDX_OP_SCORE, "{id: 1, status: 0, results: [{seq: 1, logits: T(f32, [4])}]}",
     FP4IDX_ESHAPE, "logits"},
    {FP4IDX_OP_SCORE,
     "{id: 1, status: 0, results: [{seq: 1, logits: T(f32, [1, 4], -1)}]}",
     FP4IDX_ESHAPE, "logits"},
    {FP4IDX_OP_SCORE,
     "{id: 1, status: 0, results: [{seq: 1, logits: T(f32, [2, 4]), "
     "positions: T(i32, [2, 4])}]}",
     FP4IDX_EPROTO, "counts"},
    {FP4IDX_OP_SCORE,
     "{id: 1, status: 0, results: [{seq: 1, logits: T(f32, [2, 4]), "
     "positions: T(i32, [2, 3]), counts: T(i32, [2])}]}",
     FP4IDX_ESHAPE, "positions"},
    {FP4IDX_OP_SCORE,
     "{id: 1, status: 0, results: [{seq: 1, logits: T(f32, [2, 4]), "
     "positions: T(i32, [2, 4]), counts: T(i32, [3])}]}",
     FP4IDX_ESHAPE, "counts"},
    {FP4IDX_OP_READ, "{id: 1, status: 0, keys: T(bf16, [1, 128])}", FP4IDX_ESHAPE,
     "keys"},
    {FP4IDX_OP_READ, "{id: 1, status: 0, keys: T(u8, [1, 128])}", FP4IDX_ESHAPE,
     "keys"},
    {FP4IDX_OP_READ, "{id: 1, status: 0}", FP4IDX_EPROTO, "keys"},
    {FP4IDX_OP_STATS,
     "{id: 1, status: 0, uptime_s: 1.5, connections: 1, sequences: 0, keys: 0, "
     "backend: 'cpu', device: 'd', pages_total: 1, pages_free: 1, requests: "
     "{append: {count: 1, errors: 0, latency_us_le: [1, 2.0], "
     "latency_hist: [1], latency_sum_us: 3}}}",
     FP4IDX_EPROTO, "latency"},
    {FP4IDX_OP_STATS,
     "{id: 1, status: 0, uptime_s: 'x', connections: 1, sequences: 0, keys: 0, "
     "backend: 'cpu', device: 'd', pages_total: 1, pages_free: 1, requests: {}}",
     FP4IDX_EPROTO, "uptime_s"},
    {FP4IDX_OP_STATS,
     "{id: 1, status: 0, uptime_s: 1, connections: 1, sequences: 0, keys: 0, "
     "backend: 'cpu', device: 'd', pages_total: 1, pages_free: 1, "
     "requests: []}",
     FP4IDX_EPROTO, "requests"},
};

Test(reject, responses) {
  size_t n = sizeof(resp_cases) / sizeof(resp_cases[0]);
  for (size_t i = 0; i < n; i++) {
    unsigned char *body;
    size_t len;
    char msg[256] = "";
    fp4idx_response_t r;
    cr_assert_eq(mp_build_alloc(resp_cases[i].text, &body, &len), 0);
    int rc = fp4idx_decode_response(body, len, resp_cases[i].op, &r, msg, 256);
    cr_expect_eq(rc, resp_cases[i].status, "case %zu %s: %d (%s): %s", i,
                 resp_cases[i].text, rc, fp4idx_status_name(rc), msg);
    cr_expect(strstr(msg, resp_cases[i].word) != NULL,
              "case %zu: \"%s\" lacks \"%s\"", i, msg, resp_cases[i].word);
    fp4idx_response_clear(&r);
    free(body);
  }
  /* an error reply without "error" gets the code's standard message */
  unsigned char *body;
  size_t len;
  fp4idx_response_t r;
  cr_assert_eq(mp_build_alloc("{id: 3, status: -10}", &body, &len), 0);
  cr_assert_eq(fp4idx_decode_response(body, len, FP4IDX_OP_APPEND, &r, NULL, 0), 0);
  cr_assert_eq(r.status, FP4IDX_EFULL);
  cr_assert_str_eq(r.error, fp4idx_strerror(FP4IDX_EFULL));
  fp4idx_response_clear(&r);
  free(body);
  cr_assert_eq(fp4idx_decode_response("\x80", 1, FP4IDX_OP_NONE, &r, NULL, 0),
               FP4IDX_EINVAL);
}
