/* keygen.c -- deterministic keys for `fp4idx-cli append --random N --seed S`.
 * Key i depends only on (seed, i), so the CLI can generate a large input one
 * request chunk at a time. */
#include <math.h>
#include <string.h>

#include "cli.h"
#include "fp4idx_format.h"

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1]: 53 random bits, never 0 (log below). */
static double keygen_uniform(uint64_t *st) {
  return ((double)(splitmix64(st) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

void fp4idx__gen_keys(int dtype, uint64_t seed, uint64_t first, size_t n,
                      void *keys) {
  for (size_t k = 0; k < n; k++) {
    /* One independent stream per key. */
    uint64_t st = seed ^ ((first + k) * 0xd1b54a32d192ed03ull);
    splitmix64(&st);
    if (dtype == FP4IDX_KEYS_FP4) {
      uint8_t *slot = (uint8_t *)keys + k * FP4IDX_CLIENT_SLOT_BYTES;
      for (int i = 0; i < FP4IDX_PAYLOAD_BYTES; i += 8) {
        uint64_t r = splitmix64(&st);
        memcpy(slot + i, &r, 8);
      }
      for (int j = 0; j < FP4IDX_SCALE_BYTES; j++)
        slot[FP4IDX_PAYLOAD_BYTES + j] = (uint8_t)(120 + splitmix64(&st) % 15);
      continue;
    }
    for (int i = 0; i < FP4IDX_CLIENT_HEAD_DIM; i += 2) {
      /* Box-Muller: two normal values per pair of uniforms. */
      double r = sqrt(-2.0 * log(keygen_uniform(&st)));
      double t = 6.283185307179586 * keygen_uniform(&st);
      float a = (float)(r * cos(t)), b = (float)(r * sin(t));
      if (dtype == FP4IDX_KEYS_F32) {
        float *o = (float *)keys + k * FP4IDX_CLIENT_HEAD_DIM + i;
        o[0] = a;
        o[1] = b;
      } else {
        uint16_t *o = (uint16_t *)keys + k * FP4IDX_CLIENT_HEAD_DIM + i;
        o[0] = fp4idx_f32_to_bf16(a); /* the project's one RNE rule */
        o[1] = fp4idx_f32_to_bf16(b);
      }
    }
  }
}
