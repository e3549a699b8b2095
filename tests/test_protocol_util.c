/* test_protocol_util.c -- see test_protocol_util.h. */
#include "test_protocol_util.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_codec.h"

void fill_pattern(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; i++) {
    x = x * 1103515245u + 12345u;
    b[i] = (unsigned char)(x >> 16);
  }
}

typedef struct {
  const char *s;
  msgpack_packer pk;
  int err;
} mp_ctx;

static void ws(mp_ctx *c) {
  while (isspace((unsigned char)*c->s)) c->s++;
}

static int expect(mp_ctx *c, char ch) {
  ws(c);
  if (*c->s != ch) {
    fprintf(stderr, "mp_build: expected '%c' at \"%.20s\"\n", ch, c->s);
    c->err = -1;
    return -1;
  }
  c->s++;
  return 0;
}

static int peek(mp_ctx *c) {
  ws(c);
  return *c->s;
}

static void value(mp_ctx *c);

static size_t count_items(const char *s, char close) {
  /* counts top-level commas inside the brackets starting at s */
  int depth = 0;
  size_t n = 0;
  int any = 0;
  char q = 0;
  for (; *s; s++) {
    if (q) {
      if (*s == q) q = 0;
      continue;
    }
    if (*s == '\'') {
      q = '\'';
      any = 1;
      continue;
    }
    if (*s == '{' || *s == '[' || *s == '(') depth++;
    else if (*s == '}' || *s == ']' || *s == ')') {
      if (depth == 0) {
        if (*s != close) return (size_t)-1;
        return any ? n + 1 : 0;
      }
      depth--;
    } else if (*s == ',' && depth == 0)
      n++;
    else if (!isspace((unsigned char)*s))
      any = 1;
  }
  return (size_t)-1;
}

static void str_lit(mp_ctx *c) {
  ws(c);
  c->s++; /* ' */
  const char *e = strchr(c->s, '\'');
  if (!e) {
    c->err = -1;
    return;
  }
  msgpack_pack_str(&c->pk, (size_t)(e - c->s));
  msgpack_pack_str_body(&c->pk, c->s, (size_t)(e - c->s));
  c->s = e + 1;
}

static char *ident(mp_ctx *c, char *buf, size_t cap) {
  ws(c);
  size_t n = 0;
  while ((isalnum((unsigned char)*c->s) || *c->s == '_') && n + 1 < cap)
    buf[n++] = *c->s++;
  buf[n] = 0;
  return buf;
}

static double number(mp_ctx *c, int *is_float, int *neg) {
  ws(c);
  char *end;
  const char *st = c->s;
  *neg = (*st == '-');
  *is_float = 0;
  for (const char *p = st; *p && (isdigit((unsigned char)*p) || strchr("+-.e", *p)); p++)
    if (*p == '.' || *p == 'e') *is_float = 1;
  double d = strtod(st, &end);
  if (end == st) c->err = -1;
  c->s = end;
  return d;
}

static unsigned long long unum(mp_ctx *c) {
  ws(c);
  char *end;
  unsigned long long v = strtoull(c->s, &end, 10);
  if (end == c->s) c->err = -1;
  c->s = end;
  return v;
}

static void tensor(mp_ctx *c) {
  char dt[16];
  uint64_t shape[8];
  int nd = 0, as_str = 0;
  long long delta = 0;
  expect(c, '(');
  ident(c, dt, sizeof(dt));
  expect(c, ',');
  expect(c, '[');
  while (peek(c) != ']' && nd < 8) {
    shape[nd++] = unum(c);
    if (peek(c) == ',') c->s++;
  }
  expect(c, ']');
  if (peek(c) == ',') {
    c->s++;
    ws(c);
    if (*c->s == 's') {
      as_str = 1;
      c->s++;
    } else {
      int f, n;
      delta = (long long)number(c, &f, &n);
    }
  }
  expect(c, ')');
  size_t item = !strcmp(dt, "bf16") ? 2 : !strcmp(dt, "f32") || !strcmp(dt, "i32") ? 4 : 1;
  unsigned long long n = item;
  for (int i = 0; i < nd; i++) n *= shape[i];
  n = (unsigned long long)((long long)n + delta);
  unsigned char *data = malloc(n ? n : 1);
  fill_pattern(data, n, (unsigned)n);
  msgpack_pack_map(&c->pk, 3);
  msgpack_pack_str_with_body(&c->pk, "dtype", 5);
  msgpack_pack_str_with_body(&c->pk, dt, strlen(dt));
  msgpack_pack_str_with_body(&c->pk, "shape", 5);
  msgpack_pack_array(&c->pk, (size_t)nd);
  for (int i = 0; i < nd; i++) msgpack_pack_uint64(&c->pk, shape[i]);
  msgpack_pack_str_with_body(&c->pk, "data", 4);
  if (as_str) {
    msgpack_pack_str(&c->pk, n);
    msgpack_pack_str_body(&c->pk, data, n);
  } else {
    msgpack_pack_bin(&c->pk, n);
    msgpack_pack_bin_body(&c->pk, data, n);
  }
  free(data);
}

