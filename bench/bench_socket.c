/* bench_socket.c -- fp4idx-bench-socket: the daemon measured through its
 * socket, the way a client sees it (libfp4idx-client over a Unix socket).
 *
 * Spawns a real fp4idxd (CPU backend, temporary socket) or connects to a
 * running one with -s, then measures:
 *   (a) round-trip latency of small requests: score of 1 sequence of 64 keys,
 *       R=4 rows, H=32 heads (full logits, and top-k 16), and info;
 *       warm-up, then N calls each, p50/p90/p99/max in us;
 *   (b) append throughput in keys/s, 8192-key requests of bf16, f32 and
 *       packed fp4 keys, K keys in all per run (one fresh sequence per run);
 *   (c) a score of R=4 x H=32 rows at context 100,000 through the socket,
 *       full logits and top-k 16, next to the same score computed in this
 *       process by the CPU backend (no socket, no codec): the difference is
 *       what the socket path costs at that size;
 *   (d) the region cases (bench_socket_regions.c): full logits and top-2048
 *       through the socket, into a host region, into a CUDA region
 *       (--region-cuda), at context --region-ctx (default 100,000), and the
 *       append rate of bf16 keys from a host region.
 * Every measurement runs -r times (default 3) and the table shows the median
 * of the per-run figures. --csv writes every raw sample, --hist a log-binned
 * latency histogram of (a) (bench/plot_socket.py draws both).
 *
 * The spawned daemon gets the default thread count (one per core); the
 * in-process compute of (c) runs while that daemon is idle, with as many
 * threads. With -s the (c) compute column is still this machine's CPU
 * backend, so it only compares when the daemon runs here with --backend cpu.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_socket_regions.h"
#include "bench_time.h"
#include "fp4idx_backend.h"
#include "fp4idx_client.h"

#ifndef FP4IDXD_PATH
#define FP4IDXD_PATH "fp4idxd"
#endif

#define HEADS 32
#define ROWS 4
#define SMALL_KEYS 64
#define TOPK 16
#define CHUNK 8192
#define BIG_CTX 100000

typedef struct opts_s {
  const char *sock;    /* -s: a running daemon; NULL: spawn one */
  const char *daemon;  /* -d: fp4idxd binary */
  const char *csv;
  const char *hist;
  int iters;           /* -n latency calls per run */
  int warmup;          /* -w */
  long append_keys;    /* -k keys per append run */
  int big_iters;       /* -b 100k scores per run */
  int reps;            /* -r runs of everything */
  long region_ctx;     /* --region-ctx: context of (d) */
  int region_cuda;     /* --region-cuda: CUDA regions in (d) */
} opts_t;

static FILE *g_csv;

static double median3(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void csv_samples(const char *name, int rep, const double *v, size_t n) {
  if (!g_csv) return;
  for (size_t i = 0; i < n; i++) fprintf(g_csv, "%s,%d,%zu,%.3f\n", name, rep, i, v[i]);
}

static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even; values are finite */
  return (uint16_t)(u >> 16);
}

/* Deterministic pseudo-random floats in about [-2, 2) (xorshift). */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (float)((g_rng >> 40) & 0xFFFFFF) / (float)(1 << 22) - 2.0f;
}

static void fill_bf16(uint16_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) v[i] = bf16_of(frand());
}

/* ---- the daemon ------------------------------------------------------------ */

static pid_t g_pid;
static char g_dir[128], g_sockpath[192];

