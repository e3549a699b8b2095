/* cuda_launch.c -- a kernel launch described as data (fp4idx_cuda.h),
 * enqueued with its cluster and programmatic-dependent-launch attributes. */
#include <string.h>

#include <cuda_runtime_api.h>

#include "fp4idx_cuda.h"
#include "fp4idx_status.h"

static void fp4idx__launch_args(const fp4idx_cuda_launch_t *l, void **args) {
  for (int32_t i = 0; i < l->n_args; i++)
    args[i] = (void *)((const unsigned char *)l->argv + l->arg_off[i]);
}

int fp4idx_cuda_launch_run(const fp4idx_cuda_launch_t *l, cudaStream_t stream) {
  if (!l->func) return FP4IDX_OK;
  void *args[FP4IDX_CUDA_LAUNCH_ARGS];
  fp4idx__launch_args(l, args);
  cudaLaunchAttribute at[2];
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim.x = l->grid;
  cfg.gridDim.y = cfg.gridDim.z = 1;
  cfg.blockDim.x = l->block;
  cfg.blockDim.y = cfg.blockDim.z = 1;
  cfg.dynamicSmemBytes = l->smem;
  cfg.stream = stream;
  cfg.attrs = at;
  if (l->cluster) {
    memset(&at[cfg.numAttrs], 0, sizeof at[0]);
    at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    at[cfg.numAttrs].val.clusterDim.x = l->cluster;
    at[cfg.numAttrs].val.clusterDim.y = 1;
    at[cfg.numAttrs].val.clusterDim.z = 1;
    cfg.numAttrs++;
  }
  if (l->pdl) {
    memset(&at[cfg.numAttrs], 0, sizeof at[0]);
    at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs++;
  }
  return fp4idx__cuda_check(cudaLaunchKernelExC(&cfg, l->func, args), "launch");
}
