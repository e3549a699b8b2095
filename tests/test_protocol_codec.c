/* test_protocol_codec.c -- round trips of every request and response through
 * the real framing, zero-copy views, accepted encodings, encoder checks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h" /* fp4idx__op_plain, fp4idx__resp_scalar */
#include "fp4idx_codec.h"
#include "test_protocol_util.h"

/* ---- helpers -------------------------------------------------------------- */

/* Runs the frames in sb through a frame reader; returns the i-th body. */
static unsigned char *nth_body(const msgpack_sbuffer *sb, int i, size_t *len) {
  fp4idx_frame_reader_t r;
  size_t off = 0;
  int k = 0;
  fp4idx_frame_reader_init(&r, 0);
  while (off <= sb->size) {
    size_t used;
    int rc = fp4idx_frame_reader_feed(&r, sb->data + off, sb->size - off, &used);
    cr_assert_geq(rc, 0);
    off += used;
    if (rc == 1) {
      unsigned char *body;
      fp4idx_frame_reader_take(&r, &body, len);
      if (k++ == i) {
        fp4idx_frame_reader_free(&r);
        return body;
      }
      free(body);
    } else if (off == sb->size) {
      break;
    }
  }
  fp4idx_frame_reader_free(&r);
  cr_assert_fail("frame %d not found", i);
  return NULL;
}

static void check_view(const fp4idx_tensor_t *t, const unsigned char *body,
                       size_t len) {
  /* zero copy: the view lies inside the frame body */
  cr_assert((const unsigned char *)t->data >= body &&
                (const unsigned char *)t->data + t->nbytes <= body + len,
            "tensor data is not a view into the body");
}

static void tensor_eq(const fp4idx_tensor_t *a, const fp4idx_tensor_t *b) {
  cr_assert_eq(a->dtype, b->dtype);
  cr_assert_eq(a->ndim, b->ndim);
  for (uint32_t i = 0; i < a->ndim; i++) cr_assert_eq(a->shape[i], b->shape[i]);
  cr_assert_eq(a->nbytes, b->nbytes);
  cr_assert(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
}

/* Encodes, frames, decodes. The caller frees *body after comparing. */
static unsigned char *rt_req(const fp4idx_request_t *in, fp4idx_request_t *out) {
  msgpack_sbuffer sb;
  char msg[256];
  size_t len;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_request(&sb, in), 0);
  cr_assert_eq(fp4idx_frame_header_get((unsigned char *)sb.data), sb.size - 4);
  unsigned char *body = nth_body(&sb, 0, &len);
  msgpack_sbuffer_destroy(&sb);
  int rc = fp4idx_decode_request(body, len, out, msg, sizeof(msg));
  cr_assert_eq(rc, 0, "decode: %d %s", rc, msg);
  cr_assert_eq(out->id, in->id);
  cr_assert_eq(out->op, in->op);
  return body;
}

static unsigned char *rt_resp(const fp4idx_response_t *in,
                              fp4idx_response_t *out, size_t *lenp) {
  msgpack_sbuffer sb;
  char msg[256];
  size_t len;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_response(&sb, in), 0);
  unsigned char *body = nth_body(&sb, 0, &len);
  msgpack_sbuffer_destroy(&sb);
  int rc = fp4idx_decode_response(body, len, in->op, out, msg, sizeof(msg));
  cr_assert_eq(rc, 0, "decode: %d %s", rc, msg);
  cr_assert_eq(out->id, in->id);
  cr_assert_eq(out->status, 0);
  if (lenp) *lenp = len;
  return body;
}

static void *pattern(size_t n, unsigned seed) {
  void *p = malloc(n ? n : 1);
  fill_pattern(p, n, seed);
  return p;
}

/* ---- requests -------------------------------------------------------------- */

Test(codec, hello_roundtrip) {
  fp4idx_request_t in = {.id = 1, .op = FP4IDX_OP_HELLO}, out;
  in.u.hello.version = 1;
  in.u.hello.client = (fp4idx_strview_t){"py-client 1.0", 13};
  unsigned char *b = rt_req(&in, &out);
  cr_assert_eq(out.u.hello.version, 1u);
  cr_assert_eq(out.u.hello.client.len, 13u);
  cr_assert(memcmp(out.u.hello.client.ptr, "py-client 1.0", 13) == 0);
  fp4idx_request_clear(&out);
  free(b);

  in.u.hello.client = (fp4idx_strview_t){NULL, 0};
  in.u.hello.version = 7; /* any version decodes; the daemon says EVERSION */
  in.id = UINT64_MAX;
  b = rt_req(&in, &out);
  cr_assert_null(out.u.hello.client.ptr);
  cr_assert_eq(out.u.hello.version, 7u);
  fp4idx_request_clear(&out);
  free(b);
}

Test(codec, fieldless_requests_roundtrip) {
  const fp4idx_op_t ops[] = {FP4IDX_OP_INFO, FP4IDX_OP_STATS, FP4IDX_OP_SAVE};
  for (int i = 0; i < 3; i++) {
    fp4idx_request_t in = {.id = 10u + (unsigned)i, .op = ops[i]}, out;
    unsigned char *b = rt_req(&in, &out);
    fp4idx_request_clear(&out);
    free(b);
  }
}

Test(codec, append_roundtrip_all_key_types) {
  struct {
    fp4idx_wire_dtype_t dt;
    uint64_t n, d;
    int rounding;
  } cases[] = {{FP4IDX_WIRE_BF16, 3, 128, FP4IDX_WIRE_ROUND_RNE},
               {FP4IDX_WIRE_F32, 1, 128, FP4IDX_WIRE_ROUND_THRESHOLD},
               {FP4IDX_WIRE_U8, 5, 68, FP4IDX_WIRE_ROUND_RNE},
               {FP4IDX_WIRE_BF16, 1000, 128, FP4IDX_WIRE_ROUND_THRESHOLD}};
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    fp4idx_request_t in = {.id = 2, .op = FP4IDX_OP_APPEND}, out;
    size_t nb = cases[c].n * cases[c].d * fp4idx_wire_dtype_size(cases[c].dt);
    void *keys = pattern(nb, (unsigned)c);
    in.u.append.seq = 0xDEADBEEFCAFEull;
    in.u.append.rounding = cases[c].rounding;
    cr_assert_eq(fp4idx_tensor_init(&in.u.append.keys, cases[c].dt, 2,
                                    (uint64_t[]){cases[c].n, cases[c].d},
                                    keys),
                 0);
    unsigned char *b = rt_req(&in, &out);
    cr_assert_eq(out.u.append.seq, in.u.append.seq);
    cr_assert_eq(out.u.append.rounding, cases[c].rounding);
    tensor_eq(&out.u.append.keys, &in.u.append.keys);
    fp4idx_request_clear(&out);
    free(b);
    free(keys);
  }
}

Test(codec, score_roundtrip_views_into_body) {
  enum { H = 32, NS = 3 };
  fp4idx_score_seq_t seqs[NS];
  void *bufs[NS][4];
  memset(seqs, 0, sizeof(seqs));
  for (int s = 0; s < NS; s++) {
    uint64_t R = 1 + (uint64_t)s * 2, W = 17;
    seqs[s].seq = 100u + (unsigned)s;
    seqs[s].rows = (uint32_t)R;
    bufs[s][0] = pattern(R * H * 128 * 2, 1);
    bufs[s][1] = pattern(R * H * 2, 2);
    bufs[s][2] = calloc(R, 4);
    bufs[s][3] = pattern(R * W, 3);
    fp4idx_tensor_init(&seqs[s].q, FP4IDX_WIRE_BF16, 3,
                       (uint64_t[]){R, H, 128}, bufs[s][0]);
    fp4idx_tensor_init(&seqs[s].w, FP4IDX_WIRE_BF16, 2, (uint64_t[]){R, H},
                       bufs[s][1]);
    if (s >= 1) {
      for (uint64_t r = 0; r < R; r++) ((int32_t *)bufs[s][2])[r] = (int32_t)(W - r);
      fp4idx_tensor_init(&seqs[s].lens, FP4IDX_WIRE_I32, 1, (uint64_t[]){R},
                         bufs[s][2]);
    }
    if (s == 2)
      fp4idx_tensor_init(&seqs[s].mask, FP4IDX_WIRE_U8, 2, (uint64_t[]){R, W},
                         bufs[s][3]);
  }
  for (int topk = 0; topk <= 16; topk += 16) {
    fp4idx_request_t in = {.id = 3, .op = FP4IDX_OP_SCORE}, out;
    in.u.score.heads = H;
    in.u.score.topk = (uint32_t)topk;
    in.u.score.seqs = seqs;
    in.u.score.nseqs = NS;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    cr_assert_eq(fp4idx_encode_request(&sb, &in), 0);
    size_t len;
    unsigned char *b = nth_body(&sb, 0, &len);
    msgpack_sbuffer_destroy(&sb);
    cr_assert_eq(fp4idx_decode_request(b, len, &out, NULL, 0), 0);
    cr_assert_eq(out.u.score.heads, (uint32_t)H);
    cr_assert_eq(out.u.score.topk, (uint32_t)topk);
    cr_assert_eq(out.u.score.nseqs, (size_t)NS);
    for (int s = 0; s < NS; s++) {
      const fp4idx_score_seq_t *o = &out.u.score.seqs[s];
      cr_assert_eq(o->seq, seqs[s].seq);
      cr_assert_eq(o->rows, seqs[s].rows);
      tensor_eq(&o->q, &seqs[s].q);
      tensor_eq(&o->w, &seqs[s].w);
      check_view(&o->q, b, len);
      check_view(&o->w, b, len);
      cr_assert_eq(fp4idx_tensor_present(&o->lens), s >= 1);
      cr_assert_eq(fp4idx_tensor_present(&o->mask), s == 2);
      if (s >= 1) {
        tensor_eq(&o->lens, &seqs[s].lens);
        check_view(&o->lens, b, len);
      }
      if (s == 2) tensor_eq(&o->mask, &seqs[s].mask);
    }
    fp4idx_request_clear(&out);
    cr_assert_null(out.owned_);
    free(b);
  }
  for (int s = 0; s < NS; s++)
    for (int k = 0; k < 4; k++) free(bufs[s][k]);
}

