/* test_daemon_budget.c -- the buffer budget (daemon/budget.h) against the
 * real daemon: clients that pipeline requests and never read their replies
 * make it hold no more than --buffer-budget (plus one small reply each), while
 * another client is answered; a connection that holds its share without
 * reading is closed after --buffer-timeout, one that reads slowly is not; a
 * frame larger than the budget still completes while the budget is full;
 * large replies count before they are built: 8 connections pipelining
 * 16 MiB replies and 1,000 leaving 2 MiB replies unread stay within the
 * budget plus a fixed margin, and a reply above the whole budget is
 * refused with a message that says how to ask for less.
 * Speed is the benchmark's (bench/bench_slow_readers.c), not asserted here. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "daemon_harness.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Room for n more fds in this process (the test's own connections). */
static void raise_nofile(rlim_t n) {
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur >= n) return;
  rl.rlim_cur = rl.rlim_max < n ? rl.rlim_max : n;
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  cr_assert_geq(rl.rlim_cur, n, "RLIMIT_NOFILE hard limit %llu is below %llu",
                (unsigned long long)rl.rlim_max, (unsigned long long)n);
}

/* Stores `n` packed keys (scale bytes 127) as sequence `seq`. */
static void store_keys(int fd, uint64_t seq, uint64_t n) {
  unsigned char *keys = malloc(n * 68);
  for (uint64_t i = 0; i < n * 68; i++) keys[i] = (unsigned char)(i * 13 + 5);
  for (uint64_t i = 0; i < n; i++) memset(keys + i * 68 + 64, 127, 4);
  uint64_t first, len;
  cr_assert_eq(fp4idx_test_append(fd, seq, FP4IDX_WIRE_U8, n, keys, &first, &len), 0);
  free(keys);
}

/* `count` pipelined read requests of the whole of `seq` (dequant: f32
 * [n,128], 512 bytes a key; else packed, 68), as one buffer. */
static unsigned char *read_requests_as(uint64_t seq, int count, int dequant, size_t *len) {
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_READ;
  req.u.read.seq = seq;
  req.u.read.dequant = dequant;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  for (int i = 0; i < count; i++) {
    req.id = (uint64_t)i + 1;
    cr_assert_eq(fp4idx_encode_request(&sb, &req), 0);
  }
  unsigned char *buf = malloc(sb.size);
  memcpy(buf, sb.data, sb.size);
  *len = sb.size;
  msgpack_sbuffer_destroy(&sb);
  return buf;
}

static unsigned char *read_requests(uint64_t seq, int count, size_t *len) {
  return read_requests_as(seq, count, 0, len);
}

/* Opens n connections that each send `reqs` and never read. */
static int *open_bad(const fp4idx_test_daemon_t *d, int n, const unsigned char *reqs,
                     size_t len) {
  int *fds = malloc((size_t)n * sizeof *fds);
  for (int i = 0; i < n; i++) {
    fds[i] = fp4idx_test_connect(d->sock);
    cr_assert_geq(fds[i], 0, "bad connection %d", i);
    cr_assert_eq(fp4idx_test_send_all(fds[i], reqs, len), 0);
  }
  return fds;
}

#define N_BAD 1000
#define BAD_REQS 64

/* Two measures of what the daemon holds, checked after each load below:
 *   - its own count (stats: buffered_bytes_peak), in every build, against
 *     the bound budget.h states;
 *   - its RSS growth, in builds without AddressSanitizer: there every block
 *     costs redzones, size-class rounding and shadow, and RSS moves in
 *     steps of tens of MiB with the sanitizer's allocator, not with what the
 *     daemon holds. The RSS bound is what the count allows plus the
 *     connections' own memory and the allocator's slack. */
static void check_held(int ctl, long grew_mib, long rss_bound_mib, uint64_t count_bound,
                       const char *what) {
  uint64_t held = 0, peak = 0, budget = 0;
  cr_assert_eq(fp4idx_test_buffered(ctl, &held, &peak, &budget), 0);
  cr_log_info("%s: the daemon counted at most %llu bytes held (budget %llu); VmRSS grew by "
              "%ld MiB", what, (unsigned long long)peak, (unsigned long long)budget, grew_mib);
  cr_assert_leq(peak, count_bound, "%s: %llu bytes held at most, above %llu", what,
                (unsigned long long)peak, (unsigned long long)count_bound);
#if defined(__SANITIZE_ADDRESS__)
  (void)rss_bound_mib;
#else
  cr_assert_lt(grew_mib, rss_bound_mib, "%s: VmRSS grew by %ld MiB", what, grew_mib);
#endif
}

