/* unpack.c -- a small message unpacked into the caller's fixed pool of
 * msgpack objects instead of a msgpack-c zone (see codec_internal.h,
 * fp4idx__mp_doc_t), in one walk that also makes the checks of
 * fp4idx__mp_scan (depth, bytes present, no reserved byte, nothing after
 * the object): what it takes, the scan would have passed.
 *
 * Most frames are small (a score request is ~40 objects, an info reply ~15)
 * and msgpack-c's unpacker spent more on them than the rest of their decode:
 * an 8 KiB zone allocated and freed per message, and its generic state
 * machine (~3.6k instructions per request on the daemon's loop, ~2k per
 * reply on the client). This builds the same objects msgpack-c builds (the
 * same types and values; str and bin pointing into the body), so
 * everything downstream reads them unchanged. A message it does not take
 * -- more objects than the pool, an ext value, anything malformed -- is
 * scanned and, if sound, goes to msgpack-c.
 */
#include <string.h>

#include "codec_internal.h"

_Static_assert(sizeof(msgpack_object_kv) == 2 * sizeof(msgpack_object),
               "a map's entries are built as pairs of objects in the pool");

typedef struct fp4idx__mp_build_s {
  const unsigned char *p, *end;
  fp4idx__mp_doc_t *doc;
  size_t nobj; /* taken from doc->obj */
} fp4idx__mp_build_t;

static inline void fp4idx__mp_int(msgpack_object *o, int64_t v) {
  /* as msgpack-c: a signed encoding of a value >= 0 is a positive integer */
  if (v >= 0) {
    o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
    o->via.u64 = (uint64_t)v;
  } else {
    o->type = MSGPACK_OBJECT_NEGATIVE_INTEGER;
    o->via.i64 = v;
  }
}

/* One object at the cursor into *o (its children into the pool). 0, or -1:
 * not taken here (the pool is short, an ext, or bytes the scan refuses:
 * truncated, the reserved 0xc1, nested deeper than the protocol allows --
 * fp4idx__mp_parse then scans, which says what is wrong). */
static int fp4idx__mp_build(fp4idx__mp_build_t *b, msgpack_object *o, unsigned depth) {
  if (b->p >= b->end || depth > FP4IDX_PROTO_MAX_DEPTH) return -1;
  const unsigned c = *b->p++;
  const size_t left = (size_t)(b->end - b->p);
  uint64_t n;     /* a str/bin length or a container count */
  unsigned w = 0; /* bytes of the length or count that follow */
  int kind;       /* 1 str, 2 bin, 3 array, 4 map */
  if (c <= 0x7f) {
    o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
    o->via.u64 = c;
    return 0;
  }
  if (c >= 0xe0) {
    fp4idx__mp_int(o, (int8_t)c);
    return 0;
  }
  if (c >= 0xa0 && c <= 0xbf) { /* fixstr: the usual key */
    n = c & 0x1f;
    if (n > left) return -1;
    o->type = MSGPACK_OBJECT_STR;
    o->via.str.size = (uint32_t)n;
    o->via.str.ptr = (const char *)b->p;
    b->p += n;
    return 0;
  }
  if (c <= 0x8f) {
    kind = 4, n = c & 0x0f;
  } else if (c <= 0x9f) {
    kind = 3, n = c & 0x0f;
  } else {
    switch (c) {
      case 0xc0: o->type = MSGPACK_OBJECT_NIL; return 0;
      case 0xc2: case 0xc3:
        o->type = MSGPACK_OBJECT_BOOLEAN;
        o->via.boolean = c == 0xc3;
        return 0;
      case 0xc4: case 0xc5: case 0xc6: kind = 2, w = 1u << (c - 0xc4); break;
      case 0xd9: case 0xda: case 0xdb: kind = 1, w = 1u << (c - 0xd9); break;
      case 0xdc: case 0xdd: kind = 3, w = c == 0xdc ? 2 : 4; break;
      case 0xde: case 0xdf: kind = 4, w = c == 0xde ? 2 : 4; break;
      case 0xca:
        if (left < 4) return -1;
        {
          uint32_t u = (uint32_t)fp4idx__mp_be(b->p, 4);
          float f;
          memcpy(&f, &u, 4);
          o->type = MSGPACK_OBJECT_FLOAT32;
          o->via.f64 = f;
        }
        b->p += 4;
        return 0;
      case 0xcb:
        if (left < 8) return -1;
        {
          uint64_t u = fp4idx__mp_be(b->p, 8);
          memcpy(&o->via.f64, &u, 8);
          o->type = MSGPACK_OBJECT_FLOAT64;
        }
        b->p += 8;
        return 0;
      case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        const unsigned k = 1u << (c - 0xcc);
        if (left < k) return -1;
        o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
        o->via.u64 = fp4idx__mp_be(b->p, k);
        b->p += k;
        return 0;
      }
      case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        const unsigned k = 1u << (c - 0xd0);
        if (left < k) return -1;
        uint64_t u = fp4idx__mp_be(b->p, k);
        b->p += k;
        fp4idx__mp_int(o, k == 1   ? (int8_t)u
                          : k == 2 ? (int16_t)u
                          : k == 4 ? (int32_t)u
                                   : (int64_t)u);
        return 0;
      }
      default: /* ext (0xc7-0xc9, 0xd4-0xd8) and the reserved 0xc1 */
        return -1;
    }
  }
  if (w) {
    if (left < w) return -1;
    n = fp4idx__mp_be(b->p, w);
    b->p += w;
  }
  if (kind <= 2) {
    if (n > (size_t)(b->end - b->p)) return -1;
    o->type = kind == 1 ? MSGPACK_OBJECT_STR : MSGPACK_OBJECT_BIN;
    /* str and bin share their layout in msgpack_object's union; an empty
     * one points where its bytes would be, never NULL (msgpack-c leaves
     * NULL or a stale position there), so a memcpy of 0 bytes from it is
     * defined */
    o->via.str.size = (uint32_t)n;
    o->via.str.ptr = (const char *)b->p;
    b->p += n;
    return 0;
  }
  /* a container's children from the pool: an array's items, or a map's
   * keys and values in turn (a msgpack_object_kv is two objects) */
  const uint64_t items = kind == 3 ? n : 2 * n;
  if (items > FP4IDX__MP_POOL - b->nobj) return -1;
  msgpack_object *child = b->doc->obj + b->nobj;
  b->nobj += (size_t)items;
  if (kind == 3) {
    o->type = MSGPACK_OBJECT_ARRAY;
    o->via.array.size = (uint32_t)n;
    o->via.array.ptr = child;
  } else {
    o->type = MSGPACK_OBJECT_MAP;
    o->via.map.size = (uint32_t)n;
    o->via.map.ptr = (msgpack_object_kv *)child;
  }
  for (uint64_t i = 0; i < items; i++)
    if (fp4idx__mp_build(b, &child[i], depth + 1)) return -1;
  return 0;
}

int fp4idx__mp_unpack_small(const void *body, size_t len, fp4idx__mp_doc_t *doc) {
  fp4idx__mp_build_t b = {.p = body, .end = (const unsigned char *)body + len, .doc = doc};
  if (fp4idx__mp_build(&b, &doc->small, 0) || b.p != b.end) return -1;
  doc->root = &doc->small;
  return 0;
}
