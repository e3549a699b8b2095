/* test_client_cli.c -- fp4idx-cli end to end against the real fp4idxd: the
 * golden cases through `append --dtype bf16` and `score --format raw --out`
 * compared byte for byte with tests/golden/<case>_ref.bin, top-k raw output
 * against a sort of the reference, .npy and stdin inputs, --random keys in
 * chunks, read/truncate/drop, info/stats/--prometheus, and the exit codes
 * and one-line errors. The CLI is $FP4IDX_CLI or the one built here. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "daemon_harness.h"
#include "test_util.h"

#ifndef FP4IDX_CLI_PATH
#define FP4IDX_CLI_PATH "fp4idx-cli"
#endif

static fp4idx_test_daemon_t daemon_;
static char out_[4096], err_[4096];
static char work_[64]; /* our files; outlives a stopped daemon's folder */

static void start(void) {
  snprintf(work_, sizeof work_, "/tmp/fp4idx-cli-test-XXXXXX");
  cr_assert_not_null(mkdtemp(work_));
  cr_assert_eq(fp4idx_test_daemon_start(&daemon_, NULL), 0,
               "fp4idxd did not start");
}

static void stop(void) {
  if (daemon_.pid) fp4idx_test_daemon_stop(&daemon_);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", work_);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", work_);
}

static const char *cli_path(void) {
  const char *e = getenv("FP4IDX_CLI");
  return (e && *e) ? e : FP4IDX_CLI_PATH;
}

/* A path inside the test's temporary folder. */
static const char *tmp(const char *name) {
  static char buf[8][256];
  static int i;
  char *b = buf[i++ % 8];
  snprintf(b, 256, "%s/%s", work_, name);
  return b;
}

static void slurp(const char *path, char *dst, size_t cap) {
  size_t n = 0;
  char *p = fp4idx_test_load_file(path, &n);
  if (n >= cap) n = cap - 1;
  if (p) memcpy(dst, p, n);
  dst[n] = '\0';
  free(p);
}

/* Runs `fp4idx-cli -s SOCK <args>` through the shell (args are a format:
 * callers quote nothing, our paths have no spaces); stdout and stderr land
 * in out_ / err_ (first 4 KiB). Returns the exit status. */
static int cli(const char *fmt, ...) {
  char args[2048], cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "%s -s %s %s >%s 2>%s", cli_path(), daemon_.sock,
           args, tmp("cli.out"), tmp("cli.err"));
  int st = system(cmd);
  slurp(tmp("cli.out"), out_, sizeof out_);
  slurp(tmp("cli.err"), err_, sizeof err_);
  cr_assert(WIFEXITED(st), "cli killed: %s", cmd);
  return WEXITSTATUS(st);
}

/* The error contract: exactly one line on stderr, "fp4idx-cli: OP: ... (CODE)". */
static void expect_one_line_error(const char *op, const char *code) {
  char prefix[64], suffix[64];
  snprintf(prefix, sizeof prefix, "fp4idx-cli: %s: ", op);
  snprintf(suffix, sizeof suffix, " (%s)\n", code);
  size_t n = strlen(err_), s = strlen(suffix);
  cr_expect(strncmp(err_, prefix, strlen(prefix)) == 0, "stderr: %s", err_);
  cr_expect(n > s && strcmp(err_ + n - s, suffix) == 0, "stderr: %s", err_);
  cr_expect(strchr(err_, '\n') == err_ + n - 1, "not one line: %s", err_);
}

static int files_equal(const char *a, const char *b) {
  size_t na, nb;
  void *pa = fp4idx_test_load_file(a, &na), *pb = fp4idx_test_load_file(b, &nb);
  int eq = pa && pb && na == nb && memcmp(pa, pb, na) == 0;
  free(pa);
  free(pb);
  return eq;
}

static char *golden_path(const char *name) {
  static char buf[4][512];
  static int i;
  char *b = buf[i++ % 4];
  snprintf(b, 512, "%s/%s", fp4idx_test_golden_dir(), name);
  return b;
}

