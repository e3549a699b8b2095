/* test_client_channel.c -- channels (PROTOCOL.md "Channels") against the
 * real fp4idxd on the CPU backend, with calls made by the host
 * (FP4IDX_CLIENT_CHANNEL_HOST: the same block, descriptor, doorbell and
 * completion word a CUDA stream writes): results equal the socket's bytes,
 * calls round the ring again and again give the same bytes, a bad call
 * completes with its status and the channel goes on, channel_open's
 * refusals, a channel cannot name another connection's regions, a killed
 * daemon releases a waiting call with ECONN, a ring of calls sharing output
 * slots keeps each slot's later bytes, and a client that exits with
 * its channel open leaves the daemon with no channel. The CUDA stream path
 * (cuStreamWriteValue/WaitValue) needs a GPU: test_cuda_channel.c. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_internal.h" /* fp4idx__client_call_fd: channel_open by hand */
#include "client_check.h"
#include "daemon_harness.h"
#include "fp4idx_channel.h"
#include "fp4idx_client.h"
#include "test_util.h"

static fp4idx_test_daemon_t daemon_;

static void start(void) {
  cr_assert_eq(fp4idx_test_daemon_start(&daemon_, NULL), 0, "fp4idxd did not start");
}

static void stop(void) {
  if (daemon_.pid) fp4idx_test_daemon_stop(&daemon_);
}

TestSuite(channel, .init = start, .fini = stop);

#define HOST FP4IDX_CLIENT_CHANNEL_HOST

enum { N = 2000, R = 4, H = 8, K = 32 };

static fp4idx_client_t *open_client(void) {
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_not_null(c);
  cr_assert_eq(fp4idx_client_connect(c, daemon_.sock), FP4IDX_OK, "%s",
               fp4idx_client_last_error(c));
  return c;
}

static void fill_bf16(uint16_t *v, size_t n, uint64_t seed, int lo, int hi) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  for (size_t i = 0; i < n; i++)
    v[i] = fp4idx_test_f64_to_bf16((double)fp4idx_test_rng_range(&rng, lo, hi) / 8.0);
}

/* A sequence of N keys, and one host region holding q, w, lens (inputs)
 * and room for outputs; the layout of a call in it. */
typedef struct {
  fp4idx_client_t *c;
  uint64_t region;
  uint8_t *mem;
  size_t size;
  fp4idx_client_channel_call_t call;
  uint16_t q[R * H * 128], w[R * H];
  int32_t lens[R];
} setup_t;

#define OUT_AT 65536u

static void setup(setup_t *s, uint64_t seq) {
  s->c = open_client();
  uint16_t *keys = malloc((size_t)N * 128 * 2);
  fill_bf16(keys, (size_t)N * 128, seq, -12, 12);
  CHECK(s->c, fp4idx_client_append_bf16(s->c, seq, keys, N, FP4IDX_ROUNDING_RNE, NULL, NULL));
  free(keys);
  fill_bf16(s->q, sizeof s->q / 2, 2, -8, 8);
  fill_bf16(s->w, sizeof s->w / 2, 3, 0, 8);
  int32_t lens[R] = {N, N - 1, 17, N / 2};
  memcpy(s->lens, lens, sizeof lens);
  s->size = OUT_AT + (size_t)R * N * 4;
  void *base = NULL;
  CHECK(s->c, fp4idx_client_region_create(s->c, s->size, &s->region, &base));
  s->mem = base;
  memcpy(s->mem, s->q, sizeof s->q);
  memcpy(s->mem + 32768, s->w, sizeof s->w);
  memcpy(s->mem + 40960, s->lens, sizeof s->lens);
  s->call = (fp4idx_client_channel_call_t){
      .seq = seq, .rows = R, .heads = H, .q_offset = 0, .w_offset = 32768,
      .lens_offset = 40960, .logits_offset = OUT_AT,
      .positions_offset = OUT_AT + R * K * 4, .counts_offset = OUT_AT + 2 * R * K * 4};
}

static void teardown(setup_t *s) {
  CHECK(s->c, fp4idx_client_region_destroy(s->c, s->region, s->mem, s->size));
  fp4idx_client_close(s->c);
}

static fp4idx_client_channel_t *open_channel(setup_t *s, uint32_t slots) {
  fp4idx_client_channel_t *ch = NULL;
  CHECK(s->c, fp4idx_client_channel_open(s->c, slots, s->region, s->region, s->region,
                                         s->region, &ch));
  return ch;
}

