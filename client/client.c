/* client.c -- the requests of libfp4idx-client: each public call fills a
 * codec request struct, does one round trip (encode, send, receive, strict
 * decode through protocol/fp4idx_codec.h) and copies the answer out of the
 * receive buffer into a library-allocated block -- except the scores into
 * caller buffers, whose tensors are received in place (recv_score.c). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_internal.h"
#include "fp4idx_codec.h"
#include "fp4idx_wire_key.h"

_Static_assert(FP4IDX_CLIENT_SLOT_BYTES == FP4IDX_SLOT_BYTES,
               "the client's fp4 slots are the key format's (fp4idx_format.h)");
_Static_assert(FP4IDX_CLIENT_CUDA_HANDLE_BYTES == FP4IDX_PROTO_CUDA_HANDLE,
               "a cudaIpcMemHandle_t is 64 bytes on the wire");
_Static_assert(FP4IDX_CLIENT_HEAD_DIM == FP4IDX_HEAD_DIM,
               "the client's head dim is the key format's (fp4idx_format.h)");

/* A finished round trip: the decoded response and the frame body its views
 * point into. Release with exchange_done(). */
typedef struct exchange_s {
  fp4idx_response_t resp;
  char *body;
} exchange_t;

static void exchange_done(exchange_t *x) {
  fp4idx_response_clear(&x->resp);
  free(x->body);
  x->body = NULL;
}

/* Decodes `body` as the answer to `op`; on a daemon error records it.
 * Returns OK, the daemon's status (connection kept) or EPROTO (closed). */
static fp4idx_status_t take_response(fp4idx_client_t *c, exchange_t *x,
                                     fp4idx_op_t op, uint64_t id, size_t len) {
  char msg[256] = "";
  int rc = fp4idx_decode_response(x->body, len, op, &x->resp, msg, sizeof msg);
  if (rc == FP4IDX_ENOMEM) /* the frame was read whole: stream still in step */
    return fp4idx__client_fail(c, FP4IDX_ENOMEM,
                               "no memory to decode the %s response",
                               fp4idx_op_name(op));
  if (rc != 0) {
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_EPROTO,
                               "malformed %s response from the daemon: %s",
                               fp4idx_op_name(op), msg);
  }
  if (x->resp.status < 0) {
    /* id 0: the daemon could not read our frame and closes after this. */
    if (x->resp.id != id) fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, (fp4idx_status_t)x->resp.status, "%s",
                               x->resp.error[0] ? x->resp.error
                                                : fp4idx_strerror(
                                                      x->resp.status));
  }
  if (x->resp.id != id) {
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_EPROTO,
                               "response id %llu does not match request id "
                               "%llu",
                               (unsigned long long)x->resp.id,
                               (unsigned long long)id);
  }
  return FP4IDX_OK;
}

/* Encodes and sends one request (req->id assigned here), with `fd` (>= 0)
 * passed along the frame as SCM_RIGHTS. On a send that failed because the
 * daemon stopped reading, looks briefly for the reply it may have sent
 * before closing (E2BIG for an oversized frame) and returns that error.
 * Returns OK when the request is out. */
static fp4idx_status_t send_request(fp4idx_client_t *c, fp4idx_request_t *req,
                                    int fd, int64_t deadline) {
  if (c->fd < 0)
    return fp4idx__client_fail(c, FP4IDX_ECONN,
                               "not connected (connect first, or reconnect "
                               "after a connection error)");
  req->id = c->next_id++;
  /* Tensors of FP4IDX__CLIENT_SPLIT_MIN bytes or more go to the socket
   * from the caller's memory (writev), not through a copy into the frame:
   * encoding a 4 x 32-row score (32 KB of q) cost ~21 us of copies and
   * buffer growth on the dev box. A score names up to 4 tensors a
   * sequence, an append one. */
  fp4idx_payload_t pl_small[8], *pl = pl_small;
  size_t cap = 8, npl = 0;
  if (req->op == FP4IDX_OP_SCORE && req->u.score.nseqs * 4 > cap) {
    cap = req->u.score.nseqs * 4;
    if (!(pl = malloc(cap * sizeof *pl)))
      return fp4idx__client_fail(c, FP4IDX_ENOMEM, "out of memory for the %s request",
                                 fp4idx_op_name(req->op));
  }
  struct iovec iov_small[2 * 8 + 1], *iov = iov_small;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  int rc = fp4idx_encode_request_split(&sb, req, FP4IDX__CLIENT_SPLIT_MIN, pl, cap, &npl);
  if (rc == 0 && npl > 8 && !(iov = malloc((2 * npl + 1) * sizeof *iov))) rc = FP4IDX_ENOMEM;
  if (rc != 0) {
    msgpack_sbuffer_destroy(&sb);
    if (pl != pl_small) free(pl);
    return fp4idx__client_fail(c, (fp4idx_status_t)rc,
                               "cannot encode the %s request: %s",
                               fp4idx_op_name(req->op), fp4idx_strerror(rc));
  }
  size_t body_len = fp4idx_frame_header_get((const unsigned char *)sb.data);
  fp4idx_status_t st = FP4IDX_OK;
  if (c->max_frame != 0 && body_len > c->max_frame) {
    st = fp4idx__client_fail(c, FP4IDX_E2BIG,
                             "%s request of %zu bytes exceeds the daemon's "
                             "max frame of %llu bytes",
                             fp4idx_op_name(req->op), body_len,
                             (unsigned long long)c->max_frame);
  } else {
    /* the frame's bytes with the payloads spliced in at their offsets */
    int n = 0;
    size_t at = 0;
    for (size_t i = 0; i < npl; i++) {
      iov[n++] = (struct iovec){sb.data + at, pl[i].at - at};
      iov[n++] = (struct iovec){(void *)pl[i].data, pl[i].len};
      at = pl[i].at;
    }
    iov[n++] = (struct iovec){sb.data + at, sb.size - at};
    st = fp4idx__client_sendv(c, iov, n, fd, deadline);
  }
  msgpack_sbuffer_destroy(&sb);
  if (pl != pl_small) free(pl);
  if (iov != iov_small) free(iov);
  if (st == FP4IDX_E2BIG) return st;
  if (st == FP4IDX_ECONN && c->fd >= 0) {
    /* The daemon stopped reading: it may have replied (E2BIG for an
     * oversized frame) before closing. Look briefly for that reply. */
    exchange_t x;
    size_t len = 0;
    memset(&x, 0, sizeof x);
    char saved[sizeof c->last_error];
    memcpy(saved, c->last_error, sizeof saved);
    int64_t soon = fp4idx__client_deadline(&(fp4idx_client_t){.timeout_ms = 200});
    if (fp4idx__client_recv_frame(c, &x.body, &len, soon) == FP4IDX_OK) {
      st = take_response(c, &x, req->op, req->id, len);
      fp4idx__client_disconnect(c);
      if (st != FP4IDX_OK) {
        exchange_done(&x);
        return st;
      }
    }
    exchange_done(&x);
    fp4idx__client_disconnect(c);
    memcpy(c->last_error, saved, sizeof saved);
    return fp4idx__client_fail(c, FP4IDX_ECONN, "%s", saved);
  }
  return st;
}

