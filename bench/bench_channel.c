/* bench_channel.c -- fp4idx-bench-channel: what a score costs as seen by
 * the client's CUDA stream, channel (PROTOCOL.md "Channels") vs the socket
 * vs the socket writing into CUDA regions, against a running
 * `fp4idxd --backend cuda`:
 *
 *   big      R x H rows, 400,000 keys, top-2048
 *   small    R x H rows, 64 keys, full logits
 *   graph    a captured CUDA graph of 61 channel calls (61 sequences of
 *            32,768 keys, top-512), per call
 *
 * Channel calls are timed with CUDA events recorded on the stream around
 * the call (what the stream sees); socket calls with the host clock around
 * the blocking call (a stream-ordered caller would synchronize before and
 * enqueue after, so it sees at least this). Each figure is the median (and
 * p90) of N calls after W warm-up calls; "kernels" is the daemon's own
 * mean kernel time per call over the same calls (stats "stages" kernels,
 * the difference of two snapshots), and "added" = median - kernels; a
 * line under each case gives the mean of every stage of the daemon's path.
 *
 *   fp4idx-bench-channel -s SOCKET [-n CALLS] [-w WARMUP] [-r ROWS] [-H HEADS]
 *                        [-k BIG_KEYS]
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bench_time.h"
#include "fp4idx_client.h"

#define GRAPH_CALLS 61
#define GRAPH_KEYS 32768
#define GRAPH_TOPK 512
#define BIG_TOPK 2048
#define SMALL_KEYS 64
#define SEQ_BIG 1
#define SEQ_SMALL 2
#define SEQ_GRAPH0 100

#define CU(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                           \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)
#define FP(c, x)                                                                         \
  do {                                                                                   \
    fp4idx_status_t s_ = (x);                                                            \
    if (s_ != FP4IDX_OK) {                                                               \
      fprintf(stderr, "%s: %s (%s)\n", #x, fp4idx_client_last_error(c),                  \
              fp4idx_status_name(s_));                                                   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

typedef struct {
  fp4idx_client_t *c;
  int rows, heads, n, warm;
  long big_keys;
  uint16_t *q, *w;             /* host copies of the input region */
  void *din, *dout;
  uint64_t rin, rout;
  size_t w_at, out_bytes;
  cudaStream_t s;
  cudaEvent_t e0, e1;
  fp4idx_client_channel_t *ch;
} bench_t;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint16_t rand_bf16(int lo, int hi, int div) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  float f = (float)(lo + (int)(rng_state % (uint64_t)(hi - lo + 1))) / (float)div;
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void append_keys(bench_t *b, uint64_t seq, long n) {
  const long chunk = 65536;
  uint16_t *k = malloc((size_t)chunk * 128 * 2);
  if (!k) exit(1);
  for (long at = 0; at < n; at += chunk) {
    long m = n - at < chunk ? n - at : chunk;
    for (size_t i = 0; i < (size_t)m * 128; i++) k[i] = rand_bf16(-12, 12, 4);
    FP(b->c, fp4idx_client_append_bf16(b->c, seq, k, (size_t)m, FP4IDX_ROUNDING_RNE, NULL, NULL));
  }
  free(k);
}

/* The daemon's stage totals so far (stats "stages": sum in us and count of
 * each stage, in path order), so that two snapshots give a case's mean
 * per stage, "kernels" among them. */
#define MAX_STAGES 16
typedef struct {
  uint32_t n;
  char name[MAX_STAGES][32];
  double sum[MAX_STAGES];
  uint64_t count[MAX_STAGES];
} stages_t;

static void stages(bench_t *b, stages_t *s) {
  fp4idx_client_stats_t *st = NULL;
  FP(b->c, fp4idx_client_stats(b->c, &st));
  s->n = st->nstages < MAX_STAGES ? st->nstages : MAX_STAGES;
  for (uint32_t i = 0; i < s->n; i++) {
    snprintf(s->name[i], sizeof s->name[i], "%s", st->stages[i].op);
    s->sum[i] = st->stages[i].latency_sum_us;
    s->count[i] = st->stages[i].count;
  }
  fp4idx_client_free(st);
}

