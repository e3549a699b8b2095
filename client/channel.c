/* channel.c -- channels on the client side (fp4idx_client.h "channels",
 * PROTOCOL.md "Channels"): the control block, the stream operations of a
 * call through the CUDA driver loaded at run time, and the watcher that
 * releases pending calls once the connection is gone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_internal.h"
#include "fp4idx_channel.h"

/* ---- the CUDA driver, loaded at run time ------------------------------------ */

typedef int (*fp4idx__cu_init_fn)(unsigned);
typedef int (*fp4idx__cu_ctx_fn)(void **);
typedef int (*fp4idx__cu_reg_fn)(void *, size_t, unsigned);
typedef int (*fp4idx__cu_devptr_fn)(unsigned long long *, void *, unsigned);
typedef int (*fp4idx__cu_unreg_fn)(void *);
typedef int (*fp4idx__cu_w32_fn)(void *, unsigned long long, uint32_t, unsigned);
typedef int (*fp4idx__cu_w64_fn)(void *, unsigned long long, uint64_t, unsigned);
typedef int (*fp4idx__cu_sync_fn)(void);
typedef int (*fp4idx__cu_batch_fn)(void *, unsigned, void *, unsigned);
typedef int (*fp4idx__cu_push_fn)(void *);

#define FP4IDX__CU_MEMHOSTREGISTER_PORTABLE 0x01u
#define FP4IDX__CU_MEMHOSTREGISTER_DEVICEMAP 0x02u
#define FP4IDX__CU_STREAM_WAIT_VALUE_AND 0x2u
#define FP4IDX__CU_STREAM_MEM_OP_WAIT_VALUE_32 1u
#define FP4IDX__CU_STREAM_MEM_OP_WRITE_VALUE_32 2u
#define FP4IDX__CU_STREAM_MEM_OP_WRITE_VALUE_64 5u

/* One entry of cuStreamBatchMemOp (CUstreamBatchMemOpParams in cuda.h,
 * which this file does not need): a 48-byte union whose wait and write
 * members share this layout; a 32-bit value is the low word of `value`. */
typedef union fp4idx__cu_memop_u {
  struct {
    uint32_t operation;
    unsigned long long address;
    uint64_t value;
    unsigned flags;
    unsigned long long alias; /* the driver's */
  } op;
  uint64_t pad[6];
} fp4idx__cu_memop_t;
_Static_assert(sizeof(fp4idx__cu_memop_t) == 48, "CUstreamBatchMemOpParams is 48 bytes");
_Static_assert(offsetof(fp4idx__cu_memop_t, op.value) == 16 &&
                   offsetof(fp4idx__cu_memop_t, op.flags) == 24,
               "CUstreamMemOpWriteValueParams_st layout");

static struct {
  pthread_once_t once;
  int ok;
  fp4idx__cu_init_fn init;
  fp4idx__cu_ctx_fn ctx_get_current;
  fp4idx__cu_reg_fn host_register;
  fp4idx__cu_devptr_fn host_device_pointer;
  fp4idx__cu_unreg_fn host_unregister;
  fp4idx__cu_w32_fn write32, wait32;
  fp4idx__cu_w64_fn write64;
  fp4idx__cu_batch_fn batch;   /* cuStreamBatchMemOp_v2, or NULL: op by op */
  fp4idx__cu_sync_fn ctx_synchronize;
  fp4idx__cu_push_fn ctx_push;
  fp4idx__cu_ctx_fn ctx_pop;
} fp4idx__cu = {.once = PTHREAD_ONCE_INIT};

/* The newest name of a driver entry point first (_v2 since CUDA 11.7 for
 * the stream memory operations), then the plain one. */
static void *fp4idx__cu_sym(void *h, const char *v2, const char *v1) {
  void *p = v2 ? dlsym(h, v2) : NULL;
  return p ? p : dlsym(h, v1);
}