static int daemon_spawn(const char *bin) {
  snprintf(g_dir, sizeof g_dir, "/tmp/fp4idx-bench-socket.XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_sockpath, sizeof g_sockpath, "%s/d.sock", g_dir);
  pid_t parent = getpid();
  g_pid = fork();
  if (g_pid < 0) return -1;
  if (g_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* no daemon outlives the benchmark */
    if (getppid() != parent) _exit(127);
    execl(bin, bin, "--socket", g_sockpath, "--backend", "cpu", "--cache-bytes",
          "512M", "--log-level", "warn", (char *)NULL);
    fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
    _exit(127);
  }
  /* Wait until it answers (10 s). */
  for (int i = 0; i < 1000; i++) {
    fp4idx_client_t *c = fp4idx_client_new();
    int ok = c && fp4idx_client_connect(c, g_sockpath) == FP4IDX_OK;
    fp4idx_client_close(c);
    if (ok) return 0;
    int st;
    if (waitpid(g_pid, &st, WNOHANG) == g_pid) {
      g_pid = 0;
      return -1;
    }
    usleep(10000);
  }
  return -1;
}

static void daemon_stop(void) {
  if (g_pid > 0) {
    int st;
    kill(g_pid, SIGTERM);
    waitpid(g_pid, &st, 0);
    g_pid = 0;
  }
  if (g_dir[0]) {
    unlink(g_sockpath);
    rmdir(g_dir);
    g_dir[0] = '\0';
  }
}

#define CHECK(call)                                                          \
  do {                                                                       \
    fp4idx_status_t st_ = (call);                                            \
    if (st_ != FP4IDX_OK) {                                                  \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,     \
              fp4idx_strerror(st_), fp4idx_client_last_error(c));            \
      goto fail;                                                             \
    }                                                                        \
  } while (0)

/* The daemon's own count and latency sum of `op` (stats): the time from a
 * whole request frame read to its response encoded, queue wait included. */
static int op_stats(fp4idx_client_t *c, const char *op, uint64_t *count, double *sum_us) {
  fp4idx_client_stats_t *st = NULL;
  *count = 0;
  *sum_us = 0;
  CHECK(fp4idx_client_stats(c, &st));
  for (uint32_t i = 0; i < st->nops; i++)
    if (strcmp(st->ops[i].op, op) == 0) {
      *count = st->ops[i].count;
      *sum_us = st->ops[i].latency_sum_us;
    }
  fp4idx_client_free(st);
  return 0;
fail:
  return -1;
}

/* Mean daemon-side us of the `op` requests since (*count, *sum_us), which it
 * then advances. */
static double op_mean_since(fp4idx_client_t *c, const char *op, uint64_t *count,
                            double *sum_us) {
  uint64_t n0 = *count;
  double s0 = *sum_us;
  if (op_stats(c, op, count, sum_us) || *count <= n0) return NAN;
  return (*sum_us - s0) / (double)(*count - n0);
}

/* A CPU backend in this process holding keys[n] (bf16) at slots 0..n-1 in
 * pages of 64, as the daemon stores them: *pages [ceil(n/64)] for the score
 * calls (free() it; fp4idx_backend_destroy(*b)). 0 or -1. */
static int local_backend(const uint16_t *keys, int64_t n, fp4idx_backend_t **b,
                         int32_t **pages) {
  const int32_t P = 64;
  const int64_t npages = (n + P - 1) / P;
  int64_t *slots = malloc((size_t)n * sizeof *slots);
  int rc = -1;
  *b = NULL;
  *pages = malloc((size_t)npages * sizeof **pages);
  if (!slots || !*pages) goto out;
  for (int64_t i = 0; i < n; i++) slots[i] = i;
  for (int64_t i = 0; i < npages; i++) (*pages)[i] = (int32_t)i;
  if (fp4idx_backend_cpu_create(b, 0) || (*b)->ops->pool_create(*b, npages, P) ||
      (*b)->ops->store(*b, keys, FP4IDX_DTYPE_BF16, n, slots, FP4IDX_ROUND_RNE))
    goto out;
  rc = 0;
out:
  if (rc) {
    fprintf(stderr, "local CPU backend failed\n");
    fp4idx_backend_destroy(*b);
    *b = NULL;
    free(*pages);
    *pages = NULL;
  }
  free(slots);
  return rc;
}

/* ---- (a) latency ----------------------------------------------------------- */

enum { LAT_SCORE, LAT_TOPK, LAT_INFO, LAT_N };
static const char *const lat_name[LAT_N] = {"score_logits", "score_topk16", "info"};