Test(codec, truncate_drop_read_roundtrip) {
  fp4idx_request_t in = {.id = 4, .op = FP4IDX_OP_TRUNCATE}, out;
  in.u.truncate.seq = 9;
  in.u.truncate.length = 12345678901ull;
  unsigned char *b = rt_req(&in, &out);
  cr_assert_eq(out.u.truncate.seq, 9u);
  cr_assert_eq(out.u.truncate.length, 12345678901ull);
  fp4idx_request_clear(&out);
  free(b);

  memset(&in, 0, sizeof(in));
  in.id = 5;
  in.op = FP4IDX_OP_DROP;
  in.u.drop.seq = UINT64_MAX;
  b = rt_req(&in, &out);
  cr_assert_eq(out.u.drop.seq, UINT64_MAX);
  fp4idx_request_clear(&out);
  free(b);

  memset(&in, 0, sizeof(in));
  in.id = 6;
  in.op = FP4IDX_OP_READ;
  in.u.read.seq = 3;
  b = rt_req(&in, &out);
  cr_assert(out.u.read.from == 0 && !out.u.read.has_count && !out.u.read.dequant);
  fp4idx_request_clear(&out);
  free(b);
  in.u.read.from = 10;
  in.u.read.count = 0; /* zero is a real count, distinct from absent */
  in.u.read.has_count = true;
  in.u.read.dequant = true;
  b = rt_req(&in, &out);
  cr_assert(out.u.read.from == 10 && out.u.read.has_count &&
            out.u.read.count == 0 && out.u.read.dequant);
  fp4idx_request_clear(&out);
  free(b);
}

/* Decoding hand-built bodies: accepted encodings and defaults. */
static int dec(const char *text, fp4idx_request_t *out, char *msg) {
  unsigned char *body;
  size_t len;
  cr_assert_eq(mp_build_alloc(text, &body, &len), 0, "bad notation: %s", text);
  int rc = fp4idx_decode_request(body, len, out, msg, 256);
  free(body); /* only scalar fields are read after this */
  return rc;
}

Test(codec, accepts_any_integer_width) {
  fp4idx_request_t r;
  char msg[256];
  const char *ok[] = {
      "{id: u8(1), op: 'truncate', seq: u16(2), length: u32(3)}",
      "{id: u64(1), op: 'truncate', seq: u64(2), length: u64(3)}",
      "{id: i8(1), op: 'truncate', seq: i16(2), length: i32(3)}",
      "{id: i64(1), op: 'truncate', seq: 2, length: i64(3)}",
  };
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    int rc = dec(ok[i], &r, msg);
    cr_assert_eq(rc, 0, "%s: %d %s", ok[i], rc, msg);
    cr_assert(r.id == 1 && r.u.truncate.seq == 2 && r.u.truncate.length == 3);
    fp4idx_request_clear(&r);
  }
  cr_assert_eq(dec("{id: 18446744073709551615, op: 'drop', seq: 1}", &r, msg), 0);
  cr_assert_eq(r.id, UINT64_MAX);
  fp4idx_request_clear(&r);
}

Test(codec, nil_means_absent_and_defaults) {
  fp4idx_request_t r;
  char msg[256];
  cr_assert_eq(dec("{id: 1, op: 'read', seq: 4, from: nil, count: nil, "
                   "dequant: nil}",
                   &r, msg),
               0, "%s", msg);
  cr_assert(r.u.read.from == 0 && !r.u.read.has_count && !r.u.read.dequant);
  fp4idx_request_clear(&r);
  cr_assert_eq(dec("{op: 'append', id: 2, keys: T(u8, [1, 68]), seq: 1, "
                   "rounding: nil}",
                   &r, msg),
               0, "%s", msg);
  cr_assert_eq(r.u.append.rounding, FP4IDX_WIRE_ROUND_RNE);
  fp4idx_request_clear(&r);
  cr_assert_eq(dec("{id: 3, op: 'score', heads: 2, topk: nil, seqs: [{seq: 1, "
                   "q: T(bf16, [2, 2, 128]), w: T(bf16, [2, 2]), lens: nil, "
                   "mask: nil}]}",
                   &r, msg),
               0, "%s", msg);
  cr_assert_eq(r.u.score.topk, 0u);
  cr_assert(!fp4idx_tensor_present(&r.u.score.seqs[0].lens));
  fp4idx_request_clear(&r);
  /* key order does not matter; str data is accepted (old Python msgpack) */
  cr_assert_eq(dec("{keys: T(f32, [2, 128], s), seq: 8, op: 'append', id: 9}",
                   &r, msg),
               0, "%s", msg);
  cr_assert_eq(r.u.append.keys.nbytes, 2u * 128 * 4);
  fp4idx_request_clear(&r);
}

Test(codec, pipelined_frames_in_one_buffer) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  for (uint64_t id = 1; id <= 20; id++) {
    fp4idx_request_t in = {.id = id, .op = FP4IDX_OP_DROP};
    in.u.drop.seq = id * 10;
    cr_assert_eq(fp4idx_encode_request(&sb, &in), 0);
  }
  for (int i = 0; i < 20; i++) {
    size_t len;
    fp4idx_request_t out;
    unsigned char *b = nth_body(&sb, i, &len);
    cr_assert_eq(fp4idx_decode_request(b, len, &out, NULL, 0), 0);
    cr_assert_eq(out.id, (uint64_t)i + 1);
    cr_assert_eq(out.u.drop.seq, ((uint64_t)i + 1) * 10);
    fp4idx_request_clear(&out);
    free(b);
  }
  msgpack_sbuffer_destroy(&sb);
}

Test(codec, encoder_rejects_bad_structs_and_leaves_buffer) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  fp4idx_request_t first = {.id = 1, .op = FP4IDX_OP_INFO};
  cr_assert_eq(fp4idx_encode_request(&sb, &first), 0);
  size_t before = sb.size;

  fp4idx_request_t r = {.id = 2, .op = FP4IDX_OP_APPEND};
  cr_assert_eq(fp4idx_encode_request(&sb, &r), FP4IDX_EINVAL, "no keys");
  uint16_t keys[2 * 64] = {0};
  fp4idx_tensor_init(&r.u.append.keys, FP4IDX_WIRE_BF16, 2,
                     (uint64_t[]){2, 64}, keys);
  cr_assert_eq(fp4idx_encode_request(&sb, &r), FP4IDX_EINVAL, "[2,64] keys");
  cr_assert_eq(sb.size, before);

  r.op = FP4IDX_OP_NONE;
  cr_assert_eq(fp4idx_encode_request(&sb, &r), FP4IDX_EINVAL);
  r.op = (fp4idx_op_t)99;
  cr_assert_eq(fp4idx_encode_request(&sb, &r), FP4IDX_EINVAL);

  fp4idx_request_t s = {.id = 3, .op = FP4IDX_OP_SCORE};
  s.u.score.heads = 4;
  cr_assert_eq(fp4idx_encode_request(&sb, &s), FP4IDX_EINVAL, "no seqs");
  s.u.score.heads = 0;
  cr_assert_eq(fp4idx_encode_request(&sb, &s), FP4IDX_EINVAL);
  cr_assert_eq(sb.size, before);

  /* a tensor whose nbytes disagrees with its shape */
  fp4idx_tensor_t t;
  fp4idx_tensor_init(&t, FP4IDX_WIRE_U8, 2, (uint64_t[]){1, 68}, keys);
  t.nbytes = 67;
  r.op = FP4IDX_OP_APPEND;
  r.u.append.keys = t;
  cr_assert_eq(fp4idx_encode_request(&sb, &r), FP4IDX_EINVAL);
  cr_assert_eq(sb.size, before);
  cr_assert_eq(fp4idx_encode_request(NULL, &first), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_encode_request(&sb, NULL), FP4IDX_EINVAL);
  msgpack_sbuffer_destroy(&sb);
}

/* ---- responses ------------------------------------------------------------- */

Test(codec, hello_info_append_truncate_responses) {
  fp4idx_response_t in, out;
  memset(&in, 0, sizeof(in));
  in.id = 1;
  in.op = FP4IDX_OP_HELLO;
  in.u.hello.version = 1;
  strcpy(in.u.hello.server, "fp4idxd 0.1.0");
  unsigned char *b = rt_resp(&in, &out, NULL);
  cr_assert_eq(out.u.hello.version, 1u);
  cr_assert_str_eq(out.u.hello.server, "fp4idxd 0.1.0");
  fp4idx_response_clear(&out);
  free(b);

  memset(&in, 0, sizeof(in));
  in.id = 2;
  in.op = FP4IDX_OP_INFO;
  fp4idx_info_t *i = &in.u.info;
  i->version = 1;
  strcpy(i->server, "fp4idxd 0.1.0");
  strcpy(i->backend, "cuda");
  strcpy(i->device, "NVIDIA H200");
  i->page_size = 64;
  i->pages_total = 1u << 20;
  i->pages_free = 12345;
  i->sequences = 3;
  i->max_frame = 64u << 20;
  i->pages_shared = 777;
  b = rt_resp(&in, &out, NULL);
  cr_assert(memcmp(&out.u.info, &in.u.info, sizeof(in.u.info)) == 0);
  fp4idx_response_clear(&out);
  free(b);

  memset(&in, 0, sizeof(in));
  in.id = 3;
  in.op = FP4IDX_OP_APPEND;
  in.u.append.first = 100;
  in.u.append.length = 164;
  b = rt_resp(&in, &out, NULL);
  cr_assert(out.u.append.first == 100 && out.u.append.length == 164);
  fp4idx_response_clear(&out);
  free(b);

  memset(&in, 0, sizeof(in));
  in.id = 4;
  in.op = FP4IDX_OP_TRUNCATE;
  in.u.truncate.length = 77;
  b = rt_resp(&in, &out, NULL);
  cr_assert_eq(out.u.truncate.length, 77u);
  fp4idx_response_clear(&out);
  free(b);

  const fp4idx_op_t empty[] = {FP4IDX_OP_DROP, FP4IDX_OP_SAVE};
  for (int k = 0; k < 2; k++) {
    memset(&in, 0, sizeof(in));
    in.id = 5;
    in.op = empty[k];
    b = rt_resp(&in, &out, NULL);
    fp4idx_response_clear(&out);
    free(b);
  }
}

