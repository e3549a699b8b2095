/* backend_cuda.c -- the CUDA backend (fp4idx_backend.h) over kernels/cuda.
 *
 * One device, one non-blocking stream, a cudaMalloc'd page pool, and two
 * staging sets (double buffering): each a pinned host buffer and a device
 * buffer laid out identically, sized once and grown rarely (x1.5), so the
 * inputs of a call travel in ONE host-to-device copy. A set is reused only
 * after the event that ends its last call has fired, so the host may fill
 * one set while the device still works from the other.
 *
 * A score call: [ev0] upload [ev1] scorer + top-k [ev2] download [ev3],
 * then one wait on ev3 (the caller's thread blocks there; the daemon runs
 * backends on a worker thread); no synchronization in between. The
 * kernels' attributes are set once per device (fp4idx_cuda.h: describe),
 * so a call makes no attribute or occupancy call; its events are recorded
 * only when the caller asks for the timing (each costs device time between
 * its neighbours). As one launch of a cached, updated CUDA graph the same
 * work measures slower on the H200 (64-key score 28.6 vs 23.2 us, 400,000
 * keys top-2048 110.6 vs 102.4: the results page), so it is enqueued op by
 * op. The wait
 * spins on a word of mapped host memory that the stream writes after ev3
 * (cuStreamWriteValue32, where the driver has it), and falls back to the
 * event: see fp4idx__stage_wait. The events
 * give the device time of each part (fp4idx_backend_timing_t). Results are
 * copied from the device straight into the caller's output arrays: when the
 * caller got them from host_alloc (pinned, cuda_pinned.c) that is a true
 * asynchronous DMA and nothing is copied again on the host; small full
 * logits in pinned memory (<= 256 KB) are stored there by the scorer itself,
 * with no copy at all, and outputs in the device's own memory (a client's
 * CUDA region, batch.outputs_on_device) never leave it. Sequences whose
 * page list is resident (seq_pages_update, cuda_seqpages.c) are scored from
 * the device copy of their list instead of uploading it.
 *
 * The stream has the device's greatest priority, so that on a GPU shared
 * with a serving engine (under MPS, kernels of both side by side) our
 * blocks are scheduled before a co-tenant's waiting ones (beside a GEMM
 * load under MPS a 400,000-key top-2048 takes a quarter of the time it
 * takes at the default priority: docs/RESULTS.md, "Sharing the GPU").
 *
 * Every CUDA return code is checked; a failure logs "fp4idx cuda: <what>:
 * <error>" to stderr and returns FP4IDX_EDEVICE (FP4IDX_ENOMEM when device
 * memory runs out).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h> /* the types of cuStreamWriteValue32 (no libcuda link: entry point) */
#include <cuda_runtime_api.h>

#include "cuda_pinned.h"
#include "cuda_seqpages.h"
#include "fp4idx_backend.h"
#include "fp4idx_cuda.h"

/* Full logits up to this size that lie in pinned host memory are stored by
 * the scorer itself across PCIe (mapped memory, same address under
 * UVA): no download copy and no wait for it, which is most of a small
 * request's device time. Larger ones are copied (a DMA beats the kernels'
 * stores over PCIe and keeps them out of the scorer's pipeline). */
#define FP4IDX__CUDA_DIRECT_MAX ((size_t)256 << 10)

/* A score whose inputs take at least this many bytes (a batch of many
 * sequences) uploads them on the side stream (fp4idx__cuda_t.up_stream),
 * and its kernels wait for that upload by an event: so the upload of one
 * batch overlaps the kernels of the batch before it on the main stream
 * (the worker begins batch k+1 while the device runs batch k), instead of
 * queueing behind them. Smaller uploads stay on the main stream: the event
 * and the cross-stream wait cost more than they overlap. */
#define FP4IDX__CUDA_SIDE_UPLOAD_MIN ((size_t)256 << 10)

/* Top-k results of at most this many bytes (positions, logits, counts)
 * that lie in pinned host memory are stored by the top-k kernel itself
 * across PCIe, as small full logits are: no download copy (a DMA's latency
 * and a stream operation). Larger ones are copied: the top-k's scattered
 * 4-byte stores over PCIe cost more than the copy they save (H200: a
 * 400,000-key top-2048, 64 KB of results, took ~30 us longer in its
 * kernels to save ~10 us of download). */
#define FP4IDX__CUDA_DIRECT_TOPK_MAX ((size_t)4 << 10)

/* A call of one scorer block (the scorer's plan has grid 1: a context of at
 * most one tile, 64 keys) whose inputs take at most this many bytes reads
 * them where the host wrote them, in the pinned staging (mapped, the same
 * address under UVA): no upload copy, one stream operation less between the
 * host and the kernel (H100, 64-key score of 4 x 32 rows through the
 * socket: 45.2 -> 37.2 us p50). Wider grids upload: every block reads its
 * rows' q, and 132 blocks reading 32 KB each over PCIe took a 16,384-key
 * top-2048 from 84 to 177 us; the scorer's long-context paths also faulted
 * on inputs in host memory (cudaErrorLaunchFailure at 400,000 keys). */
#define FP4IDX__CUDA_ZERO_COPY_MAX ((size_t)64 << 10)

/* Full logits of at least FP4IDX__CUDA_PART_MIN bytes copied back into
 * host memory by a submitted call come in parts, FP4IDX__CUDA_PART_FIRST
 * and then each 4x the one before (at most FP4IDX__CUDA_PARTS, the last
 * taking the rest), each closed by an event: score_wait_part hands out the
 * first bytes while the rest is coming, so that a socket sends them
 * meanwhile (6.4 MB of logits take ~135 us over PCIe, ~900 us through a
 * Unix socket; the first 256 KiB are back in ~10 us). */
#define FP4IDX__CUDA_PART_MIN ((size_t)1 << 20)
#define FP4IDX__CUDA_PART_FIRST ((size_t)256 << 10)
#define FP4IDX__CUDA_PARTS 5

/* A timed score call records the device events (upload, kernels, download)
 * once in this many calls: each event costs device time between its
 * neighbours (64-key score 23.2 us with them, 19.5 without; 400,000 keys
 * top-2048 102.4 vs 92.1: fp4idx-bench-backend-call). The calls between
 * split their own host-measured time (start to end seen) in the shares
 * of the last evented call of their kind. */
#define FP4IDX__CUDA_EVENTS_EVERY 16

/* Pinned output blocks kept for reuse once freed. */
#define FP4IDX__CUDA_PINNED_KEEP ((size_t)512 << 20)

/* One staging set: inputs laid out identically on both sides. */
typedef struct fp4idx__staging_s {
  uint8_t *h;             /* pinned */
  size_t h_cap;
  uint8_t *d;             /* device */
  size_t d_cap;
  cudaEvent_t ev[4];      /* before upload, after upload, after kernels, end */
  cudaEvent_t up_done;    /* its upload on the side stream done (no timing) */
  int used;               /* 0: free (its end waited for); 1: ev[3]
                             recorded, wait on it before reuse; 2: a call
                             failed before recording it: sync */
  int pending;            /* a submitted score not yet waited for */
  int no_down;            /* its last score copied nothing back: no ev[2] */
  volatile uint32_t *h_done; /* mapped host word the stream writes after ev[3] */
  CUdeviceptr d_done;     /* its device address */
  uint32_t done_seq;      /* the value the last call writes there */
  int flagged;            /* the last call writes it (else: wait on ev[3]) */
  cudaEvent_t part_ev[FP4IDX__CUDA_PARTS]; /* after each part of a download
                             in parts ([0] timing: the first part's time) */
  uint64_t part_end[FP4IDX__CUDA_PARTS];   /* bytes back after each part */
  int n_parts;            /* parts of the last call's download (0: one copy) */
  int parts_seen;         /* of them, returned by score_wait_part */
  fp4idx_backend_timing_t *timing; /* where its timing goes (may be NULL) */
  int evented;            /* its last call recorded the timing events */
  int kind;               /* its last call: 0 full logits, 1 top-k */
  int checked;            /* its last call checks device inputs (the verdict) */
  volatile uint64_t *h_verdict; /* mapped host word: the check's verdict */
  unsigned long long *d_verdict; /* its device address */
  fp4idx_backend_input_error_t *input_error; /* where a failed check goes */
  double t_start;         /* host clock (us) when its last call began */
} fp4idx__staging_t;

