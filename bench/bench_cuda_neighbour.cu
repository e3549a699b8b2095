/* bench_cuda_neighbour.cu -- a neighbour process whose stream waits on a
 * host word (bench_cuda_neighbour.h). */
#include "bench_cuda_neighbour.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>  // CUresult, CUstream, CU_STREAM_WAIT_VALUE_GEQ (types only: no libcuda link)
#include <cuda_runtime_api.h>

namespace {

typedef CUresult (*wait32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// The child: its own CUDA context, the word registered as mapped host
// memory, one stream blocked on it; tells the parent through `fd` once the
// wait is enqueued, then synchronizes (returns when the word is set).
// Returns its exit status: 0, or the step that failed.
int neighbour_main(volatile uint32_t *word, int fd) {
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      !fn)
    return 2;
  if (cudaHostRegister((void *)word, 4096, cudaHostRegisterMapped) != cudaSuccess) return 3;
  void *dword = nullptr;
  cudaStream_t s;
  if (cudaHostGetDevicePointer(&dword, (void *)word, 0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
    return 4;
  if (((wait32_fn)fn)((CUstream)s, (CUdeviceptr)dword, 1, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
    return 5;
  const char ready = 1;
  if (write(fd, &ready, 1) != 1) return 6;
  if (cudaStreamSynchronize(s) != cudaSuccess) return 7;
  return 0;
}

}  // namespace

extern "C" int fp4idx_bench_neighbour_start(fp4idx_bench_neighbour_t *n) {
  memset(n, 0, sizeof *n);
  void *page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    perror("neighbour: mmap");
    return -1;
  }
  int p[2];
  if (pipe(p) != 0) {
    perror("neighbour: pipe");
    munmap(page, 4096);
    return -1;
  }
  n->word = static_cast<volatile uint32_t *>(page);  // zero: a fresh anonymous page
  const pid_t pid = fork();
  if (pid < 0) {
    perror("neighbour: fork");
    close(p[0]);
    close(p[1]);
    munmap(page, 4096);
    n->word = nullptr;
    return -1;
  }
  if (pid == 0) {
    // a parent that exits on an error path (its checks call exit) takes
    // the neighbour with it instead of leaving its stream waiting forever
    close(p[0]);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1) _exit(1);
    _exit(neighbour_main(n->word, p[1]));
  }
  close(p[1]);
  char ready = 0;
  const ssize_t r = read(p[0], &ready, 1);
  close(p[0]);
  n->pid = pid;
  if (r != 1) {  // the child exited before its wait was enqueued
    fp4idx_bench_neighbour_stop(n);
    return -1;
  }
  return 0;
}

extern "C" int fp4idx_bench_neighbour_stop(fp4idx_bench_neighbour_t *n) {
  if (!n->pid) return 0;
  __atomic_store_n(n->word, 1u, __ATOMIC_RELEASE);
  int status = 0;
  const pid_t r = waitpid(n->pid, &status, 0);
  n->pid = 0;
  munmap((void *)n->word, 4096);
  n->word = nullptr;
  if (r < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "neighbour: exited with status %d (a CUDA step of its set-up failed: %d)\n",
            status, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return -1;
  }
  return 0;
}