/* One request/response exchange, with `fd` (>= 0) passed along the frame
 * as SCM_RIGHTS. On OK the caller reads x->resp and then calls
 * exchange_done(x); on error x is already released. */
static fp4idx_status_t roundtrip_fd(fp4idx_client_t *c, fp4idx_request_t *req,
                                    int fd, exchange_t *x) {
  memset(x, 0, sizeof *x);
  int64_t deadline = fp4idx__client_deadline(c);
  fp4idx_status_t st = send_request(c, req, fd, deadline);
  if (st != FP4IDX_OK) return st;
  size_t len = 0;
  st = fp4idx__client_recv_frame(c, &x->body, &len, deadline);
  if (st != FP4IDX_OK) return st;
  st = take_response(c, x, req->op, req->id, len);
  if (st != FP4IDX_OK) {
    exchange_done(x);
    return st;
  }
  fp4idx__client_fail(c, FP4IDX_OK, NULL);
  return FP4IDX_OK;
}

static fp4idx_status_t roundtrip(fp4idx_client_t *c, fp4idx_request_t *req,
                                 exchange_t *x) {
  return roundtrip_fd(c, req, -1, x);
}

static fp4idx_status_t bad_arg(fp4idx_client_t *c, const char *what) {
  return fp4idx__client_fail(c, FP4IDX_EINVAL, "invalid argument: %s", what);
}

/* Copies a NUL-terminated string, cut to fit cap (> 0) bytes. */
static void copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

/* ---- hello / info -------------------------------------------------------- */

fp4idx_status_t fp4idx_client_hello(fp4idx_client_t *c,
                                    fp4idx_client_info_t *out) {
  if (c == NULL) return FP4IDX_EINVAL;
  static const char name[] = "libfp4idx-client";
  fp4idx_request_t req = {.op = FP4IDX_OP_HELLO};
  req.u.hello.version = FP4IDX_CLIENT_PROTOCOL_VERSION;
  req.u.hello.client.ptr = name;
  req.u.hello.client.len = sizeof name - 1;
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, &req, &x);
  if (st != FP4IDX_OK) return st;
  if (out != NULL) {
    memset(out, 0, sizeof *out);
    out->version = (uint32_t)x.resp.u.hello.version;
    copy_str(out->server, sizeof out->server, x.resp.u.hello.server);
  }
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_info(fp4idx_client_t *c,
                                   fp4idx_client_info_t *out) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (out == NULL) return bad_arg(c, "out is NULL");
  fp4idx_request_t req = {.op = FP4IDX_OP_INFO};
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, &req, &x);
  if (st != FP4IDX_OK) return st;
  const fp4idx_info_t *in = &x.resp.u.info;
  memset(out, 0, sizeof *out);
  out->version = (uint32_t)in->version;
  copy_str(out->server, sizeof out->server, in->server);
  copy_str(out->backend, sizeof out->backend, in->backend);
  copy_str(out->device, sizeof out->device, in->device);
  out->page_size = in->page_size;
  out->pages_total = in->pages_total;
  out->pages_free = in->pages_free;
  out->sequences = in->sequences;
  out->max_frame = in->max_frame;
  c->max_frame = in->max_frame; /* lets later requests fail fast on E2BIG */
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_sharing(fp4idx_client_t *c, fp4idx_client_sharing_t *out) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (out == NULL) return bad_arg(c, "out is NULL");
  fp4idx_request_t req = {.op = FP4IDX_OP_INFO};
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, &req, &x);
  if (st != FP4IDX_OK) return st;
  const fp4idx_info_t *in = &x.resp.u.info;
  memset(out, 0, sizeof *out);
  copy_str(out->mode, sizeof out->mode, in->gpu_sharing);
  out->other_processes = in->gpu_other_processes;
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_channels(fp4idx_client_t *c, uint64_t *open) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (open == NULL) return bad_arg(c, "open is NULL");
  fp4idx_request_t req = {.op = FP4IDX_OP_INFO};
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, &req, &x);
  if (st != FP4IDX_OK) return st;
  *open = x.resp.u.info.channels;
  exchange_done(&x);
  return FP4IDX_OK;
}

