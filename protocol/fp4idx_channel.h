/* fp4idx_channel.h -- the shared control block of a channel (PROTOCOL.md
 * "Channels"): stream-ordered score calls with no host round trip.
 *
 * A channel is set up once over the socket (`channel_open`, with the block's
 * memfd passed as SCM_RIGHTS) and then driven by the client's CUDA stream
 * alone: the stream writes a slot's descriptor and rings its doorbell
 * (cuStreamWriteValue32/64), then waits on the slot's completion word
 * (cuStreamWaitValue32); the daemon watches the doorbells, runs the score
 * the descriptor names on the regions given at `channel_open`, and writes
 * the completion word (with a status) after the outputs.
 *
 * The block is a sealed memfd both processes map (the client registers its
 * mapping with cuMemHostRegister so its stream can write and wait on it, the
 * daemon pins its own with cudaHostRegister on a GPU). Its layout, all
 * little-endian and naturally aligned:
 *
 *   [0, 64)                          header (fp4idx_channel_header_t)
 *   [64 + i * 128, 64 + (i+1) * 128) slot i, i < nslots (fp4idx_channel_slot_t)
 *
 * The replay rule. A captured CUDA graph writes the same values each time it
 * is replayed, so nothing here depends on fresh values from the host:
 *   - what changes per step (the lengths a row sees, q and w) lives in the
 *     client's regions, which its own kernels update before the call;
 *   - each call first resets its completion word to 0 on the stream, then
 *     writes the descriptor, then rings the doorbell with the call's ticket
 *     (nonzero; the descriptor carries the same ticket);
 *   - the daemon consumes a doorbell: it reads the ticket, takes a copy of
 *     the descriptor, writes the doorbell back to 0 and records the ticket
 *     in `served`; so the same ticket rung again by a replay is a new call,
 *     and a ticket is never served twice for one ring. A descriptor whose
 *     ticket is not the doorbell's (written out of order) completes with
 *     EPROTO.
 * cuStreamWriteValue orders each write after the stream's earlier writes (a
 * fence scoped to the stream), so the daemon that sees the ticket sees the
 * descriptor and the reset completion word.
 *
 * This header holds only plain C (no CUDA): the layout, the ring arithmetic
 * and the checks both sides share, unit-tested without a GPU.
 */
#ifndef FP4IDX_CHANNEL_H
#define FP4IDX_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_codec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP4IDX_CHANNEL_MAGIC 0x48433446u /* "F4CH" little-endian */
#define FP4IDX_CHANNEL_VERSION 1u
#define FP4IDX_CHANNEL_HEADER_BYTES 64u
#define FP4IDX_CHANNEL_SLOT_BYTES 128u
#define FP4IDX_CHANNEL_MAX_SLOTS FP4IDX_PROTO_MAX_CHANNEL_SLOTS /* slots of one channel */
#define FP4IDX_CHANNEL_MAX_ROWS 65536u   /* rows of one call */

/* Descriptor flags. */
#define FP4IDX_CHANNEL_F_LENS 1u /* lens i32 [rows] at lens_offset of the lens region */
#define FP4IDX_CHANNEL_F_ALL 1u  /* every known flag */

/* The completion word: 0 while the call is pending (the client resets it on
 * its stream before ringing); the daemon (or the client library, when the
 * connection is gone) writes DONE | (ticket & 0x7fff) << 16 | -status.
 * The stream waits with CU_STREAM_WAIT_VALUE_AND on FP4IDX_CHANNEL_DONE. */
#define FP4IDX_CHANNEL_DONE 0x80000000u
#define FP4IDX_CHANNEL_TICKET_MASK 0x7fffu

/* The header, written once by the client (fp4idx_channel_block_init), read
 * by the daemon (fp4idx_channel_block_check). */
typedef struct fp4idx_channel_header_s {
  uint32_t magic;      /* FP4IDX_CHANNEL_MAGIC */
  uint32_t version;    /* FP4IDX_CHANNEL_VERSION */
  uint32_t nslots;     /* 1..FP4IDX_CHANNEL_MAX_SLOTS */
  uint32_t slot_bytes; /* FP4IDX_CHANNEL_SLOT_BYTES */
  uint64_t size;       /* bytes of the block, >= fp4idx_channel_block_bytes(nslots) */
  uint8_t reserved[40];
} fp4idx_channel_header_t;

/* A call's descriptor: which sequence, the shapes, and where the inputs and
 * outputs lie in the channel's regions (byte offsets). Written by the
 * client's stream before the doorbell. */
