/* test_daemon_fork.c -- the fork op through the real fp4idxd (CPU backend):
 * forks of a prompt, each extended by keys of its own, score byte for byte
 * like the same keys appended to sequences of their own, read back the same
 * bytes, and use the pages the sharing says (info pages_free/pages_shared);
 * bad forks and a copy-on-write append on a full pool change nothing; and
 * with --data-dir the sharing survives a SIGTERM restart (snapshot) and a
 * kill -9 (append log replay): same bytes, same scores, same page counts. */
#include "persist_util.h"

#include <signal.h>

#include "daemon_harness.h"
#include "fp4idx_codec.h"
#include "fp4idx_format.h"
#include "fp4idx_status.h"

enum { PROMPT = 1000, EXTRA = 37, FORKS = 4, HEADS = 4, ROWS = 2 };

static int fork_call(int fd, uint64_t src, uint64_t dst, uint64_t length) {
  fp4idx_request_t req = {.id = 77, .op = FP4IDX_OP_FORK};
  req.u.fork = (fp4idx_fork_req_t){.src = src, .dst = dst, .length = length};
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  int rc = fp4idx_test_call(fd, &req, &resp, &body);
  if (rc == 0) {
    rc = resp.status;
    if (rc == 0 && resp.u.fork.length != length) rc = FP4IDX_EINTERNAL;
  }
  fp4idx_response_clear(&resp);
  free(body);
  return rc;
}

static void make_bf16(uint16_t *k, size_t n, uint64_t seed) {
  uint64_t s = seed | 1;
  for (size_t i = 0; i < n; i++)
    k[i] = fp4idx_f32_to_bf16((float)((int64_t)(rng_next(&s) % 2001) - 1000) / 250.0f);
}

static void append_ok(int fd, uint64_t seq, const uint16_t *keys, uint64_t n) {
  uint64_t first, len;
  int rc = fp4idx_test_append(fd, seq, FP4IDX_WIRE_BF16, n, keys, &first, &len);
  cr_assert_eq(rc, 0, "append %llu keys to seq %llu: %d", (unsigned long long)n,
               (unsigned long long)seq, rc);
}

static uint16_t *keys_of(uint64_t n, uint64_t seed) {
  uint16_t *k = malloc(n * FP4IDX_HEAD_DIM * sizeof *k);
  cr_assert_not_null(k);
  make_bf16(k, n * FP4IDX_HEAD_DIM, seed);
  return k;
}

/* The queries every check scores with. */
static uint16_t g_q[ROWS * HEADS * FP4IDX_HEAD_DIM], g_w[ROWS * HEADS];

static void scores_of(int fd, uint64_t seq, float **logits, uint64_t *width) {
  int rc = fp4idx_test_score(fd, seq, HEADS, ROWS, g_q, g_w, NULL, logits, width);
  cr_assert_eq(rc, 0, "score seq %llu: %d", (unsigned long long)seq, rc);
}

/* seq a and seq b hold the same n keys and score the same, byte for byte. */
static void same_seq(int fd, uint64_t a, uint64_t b, uint64_t n) {
  unsigned char *ka = malloc(n * FP4IDX_SLOT_BYTES + 1), *kb = malloc(n * FP4IDX_SLOT_BYTES + 1);
  uint64_t ga = 0, gb = 0;
  cr_assert_eq(fp4idx_test_read(fd, a, 0, n, ka, &ga), 0);
  cr_assert_eq(fp4idx_test_read(fd, b, 0, n, kb, &gb), 0);
  cr_assert_eq(ga, n);
  cr_assert_eq(gb, n);
  cr_assert_eq(memcmp(ka, kb, n * FP4IDX_SLOT_BYTES), 0, "seq %llu vs %llu: read-back bytes",
               (unsigned long long)a, (unsigned long long)b);
  float *la, *lb;
  uint64_t wa, wb;
  scores_of(fd, a, &la, &wa);
  scores_of(fd, b, &lb, &wb);
  cr_assert_eq(wa, n);
  cr_assert_eq(wb, n);
  cr_assert_eq(memcmp(la, lb, ROWS * n * sizeof *la), 0, "seq %llu vs %llu: scores",
               (unsigned long long)a, (unsigned long long)b);
  free(ka);
  free(kb);
  free(la);
  free(lb);
}

static void info_of(int fd, fp4idx_info_t *in) { cr_assert_eq(fp4idx_test_info(fd, in), 0); }