/* "L1,L2,..." from a golden lens file. */
static void golden_lens(const char *name, char *out, size_t cap, int *rows) {
  size_t sz;
  int32_t *l = fp4idx_test_load_golden(name, 0, &sz);
  cr_assert_not_null(l);
  *rows = (int)(sz / 4);
  size_t n = 0;
  for (int r = 0; r < *rows; r++)
    n += (size_t)snprintf(out + n, cap - n, "%s%d", r ? "," : "", l[r]);
  free(l);
}

TestSuite(cli, .init = start, .fini = stop);

static void golden_raw(const char *name, int heads) {
  char f[64], lens[256];
  int rows;
  snprintf(f, sizeof f, "%s_lens.bin", name);
  golden_lens(f, lens, sizeof lens, &rows);
  snprintf(f, sizeof f, "%s_keys.bin", name);
  cr_assert_eq(cli("append 1 %s --dtype bf16", golden_path(f)), 0, "%s", err_);
  cr_expect(strstr(out_, "appended") != NULL, "%s", out_);
  char q[64], w[64], ref[64];
  snprintf(q, sizeof q, "%s_q.bin", name);
  snprintf(w, sizeof w, "%s_w.bin", name);
  snprintf(ref, sizeof ref, "%s_ref.bin", name);
  cr_assert_eq(cli("score 1 --q %s --w %s --heads %d --lens %s --format raw "
                   "--out %s",
                   golden_path(q), golden_path(w), heads, lens,
                   tmp("logits.f32")),
               0, "%s", err_);
  /* In these cases max(lens) is the key count: the file is [R, n]. */
  cr_expect(files_equal(tmp("logits.f32"), golden_path(ref)),
            "%s: raw logits differ from %s", name, ref);
}

Test(cli, golden_dyadic_h32_raw) { golden_raw("dyadic_h32", 32); }
Test(cli, golden_gauss_h32_raw) { golden_raw("gauss_h32", 32); }
Test(cli, golden_gauss_h64_raw) { golden_raw("gauss_h64", 64); }

Test(cli, topk_raw_text_json) {
  char lens[256];
  int rows;
  golden_lens("gauss_h64_lens.bin", lens, sizeof lens, &rows);
  cr_assert_eq(cli("append 4 %s", golden_path("gauss_h64_keys.bin")), 0, "%s",
               err_);
  char base[1024];
  snprintf(base, sizeof base, "score 4 --q %s --w %s --heads 64 --lens %s",
           golden_path("gauss_h64_q.bin"), golden_path("gauss_h64_w.bin"), lens);
  int k = 16;
  cr_assert_eq(cli("%s --topk %d --format raw --out %s", base, k,
                   tmp("top.raw")),
               0, "%s", err_);
  size_t sz, rsz;
  unsigned char *raw = fp4idx_test_load_file(tmp("top.raw"), &sz);
  float *ref = fp4idx_test_load_golden("gauss_h64_ref.bin", 0, &rsz);
  int64_t width = (int64_t)(rsz / 4 / (size_t)rows);
  size_t m = (size_t)rows * (size_t)k;
  cr_assert_eq(sz, m * 8, "raw top-k is positions then logits");
  int32_t *rpos = malloc(m * 4), *rcnt = malloc((size_t)rows * 4);
  float *rval = malloc(m * 4);
  cr_assert_eq(fp4idx_test_ref_topk(ref, rows, width, k, rpos, rval, rcnt), 0);
  cr_expect_eq(memcmp(raw, rpos, m * 4), 0, "positions differ");
  cr_expect_eq(fp4idx_test_count_diff((const float *)(raw + m * 4), rval,
                                      (int64_t)m),
               0, "logits differ");

  /* text: one line per row, "row r: pos:logit ...", count pairs each. */
  cr_assert_eq(cli("%s --topk %d", base, k), 0, "%s", err_);
  char *line = out_;
  for (int r = 0; r < rows; r++) {
    char want[16];
    snprintf(want, sizeof want, "row %d:", r);
    cr_assert(strncmp(line, want, strlen(want)) == 0, "%s", line);
    char *nl = strchr(line, '\n');
    cr_assert_not_null(nl);
    int pairs = 0;
    for (char *p = line; p < nl; p++) pairs += *p == ':';
    cr_expect_eq(pairs - 1, rcnt[r], "row %d pairs", r);
    if (rcnt[r] > 0) {
      char first[32];
      snprintf(first, sizeof first, " %d:", rpos[(size_t)r * (size_t)k]);
      cr_expect(strstr(line, first) == line + strlen(want), "%s", line);
    }
    line = nl + 1;
  }
  cr_expect_eq(*line, '\0');

  /* json: the fixed schema, k and per-row counts. */
  cr_assert_eq(cli("%s --topk 2 --format json", base), 0, "%s", err_);
  static const char head[] =
      "{\"seq\":4,\"rows\":6,\"k\":2,\"results\":[{\"count\":2,";
  cr_expect(strncmp(out_, head, sizeof head - 1) == 0, "%s", out_);
  cr_expect(strstr(out_, "{\"count\":0,\"positions\":[],\"logits\":[]}") != NULL,
            "row with lens 0: %s", out_);
  cr_expect_eq(out_[strlen(out_) - 1], '\n');
  free(raw), free(ref), free(rpos), free(rcnt), free(rval);
}