/* n channel calls on `stream`, alternating top-k (even) and full logits
 * (odd), each into output bytes filled with 0xAB first: every one gives the
 * socket's answer (pos, val, cnt; ref of `width`) and completes OK. */
static void alternate_calls(setup_t *s, fp4idx_client_channel_t *ch, void *stream, int n,
                            const int32_t *pos, const float *val, const int32_t *cnt,
                            const float *ref, uint32_t width) {
  for (int i = 0; i < n; i++) {
    uint32_t t = 0;
    memset(s->mem + OUT_AT, 0xAB, s->size - OUT_AT);
    if (i % 2 == 0) {
      CHECK(s->c, fp4idx_client_channel_topk(ch, stream, &s->call, K, &t));
      cr_assert_eq(memcmp(s->mem + s->call.positions_offset, pos, (size_t)R * K * 4), 0,
                   "call %d", i);
      cr_assert_eq(memcmp(s->mem + s->call.logits_offset, val, (size_t)R * K * 4), 0,
                   "call %d", i);
      cr_assert_eq(memcmp(s->mem + s->call.counts_offset, cnt, (size_t)R * 4), 0, "call %d", i);
    } else {
      CHECK(s->c, fp4idx_client_channel_score(ch, stream, &s->call, width, &t));
      cr_assert_eq(memcmp(s->mem + OUT_AT, ref, (size_t)R * width * 4), 0, "call %d", i);
    }
    cr_assert_eq(fp4idx_client_channel_status(ch, t), FP4IDX_OK, "call %d", i);
  }
}

Test(channel, topk_and_logits_equal_the_socket_and_repeat_round_the_ring) {
  setup_t s;
  setup(&s, 11);
  int32_t pos[R * K], cnt[R];
  float val[R * K];
  CHECK(s.c, fp4idx_client_topk(s.c, 11, H, R, s.q, s.w, s.lens, K, pos, val, cnt));
  float *ref = malloc((size_t)R * N * 4);
  uint32_t width = 0;
  CHECK(s.c, fp4idx_client_score_into(s.c, 11, H, R, s.q, s.w, s.lens, ref, (size_t)R * N,
                                      &width));
  fp4idx_client_channel_t *ch = open_channel(&s, 3);
  alternate_calls(&s, ch, HOST, 10, pos, val, cnt, ref, width); /* 10 calls over 3 slots */
  fp4idx_client_stats_t *st = NULL;
  CHECK(s.c, fp4idx_client_stats(s.c, &st));
  cr_assert_eq(st->channels, 1u);
  cr_assert_eq(st->channel_calls, 10u);
  cr_assert_eq(st->channel_errors, 0u);
  fp4idx_client_free(st);
  uint64_t open = 0;
  CHECK(s.c, fp4idx_client_channels(s.c, &open)); /* info's "channels" */
  cr_assert_eq(open, 1u);
  CHECK(s.c, fp4idx_client_channel_close(ch));
  CHECK(s.c, fp4idx_client_stats(s.c, &st));
  cr_assert_eq(st->channels, 0u);
  fp4idx_client_free(st);
  CHECK(s.c, fp4idx_client_channels(s.c, &open));
  cr_assert_eq(open, 0u);
  free(ref);
  teardown(&s);
}

Test(channel, a_bad_call_completes_with_its_status_and_the_channel_goes_on) {
  setup_t s;
  setup(&s, 12);
  fp4idx_client_channel_t *ch = open_channel(&s, 2);
  fp4idx_client_channel_call_t bad = s.call;
  uint32_t t = 0;
  bad.seq = 999; /* unknown sequence: the score path's check */
  cr_assert_eq(fp4idx_client_channel_topk(ch, HOST, &bad, K, &t), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_client_channel_status(ch, t), FP4IDX_ENOSEQ);
  bad = s.call, bad.q_offset = 1; /* misaligned: the descriptor check */
  cr_assert_eq(fp4idx_client_channel_topk(ch, HOST, &bad, K, &t), FP4IDX_EREGION);
  bad = s.call, bad.counts_offset = s.size; /* outside the region */
  cr_assert_eq(fp4idx_client_channel_topk(ch, HOST, &bad, K, &t), FP4IDX_EREGION);
  bad = s.call, bad.logits_offset = 0; /* over q */
  cr_assert_eq(fp4idx_client_channel_topk(ch, HOST, &bad, K, &t), FP4IDX_EREGION);
  cr_assert_eq(fp4idx_client_channel_score(ch, HOST, &s.call, N - 1, &t), FP4IDX_ESHAPE);
  int32_t big[R] = {N + 1, 0, 0, 0}; /* lens above the length */
  memcpy(s.mem + 40960, big, sizeof big);
  cr_assert_eq(fp4idx_client_channel_topk(ch, HOST, &s.call, K, &t), FP4IDX_ERANGE);
  memcpy(s.mem + 40960, s.lens, sizeof s.lens);
  CHECK(s.c, fp4idx_client_channel_topk(ch, HOST, &s.call, K, &t));
  CHECK(s.c, fp4idx_client_channel_close(ch));
  teardown(&s);
}