/* One call of case k. */
static fp4idx_status_t lat_call(fp4idx_client_t *c, int k, uint64_t seq, const uint16_t *q,
                                const uint16_t *w, float *logits, int32_t *pos,
                                int32_t *counts) {
  uint32_t width;
  fp4idx_client_info_t info;
  switch (k) {
  case LAT_SCORE:
    return fp4idx_client_score_into(c, seq, HEADS, ROWS, q, w, NULL, logits,
                                    ROWS * SMALL_KEYS, &width);
  case LAT_TOPK:
    return fp4idx_client_topk(c, seq, HEADS, ROWS, q, w, NULL, TOPK, pos, logits, counts);
  default:
    return fp4idx_client_info(c, &info);
  }
}

/* Log bins for the histogram: 8 per octave from 1 us. */
#define HBINS 192
static int hbin(double us) {
  if (us < 1.0) return 0;
  int b = (int)floor(log2(us) * 8.0);
  return b >= HBINS ? HBINS - 1 : b;
}

static int bench_latency(fp4idx_client_t *c, const opts_t *o, double res[LAT_N][6],
                         uint64_t hist[LAT_N][HBINS]) {
  const uint64_t seq = 1;
  uint16_t *keys = malloc((size_t)SMALL_KEYS * 128 * 2);
  uint16_t q[ROWS * HEADS * 128], w[ROWS * HEADS];
  float logits[ROWS * SMALL_KEYS];
  int32_t pos[ROWS * TOPK], counts[ROWS];
  double *s = malloc((size_t)o->iters * sizeof *s);
  double per[LAT_N][6][16];
  fp4idx_backend_t *b = NULL;
  int32_t *pages = NULL;
  uint64_t dn;
  double dsum;
  int rc = -1;
  if (!keys || !s) goto fail;
  fill_bf16(keys, (size_t)SMALL_KEYS * 128);
  fill_bf16(q, sizeof q / 2);
  fill_bf16(w, sizeof w / 2);
  fp4idx_client_drop(c, seq); /* a leftover from an earlier run on -s */
  CHECK(fp4idx_client_append_bf16(c, seq, keys, SMALL_KEYS, FP4IDX_ROUNDING_RNE, NULL, NULL));
  if (local_backend(keys, SMALL_KEYS, &b, &pages)) goto fail;
  int32_t lens[ROWS];
  for (int r = 0; r < ROWS; r++) lens[r] = SMALL_KEYS;
  fp4idx_backend_seq_t ss = {.pages = pages, .n_keys = SMALL_KEYS, .rows = ROWS,
                           .width = SMALL_KEYS, .q = q, .w = w, .lens = lens};
  float tval[ROWS * TOPK];
  fp4idx_backend_batch_t lb[2] = {
      {.heads = HEADS, .n_seqs = 1, .seqs = &ss, .logits = logits},
      {.heads = HEADS, .n_seqs = 1, .seqs = &ss, .topk = TOPK, .topk_pos = pos,
       .topk_val = tval, .topk_count = counts}};
  for (int rep = 0; rep < o->reps; rep++) {
    for (int k = 0; k < LAT_N; k++) {
      const char *op = k == LAT_INFO ? "info" : "score";
      for (int i = 0; i < o->warmup; i++)
        CHECK(lat_call(c, k, seq, q, w, logits, pos, counts));
      if (op_stats(c, op, &dn, &dsum)) goto fail;
      for (int i = 0; i < o->iters; i++) {
        double t0 = now_us();
        CHECK(lat_call(c, k, seq, q, w, logits, pos, counts));
        s[i] = now_us() - t0;
      }
      csv_samples(lat_name[k], rep, s, (size_t)o->iters);
      for (int i = 0; i < o->iters; i++) hist[k][hbin(s[i])]++;
      qsort(s, (size_t)o->iters, sizeof *s, cmp_double);
      per[k][0][rep] = pct(s, (size_t)o->iters, 50);
      per[k][1][rep] = pct(s, (size_t)o->iters, 90);
      per[k][2][rep] = pct(s, (size_t)o->iters, 99);
      per[k][3][rep] = s[o->iters - 1];
      per[k][4][rep] = op_mean_since(c, op, &dn, &dsum);
      /* The same score in this process's CPU backend: what compute costs. */
      per[k][5][rep] = NAN;
      if (k != LAT_INFO) {
        for (int i = 0; i < o->warmup; i++) CHECK(b->ops->score(b, &lb[k]));
        for (int i = 0; i < o->iters; i++) {
          double t0 = now_us();
          CHECK(b->ops->score(b, &lb[k]));
          s[i] = now_us() - t0;
        }
        qsort(s, (size_t)o->iters, sizeof *s, cmp_double);
        per[k][5][rep] = pct(s, (size_t)o->iters, 50);
      }
    }
  }
  for (int k = 0; k < LAT_N; k++)
    for (int j = 0; j < 6; j++) res[k][j] = median3(per[k][j], o->reps);
  CHECK(fp4idx_client_drop(c, seq));
  rc = 0;
fail:
  fp4idx_backend_destroy(b);
  free(pages);
  free(keys);
  free(s);
  return rc;
}