Test(codec, score_response_logits_and_topk) {
  enum { R = 4, W = 33, K = 8 };
  float *lg = pattern(R * W * 4, 5), *tl = pattern(R * K * 4, 6);
  int32_t *pos = pattern(R * K * 4, 7), cnt[R] = {8, 8, 3, 0};
  fp4idx_score_result_t res[2];
  memset(res, 0, sizeof(res));
  res[0].seq = 1;
  fp4idx_tensor_init(&res[0].logits, FP4IDX_WIRE_F32, 2, (uint64_t[]){R, W}, lg);
  res[1].seq = 2;
  res[1].topk = true;
  fp4idx_tensor_init(&res[1].positions, FP4IDX_WIRE_I32, 2, (uint64_t[]){R, K}, pos);
  fp4idx_tensor_init(&res[1].logits, FP4IDX_WIRE_F32, 2, (uint64_t[]){R, K}, tl);
  fp4idx_tensor_init(&res[1].counts, FP4IDX_WIRE_I32, 1, (uint64_t[]){R}, cnt);
  fp4idx_response_t in, out;
  memset(&in, 0, sizeof(in));
  in.id = 9;
  in.op = FP4IDX_OP_SCORE;
  in.u.score.results = res;
  in.u.score.nresults = 2;
  size_t len;
  unsigned char *b = rt_resp(&in, &out, &len);
  cr_assert_eq(out.u.score.nresults, 2u);
  cr_assert(!out.u.score.results[0].topk && out.u.score.results[1].topk);
  cr_assert_eq(out.u.score.results[1].seq, 2u);
  tensor_eq(&out.u.score.results[0].logits, &res[0].logits);
  tensor_eq(&out.u.score.results[1].logits, &res[1].logits);
  tensor_eq(&out.u.score.results[1].positions, &res[1].positions);
  tensor_eq(&out.u.score.results[1].counts, &res[1].counts);
  check_view(&out.u.score.results[0].logits, b, len);
  cr_assert_eq(fp4idx_load_i32(out.u.score.results[1].counts.data, 2), 3);
  fp4idx_response_clear(&out);
  free(b);

  /* inconsistent topk result: positions [R,K] but logits [R,K-1] */
  res[1].logits.shape[1] = K - 1;
  res[1].logits.nbytes = R * (K - 1) * 4;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_response(&sb, &in), FP4IDX_EINVAL);
  cr_assert_eq(sb.size, 0u);
  msgpack_sbuffer_destroy(&sb);
  free(lg);
  free(tl);
  free(pos);
}

/* sb's bytes from `from` with the n payloads spliced in at their offsets
 * (what a writev of them sends); malloc'ed, *len its length. */
static unsigned char *splice(const msgpack_sbuffer *sb, size_t from, const fp4idx_payload_t *pl,
                             size_t n, size_t *len) {
  size_t total = sb->size - from;
  for (size_t i = 0; i < n; i++) total += pl[i].len;
  unsigned char *joined = malloc(total ? total : 1);
  size_t at = from, w = 0;
  for (size_t i = 0; i < n; i++) {
    cr_assert(pl[i].at >= at && pl[i].at <= sb->size);
    memcpy(joined + w, sb->data + at, pl[i].at - at), w += pl[i].at - at;
    memcpy(joined + w, pl[i].data, pl[i].len), w += pl[i].len;
    at = pl[i].at;
  }
  memcpy(joined + w, sb->data + at, sb->size - at), w += sb->size - at;
  cr_assert_eq(w, total);
  *len = total;
  return joined;
}

/* The request split encoder (the client's writev path): spliced bytes ==
 * the plain encoder's, for a score of two sequences (q, w, lens, mask; q
 * and w only) and an append, at thresholds that split everything, some
 * tensors, none; too small a payload list is refused, sb unchanged. */
Test(codec, request_split_equals_whole) {
  enum { R = 3, H = 5, W = 700, N = 40 };
  void *q1 = pattern(R * H * 128 * 2, 21), *w1 = pattern(R * H * 2, 22);
  void *q2 = pattern(1 * H * 128 * 2, 23), *w2 = pattern(1 * H * 2, 24);
  void *mask = pattern(R * W, 25), *keys = pattern(N * 256, 26);
  int32_t lens[R] = {700, 3, 0};
  fp4idx_score_seq_t seqs[2];
  memset(seqs, 0, sizeof seqs);
  seqs[0].seq = 9;
  seqs[0].rows = R;
  fp4idx_tensor_init(&seqs[0].q, FP4IDX_WIRE_BF16, 3, (uint64_t[]){R, H, 128}, q1);
  fp4idx_tensor_init(&seqs[0].w, FP4IDX_WIRE_BF16, 2, (uint64_t[]){R, H}, w1);
  fp4idx_tensor_init(&seqs[0].lens, FP4IDX_WIRE_I32, 1, (uint64_t[]){R}, lens);
  fp4idx_tensor_init(&seqs[0].mask, FP4IDX_WIRE_U8, 2, (uint64_t[]){R, W}, mask);
  seqs[1].seq = 10;
  seqs[1].rows = 1;
  fp4idx_tensor_init(&seqs[1].q, FP4IDX_WIRE_BF16, 3, (uint64_t[]){1, H, 128}, q2);
  fp4idx_tensor_init(&seqs[1].w, FP4IDX_WIRE_BF16, 2, (uint64_t[]){1, H}, w2);
  fp4idx_request_t reqs[2];
  memset(reqs, 0, sizeof reqs);
  reqs[0].id = 5;
  reqs[0].op = FP4IDX_OP_SCORE;
  reqs[0].u.score.heads = H;
  reqs[0].u.score.topk = 16;
  reqs[0].u.score.seqs = seqs;
  reqs[0].u.score.nseqs = 2;
  reqs[1].id = 6;
  reqs[1].op = FP4IDX_OP_APPEND;
  reqs[1].u.append.seq = 4;
  fp4idx_tensor_init(&reqs[1].u.append.keys, FP4IDX_WIRE_BF16, 2, (uint64_t[]){N, 128}, keys);
  /* payloads at each threshold: score q1 3840 B, mask 2100, q2 1280, w1 30,
   * lens 12, w2 10 (< 64: never); append 10240 */
  const size_t mins[] = {1, 2000, 4096, 1u << 30};
  const size_t want_n[2][4] = {{3, 2, 0, 0}, {1, 1, 1, 0}};
  for (int r = 0; r < 2; r++) {
    msgpack_sbuffer whole;
    msgpack_sbuffer_init(&whole);
    cr_assert_eq(fp4idx_encode_request(&whole, &reqs[r]), 0);
    for (int m = 0; m < 4; m++) {
      msgpack_sbuffer sb;
      msgpack_sbuffer_init(&sb);
      msgpack_sbuffer_write(&sb, "pre", 3); /* appends after what is there */
      fp4idx_payload_t pl[8];
      size_t n = 99, len = 0;
      cr_assert_eq(fp4idx_encode_request_split(&sb, &reqs[r], mins[m], pl, 8, &n), 0);
      cr_assert_eq(n, want_n[r][m], "request %d, min %zu: %zu payloads", r, mins[m], n);
      unsigned char *joined = splice(&sb, 3, pl, n, &len);
      cr_assert_eq(len, whole.size);
      cr_assert(memcmp(joined, whole.data, len) == 0, "request %d, min %zu: bytes differ", r,
                mins[m]);
      free(joined);
      if (n > 0) {
        size_t before = sb.size;
        cr_assert_eq(fp4idx_encode_request_split(&sb, &reqs[r], mins[m], pl, n - 1, &n),
                     FP4IDX_EINVAL);
        cr_assert_eq(sb.size, before);
      }
      msgpack_sbuffer_destroy(&sb);
    }
    msgpack_sbuffer_destroy(&whole);
  }
  size_t n = 0;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  reqs[0].u.score.heads = 0; /* a bad struct: refused as the plain encoder does */
  cr_assert_eq(fp4idx_encode_request_split(&sb, &reqs[0], 1, NULL, 0, &n), FP4IDX_EINVAL);
  cr_assert_eq(sb.size, 0);
  msgpack_sbuffer_destroy(&sb);
  free(q1), free(w1), free(q2), free(w2), free(mask), free(keys);
}

/* The split encoder's bytes with the payloads spliced back in == the plain
 * encoder's bytes, for several thresholds (everything split, some, none). */
