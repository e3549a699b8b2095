/* bench_cuda_neighbour.h -- another process beside a benchmark whose CUDA
 * stream is blocked in cuStreamWaitValue32 on a word in host memory, as a
 * channel's client stream waits for its completion word while the daemon
 * runs its kernels (`fp4idx-bench-cuda --topk --beside-wait`). Under MPS
 * the two processes' work shares the SMs, so timing the kernels with and
 * without this neighbour shows what a waiting channel client costs them.
 * Benchmark code only, not the product. */
#ifndef FP4IDX_BENCH_CUDA_NEIGHBOUR_H
#define FP4IDX_BENCH_CUDA_NEIGHBOUR_H

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fp4idx_bench_neighbour_s {
  pid_t pid;             /* the neighbour process (0: none) */
  volatile uint32_t *word; /* its wait's word, shared with it (one page) */
} fp4idx_bench_neighbour_t;

/* Forks the neighbour and returns once its stream's wait is enqueued (it
 * waits until the word is at least 1). Call it before this process's first
 * CUDA call (the child initializes CUDA of its own after fork).
 * Returns 0, or -1 with the reason on stderr (fork, mmap, or the child's
 * CUDA set-up failed; no child is left). */
int fp4idx_bench_neighbour_start(fp4idx_bench_neighbour_t *n);

/* Releases the neighbour's wait (a store to the word from this CPU) and
 * reaps it. Returns 0 when its stream ran through and it exited 0, else -1
 * (reason on stderr). Does nothing for a neighbour never started. */
int fp4idx_bench_neighbour_stop(fp4idx_bench_neighbour_t *n);

#ifdef __cplusplus
}
#endif
#endif
