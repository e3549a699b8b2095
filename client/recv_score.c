/* recv_score.c -- a score response read from the socket straight into the
 * caller's arrays (fp4idx_client_score_into, fp4idx_client_topk).
 *
 * The general path reads a whole frame into a malloc'd body, decodes it and
 * copies the tensors out: for a 6.4 MB logits reply that is a 6.4 MB
 * allocation (page faults) plus a copy. Here the frame is walked as it
 * arrives: msgpack headers and small values through a 4 KiB buffer, and the
 * bin payload of each result tensor recv()'d directly into its destination
 * once dtype and shape have been checked against what was asked. The checks
 * are those of fp4idx_decode_response for a one-result score (PROTOCOL.md
 * "score"); a malformed frame is EPROTO and the connection closes, since
 * the stream position is lost. A payload that does not fit (E2BIG) is read
 * and dropped, so the connection stays in step.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "fp4idx_codec.h"

#define RS_BUF 4096
#define RS_MAX_DEPTH 8

typedef struct rs_s {
  fp4idx_client_t *c;
  int64_t deadline;
  size_t left;          /* body bytes not yet taken from the socket */
  unsigned char buf[RS_BUF];
  size_t pos, len;      /* buffered bytes buf[pos..len) */
  fp4idx_status_t st;   /* first error (sticky) */
  char msg[160];
} rs_t;

static fp4idx_status_t rs_fail(rs_t *r, fp4idx_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static fp4idx_status_t rs_fail(rs_t *r, fp4idx_status_t st, const char *fmt, ...) {
  if (r->st == FP4IDX_OK) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->st = st;
  }
  return st;
}

/* n bytes of the body into dst (NULL: drop them). Buffered bytes first; a
 * large remainder goes straight from the socket into dst. */
static fp4idx_status_t rs_read(rs_t *r, void *dst, size_t n) {
  unsigned char *d = dst;
  size_t have = r->len - r->pos;
  size_t take = have < n ? have : n;
  if (take) {
    if (d) memcpy(d, r->buf + r->pos, take), d += take;
    r->pos += take;
    n -= take;
  }
  while (n > 0) {
    if (n > r->left) return rs_fail(r, FP4IDX_EPROTO, "value runs past the frame end");
    if (d && n >= RS_BUF) {
      fp4idx_status_t st = fp4idx__client_recv_exact(r->c, d, n, r->deadline);
      if (st != FP4IDX_OK) return r->st = st;
      r->left -= n;
      return FP4IDX_OK;
    }
    size_t want = r->left < RS_BUF ? r->left : RS_BUF;
    size_t got = 0;
    fp4idx_status_t st = fp4idx__client_recv_some(r->c, r->buf, want, &got, r->deadline);
    if (st != FP4IDX_OK) return r->st = st;
    r->left -= got;
    r->pos = 0;
    r->len = got;
    take = got < n ? got : n;
    if (d) memcpy(d, r->buf, take), d += take;
    r->pos = take;
    n -= take;
  }
  return FP4IDX_OK;
}

static uint64_t rs_be(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = v << 8 | p[i];
  return v;
}

/* One msgpack header: kind and the length/value it carries. */
enum { K_UINT, K_INT, K_NIL, K_BOOL, K_FLOAT, K_STR, K_BIN, K_ARRAY, K_MAP, K_EXT };
typedef struct { int kind; uint64_t u; int64_t i; } rs_hdr_t;

