/* bench_socket.c -- fp4idx-bench-socket: the daemon measured through its
 * socket, the way a client sees it (libfp4idx-client over a Unix socket).
 *
 * Spawns a real fp4idxd (--backend cpu by default, --backend cuda for the
 * GPU, --backend nowork with -d fp4idxd-nowork for the daemon's own cost;
 * temporary socket) or connects to a running one with -s, then
 * measures (--sections, default abcd):
 *   (a) round-trip latency of small requests: score of 1 sequence of 64 keys,
 *       R=4 rows, H=32 heads (full logits, and top-k 16), and info;
 *       warm-up, then N calls each, p50/p90/p99/max in us, and the
 *       daemon's stage breakdown of each case (means per request);
 *   (b) append throughput in keys/s, 8192-key requests of bf16, f32 and
 *       packed fp4 keys, K keys in all per run (one fresh sequence per run);
 *   (c) one client, R=4 x H=32 rows, every context of --ctx (default
 *       16384,100000,400000) x every k of --topk (0 = full logits; default
 *       0,16,512,2048): p50 and p99 round trip, the daemon's own time and its stage
 *       breakdown (stats "stages": read, queue, decode, execute, upload,
 *       kernels, download, encode, wake, write; means per request), and the
 *       same score computed in this process (--local cpu|cuda|none);
 *   (d) concurrency: for every N of --clients (default 1,8,32,64), N
 *       connections on N threads, each with its own sequence of --conc-ctx
 *       keys (default 32768), scoring R=4 x H=32 top---conc-topk (default
 *       512) back to back: aggregate requests/s and p50 latency, next to ONE
 *       in-process launch of all N sequences (--local): the ratio is what
 *       the daemon delivers of the device's batched throughput.
 *   (e) the region cases (bench_socket_regions.c): full logits and top-2048
 *       through the socket, into a host region, into a CUDA region, and with
 *       q, w and the outputs all in a CUDA region (--region-cuda), at context
 *       --region-ctx (default 100,000), and the append rate of bf16 keys from
 *       a host region.
 * Every measurement runs -r times (default 3) and the table shows the median
 * of the per-run figures. --csv writes every raw sample, --hist a log-binned
 * latency histogram of (a), --summary one row per case of (a), (c) and (d)
 * with the stage means (section score_logits / score_topk16 / info for (a),
 * single for (c), concurrent for (d); bench/plot_socket.py draws (c) and
 * (d)).
 *
 * The in-process compute of (c) and (d) runs while the daemon is idle; with
 * --local cuda it creates its own CUDA backend on the same GPU (the daemon
 * holds its pool there too: size --cache-bytes to leave room).
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

#include <pthread.h>

#include "bench_socket_regions.h"
#include "bench_threads.h"
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
#define MAX_LIST 16

typedef struct opts_s {
  const char *sock;    /* -s: a running daemon; NULL: spawn one */
  const char *daemon;  /* -d: fp4idxd binary */
  const char *backend; /* --backend for the spawned daemon */
  const char *cache;   /* --cache-bytes for the spawned daemon */
  const char *local;   /* --local cpu|cuda|none */
  const char *sections;
  pid_t daemon_pid;    /* the daemon's, by SO_PEERCRED: its threads' CPU in (d) */
  const char *csv;
  const char *hist;
  const char *summary;
  int iters;           /* -n latency calls per run */
  int warmup;          /* -w */
  long append_keys;    /* -k keys per append run */
  int big_iters;       /* -b scores per case and run in (c) */
  int conc_calls;      /* --conc-calls per client and run in (d) */
  int reps;            /* -r runs of everything */
  long region_ctx;     /* --region-ctx: context of (d) */
  int region_cuda;     /* --region-cuda: CUDA regions in (d) */
  long ctx[MAX_LIST];
  int nctx;
  long topk[MAX_LIST];
  int ntopk;
  long clients[MAX_LIST];
  int nclients;
  long conc_ctx, conc_topk;
} opts_t;

static FILE *g_csv;
static int g_client_busy_us = -1; /* --client-busy-poll: fp4idx_client_set_busy_poll; -1: the library's default */
static long g_reply_region = -1;  /* --reply-region: fp4idx_client_set_reply_region; -1: the library's default */

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