typedef struct fp4idx__cuda_s {
  int device;
  int sms;
  fp4idx_cuda_scorer_t scorer; /* chosen once, from the device's capability */
  char name[128];
  char bus[32];           /* PCI bus id */
  int mps;                /* 1 MPS client, 0 not, -1 the driver does not say */
  int priority;           /* of the stream */
  cudaStream_t stream;
  cudaStream_t up_stream; /* large uploads (FP4IDX__CUDA_SIDE_UPLOAD_MIN) */
  uint8_t *pool;          /* device */
  int32_t log2p;
  fp4idx__staging_t set[2];
  int cur;                /* set of the next call */
  int32_t *d_flag;        /* device: non-finite flag of store */
  fp4idx__pinned_t *pinned;
  fp4idx__seqpages_t *seqpages;
  uint32_t *h_words;      /* pinned mapped: the sets' h_done, 64 bytes apart */
  int untimed_left;       /* timed calls before the next with events */
  double split[2][3];     /* upload / kernels / download share of the last
                             evented call of each kind (full logits, top-k) */
  int have_split[2];
  /* cuStreamWriteValue32 from the driver, or NULL: every wait on the event */
  CUresult (*write_value)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
} fp4idx__cuda_t;

/* How long a wait spins on the mapped word before it waits on the event
 * instead (a long call, or a failed one: a faulted stream never writes it,
 * and the event's wait returns the error). */
#define FP4IDX__CUDA_FLAG_SPIN_US 2000.0

#define CK(call, what)                                  \
  do {                                                  \
    rc = fp4idx__cuda_check((call), (what));            \
    if (rc) goto out;                                   \
  } while (0)

static size_t fp4idx__align(size_t x) { return (x + 255) & ~(size_t)255; }

/* The next staging set, free (its last call's end event waited for) and
 * with room for h_need / d_need bytes. */
static int fp4idx__stage_take(fp4idx__cuda_t *c, size_t h_need, size_t d_need,
                              fp4idx__staging_t **out) {
  int rc = FP4IDX_OK;
  fp4idx__staging_t *st = &c->set[c->cur];
  if (st->pending) return FP4IDX_EINVAL; /* more than FP4IDX_BACKEND_INFLIGHT out */
  c->cur ^= 1;
  if (st->used == 1) CK(cudaEventSynchronize(st->ev[3]), "staging: wait");
  if (st->used == 2) {
    CK(cudaStreamSynchronize(c->stream), "staging: wait after an error");
    CK(cudaStreamSynchronize(c->up_stream), "staging: wait after an error");
  }
  st->used = 2; /* in use until fp4idx__stage_finish records its end */
  if (h_need > st->h_cap) {
    size_t cap = h_need + h_need / 2;
    if (st->h) CK(cudaFreeHost(st->h), "free pinned staging");
    st->h = NULL;
    st->h_cap = 0;
    cudaError_t e = cudaMallocHost((void **)&st->h, cap);
    if (e != cudaSuccess) {
      fp4idx__cuda_check(e, "alloc pinned staging");
      return FP4IDX_ENOMEM;
    }
    st->h_cap = cap;
  }
  if (d_need > st->d_cap) {
    size_t cap = d_need + d_need / 2;
    if (st->d) CK(cudaFree(st->d), "free device scratch");
    st->d = NULL;
    st->d_cap = 0;
    cudaError_t e = cudaMalloc((void **)&st->d, cap);
    if (e != cudaSuccess) {
      fp4idx__cuda_check(e, "alloc device scratch");
      return e == cudaErrorMemoryAllocation ? FP4IDX_ENOMEM : FP4IDX_EDEVICE;
    }
    st->d_cap = cap;
  }
  *out = st;
out:
  return rc;
}

/* Records the end of st's call on the stream: ev[3], then (where the driver
 * has it) the write of st->done_seq into st's mapped word. */
static int fp4idx__stage_end(fp4idx__cuda_t *c, fp4idx__staging_t *st, const char *what) {
  int rc;
  CK(cudaEventRecord(st->ev[3], c->stream), what);
  st->used = 1;
  st->flagged = 0;
  if (c->write_value) {
    /* the default flags fence the stream's earlier writes (the results
     * copied back) before the word */
    if (c->write_value((CUstream)c->stream, st->d_done, st->done_seq + 1u,
                       CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS) {
      st->done_seq++;
      st->flagged = 1;
    } else {
      c->write_value = NULL; /* refused once: the events from now on */
    }
  }
out:
  return rc;
}

/* Waits for the call fp4idx__stage_end closed. A spin on the mapped word
 * sees the end as soon as it lands: 0.7-0.9 us sooner per round trip than
 * cudaEventSynchronize on the H200 (fp4idx-probe-cuda-api: upload +
 * kernel + download). Only a call that
 * wrote its word may skip the event: a
 * faulted stream writes nothing, so after FP4IDX__CUDA_FLAG_SPIN_US the
 * event's wait gives the error (and waits for a long call). */
static int fp4idx__stage_wait(fp4idx__staging_t *st, const char *what) {
  int rc = FP4IDX_OK;
  if (st->flagged) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 1;; i++) {
      if (*st->h_done == st->done_seq) {
        __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the results after the word */
        st->used = 0;
        return FP4IDX_OK;
      }
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      if ((i & 255u) == 0) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) * 1e6 + (double)(t.tv_nsec - t0.tv_nsec) / 1e3 >
            FP4IDX__CUDA_FLAG_SPIN_US)
          break;
      }
    }
  }
  CK(cudaEventSynchronize(st->ev[3]), what);
  st->used = 0; /* waited for: the next take needs no sync (~1.6 us) */
out:
  return rc;
}

/* The device time of st's last call into *t, up to event `end` (ev[3], or
 * the first part of a download in parts: score_wait_part), which has been
 * waited for. */
static int fp4idx__stage_timing(fp4idx__staging_t *st, cudaEvent_t end,
                                fp4idx_backend_timing_t *t) {
  int rc;
  float up = 0, k = 0, down = 0;
  /* The mapped word can land before the driver has seen the events done:
   * then wait on the last one, once. */
  cudaError_t e = cudaEventElapsedTime(&up, st->ev[0], st->ev[1]);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    CK(cudaEventSynchronize(end), "score: timing");
    e = cudaEventElapsedTime(&up, st->ev[0], st->ev[1]);
  }
  CK(e, "score: timing");
  if (st->no_down) {
    CK(cudaEventElapsedTime(&k, st->ev[1], end), "score: timing");
  } else {
    CK(cudaEventElapsedTime(&k, st->ev[1], st->ev[2]), "score: timing");
    CK(cudaEventElapsedTime(&down, st->ev[2], end), "score: timing");
  }
  t->timed = 1;
  t->upload_us = up * 1e3;
  t->kernels_us = k * 1e3;
  t->download_us = down * 1e3;
out:
  return rc;
}

static double fp4idx__host_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* The timing of st's last call into *t once its end (event `end`) has been
 * seen: from its events when it recorded them (and their shares kept for
 * its kind), else its host time from start to now split in the shares of
 * the last evented call of its kind (all kernels before there is one). */
static int fp4idx__call_timing(fp4idx__cuda_t *c, fp4idx__staging_t *st, cudaEvent_t end,
                               fp4idx_backend_timing_t *t) {
  if (st->evented) {
    int rc = fp4idx__stage_timing(st, end, t);
    const double all = t->upload_us + t->kernels_us + t->download_us;
    if (rc == FP4IDX_OK && all > 0) {
      c->split[st->kind][0] = t->upload_us / all;
      c->split[st->kind][1] = t->kernels_us / all;
      c->split[st->kind][2] = t->download_us / all;
      c->have_split[st->kind] = 1;
    }
    return rc;
  }
  const double all = fp4idx__host_us() - st->t_start;
  const double *f = c->split[st->kind];
  t->timed = 1;
  if (c->have_split[st->kind]) {
    t->upload_us = all * f[0];
    t->kernels_us = all * f[1];
    t->download_us = all * f[2];
  } else {
    t->upload_us = t->download_us = 0;
    t->kernels_us = all;
  }
  return FP4IDX_OK;
}

/* The verdict of st's last call once it has been waited for: FP4IDX_OK when
 * it checked no device inputs or they passed, else the failure's status
 * (and its place in st->input_error). */
static int fp4idx__stage_verdict(fp4idx__staging_t *st) {
  if (!st->checked) return FP4IDX_OK;
  fp4idx_backend_input_error_t e = {0, 0, 0};
  const int rc = fp4idx_cuda_check_verdict(*st->h_verdict, &e.seq, &e.tensor, &e.index);
  if (rc && st->input_error) *st->input_error = e;
  return rc;
}