Test(codec, score_response_split_equals_whole) {
  enum { R = 4, W = 1500, K = 300 };
  float *lg = pattern(R * W * 4, 15), *tl = pattern(R * K * 4, 16);
  int32_t *pos = pattern(R * K * 4, 17), cnt[R] = {300, 300, 3, 0};
  fp4idx_score_result_t res[3];
  memset(res, 0, sizeof(res));
  res[0].seq = 1;
  fp4idx_tensor_init(&res[0].logits, FP4IDX_WIRE_F32, 2, (uint64_t[]){R, W}, lg);
  res[1].seq = 2;
  res[1].topk = true;
  fp4idx_tensor_init(&res[1].positions, FP4IDX_WIRE_I32, 2, (uint64_t[]){R, K}, pos);
  fp4idx_tensor_init(&res[1].logits, FP4IDX_WIRE_F32, 2, (uint64_t[]){R, K}, tl);
  fp4idx_tensor_init(&res[1].counts, FP4IDX_WIRE_I32, 1, (uint64_t[]){R}, cnt);
  res[2].seq = 3; /* W = 0: an empty payload is never split */
  fp4idx_tensor_init(&res[2].logits, FP4IDX_WIRE_F32, 2, (uint64_t[]){R, 0}, NULL);
  fp4idx_response_t in;
  memset(&in, 0, sizeof(in));
  in.id = 77;
  in.op = FP4IDX_OP_SCORE;
  in.u.score.results = res;
  in.u.score.nresults = 3;
  msgpack_sbuffer whole;
  msgpack_sbuffer_init(&whole);
  cr_assert_eq(fp4idx_encode_response(&whole, &in), 0);
  const size_t mins[] = {1, 4096, 1u << 30};
  const size_t want_n[] = {4, 3, 0};
  for (int m = 0; m < 3; m++) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_sbuffer_write(&sb, "pre", 3); /* appends after what is there */
    fp4idx_payload_t pl[9];
    size_t n = 99;
    cr_assert_eq(fp4idx_encode_response_split(&sb, &in, mins[m], pl, 9, &n), 0);
    cr_assert_eq(n, want_n[m], "min %zu: %zu payloads", mins[m], n);
    size_t total = 0;
    unsigned char *joined = splice(&sb, 3, pl, n, &total);
    cr_assert_eq(total, whole.size);
    cr_assert(memcmp(joined, whole.data, total) == 0, "min %zu: bytes differ", mins[m]);
    free(joined);
    /* too little room for the payload list: refused, buffer unchanged */
    if (n > 0) {
      size_t before = sb.size;
      cr_assert_eq(fp4idx_encode_response_split(&sb, &in, mins[m], pl, n - 1, &n),
                   FP4IDX_EINVAL);
      cr_assert_eq(sb.size, before);
    }
    msgpack_sbuffer_destroy(&sb);
  }
  msgpack_sbuffer_destroy(&whole);
  free(lg);
  free(tl);
  free(pos);
}

Test(codec, read_response_packed_dequant_empty) {
  struct {
    fp4idx_wire_dtype_t dt;
    uint64_t n, d;
  } c[] = {{FP4IDX_WIRE_U8, 10, 68}, {FP4IDX_WIRE_F32, 3, 128},
           {FP4IDX_WIRE_U8, 0, 68}};
  for (int k = 0; k < 3; k++) {
    size_t nb = c[k].n * c[k].d * fp4idx_wire_dtype_size(c[k].dt);
    void *d = pattern(nb, 9);
    fp4idx_response_t in, out;
    memset(&in, 0, sizeof(in));
    in.id = 6;
    in.op = FP4IDX_OP_READ;
    fp4idx_tensor_init(&in.u.read.keys, c[k].dt, 2,
                       (uint64_t[]){c[k].n, c[k].d}, d);
    unsigned char *b = rt_resp(&in, &out, NULL);
    tensor_eq(&out.u.read.keys, &in.u.read.keys);
    fp4idx_response_clear(&out);
    free(b);
    free(d);
  }
}

Test(codec, stats_response) {
  fp4idx_op_stats_t ops[2];
  memset(ops, 0, sizeof(ops));
  for (int o = 0; o < 2; o++) {
    strcpy(ops[o].op, o ? "score" : "append");
    ops[o].count = 1000u + (unsigned)o;
    ops[o].errors = (unsigned)o;
    ops[o].nbuckets = 26;
    for (int i = 0; i < 25; i++) {
      ops[o].le_us[i] = (double)(1u << i);
      ops[o].hist[i] = (uint64_t)(i * o);
    }
    ops[o].le_us[25] = INFINITY;
    ops[o].hist[25] = 1;
    ops[o].sum_us = 1234.5;
  }
  fp4idx_response_t in, out;
  memset(&in, 0, sizeof(in));
  in.id = 8;
  in.op = FP4IDX_OP_STATS;
  fp4idx_stats_t *st = &in.u.stats;
  st->uptime_s = 12.25;
  st->connections = 3;
  st->sequences = 4;
  st->keys = 5;
  strcpy(st->backend, "cpu");
  strcpy(st->device, "host (16 threads)");
  st->pages_total = 100;
  st->pages_free = 90;
  st->ops = ops;
  st->nops = 2;
  fp4idx_op_stats_t stg[3];
  memset(stg, 0, sizeof(stg));
  for (int g = 0; g < 3; g++) {
    snprintf(stg[g].op, sizeof(stg[g].op), "stage%d", g);
    stg[g].count = 10u + (unsigned)g;
    stg[g].nbuckets = 2;
    stg[g].le_us[0] = 1;
    stg[g].le_us[1] = INFINITY;
    stg[g].hist[0] = 4;
    stg[g].hist[1] = 6u + (unsigned)g;
    stg[g].sum_us = 0.25 * g;
  }
  st->stages = stg;
  st->nstages = 3;
  unsigned char *b = rt_resp(&in, &out, NULL);
  const fp4idx_stats_t *o = &out.u.stats;
  cr_assert(o->uptime_s == 12.25 && o->connections == 3 && o->sequences == 4 &&
            o->keys == 5 && o->pages_total == 100 && o->pages_free == 90);
  cr_assert_str_eq(o->backend, "cpu");
  cr_assert_str_eq(o->device, "host (16 threads)");
  cr_assert_eq(o->nops, 2u);
  for (int k = 0; k < 2; k++) {
    cr_assert_str_eq(o->ops[k].op, ops[k].op);
    cr_assert_eq(o->ops[k].count, ops[k].count);
    cr_assert_eq(o->ops[k].errors, ops[k].errors);
    cr_assert_eq(o->ops[k].nbuckets, 26u);
    cr_assert(memcmp(o->ops[k].le_us, ops[k].le_us, 26 * sizeof(double)) == 0);
    cr_assert(memcmp(o->ops[k].hist, ops[k].hist, 26 * sizeof(uint64_t)) == 0);
    cr_assert(isinf(o->ops[k].le_us[25]));
    cr_assert_eq(o->ops[k].sum_us, 1234.5);
  }
  cr_assert_eq(o->nstages, 3u);
  for (int g = 0; g < 3; g++) {
    cr_assert_str_eq(o->stages[g].op, stg[g].op);
    cr_assert_eq(o->stages[g].count, stg[g].count);
    cr_assert_eq(o->stages[g].nbuckets, 2u);
    cr_assert_eq(o->stages[g].hist[1], stg[g].hist[1]);
    cr_assert(isinf(o->stages[g].le_us[1]));
    cr_assert_eq(o->stages[g].sum_us, stg[g].sum_us);
  }
  fp4idx_response_clear(&out);
  free(b);
  /* without stages the map is absent and decodes as none */
  st->nstages = 0;
  st->stages = NULL;
  b = rt_resp(&in, &out, NULL);
  cr_assert_eq(out.u.stats.nstages, 0u);
  cr_assert_null(out.u.stats.stages);
  cr_assert_eq(out.u.stats.nops, 2u);
  fp4idx_response_clear(&out);
  free(b);
}

Test(codec, error_response) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_error(&sb, 42, FP4IDX_ENOSEQ, "unknown sequence 7"), 0);
  cr_assert_eq(fp4idx_encode_error(&sb, 43, FP4IDX_EFULL, NULL), 0);
  /* non-ASCII and control bytes are replaced so the str is valid UTF-8 */
  cr_assert_eq(fp4idx_encode_error(&sb, 44, FP4IDX_ETYPE, "op 'x\xc3\xa9\n'"), 0);
  cr_assert_eq(fp4idx_encode_error(&sb, 45, 0, "no"), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_encode_error(&sb, 45, 3, "no"), FP4IDX_EINVAL);
  char longmsg[1000];
  memset(longmsg, 'a', sizeof(longmsg) - 1);
  longmsg[sizeof(longmsg) - 1] = 0;
  cr_assert_eq(fp4idx_encode_error(&sb, 46, FP4IDX_EPROTO, longmsg), 0);

  struct {
    uint64_t id;
    int st;
    const char *msg;
  } want[] = {{42, FP4IDX_ENOSEQ, "unknown sequence 7"},
              {43, FP4IDX_EFULL, "page pool is full"},
              {44, FP4IDX_ETYPE, "op 'x\?\?\?'"}};
  for (int i = 0; i < 4; i++) {
    size_t len;
    fp4idx_response_t out;
    unsigned char *b = nth_body(&sb, i, &len);
    /* an error reply decodes whatever op was asked */
    cr_assert_eq(fp4idx_decode_response(b, len, FP4IDX_OP_SCORE, &out, NULL, 0), 0);
    if (i < 3) {
      cr_assert_eq(out.id, want[i].id);
      cr_assert_eq(out.status, want[i].st);
      cr_assert_str_eq(out.error, want[i].msg);
    } else {
      cr_assert_eq(strlen(out.error), FP4IDX_PROTO_ERROR_CAP - 1);
    }
    fp4idx_response_clear(&out);
    free(b);
  }
  msgpack_sbuffer_destroy(&sb);
}

