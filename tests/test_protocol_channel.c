/* test_protocol_channel.c -- a channel's control block, ring arithmetic and
 * descriptor checks (protocol/fp4idx_channel.h), without a GPU. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_channel.h"

static char msg[256];

Test(channel_block, init_then_check) {
  size_t n = fp4idx_channel_block_bytes(8);
  cr_assert_eq(n, 64u + 8u * 128u);
  void *b = malloc(n + 64);
  memset(b, 0xAB, n + 64);
  cr_assert_eq(fp4idx_channel_block_init(b, n + 64, 8), 0);
  cr_assert_eq(fp4idx_channel_block_check(b, n + 64, 8, msg, sizeof msg), 0, "%s", msg);
  fp4idx_channel_slot_t *s = fp4idx_channel_slot(b, 7);
  cr_assert_eq((uint8_t *)s - (uint8_t *)b, 64 + 7 * 128);
  cr_assert_eq(s->doorbell, 0u);
  cr_assert_eq(s->completion, 0u);
  cr_assert_eq(s->desc.ticket, 0u);
  free(b);
}

Test(channel_block, init_refuses_bad_arguments) {
  uint8_t b[4096];
  cr_assert_eq(fp4idx_channel_block_init(NULL, sizeof b, 1), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_channel_block_init(b, sizeof b, 0), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_channel_block_init(b, sizeof b, FP4IDX_CHANNEL_MAX_SLOTS + 1),
               FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_channel_block_init(b, 64 + 128 * 2 - 1, 2), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx_channel_block_bytes(0), 0u);
  cr_assert_eq(fp4idx_channel_block_bytes(FP4IDX_CHANNEL_MAX_SLOTS + 1), 0u);
}

Test(channel_block, check_names_what_is_wrong) {
  size_t n = fp4idx_channel_block_bytes(4);
  uint8_t *b = calloc(1, n);
  fp4idx_channel_header_t *h = (fp4idx_channel_header_t *)b;
  cr_assert_eq(fp4idx_channel_block_init(b, n, 4), 0);
  cr_assert_eq(fp4idx_channel_block_check(b, 10, 4, msg, sizeof msg), FP4IDX_EREGION);
  cr_assert_eq(fp4idx_channel_block_check(b, n, 5, msg, sizeof msg), FP4IDX_EREGION);
  cr_assert(strstr(msg, "4 slots"), "%s", msg);
  cr_assert_eq(fp4idx_channel_block_check(b, n + 128, 4, msg, sizeof msg), FP4IDX_EREGION);
  h->magic ^= 1;
  cr_assert_eq(fp4idx_channel_block_check(b, n, 4, msg, sizeof msg), FP4IDX_EREGION);
  cr_assert(strstr(msg, "magic"), "%s", msg);
  h->magic ^= 1;
  h->version = 2;
  cr_assert_eq(fp4idx_channel_block_check(b, n, 4, msg, sizeof msg), FP4IDX_EREGION);
  cr_assert(strstr(msg, "version"), "%s", msg);
  h->version = FP4IDX_CHANNEL_VERSION;
  h->slot_bytes = 64;
  cr_assert_eq(fp4idx_channel_block_check(b, n, 4, msg, sizeof msg), FP4IDX_EREGION);
  h->slot_bytes = FP4IDX_CHANNEL_SLOT_BYTES;
  h->size = n - 1; /* says less than it needs */
  cr_assert_eq(fp4idx_channel_block_check(b, n - 1, 4, msg, sizeof msg), FP4IDX_EREGION);
  h->size = n;
  cr_assert_eq(fp4idx_channel_block_check(b, n, 4, msg, sizeof msg), 0);
  free(b);
}