static void fp4idx__cu_load(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return;
  fp4idx__cu.init = (fp4idx__cu_init_fn)fp4idx__cu_sym(h, NULL, "cuInit");
  fp4idx__cu.ctx_get_current = (fp4idx__cu_ctx_fn)fp4idx__cu_sym(h, NULL, "cuCtxGetCurrent");
  fp4idx__cu.host_register =
      (fp4idx__cu_reg_fn)fp4idx__cu_sym(h, "cuMemHostRegister_v2", "cuMemHostRegister");
  fp4idx__cu.host_device_pointer = (fp4idx__cu_devptr_fn)fp4idx__cu_sym(
      h, "cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer");
  fp4idx__cu.host_unregister = (fp4idx__cu_unreg_fn)fp4idx__cu_sym(h, NULL, "cuMemHostUnregister");
  fp4idx__cu.write32 =
      (fp4idx__cu_w32_fn)fp4idx__cu_sym(h, "cuStreamWriteValue32_v2", "cuStreamWriteValue32");
  fp4idx__cu.wait32 =
      (fp4idx__cu_w32_fn)fp4idx__cu_sym(h, "cuStreamWaitValue32_v2", "cuStreamWaitValue32");
  fp4idx__cu.write64 =
      (fp4idx__cu_w64_fn)fp4idx__cu_sym(h, "cuStreamWriteValue64_v2", "cuStreamWriteValue64");
  fp4idx__cu.batch = (fp4idx__cu_batch_fn)fp4idx__cu_sym(h, NULL, "cuStreamBatchMemOp_v2");
  fp4idx__cu.ctx_synchronize = (fp4idx__cu_sync_fn)fp4idx__cu_sym(h, NULL, "cuCtxSynchronize");
  fp4idx__cu.ctx_push = (fp4idx__cu_push_fn)fp4idx__cu_sym(h, "cuCtxPushCurrent_v2",
                                                          "cuCtxPushCurrent");
  fp4idx__cu.ctx_pop = (fp4idx__cu_ctx_fn)fp4idx__cu_sym(h, "cuCtxPopCurrent_v2",
                                                        "cuCtxPopCurrent");
  fp4idx__cu.ok = fp4idx__cu.ctx_synchronize && fp4idx__cu.ctx_push && fp4idx__cu.ctx_pop &&
                  fp4idx__cu.init && fp4idx__cu.ctx_get_current && fp4idx__cu.host_register &&
                  fp4idx__cu.host_device_pointer && fp4idx__cu.host_unregister &&
                  fp4idx__cu.write32 && fp4idx__cu.wait32 && fp4idx__cu.write64 &&
                  fp4idx__cu.init(0) == 0;
}

/* 1 when the driver is loaded and a context is current on this thread. */
static int fp4idx__cu_ready(void) {
  pthread_once(&fp4idx__cu.once, fp4idx__cu_load);
  void *ctx = NULL;
  return fp4idx__cu.ok && fp4idx__cu.ctx_get_current(&ctx) == 0 && ctx != NULL;
}

/* ---- the channel --------------------------------------------------------------- */

struct fp4idx_client_channel_s {
  fp4idx_client_t *c;
  uint64_t id;
  uint32_t nslots;
  uint8_t *block;              /* this process's mapping */
  size_t size;
  unsigned long long dblock;   /* its device address, 0 without CUDA */
  void *ctx;                   /* the CUDA context current at open (with dblock) */
  uint32_t released;           /* pending calls the last release completed (watcher) */
  uint32_t next_ticket;        /* atomic */
  int sock;                    /* a dup of the connection's socket (watcher) */
  int wake[2];                 /* pipe: close -> watcher */
  pthread_t watcher;
  int dead;                    /* the connection is gone (atomic) */
};

/* Writes ECONN into every pending (0) completion word; returns how many. */
static uint32_t fp4idx__client_channel_release(fp4idx_client_channel_t *ch) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < ch->nslots; i++) {
    fp4idx_channel_slot_t *s = fp4idx_channel_slot(ch->block, i);
    uint32_t zero = 0, t = __atomic_load_n(&s->desc.ticket, __ATOMIC_RELAXED);
    n += __atomic_compare_exchange_n(&s->completion, &zero,
                                     fp4idx_channel_completion(t, FP4IDX_ECONN), 0,
                                     __ATOMIC_RELEASE, __ATOMIC_RELAXED);
  }
  return n;
}

/* Waits for the connection to close (or the channel to), then releases the
 * pending calls, and keeps releasing later ones until the channel closes. */