Test(codec, response_decoder_ignores_unknown_keys) {
  unsigned char *b;
  size_t len;
  fp4idx_response_t out;
  char msg[256];
  cr_assert_eq(mp_build_alloc("{id: 1, status: 0, first: 5, length: 6, "
                              "future_field: [1, 'x', {a: nil}]}",
                              &b, &len),
               0);
  cr_assert_eq(fp4idx_decode_response(b, len, FP4IDX_OP_APPEND, &out, msg, 256),
               0, "%s", msg);
  cr_assert(out.u.append.first == 5 && out.u.append.length == 6);
  fp4idx_response_clear(&out);
  free(b);
  /* ... but not a missing one */
  cr_assert_eq(mp_build_alloc("{id: 1, status: 0, first: 5}", &b, &len), 0);
  cr_assert_eq(fp4idx_decode_response(b, len, FP4IDX_OP_APPEND, &out, msg, 256),
               FP4IDX_EPROTO);
  cr_assert(strstr(msg, "length") != NULL, "%s", msg);
  fp4idx_response_clear(&out);
  free(b);
}

/* ---- helpers of the API ------------------------------------------------------ */

/* Every non-finite bf16 (inf, -inf, NaNs) at every position of q and w,
 * with q at an odd address (views into a frame are unaligned) and lengths
 * that leave a tail of 1..3 values: ENONFINITE naming the first one; the
 * finite extremes (max, min subnormal, -0) pass. */
Test(codec, score_seq_check_finds_every_nonfinite) {
  static const uint16_t bad[] = {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff};
  static const uint16_t good[] = {0x7f7f, 0xff7f, 0x0001, 0x8000, 0x3f80};
  for (uint32_t heads = 1; heads <= 3; heads++) {
    const uint32_t rows = 2;
    size_t nq = (size_t)rows * heads * 128, nw = (size_t)rows * heads;
    unsigned char *qb = calloc(nq * 2 + 1, 1), *wb = calloc(nw * 2 + 1, 1);
    const void *q = qb + 1, *w = wb + 1; /* odd addresses */
    fp4idx_score_seq_t s;
    uint64_t width;
    char msg[256];
    memset(&s, 0, sizeof(s));
    s.seq = 3;
    s.rows = rows;
    fp4idx_tensor_init(&s.q, FP4IDX_WIRE_BF16, 3, (uint64_t[]){rows, heads, 128}, q);
    fp4idx_tensor_init(&s.w, FP4IDX_WIRE_BF16, 2, (uint64_t[]){rows, heads}, w);
    for (size_t i = 0; i < nq; i += (i < 140 ? 1 : 37)) {
      for (size_t g = 0; g < 5; g++) {
        memcpy(qb + 1 + i * 2, &good[g], 2);
        cr_assert_eq(fp4idx_score_seq_check(&s, 10, &width, msg, sizeof msg), 0, "%s", msg);
      }
      for (size_t b = 0; b < 5; b++) {
        memcpy(qb + 1 + i * 2, &bad[b], 2);
        cr_assert_eq(fp4idx_score_seq_check(&s, 10, &width, msg, sizeof msg), FP4IDX_ENONFINITE,
                     "q value %zu = 0x%04x passed", i, bad[b]);
        char want[64];
        snprintf(want, sizeof want, "q[%zu,%zu,%zu]", i / (heads * 128), i / 128 % heads, i % 128);
        cr_assert(strstr(msg, want) != NULL, "%s (want %s)", msg, want);
      }
      memset(qb + 1 + i * 2, 0, 2);
    }
    for (size_t i = 0; i < nw; i++) {
      memcpy(wb + 1 + i * 2, &bad[i % 5], 2);
      cr_assert_eq(fp4idx_score_seq_check(&s, 10, &width, msg, sizeof msg), FP4IDX_ENONFINITE);
      char want[64];
      snprintf(want, sizeof want, "w[%zu,%zu]", i / heads, i % heads);
      cr_assert(strstr(msg, want) != NULL, "%s (want %s)", msg, want);
      memset(wb + 1 + i * 2, 0, 2);
    }
    free(qb);
    free(wb);
  }
}

Test(codec, score_seq_check) {
  int32_t lens[3] = {5, 0, 9};
  uint8_t mask[3 * 9] = {0};
  uint16_t q[3 * 128] = {0}, w[3] = {0};
  fp4idx_score_seq_t s;
  uint64_t width;
  char msg[256];
  memset(&s, 0, sizeof(s));
  s.seq = 7;
  s.rows = 3;
  fp4idx_tensor_init(&s.q, FP4IDX_WIRE_BF16, 3, (uint64_t[]){3, 1, 128}, q);
  fp4idx_tensor_init(&s.w, FP4IDX_WIRE_BF16, 2, (uint64_t[]){3, 1}, w);
  cr_assert_eq(fp4idx_score_seq_check(&s, 12, &width, msg, 256), 0);
  cr_assert_eq(width, 12u, "without lens W = keys");
  fp4idx_tensor_init(&s.lens, FP4IDX_WIRE_I32, 1, (uint64_t[]){3}, lens);
  cr_assert_eq(fp4idx_score_seq_check(&s, 12, &width, msg, 256), 0);
  cr_assert_eq(width, 9u, "W = max(lens)");
  cr_assert_eq(fp4idx_score_seq_check(&s, 9, &width, msg, 256), 0);
  cr_assert_eq(fp4idx_score_seq_check(&s, 8, &width, msg, 256), FP4IDX_ERANGE);
  cr_assert(strstr(msg, "lens[2]") != NULL, "%s", msg);
  lens[1] = -1;
  cr_assert_eq(fp4idx_score_seq_check(&s, 100, &width, msg, 256), FP4IDX_ERANGE);
  lens[1] = 0;
  fp4idx_tensor_init(&s.mask, FP4IDX_WIRE_U8, 2, (uint64_t[]){3, 9}, mask);
  cr_assert_eq(fp4idx_score_seq_check(&s, 100, &width, msg, 256), 0);
  fp4idx_tensor_init(&s.mask, FP4IDX_WIRE_U8, 2, (uint64_t[]){3, 8}, mask);
  cr_assert_eq(fp4idx_score_seq_check(&s, 100, &width, msg, 256), FP4IDX_ESHAPE);
  cr_assert_eq(fp4idx_score_seq_check(NULL, 1, &width, NULL, 0), FP4IDX_EINVAL);
  /* its halves: the finite scan alone, the rest alone */
  fp4idx_tensor_init(&s.mask, FP4IDX_WIRE_U8, 2, (uint64_t[]){3, 9}, mask);
  q[200] = 0x7fc0; /* NaN */
  lens[2] = 13;    /* over 12 keys */
  cr_assert_eq(fp4idx_score_seq_check(&s, 12, &width, msg, 256), FP4IDX_ENONFINITE);
  cr_assert_eq(fp4idx_score_seq_finite(&s, msg, 256), FP4IDX_ENONFINITE);
  cr_assert(strstr(msg, "q[1,0,72] is NaN") != NULL, "%s", msg);
  cr_assert_eq(fp4idx_score_seq_check_shape(&s, 12, &width, msg, 256), FP4IDX_ERANGE);
  lens[2] = 9;
  cr_assert_eq(fp4idx_score_seq_check_shape(&s, 12, &width, msg, 256), 0, "q is not scanned");
  cr_assert_eq(width, 9u);
  q[200] = 0;
  cr_assert_eq(fp4idx_score_seq_finite(&s, msg, 256), 0);
  cr_assert_eq(fp4idx_score_seq_finite(NULL, msg, 256), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_score_seq_check_shape(NULL, 1, &width, NULL, 0), FP4IDX_EINVAL);
}

Test(codec, names_and_tensor_init) {
  for (int op = FP4IDX_OP_NONE + 1; op < FP4IDX_OP__COUNT; op++) {
    const char *n = fp4idx_op_name((fp4idx_op_t)op);
    cr_assert_eq(fp4idx_op_from_name(n, strlen(n)), (fp4idx_op_t)op);
  }
  cr_assert_str_eq(fp4idx_op_name(FP4IDX_OP_NONE), "?");
  cr_assert_eq(fp4idx_op_from_name("appendx", 6), FP4IDX_OP_APPEND);
  cr_assert_eq(fp4idx_op_from_name("appen", 5), FP4IDX_OP_NONE);
  cr_assert_eq(fp4idx_wire_dtype_size(FP4IDX_WIRE_BF16), 2u);
  cr_assert_eq(fp4idx_wire_dtype_size(FP4IDX_WIRE_U8), 1u);
  cr_assert_eq(fp4idx_wire_dtype_size((fp4idx_wire_dtype_t)77), 0u);
  cr_assert_str_eq(fp4idx_wire_dtype_name(FP4IDX_WIRE_I32), "i32");

  fp4idx_tensor_t t;
  uint64_t big[2] = {UINT64_MAX / 2, 4};
  cr_assert_eq(fp4idx_tensor_init(&t, FP4IDX_WIRE_F32, 2, big, &t), FP4IDX_E2BIG);
  cr_assert_eq(fp4idx_tensor_init(&t, FP4IDX_WIRE_F32, 0, big, &t), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_tensor_init(&t, FP4IDX_WIRE_F32, 5, big, &t), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_tensor_init(&t, FP4IDX_WIRE_NONE, 1, big, &t), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_tensor_init(&t, FP4IDX_WIRE_U8, 1, (uint64_t[]){3}, NULL),
               FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_tensor_init(&t, FP4IDX_WIRE_U8, 1, (uint64_t[]){0}, NULL), 0);
  cr_assert_eq(t.nbytes, 0u);

  /* unaligned loads */
  unsigned char buf[9] = {0xff, 1, 0, 0, 0, 0, 0, 0x80, 0x3f};
  cr_assert_eq(fp4idx_load_i32(buf + 1, 0), 1);
  cr_assert_eq(fp4idx_load_f32(buf + 5, 0), 1.0f);
  cr_assert_eq(fp4idx_load_bf16(buf + 7, 0), 0x3f80);
}