/* ---- keys ---------------------------------------------------------------- */

/* The wire dtype and shape [n,128] or [n,68] of an append's keys. */
static int keys_shape(fp4idx_client_keys_t dtype, size_t n,
                      fp4idx_wire_dtype_t *wt, uint64_t shape[2]) {
  shape[0] = n;
  shape[1] = FP4IDX_CLIENT_HEAD_DIM;
  switch (dtype) {
    case FP4IDX_KEYS_BF16: *wt = FP4IDX_WIRE_BF16; return 0;
    case FP4IDX_KEYS_F32: *wt = FP4IDX_WIRE_F32; return 0;
    case FP4IDX_KEYS_FP4:
      *wt = FP4IDX_WIRE_U8;
      shape[1] = FP4IDX_CLIENT_SLOT_BYTES;
      return 0;
    default: return -1;
  }
}

/* An append of n keys, inline from `keys` (region 0) or by reference to
 * `offset` of `region`. */
static fp4idx_status_t append_keys(fp4idx_client_t *c, uint64_t seq,
                                   fp4idx_client_keys_t dtype,
                                   const void *keys, uint64_t region,
                                   uint64_t offset, size_t n,
                                   fp4idx_client_rounding_t rounding,
                                   uint64_t *first, uint64_t *length) {
  if (n == 0) return bad_arg(c, "n is 0 (append at least one key)");
  if (rounding != FP4IDX_ROUNDING_RNE && rounding != FP4IDX_ROUNDING_THRESHOLD)
    return bad_arg(c, "unknown rounding mode");
  fp4idx_wire_dtype_t wt;
  uint64_t shape[2];
  if (keys_shape(dtype, n, &wt, shape) != 0)
    return bad_arg(c, "unknown key dtype");
  fp4idx_request_t req = {.op = FP4IDX_OP_APPEND};
  req.u.append.seq = seq;
  req.u.append.rounding = rounding == FP4IDX_ROUNDING_THRESHOLD
                              ? FP4IDX_WIRE_ROUND_THRESHOLD
                              : FP4IDX_WIRE_ROUND_RNE;
  int rc = region ? fp4idx_tensor_ref(&req.u.append.keys, wt, 2, shape, region,
                                      offset)
                  : fp4idx_tensor_init(&req.u.append.keys, wt, 2, shape, keys);
  if (rc != 0)
    return fp4idx__client_fail(c, (fp4idx_status_t)rc, "%zu keys: %s", n,
                               fp4idx_strerror(rc));
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, &req, &x);
  if (st != FP4IDX_OK) return st;
  if (first) *first = x.resp.u.append.first;
  if (length) *length = x.resp.u.append.length;
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_append(fp4idx_client_t *c, uint64_t seq,
                                     fp4idx_client_keys_t dtype,
                                     const void *keys, size_t n,
                                     fp4idx_client_rounding_t rounding,
                                     uint64_t *first, uint64_t *length) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (keys == NULL) return bad_arg(c, "keys is NULL");
  return append_keys(c, seq, dtype, keys, 0, 0, n, rounding, first, length);
}

fp4idx_status_t fp4idx_client_append_bf16(fp4idx_client_t *c, uint64_t seq,
                                          const uint16_t *keys, size_t n,
                                          fp4idx_client_rounding_t rounding,
                                          uint64_t *first, uint64_t *length) {
  return fp4idx_client_append(c, seq, FP4IDX_KEYS_BF16, keys, n, rounding,
                              first, length);
}

fp4idx_status_t fp4idx_client_append_f32(fp4idx_client_t *c, uint64_t seq,
                                         const float *keys, size_t n,
                                         fp4idx_client_rounding_t rounding,
                                         uint64_t *first, uint64_t *length) {
  return fp4idx_client_append(c, seq, FP4IDX_KEYS_F32, keys, n, rounding,
                              first, length);
}

fp4idx_status_t fp4idx_client_append_fp4(fp4idx_client_t *c, uint64_t seq,
                                         const uint8_t *slots, size_t n,
                                         uint64_t *first, uint64_t *length) {
  return fp4idx_client_append(c, seq, FP4IDX_KEYS_FP4, slots, n,
                              FP4IDX_ROUNDING_RNE, first, length);
}

