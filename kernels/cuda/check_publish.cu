/* check_publish.cu -- the last kernel of a score call whose inputs lie in
 * device memory (a client's CUDA region, fp4idx_backend_seq_t
 * .device_inputs): it checks those inputs as the daemon checks a request's
 * host inputs (PROTOCOL.md "score": q and w finite, 0 <= lens[r] <= the
 * width) and publishes the call: the outputs copied from the call's scratch
 * to the caller's device buffers only when every input passed, the verdict
 * stored in a mapped host word, then the caller's done word (a channel's
 * completion) with the call's status.
 *
 * The scorer and the top-k have already run on the unchecked inputs: they
 * are memory-safe for any bits (lengths only mask columns below the width;
 * a NaN only makes logits NaN in the scratch), and nothing they wrote
 * reaches the caller unless the check passes. So a call with inputs on the
 * device needs no copy of them to the host and back, and no host wait
 * before its kernels.
 *
 * One block: the inputs it checks are a call's queries (R x H x 256 bytes,
 * kilobytes to a few hundred) and the outputs it copies are small (the
 * backend takes this path only below FP4IDX_CUDA_PUBLISH_MAX bytes of
 * each).
 *
 * On sm_90 it is launched with programmatic dependent launch: it may start
 * while the kernel before it (the top-k, or the scorer) still runs, checks
 * the inputs there (no kernel of the call writes them), and waits
 * (griddepcontrol.wait) only before it reads the outputs that kernel wrote.
 */
#include <stdint.h>

#include "fp4idx_cuda.h"
#include "fp4idx_status.h"
#include "launch_args.cuh"

namespace {

constexpr int kThreads = 1024;

// The key of a failed element: the first failure (lowest sequence, then q
// before w before lens, then the lowest element) is the least key.
__device__ __forceinline__ unsigned long long fail_key(int32_t seq, int32_t tensor,
                                                       uint64_t index) {
  return (unsigned long long)(uint32_t)seq << 48 | (unsigned long long)(tensor & 15) << 44 |
         (index & FP4IDX_CUDA_CHECK_INDEX_MASK);
}

// A bf16 is NaN or inf when its exponent bits are all ones.
__device__ __forceinline__ bool bf16_bad(uint32_t h) { return (h & 0x7f80u) == 0x7f80u; }

__device__ __forceinline__ uint32_t word_bad_lanes(uint32_t w) {
  return (bf16_bad(w & 0xffffu) ? 1u : 0u) | (bf16_bad(w >> 16) ? 2u : 0u);
}

__device__ void check_bf16(const fp4idx_cuda_check_in_t &in, unsigned long long *first) {
  const uint16_t *x = static_cast<const uint16_t *>(in.data);
  const uint64_t n = in.n;
  // 16-byte loads where the tensor is 16-byte aligned (q always is), eight
  // values a load; the rest one value at a time.
  uint64_t head = 0;
  if (((uintptr_t)x & 15u) == 0) {
    const uint4 *v = reinterpret_cast<const uint4 *>(x);
    const uint64_t nv = n / 8;
    for (uint64_t i = threadIdx.x; i < nv; i += kThreads) {
      const uint4 u = __ldg(v + i);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint32_t b = word_bad_lanes(w[j]);
        if (b) atomicMin(first, fail_key(in.seq, in.tensor, i * 8 + 2 * j + (b & 1u ? 0 : 1)));
      }
    }
    head = nv * 8;
  }
  for (uint64_t i = head + threadIdx.x; i < n; i += kThreads)
    if (bf16_bad(__ldg(x + i))) atomicMin(first, fail_key(in.seq, in.tensor, i));
}

__device__ void check_lens(const fp4idx_cuda_check_in_t &in, unsigned long long *first) {
  const int32_t *l = static_cast<const int32_t *>(in.data);
  for (uint64_t i = threadIdx.x; i < in.n; i += kThreads) {
    const int32_t v = __ldg(l + i);
    if (v < 0 || v > in.bound) atomicMin(first, fail_key(in.seq, in.tensor, i));
  }
}

__device__ void copy_bytes(const fp4idx_cuda_copy_t &c) {
  uint8_t *d = static_cast<uint8_t *>(c.dst);
  const uint8_t *s = static_cast<const uint8_t *>(c.src);
  uint64_t done = 0;
  if ((((uintptr_t)d | (uintptr_t)s) & 15u) == 0) {
    const uint64_t nv = c.bytes / 16;
    uint4 *dv = reinterpret_cast<uint4 *>(d);
    const uint4 *sv = reinterpret_cast<const uint4 *>(s);
    for (uint64_t i = threadIdx.x; i < nv; i += kThreads) dv[i] = sv[i];
    done = nv * 16;
  }
  for (uint64_t i = done + threadIdx.x; i < c.bytes; i += kThreads) d[i] = s[i];
}

__global__ void __launch_bounds__(kThreads)
    fp4idx_check_publish_kernel(fp4idx_cuda_publish_params_t p) {
  __shared__ unsigned long long first;
  if (threadIdx.x == 0) first = ~0ull;
  __syncthreads();
  for (int32_t i = 0; i < p.n_ins; i++) {
    const fp4idx_cuda_check_in_t in = p.ins[i];
    if (in.tensor == FP4IDX_CUDA_CHECK_LENS) check_lens(in, &first);
    else check_bf16(in, &first);
  }
  __syncthreads();
  const unsigned long long verdict = first;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The outputs are the previous kernel's: read them once it has completed
  // and its writes are visible (returns at once without the launch
  // attribute, as stream order then already holds).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (verdict == ~0ull)
    for (int32_t i = 0; i < p.n_copies; i++) copy_bytes(p.copies[i]);
  // The block's copies happen before thread 0 passes the barrier, and its
  // system-scope fence (cumulative) orders them before the words it
  // stores; one fence, not one per thread (each costs a round trip).
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t word = p.done_value;
    if (verdict != ~0ull) {
      const int tensor = (int)(verdict >> 44 & 15u);
      const int status = tensor == FP4IDX_CUDA_CHECK_LENS ? FP4IDX_ERANGE : FP4IDX_ENONFINITE;
      word |= (uint32_t)(-status) & 0xffffu;
    }
    __threadfence_system();
    *reinterpret_cast<volatile unsigned long long *>(p.verdict) = verdict;
    if (p.done) *reinterpret_cast<volatile uint32_t *>(p.done) = word;
  }
}

}  // namespace

extern "C" int fp4idx_cuda_publish_describe(const fp4idx_cuda_publish_params_t *p, int pdl,
                                            fp4idx_cuda_launch_t *out) {
  if (!p || !out || !p->verdict || p->n_ins < 0 || p->n_copies < 0) return FP4IDX_EINVAL;
  fp4idx__launch_begin(out, fp4idx_check_publish_kernel, 1, kThreads, 0, 0, pdl ? 1u : 0u);
  fp4idx__launch_arg(out, *p);
  return FP4IDX_OK;
}

extern "C" int fp4idx_cuda_check_verdict(uint64_t verdict, int32_t *seq, int32_t *tensor,
                                         uint64_t *index) {
  if (verdict == ~(uint64_t)0) return FP4IDX_OK;
  const int32_t t = (int32_t)(verdict >> 44 & 15u);
  if (seq) *seq = (int32_t)(verdict >> 48);
  if (tensor) *tensor = t;
  if (index) *index = verdict & FP4IDX_CUDA_CHECK_INDEX_MASK;
  return t == FP4IDX_CUDA_CHECK_LENS ? FP4IDX_ERANGE : FP4IDX_ENONFINITE;
}