/* 1000 connections x 64 pipelined 4.4 kB replies: the count stays under
 * budget + one reply per connection (budget.h); RSS adds the connections
 * (5 KiB each) and the allocator's slack: it measured 45 MiB. Without the
 * budget the daemon held 141 MB. */
#define SMALL_REPLY_BYTES (64 * 68 + 512)
#define RSS_BOUND_MIB 64

Test(daemon_budget, non_reading_clients_hold_no_more_than_the_budget) {
  raise_nofile(N_BAD + 64);
  fp4idx_test_small_asan_quarantine();
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--buffer-budget", "32M",
                                                              "--log-level", "info", NULL}),
               0);
  int ctl = fp4idx_test_connect(d.sock);
  cr_assert_geq(ctl, 0);
  store_keys(ctl, 1, 64); /* a read of it: a 4.4 kB reply */
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(ctl, &info), 0);
  long before = fp4idx_test_proc_kib(d.pid, "VmRSS");

  /* 1000 connections x 64 pipelined reads, never read: without a budget
   * the daemon held 32 replies each (32 requests in flight), 141 MB. */
  size_t len;
  unsigned char *reqs = read_requests(1, BAD_REQS, &len);
  int *bad = open_bad(&d, N_BAD, reqs, len);
  long peak = before;
  for (int t = 0; t < 40; t++) {
    cr_assert_eq(fp4idx_test_info(ctl, &info), 0, "the well-behaved client is answered");
    long now = fp4idx_test_proc_kib(d.pid, "VmRSS");
    if (now > peak) peak = now;
    sleep_ms(50);
  }
  check_held(ctl, (peak - before) / 1024, RSS_BOUND_MIB,
             ((uint64_t)32 << 20) + (uint64_t)N_BAD * SMALL_REPLY_BYTES,
             "1000 non-reading clients");
  cr_assert_eq(info.sequences, 1);
  for (int i = 0; i < N_BAD; i++) close(bad[i]);
  free(bad);
  free(reqs);
  cr_assert_eq(fp4idx_test_info(ctl, &info), 0);
  close(ctl);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* Reads from fd until EOF or error within timeout_ms: 1 at EOF/reset, 0 if
 * the connection stays open, and *bytes gets what was read. */
static int drains_to_eof(int fd, int timeout_ms, size_t *bytes) {
  char buf[65536];
  *bytes = 0;
  for (int waited = 0; waited < timeout_ms;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 100);
    if (r == 0) {
      waited += 100;
      continue;
    }
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return 1;
    *bytes += (size_t)n;
  }
  return 0;
}

Test(daemon_budget, timeout_closes_a_full_connection_that_never_reads) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--buffer-budget", "16M",
                                                              "--buffer-timeout", "1",
                                                              "--log-level", "info", NULL}),
               0);
  int ctl = fp4idx_test_connect(d.sock);
  cr_assert_geq(ctl, 0);
  store_keys(ctl, 1, 4096); /* a read of it: a 278 kB reply */
  size_t len;
  unsigned char *reqs = read_requests(1, 20, &len);

  /* A slow reader: one reply every 150 ms (its share is reached, but it
   * reads), and a client that never reads. */
  int slow = fp4idx_test_connect(d.sock);
  cr_assert_geq(slow, 0);
  cr_assert_eq(fp4idx_test_send_all(slow, reqs, len), 0);
  int *bad = open_bad(&d, 1, reqs, len);
  for (int i = 0; i < 20; i++) {
    sleep_ms(150);
    fp4idx_response_t resp;
    unsigned char *body = NULL;
    cr_assert_eq(fp4idx_test_recv_response(slow, FP4IDX_OP_READ, &resp, &body), 0,
                 "slow reader, reply %d", i);
    cr_assert_eq(resp.status, 0);
    cr_assert_eq(resp.id, (uint64_t)i + 1);
    fp4idx_response_clear(&resp);
    free(body);
  }
  /* By now (3 s) the never-reading one was closed: what the kernel buffered
   * for it, then EOF. */
  size_t got;
  cr_assert_eq(drains_to_eof(bad[0], 3000, &got), 1, "the non-reading connection is closed");
  cr_assert_lt(got, 20 * (size_t)4096 * 68, "it did not get every reply (%zu bytes)", got);
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(ctl, &info), 0);
  close(bad[0]);
  free(bad);
  free(reqs);
  close(slow);
  close(ctl);
  cr_assert_eq(fp4idx_test_daemon_kill(&d, SIGTERM), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(&d, 10000), 0);
  FILE *f = fopen(d.log, "r");
  cr_assert_not_null(f);
  char line[1024];
  int closed_lines = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "WARN") && strstr(line, "unread for")) closed_lines++;
  fclose(f);
  cr_assert_eq(closed_lines, 1, "one WARN line for the one connection closed");
  fp4idx_test_daemon_stop(&d);
}