/* ---- (b) append throughput ------------------------------------------------- */

static const char *const app_name[3] = {"append_bf16", "append_f32", "append_fp4"};

/* res[d] = median keys/s, mbs[d] = median MB/s of key data sent. */
static int bench_append(fp4idx_client_t *c, const opts_t *o, double res[3], double mbs[3]) {
  const size_t nreq = (size_t)((o->append_keys + CHUNK - 1) / CHUNK);
  uint16_t *kb = malloc((size_t)CHUNK * 128 * 2);
  float *kf = malloc((size_t)CHUNK * 128 * 4);
  void *kq = NULL;
  size_t nq = 0;
  double *s = malloc(nreq * sizeof *s);
  double per[3][16];
  int rc = -1;
  if (!kb || !kf || !s) goto fail;
  fill_bf16(kb, (size_t)CHUNK * 128);
  for (size_t i = 0; i < (size_t)CHUNK * 128; i++) {
    uint32_t u = (uint32_t)kb[i] << 16;
    memcpy(&kf[i], &u, 4); /* the same values as f32 */
  }
  /* Valid packed slots: the daemon's own quantization of the same keys. */
  CHECK(fp4idx_client_append_bf16(c, 99, kb, CHUNK, FP4IDX_ROUNDING_RNE, NULL, NULL));
  CHECK(fp4idx_client_read(c, 99, 0, UINT64_MAX, 0, &kq, &nq));
  CHECK(fp4idx_client_drop(c, 99));
  if (nq != CHUNK) goto fail;
  const size_t itemsz[3] = {128 * 2, 128 * 4, 68};
  for (int rep = 0; rep < o->reps; rep++) {
    for (int d = 0; d < 3; d++) {
      const uint64_t seq = 100 + (uint64_t)d;
      const void *src = d == 0 ? (const void *)kb : d == 1 ? (const void *)kf : kq;
      long left = o->append_keys;
      double total = 0;
      for (size_t r = 0; r < nreq; r++, left -= CHUNK) {
        size_t n = left < CHUNK ? (size_t)left : CHUNK;
        double t0 = now_us();
        CHECK(fp4idx_client_append(c, seq, (fp4idx_client_keys_t)(d + 1), src, n,
                                   FP4IDX_ROUNDING_RNE, NULL, NULL));
        s[r] = now_us() - t0;
        total += s[r];
      }
      csv_samples(app_name[d], rep, s, nreq);
      per[d][rep] = (double)o->append_keys / (total * 1e-6);
      CHECK(fp4idx_client_drop(c, seq));
    }
  }
  for (int d = 0; d < 3; d++) {
    res[d] = median3(per[d], o->reps);
    mbs[d] = res[d] * (double)itemsz[d] / 1e6;
  }
  rc = 0;
fail:
  free(kb);
  free(kf);
  fp4idx_client_free(kq);
  free(s);
  return rc;
}

/* ---- (c) context 100,000: socket vs compute -------------------------------- */

