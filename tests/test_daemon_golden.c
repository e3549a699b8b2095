/* test_daemon_golden.c -- golden cases end to end through the real daemon:
 * append the golden bf16 keys over the socket, score with the golden q, w
 * and lens, compare the logits bit for bit with the golden *_ref.bin files; the
 * quantizer golden files through "append" + "read" in both rounding modes. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_format.h"
#include "test_util.h"

typedef struct golden_case_s {
  const char *name;
  uint32_t n, rows, heads;
  uint16_t *keys, *q, *w;
  int32_t *lens;
  float *ref;
} golden_case_t;

static void load_case(golden_case_t *c, const char *name, uint32_t n, uint32_t rows,
                      uint32_t heads) {
  char f[128];
  memset(c, 0, sizeof *c);
  c->name = name;
  c->n = n;
  c->rows = rows;
  c->heads = heads;
  snprintf(f, sizeof f, "%s_keys.bin", name);
  c->keys = fp4idx_test_load_golden(f, (size_t)n * 128 * 2, NULL);
  snprintf(f, sizeof f, "%s_q.bin", name);
  c->q = fp4idx_test_load_golden(f, (size_t)rows * heads * 128 * 2, NULL);
  snprintf(f, sizeof f, "%s_w.bin", name);
  c->w = fp4idx_test_load_golden(f, (size_t)rows * heads * 2, NULL);
  snprintf(f, sizeof f, "%s_lens.bin", name);
  c->lens = fp4idx_test_load_golden(f, (size_t)rows * 4, NULL);
  snprintf(f, sizeof f, "%s_ref.bin", name);
  c->ref = fp4idx_test_load_golden(f, (size_t)rows * n * 4, NULL);
  cr_assert(c->keys && c->q && c->w && c->lens && c->ref,
            "golden files of %s missing in %s", name, fp4idx_test_golden_dir());
}

static void free_case(golden_case_t *c) {
  free(c->keys);
  free(c->q);
  free(c->w);
  free(c->lens);
  free(c->ref);
}

/* Appends the case's keys to seq in uneven chunks (crossing page borders). */
static void append_keys(int fd, uint64_t seq, const golden_case_t *c) {
  static const uint32_t chunks[] = {1, 63, 1, 100, 64, 7};
  uint32_t done = 0;
  for (int i = 0; done < c->n; i++) {
    uint32_t k = i < 6 ? chunks[i] : 250;
    if (k > c->n - done) k = c->n - done;
    uint64_t first = 0, length = 0;
    int rc = fp4idx_test_append(fd, seq, FP4IDX_WIRE_BF16, k, c->keys + (size_t)done * 128,
                                &first, &length);
    cr_assert_eq(rc, 0, "%s: append of %u keys: %d", c->name, k, rc);
    cr_assert_eq(first, done);
    cr_assert_eq(length, done + k);
    done += k;
  }
}

static int32_t max_len(const golden_case_t *c) {
  int32_t m = 0;
  for (uint32_t r = 0; r < c->rows; r++) m = c->lens[r] > m ? c->lens[r] : m;
  return m;
}

/* Logits [R,W] against ref [R,n]: equal bits on [0,W), ref -inf beyond. */
static void compare_logits(const golden_case_t *c, const float *logits, uint64_t width) {
  cr_assert_eq(width, (uint64_t)max_len(c), "%s: width", c->name);
  size_t diffs = 0;
  for (uint32_t r = 0; r < c->rows; r++) {
    for (uint64_t l = 0; l < width; l++) {
      float a = logits[r * width + l], b = c->ref[(size_t)r * c->n + l];
      if (memcmp(&a, &b, 4) != 0) {
        if (diffs < 5)
          cr_log_error("%s row %u pos %llu: got %a, ref %a", c->name, r,
                       (unsigned long long)l, a, b);
        diffs++;
      }
    }
    for (uint64_t l = width; l < c->n; l++)
      cr_assert(isinf(c->ref[(size_t)r * c->n + l]) && c->ref[(size_t)r * c->n + l] < 0);
  }
  cr_assert_eq(diffs, 0, "%s: %zu logits differ from the reference", c->name, diffs);
}

static void run_case_on(fp4idx_test_daemon_t *dp, const char *name, uint32_t n, uint32_t rows,
                        uint32_t heads);

static void run_case(const char *name, uint32_t n, uint32_t rows, uint32_t heads) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "16M", NULL}), 0);
  run_case_on(&d, name, n, rows, heads);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* Runs one golden case on an already started daemon, on a fresh sequence. */