/* The CUDA graph test's pattern (test_cuda_channel.c) by the host: 40
 * calls over an 8-slot ring, call i writing output slot i % 31, so calls i
 * and i + 31 share a slot and the later one's bytes must stay there; the
 * calls cycle through 8 cases (full logits of a long sequence and small
 * top-k), so a long call's logits are followed into its slot by a short
 * top-k (calls 2 and 33, as on the H200). Each call's status is checked
 * before any bytes are. */
enum { SH_N = 2, SH_H = 16, SH_CALLS = 40, SH_RING = 8, SH_SLOTS = 31, SH_LONG = 4096 };
#define SH_W_AT 16384u
#define SH_OUT_AT 32768u
#define SH_SLOT ((size_t)2 * SH_LONG * 4)

typedef struct {
  int seq; /* 0: 64 keys, 1: SH_LONG keys */
  uint32_t rows, k;
} sh_case_t;

static const sh_case_t sh_cases[SH_RING] = {{0, 1, 0}, {0, 2, 16}, {1, 1, 0}, {1, 2, 64},
                                            {1, 2, 0}, {0, 1, 8},  {1, 1, 1}, {0, 2, 0}};

static size_t sh_bytes(const sh_case_t *k, const uint32_t *keys) {
  return k->k ? (size_t)k->rows * k->k * 8 + (size_t)k->rows * 4
              : (size_t)k->rows * keys[k->seq] * 4;
}