/* A round trip whose reply has no fields (unregister). */
static fp4idx_status_t roundtrip_empty(fp4idx_client_t *c,
                                       fp4idx_request_t *req) {
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, req, &x);
  if (st != FP4IDX_OK) return st;
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx__client_call_fd(fp4idx_client_t *c, fp4idx_request_t *req, int fd,
                                       fp4idx_response_t *resp) {
  exchange_t x;
  fp4idx_status_t st = roundtrip_fd(c, req, fd, &x);
  if (st != FP4IDX_OK) return st;
  *resp = x.resp;
  resp->owned_ = NULL; /* integer fields only: nothing points into x */
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx__client_call(fp4idx_client_t *c, fp4idx_request_t *req,
                                    fp4idx_response_t *resp) {
  return fp4idx__client_call_fd(c, req, -1, resp);
}

fp4idx_status_t fp4idx_client_list(fp4idx_client_t *c, uint64_t cursor,
                                   uint32_t count, uint64_t *next_cursor,
                                   fp4idx_client_seq_info_t **seqs, size_t *n) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (next_cursor == NULL || seqs == NULL || n == NULL)
    return bad_arg(c, "next_cursor, seqs or n is NULL");
  *next_cursor = 0;
  *seqs = NULL;
  *n = 0;
  fp4idx_request_t req = {.op = FP4IDX_OP_LIST};
  req.u.list.cursor = cursor;
  req.u.list.count = count;
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, &req, &x);
  if (st != FP4IDX_OK) return st;
  const fp4idx_list_resp_t *l = &x.resp.u.list;
  if (l->nseqs > 0) {
    fp4idx_client_seq_info_t *out = malloc(l->nseqs * sizeof *out);
    if (out == NULL) {
      exchange_done(&x);
      return fp4idx__client_fail(c, FP4IDX_ENOMEM,
                                 "no memory for %zu sequences", l->nseqs);
    }
    for (size_t i = 0; i < l->nseqs; i++)
      out[i] = (fp4idx_client_seq_info_t){
          .seq = l->seqs[i].seq, .keys = l->seqs[i].keys, .pages = l->seqs[i].pages,
          .pages_shared = l->seqs[i].pages_shared};
    *seqs = out;
  }
  *n = l->nseqs;
  *next_cursor = l->cursor;
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_read(fp4idx_client_t *c, uint64_t seq,
                                   uint64_t from, uint64_t count, int dequant,
                                   void **keys, size_t *n) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (keys == NULL || n == NULL) return bad_arg(c, "keys or n is NULL");
  *keys = NULL;
  *n = 0;
  fp4idx_request_t req = {.op = FP4IDX_OP_READ};
  req.u.read.seq = seq;
  req.u.read.from = from;
  req.u.read.has_count = count != UINT64_MAX;
  req.u.read.count = count;
  req.u.read.dequant = dequant != 0;
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, &req, &x);
  if (st != FP4IDX_OK) return st;
  const fp4idx_tensor_t *t = &x.resp.u.read.keys;
  size_t want_cols = dequant ? FP4IDX_CLIENT_HEAD_DIM : FP4IDX_CLIENT_SLOT_BYTES;
  fp4idx_wire_dtype_t want_dt = dequant ? FP4IDX_WIRE_F32 : FP4IDX_WIRE_U8;
  if (t->dtype != want_dt || t->ndim != 2 || t->shape[1] != want_cols ||
      (count != UINT64_MAX && t->shape[0] > count)) {
    exchange_done(&x);
    fp4idx__client_disconnect(c);
    return fp4idx__client_fail(c, FP4IDX_EPROTO,
                               "read response keys have dtype %s, %u dims",
                               fp4idx_wire_dtype_name(t->dtype), t->ndim);
  }
  if (t->nbytes > 0) {
    void *buf = malloc(t->nbytes);
    if (buf == NULL) {
      exchange_done(&x);
      return fp4idx__client_fail(c, FP4IDX_ENOMEM,
                                 "no memory for %zu bytes of keys", t->nbytes);
    }
    memcpy(buf, t->data, t->nbytes);
    *keys = buf;
  }
  *n = (size_t)t->shape[0];
  exchange_done(&x);
  return FP4IDX_OK;
}

/* ---- scoring ------------------------------------------------------------- */

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Checks one decoded result against what was asked; returns its width or
 * -1 when it does not fit. */
static int64_t result_width(const fp4idx_score_result_t *r,
                            const fp4idx_client_seq_t *s, uint32_t topk) {
  const fp4idx_tensor_t *l = &r->logits;
  if (r->seq != s->seq || l->dtype != FP4IDX_WIRE_F32 || l->ndim != 2 ||
      l->shape[0] != s->rows || l->shape[1] > INT32_MAX)
    return -1;
  if ((topk != 0) != r->topk) return -1;
  if (topk != 0) {
    const fp4idx_tensor_t *p = &r->positions, *n = &r->counts;
    if (l->shape[1] != topk || p->dtype != FP4IDX_WIRE_I32 || p->ndim != 2 ||
        p->shape[0] != s->rows || p->shape[1] != topk ||
        n->dtype != FP4IDX_WIRE_I32 || n->ndim != 1 || n->shape[0] != s->rows)
      return -1;
  }
  return (int64_t)l->shape[1];
}

/* The caller's arrays for a one-sequence score received in place. */
typedef struct score_into_s {
  float *logits;
  size_t logits_cap; /* floats */
  int32_t *positions, *counts;
  uint32_t *width;
} score_into_t;

/* Sends the score request; on OK x holds the checked response, or with
 * `into` (one sequence) the results are already in the caller's arrays.
 * out: NULL, or the region references of seqs[0]'s results (logits,
 * positions, counts; see fp4idx_score_seq_t); ins: NULL, or the region
 * references of seqs[0]'s q, w and lens (lens absent: dtype NONE), which
 * then replace its pointers. */