static void run_case_on(fp4idx_test_daemon_t *dp, const char *name, uint32_t n, uint32_t rows,
                        uint32_t heads) {
  static uint64_t next_seq = 77;
  golden_case_t c;
  const fp4idx_test_daemon_t *d = dp;
  uint64_t seq = next_seq++;
  load_case(&c, name, n, rows, heads);
  int fd = fp4idx_test_connect(d->sock);
  cr_assert_geq(fd, 0);
  append_keys(fd, seq, &c);
  float *logits = NULL;
  uint64_t width = 0;
  cr_assert_eq(fp4idx_test_score(fd, seq, heads, rows, c.q, c.w, c.lens, &logits, &width), 0);
  compare_logits(&c, logits, width);
  free(logits);

  /* Without lens every row sees all n keys: compare the rows whose golden
   * len is n (the reference for other positions would be different). */
  cr_assert_eq(fp4idx_test_score(fd, seq, heads, rows, c.q, c.w, NULL, &logits, &width), 0);
  cr_assert_eq(width, n);
  for (uint32_t r = 0; r < rows; r++)
    if ((uint32_t)c.lens[r] == n)
      cr_assert_eq(memcmp(logits + (size_t)r * n, c.ref + (size_t)r * n, (size_t)n * 4), 0);
  free(logits);

  /* The stored bytes are the quantizer's (RNE) of the golden keys. */
  uint8_t *got = malloc((size_t)n * 68);
  uint64_t cnt = 0;
  cr_assert_eq(fp4idx_test_read(fd, seq, 0, n, got, &cnt), 0);
  for (uint32_t i = 0; i < n; i++) {
    uint8_t want[68];
    cr_assert_eq(fp4idx_quantize_key(c.keys + (size_t)i * 128, FP4IDX_DTYPE_BF16,
                                     FP4IDX_ROUND_RNE, want, want + 64), 0);
    cr_assert_eq(memcmp(got + (size_t)i * 68, want, 68), 0, "%s: key %u stored bytes", name, i);
  }
  free(got);
  close(fd);
  free_case(&c);
}

Test(daemon_golden, dyadic_h32) { run_case("dyadic_h32", 1000, 4, 32); }
Test(daemon_golden, gauss_h32) { run_case("gauss_h32", 1000, 4, 32); }
Test(daemon_golden, gauss_h64) { run_case("gauss_h64", 777, 6, 64); }

/* The same through the CUDA backend, when it is built and a GPU answers. */
Test(daemon_golden, cuda_backend_all_cases) {
#ifndef FP4IDX_TEST_HAVE_CUDA
  cr_skip_test("built without the CUDA backend");
#else
  fp4idx_test_daemon_t d;
  int code = 0, up = fp4idx_test_daemon_start_cuda(&d, "64M", &code);
  cr_assert_geq(up, 0);
  if (up) cr_skip_test("no usable GPU (fp4idxd --backend cuda exited %d)", code);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(fd, &info), 0);
  cr_assert_str_eq(info.backend, "cuda");
  close(fd);
  run_case_on(&d, "dyadic_h32", 1000, 4, 32);
  run_case_on(&d, "gauss_h32", 1000, 4, 32);
  run_case_on(&d, "gauss_h64", 777, 6, 64);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
#endif
}

/* Two sequences in one score call, topk on the golden data: the top-k of
 * each row equals the reference's (logit descending, ties by position). */