static void *fp4idx__client_channel_watch(void *arg) {
  fp4idx_client_channel_t *ch = arg;
  struct pollfd p[2] = {{.fd = ch->sock, .events = POLLRDHUP}, {.fd = ch->wake[0], .events = POLLIN}};
  int nap_ms = -1;
  for (;;) {
    int n = poll(p, 2, nap_ms);
    if (n < 0 && errno != EINTR) break;
    if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
      __atomic_store_n(&ch->dead, 1, __ATOMIC_RELEASE);
      p[0].fd = -1; /* poll ignores it from now on */
      nap_ms = 1;
    }
    if (__atomic_load_n(&ch->dead, __ATOMIC_ACQUIRE)) fp4idx__client_channel_release(ch);
    if (p[1].revents) break;
  }
  ch->released = fp4idx__client_channel_release(ch); /* read after the join */
  return NULL;
}

/* A stream may still be waiting on a word the close just completed: the
 * device must have read it before the block is unregistered, so the
 * channel's context is synchronized first (only then: it waits for all of
 * the context's work). */
static void fp4idx__client_channel_settle(fp4idx_client_channel_t *ch) {
  void *was = NULL;
  if (!ch->dblock || !ch->released || !ch->ctx || fp4idx__cu.ctx_push(ch->ctx) != 0) return;
  (void)fp4idx__cu.ctx_synchronize();
  (void)fp4idx__cu.ctx_pop(&was);
}

static void fp4idx__client_channel_free(fp4idx_client_channel_t *ch) {
  if (ch->dblock) fp4idx__cu.host_unregister(ch->block);
  if (ch->block) munmap(ch->block, ch->size);
  if (ch->sock >= 0) close(ch->sock);
  if (ch->wake[0] >= 0) close(ch->wake[0]), close(ch->wake[1]);
  free(ch);
}

/* The sealed memfd of the block, mapped into ch, initialised. Returns the
 * fd (the caller closes it) or -1 with the error recorded on c. */
static int fp4idx__client_channel_block(fp4idx_client_t *c, fp4idx_client_channel_t *ch) {
  void *p = NULL;
  int fd = fp4idx__client_memfd_map("fp4idx-channel", ch->size,
                                    F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, &p);
  if (fd < 0) {
    fp4idx__client_fail(c, FP4IDX_ENOMEM, "cannot make the channel's control block: %s",
                        strerror(errno));
    return -1;
  }
  ch->block = p;
  fp4idx_channel_block_init(p, ch->size, ch->nslots);
  return fd;
}

/* Registers the block with the CUDA driver when it has a context here. */
static fp4idx_status_t fp4idx__client_channel_map_device(fp4idx_client_t *c,
                                                  fp4idx_client_channel_t *ch) {
  if (!fp4idx__cu_ready()) return FP4IDX_OK; /* host calls only */
  unsigned flags = FP4IDX__CU_MEMHOSTREGISTER_PORTABLE | FP4IDX__CU_MEMHOSTREGISTER_DEVICEMAP;
  int r = fp4idx__cu.host_register(ch->block, ch->size, flags);
  if (r != 0)
    return fp4idx__client_fail(c, FP4IDX_EDEVICE, "cuMemHostRegister of the block: error %d", r);
  (void)fp4idx__cu.ctx_get_current(&ch->ctx);
  r = fp4idx__cu.host_device_pointer(&ch->dblock, ch->block, 0);
  if (r != 0 || !ch->dblock) {
    fp4idx__cu.host_unregister(ch->block);
    ch->dblock = 0;
    return fp4idx__client_fail(c, FP4IDX_EDEVICE, "cuMemHostGetDevicePointer: error %d", r);
  }
  return FP4IDX_OK;
}