static fp4idx_status_t score_exchange(fp4idx_client_t *c, uint32_t heads,
                                      uint32_t topk,
                                      const fp4idx_client_seq_t *seqs,
                                      size_t nseqs, const fp4idx_tensor_t *out,
                                      const fp4idx_tensor_t *ins,
                                      exchange_t *x, const score_into_t *into) {
  if (seqs == NULL || nseqs == 0) return bad_arg(c, "no sequences to score");
  if (heads < 1 || heads > FP4IDX_PROTO_MAX_HEADS)
    return fp4idx__client_fail(c, FP4IDX_EINVAL,
                               "heads %u outside 1..%u", heads,
                               FP4IDX_PROTO_MAX_HEADS);
  if (nseqs > FP4IDX_PROTO_MAX_SCORE_SEQS)
    return fp4idx__client_fail(c, FP4IDX_E2BIG,
                               "%zu sequences in one score request (max %u)",
                               nseqs, FP4IDX_PROTO_MAX_SCORE_SEQS);
  fp4idx_score_seq_t *ws = calloc(nseqs, sizeof *ws);
  if (ws == NULL)
    return fp4idx__client_fail(c, FP4IDX_ENOMEM, "out of memory");
  fp4idx_status_t st = FP4IDX_OK;
  for (size_t i = 0; i < nseqs; i++) {
    const fp4idx_client_seq_t *s = &seqs[i];
    const int refs = i == 0 && ins != NULL;
    if (s->rows == 0 || (!refs && (s->q == NULL || s->w == NULL)) ||
        (s->mask != NULL && s->mask_width == 0)) {
      st = fp4idx__client_fail(c, FP4IDX_EINVAL,
                               "seqs[%zu]: rows 0, q/w NULL or mask without "
                               "width",
                               i);
      goto out;
    }
    uint64_t R = s->rows;
    uint64_t qs[3] = {R, heads, FP4IDX_CLIENT_HEAD_DIM}, wsh[2] = {R, heads};
    uint64_t ls[1] = {R}, ms[2] = {R, s->mask_width};
    ws[i].seq = s->seq;
    ws[i].rows = s->rows;
    if (refs) { /* checked by the caller: fp4idx_client_score_regions */
      ws[i].q = ins[0];
      ws[i].w = ins[1];
      ws[i].lens = ins[2];
      continue;
    }
    int rc = fp4idx_tensor_init(&ws[i].q, FP4IDX_WIRE_BF16, 3, qs, s->q);
    if (rc == 0) rc = fp4idx_tensor_init(&ws[i].w, FP4IDX_WIRE_BF16, 2, wsh, s->w);
    if (rc == 0 && s->lens)
      rc = fp4idx_tensor_init(&ws[i].lens, FP4IDX_WIRE_I32, 1, ls, s->lens);
    if (rc == 0 && s->mask)
      rc = fp4idx_tensor_init(&ws[i].mask, FP4IDX_WIRE_U8, 2, ms, s->mask);
    if (rc != 0) {
      st = fp4idx__client_fail(c, (fp4idx_status_t)rc, "seqs[%zu]: %s", i,
                               fp4idx_strerror(rc));
      goto out;
    }
  }
  if (out) {
    ws[0].out_logits = out[0];
    ws[0].out_positions = out[1];
    ws[0].out_counts = out[2];
  }
  fp4idx_request_t req = {.op = FP4IDX_OP_SCORE};
  req.u.score.heads = heads;
  req.u.score.topk = topk;
  req.u.score.seqs = ws;
  req.u.score.nseqs = nseqs;
  if (into != NULL) {
    /* straight into the caller's arrays (recv_score.c) */
    int64_t deadline = fp4idx__client_deadline(c);
    st = send_request(c, &req, -1, deadline);
    if (st == FP4IDX_OK)
      st = fp4idx__client_recv_score(c, req.id, seqs[0].seq, seqs[0].rows, topk,
                                     into->logits, into->logits_cap, into->positions,
                                     into->counts, into->width, deadline);
    goto out;
  }
  st = roundtrip(c, &req, x);
  if (st != FP4IDX_OK) goto out;
  const fp4idx_score_resp_t *sr = &x->resp.u.score;
  int ok = sr->nresults == nseqs;
  for (size_t i = 0; ok && i < nseqs; i++)
    ok = result_width(&sr->results[i], &seqs[i], topk) >= 0;
  if (!ok) {
    exchange_done(x);
    fp4idx__client_disconnect(c);
    st = fp4idx__client_fail(c, FP4IDX_EPROTO,
                             "score response does not match the request "
                             "(results, seq, shapes)");
  }
out:
  free(ws);
  return st;
}

fp4idx_status_t fp4idx_client_score(fp4idx_client_t *c, uint32_t heads,
                                    uint32_t topk,
                                    const fp4idx_client_seq_t *seqs,
                                    size_t nseqs,
                                    fp4idx_client_result_t **out) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (out == NULL) return bad_arg(c, "out is NULL");
  *out = NULL;
  exchange_t x;
  fp4idx_status_t st = score_exchange(c, heads, topk, seqs, nseqs, NULL, NULL, &x, NULL);
  if (st != FP4IDX_OK) return st;
  const fp4idx_score_resp_t *sr = &x.resp.u.score;

  /* One block: the result array, then each result's arrays (8-aligned). */
  size_t total = align8(nseqs * sizeof(fp4idx_client_result_t));
  for (size_t i = 0; i < nseqs; i++) {
    total += align8(sr->results[i].logits.nbytes);
    total += align8(sr->results[i].positions.nbytes);
    total += align8(sr->results[i].counts.nbytes);
  }
  char *block = calloc(1, total);
  if (block == NULL) {
    exchange_done(&x);
    return fp4idx__client_fail(c, FP4IDX_ENOMEM,
                               "no memory for %zu bytes of results", total);
  }
  fp4idx_client_result_t *res = (fp4idx_client_result_t *)block;
  char *p = block + align8(nseqs * sizeof *res);
  for (size_t i = 0; i < nseqs; i++) {
    const fp4idx_score_result_t *r = &sr->results[i];
    res[i].seq = r->seq;
    res[i].rows = seqs[i].rows;
    res[i].width = (uint32_t)r->logits.shape[1];
    res[i].logits = (float *)p;
    if (r->logits.nbytes) memcpy(p, r->logits.data, r->logits.nbytes);
    p += align8(r->logits.nbytes);
    if (r->topk) {
      res[i].positions = (int32_t *)p;
      memcpy(p, r->positions.data, r->positions.nbytes);
      p += align8(r->positions.nbytes);
      res[i].counts = (int32_t *)p;
      memcpy(p, r->counts.data, r->counts.nbytes);
      p += align8(r->counts.nbytes);
    }
  }
  exchange_done(&x);
  *out = res;
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_score_into(fp4idx_client_t *c, uint64_t seq,
                                         uint32_t heads, uint32_t rows,
                                         const uint16_t *q, const uint16_t *w,
                                         const int32_t *lens, float *logits,
                                         size_t cap, uint32_t *width) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (width == NULL || (logits == NULL && cap > 0))
    return bad_arg(c, "width NULL, or logits NULL with cap > 0");
  fp4idx_client_seq_t s = {.seq = seq, .rows = rows, .q = q, .w = w,
                           .lens = lens};
  score_into_t into = {.logits = logits, .logits_cap = cap, .width = width};
  return score_exchange(c, heads, 0, &s, 1, NULL, NULL, NULL, &into);
}