static fp4idx_status_t rs_hdr(rs_t *r, rs_hdr_t *h) {
  unsigned char b, x[8];
  fp4idx_status_t st = rs_read(r, &b, 1);
  if (st) return st;
  memset(h, 0, sizeof *h);
  int n = 0; /* bytes of length / value that follow */
  if (b <= 0x7f) { h->kind = K_UINT; h->u = b; return FP4IDX_OK; }
  if (b >= 0xe0) { h->kind = K_INT; h->i = (int8_t)b; return FP4IDX_OK; }
  if ((b & 0xf0) == 0x80) { h->kind = K_MAP; h->u = b & 15; return FP4IDX_OK; }
  if ((b & 0xf0) == 0x90) { h->kind = K_ARRAY; h->u = b & 15; return FP4IDX_OK; }
  if ((b & 0xe0) == 0xa0) { h->kind = K_STR; h->u = b & 31; return FP4IDX_OK; }
  switch (b) {
    case 0xc0: h->kind = K_NIL; return FP4IDX_OK;
    case 0xc2: case 0xc3: h->kind = K_BOOL; h->u = b & 1; return FP4IDX_OK;
    case 0xc4: h->kind = K_BIN; n = 1; break;
    case 0xc5: h->kind = K_BIN; n = 2; break;
    case 0xc6: h->kind = K_BIN; n = 4; break;
    case 0xc7: h->kind = K_EXT; n = 1; break;
    case 0xc8: h->kind = K_EXT; n = 2; break;
    case 0xc9: h->kind = K_EXT; n = 4; break;
    case 0xca: h->kind = K_FLOAT; n = 4; break;
    case 0xcb: h->kind = K_FLOAT; n = 8; break;
    case 0xcc: h->kind = K_UINT; n = 1; break;
    case 0xcd: h->kind = K_UINT; n = 2; break;
    case 0xce: h->kind = K_UINT; n = 4; break;
    case 0xcf: h->kind = K_UINT; n = 8; break;
    case 0xd0: h->kind = K_INT; n = 1; break;
    case 0xd1: h->kind = K_INT; n = 2; break;
    case 0xd2: h->kind = K_INT; n = 4; break;
    case 0xd3: h->kind = K_INT; n = 8; break;
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
      /* fixext: type byte + 1..16 bytes, skipped as a payload */
      h->kind = K_EXT;
      h->u = 1u + (1u << (b - 0xd4));
      return FP4IDX_OK;
    case 0xd9: h->kind = K_STR; n = 1; break;
    case 0xda: h->kind = K_STR; n = 2; break;
    case 0xdb: h->kind = K_STR; n = 4; break;
    case 0xdc: h->kind = K_ARRAY; n = 2; break;
    case 0xdd: h->kind = K_ARRAY; n = 4; break;
    case 0xde: h->kind = K_MAP; n = 2; break;
    case 0xdf: h->kind = K_MAP; n = 4; break;
    default: return rs_fail(r, FP4IDX_EPROTO, "invalid msgpack byte 0x%02x", b);
  }
  if ((st = rs_read(r, x, (size_t)n))) return st;
  h->u = rs_be(x, n);
  if (h->kind == K_INT) {
    /* sign-extend from n bytes */
    h->i = n == 8 ? (int64_t)h->u : (int64_t)(h->u ^ (1ull << (8 * n - 1))) - (int64_t)(1ull << (8 * n - 1));
  } else if (h->kind == K_EXT) {
    h->u += 1; /* the type byte */
  }
  return FP4IDX_OK;
}

/* Skips the value whose header is h (containers recursively). */
static fp4idx_status_t rs_skip_body(rs_t *r, const rs_hdr_t *h, int depth) {
  if (depth > RS_MAX_DEPTH) return rs_fail(r, FP4IDX_EPROTO, "nesting deeper than %d", RS_MAX_DEPTH);
  fp4idx_status_t st = FP4IDX_OK;
  switch (h->kind) {
    case K_STR: case K_BIN: case K_EXT: return rs_read(r, NULL, h->u);
    case K_ARRAY: case K_MAP: {
      uint64_t n = h->kind == K_MAP ? 2 * h->u : h->u;
      if (n > r->left + (r->len - r->pos)) return rs_fail(r, FP4IDX_EPROTO, "container larger than the frame");
      for (uint64_t i = 0; i < n && !st; i++) {
        rs_hdr_t e;
        if ((st = rs_hdr(r, &e)) == FP4IDX_OK) st = rs_skip_body(r, &e, depth + 1);
      }
      return st;
    }
    default: return FP4IDX_OK; /* scalars were read with their header */
  }
}

/* A map key (str, at most cap-1 bytes), NUL-terminated into k. */
static fp4idx_status_t rs_key(rs_t *r, char *k, size_t cap) {
  rs_hdr_t h;
  fp4idx_status_t st = rs_hdr(r, &h);
  if (st) return st;
  if (h.kind != K_STR) return rs_fail(r, FP4IDX_EPROTO, "map key is not a string");
  if (h.u >= cap) {
    k[0] = '\0';
    return rs_read(r, NULL, h.u); /* longer than any key we know: unknown */
  }
  if ((st = rs_read(r, k, h.u))) return st;
  k[h.u] = '\0';
  return FP4IDX_OK;
}

