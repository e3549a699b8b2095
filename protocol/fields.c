/* fields.c -- typed, strict access to the fields of a decoded msgpack map,
 * with error messages that name the field ("seqs[1].lens: ..."). */
#include <stdio.h>

#include "codec_internal.h"

static bool str_is(const msgpack_object *o, const char *s) {
  size_t n = strlen(s);
  return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
         memcmp(o->via.str.ptr, s, n) == 0;
}

/* "path.name" or "name" for messages. */
#define SEP(path) ((path)[0] ? "." : "")

const msgpack_object *fp4idx__map_get(const msgpack_object *map,
                                      const char *name) {
  if (map == NULL || map->type != MSGPACK_OBJECT_MAP) return NULL;
  for (uint32_t i = 0; i < map->via.map.size; i++)
    if (str_is(&map->via.map.ptr[i].key, name))
      return &map->via.map.ptr[i].val;
  return NULL;
}

int fp4idx__map_fields(const msgpack_object *map, const char *path,
                       fp4idx__field_t *fields, size_t n, bool strict,
                       char *msg, size_t cap) {
  bool seen[32] = {false};
  size_t next = 0;

  if (n > 32) return fp4idx__fail(msg, cap, FP4IDX_EINTERNAL, "too many fields");
  for (size_t f = 0; f < n; f++) fields[f].val = NULL;
  if (map->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: expected a map",
                        path[0] ? path : "message");
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    if (kv->key.type != MSGPACK_OBJECT_STR)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "%s: map key %u is not a string",
                          path[0] ? path : "message", i);
    /* keys mostly come in the table's order (every packer here writes
     * them so): the search starts after the last key's field, and wraps */
    size_t f = n, k;
    for (k = 0; k < n; k++) {
      size_t at = (next + k) % n;
      if (str_is(&kv->key, fields[at].name)) {
        f = at;
        next = at + 1;
        break;
      }
    }
    if (f == n) {
      if (!strict) continue;
      int klen = kv->key.via.str.size > 64 ? 64 : (int)kv->key.via.str.size;
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s%sunknown field '%.*s'",
                          path, path[0] ? ": " : "", klen, kv->key.via.str.ptr);
    }
    if (seen[f])
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s%s%s: given twice", path,
                          SEP(path), fields[f].name);
    seen[f] = true;
    /* nil counts as absent: optional fields may be sent as nil/None */
    fields[f].val = kv->val.type == MSGPACK_OBJECT_NIL ? NULL : &kv->val;
  }
  return 0;
}

static int missing(const char *path, const char *name, char *msg, size_t cap) {
  return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s%s%s: missing field", path,
                      SEP(path), name);
}

static const char *type_name(const msgpack_object *v) {
  switch (v->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "uint";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative int";
    case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_EXT: return "ext";
  }
  return "?";
}

static int wrong(const msgpack_object *v, const char *path, const char *name,
                 const char *want, char *msg, size_t cap) {
  return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s%s%s: expected %s, got %s",
                      path, SEP(path), name, want, type_name(v));
}

int fp4idx__get_uint(const msgpack_object *v, const char *path,
                     const char *name, uint64_t *out, char *msg, size_t cap) {
  if (v == NULL) return missing(path, name, msg, cap);
  /* msgpack-c maps every non-negative integer encoding (positive fixint,
   * uint8..64 and non-negative int8..64) to POSITIVE_INTEGER */
  if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return wrong(v, path, name, "an unsigned integer", msg, cap);
  *out = v->via.u64;
  return 0;
}

int fp4idx__get_int(const msgpack_object *v, const char *path,
                    const char *name, int64_t *out, char *msg, size_t cap) {
  if (v == NULL) return missing(path, name, msg, cap);
  if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *out = v->via.i64;
    return 0;
  }
  if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX) {
    *out = (int64_t)v->via.u64;
    return 0;
  }
  return wrong(v, path, name, "an integer", msg, cap);
}

int fp4idx__get_num(const msgpack_object *v, const char *path,
                    const char *name, double *out, char *msg, size_t cap) {
  if (v == NULL) return missing(path, name, msg, cap);
  switch (v->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *out = v->via.f64; return 0;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)v->via.u64; return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)v->via.i64; return 0;
    default: return wrong(v, path, name, "a number", msg, cap);
  }
}

int fp4idx__get_bool(const msgpack_object *v, const char *path,
                     const char *name, bool *out, char *msg, size_t cap) {
  if (v == NULL) return missing(path, name, msg, cap);
  if (v->type != MSGPACK_OBJECT_BOOLEAN)
    return wrong(v, path, name, "a bool", msg, cap);
  *out = v->via.boolean;
  return 0;
}

int fp4idx__get_str(const msgpack_object *v, const char *path,
                    const char *name, fp4idx_strview_t *out, char *msg,
                    size_t cap) {
  if (v == NULL) return missing(path, name, msg, cap);
  if (v->type != MSGPACK_OBJECT_STR)
    return wrong(v, path, name, "a str", msg, cap);
  out->ptr = v->via.str.ptr;
  out->len = v->via.str.size;
  return 0;
}

int fp4idx__get_strcpy(const msgpack_object *v, const char *path,
                       const char *name, char *out, size_t outcap, char *msg,
                       size_t cap) {
  fp4idx_strview_t s;
  int rc = fp4idx__get_str(v, path, name, &s, msg, cap);
  if (rc != 0) return rc;
  size_t n = s.len < outcap - 1 ? s.len : outcap - 1;
  if (n > 0) memcpy(out, s.ptr, n);
  out[n] = '\0';
  return 0;
}