/* Records the end of a call on `st` and waits for it. */
static int fp4idx__stage_finish(fp4idx__cuda_t *c, fp4idx__staging_t *st, const char *what) {
  int rc;
  if ((rc = fp4idx__stage_end(c, st, what))) return rc;
  return fp4idx__stage_wait(st, what);
}

static void fp4idx__cuda_destroy(fp4idx_backend_t *b) {
  if (!b) return;
  fp4idx__cuda_t *c = b->impl;
  if (c) {
    cudaSetDevice(c->device);
    if (c->stream) {
      fp4idx__seqpages_destroy(c->seqpages, c->stream);
      cudaStreamSynchronize(c->stream);
    }
    if (c->up_stream) cudaStreamSynchronize(c->up_stream);
    cudaFree(c->pool);
    for (int i = 0; i < 2; i++) {
      fp4idx__staging_t *st = &c->set[i];
      cudaFree(st->d);
      if (st->h) cudaFreeHost(st->h);
      for (int j = 0; j < 4; j++)
        if (st->ev[j]) cudaEventDestroy(st->ev[j]);
      for (int j = 0; j < FP4IDX__CUDA_PARTS; j++)
        if (st->part_ev[j]) cudaEventDestroy(st->part_ev[j]);
      if (st->up_done) cudaEventDestroy(st->up_done);
    }
    cudaFree(c->d_flag);
    if (c->h_words) cudaFreeHost(c->h_words);
    fp4idx__pinned_destroy(c->pinned);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->up_stream) cudaStreamDestroy(c->up_stream);
    free(c);
  }
  free(b);
}

static int fp4idx__cuda_describe(fp4idx_backend_t *b, fp4idx_backend_info_t *info) {
  if (!b || !info) return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  int rc;
  size_t fr = 0, tot = 0;
  memset(info, 0, sizeof *info);
  CK(cudaSetDevice(c->device), "set device");
  CK(cudaMemGetInfo(&fr, &tot), "mem info");
  snprintf(info->name, sizeof info->name, "cuda");
  snprintf(info->device, sizeof info->device, "%s", c->name);
  info->device_index = c->device;
  info->mem_total = tot;
  info->mem_free = fr;
  /* one launch fills the GPU: e.g. 64 requests of 4 x 32 rows at 32,768 keys */
  info->batch_work = (uint64_t)1 << 28;
  info->device_outputs = 1;
  info->device_inputs_max = FP4IDX_CUDA_PUBLISH_MAX;
  info->mps = c->mps;
  snprintf(info->pci_bus, sizeof info->pci_bus, "%s", c->bus);
out:
  return rc;
}

static int fp4idx__cuda_pool_create(fp4idx_backend_t *b, int64_t n_pages, int32_t page_size) {
  if (!b || n_pages < 1 || !fp4idx_page_size_valid(page_size)) return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  if (c->pool) return FP4IDX_EINVAL;
  int rc;
  const size_t bytes = (size_t)n_pages * (size_t)page_size * FP4IDX_SLOT_BYTES;
  CK(cudaSetDevice(c->device), "set device");
  cudaError_t e = cudaMalloc((void **)&c->pool, bytes);
  if (e != cudaSuccess) {
    fp4idx__cuda_check(e, "alloc page pool");
    c->pool = NULL;
    return e == cudaErrorMemoryAllocation ? FP4IDX_ENOMEM : FP4IDX_EDEVICE;
  }
  CK(cudaMemsetAsync(c->pool, 0, bytes, c->stream), "zero page pool");
  CK(cudaStreamSynchronize(c->stream), "zero page pool: sync");
  int32_t l = 0;
  while ((1 << l) < page_size) l++;
  c->log2p = l;
  b->n_pages = n_pages;
  b->page_size = page_size;
out:
  return rc;
}

static int fp4idx__slots_ok(const fp4idx_backend_t *b, const int64_t *slots, int64_t n) {
  const int64_t total = b->n_pages * b->page_size;
  for (int64_t i = 0; i < n; i++)
    if (slots[i] < 0 || slots[i] >= total) return 0;
  return 1;
}

/* The device address of host memory p when it is pinned and mapped
 * (cudaHostAlloc, cudaHostRegister: the same address under UVA), else NULL. */
static void *fp4idx__mapped(const void *p) {
  struct cudaPointerAttributes a;
  if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError(); /* not an error: pageable memory */
    return NULL;
  }
  return a.type == cudaMemoryTypeHost ? a.devicePointer : NULL;
}

static int fp4idx__cuda_store(fp4idx_backend_t *b, const void *keys, fp4idx_dtype_t dtype,
                              int64_t n, const int64_t *slots, fp4idx_rounding_t mode) {
  if (!b || n < 0 || (n && (!keys || !slots))) return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  if (!c->pool) return FP4IDX_EINVAL;
  if (dtype != FP4IDX_DTYPE_BF16 && dtype != FP4IDX_DTYPE_F32 && dtype != FP4IDX_DTYPE_FP4)
    return FP4IDX_EINVAL;
  if (mode != FP4IDX_ROUND_RNE && mode != FP4IDX_ROUND_THRESHOLD) return FP4IDX_EINVAL;
  if (n == 0) return FP4IDX_OK;
  if (!fp4idx__slots_ok(b, slots, n)) return FP4IDX_EINVAL;
  int rc;
  const size_t kb = (size_t)n * (dtype == FP4IDX_DTYPE_BF16 ? FP4IDX_HEAD_DIM * 2u
                                 : dtype == FP4IDX_DTYPE_F32 ? FP4IDX_HEAD_DIM * 4u
                                                             : FP4IDX_SLOT_BYTES);
  const size_t off_slots = fp4idx__align(kb), total = off_slots + (size_t)n * 8;
  CK(cudaSetDevice(c->device), "set device");
  /* Keys in pinned memory (a registered host region: bulk ingest) go to
   * the device by one DMA straight from there; only the slots pass
   * through the staging buffer. Pageable keys are copied into it first. */
  const int pinned = fp4idx__mapped(keys) != NULL;
  fp4idx__staging_t *st;
  if ((rc = fp4idx__stage_take(c, pinned ? (size_t)n * 8 : total, total, &st))) goto out;
  if (pinned) {
    memcpy(st->h, slots, (size_t)n * 8);
    CK(cudaMemcpyAsync(st->d, keys, kb, cudaMemcpyHostToDevice, c->stream), "store: upload");
    CK(cudaMemcpyAsync(st->d + off_slots, st->h, (size_t)n * 8, cudaMemcpyHostToDevice,
                       c->stream), "store: upload");
  } else {
    memcpy(st->h, keys, kb);
    memcpy(st->h + off_slots, slots, (size_t)n * 8);
    CK(cudaMemcpyAsync(st->d, st->h, total, cudaMemcpyHostToDevice, c->stream), "store: upload");
  }
  if (dtype == FP4IDX_DTYPE_FP4) {
    rc = fp4idx_cuda_store_packed_launch(c->pool, c->log2p, st->d, n,
                                         (const int64_t *)(st->d + off_slots), c->stream);
    if (rc) goto out;
    rc = fp4idx__stage_finish(c, st, "store: wait");
  } else {
    rc = fp4idx_cuda_store_launch(c->pool, c->log2p, st->d, dtype, n,
                                  (const int64_t *)(st->d + off_slots), mode, c->d_flag,
                                  c->stream);
    if (rc) goto out;
    /* the flag lands in the staging buffer, after the keys were read */
    CK(cudaMemcpyAsync(st->h, c->d_flag, sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream),
       "store: flag");
    if ((rc = fp4idx__stage_finish(c, st, "store: wait"))) goto out;
    int32_t flag;
    memcpy(&flag, st->h, sizeof flag);
    if (flag) rc = FP4IDX_ENONFINITE;
  }
out:
  return rc;
}

static int fp4idx__cuda_read(fp4idx_backend_t *b, const int64_t *slots, int64_t n, int dequant,
                             void *outp) {
  if (!b || n < 0 || (n && (!slots || !outp))) return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  if (!c->pool) return FP4IDX_EINVAL;
  if (n == 0) return FP4IDX_OK;
  if (!fp4idx__slots_ok(b, slots, n)) return FP4IDX_EINVAL;
  int rc;
  const size_t ob = (size_t)n * (dequant ? FP4IDX_HEAD_DIM * 4u : FP4IDX_SLOT_BYTES);
  const size_t off_out = fp4idx__align((size_t)n * 8);
  const size_t total = off_out + ob;
  CK(cudaSetDevice(c->device), "set device");
  fp4idx__staging_t *st;
  if ((rc = fp4idx__stage_take(c, (size_t)n * 8, total, &st))) goto out;
  memcpy(st->h, slots, (size_t)n * 8);
  CK(cudaMemcpyAsync(st->d, st->h, (size_t)n * 8, cudaMemcpyHostToDevice, c->stream),
     "read: upload");
  rc = fp4idx_cuda_read_launch(c->pool, c->log2p, (const int64_t *)st->d, n, dequant,
                               st->d + off_out, c->stream);
  if (rc) goto out;
  /* straight into the caller's buffer (pageable: the copy is synchronous) */
  CK(cudaMemcpyAsync(outp, st->d + off_out, ob, cudaMemcpyDeviceToHost, c->stream),
     "read: download");
  rc = fp4idx__stage_finish(c, st, "read: wait");
out:
  return rc;
}

