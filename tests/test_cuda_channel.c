/* test_cuda_channel.c -- channels (PROTOCOL.md "Channels") called by a real
 * CUDA stream: an fp4idxd on the CUDA backend, this process's CUDA regions
 * for q, w, lens and outputs, and a channel whose calls are stream
 * operations (cuStreamWriteValue / cuStreamWaitValue through the client
 * library). Checks: every call's outputs equal the bytes the socket's region
 * path (fp4idx_client_score_region / _topk_region) writes, for full logits
 * and top-k over 64, 16,384 and 100,000 keys and several rows and heads; a
 * captured CUDA graph of many calls replayed 3 times gives those bytes each
 * time; a bad descriptor completes with its error and the stream goes on; a
 * channel closed while its call waits, and a daemon killed while the stream
 * waits, release the stream with ECONN; a client process that exits with
 * calls pending leaves the daemon with no channel and no connection. Every
 * wait on a stream is bounded (cudaStreamQuery against a deadline): a lost
 * completion fails the test instead of hanging it. Skips cleanly without a
 * GPU. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "client_check.h"
#include "daemon_harness.h"
#include "fp4idx_client.h"
#include "test_util.h"

#define CK(x) cr_assert_eq((x), cudaSuccess, "%s: %s", #x, cudaGetErrorString(x))
/* The longest any stream may take to pass a call, however slow the GPU. */
#define WAIT_MS 60000

static fp4idx_test_daemon_t gpu_;

/* A CUDA daemon on device 0, or a skip when it does not come up. */
static void start_gpu(void) {
  int code = 0;
  int rc = fp4idx_test_daemon_start_cuda(&gpu_, "1G", &code);
  if (rc == 1) cr_skip_test("no usable GPU (fp4idxd --backend cuda exited %d)", code);
  cr_assert_eq(rc, 0, "fp4idxd --backend cuda did not start");
}

static void stop_gpu(void) {
  if (gpu_.pid) fp4idx_test_daemon_stop(&gpu_);
}

/* cudaMemset of device memory and cudaMemcpy from pageable memory return
 * before the device holds the bytes: the daemon (another process, another
 * stream) must see them, so the test waits for them first. */
#define LANDED() CK(cudaDeviceSynchronize())

static int have_gpu(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n > 0;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Waits for the stream with a deadline: cudaSuccess, the stream's error, or
 * cudaErrorNotReady when the deadline passed first. */
static cudaError_t wait_stream(cudaStream_t s, int ms) {
  double end = now_ms() + ms;
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) return e;
    if (now_ms() > end) return cudaErrorNotReady;
    usleep(50);
  }
}

/* Waits for the stream; on a missed deadline the channel is closed (which
 * writes ECONN into its pending completion words, so the stream ends) and
 * the test fails. */
#define WAIT(s, ch)                                                                      \
  do {                                                                                   \
    cudaError_t e_ = wait_stream((s), WAIT_MS);                                          \
    if (e_ == cudaErrorNotReady) {                                                       \
      fp4idx_client_channel_close(ch);                                                   \
      cr_assert_fail("the stream did not pass the channel call in %d ms", WAIT_MS);      \
    }                                                                                    \
    CK(e_);                                                                              \
  } while (0)

static fp4idx_client_t *open_client(void) {
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_not_null(c);
  cr_assert_eq(fp4idx_client_set_timeout(c, 120000), FP4IDX_OK);
  CHECK(c, fp4idx_client_connect(c, gpu_.sock));
  return c;
}

static void fill_bf16(uint16_t *v, size_t n, uint64_t seed, int lo, int hi, int div) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  for (size_t i = 0; i < n; i++)
    v[i] = fp4idx_test_f64_to_bf16((double)fp4idx_test_rng_range(&rng, lo, hi) / div);
}

/* ---- the setting: three sequences, an input and an output region ----------- */

enum { NSEQ = 3, RMAX = 8, HMAX = 128 };
static const uint64_t seq_id[NSEQ] = {1, 2, 3};
static const uint32_t seq_keys[NSEQ] = {64, 16384, 100000};