Test(cli, npy_and_stdin_inputs_store_the_same_keys) {
  size_t sz;
  void *keys = fp4idx_test_load_golden("dyadic_h32_keys.bin", 0, &sz);
  FILE *f = fopen(tmp("keys.npy"), "wb");
  uint64_t shape[2] = {sz / 256, 128};
  cr_assert_eq(fp4idx__npy_write_header(f, "<u2", 2, shape), 0);
  fwrite(keys, 1, sz, f);
  fclose(f);
  free(keys);
  const char *raw = golden_path("dyadic_h32_keys.bin");
  cr_assert_eq(cli("append 1 %s --dtype bf16", raw), 0, "%s", err_);
  cr_assert_eq(cli("append 2 %s", tmp("keys.npy")), 0, "%s", err_);
  cr_assert_eq(cli("append 3 - --dtype bf16 <%s", raw), 0, "%s", err_);
  cr_expect(strstr(out_, "appended 1000 keys at 0, length 1000") != NULL, "%s",
            out_);
  for (int s = 1; s <= 3; s++) {
    char name[32];
    snprintf(name, sizeof name, "r%d.bin", s);
    cr_assert_eq(cli("read %d --out %s", s, tmp(name)), 0, "%s", err_);
  }
  cr_expect(files_equal(tmp("r1.bin"), tmp("r2.bin")), ".npy input differs");
  cr_expect(files_equal(tmp("r1.bin"), tmp("r3.bin")), "stdin input differs");
  size_t n;
  void *p = fp4idx_test_load_file(tmp("r1.bin"), &n);
  cr_expect_eq(n, 1000u * 68);
  free(p);
  /* A .npy whose dtype contradicts --dtype is refused (usage of data). */
  cr_expect_eq(cli("append 9 %s --dtype f32", tmp("keys.npy")), 1);
  expect_one_line_error("append", "EINVAL");
}

