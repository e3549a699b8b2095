"""The stream path of channels (fp4idx.channel: ctypes on libcuda) against a
stub libcuda compiled here and a stand-in torch, with a real CPU daemon:
the stub's "stream" runs each operation at once on the host (a write is a
store, cuMemcpyAsync a memcpy, cuStreamWaitValue32 a spin on the word), so
the driver calls a call makes -- their entry points, the device addresses
of the block's words, the ten descriptor words, the doorbell, the wait's
AND flag, seq copied from a device tensor -- are checked end to end
without a GPU: results equal the socket's bytes, and a killed daemon
releases a waiting "stream". The real driver is test_channel_cuda.py."""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

import fp4idx
from fp4idx import channel as chmod, cuda_driver
from conftest import stop_daemon
from test_channel import Setting, K, same, wait_rung

STUB = r"""
#include <stdint.h>
#include <string.h>
#define CTX ((void *)0x1234)
#define STREAM ((void *)0x5678)
static int registered;  /* cuMemHostRegister'd bytes, 0 after unregister */
static int calls[9];    /* init, register, unregister, write32, write64, wait, memcpy, sync,
                           batch */
static int refuse_batch; /* 1: cuStreamBatchMemOp_v2 fails (the caller goes op by op) */
int cuInit(unsigned f) { calls[0]++; return f ? 1 : 0; }
int cuDeviceGet(int *d, int ord) { if (ord != 0) return 101; *d = 100; return 0; }
int cuDevicePrimaryCtxRetain(void **c, int dev) { if (dev != 100) return 101; *c = CTX; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { return dev == 100 ? 0 : 101; }
int cuCtxPushCurrent_v2(void *c) { return c == CTX ? 0 : 201; }
int cuCtxPopCurrent_v2(void **c) { *c = CTX; return 0; }
int cuCtxSynchronize(void) { calls[7]++; return 0; }
int cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
  if (flags != 3 || ((uintptr_t)p & 4095) || n < 192) return 1;
  calls[1]++; registered = (int)n; return 0;
}
int cuMemHostGetDevicePointer_v2(uint64_t *d, void *p, unsigned flags) {
  if (!registered || flags) return 1;
  *d = (uint64_t)(uintptr_t)p; return 0;
}
int cuMemHostUnregister(void *p) { if (!registered) return 1; calls[2]++; registered = 0; return 0; }
int cuStreamWriteValue32_v2(void *s, uint64_t a, uint32_t v, unsigned f) {
  if (s != STREAM || f || !registered || (a & 3)) return 1;
  calls[3]++; __atomic_store_n((uint32_t *)(uintptr_t)a, v, __ATOMIC_RELEASE); return 0;
}
int cuStreamWriteValue64_v2(void *s, uint64_t a, uint64_t v, unsigned f) {
  if (s != STREAM || f || !registered || (a & 7)) return 1;
  calls[4]++; __atomic_store_n((uint64_t *)(uintptr_t)a, v, __ATOMIC_RELEASE); return 0;
}
int cuStreamWaitValue32_v2(void *s, uint64_t a, uint32_t v, unsigned f) {
  if (s != STREAM || f != 2 || !registered || (a & 3)) return 1;  /* CU_STREAM_WAIT_VALUE_AND */
  calls[5]++;
  while (!(__atomic_load_n((uint32_t *)(uintptr_t)a, __ATOMIC_ACQUIRE) & v)) {}
  return 0;
}
int cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *s) {
  if (s != STREAM) return 1;
  calls[6]++; memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n); return 0;
}
/* CUstreamBatchMemOpParams: operation, address, value, flags, alias, pad */
typedef struct { uint32_t op; uint64_t address, value; unsigned flags; uint64_t alias, pad; } memop_t;
int cuStreamBatchMemOp_v2(void *s, unsigned n, memop_t *ops, unsigned f) {
  calls[8]++;
  if (refuse_batch || s != STREAM || f || sizeof(memop_t) != 48) return 1;
  for (unsigned i = 0; i < n; i++) {
    int rc = ops[i].op == 2 ? cuStreamWriteValue32_v2(s, ops[i].address, (uint32_t)ops[i].value, ops[i].flags)
           : ops[i].op == 5 ? cuStreamWriteValue64_v2(s, ops[i].address, ops[i].value, ops[i].flags)
           : ops[i].op == 1 ? cuStreamWaitValue32_v2(s, ops[i].address, (uint32_t)ops[i].value, ops[i].flags)
           : 1;
    if (rc) return rc;
  }
  return 0;
}
void stub_refuse_batch(int on) { refuse_batch = on; }
int cuGetErrorName(int rc, const char **s) { *s = rc == 1 ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_OTHER"; return 0; }
int stub_calls(int i) { return calls[i]; }
int stub_registered(void) { return registered; }
"""
INIT, REGISTER, UNREGISTER, WRITE32, WRITE64, WAIT, MEMCPY, SYNC, BATCH = range(9)