/* The list entry of seq (a whole scan), as pages and shared pages. */
static void list_of(int fd, uint64_t seq, uint64_t *pages, uint64_t *shared) {
  uint64_t cursor = 0;
  int found = 0;
  do {
    fp4idx_request_t req = {.id = 5, .op = FP4IDX_OP_LIST};
    req.u.list.cursor = cursor;
    req.u.list.count = 1000;
    fp4idx_response_t resp;
    unsigned char *body = NULL;
    cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
    cr_assert_eq(resp.status, 0);
    for (size_t i = 0; i < resp.u.list.nseqs; i++)
      if (resp.u.list.seqs[i].seq == seq) {
        *pages = resp.u.list.seqs[i].pages;
        *shared = resp.u.list.seqs[i].pages_shared;
        found = 1;
      }
    cursor = resp.u.list.cursor;
    fp4idx_response_clear(&resp);
    free(body);
  } while (cursor != 0);
  cr_assert(found, "seq %llu not listed", (unsigned long long)seq);
}

/* Source 1 holds the prompt; forks 11..14 of it and unshared copies
 * 21..24 each get the prompt (copies: appended again) and EXTRA keys of
 * their own; then the source gets EXTRA keys too. */
static void build(int fd, uint16_t *prompt, uint16_t **extra) {
  append_ok(fd, 1, prompt, PROMPT);
  for (int f = 0; f < FORKS; f++) cr_assert_eq(fork_call(fd, 1, 11 + (uint64_t)f, PROMPT), 0);
  for (int f = 0; f < FORKS; f++) {
    append_ok(fd, 11 + (uint64_t)f, extra[f], EXTRA);
    append_ok(fd, 21 + (uint64_t)f, prompt, PROMPT);
    append_ok(fd, 21 + (uint64_t)f, extra[f], EXTRA);
  }
  append_ok(fd, 1, extra[FORKS], EXTRA);
  append_ok(fd, 31, prompt, PROMPT);
  append_ok(fd, 31, extra[FORKS], EXTRA);
}

static void check_built(int fd, int with_source) {
  for (int f = 0; f < FORKS; f++) same_seq(fd, 11 + (uint64_t)f, 21 + (uint64_t)f, PROMPT + EXTRA);
  if (with_source) same_seq(fd, 1, 31, PROMPT + EXTRA);
}

static void setup_queries(void) {
  make_bf16(g_q, sizeof g_q / sizeof *g_q, 5);
  make_bf16(g_w, sizeof g_w / sizeof *g_w, 6);
}

/* The forks case on a started daemon d (CPU or CUDA backend); stops it. */
static void forks_case(fp4idx_test_daemon_t *d) {
  setup_queries();
  int fd = fp4idx_test_connect(d->sock);
  cr_assert_geq(fd, 0);
  uint16_t *prompt = keys_of(PROMPT, 1), *extra[FORKS + 1];
  for (int f = 0; f <= FORKS; f++) extra[f] = keys_of(EXTRA, 100 + (uint64_t)f);
  fp4idx_info_t in0, in;
  info_of(fd, &in0);
  const uint64_t P = in0.page_size, shared_pages = PROMPT / P, own = (PROMPT + EXTRA + P - 1) / P;
  build(fd, prompt, extra);
  check_built(fd, 1);
  info_of(fd, &in);
  /* 5 sequences of the prompt + EXTRA: the prompt's whole pages once; each
   * fork's partly filled page was copied at its first append. */
  uint64_t used = in0.pages_free - in.pages_free;
  uint64_t copies = (FORKS + 1) * own;
  cr_assert_eq(used, copies + own + FORKS * (own - shared_pages), "used %llu",
               (unsigned long long)used);
  cr_assert_eq(in.pages_shared, shared_pages);
  cr_assert_eq(in.sequences, 2 * FORKS + 2);
  uint64_t lp, ls;
  list_of(fd, 11, &lp, &ls); /* a fork: the prompt's whole pages are shared */
  cr_assert_eq(lp, own);
  cr_assert_eq(ls, shared_pages);
  list_of(fd, 1, &lp, &ls); /* the source likewise */
  cr_assert_eq(ls, shared_pages);
  list_of(fd, 21, &lp, &ls); /* an unshared copy */
  cr_assert_eq(lp, own);
  cr_assert_eq(ls, 0);

  /* Bad forks: nothing changes. */
  cr_assert_eq(fork_call(fd, 999, 50, 0), FP4IDX_ENOSEQ);
  cr_assert_eq(fork_call(fd, 1, 11, 5), FP4IDX_EEXIST);
  cr_assert_eq(fork_call(fd, 1, 1, 5), FP4IDX_EEXIST);
  cr_assert_eq(fork_call(fd, 1, 50, PROMPT + EXTRA + 1), FP4IDX_ERANGE);
  fp4idx_info_t after;
  info_of(fd, &after);
  cr_assert_eq(after.pages_free, in.pages_free);
  cr_assert_eq(after.sequences, in.sequences);

  /* A fork at 0 and at a page boundary, then the source truncated below the
   * fork point and dropped: the forks keep their keys. */
  cr_assert_eq(fork_call(fd, 1, 40, 0), 0);
  cr_assert_eq(fork_call(fd, 1, 41, 2 * P), 0);
  append_ok(fd, 40, prompt, 3);
  append_ok(fd, 42, prompt, 2 * P);
  cr_assert_eq(fp4idx_test_truncate(fd, 1, 5), 0);
  append_ok(fd, 1, extra[0], 9);
  cr_assert_eq(fp4idx_test_drop(fd, 1), 0);
  cr_assert_eq(fp4idx_test_drop(fd, 31), 0);
  check_built(fd, 0);
  same_seq(fd, 41, 42, 2 * P);
  /* The copies go: only the forks' pages stay. */
  for (int f = 0; f < FORKS; f++) cr_assert_eq(fp4idx_test_drop(fd, 21 + (uint64_t)f), 0);
  for (int f = 0; f < FORKS; f++) cr_assert_eq(fp4idx_test_drop(fd, 11 + (uint64_t)f), 0);
  cr_assert_eq(fp4idx_test_drop(fd, 42), 0);
  info_of(fd, &after);
  cr_assert_eq(in0.pages_free - after.pages_free, 2 + 1, "fork 41 (2 pages), fork 40 (1)");
  cr_assert_eq(after.pages_shared, 0);
  cr_assert_eq(fp4idx_test_drop(fd, 40), 0);
  cr_assert_eq(fp4idx_test_drop(fd, 41), 0);
  info_of(fd, &after);
  cr_assert_eq(after.pages_free, in0.pages_free, "every page back");
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(d), 0);
  free(prompt);
  for (int f = 0; f <= FORKS; f++) free(extra[f]);
}