/* Mean us per call of stage `name` between snapshots a and b (0: none). */
static double stage_mean(const stages_t *a, const stages_t *b, const char *name) {
  for (uint32_t i = 0; i < a->n && i < b->n; i++)
    if (strcmp(b->name[i], name) == 0 && b->count[i] > a->count[i])
      return (b->sum[i] - a->sum[i]) / (double)(b->count[i] - a->count[i]);
  return 0;
}

/* One line of every stage's mean per call between a and b ("stages:
 * read=1.2 queue=0.4 ..."; no token of it is a bare number, so the
 * scripts' tables skip it). */
static void print_stages(const stages_t *a, const stages_t *b) {
  printf("  stages (daemon, mean us):");
  for (uint32_t i = 0; i < a->n && i < b->n; i++)
    if (b->count[i] > a->count[i])
      printf(" %s=%.1f", b->name[i], stage_mean(a, b, b->name[i]));
  printf("\n");
}

typedef enum { PATH_SOCKET, PATH_REGION, PATH_CHANNEL } path_t;
static const char *const path_name[] = {"socket", "cuda region", "channel"};

/* One call of a case on a path; returns its time in us. */
static double one(bench_t *b, path_t p, int big) {
  static float logits[16 * 128 * 4 * SMALL_KEYS];
  static int32_t pos[16 * 128 * BIG_TOPK], cnt[16 * 128];
  static float val[16 * 128 * BIG_TOPK];
  uint64_t seq = big ? SEQ_BIG : SEQ_SMALL;
  uint32_t R = (uint32_t)b->rows, H = (uint32_t)b->heads;
  uint64_t tk = (uint64_t)R * BIG_TOPK * 4;
  if (p == PATH_CHANNEL) {
    fp4idx_client_channel_call_t a = {.seq = seq, .rows = R, .heads = H, .q_offset = 0,
                                      .w_offset = b->w_at, .lens_offset = -1,
                                      .logits_offset = big ? tk : 0, .positions_offset = 0,
                                      .counts_offset = 2 * tk};
    uint32_t t = 0;
    CU(cudaEventRecord(b->e0, b->s));
    if (big)
      FP(b->c, fp4idx_client_channel_topk(b->ch, b->s, &a, BIG_TOPK, &t));
    else
      FP(b->c, fp4idx_client_channel_score(b->ch, b->s, &a, SMALL_KEYS, &t));
    CU(cudaEventRecord(b->e1, b->s));
    CU(cudaEventSynchronize(b->e1));
    FP(b->c, fp4idx_client_channel_status(b->ch, t));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, b->e0, b->e1));
    return (double)ms * 1e3;
  }
  double t0 = now_us();
  uint32_t width = 0;
  if (p == PATH_SOCKET && big)
    FP(b->c, fp4idx_client_topk(b->c, seq, H, R, b->q, b->w, NULL, BIG_TOPK, pos, val, cnt));
  else if (p == PATH_SOCKET)
    FP(b->c, fp4idx_client_score_into(b->c, seq, H, R, b->q, b->w, NULL, logits,
                                      sizeof logits / sizeof *logits, &width));
  else if (big)
    FP(b->c, fp4idx_client_topk_region(b->c, seq, H, R, b->q, b->w, NULL, BIG_TOPK, b->rout, 0,
                                       tk, 2 * tk));
  else
    FP(b->c, fp4idx_client_score_region(b->c, seq, H, R, b->q, b->w, NULL, SMALL_KEYS, b->rout,
                                        0));
  return now_us() - t0;
}

static void report(const char *what, const char *path, double *v, int n, double kern_us,
                   int per) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  double p50 = pct(v, (size_t)n, 50) / per, p90 = pct(v, (size_t)n, 90) / per;
  printf("%-34s %-12s %9.1f %9.1f %10.1f %9.1f\n", what, path, p50, p90, kern_us,
         p50 - kern_us);
}

