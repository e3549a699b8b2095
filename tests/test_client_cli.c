/* test_client_cli.c -- fp4idx-cli end to end against the real fp4idxd: the
 * golden cases through `append --dtype bf16` and `score --format raw --out`
 * compared byte for byte with tests/golden/<case>_ref.bin, top-k raw output
 * against a sort of the reference, .npy and stdin inputs, --random keys in
 * chunks, read/truncate/drop, info/stats/--prometheus, and the exit codes
 * and one-line errors. The CLI is $FP4IDX_CLI or the one built here. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <fcntl.h>
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
  cr_expect_str_eq(out_, "seq keys pages shared\n");
  cr_assert_eq(cli("list --format json"), 0, "%s", err_);
  cr_expect_str_eq(out_, "{\"sequences\":[]}\n");
  cr_assert_eq(cli("append 9 --random 130 --seed 1"), 0, "%s", err_);
  cr_assert_eq(cli("append 3 --random 1 --seed 2"), 0, "%s", err_);
  for (int i = 0; i < 40; i++) cr_assert_eq(cli("append %d --random 1", 100 + i), 0, "%s", err_);
  cr_assert_eq(cli("drop 120"), 0, "%s", err_);
  /* every sequence once, sorted, through several steps of 5 */
  cr_assert_eq(cli("list --count 5"), 0, "%s", err_);
  static const char head[] = "seq keys pages shared\n3 1 1 0\n9 130 3 0\n100 1 1 0\n";
  cr_expect(strncmp(out_, head, strlen(head)) == 0, "%s", out_);
  int lines = 0;
  for (const char *p = out_; *p; p++) lines += *p == '\n';
  cr_expect_eq(lines, 1 + 41, "%s", out_);
  cr_expect(strstr(out_, "\n120 ") == NULL, "dropped 120 listed: %s", out_);
  cr_assert_eq(cli("list --format json --count 3"), 0, "%s", err_);
  static const char jhead[] =
      "{\"sequences\":[{\"seq\":3,\"keys\":1,\"pages\":1,\"pages_shared\":0},"
      "{\"seq\":9,\"keys\":130,\"pages\":3,\"pages_shared\":0},";
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

/* f32 [n] file from bf16 [n] values, plus `nudge` (in f32 ulps) that RNE
 * rounds away again (|nudge| < 2^15 ulps keeps the nearest bf16). */
static void bf16_file_to_f32(const char *src, const char *dst, int32_t nudge) {
  size_t sz;
  uint16_t *h = fp4idx_test_load_golden(src, 0, &sz);
  cr_assert_not_null(h);
  FILE *f = fopen(dst, "wb");
  cr_assert_not_null(f);
  for (size_t i = 0; i < sz / 2; i++) {
    uint32_t u = (uint32_t)h[i] << 16;
    if ((u & 0x7fffffffu) != 0) u = (uint32_t)((int32_t)u + nudge);
    fwrite(&u, 4, 1, f);
  }
  fclose(f);
  free(h);
}