/* ---- every op of the op list: what the encoder writes, the decoder takes ---- */

/* A small valid request of `op` (tensors point into `buf`). An op whose
 * zeroed request is valid (integer fields only, fp4idx__op_plain: generated
 * from the op table) is covered as it is; any other op without a sample
 * here fails the test below, so a new row with tensors, enums or nested
 * fields gets one. */
static bool sample_request(fp4idx_op_t op, fp4idx_request_t *r,
                           fp4idx_score_seq_t *seq, unsigned char *buf) {
  memset(r, 0, sizeof(*r));
  r->id = 100 + (uint64_t)op;
  r->op = op;
  switch (op) {
    case FP4IDX_OP_HELLO:
      r->u.hello.version = 1;
      r->u.hello.client = (fp4idx_strview_t){"test", 4};
      return true;
    case FP4IDX_OP_APPEND:
      r->u.append.seq = 7;
      r->u.append.rounding = FP4IDX_WIRE_ROUND_THRESHOLD;
      return fp4idx_tensor_init(&r->u.append.keys, FP4IDX_WIRE_U8, 2,
                                (uint64_t[]){2, FP4IDX_PROTO_SLOT_BYTES},
                                buf) == 0;
    case FP4IDX_OP_SCORE:
      memset(seq, 0, sizeof(*seq));
      seq->seq = 7;
      r->u.score.heads = 2;
      r->u.score.topk = 3;
      r->u.score.seqs = seq;
      r->u.score.nseqs = 1;
      return fp4idx_tensor_init(&seq->q, FP4IDX_WIRE_BF16, 3,
                                (uint64_t[]){1, 2, FP4IDX_PROTO_HEAD_DIM},
                                buf) == 0 &&
             fp4idx_tensor_init(&seq->w, FP4IDX_WIRE_BF16, 2,
                                (uint64_t[]){1, 2}, buf) == 0;
    case FP4IDX_OP_TRUNCATE:
      r->u.truncate.seq = 7;
      r->u.truncate.length = 3;
      return true;
    case FP4IDX_OP_DROP: r->u.drop.seq = 7; return true;
    case FP4IDX_OP_FORK:
      r->u.fork = (fp4idx_fork_req_t){.src = 7, .dst = UINT64_MAX, .length = 3};
      return true;
    case FP4IDX_OP_READ:
      r->u.read = (fp4idx_read_req_t){.seq = 7, .from = 1, .count = 2,
                                      .has_count = true, .dequant = true};
      return true;
    case FP4IDX_OP_LIST:
      r->u.list.cursor = 0x8000000000000001ull;
      r->u.list.count = 25;
      return true;
    case FP4IDX_OP_REGISTER:
      r->u.register_ = (fp4idx_register_req_t){.kind = FP4IDX_REGION_CUDA,
                                               .size = 1u << 20,
                                               .handle = buf,
                                               .handle_len = 64,
                                               .device = 3};
      return true;
    case FP4IDX_OP_UNREGISTER:
      r->u.unregister.region = 12;
      return true;
    case FP4IDX_OP_CHANNEL_OPEN:
      r->u.channel_open = (fp4idx_channel_open_req_t){.slots = 64, .size = 64 + 64 * 128,
                                                      .q_region = 1, .w_region = 1,
                                                      .out_region = 2, .lens_region = 3};
      return true;
    case FP4IDX_OP_INFO: case FP4IDX_OP_STATS: case FP4IDX_OP_SAVE:
      return true;
    default: return fp4idx__op_plain(op);
  }
}

Test(codec, every_op_encodes_what_decodes) {
  static unsigned char buf[1024];
  for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (unsigned char)(i * 7);
  for (int op = FP4IDX_OP_NONE + 1; op < FP4IDX_OP__COUNT; op++) {
    fp4idx_request_t in, out;
    fp4idx_score_seq_t seq;
    cr_assert(sample_request((fp4idx_op_t)op, &in, &seq, buf),
              "no sample request for op %s", fp4idx_op_name((fp4idx_op_t)op));
    msgpack_sbuffer a, b;
    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    cr_assert_eq(fp4idx_encode_request(&a, &in), 0, "%s",
                 fp4idx_op_name((fp4idx_op_t)op));
    char msg[256];
    int rc = fp4idx_decode_request(a.data + 4, a.size - 4, &out, msg,
                                   sizeof(msg));
    cr_assert_eq(rc, 0, "%s: %s", fp4idx_op_name((fp4idx_op_t)op), msg);
    cr_assert_eq(out.op, (fp4idx_op_t)op);
    cr_assert_eq(out.id, in.id);
    /* and the decoded request encodes to the very same bytes */
    cr_assert_eq(fp4idx_encode_request(&b, &out), 0);
    cr_assert_eq(a.size, b.size, "%s", fp4idx_op_name((fp4idx_op_t)op));
    cr_assert(memcmp(a.data, b.data, a.size) == 0, "%s",
              fp4idx_op_name((fp4idx_op_t)op));
    fp4idx_request_clear(&out);
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
  }
}

/* fp4idx_encode_response does not decode again the responses that are all
 * scalars (fp4idx__resp_scalar): each of them, its every byte 0x01 (numbers
 * nonzero, bools true, fixed strings filled to their buffer's end with no
 * NUL), decodes, and encodes again to the same bytes; "hello", "info" and
 * "append" are among them, "score", "read", "stats" and "list" are not. */
Test(codec, scalar_responses_decode_as_packed) {
  cr_assert(fp4idx__resp_scalar(FP4IDX_OP_HELLO) && fp4idx__resp_scalar(FP4IDX_OP_INFO) &&
            fp4idx__resp_scalar(FP4IDX_OP_APPEND));
  cr_assert(!fp4idx__resp_scalar(FP4IDX_OP_SCORE) && !fp4idx__resp_scalar(FP4IDX_OP_READ) &&
            !fp4idx__resp_scalar(FP4IDX_OP_STATS) && !fp4idx__resp_scalar(FP4IDX_OP_LIST));
  int n = 0;
  for (int op = FP4IDX_OP_NONE + 1; op < FP4IDX_OP__COUNT; op++) {
    if (!fp4idx__resp_scalar((fp4idx_op_t)op)) continue;
    n++;
    fp4idx_response_t in, out;
    memset(&in, 0, sizeof in);
    memset(&in.u, 0x01, sizeof in.u);
    in.id = 5;
    in.op = (fp4idx_op_t)op;
    msgpack_sbuffer a, b;
    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    cr_assert_eq(fp4idx_encode_response(&a, &in), 0, "%s", fp4idx_op_name((fp4idx_op_t)op));
    char msg[256] = "";
    cr_assert_eq(fp4idx_decode_response(a.data + 4, a.size - 4, (fp4idx_op_t)op, &out, msg,
                                        sizeof msg),
                 0, "%s: %s", fp4idx_op_name((fp4idx_op_t)op), msg);
    cr_assert_eq(fp4idx_encode_response(&b, &out), 0);
    cr_assert(a.size == b.size && memcmp(a.data, b.data, a.size) == 0,
              "%s: decoded and encoded again, the bytes differ", fp4idx_op_name((fp4idx_op_t)op));
    fp4idx_response_clear(&out);
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
  }
  cr_assert_geq(n, 3);
}

Test(codec, fork_request_and_response) {
  fp4idx_request_t in = {.id = 9, .op = FP4IDX_OP_FORK}, out;
  in.u.fork = (fp4idx_fork_req_t){.src = 1ull << 63, .dst = 5, .length = 100000};
  unsigned char *b = rt_req(&in, &out);
  cr_assert_eq(out.u.fork.src, 1ull << 63);
  cr_assert_eq(out.u.fork.dst, 5u);
  cr_assert_eq(out.u.fork.length, 100000u);
  fp4idx_request_clear(&out);
  free(b);
  fp4idx_response_t rin = {.id = 9, .op = FP4IDX_OP_FORK}, rout;
  rin.u.fork.length = 100000;
  b = rt_resp(&rin, &rout, NULL);
  cr_assert_eq(rout.u.fork.length, 100000u);
  fp4idx_response_clear(&rout);
  free(b);
  /* A field missing or of the wrong type is refused, like every request. */
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 4);
  msgpack_pack_str_with_body(&pk, "id", 2);
  msgpack_pack_uint64(&pk, 1);
  msgpack_pack_str_with_body(&pk, "op", 2);
  msgpack_pack_str_with_body(&pk, "fork", 4);
  msgpack_pack_str_with_body(&pk, "src", 3);
  msgpack_pack_uint64(&pk, 1);
  msgpack_pack_str_with_body(&pk, "dst", 3);
  msgpack_pack_int64(&pk, -2);
  char msg[256];
  fp4idx_request_t bad;
  cr_assert_neq(fp4idx_decode_request(sb.data, sb.size, &bad, msg, sizeof msg), 0);
  fp4idx_request_clear(&bad);
  msgpack_sbuffer_destroy(&sb);
}

