/* codec_response.c -- responses: the encoders (daemon side) and the strict
 * decoder (client side); the op's own fields are the generated codec's
 * (codec_gen.c, from protocol/optable.py), found through the op table (ops.c). Response decoding ignores unknown keys so
 * that a newer daemon may add fields; everything the client reads is
 * checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"

/* ---- decoding ----------------------------------------------------------------- */

int fp4idx_decode_response(const void *body, size_t len, fp4idx_op_t op,
                           fp4idx_response_t *resp, char *msg, size_t cap) {
  fp4idx__mp_doc_t doc;
  int rc;

  if (msg != NULL && cap > 0) msg[0] = '\0';
  if (resp == NULL) return FP4IDX_EINVAL;
  memset(resp, 0, sizeof(*resp));
  resp->op = op;
  if ((body == NULL && len > 0) || (int)op <= FP4IDX_OP_NONE ||
      op >= FP4IDX_OP__COUNT)
    return fp4idx__fail(msg, cap, FP4IDX_EINVAL, "bad arguments");

  fp4idx__mp_doc_init(&doc);
  if ((rc = fp4idx__mp_parse(body, len, &doc, msg, cap)) != 0) goto out;
  const msgpack_object *root = doc.root;
  const fp4idx__op_desc_t *od = fp4idx__op_desc(op);
  fp4idx__field_t f[FP4IDX_OP_MAX_FIELDS];
  fp4idx__fields_t fs;
  int64_t status;
  if ((rc = fp4idx__map_named(root, od->resp_fields, false, f, &fs, msg,
                              cap)) ||
      (rc = fp4idx__get_uint(fp4idx__fv(&fs, "id"), "", "id", &resp->id, msg,
                             cap)) ||
      (rc = fp4idx__get_int(fp4idx__fv(&fs, "status"), "", "status", &status,
                            msg, cap)))
    goto out;
  if (status > 0 || status < INT32_MIN) {
    rc = fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                      "status: %lld, expected 0 or a negative code",
                      (long long)status);
    goto out;
  }
  resp->status = (int)status;
  if (status < 0) {
    /* an error reply: only the message matters */
    const msgpack_object *ev = fp4idx__fv(&fs, "error");
    if (ev != NULL)
      rc = fp4idx__get_strcpy(ev, "", "error", resp->error,
                              sizeof(resp->error), msg, cap);
    else
      snprintf(resp->error, sizeof(resp->error), "%s",
               fp4idx_strerror(resp->status));
    goto out;
  }
  rc = od->resp_decode(&fs, resp, msg, cap);
out:
  fp4idx__mp_doc_destroy(&doc);
  return rc;
}

void fp4idx_response_clear(fp4idx_response_t *resp) {
  if (resp == NULL) return;
  free(resp->owned_);
  memset(resp, 0, sizeof(*resp));
}

/* ---- encoding ----------------------------------------------------------------- */

int fp4idx_encode_response(msgpack_sbuffer *sb,
                           const fp4idx_response_t *resp) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (sb == NULL || resp == NULL || resp->status != 0) return FP4IDX_EINVAL;
  const fp4idx__op_desc_t *od = fp4idx__op_desc(resp->op);
  if (od == NULL) return FP4IDX_EINVAL;
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  if ((rc = fp4idx__frame_end(sb, start, od->resp_pack(&pk, resp))) != 0)
    return rc;

  /* what we send must decode: run the client's decoder over it, unless the
   * response is all scalars, which decode as packed (fp4idx__resp_scalar):
   * the decode would cost more than the packing (info: ~25k instructions of
   * ~43k on the loop) */
  if (fp4idx__resp_scalar(resp->op)) return 0;
  fp4idx_response_t chk;
  rc = fp4idx_decode_response(sb->data + start + 4, sb->size - start - 4,
                              resp->op, &chk, NULL, 0);
  fp4idx_response_clear(&chk);
  if (rc != 0) {
    sb->size = start;
    return rc == FP4IDX_ENOMEM || rc == FP4IDX_E2BIG ? rc : FP4IDX_EINVAL;
  }
  return 0;
}

/* The score-result tensors' bodies are the response's payloads. */
static int split_is_result(const void *ctx, const char *buf, size_t len) {
  const fp4idx_score_resp_t *sc = ctx;
  for (size_t i = 0; i < sc->nresults; i++) {
    const fp4idx_score_result_t *x = &sc->results[i];
    const fp4idx_tensor_t *t[3] = {&x->logits, &x->positions, &x->counts};
    for (int k = 0; k < (x->topk ? 3 : 1); k++)
      if (t[k]->data == (const void *)buf && t[k]->nbytes == len) return 1;
  }
  return 0;
}

int fp4idx_encode_response_split(msgpack_sbuffer *sb,
                                 const fp4idx_response_t *resp,
                                 size_t min_split, fp4idx_payload_t *out,
                                 size_t cap, size_t *n) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (n != NULL) *n = 0;
  if (sb == NULL || resp == NULL || n == NULL || (cap > 0 && out == NULL) ||
      resp->status != 0)
    return FP4IDX_EINVAL;
  if (resp->op != FP4IDX_OP_SCORE) return fp4idx_encode_response(sb, resp);
  const fp4idx__op_desc_t *od = fp4idx__op_desc(resp->op);
  if (od == NULL) return FP4IDX_EINVAL;
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  fp4idx__split_t sp = {.sb = sb, .is_payload = split_is_result, .ctx = &resp->u.score,
                        .min = min_split ? min_split : 1, .out = out, .cap = cap};
  msgpack_packer_init(&pk, &sp, fp4idx__split_write);
  return fp4idx__split_end(&sp, start, od->resp_pack(&pk, resp), n);
}

int fp4idx_encode_error(msgpack_sbuffer *sb, uint64_t id, int status,
                        const char *message) {
  msgpack_packer pk;
  size_t start;
  int rc;

  if (sb == NULL || status >= 0) return FP4IDX_EINVAL;
  if (message == NULL) message = fp4idx_strerror(status);
  if ((rc = fp4idx__frame_begin(sb, &start)) != 0) return rc;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  rc = msgpack_pack_map(&pk, 3);
  rc |= fp4idx__pack_kv_uint(&pk, "id", id);
  rc |= fp4idx__pack_cstr(&pk, "status") | msgpack_pack_int(&pk, status);
  /* messages may quote client bytes (an unknown op name) and get cut at the
   * cap: send printable ASCII only, so the str is always valid UTF-8 (Python
   * clients decode str as UTF-8 and would fail on a cut sequence) */
  char clean[FP4IDX_PROTO_ERROR_CAP];
  size_t n = fp4idx__bounded_len(message, FP4IDX_PROTO_ERROR_CAP - 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)message[i];
    clean[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  rc |= fp4idx__pack_cstr(&pk, "error");
  rc |= fp4idx__pack_strn(&pk, clean, n);
  return fp4idx__frame_end(sb, start, rc != 0 ? FP4IDX_ENOMEM : 0);
}