static void value(mp_ctx *c) {
  int ch = peek(c);
  if (c->err) return;
  if (ch == '{') {
    size_t n = count_items(c->s + 1, '}');
    if (n == (size_t)-1) {
      c->err = -1;
      return;
    }
    c->s++;
    msgpack_pack_map(&c->pk, n);
    for (size_t i = 0; i < n && !c->err; i++) {
      char key[64];
      if (peek(c) == '\'')
        str_lit(c);
      else if (!strncmp(c->s, "rawkey(", 7)) {
        c->s += 7;
        msgpack_pack_uint64(&c->pk, unum(c));
        expect(c, ')');
      } else {
        ident(c, key, sizeof(key));
        msgpack_pack_str_with_body(&c->pk, key, strlen(key));
      }
      expect(c, ':');
      value(c);
      if (i + 1 < n) expect(c, ',');
    }
    expect(c, '}');
  } else if (ch == '[') {
    size_t n = count_items(c->s + 1, ']');
    if (n == (size_t)-1) {
      c->err = -1;
      return;
    }
    c->s++;
    msgpack_pack_array(&c->pk, n);
    for (size_t i = 0; i < n && !c->err; i++) {
      value(c);
      if (i + 1 < n) expect(c, ',');
    }
    expect(c, ']');
  } else if (ch == '\'') {
    str_lit(c);
  } else if (ch == '-' || isdigit(ch)) {
    int f, neg;
    const char *st = c->s;
    double d = number(c, &f, &neg);
    if (f)
      msgpack_pack_double(&c->pk, d);
    else if (neg)
      msgpack_pack_int64(&c->pk, strtoll(st, NULL, 10));
    else
      msgpack_pack_uint64(&c->pk, strtoull(st, NULL, 10));
  } else {
    char id[16];
    ident(c, id, sizeof(id));
    if (!strcmp(id, "nil")) msgpack_pack_nil(&c->pk);
    else if (!strcmp(id, "true")) msgpack_pack_true(&c->pk);
    else if (!strcmp(id, "false")) msgpack_pack_false(&c->pk);
    else if (!strcmp(id, "T")) tensor(c);
    else if (!strcmp(id, "bin")) {
      expect(c, '(');
      unsigned long long n = unum(c);
      expect(c, ')');
      unsigned char *d = malloc(n ? n : 1);
      fill_pattern(d, n, 1);
      msgpack_pack_bin(&c->pk, n);
      msgpack_pack_bin_body(&c->pk, d, n);
      free(d);
    } else {
      expect(c, '(');
      if (!strcmp(id, "f32")) {
        int f, neg;
        msgpack_pack_float(&c->pk, (float)number(c, &f, &neg));
      } else if (id[0] == 'u') {
        unsigned long long v = unum(c);
        if (!strcmp(id, "u8")) msgpack_pack_fix_uint8(&c->pk, (uint8_t)v);
        else if (!strcmp(id, "u16")) msgpack_pack_fix_uint16(&c->pk, (uint16_t)v);
        else if (!strcmp(id, "u32")) msgpack_pack_fix_uint32(&c->pk, (uint32_t)v);
        else if (!strcmp(id, "u64")) msgpack_pack_fix_uint64(&c->pk, v);
        else c->err = -1;
      } else if (id[0] == 'i') {
        ws(c);
        char *end;
        long long v = strtoll(c->s, &end, 10);
        c->s = end;
        if (!strcmp(id, "i8")) msgpack_pack_fix_int8(&c->pk, (int8_t)v);
        else if (!strcmp(id, "i16")) msgpack_pack_fix_int16(&c->pk, (int16_t)v);
        else if (!strcmp(id, "i32")) msgpack_pack_fix_int32(&c->pk, (int32_t)v);
        else if (!strcmp(id, "i64")) msgpack_pack_fix_int64(&c->pk, v);
        else c->err = -1;
      } else {
        fprintf(stderr, "mp_build: unknown word '%s'\n", id);
        c->err = -1;
      }
      expect(c, ')');
    }
  }
}