/* Full-logits and top-k scores at BIG_CTX, p50 us (median over runs):
 * res[0..1] round trip through the socket; res[2..3] in-process with the CPU
 * backend on the same keys; res[4..5] inside the daemon (its stats, per
 * call); res[6..7] socket minus daemon, paired per call (transport, client
 * and the waits between them). */
static int bench_big(fp4idx_client_t *c, const opts_t *o, double res[8]) {
  const uint64_t seq = 7;
  uint16_t *keys = malloc((size_t)BIG_CTX * 128 * 2);
  uint16_t q[ROWS * HEADS * 128], w[ROWS * HEADS];
  float *logits = malloc((size_t)ROWS * BIG_CTX * 4);
  int32_t pos[ROWS * TOPK], counts[ROWS];
  float tval[ROWS * TOPK];
  double *s = malloc(8 * (size_t)o->big_iters * sizeof *s);
  double per[8][16];
  fp4idx_backend_t *b = NULL;
  int32_t *pages = NULL;
  int rc = -1;
  if (!keys || !logits || !s) goto fail;
  fill_bf16(keys, (size_t)BIG_CTX * 128);
  fill_bf16(q, sizeof q / 2);
  fill_bf16(w, sizeof w / 2);
  fp4idx_client_drop(c, seq);
  for (size_t i = 0; i < BIG_CTX; i += CHUNK) {
    size_t n = BIG_CTX - i < CHUNK ? BIG_CTX - i : CHUNK;
    CHECK(fp4idx_client_append_bf16(c, seq, keys + i * 128, n, FP4IDX_ROUNDING_RNE, NULL,
                                    NULL));
  }
  /* The same keys in a local CPU backend (page size 64, like the daemon). */
  if (local_backend(keys, BIG_CTX, &b, &pages)) goto fail;
  int32_t lens[ROWS];
  for (int r = 0; r < ROWS; r++) lens[r] = BIG_CTX;
  fp4idx_backend_seq_t ss = {.pages = pages, .n_keys = BIG_CTX, .rows = ROWS,
                           .width = BIG_CTX, .q = q, .w = w, .lens = lens};
  fp4idx_backend_batch_t full = {.heads = HEADS, .n_seqs = 1, .seqs = &ss, .logits = logits};
  fp4idx_backend_batch_t topk = {.heads = HEADS, .n_seqs = 1, .seqs = &ss, .topk = TOPK,
                               .topk_pos = pos, .topk_val = tval, .topk_count = counts};
  static const char *const name[8] = {
      "ctx100k_socket_logits", "ctx100k_socket_topk16",    "ctx100k_compute_logits",
      "ctx100k_compute_topk16", "ctx100k_daemon_logits",   "ctx100k_daemon_topk16",
      "ctx100k_overhead_logits", "ctx100k_overhead_topk16"};
  /* The four cases interleaved call by call, so that the socket and the
   * in-process figures see the same load on a shared machine. The daemon
   * side is read from its stats around the run (only these scores run). */
  double *sk[8];
  for (int k = 0; k < 8; k++) sk[k] = s + (size_t)k * (size_t)o->big_iters;
  for (int rep = 0; rep < o->reps; rep++) {
    uint64_t dn0[2] = {0, 0};
    double dsum0[2] = {0, 0};
    for (int i = -2; i < o->big_iters; i++) { /* 2 warm-up rounds */
      for (int k = 0; k < 4; k++) {
        uint32_t width;
        if (k < 2 && i >= 0 && op_stats(c, "score", &dn0[k], &dsum0[k])) goto fail;
        double t0 = now_us();
        switch (k) {
        case 0:
          CHECK(fp4idx_client_score_into(c, seq, HEADS, ROWS, q, w, NULL, logits,
                                         (size_t)ROWS * BIG_CTX, &width));
          break;
        case 1:
          CHECK(fp4idx_client_topk(c, seq, HEADS, ROWS, q, w, NULL, TOPK, pos, tval, counts));
          break;
        case 2:
          CHECK(b->ops->score(b, &full));
          break;
        default:
          CHECK(b->ops->score(b, &topk));
        }
        if (i >= 0) sk[k][i] = now_us() - t0;
        if (k < 2 && i >= 0) {
          sk[4 + k][i] = op_mean_since(c, "score", &dn0[k], &dsum0[k]);
          sk[6 + k][i] = sk[k][i] - sk[4 + k][i];
        }
      }
    }
    for (int k = 0; k < 8; k++) {
      csv_samples(name[k], rep, sk[k], (size_t)o->big_iters);
      qsort(sk[k], (size_t)o->big_iters, sizeof *s, cmp_double);
      per[k][rep] = pct(sk[k], (size_t)o->big_iters, 50);
    }
  }
  for (int k = 0; k < 8; k++) res[k] = median3(per[k], o->reps);
  CHECK(fp4idx_client_drop(c, seq));
  rc = 0;
fail:
  fp4idx_backend_destroy(b);
  free(pages);
  free(keys);
  free(logits);
  free(s);
  return rc;
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *f) {
  fprintf(f,
          "usage: fp4idx-bench-socket [options]\n"
          "  -s PATH    use the daemon on PATH (default: spawn one, CPU backend)\n"
          "  -d PATH    fp4idxd binary to spawn (default $FP4IDXD, else the build's)\n"
          "  -n N       latency calls per case and run (default 5000)\n"
          "  -w N       warm-up calls per case and run (default 500)\n"
          "  -k N       keys per append run (default 1048576)\n"
          "  -b N       context-100k scores per case and run (default 20)\n"
          "  -r N       runs of everything, median reported (default 3, max 15)\n"
          "  --csv FILE raw samples: case,run,index,us\n"
          "  --hist FILE latency histogram of (a): lo_us,hi_us,counts per case\n"
          "  --region-ctx N  context of (d), the region cases (default 100000)\n"
          "  --region-cuda   (d) also into CUDA regions (the daemon must run CUDA)\n");
}