static fp4idx_status_t rs_uint(rs_t *r, const char *what, uint64_t *v) {
  rs_hdr_t h;
  fp4idx_status_t st = rs_hdr(r, &h);
  if (st) return st;
  if (h.kind == K_UINT) { *v = h.u; return FP4IDX_OK; }
  if (h.kind == K_INT && h.i >= 0) { *v = (uint64_t)h.i; return FP4IDX_OK; }
  return rs_fail(r, FP4IDX_EPROTO, "%s: expected an unsigned integer", what);
}

/* Where a result tensor goes: `want` dtype, shape [d0, d1] (ndim 2) or
 * [d0] (ndim 1; d1 ignored); d1 == 0 in a 2-D want means "any width" (full
 * logits: the caller learns W). dst NULL or cap too small -> E2BIG after the
 * bytes are dropped. */
typedef struct rs_dest_s {
  fp4idx_wire_dtype_t want;
  uint32_t ndim;
  uint64_t d0, d1;
  void *dst;
  size_t cap;           /* bytes */
  uint64_t got_d1;      /* out: the second dimension received */
  int seen;
} rs_dest_t;

static fp4idx_status_t rs_tensor(rs_t *r, const char *name, rs_dest_t *t) {
  rs_hdr_t h;
  fp4idx_status_t st = rs_hdr(r, &h);
  if (st) return st;
  if (h.kind != K_MAP) return rs_fail(r, FP4IDX_EPROTO, "%s: expected a tensor map", name);
  int have_dtype = 0, ndim = -1;
  uint64_t shape[FP4IDX_PROTO_MAX_NDIM] = {0};
  fp4idx_wire_dtype_t dt = FP4IDX_WIRE_NONE;
  int have_data = 0;
  for (uint64_t i = 0; i < h.u; i++) {
    char k[16];
    if ((st = rs_key(r, k, sizeof k))) return st;
    if (strcmp(k, "dtype") == 0) {
      rs_hdr_t v;
      char s[8];
      if ((st = rs_hdr(r, &v))) return st;
      if (v.kind != K_STR || v.u >= sizeof s)
        return rs_fail(r, FP4IDX_EPROTO, "%s.dtype: expected a short string", name);
      if ((st = rs_read(r, s, v.u))) return st;
      s[v.u] = '\0';
      dt = strcmp(s, "f32") == 0 ? FP4IDX_WIRE_F32 : strcmp(s, "i32") == 0 ? FP4IDX_WIRE_I32
                                                                        : FP4IDX_WIRE_NONE;
      have_dtype = 1;
    } else if (strcmp(k, "shape") == 0) {
      rs_hdr_t v;
      if ((st = rs_hdr(r, &v))) return st;
      if (v.kind != K_ARRAY || v.u < 1 || v.u > FP4IDX_PROTO_MAX_NDIM)
        return rs_fail(r, FP4IDX_EPROTO, "%s.shape: expected 1..%u dims", name,
                       FP4IDX_PROTO_MAX_NDIM);
      ndim = (int)v.u;
      for (int d = 0; d < ndim; d++)
        if ((st = rs_uint(r, "shape[]", &shape[d]))) return st;
    } else if (strcmp(k, "data") == 0) {
      rs_hdr_t v;
      if ((st = rs_hdr(r, &v))) return st;
      if (v.kind != K_BIN) return rs_fail(r, FP4IDX_EPROTO, "%s.data: expected bin", name);
      /* dtype and shape come first from fp4idxd; another order is valid
       * msgpack but cannot be checked before the bytes arrive */
      if (!have_dtype || ndim < 0)
        return rs_fail(r, FP4IDX_EPROTO, "%s: data before dtype/shape", name);
      if (dt != t->want || (uint32_t)ndim != t->ndim || shape[0] != t->d0 ||
          (t->ndim == 2 && t->d1 && shape[1] != t->d1))
        return rs_fail(r, FP4IDX_EPROTO, "%s: dtype or shape does not match the request", name);
      uint64_t elems = shape[0] * (t->ndim == 2 ? shape[1] : 1);
      if ((t->ndim == 2 && shape[1] && elems / shape[1] != shape[0]) || v.u != elems * 4)
        return rs_fail(r, FP4IDX_EPROTO, "%s: %llu data bytes for shape", name,
                       (unsigned long long)v.u);
      t->got_d1 = t->ndim == 2 ? shape[1] : 0;
      if (v.u > t->cap || (!t->dst && v.u)) {
        rs_fail(r, FP4IDX_E2BIG, "%s need %llu bytes, the buffer holds %zu", name,
                (unsigned long long)v.u, t->cap);
        if ((st = rs_read(r, NULL, v.u))) return st;
        r->st = FP4IDX_E2BIG; /* keep E2BIG unless the stream broke */
      } else if ((st = rs_read(r, t->dst, v.u))) {
        return st;
      }
      have_data = 1;
    } else {
      rs_hdr_t v;
      if ((st = rs_hdr(r, &v)) || (st = rs_skip_body(r, &v, 1))) return st;
    }
  }
  if (!have_data) return rs_fail(r, FP4IDX_EPROTO, "%s: no data", name);
  t->seen = 1;
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx__client_recv_score(fp4idx_client_t *c, uint64_t id, uint64_t seq,
                                          uint32_t rows, uint32_t topk, float *logits,
                                          size_t logits_cap, int32_t *positions,
                                          int32_t *counts, uint32_t *width, int64_t deadline) {
  unsigned char hdr[4];
  fp4idx_status_t st = fp4idx__client_recv_exact(c, hdr, 4, deadline);
  if (st != FP4IDX_OK) return st;
  size_t n = fp4idx_frame_header_get(hdr);
  if (n > FP4IDX_CLIENT_MAX_RESPONSE) {
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_E2BIG,
                               "response frame of %zu bytes exceeds the client limit %u", n,
                               FP4IDX_CLIENT_MAX_RESPONSE);
  }
  rs_t *r = malloc(sizeof *r);
  if (!r) {
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_ENOMEM, "no memory to receive a response");
  }
  /* the header fields only: buf (4 kB) is written before it is read, and
   * zeroing it cost a third of a small score's client time */
  r->c = c;
  r->deadline = deadline;
  r->left = n;
  r->pos = r->len = 0;
  r->st = FP4IDX_OK;
  r->msg[0] = '\0';
  int32_t cnt_scratch[64];
  int32_t *cnt_tmp = NULL;
  rs_dest_t dl = {.want = FP4IDX_WIRE_F32, .ndim = 2, .d0 = rows, .d1 = topk, .dst = logits,
                  .cap = logits_cap * 4};
  rs_dest_t dp = {.want = FP4IDX_WIRE_I32, .ndim = 2, .d0 = rows, .d1 = topk, .dst = positions,
                  .cap = (size_t)rows * topk * 4};
  rs_dest_t dc = {.want = FP4IDX_WIRE_I32, .ndim = 1, .d0 = rows, .dst = counts,
                  .cap = (size_t)rows * 4};
  if (topk && !counts) {
    /* the caller does not want them: land them somewhere */
    dc.dst = rows <= 64 ? cnt_scratch : (cnt_tmp = malloc((size_t)rows * 4));
    if (!dc.dst) dc.cap = 0;
  }
  uint64_t rid = 0, rseq = 0, nres = 0;
  int64_t status = 0;
  int have_id = 0, have_status = 0, have_results = 0;
  char err[FP4IDX_PROTO_ERROR_CAP] = "";
  rs_hdr_t h;
  if ((st = rs_hdr(r, &h))) goto done;
  if (h.kind != K_MAP) {
    st = rs_fail(r, FP4IDX_EPROTO, "response is not a map");
    goto done;
  }
  for (uint64_t i = 0; i < h.u && !st; i++) {
    char k[16];
    if ((st = rs_key(r, k, sizeof k))) break;
    if (strcmp(k, "id") == 0) {
      st = rs_uint(r, "id", &rid);
      have_id = 1;
    } else if (strcmp(k, "status") == 0) {
      rs_hdr_t v;
      if ((st = rs_hdr(r, &v))) break;
      if (v.kind == K_UINT) status = (int64_t)v.u;
      else if (v.kind == K_INT) status = v.i;
      else st = rs_fail(r, FP4IDX_EPROTO, "status: expected an integer");
      have_status = 1;
    } else if (strcmp(k, "error") == 0) {
      rs_hdr_t v;
      if ((st = rs_hdr(r, &v))) break;
      if (v.kind != K_STR) {
        st = rs_fail(r, FP4IDX_EPROTO, "error: expected a string");
        break;
      }
      size_t keep = v.u < sizeof err - 1 ? v.u : sizeof err - 1;
      if ((st = rs_read(r, err, keep)) || (st = rs_read(r, NULL, v.u - keep))) break;
      err[keep] = '\0';
    } else if (strcmp(k, "results") == 0) {
      rs_hdr_t v;
      if ((st = rs_hdr(r, &v))) break;
      if (v.kind != K_ARRAY || v.u != 1) {
        st = rs_fail(r, FP4IDX_EPROTO, "results: expected one result");
        break;
      }
      have_results = 1;
      nres = v.u;
      rs_hdr_t m;
      if ((st = rs_hdr(r, &m))) break;
      if (m.kind != K_MAP) {
        st = rs_fail(r, FP4IDX_EPROTO, "results[0]: expected a map");
        break;
      }
      for (uint64_t j = 0; j < m.u && !st; j++) {
        char rk[16];
        if ((st = rs_key(r, rk, sizeof rk))) break;
        if (strcmp(rk, "seq") == 0) st = rs_uint(r, "seq", &rseq);
        else if (strcmp(rk, "logits") == 0) st = rs_tensor(r, "logits", &dl);
        else if (strcmp(rk, "positions") == 0 && topk) st = rs_tensor(r, "positions", &dp);
        else if (strcmp(rk, "counts") == 0 && topk) st = rs_tensor(r, "counts", &dc);
        else {
          rs_hdr_t v2;
          if ((st = rs_hdr(r, &v2)) == FP4IDX_OK) st = rs_skip_body(r, &v2, 2);
        }
        if (st == FP4IDX_E2BIG) st = FP4IDX_OK; /* dropped, stream in step */
      }
    } else {
      rs_hdr_t v;
      if ((st = rs_hdr(r, &v)) == FP4IDX_OK) st = rs_skip_body(r, &v, 1);
    }
  }
  if (st == FP4IDX_OK && (r->left || r->pos != r->len))
    st = rs_fail(r, FP4IDX_EPROTO, "trailing bytes after the response map");
