/* test_cuda_regions.c -- CUDA regions (PROTOCOL.md "Regions") on a real GPU:
 * this process allocates device buffers, registers them with an fp4idxd
 * running the CUDA backend (cudaIpcGetMemHandle -> register), appends keys
 * from device memory, scores full logits and top-k into device memory, and
 * compares every byte with an fp4idxd on the CPU backend answering through
 * the socket (the backends are bit-exact by contract). Also: a pinned host
 * region on the CUDA daemon, and the CUDA refusals (another device, a bad
 * handle, a size above the allocation). Skips cleanly without a GPU. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "client_check.h"
#include "daemon_harness.h"
#include "fp4idx_client.h"
#include "test_util.h"

#define CK(x) cr_assert_eq((x), cudaSuccess, "%s", #x)
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

static fp4idx_test_daemon_t gpu_, cpu_;

/* A CUDA daemon on device 0, or a skip when it does not come up. */
static void start_gpu(void) {
  memset(&gpu_, 0, sizeof gpu_);
  cr_assert_eq(fp4idx_test_daemon_prepare(&gpu_), 0);
  cr_assert_eq(fp4idx_test_daemon_spawn(&gpu_, gpu_.sock,
                                        (const char *[]){"--backend", "cuda", "--device", "0",
                                                         "--cache-bytes", "256M",
                                                         "--log-level", "debug", NULL}),
               0);
  int fd = -1;
  for (int i = 0; i < 3000 && fd < 0 && fp4idx_test_daemon_alive(&gpu_); i++) {
    fd = fp4idx_test_connect(gpu_.sock);
    if (fd < 0) usleep(10000);
  }
  if (fd < 0) {
    int code = fp4idx_test_daemon_stop(&gpu_);
    cr_skip_test("no usable GPU (fp4idxd --backend cuda exited %d)", code);
  }
  close(fd);
  static const char *const extra[] = {"--cache-bytes", "256M", NULL};
  cr_assert_eq(fp4idx_test_daemon_start(&cpu_, extra), 0);
}

static void stop_all(void) {
  if (gpu_.pid) fp4idx_test_daemon_stop(&gpu_);
  if (cpu_.pid) fp4idx_test_daemon_stop(&cpu_);
}

static fp4idx_client_t *open_client(const fp4idx_test_daemon_t *d) {
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_not_null(c);
  cr_assert_eq(fp4idx_client_set_timeout(c, 120000), FP4IDX_OK);
  CHECK(c, fp4idx_client_connect(c, d->sock));
  return c;
}

static uint16_t *make_bf16(size_t n, uint64_t seed, int lo, int hi, int div) {
  fp4idx_test_rng_t rng;
  fp4idx_test_rng_seed(&rng, seed);
  uint16_t *v = malloc(n * sizeof *v);
  cr_assert_not_null(v);
  for (size_t i = 0; i < n; i++)
    v[i] = fp4idx_test_f64_to_bf16((double)fp4idx_test_rng_range(&rng, lo, hi) / div);
  return v;
}