static void run_case(bench_t *b, int big) {
  char what[64];
  if (big)
    snprintf(what, sizeof what, "%ld keys, top-%d", b->big_keys, BIG_TOPK);
  else
    snprintf(what, sizeof what, "%d keys, full logits", SMALL_KEYS);
  double *v = malloc((size_t)b->n * sizeof *v);
  if (!v) exit(1);
  for (int p = PATH_SOCKET; p <= PATH_CHANNEL; p++) {
    for (int i = 0; i < b->warm; i++) (void)one(b, (path_t)p, big);
    stages_t s0, s1;
    stages(b, &s0);
    for (int i = 0; i < b->n; i++) v[i] = one(b, (path_t)p, big);
    stages(b, &s1);
    report(what, path_name[p], v, b->n, stage_mean(&s0, &s1, "kernels"), 1);
    print_stages(&s0, &s1);
  }
  free(v);
}

static void run_graph(bench_t *b) {
  uint32_t R = (uint32_t)b->rows, H = (uint32_t)b->heads;
  uint64_t each = (uint64_t)R * GRAPH_TOPK * 8 + (uint64_t)R * 4;
  each = (each + 255) & ~(uint64_t)255;
  cudaGraph_t g;
  cudaGraphExec_t x;
  CU(cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < GRAPH_CALLS; i++) {
    uint64_t at = (uint64_t)i * each, tk = (uint64_t)R * GRAPH_TOPK * 4;
    fp4idx_client_channel_call_t a = {.seq = SEQ_GRAPH0 + (uint64_t)i, .rows = R, .heads = H,
                                      .q_offset = 0, .w_offset = b->w_at, .lens_offset = -1,
                                      .logits_offset = at + tk, .positions_offset = at,
                                      .counts_offset = at + 2 * tk};
    FP(b->c, fp4idx_client_channel_topk(b->ch, b->s, &a, GRAPH_TOPK, NULL));
  }
  CU(cudaStreamEndCapture(b->s, &g));
  CU(cudaGraphInstantiate(&x, g, 0));
  double *v = malloc((size_t)b->n * sizeof *v);
  if (!v) exit(1);
  for (int i = 0; i < b->warm; i++) CU(cudaGraphLaunch(x, b->s));
  CU(cudaStreamSynchronize(b->s));
  stages_t s0, s1;
  stages(b, &s0);
  for (int i = 0; i < b->n; i++) {
    CU(cudaEventRecord(b->e0, b->s));
    CU(cudaGraphLaunch(x, b->s));
    CU(cudaEventRecord(b->e1, b->s));
    CU(cudaEventSynchronize(b->e1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, b->e0, b->e1));
    v[i] = (double)ms * 1e3;
  }
  stages(b, &s1);
  fp4idx_client_stats_t *st = NULL;
  FP(b->c, fp4idx_client_stats(b->c, &st));
  if (st->channel_errors) {
    fprintf(stderr, "%" PRIu64 " channel calls failed\n", st->channel_errors);
    exit(1);
  }
  fp4idx_client_free(st);
  char what[64];
  snprintf(what, sizeof what, "graph of %d x %d keys, top-%d", GRAPH_CALLS, GRAPH_KEYS,
           GRAPH_TOPK);
  report(what, "channel/call", v, b->n, stage_mean(&s0, &s1, "kernels"), GRAPH_CALLS);
  print_stages(&s0, &s1);
  free(v);
  CU(cudaGraphExecDestroy(x));
  CU(cudaGraphDestroy(g));
}

