/* probe_cuda_api.cu -- `fp4idx-probe-cuda-api`: what the CUDA runtime calls
 * of one fp4idxd request cost on the host, and the device round trip of a
 * small request, so the request path's "execute" stage can be read call by
 * call (docs/RESULTS.md, "Host cost of the CUDA calls").
 *
 * Each figure is the median over 5 runs of the mean host time of 400 calls
 * (clock_gettime around the loop; the stream is drained between runs so no
 * call waits for a full queue). The round trips are medians of 400 single
 * requests, each waited for: upload 32 KB, one kernel, download 16 KB.
 */
#include <algorithm>
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench_cuda_check.h"
#include "bench_time.h"


namespace {

struct Args8 {
  const void *a[8];
};

__global__ void empty_kernel(Args8 p, int n) {
  if (n < 0 && threadIdx.x == 0) ((int *)p.a[0])[0] = n;  // never: keeps the args live
}

__global__ void touch_kernel(const uint4 *in, uint4 *out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = in[i];
}

constexpr int kCalls = 400, kRuns = 5;

// Median over kRuns of the mean host time of one call of f.
template <typename F>
double host_cost(cudaStream_t st, F f) {
  double r[kRuns];
  for (int k = 0; k < kRuns; k++) {
    TCK(cudaStreamSynchronize(st));
    const double t0 = now_us();
    for (int i = 0; i < kCalls; i++) f(i);
    r[k] = (now_us() - t0) / kCalls;
  }
  TCK(cudaStreamSynchronize(st));
  std::sort(r, r + kRuns);
  return r[kRuns / 2];
}

// Median over kCalls single requests of f, each waited for by `wait`.
template <typename F, typename W>
double round_trip(F f, W wait) {
  static double r[kCalls];
  for (int i = 0; i < kCalls; i++) {
    const double t0 = now_us();
    f();
    wait();
    r[i] = now_us() - t0;
  }
  std::sort(r, r + kCalls);
  return r[kCalls / 2];
}

}  // namespace