fp4idx_status_t fp4idx_client_topk(fp4idx_client_t *c, uint64_t seq,
                                   uint32_t heads, uint32_t rows,
                                   const uint16_t *q, const uint16_t *w,
                                   const int32_t *lens, uint32_t k,
                                   int32_t *positions, float *logits,
                                   int32_t *counts) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (k == 0) return bad_arg(c, "k is 0");
  if (positions == NULL || logits == NULL)
    return bad_arg(c, "positions or logits is NULL");
  fp4idx_client_seq_t s = {.seq = seq, .rows = rows, .q = q, .w = w,
                           .lens = lens};
  if ((uint64_t)rows * k > SIZE_MAX / 4)
    return bad_arg(c, "rows x k too large");
  /* Large results through the connection's reply region, [positions |
   * logits | counts] with no gap (the daemon brings them back by one copy);
   * where no region can be had, the socket from now on. */
  const size_t kk = (size_t)rows * k * 4;
  if (rows > 0 && kk <= (SIZE_MAX - rows * 4u) / 2 &&
      fp4idx__client_reply_wanted(c, 2 * kk + (size_t)rows * 4)) {
    void *p = NULL;
    uint64_t rid = 0;
    fp4idx_status_t st = fp4idx__client_reply_region(c, 2 * kk + (size_t)rows * 4, &p, &rid);
    if (st == FP4IDX_OK) {
      st = fp4idx_client_topk_region(c, seq, heads, rows, q, w, lens, k, rid, 0, kk, 2 * kk);
      if (st == FP4IDX_OK) {
        memcpy(positions, p, kk);
        memcpy(logits, (const char *)p + kk, kk);
        if (counts) memcpy(counts, (const char *)p + 2 * kk, (size_t)rows * 4);
      }
      return st;
    }
    if (!fp4idx_client_connected(c)) return st;
    c->reply_min = 0;
  }
  score_into_t into = {.logits = logits, .logits_cap = (size_t)rows * k,
                       .positions = positions, .counts = counts};
  return score_exchange(c, heads, k, &s, 1, NULL, NULL, NULL, &into);
}

/* ---- regions ------------------------------------------------------------- */

static fp4idx_status_t register_region(fp4idx_client_t *c,
                                       fp4idx_request_t *req, int fd,
                                       uint64_t *region) {
  exchange_t x;
  fp4idx_status_t st = roundtrip_fd(c, req, fd, &x);
  if (st != FP4IDX_OK) return st;
  *region = x.resp.u.register_.region;
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_region_register_fd(fp4idx_client_t *c, int fd,
                                                 size_t size,
                                                 uint64_t *region) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (fd < 0 || size == 0 || region == NULL)
    return bad_arg(c, "fd < 0, size 0 or region NULL");
  fp4idx_request_t req = {.op = FP4IDX_OP_REGISTER};
  req.u.register_ = (fp4idx_register_req_t){.kind = FP4IDX_REGION_HOST,
                                            .size = size};
  return register_region(c, &req, fd, region);
}

int fp4idx__client_memfd_map(const char *name, size_t size, unsigned seals, void **ptr) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  void *p = MAP_FAILED;
  if (ftruncate(fd, (off_t)size) != 0 || fcntl(fd, F_ADD_SEALS, (int)seals) != 0 ||
      (p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  *ptr = p;
  return fd;
}

fp4idx_status_t fp4idx_client_region_create(fp4idx_client_t *c, size_t size,
                                            uint64_t *region, void **ptr) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (size == 0 || region == NULL || ptr == NULL)
    return bad_arg(c, "size 0, region or ptr NULL");
  *ptr = NULL;
  *region = 0;
  void *p = NULL;
  int fd = fp4idx__client_memfd_map("fp4idx-region", size, F_SEAL_SHRINK | F_SEAL_SEAL, &p);
  if (fd < 0)
    return fp4idx__client_fail(c, FP4IDX_ENOMEM, "cannot make a %zu-byte region: %s", size,
                               strerror(errno));
  fp4idx_status_t st = fp4idx_client_region_register_fd(c, fd, size, region);
  close(fd); /* both sides hold their own mapping now */
  if (st != FP4IDX_OK) {
    munmap(p, size);
    return st;
  }
  *ptr = p;
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_region_register_cuda(fp4idx_client_t *c,
                                                   const void *ipc_handle,
                                                   size_t size,
                                                   uint32_t device,
                                                   uint64_t *region) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (ipc_handle == NULL || size == 0 || region == NULL)
    return bad_arg(c, "ipc_handle NULL, size 0 or region NULL");
  fp4idx_request_t req = {.op = FP4IDX_OP_REGISTER};
  req.u.register_ = (fp4idx_register_req_t){
      .kind = FP4IDX_REGION_CUDA,
      .size = size,
      .handle = ipc_handle,
      .handle_len = FP4IDX_CLIENT_CUDA_HANDLE_BYTES,
      .device = device};
  return register_region(c, &req, -1, region);
}