class Device:
    def __init__(self):
        self.type, self.index = "cuda", 0


class Tensor:
    """A stand-in CUDA tensor of one int64 (its memory: a numpy array)."""

    def __init__(self, value):
        self.a = np.array([value], np.int64)
        self.device, self.dtype = Device(), "int64"

    def numel(self):
        return 1

    def data_ptr(self):
        return self.a.__array_interface__["data"][0]


class Stream:
    cuda_stream = 0x5678
    device = Device()

    def synchronize(self):
        pass


def fake_torch():
    cuda = types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 0,
                                 current_stream=lambda device=None: Stream(),
                                 synchronize=lambda device=None: None)
    return types.SimpleNamespace(cuda=cuda, Tensor=Tensor, int64="int64")


@pytest.fixture
def stub(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build the stub libcuda"
    src, lib = tmp_path / "cuda_stub.c", tmp_path / "libcuda_stub.so"
    src.write_text(STUB)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    real = ctypes.CDLL
    monkeypatch.setattr(ctypes, "CDLL",
                        lambda name, *a, **k: real(str(lib) if name == "libcuda.so.1" else name,
                                                   *a, **k))
    monkeypatch.setattr(cuda_driver.Driver, "_one", None)
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    yield cuda_driver.Driver.get().lib
    cuda_driver.Driver._one = None


@pytest.mark.parametrize("refuse_batch", [0, 1])
def test_stream_calls_through_the_driver_equal_the_socket(stub, client, seq, refuse_batch):
    stub.stub_refuse_batch(refuse_batch)
    s = Setting(client, seq(), seed=3)
    want_t = client.topk(s.seq, s.q, s.w, K, lens=s.lens)
    want_l = client.score(s.seq, s.q, s.w)
    n0 = [stub.stub_calls(i) for i in range(9)]
    with client.channel(slots=3) as ch:                    # stream None: the current one
        assert stub.stub_registered() == chmod.block_bytes(3)
        s.scribble()
        t = ch.topk(s.seq, s.qr, s.wr, K, lens=s.lr, out=s.out)
        same(s.out, want_t)                                # the stub's wait has returned
        assert ch.status(t) == 0
        s.scribble()
        ch.score(s.seq, s.qr, s.wr, out=s.logits)
        assert s.logits.tobytes() == want_l.tobytes()
        s.scribble()
        seq_d = Tensor(s.seq)                              # seq read from "device memory"
        ch.topk(seq_d, s.qr, s.wr, K, lens=s.lr, out=s.out)
        same(s.out, want_t)
        seq_d.a[0] = s.seq + 10**9                         # the next step's sequence: none
        ch.topk(seq_d, s.qr, s.wr, K, lens=s.lr, out=s.out)   # enqueued: no error yet
        with pytest.raises(fp4idx.NoSequence):
            ch.check()
        n = [stub.stub_calls(i) - n0[i] for i in range(9)]
        # per call: completion reset + doorbell, 10 descriptor words (9 with
        # seq from a tensor, then one memcpy), one wait; as one batch (two
        # around the memcpy), or op by op where the batch is refused
        assert n[WRITE32] == 8 and n[WAIT] == 4 and n[WRITE64] == 10 + 10 + 9 + 9
        assert n[MEMCPY] == 2
        assert n[BATCH] == 1 + 1 + 2 + 2
    assert stub.stub_registered() == 0 and stub.stub_calls(UNREGISTER) == n0[UNREGISTER] + 1
    assert stub.stub_calls(SYNC) == n0[SYNC]               # nothing was released
    s.r.close()


def test_a_killed_daemon_releases_a_waiting_stream(stub, make_daemon):
    d = make_daemon()
    c = fp4idx.Client(d.socket, timeout=60)
    s = Setting(c, 5)
    ch = c.channel(Stream(), slots=2)
    stop_daemon(d)
    got = []
    th = threading.Thread(target=lambda: got.append(ch.topk(s.seq, s.qr, s.wr, K, out=s.out)))
    th.start()
    wait_rung(ch, th)                                      # the stub's stream waits
    os.kill(d.proc.pid, signal.SIGKILL)
    th.join()
    assert got == [1] and ch.status(1) == fp4idx.ConnectionLost.code
    with pytest.raises(fp4idx.ConnectionLost):
        ch.check()
    n_sync = stub.stub_calls(SYNC)
    ch.close()
    assert stub.stub_calls(SYNC) == n_sync                 # released before the close
    assert stub.stub_registered() == 0
    d.proc.wait()
    d.proc = None
    c.close()
