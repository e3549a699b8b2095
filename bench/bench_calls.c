/* bench_calls.c -- fp4idx-bench-calls: the C client's side of
 * bench/bench_python.py. Times three blocking libfp4idx-client calls against
 * a running daemon, one request in flight:
 *   info       fp4idx_client_info
 *   score64    fp4idx_client_score_into, a 64-key sequence, R=4 x H=32
 *   topk100k   fp4idx_client_topk k=16, a 100,000-key sequence, R=4 x H=32
 * The sequences and the bf16 q [4,32,128] / w [4,32] files are prepared by
 * the caller (bench_python.py), so that the Python client times the very
 * same requests. Prints one CSV line per case: case,n,p50_us,p90_us,mean_us.
 *
 *   fp4idx-bench-calls -s SOCKET -a SMALL_SEQ -B BIG_SEQ -q Q.bin -W W.bin
 *                      [-n CALLS] [-b BIG_CALLS] [-w WARMUP]
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_time.h"
#include "fp4idx_client.h"

#define ROWS 4
#define HEADS 32
#define TOPK 16

static double thread_cpu_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int load(const char *path, void *buf, size_t len) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t got = fread(buf, 1, len, f);
  int extra = fgetc(f);
  fclose(f);
  return got == len && extra == EOF ? 0 : -1;
}

typedef struct bench_s {
  fp4idx_client_t *c;
  uint64_t small, big;
  uint16_t q[ROWS * HEADS * 128], w[ROWS * HEADS];
  float logits[ROWS * 100000];
  int32_t pos[ROWS * TOPK], counts[ROWS];
} bench_t;

static fp4idx_status_t call(bench_t *b, int which) {
  fp4idx_client_info_t info;
  uint32_t width;
  switch (which) {
    case 0: return fp4idx_client_info(b->c, &info);
    case 1:
      return fp4idx_client_score_into(b->c, b->small, HEADS, ROWS, b->q, b->w, NULL,
                                      b->logits, sizeof b->logits / sizeof *b->logits,
                                      &width);
    default:
      return fp4idx_client_topk(b->c, b->big, HEADS, ROWS, b->q, b->w, NULL, TOPK,
                                b->pos, b->logits, b->counts);
  }
}

int main(int argc, char **argv) {
  static bench_t b;
  const char *sock = NULL, *qf = NULL, *wf = NULL;
  int n = 2000, nbig = 20, warm = 200, opt;
  while ((opt = getopt(argc, argv, "s:a:B:q:W:n:b:w:")) != -1) {
    switch (opt) {
      case 's': sock = optarg; break;
      case 'a': b.small = strtoull(optarg, NULL, 0); break;
      case 'B': b.big = strtoull(optarg, NULL, 0); break;
      case 'q': qf = optarg; break;
      case 'W': wf = optarg; break;
      case 'n': n = atoi(optarg); break;
      case 'b': nbig = atoi(optarg); break;
      case 'w': warm = atoi(optarg); break;
      default:
        fprintf(stderr, "usage: fp4idx-bench-calls -s SOCKET -a SMALL_SEQ -B BIG_SEQ "
                        "-q Q.bin -W W.bin [-n CALLS] [-b BIG_CALLS] [-w WARMUP]\n");
        return 2;
    }
  }
  if (!sock || !qf || !wf || n < 1 || nbig < 1 || warm < 0) {
    fprintf(stderr, "fp4idx-bench-calls: -s, -q, -W required; counts >= 1\n");
    return 2;
  }
  if (load(qf, b.q, sizeof b.q) || load(wf, b.w, sizeof b.w)) {
    fprintf(stderr, "fp4idx-bench-calls: %s / %s: not bf16 [4,32,128] / [4,32]\n", qf, wf);
    return 1;
  }
  b.c = fp4idx_client_new();
  if (!b.c || fp4idx_client_connect(b.c, sock) != FP4IDX_OK) {
    fprintf(stderr, "fp4idx-bench-calls: connect %s: %s\n", sock,
            b.c ? fp4idx_client_last_error(b.c) : "out of memory");
    fp4idx_client_close(b.c);
    return 1;
  }
  static const char *names[3] = {"info", "score64", "topk100k"};
  int rc = 0;
  for (int which = 0; which < 3 && rc == 0; which++) {
    int calls = which == 2 ? nbig : n, w = which == 2 ? (warm ? 2 : 0) : warm;
    double *t = malloc((size_t)calls * sizeof *t), sum = 0;
    double *cpu = malloc((size_t)calls * sizeof *cpu);
    if (!t || !cpu) {
      free(t);
      free(cpu);
      fp4idx_client_close(b.c);
      return 1;
    }
    for (int i = 0; i < w + calls; i++) {
      double c0 = thread_cpu_us(), t0 = now_us();
      if (call(&b, which) != FP4IDX_OK) {
        fprintf(stderr, "fp4idx-bench-calls: %s: %s\n", names[which],
                fp4idx_client_last_error(b.c));
        rc = 1;
        break;
      }
      if (i >= w) {
        sum += (t[i - w] = now_us() - t0);
        cpu[i - w] = thread_cpu_us() - c0;
      }
    }
    if (rc == 0) {
      qsort(t, (size_t)calls, sizeof *t, cmp_double);
      qsort(cpu, (size_t)calls, sizeof *cpu, cmp_double);
      printf("%s,%d,%.2f,%.2f,%.2f,%.2f\n", names[which], calls, pct(t, (size_t)calls, 50),
             pct(t, (size_t)calls, 90), sum / calls, pct(cpu, (size_t)calls, 50));
    }
    free(t);
    free(cpu);
  }
  fp4idx_client_close(b.c);
  return rc;
}