/* "pages_shared" came with fork: a daemon without it still decodes (0). */
Test(codec, info_without_pages_shared) {
  static const char *const k[] = {"version", "page_size", "pages_total", "pages_free",
                                  "sequences", "max_frame"};
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 5 + 6);
  msgpack_pack_str_with_body(&pk, "id", 2);
  msgpack_pack_uint64(&pk, 3);
  msgpack_pack_str_with_body(&pk, "status", 6);
  msgpack_pack_int64(&pk, 0);
  const char *sk[] = {"server", "backend", "device"};
  for (int j = 0; j < 3; j++) {
    msgpack_pack_str_with_body(&pk, sk[j], strlen(sk[j]));
    msgpack_pack_str_with_body(&pk, "x", 1);
  }
  for (int j = 0; j < 6; j++) {
    msgpack_pack_str_with_body(&pk, k[j], strlen(k[j]));
    msgpack_pack_uint64(&pk, 1 + (uint64_t)j);
  }
  fp4idx_response_t out;
  char msg[256];
  cr_assert_eq(fp4idx_decode_response(sb.data, sb.size, FP4IDX_OP_INFO, &out, msg, sizeof msg),
               0, "%s", msg);
  cr_assert_eq(out.u.info.pages_free, 4u);
  cr_assert_eq(out.u.info.pages_shared, 0u);
  cr_assert_str_eq(out.u.info.gpu_sharing, "", "absent from an older daemon");
  cr_assert_eq(out.u.info.gpu_other_processes, 0u);
  fp4idx_response_clear(&out);
  msgpack_sbuffer_destroy(&sb);
}

/* The op table's flags: what the daemon logs, replays and refuses without
 * persistence. */
Test(codec, op_flags) {
  cr_assert(fp4idx_op_flags(FP4IDX_OP_APPEND) & FP4IDX_OPF_MUTATES);
  cr_assert(fp4idx_op_flags(FP4IDX_OP_TRUNCATE) & FP4IDX_OPF_MUTATES);
  cr_assert(fp4idx_op_flags(FP4IDX_OP_DROP) & FP4IDX_OPF_MUTATES);
  cr_assert(fp4idx_op_flags(FP4IDX_OP_FORK) & FP4IDX_OPF_MUTATES);
  cr_assert_not(fp4idx_op_flags(FP4IDX_OP_SCORE) & FP4IDX_OPF_MUTATES);
  cr_assert_not(fp4idx_op_flags(FP4IDX_OP_READ) & FP4IDX_OPF_MUTATES);
  cr_assert(fp4idx_op_flags(FP4IDX_OP_SAVE) & FP4IDX_OPF_PERSIST);
  cr_assert_eq(fp4idx_op_flags(FP4IDX_OP_NONE), 0u);
  cr_assert_eq(fp4idx_op_flags(FP4IDX_OP__COUNT), 0u);
  /* the generated "a zeroed request is valid" of the op table */
  cr_assert(fp4idx__op_plain(FP4IDX_OP_TRUNCATE));
  cr_assert(fp4idx__op_plain(FP4IDX_OP_LIST)); /* count 0: absent */
  cr_assert_not(fp4idx__op_plain(FP4IDX_OP_APPEND));   /* a tensor */
  cr_assert_not(fp4idx__op_plain(FP4IDX_OP_SCORE));    /* heads >= 1, seqs */
  cr_assert_not(fp4idx__op_plain(FP4IDX_OP_REGISTER)); /* kind, size >= 1 */
  for (int op = FP4IDX_OP_NONE + 1; op < FP4IDX_OP__COUNT; op++) {
    const char *n = fp4idx_op_name((fp4idx_op_t)op);
    cr_assert_eq(fp4idx_op_from_name(n, strlen(n)), (fp4idx_op_t)op);
  }
}

/* "list": the response round trip, and what the encoder refuses. */
Test(codec, list_round_trip_and_encoder_checks) {
  fp4idx_list_entry_t e[3] = {{7, 130, 3, 2}, {0, 0, 0, 0}, {UINT64_MAX, 1, 1, 1}};
  fp4idx_response_t in = {.id = 9, .op = FP4IDX_OP_LIST};
  in.u.list = (fp4idx_list_resp_t){.cursor = 12345, .seqs = e, .nseqs = 3};
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_response(&sb, &in), 0);
  fp4idx_response_t out;
  char msg[256];
  cr_assert_eq(fp4idx_decode_response(sb.data + 4, sb.size - 4, FP4IDX_OP_LIST,
                                      &out, msg, sizeof(msg)),
               0, "%s", msg);
  cr_assert_eq(out.u.list.cursor, 12345u);
  cr_assert_eq(out.u.list.nseqs, 3u);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(out.u.list.seqs[i].seq, e[i].seq);
    cr_assert_eq(out.u.list.seqs[i].keys, e[i].keys);
    cr_assert_eq(out.u.list.seqs[i].pages, e[i].pages);
    cr_assert_eq(out.u.list.seqs[i].pages_shared, e[i].pages_shared);
  }
  fp4idx_response_clear(&out);
  /* an empty step: cursor not 0, no sequences */
  msgpack_sbuffer_clear(&sb);
  in.u.list = (fp4idx_list_resp_t){.cursor = 5};
  cr_assert_eq(fp4idx_encode_response(&sb, &in), 0);
  cr_assert_eq(fp4idx_decode_response(sb.data + 4, sb.size - 4, FP4IDX_OP_LIST,
                                      &out, msg, sizeof(msg)),
               0);
  cr_assert_eq(out.u.list.nseqs, 0u);
  cr_assert_null(out.u.list.seqs);
  cr_assert_eq(out.u.list.cursor, 5u);
  fp4idx_response_clear(&out);
  /* seqs NULL with a count: refused, buffer unchanged */
  msgpack_sbuffer_clear(&sb);
  in.u.list = (fp4idx_list_resp_t){.cursor = 5, .nseqs = 2};
  cr_assert_eq(fp4idx_encode_response(&sb, &in), FP4IDX_EINVAL);
  cr_assert_eq(sb.size, 0u);
  /* requests: count 0 is "absent", above the bound E2BIG */
  fp4idx_request_t r = {.id = 1, .op = FP4IDX_OP_LIST};
  r.u.list.count = FP4IDX_PROTO_MAX_LIST_COUNT + 1;
  cr_assert_eq(fp4idx_encode_request(&sb, &r), FP4IDX_E2BIG);
  cr_assert_eq(sb.size, 0u);
  r.u.list.count = 0;
  cr_assert_eq(fp4idx_encode_request(&sb, &r), 0);
  fp4idx_request_t back;
  cr_assert_eq(fp4idx_decode_request(sb.data + 4, sb.size - 4, &back, msg,
                                     sizeof(msg)),
               0, "%s", msg);
  cr_assert_eq(back.u.list.count, 0u);
  cr_assert_eq(back.u.list.cursor, 0u);
  fp4idx_request_clear(&back);
  /* a malformed reply: an entry without "pages" */
  msgpack_sbuffer_clear(&sb);
  cr_assert_eq(mp_build(&sb, "{id: 9, status: 0, cursor: 0, seqs: [{seq: 1, keys: 2}]}"), 0);
  cr_assert_eq(fp4idx_decode_response(sb.data, sb.size, FP4IDX_OP_LIST, &out,
                                      msg, sizeof(msg)),
               FP4IDX_EPROTO);
  cr_assert(strstr(msg, "pages") != NULL, "%s", msg);
  fp4idx_response_clear(&out);
  msgpack_sbuffer_destroy(&sb);
}

/* ---- small messages unpacked into the pool (unpack.c) ---------------------- */

typedef struct gen_s {
  unsigned char *p;
  size_t n, cap;
  uint64_t rng;
  int objects, ext;
} gen_t;

static uint64_t gen_next(gen_t *g) {
  g->rng ^= g->rng << 13, g->rng ^= g->rng >> 7, g->rng ^= g->rng << 17;
  return g->rng;
}

static void gen_bytes(gen_t *g, const void *b, size_t n) {
  while (g->n + n > g->cap) g->p = realloc(g->p, g->cap = g->cap ? 2 * g->cap : 256);
  memcpy(g->p + g->n, b, n);
  g->n += n;
}

static void gen_be(gen_t *g, unsigned char head, uint64_t v, unsigned w) {
  unsigned char b[9] = {head};
  for (unsigned i = 0; i < w; i++) b[1 + i] = (unsigned char)(v >> (8 * (w - 1 - i)));
  gen_bytes(g, b, 1 + w);
}

/* One random object in raw msgpack, every encoding width (not only the
 * smallest, as msgpack-c's packer would choose), containers to `depth`. */