done:
  free(cnt_tmp);
  if (st != FP4IDX_OK || (r->st != FP4IDX_OK && r->st != FP4IDX_E2BIG)) {
    fp4idx_status_t e = st != FP4IDX_OK ? st : r->st;
    char m[sizeof r->msg];
    memcpy(m, r->msg, sizeof m);
    free(r);
    if (e == FP4IDX_EPROTO) {
      fp4idx__client_disconnect(c);
      return fp4idx__client_fail(c, e, "malformed score response from the daemon: %s", m);
    }
    return e; /* connection errors: already recorded and closed */
  }
  int e2big = r->st == FP4IDX_E2BIG;
  char m[sizeof r->msg];
  memcpy(m, r->msg, sizeof m);
  free(r);
  if (!have_id || !have_status)
    return fp4idx__client_disconnect(c),
           fp4idx__client_fail(c, FP4IDX_EPROTO, "score response without id or status");
  if (status < 0) {
    if (rid != id) fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, (fp4idx_status_t)status, "%s",
                               err[0] ? err : fp4idx_strerror((int)status));
  }
  if (rid != id) {
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_EPROTO,
                               "response id %llu does not match request id %llu",
                               (unsigned long long)rid, (unsigned long long)id);
  }
  if (!have_results || nres != 1 || rseq != seq || !dl.seen || (topk && (!dp.seen || !dc.seen))) {
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_EPROTO,
                               "score response does not match the request (results, seq, shapes)");
  }
  if (width) *width = (uint32_t)dl.got_d1;
  if (e2big) return fp4idx__client_fail(c, FP4IDX_E2BIG, "%s", m);
  return fp4idx__client_fail(c, FP4IDX_OK, NULL);
}