fp4idx_status_t fp4idx_client_region_unregister(fp4idx_client_t *c,
                                                uint64_t region) {
  if (c == NULL) return FP4IDX_EINVAL;
  fp4idx_request_t req = {.op = FP4IDX_OP_UNREGISTER};
  req.u.unregister.region = region;
  return roundtrip_empty(c, &req);
}

fp4idx_status_t fp4idx_client_region_destroy(fp4idx_client_t *c,
                                             uint64_t region, void *ptr,
                                             size_t size) {
  fp4idx_status_t st = FP4IDX_OK;
  if (c != NULL && fp4idx_client_connected(c))
    st = fp4idx_client_region_unregister(c, region);
  if (ptr != NULL && size > 0) munmap(ptr, size);
  return st;
}

fp4idx_status_t fp4idx_client_append_region(
    fp4idx_client_t *c, uint64_t seq, fp4idx_client_keys_t dtype,
    uint64_t region, uint64_t offset, size_t n,
    fp4idx_client_rounding_t rounding, uint64_t *first, uint64_t *length) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (region == 0) return bad_arg(c, "region 0");
  return append_keys(c, seq, dtype, NULL, region, offset, n, rounding, first,
                     length);
}

/* One sequence scored into regions: the outputs named by o[3] (logits,
 * positions, counts; positions and counts only for topk >= 1), the inputs
 * from s's pointers or, with ins, from regions (see score_exchange). */
static fp4idx_status_t score_to_regions(fp4idx_client_t *c,
                                        const fp4idx_client_seq_t *s,
                                        uint32_t heads, uint32_t topk,
                                        uint32_t width,
                                        const fp4idx_client_ref_t o[3],
                                        const fp4idx_tensor_t *ins) {
  fp4idx_tensor_t out[3];
  memset(out, 0, sizeof out);
  uint64_t shp[2] = {s->rows, topk ? topk : width}, rs[1] = {s->rows};
  if (fp4idx_tensor_ref(&out[0], FP4IDX_WIRE_F32, 2, shp, o[0].region,
                        o[0].offset) ||
      (topk && (fp4idx_tensor_ref(&out[1], FP4IDX_WIRE_I32, 2, shp,
                                  o[1].region, o[1].offset) ||
                fp4idx_tensor_ref(&out[2], FP4IDX_WIRE_I32, 1, rs,
                                  o[2].region, o[2].offset))))
    return bad_arg(c, "outputs do not fit in memory");
  exchange_t x;
  fp4idx_status_t st = score_exchange(c, heads, topk, s, 1, out, ins, &x, NULL);
  if (st != FP4IDX_OK) return st;
  exchange_done(&x);
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_score_region(
    fp4idx_client_t *c, uint64_t seq, uint32_t heads, uint32_t rows,
    const uint16_t *q, const uint16_t *w, const int32_t *lens, uint32_t width,
    uint64_t region, uint64_t offset) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (region == 0 || rows == 0) return bad_arg(c, "region 0 or rows 0");
  fp4idx_client_seq_t s = {.seq = seq, .rows = rows, .q = q, .w = w,
                           .lens = lens};
  const fp4idx_client_ref_t o[3] = {{region, offset}, {0, 0}, {0, 0}};
  return score_to_regions(c, &s, heads, 0, width, o, NULL);
}

fp4idx_status_t fp4idx_client_topk_region(
    fp4idx_client_t *c, uint64_t seq, uint32_t heads, uint32_t rows,
    const uint16_t *q, const uint16_t *w, const int32_t *lens, uint32_t k,
    uint64_t region, uint64_t positions_offset, uint64_t logits_offset,
    uint64_t counts_offset) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (region == 0 || rows == 0 || k == 0)
    return bad_arg(c, "region 0, rows 0 or k 0");
  fp4idx_client_seq_t s = {.seq = seq, .rows = rows, .q = q, .w = w,
                           .lens = lens};
  const fp4idx_client_ref_t o[3] = {
      {region, logits_offset}, {region, positions_offset}, {region, counts_offset}};
  return score_to_regions(c, &s, heads, k, 0, o, NULL);
}