Test(daemon_golden, multi_seq_score_and_topk) {
  golden_case_t a, b;
  load_case(&a, "gauss_h32", 1000, 4, 32);
  load_case(&b, "dyadic_h32", 1000, 4, 32);
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "16M", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  append_keys(fd, 1, &a);
  append_keys(fd, 2, &b);
  const golden_case_t *cs[2] = {&a, &b};
  for (int topk = 0; topk <= 16; topk += 16) {
    fp4idx_request_t req;
    fp4idx_score_seq_t seqs[2];
    memset(&req, 0, sizeof req);
    memset(seqs, 0, sizeof seqs);
    req.id = 5 + (uint64_t)topk;
    req.op = FP4IDX_OP_SCORE;
    req.u.score.heads = 32;
    req.u.score.topk = (uint32_t)topk;
    req.u.score.seqs = seqs;
    req.u.score.nseqs = 2;
    for (int i = 0; i < 2; i++) {
      uint64_t qs[3] = {4, 32, 128}, ws[2] = {4, 32}, ls[1] = {4};
      seqs[i].seq = (uint64_t)i + 1;
      seqs[i].rows = 4;
      cr_assert_eq(fp4idx_tensor_init(&seqs[i].q, FP4IDX_WIRE_BF16, 3, qs, cs[i]->q), 0);
      cr_assert_eq(fp4idx_tensor_init(&seqs[i].w, FP4IDX_WIRE_BF16, 2, ws, cs[i]->w), 0);
      cr_assert_eq(fp4idx_tensor_init(&seqs[i].lens, FP4IDX_WIRE_I32, 1, ls, cs[i]->lens), 0);
    }
    fp4idx_response_t resp;
    unsigned char *body = NULL;
    cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
    cr_assert_eq(resp.status, 0, "%s", resp.error);
    cr_assert_eq(resp.id, req.id);
    cr_assert_eq(resp.u.score.nresults, 2);
    for (int i = 0; i < 2; i++) {
      const fp4idx_score_result_t *r = &resp.u.score.results[i];
      const golden_case_t *c = cs[i];
      cr_assert_eq(r->seq, (uint64_t)i + 1);
      if (!topk) {
        float *l = malloc(r->logits.nbytes);
        memcpy(l, r->logits.data, r->logits.nbytes);
        compare_logits(c, l, r->logits.shape[1]);
        free(l);
        continue;
      }
      cr_assert(r->topk);
      cr_assert_eq(r->positions.shape[0], 4);
      cr_assert_eq(r->positions.shape[1], 16);
      for (uint32_t row = 0; row < 4; row++) {
        /* reference top-k by selection over the ref row */
        const float *ref = c->ref + (size_t)row * c->n;
        int32_t len = c->lens[row];
        char *taken = calloc(c->n, 1);
        int32_t want_count = len < 16 ? len : 16;
        cr_assert_eq(fp4idx_load_i32(r->counts.data, row), want_count);
        for (int j = 0; j < 16; j++) {
          int32_t best = -1;
          for (int32_t l = 0; l < len; l++)
            if (!taken[l] && (best < 0 || ref[l] > ref[best])) best = l;
          int32_t pos = fp4idx_load_i32(r->positions.data, (size_t)row * 16 + j);
          float val = fp4idx_load_f32(r->logits.data, (size_t)row * 16 + j);
          if (j >= want_count) {
            cr_assert_eq(pos, -1);
            cr_assert(isinf(val) && val < 0);
            continue;
          }
          taken[best] = 1;
          cr_assert_eq(pos, best, "seq %d row %u rank %d", i + 1, row, j);
          cr_assert_eq(memcmp(&val, &ref[best], 4), 0);
        }
        free(taken);
      }
    }
    fp4idx_response_clear(&resp);
    free(body);
  }
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  free_case(&a);
  free_case(&b);
}

/* The quantizer golden files through the socket: bf16 keys appended with
 * "rounding" rne and threshold, and as f32, read back byte for byte. */
Test(daemon_golden, quantizer_modes) {
  uint16_t *keys = fp4idx_test_load_golden("quant_keys.bin", 512 * 128 * 2, NULL);
  uint8_t *pay[2] = {fp4idx_test_load_golden("quant_payload_rne.bin", 512 * 64, NULL),
                     fp4idx_test_load_golden("quant_payload_thr.bin", 512 * 64, NULL)};
  uint8_t *sc[2] = {fp4idx_test_load_golden("quant_scales_rne.bin", 512 * 4, NULL),
                    fp4idx_test_load_golden("quant_scales_thr.bin", 512 * 4, NULL)};
  cr_assert(keys && pay[0] && pay[1] && sc[0] && sc[1]);
  float *keys32 = malloc(512 * 128 * 4);
  for (int i = 0; i < 512 * 128; i++) keys32[i] = fp4idx_bf16_to_f32(keys[i]);
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--cache-bytes", "4M", NULL}), 0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  for (int v = 0; v < 4; v++) {
    int mode = v & 1, f32 = v >> 1;
    fp4idx_request_t req;
    fp4idx_response_t resp;
    unsigned char *body = NULL;
    memset(&req, 0, sizeof req);
    req.id = 100 + (uint64_t)v;
    req.op = FP4IDX_OP_APPEND;
    req.u.append.seq = 500 + (uint64_t)v;
    req.u.append.rounding = mode ? FP4IDX_WIRE_ROUND_THRESHOLD : FP4IDX_WIRE_ROUND_RNE;
    uint64_t shape[2] = {512, 128};
    cr_assert_eq(fp4idx_tensor_init(&req.u.append.keys, f32 ? FP4IDX_WIRE_F32 : FP4IDX_WIRE_BF16,
                                    2, shape, f32 ? (void *)keys32 : (void *)keys), 0);
    cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
    cr_assert_eq(resp.status, 0, "%s", resp.error);
    cr_assert_eq(resp.u.append.length, 512);
    fp4idx_response_clear(&resp);
    free(body);
    uint8_t *got = malloc(512 * 68);
    cr_assert_eq(fp4idx_test_read(fd, 500 + (uint64_t)v, 0, 512, got, NULL), 0);
    for (int i = 0; i < 512; i++) {
      cr_assert_eq(memcmp(got + i * 68, pay[mode] + i * 64, 64), 0, "v%d key %d payload", v, i);
      cr_assert_eq(memcmp(got + i * 68 + 64, sc[mode] + i * 4, 4), 0, "v%d key %d scales", v, i);
    }
    /* And packed FP4 keys go in verbatim. */
    if (v == 0) {
      uint64_t first;
      cr_assert_eq(fp4idx_test_append(fd, 600, FP4IDX_WIRE_U8, 512, got, &first, NULL), 0);
      uint8_t *again = malloc(512 * 68);
      cr_assert_eq(fp4idx_test_read(fd, 600, 0, 512, again, NULL), 0);
      cr_assert_eq(memcmp(again, got, 512 * 68), 0);
      free(again);
    }
    free(got);
  }
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  free(keys32);
  free(keys);
  for (int i = 0; i < 2; i++) free(pay[i]), free(sc[i]);
}

