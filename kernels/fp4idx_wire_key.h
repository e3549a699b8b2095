/* fp4idx_wire_key.h -- the one mapping between the wire's names
 * (protocol/fp4idx_codec.h: tensor dtypes, "rounding") and the key
 * format's (fp4idx_format.h: key encodings, rounding modes), and the checks
 * that the protocol's sizes are the key format's. It sits with the format,
 * above the protocol (which knows no key format), for the daemon and the
 * client library. Not installed. */
#ifndef FP4IDX_WIRE_KEY_H
#define FP4IDX_WIRE_KEY_H

#include "fp4idx_codec.h"
#include "fp4idx_format.h"

_Static_assert(FP4IDX_PROTO_SLOT_BYTES == FP4IDX_SLOT_BYTES,
               "u8 keys on the wire are packed slots (fp4idx_format.h)");
_Static_assert(FP4IDX_PROTO_SCALE_BYTES == FP4IDX_SCALE_BYTES,
               "a packed slot ends in the key format's scale bytes");
_Static_assert(FP4IDX_PROTO_HEAD_DIM == FP4IDX_HEAD_DIM,
               "a key on the wire has the key format's head dim");
_Static_assert(FP4IDX_WIRE_ROUND_RNE == (int)FP4IDX_ROUND_RNE &&
                   FP4IDX_WIRE_ROUND_THRESHOLD == (int)FP4IDX_ROUND_THRESHOLD,
               "wire rounding numbers are fp4idx_rounding_t's");

/* The key encoding of an "append" keys tensor (PROTOCOL.md "append"): bf16
 * and f32 keys are quantized, u8 [n,68] are already-packed slots. */
static inline fp4idx_dtype_t fp4idx_wire_key_dtype(fp4idx_wire_dtype_t dt) {
  return dt == FP4IDX_WIRE_BF16  ? FP4IDX_DTYPE_BF16
         : dt == FP4IDX_WIRE_F32 ? FP4IDX_DTYPE_F32
                                 : FP4IDX_DTYPE_FP4;
}

/* The quantizer's rounding mode of an "append" "rounding" value. */
static inline fp4idx_rounding_t fp4idx_wire_rounding(int wire) {
  return wire == FP4IDX_WIRE_ROUND_THRESHOLD ? FP4IDX_ROUND_THRESHOLD
                                             : FP4IDX_ROUND_RNE;
}

#endif /* FP4IDX_WIRE_KEY_H */