fp4idx_status_t fp4idx_client_score_regions(
    fp4idx_client_t *c, const fp4idx_client_region_score_t *call) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (call == NULL) return bad_arg(c, "call is NULL");
  if (call->rows == 0 || call->q.region == 0 || call->w.region == 0 ||
      call->logits.region == 0 ||
      (call->topk && (call->positions.region == 0 || call->counts.region == 0)))
    return bad_arg(c, "rows 0, or q, w or an output not in a region");
  const uint64_t R = call->rows;
  uint64_t qs[3] = {R, call->heads, FP4IDX_CLIENT_HEAD_DIM};
  uint64_t wsh[2] = {R, call->heads}, ls[1] = {R};
  fp4idx_tensor_t ins[3];
  memset(ins, 0, sizeof ins); /* lens: none unless named */
  if (fp4idx_tensor_ref(&ins[0], FP4IDX_WIRE_BF16, 3, qs, call->q.region,
                        call->q.offset) ||
      fp4idx_tensor_ref(&ins[1], FP4IDX_WIRE_BF16, 2, wsh, call->w.region,
                        call->w.offset) ||
      (call->lens.region &&
       fp4idx_tensor_ref(&ins[2], FP4IDX_WIRE_I32, 1, ls, call->lens.region,
                         call->lens.offset)))
    return bad_arg(c, "inputs do not fit in memory");
  fp4idx_client_seq_t s = {.seq = call->seq, .rows = call->rows};
  const fp4idx_client_ref_t o[3] = {call->logits, call->positions, call->counts};
  return score_to_regions(c, &s, call->heads, call->topk, call->width, o, ins);
}

/* ---- stats --------------------------------------------------------------- */

static int op_cmp(const void *a, const void *b) {
  return strcmp(((const fp4idx_client_op_stats_t *)a)->op,
                ((const fp4idx_client_op_stats_t *)b)->op);
}

/* Copies n decoded counters into d[], their buckets at p (8-aligned);
 * returns the byte after them. */
static char *copy_counters(fp4idx_client_op_stats_t *d,
                           const fp4idx_op_stats_t *in, size_t n, char *p) {
  for (size_t i = 0; i < n; i++) {
    const fp4idx_op_stats_t *o = &in[i];
    copy_str(d[i].op, sizeof d[i].op, o->op);
    d[i].count = o->count;
    d[i].errors = o->errors;
    d[i].latency_sum_us = o->sum_us;
    d[i].nbuckets = o->nbuckets;
    double *b = (double *)p;
    memcpy(b, o->le_us, o->nbuckets * sizeof *b);
    p += o->nbuckets * sizeof(double);
    uint64_t *h = (uint64_t *)p;
    memcpy(h, o->hist, o->nbuckets * sizeof *h);
    p += o->nbuckets * sizeof(uint64_t);
    d[i].bounds_us = b;
    d[i].hist = h;
  }
  return p;
}

fp4idx_status_t fp4idx_client_stats(fp4idx_client_t *c,
                                    fp4idx_client_stats_t **out) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (out == NULL) return bad_arg(c, "out is NULL");
  *out = NULL;
  fp4idx_request_t req = {.op = FP4IDX_OP_STATS};
  exchange_t x;
  fp4idx_status_t st = roundtrip(c, &req, &x);
  if (st != FP4IDX_OK) return st;
  const fp4idx_stats_t *in = &x.resp.u.stats;

  size_t nb = 0;
  for (size_t i = 0; i < in->nops; i++) nb += in->ops[i].nbuckets;
  for (size_t i = 0; i < in->nstages; i++) nb += in->stages[i].nbuckets;
  size_t total = align8(sizeof(fp4idx_client_stats_t)) +
                 align8(in->nops * sizeof(fp4idx_client_op_stats_t)) +
                 align8(in->nstages * sizeof(fp4idx_client_op_stats_t)) +
                 nb * (sizeof(double) + sizeof(uint64_t));
  char *block = calloc(1, total);
  if (block == NULL) {
    exchange_done(&x);
    return fp4idx__client_fail(c, FP4IDX_ENOMEM, "out of memory");
  }
  fp4idx_client_stats_t *s = (fp4idx_client_stats_t *)block;
  s->uptime_s = in->uptime_s;
  s->connections = in->connections;
  s->sequences = in->sequences;
  s->keys = in->keys;
  s->pages_total = in->pages_total;
  s->pages_free = in->pages_free;
  s->pages_shared = in->pages_shared;
  copy_str(s->backend, sizeof s->backend, in->backend);
  copy_str(s->device, sizeof s->device, in->device);
  s->keys_appended = in->keys_appended;
  s->rows_scored = in->rows_scored;
  s->request_bytes = in->request_bytes;
  s->response_bytes = in->response_bytes;
  _Static_assert(sizeof s->status_errors == sizeof in->status_errors,
                 "status_errors: client and wire tables differ");
  memcpy(s->status_errors, in->status_errors, sizeof s->status_errors);
  s->queue_depth = in->queue_depth;
  s->device_mem_total = in->device_mem_total;
  s->device_mem_free = in->device_mem_free;
  copy_str(s->gpu_sharing, sizeof s->gpu_sharing, in->gpu_sharing);
  s->gpu_other_processes = in->gpu_other_processes;
  s->buffered_bytes = in->buffered_bytes;
  s->buffered_bytes_peak = in->buffered_bytes_peak;
  s->buffer_budget = in->buffer_budget;
  s->channels = in->channels;
  s->channel_calls = in->channel_calls;
  s->channel_errors = in->channel_errors;
  s->nops = (uint32_t)in->nops;
  s->ops = (fp4idx_client_op_stats_t *)(block + align8(sizeof *s));
  s->nstages = (uint32_t)in->nstages;
  s->stages = (fp4idx_client_op_stats_t *)((char *)s->ops +
                                           align8(in->nops * sizeof *s->ops));
  char *p = (char *)s->stages + align8(in->nstages * sizeof *s->stages);
  p = copy_counters(s->ops, in->ops, in->nops, p);
  copy_counters(s->stages, in->stages, in->nstages, p);
  qsort(s->ops, s->nops, sizeof *s->ops, op_cmp);
  exchange_done(&x);
  *out = s;
  return FP4IDX_OK;
}