Test(daemon_budget, a_frame_larger_than_the_budget_completes_while_it_is_full) {
  raise_nofile(256);
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--buffer-budget", "16M",
                                                              "--cache-bytes", "32M",
                                                              "--log-level", "info", NULL}),
               0);
  int ctl = fp4idx_test_connect(d.sock);
  cr_assert_geq(ctl, 0);
  store_keys(ctl, 1, 4096);
  size_t len;
  unsigned char *reqs = read_requests(1, 32, &len);
  int *bad = open_bad(&d, 64, reqs, len); /* 64 x 32 x 278 kB wanted: pressure */
  /* The big frame comes once the budget is full (stats: no room left for
   * one more of their replies, which the budget admits only whole), not
   * after a guessed while. */
  const uint64_t reply = 4096 * 68;
  uint64_t held = 0, peak = 0, budget = UINT64_MAX;
  for (int t = 0; t < 1000 && held + reply <= budget; t++) {
    cr_assert_eq(fp4idx_test_buffered(ctl, &held, &peak, &budget), 0);
    if (held + reply <= budget) sleep_ms(10);
  }
  cr_assert_gt(held + reply, budget, "the non-reading clients never filled the budget (%llu of %llu)",
               (unsigned long long)held, (unsigned long long)budget);
  /* 20 MiB of bf16 keys in one frame, more than the whole budget. */
  uint64_t n = 80 * 1024;
  uint16_t *keys = malloc(n * 128 * sizeof *keys);
  for (uint64_t i = 0; i < n * 128; i++) keys[i] = (uint16_t)(0x3f80 + (i % 64));
  uint64_t first, length;
  cr_assert_eq(fp4idx_test_append(ctl, 2, FP4IDX_WIRE_BF16, n, keys, &first, &length), 0,
               "the big append completes");
  cr_assert_eq(length, n);
  free(keys);
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(ctl, &info), 0);
  cr_assert_eq(info.sequences, 2);
  for (int i = 0; i < 64; i++) close(bad[i]);
  free(bad);
  free(reqs);
  close(ctl);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

/* How many of fds[0..n) have bytes to read now (a reply was produced). */
static int count_readable(const int *fds, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    struct pollfd p = {.fd = fds[i], .events = POLLIN};
    if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) k++;
  }
  return k;
}

/* The daemon's RSS growth over `before` at its highest in `samples` looks
 * 50 ms apart, the control client answered at each. */
static long peak_growth_mib(fp4idx_test_daemon_t *d, int ctl, long before, int samples) {
  long peak = before;
  fp4idx_info_t info;
  for (int t = 0; t < samples; t++) {
    cr_assert_eq(fp4idx_test_info(ctl, &info), 0, "the well-behaved client is answered");
    long now = fp4idx_test_proc_kib(d->pid, "VmRSS");
    if (now > peak) peak = now;
    sleep_ms(50);
  }
  return (peak - before) / 1024;
}

#define BIG_CONNS 8
#define BIG_READS 3
#define BIG_KEYS 32768 /* a dequantized read of it: a 16 MiB reply */
/* Large replies are admitted before they are built: the count stays under
 * the budget itself. RSS: the budget plus a fixed margin (Criterion's and
 * the daemon's own churn; the kernel-side socket buffers are not RSS).
 * Without the global budget every connection held one 16 MiB reply:
 * 128 MiB and more. */
#define BIG_COUNT_BOUND ((uint64_t)32 << 20)
#define BIG_RSS_BOUND_MIB 72

/* One client reading its pipelined replies, checked against ref. */
typedef struct {
  int fd;
  const fp4idx_tensor_t *ref;
  int good;        /* replies right, in order */
  char why[400];   /* the first wrong one */
} big_reader_t;