/* 1 when no row of the batch sees any key (every visible count is 0). */
static int fp4idx__all_lens_zero(const fp4idx_backend_batch_t *bt) {
  for (int32_t i = 0; i < bt->n_seqs; i++) {
    if (bt->seqs[i].device_inputs) return 0; /* not read here; checked on the device */
    for (int32_t r = 0; r < bt->seqs[i].rows; r++)
      if (bt->seqs[i].lens[r] > 0) return 0;
  }
  return 1;
}

/* The result of such a batch, on the host at once (no upload, no launch):
 * every logit -inf; top-k: count 0, positions -1, logits -inf. */
static int fp4idx__score_nothing_visible(const fp4idx_backend_batch_t *bt) {
  size_t rows = 0, cells = 0;
  for (int32_t i = 0; i < bt->n_seqs; i++) {
    rows += (size_t)bt->seqs[i].rows;
    cells += (size_t)bt->seqs[i].rows * (size_t)bt->seqs[i].width;
  }
  if (bt->topk == 0) {
    for (size_t j = 0; j < cells; j++) bt->logits[j] = -INFINITY;
  } else {
    const size_t k = (size_t)bt->topk;
    for (size_t j = 0; j < rows; j++) {
      bt->topk_count[j] = 0;
      for (size_t e = 0; e < k; e++) {
        bt->topk_pos[j * k + e] = -1;
        bt->topk_val[j * k + e] = -INFINITY;
      }
    }
  }
  return FP4IDX_OK;
}

/* One copy. */
typedef struct fp4idx__copy_s {
  void *dst;
  const void *src;
  size_t bytes;
} fp4idx__copy_t;

/* What one score call enqueues, in order: ev[0], up, ev[1], kern[0..n_kern),
 * ev[2], down[0..n_down), ev[3]; a NULL event is left out. */
typedef struct fp4idx__score_ops_s {
  cudaEvent_t ev[4];
  fp4idx__copy_t up;                  /* host to device */
  fp4idx_cuda_launch_t kern[2];       /* scorer, top-k (cluster path) */
  int n_kern;
  fp4idx_cuda_launch_t publish;       /* device inputs: check, publish (func NULL: none) */
  int publish_done;                   /* it stores the caller's done word */
  fp4idx__copy_t down[3];             /* device to host */
  int n_down;
} fp4idx__score_ops_t;

/* A score call's layout: the inputs region (uploaded), then the outputs,
 * with the plans of both kernels. A resident page list is read where it is
 * on the device and takes no room here. */
typedef struct fp4idx__score_layout_s {
  int32_t *rows;
  int64_t *widths;
  fp4idx_cuda_work_t *works;
  size_t *o_pages;                 /* 5 per sequence: pages, q, w, lens, mask */
  const int32_t **dev_pages;       /* resident page lists (NULL: uploaded) */
  fp4idx_cuda_topk_row_t *trows_plan;
  fp4idx_cuda_score_params_t prm;
  fp4idx_cuda_topk_plan_t tp;
  int nw;
  size_t total_rows, total_out, tk_bytes, h_val, h_cnt;
  size_t o_descs, o_works, o_trows, in_bytes, o_logits, o_tpos, o_tval, o_tcnt, o_tws, all;
  int dev_out;                     /* outputs written by the kernels where they are */
  int checked;                     /* some inputs on the device: checked after the kernels */
  int publish_copy;                /* device outputs copied there by the check's kernel */
  int n_ins, n_copies;             /* its check entries and copies */
  size_t o_ins, o_copies;          /* where they lie in the inputs region */
  int zero_copy;                   /* inputs read from the pinned staging, no upload */
  int one_copy;                    /* top-k results in one download */
  float *o_dlogits;                /* full logits written in place (dev_out) */
  int32_t *o_dtpos, *o_dtcnt;      /* top-k results written in place (dev_out) */
  float *o_dtval;
} fp4idx__score_layout_t;

static void fp4idx__score_layout_free(fp4idx__score_layout_t *L) {
  free(L->trows_plan);
  free(L->o_pages);
  free(L->works);
  free(L->rows);
  free(L->widths);
  free(L->dev_pages);
}

/* Where each input goes and the scorer's plan. */
static int fp4idx__score_layout_inputs(fp4idx__cuda_t *c, int32_t P,
                                       const fp4idx_backend_batch_t *bt,
                                       fp4idx__score_layout_t *L) {
  const int32_t H = bt->heads, ns = bt->n_seqs;
  L->rows = malloc(sizeof *L->rows * (size_t)ns);
  L->widths = malloc(sizeof *L->widths * (size_t)ns);
  L->dev_pages = calloc((size_t)ns, sizeof *L->dev_pages);
  L->o_pages = malloc(sizeof *L->o_pages * (size_t)ns * 5);
  if (!L->rows || !L->widths || !L->dev_pages || !L->o_pages) return FP4IDX_ENOMEM;
  size_t off = 0;
  for (int32_t i = 0; i < ns; i++) {
    const fp4idx_backend_seq_t *s = &bt->seqs[i];
    const int64_t np = (s->width + P - 1) / P; /* pages the scorer reads */
    L->rows[i] = s->rows;
    L->widths[i] = s->width;
    if (s->resident && np) L->dev_pages[i] = fp4idx__seqpages_get(c->seqpages, s->seq, np);
    size_t *o = &L->o_pages[5 * i];
    o[0] = off;
    if (!L->dev_pages[i]) off = fp4idx__align(off + (size_t)np * 4);
    /* q, w, lens: staged, or read where they are on the device (checked
     * there after the kernels, check_publish.cu) */
    const int dev = s->device_inputs;
    const size_t qb = (size_t)s->rows * H * FP4IDX_HEAD_DIM * 2u, wb = (size_t)s->rows * H * 2,
                 lb = (size_t)s->rows * 4;
    o[1] = off; if (!(dev & FP4IDX_BACKEND_DEV_Q)) off = fp4idx__align(off + qb);
    o[2] = off; if (!(dev & FP4IDX_BACKEND_DEV_W)) off = fp4idx__align(off + wb);
    o[3] = off; if (!(dev & FP4IDX_BACKEND_DEV_LENS)) off = fp4idx__align(off + lb);
    o[4] = off;
    L->n_ins += !!(dev & FP4IDX_BACKEND_DEV_Q) + !!(dev & FP4IDX_BACKEND_DEV_W) +
                !!(dev & FP4IDX_BACKEND_DEV_LENS);
    if (s->mask) off = fp4idx__align(off + (size_t)s->rows * (size_t)s->width);
    L->total_rows += (size_t)s->rows;
    L->total_out += (size_t)s->rows * (size_t)s->width;
  }
  if (L->n_ins) {
    L->checked = 1;
    L->o_ins = off;
    off = fp4idx__align(off + sizeof(fp4idx_cuda_check_in_t) * (size_t)L->n_ins);
    L->o_copies = off;
    off = fp4idx__align(off + sizeof(fp4idx_cuda_copy_t) * 3);
  }
  const int32_t max_works = fp4idx_cuda_score_max_works(H, ns, L->rows);
  L->works = malloc(sizeof *L->works * (size_t)(max_works > 0 ? max_works : 1));
  if (!L->works) return FP4IDX_ENOMEM;
  L->nw = fp4idx_cuda_score_plan(c->scorer, H, ns, L->rows, L->widths, c->sms, L->works,
                                 max_works, &L->prm);
  if (L->nw < 0) return L->nw;
  L->o_descs = off; off = fp4idx__align(off + sizeof(fp4idx_cuda_seq_t) * (size_t)ns);
  L->o_works = off; off = fp4idx__align(off + sizeof(fp4idx_cuda_work_t) * (size_t)(L->nw ? L->nw : 1));
  L->o_trows = off;
  if (bt->topk) {
    /* Planned on a host copy (widths in, chunk0 out); logits pointers come later. */
    L->trows_plan = malloc(sizeof *L->trows_plan * (L->total_rows ? L->total_rows : 1));
    if (!L->trows_plan) return FP4IDX_ENOMEM;
    size_t ra = 0;
    for (int32_t i = 0; i < ns; i++)
      for (int32_t r = 0; r < bt->seqs[i].rows; r++) L->trows_plan[ra++].width = bt->seqs[i].width;
    int rc = fp4idx_cuda_topk_plan(L->trows_plan, (int32_t)L->total_rows, bt->topk, &L->tp);
    if (rc) return rc;
    off = fp4idx__align(off + sizeof(fp4idx_cuda_topk_row_t) * L->total_rows);
  }
  L->in_bytes = off;
  return FP4IDX_OK;
}