typedef struct fp4idx_channel_desc_s {
  uint32_t ticket;          /* == the doorbell of this call */
  uint32_t flags;           /* FP4IDX_CHANNEL_F_* */
  uint64_t seq;             /* the cache sequence */
  uint32_t rows;            /* R, 1..FP4IDX_CHANNEL_MAX_ROWS */
  uint32_t heads;           /* H, 1..128 */
  uint32_t topk;            /* k >= 1: top-k; 0: full logits */
  uint32_t width;           /* full logits: W of out_logits [R,W]; 0 with topk */
  uint64_t q_offset;        /* bf16 [R,H,128] in the q region */
  uint64_t w_offset;        /* bf16 [R,H] in the w region */
  uint64_t lens_offset;     /* i32 [R] in the lens region (with F_LENS) */
  uint64_t logits_offset;   /* f32 [R,W] or [R,k] in the output region */
  uint64_t positions_offset; /* i32 [R,k] (topk) */
  uint64_t counts_offset;   /* i32 [R] (topk) */
} fp4idx_channel_desc_t;

/* One slot: the descriptor, then the words the two sides signal with. */
typedef struct fp4idx_channel_slot_s {
  fp4idx_channel_desc_t desc; /* [0, 80) */
  uint8_t reserved0[16];
  uint32_t doorbell;          /* [96] the ticket of a rung call, 0 when none */
  uint32_t completion;        /* [100] 0 pending, else DONE | ticket | -status */
  uint32_t served;            /* [104] the last ticket the daemon took */
  uint8_t reserved1[20];
} fp4idx_channel_slot_t;

/* Byte offsets of the words inside a slot, for stream writes. */
#define FP4IDX_CHANNEL_DOORBELL_AT 96u
#define FP4IDX_CHANNEL_COMPLETION_AT 100u

/* The regions a channel's calls read and write, as the daemon resolved them
 * at `channel_open` (ids on the connection; sizes in bytes). lens_region 0:
 * calls may not pass lens. */
typedef struct fp4idx_channel_bind_s {
  uint64_t q_region, w_region, lens_region, out_region;
  uint64_t q_size, w_size, lens_size, out_size;
} fp4idx_channel_bind_t;

/* The score request a checked descriptor stands for: one entry whose
 * tensors are references into the bound regions, and the request's heads
 * and topk (what the socket's `score` decoder would produce). */
typedef struct fp4idx_channel_call_s {
  uint32_t heads;
  uint32_t topk;
  fp4idx_score_seq_t entry;
} fp4idx_channel_call_t;

/* Bytes of a block of nslots slots (0 when nslots is 0 or above the cap). */
size_t fp4idx_channel_block_bytes(uint32_t nslots);

/* Writes an empty block of nslots slots into base[0..size) (zeroes it, then
 * the header). Returns 0, or FP4IDX_EINVAL (base NULL, nslots out of
 * 1..FP4IDX_CHANNEL_MAX_SLOTS, size below fp4idx_channel_block_bytes). */
int fp4idx_channel_block_init(void *base, size_t size, uint32_t nslots);

/* Checks a mapped block of `size` bytes against what `channel_open` said
 * (nslots): magic, version, slot size, slot count and size. Returns 0 or
 * FP4IDX_EREGION with the reason in msg. */
int fp4idx_channel_block_check(const void *base, size_t size, uint32_t nslots, char *msg,
                               size_t msgcap);

/* Slot i of a block (no check). */
static inline fp4idx_channel_slot_t *fp4idx_channel_slot(void *base, uint32_t i) {
  return (fp4idx_channel_slot_t *)((uint8_t *)base + FP4IDX_CHANNEL_HEADER_BYTES +
                                   (size_t)i * FP4IDX_CHANNEL_SLOT_BYTES);
}

/* Ring arithmetic. Tickets count calls 1, 2, ..., 2^32 - 1, then 1 again (0
 * means "no call"); the call with ticket t uses slot (t - 1) % nslots, so
 * consecutive calls go round the ring. */
uint32_t fp4idx_channel_ticket_next(uint32_t ticket);
uint32_t fp4idx_channel_slot_of(uint32_t ticket, uint32_t nslots);

/* The completion word of a finished call (status 0 or negative). */
uint32_t fp4idx_channel_completion(uint32_t ticket, int status);

/* The status a completion word holds: 0 or negative; FP4IDX_EINVAL for a
 * word that is not DONE (still pending). */
int fp4idx_channel_completion_status(uint32_t word);

/* Checks a descriptor, copied out of the block, against the ticket that
 * rang and the bound regions, and makes the score request it stands for:
 * ticket equal (EPROTO), known flags (EPROTO), rows 1..MAX_ROWS and heads
 * 1..128 (ESHAPE), topk <= FP4IDX_PROTO_MAX_TOPK (E2BIG), width 0 with topk
 * (ESHAPE), lens only with a lens region (ENOREGION), every offset a
 * multiple of its element size and every tensor inside its region without
 * overflow (EREGION), outputs disjoint from each other and from inputs in
 * the same region (EREGION). What needs the cache (the sequence, lens
 * values, W) is the score path's check, as for a socket request. Returns 0
 * with *call set, or the status with the reason in msg. */
int fp4idx_channel_desc_check(const fp4idx_channel_desc_t *d, uint32_t ticket,
                              const fp4idx_channel_bind_t *bind, fp4idx_channel_call_t *call,
                              char *msg, size_t msgcap);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_CHANNEL_H */