Test(channel_ring, tickets_go_round_and_skip_zero) {
  cr_assert_eq(fp4idx_channel_ticket_next(1), 2u);
  cr_assert_eq(fp4idx_channel_ticket_next(UINT32_MAX), 1u);
  cr_assert_eq(fp4idx_channel_slot_of(1, 4), 0u);
  cr_assert_eq(fp4idx_channel_slot_of(4, 4), 3u);
  cr_assert_eq(fp4idx_channel_slot_of(5, 4), 0u);
  cr_assert_eq(fp4idx_channel_slot_of(0, 4), 0u);
  cr_assert_eq(fp4idx_channel_slot_of(7, 0), 0u);
  /* every slot is used once per nslots consecutive tickets, across the wrap */
  uint32_t t = UINT32_MAX - 5, seen[3] = {0};
  for (int i = 0; i < 9; i++, t = fp4idx_channel_ticket_next(t)) {
    cr_assert_neq(t, 0u);
    uint32_t s = fp4idx_channel_slot_of(t, 3);
    cr_assert(s < 3);
    seen[s]++;
  }
  cr_assert(seen[0] >= 2 && seen[1] >= 2 && seen[2] >= 2);
}

Test(channel_ring, completion_words) {
  uint32_t ok = fp4idx_channel_completion(0x12345, 0);
  cr_assert(ok & FP4IDX_CHANNEL_DONE);
  cr_assert_eq((ok >> 16) & FP4IDX_CHANNEL_TICKET_MASK, 0x2345u);
  cr_assert_eq(fp4idx_channel_completion_status(ok), 0);
  uint32_t bad = fp4idx_channel_completion(3, FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_channel_completion_status(bad), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_channel_completion_status(fp4idx_channel_completion(3, FP4IDX_ECONN)),
               FP4IDX_ECONN);
  cr_assert_eq(fp4idx_channel_completion_status(0), FP4IDX_EINVAL);
}

/* A bind of one 1 MiB region for everything, lens included. */
static fp4idx_channel_bind_t bind_one(void) {
  return (fp4idx_channel_bind_t){.q_region = 1, .w_region = 1, .lens_region = 1,
                                 .out_region = 1, .q_size = 1 << 20, .w_size = 1 << 20,
                                 .lens_size = 1 << 20, .out_size = 1 << 20};
}

/* A top-k call of 4 rows, 8 heads, k 16, laid out without overlap. */
static fp4idx_channel_desc_t desc_topk(void) {
  return (fp4idx_channel_desc_t){.ticket = 9, .flags = FP4IDX_CHANNEL_F_LENS, .seq = 77,
                                 .rows = 4, .heads = 8, .topk = 16, .q_offset = 0,
                                 .w_offset = 8192, .lens_offset = 8448,
                                 .positions_offset = 9000, .logits_offset = 9256,
                                 .counts_offset = 9512};
}

Test(channel_desc, a_good_topk_call_becomes_a_score_entry) {
  fp4idx_channel_bind_t b = bind_one();
  fp4idx_channel_desc_t d = desc_topk();
  fp4idx_channel_call_t c;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), 0, "%s", msg);
  cr_assert_eq(c.heads, 8u);
  cr_assert_eq(c.topk, 16u);
  cr_assert_eq(c.entry.seq, 77u);
  cr_assert_eq(c.entry.rows, 4u);
  cr_assert_eq(c.entry.q.nbytes, 4u * 8 * 128 * 2);
  cr_assert_eq(c.entry.q.region, 1u);
  cr_assert_eq(c.entry.w.offset, 8192u);
  cr_assert_eq(c.entry.lens.dtype, FP4IDX_WIRE_I32);
  cr_assert_eq(c.entry.out_positions.shape[1], 16u);
  cr_assert_eq(c.entry.out_counts.nbytes, 16u);
  cr_assert_eq(c.entry.mask.dtype, FP4IDX_WIRE_NONE);
}