/* Where each output goes: in the scratch, except those the caller has on
 * the device (or small full logits in mapped host memory,
 * FP4IDX__CUDA_DIRECT_MAX), written by the kernels straight there. */
static int fp4idx__score_layout_outputs(const fp4idx_backend_batch_t *bt,
                                        fp4idx__score_layout_t *L) {
  size_t off = L->in_bytes;
  const size_t kk = (size_t)bt->topk;
  /* Device outputs of a checked call: written to the scratch, copied to
   * the caller's only if its inputs pass (check_publish.cu). */
  L->dev_out = bt->outputs_on_device && !L->checked;
  L->publish_copy = bt->outputs_on_device && L->checked;
  if (L->publish_copy &&
      (kk ? L->total_rows * (kk * 8 + 4) : L->total_out * 4) > FP4IDX_CUDA_PUBLISH_MAX)
    return FP4IDX_EINVAL; /* info.device_inputs_max */
  L->o_dlogits = bt->logits;
  L->o_dtpos = bt->topk_pos;
  L->o_dtval = bt->topk_val;
  L->o_dtcnt = bt->topk_count;
  /* Full logits store whole rows (16k full logits save ~3.6 us); top-k
   * results only when small (FP4IDX__CUDA_DIRECT_TOPK_MAX). */
  if (!bt->outputs_on_device && !bt->topk && L->total_out * 4 <= FP4IDX__CUDA_DIRECT_MAX) {
    L->o_dlogits = fp4idx__mapped(bt->logits);
    L->dev_out = L->o_dlogits != NULL;
  }
  if (!bt->outputs_on_device && bt->topk &&
      L->total_rows * (kk * 8 + 4) <= FP4IDX__CUDA_DIRECT_TOPK_MAX) {
    L->o_dtpos = fp4idx__mapped(bt->topk_pos);
    L->o_dtval = fp4idx__mapped(bt->topk_val);
    L->o_dtcnt = fp4idx__mapped(bt->topk_count);
    L->dev_out = L->o_dtpos && L->o_dtval && L->o_dtcnt;
  }
  L->o_logits = off;
  if (!(L->dev_out && !bt->topk)) off = fp4idx__align(off + L->total_out * 4);
  /* Top-k results laid out as the caller's buffer when it is one
   * (topk_one_buffer): one download instead of three (each copy costs a
   * DMA's latency, ~4 us). */
  L->tk_bytes = L->total_rows * kk * 4;
  L->h_val = bt->topk ? (size_t)((const uint8_t *)bt->topk_val - (const uint8_t *)bt->topk_pos) : 0;
  L->h_cnt = bt->topk ? (size_t)((const uint8_t *)bt->topk_count - (const uint8_t *)bt->topk_pos) : 0;
  L->one_copy = bt->topk && !bt->outputs_on_device && !L->dev_out && bt->topk_one_buffer &&
                L->h_val >= L->tk_bytes &&
                L->h_cnt >= L->h_val + L->tk_bytes && L->h_val % 4 == 0 && L->h_cnt % 4 == 0 &&
                L->h_cnt <= 2 * L->tk_bytes + 512;
  L->o_tpos = off;
  if (L->one_copy) off += L->h_val;
  else if (!L->dev_out) off = fp4idx__align(off + L->tk_bytes);
  L->o_tval = off;
  if (L->one_copy) off += L->h_cnt - L->h_val;
  else if (!L->dev_out) off = fp4idx__align(off + L->tk_bytes);
  L->o_tcnt = off;
  if (!L->dev_out) off = fp4idx__align(off + L->total_rows * 4);
  L->o_tws = off;
  off = fp4idx__align(off + L->tp.ws_bytes);
  L->all = off;
  return FP4IDX_OK;
}

/* Where the kernels read the inputs: the device scratch (uploaded) or the
 * pinned staging itself (zero_copy). */
static uint8_t *fp4idx__score_in(const fp4idx__score_layout_t *L, const fp4idx__staging_t *st) {
  return L->zero_copy ? st->h : st->d;
}

/* The staging set's host side filled with the inputs, the sequences'
 * descriptors and the top-k rows; the scorer's params pointed at the
 * device side. */
static void fp4idx__score_fill(fp4idx__cuda_t *c, int32_t P, const fp4idx_backend_batch_t *bt,
                               fp4idx__score_layout_t *L, fp4idx__staging_t *st) {
  const int32_t H = bt->heads;
  uint8_t *h = st->h, *d = st->d;
  const uint8_t *in = fp4idx__score_in(L, st);
  float *d_logits = L->dev_out && !bt->topk ? L->o_dlogits : (float *)(d + L->o_logits);
  fp4idx_cuda_seq_t *descs = (fp4idx_cuda_seq_t *)(h + L->o_descs);
  fp4idx_cuda_topk_row_t *trows = (fp4idx_cuda_topk_row_t *)(h + L->o_trows);
  size_t out_at = 0, row_at = 0;
  int n_ins = 0;
  for (int32_t i = 0; i < bt->n_seqs; i++) {
    const fp4idx_backend_seq_t *s = &bt->seqs[i];
    const size_t *o = &L->o_pages[5 * i];
    const int64_t np = (s->width + P - 1) / P;
    const int dev = s->device_inputs;
    const size_t nq = (size_t)s->rows * H * FP4IDX_HEAD_DIM, nw = (size_t)s->rows * H;
    if (np && !L->dev_pages[i]) memcpy(h + o[0], s->pages, (size_t)np * 4);
    if (!(dev & FP4IDX_BACKEND_DEV_Q)) memcpy(h + o[1], s->q, nq * 2u);
    if (!(dev & FP4IDX_BACKEND_DEV_W)) memcpy(h + o[2], s->w, nw * 2u);
    if (!(dev & FP4IDX_BACKEND_DEV_LENS)) memcpy(h + o[3], s->lens, (size_t)s->rows * 4);
    if (s->mask) memcpy(h + o[4], s->mask, (size_t)s->rows * (size_t)s->width);
    fp4idx_cuda_seq_t *q = &descs[i];
    memset(q, 0, sizeof *q);
    q->pages = L->dev_pages[i] ? L->dev_pages[i] : (const int32_t *)(in + o[0]);
    q->q = dev & FP4IDX_BACKEND_DEV_Q ? (const uint16_t *)s->q : (const uint16_t *)(in + o[1]);
    q->w = dev & FP4IDX_BACKEND_DEV_W ? (const uint16_t *)s->w : (const uint16_t *)(in + o[2]);
    q->lens = dev & FP4IDX_BACKEND_DEV_LENS ? s->lens : (const int32_t *)(in + o[3]);
    if (dev) {
      fp4idx_cuda_check_in_t *ck = (fp4idx_cuda_check_in_t *)(h + L->o_ins) + n_ins;
      if (dev & FP4IDX_BACKEND_DEV_Q)
        *ck++ = (fp4idx_cuda_check_in_t){s->q, nq, i, FP4IDX_CUDA_CHECK_Q, 0, 0};
      if (dev & FP4IDX_BACKEND_DEV_W)
        *ck++ = (fp4idx_cuda_check_in_t){s->w, nw, i, FP4IDX_CUDA_CHECK_W, 0, 0};
      if (dev & FP4IDX_BACKEND_DEV_LENS)
        *ck++ = (fp4idx_cuda_check_in_t){s->lens, (uint64_t)s->rows, i, FP4IDX_CUDA_CHECK_LENS,
                                         (int32_t)s->width, 0};
      n_ins = (int)(ck - (fp4idx_cuda_check_in_t *)(h + L->o_ins));
    }
    q->mask = s->mask ? (const uint8_t *)(in + o[4]) : NULL;
    q->out = d_logits + out_at;
    q->width = s->width;
    q->rows = s->rows;
    if (bt->topk)
      for (int32_t r = 0; r < s->rows; r++) {
        trows[row_at] = L->trows_plan[row_at];
        trows[row_at].logits = q->out + (size_t)r * (size_t)s->width;
        row_at++;
      }
    out_at += (size_t)s->rows * (size_t)s->width;
  }
  memcpy(h + L->o_works, L->works, sizeof *L->works * (size_t)L->nw);
  if (L->publish_copy) { /* the scratch's outputs to the caller's, if the check passes */
    fp4idx_cuda_copy_t *cp = (fp4idx_cuda_copy_t *)(h + L->o_copies);
    const size_t kk = (size_t)bt->topk;
    if (kk) {
      cp[0] = (fp4idx_cuda_copy_t){bt->topk_pos, d + L->o_tpos, L->total_rows * kk * 4};
      cp[1] = (fp4idx_cuda_copy_t){bt->topk_val, d + L->o_tval, L->total_rows * kk * 4};
      cp[2] = (fp4idx_cuda_copy_t){bt->topk_count, d + L->o_tcnt, L->total_rows * 4};
      L->n_copies = 3;
    } else {
      cp[0] = (fp4idx_cuda_copy_t){bt->logits, d + L->o_logits, L->total_out * 4};
      L->n_copies = L->total_out ? 1 : 0;
    }
  }
  L->prm.pool = c->pool;
  L->prm.seqs = (const fp4idx_cuda_seq_t *)(in + L->o_descs);
  L->prm.works = (const fp4idx_cuda_work_t *)(in + L->o_works);
  L->prm.log2_page = c->log2p;
  fp4idx_cuda_score_use_seq0(&L->prm, L->works, descs);
}