static int daemon_spawn(const char *bin, const char *backend, const char *cache) {
  snprintf(g_dir, sizeof g_dir, "/tmp/fp4idx-bench-socket.XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_sockpath, sizeof g_sockpath, "%s/d.sock", g_dir);
  pid_t parent = getpid();
  g_pid = fork();
  if (g_pid < 0) return -1;
  if (g_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* no daemon outlives the benchmark */
    if (getppid() != parent) _exit(127);
    execl(bin, bin, "--socket", g_sockpath, "--backend", backend, "--cache-bytes", cache,
          "--log-level", "warn", (char *)NULL);
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

/* The backend of --local in this process ("cpu", or "cuda" when built in). */
static int local_create(const char *kind, fp4idx_backend_t **b) {
  *b = NULL;
  if (strcmp(kind, "cuda") == 0) {
#ifdef FP4IDX_BENCH_HAVE_CUDA
    return fp4idx_backend_cuda_create(b, 0) ? -1 : 0;
#else
    fprintf(stderr, "--local cuda: this build has no CUDA backend\n");
    return -1;
#endif
  }
  return fp4idx_backend_cpu_create(b, 0) ? -1 : 0;
}

/* A local backend holding `copies` sequences of keys[n] (bf16), sequence s
 * at slots s*n' .. in pages of 64 (n' = n rounded up to a page), as the
 * daemon stores them: *pages [copies * ceil(n/64)], sequence s's list at
 * s * ceil(n/64) (free() it; fp4idx_backend_destroy(*b)). 0 or -1. */
static int local_backend_n(const char *kind, const uint16_t *keys, int64_t n, int copies,
                           fp4idx_backend_t **b, int32_t **pages) {
  const int32_t P = 64;
  const int64_t np = (n + P - 1) / P, npages = np * copies;
  int64_t *slots = malloc((size_t)n * sizeof *slots);
  int rc = -1;
  *b = NULL;
  *pages = malloc((size_t)npages * sizeof **pages);
  if (!slots || !*pages) goto out;
  for (int64_t i = 0; i < npages; i++) (*pages)[i] = (int32_t)i;
  if (local_create(kind, b) || (*b)->ops->pool_create(*b, npages, P)) goto out;
  for (int c = 0; c < copies; c++) {
    for (int64_t i = 0; i < n; i++) slots[i] = (int64_t)c * np * P + i;
    if ((*b)->ops->store(*b, keys, FP4IDX_DTYPE_BF16, n, slots, FP4IDX_ROUND_RNE)) goto out;
  }
  rc = 0;
out:
  if (rc) {
    fprintf(stderr, "local %s backend failed\n", kind);
    fp4idx_backend_destroy(*b);
    *b = NULL;
    free(*pages);
    *pages = NULL;
  }
  free(slots);
  return rc;
}

static int local_backend(const uint16_t *keys, int64_t n, fp4idx_backend_t **b,
                         int32_t **pages) {
  return local_backend_n("cpu", keys, n, 1, b, pages);
}

/* ---- the daemon's stage breakdown ------------------------------------------ */

#define NSTAGE 10
static const char *const stage_name[NSTAGE] = {"read",    "queue",    "decode", "execute",
                                               "upload",  "kernels",  "download", "encode",
                                               "wake",    "write"};

/* Sums and counts of every stage, and of the "score" op, at one moment. */
typedef struct snap_s {
  double sum[NSTAGE];
  uint64_t cnt[NSTAGE];
  double score_sum;
  uint64_t score_cnt;
  int has_stages;     /* 0: a daemon before stats "stages" */
} snap_t;

static int take_snap(fp4idx_client_t *c, snap_t *o) {
  fp4idx_client_stats_t *st = NULL;
  memset(o, 0, sizeof *o);
  if (fp4idx_client_stats(c, &st) != FP4IDX_OK) return -1;
  o->has_stages = st->nstages > 0;
  for (uint32_t i = 0; i < st->nstages; i++)
    for (int k = 0; k < NSTAGE; k++)
      if (strcmp(st->stages[i].op, stage_name[k]) == 0) {
        o->sum[k] = st->stages[i].latency_sum_us;
        o->cnt[k] = st->stages[i].count;
      }
  for (uint32_t i = 0; i < st->nops; i++)
    if (strcmp(st->ops[i].op, "score") == 0) {
      o->score_sum = st->ops[i].latency_sum_us;
      o->score_cnt = st->ops[i].count;
    }
  fp4idx_client_free(st);
  return 0;
}

/* What one stats request itself adds to the stage sums (subtracted from a
 * case's delta): the mean over 8 back-to-back stats requests. */
static int stats_cost(fp4idx_client_t *c, snap_t *cost) {
  snap_t a, b;
  if (take_snap(c, &a)) return -1;
  for (int i = 0; i < 8; i++)
    if (take_snap(c, &b)) return -1;
  for (int k = 0; k < NSTAGE; k++) {
    cost->sum[k] = (b.sum[k] - a.sum[k]) / 8;
    cost->cnt[k] = (b.cnt[k] - a.cnt[k]) / 8;
  }
  return 0;
}

/* Per-request mean of each stage between before and after (n score
 * requests in between, plus the one stats request that took `after`),
 * into mean[NSTAGE]; the daemon's mean score latency into *daemon. */
static void snap_means(const snap_t *before, const snap_t *after, const snap_t *cost, int n,
                       double *mean, double *daemon) {
  for (int k = 0; k < NSTAGE; k++)
    mean[k] = n > 0 && after->has_stages
                  ? (after->sum[k] - before->sum[k] - cost->sum[k]) / n
                  : NAN;
  uint64_t dn = after->score_cnt - before->score_cnt;
  *daemon = dn ? (after->score_sum - before->score_sum) / (double)dn : NAN;
}

/* --summary: one row per case (sections a, c, d). */
static FILE *g_summary;

static void summary_row(const char *section, long ctx, long k, long clients, double p50,
                        double p90, double p99, double daemon, const double *st,
                        double compute, double outside, double agg, double local_agg,
                        const bench_threads_use_t *use) {
  if (!g_summary) return;
  fprintf(g_summary, "%s,%ld,%ld,%ld,%.2f,%.2f,%.2f", section, ctx, k, clients, p50, p90,
          daemon);
  for (int i = 0; i < NSTAGE; i++) fprintf(g_summary, ",%.2f", st ? st[i] : NAN);
  fprintf(g_summary, ",%.2f,%.2f,%.1f,%.1f,%.2f", compute, outside, agg, local_agg, p99);
  fprintf(g_summary, ",%.1f,%.1f,%.1f,%.1f\n", use ? use->worker : NAN, use ? use->loops : NAN,
          use ? use->loop_max : NAN, use ? use->other : NAN);
  fflush(g_summary);
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
                         double stages[LAT_N][NSTAGE], uint64_t hist[LAT_N][HBINS]) {
  const uint64_t seq = 1;
  uint16_t *keys = malloc((size_t)SMALL_KEYS * 128 * 2);
  uint16_t q[ROWS * HEADS * 128], w[ROWS * HEADS];
  float logits[ROWS * SMALL_KEYS];
  int32_t pos[ROWS * TOPK], counts[ROWS];
  double *s = malloc((size_t)o->iters * sizeof *s);
  double per[LAT_N][6][16], stm[LAT_N][NSTAGE][16];
  const int local = strcmp(o->local, "none") != 0;
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
  if (local && local_backend(keys, SMALL_KEYS, &b, &pages)) goto fail;
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
      snap_t cost, s0, s1;
      if (op_stats(c, op, &dn, &dsum) || stats_cost(c, &cost) || take_snap(c, &s0)) goto fail;
      for (int i = 0; i < o->iters; i++) {
        double t0 = now_us();
        CHECK(lat_call(c, k, seq, q, w, logits, pos, counts));
        s[i] = now_us() - t0;
      }
      if (take_snap(c, &s1)) goto fail;
      double mean[NSTAGE], unused;
      snap_means(&s0, &s1, &cost, o->iters, mean, &unused);
      for (int st = 0; st < NSTAGE; st++) stm[k][st][rep] = mean[st];
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
      if (local && k != LAT_INFO) {
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
  for (int k = 0; k < LAT_N; k++) {
    for (int j = 0; j < 6; j++) res[k][j] = median3(per[k][j], o->reps);
    for (int st = 0; st < NSTAGE; st++) stages[k][st] = median3(stm[k][st], o->reps);
    summary_row(lat_name[k], k == LAT_INFO ? 0 : SMALL_KEYS, k == LAT_TOPK ? TOPK : 0, 1,
                res[k][0], res[k][1], res[k][2], res[k][4], stages[k], res[k][5], NAN, NAN,
                NAN, NULL);
  }
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

/* ---- (c) one client: contexts x top-k ------------------------------------- */

/* Appends n bf16 keys to seq in CHUNK-key requests. */
static int load_seq(fp4idx_client_t *c, uint64_t seq, const uint16_t *keys, long n) {
  fp4idx_client_drop(c, seq);
  for (long i = 0; i < n; i += CHUNK) {
    size_t m = n - i < CHUNK ? (size_t)(n - i) : CHUNK;
    CHECK(fp4idx_client_append_bf16(c, seq, keys + (size_t)i * 128, m, FP4IDX_ROUNDING_RNE,
                                    NULL, NULL));
  }
  return 0;
fail:
  return -1;
}

/* One score of case k (0 = full logits into logits[cap], else top-k). */
static fp4idx_status_t score_call(fp4idx_client_t *c, uint64_t seq, long k, const uint16_t *q,
                                  const uint16_t *w, float *logits, size_t cap, int32_t *pos,
                                  int32_t *counts) {
  uint32_t width;
  if (k == 0) return fp4idx_client_score_into(c, seq, HEADS, ROWS, q, w, NULL, logits, cap, &width);
  return fp4idx_client_topk(c, seq, HEADS, ROWS, q, w, NULL, (uint32_t)k, pos, logits, counts);
}

static int bench_matrix(fp4idx_client_t *c, const opts_t *o) {
  const uint64_t seq = 7;
  long maxctx = 0, maxk = 16;
  for (int i = 0; i < o->nctx; i++) maxctx = o->ctx[i] > maxctx ? o->ctx[i] : maxctx;
  for (int i = 0; i < o->ntopk; i++) maxk = o->topk[i] > maxk ? o->topk[i] : maxk;
  uint16_t *keys = malloc((size_t)maxctx * 128 * 2);
  uint16_t q[ROWS * HEADS * 128], w[ROWS * HEADS];
  size_t cap = (size_t)ROWS * (size_t)(maxctx > maxk ? maxctx : maxk);
  float *logits = malloc(cap * 4), *lval = malloc(cap * 4);
  int32_t *pos = malloc((size_t)ROWS * maxk * 4), counts[ROWS], lcnt[ROWS];
  int32_t *lpos = malloc((size_t)ROWS * maxk * 4);
  double *s = malloc((size_t)o->big_iters * sizeof *s), *lt = malloc((size_t)o->big_iters * sizeof *lt);
  int rc = -1;
  if (!keys || !logits || !lval || !pos || !lpos || !s || !lt) goto fail;
  fill_bf16(keys, (size_t)maxctx * 128);
  fill_bf16(q, sizeof q / 2);
  fill_bf16(w, sizeof w / 2);
  printf("\n(c) one client, score R=%d x H=%d (p50 us; stage means per request)\n", ROWS, HEADS);
  printf("    %-8s %-6s %9s %9s %9s %9s %9s |", "context", "top-k", "socket", "p99",
         "daemon", "outside", "compute");
  for (int i = 0; i < NSTAGE; i++) printf(" %8.8s", stage_name[i]);
  printf("\n");
  for (int ci = 0; ci < o->nctx; ci++) {
    const long n = o->ctx[ci];
    if (load_seq(c, seq, keys, n)) goto fail;
    fp4idx_backend_t *b = NULL;
    int32_t *pages = NULL;
    int local = strcmp(o->local, "none") != 0;
    if (local && local_backend_n(o->local, keys, n, 1, &b, &pages)) goto fail;
    int32_t lens[ROWS];
    for (int r = 0; r < ROWS; r++) lens[r] = (int32_t)n;
    fp4idx_backend_seq_t ss = {.pages = pages, .n_keys = n, .rows = ROWS, .width = n,
                               .q = q, .w = w, .lens = lens};
    for (int ki = 0; ki < o->ntopk; ki++) {
      const long k = o->topk[ki];
      double per[6][16], stm[NSTAGE][16];
      char name[64];
      snprintf(name, sizeof name, "ctx%ld_top%ld", n, k);
      for (int rep = 0; rep < o->reps; rep++) {
        for (int i = 0; i < 2; i++) CHECK(score_call(c, seq, k, q, w, logits, cap, pos, counts));
        snap_t cost, s0, s1;
        if (stats_cost(c, &cost) || take_snap(c, &s0)) goto fail;
        for (int i = 0; i < o->big_iters; i++) {
          double t0 = now_us();
          CHECK(score_call(c, seq, k, q, w, logits, cap, pos, counts));
          s[i] = now_us() - t0;
        }
        if (take_snap(c, &s1)) goto fail;
        double mean[NSTAGE], daemon;
        snap_means(&s0, &s1, &cost, o->big_iters, mean, &daemon);
        /* again, each call bracketed by stats: round trip minus the
         * daemon's own time for that call (transport, client, hops) */
        for (int i = 0; i < o->big_iters; i++) {
          uint64_t dn;
          double dsum;
          if (op_stats(c, "score", &dn, &dsum)) goto fail;
          double t0 = now_us();
          CHECK(score_call(c, seq, k, q, w, logits, cap, pos, counts));
          lt[i] = now_us() - t0 - op_mean_since(c, "score", &dn, &dsum);
        }
        qsort(lt, (size_t)o->big_iters, sizeof *lt, cmp_double);
        per[4][rep] = pct(lt, (size_t)o->big_iters, 50);
        csv_samples(name, rep, s, (size_t)o->big_iters);
        qsort(s, (size_t)o->big_iters, sizeof *s, cmp_double);
        per[0][rep] = pct(s, (size_t)o->big_iters, 50);
        per[1][rep] = pct(s, (size_t)o->big_iters, 90);
        per[5][rep] = pct(s, (size_t)o->big_iters, 99);
        per[2][rep] = daemon;
        for (int st = 0; st < NSTAGE; st++) stm[st][rep] = mean[st];
        per[3][rep] = NAN;
        if (local) {
          fp4idx_backend_batch_t lb = {.heads = HEADS, .n_seqs = 1, .seqs = &ss, .topk = (int32_t)k,
                                       .logits = k ? NULL : lval, .topk_pos = lpos,
                                       .topk_val = lval, .topk_count = lcnt};
          for (int i = 0; i < 2; i++) CHECK(b->ops->score(b, &lb));
          for (int i = 0; i < o->big_iters; i++) {
            double t0 = now_us();
            CHECK(b->ops->score(b, &lb));
            lt[i] = now_us() - t0;
          }
          qsort(lt, (size_t)o->big_iters, sizeof *lt, cmp_double);
          per[3][rep] = pct(lt, (size_t)o->big_iters, 50);
        }
      }
      double r[6], sm[NSTAGE];
      for (int j = 0; j < 6; j++) r[j] = median3(per[j], o->reps);
      for (int st = 0; st < NSTAGE; st++) sm[st] = median3(stm[st], o->reps);
      printf("    %-8ld %-6s %9.0f %9.0f %9.0f %9.0f %9.0f |", n,
             k ? (snprintf(name, 8, "%ld", k), name) : "full", r[0], r[5], r[2], r[4], r[3]);
      for (int st = 0; st < NSTAGE; st++) printf(" %8.1f", sm[st]);
      printf("\n");
      fflush(stdout);
      summary_row("single", n, k, 1, r[0], r[1], r[5], r[2], sm, r[3], r[4], NAN, NAN, NULL);
    }
    fp4idx_backend_destroy(b);
    free(pages);
  }
  printf("    (socket: client round trip, p50 and p99; daemon: its own time per score, frame\n"
         "     complete to response encoded; outside: round trip minus the daemon's\n"
         "     time, per call (a second pass, each call between two stats);\n"
         "     compute: --local %s in this process, no socket; stages: means of\n"
         "     the daemon's stats deltas)\n", o->local);
  CHECK(fp4idx_client_drop(c, seq));
  rc = 0;
fail:
  free(keys);
  free(logits);
  free(lval);
  free(pos);
  free(lpos);
  free(s);
  free(lt);
  return rc;
}

/* ---- (d) concurrency --------------------------------------------------------- */

typedef struct conc_s {
  const char *sock;
  uint64_t seq;
  long k;
  int calls;
  pthread_barrier_t *start;
  double *lat;        /* [calls] */
  int failed;
} conc_t;

static void *conc_main(void *arg) {
  conc_t *t = arg;
  fp4idx_client_t *c = fp4idx_client_new();
  uint16_t q[ROWS * HEADS * 128], w[ROWS * HEADS];
  int32_t *pos = malloc((size_t)ROWS * t->k * 4), counts[ROWS];
  float *val = malloc((size_t)ROWS * t->k * 4);
  for (size_t i = 0; i < sizeof q / 2; i++) q[i] = bf16_of((float)((i * 7 + t->seq) % 13) / 8 - 0.75f);
  for (size_t i = 0; i < sizeof w / 2; i++) w[i] = bf16_of(0.5f);
  if (!c || !pos || !val || fp4idx_client_set_timeout(c, 600000) ||
      (g_client_busy_us >= 0 && fp4idx_client_set_busy_poll(c, g_client_busy_us)) ||
      (g_reply_region >= 0 && fp4idx_client_set_reply_region(c, (size_t)g_reply_region)) ||
      fp4idx_client_connect(c, t->sock))
    t->failed = 1;
  if (!t->failed) /* warm-up */
    t->failed = fp4idx_client_topk(c, t->seq, HEADS, ROWS, q, w, NULL, (uint32_t)t->k, pos, val,
                                   counts) != FP4IDX_OK;
  pthread_barrier_wait(t->start);
  for (int i = 0; i < t->calls && !t->failed; i++) {
    double t0 = now_us();
    if (fp4idx_client_topk(c, t->seq, HEADS, ROWS, q, w, NULL, (uint32_t)t->k, pos, val,
                           counts) != FP4IDX_OK) {
      fprintf(stderr, "client %llu: %s\n", (unsigned long long)t->seq,
              fp4idx_client_last_error(c));
      t->failed = 1;
    }
    t->lat[i] = now_us() - t0;
  }
  pthread_barrier_wait(t->start);
  fp4idx_client_close(c);
  free(pos);
  free(val);
  return NULL;
}

static int bench_conc(fp4idx_client_t *c, const opts_t *o) {
  long maxn = 0;
  for (int i = 0; i < o->nclients; i++) maxn = o->clients[i] > maxn ? o->clients[i] : maxn;
  const long n = o->conc_ctx, k = o->conc_topk;
  uint16_t *keys = malloc((size_t)n * 128 * 2);
  int rc = -1;
  conc_t *t = calloc((size_t)maxn, sizeof *t);
  pthread_t *th = calloc((size_t)maxn, sizeof *th);
  double *all = malloc((size_t)maxn * o->conc_calls * sizeof *all);
  if (!keys || !t || !th || !all) goto fail;
  fill_bf16(keys, (size_t)n * 128);
  for (long i = 0; i < maxn; i++)
    if (load_seq(c, 1000 + (uint64_t)i, keys, n)) goto fail;
  printf("\n(d) %ld-key sequences, one per client, score R=%d x H=%d top-%ld, %d calls per client\n",
         n, ROWS, HEADS, k, o->conc_calls);
  printf("    %-8s %12s %10s %10s %14s %16s %7s |", "clients", "requests/s", "p50 us",
         "p90 us", "daemon us", "in-process /s", "ratio");
  for (int i = 0; i < NSTAGE; i++) printf(" %8.8s", stage_name[i]);
  printf("\n");
  for (int ni = 0; ni < o->nclients; ni++) {
    const long N = o->clients[ni];
    int nloops = 0;
    double per[6][16], stm[NSTAGE][16], cpu[4][16];
    for (int rep = 0; rep < o->reps; rep++) {
      pthread_barrier_t bar;
      pthread_barrier_init(&bar, NULL, (unsigned)N + 1);
      snap_t cost, s0, s1;
      if (stats_cost(c, &cost) || take_snap(c, &s0)) goto fail;
      for (long i = 0; i < N; i++) {
        t[i] = (conc_t){.sock = o->sock, .seq = 1000 + (uint64_t)i, .k = k,
                        .calls = o->conc_calls, .start = &bar,
                        .lat = all + (size_t)i * o->conc_calls};
        pthread_create(&th[i], NULL, conc_main, &t[i]);
      }
      pthread_barrier_wait(&bar); /* all connected and warm */
      double t0 = now_us();
      static bench_threads_t th0, th1; /* the daemon's threads' CPU time */
      bench_threads_take(o->daemon_pid, &th0);
      double tc0 = now_us();
      pthread_barrier_wait(&bar); /* all done */
      double wall = now_us() - t0, tc1 = now_us();
      bench_threads_take(o->daemon_pid, &th1);
      bench_threads_use_t u;
      bench_threads_use(&th0, &th1, tc1 - tc0, &u);
      cpu[0][rep] = u.worker, cpu[1][rep] = u.loops, cpu[2][rep] = u.loop_max;
      cpu[3][rep] = u.other;
      nloops = u.nloops;
      int failed = 0;
      for (long i = 0; i < N; i++) pthread_join(th[i], NULL), failed |= t[i].failed;
      pthread_barrier_destroy(&bar);
      if (failed) goto fail;
      if (take_snap(c, &s1)) goto fail;
      double mean[NSTAGE], daemon;
      snap_means(&s0, &s1, &cost, (int)(N * o->conc_calls), mean, &daemon);
      size_t m = (size_t)N * o->conc_calls;
      char name[64];
      snprintf(name, sizeof name, "conc%ld", N);
      csv_samples(name, rep, all, m);
      qsort(all, m, sizeof *all, cmp_double);
      per[0][rep] = (double)m / (wall * 1e-6);
      per[1][rep] = pct(all, m, 50);
      per[2][rep] = pct(all, m, 90);
      per[3][rep] = daemon;
      per[4][rep] = NAN;
      per[5][rep] = pct(all, m, 99);
      for (int st = 0; st < NSTAGE; st++) stm[st][rep] = mean[st];
    }
    /* One in-process launch of all N sequences (the device's batched rate). */
    double local_rate = NAN;
    if (strcmp(o->local, "none") != 0) {
      fp4idx_backend_t *b = NULL;
      int32_t *pages = NULL;
      if (local_backend_n(o->local, keys, n, (int)N, &b, &pages)) goto fail;
      uint16_t *q = malloc((size_t)N * ROWS * HEADS * 256), *w = malloc((size_t)N * ROWS * HEADS * 2);
      int32_t *lens = malloc((size_t)N * ROWS * 4), *lp = malloc((size_t)N * ROWS * k * 4);
      int32_t *lc = malloc((size_t)N * ROWS * 4);
      float *lv = malloc((size_t)N * ROWS * k * 4);
      fp4idx_backend_seq_t *ss = calloc((size_t)N, sizeof *ss);
      const int64_t np = (n + 63) / 64;
      fill_bf16(q, (size_t)N * ROWS * HEADS * 128);
      fill_bf16(w, (size_t)N * ROWS * HEADS);
      for (long i = 0; i < N * ROWS; i++) lens[i] = (int32_t)n;
      for (long i = 0; i < N; i++)
        ss[i] = (fp4idx_backend_seq_t){.pages = pages + i * np, .n_keys = n, .rows = ROWS,
                                       .width = n, .q = q + (size_t)i * ROWS * HEADS * 128,
                                       .w = w + (size_t)i * ROWS * HEADS, .lens = lens + i * ROWS};
      fp4idx_backend_batch_t lb = {.heads = HEADS, .n_seqs = (int32_t)N, .seqs = ss,
                                   .topk = (int32_t)k, .topk_pos = lp, .topk_val = lv,
                                   .topk_count = lc};
      double lt[16];
      int reps = o->conc_calls < 16 ? o->conc_calls : 16;
      int ok = b->ops->score(b, &lb) == FP4IDX_OK;
      for (int i = 0; ok && i < reps; i++) {
        double t0 = now_us();
        ok = b->ops->score(b, &lb) == FP4IDX_OK;
        lt[i] = now_us() - t0;
      }
      if (ok) local_rate = (double)N / (median3(lt, reps) * 1e-6);
      fp4idx_backend_destroy(b);
      free(pages), free(q), free(w), free(lens), free(lp), free(lc), free(lv), free(ss);
      if (!ok) goto fail;
    }
    double r[6], sm[NSTAGE];
    for (int j = 0; j < 6; j++) r[j] = median3(per[j], o->reps);
    bench_threads_use_t use = {.worker = median3(cpu[0], o->reps),
                               .loops = median3(cpu[1], o->reps),
                               .loop_max = median3(cpu[2], o->reps),
                               .other = median3(cpu[3], o->reps),
                               .nloops = nloops};
    for (int st = 0; st < NSTAGE; st++) sm[st] = median3(stm[st], o->reps);
    printf("    %-8ld %12.0f %10.0f %10.0f %14.0f %16.0f %6.0f%% |", N, r[0], r[1], r[2], r[3],
           local_rate, 100.0 * r[0] / local_rate);
    for (int st = 0; st < NSTAGE; st++) printf(" %8.1f", sm[st]);
    printf("\n");
    if (!isnan(use.worker) || !isnan(use.loops))
      printf("    %-8s the daemon's threads, %% of one CPU: worker %.0f, %d I/O loop(s) %.0f "
             "(busiest %.0f), other %.0f\n", "", use.worker, use.nloops, use.loops,
             use.loop_max, use.other);
    fflush(stdout);
    summary_row("concurrent", n, k, N, r[1], r[2], r[5], r[3], sm, NAN, NAN, r[0], local_rate,
                &use);
  }
  printf("    (requests/s: all clients together over the wall time; in-process /s:\n"
         "     N sequences / the p50 time of one --local %s launch of all N, no socket;\n"
         "     ratio: through the daemon vs that; the daemon's threads: on-CPU time over\n"
         "     the run (/proc/PID/task/*/schedstat), 100 = one CPU all along)\n", o->local);
  for (long i = 0; i < maxn; i++) fp4idx_client_drop(c, 1000 + (uint64_t)i);
  rc = 0;
fail:
  if (rc) fprintf(stderr, "(d) failed\n");
  free(keys);
  free(t);
  free(th);
  free(all);
  return rc;
}

/* ---- main ------------------------------------------------------------------ */

/* "a,b,c" -> v[], at most MAX_LIST; 0 or -1. */
static int parse_list(const char *s, long *v, int *n) {
  *n = 0;
  while (*s) {
    char *end;
    long x = strtol(s, &end, 10);
    if (end == s || x < 0 || *n == MAX_LIST) return -1;
    v[(*n)++] = x;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  return *n ? 0 : -1;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: fp4idx-bench-socket [options]\n"
          "  -s PATH          use the daemon on PATH (default: spawn one)\n"
          "  -d PATH          fp4idxd binary to spawn (default $FP4IDXD, else the build's)\n"
          "  --backend B      backend of the spawned daemon: cpu (default), cuda, or\n"
          "                   nowork (with -d fp4idxd-nowork: the daemon's own cost)\n"
          "  --cache-bytes S  --cache-bytes of the spawned daemon (default 1G)\n"
          "  --local L        in-process comparison backend: cpu (default), cuda, none\n"
          "                   (none: no compute column in (a), no ratio in (d))\n"
          "  --sections S     which of a, b, c, d, e to run (default abcde)\n"
          "  -n N             (a) latency calls per case and run (default 5000)\n"
          "  -w N             (a) warm-up calls per case and run (default 500)\n"
          "  -k N             (b) keys per append run (default 1048576)\n"
          "  -b N             (c) scores per case and run (default 20)\n"
          "  --ctx LIST       (c) contexts (default 16384,100000,400000)\n"
          "  --topk LIST      (c) top-k values, 0 = full logits (default 0,16,512,2048)\n"
          "  --clients LIST   (d) concurrent clients (default 1,8,32,64)\n"
          "  --conc-ctx N     (d) keys per client's sequence (default 32768)\n"
          "  --conc-topk K    (d) top-k (default 512)\n"
          "  --conc-calls N   (d) scores per client and run (default 20)\n"
          "  -r N             runs of everything, median reported (default 3, max 15)\n"
          "  --csv FILE       raw samples: case,run,index,us\n"
          "  --hist FILE      latency histogram of (a): lo_us,hi_us,counts per case\n"
          "  --summary FILE   one row per case of (a), (c) and (d), stage means and\n"
          "                   p99 included\n"
          "  --region-ctx N   (e) context of the region cases (default 100000)\n"
          "  --region-cuda    (e) also into CUDA regions (the daemon must run CUDA)\n"
          "  --client-busy-poll US  every client polls its socket US us before\n"
          "                   sleeping (fp4idx_client_set_busy_poll; default: the\n"
          "                   library's automatic window on 4+ CPUs)\n"
          "  --reply-region B every client takes top-k results of B bytes and more\n"
          "                   through its reply region (fp4idx_client_set_reply_region;\n"
          "                   0: the socket; default: the library's, 16 KiB)\n");
}

int main(int argc, char **argv) {
  opts_t o = {.iters = 5000, .warmup = 500, .append_keys = 1L << 20, .big_iters = 20,
              .conc_calls = 20, .reps = 3, .backend = "cpu", .cache = "1G", .local = "cpu",
              .sections = "abcde", .conc_ctx = 32768, .conc_topk = 512,
              .region_ctx = 100000};
  parse_list("16384,100000,400000", o.ctx, &o.nctx);
  parse_list("0,16,512,2048", o.topk, &o.ntopk);
  parse_list("1,8,32,64", o.clients, &o.nclients);
  static const struct option lo[] = {{"csv", required_argument, NULL, 'C'},
                                     {"hist", required_argument, NULL, 'H'},
                                     {"summary", required_argument, NULL, 'S'},
                                     {"backend", required_argument, NULL, 'B'},
                                     {"cache-bytes", required_argument, NULL, 'M'},
                                     {"local", required_argument, NULL, 'L'},
                                     {"sections", required_argument, NULL, 'X'},
                                     {"ctx", required_argument, NULL, 1},
                                     {"topk", required_argument, NULL, 2},
                                     {"clients", required_argument, NULL, 3},
                                     {"conc-ctx", required_argument, NULL, 4},
                                     {"conc-topk", required_argument, NULL, 5},
                                     {"conc-calls", required_argument, NULL, 6},
                                     {"help", no_argument, NULL, 'h'},
                                     {"region-ctx", required_argument, NULL, 7},
                                     {"region-cuda", no_argument, NULL, 8},
                                     {"client-busy-poll", required_argument, NULL, 9},
                                     {"reply-region", required_argument, NULL, 10},
                                     {NULL, 0, NULL, 0}};
  int opt, bad = 0;
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
    case 'S': o.summary = optarg; break;
    case 'B': o.backend = optarg; break;
    case 'M': o.cache = optarg; break;
    case 'L': o.local = optarg; break;
    case 'X': o.sections = optarg; break;
    case 1: bad |= parse_list(optarg, o.ctx, &o.nctx); break;
    case 2: bad |= parse_list(optarg, o.topk, &o.ntopk); break;
    case 3: bad |= parse_list(optarg, o.clients, &o.nclients); break;
    case 4: o.conc_ctx = atol(optarg); break;
    case 5: o.conc_topk = atol(optarg); break;
    case 6: o.conc_calls = atoi(optarg); break;
    case 7: o.region_ctx = atol(optarg); break;
    case 8: o.region_cuda = 1; break;
    case 9: g_client_busy_us = atoi(optarg); break;
    case 10: g_reply_region = atol(optarg); break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  for (int i = 0; i < o.nclients; i++) bad |= o.clients[i] < 1 || o.clients[i] > 1024;
  bad |= g_client_busy_us < -1 || g_client_busy_us > 1000000;
  bad |= g_reply_region < -1;
  for (int i = 0; i < o.nctx; i++) bad |= o.ctx[i] < 1;
  if (bad || o.iters < 1 || o.warmup < 0 || o.append_keys < 1 || o.big_iters < 1 ||
      o.big_iters > 100000 || o.conc_calls < 1 || o.conc_ctx < 1 || o.conc_topk < 1 ||
      o.reps < 1 || o.reps > 15 || o.region_ctx < 1 || optind != argc ||
      (strcmp(o.local, "cpu") && strcmp(o.local, "cuda") && strcmp(o.local, "none"))) {
    usage(stderr);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  fp4idx_client_t *c = NULL;
  int rc = 1;
  static uint64_t hist[LAT_N][HBINS];
  double lat[LAT_N][6], lat_st[LAT_N][NSTAGE], app[3], mbs[3];
  fp4idx_client_info_t info;

  if (o.csv) {
    if (!(g_csv = fopen(o.csv, "w"))) {
      perror(o.csv);
      return 1;
    }
    fprintf(g_csv, "case,run,index,us\n");
  }
  if (o.summary) {
    if (!(g_summary = fopen(o.summary, "w"))) {
      perror(o.summary);
      return 1;
    }
    fprintf(g_summary, "section,ctx,topk,clients,p50_us,p90_us,daemon_us");
    for (int i = 0; i < NSTAGE; i++) fprintf(g_summary, ",%s_us", stage_name[i]);
    fprintf(g_summary, ",compute_us,outside_us,requests_per_s,inprocess_per_s,p99_us,"
                       "worker_cpu_pct,loops_cpu_pct,loop_max_cpu_pct,other_cpu_pct\n");
  }
  if (!o.sock) {
    if (daemon_spawn(o.daemon, o.backend, o.cache)) {
      fprintf(stderr, "could not start %s\n", o.daemon);
      goto fail;
    }
    o.sock = g_sockpath;
  }
  c = fp4idx_client_new();
  if (!c) goto fail;
  CHECK(fp4idx_client_set_timeout(c, 600000));
  if (g_client_busy_us >= 0) CHECK(fp4idx_client_set_busy_poll(c, g_client_busy_us));
  if (g_reply_region >= 0) CHECK(fp4idx_client_set_reply_region(c, (size_t)g_reply_region));
  CHECK(fp4idx_client_connect(c, o.sock));
  o.daemon_pid = bench_threads_peer(o.sock);
  CHECK(fp4idx_client_info(c, &info));
  printf("daemon: %s, backend %s (%s), page %llu keys, %llu pages, max frame %llu\n",
         info.server, info.backend, info.device, (unsigned long long)info.page_size,
         (unsigned long long)info.pages_total, (unsigned long long)info.max_frame);
  printf("runs %d (median shown); in-process comparison: --local %s\n", o.reps, o.local);
  fflush(stdout);

  if (strchr(o.sections, 'a')) {
    if (bench_latency(c, &o, lat, lat_st, hist)) goto fail;
    printf("\n(a) round trip, 64 keys, R=%d H=%d   p50 us   p90 us   p99 us   max us"
           "  daemon us  compute us\n",
           ROWS, HEADS);
    for (int k = 0; k < LAT_N; k++) {
      char comp[32] = "-";
      if (!isnan(lat[k][5])) snprintf(comp, sizeof comp, "%.1f", lat[k][5]);
      printf("    %-33s %8.1f %8.1f %8.1f %8.1f %10.1f %11s\n", lat_name[k], lat[k][0],
             lat[k][1], lat[k][2], lat[k][3], lat[k][4], comp);
    }
    printf("    (%d calls after %d warm-up per run; daemon: mean time inside the daemon,\n"
           "     frame read to response encoded; compute: this process's CPU backend, p50)\n",
           o.iters, o.warmup);
    printf("    stages, us per request (means):    ");
    for (int i = 0; i < NSTAGE; i++) printf(" %8.8s", stage_name[i]);
    printf("\n");
    for (int k = 0; k < LAT_N; k++) {
      printf("    %-33s  ", lat_name[k]);
      for (int i = 0; i < NSTAGE; i++) printf(" %8.1f", lat_st[k][i]);
      printf("\n");
    }
    fflush(stdout);
  }
  if (strchr(o.sections, 'b')) {
    if (bench_append(c, &o, app, mbs)) goto fail;
    printf("\n(b) append, %ld keys in %d-key requests     keys/s       MB/s sent\n",
           o.append_keys, CHUNK);
    for (int d = 0; d < 3; d++)
      printf("    %-40s %10.3g %8.0f\n", app_name[d], app[d], mbs[d]);
    fflush(stdout);
  }
  if (strchr(o.sections, 'c') && bench_matrix(c, &o)) goto fail;
  if (strchr(o.sections, 'd') && bench_conc(c, &o)) goto fail;

  if (strchr(o.sections, 'e')) {
    fp4idx_bench_regions_opts_t ro = {.ctx = o.region_ctx, .iters = o.big_iters,
                                      .reps = o.reps, .append_keys = o.append_keys,
                                      .cuda = o.region_cuda, .csv = g_csv};
    if (fp4idx_bench_regions(c, &ro)) goto fail;
  }

  if (o.hist && strchr(o.sections, 'a')) {
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
  if (g_summary) fclose(g_summary);
  return rc;
}
