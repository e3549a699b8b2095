/* scan.c -- an allocation-free walk over raw msgpack bytes, run before
 * msgpack-c unpacks a message.
 *
 * msgpack-c allocates an array/map's element table from the announced count
 * before it reads the elements, so a 6-byte "array32 of 4 billion" would ask
 * for ~96 GiB. This walk enforces, without allocating: every container count
 * fits in the bytes left (each element takes at least one byte), nesting of
 * at most FP4IDX_PROTO_MAX_DEPTH containers, at most FP4IDX_PROTO_MAX_OBJECTS
 * objects, one object spanning the whole body (no trailing bytes), and no
 * reserved byte 0xc1. After it, msgpack-c's zone holds at most ~48 bytes per
 * object.
 */
#include "codec_internal.h"

int fp4idx__mp_scan(const unsigned char *p, size_t len, char *msg,
                    size_t cap) {
  uint64_t remain[FP4IDX_PROTO_MAX_DEPTH + 1];
  unsigned depth = 0;
  size_t off = 0;
  uint64_t objects = 0;

  remain[0] = 1; /* the root object */
  for (;;) {
    if (remain[depth] == 0) {
      if (depth == 0) break;
      depth--;
      continue;
    }
    remain[depth]--;
    if (off >= len)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "msgpack: truncated at byte %zu", off);
    if (++objects > FP4IDX_PROTO_MAX_OBJECTS)
      return fp4idx__fail(msg, cap, FP4IDX_E2BIG,
                          "msgpack: more than %u objects in one message",
                          FP4IDX_PROTO_MAX_OBJECTS);
    unsigned b = p[off++];
    uint64_t skip = 0;    /* payload bytes after the header */
    uint64_t items = 0;   /* child objects, for containers */
    bool container = false;
    unsigned lenbytes = 0; /* width of a length field that follows */

    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
      /* fixint, nil, bool: no payload */
    } else if (b >= 0x80 && b <= 0x8f) {
      container = true;
      items = 2u * (b & 0x0f);
    } else if (b >= 0x90 && b <= 0x9f) {
      container = true;
      items = b & 0x0f;
    } else if (b >= 0xa0 && b <= 0xbf) {
      skip = b & 0x1f;
    } else {
      switch (b) {
        case 0xc4: case 0xd9: lenbytes = 1; break;           /* bin8 str8 */
        case 0xc5: case 0xda: lenbytes = 2; break;           /* bin16 str16 */
        case 0xc6: case 0xdb: lenbytes = 4; break;           /* bin32 str32 */
        case 0xc7: lenbytes = 1; skip = 1; break;            /* ext8 + type */
        case 0xc8: lenbytes = 2; skip = 1; break;
        case 0xc9: lenbytes = 4; skip = 1; break;
        case 0xca: skip = 4; break;                          /* float32 */
        case 0xcb: skip = 8; break;                          /* float64 */
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: skip = 4; break;
        case 0xcf: case 0xd3: skip = 8; break;
        case 0xd4: skip = 2; break;                          /* fixext1..16 */
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        case 0xdc: case 0xdd: /* array16/32 */
        case 0xde: case 0xdf: /* map16/32 */
          container = true;
          lenbytes = (b == 0xdc || b == 0xde) ? 2 : 4;
          break;
        default: /* 0xc1 is reserved, never used */
          return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                              "msgpack: invalid type byte 0x%02x at byte %zu",
                              b, off - 1);
      }
    }
    if (lenbytes) {
      if (len - off < lenbytes)
        return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                            "msgpack: truncated at byte %zu", off);
      uint64_t n = fp4idx__mp_be(p + off, lenbytes);
      off += lenbytes;
      if (container)
        items = (b == 0xde || b == 0xdf) ? 2 * n : n;
      else
        skip += n;
    }
    if (skip > len - off)
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "msgpack: truncated at byte %zu (need %llu more)",
                          off, (unsigned long long)skip);
    off += (size_t)skip;
    if (container && items > 0) {
      if (items > len - off)
        return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                            "msgpack: container at byte %zu announces %llu "
                            "objects but only %zu bytes follow",
                            off, (unsigned long long)items, len - off);
      if (depth + 1 > FP4IDX_PROTO_MAX_DEPTH)
        return fp4idx__fail(msg, cap, FP4IDX_E2BIG,
                            "msgpack: nesting deeper than %u",
                            FP4IDX_PROTO_MAX_DEPTH);
      remain[++depth] = items;
    }
  }
  if (off != len)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "msgpack: %zu trailing bytes after the message",
                        len - off);
  return 0;
}

int fp4idx__mp_parse(const void *body, size_t len, fp4idx__mp_doc_t *doc, char *msg,
                     size_t cap) {
  size_t off = 0;
  int rc;

  if (len == 0)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "empty frame body");
  /* a small sound message in one walk (unpack.c makes the scan's checks);
   * anything else is scanned first, so that msgpack-c only sees bytes that
   * passed */
  if (fp4idx__mp_unpack_small(body, len, doc) != 0) {
    if ((rc = fp4idx__mp_scan(body, len, msg, cap)) != 0) return rc;
    switch (msgpack_unpack_next(&doc->up, body, len, &off)) {
      case MSGPACK_UNPACK_SUCCESS:
        break;
      case MSGPACK_UNPACK_NOMEM_ERROR:
        return fp4idx__fail(msg, cap, FP4IDX_ENOMEM, "msgpack: out of memory");
      default: /* the scan accepted it, so this should not happen */
        return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "msgpack: parse error");
    }
    if (off != len) /* belt and braces: the scan already checked */
      return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                          "msgpack: trailing bytes after the message");
    doc->root = &doc->up.data;
  }
  if (doc->root->type != MSGPACK_OBJECT_MAP)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "message is not a msgpack map");
  return 0;
}