static void *big_reader(void *arg) {
  big_reader_t *r = arg;
  for (int k = 0; k < BIG_READS; k++) {
    fp4idx_response_t resp;
    unsigned char *body = NULL;
    int rc = fp4idx_test_recv_response(r->fd, FP4IDX_OP_READ, &resp, &body);
    if (rc) {
      snprintf(r->why, sizeof r->why, "reply %d: receive failed (%d)", k, rc);
      return NULL;
    }
    int ok = resp.status == 0 && resp.id == (uint64_t)k + 1 &&
             resp.u.read.keys.nbytes == r->ref->nbytes &&
             memcmp(resp.u.read.keys.data, r->ref->data, r->ref->nbytes) == 0;
    if (!ok) snprintf(r->why, sizeof r->why, "reply %d: status %d id %llu: %s", k, resp.status,
                      (unsigned long long)resp.id, resp.error);
    fp4idx_response_clear(&resp);
    free(body);
    if (!ok) return NULL;
    r->good++;
  }
  return NULL;
}

Test(daemon_budget, pipelined_large_replies_stay_within_the_budget) {
  fp4idx_test_small_asan_quarantine();
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--buffer-budget", "32M",
                                                              "--buffer-timeout", "600",
                                                              "--log-level", "info", NULL}),
               0);
  int ctl = fp4idx_test_connect(d.sock);
  cr_assert_geq(ctl, 0);
  store_keys(ctl, 1, BIG_KEYS);
  /* The reference: the same read, alone. */
  size_t len;
  unsigned char *one = read_requests_as(1, 1, 1, &len);
  cr_assert_eq(fp4idx_test_send_all(ctl, one, len), 0);
  fp4idx_response_t ref;
  unsigned char *ref_body = NULL;
  cr_assert_eq(fp4idx_test_recv_response(ctl, FP4IDX_OP_READ, &ref, &ref_body), 0);
  cr_assert_eq(ref.status, 0, "%s", ref.error);
  cr_assert_eq(ref.u.read.keys.nbytes, (uint64_t)BIG_KEYS * 512);
  free(one);
  long before = fp4idx_test_proc_kib(d.pid, "VmRSS");

  unsigned char *reqs = read_requests_as(1, BIG_READS, 1, &len);
  int *big = open_bad(&d, BIG_CONNS, reqs, len);
  /* Replies were built (some connections have bytes waiting) before the
   * daemon's memory is looked at. */
  for (int t = 0; t < 400 && count_readable(big, BIG_CONNS) < 1; t++) sleep_ms(25);
  cr_assert_geq(count_readable(big, BIG_CONNS), 1, "a reply was produced");
  long grew = peak_growth_mib(&d, ctl, before, 30);
  check_held(ctl, grew, BIG_RSS_BOUND_MIB, BIG_COUNT_BOUND,
             "8 connections x 3 pipelined 16 MiB replies unread");
  /* Every reply arrives, in order and whole, once the clients read (each
   * on its own thread, as clients do: the budget is shared, so a reply
   * waits for the others' to be read). */
  pthread_t th[BIG_CONNS];
  big_reader_t rd[BIG_CONNS];
  for (int i = 0; i < BIG_CONNS; i++) {
    rd[i] = (big_reader_t){.fd = big[i], .ref = &ref.u.read.keys};
    cr_assert_eq(pthread_create(&th[i], NULL, big_reader, &rd[i]), 0);
  }
  for (int i = 0; i < BIG_CONNS; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(rd[i].good, BIG_READS, "connection %d: %d of %d replies right (%s)", i,
                 rd[i].good, BIG_READS, rd[i].why);
  }
  for (int i = 0; i < BIG_CONNS; i++) close(big[i]);
  free(big);
  free(reqs);
  fp4idx_response_clear(&ref);
  free(ref_body);
  close(ctl);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