fp4idx_status_t fp4idx_client_channel_open(fp4idx_client_t *c, uint32_t slots,
                                           uint64_t q_region, uint64_t w_region,
                                           uint64_t lens_region, uint64_t out_region,
                                           fp4idx_client_channel_t **out) {
  if (c == NULL) return FP4IDX_EINVAL;
  if (out == NULL || !fp4idx_channel_block_bytes(slots))
    return fp4idx__client_fail(c, FP4IDX_EINVAL, "invalid argument: out NULL or slots not "
                                                 "in 1..%u", FP4IDX_CHANNEL_MAX_SLOTS);
  *out = NULL;
  if (c->fd < 0) return fp4idx__client_fail(c, FP4IDX_ECONN, "not connected");
  fp4idx_client_channel_t *ch = calloc(1, sizeof *ch);
  if (!ch) return fp4idx__client_fail(c, FP4IDX_ENOMEM, "out of memory");
  *ch = (fp4idx_client_channel_t){.c = c, .nslots = slots, .size = fp4idx_channel_block_bytes(slots),
                                  .next_ticket = 1, .sock = -1, .wake = {-1, -1}};
  int fd = fp4idx__client_channel_block(c, ch);
  fp4idx_status_t st = fd < 0 ? FP4IDX_ENOMEM : fp4idx__client_channel_map_device(c, ch);
  if (st == FP4IDX_OK && (pipe2(ch->wake, O_CLOEXEC) != 0 ||
                          (ch->sock = fcntl(c->fd, F_DUPFD_CLOEXEC, 3)) < 0))
    st = fp4idx__client_fail(c, FP4IDX_ENOMEM, "channel watcher: %s", strerror(errno));
  if (st == FP4IDX_OK) {
    fp4idx_request_t req = {.op = FP4IDX_OP_CHANNEL_OPEN};
    req.u.channel_open = (fp4idx_channel_open_req_t){
        .slots = slots, .size = ch->size, .q_region = q_region, .w_region = w_region,
        .out_region = out_region, .lens_region = lens_region};
    fp4idx_response_t resp;
    st = fp4idx__client_call_fd(c, &req, fd, &resp);
    if (st == FP4IDX_OK) ch->id = resp.u.channel_open.channel;
  }
  if (fd >= 0) close(fd);
  if (st == FP4IDX_OK && pthread_create(&ch->watcher, NULL, fp4idx__client_channel_watch, ch) != 0) {
    fp4idx_request_t req = {.op = FP4IDX_OP_CHANNEL_CLOSE};
    req.u.channel_close.channel = ch->id;
    fp4idx_response_t resp;
    fp4idx__client_call(c, &req, &resp);
    st = fp4idx__client_fail(c, FP4IDX_ENOMEM, "cannot start the channel watcher");
  }
  if (st != FP4IDX_OK) {
    fp4idx__client_channel_free(ch);
    return st;
  }
  c->channels++;
  *out = ch;
  return FP4IDX_OK;
}

/* The descriptor of a call, checked here as far as it can be without the
 * daemon. */
static fp4idx_status_t fp4idx__client_channel_desc(fp4idx_client_channel_t *ch,
                                            const fp4idx_client_channel_call_t *call,
                                            uint32_t width, uint32_t k,
                                            fp4idx_channel_desc_t *d) {
  if (!call || call->rows < 1 || call->rows > FP4IDX_CHANNEL_MAX_ROWS || call->heads < 1 ||
      call->heads > FP4IDX_PROTO_MAX_HEADS || k > FP4IDX_PROTO_MAX_TOPK)
    return fp4idx__client_fail(ch->c, FP4IDX_EINVAL,
                               "invalid argument: call NULL, rows, heads or k out of range");
  *d = (fp4idx_channel_desc_t){
      .flags = call->lens_offset >= 0 ? FP4IDX_CHANNEL_F_LENS : 0u, .seq = call->seq,
      .rows = call->rows, .heads = call->heads, .topk = k, .width = k ? 0u : width,
      .q_offset = call->q_offset, .w_offset = call->w_offset,
      .lens_offset = call->lens_offset >= 0 ? (uint64_t)call->lens_offset : 0u,
      .logits_offset = call->logits_offset,
      .positions_offset = k ? call->positions_offset : 0u,
      .counts_offset = k ? call->counts_offset : 0u};
  return FP4IDX_OK;
}

/* The call by the calling thread: CPU stores, then a wait on the word (the
 * watcher writes ECONN into it when the connection goes). */
static fp4idx_status_t fp4idx__client_channel_host_call(fp4idx_client_channel_t *ch,
                                                 fp4idx_channel_slot_t *s,
                                                 const fp4idx_channel_desc_t *d) {
  __atomic_store_n(&s->completion, 0u, __ATOMIC_RELAXED);
  memcpy((void *)&s->desc, d, sizeof *d);
  __atomic_store_n(&s->doorbell, d->ticket, __ATOMIC_RELEASE);
  unsigned spins = 0;
  uint32_t w;
  while (!((w = __atomic_load_n(&s->completion, __ATOMIC_ACQUIRE)) & FP4IDX_CHANNEL_DONE))
    if (++spins > 4096) usleep(spins > 65536 ? 1000 : 20);
  fp4idx_status_t st = (fp4idx_status_t)fp4idx_channel_completion_status(w);
  return st == FP4IDX_OK ? fp4idx__client_fail(ch->c, FP4IDX_OK, NULL)
                         : fp4idx__client_fail(ch->c, st, "channel call: %s",
                                               fp4idx_strerror(st));
}