Test(cli, random_keys_in_chunks_and_read) {
  cr_assert_eq(cli("append 1 --random 20000 --seed 5"), 0, "%s", err_);
  cr_expect(strstr(out_, "seq 1: appended 20000 keys at 0, length 20000") !=
                NULL,
            "%s", out_);
  cr_expect_str_eq(err_, "", "no progress bar when stderr is not a terminal");
  cr_assert_eq(cli("append 2 --random 20000 --seed 5 --chunk 999"), 0, "%s",
               err_);
  cr_assert_eq(cli("append 3 --random 20000 --seed 6"), 0, "%s", err_);
  cr_assert_eq(cli("read 1 --out %s", tmp("a.bin")), 0, "%s", err_);
  cr_assert_eq(cli("read 2 --out %s", tmp("b.bin")), 0, "%s", err_);
  cr_assert_eq(cli("read 3 --out %s", tmp("c.bin")), 0, "%s", err_);
  cr_expect(files_equal(tmp("a.bin"), tmp("b.bin")),
            "same seed, other chunking: other keys");
  cr_expect(!files_equal(tmp("a.bin"), tmp("c.bin")), "seed ignored");
  /* A sub-range, dequantized, as .npy. */
  cr_assert_eq(cli("read 1 --from 100 --count 7 --dequant --out %s",
                   tmp("d.npy")),
               0, "%s", err_);
  size_t n;
  unsigned char *p = fp4idx_test_load_file(tmp("d.npy"), &n);
  fp4idx_npy_t h;
  fp4idx_cli_err_t e = {0};
  cr_assert_eq(fp4idx__npy_parse(p, n, &h, &e), 0, "%s", e.msg);
  cr_expect_eq(h.kind, 'f');
  cr_expect_eq(h.itemsize, 4);
  cr_expect_eq(h.ndim, 2);
  cr_expect_eq(h.shape[0], 7);
  cr_expect_eq(h.shape[1], 128);
  /* Values equal the exact decode of the packed keys 100..106. */
  unsigned char *slots = fp4idx_test_load_file(tmp("a.bin"), NULL);
  size_t bad = 0;
  for (int k = 0; k < 7; k++)
    for (int el = 0; el < 128; el++) {
      float v;
      memcpy(&v, p + h.data_offset + ((size_t)k * 128 + (size_t)el) * 4, 4);
      bad += (double)v != fp4idx_test_key_element(slots + (100 + k) * 68, el);
    }
  cr_expect_eq(bad, 0);
  free(p);
  free(slots);
  /* fp4 random keys are stored verbatim. */
  cr_assert_eq(cli("append 8 --random 50 --seed 1 --dtype fp4"), 0, "%s", err_);
  cr_assert_eq(cli("read 8 --out %s", tmp("f.bin")), 0, "%s", err_);
  uint8_t want[50 * 68];
  fp4idx__gen_keys(FP4IDX_KEYS_FP4, 1, 0, 50, want);
  unsigned char *got = fp4idx_test_load_file(tmp("f.bin"), &n);
  cr_expect_eq(n, sizeof want);
  cr_expect_eq(memcmp(got, want, sizeof want), 0);
  free(got);
}

Test(cli, truncate_drop_and_errors) {
  cr_assert_eq(cli("append 1 --random 100 --seed 1"), 0, "%s", err_);
  cr_assert_eq(cli("truncate 1 40"), 0, "%s", err_);
  cr_expect_str_eq(out_, "seq 1: length 40\n");
  cr_expect_eq(cli("truncate 1 41"), 1);
  expect_one_line_error("truncate", "ERANGE");
  cr_assert_eq(cli("drop 1"), 0, "%s", err_);
  cr_expect_str_eq(out_, "seq 1: dropped\n");
  cr_expect_eq(cli("drop 1"), 1);
  expect_one_line_error("drop", "ENOSEQ");
  cr_expect_str_eq(out_, "");
  cr_expect_eq(cli("score 42 --q %s --w %s --heads 32",
                   golden_path("dyadic_h32_q.bin"),
                   golden_path("dyadic_h32_w.bin")),
               1);
  expect_one_line_error("score", "ENOSEQ");
  cr_expect(strstr(err_, "42") != NULL, "%s", err_);
  cr_expect_eq(cli("read 42 --out %s", tmp("x.bin")), 1);
  expect_one_line_error("read", "ENOSEQ");

  /* Files that do not fit. */
  cr_expect_eq(cli("append 1 %s/nope.bin", work_), 1);
  expect_one_line_error("append", "EIO");
  cr_expect_eq(cli("append 1 %s --dtype f32", golden_path("dyadic_h32_w.bin")),
               1);
  expect_one_line_error("append", "ESHAPE");
  cr_expect_eq(cli("score 1 --q %s --w %s --heads 64",
                   golden_path("dyadic_h32_q.bin"),
                   golden_path("dyadic_h32_q.bin")),
               1);
  expect_one_line_error("score", "ESHAPE");
  cr_expect_eq(cli("score 1 --q %s --w %s --heads 32 --lens 1,2",
                   golden_path("dyadic_h32_q.bin"),
                   golden_path("dyadic_h32_w.bin")),
               1);
  expect_one_line_error("score", "ESHAPE");
}