Test(cli, score_takes_f32_q_and_w_rounded_rne) {
  /* The golden case with q/w given as f32 (raw with --dtype f32, and .npy
   * '<f4'), each value 0x7fff ulps above its bf16: RNE gives back the bf16
   * values, so the logits equal the reference byte for byte. */
  char lens[256];
  int rows;
  golden_lens("dyadic_h32_lens.bin", lens, sizeof lens, &rows);
  cr_assert_eq(cli("append 1 %s --dtype bf16", golden_path("dyadic_h32_keys.bin")), 0, "%s", err_);
  bf16_file_to_f32("dyadic_h32_q.bin", tmp("q.f32"), 0x7fff);
  bf16_file_to_f32("dyadic_h32_w.bin", tmp("w.f32"), -0x7fff);
  cr_assert_eq(cli("score 1 --q %s --w %s --dtype f32 --heads 32 --lens %s "
                   "--format raw --out %s", tmp("q.f32"), tmp("w.f32"), lens,
                   tmp("l32.f32")), 0, "%s", err_);
  cr_expect(files_equal(tmp("l32.f32"), golden_path("dyadic_h32_ref.bin")),
            "f32 q/w logits differ from the bf16 reference");
  /* The same as .npy '<f4' [R,32,128] / [R,32], no --dtype needed. */
  size_t qn, wn;
  void *qd = fp4idx_test_load_file(tmp("q.f32"), &qn);
  void *wd = fp4idx_test_load_file(tmp("w.f32"), &wn);
  uint64_t qs[3] = {(uint64_t)rows, 32, 128}, ws[2] = {(uint64_t)rows, 32};
  FILE *f = fopen(tmp("q.npy"), "wb");
  fp4idx__npy_write_header(f, "<f4", 3, qs);
  fwrite(qd, 1, qn, f);
  fclose(f);
  f = fopen(tmp("w.npy"), "wb");
  fp4idx__npy_write_header(f, "<f4", 2, ws);
  fwrite(wd, 1, wn, f);
  fclose(f);
  free(qd);
  free(wd);
  cr_assert_eq(cli("score 1 --q %s --w %s --heads 32 --lens %s --format raw --out %s",
                   tmp("q.npy"), tmp("w.npy"), lens, tmp("lnpy.f32")), 0, "%s", err_);
  cr_expect(files_equal(tmp("lnpy.f32"), golden_path("dyadic_h32_ref.bin")),
            ".npy f32 q/w logits differ from the bf16 reference");
  /* --heads 16 against that q of 32 heads names both counts. */
  cr_expect_eq(cli("score 1 --q %s --w %s --heads 16", tmp("q.npy"), tmp("w.npy")), 1);
  expect_one_line_error("score", "ESHAPE");
  cr_expect(strstr(err_, "--q has 32 heads (.npy shape [") != NULL &&
            strstr(err_, "but --heads is 16") != NULL, "%s", err_);
  /* Raw q of 32 heads, --heads 16 and --lens for the real rows: named too. */
  cr_expect_eq(cli("score 1 --q %s --w %s --dtype f32 --heads 16 --lens %s",
                   tmp("q.f32"), tmp("w.f32"), lens), 1);
  expect_one_line_error("score", "ESHAPE");
  cr_expect(strstr(err_, "--q would then have 32 heads, but --heads is 16") != NULL,
            "%s", err_);
  cr_expect_eq(cli("score 1 --q %s --w %s --dtype f16 --heads 32", tmp("q.f32"),
                   tmp("w.f32")), 2);
  expect_one_line_error("score", "EINVAL");
}

Test(cli, help_command) {
  cr_expect_eq(cli("help"), 0, "%s", err_);
  cr_expect(strncmp(out_, "usage: fp4idx-cli", 17) == 0, "%s", out_);
  cr_expect(strstr(out_, "append") && strstr(out_, "score"), "%s", out_);
  cr_expect_str_eq(err_, "");
  cr_expect_eq(cli("help append"), 0, "%s", err_);
  cr_expect(strncmp(out_, "usage: fp4idx-cli [-s SOCKET] append", 36) == 0, "%s", out_);
  cr_expect_eq(cli("help frobnicate"), 2);
  expect_one_line_error("help", "EINVAL");
}

Test(cli, info_and_stats_as_json) {
  cr_assert_eq(cli("append 1 --random 10 --seed 1"), 0, "%s", err_);
  cr_assert_eq(cli("info --format json"), 0, "%s", err_);
  cr_expect(out_[0] == '{' && strstr(out_, "}\n") == out_ + strlen(out_) - 2, "%s", out_);
  cr_expect(strstr(out_, "\"backend\":\"cpu\"") != NULL, "%s", out_);
  cr_expect(strstr(out_, "\"sequences\":1,") != NULL, "%s", out_);
  cr_expect(strstr(out_, "\"server\":\"fp4idxd ") != NULL, "%s", out_);
  cr_assert_eq(cli("stats --format json"), 0, "%s", err_);
  cr_expect(strstr(out_, "\"keys\":10,") != NULL, "%s", out_);
  cr_expect(strstr(out_, "{\"op\":\"append\",\"requests\":1,\"errors\":0,") != NULL, "%s", out_);
  cr_expect(strstr(out_, "{\"le_us\":null,\"count\":") != NULL, "+inf bucket: %s", out_);
  /* A JSON parser reads both (python3 is part of Debian's base images; the
   * check is skipped where it is missing). */
  if (system("command -v python3 >/dev/null 2>&1") == 0) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; json.load(open(sys.argv[1]))' %s",
             tmp("cli.out"));
    cr_expect_eq(system(cmd), 0, "stats JSON does not parse: %s", out_);
    cr_assert_eq(cli("info --format json"), 0);
    cr_expect_eq(system(cmd), 0, "info JSON does not parse: %s", out_);
  }
  cr_expect_eq(cli("stats --format json --prometheus"), 2);
  cr_expect_eq(cli("info --format yaml"), 2);
  expect_one_line_error("info", "EINVAL");
}