int mp_build(msgpack_sbuffer *sb, const char *text) {
  mp_ctx c = {.s = text, .err = 0};
  msgpack_packer_init(&c.pk, sb, msgpack_sbuffer_write);
  value(&c);
  ws(&c);
  if (!c.err && *c.s) {
    fprintf(stderr, "mp_build: trailing text \"%.20s\"\n", c.s);
    c.err = -1;
  }
  return c.err;
}

int mp_build_alloc(const char *text, unsigned char **out, size_t *len) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  int rc = mp_build(&sb, text);
  if (rc != 0) {
    msgpack_sbuffer_destroy(&sb);
    return rc;
  }
  *len = sb.size;
  *out = (unsigned char *)msgpack_sbuffer_release(&sb);
  if (*out == NULL) *out = malloc(1);
  return 0;
}

char *hex_dump(const void *p, size_t n) {
  const unsigned char *b = p;
  char *out = malloc(n * 3 + n / 16 + 2);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    o += (size_t)sprintf(out + o, "%02x", b[i]);
    out[o++] = (i % 16 == 15 || i + 1 == n) ? '\n' : ' ';
  }
  out[o] = 0;
  return out;
}

static transcript_msg_t *tmsg(transcript_msg_t *m, int *n, int cap,
                              int from_client, const char *title) {
  if (*n >= cap) return NULL;
  transcript_msg_t *t = &m[(*n)++];
  t->from_client = from_client;
  snprintf(t->title, sizeof(t->title), "%s", title);
  msgpack_sbuffer_init(&t->sb);
  return t;
}

