/* regions_cuda.c -- the CUDA runtime side of regions (see regions.h):
 * pinning host mappings, opening IPC handles, copies. Without the CUDA
 * backend every call reports that CUDA is absent. Every CUDA call's status
 * is checked. */
#define _GNU_SOURCE
#include "regions.h"

#include <inttypes.h>
#include <string.h>

#include "fp4idx_fail.h"
#include "log.h"

#ifdef FP4IDX_HAVE_CUDA_BACKEND
#include <cuda.h> /* types of cuMemGetAddressRange only: libcuda is not linked */
#include <cuda_runtime_api.h>

/* cuMemGetAddressRange through the runtime's driver entry points, so the
 * daemon does not link libcuda (it must start on hosts without a driver,
 * with the CPU backend). */
typedef CUresult (*fp4idx__mem_range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr);

static int fp4idx__region_cuda_range(void *p, uintptr_t *base, size_t *len) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                       &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !fn)
    return -1;
  CUdeviceptr b = 0;
  if (((fp4idx__mem_range_fn)fn)(&b, len, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS) return -1;
  *base = (uintptr_t)b;
  return 0;
}

/* device < 0: keep the worker thread's current device (set by the backend). */
static int fp4idx__region_cuda_use(int device) {
  if (device < 0) return FP4IDX_OK;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    fp4idx__log_error("cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
    return FP4IDX_EDEVICE;
  }
  return FP4IDX_OK;
}

int fp4idx__region_cuda_pin(int device, void *base, uint64_t size) {
  if (fp4idx__region_cuda_use(device)) return FP4IDX_EDEVICE;
  cudaError_t e = cudaHostRegister(base, (size_t)size, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    fp4idx__log_warn("cudaHostRegister(%" PRIu64 " bytes): %s", size, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return FP4IDX_EDEVICE;
  }
  return FP4IDX_OK;
}

void fp4idx__region_cuda_unpin(int device, void *base) {
  if (fp4idx__region_cuda_use(device)) return;
  cudaError_t e = cudaHostUnregister(base);
  if (e != cudaSuccess) fp4idx__log_warn("cudaHostUnregister: %s", cudaGetErrorString(e));
}

int fp4idx__region_cuda_open(int device, const void *handle, uint64_t size, void **ptr,
                             char *msg, size_t cap) {
  cudaIpcMemHandle_t h;
  _Static_assert(sizeof h == FP4IDX_PROTO_CUDA_HANDLE, "cudaIpcMemHandle_t is 64 bytes");
  memcpy(&h, handle, sizeof h);
  if (fp4idx__region_cuda_use(device))
    return fp4idx__fail(msg, cap, FP4IDX_EDEVICE, "cannot select device %d", device);
  void *p = NULL;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fp4idx__fail(msg, cap, FP4IDX_EREGION, "cudaIpcOpenMemHandle refused the handle: %s",
                        cudaGetErrorString(e));
  }
  /* The client's size is a claim: the allocation behind the handle is the
   * truth (cuMemGetAddressRange), so a lie cannot make the daemon write past
   * it. */
  uintptr_t base = 0;
  size_t len = 0;
  int bad = fp4idx__region_cuda_range(p, &base, &len);
  if (bad || (uint64_t)len - ((uintptr_t)p - base) < size) {
    cudaError_t ce = cudaIpcCloseMemHandle(p);
    if (ce != cudaSuccess) fp4idx__log_warn("cudaIpcCloseMemHandle: %s", cudaGetErrorString(ce));
    if (bad)
      return fp4idx__fail(msg, cap, FP4IDX_EREGION, "cannot query the allocation of the handle");
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "size %" PRIu64 " is larger than the allocation (%zu bytes)", size, len);
  }
  *ptr = p;
  return FP4IDX_OK;
}

void fp4idx__region_cuda_close(int device, void *ptr) {
  if (fp4idx__region_cuda_use(device)) return;
  cudaError_t e = cudaIpcCloseMemHandle(ptr);
  if (e != cudaSuccess) fp4idx__log_warn("cudaIpcCloseMemHandle: %s", cudaGetErrorString(e));
}

int fp4idx__region_cuda_copy(int device, void *dst, const void *src, size_t n, int to_device) {
  if (fp4idx__region_cuda_use(device)) return FP4IDX_EDEVICE;
  cudaError_t e =
      cudaMemcpy(dst, src, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    fp4idx__log_error("cudaMemcpy of a region (%zu bytes): %s", n, cudaGetErrorString(e));
    return FP4IDX_EDEVICE;
  }
  return FP4IDX_OK;
}

/* The calling thread's copy stream for region snapshots, made on first use
 * (non-blocking: it never waits for the backend's stream); it lives as
 * long as the thread's process. */
static _Thread_local cudaStream_t fp4idx__region_stream;

int fp4idx__region_cuda_read_start(void *dst, const void *src, size_t n) {
  cudaError_t e = cudaSuccess;
  if (!fp4idx__region_stream)
    e = cudaStreamCreateWithFlags(&fp4idx__region_stream, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, fp4idx__region_stream);
  if (e != cudaSuccess) {
    fp4idx__log_error("copy from a CUDA region (%zu bytes): %s", n, cudaGetErrorString(e));
    return FP4IDX_EDEVICE;
  }
  return FP4IDX_OK;
}

int fp4idx__region_cuda_read_wait(void) {
  if (!fp4idx__region_stream) return FP4IDX_OK;
  cudaError_t e = cudaStreamSynchronize(fp4idx__region_stream);
  if (e != cudaSuccess) {
    fp4idx__log_error("copy from a CUDA region: %s", cudaGetErrorString(e));
    return FP4IDX_EDEVICE;
  }
  return FP4IDX_OK;
}

#else /* no CUDA backend in this build */

int fp4idx__region_cuda_pin(int device, void *base, uint64_t size) {
  (void)device, (void)base, (void)size;
  return FP4IDX_ENODEV;
}

void fp4idx__region_cuda_unpin(int device, void *base) { (void)device, (void)base; }

int fp4idx__region_cuda_open(int device, const void *handle, uint64_t size, void **ptr,
                             char *msg, size_t cap) {
  (void)device, (void)handle, (void)size, (void)ptr;
  return fp4idx__fail(msg, cap, FP4IDX_EREGION, "this build has no CUDA backend");
}

void fp4idx__region_cuda_close(int device, void *ptr) { (void)device, (void)ptr; }

int fp4idx__region_cuda_copy(int device, void *dst, const void *src, size_t n, int to_device) {
  (void)device, (void)dst, (void)src, (void)n, (void)to_device;
  return FP4IDX_ENODEV;
}

int fp4idx__region_cuda_read_start(void *dst, const void *src, size_t n) {
  (void)dst, (void)src, (void)n;
  return FP4IDX_ENODEV;
}

int fp4idx__region_cuda_read_wait(void) { return FP4IDX_OK; }

#endif