int main() {
  int dev = 0;
  cudaDeviceProp prop;
  TCK(cudaSetDevice(dev));
  TCK(cudaGetDeviceProperties(&prop, dev));
  printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t st;
  TCK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  uint8_t *h_in, *h_out, *d_in, *d_out, *d_ws;
  TCK(cudaMallocHost((void **)&h_in, 1 << 20));
  TCK(cudaMallocHost((void **)&h_out, 1 << 20));
  TCK(cudaMalloc((void **)&d_in, 1 << 20));
  TCK(cudaMalloc((void **)&d_out, 1 << 20));
  TCK(cudaMalloc((void **)&d_ws, 1 << 20));
  cudaEvent_t ev_t, ev_n;
  TCK(cudaEventCreate(&ev_t));
  TCK(cudaEventCreateWithFlags(&ev_n, cudaEventDisableTiming));
  Args8 a8;
  for (int i = 0; i < 8; i++) a8.a[i] = d_ws;
  // Warm every path once.
  empty_kernel<<<1, 32, 0, st>>>(a8, 1);
  TCK(cudaGetLastError());
  TCK(cudaStreamSynchronize(st));

  struct Row {
    const char *what;
    double us;
  };
  Row rows[32];
  int nr = 0;
  auto add = [&](const char *w, double us) { rows[nr++] = {w, us}; };

  add("cudaSetDevice (same device)", host_cost(st, [&](int) { TCK(cudaSetDevice(dev)); }));
  add("cudaGetLastError", host_cost(st, [&](int) { (void)cudaGetLastError(); }));
  add("cudaPointerGetAttributes (pinned)", host_cost(st, [&](int) {
        cudaPointerAttributes pa;
        TCK(cudaPointerGetAttributes(&pa, h_in));
      }));
  add("cudaEventRecord (timing)", host_cost(st, [&](int) { TCK(cudaEventRecord(ev_t, st)); }));
  add("cudaEventRecord (no timing)", host_cost(st, [&](int) { TCK(cudaEventRecord(ev_n, st)); }));
  add("kernel <<<1,32>>> (8 pointer args)", host_cost(st, [&](int) {
        empty_kernel<<<1, 32, 0, st>>>(a8, 1);
        TCK(cudaGetLastError());
      }));
  add("kernel <<<784,256>>> (8 pointer args)", host_cost(st, [&](int) {
        empty_kernel<<<784, 256, 0, st>>>(a8, 1);
        TCK(cudaGetLastError());
      }));
  add("cudaLaunchKernelEx + PDL attribute", host_cost(st, [&](int) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(132);
        cfg.blockDim = dim3(384);
        cfg.stream = st;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        TCK(cudaLaunchKernelEx(&cfg, empty_kernel, a8, 1));
      }));
  add("cudaFuncSetAttribute (max dynamic smem)", host_cost(st, [&](int) {
        TCK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 << 10));
      }));
  add("cudaMemsetAsync 40 KB", host_cost(st, [&](int) { TCK(cudaMemsetAsync(d_ws, 0, 40 << 10, st)); }));
  add("cudaMemcpyAsync H2D 32 KB (pinned)", host_cost(st, [&](int) {
        TCK(cudaMemcpyAsync(d_in, h_in, 32 << 10, cudaMemcpyHostToDevice, st));
      }));
  add("cudaMemcpyAsync D2H 16 KB (pinned)", host_cost(st, [&](int) {
        TCK(cudaMemcpyAsync(h_out, d_out, 16 << 10, cudaMemcpyDeviceToHost, st));
      }));
  add("cudaEventQuery (done)", host_cost(st, [&](int) { (void)cudaEventQuery(ev_n); }));
  add("cudaEventSynchronize (done)", host_cost(st, [&](int) { TCK(cudaEventSynchronize(ev_n)); }));
  add("cudaEventElapsedTime", host_cost(st, [&](int) {
        float ms;
        TCK(cudaEventElapsedTime(&ms, ev_t, ev_t));
      }));

  // A request's sequence as a graph: upload, 5 kernels, download.
  cudaGraph_t g;
  cudaGraphExec_t ge;
  auto request_seq = [&] {
    TCK(cudaMemcpyAsync(d_in, h_in, 32 << 10, cudaMemcpyHostToDevice, st));
    for (int j = 0; j < 5; j++) {
      empty_kernel<<<132, 256, 0, st>>>(a8, 1);
      TCK(cudaGetLastError());
    }
    TCK(cudaMemcpyAsync(h_out, d_out, 16 << 10, cudaMemcpyDeviceToHost, st));
  };
  TCK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  request_seq();
  TCK(cudaStreamEndCapture(st, &g));
  TCK(cudaGraphInstantiate(&ge, g, 0));
  add("the 7 calls of a request, direct", host_cost(st, [&](int) { request_seq(); }));
  add("cudaGraphLaunch of those 7 nodes", host_cost(st, [&](int) { TCK(cudaGraphLaunch(ge, st)); }));
  add("capture the 7 + cudaGraphExecUpdate + launch", host_cost(st, [&](int) {
        cudaGraph_t g2;
        TCK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        request_seq();
        TCK(cudaStreamEndCapture(st, &g2));
        cudaGraphExecUpdateResultInfo info;
        TCK(cudaGraphExecUpdate(ge, g2, &info));
        TCK(cudaGraphDestroy(g2));
        TCK(cudaGraphLaunch(ge, st));
      }));
  {
    size_t nn = 0;
    TCK(cudaGraphGetNodes(g, nullptr, &nn));
    cudaGraphNode_t nodes[16];
    TCK(cudaGraphGetNodes(g, nodes, &nn));
    cudaGraphNode_t kn = nullptr;
    for (size_t i = 0; i < nn && !kn; i++) {
      cudaGraphNodeType t;
      TCK(cudaGraphNodeGetType(nodes[i], &t));
      if (t == cudaGraphNodeTypeKernel) kn = nodes[i];
    }
    cudaKernelNodeParams kp;
    TCK(cudaGraphKernelNodeGetParams(kn, &kp));
    add("cudaGraphExecKernelNodeSetParams", host_cost(st, [&](int i) {
          kp.gridDim = dim3(132 + (i & 1));
          TCK(cudaGraphExecKernelNodeSetParams(ge, kn, &kp));
        }));
  }

  // Round trips of one small request, waited for.
  const int n16 = (32 << 10) / 16;
  auto small_req = [&] {
    TCK(cudaEventRecord(ev_t, st));
    TCK(cudaMemcpyAsync(d_in, h_in, 32 << 10, cudaMemcpyHostToDevice, st));
    touch_kernel<<<8, 256, 0, st>>>((const uint4 *)d_in, (uint4 *)d_out, n16 / 2);
    TCK(cudaGetLastError());
    TCK(cudaMemcpyAsync(h_out, d_out, 16 << 10, cudaMemcpyDeviceToHost, st));
    TCK(cudaEventRecord(ev_n, st));
  };
  auto spin = [&] {
    while (cudaEventQuery(ev_n) == cudaErrorNotReady) {
    }
  };
  auto sync = [&] { TCK(cudaEventSynchronize(ev_n)); };
  add("round trip: up 32 KB + kernel + down 16 KB, EventSynchronize",
      round_trip(small_req, sync));
  add("round trip: the same, spinning on cudaEventQuery", round_trip(small_req, spin));
  auto kernel_only = [&] {
    touch_kernel<<<8, 256, 0, st>>>((const uint4 *)d_in, (uint4 *)d_out, n16 / 2);
    TCK(cudaGetLastError());
    TCK(cudaEventRecord(ev_n, st));
  };
  add("round trip: one kernel alone, EventSynchronize", round_trip(kernel_only, sync));
  // The same request with no copies: the kernel reads its input from and
  // writes its output to mapped pinned memory (PCIe instead of two DMAs).
  uint4 *m_in, *m_out;
  TCK(cudaHostGetDevicePointer((void **)&m_in, h_in, 0));
  TCK(cudaHostGetDevicePointer((void **)&m_out, h_out, 0));
  add("round trip: kernel on mapped host memory, no copies", round_trip([&] {
        touch_kernel<<<8, 256, 0, st>>>(m_in, m_out, n16 / 2);
        TCK(cudaGetLastError());
        TCK(cudaEventRecord(ev_n, st));
      }, sync));
  add("round trip: up 32 KB + kernel writing mapped output", round_trip([&] {
        TCK(cudaMemcpyAsync(d_in, h_in, 32 << 10, cudaMemcpyHostToDevice, st));
        touch_kernel<<<8, 256, 0, st>>>((const uint4 *)d_in, m_out, n16 / 2);
        TCK(cudaGetLastError());
        TCK(cudaEventRecord(ev_n, st));
      }, sync));
  // The end of a request seen through a word of mapped host memory that the
  // stream writes after its last operation (cuStreamWriteValue32), the host
  // spinning on it, instead of waiting on the end event.
  {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult qr;
    TCK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault,
                                         &qr));
    typedef CUresult (*write_value_t)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    write_value_t wv = qr == cudaDriverEntryPointSuccess ? (write_value_t)fn : nullptr;
    uint32_t *h_flag, *d_flag;
    TCK(cudaHostAlloc((void **)&h_flag, 64, cudaHostAllocMapped));
    TCK(cudaHostGetDevicePointer((void **)&d_flag, h_flag, 0));
    *(volatile uint32_t *)h_flag = 0;
    uint32_t seq = 0;
    auto flag_wait = [&] {
      while (*(volatile uint32_t *)h_flag != seq) {
      }
    };
    if (wv) {
      add("round trip: up 32 KB + kernel + down 16 KB, mapped flag", round_trip([&] {
            small_req();
            if (wv((CUstream)st, (CUdeviceptr)d_flag, ++seq, CU_STREAM_WRITE_VALUE_DEFAULT))
              abort();
          }, flag_wait));
      add("round trip: one kernel alone, mapped flag", round_trip([&] {
            kernel_only();
            if (wv((CUstream)st, (CUdeviceptr)d_flag, ++seq, CU_STREAM_WRITE_VALUE_DEFAULT))
              abort();
          }, flag_wait));
      add("cuStreamWriteValue32 (mapped host word)", host_cost(st, [&](int) {
            if (wv((CUstream)st, (CUdeviceptr)d_flag, ++seq, CU_STREAM_WRITE_VALUE_DEFAULT))
              abort();
          }));
    } else {
      printf("cuStreamWriteValue32: not available (%d)\n", (int)qr);
    }
    TCK(cudaStreamSynchronize(st));
    TCK(cudaFreeHost(h_flag));
  }
  add("round trip: the request's 7 nodes as a graph", round_trip([&] {
        TCK(cudaGraphLaunch(ge, st));
        TCK(cudaEventRecord(ev_n, st));
      }, sync));
  add("round trip: the 7 calls direct", round_trip([&] {
        request_seq();
        TCK(cudaEventRecord(ev_n, st));
      }, sync));

  printf("%-64s %9s\n", "host cost of one call (median of 5 means of 400)", "us");
  for (int i = 0; i < nr; i++) printf("%-64s %9.2f\n", rows[i].what, rows[i].us);
  return 0;
}