Test(daemon_fork, forks_score_like_copies_and_share_pages) {
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  cr_assert_eq(fp4idx_test_daemon_start(&d, NULL), 0);
  forks_case(&d);
}

/* The same through --backend cuda: shared pages scored on the GPU, the
 * copy-on-write through the CUDA backend's copy_pages (skips without one). */
Test(daemon_fork, forks_on_the_cuda_backend) {
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
  forks_case(&d);
#endif
}

Test(daemon_fork, full_pool_fork_then_copy_on_write_is_efull) {
  setup_queries();
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  const char *args[] = {"--cache-bytes", "64K", NULL}; /* 15 pages of 64 keys */
  cr_assert_eq(fp4idx_test_daemon_start(&d, args), 0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  fp4idx_info_t in;
  info_of(fd, &in);
  uint64_t n = in.pages_total * in.page_size - in.page_size / 2; /* last page half full */
  uint16_t *k = keys_of(n, 3);
  for (uint64_t at = 0; at < n; at += 256) append_ok(fd, 1, k + at * FP4IDX_HEAD_DIM, n - at < 256 ? n - at : 256);
  info_of(fd, &in);
  cr_assert_eq(in.pages_free, 0);
  cr_assert_eq(fork_call(fd, 1, 2, n), 0, "a fork takes no page");
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_append(fd, 2, FP4IDX_WIRE_BF16, 1, k, &first, &len), FP4IDX_EFULL);
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_BF16, 1, k, &first, &len), FP4IDX_EFULL);
  fp4idx_info_t after;
  info_of(fd, &after);
  cr_assert_eq(after.pages_free, 0);
  cr_assert_eq(after.pages_shared, in.pages_total);
  same_seq(fd, 1, 2, n);
  /* Dropping the source frees nothing the fork sees, and the fork's own
   * appends then need no copy. */
  cr_assert_eq(fp4idx_test_drop(fd, 1), 0);
  info_of(fd, &after);
  cr_assert_eq(after.pages_free, 0);
  cr_assert_eq(fp4idx_test_append(fd, 2, FP4IDX_WIRE_BF16, 1, k, &first, &len), 0);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  free(k);
}

static void start_persist(fp4idx_test_daemon_t *d, const char *data) {
  const char *args[] = {"--cache-bytes", "16M", "--data-dir", data, "--fsync", "always", NULL};
  memset(d, 0, sizeof *d);
  cr_assert_eq(fp4idx_test_daemon_start(d, args), 0, "daemon did not start");
}