Test(channel, calls_sharing_output_slots_round_the_ring_keep_the_later_bytes) {
  fp4idx_client_t *c = open_client();
  const uint64_t seqs[2] = {21, 22};
  const uint32_t keys[2] = {64, SH_LONG};
  for (int i = 0; i < 2; i++) {
    uint16_t *kv = malloc((size_t)keys[i] * 128 * 2);
    cr_assert_not_null(kv);
    fill_bf16(kv, (size_t)keys[i] * 128, 40 + (uint64_t)i, -12, 12);
    CHECK(c, fp4idx_client_append_bf16(c, seqs[i], kv, keys[i], FP4IDX_ROUNDING_RNE, NULL,
                                       NULL));
    free(kv);
  }
  static uint16_t q[SH_N * SH_H * 128], w[SH_N * SH_H];
  fill_bf16(q, sizeof q / 2, 5, -8, 8);
  fill_bf16(w, sizeof w / 2, 6, 0, 8);
  size_t size = SH_OUT_AT + SH_SLOTS * SH_SLOT;
  uint64_t region = 0;
  void *base = NULL;
  CHECK(c, fp4idx_client_region_create(c, size, &region, &base));
  uint8_t *mem = base;
  memcpy(mem, q, sizeof q);
  memcpy(mem + SH_W_AT, w, sizeof w);
  /* each case's socket answer, laid out as a channel call writes it */
  uint8_t *want[SH_RING];
  for (int i = 0; i < SH_RING; i++) {
    const sh_case_t *k = &sh_cases[i];
    want[i] = malloc(sh_bytes(k, keys));
    cr_assert_not_null(want[i]);
    if (k->k) {
      size_t rk = (size_t)k->rows * k->k * 4;
      CHECK(c, fp4idx_client_topk(c, seqs[k->seq], SH_H, k->rows, q, w, NULL, k->k,
                                  (int32_t *)want[i], (float *)(want[i] + rk),
                                  (int32_t *)(want[i] + 2 * rk)));
    } else {
      uint32_t width = 0;
      CHECK(c, fp4idx_client_score_into(c, seqs[k->seq], SH_H, k->rows, q, w, NULL,
                                        (float *)want[i], (size_t)k->rows * keys[k->seq],
                                        &width));
      cr_assert_eq(width, keys[k->seq]);
    }
  }
  fp4idx_client_channel_t *ch = NULL;
  CHECK(c, fp4idx_client_channel_open(c, SH_RING, region, region, 0, region, &ch));
  for (int round = 0; round < 3; round++) {
    memset(mem + SH_OUT_AT, 0xC3 + round, SH_SLOTS * SH_SLOT);
    for (int i = 0; i < SH_CALLS; i++) {
      const sh_case_t *k = &sh_cases[i % SH_RING];
      uint64_t at = SH_OUT_AT + (uint64_t)(i % SH_SLOTS) * SH_SLOT;
      uint64_t rk = (uint64_t)k->rows * k->k * 4;
      fp4idx_client_channel_call_t a = {
          .seq = seqs[k->seq], .rows = k->rows, .heads = SH_H, .q_offset = 0,
          .w_offset = SH_W_AT, .lens_offset = -1, .logits_offset = at + (k->k ? rk : 0),
          .positions_offset = at, .counts_offset = at + 2 * rk};
      uint32_t t = 0;
      int st = k->k ? fp4idx_client_channel_topk(ch, HOST, &a, k->k, &t)
                    : fp4idx_client_channel_score(ch, HOST, &a, keys[k->seq], &t);
      cr_assert_eq(st, FP4IDX_OK, "round %d, call %d: %s (%s)", round, i,
                   fp4idx_status_name(st), fp4idx_client_last_error(c));
      cr_assert_eq(fp4idx_client_channel_status(ch, t), FP4IDX_OK, "round %d, call %d", round,
                   i);
    }
    for (int i = SH_CALLS - SH_SLOTS; i < SH_CALLS; i++) {
      const sh_case_t *k = &sh_cases[i % SH_RING];
      const uint8_t *got = mem + SH_OUT_AT + (size_t)(i % SH_SLOTS) * SH_SLOT;
      cr_assert_eq(memcmp(got, want[i % SH_RING], sh_bytes(k, keys)), 0,
                   "round %d, call %d (slot %d, %u keys, rows %u, k %u): the channel's bytes "
                   "differ from the socket's",
                   round, i, i % SH_SLOTS, keys[k->seq], k->rows, k->k);
    }
  }
  fp4idx_client_stats_t *st = NULL;
  CHECK(c, fp4idx_client_stats(c, &st));
  cr_assert_eq(st->channel_calls, 3u * SH_CALLS);
  cr_assert_eq(st->channel_errors, 0u);
  fp4idx_client_free(st);
  CHECK(c, fp4idx_client_channel_close(ch));
  for (int i = 0; i < SH_RING; i++) free(want[i]);
  CHECK(c, fp4idx_client_region_destroy(c, region, mem, size));
  fp4idx_client_close(c);
}

/* channel_open by hand: fd, slots and regions as given. */
static int raw_open(fp4idx_client_t *c, int fd, uint32_t slots, uint64_t size, uint64_t q,
                    uint64_t out) {
  fp4idx_request_t req = {.op = FP4IDX_OP_CHANNEL_OPEN};
  req.u.channel_open = (fp4idx_channel_open_req_t){.slots = slots, .size = size,
                                                   .q_region = q, .w_region = q,
                                                   .out_region = out};
  fp4idx_response_t resp;
  return fp4idx__client_call_fd(c, &req, fd, &resp);
}

static int block_fd(uint32_t slots, int seal, int init) {
  size_t n = fp4idx_channel_block_bytes(slots);
  int fd = memfd_create("test-channel", MFD_ALLOW_SEALING);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)n), 0);
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert_neq(p, MAP_FAILED);
  if (init) fp4idx_channel_block_init(p, n, slots);
  munmap(p, n);
  if (seal) cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  return fd;
}

