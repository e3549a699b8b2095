/* cuda_driver_stub.c -- a stand-in libcuda.so.1 for the C client's channel
 * stream path without a GPU (test_client_channel_stream.c): its "stream"
 * runs each operation at once on the calling thread (a write is a store, a
 * wait spins on the word), its "device address" of registered host memory
 * is the host address, and it counts what it was asked. Exports only what
 * client/channel.c looks up, plus the stub_* controls. */
#include <stddef.h>
#include <stdint.h>

/* The driver's entry points, exported by name: no header declares them. */
#pragma GCC diagnostic ignored "-Wmissing-prototypes"

#define STUB_CTX ((void *)0x1234)
#define STUB_STREAM ((void *)0x5678)

enum { C_REGISTER, C_UNREGISTER, C_WRITE32, C_WRITE64, C_WAIT, C_BATCH, C_SYNC, C_N };
static int calls[C_N];
static size_t registered; /* blocks registered now */
static int refuse_batch;  /* 1: cuStreamBatchMemOp_v2 fails */

int cuInit(unsigned flags) { return flags ? 1 : 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = STUB_CTX; return 0; }
int cuCtxPushCurrent_v2(void *ctx) { return ctx == STUB_CTX ? 0 : 201; }
int cuCtxPopCurrent_v2(void **ctx) { *ctx = STUB_CTX; return 0; }
int cuCtxSynchronize(void) { calls[C_SYNC]++; return 0; }

int cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
  if (flags != 3u || ((uintptr_t)p & 4095u) || n == 0) return 1;
  calls[C_REGISTER]++;
  registered++;
  return 0;
}

int cuMemHostGetDevicePointer_v2(unsigned long long *d, void *p, unsigned flags) {
  if (!registered || flags) return 1;
  *d = (unsigned long long)(uintptr_t)p;
  return 0;
}

int cuMemHostUnregister(void *p) {
  (void)p;
  if (!registered) return 1;
  calls[C_UNREGISTER]++;
  registered--;
  return 0;
}

int cuStreamWriteValue32_v2(void *s, unsigned long long a, uint32_t v, unsigned f) {
  if (s != STUB_STREAM || f || !registered || (a & 3u)) return 1;
  calls[C_WRITE32]++;
  __atomic_store_n((uint32_t *)(uintptr_t)a, v, __ATOMIC_RELEASE);
  return 0;
}

int cuStreamWriteValue64_v2(void *s, unsigned long long a, uint64_t v, unsigned f) {
  if (s != STUB_STREAM || f || !registered || (a & 7u)) return 1;
  calls[C_WRITE64]++;
  __atomic_store_n((uint64_t *)(uintptr_t)a, v, __ATOMIC_RELEASE);
  return 0;
}

/* CU_STREAM_WAIT_VALUE_AND (2) only: the client's waits use it. */
int cuStreamWaitValue32_v2(void *s, unsigned long long a, uint32_t v, unsigned f) {
  if (s != STUB_STREAM || f != 2u || !registered || (a & 3u)) return 1;
  calls[C_WAIT]++;
  while (!(__atomic_load_n((uint32_t *)(uintptr_t)a, __ATOMIC_ACQUIRE) & v)) {
  }
  return 0;
}

/* CUstreamBatchMemOpParams: operation, address, value, flags, alias, pad. */
typedef struct {
  uint32_t op;
  unsigned long long address;
  uint64_t value;
  unsigned flags;
  unsigned long long alias, pad;
} stub_memop_t;
_Static_assert(sizeof(stub_memop_t) == 48, "CUstreamBatchMemOpParams is 48 bytes");

int cuStreamBatchMemOp_v2(void *s, unsigned n, stub_memop_t *ops, unsigned f) {
  calls[C_BATCH]++;
  if (refuse_batch || s != STUB_STREAM || f || n == 0 || n > 256) return 1;
  for (unsigned i = 0; i < n; i++) {
    const stub_memop_t *o = &ops[i];
    int rc = o->op == 2u   ? cuStreamWriteValue32_v2(s, o->address, (uint32_t)o->value, o->flags)
             : o->op == 5u ? cuStreamWriteValue64_v2(s, o->address, o->value, o->flags)
             : o->op == 1u ? cuStreamWaitValue32_v2(s, o->address, (uint32_t)o->value, o->flags)
                           : 1;
    if (rc) return rc;
  }
  return 0;
}

/* Controls for the test: a count (enum order above), the blocks registered
 * now, and whether the batch entry point refuses. */
int stub_calls(int i) { return i >= 0 && i < C_N ? calls[i] : -1; }
size_t stub_registered(void) { return registered; }
void stub_refuse_batch(int on) { refuse_batch = on; }