/* Input region: q [RMAX,HMAX,128] bf16 at 0, w [RMAX,HMAX] at W_AT, lens
 * [RMAX] at LENS_AT. Output region: OUT_SLOTS slots of OUT_SLOT bytes each;
 * a case writes the channel's results into its slot and the socket's into
 * the slot OUT_SLOTS / 2 further. */
#define W_AT ((size_t)RMAX * HMAX * 128 * 2)
#define LENS_AT (W_AT + (size_t)RMAX * HMAX * 2)
#define IN_BYTES (LENS_AT + 4096)
#define OUT_SLOT ((size_t)RMAX * 100000 * 4)
#define OUT_SLOTS 32
#define OUT_BYTES (OUT_SLOT * OUT_SLOTS)

typedef struct {
  fp4idx_client_t *c;
  void *din, *dout;
  uint64_t rin, rout;
  uint16_t q[RMAX * HMAX * 128], w[RMAX * HMAX];
  cudaStream_t stream;
} setting_t;

static void setting_up(setting_t *s, int with_keys) {
  memset(s, 0, sizeof *s);
  CK(cudaSetDevice(0));
  CK(cudaFree(0)); /* the primary context, current on this thread */
  s->c = open_client();
  if (with_keys)
    for (int i = 0; i < NSEQ; i++) {
      uint16_t *keys = malloc((size_t)seq_keys[i] * 128 * 2);
      cr_assert_not_null(keys);
      fill_bf16(keys, (size_t)seq_keys[i] * 128, 100 + (uint64_t)i, -12, 12, 4);
      CHECK(s->c, fp4idx_client_append_bf16(s->c, seq_id[i], keys, seq_keys[i],
                                            FP4IDX_ROUNDING_RNE, NULL, NULL));
      free(keys);
    }
  fill_bf16(s->q, sizeof s->q / 2, 2, -8, 8, 8);
  fill_bf16(s->w, sizeof s->w / 2, 3, 0, 8, 8);
  CK(cudaMalloc(&s->din, IN_BYTES));
  CK(cudaMalloc(&s->dout, OUT_BYTES));
  CK(cudaMemset(s->din, 0, IN_BYTES));
  CK(cudaMemset(s->dout, 0, OUT_BYTES));
  LANDED();
  CHECK(s->c, fp4idx_client_region_register_device(s->c, s->din, IN_BYTES, &s->rin));
  CHECK(s->c, fp4idx_client_region_register_device(s->c, s->dout, OUT_BYTES, &s->rout));
  CK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
}

static void setting_down(setting_t *s) {
  CK(cudaStreamDestroy(s->stream));
  fp4idx_client_close(s->c);
  CK(cudaFree(s->din));
  CK(cudaFree(s->dout));
}

static fp4idx_client_channel_t *open_channel(setting_t *s, uint32_t slots) {
  fp4idx_client_channel_t *ch = NULL;
  CHECK(s->c, fp4idx_client_channel_open(s->c, slots, s->rin, s->rin, s->rin, s->rout, &ch));
  cr_assert_neq(fp4idx_client_channel_device_block(ch), 0u, "the block has no device mapping");
  return ch;
}

/* One case: a sequence, rows, heads, top-k (0: full logits), lens or not. */
typedef struct {
  int seq;        /* index into seq_id */
  uint32_t rows, heads, k;
  int use_lens;
} case_t;

