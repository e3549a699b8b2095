/* score.c -- score requests, validated one by one, launched together (see
 * score.h). */
#define _GNU_SOURCE
#include "score.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "daemon.h"
#include "log.h"
#include "refs.h"
#include "zalloc.h"

/* A launch's output buffer, shared by the responses that point into it
 * (and, while it is still being copied back in parts, by the launch). */
typedef struct fp4idx__score_out_s {
  int refs;                /* atomic */
  fp4idx_engine_t *engine;
  uint8_t *mem;
  uint64_t ready;          /* atomic: leading bytes of mem final (UINT64_MAX: all) */
  int failed;              /* atomic: the copy back failed part way */
} fp4idx__score_out_t;

uint64_t fp4idx__score_out_ready(const void *out, const uint8_t **base, int *failed) {
  const fp4idx__score_out_t *o = out;
  if (base) *base = o ? o->mem : NULL;
  if (failed) *failed = o ? __atomic_load_n(&o->failed, __ATOMIC_ACQUIRE) : 0;
  return o ? __atomic_load_n(&o->ready, __ATOMIC_ACQUIRE) : UINT64_MAX;
}

void fp4idx__score_out_release(void *p) {
  fp4idx__score_out_t *o = p;
  if (!o || __atomic_sub_fetch(&o->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  fp4idx__engine_host_free(o->engine, o->mem);
  free(o);
}

static int fp4idx__score_fail(fp4idx_score_job_t *j, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fp4idx__score_fail(fp4idx_score_job_t *j, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->msg, j->msgcap, fmt, ap);
  va_end(ap);
  return j->rc = status;
}

void fp4idx__score_job_clear(fp4idx_score_job_t *j) {
  size_t n = j->req ? j->req->u.score.nseqs : 0;
  if (j->owned)
    for (size_t i = 0; i < 4 * n; i++) free(j->owned[i]);
  if (j->pinned)
    for (size_t i = 0; i < 4 * n; i++) fp4idx__engine_host_free(j->engine, j->pinned[i]);
  free(j->owned);
  free(j->pinned);
  j->pinned = NULL;
  free(j->eng);
  free(j->results);
  j->owned = NULL;
  j->eng = NULL;
  j->results = NULL;
}

/* Checks one request against the cache and its regions and points its
 * backend sequences at its inputs. rc 0 or the request's error. */
int fp4idx__score_inputs_finite(const fp4idx_request_t *req) {
  if (req->op != FP4IDX_OP_SCORE) return 0;
  for (size_t i = 0; i < req->u.score.nseqs; i++) {
    fp4idx_score_seq_t s = req->u.score.seqs[i];
    if (s.q.region) s.q.nbytes = 0; /* a region's: the worker snapshots and scans it */
    if (s.w.region) s.w.nbytes = 0;
    if (fp4idx_score_seq_finite(&s, NULL, 0)) return 0;
  }
  return 1;
}

/* Input tensor t of a job (owned / pinned slot `slot`) as host bytes in
 * *in: in place from the frame or a host region, or a private snapshot
 * (fp4idx__refs_input). A CUDA region's snapshot goes to pinned memory with
 * its copy only started (*started = 1): the caller waits for it
 * (fp4idx__region_cuda_read_wait), so the copies of one entry overlap. */
static int fp4idx__score_input(fp4idx_daemon_t *d, fp4idx_score_job_t *j, size_t slot,
                               const fp4idx_tensor_t *t, int any_align, const void **in,
                               int *started) {
  void *dev = t->region && t->nbytes ? fp4idx__refs_device(j->regions, t) : NULL;
  if (dev) {
    void *p = fp4idx__engine_host_alloc(d->engine, t->nbytes);
    if (!p) return FP4IDX_ENOMEM;
    j->pinned[slot] = p;
    *in = p;
    int rc = fp4idx__region_cuda_read_start(p, dev, t->nbytes);
    if (rc == FP4IDX_OK) *started = 1;
    return rc;
  }
  return fp4idx__refs_input(j->regions, t, 1, any_align, in, &j->owned[slot], j->msg,
                            j->msgcap);
}

/* Which of an entry's q, w and lens the backend reads where they lie, in
 * CUDA regions, and checks on the device after its kernels
 * (FP4IDX_BACKEND_DEV_*, their device addresses in ptrs; 0: every input
 * as host bytes, CUDA-region ones by a snapshot): all of those in CUDA
 * regions, where the backend checks device inputs, they are aligned for
 * its kernels and within its size, the mask is not on the device, and the
 * width needs no lens read here (top-k, or full logits into an out
 * tensor, whose width is then the caller's). Saves a snapshot's round
 * trip to the host and the upload back before the kernels. */
static int fp4idx__score_device_inputs(const fp4idx_daemon_t *d, const fp4idx_score_job_t *j,
                                       const fp4idx_score_seq_t *s, uint32_t topk,
                                       void *ptrs[3]) {
  if (!d->desc.device_inputs_max) return 0;
  const fp4idx_tensor_t *t[3] = {&s->q, &s->w, &s->lens};
  static const uintptr_t align[3] = {16, 2, 4}; /* the kernels' loads */
  int dev = 0;
  uint64_t bytes = 0;
  for (int x = 0; x < 3; x++) {
    ptrs[x] = t[x]->region && t[x]->nbytes ? fp4idx__refs_device(j->regions, t[x]) : NULL;
    if (!ptrs[x]) continue;
    if ((uintptr_t)ptrs[x] % align[x]) return 0;
    dev |= 1 << x; /* FP4IDX_BACKEND_DEV_Q, _W, _LENS */
    bytes += t[x]->nbytes;
  }
  if (!dev || bytes > d->desc.device_inputs_max) return 0;
  if (s->mask.region && fp4idx__refs_device(j->regions, &s->mask)) return 0;
  if (fp4idx_tensor_present(&s->out_logits) && fp4idx__refs_device(j->regions, &s->out_logits)) {
    /* outputs on the device are copied there by one block after the check */
    const uint64_t out = topk ? (uint64_t)s->rows * (topk * 8u + 4u)
                              : (uint64_t)s->rows * s->out_logits.shape[1] * 4u;
    if (out > d->desc.device_inputs_max) return 0;
  }
  if ((dev & FP4IDX_BACKEND_DEV_LENS) && !topk && !fp4idx_tensor_present(&s->out_logits))
    return 0;
  return dev;
}

/* The width of an entry whose lens the device reads (the caller's: its
 * out tensor's for full logits, else its mask's, else the sequence's
 * keys), checked against the sequence and the mask. */
static int fp4idx__score_device_width(const fp4idx_score_seq_t *s, uint32_t topk, uint64_t nkeys,
                                      uint64_t *width, char *msg, size_t cap) {
  const int masked = fp4idx_tensor_present(&s->mask);
  const uint64_t w = !topk ? s->out_logits.shape[1] : masked ? s->mask.shape[1] : nkeys;
  if (w > nkeys) {
    snprintf(msg, cap, "seq %" PRIu64 ": %s is %" PRIu64 " wide, the sequence has %" PRIu64
             " keys (with lens in a CUDA region the width is the caller's)", s->seq,
             !topk ? "out.logits" : "mask", w, nkeys);
    return FP4IDX_ESHAPE;
  }
  if (masked && s->mask.shape[1] != w) {
    snprintf(msg, cap, "seq %" PRIu64 ": mask is [%u,%" PRIu64 "], expected [%u,%" PRIu64
             "] (W = out.logits' width)", s->seq, s->rows, s->mask.shape[1], s->rows, w);
    return FP4IDX_ESHAPE;
  }
  *width = w;
  return FP4IDX_OK;
}

/* Every lens[r] of a snapshot (host bytes) in 0..width, the message as the
 * device's check gives it (fp4idx__score_device_reject). */
static int fp4idx__score_lens_within(const fp4idx_score_seq_t *s, uint64_t width, uint64_t nkeys,
                                     char *msg, size_t cap) {
  for (uint32_t r = 0; r < s->rows; r++) {
    const int32_t l = fp4idx_load_i32(s->lens.data, r);
    if (l < 0 || (uint64_t)l > width) {
      snprintf(msg, cap, "seq %" PRIu64 ": lens[%u] = %d outside 0..%" PRIu64 " (%s)", s->seq,
               r, (int)l, width, width == nkeys ? "keys" : "the width");
      return FP4IDX_ERANGE;
    }
  }
  return FP4IDX_OK;
}

int fp4idx__score_check(fp4idx_daemon_t *d, fp4idx_score_job_t *j) {
  const fp4idx_score_req_t *sr = &j->req->u.score;
  size_t n = sr->nseqs;
  char detail[256];
  j->eng = fp4idx__zalloc(n, sizeof *j->eng);
  j->owned = fp4idx__zalloc(4 * n, sizeof *j->owned);
  j->pinned = fp4idx__zalloc(4 * n, sizeof *j->pinned);
  j->engine = d->engine;
  j->results = fp4idx__zalloc(n, sizeof *j->results);
  fp4idx_ref_t *refs = fp4idx__zalloc(7 * n + 1, sizeof *refs);
  if (!j->eng || !j->owned || !j->pinned || !j->results || !refs) {
    free(refs);
    return fp4idx__score_fail(j, FP4IDX_ENOMEM, "out of memory for a score of %zu sequences", n);
  }
  /* Region references first (bounds, alignment, overlap of outputs with
   * anything else): a bad one fails the request before it reads anything. */
  size_t nrefs = 0;
  for (size_t i = 0; i < n; i++) {
    const fp4idx_score_seq_t *s = &sr->seqs[i];
    const fp4idx_tensor_t *t[7] = {&s->q, &s->w, &s->lens, &s->mask,
                                   &s->out_logits, &s->out_positions, &s->out_counts};
    for (int x = 0; x < 7; x++)
      if (t[x]->region) refs[nrefs++] = (fp4idx_ref_t){t[x], x >= 4};
    if (fp4idx_tensor_present(&s->out_logits)) j->alone = 1;
  }
  int rc = fp4idx__refs_check(j->regions, refs, nrefs, j->msg, j->msgcap);
  free(refs);
  if (rc) return j->rc = rc;
  uint64_t rows = 0, cells = 0;
  for (size_t i = 0; i < n; i++) {
    const fp4idx_score_seq_t *s = &sr->seqs[i];
    const fp4idx_cache_seq_t *cs = fp4idx__cache_find(&d->cache, s->seq);
    if (!cs)
      return fp4idx__score_fail(j, FP4IDX_ENOSEQ, "seqs[%zu]: unknown sequence %" PRIu64, i,
                                s->seq);
    /* Inputs as host arrays: in place from the frame, a private snapshot
     * from a region (checked, then used). */
    void **o = &j->owned[4 * i];
    const void *in[4] = {NULL, NULL, NULL, NULL};
    const fp4idx_tensor_t *t[4] = {&s->q, &s->w, &s->lens, &s->mask};
    int started = 0;
    void *dptr[3] = {NULL, NULL, NULL};
    const int dev = fp4idx__score_device_inputs(d, j, s, sr->topk, dptr);
    for (int x = 0; x < 4 && rc == FP4IDX_OK; x++) {
      if (!fp4idx_tensor_present(t[x])) continue;
      if (x < 3 && (dev & (1 << x))) { /* read and checked on the device */
        in[x] = dptr[x];
        continue;
      }
      /* q and w at any alignment: the backends read them bytewise */
      rc = fp4idx__score_input(d, j, 4 * i + (size_t)x, t[x], x < 2, &in[x], &started);
    }
    if (started) { /* every copy landed before its buffer is read, or freed */
      int w = fp4idx__region_cuda_read_wait();
      if (rc == FP4IDX_OK && w) rc = w;
    }
    if (rc == FP4IDX_ENOMEM) return fp4idx__score_fail(j, rc, "out of memory for seqs[%zu]", i);
    if (rc == FP4IDX_EDEVICE)
      return fp4idx__score_fail(j, rc, "seqs[%zu]: reading its inputs from a CUDA region failed",
                                i);
    if (rc) return j->rc = rc;
    fp4idx_score_seq_t view = *s;
    view.q.data = in[0];
    view.w.data = in[1];
    view.lens.data = in[2];
    view.mask.data = in[3];
    if (dev & FP4IDX_BACKEND_DEV_Q) view.q.nbytes = 0; /* checked on the device */
    if (dev & FP4IDX_BACKEND_DEV_W) view.w.nbytes = 0;
    uint64_t width = 0;
    /* q and w from the frame are scanned on the loop (inputs_finite) */
    /* lens in a CUDA region with out or topk: the width is the caller's
     * (PROTOCOL.md "score"), whether the device reads lens or a snapshot */
    const int lens_cuda = s->lens.region && (sr->topk || fp4idx_tensor_present(&s->out_logits)) &&
                          fp4idx__refs_device(j->regions, &s->lens);
    if (lens_cuda) {
      rc = fp4idx__score_device_width(s, sr->topk, (uint64_t)cs->n_keys, &width, detail,
                                      sizeof detail);
      if (rc == FP4IDX_OK && !(dev & FP4IDX_BACKEND_DEV_LENS))
        rc = fp4idx__score_lens_within(&view, width, (uint64_t)cs->n_keys, detail,
                                       sizeof detail);
      if (rc == FP4IDX_OK && !(j->inputs_finite && !s->q.region && !s->w.region))
        rc = fp4idx_score_seq_finite(&view, detail, sizeof detail);
    } else {
      rc = j->inputs_finite && !s->q.region && !s->w.region
               ? fp4idx_score_seq_check_shape(&view, (uint64_t)cs->n_keys, &width, detail,
                                              sizeof detail)
               : fp4idx_score_seq_check(&view, (uint64_t)cs->n_keys, &width, detail,
                                        sizeof detail);
    }
    if (rc == FP4IDX_OK) rc = fp4idx_score_out_check(s, width, sr->topk, detail, sizeof detail);
    if (rc)
      return fp4idx__score_fail(j, rc, "seqs[%zu] (sequence %" PRIu64 ", %" PRId64 " keys): %s",
                                i, s->seq, cs->n_keys, detail);
    if (!fp4idx_tensor_present(&s->lens)) {
      int32_t *l = malloc((size_t)s->rows * sizeof *l);
      if (!l) return fp4idx__score_fail(j, FP4IDX_ENOMEM, "out of memory for seqs[%zu]", i);
      for (uint32_t r = 0; r < s->rows; r++) l[r] = (int32_t)cs->n_keys;
      in[2] = o[2] = l;
    }
    const int32_t *pages = NULL; /* one array; forks hold shared chunks of it */
    if (fp4idx__cache_pages(&d->cache, cs, &pages) != FP4IDX_OK)
      return fp4idx__score_fail(j, FP4IDX_ENOMEM, "out of memory for seqs[%zu]", i);
    j->eng[i] = (fp4idx_backend_seq_t){.pages = pages, .n_keys = cs->n_keys,
                                      .rows = (int32_t)s->rows, .width = (int64_t)width,
                                      .q = in[0], .w = in[1], .lens = in[2], .mask = in[3],
                                      .seq = cs->id, .resident = 1, .device_inputs = dev};
    rows += s->rows;
    cells += (uint64_t)s->rows * width;
    j->work += (uint64_t)s->rows * sr->heads * (width ? width : 1);
  }
  uint64_t k = sr->topk;
  uint64_t bytes = k ? rows * (k * 8u + 4u) : cells * 4u;
  if ((k && rows > FP4IDX_CMD_MAX_RESULT / (k * 8u + 4u)) || bytes > FP4IDX_CMD_MAX_RESULT)
    return fp4idx__score_fail(j, FP4IDX_E2BIG,
                              "result of %" PRIu64 " rows would exceed %" PRIu64 " bytes", rows,
                              FP4IDX_CMD_MAX_RESULT);
  j->rows = rows;
  j->cells = cells;
  return j->rc = FP4IDX_OK;
}

uint64_t fp4idx__score_out_bytes(const fp4idx_score_job_t *j) {
  uint64_t k = j->req->u.score.topk;
  return k ? j->rows * (k * 8u + 4u) : j->cells * 4u;
}

/* One entry's results written to its "out" references (after the backend
 * ran), and the reply's tensors turned into the same references. */
static int fp4idx__score_outputs(const fp4idx_score_job_t *j, const fp4idx_score_seq_t *s,
                                 fp4idx_score_result_t *r) {
  const fp4idx_tensor_t *out[3] = {&s->out_logits, &s->out_positions, &s->out_counts};
  fp4idx_tensor_t *res[3] = {&r->logits, &r->positions, &r->counts};
  for (int x = 0; x < (r->topk ? 3 : 1); x++) {
    int rc = fp4idx__refs_output(j->regions, out[x], res[x]->data, j->msg, j->msgcap);
    if (rc) return rc;
    fp4idx_tensor_ref(res[x], out[x]->dtype, out[x]->ndim, out[x]->shape, out[x]->region,
                      out[x]->offset);
  }
  return FP4IDX_OK;
}

/* One backend call of a group of jobs, from submit to split-back. */
struct fp4idx_score_launch_s {
  fp4idx_score_job_t **jobs; /* [n], owned */
  int n;
  fp4idx__score_out_t *o;    /* the shared output buffer, or NULL */
  float *logits, *val;
  int32_t *pos, *count;
  fp4idx_backend_seq_t *seqs;
  int own_seqs;              /* seqs is the launch's own copy (several jobs) */
  fp4idx_backend_timing_t timing;
  fp4idx_backend_input_error_t input_error; /* a failed device check's place */
  fp4idx_backend_batch_t batch;
  fp4idx_engine_call_t call;
  double t0;
  int streaming;             /* answered with only the first part back */
};


static void fp4idx__score_launch_free(fp4idx_score_launch_t *l) {
  if (!l) return;
  /* not the jobs: their requests may be answered and gone by now */
  if (l->own_seqs) free(l->seqs);
  free(l->jobs);
  free(l);
}

/* Queues one backend call for jobs[0..n) (all valid, same heads and topk;
 * the array is taken over): one output buffer, [logits] or [pos | val |
 * count] (64-byte aligned parts), each job's rows in order. A job alone
 * with one entry writing into regions has the backend write there itself:
 * into CUDA regions on the device (no host copy at all; CUDA backend), into
 * a host region from the device (a pinned region takes the device-to-host
 * DMA); other outputs into regions are staged in the buffer and written
 * after the call. *out: the launch (finish it with fp4idx__score_finish),
 * or NULL with the error. */
static int fp4idx__score_submit(fp4idx_daemon_t *d, fp4idx_score_job_t **jobs, int n,
                                fp4idx_score_launch_t **out) {
  *out = NULL;
  const fp4idx_score_req_t *sr0 = &jobs[0]->req->u.score;
  const uint64_t k = sr0->topk;
  size_t nseqs = 0;
  uint64_t rows = 0, cells = 0;
  for (int i = 0; i < n; i++) {
    nseqs += jobs[i]->req->u.score.nseqs;
    rows += jobs[i]->rows;
    cells += jobs[i]->cells;
  }
  float *logits = NULL, *val = NULL;
  int32_t *pos = NULL, *count = NULL;
  int on_device = 0;
  if (n == 1 && jobs[0]->alone && sr0->nseqs == 1) {
    const fp4idx_score_seq_t *s0 = &sr0->seqs[0];
    const fp4idx_regions_t *rs = jobs[0]->regions;
    /* all outputs in CUDA regions of a backend that writes device memory:
     * the results never leave the device */
    void *(*where)(const fp4idx_regions_t *, const fp4idx_tensor_t *) = fp4idx__refs_direct;
    if (d->desc.device_outputs && fp4idx__refs_device(rs, &s0->out_logits) &&
        (!k || (fp4idx__refs_device(rs, &s0->out_positions) &&
                fp4idx__refs_device(rs, &s0->out_counts)))) {
      where = fp4idx__refs_device;
      on_device = 1;
    }
    if (k) {
      val = where(rs, &s0->out_logits);
      pos = where(rs, &s0->out_positions);
      count = where(rs, &s0->out_counts);
    } else {
      logits = where(rs, &s0->out_logits);
    }
  }
  int staged = k ? (!val || !pos || !count) : !logits;
  fp4idx_score_launch_t *l = fp4idx__zalloc(1, sizeof *l);
  fp4idx_backend_seq_t *seqs = n == 1 ? jobs[0]->eng : malloc(nseqs * sizeof *seqs);
  fp4idx__score_out_t *o = staged ? fp4idx__zalloc(1, sizeof *o) : NULL;
  size_t kk = (size_t)(k * rows * 4u), at_val = (kk + 63) & ~(size_t)63;
  size_t at_cnt = at_val + at_val;
  uint8_t *mem =
      staged ? fp4idx__engine_host_alloc(d->engine, k ? at_cnt + rows * 4u : cells * 4u) : NULL;
  if (!l || !seqs || (staged && (!o || !mem))) {
    if (seqs != jobs[0]->eng) free(seqs);
    free(o);
    free(l);
    free(jobs);
    fp4idx__engine_host_free(d->engine, mem);
    return FP4IDX_ENOMEM;
  }
  if (n > 1)
    for (int i = 0, at = 0; i < n; i++) {
      size_t m = jobs[i]->req->u.score.nseqs;
      memcpy(seqs + at, jobs[i]->eng, m * sizeof *seqs);
      at += (int)m;
    }
  if (o) {
    o->refs = n;
    o->engine = d->engine;
    o->mem = mem;
    o->ready = UINT64_MAX;
  }
  if (staged) {
    if (!k) logits = (float *)mem;
    if (k && !pos) pos = (int32_t *)mem;
    if (k && !val) val = (float *)(mem + at_val);
    if (k && !count) count = (int32_t *)(mem + at_cnt);
  }
  *l = (fp4idx_score_launch_t){.jobs = jobs, .n = n, .o = o, .logits = logits, .val = val,
                                .pos = pos, .count = count, .seqs = seqs, .own_seqs = n > 1};
  l->batch = (fp4idx_backend_batch_t){.heads = (int32_t)sr0->heads, .n_seqs = (int32_t)nseqs,
                                      .seqs = seqs, .topk = (int32_t)k, .logits = logits,
                                      .topk_pos = pos, .topk_val = val, .topk_count = count,
                                      .timing = &l->timing, .outputs_on_device = on_device,
                                      .input_error = &l->input_error,
                                      /* [pos | val | count] of mem, or of a host
                                       * region with no gap between them (the
                                       * client's reply region) */
                                      .topk_one_buffer =
                                          k && !on_device &&
                                          ((staged && pos == (int32_t *)mem &&
                                            val == (float *)(mem + at_val) &&
                                            count == (int32_t *)(mem + at_cnt)) ||
                                           (!staged && (uint8_t *)val == (uint8_t *)pos + kk &&
                                            (uint8_t *)count == (uint8_t *)val + kk))};
  if (n == 1 && jobs[0]->done_word) {
    jobs[0]->done_written = 0;
    l->batch.done_word = jobs[0]->done_word;
    l->batch.done_value = jobs[0]->done_value;
    l->batch.done_written = &jobs[0]->done_written;
  }
  l->t0 = fp4idx__stats_now_us();
  int rc = fp4idx__engine_score_submit(d->engine, &l->batch, &l->call);
  if (rc) {
    if (o) {
      o->refs = 1;
      fp4idx__score_out_release(o);
    }
    fp4idx__score_launch_free(l);
    return rc;
  }
  *out = l;
  return FP4IDX_OK;
}

/* 1 when l's reply may leave while its logits are still coming back: one
 * request of one sequence, full logits into the launch's own buffer, big
 * enough to be copied back in parts (the reply is then written as they
 * land; a batch's replies wait, since small ones are copied into their
 * frames when encoded). */
static int fp4idx__score_streamable(const fp4idx_score_launch_t *l) {
  /* (not one writing into regions: its outputs are copied there from the
   * buffer when collected, so they must all be back by then) */
  return l->o && l->n == 1 && !l->jobs[0]->alone && l->batch.topk == 0 &&
         l->jobs[0]->req->u.score.nseqs == 1 && l->jobs[0]->cells * 4u >= FP4IDX_SCORE_STREAM_MIN;
}

/* Waits for a submitted launch and splits its results back into its jobs.
 * With `stream` a streamable launch (above) returns as soon as the first
 * part of its logits is back (l->streaming; fp4idx__score_stream_rest
 * waits for the rest). Returns the call's status (the jobs untouched on
 * failure). On failure the caller still owns l->jobs' fate (see finish). */
static int fp4idx__score_wait(fp4idx_daemon_t *d, fp4idx_score_launch_t *l, int stream) {
  int rc = FP4IDX_OK;
  uint64_t ready = UINT64_MAX;
  if (stream && fp4idx__score_streamable(l))
    rc = fp4idx__engine_score_wait_part(d->engine, l->call, &ready);
  if (rc == FP4IDX_OK && ready != UINT64_MAX) {
    l->streaming = 1;
    __atomic_store_n(&l->o->ready, ready, __ATOMIC_RELEASE);
    __atomic_add_fetch(&l->o->refs, 1, __ATOMIC_ACQ_REL); /* the launch's, until all is back */
  } else {
    int wrc = fp4idx__engine_score_wait(d->engine, l->call);
    if (rc == FP4IDX_OK) rc = wrc;
  }
  if (!l->timing.timed) l->timing.kernels_us = fp4idx__stats_now_us() - l->t0;
  if (rc) {
    if (l->o) {
      l->o->refs = 1;
      fp4idx__score_out_release(l->o);
      l->o = NULL;
    }
    return rc;
  }
  const uint64_t k = (uint64_t)l->batch.topk;
  uint64_t row = 0, cell = 0;
  for (int i = 0; i < l->n; i++) {
    fp4idx_score_job_t *j = l->jobs[i];
    const fp4idx_score_req_t *sr = &j->req->u.score;
    for (size_t s = 0; s < sr->nseqs; s++) {
      fp4idx_score_result_t *r = &j->results[s];
      uint64_t R = (uint64_t)j->eng[s].rows, W = (uint64_t)j->eng[s].width;
      r->seq = sr->seqs[s].seq;
      r->topk = k != 0;
      if (k) {
        uint64_t shp[2] = {R, k};
        fp4idx_tensor_init(&r->positions, FP4IDX_WIRE_I32, 2, shp, l->pos + row * k);
        fp4idx_tensor_init(&r->logits, FP4IDX_WIRE_F32, 2, shp, l->val + row * k);
        fp4idx_tensor_init(&r->counts, FP4IDX_WIRE_I32, 1, &R, l->count + row);
      } else {
        uint64_t shp[2] = {R, W};
        fp4idx_tensor_init(&r->logits, FP4IDX_WIRE_F32, 2, shp, l->logits + cell);
      }
      if (j->alone && fp4idx_tensor_present(&sr->seqs[s].out_logits) && j->rc == FP4IDX_OK) {
        int orc = fp4idx__score_outputs(j, &sr->seqs[s], r);
        if (orc)
          fp4idx__score_fail(j, orc, "writing the results of seqs[%zu]: %s", s,
                             fp4idx_strerror(orc));
      }
      row += R;
      cell += R * W;
    }
    j->nresults = sr->nseqs;
    j->out = l->o;
    j->timing = l->timing;
    j->launch_size = l->n;
  }
  return FP4IDX_OK;
}

/* The error of a launch of one job whose inputs in CUDA regions failed the
 * device's check (rc FP4IDX_ENONFINITE or FP4IDX_ERANGE, where in
 * l->input_error): the failing tensor is read back whole and checked by the
 * host's own check, so the message is the one a host input gets. Returns 0
 * (nothing done) for any other failure. */
static int fp4idx__score_device_reject(fp4idx_score_launch_t *l, int rc) {
  const fp4idx_backend_input_error_t *e = &l->input_error;
  fp4idx_score_job_t *j = l->jobs[0];
  const fp4idx_score_req_t *sr = &j->req->u.score;
  if ((rc != FP4IDX_ENONFINITE && rc != FP4IDX_ERANGE) || l->n != 1 || e->seq < 0 ||
      (size_t)e->seq >= sr->nseqs || !j->eng[e->seq].device_inputs || e->tensor < 0 ||
      e->tensor > 2)
    return 0;
  const size_t i = (size_t)e->seq;
  const fp4idx_backend_seq_t *b = &j->eng[i];
  const fp4idx_score_seq_t *s = &sr->seqs[i];
  fp4idx_score_seq_t view = *s; /* only the failing tensor's bytes */
  view.q.nbytes = view.w.nbytes = 0;
  fp4idx_tensor_t *t = e->tensor == 0 ? &view.q : e->tensor == 1 ? &view.w : &view.lens;
  const void *dev = e->tensor == 0 ? b->q : e->tensor == 1 ? b->w : b->lens;
  /* a region tensor's nbytes is its shape's (fp4idx_codec.h) */
  const size_t n = (e->tensor == 0 ? s->q : e->tensor == 1 ? s->w : s->lens).nbytes;
  char detail[256];
  int hrc = FP4IDX_ENOMEM;
  void *host = malloc(n ? n : 1);
  if (host && fp4idx__region_cuda_copy(-1, host, dev, n, 0) == FP4IDX_OK) {
    t->data = host;
    t->nbytes = n;
    hrc = e->tensor == 2 ? fp4idx__score_lens_within(&view, (uint64_t)b->width,
                                                     (uint64_t)b->n_keys, detail, sizeof detail)
                         : fp4idx_score_seq_finite(&view, detail, sizeof detail);
  }
  free(host);
  if (hrc == FP4IDX_OK || hrc == FP4IDX_ENOMEM) /* changed since, or not read back */
    snprintf(detail, sizeof detail, "seq %" PRIu64 ": %s[%" PRIu64 "] (flat) %s", s->seq,
             e->tensor == 0 ? "q" : e->tensor == 1 ? "w" : "lens", e->index,
             e->tensor == 2 ? "was outside its range" : "was NaN or inf; q and w must be finite");
  fp4idx__score_fail(j, rc, "seqs[%zu] (sequence %" PRIu64 ", %" PRId64 " keys): %s", i, s->seq,
                     b->n_keys, detail);
  return 1;
}

/* A group alone, submitted and waited for at once (the retry path). */
static int fp4idx__score_now(fp4idx_daemon_t *d, fp4idx_score_job_t *j) {
  fp4idx_score_job_t **one = malloc(sizeof *one);
  if (!one) return FP4IDX_ENOMEM;
  one[0] = j;
  fp4idx_score_launch_t *l;
  int rc = fp4idx__score_submit(d, one, 1, &l);
  if (rc) return rc;
  rc = fp4idx__score_wait(d, l, 0);
  if (rc && fp4idx__score_device_reject(l, rc)) rc = FP4IDX_OK; /* j->rc holds it */
  fp4idx__score_launch_free(l);
  return rc;
}

/* The rest of a streaming launch's logits: each part published to the
 * reply writing from the buffer (and the loop told), then the call waited
 * for and the launch's reference dropped. A part that fails marks the
 * buffer failed: its reply cannot be finished, the server drops the
 * connection. */
static void fp4idx__score_stream_rest(fp4idx_daemon_t *d, fp4idx_score_launch_t *l) {
  fp4idx__score_out_t *o = l->o;
  for (;;) {
    uint64_t ready = 0;
    int rc = fp4idx__engine_score_wait_part(d->engine, l->call, &ready);
    if (rc) {
      fp4idx__log_error("a score's logits failed part way back (%s): its connection closes",
                        fp4idx_strerror(rc));
      __atomic_store_n(&o->failed, 1, __ATOMIC_RELEASE);
    } else {
      __atomic_store_n(&o->ready, ready, __ATOMIC_RELEASE);
    }
    fp4idx__worker_kick(&d->worker); /* the loop writes what came (daemon.c on_wake) */
    if (rc || ready == UINT64_MAX) break;
  }
  (void)fp4idx__engine_score_wait(d->engine, l->call);
  l->streaming = 0;
  fp4idx__score_out_release(o);
}

/* Collects a launch: its results, or on failure each of its jobs alone
 * (one bad launch must not fail its neighbours), or the error. */
static void fp4idx__score_finish(fp4idx_daemon_t *d, fp4idx_score_launch_t *l) {
  int rc = fp4idx__score_wait(d, l, 1);
  if (l->n > 1) fp4idx__log_debug("one launch for %d score requests (rc %d)", l->n, rc);
  if (rc && l->n > 1) {
    fp4idx__log_warn("a launch of %d score requests failed (%s): running them one by one",
                     l->n, fp4idx_strerror(rc));
    for (int x = 0; x < l->n; x++) {
      int r1 = fp4idx__score_now(d, l->jobs[x]);
      if (r1) fp4idx__score_fail(l->jobs[x], r1, "scoring failed: %s", fp4idx_strerror(r1));
    }
  } else if (rc && !fp4idx__score_device_reject(l, rc)) {
    fp4idx__score_fail(l->jobs[0], rc, "scoring failed: %s", fp4idx_strerror(rc));
  }
}

int fp4idx__score_launch(fp4idx_daemon_t *d, fp4idx_score_job_t *const *jobs, int n,
                         fp4idx_score_launch_t **out) {
  *out = NULL;
  fp4idx_score_job_t **g = malloc((size_t)n * sizeof *g);
  if (!g) return FP4IDX_ENOMEM;
  memcpy(g, jobs, (size_t)n * sizeof *g);
  return fp4idx__score_submit(d, g, n, out); /* takes g */
}

void fp4idx__score_collect(fp4idx_daemon_t *d, fp4idx_score_launch_t *l) {
  fp4idx__score_finish(d, l);
}

void fp4idx__score_launch_end(fp4idx_daemon_t *d, fp4idx_score_launch_t *l) {
  if (!l) return;
  if (l->streaming) fp4idx__score_stream_rest(d, l);
  fp4idx__score_launch_free(l);
}