Test(channel, open_refuses_bad_blocks_unknown_regions_and_a_fifth_channel) {
  setup_t s;
  setup(&s, 13);
  uint64_t n = fp4idx_channel_block_bytes(4);
  cr_assert_eq(raw_open(s.c, -1, 4, n, s.region, s.region), FP4IDX_EREGION);
  int fd = block_fd(4, 0, 1); /* not sealed */
  cr_assert_eq(raw_open(s.c, fd, 4, n, s.region, s.region), FP4IDX_EREGION);
  close(fd);
  fd = block_fd(4, 1, 0); /* not initialised: bad magic */
  cr_assert_eq(raw_open(s.c, fd, 4, n, s.region, s.region), FP4IDX_EREGION);
  cr_assert(strstr(fp4idx_client_last_error(s.c), "magic"), "%s", fp4idx_client_last_error(s.c));
  close(fd);
  fd = block_fd(4, 1, 1);
  cr_assert_eq(raw_open(s.c, fd, 8, n, s.region, s.region), FP4IDX_EREGION); /* slots lie */
  cr_assert_eq(raw_open(s.c, fd, 4, n, s.region + 7, s.region), FP4IDX_ENOREGION);
  cr_assert_eq(raw_open(s.c, fd, 4, n, s.region, 0), FP4IDX_ENOREGION);
  cr_assert_eq(raw_open(s.c, fd, 4, n - 1, s.region, s.region), FP4IDX_EREGION);
  close(fd);
  fp4idx_client_channel_t *chs[4];
  for (int i = 0; i < 4; i++) chs[i] = open_channel(&s, 1);
  fd = block_fd(1, 1, 1);
  cr_assert_eq(raw_open(s.c, fd, 1, fp4idx_channel_block_bytes(1), s.region, s.region),
               FP4IDX_E2BIG);
  close(fd);
  fp4idx_client_channel_t *x = NULL;
  cr_assert_eq(fp4idx_client_channel_open(s.c, 0, 1, 1, 0, 1, &x), FP4IDX_EINVAL);
  for (int i = 0; i < 4; i++) CHECK(s.c, fp4idx_client_channel_close(chs[i]));
  fp4idx_request_t req = {.op = FP4IDX_OP_CHANNEL_CLOSE};
  req.u.channel_close.channel = 1; /* closed already */
  fp4idx_response_t resp;
  cr_assert_eq(fp4idx__client_call(s.c, &req, &resp), FP4IDX_ENOREGION);
  teardown(&s);
}

Test(channel, a_channel_cannot_name_another_connections_regions) {
  setup_t a, b;
  setup(&a, 14);
  setup(&b, 15);
  fp4idx_client_channel_t *ch = NULL;
  /* b's region ids are numbered on b's connection: a's id means nothing there */
  cr_assert_eq(fp4idx_client_channel_open(b.c, 2, a.region + 1, a.region + 1, 0, a.region + 1,
                                          &ch),
               FP4IDX_ENOREGION);
  teardown(&a);
  teardown(&b);
}

typedef struct {
  fp4idx_client_channel_t *ch;
  fp4idx_client_channel_call_t call;
  int status;
} host_call_t;

static void *host_call(void *arg) {
  host_call_t *h = arg;
  h->status = fp4idx_client_channel_topk(h->ch, HOST, &h->call, K, NULL);
  return NULL;
}

Test(channel, a_killed_daemon_releases_a_waiting_call_with_econn) {
  setup_t s;
  setup(&s, 16);
  fp4idx_client_channel_t *ch = open_channel(&s, 2);
  /* the daemon cannot serve: the call waits until the kill releases it */
  cr_assert_eq(fp4idx_test_daemon_kill(&daemon_, SIGSTOP), 0);
  host_call_t h = {.ch = ch, .call = s.call, .status = 1};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, host_call, &h), 0);
  cr_assert_eq(fp4idx_test_daemon_kill(&daemon_, SIGKILL), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(h.status, FP4IDX_ECONN);
  /* later calls fail at once, and closing works without a daemon */
  cr_assert_eq(fp4idx_client_channel_topk(ch, HOST, &s.call, K, NULL), FP4IDX_ECONN);
  fp4idx_client_channel_close(ch);
  fp4idx_test_daemon_wait(&daemon_, 10000);
  daemon_.pid = 0;
  munmap(s.mem, s.size);
  fp4idx_client_close(s.c);
}

Test(channel, a_client_that_exits_with_a_channel_open_leaves_no_channel) {
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    setup_t s;
    setup(&s, 17);
    open_channel(&s, 2);
    _exit(0); /* without closing the channel or the connection */
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  fp4idx_client_t *c = open_client();
  /* the daemon closes the child's channel when it sees the connection
   * close, which may come after this connection's first request: ask
   * until it has */
  fp4idx_client_stats_t *st = NULL;
  for (;;) {
    CHECK(c, fp4idx_client_stats(c, &st));
    uint64_t open = st->channels;
    fp4idx_client_free(st);
    if (open == 0) break;
  }
  cr_assert(fp4idx_test_daemon_alive(&daemon_));
  fp4idx_client_close(c);
}