int main(int argc, char **argv) {
  bench_t b = {.rows = 4, .heads = 32, .n = 200, .warm = 20, .big_keys = 400000};
  const char *sock = NULL;
  int opt;
  while ((opt = getopt(argc, argv, "s:n:w:r:H:k:")) != -1) {
    switch (opt) {
      case 's': sock = optarg; break;
      case 'n': b.n = atoi(optarg); break;
      case 'w': b.warm = atoi(optarg); break;
      case 'r': b.rows = atoi(optarg); break;
      case 'H': b.heads = atoi(optarg); break;
      case 'k': b.big_keys = atol(optarg); break;
      default:
        fprintf(stderr, "usage: %s -s SOCKET [-n CALLS] [-w WARMUP] [-r ROWS] [-H HEADS] "
                        "[-k BIG_KEYS]\n", argv[0]);
        return 2;
    }
  }
  if (!sock || b.n < 1 || b.warm < 0 || b.rows < 1 || b.rows > 16 || b.heads < 1 ||
      b.heads > 128 || b.big_keys < 1) {
    fprintf(stderr, "%s: -s SOCKET is required; -r 1..16, -H 1..128, -n >= 1\n", argv[0]);
    return 2;
  }
  CU(cudaSetDevice(0));
  CU(cudaFree(0));
  b.c = fp4idx_client_new();
  if (!b.c) return 1;
  FP(b.c, fp4idx_client_set_timeout(b.c, 600000));
  FP(b.c, fp4idx_client_connect(b.c, sock));
  fp4idx_client_info_t info;
  FP(b.c, fp4idx_client_info(b.c, &info));
  if (strcmp(info.backend, "cuda") != 0) {
    fprintf(stderr, "the daemon runs the %s backend: start it with --backend cuda\n",
            info.backend);
    return 1;
  }
  /* sequences (dropped first: a daemon reused from an earlier run) */
  uint64_t seqs[2 + GRAPH_CALLS] = {SEQ_BIG, SEQ_SMALL};
  for (int i = 0; i < GRAPH_CALLS; i++) seqs[2 + i] = SEQ_GRAPH0 + (uint64_t)i;
  for (int i = 0; i < 2 + GRAPH_CALLS; i++) (void)fp4idx_client_drop(b.c, seqs[i]);
  append_keys(&b, SEQ_BIG, b.big_keys);
  append_keys(&b, SEQ_SMALL, SMALL_KEYS);
  for (int i = 0; i < GRAPH_CALLS; i++) append_keys(&b, SEQ_GRAPH0 + (uint64_t)i, GRAPH_KEYS);
  /* inputs in a CUDA region (the channel's) and as host arrays (socket) */
  size_t nq = (size_t)b.rows * b.heads * 128, nw = (size_t)b.rows * b.heads;
  b.q = malloc(nq * 2);
  b.w = malloc(nw * 2);
  if (!b.q || !b.w) return 1;
  for (size_t i = 0; i < nq; i++) b.q[i] = rand_bf16(-8, 8, 8);
  for (size_t i = 0; i < nw; i++) b.w[i] = rand_bf16(0, 8, 8);
  b.w_at = (nq * 2 + 255) & ~(size_t)255;
  size_t in_bytes = b.w_at + nw * 2 + 4096;
  size_t graph_out = (size_t)GRAPH_CALLS *
                     (((size_t)b.rows * GRAPH_TOPK * 8 + (size_t)b.rows * 4 + 255) & ~(size_t)255);
  size_t big_out = (size_t)b.rows * BIG_TOPK * 8 + (size_t)b.rows * 4;
  b.out_bytes = graph_out > big_out ? graph_out : big_out;
  CU(cudaMalloc(&b.din, in_bytes));
  CU(cudaMalloc(&b.dout, b.out_bytes));
  CU(cudaMemcpy(b.din, b.q, nq * 2, cudaMemcpyHostToDevice));
  CU(cudaMemcpy((uint8_t *)b.din + b.w_at, b.w, nw * 2, cudaMemcpyHostToDevice));
  FP(b.c, fp4idx_client_region_register_device(b.c, b.din, in_bytes, &b.rin));
  FP(b.c, fp4idx_client_region_register_device(b.c, b.dout, b.out_bytes, &b.rout));
  FP(b.c, fp4idx_client_channel_open(b.c, 8, b.rin, b.rin, 0, b.rout, &b.ch));
  CU(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
  CU(cudaEventCreate(&b.e0));
  CU(cudaEventCreate(&b.e1));

  printf("fp4idx-bench-channel: R=%d x H=%d, %d calls after %d warm-up, device %s\n", b.rows,
         b.heads, b.n, b.warm, info.device);
  printf("%-34s %-12s %9s %9s %10s %9s\n", "case", "path", "p50_us", "p90_us", "kernels_us",
         "added_us");
  run_case(&b, 1);
  run_case(&b, 0);
  run_graph(&b);

  FP(b.c, fp4idx_client_channel_close(b.ch));
  CU(cudaEventDestroy(b.e0));
  CU(cudaEventDestroy(b.e1));
  CU(cudaStreamDestroy(b.s));
  fp4idx_client_close(b.c);
  CU(cudaFree(b.din));
  CU(cudaFree(b.dout));
  free(b.q);
  free(b.w);
  return 0;
}