Test(daemon_fork, sharing_survives_restart_and_kill9) {
  setup_queries();
  char root[64], data[128];
  tmpdir_make(root, sizeof root);
  snprintf(data, sizeof data, "%s/state", root);
  uint16_t *prompt = keys_of(PROMPT, 1), *extra[FORKS + 1];
  for (int f = 0; f <= FORKS; f++) extra[f] = keys_of(EXTRA, 100 + (uint64_t)f);
  fp4idx_test_daemon_t d;
  start_persist(&d, data);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  build(fd, prompt, extra);
  fp4idx_info_t before, in;
  info_of(fd, &before);
  cr_assert_gt(before.pages_shared, 0);
  close(fd);
  /* SIGTERM: the final snapshot holds the sharing. */
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGTERM), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 10000), 0);
  start_persist(&d, data);
  fd = fp4idx_test_connect(d.sock);
  info_of(fd, &in);
  cr_assert_eq(in.pages_free, before.pages_free, "same pages after the snapshot");
  cr_assert_eq(in.pages_shared, before.pages_shared);
  check_built(fd, 1);
  /* More forks, now only in the append log, then kill -9. */
  cr_assert_eq(fork_call(fd, 11, 60, PROMPT + 3), 0);
  cr_assert_eq(fork_call(fd, 60, 61, PROMPT), 0);
  append_ok(fd, 60, extra[1], 5);
  append_ok(fd, 62, prompt, PROMPT); /* 60 = the prompt, 3 keys of extra[0], 5 of extra[1] */
  append_ok(fd, 62, extra[0], 3);
  append_ok(fd, 62, extra[1], 5);
  cr_assert_eq(fp4idx_test_truncate(fd, 11, 10), 0);
  append_ok(fd, 61, extra[2], 2);
  append_ok(fd, 63, prompt, PROMPT);
  append_ok(fd, 63, extra[2], 2);
  info_of(fd, &before);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGKILL), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 5000), 128 + SIGKILL);
  start_persist(&d, data);
  fd = fp4idx_test_connect(d.sock);
  info_of(fd, &in);
  cr_assert_eq(in.pages_free, before.pages_free, "same pages after the log replay");
  cr_assert_eq(in.pages_shared, before.pages_shared);
  cr_assert_eq(in.sequences, before.sequences);
  same_seq(fd, 60, 62, PROMPT + 3 + 5);
  same_seq(fd, 61, 63, PROMPT + 2);
  for (int f = 1; f < FORKS; f++) same_seq(fd, 11 + (uint64_t)f, 21 + (uint64_t)f, PROMPT + EXTRA);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
  tmpdir_rm(root);
  free(prompt);
  for (int f = 0; f <= FORKS; f++) free(extra[f]);
}

/* When the append log cannot take the fork's record (file size limit:
 * EFBIG), the fork fails with EIO and changes nothing: no new sequence, no
 * page taken; after a kill -9 the restarted daemon has no trace of it. */
#include <sys/resource.h>

Test(daemon_fork, log_write_failure_fails_the_fork_cleanly) {
  char root[64], data[128];
  tmpdir_make(root, sizeof root);
  snprintf(data, sizeof data, "%s/state", root);
  unsigned char *keys = malloc(100 * FP4IDX_SLOT_BYTES);
  fill_random(keys, 100 * FP4IDX_SLOT_BYTES, 17);
  for (int i = 0; i < 100; i++) /* finite scales */
    for (int b = 0; b < 4; b++) keys[i * FP4IDX_SLOT_BYTES + 64 + b] = 127;
  signal(SIGXFSZ, SIG_IGN); /* inherited: the daemon gets EFBIG, not a signal */
  /* Room for the log header and one append of 100 keys, not for a fork. */
  struct rlimit rl = {.rlim_cur = 32 + (40 + 100 * FP4IDX_SLOT_BYTES + 4) + 20,
                      .rlim_max = RLIM_INFINITY};
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
  fp4idx_test_daemon_t d;
  start_persist(&d, data);
  int fd = fp4idx_test_connect(d.sock);
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_U8, 100, keys, &first, &len), 0);
  fp4idx_info_t before, after;
  info_of(fd, &before);
  cr_assert_eq(fork_call(fd, 1, 2, 50), FP4IDX_EIO);
  info_of(fd, &after);
  cr_assert_eq(after.sequences, 1, "the failed fork made no sequence");
  cr_assert_eq(after.pages_free, before.pages_free);
  cr_assert_eq(after.pages_shared, 0);
  cr_assert_eq(fp4idx_test_drop(fd, 2), FP4IDX_ENOSEQ);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGKILL), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 5000), 128 + SIGKILL);
  start_persist(&d, data);
  fd = fp4idx_test_connect(d.sock);
  info_of(fd, &after);
  cr_assert_eq(after.sequences, 1);
  unsigned char *back = malloc(100 * FP4IDX_SLOT_BYTES);
  cr_assert_eq(fp4idx_test_read(fd, 1, 0, 100, back, &len), 0);
  cr_assert_eq(memcmp(back, keys, 100 * FP4IDX_SLOT_BYTES), 0);
  close(fd);
  fp4idx_test_daemon_stop(&d); /* (its final snapshot may hit the limit too) */
  free(back);
  free(keys);
  tmpdir_rm(root);
}