/* The call's device work as data: the upload, the scorer
 * and the top-k (when it is one kernel), the downloads straight into the
 * caller's arrays. Without a download the end event closes the kernels
 * (each timing event costs ~1.4 us of host time: fp4idx-probe-cuda-api).
 * *chunked: the top-k is the chunked path's several operations, enqueued
 * by fp4idx__score_enqueue itself. */
static int fp4idx__score_ops(const fp4idx__cuda_t *c, const fp4idx_backend_batch_t *bt,
                             const fp4idx__score_layout_t *L, fp4idx__staging_t *st,
                             fp4idx__score_ops_t *ops, int *chunked) {
  uint8_t *d = st->d;
  int rc;
  memset(ops, 0, sizeof *ops);
  *chunked = 0;
  /* The timing events only on an evented call (FP4IDX__CUDA_EVENTS_EVERY).
   * ev[3] always (fp4idx__stage_end): the end a wait falls back on and the
   * set's reuse waits for. */
  if (st->evented) {
    ops->ev[0] = st->ev[0];
    ops->ev[1] = st->ev[1];
  }
  ops->up = (fp4idx__copy_t){d, st->h, L->zero_copy ? 0 : L->in_bytes};
  if ((rc = fp4idx_cuda_score_describe(&L->prm, &ops->kern[0]))) return rc;
  if (ops->kern[0].func) ops->n_kern = 1;
  const size_t kk = (size_t)bt->topk;
  int32_t *d_tpos = L->dev_out ? L->o_dtpos : (int32_t *)(d + L->o_tpos);
  float *d_tval = L->dev_out ? L->o_dtval : (float *)(d + L->o_tval);
  int32_t *d_tcnt = L->dev_out ? L->o_dtcnt : (int32_t *)(d + L->o_tcnt);
  if (bt->topk) {
    rc = fp4idx_cuda_topk_describe(&L->tp,
                                   (const fp4idx_cuda_topk_row_t *)(fp4idx__score_in(L, st) +
                                                                    L->o_trows),
                                   d_tpos, d_tval, d_tcnt, &ops->kern[ops->n_kern]);
    if (rc == FP4IDX_ENODEV) *chunked = 1;
    else if (rc) return rc;
    else ops->n_kern++;
  }
  if (L->checked) {
    /* the last kernel: the check of the device inputs, the outputs
     * published, the done word stored by it (fp4idx__score_enqueue) */
    const uint8_t *in = fp4idx__score_in(L, st);
    fp4idx_cuda_publish_params_t pp = {
        .ins = (const fp4idx_cuda_check_in_t *)(in + L->o_ins),
        .copies = (const fp4idx_cuda_copy_t *)(in + L->o_copies),
        .n_ins = L->n_ins, .n_copies = L->n_copies, .verdict = st->d_verdict,
        .done = NULL, .done_value = bt->done_value};
    void *done_dev = NULL;
    if (bt->done_word && cudaHostGetDevicePointer(&done_dev, (void *)bt->done_word, 0) == cudaSuccess)
      pp.done = (uint32_t *)done_dev;
    else
      (void)cudaGetLastError(); /* not mapped: the caller stores it */
    /* with PDL where the sm_90 kernels run (the wgmma scorer's device):
     * the check overlaps the kernel before it */
    if ((rc = fp4idx_cuda_publish_describe(&pp, c->scorer == FP4IDX_CUDA_SCORER_WGMMA,
                                           &ops->publish)))
      return rc;
    ops->publish_done = pp.done != NULL;
  }
  st->no_down = L->dev_out || L->publish_copy || (!bt->topk && !L->total_out);
  if (!st->no_down && st->evented) ops->ev[2] = st->ev[2];
  if (L->dev_out || L->publish_copy) {
    /* already where the caller wants them (or copied there by the publish) */
  } else if (L->one_copy) {
    ops->down[ops->n_down++] = (fp4idx__copy_t){bt->topk_pos, d_tpos, L->h_cnt + L->total_rows * 4};
  } else if (bt->topk) {
    ops->down[ops->n_down++] = (fp4idx__copy_t){bt->topk_pos, d_tpos, L->total_rows * kk * 4};
    ops->down[ops->n_down++] = (fp4idx__copy_t){bt->topk_val, d_tval, L->total_rows * kk * 4};
    ops->down[ops->n_down++] = (fp4idx__copy_t){bt->topk_count, d_tcnt, L->total_rows * 4};
  } else if (L->total_out) {
    ops->down[ops->n_down++] =
        (fp4idx__copy_t){bt->logits, d + L->o_logits, L->total_out * 4};
  }
  return FP4IDX_OK;
}

/* Full logits copied back in parts (FP4IDX__CUDA_PART_MIN), each closed by
 * an event: score_wait_part hands them out while the rest is coming. */
static int fp4idx__score_download_parts(fp4idx__cuda_t *c, const fp4idx__copy_t *down,
                                        fp4idx__staging_t *st) {
  int rc = FP4IDX_OK;
  size_t at = 0, len = FP4IDX__CUDA_PART_FIRST;
  while (at < down->bytes) {
    size_t n = st->n_parts == FP4IDX__CUDA_PARTS - 1 || down->bytes - at < len ? down->bytes - at
                                                                              : len;
    CK(cudaMemcpyAsync((uint8_t *)down->dst + at, (const uint8_t *)down->src + at, n,
                       cudaMemcpyDeviceToHost, c->stream), "score: download");
    at += n;
    CK(cudaEventRecord(st->part_ev[st->n_parts], c->stream), "score: event");
    st->part_end[st->n_parts++] = at;
    len *= 4;
  }
out:
  return rc;
}

/* The caller's done word (fp4idx_backend_batch_t.done_word), stored by the
 * stream after the outputs where the driver has cuStreamWriteValue32 and
 * the word is mapped; else left to the caller (*done_written stays 0). */
static void fp4idx__score_done_word(fp4idx__cuda_t *c, const fp4idx_backend_batch_t *bt) {
  void *dev = NULL;
  if (!c->write_value || cudaHostGetDevicePointer(&dev, (void *)bt->done_word, 0) != cudaSuccess) {
    (void)cudaGetLastError(); /* not mapped: the caller stores it */
    return;
  }
  /* the default flags fence the outputs before the word; refused: the
   * caller stores it once the call is seen done */
  *bt->done_written = c->write_value((CUstream)c->stream, (CUdeviceptr)(uintptr_t)dev,
                                     bt->done_value, CU_STREAM_WRITE_VALUE_DEFAULT) ==
                      CUDA_SUCCESS;
}

/* Enqueues the call op by op: events, upload, the kernels (and the chunked
 * top-k's several operations), the downloads (in parts: `parts`), then the
 * end (fp4idx__stage_end). */