Test(channel_desc, full_logits_and_no_lens) {
  fp4idx_channel_bind_t b = bind_one();
  b.lens_region = 0;
  fp4idx_channel_desc_t d = {.ticket = 1, .seq = 3, .rows = 2, .heads = 1, .width = 100,
                             .q_offset = 0, .w_offset = 512, .logits_offset = 1024};
  fp4idx_channel_call_t c;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 1, &b, &c, msg, sizeof msg), 0, "%s", msg);
  cr_assert_eq(c.topk, 0u);
  cr_assert_eq(c.entry.out_logits.nbytes, 2u * 100 * 4);
  cr_assert_eq(c.entry.lens.dtype, FP4IDX_WIRE_NONE);
  d.flags = FP4IDX_CHANNEL_F_LENS; /* lens without a lens region */
  cr_assert_eq(fp4idx_channel_desc_check(&d, 1, &b, &c, msg, sizeof msg), FP4IDX_ENOREGION);
}

/* Each bad descriptor: one field changed from desc_topk. */
Test(channel_desc, each_bad_field_has_its_status) {
  fp4idx_channel_bind_t b = bind_one();
  fp4idx_channel_call_t c;
  fp4idx_channel_desc_t d = desc_topk();
  cr_assert_eq(fp4idx_channel_desc_check(&d, 10, &b, &c, msg, sizeof msg), FP4IDX_EPROTO);
  cr_assert(strstr(msg, "ticket"), "%s", msg);
  d = desc_topk(), d.flags = 6;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_EPROTO);
  d = desc_topk(), d.rows = 0;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_ESHAPE);
  d = desc_topk(), d.rows = FP4IDX_CHANNEL_MAX_ROWS + 1;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_ESHAPE);
  d = desc_topk(), d.heads = 0;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_ESHAPE);
  d = desc_topk(), d.heads = 129;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_ESHAPE);
  d = desc_topk(), d.topk = FP4IDX_PROTO_MAX_TOPK + 1;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_E2BIG);
  d = desc_topk(), d.width = 5;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_ESHAPE);
  d = desc_topk(), d.q_offset = 1; /* misaligned bf16 */
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_EREGION);
  d = desc_topk(), d.lens_offset = 8450; /* misaligned i32 */
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_EREGION);
  d = desc_topk(), d.counts_offset = (1 << 20) - 8; /* 16 bytes, 8 inside */
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_EREGION);
  cr_assert(strstr(msg, "outside"), "%s", msg);
  d = desc_topk(), d.w_offset = UINT64_MAX - 1; /* offset + bytes overflows */
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_EREGION);
  d = desc_topk(), d.logits_offset = d.positions_offset + 4; /* outputs overlap */
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_EREGION);
  cr_assert(strstr(msg, "overlaps"), "%s", msg);
  d = desc_topk(), d.counts_offset = 100; /* an output over q */
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg), FP4IDX_EREGION);
  /* the same offsets in different regions do not overlap */
  fp4idx_channel_bind_t b2 = bind_one();
  b2.out_region = 2;
  d = desc_topk(), d.counts_offset = 100;
  cr_assert_eq(fp4idx_channel_desc_check(&d, 9, &b2, &c, msg, sizeof msg), 0, "%s", msg);
  cr_assert_eq(fp4idx_channel_desc_check(NULL, 9, &b, &c, msg, sizeof msg), FP4IDX_EINVAL);
}

Test(channel_desc, huge_rows_times_topk_is_refused_not_wrapped) {
  fp4idx_channel_bind_t b = bind_one();
  b.out_size = UINT64_MAX;
  fp4idx_channel_desc_t d = desc_topk();
  d.rows = FP4IDX_CHANNEL_MAX_ROWS;
  d.topk = FP4IDX_PROTO_MAX_TOPK;
  d.positions_offset = UINT64_MAX - 64;
  fp4idx_channel_call_t c;
  int rc = fp4idx_channel_desc_check(&d, 9, &b, &c, msg, sizeof msg);
  cr_assert(rc == FP4IDX_EREGION, "%d %s", rc, msg);
}