Test(cli, ctrl_c_mid_append_says_what_was_stored) {
  /* A long append, SIGINT once some keys are in: the CLI finishes the
   * request in flight, then reports the stored count and the length, and
   * the daemon holds exactly that many keys. */
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    int fd = open(tmp("int.err"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, STDERR_FILENO);
    int fo = open("/dev/null", O_WRONLY);
    dup2(fo, STDOUT_FILENO);
    signal(SIGINT, SIG_DFL);
    execl(cli_path(), cli_path(), "-s", daemon_.sock, "append", "7", "--random",
          "50000000", "--chunk", "2048", (char *)NULL);
    _exit(127);
  }
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_eq(fp4idx_client_connect(c, daemon_.sock), FP4IDX_OK);
  /* Wait until the sequence has keys (read of 1 key succeeds). */
  for (int i = 0; i < 400; i++) {
    void *k = NULL;
    size_t n = 0;
    int st = fp4idx_client_read(c, 7, 0, 1, 0, &k, &n);
    fp4idx_client_free(k);
    if (st == FP4IDX_OK && n == 1) break;
    usleep(10000);
  }
  cr_assert_eq(kill(pid, SIGINT), 0);
  int ws;
  cr_assert_eq(waitpid(pid, &ws, 0), pid);
  slurp(tmp("int.err"), err_, sizeof err_);
  cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 130, "status %d: %s", ws, err_);
  unsigned long long done = 0, total = 0, at = 0, seq = 0, len = 0;
  cr_assert_eq(sscanf(err_, "fp4idx-cli: append: interrupted: %llu of %llu keys were "
                            "stored (at %llu); seq %llu has length %llu (SIGINT)",
                      &done, &total, &at, &seq, &len), 5, "%s", err_);
  cr_expect_eq(total, 50000000ull);
  cr_expect(done > 0 && done < total && done % 2048 == 0, "%llu", done);
  cr_expect_eq(seq, 7);
  cr_expect_eq(len, done);
  cr_expect(strchr(err_, '\n') == err_ + strlen(err_) - 1, "not one line: %s", err_);
  void *k = NULL;
  size_t n = 0;
  cr_assert_eq(fp4idx_client_read(c, 7, 0, UINT64_MAX, 0, &k, &n), FP4IDX_OK);
  fp4idx_client_free(k);
  cr_expect_eq(n, len, "daemon holds %zu keys, the CLI said %llu", n, len);
  fp4idx_client_close(c);
}

Test(cli, progress_bar_fits_the_terminal) {
  /* script(1) gives the CLI a terminal; COLUMNS its width (a pty of no
   * size). Every redraw fits in COLUMNS - 1 and shows rate and ETA. */
  if (system("command -v script >/dev/null 2>&1") != 0)
    cr_skip_test("script(1) (util-linux) is missing: no terminal to draw on");
  static const int widths[] = {40, 100};
  for (int wi = 0; wi < 2; wi++) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "COLUMNS=%d script -qec 'stty cols 0 rows 0 2>/dev/null; %s -s %s append %d "
             "--random 60000 --chunk 1000' /dev/null >%s 2>&1",
             widths[wi], cli_path(), daemon_.sock, 20 + wi, tmp("tty.out"));
    cr_assert_eq(WEXITSTATUS(system(cmd)), 0);
    static char buf[1 << 16];
    slurp(tmp("tty.out"), buf, sizeof buf);
    int draws = 0;
    for (char *p = strtok(buf, "\r\n"); p; p = strtok(NULL, "\r\n")) {
      char *esc = strstr(p, "\033[K");
      if (strncmp(p, widths[wi] >= 80 ? "append [" : "[", widths[wi] >= 80 ? 8 : 1) != 0)
        continue;
      size_t len = esc ? (size_t)(esc - p) : strlen(p);
      cr_expect_leq(len, (size_t)widths[wi] - 1, "width %d: %zu: %s", widths[wi], len, p);
      cr_expect(strstr(p, "/s ") && (strstr(p, "ETA ") || strstr(p, " in ")), "%s", p);
      draws++;
    }
    cr_expect_geq(draws, 10, "width %d: %d redraws", widths[wi], draws);
  }
}

Test(cli, save_without_persistence_says_so) {
  /* Not "unknown request type": the code and the message name what is
   * missing, and the op is named once. */
  cr_expect_eq(cli("save"), 1);
  expect_one_line_error("save", "EDISABLED");
  cr_expect_str_eq(err_, "fp4idx-cli: save: persistence is not enabled: start fp4idxd "
                         "with --data-dir (EDISABLED)\n");
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