static int fp4idx__score_enqueue(fp4idx__cuda_t *c, const fp4idx_backend_batch_t *bt,
                                 const fp4idx__score_layout_t *L, fp4idx__staging_t *st,
                                 const fp4idx__score_ops_t *ops, int chunked, int parts) {
  int rc = FP4IDX_OK;
  /* a large upload on the side stream, the kernels after it by its event */
  const int side = ops->up.bytes >= FP4IDX__CUDA_SIDE_UPLOAD_MIN;
  cudaStream_t us = side ? c->up_stream : c->stream;
  if (ops->ev[0]) CK(cudaEventRecord(ops->ev[0], us), "score: event");
  if (ops->up.bytes)
    CK(cudaMemcpyAsync(ops->up.dst, ops->up.src, ops->up.bytes, cudaMemcpyHostToDevice, us),
       "score: upload");
  if (ops->ev[1]) CK(cudaEventRecord(ops->ev[1], us), "score: event");
  if (side) {
    CK(cudaEventRecord(st->up_done, us), "score: event");
    CK(cudaStreamWaitEvent(c->stream, st->up_done, 0), "score: wait for the upload");
  }
  for (int i = 0; i < ops->n_kern; i++)
    if ((rc = fp4idx_cuda_launch_run(&ops->kern[i], c->stream))) goto out;
  if (chunked) {
    uint8_t *d = st->d;
    rc = fp4idx_cuda_topk_launch(&L->tp,
                                 (const fp4idx_cuda_topk_row_t *)(fp4idx__score_in(L, st) +
                                                                  L->o_trows),
                                 d + L->o_tws,
                                 L->dev_out ? L->o_dtpos : (int32_t *)(d + L->o_tpos),
                                 L->dev_out ? L->o_dtval : (float *)(d + L->o_tval),
                                 L->dev_out ? L->o_dtcnt : (int32_t *)(d + L->o_tcnt),
                                 c->stream);
    if (rc) goto out;
  }
  if (ops->publish.func) {
    if ((rc = fp4idx_cuda_launch_run(&ops->publish, c->stream))) goto out;
    if (bt->done_word) *bt->done_written = ops->publish_done;
  }
  if (ops->ev[2]) CK(cudaEventRecord(ops->ev[2], c->stream), "score: event");
  if (parts) {
    if ((rc = fp4idx__score_download_parts(c, &ops->down[0], st))) goto out;
  } else {
    for (int i = 0; i < ops->n_down; i++)
      CK(cudaMemcpyAsync(ops->down[i].dst, ops->down[i].src, ops->down[i].bytes,
                         cudaMemcpyDeviceToHost, c->stream), "score: download");
  }
  if (bt->done_word && !L->checked) fp4idx__score_done_word(c, bt);
  rc = fp4idx__stage_end(c, st, "score: event");
out:
  return rc;
}

/* Score, or with stage != NULL only upload the inputs and plan the launch
 * (the benchmark captures the launch itself in a CUDA graph). With ticket
 * != NULL the call is only queued (score_submit): *ticket = its staging
 * set, or -1 when it finished without the device (nothing visible). */
static int fp4idx__cuda_score_impl(fp4idx_backend_t *b, const fp4idx_backend_batch_t *bt,
                                   int *ticket) {
  if (ticket) *ticket = -1;
  if (!b || !((fp4idx__cuda_t *)b->impl)->pool) return FP4IDX_EINVAL;
  int rc = fp4idx_backend_check_score(b, bt);
  if (rc != FP4IDX_OK) return rc;
  if (bt->done_word) *bt->done_written = 0; /* until the stream takes it on */
  fp4idx__cuda_t *c = b->impl;
  if (bt->timing) memset(bt->timing, 0, sizeof *bt->timing);
  if (bt->n_seqs == 0) return FP4IDX_OK;
  /* (device outputs: the kernels write the same -inf / -1 themselves) */
  if (!bt->outputs_on_device && fp4idx__all_lens_zero(bt))
    return fp4idx__score_nothing_visible(bt);
  fp4idx__score_layout_t L;
  memset(&L, 0, sizeof L);
  CK(cudaSetDevice(c->device), "set device");
  if ((rc = fp4idx__score_layout_inputs(c, b->page_size, bt, &L))) goto out;
  if ((rc = fp4idx__score_layout_outputs(bt, &L))) goto out;
  /* Host side: the inputs only (results go straight to the caller; the
   * top-k workspace stays on the device). */
  fp4idx__staging_t *st;
  if ((rc = fp4idx__stage_take(c, L.in_bytes, L.all, &st))) goto out;
  st->n_parts = 0;
  st->parts_seen = 0;
  st->checked = L.checked;
  st->input_error = bt->input_error;
  L.zero_copy = L.prm.grid == 1 && L.in_bytes <= FP4IDX__CUDA_ZERO_COPY_MAX;
  fp4idx__score_fill(c, b->page_size, bt, &L, st);
  fp4idx__score_ops_t ops;
  int chunked;
  st->kind = bt->topk != 0;
  st->evented = 0;
  if (bt->timing) {
    st->t_start = fp4idx__host_us();
    if (c->untimed_left-- <= 0) {
      st->evented = 1;
      c->untimed_left = FP4IDX__CUDA_EVENTS_EVERY - 1;
    }
  }
  if ((rc = fp4idx__score_ops(c, bt, &L, st, &ops, &chunked))) goto out;
  /* (a checked call's outputs are the caller's only once the whole call
   * has passed: no parts) */
  const int parts = ticket && !bt->topk && !L.dev_out && !L.checked &&
                    L.total_out * 4 >= FP4IDX__CUDA_PART_MIN;
  if ((rc = fp4idx__score_enqueue(c, bt, &L, st, &ops, chunked, parts))) goto out;
  if (ticket) {
    /* queued: fp4idx__cuda_score_wait finishes it */
    st->pending = 1;
    st->timing = bt->timing;
    *ticket = (int)(st - c->set);
    goto out;
  }
  if ((rc = fp4idx__stage_wait(st, "score: wait"))) goto out;
  if (bt->timing) rc = fp4idx__call_timing(c, st, st->ev[3], bt->timing);
  if (rc == FP4IDX_OK) rc = fp4idx__stage_verdict(st);
out:
  fp4idx__score_layout_free(&L);
  return rc;
}

static int fp4idx__cuda_score(fp4idx_backend_t *b, const fp4idx_backend_batch_t *bt) {
  return fp4idx__cuda_score_impl(b, bt, NULL);
}

static int fp4idx__cuda_score_submit(fp4idx_backend_t *b, const fp4idx_backend_batch_t *bt,
                                     int *ticket) {
  if (!ticket) return FP4IDX_EINVAL;
  return fp4idx__cuda_score_impl(b, bt, ticket);
}

static int fp4idx__cuda_score_wait(fp4idx_backend_t *b, int ticket) {
  if (!b || ticket < 0 || ticket > 1) return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  fp4idx__staging_t *st = &c->set[ticket];
  if (!st->pending) return FP4IDX_EINVAL;
  st->pending = 0;
  int rc = fp4idx__stage_wait(st, "score: wait");
  if (rc == FP4IDX_OK && st->timing) rc = fp4idx__call_timing(c, st, st->ev[3], st->timing);
  if (rc == FP4IDX_OK) rc = fp4idx__stage_verdict(st);
  return rc;
}

static int fp4idx__cuda_score_wait_part(fp4idx_backend_t *b, int ticket, uint64_t *ready) {
  if (!b || !ready || ticket < 0 || ticket > 1) return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  fp4idx__staging_t *st = &c->set[ticket];
  if (!st->pending) return FP4IDX_EINVAL;
  int rc = FP4IDX_OK;
  if (st->parts_seen >= st->n_parts) {
    /* one piece (or every part handed out): the whole call */
    if ((rc = fp4idx__stage_wait(st, "score: wait"))) return rc;
    if ((rc = fp4idx__stage_verdict(st))) return rc;
    *ready = UINT64_MAX;
    return FP4IDX_OK;
  }
  const int i = st->parts_seen;
  CK(cudaEventSynchronize(st->part_ev[i]), "score: wait for a part");
  if (i == 0 && st->timing &&
      (rc = fp4idx__call_timing(c, st, st->part_ev[0], st->timing)))
    goto out;
  st->parts_seen++;
  *ready = st->parts_seen == st->n_parts ? UINT64_MAX : st->part_end[i];
out:
  return rc;
}

