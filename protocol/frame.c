/* frame.c -- framing: the 4-byte big-endian length header and the
 * incremental frame reader (state lives on the connection; "need more bytes"
 * is a normal return, not an error). */
#include <stdlib.h>

#include "codec_internal.h"

void fp4idx_frame_header_put(unsigned char out[4], uint32_t n) {
  out[0] = (unsigned char)(n >> 24);
  out[1] = (unsigned char)(n >> 16);
  out[2] = (unsigned char)(n >> 8);
  out[3] = (unsigned char)n;
}

uint32_t fp4idx_frame_header_get(const unsigned char in[4]) {
  return ((uint32_t)in[0] << 24) | ((uint32_t)in[1] << 16) |
         ((uint32_t)in[2] << 8) | (uint32_t)in[3];
}

int fp4idx_frame_reader_init(fp4idx_frame_reader_t *r, uint32_t max_frame) {
  if (r == NULL) return FP4IDX_EINVAL;
  memset(r, 0, sizeof(*r));
  r->max_frame = max_frame ? max_frame : FP4IDX_MAX_FRAME_DEFAULT;
  return 0;
}

void fp4idx_frame_reader_free(fp4idx_frame_reader_t *r) {
  if (r == NULL) return;
  free(r->body);
  r->body = NULL;
  r->hdr_have = r->body_len = r->body_have = r->body_cap = 0;
}

static bool reader_complete(const fp4idx_frame_reader_t *r) {
  return r->hdr_have == 4 && r->body != NULL && r->body_have == r->body_len;
}

/* Makes room for at least `need` body bytes (need <= body_len). The buffer
 * follows the bytes that actually arrived, not the announced length: a peer
 * that announces max_frame and sends nothing must not cost max_frame per
 * connection. Growth is geometric (amortized O(N) copying however the body
 * is chunked) with a floor of FP4IDX_FRAME_GROW_MIN, capped at body_len, so
 * a completed body is exactly body_len bytes. */
static int reader_reserve(fp4idx_frame_reader_t *r, uint32_t need) {
  if (need <= r->body_cap && r->body != NULL) return 0;
  uint64_t cap = (uint64_t)r->body_cap * 2;
  if (cap < need) cap = need;
  if (cap < FP4IDX_FRAME_GROW_MIN) cap = FP4IDX_FRAME_GROW_MIN;
  if (cap > r->body_len) cap = r->body_len;
  /* 1 byte for an empty body so that "body != NULL" marks the body phase */
  unsigned char *b = realloc(r->body, cap ? (size_t)cap : 1);
  if (b == NULL) return r->error = FP4IDX_ENOMEM; /* old buffer stays owned */
  r->body = b;
  r->body_cap = (uint32_t)cap;
  return 0;
}

/* The header just completed: check the cap, allocate room for the `avail`
 * body bytes already in hand (at least the growth floor, at most N). */
static int reader_start_body(fp4idx_frame_reader_t *r, size_t avail) {
  r->body_len = fp4idx_frame_header_get(r->hdr);
  r->body_have = r->body_cap = 0;
  if (r->body_len > r->max_frame) return r->error = FP4IDX_E2BIG;
  return reader_reserve(r, avail < r->body_len ? (uint32_t)avail : r->body_len);
}

int fp4idx_frame_reader_feed(fp4idx_frame_reader_t *r, const void *data,
                             size_t len, size_t *consumed) {
  const unsigned char *p = data;
  size_t used = 0;
  int rc;

  if (consumed != NULL) *consumed = 0;
  if (r == NULL || consumed == NULL || (data == NULL && len > 0))
    return FP4IDX_EINVAL;
  if (r->error) return r->error;
  if (reader_complete(r)) return 1;

  while (r->hdr_have < 4 && used < len) r->hdr[r->hdr_have++] = p[used++];
  if (r->hdr_have < 4) {
    *consumed = used;
    return 0;
  }
  if (r->body == NULL && (rc = reader_start_body(r, len - used)) != 0) {
    *consumed = used;
    return rc;
  }
  size_t want = r->body_len - r->body_have;
  size_t n = len - used < want ? len - used : want;
  if (n > 0 && (rc = reader_reserve(r, r->body_have + (uint32_t)n)) != 0) {
    *consumed = used;
    return rc;
  }
  if (n > 0) memcpy(r->body + r->body_have, p + used, n);
  r->body_have += (uint32_t)n;
  used += n;
  *consumed = used;
  return reader_complete(r) ? 1 : 0;
}

int fp4idx_frame_reader_space(fp4idx_frame_reader_t *r, void **buf,
                              size_t *len) {
  if (r == NULL || buf == NULL || len == NULL) return FP4IDX_EINVAL;
  *buf = NULL;
  *len = 0;
  if (r->error != 0 || r->body == NULL || r->body_have >= r->body_len)
    return 0;
  /* Full buffer: grow (geometrically) before offering room. Each growth
   * follows a read that filled the previous space, so the buffer stays
   * within about twice the bytes received. */
  if (r->body_have == r->body_cap) {
    int rc = reader_reserve(r, r->body_have + 1);
    if (rc != 0) return rc; /* sticky: the next feed reports it too */
  }
  *buf = r->body + r->body_have;
  *len = r->body_cap - r->body_have;
  return 0;
}

int fp4idx_frame_reader_commit(fp4idx_frame_reader_t *r, size_t n) {
  if (r == NULL || r->body == NULL || n > r->body_cap - r->body_have)
    return FP4IDX_EINVAL;
  r->body_have += (uint32_t)n;
  return reader_complete(r) ? 1 : 0;
}

int64_t fp4idx_frame_reader_whole(const fp4idx_frame_reader_t *r, const void *data,
                                  size_t len) {
  if (r == NULL || data == NULL || r->error || r->hdr_have || r->body != NULL ||
      len < FP4IDX_FRAME_HEADER)
    return -1;
  uint32_t n = fp4idx_frame_header_get(data);
  if (n > r->max_frame || len - FP4IDX_FRAME_HEADER != n) return -1;
  return (int64_t)n;
}

int fp4idx_frame_reader_capacity(const fp4idx_frame_reader_t *r,
                                 size_t *cap) {
  if (r == NULL || cap == NULL) return FP4IDX_EINVAL;
  *cap = r->body != NULL ? r->body_cap : 0;
  return 0;
}

int fp4idx_frame_reader_take(fp4idx_frame_reader_t *r, unsigned char **body,
                             size_t *len) {
  if (r == NULL || body == NULL || len == NULL || !reader_complete(r))
    return FP4IDX_EINVAL;
  *body = r->body; /* body_cap == body_len here: growth is capped at N */
  *len = r->body_len;
  r->body = NULL;
  r->hdr_have = r->body_len = r->body_have = r->body_cap = 0;
  return 0;
}