Test(cli, list_text_json_and_steps) {
  cr_assert_eq(cli("list"), 0, "%s", err_);
  cr_expect_str_eq(out_, "seq keys pages\n");
  cr_assert_eq(cli("list --format json"), 0, "%s", err_);
  cr_expect_str_eq(out_, "{\"sequences\":[]}\n");
  cr_assert_eq(cli("append 9 --random 130 --seed 1"), 0, "%s", err_);
  cr_assert_eq(cli("append 3 --random 1 --seed 2"), 0, "%s", err_);
  for (int i = 0; i < 40; i++) cr_assert_eq(cli("append %d --random 1", 100 + i), 0, "%s", err_);
  cr_assert_eq(cli("drop 120"), 0, "%s", err_);
  /* every sequence once, sorted, through several steps of 5 */
  cr_assert_eq(cli("list --count 5"), 0, "%s", err_);
  static const char head[] = "seq keys pages\n3 1 1\n9 130 3\n100 1 1\n";
  cr_expect(strncmp(out_, head, strlen(head)) == 0, "%s", out_);
  int lines = 0;
  for (const char *p = out_; *p; p++) lines += *p == '\n';
  cr_expect_eq(lines, 1 + 41, "%s", out_);
  cr_expect(strstr(out_, "\n120 ") == NULL, "dropped 120 listed: %s", out_);
  cr_assert_eq(cli("list --format json --count 3"), 0, "%s", err_);
  static const char jhead[] = "{\"sequences\":[{\"seq\":3,\"keys\":1,\"pages\":1},"
                              "{\"seq\":9,\"keys\":130,\"pages\":3},";
  cr_expect(strncmp(out_, jhead, strlen(jhead)) == 0, "%s", out_);
  /* one step: the next cursor is printed; walking the cursors by hand
   * finds all 41 */
  unsigned long long cursor = 0;
  int found = 0, steps = 0;
  do {
    cr_assert_eq(cli("list --cursor %llu --count 4", cursor), 0, "%s", err_);
    const char *c = strstr(out_, "cursor: ");
    cr_assert_not_null(c, "%s", out_);
    cursor = strtoull(c + 8, NULL, 10);
    for (const char *p = out_; p < c; p++) found += *p == '\n';
    found--; /* the header line */
    cr_assert_lt(++steps, 1000);
  } while (cursor != 0);
  cr_expect_eq(found, 41);
  cr_assert_eq(cli("list --cursor 0 --count 10000 --format json"), 0, "%s", err_);
  cr_expect(strncmp(out_, "{\"cursor\":", 10) == 0, "%s", out_);
  cr_expect_eq(cli("list --count 0"), 2);
  expect_one_line_error("list", "EINVAL");
  cr_expect_eq(cli("list --count 10001"), 2);
  expect_one_line_error("list", "EINVAL");
  cr_expect_eq(cli("list --format raw"), 2);
  expect_one_line_error("list", "EINVAL");
  cr_expect_eq(cli("list extra"), 2);
  expect_one_line_error("list", "EINVAL");
}