#ifdef FP4IDX_TEST_STUB_DRIVER
/* ---- the stream path, through a stand-in driver ------------------------------ *
 * This build (test_client_channel_stream) loads tests/cuda_driver_stub.c's
 * libcuda.so.1 before the client looks for the driver (by its soname, so
 * the client's dlopen finds it loaded; the daemon it starts never sees it):
 * every test above then runs with a driver present, and these run the C
 * client's stream calls, whose operations the stub performs at once on the
 * calling thread. $FP4IDX_STUB_DRIVER names the stub where the build's path
 * is not there (a build run on another machine). */
#include <dlfcn.h>

#define STUB_STREAM ((void *)0x5678)
enum { STUB_WRITE32 = 2, STUB_WRITE64 = 3, STUB_WAIT = 4, STUB_BATCH = 5, STUB_N = 7 };

static const char *stub_driver_path(void) {
  const char *p = getenv("FP4IDX_STUB_DRIVER");
  return p && *p ? p : FP4IDX_TEST_STUB_DRIVER;
}

static void *stub_driver(void) {
  void *h = dlopen(stub_driver_path(), RTLD_NOW | RTLD_GLOBAL);
  cr_assert_not_null(h, "the stub driver %s: %s", stub_driver_path(), dlerror());
  return h;
}

__attribute__((constructor)) static void load_stub_driver(void) {
  (void)dlopen(stub_driver_path(), RTLD_NOW | RTLD_GLOBAL);
}

/* Four calls on the stub's "stream" (top-k and full logits, alternating)
 * give the socket's bytes; each is one batch of 13 operations (2 32-bit
 * writes, 10 64-bit writes, 1 wait), or with the batch refused the same 13
 * one by one. */
static void stream_calls(uint64_t seq, int refuse_batch) {
  void *h = stub_driver();
  int (*calls)(int) = (int (*)(int))dlsym(h, "stub_calls");
  void (*refuse)(int) = (void (*)(int))dlsym(h, "stub_refuse_batch");
  size_t (*registered)(void) = (size_t(*)(void))dlsym(h, "stub_registered");
  cr_assert(calls && refuse && registered, "the stub driver lacks its controls");
  setup_t s;
  setup(&s, seq);
  int32_t pos[R * K], cnt[R];
  float val[R * K];
  CHECK(s.c, fp4idx_client_topk(s.c, seq, H, R, s.q, s.w, s.lens, K, pos, val, cnt));
  float *ref = malloc((size_t)R * N * 4);
  cr_assert_not_null(ref);
  uint32_t width = 0;
  CHECK(s.c, fp4idx_client_score_into(s.c, seq, H, R, s.q, s.w, s.lens, ref, (size_t)R * N,
                                      &width));
  fp4idx_client_channel_t *ch = open_channel(&s, 2);
  cr_assert_neq(fp4idx_client_channel_device_block(ch), 0u, "no device mapping from the stub");
  cr_assert_gt(registered(), 0u);
  refuse(refuse_batch);
  int n0[STUB_N];
  for (int i = 0; i < STUB_N; i++) n0[i] = calls(i);
  alternate_calls(&s, ch, STUB_STREAM, 4, pos, val, cnt, ref, width);
  int n[STUB_N];
  for (int i = 0; i < STUB_N; i++) n[i] = calls(i) - n0[i];
  cr_assert_eq(n[STUB_BATCH], 4, "%d batch calls", n[STUB_BATCH]);
  cr_assert_eq(n[STUB_WRITE32], 8, "%d 32-bit writes", n[STUB_WRITE32]);
  cr_assert_eq(n[STUB_WRITE64], 40, "%d 64-bit writes", n[STUB_WRITE64]);
  cr_assert_eq(n[STUB_WAIT], 4, "%d waits", n[STUB_WAIT]);
  CHECK(s.c, fp4idx_client_channel_close(ch));
  cr_assert_eq(registered(), 0u, "the block is still registered after the close");
  free(ref);
  teardown(&s);
}

Test(channel, stream_calls_in_one_batch_equal_the_socket) { stream_calls(21, 0); }

Test(channel, stream_calls_op_by_op_where_the_batch_is_refused_equal_the_socket) {
  stream_calls(22, 1);
}
#endif