Test(cuda_regions, device_buffers_equal_the_cpu_backend) {
  if (!have_gpu()) cr_skip_test("no CUDA device");
  start_gpu();
  enum { N = 100000, R = 4, H = 32, K = 2048 };
  fp4idx_client_t *g = open_client(&gpu_), *c = open_client(&cpu_);
  uint16_t *keys = make_bf16((size_t)N * 128, 1, -12, 12, 4);
  uint16_t *q = make_bf16((size_t)R * H * 128, 2, -8, 8, 8);
  uint16_t *w = make_bf16((size_t)R * H, 3, 0, 8, 8);
  int32_t lens[R] = {N, N - 7, 1000, N / 3};
  const uint32_t W = N;

  /* keys: from device memory into the CUDA daemon, by socket into the CPU one */
  CK(cudaSetDevice(0));
  void *dkeys = NULL, *dlog = NULL, *dtop = NULL;
  size_t kbytes = (size_t)N * 256, lbytes = (size_t)R * W * 4;
  size_t tbytes = (size_t)R * K * 8 + 4096;
  CK(cudaMalloc(&dkeys, kbytes));
  CK(cudaMalloc(&dlog, lbytes));
  CK(cudaMalloc(&dtop, tbytes));
  CK(cudaMemcpy(dkeys, keys, kbytes, cudaMemcpyHostToDevice));
  LANDED();
  uint64_t rk = 0, rl = 0, rt = 0;
  CHECK(g, fp4idx_client_region_register_device(g, dkeys, kbytes, &rk));
  CHECK(g, fp4idx_client_region_register_device(g, dlog, lbytes, &rl));
  CHECK(g, fp4idx_client_region_register_device(g, dtop, tbytes, &rt));
  CHECK(g, fp4idx_client_append_region(g, 1, FP4IDX_KEYS_BF16, rk, 0, N, FP4IDX_ROUNDING_RNE,
                                       NULL, NULL));
  CHECK(c, fp4idx_client_append_bf16(c, 1, keys, N, FP4IDX_ROUNDING_RNE, NULL, NULL));
  void *ka = NULL, *kb = NULL;
  size_t na = 0, nb = 0;
  CHECK(g, fp4idx_client_read(g, 1, 0, UINT64_MAX, 0, &ka, &na));
  CHECK(c, fp4idx_client_read(c, 1, 0, UINT64_MAX, 0, &kb, &nb));
  cr_assert_eq(na, nb);
  cr_assert_eq(memcmp(ka, kb, na * 68), 0, "keys appended from device memory differ");
  fp4idx_client_free(ka);
  fp4idx_client_free(kb);

  /* full logits into device memory */
  float *ref = malloc(lbytes), *got = malloc(lbytes);
  uint32_t width = 0;
  CHECK(c, fp4idx_client_score_into(c, 1, H, R, q, w, lens, ref, (size_t)R * W, &width));
  cr_assert_eq(width, W);
  CK(cudaMemset(dlog, 0xff, lbytes));
  LANDED();
  CHECK(g, fp4idx_client_score_region(g, 1, H, R, q, w, lens, W, rl, 0));
  CK(cudaMemcpy(got, dlog, lbytes, cudaMemcpyDeviceToHost));
  cr_assert_eq(fp4idx_test_count_diff(got, ref, (int64_t)R * W), 0,
               "logits in device memory differ from the CPU backend");

  /* top-2048 into device memory */
  int32_t *pos = malloc((size_t)R * K * 4), *cnt = malloc(R * 4);
  float *val = malloc((size_t)R * K * 4);
  CHECK(c, fp4idx_client_topk(c, 1, H, R, q, w, lens, K, pos, val, cnt));
  size_t po = 0, vo = (size_t)R * K * 4, co = 2 * vo;
  CHECK(g, fp4idx_client_topk_region(g, 1, H, R, q, w, lens, K, rt, po, vo, co));
  unsigned char *top = malloc(tbytes);
  CK(cudaMemcpy(top, dtop, tbytes, cudaMemcpyDeviceToHost));
  cr_assert_eq(memcmp(top + po, pos, vo), 0, "top-k positions differ");
  cr_assert_eq(memcmp(top + vo, val, vo), 0, "top-k logits differ");
  cr_assert_eq(memcmp(top + co, cnt, R * 4), 0, "top-k counts differ");

  /* a host region on the CUDA daemon (pinned there) gives the same logits */
  uint64_t rh = 0;
  void *hmem = NULL;
  CHECK(g, fp4idx_client_region_create(g, lbytes, &rh, &hmem));
  CHECK(g, fp4idx_client_score_region(g, 1, H, R, q, w, lens, W, rh, 0));
  cr_assert_eq(memcmp(hmem, ref, lbytes), 0, "logits in a pinned host region differ");
  CHECK(g, fp4idx_client_region_destroy(g, rh, hmem, lbytes));

  /* refusals: another device, a bad handle, a size above the allocation */
  cudaIpcMemHandle_t h;
  CK(cudaIpcGetMemHandle(&h, dlog));
  uint64_t bad = 0;
  cr_assert_eq(fp4idx_client_region_register_cuda(g, &h, lbytes, 1, &bad), FP4IDX_EREGION);
  cr_assert_eq(fp4idx_client_region_register_cuda(g, &h, lbytes + 4096 * 1024, 0, &bad),
               FP4IDX_EREGION);
  unsigned char junk[64];
  for (int i = 0; i < 64; i++) junk[i] = (unsigned char)(i * 37 + 11);
  cr_assert_eq(fp4idx_client_region_register_cuda(g, junk, 4096, 0, &bad), FP4IDX_EREGION);
  /* a reference past the end of a device region changes nothing */
  CK(cudaMemset(dlog, 0x11, lbytes));
  LANDED();
  cr_assert_eq(fp4idx_client_score_region(g, 1, H, R, q, w, lens, W, rl, 4), FP4IDX_EREGION);
  CK(cudaMemcpy(got, dlog, 4096, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 1024; i++) {
    uint32_t u;
    memcpy(&u, &got[i], 4);
    cr_assert_eq(u, 0x11111111u, "a refused request wrote device memory");
  }
  /* the daemon is fine afterwards */
  fp4idx_client_info_t info;
  CHECK(g, fp4idx_client_info(g, &info));
  cr_assert_str_eq(info.backend, "cuda");

  CHECK(g, fp4idx_client_region_unregister(g, rk));
  fp4idx_client_close(g);
  fp4idx_client_close(c);
  CK(cudaFree(dkeys));
  CK(cudaFree(dlog));
  CK(cudaFree(dtop));
  free(keys), free(q), free(w), free(ref), free(got), free(pos), free(cnt), free(val), free(top);
  stop_all();
}

/* fp4idx_client_topk's reply region on the CUDA daemon (its results
 * downloaded by one copy into the client's host region, [pos | val |
 * count] with no gap) and a host region with gaps between the three (three
 * copies) give the CPU backend's bytes through the socket. */
Test(cuda_regions, reply_region_topk_equals_the_cpu_backend) {
  if (!have_gpu()) cr_skip_test("no CUDA device");
  start_gpu();
  enum { N = 100000, R = 4, H = 32 };
  fp4idx_client_t *g = open_client(&gpu_), *c = open_client(&cpu_);
  CHECK(c, fp4idx_client_set_reply_region(c, 0));
  uint16_t *keys = make_bf16((size_t)N * 128, 4, -12, 12, 4);
  uint16_t *q = make_bf16((size_t)R * H * 128, 5, -8, 8, 8);
  uint16_t *w = make_bf16((size_t)R * H, 6, 0, 8, 8);
  int32_t lens[R] = {N, N - 3, 700, N / 2};
  CHECK(g, fp4idx_client_append_bf16(g, 1, keys, N, FP4IDX_ROUNDING_RNE, NULL, NULL));
  CHECK(c, fp4idx_client_append_bf16(c, 1, keys, N, FP4IDX_ROUNDING_RNE, NULL, NULL));
  static const uint32_t ks[] = {16, 512, 2048, 4096, 1024};
  for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
    const uint32_t K = ks[i];
    const size_t kk = (size_t)R * K * 4;
    int32_t *pos = malloc(kk), *cnt = malloc(R * 4), *rpos = malloc(kk), *rcnt = malloc(R * 4);
    float *val = malloc(kk), *rval = malloc(kk);
    CHECK(c, fp4idx_client_topk(c, 1, H, R, q, w, lens, K, rpos, rval, rcnt));
    CHECK(g, fp4idx_client_topk(g, 1, H, R, q, w, lens, K, pos, val, cnt));
    cr_expect_eq(memcmp(pos, rpos, kk), 0, "k %u: positions differ", K);
    cr_expect_eq(memcmp(val, rval, kk), 0, "k %u: logits differ", K);
    cr_expect_eq(memcmp(cnt, rcnt, R * 4), 0, "k %u: counts differ", K);
    /* gaps between the outputs: three copies, the gaps untouched */
    const size_t vo = kk + 256, co = vo + kk + 1024, hb = co + R * 4 + 256;
    uint64_t rh = 0;
    void *hmem = NULL;
    CHECK(g, fp4idx_client_region_create(g, hb, &rh, &hmem));
    memset(hmem, 0x77, hb);
    CHECK(g, fp4idx_client_topk_region(g, 1, H, R, q, w, lens, K, rh, 0, vo, co));
    const unsigned char *h = hmem;
    cr_expect_eq(memcmp(h, rpos, kk), 0, "k %u: positions in a region differ", K);
    cr_expect_eq(memcmp(h + vo, rval, kk), 0, "k %u: logits in a region differ", K);
    cr_expect_eq(memcmp(h + co, rcnt, R * 4), 0, "k %u: counts in a region differ", K);
    for (size_t b = kk; b < vo; b++) cr_assert_eq(h[b], 0x77, "k %u: gap byte %zu written", K, b);
    for (size_t b = vo + kk; b < co; b++)
      cr_assert_eq(h[b], 0x77, "k %u: gap byte %zu written", K, b);
    for (size_t b = co + R * 4; b < hb; b++)
      cr_assert_eq(h[b], 0x77, "k %u: byte %zu past the counts written", K, b);
    CHECK(g, fp4idx_client_region_destroy(g, rh, hmem, hb));
    free(pos), free(cnt), free(rpos), free(rcnt), free(val), free(rval);
  }
  fp4idx_client_close(g);
  fp4idx_client_close(c);
  free(keys), free(q), free(w);
  stop_all();
}