/* The operations of ops[0..n) as single driver calls, in order: for a
 * driver without cuStreamBatchMemOp_v2 (or one that refuses the batch).
 * Returns 0 or the first driver error. */
static int fp4idx__cu_memops_one_by_one(void *stream, const fp4idx__cu_memop_t *ops,
                                        unsigned n) {
  int r = 0;
  for (unsigned i = 0; r == 0 && i < n; i++) {
    const unsigned long long a = ops[i].op.address;
    const uint64_t v = ops[i].op.value;
    if (ops[i].op.operation == FP4IDX__CU_STREAM_MEM_OP_WRITE_VALUE_32)
      r = fp4idx__cu.write32(stream, a, (uint32_t)v, ops[i].op.flags);
    else if (ops[i].op.operation == FP4IDX__CU_STREAM_MEM_OP_WRITE_VALUE_64)
      r = fp4idx__cu.write64(stream, a, v, ops[i].op.flags);
    else
      r = fp4idx__cu.wait32(stream, a, (uint32_t)v, ops[i].op.flags);
  }
  return r;
}

static fp4idx__cu_memop_t fp4idx__cu_memop(uint32_t operation, unsigned long long address,
                                           uint64_t value, unsigned flags) {
  fp4idx__cu_memop_t m;
  memset(&m, 0, sizeof m);
  m.op.operation = operation;
  m.op.address = address;
  m.op.value = value;
  m.op.flags = flags;
  return m;
}

/* The call as stream operations: reset the completion word, write the
 * descriptor (ten 64-bit words), ring, wait. One cuStreamBatchMemOp where
 * the driver has it (one submission, one graph node when captured), else
 * the same operations one by one. */
static fp4idx_status_t fp4idx__client_channel_stream_call(fp4idx_client_channel_t *ch, void *stream,
                                                   uint32_t slot,
                                                   const fp4idx_channel_desc_t *d) {
  if (!ch->dblock)
    return fp4idx__client_fail(ch->c, FP4IDX_ENODEV,
                               "the channel has no CUDA mapping (no driver or no context at "
                               "open): only FP4IDX_CLIENT_CHANNEL_HOST calls");
  unsigned long long base = ch->dblock + FP4IDX_CHANNEL_HEADER_BYTES +
                            (unsigned long long)slot * FP4IDX_CHANNEL_SLOT_BYTES;
  enum { NW = sizeof *d / 8 };
  uint64_t words[NW];
  memcpy(words, d, sizeof words);
  fp4idx__cu_memop_t ops[NW + 3];
  ops[0] = fp4idx__cu_memop(FP4IDX__CU_STREAM_MEM_OP_WRITE_VALUE_32,
                            base + FP4IDX_CHANNEL_COMPLETION_AT, 0u, 0u);
  for (unsigned i = 0; i < NW; i++)
    ops[1 + i] = fp4idx__cu_memop(FP4IDX__CU_STREAM_MEM_OP_WRITE_VALUE_64, base + 8u * i,
                                  words[i], 0u);
  ops[NW + 1] = fp4idx__cu_memop(FP4IDX__CU_STREAM_MEM_OP_WRITE_VALUE_32,
                                 base + FP4IDX_CHANNEL_DOORBELL_AT, d->ticket, 0u);
  ops[NW + 2] = fp4idx__cu_memop(FP4IDX__CU_STREAM_MEM_OP_WAIT_VALUE_32,
                                 base + FP4IDX_CHANNEL_COMPLETION_AT, FP4IDX_CHANNEL_DONE,
                                 FP4IDX__CU_STREAM_WAIT_VALUE_AND);
  int r = fp4idx__cu.batch ? fp4idx__cu.batch(stream, NW + 3, ops, 0) : -1;
  if (r != 0) r = fp4idx__cu_memops_one_by_one(stream, ops, NW + 3);
  if (r != 0)
    return fp4idx__client_fail(ch->c, FP4IDX_EDEVICE, "channel call: stream operation: error %d",
                               r);
  return fp4idx__client_fail(ch->c, FP4IDX_OK, NULL);
}

