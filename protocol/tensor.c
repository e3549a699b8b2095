/* tensor.c -- tensors on the wire: {"dtype": str, "shape": [uint...],
 * "data": bin}, decoded as views into the frame body, encoded by copy. */
#include <stdio.h>

#include "codec_internal.h"

static const struct {
  const char *name;
  size_t size;
} dtypes[] = {[FP4IDX_WIRE_NONE] = {"?", 0},
              [FP4IDX_WIRE_BF16] = {"bf16", 2},
              [FP4IDX_WIRE_F32] = {"f32", 4},
              [FP4IDX_WIRE_I32] = {"i32", 4},
              [FP4IDX_WIRE_U8] = {"u8", 1}};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

size_t fp4idx_wire_dtype_size(fp4idx_wire_dtype_t dt) {
  return (unsigned)dt < NDTYPES ? dtypes[dt].size : 0;
}

const char *fp4idx_wire_dtype_name(fp4idx_wire_dtype_t dt) {
  return (unsigned)dt < NDTYPES ? dtypes[dt].name : "?";
}

bool fp4idx__tensor_bytes(fp4idx_wire_dtype_t dt, uint32_t ndim,
                          const uint64_t *shape, size_t *nbytes) {
  uint64_t n = fp4idx_wire_dtype_size(dt);
  for (uint32_t i = 0; i < ndim; i++) {
    if (shape[i] != 0 && n > SIZE_MAX / shape[i]) return false;
    n *= shape[i];
  }
  *nbytes = (size_t)n;
  return true;
}

int fp4idx_tensor_init(fp4idx_tensor_t *t, fp4idx_wire_dtype_t dtype,
                       uint32_t ndim, const uint64_t *shape,
                       const void *data) {
  size_t nbytes;
  if (t == NULL || shape == NULL || ndim == 0 ||
      ndim > FP4IDX_PROTO_MAX_NDIM || fp4idx_wire_dtype_size(dtype) == 0)
    return FP4IDX_EINVAL;
  if (!fp4idx__tensor_bytes(dtype, ndim, shape, &nbytes)) return FP4IDX_E2BIG;
  if (data == NULL && nbytes > 0) return FP4IDX_EINVAL;
  memset(t, 0, sizeof(*t));
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, ndim * sizeof(shape[0]));
  t->data = data;
  t->nbytes = nbytes;
  return 0;
}

int fp4idx_tensor_ref(fp4idx_tensor_t *t, fp4idx_wire_dtype_t dtype,
                      uint32_t ndim, const uint64_t *shape, uint64_t region,
                      uint64_t offset) {
  if (t == NULL || region == 0) return FP4IDX_EINVAL;
  /* a non-NULL dummy passes tensor_init's data check; cleared below */
  int rc = fp4idx_tensor_init(t, dtype, ndim, shape, t);
  if (rc != 0) return rc;
  t->data = NULL;
  t->region = region;
  t->offset = offset;
  return 0;
}

bool fp4idx__tensor_sane(const fp4idx_tensor_t *t) {
  size_t nbytes;
  if (fp4idx_wire_dtype_size(t->dtype) == 0 || t->ndim == 0 ||
      t->ndim > FP4IDX_PROTO_MAX_NDIM)
    return false;
  if (!fp4idx__tensor_bytes(t->dtype, t->ndim, t->shape, &nbytes) ||
      nbytes != t->nbytes)
    return false;
  return t->region != 0 || t->data != NULL || t->nbytes == 0;
}

const char *fp4idx__tensor_desc(const fp4idx_tensor_t *t, char *buf,
                                size_t cap) {
  size_t off = 0;
  int n = snprintf(buf, cap, "%s [", fp4idx_wire_dtype_name(t->dtype));
  if (n < 0 || (size_t)n >= cap) return buf;
  off = (size_t)n;
  for (uint32_t i = 0; i < t->ndim && i < FP4IDX_PROTO_MAX_NDIM; i++) {
    n = snprintf(buf + off, cap - off, "%s%llu", i ? "," : "",
                 (unsigned long long)t->shape[i]);
    if (n < 0 || (size_t)n >= cap - off) return buf;
    off += (size_t)n;
  }
  snprintf(buf + off, cap - off, "]");
  return buf;
}