int main(int argc, char **argv) {
  opts_t o = {.iters = 5000, .warmup = 500, .append_keys = 1L << 20, .big_iters = 20,
              .reps = 3, .region_ctx = BIG_CTX};
  static const struct option lo[] = {{"csv", required_argument, NULL, 'C'},
                                     {"hist", required_argument, NULL, 'H'},
                                     {"help", no_argument, NULL, 'h'},
                                     {"region-ctx", required_argument, NULL, 'X'},
                                     {"region-cuda", no_argument, NULL, 'U'},
                                     {NULL, 0, NULL, 0}};
  int opt;
  o.daemon = getenv("FP4IDXD") && *getenv("FP4IDXD") ? getenv("FP4IDXD") : FP4IDXD_PATH;
  while ((opt = getopt_long(argc, argv, "s:d:n:w:k:b:r:h", lo, NULL)) != -1) {
    switch (opt) {
    case 's': o.sock = optarg; break;
    case 'd': o.daemon = optarg; break;
    case 'n': o.iters = atoi(optarg); break;
    case 'w': o.warmup = atoi(optarg); break;
    case 'k': o.append_keys = atol(optarg); break;
    case 'b': o.big_iters = atoi(optarg); break;
    case 'r': o.reps = atoi(optarg); break;
    case 'C': o.csv = optarg; break;
    case 'H': o.hist = optarg; break;
    case 'X': o.region_ctx = atol(optarg); break;
    case 'U': o.region_cuda = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (o.iters < 1 || o.warmup < 0 || o.append_keys < 1 || o.big_iters < 1 || o.reps < 1 ||
      o.reps > 15 || o.region_ctx < 1 || optind != argc) {
    usage(stderr);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  fp4idx_client_t *c = NULL;
  int rc = 1;
  static uint64_t hist[LAT_N][HBINS];
  double lat[LAT_N][6], app[3], mbs[3], big[8];
  fp4idx_client_info_t info;

  if (o.csv) {
    if (!(g_csv = fopen(o.csv, "w"))) {
      perror(o.csv);
      return 1;
    }
    fprintf(g_csv, "case,run,index,us\n");
  }
  if (!o.sock) {
    if (daemon_spawn(o.daemon)) {
      fprintf(stderr, "could not start %s\n", o.daemon);
      goto fail;
    }
    o.sock = g_sockpath;
  }
  c = fp4idx_client_new();
  if (!c) goto fail;
  CHECK(fp4idx_client_set_timeout(c, 60000));
  CHECK(fp4idx_client_connect(c, o.sock));
  CHECK(fp4idx_client_info(c, &info));
  printf("daemon: %s, backend %s (%s), page %llu keys, %llu pages, max frame %llu\n",
         info.server, info.backend, info.device, (unsigned long long)info.page_size,
         (unsigned long long)info.pages_total, (unsigned long long)info.max_frame);
  printf("runs %d (median shown); latency: %d calls after %d warm-up per run\n\n", o.reps,
         o.iters, o.warmup);
  fflush(stdout);

  if (bench_latency(c, &o, lat, hist)) goto fail;
  printf("(a) round trip, 64 keys, R=%d H=%d   p50 us   p90 us   p99 us   max us"
         "  daemon us  compute us\n",
         ROWS, HEADS);
  for (int k = 0; k < LAT_N; k++) {
    char comp[32] = "-";
    if (!isnan(lat[k][5])) snprintf(comp, sizeof comp, "%.1f", lat[k][5]);
    printf("    %-33s %8.1f %8.1f %8.1f %8.1f %10.1f %11s\n", lat_name[k], lat[k][0],
           lat[k][1], lat[k][2], lat[k][3], lat[k][4], comp);
  }
  printf("    (daemon: mean time inside the daemon, frame read to response encoded;\n"
         "     compute: the same score in this process's CPU backend, p50)\n");
  fflush(stdout);

  if (bench_append(c, &o, app, mbs)) goto fail;
  printf("\n(b) append, %ld keys in %d-key requests     keys/s       MB/s sent\n",
         o.append_keys, CHUNK);
  for (int d = 0; d < 3; d++)
    printf("    %-40s %10.3g %8.0f\n", app_name[d], app[d], mbs[d]);
  fflush(stdout);

  if (bench_big(c, &o, big)) goto fail;
  printf("\n(c) score R=%d H=%d, context %d     socket us  in daemon us  compute us"
         "  socket - daemon us\n",
         ROWS, HEADS, BIG_CTX);
  printf("    %-37s %9.0f %13.0f %11.0f %19.0f\n", "full logits (1.6 MB response)", big[0],
         big[4], big[2], big[6]);
  printf("    %-37s %9.0f %13.0f %11.0f %19.0f\n", "top-k 16", big[1], big[5], big[3],
         big[7]);
  printf("    (p50s. socket: client round trip; in daemon: frame read to response\n"
         "     encoded (stats); compute: this process's CPU backend, no socket, no\n"
         "     codec, interleaved with the socket calls; socket - daemon: per call)\n");

  fflush(stdout);
  fp4idx_bench_regions_opts_t ro = {.ctx = o.region_ctx, .iters = o.big_iters,
                                    .reps = o.reps, .append_keys = o.append_keys,
                                    .cuda = o.region_cuda, .csv = g_csv};
  if (fp4idx_bench_regions(c, &ro)) goto fail;

  if (o.hist) {
    FILE *f = fopen(o.hist, "w");
    if (!f) {
      perror(o.hist);
      goto fail;
    }
    fprintf(f, "lo_us,hi_us");
    for (int k = 0; k < LAT_N; k++) fprintf(f, ",%s", lat_name[k]);
    fprintf(f, "\n");
    for (int i = 0; i < HBINS; i++) {
      uint64_t any = 0;
      for (int k = 0; k < LAT_N; k++) any |= hist[k][i];
      if (!any) continue;
      fprintf(f, "%.2f,%.2f", i ? exp2(i / 8.0) : 0.0, exp2((i + 1) / 8.0));
      for (int k = 0; k < LAT_N; k++) fprintf(f, ",%llu", (unsigned long long)hist[k][i]);
      fprintf(f, "\n");
    }
    fclose(f);
  }
  rc = 0;
fail:
  fp4idx_client_close(c);
  daemon_stop();
  if (g_csv) fclose(g_csv);
  return rc;
}
