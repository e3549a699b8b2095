/* channel.c -- a channel's control block, ring arithmetic and descriptor
 * checks (fp4idx_channel.h, PROTOCOL.md "Channels"). Plain C, no CUDA: the
 * daemon and the client share it, the tests run it without a GPU. */
#include "fp4idx_channel.h"

#include <inttypes.h>
#include <string.h>

#include "fp4idx_fail.h"

_Static_assert(sizeof(fp4idx_channel_header_t) == FP4IDX_CHANNEL_HEADER_BYTES,
               "channel header layout");
_Static_assert(sizeof(fp4idx_channel_desc_t) == 80, "channel descriptor layout");
_Static_assert(sizeof(fp4idx_channel_slot_t) == FP4IDX_CHANNEL_SLOT_BYTES, "channel slot layout");
_Static_assert(offsetof(fp4idx_channel_slot_t, doorbell) == FP4IDX_CHANNEL_DOORBELL_AT,
               "doorbell offset");
_Static_assert(offsetof(fp4idx_channel_slot_t, completion) == FP4IDX_CHANNEL_COMPLETION_AT,
               "completion offset");

size_t fp4idx_channel_block_bytes(uint32_t nslots) {
  if (nslots == 0 || nslots > FP4IDX_CHANNEL_MAX_SLOTS) return 0;
  return FP4IDX_CHANNEL_HEADER_BYTES + (size_t)nslots * FP4IDX_CHANNEL_SLOT_BYTES;
}

int fp4idx_channel_block_init(void *base, size_t size, uint32_t nslots) {
  size_t need = fp4idx_channel_block_bytes(nslots);
  if (!base || need == 0 || size < need) return FP4IDX_EINVAL;
  memset(base, 0, size);
  fp4idx_channel_header_t *h = base;
  h->magic = FP4IDX_CHANNEL_MAGIC;
  h->version = FP4IDX_CHANNEL_VERSION;
  h->nslots = nslots;
  h->slot_bytes = FP4IDX_CHANNEL_SLOT_BYTES;
  h->size = size;
  return FP4IDX_OK;
}

int fp4idx_channel_block_check(const void *base, size_t size, uint32_t nslots, char *msg,
                               size_t msgcap) {
  fp4idx_channel_header_t h;
  size_t need = fp4idx_channel_block_bytes(nslots);
  if (!base || size < sizeof h)
    return fp4idx__fail(msg, msgcap, FP4IDX_EREGION, "control block: %zu bytes, need %u",
                        size, FP4IDX_CHANNEL_HEADER_BYTES);
  memcpy(&h, base, sizeof h);
  if (h.magic != FP4IDX_CHANNEL_MAGIC)
    return fp4idx__fail(msg, msgcap, FP4IDX_EREGION, "control block: bad magic 0x%08x",
                        h.magic);
  if (h.version != FP4IDX_CHANNEL_VERSION)
    return fp4idx__fail(msg, msgcap, FP4IDX_EREGION,
                        "control block: version %u, the daemon speaks %u", h.version,
                        FP4IDX_CHANNEL_VERSION);
  if (h.slot_bytes != FP4IDX_CHANNEL_SLOT_BYTES)
    return fp4idx__fail(msg, msgcap, FP4IDX_EREGION, "control block: slots of %u bytes, not %u",
                        h.slot_bytes, FP4IDX_CHANNEL_SLOT_BYTES);
  if (h.nslots != nslots || need == 0)
    return fp4idx__fail(msg, msgcap, FP4IDX_EREGION,
                        "control block: %u slots, channel_open said %u", h.nslots, nslots);
  if (h.size != size || size < need)
    return fp4idx__fail(msg, msgcap, FP4IDX_EREGION,
                        "control block: says %" PRIu64 " bytes, is %zu, needs %zu", h.size,
                        size, need);
  return FP4IDX_OK;
}

uint32_t fp4idx_channel_ticket_next(uint32_t ticket) { return ticket == UINT32_MAX ? 1u : ticket + 1u; }

uint32_t fp4idx_channel_slot_of(uint32_t ticket, uint32_t nslots) {
  if (ticket == 0 || nslots == 0) return 0;
  return (ticket - 1u) % nslots;
}

uint32_t fp4idx_channel_completion(uint32_t ticket, int status) {
  uint32_t code = status < 0 ? (uint32_t)(-(int64_t)status) & 0xffffu : 0u;
  return FP4IDX_CHANNEL_DONE | (ticket & FP4IDX_CHANNEL_TICKET_MASK) << 16 | code;
}

int fp4idx_channel_completion_status(uint32_t word) {
  if (!(word & FP4IDX_CHANNEL_DONE)) return FP4IDX_EINVAL;
  return -(int)(word & 0xffffu);
}

/* One tensor of a call: `what`, at `off` of region `region` (`rsize`
 * bytes), dims shape[0..ndim) of dtype. Checked: alignment, bounds, no
 * overflow. */
static int fp4idx__channel_ref(fp4idx_tensor_t *t, const char *what, fp4idx_wire_dtype_t dt,
                               uint32_t ndim, const uint64_t *shape, uint64_t region,
                               uint64_t rsize, uint64_t off, char *msg, size_t cap) {
  uint64_t item = fp4idx_wire_dtype_size(dt), bytes = item;
  for (uint32_t i = 0; i < ndim; i++) {
    if (shape[i] && bytes > UINT64_MAX / shape[i])
      return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: size overflows", what);
    bytes *= shape[i];
  }
  if (off % item != 0)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "%s: offset %" PRIu64 " is not a multiple of %" PRIu64, what, off, item);
  if (off > rsize || bytes > rsize - off)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "%s: bytes [%" PRIu64 ", %" PRIu64 " + %" PRIu64
                        ") are outside region %" PRIu64 " (%" PRIu64 " bytes)",
                        what, off, off, bytes, region, rsize);
  if (fp4idx_tensor_ref(t, dt, ndim, shape, region, off) != FP4IDX_OK)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "%s: size overflows", what);
  return FP4IDX_OK;
}