static const case_t cases[] = {
    {0, 1, 32, 0, 0},    {0, 4, 64, 0, 1},    {0, 2, 32, 16, 0},   {0, 4, 64, 2048, 1},
    {1, 1, 64, 0, 0},    {1, 4, 32, 0, 1},    {1, 8, 64, 512, 1},  {1, 3, 16, 2048, 0},
    {2, 1, 64, 0, 0},    {2, 4, 32, 0, 1},    {2, 2, 64, 2048, 1}, {2, 8, 32, 512, 0},
    {2, 1, 128, 1, 0},   {1, 2, 128, 64, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* The lens of a case: a spread below the sequence's keys, the first full. */
static void case_lens(const case_t *k, int32_t *lens) {
  uint32_t n = seq_keys[k->seq];
  for (uint32_t r = 0; r < k->rows; r++) lens[r] = (int32_t)(r == 0 ? n : 1 + (n * (r + 1)) / 11);
}

/* The width of a full-logits case (max lens, or the sequence's keys). */
static uint32_t case_width(const case_t *k) {
  if (!k->use_lens) return seq_keys[k->seq];
  int32_t lens[RMAX];
  case_lens(k, lens);
  int32_t m = 0;
  for (uint32_t r = 0; r < k->rows; r++) m = lens[r] > m ? lens[r] : m;
  return (uint32_t)m;
}

/* Bytes of a case's outputs, and the channel call for it at output slot. */
static size_t case_bytes(const case_t *k) {
  return k->k ? (size_t)k->rows * k->k * 8 + (size_t)k->rows * 4
              : (size_t)k->rows * case_width(k) * 4;
}

static fp4idx_client_channel_call_t case_call(const case_t *k, int slot) {
  uint64_t at = (uint64_t)slot * OUT_SLOT;
  uint64_t rk = (uint64_t)k->rows * k->k * 4;
  return (fp4idx_client_channel_call_t){
      .seq = seq_id[k->seq], .rows = k->rows, .heads = k->heads, .q_offset = 0,
      .w_offset = W_AT, .lens_offset = k->use_lens ? (int64_t)LENS_AT : -1,
      .logits_offset = at + (k->k ? rk : 0), .positions_offset = at, .counts_offset = at + 2 * rk};
}

/* q and w of a case as [rows,heads,128] / [rows,heads], C-ordered. */
static void case_inputs(const setting_t *s, const case_t *k, uint16_t *q, uint16_t *w) {
  for (uint32_t r = 0; r < k->rows; r++)
    for (uint32_t h = 0; h < k->heads; h++) {
      memcpy(q + ((size_t)r * k->heads + h) * 128, s->q + ((size_t)r * HMAX + h) * 128, 256);
      w[(size_t)r * k->heads + h] = s->w[(size_t)r * HMAX + h];
    }
}

/* Puts a case's inputs in the input region (synchronously). */
static void case_upload(setting_t *s, const case_t *k) {
  static uint16_t q[RMAX * HMAX * 128], w[RMAX * HMAX];
  int32_t lens[RMAX];
  case_inputs(s, k, q, w);
  case_lens(k, lens);
  CK(cudaMemcpy(s->din, q, (size_t)k->rows * k->heads * 256, cudaMemcpyHostToDevice));
  CK(cudaMemcpy((uint8_t *)s->din + W_AT, w, (size_t)k->rows * k->heads * 2,
                cudaMemcpyHostToDevice));
  CK(cudaMemcpy((uint8_t *)s->din + LENS_AT, lens, sizeof lens, cudaMemcpyHostToDevice));
  LANDED();
}

/* The socket's answer to a case, written into output slot `slot` of the
 * output region; returned as host bytes (case_bytes long, malloc'd). */
static uint8_t *case_socket(setting_t *s, const case_t *k, int slot) {
  static uint16_t q[RMAX * HMAX * 128], w[RMAX * HMAX];
  int32_t lens[RMAX];
  case_inputs(s, k, q, w);
  case_lens(k, lens);
  fp4idx_client_channel_call_t a = case_call(k, slot);
  size_t n = case_bytes(k);
  uint8_t *at = (uint8_t *)s->dout + (size_t)slot * OUT_SLOT;
  CK(cudaMemset(at, 0x5A, n));
  LANDED();
  if (k->k)
    CHECK(s->c, fp4idx_client_topk_region(s->c, a.seq, k->heads, k->rows, q, w,
                                          k->use_lens ? lens : NULL, k->k, s->rout,
                                          a.positions_offset, a.logits_offset,
                                          a.counts_offset));
  else
    CHECK(s->c, fp4idx_client_score_region(s->c, a.seq, k->heads, k->rows, q, w,
                                           k->use_lens ? lens : NULL, case_width(k), s->rout,
                                           a.logits_offset));
  uint8_t *b = malloc(n);
  cr_assert_not_null(b);
  CK(cudaMemcpy(b, at, n, cudaMemcpyDeviceToHost));
  return b;
}

/* Enqueues a case's channel call on s->stream (outputs at output slot). */
static uint32_t case_enqueue(setting_t *s, fp4idx_client_channel_t *ch, const case_t *k,
                             int slot) {
  fp4idx_client_channel_call_t a = case_call(k, slot);
  uint32_t t = 0;
  if (k->k)
    CHECK(s->c, fp4idx_client_channel_topk(ch, s->stream, &a, k->k, &t));
  else
    CHECK(s->c, fp4idx_client_channel_score(ch, s->stream, &a, case_width(k), &t));
  return t;
}

/* Where got and want (n bytes of case k's outputs) first differ, in words:
 * the offset, the output it falls in, the two 32-bit words there, how many
 * bytes differ and how many of got's hold `fill` (never written). */
static void describe_diff(const case_t *k, const uint8_t *got, const uint8_t *want, size_t n,
                          int fill, char *out, size_t cap) {
  size_t first = n, differ = 0, filled = 0;
  for (size_t b = 0; b < n; b++) {
    if (got[b] != want[b]) {
      differ++;
      if (first == n) first = b;
    }
    if (fill >= 0 && got[b] == (uint8_t)fill) filled++;
  }
  size_t rk = (size_t)k->rows * k->k * 4, w = first & ~(size_t)3;
  const char *part = !k->k ? "logits" : first < rk ? "positions" : first < 2 * rk ? "values" : "counts";
  uint32_t g = 0, x = 0;
  memcpy(&g, got + w, w + 4 <= n ? 4 : n - w);
  memcpy(&x, want + w, w + 4 <= n ? 4 : n - w);
  snprintf(out, cap,
           "first at byte %zu of %zu (%s), word there 0x%08x, the socket's 0x%08x; %zu bytes "
           "differ, %zu hold the fill 0x%02x",
           first, n, part, g, x, differ, filled, fill & 0xff);
}

/* fill: the byte the slot held before the call (-1: unknown). */
static void expect_slot(setting_t *s, const case_t *k, int slot, const uint8_t *want,
                        const char *what, int i, int fill) {
  size_t n = case_bytes(k);
  uint8_t *got = malloc(n);
  cr_assert_not_null(got);
  CK(cudaMemcpy(got, (uint8_t *)s->dout + (size_t)slot * OUT_SLOT, n, cudaMemcpyDeviceToHost));
  if (memcmp(got, want, n) != 0) {
    char why[256];
    describe_diff(k, got, want, n, fill, why, sizeof why);
    cr_assert_fail("%s, case %d (%u keys, rows %u, heads %u, k %u, lens %d, slot %d): the "
                   "channel's bytes differ from the socket's: %s",
                   what, i, seq_keys[k->seq], k->rows, k->heads, k->k, k->use_lens, slot, why);
  }
  free(got);
}

TestSuite(cuda_channel, .fini = stop_gpu, .timeout = 600);

Test(cuda_channel, calls_equal_the_socket_bytes) {
  if (!have_gpu()) cr_skip_test("no CUDA device");
  start_gpu();
  setting_t s;
  setting_up(&s, 1);
  fp4idx_client_channel_t *ch = open_channel(&s, 4);
  for (int i = 0; i < NCASES; i++) {
    const case_t *k = &cases[i];
    case_upload(&s, k);
    uint8_t *want = case_socket(&s, k, OUT_SLOTS / 2);
    CK(cudaMemsetAsync(s.dout, 0xA5, case_bytes(k), s.stream)); /* not the socket's 0x5A */
    uint32_t t = case_enqueue(&s, ch, k, 0);
    WAIT(s.stream, ch);
    cr_assert_eq(fp4idx_client_channel_status(ch, t), FP4IDX_OK, "case %d: %s", i,
                 fp4idx_status_name(fp4idx_client_channel_status(ch, t)));
    expect_slot(&s, k, 0, want, "one call", i, 0xA5);
    free(want);
  }
  fp4idx_client_stats_t *st = NULL;
  CHECK(s.c, fp4idx_client_stats(s.c, &st));
  cr_assert_eq(st->channels, 1u);
  cr_assert_eq(st->channel_calls, (uint64_t)NCASES);
  cr_assert_eq(st->channel_errors, 0u);
  fp4idx_client_free(st);
  CHECK(s.c, fp4idx_client_channel_close(ch));
  setting_down(&s);
}

/* A graph of NG calls over the cases without lens, all reading one upload
 * (q [RMAX,HMAX,128], w [RMAX,HMAX]): a call of R rows and H heads reads
 * its leading R*H*128 and R*H values, which the socket is given as they
 * are. Each call writes its own output slot (slot i % 31). */
Test(cuda_channel, a_captured_graph_of_calls_replays_to_the_same_bytes) {
  if (!have_gpu()) cr_skip_test("no CUDA device");
  start_gpu();
  setting_t s;
  setting_up(&s, 1);
  enum { NG = 40 };
  const case_t *g[NG];
  int ng = 0;
  while (ng < NG)
    for (int i = 0; i < NCASES && ng < NG; i++)
      if (!cases[i].use_lens) g[ng++] = &cases[i];
  const case_t wide = {2, RMAX, HMAX, 0, 0};
  case_upload(&s, &wide); /* exactly s.q and s.w */
  uint8_t *want[NG];
  uint8_t *at = (uint8_t *)s.dout + (size_t)(OUT_SLOTS - 1) * OUT_SLOT;
  for (int i = 0; i < NG; i++) {
    const case_t *k = g[i];
    size_t n = case_bytes(k);
    CK(cudaMemset(at, 0x5A, n));
    LANDED();
  LANDED();
    fp4idx_client_channel_call_t a = case_call(k, OUT_SLOTS - 1);
    if (k->k)
      CHECK(s.c, fp4idx_client_topk_region(s.c, a.seq, k->heads, k->rows, s.q, s.w, NULL, k->k,
                                           s.rout, a.positions_offset, a.logits_offset,
                                           a.counts_offset));
    else
      CHECK(s.c, fp4idx_client_score_region(s.c, a.seq, k->heads, k->rows, s.q, s.w, NULL,
                                            case_width(k), s.rout, a.logits_offset));
    want[i] = malloc(n);
    cr_assert_not_null(want[i]);
    CK(cudaMemcpy(want[i], at, n, cudaMemcpyDeviceToHost));
  }
  enum { RING = 8 };
  fp4idx_client_channel_t *ch = open_channel(&s, RING);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  uint32_t tk[NG];
  CK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < NG; i++) tk[i] = case_enqueue(&s, ch, g[i], i % (OUT_SLOTS - 1));
  CK(cudaStreamEndCapture(s.stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  /* calls i and i + 31 share an output slot: the later one's bytes stay */
  for (int replay = 0; replay < 3; replay++) {
    CK(cudaMemsetAsync(s.dout, 0xC3 + replay, (size_t)(OUT_SLOTS - 1) * OUT_SLOT, s.stream));
    CK(cudaGraphLaunch(exec, s.stream));
    WAIT(s.stream, ch);
    /* the statuses first, so a failed call is told from wrong bytes: the
     * last RING calls' completion words are still in the ring, the others'
     * errors are counted in stats */
    for (int i = NG - RING; i < NG; i++)
      cr_assert_eq(fp4idx_client_channel_status(ch, tk[i]), FP4IDX_OK,
                   "graph replay %d, call %d (ticket %u): %s", replay, i, tk[i],
                   fp4idx_status_name(fp4idx_client_channel_status(ch, tk[i])));
    fp4idx_client_stats_t *rs = NULL;
    CHECK(s.c, fp4idx_client_stats(s.c, &rs));
    uint64_t calls = rs->channel_calls, errors = rs->channel_errors;
    fp4idx_client_free(rs);
    cr_assert_eq(errors, 0u, "graph replay %d: %" PRIu64 " of %" PRIu64 " calls erred", replay,
                 errors, calls);
    for (int i = 0; i < NG; i++) {
      if (i + (OUT_SLOTS - 1) < NG) continue; /* overwritten by a later call */
      char what[64];
      snprintf(what, sizeof what, "graph replay %d", replay);
      expect_slot(&s, g[i], i % (OUT_SLOTS - 1), want[i], what, i, 0xC3 + replay);
    }
  }
  fp4idx_client_stats_t *st = NULL;
  CHECK(s.c, fp4idx_client_stats(s.c, &st));
  cr_assert_eq(st->channel_calls, 3u * NG, "%" PRIu64 " calls", st->channel_calls);
  cr_assert_eq(st->channel_errors, 0u);
  fp4idx_client_free(st);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  for (int i = 0; i < NG; i++) free(want[i]);
  CHECK(s.c, fp4idx_client_channel_close(ch));
  setting_down(&s);
}

Test(cuda_channel, a_bad_descriptor_completes_with_its_error_and_the_stream_goes_on) {
  if (!have_gpu()) cr_skip_test("no CUDA device");
  start_gpu();
  setting_t s;
  setting_up(&s, 1);
  fp4idx_client_channel_t *ch = open_channel(&s, 2);
  const case_t *k = &cases[6];
  case_upload(&s, k);
  uint8_t *want = case_socket(&s, k, OUT_SLOTS / 2);
  fp4idx_client_channel_call_t good = case_call(k, 0), bad[4];
  bad[0] = good, bad[0].seq = 999;              /* unknown sequence */
  bad[1] = good, bad[1].q_offset = 2 * IN_BYTES; /* outside the input region */
  bad[2] = good, bad[2].w_offset = 1;            /* misaligned */
  bad[3] = good, bad[3].counts_offset = OUT_BYTES; /* outside the output region */
  const int want_st[4] = {FP4IDX_ENOSEQ, FP4IDX_EREGION, FP4IDX_EREGION, FP4IDX_EREGION};
  uint32_t t[5];
  CK(cudaMemsetAsync(s.dout, 0xA5, case_bytes(k), s.stream));
  for (int i = 0; i < 4; i++) CHECK(s.c, fp4idx_client_channel_topk(ch, s.stream, &bad[i], k->k, &t[i]));
  CHECK(s.c, fp4idx_client_channel_topk(ch, s.stream, &good, k->k, &t[4]));
  WAIT(s.stream, ch);
  /* slots are reused round the ring: only the last two tickets are readable */
  cr_assert_eq(fp4idx_client_channel_status(ch, t[3]), want_st[3]);
  cr_assert_eq(fp4idx_client_channel_status(ch, t[4]), FP4IDX_OK);
  expect_slot(&s, k, 0, want, "after bad calls", 6, 0xA5);
  /* each bad call alone, its status read before the ring comes round */
  for (int i = 0; i < 4; i++) {
    CHECK(s.c, fp4idx_client_channel_topk(ch, s.stream, &bad[i], k->k, &t[i]));
    WAIT(s.stream, ch);
    cr_assert_eq(fp4idx_client_channel_status(ch, t[i]), want_st[i], "bad call %d: %s", i,
                 fp4idx_status_name(fp4idx_client_channel_status(ch, t[i])));
  }
  fp4idx_client_stats_t *st = NULL;
  CHECK(s.c, fp4idx_client_stats(s.c, &st));
  cr_assert_eq(st->channel_errors, 8u);
  cr_assert_eq(st->channel_calls, 9u);
  fp4idx_client_free(st);
  free(want);
  CHECK(s.c, fp4idx_client_channel_close(ch));
  setting_down(&s);
}

/* Inputs in device memory are snapshotted and checked as a socket's are: a
 * NaN in q, an inf in w, a lens above the width each complete with their
 * error and leave the outputs as they were; the good call after them gives
 * the socket's bytes. */
Test(cuda_channel, bad_values_in_device_inputs_complete_with_their_error) {
  if (!have_gpu()) cr_skip_test("no CUDA device");
  start_gpu();
  setting_t s;
  setting_up(&s, 1);
  fp4idx_client_channel_t *ch = open_channel(&s, 2);
  const case_t *k = &cases[6]; /* 16,384 keys, 8 rows x 64 heads, top-512, lens */
  case_upload(&s, k);
  uint8_t *want = case_socket(&s, k, OUT_SLOTS / 2);
  fp4idx_client_channel_call_t call = case_call(k, 0);
  const uint16_t nan = 0x7fc0, inf = 0x7f80;
  const int32_t wide = (int32_t)seq_keys[k->seq] + 1;
  struct {
    size_t at;
    const void *v;
    size_t n;
    int st;
  } bad[3] = {
      {(size_t)(3 * k->heads + 5) * 128 * 2 + 2 * 77, &nan, 2, FP4IDX_ENONFINITE}, /* q[3,5,77] */
      {W_AT + 2 * (size_t)(k->rows * k->heads - 1), &inf, 2, FP4IDX_ENONFINITE},   /* last w */
      {LENS_AT + 4 * 2, &wide, 4, FP4IDX_ERANGE},                                  /* lens[2] */
  };
  for (int i = 0; i < 3; i++) {
    uint8_t keep[4];
    CK(cudaMemcpy(keep, (uint8_t *)s.din + bad[i].at, bad[i].n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy((uint8_t *)s.din + bad[i].at, bad[i].v, bad[i].n, cudaMemcpyHostToDevice));
    LANDED();
    CK(cudaMemsetAsync(s.dout, 0xA5, case_bytes(k), s.stream));
    uint32_t t = 0;
    CHECK(s.c, fp4idx_client_channel_topk(ch, s.stream, &call, k->k, &t));
    WAIT(s.stream, ch);
    cr_assert_eq(fp4idx_client_channel_status(ch, t), bad[i].st, "bad input %d: %s", i,
                 fp4idx_status_name(fp4idx_client_channel_status(ch, t)));
    uint8_t *got = malloc(case_bytes(k));
    cr_assert_not_null(got);
    CK(cudaMemcpy(got, s.dout, case_bytes(k), cudaMemcpyDeviceToHost));
    for (size_t b = 0; b < case_bytes(k); b++)
      cr_assert_eq(got[b], 0xA5, "bad input %d: the failed call wrote output byte %zu", i, b);
    free(got);
    CK(cudaMemcpy((uint8_t *)s.din + bad[i].at, keep, bad[i].n, cudaMemcpyHostToDevice));
    LANDED();
  }
  uint32_t t = 0;
  CHECK(s.c, fp4idx_client_channel_topk(ch, s.stream, &call, k->k, &t));
  WAIT(s.stream, ch);
  cr_assert_eq(fp4idx_client_channel_status(ch, t), FP4IDX_OK);
  expect_slot(&s, k, 0, want, "after bad inputs", 6, -1);
  free(want);
  CHECK(s.c, fp4idx_client_channel_close(ch));
  setting_down(&s);
}

/* The number of channels and connections the daemon has, read by a new
 * connection until they are 0 and 1 (itself), with a deadline. */
static void expect_no_channel_left(void) {
  fp4idx_client_t *c = open_client();
  double end = now_ms() + WAIT_MS;
  uint64_t chans = 0, conns = 0;
  for (;;) {
    fp4idx_client_stats_t *st = NULL;
    CHECK(c, fp4idx_client_stats(c, &st));
    chans = st->channels;
    conns = st->connections;
    fp4idx_client_free(st);
    if ((chans == 0 && conns == 1) || now_ms() > end) break;
    usleep(1000);
  }
  cr_assert_eq(chans, 0u, "the daemon still holds %" PRIu64 " channels", chans);
  cr_assert_eq(conns, 1u, "the daemon still holds %" PRIu64 " connections", conns);
  fp4idx_client_info_t info;
  CHECK(c, fp4idx_client_info(c, &info));
  fp4idx_client_close(c);
}

Test(cuda_channel, a_channel_closed_while_its_call_waits_releases_the_stream) {
  if (!have_gpu()) cr_skip_test("no CUDA device");
  start_gpu();
  setting_t s;
  setting_up(&s, 1);
  fp4idx_client_channel_t *ch = open_channel(&s, 2);
  const case_t *k = &cases[6];
  case_upload(&s, k);
  /* the daemon stopped: the rung call is never served, and channel_close's
   * reply never comes (the client gives up after its timeout) */
  cr_assert_eq(fp4idx_test_daemon_kill(&gpu_, SIGSTOP), 0);
  uint32_t t = case_enqueue(&s, ch, k, 0);
  cr_assert_eq(cudaStreamQuery(s.stream), cudaErrorNotReady, "a call passed a stopped daemon");
  cr_assert_eq(fp4idx_client_set_timeout(s.c, 300), FP4IDX_OK);
  (void)t; /* ch is gone after the close: the stream's release is the check */
  int st = fp4idx_client_channel_close(ch); /* writes ECONN into the waiting slot */
  cr_assert_neq(st, FP4IDX_OK, "channel_close answered by a stopped daemon");
  cudaError_t e = wait_stream(s.stream, WAIT_MS);
  cr_assert_eq(fp4idx_test_daemon_kill(&gpu_, SIGCONT), 0);
  cr_assert_eq(e, cudaSuccess, "the stream was not released by the close: %s",
               cudaGetErrorString(e));
  setting_down(&s);
  expect_no_channel_left();
}

Test(cuda_channel, a_killed_daemon_releases_the_waiting_stream_with_econn) {
  if (!have_gpu()) cr_skip_test("no CUDA device");
  start_gpu();
  setting_t s;
  setting_up(&s, 1);
  fp4idx_client_channel_t *ch = open_channel(&s, 2);
  const case_t *k = &cases[10];
  case_upload(&s, k);
  cr_assert_eq(fp4idx_test_daemon_kill(&gpu_, SIGSTOP), 0);
  uint32_t t = case_enqueue(&s, ch, k, 0);
  cr_assert_eq(cudaStreamQuery(s.stream), cudaErrorNotReady, "a call passed a stopped daemon");
  cr_assert_eq(fp4idx_test_daemon_kill(&gpu_, SIGKILL), 0);
  cudaError_t e = wait_stream(s.stream, WAIT_MS);
  if (e == cudaErrorNotReady) fp4idx_client_channel_close(ch);
  cr_assert_eq(e, cudaSuccess, "the stream was not released: %s", cudaGetErrorString(e));
  cr_assert_eq(fp4idx_client_channel_status(ch, t), FP4IDX_ECONN);
  /* later calls complete with ECONN at once (or are refused) */
  fp4idx_client_channel_call_t a = case_call(k, 0);
  uint32_t t2 = 0;
  int st = fp4idx_client_channel_topk(ch, s.stream, &a, k->k, &t2);
  cr_assert(st == FP4IDX_ECONN || st == FP4IDX_OK, "%s", fp4idx_status_name(st));
  if (st == FP4IDX_OK) {
    WAIT(s.stream, ch);
    cr_assert_eq(fp4idx_client_channel_status(ch, t2), FP4IDX_ECONN);
  }
  fp4idx_client_channel_close(ch);
  fp4idx_test_daemon_wait(&gpu_, 10000);
  gpu_.pid = 0;
  CK(cudaStreamDestroy(s.stream));
  fp4idx_client_close(s.c);
  CK(cudaFree(s.din));
  CK(cudaFree(s.dout));
}

Test(cuda_channel, a_client_that_exits_with_calls_pending_leaves_no_channel) {
  /* fork before this process touches CUDA: the child makes the calls */
  start_gpu();
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    if (!have_gpu()) _exit(77);
    setting_t s;
    setting_up(&s, 1);
    fp4idx_client_channel_t *ch = open_channel(&s, 4);
    const case_t *k = &cases[9]; /* 100,000 keys, full logits */
    case_upload(&s, k);
    for (int i = 0; i < 16; i++) (void)case_enqueue(&s, ch, k, i % 4);
    (void)ch;
    _exit(0); /* the calls pending, nothing closed */
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) cr_skip_test("no CUDA device");
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (%d)", status);
  expect_no_channel_left();
  cr_assert(fp4idx_test_daemon_alive(&gpu_));
  /* the daemon still scores */
  fp4idx_client_t *c = open_client();
  uint16_t keys[64 * 128], q[4 * 128], w[4];
  fill_bf16(keys, 64 * 128, 7, -12, 12, 4);
  fill_bf16(q, 4 * 128, 8, -8, 8, 8);
  fill_bf16(w, 4, 9, 0, 8, 8);
  CHECK(c, fp4idx_client_append_bf16(c, 77, keys, 64, FP4IDX_ROUNDING_RNE, NULL, NULL));
  int32_t pos[8], cnt[1];
  float val[8];
  CHECK(c, fp4idx_client_topk(c, 77, 4, 1, q, w, NULL, 8, pos, val, cnt));
  cr_assert_eq(cnt[0], 8);
  fp4idx_client_close(c);
}