int fp4idx__get_tensor(const msgpack_object *v, const char *path,
                       const char *name, bool strict, fp4idx_tensor_t *t,
                       char *msg, size_t cap) {
  char where[128];
  fp4idx__field_t f[5] = {{"dtype", NULL},
                          {"shape", NULL},
                          {"data", NULL},
                          {"region", NULL},
                          {"offset", NULL}};
  fp4idx_strview_t dt;
  int rc;

  memset(t, 0, sizeof(*t));
  fp4idx__path_cat(where, sizeof(where), path, path[0] ? "." : "", name);
  if (v == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: missing field", where);
  if (v->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "%s: expected a tensor map {dtype, shape, data}",
                        where);
  if ((rc = fp4idx__map_fields(v, where, f, 5, strict, msg, cap)) != 0)
    return rc;
  /* A region reference {region, offset, dtype, shape} instead of data. */
  if (f[3].val != NULL || f[4].val != NULL) {
    if ((rc = fp4idx__get_uint(f[3].val, where, "region", &t->region, msg,
                               cap)) ||
        (rc = fp4idx__get_uint(f[4].val, where, "offset", &t->offset, msg,
                               cap)))
      return rc;
    if (t->region == 0)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "%s.region: 0 names no region (ids start at 1)",
                          where);
    if (f[2].val != NULL)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "%s: a region reference has no data field", where);
  }
  if ((rc = fp4idx__get_str(f[0].val, where, "dtype", &dt, msg, cap)) != 0)
    return rc;
  for (unsigned d = 1; d < NDTYPES; d++)
    if (strlen(dtypes[d].name) == dt.len &&
        memcmp(dtypes[d].name, dt.ptr, dt.len) == 0)
      t->dtype = (fp4idx_wire_dtype_t)d;
  if (t->dtype == FP4IDX_WIRE_NONE)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE,
                        "%s.dtype: '%.*s' is not bf16, f32, i32 or u8", where,
                        dt.len > 16 ? 16 : (int)dt.len, dt.ptr);

  const msgpack_object *s = f[1].val;
  if (s == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s.shape: missing field",
                        where);
  if (s->type != MSGPACK_OBJECT_ARRAY)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "%s.shape: expected an array of uints", where);
  if (s->via.array.size == 0)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE,
                        "%s.shape: empty (scalars are not tensors)", where);
  if (s->via.array.size > FP4IDX_PROTO_MAX_NDIM)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG,
                        "%s.shape: %u dims, at most %u", where,
                        s->via.array.size, FP4IDX_PROTO_MAX_NDIM);
  t->ndim = s->via.array.size;
  for (uint32_t i = 0; i < t->ndim; i++) {
    const msgpack_object *e = &s->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "%s.shape[%u]: expected an unsigned integer", where,
                          i);
    t->shape[i] = e->via.u64;
  }

  size_t want;
  char desc[96];
  /* desc only for a message: built on the error branches alone */
  if (t->region != 0) {
    if (!fp4idx__tensor_bytes(t->dtype, t->ndim, t->shape, &t->nbytes))
      return fp4idx__fail(msg, cap, FP4IDX_ESHAPE,
                          "%s: %s is too large (size overflows)", where,
                          fp4idx__tensor_desc(t, desc, sizeof(desc)));
    return 0;
  }
  const msgpack_object *d = f[2].val;
  if (d == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s.data: missing field",
                        where);
  /* bin is the encoding; str is accepted too because pre-1.0 Python msgpack
   * (use_bin_type=False) sends bytes as str */
  if (d->type == MSGPACK_OBJECT_BIN) {
    t->data = d->via.bin.ptr;
    t->nbytes = d->via.bin.size;
  } else if (d->type == MSGPACK_OBJECT_STR) {
    t->data = d->via.str.ptr;
    t->nbytes = d->via.str.size;
  } else {
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s.data: expected bin",
                        where);
  }
  if (!fp4idx__tensor_bytes(t->dtype, t->ndim, t->shape, &want))
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE,
                        "%s: %s is too large (size overflows)", where,
                        fp4idx__tensor_desc(t, desc, sizeof(desc)));
  if (want != t->nbytes)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE,
                        "%s: %s needs %zu bytes of data, got %zu", where,
                        fp4idx__tensor_desc(t, desc, sizeof(desc)), want, t->nbytes);
  return 0;
}

int fp4idx__pack_tensor(msgpack_packer *pk, const fp4idx_tensor_t *t) {
  int rc = 0;
  rc |= msgpack_pack_map(pk, t->region != 0 ? 4 : 3);
  if (t->region != 0) {
    rc |= fp4idx__pack_kv_uint(pk, "region", t->region);
    rc |= fp4idx__pack_kv_uint(pk, "offset", t->offset);
  }
  rc |= fp4idx__pack_cstr(pk, "dtype");
  rc |= fp4idx__pack_cstr(pk, fp4idx_wire_dtype_name(t->dtype));
  rc |= fp4idx__pack_cstr(pk, "shape");
  rc |= msgpack_pack_array(pk, t->ndim);
  for (uint32_t i = 0; i < t->ndim; i++) rc |= msgpack_pack_uint64(pk, t->shape[i]);
  if (t->region != 0) return rc;
  rc |= fp4idx__pack_cstr(pk, "data");
  rc |= msgpack_pack_bin(pk, t->nbytes);
  if (t->nbytes > 0) rc |= msgpack_pack_bin_body(pk, t->data, t->nbytes);
  return rc;
}
