/* bench_cuda_stage.cu -- see bench_cuda_stage.h. */
#include "bench_cuda_stage.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "fp4idx_format.h"

namespace {

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

int check(cudaError_t e, const char *what) { return fp4idx__cuda_check(e, what); }

}  // namespace

extern "C" int fp4idx_bench_cuda_stage(fp4idx_backend_t *b, const fp4idx_backend_batch_t *bt,
                                       fp4idx_bench_staged_t *s) {
  if (!b || !bt || !s || b->n_pages <= 0 || b->page_size <= 0 || bt->n_seqs < 1 ||
      bt->heads < 1 || !bt->seqs)
    return FP4IDX_EINVAL;
  memset(s, 0, sizeof *s);
  const int32_t H = bt->heads, ns = bt->n_seqs, P = b->page_size;
  int32_t log2p = 0;
  while ((1 << log2p) < P) log2p++;
  if ((1 << log2p) != P) return FP4IDX_EINVAL;
  std::vector<int32_t> rows(ns);
  std::vector<int64_t> widths(ns);
  for (int32_t i = 0; i < ns; i++) {
    rows[i] = bt->seqs[i].rows;
    widths[i] = bt->seqs[i].width;
  }
  int dev = 0, sms = 0, rc;
  if ((rc = check(cudaGetDevice(&dev), "stage: device"))) return rc;
  if ((rc = check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "stage: sms")))
    return rc;
  fp4idx_cuda_scorer_t scorer;
  if ((rc = fp4idx_cuda_scorer_for_device(dev, &scorer))) return rc;
  const int32_t mw = fp4idx_cuda_score_max_works(H, ns, rows.data());
  std::vector<fp4idx_cuda_work_t> works(mw > 0 ? mw : 1);
  fp4idx_cuda_score_params_t prm;
  memset(&prm, 0, sizeof prm);
  const int nw = fp4idx_cuda_score_plan(scorer, H, ns, rows.data(), widths.data(), sms,
                                        works.data(), mw, &prm);
  if (nw < 0) return nw;
  if (nw > mw) return FP4IDX_EINVAL;

  /* One host image of the device allocation: pool, then per sequence pages,
   * q, w, lens, mask, then descriptors, works; the logits after it all. */
  const size_t pool_bytes = (size_t)b->n_pages * (size_t)P * FP4IDX_SLOT_BYTES;
  size_t off = align256(pool_bytes);
  std::vector<size_t> o((size_t)ns * 5);
  size_t total_out = 0;
  for (int32_t i = 0; i < ns; i++) {
    const fp4idx_backend_seq_t *q = &bt->seqs[i];
    const int64_t np = (q->width + P - 1) / P;
    o[5 * i + 0] = off; off = align256(off + (size_t)np * 4);
    o[5 * i + 1] = off; off = align256(off + (size_t)q->rows * H * FP4IDX_HEAD_DIM * 2);
    o[5 * i + 2] = off; off = align256(off + (size_t)q->rows * H * 2);
    o[5 * i + 3] = off; off = align256(off + (size_t)q->rows * 4);
    o[5 * i + 4] = off;
    if (q->mask) off = align256(off + (size_t)q->rows * (size_t)q->width);
    total_out += (size_t)q->rows * (size_t)q->width;
  }
  const size_t o_descs = off;
  off = align256(off + sizeof(fp4idx_cuda_seq_t) * (size_t)ns);
  const size_t o_works = off;
  off = align256(off + sizeof(fp4idx_cuda_work_t) * (size_t)(nw ? nw : 1));
  const size_t in_bytes = off, o_out = off;
  const size_t all = off + total_out * 4;

  std::vector<uint8_t> h(in_bytes);
  if ((rc = b->ops->read_pages(b, 0, b->n_pages, h.data()))) return rc;
  uint8_t *d = nullptr;
  if ((rc = check(cudaMalloc((void **)&d, all), "stage: alloc"))) return rc;
  s->dev = d;
  fp4idx_cuda_seq_t *descs = (fp4idx_cuda_seq_t *)(h.data() + o_descs);
  size_t out_at = 0;
  for (int32_t i = 0; i < ns; i++) {
    const fp4idx_backend_seq_t *q = &bt->seqs[i];
    const size_t *oi = &o[5 * i];
    const int64_t np = (q->width + P - 1) / P;
    if (np) memcpy(h.data() + oi[0], q->pages, (size_t)np * 4);
    memcpy(h.data() + oi[1], q->q, (size_t)q->rows * H * FP4IDX_HEAD_DIM * 2);
    memcpy(h.data() + oi[2], q->w, (size_t)q->rows * H * 2);
    memcpy(h.data() + oi[3], q->lens, (size_t)q->rows * 4);
    if (q->mask) memcpy(h.data() + oi[4], q->mask, (size_t)q->rows * (size_t)q->width);
    fp4idx_cuda_seq_t *e = &descs[i];
    memset(e, 0, sizeof *e);
    e->pages = (const int32_t *)(d + oi[0]);
    e->q = (const uint16_t *)(d + oi[1]);
    e->w = (const uint16_t *)(d + oi[2]);
    e->lens = (const int32_t *)(d + oi[3]);
    e->mask = q->mask ? (const uint8_t *)(d + oi[4]) : nullptr;
    e->out = (float *)(d + o_out) + out_at;
    e->width = q->width;
    e->rows = q->rows;
    out_at += (size_t)q->rows * (size_t)q->width;
  }
  memcpy(h.data() + o_works, works.data(), sizeof(fp4idx_cuda_work_t) * (size_t)nw);
  if ((rc = check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stage: stream")))
    goto fail;
  if ((rc = check(cudaMemcpy(d, h.data(), in_bytes, cudaMemcpyHostToDevice), "stage: upload")))
    goto fail;
  prm.pool = d;
  prm.seqs = (const fp4idx_cuda_seq_t *)(d + o_descs);
  prm.works = (const fp4idx_cuda_work_t *)(d + o_works);
  prm.log2_page = log2p;
  fp4idx_cuda_score_use_seq0(&prm, works.data(), descs);
  s->prm = prm;
  return FP4IDX_OK;
fail:
  fp4idx_bench_cuda_unstage(s);
  return rc;
}

extern "C" void fp4idx_bench_cuda_unstage(fp4idx_bench_staged_t *s) {
  if (!s) return;
  if (s->stream) cudaStreamDestroy(s->stream);
  if (s->dev) cudaFree(s->dev);
  memset(s, 0, sizeof *s);
}