static int fp4idx__channel_overlap(const fp4idx_tensor_t *a, const fp4idx_tensor_t *b) {
  if (!fp4idx_tensor_present(a) || !fp4idx_tensor_present(b) || a->region != b->region)
    return 0;
  if (a->nbytes == 0 || b->nbytes == 0) return 0;
  return a->offset < b->offset + b->nbytes && b->offset < a->offset + a->nbytes;
}

/* The shapes: rows, heads, flags, topk/width consistency. */
static int fp4idx__channel_desc_shapes(const fp4idx_channel_desc_t *d, uint32_t ticket,
                                       const fp4idx_channel_bind_t *b, char *msg, size_t cap) {
  if (d->ticket != ticket)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO,
                        "descriptor ticket %u is not the doorbell's %u (written out of order)",
                        d->ticket, ticket);
  if (d->flags & ~FP4IDX_CHANNEL_F_ALL)
    return fp4idx__fail(msg, cap, FP4IDX_EPROTO, "descriptor flags 0x%x: unknown bits",
                        d->flags);
  if (d->rows < 1 || d->rows > FP4IDX_CHANNEL_MAX_ROWS)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "rows %u, expected 1..%u", d->rows,
                        FP4IDX_CHANNEL_MAX_ROWS);
  if (d->heads < 1 || d->heads > FP4IDX_PROTO_MAX_HEADS)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "heads %u, expected 1..%u", d->heads,
                        FP4IDX_PROTO_MAX_HEADS);
  if (d->topk > FP4IDX_PROTO_MAX_TOPK)
    return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "topk %u, at most %u", d->topk,
                        FP4IDX_PROTO_MAX_TOPK);
  if (d->topk && d->width)
    return fp4idx__fail(msg, cap, FP4IDX_ESHAPE, "width %u with topk %u: must be 0", d->width,
                        d->topk);
  if ((d->flags & FP4IDX_CHANNEL_F_LENS) && !b->lens_region)
    return fp4idx__fail(msg, cap, FP4IDX_ENOREGION, "lens: the channel has no lens region");
  return FP4IDX_OK;
}

int fp4idx_channel_desc_check(const fp4idx_channel_desc_t *d, uint32_t ticket,
                              const fp4idx_channel_bind_t *b, fp4idx_channel_call_t *call,
                              char *msg, size_t cap) {
  if (!d || !b || !call) return FP4IDX_EINVAL;
  memset(call, 0, sizeof *call);
  int rc = fp4idx__channel_desc_shapes(d, ticket, b, msg, cap);
  if (rc) return rc;
  fp4idx_score_seq_t *e = &call->entry;
  uint64_t R = d->rows, H = d->heads, k = d->topk;
  uint64_t qs[3] = {R, H, FP4IDX_PROTO_HEAD_DIM}, ws[2] = {R, H}, rs[1] = {R};
  e->seq = d->seq;
  e->rows = d->rows;
  rc = fp4idx__channel_ref(&e->q, "q", FP4IDX_WIRE_BF16, 3, qs, b->q_region, b->q_size,
                           d->q_offset, msg, cap);
  if (!rc)
    rc = fp4idx__channel_ref(&e->w, "w", FP4IDX_WIRE_BF16, 2, ws, b->w_region, b->w_size,
                             d->w_offset, msg, cap);
  if (!rc && (d->flags & FP4IDX_CHANNEL_F_LENS))
    rc = fp4idx__channel_ref(&e->lens, "lens", FP4IDX_WIRE_I32, 1, rs, b->lens_region,
                             b->lens_size, d->lens_offset, msg, cap);
  if (!rc && k) {
    uint64_t ks[2] = {R, k};
    rc = fp4idx__channel_ref(&e->out_positions, "out positions", FP4IDX_WIRE_I32, 2, ks,
                             b->out_region, b->out_size, d->positions_offset, msg, cap);
    if (!rc)
      rc = fp4idx__channel_ref(&e->out_logits, "out logits", FP4IDX_WIRE_F32, 2, ks,
                               b->out_region, b->out_size, d->logits_offset, msg, cap);
    if (!rc)
      rc = fp4idx__channel_ref(&e->out_counts, "out counts", FP4IDX_WIRE_I32, 1, rs,
                               b->out_region, b->out_size, d->counts_offset, msg, cap);
  } else if (!rc) {
    uint64_t ls[2] = {R, d->width};
    rc = fp4idx__channel_ref(&e->out_logits, "out logits", FP4IDX_WIRE_F32, 2, ls,
                             b->out_region, b->out_size, d->logits_offset, msg, cap);
  }
  if (rc) return rc;
  const fp4idx_tensor_t *outs[3] = {&e->out_logits, &e->out_positions, &e->out_counts};
  const fp4idx_tensor_t *all[6] = {&e->out_logits, &e->out_positions, &e->out_counts,
                                   &e->q, &e->w, &e->lens};
  for (int i = 0; i < 3; i++)
    for (int j = i + 1; j < 6; j++)
      if (fp4idx__channel_overlap(outs[i], all[j]))
        return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                            "an output overlaps another tensor of the call in region %" PRIu64,
                            outs[i]->region);
  call->heads = d->heads;
  call->topk = d->topk;
  return FP4IDX_OK;
}