/* A candidate mask hides positions (-inf) and leaves the others' bits
 * unchanged; "read" with dequant gives the exact decoded keys. */
Test(daemon_golden, mask_and_dequantized_read) {
  golden_case_t c;
  load_case(&c, "gauss_h64", 777, 6, 64);
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, NULL), 0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  append_keys(fd, 3, &c);
  uint64_t W = (uint64_t)max_len(&c);
  uint8_t *mask = malloc(c.rows * W);
  for (uint64_t i = 0; i < c.rows * W; i++) mask[i] = (uint8_t)((i * 7 + i / 5) % 3 != 0);
  fp4idx_request_t req;
  fp4idx_score_seq_t s;
  memset(&req, 0, sizeof req);
  memset(&s, 0, sizeof s);
  req.id = 77;
  req.op = FP4IDX_OP_SCORE;
  req.u.score.heads = c.heads;
  req.u.score.seqs = &s;
  req.u.score.nseqs = 1;
  s.seq = 3;
  s.rows = c.rows;
  uint64_t qs[3] = {c.rows, c.heads, 128}, ws[2] = {c.rows, c.heads}, ls[1] = {c.rows},
           ms[2] = {c.rows, W};
  cr_assert_eq(fp4idx_tensor_init(&s.q, FP4IDX_WIRE_BF16, 3, qs, c.q), 0);
  cr_assert_eq(fp4idx_tensor_init(&s.w, FP4IDX_WIRE_BF16, 2, ws, c.w), 0);
  cr_assert_eq(fp4idx_tensor_init(&s.lens, FP4IDX_WIRE_I32, 1, ls, c.lens), 0);
  cr_assert_eq(fp4idx_tensor_init(&s.mask, FP4IDX_WIRE_U8, 2, ms, mask), 0);
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0, "%s", resp.error);
  const fp4idx_tensor_t *t = &resp.u.score.results[0].logits;
  cr_assert_eq(t->shape[1], W);
  for (uint32_t r = 0; r < c.rows; r++)
    for (uint64_t l = 0; l < W; l++) {
      float got = fp4idx_load_f32(t->data, r * W + l), ref = c.ref[(size_t)r * c.n + l];
      if (mask[r * W + l])
        cr_assert_eq(memcmp(&got, &ref, 4), 0, "row %u pos %llu", r, (unsigned long long)l);
      else
        cr_assert(isinf(got) && got < 0, "masked row %u pos %llu not -inf", r, (unsigned long long)l);
    }
  fp4idx_response_clear(&resp);
  free(body);

  /* dequantized read of keys 60..70 */
  memset(&req, 0, sizeof req);
  req.id = 78;
  req.op = FP4IDX_OP_READ;
  req.u.read.seq = 3;
  req.u.read.from = 60;
  req.u.read.count = 10;
  req.u.read.has_count = true;
  req.u.read.dequant = true;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0, "%s", resp.error);
  t = &resp.u.read.keys;
  cr_assert_eq(t->dtype, FP4IDX_WIRE_F32);
  cr_assert_eq(t->shape[0], 10);
  cr_assert_eq(t->shape[1], 128);
  for (int i = 0; i < 10; i++) {
    uint8_t slot[68];
    fp4idx_quantize_key(c.keys + (size_t)(60 + i) * 128, FP4IDX_DTYPE_BF16, FP4IDX_ROUND_RNE, slot,
                        slot + 64);
    for (int e = 0; e < 128; e++) {
      float want = fp4idx_slot_element(slot, slot + 64, e);
      float got = fp4idx_load_f32(t->data, (size_t)i * 128 + e);
      cr_assert_eq(memcmp(&got, &want, 4), 0, "key %d elem %d", 60 + i, e);
    }
  }
  fp4idx_response_clear(&resp);
  free(body);
  free(mask);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  free_case(&c);
}
