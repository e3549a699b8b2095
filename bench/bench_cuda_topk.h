/* bench_cuda_topk.h -- the top-k benchmark of fp4idx-bench-cuda
 * (bench_cuda_topk.cu). Benchmark code only, not the product. */
#ifndef FP4IDX_BENCH_CUDA_TOPK_H
#define FP4IDX_BENCH_CUDA_TOPK_H

#ifdef __cplusplus
extern "C" {
#endif

/* `fp4idx-bench-cuda --topk [--check] [--csv FILE] [--only CASE]`: the top-k table
 * (argv[0] is "--topk"). Returns the process exit status. */
int fp4idx_bench_topk_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