static int fp4idx__cuda_pages_io(fp4idx_backend_t *b, int64_t first, int64_t count, void *host,
                                 int to_host) {
  if (!b || first < 0 || count < 0 || first + count > b->n_pages || (count && !host))
    return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  if (!c->pool) return FP4IDX_EINVAL;
  int rc;
  const size_t pb = (size_t)b->page_size * FP4IDX_SLOT_BYTES;
  uint8_t *dev = c->pool + (size_t)first * pb;
  CK(cudaSetDevice(c->device), "set device");
  CK(cudaStreamSynchronize(c->stream), "pages: sync");
  if (to_host) CK(cudaMemcpy(host, dev, (size_t)count * pb, cudaMemcpyDeviceToHost), "pages: read");
  else CK(cudaMemcpy(dev, host, (size_t)count * pb, cudaMemcpyHostToDevice), "pages: write");
out:
  return rc;
}

static int fp4idx__cuda_read_pages(fp4idx_backend_t *b, int64_t first, int64_t count, void *out) {
  return fp4idx__cuda_pages_io(b, first, count, out, 1);
}

static int fp4idx__cuda_write_pages(fp4idx_backend_t *b, int64_t first, int64_t count,
                                    const void *in) {
  return fp4idx__cuda_pages_io(b, first, count, (void *)in, 0);
}

static int fp4idx__cuda_seq_pages_update(fp4idx_backend_t *b, uint64_t seq,
                                         const int32_t *pages, int64_t n_pages,
                                         int64_t first) {
  if (!b || n_pages < 0 || (n_pages && !pages)) return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  int rc;
  CK(cudaSetDevice(c->device), "set device");
  rc = fp4idx__seqpages_update(c->seqpages, c->stream, seq, pages, n_pages, first);
out:
  return rc;
}

/* Device-to-device on the backend's stream, then one sync (the caller stores
 * into the copy next, and a later store on the same stream would order after
 * it anyway; the sync makes a copy error this call's error). */
static int fp4idx__cuda_copy_pages(fp4idx_backend_t *b, int64_t from, int64_t to,
                                   int64_t count) {
  if (!b || !((fp4idx__cuda_t *)b->impl)->pool) return FP4IDX_EINVAL;
  int rc = fp4idx_backend_check_copy(b, from, to, count);
  if (rc != FP4IDX_OK || count == 0) return rc;
  fp4idx__cuda_t *c = b->impl;
  const size_t pb = (size_t)b->page_size * FP4IDX_SLOT_BYTES;
  CK(cudaSetDevice(c->device), "set device");
  CK(cudaMemcpyAsync(c->pool + (size_t)to * pb, c->pool + (size_t)from * pb,
                     (size_t)count * pb, cudaMemcpyDeviceToDevice, c->stream),
     "copy pages");
  CK(cudaStreamSynchronize(c->stream), "copy pages: sync");
out:
  return rc;
}

/* Any thread (the daemon frees on its event loop): each call sets this
 * backend's device first, so the runtime never starts a context elsewhere. */
static int fp4idx__cuda_host_alloc(fp4idx_backend_t *b, size_t bytes, void **out) {
  if (!b || !out) return FP4IDX_EINVAL;
  fp4idx__cuda_t *c = b->impl;
  if (fp4idx__cuda_check(cudaSetDevice(c->device), "set device")) return FP4IDX_EDEVICE;
  return fp4idx__pinned_alloc(c->pinned, bytes, out);
}

static void fp4idx__cuda_host_free(fp4idx_backend_t *b, void *p) {
  if (!b || !p) return;
  fp4idx__cuda_t *c = b->impl;
  cudaSetDevice(c->device);
  fp4idx__pinned_free(c->pinned, p);
}

static const fp4idx_backend_ops_t fp4idx__cuda_ops = {
    .destroy = fp4idx__cuda_destroy,
    .describe = fp4idx__cuda_describe,
    .pool_create = fp4idx__cuda_pool_create,
    .store = fp4idx__cuda_store,
    .read = fp4idx__cuda_read,
    .score = fp4idx__cuda_score,
    .read_pages = fp4idx__cuda_read_pages,
    .write_pages = fp4idx__cuda_write_pages,
    .seq_pages_update = fp4idx__cuda_seq_pages_update,
    .host_alloc = fp4idx__cuda_host_alloc,
    .host_free = fp4idx__cuda_host_free,
    .copy_pages = fp4idx__cuda_copy_pages,
    .score_submit = fp4idx__cuda_score_submit,
    .score_wait = fp4idx__cuda_score_wait,
    .score_wait_part = fp4idx__cuda_score_wait_part,
};

int fp4idx_backend_cuda_create(fp4idx_backend_t **out, int device) {
  if (!out) return FP4IDX_EINVAL;
  *out = NULL;
  int n = 0, rc = FP4IDX_OK;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1 || device < 0 || device >= n) {
    cudaGetLastError(); /* clear a sticky "no device" error */
    return FP4IDX_ENODEV;
  }
  fp4idx_backend_t *b = calloc(1, sizeof *b);
  fp4idx__cuda_t *c = calloc(1, sizeof *c);
  if (!b || !c) { free(b); free(c); return FP4IDX_ENOMEM; }
  b->ops = &fp4idx__cuda_ops;
  b->impl = c;
  c->device = device;
  struct cudaDeviceProp prop;
  CK(cudaSetDevice(device), "set device");
  CK(cudaGetDeviceProperties(&prop, device), "device properties");
  /* The PCI bus id tells the GPUs of one host apart: info's device of two
   * daemons on two GPUs differ (protocol/PROTOCOL.md, info). */
  char bus[32];
  CK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device), "PCI bus id");
  snprintf(c->name, sizeof c->name, "%.90s (%.31s)", prop.name, bus);
  snprintf(c->bus, sizeof c->bus, "%s", bus);
  c->sms = prop.multiProcessorCount;
  {
    /* MPS client or not (daemon/sharing.h); a driver without the attribute
     * leaves it to NVML's process list. */
    int mps = 0;
    if (cudaDeviceGetAttribute(&mps, cudaDevAttrMpsEnabled, device) == cudaSuccess)
      c->mps = mps != 0;
    else {
      cudaGetLastError();
      c->mps = -1;
    }
  }
  if ((rc = fp4idx_cuda_scorer_for_device(device, &c->scorer))) goto out;
  /* The greatest priority the device has (numerically least): a co-tenant's
   * default-priority work on the same GPU (under MPS, another client) does
   * not get the SMs first when both have blocks waiting. */
  {
    int least = 0, greatest = 0;
    CK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priority range");
    (void)least;
    c->priority = greatest;
  }
  CK(cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking, c->priority),
     "create stream");
  CK(cudaStreamCreateWithPriority(&c->up_stream, cudaStreamNonBlocking, c->priority),
     "create upload stream");
  for (int i = 0; i < 2; i++)
    CK(cudaEventCreateWithFlags(&c->set[i].up_done, cudaEventDisableTiming), "create event");
  CK(cudaMalloc((void **)&c->d_flag, sizeof(int32_t)), "alloc flag");
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      CK(cudaEventCreate(&c->set[i].ev[j]), "create event");
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < FP4IDX__CUDA_PARTS; j++)
      CK(cudaEventCreateWithFlags(&c->set[i].part_ev[j], j ? cudaEventDisableTiming
                                                             : cudaEventDefault),
         "create event");
  /* The sets' end words (fp4idx__stage_wait), where the driver has
   * cuStreamWriteValue32 (without it every wait is on the event), and
   * their verdict words (check_publish.cu). */
  CK(cudaHostAlloc((void **)&c->h_words, 128, cudaHostAllocMapped), "alloc end words");
  memset(c->h_words, 0, 128);
  uint8_t *d_words = NULL;
  CK(cudaHostGetDevicePointer((void **)&d_words, c->h_words, 0), "end words: device address");
  for (int i = 0; i < 2; i++) {
    c->set[i].h_done = (volatile uint32_t *)((uint8_t *)c->h_words + 64 * i);
    c->set[i].d_done = (CUdeviceptr)(uintptr_t)(d_words + 64 * i);
    c->set[i].h_verdict = (volatile uint64_t *)((uint8_t *)c->h_words + 64 * i + 8);
    c->set[i].d_verdict = (unsigned long long *)(d_words + 64 * i + 8);
  }
  {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult qr = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault,
                                         &qr) == cudaSuccess &&
        qr == cudaDriverEntryPointSuccess && fn)
      c->write_value = (CUresult(*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int))fn;
    else
      cudaGetLastError(); /* not an error: the events serve */
  }
  if ((rc = fp4idx__pinned_create(&c->pinned, FP4IDX__CUDA_PINNED_KEEP))) goto out;
  if ((rc = fp4idx__seqpages_create(&c->seqpages))) goto out;
  *out = b;
  return FP4IDX_OK;
out:
  fp4idx__cuda_destroy(b);
  return rc;
}