static fp4idx_status_t fp4idx__client_channel_call(fp4idx_client_channel_t *ch, void *stream,
                                            const fp4idx_client_channel_call_t *call,
                                            uint32_t width, uint32_t k, uint32_t *ticket) {
  if (ch == NULL) return FP4IDX_EINVAL;
  fp4idx_channel_desc_t d;
  fp4idx_status_t st = fp4idx__client_channel_desc(ch, call, width, k, &d);
  if (st != FP4IDX_OK) return st;
  if (__atomic_load_n(&ch->dead, __ATOMIC_ACQUIRE))
    return fp4idx__client_fail(ch->c, FP4IDX_ECONN, "the channel's connection is closed");
  uint32_t t = __atomic_fetch_add(&ch->next_ticket, 1u, __ATOMIC_RELAXED);
  if (t == 0) t = __atomic_fetch_add(&ch->next_ticket, 1u, __ATOMIC_RELAXED);
  d.ticket = t;
  if (ticket) *ticket = t;
  uint32_t slot = fp4idx_channel_slot_of(t, ch->nslots);
  if (stream == FP4IDX_CLIENT_CHANNEL_HOST)
    return fp4idx__client_channel_host_call(ch, fp4idx_channel_slot(ch->block, slot), &d);
  return fp4idx__client_channel_stream_call(ch, stream, slot, &d);
}

fp4idx_status_t fp4idx_client_channel_score(fp4idx_client_channel_t *ch, void *stream,
                                            const fp4idx_client_channel_call_t *call,
                                            uint32_t width, uint32_t *ticket) {
  return fp4idx__client_channel_call(ch, stream, call, width, 0, ticket);
}

fp4idx_status_t fp4idx_client_channel_topk(fp4idx_client_channel_t *ch, void *stream,
                                           const fp4idx_client_channel_call_t *call, uint32_t k,
                                           uint32_t *ticket) {
  if (ch && k == 0) return fp4idx__client_fail(ch->c, FP4IDX_EINVAL, "invalid argument: k 0");
  return fp4idx__client_channel_call(ch, stream, call, 0, k, ticket);
}

fp4idx_status_t fp4idx_client_channel_status(const fp4idx_client_channel_t *ch, uint32_t ticket) {
  if (ch == NULL || ticket == 0) return FP4IDX_EINVAL;
  const fp4idx_channel_slot_t *s =
      fp4idx_channel_slot(ch->block, fp4idx_channel_slot_of(ticket, ch->nslots));
  uint32_t w = __atomic_load_n(&s->completion, __ATOMIC_ACQUIRE);
  if (!(w & FP4IDX_CHANNEL_DONE) ||
      ((w >> 16) & FP4IDX_CHANNEL_TICKET_MASK) != (ticket & FP4IDX_CHANNEL_TICKET_MASK))
    return FP4IDX_EINVAL;
  return (fp4idx_status_t)fp4idx_channel_completion_status(w);
}

uint64_t fp4idx_client_channel_device_block(const fp4idx_client_channel_t *ch) {
  return ch ? (uint64_t)ch->dblock : 0;
}

fp4idx_status_t fp4idx_client_channel_close(fp4idx_client_channel_t *ch) {
  if (ch == NULL) return FP4IDX_EINVAL;
  fp4idx_client_t *c = ch->c;
  fp4idx_status_t st = FP4IDX_OK;
  if (c->fd >= 0 && !__atomic_load_n(&ch->dead, __ATOMIC_ACQUIRE)) {
    fp4idx_request_t req = {.op = FP4IDX_OP_CHANNEL_CLOSE};
    req.u.channel_close.channel = ch->id;
    fp4idx_response_t resp;
    st = fp4idx__client_call(c, &req, &resp);
  }
  __atomic_store_n(&ch->dead, 1, __ATOMIC_RELEASE);
  char one = 1;
  while (write(ch->wake[1], &one, 1) < 0 && errno == EINTR) {
  }
  pthread_join(ch->watcher, NULL); /* it releases the pending calls last */
  fp4idx__client_channel_settle(ch);
  c->channels--;
  fp4idx__client_channel_free(ch);
  return st;
}