static void gen_object(gen_t *g, int depth) {
  g->objects++;
  uint64_t r = gen_next(g), v = gen_next(g);
  int kind = (int)(r % (depth > 0 ? 14 : 11));
  static const char text[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  switch (kind) {
    case 0: gen_be(g, (unsigned char)(v & 0x7f), 0, 0); break;              /* fixint */
    case 1: gen_be(g, (unsigned char)(0xe0 | (v & 0x1f)), 0, 0); break;     /* -fixint */
    case 2: gen_be(g, (unsigned char)(0xcc + (r >> 8) % 4), v, 1u << ((r >> 8) % 4)); break;
    case 3: gen_be(g, (unsigned char)(0xd0 + (r >> 8) % 4), v, 1u << ((r >> 8) % 4)); break;
    case 4: gen_be(g, (unsigned char)(0xc0 + (r >> 8) % 4 == 0xc1 ? 0xc0 : 0xc0 + (r >> 8) % 4),
                   0, 0);
      break; /* nil, false, true */
    case 5: gen_be(g, 0xca, v & 0xffffffffu, 4); break;
    case 6: gen_be(g, 0xcb, v, 8); break;
    case 7: case 8: { /* str: fix, 8, 16, 32 / bin 8, 16, 32 */
      size_t n = (size_t)(v % 40);
      unsigned form = (unsigned)((r >> 8) % 4);
      if (kind == 7 && form == 0) gen_be(g, (unsigned char)(0xa0 | (n & 31)), 0, 0), n &= 31;
      else if (kind == 7) gen_be(g, (unsigned char)(0xd9 + form - 1), n, 1u << (form - 1));
      else gen_be(g, (unsigned char)(0xc4 + form % 3), n, 1u << (form % 3));
      for (size_t i = 0; i < n; i++) gen_bytes(g, &text[(v + i) % 36], 1);
      break;
    }
    case 9: gen_be(g, 0xa0, 0, 0); break; /* an empty str */
    case 10: /* an ext now and then: msgpack-c's */
      if (r % 7 == 0) {
        gen_be(g, 0xd4, (uint64_t)5 << 8 | 1, 2);
        g->ext = 1;
      } else {
        gen_be(g, 0xc0, 0, 0);
      }
      break;
    default: { /* array or map: fix, 16, 32 */
      int map = kind == 13;
      unsigned n = (unsigned)(v % 6), form = (unsigned)((r >> 8) % 3);
      if (form == 0) gen_be(g, (unsigned char)((map ? 0x80 : 0x90) | n), 0, 0);
      else gen_be(g, (unsigned char)((map ? 0xde : 0xdc) + form - 1), n, form == 1 ? 2 : 4);
      for (unsigned i = 0; i < (map ? 2 * n : n); i++) gen_object(g, depth - 1);
    }
  }
}

/* a and b the same msgpack objects: types, values, str/bin at the same
 * address (both point into the body). */
static void same_object(const msgpack_object *a, const msgpack_object *b, uint64_t seed) {
  cr_assert_eq(a->type, b->type, "message %llu: type %d, msgpack-c %d", (unsigned long long)seed,
               a->type, b->type);
  switch (a->type) {
    case MSGPACK_OBJECT_NIL: break;
    case MSGPACK_OBJECT_BOOLEAN: cr_assert_eq(a->via.boolean, b->via.boolean); break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: cr_assert_eq(a->via.u64, b->via.u64); break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: cr_assert_eq(a->via.i64, b->via.i64); break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
      cr_assert(memcmp(&a->via.f64, &b->via.f64, 8) == 0, "message %llu: a float",
                (unsigned long long)seed);
      break;
    case MSGPACK_OBJECT_STR:
    case MSGPACK_OBJECT_BIN:
      cr_assert_eq(a->via.str.size, b->via.str.size);
      /* (an empty one's pointer is whatever msgpack-c's state held: NULL
       * or a stale position; the pool's points into the body) */
      if (a->via.str.size)
        cr_assert_eq(a->via.str.ptr, b->via.str.ptr, "message %llu: not the body's bytes",
                     (unsigned long long)seed);
      break;
    case MSGPACK_OBJECT_ARRAY:
      cr_assert_eq(a->via.array.size, b->via.array.size);
      for (uint32_t i = 0; i < a->via.array.size; i++)
        same_object(&a->via.array.ptr[i], &b->via.array.ptr[i], seed);
      break;
    case MSGPACK_OBJECT_MAP:
      cr_assert_eq(a->via.map.size, b->via.map.size);
      for (uint32_t i = 0; i < a->via.map.size; i++) {
        same_object(&a->via.map.ptr[i].key, &b->via.map.ptr[i].key, seed);
        same_object(&a->via.map.ptr[i].val, &b->via.map.ptr[i].val, seed);
      }
      break;
    default: cr_assert_fail("message %llu: type %d", (unsigned long long)seed, a->type);
  }
}

/* Every message of up to FP4IDX__MP_POOL objects under its root without an
 * ext unpacks into the pool as msgpack-c unpacks it; one with an ext, or
 * larger, is left to msgpack-c. */
Test(codec, small_messages_unpack_as_msgpack_c_does) {
  int small = 0, left = 0;
  static fp4idx__mp_doc_t doc;
  for (uint64_t seed = 1; seed <= 20000; seed++) {
    gen_t g = {.rng = seed * 0x9E3779B97F4A7C15ULL};
    gen_object(&g, 1 + (int)(seed % 4));
    cr_assert_eq(fp4idx__mp_scan(g.p, g.n, NULL, 0), 0, "message %llu", (unsigned long long)seed);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    cr_assert_eq(msgpack_unpack_next(&up, (const char *)g.p, g.n, &off), MSGPACK_UNPACK_SUCCESS);
    fp4idx__mp_doc_init(&doc);
    int rc = fp4idx__mp_unpack_small(g.p, g.n, &doc);
    if (g.ext || g.objects - 1 > FP4IDX__MP_POOL) { /* the pool holds those under the root */
      cr_assert_eq(rc, -1, "message %llu: %d objects%s taken", (unsigned long long)seed,
                   g.objects, g.ext ? " and an ext" : "");
      left++;
    } else {
      cr_assert_eq(rc, 0, "message %llu: %d objects, not taken", (unsigned long long)seed,
                   g.objects);
      same_object(doc.root, &up.data, seed);
      small++;
    }
    fp4idx__mp_doc_destroy(&doc);
    msgpack_unpacked_destroy(&up);
    free(g.p);
  }
  cr_log_info("%d messages unpacked into the pool, %d left to msgpack-c", small, left);
  cr_assert_gt(small, 15000);
  cr_assert_gt(left, 100);
}

/* A request larger than the pool still decodes (msgpack-c's zone). */
Test(codec, requests_beyond_the_pool_decode) {
  enum { NSEQ = 40 }; /* each sequence is a map of several objects */
  fp4idx_score_seq_t seqs[NSEQ];
  uint16_t q[2 * 128], w[2];
  memset(q, 0, sizeof q);
  memset(w, 0, sizeof w);
  memset(seqs, 0, sizeof seqs);
  for (int i = 0; i < NSEQ; i++) {
    seqs[i].seq = 100 + (uint64_t)i;
    seqs[i].rows = 1;
    uint64_t qs[3] = {1, 2, 128}, ws[2] = {1, 2};
    cr_assert_eq(fp4idx_tensor_init(&seqs[i].q, FP4IDX_WIRE_BF16, 3, qs, q), 0);
    cr_assert_eq(fp4idx_tensor_init(&seqs[i].w, FP4IDX_WIRE_BF16, 2, ws, w), 0);
  }
  fp4idx_request_t req = {.id = 9, .op = FP4IDX_OP_SCORE};
  req.u.score.heads = 2;
  req.u.score.seqs = seqs;
  req.u.score.nseqs = NSEQ;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  cr_assert_eq(fp4idx_encode_request(&sb, &req), 0);
  static fp4idx__mp_doc_t doc;
  fp4idx__mp_doc_init(&doc);
  cr_assert_eq(fp4idx__mp_unpack_small(sb.data + 4, sb.size - 4, &doc), -1, "taken by the pool");
  fp4idx__mp_doc_destroy(&doc);
  fp4idx_request_t out;
  char msg[256];
  cr_assert_eq(fp4idx_decode_request(sb.data + 4, sb.size - 4, &out, msg, sizeof msg), 0, "%s",
               msg);
  cr_assert_eq(out.u.score.nseqs, NSEQ);
  cr_assert_eq(out.u.score.seqs[NSEQ - 1].seq, 100 + NSEQ - 1);
  fp4idx_request_clear(&out);
  msgpack_sbuffer_destroy(&sb);
}

/* What the pool takes, the scan passes, and msgpack-c reads the same: over
 * mutated messages (a byte changed, cut short, a byte added) and nestings
 * around the depth cap, where the pool also takes every sound one. */
Test(codec, the_pool_takes_only_what_the_scan_passes) {
  static fp4idx__mp_doc_t doc;
  int taken = 0, refused = 0;
  for (uint64_t seed = 1; seed <= 20000; seed++) {
    gen_t g = {.rng = seed * 0xD1B54A32D192ED03ULL};
    gen_object(&g, 1 + (int)(seed % 3));
    uint64_t r = gen_next(&g);
    size_t len = g.n;
    if (r % 3 == 0) g.p[(r >> 8) % g.n] ^= (unsigned char)(1u << ((r >> 16) % 8));
    else if (r % 3 == 1 && len > 1) len -= 1 + (size_t)((r >> 8) % (len - 1));
    else gen_bytes(&g, "\xc1", 1), len = g.n;
    fp4idx__mp_doc_init(&doc);
    if (fp4idx__mp_unpack_small(g.p, len, &doc) == 0) {
      cr_assert_eq(fp4idx__mp_scan(g.p, len, NULL, 0), 0, "mutation %llu: taken, scan refuses",
                   (unsigned long long)seed);
      msgpack_unpacked up;
      msgpack_unpacked_init(&up);
      size_t off = 0;
      cr_assert_eq(msgpack_unpack_next(&up, (const char *)g.p, len, &off),
                   MSGPACK_UNPACK_SUCCESS);
      same_object(doc.root, &up.data, seed);
      msgpack_unpacked_destroy(&up);
      taken++;
    } else {
      refused++;
    }
    fp4idx__mp_doc_destroy(&doc);
    free(g.p);
  }
  cr_log_info("mutations: %d taken by the pool, %d not", taken, refused);
  cr_assert_gt(taken, 1000);
  cr_assert_gt(refused, 1000);
  /* d nested one-item arrays around a 1, then the same around an empty array */
  for (unsigned d = 1; d <= FP4IDX_PROTO_MAX_DEPTH + 2; d++) {
    for (int empty = 0; empty < 2; empty++) {
      unsigned char m[32];
      size_t n = 0;
      for (unsigned i = 0; i < d; i++) m[n++] = 0x91;
      m[n++] = empty ? 0x90 : 0x01;
      int scan = fp4idx__mp_scan(m, n, NULL, 0);
      fp4idx__mp_doc_init(&doc);
      int pool = fp4idx__mp_unpack_small(m, n, &doc);
      fp4idx__mp_doc_destroy(&doc);
      cr_assert_eq(pool == 0, scan == 0, "depth %u%s: pool %d, scan %d", d,
                   empty ? " around an empty array" : "", pool, scan);
    }
  }
}
