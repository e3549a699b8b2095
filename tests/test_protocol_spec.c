/* test_protocol_spec.c -- keeps protocol/PROTOCOL.md in sync with the code:
 * every status code of fp4idx_status.h has its row (and no row is stale),
 * every op has its section, the limits table matches the header's macros,
 * and the hex transcript is byte for byte what the encoders produce now.
 *
 * FP4IDX_PRINT_TRANSCRIPT=1 prints the transcript section (markdown) to
 * stdout, for pasting into PROTOCOL.md after a deliberate wire change. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_codec.h"
#include "test_protocol_util.h"

#ifndef FP4IDX_PROTOCOL_MD
#error "FP4IDX_PROTOCOL_MD must name protocol/PROTOCOL.md"
#endif

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = 0;
  fclose(f);
  return s;
}

static char *doc;
static void load(void) { doc = slurp(FP4IDX_PROTOCOL_MD); }
static void unload(void) { free(doc); }

TestSuite(spec, .init = load, .fini = unload);

static const struct {
  const char *name;
  int num;
} codes[] = {
#define FP4IDX__CODE(name, num, msg) {#name, num},
    FP4IDX_STATUS_MAP(FP4IDX__CODE)
#undef FP4IDX__CODE
};

Test(spec, every_status_code_has_a_row) {
  for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
    char row[64];
    snprintf(row, sizeof(row), "\n| %d | %s |", codes[i].num, codes[i].name);
    cr_expect(strstr(doc, row) != NULL, "PROTOCOL.md lacks the row \"%s\"",
              row + 1);
  }
}

Test(spec, no_stale_status_rows) {
  /* any line "| <int> | <UPPER> |" must be a real code with that number */
  for (const char *p = doc; (p = strstr(p, "\n| ")) != NULL; p++) {
    int num, n = 0;
    char name[32];
    if (sscanf(p + 3, "%d | %31[A-Z0-9_] |%n", &num, name, &n) != 2 || n == 0)
      continue;
    int found = 0;
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
      if (codes[i].num == num && strcmp(codes[i].name, name) == 0) found = 1;
    cr_expect(found, "PROTOCOL.md has a row for %d %s, not in fp4idx_status.h",
              num, name);
  }
}

Test(spec, every_op_has_a_section) {
  for (int op = FP4IDX_OP_NONE + 1; op < FP4IDX_OP__COUNT; op++) {
    char h[64];
    snprintf(h, sizeof(h), "\n### `%s`", fp4idx_op_name((fp4idx_op_t)op));
    cr_expect(strstr(doc, h) != NULL, "PROTOCOL.md lacks \"%s\"", h + 1);
  }
}

Test(spec, limits_table_matches_the_header) {
  const struct {
    const char *what;
    unsigned long long v;
  } lim[] = {
      {"protocol version", FP4IDX_PROTOCOL_VERSION},
      {"default max frame body (bytes)", FP4IDX_MAX_FRAME_DEFAULT},
      {"heads H", FP4IDX_PROTO_MAX_HEADS},
      {"entries in score `seqs`", FP4IDX_PROTO_MAX_SCORE_SEQS},
      {"`topk`", FP4IDX_PROTO_MAX_TOPK},
      {"tensor dimensions", FP4IDX_PROTO_MAX_NDIM},
      {"container nesting depth", FP4IDX_PROTO_MAX_DEPTH},
      {"msgpack objects per message", FP4IDX_PROTO_MAX_OBJECTS},
      {"hello `client` (bytes)", FP4IDX_PROTO_MAX_STRING},
      {"error message (bytes)", FP4IDX_PROTO_ERROR_CAP - 1},
      {"stats `requests` entries", FP4IDX_PROTO_MAX_STATS_OPS},
      {"latency buckets per op", FP4IDX_PROTO_MAX_BUCKETS},
      {"list `count`", FP4IDX_PROTO_MAX_LIST_COUNT},
  };
  for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
    char row[128];
    snprintf(row, sizeof(row), "\n| %s | %llu |", lim[i].what, lim[i].v);
    cr_expect(strstr(doc, row) != NULL, "PROTOCOL.md lacks the limit row \"%s\"",
              row + 1);
  }
}

/* Transcript: each message is a "C:"/"S:" line with its title, then a fenced
 * block holding the hex dump. */
static char *transcript_md(void) {
  transcript_msg_t m[TRANSCRIPT_MAX];
  int n = transcript_build(m, TRANSCRIPT_MAX);
  cr_assert_gt(n, 0);
  size_t cap = 1 << 16, off = 0;
  char *out = malloc(cap);
  out[0] = 0;
  for (int i = 0; i < n; i++) {
    char *hex = hex_dump(m[i].sb.data, m[i].sb.size);
    off += (size_t)snprintf(out + off, cap - off,
                            "%s %s (%zu bytes)\n\n```\n%s```\n\n",
                            m[i].from_client ? "C:" : "S:", m[i].title,
                            m[i].sb.size, hex);
    free(hex);
    cr_assert_lt(off, cap);
  }
  transcript_free(m, n);
  return out;
}

Test(spec, transcript_is_current) {
  char *md = transcript_md();
  if (getenv("FP4IDX_PRINT_TRANSCRIPT")) fputs(md, stdout);
  /* compare message by message for a useful failure */
  for (char *p = md; *p;) {
    char *end = strstr(p, "```\n\n");
    cr_assert_not_null(end);
    size_t len = (size_t)(end + 4 - p); /* through the closing fence */
    end += 5;
    char *one = malloc(len + 1);
    memcpy(one, p, len);
    one[len] = 0;
    char *nl = strchr(one, '\n');
    cr_expect(strstr(doc, one) != NULL,
              "PROTOCOL.md transcript differs at \"%.*s\" (rerun with "
              "FP4IDX_PRINT_TRANSCRIPT=1)",
              (int)(nl - one), one);
    free(one);
    p = end;
  }
  free(md);
}

/* The transcript's frames decode to what their titles say. */
Test(spec, transcript_frames_decode) {
  transcript_msg_t m[TRANSCRIPT_MAX];
  int n = transcript_build(m, TRANSCRIPT_MAX);
  fp4idx_op_t last = FP4IDX_OP_NONE;
  for (int i = 0; i < n; i++) {
    const unsigned char *f = (const unsigned char *)m[i].sb.data;
    cr_assert_eq(fp4idx_frame_header_get(f), m[i].sb.size - 4);
    if (m[i].from_client) {
      fp4idx_request_t r;
      int rc = fp4idx_decode_request(f + 4, m[i].sb.size - 4, &r, NULL, 0);
      last = r.op;
      cr_assert(rc == 0 || rc == FP4IDX_ETYPE);
      fp4idx_request_clear(&r);
    } else {
      fp4idx_response_t r;
      cr_assert_eq(fp4idx_decode_response(f + 4, m[i].sb.size - 4,
                                          last == FP4IDX_OP_NONE
                                              ? FP4IDX_OP_INFO
                                              : last,
                                          &r, NULL, 0),
                   0);
      if (last == FP4IDX_OP_SCORE)
        cr_assert_eq(fp4idx_load_f32(r.u.score.results[0].logits.data, 0),
                     128.0f);
      fp4idx_response_clear(&r);
    }
  }
  transcript_free(m, n);
}
