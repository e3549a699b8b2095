/* codec_kinds.c -- the checks and packers of the field kinds of the op
 * table (protocol/optable.py), which the generated codec (codec_gen.c) and
 * the hand-written `more` fields (codec_more.c) call: ranges, string
 * lengths, tensor shapes, fixed strings. Each check formats the message
 * that names the field and returns the status PROTOCOL.md gives it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"

size_t fp4idx__bounded_len(const char *s, size_t cap) {
  const char *z = memchr(s, 0, cap);
  return z ? (size_t)(z - s) : cap;
}

int fp4idx__expect_shape(const fp4idx_tensor_t *t, const char *where, const char *want,
                         bool ok, char *msg, size_t cap) {
  char desc[96];
  if (ok) return 0;
  return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "%s: got %s, expected %s", where,
                      fp4idx__tensor_desc(t, desc, sizeof(desc)), want);
}

int fp4idx__check_count(const char *name, uint64_t n, uint64_t max, const char *absent,
                        char *msg, size_t cap) {
  if (n < 1)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: 0, must be >= 1 (leave it out for %s)",
                        name, absent);
  if (n > max)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: %llu, at most %llu", name,
                        (unsigned long long)n, (unsigned long long)max);
  return 0;
}

int fp4idx__check_range_shape(const char *name, uint64_t v, uint64_t lo, uint64_t hi,
                              char *msg, size_t cap) {
  if (v < lo || v > hi)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "%s: %llu, expected %llu..%llu", name,
                        (unsigned long long)v, (unsigned long long)lo,
                        (unsigned long long)hi);
  return 0;
}

int fp4idx__check_min(const char *name, uint64_t v, uint64_t min, char *msg, size_t cap) {
  if (v < min)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: %llu, must be >= %llu", name,
                        (unsigned long long)v, (unsigned long long)min);
  return 0;
}

int fp4idx__check_strlen(const char *name, size_t len, size_t max, char *msg, size_t cap) {
  if (len > max)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: %zu bytes, at most %zu", name, len, max);
  return 0;
}

int fp4idx__pack_refused(int rc) { return rc == FP4IDX_E2BIG ? FP4IDX_E2BIG : FP4IDX_EINVAL; }

int fp4idx__packed(int rc) { return rc != 0 ? FP4IDX_ENOMEM : 0; }

/* v is a char[cap] that holds at most cap - 1 bytes and its NUL, as the
 * decoder (fp4idx__get_strcpy) gives it back: an unterminated buffer packs
 * its first cap - 1 bytes. */
int fp4idx__pack_kv_fixstr(msgpack_packer *pk, const char *k, const char *v, size_t cap) {
  return fp4idx__pack_cstr(pk, k) |
         fp4idx__pack_strn(pk, v, cap ? fp4idx__bounded_len(v, cap - 1) : 0);
}

/* Arrays (and maps) of entries in responses: codec_internal.h. */
int fp4idx__decode_entries(const msgpack_object *a, const char *name,
                          bool is_map, uint32_t max, size_t size,
                          void **owned, void **out, size_t *n,
                          char *msg, size_t cap) {
  *out = NULL;
  *n = 0;
  if (a == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: missing field", name);
  if (a->type != (is_map ? MSGPACK_OBJECT_MAP : MSGPACK_OBJECT_ARRAY))
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "%s: expected %s", name,
                        is_map ? "a map" : "an array of maps");
  uint32_t count = is_map ? a->via.map.size : a->via.array.size;
  if (max > 0 && count > max)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: %u entries, at most %u",
                        name, count, max);
  if (count == 0) return 0;
  /* the scan of the frame bounded count by the bytes it has */
  if ((*out = calloc(count, size)) == NULL)
    return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "out of memory");
  *owned = *out;
  *n = count;
  return 0;
}
