/* pack.c -- writing frames into a msgpack_sbuffer: a 4-byte header slot
 * patched once the body is packed, with rollback on failure so that a failed
 * encode leaves the buffer as it was. */
#include "codec_internal.h"

int fp4idx__frame_begin(msgpack_sbuffer *sb, size_t *start) {
  static const char zero[4] = {0, 0, 0, 0};
  *start = sb->size;
  return msgpack_sbuffer_write(sb, zero, 4) == 0 ? 0 : FP4IDX_ENOMEM;
}

int fp4idx__frame_end(msgpack_sbuffer *sb, size_t start, int rc) {
  size_t body = sb->size - start - 4;
  if (rc == 0 && body > FP4IDX_MAX_FRAME_LIMIT) rc = FP4IDX_E2BIG;
  if (rc != 0) {
    sb->size = start; /* roll back: the bytes stay allocated, unused */
    return rc;
  }
  fp4idx_frame_header_put((unsigned char *)sb->data + start, (uint32_t)body);
  return 0;
}

/* Appends src to dst[*at..cap - 1), keeping room for the NUL. */
static void fp4idx__path_put(char *dst, size_t cap, size_t *at, const char *src) {
  while (*src && *at + 1 < cap) dst[(*at)++] = *src++;
}

void fp4idx__path_cat(char *dst, size_t cap, const char *a, const char *sep, const char *b) {
  size_t at = 0;
  fp4idx__path_put(dst, cap, &at, a);
  fp4idx__path_put(dst, cap, &at, sep);
  fp4idx__path_put(dst, cap, &at, b);
  dst[at] = 0;
}

void fp4idx__path_index(char *dst, size_t cap, const char *name, size_t i) {
  char num[24], *p = num + sizeof num;
  *--p = 0;
  do *--p = (char)('0' + i % 10); while ((i /= 10) != 0);
  size_t at = 0;
  fp4idx__path_put(dst, cap, &at, name);
  fp4idx__path_put(dst, cap, &at, "[");
  fp4idx__path_put(dst, cap, &at, p);
  fp4idx__path_put(dst, cap, &at, "]");
  dst[at] = 0;
}

int fp4idx__split_write(void *data, const char *buf, size_t len) {
  fp4idx__split_t *sp = data;
  if (len == 0 || len < sp->min || (sp->is_payload && !sp->is_payload(sp->ctx, buf, len)))
    return msgpack_sbuffer_write(sp->sb, buf, len);
  if (sp->n == sp->cap) {
    sp->overflow = 1;
    return -1;
  }
  sp->out[sp->n++] = (fp4idx_payload_t){sp->sb->size, buf, len};
  sp->bytes += len;
  return 0;
}

int fp4idx__split_end(fp4idx__split_t *sp, size_t start, int rc, size_t *n) {
  msgpack_sbuffer *sb = sp->sb;
  if (rc != 0 && sp->overflow) rc = FP4IDX_EINVAL;
  size_t body = sb->size - start - 4 + sp->bytes;
  if (rc == 0 && (body < sp->bytes || body > FP4IDX_MAX_FRAME_LIMIT)) rc = FP4IDX_E2BIG;
  if (rc != 0) {
    sb->size = start;
    return rc;
  }
  fp4idx_frame_header_put((unsigned char *)sb->data + start, (uint32_t)body);
  *n = sp->n;
  return 0;
}

int fp4idx__pack_strn(msgpack_packer *pk, const char *s, size_t n) {
  int rc = msgpack_pack_str(pk, n);
  if (n > 0) rc |= msgpack_pack_str_body(pk, s, n);
  return rc;
}

int fp4idx__pack_cstr(msgpack_packer *pk, const char *s) {
  return fp4idx__pack_strn(pk, s, strlen(s));
}

int fp4idx__pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v) {
  return fp4idx__pack_cstr(pk, k) | msgpack_pack_uint64(pk, v);
}

int fp4idx__pack_kv_tensor(msgpack_packer *pk, const char *k,
                           const fp4idx_tensor_t *t) {
  return fp4idx__pack_cstr(pk, k) | fp4idx__pack_tensor(pk, t);
}

int fp4idx__pack_req_head(msgpack_packer *pk, const fp4idx_request_t *req,
                          size_t nfields) {
  return msgpack_pack_map(pk, 2 + nfields) |
         fp4idx__pack_kv_uint(pk, "id", req->id) |
         fp4idx__pack_cstr(pk, "op") |
         fp4idx__pack_cstr(pk, fp4idx_op_name(req->op));
}

int fp4idx__pack_resp_head(msgpack_packer *pk, const fp4idx_response_t *r,
                           size_t nfields) {
  return msgpack_pack_map(pk, 2 + nfields) |
         fp4idx__pack_kv_uint(pk, "id", r->id) |
         fp4idx__pack_cstr(pk, "status") | msgpack_pack_int(pk, 0);
}
