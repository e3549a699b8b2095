/* cotenant_gemm.cu -- fp4idx-cotenant-gemm: a serving engine's load on the
 * GPU, for measuring fp4idxd beside it (bench/cotenant.sh). No framework and
 * no cuBLAS (the GPU machine carries only what we bring): C = A x B in bf16
 * with f32 accumulation on the tensor cores (WMMA), N x N x N (default
 * 4096^3, the size of a prefill GEMM), launched back to back for a given
 * number of seconds.
 *
 * Grid and block: one 128 x 128 tile of C per block of 256 threads (8
 * warps, each 32 rows x 64 columns = 2 x 4 fragments of 16 x 16), K in
 * steps of 32 staged through shared memory; (N/128)^2 blocks, 1,024 at
 * N = 4096, about 8 waves over 132 SMs, each block tens of microseconds:
 * the SMs stay full all the time, as under an engine's matrix products.
 *
 *   fp4idx-cotenant-gemm [--seconds S] [--n N] [--ready FILE] [--priority P]
 *
 * --ready FILE is created once the first product is done (the GPU is busy
 * from then on); --priority P puts the stream at priority P (0 default,
 * negative is greater). Runs until S seconds have passed or SIGTERM/SIGINT
 * comes, then prints the products done and TFLOP/s.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

using namespace nvcuda;

#define TILE 128
#define KSTEP 32
#define PAD 8 /* halves of padding per shared row: fewer bank conflicts */

#define CK(call)                                                              \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      fprintf(stderr, "cotenant: %s: %s\n", #call, cudaGetErrorString(e_));   \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

/* A [N,N] row-major, B [N,N] column-major (B^T row-major), C [N,N] f32. */
__global__ void __launch_bounds__(256) gemm_bf16(const __nv_bfloat16 *__restrict__ a,
                                                 const __nv_bfloat16 *__restrict__ b,
                                                 float *__restrict__ c, int n) {
  __shared__ __align__(32) __nv_bfloat16 sa[TILE][KSTEP + PAD];
  __shared__ __align__(32) __nv_bfloat16 sb[TILE][KSTEP + PAD];
  int warp = threadIdx.x / 32;
  int wr = warp / 2, wc = warp % 2; /* 4 x 2 warps: 32 rows x 64 cols each */
  int row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) wmma::fill_fragment(acc[i][j], 0.0f);
  for (int k0 = 0; k0 < n; k0 += KSTEP) {
    /* 128 x 32 halves of A and of B^T: 256 threads x 2 x 8 halves each */
    for (int t = threadIdx.x; t < TILE * KSTEP / 8; t += 256) {
      int r = t / (KSTEP / 8), q = (t % (KSTEP / 8)) * 8;
      *(uint4 *)&sa[r][q] = *(const uint4 *)&a[(size_t)(row0 + r) * n + k0 + q];
      *(uint4 *)&sb[r][q] = *(const uint4 *)&b[(size_t)(col0 + r) * n + k0 + q];
    }
    __syncthreads();
    for (int kk = 0; kk < KSTEP; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[4];
      for (int i = 0; i < 2; i++)
        wmma::load_matrix_sync(fa[i], &sa[wr * 32 + i * 16][kk], KSTEP + PAD);
      for (int j = 0; j < 4; j++)
        wmma::load_matrix_sync(fb[j], &sb[wc * 64 + j * 16][kk], KSTEP + PAD);
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      wmma::store_matrix_sync(&c[(size_t)(row0 + wr * 32 + i * 16) * n + col0 + wc * 64 + j * 16],
                              acc[i][j], n, wmma::mem_row_major);
}

__global__ void fill(__nv_bfloat16 *x, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = __float2bfloat16((float)((i * 2654435761u + seed) % 17) / 16.0f - 0.5f);
}

/* SIGTERM / SIGINT end the loop after the products in flight: the figures
 * are printed however the load is stopped. */
static volatile sig_atomic_t g_stop;
static void on_stop(int sig) { (void)sig; g_stop = 1; }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  double seconds = 10;
  int n = 4096, prio = 0;
  const char *ready = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ready") && i + 1 < argc) ready = argv[++i];
    else if (!strcmp(argv[i], "--priority") && i + 1 < argc) prio = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--seconds S] [--n N (multiple of 128)] [--ready FILE] "
                      "[--priority P]\n", argv[0]);
      return 2;
    }
  }
  if (n < TILE || n % TILE) {
    fprintf(stderr, "cotenant: --n %d: a multiple of %d expected\n", n, TILE);
    return 2;
  }
  signal(SIGTERM, on_stop);
  signal(SIGINT, on_stop);
  size_t nn = (size_t)n * n;
  __nv_bfloat16 *a, *b;
  float *c;
  cudaStream_t s;
  CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, prio));
  CK(cudaMalloc(&a, nn * sizeof *a));
  CK(cudaMalloc(&b, nn * sizeof *b));
  CK(cudaMalloc(&c, nn * sizeof *c));
  fill<<<1024, 256, 0, s>>>(a, nn, 1);
  CK(cudaGetLastError());
  fill<<<1024, 256, 0, s>>>(b, nn, 7);
  CK(cudaGetLastError());
  dim3 grid(n / TILE, n / TILE);
  gemm_bf16<<<grid, 256, 0, s>>>(a, b, c, n);
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(s));
  if (ready) {
    FILE *f = fopen(ready, "w");
    if (f) fclose(f);
  }
  double t0 = now_s(), t = t0;
  long done = 0;
  while (t - t0 < seconds && !g_stop) {
    for (int i = 0; i < 8; i++) gemm_bf16<<<grid, 256, 0, s>>>(a, b, c, n);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s)); /* a few ms: keeps the queue short */
    done += 8;
    t = now_s();
  }
  double tf = 2.0 * n * (double)n * n * done / (t - t0) / 1e12;
  printf("cotenant: %ld products of %d^3 bf16 in %.1f s: %.0f TFLOP/s\n", done, n, t - t0, tf);
  return 0;
}