int transcript_build(transcript_msg_t *m, int cap) {
  int n = 0, rc = 0;
  transcript_msg_t *t;
  static uint16_t key[128], q[128], w[1];
  static float logit[1] = {128.0f};
  char msg[256];

  for (int i = 0; i < 128; i++) key[i] = q[i] = 0x3f80; /* bf16 1.0 */
  w[0] = 0x3f80;

  /* hello */
  fp4idx_request_t rq;
  memset(&rq, 0, sizeof(rq));
  rq.id = 1;
  rq.op = FP4IDX_OP_HELLO;
  rq.u.hello.version = 1;
  rq.u.hello.client.ptr = "example";
  rq.u.hello.client.len = 7;
  if (!(t = tmsg(m, &n, cap, 1, "hello, id 1"))) return -1;
  rc |= fp4idx_encode_request(&t->sb, &rq);

  fp4idx_response_t rs;
  memset(&rs, 0, sizeof(rs));
  rs.id = 1;
  rs.op = FP4IDX_OP_HELLO;
  rs.u.hello.version = 1;
  snprintf(rs.u.hello.server, sizeof(rs.u.hello.server), "fp4idxd 0.1.0");
  if (!(t = tmsg(m, &n, cap, 0, "hello reply"))) return -1;
  rc |= fp4idx_encode_response(&t->sb, &rs);

  /* append one bf16 key of 128 ones to sequence 7 */
  memset(&rq, 0, sizeof(rq));
  rq.id = 2;
  rq.op = FP4IDX_OP_APPEND;
  rq.u.append.seq = 7;
  rq.u.append.rounding = FP4IDX_WIRE_ROUND_RNE;
  rc |= fp4idx_tensor_init(&rq.u.append.keys, FP4IDX_WIRE_BF16, 2,
                           (uint64_t[]){1, 128}, key);
  if (!(t = tmsg(m, &n, cap, 1, "append, id 2: seq 7, keys bf16 [1,128] (all 1.0)")))
    return -1;
  rc |= fp4idx_encode_request(&t->sb, &rq);

  memset(&rs, 0, sizeof(rs));
  rs.id = 2;
  rs.op = FP4IDX_OP_APPEND;
  rs.u.append.first = 0;
  rs.u.append.length = 1;
  if (!(t = tmsg(m, &n, cap, 0, "append reply: first 0, length 1"))) return -1;
  rc |= fp4idx_encode_response(&t->sb, &rs);

  /* score: 1 head, 1 row, q = ones, w = 1 -> logit 128 */
  fp4idx_score_seq_t s;
  memset(&s, 0, sizeof(s));
  s.seq = 7;
  s.rows = 1;
  rc |= fp4idx_tensor_init(&s.q, FP4IDX_WIRE_BF16, 3, (uint64_t[]){1, 1, 128}, q);
  rc |= fp4idx_tensor_init(&s.w, FP4IDX_WIRE_BF16, 2, (uint64_t[]){1, 1}, w);
  memset(&rq, 0, sizeof(rq));
  rq.id = 3;
  rq.op = FP4IDX_OP_SCORE;
  rq.u.score.heads = 1;
  rq.u.score.seqs = &s;
  rq.u.score.nseqs = 1;
  if (!(t = tmsg(m, &n, cap, 1,
                 "score, id 3: heads 1, seq 7, q bf16 [1,1,128] (all 1.0), "
                 "w bf16 [1,1] (1.0)")))
    return -1;
  rc |= fp4idx_encode_request(&t->sb, &rq);

  fp4idx_score_result_t res;
  memset(&res, 0, sizeof(res));
  res.seq = 7;
  rc |= fp4idx_tensor_init(&res.logits, FP4IDX_WIRE_F32, 2, (uint64_t[]){1, 1},
                           logit);
  memset(&rs, 0, sizeof(rs));
  rs.id = 3;
  rs.op = FP4IDX_OP_SCORE;
  rs.u.score.results = &res;
  rs.u.score.nresults = 1;
  if (!(t = tmsg(m, &n, cap, 0, "score reply: logits f32 [1,1] = 128.0")))
    return -1;
  rc |= fp4idx_encode_response(&t->sb, &rs);

  /* drop of an unknown sequence: ENOSEQ, the connection stays */
  memset(&rq, 0, sizeof(rq));
  rq.id = 4;
  rq.op = FP4IDX_OP_DROP;
  rq.u.drop.seq = 99;
  if (!(t = tmsg(m, &n, cap, 1, "drop, id 4: seq 99 (never appended)")))
    return -1;
  rc |= fp4idx_encode_request(&t->sb, &rq);
  if (!(t = tmsg(m, &n, cap, 0, "error reply: status -7 (ENOSEQ)"))) return -1;
  rc |= fp4idx_encode_error(&t->sb, 4, FP4IDX_ENOSEQ, "unknown sequence 99");

  /* unknown op: ETYPE, message from the decoder itself */
  if (!(t = tmsg(m, &n, cap, 1, "{\"id\": 5, \"op\": \"frobnicate\"}")))
    return -1;
  {
    unsigned char *body;
    size_t len;
    rc |= mp_build_alloc("{id: 5, op: 'frobnicate'}", &body, &len);
    unsigned char hdr[4];
    fp4idx_frame_header_put(hdr, (uint32_t)len);
    msgpack_sbuffer_write(&t->sb, (const char *)hdr, 4);
    msgpack_sbuffer_write(&t->sb, (const char *)body, len);
    fp4idx_request_t chk;
    int st = fp4idx_decode_request(body, len, &chk, msg, sizeof(msg));
    fp4idx_request_clear(&chk);
    free(body);
    if (!(t = tmsg(m, &n, cap, 0, "error reply: status -4 (ETYPE)")))
      return -1;
    rc |= fp4idx_encode_error(&t->sb, 5, st, msg);
  }

  /* list: one step from cursor 0 sees all there is (seq 7), cursor 0 back */
  memset(&rq, 0, sizeof(rq));
  rq.id = 6;
  rq.op = FP4IDX_OP_LIST;
  rq.u.list.count = 10;
  if (!(t = tmsg(m, &n, cap, 1, "list, id 6: cursor 0, count 10"))) return -1;
  rc |= fp4idx_encode_request(&t->sb, &rq);
  {
    fp4idx_list_entry_t e = {.seq = 7, .keys = 1, .pages = 1};
    memset(&rs, 0, sizeof(rs));
    rs.id = 6;
    rs.op = FP4IDX_OP_LIST;
    rs.u.list = (fp4idx_list_resp_t){.cursor = 0, .seqs = &e, .nseqs = 1};
    if (!(t = tmsg(m, &n, cap, 0, "list reply: cursor 0 (complete), seq 7 with 1 key on 1 page")))
      return -1;
    rc |= fp4idx_encode_response(&t->sb, &rs);
  }

  /* fork: sequence 8 starts as the first key of sequence 7, sharing it */
  memset(&rq, 0, sizeof(rq));
  rq.id = 7;
  rq.op = FP4IDX_OP_FORK;
  rq.u.fork.src = 7;
  rq.u.fork.dst = 8;
  rq.u.fork.length = 1;
  if (!(t = tmsg(m, &n, cap, 1, "fork, id 7: src 7, dst 8, length 1"))) return -1;
  rc |= fp4idx_encode_request(&t->sb, &rq);
  fp4idx_response_t fr;
  memset(&fr, 0, sizeof(fr));
  fr.id = 7;
  fr.op = FP4IDX_OP_FORK;
  fr.u.fork.length = 1;
  if (!(t = tmsg(m, &n, cap, 0, "fork reply: length 1"))) return -1;
  rc |= fp4idx_encode_response(&t->sb, &fr);
  return rc != 0 ? -1 : n;
}

void transcript_free(transcript_msg_t *m, int n) {
  for (int i = 0; i < n; i++) msgpack_sbuffer_destroy(&m[i].sb);
}