Test(daemon_budget, a_reply_larger_than_the_budget_is_refused_with_a_way_out) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--buffer-budget", "16M",
                                                              "--log-level", "info", NULL}),
               0);
  int fd = fp4idx_test_connect(d.sock);
  cr_assert_geq(fd, 0);
  store_keys(fd, 1, BIG_KEYS); /* dequantized: 16 MiB, over a 16 MiB budget with the frame */
  size_t len;
  unsigned char *all = read_requests_as(1, 1, 1, &len);
  cr_assert_eq(fp4idx_test_send_all(fd, all, len), 0);
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_recv_response(fd, FP4IDX_OP_READ, &resp, &body), 0);
  cr_assert_eq(resp.status, FP4IDX_E2BIG);
  cr_assert_not_null(strstr(resp.error, "buffer budget"), "%s", resp.error);
  cr_assert_not_null(strstr(resp.error, "count"), "the message names the way out: %s",
                     resp.error);
  fp4idx_response_clear(&resp);
  free(body);
  free(all);
  /* In ranges it works, and the connection was not harmed. */
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_READ;
  req.id = 7;
  req.u.read.seq = 1;
  req.u.read.dequant = 1;
  req.u.read.from = BIG_KEYS / 2;
  req.u.read.count = BIG_KEYS / 2;
  req.u.read.has_count = 1;
  cr_assert_eq(fp4idx_test_call(fd, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0, "%s", resp.error);
  cr_assert_eq(resp.u.read.keys.nbytes, (uint64_t)BIG_KEYS / 2 * 512);
  fp4idx_response_clear(&resp);
  free(body);
  /* The packed read of it all is 2.2 MiB: within the budget. */
  unsigned char *keys = malloc((size_t)BIG_KEYS * 68);
  uint64_t got = 0;
  cr_assert_eq(fp4idx_test_read(fd, 1, 0, BIG_KEYS, keys, &got), 0);
  cr_assert_eq(got, (uint64_t)BIG_KEYS);
  free(keys);
  close(fd);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

#define MANY_CONNS 1000
#define MANY_KEYS 4096 /* a dequantized read of it: a 2 MiB reply */
#define NEARLY_ALL_KEYS 60000 /* 29.3 MiB dequantized */

Test(daemon_budget, a_thousand_unread_2_mib_replies_stay_within_the_budget) {
  raise_nofile(MANY_CONNS + 64);
  fp4idx_test_small_asan_quarantine();
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--buffer-budget", "32M",
                                                              "--buffer-timeout", "600",
                                                              "--log-level", "info", NULL}),
               0);
  int ctl = fp4idx_test_connect(d.sock);
  cr_assert_geq(ctl, 0);
  store_keys(ctl, 1, MANY_KEYS);
  store_keys(ctl, 2, NEARLY_ALL_KEYS);
  fp4idx_info_t info;
  cr_assert_eq(fp4idx_test_info(ctl, &info), 0);
  long before = fp4idx_test_proc_kib(d.pid, "VmRSS");
  size_t len;
  unsigned char *reqs = read_requests_as(1, 1, 1, &len);
  int *bad = open_bad(&d, MANY_CONNS, reqs, len);
  for (int t = 0; t < 400 && count_readable(bad, MANY_CONNS) < 8; t++) sleep_ms(25);
  cr_assert_geq(count_readable(bad, MANY_CONNS), 8, "replies were produced");
  long grew = peak_growth_mib(&d, ctl, before, 30);
  check_held(ctl, grew, BIG_RSS_BOUND_MIB, BIG_COUNT_BOUND,
             "1000 connections each leaving a 2 MiB reply unread");
  for (int i = 0; i < MANY_CONNS; i++) close(bad[i]);
  free(bad);
  free(reqs);
  /* What they held goes back to the budget: a reply of 29 MiB, which fits
   * a 32 MiB budget only when (nearly) nothing else is held or reserved, is
   * built at once. */
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_READ;
  req.id = 9;
  req.u.read.seq = 2;
  req.u.read.dequant = 1;
  fp4idx_response_t resp;
  unsigned char *body = NULL;
  cr_assert_eq(fp4idx_test_call(ctl, &req, &resp, &body), 0);
  cr_assert_eq(resp.status, 0, "%s", resp.error);
  cr_assert_eq(resp.u.read.keys.nbytes, (uint64_t)NEARLY_ALL_KEYS * 512);
  fp4idx_response_clear(&resp);
  free(body);
  /* The count is back to the stats request alone, and the memory does not
   * grow past what it was with them open (the allocator keeps part of the
   * freed connection buffers, so RSS does not fall all the way back; not
   * under AddressSanitizer, see check_held). */
  uint64_t held = 0, peak = 0, budget = 0;
  cr_assert_eq(fp4idx_test_buffered(ctl, &held, &peak, &budget), 0);
  cr_assert_lt(held, 4096, "%llu bytes still held once they closed", (unsigned long long)held);
  long after = fp4idx_test_proc_kib(d.pid, "VmRSS");
  cr_log_info("VmRSS %ld MiB above the start once they closed", (after - before) / 1024);
#if !defined(__SANITIZE_ADDRESS__)
  cr_assert_leq((after - before) / 1024, grew + 8, "VmRSS grew to %ld MiB above the start",
                (after - before) / 1024);
#endif
  close(ctl);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}
