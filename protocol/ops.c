/* ops.c -- the op table, generated from FP4IDX_OP_MAP (fp4idx_codec.h):
 * names, flags, field tables and codec functions of every op. */
#include "codec_internal.h"

#define FP4IDX__UNPAREN(...) __VA_ARGS__
#define FP4IDX__OP_ROW(ID, nm, fl, rq, rs)                                   \
  [FP4IDX_OP_##ID] = {                                                       \
      .name = #nm,                                                           \
      .flags = (fl),                                                         \
      .req_fields = {"id", "op", FP4IDX__UNPAREN rq},                        \
      .resp_fields = {"id", "status", "error", FP4IDX__UNPAREN rs},          \
      .req_decode = fp4idx__##nm##_req_decode,                               \
      .req_pack = fp4idx__##nm##_req_pack,                                   \
      .resp_decode = fp4idx__##nm##_resp_decode,                             \
      .resp_pack = fp4idx__##nm##_resp_pack,                                 \
  },

const fp4idx__op_desc_t fp4idx__ops[FP4IDX_OP__COUNT] = {
    FP4IDX_OP_MAP(FP4IDX__OP_ROW)};

const fp4idx__op_desc_t *fp4idx__op_desc(fp4idx_op_t op) {
  if ((int)op <= FP4IDX_OP_NONE || op >= FP4IDX_OP__COUNT) return NULL;
  return &fp4idx__ops[op];
}

const char *fp4idx_op_name(fp4idx_op_t op) {
  const fp4idx__op_desc_t *o = fp4idx__op_desc(op);
  return o != NULL ? o->name : "?";
}

unsigned fp4idx_op_flags(fp4idx_op_t op) {
  const fp4idx__op_desc_t *o = fp4idx__op_desc(op);
  return o != NULL ? o->flags : 0u;
}

fp4idx_op_t fp4idx_op_from_name(const char *name, size_t len) {
  if (name == NULL) return FP4IDX_OP_NONE;
  for (int op = FP4IDX_OP_NONE + 1; op < FP4IDX_OP__COUNT; op++)
    if (strlen(fp4idx__ops[op].name) == len &&
        memcmp(fp4idx__ops[op].name, name, len) == 0)
      return (fp4idx_op_t)op;
  return FP4IDX_OP_NONE;
}

int fp4idx__map_named(const msgpack_object *map, const char *const *names,
                      bool strict, fp4idx__field_t *f, fp4idx__fields_t *fs,
                      char *msg, size_t cap) {
  size_t n = 0;
  while (n < FP4IDX_OP_MAX_FIELDS && names[n] != NULL) {
    f[n].name = names[n];
    n++;
  }
  fs->f = f;
  fs->n = n;
  return fp4idx__map_fields(map, "", f, n, strict, msg, cap);
}

const msgpack_object *fp4idx__fv(const fp4idx__fields_t *fs, const char *name) {
  for (size_t i = 0; i < fs->n; i++)
    if (strcmp(fs->f[i].name, name) == 0) return fs->f[i].val;
  return NULL;
}