Test(cli, usage_errors_exit_2) {
  static const char *const bad[][2] = {
      {"score 1 --heads 32", "score"},
      {"score 1 --q a --w b --heads 0", "score"},
      {"score x --q a --w b --heads 1", "score"},
      {"score 1 --q a --w b --heads 1 --format xml", "score"},
      {"score 1 --q a --w b --heads 1 --lens 1,,2", "score"},
      {"append 1", "append"},
      {"append 1 f --dtype f16", "append"},
      {"append 1 f --rounding up", "append"},
      {"append 1 --random 0", "append"},
      {"truncate 1", "truncate"},
      {"drop", "drop"},
      {"read 1", "read"},
      {"info extra", "info"},
      {"stats --bogus", "stats"},
      {"frobnicate", "options"},
      {"", "options"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_expect_eq(cli("%s", bad[i][0]), 2, "'%s' -> %s", bad[i][0], err_);
    expect_one_line_error(bad[i][1], "EINVAL");
    cr_expect_str_eq(out_, "");
  }
}

Test(cli, help_and_version) {
  static const char *const cmds[] = {"info", "stats", "append", "score",
                                     "truncate", "drop", "read"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    cr_expect_eq(cli("%s --help", cmds[i]), 0, "%s", err_);
    cr_expect(strncmp(out_, "usage: fp4idx-cli", 17) == 0, "%s", out_);
    cr_expect(strstr(out_, cmds[i]) != NULL);
    cr_expect_str_eq(err_, "");
  }
  cr_expect_eq(cli("--help"), 0);
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    cr_expect(strstr(out_, cmds[i]) != NULL, "--help lacks %s", cmds[i]);
  cr_expect_eq(cli("--version"), 0);
  cr_expect(strncmp(out_, "fp4idx-cli ", 11) == 0, "%s", out_);
}

Test(cli, info_stats_prometheus) {
  cr_assert_eq(cli("append 1 --random 10 --seed 1"), 0, "%s", err_);
  cr_assert_eq(cli("info"), 0, "%s", err_);
  cr_expect(strstr(out_, "backend: cpu\n") != NULL, "%s", out_);
  cr_expect(strstr(out_, "server: fp4idxd ") != NULL, "%s", out_);
  cr_expect(strstr(out_, "sequences: 1\n") != NULL, "%s", out_);
  cr_assert_eq(cli("stats"), 0, "%s", err_);
  cr_expect(strstr(out_, "keys: 10\n") != NULL, "%s", out_);
  cr_expect(strstr(out_, "append") != NULL, "%s", out_);
  cr_assert_eq(cli("stats --prometheus --out %s", tmp("fp4idx.prom")), 0, "%s",
               err_);
  cr_expect_str_eq(out_, "");
  char prom[8192];
  slurp(tmp("fp4idx.prom"), prom, sizeof prom);
  cr_expect(strstr(prom, "fp4idx_requests_total{op=\"append\"} 1\n") != NULL,
            "%s", prom);
  cr_expect(strstr(prom, "fp4idx_request_latency_seconds_bucket{op=\"append\","
                         "le=\"+Inf\"} 1\n") != NULL,
            "%s", prom);
  cr_expect(strstr(prom, "fp4idx_keys 10\n") != NULL, "%s", prom);
  cr_expect(strstr(prom, "fp4idx_info{server=\"fp4idxd ") != NULL, "%s", prom);
  /* The temporary file was renamed away. */
  char cmd[512];
  snprintf(cmd, sizeof cmd, "ls %s | grep -q 'fp4idx.prom.tmp'", work_);
  cr_expect_neq(WEXITSTATUS(system(cmd)), 0, "temporary file left behind");
}

Test(cli, timeout_option) {
  cr_assert_eq(fp4idx_test_daemon_kill(&daemon_, SIGSTOP), 0);
  int rc = cli("-t 200 info");
  fp4idx_test_daemon_kill(&daemon_, SIGCONT);
  cr_expect_eq(rc, 1);
  expect_one_line_error("info", "ETIMEDOUT");
  cr_expect_eq(cli("-t 60000 info"), 0, "%s", err_);
  cr_expect_eq(cli("-t soon info"), 2);
  expect_one_line_error("options", "EINVAL");
}

Test(cli, daemon_absent_is_econn) {
  fp4idx_test_daemon_stop(&daemon_);
  cr_expect_eq(cli("info"), 1);
  expect_one_line_error("info", "ECONN");
  cr_expect_eq(cli("append 1 --random 5"), 1);
  expect_one_line_error("append", "ECONN");
}

/* ---- a daemon with a small frame limit ------------------------------------- */

static void start_small_frame(void) {
  static const char *const extra[] = {"--max-frame", "256K", NULL};
  snprintf(work_, sizeof work_, "/tmp/fp4idx-cli-test-XXXXXX");
  cr_assert_not_null(mkdtemp(work_));
  cr_assert_eq(fp4idx_test_daemon_start(&daemon_, extra), 0,
               "fp4idxd did not start");
}

TestSuite(cli_small_frame, .init = start_small_frame, .fini = stop);

Test(cli_small_frame, append_chunks_fit_the_frame_limit) {
  /* 8192 f32 keys would be 4 MiB per request; the CLI shrinks its chunks. */
  cr_assert_eq(cli("append 1 --random 3000 --seed 2 --dtype f32"), 0, "%s",
               err_);
  cr_expect(strstr(out_, "appended 3000 keys at 0, length 3000") != NULL, "%s",
            out_);
  cr_assert_eq(cli("append 2 --random 3000 --seed 2 --dtype f32 --chunk 100"),
               0, "%s", err_);
  cr_assert_eq(cli("read 1 --out %s", tmp("a.bin")), 0, "%s", err_);
  cr_assert_eq(cli("read 2 --out %s", tmp("b.bin")), 0, "%s", err_);
  cr_expect(files_equal(tmp("a.bin"), tmp("b.bin")));
}
