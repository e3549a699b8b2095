/* launch_args.cuh -- filling an fp4idx_cuda_launch_t from C++: the kernel
 * and its shape, then each argument by value, in the kernel's order and
 * with the kernel's parameter types. */
#ifndef FP4IDX_LAUNCH_ARGS_CUH
#define FP4IDX_LAUNCH_ARGS_CUH

#include <string.h>

#include "fp4idx_cuda.h"

template <typename... P>
void fp4idx__launch_begin(fp4idx_cuda_launch_t *l, void (*func)(P...), unsigned grid,
                          unsigned block, size_t smem, unsigned cluster, unsigned pdl) {
  memset(l, 0, sizeof *l);
  l->func = (const void *)func;
  l->grid = grid;
  l->block = block;
  l->smem = smem;
  l->cluster = cluster;
  l->pdl = pdl;
}

template <typename T>
void fp4idx__launch_arg(fp4idx_cuda_launch_t *l, const T &v) {
  static_assert(alignof(T) <= alignof(uint64_t), "argument alignment");
  const size_t off = (l->argv_used + alignof(T) - 1) & ~(alignof(T) - 1);
  // A kernel's arguments fit in argv (a static property of the caller).
  if (l->n_args >= FP4IDX_CUDA_LAUNCH_ARGS || off + sizeof v > sizeof l->argv) __builtin_trap();
  memcpy((unsigned char *)l->argv + off, &v, sizeof v);
  l->arg_off[l->n_args++] = (uint16_t)off;
  l->argv_used = (uint32_t)(off + sizeof v);
}

#endif /* FP4IDX_LAUNCH_ARGS_CUH */
