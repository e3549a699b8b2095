"""The ctypes glue of CUDA regions (fp4idx.cuda_driver as regions uses it) against a stub
libcuda compiled here, so that symbol names, argument passing and the
allocation base/handle arithmetic are checked without a GPU; the real
driver path is test_regions_cuda.py (GPU machines)."""
import ctypes
import shutil
import subprocess

import pytest

import fp4idx
from fp4idx import cuda_driver, regions

STUB = r"""
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>
#define BASE 0x100000ull
#define SIZE (8ull << 20)
int cuInit(unsigned f) { return f ? 1 : 0; }
int cuDeviceGet(int *d, int ord) { if (ord < 0 || ord > 1) return 101; *d = 100 + ord; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int dev) { if (dev < 100) return 101; *c = (void *)0x1234; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { return dev < 100 ? 101 : 0; }
int cuCtxPushCurrent_v2(void *c) { return c == (void *)0x1234 ? 0 : 201; }
int cuCtxPopCurrent_v2(void **c) { *c = (void *)0x1234; return 0; }
int cuMemGetAddressRange_v2(uint64_t *b, size_t *s, uint64_t p) {
  if (p < BASE || p >= BASE + SIZE) return 1;
  *b = BASE; *s = SIZE; return 0;
}
int cuIpcGetMemHandle(unsigned char *h, uint64_t b) {
  if (b != BASE) return 1;
  for (int i = 0; i < 64; i++) h[i] = (unsigned char)(i ^ 0x5a);
  return 0;
}
int cuDeviceGetPCIBusId(char *out, int len, int dev) { snprintf(out, len, "0000:%02X:00.0", 0x19 + dev - 100); return 0; }
int cuGetErrorName(int rc, const char **s) { *s = rc == 1 ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_OTHER"; return 0; }
"""


@pytest.fixture
def stub(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the stub libcuda"
    src, lib = tmp_path / "cuda_stub.c", tmp_path / "libcuda_stub.so"
    src.write_text(STUB)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    real = ctypes.CDLL
    monkeypatch.setattr(ctypes, "CDLL",
                        lambda name, *a, **k: real(str(lib) if name == "libcuda.so.1" else name,
                                                   *a, **k))
    monkeypatch.setattr(cuda_driver.Driver, "_one", None)
    yield
    cuda_driver.Driver._one = None


def test_cuda_glue_allocation(stub):
    base, size, handle, bus = regions.pointer_allocation(0x100000 + 4096, 0)
    assert (base, size) == (0x100000, 8 << 20)          # the allocation, not the pointer
    assert handle == bytes(i ^ 0x5a for i in range(64))
    assert bus == "0000:19:00.0"
    assert regions.pointer_allocation(0x100000 + (8 << 20) - 1, 1)[3] == "0000:1A:00.0"
    with pytest.raises(fp4idx.RegionError, match="cuMemGetAddressRange failed: CUDA_ERROR_INVALID_VALUE"):
        regions.pointer_allocation(0x50, 0)
    with pytest.raises(fp4idx.RegionError, match=r"cuDeviceGet\(5\) failed"):
        regions.pointer_allocation(0x100000, 5)


def test_cuda_glue_daemon_checks(stub, client):
    assert regions.same_bus("NVIDIA H200 (00000000:19:00.0)", "0000:19:00.0")
    assert not regions.same_bus("NVIDIA H200 (00000000:19:00.0)", "0000:1A:00.0")
    assert regions.same_bus("AMD EPYC (2 threads)", "0000:19:00.0")   # no bus id to compare
    with pytest.raises(fp4idx.RegionError, match="CUDA backend"):
        client.register_cuda_ptr(0x100000 + 256)           # a CPU daemon, said before sending
    with pytest.raises(fp4idx.RegionError, match="GPU 0000:1A:00.0"):
        regions.check_cuda_daemon({"backend": "cuda", "device": "H200 (00000000:19:00.0)"},
                                  "0000:1A:00.0", "sock")
