/* test_daemon_budget.c -- the buffer budget (daemon/budget.h) against the
 * real daemon: clients that pipeline requests and never read their replies
 * make it hold no more than --buffer-budget (plus one reply each), while
 * another client is answered; a connection that holds its share without
 * reading is closed after --buffer-timeout, one that reads slowly is not; a
 * frame larger than the budget still completes while the budget is full.
 * Speed is the benchmark's (bench/bench_slow_readers.c), not asserted here. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

/* `count` pipelined read requests of the whole of `seq`, as one buffer. */
static unsigned char *read_requests(uint64_t seq, int count, size_t *len) {
  fp4idx_request_t req;
  memset(&req, 0, sizeof req);
  req.op = FP4IDX_OP_READ;
  req.u.read.seq = seq;
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

/* Under AddressSanitizer freed blocks wait in a quarantine (256 MB by
 * default) and count in RSS: keep it small for the daemon spawned next, so
 * RSS measures what the daemon holds. No effect on other builds. */
static void small_asan_quarantine(void) {
  const char *o = getenv("ASAN_OPTIONS");
  char buf[512];
  snprintf(buf, sizeof buf, "%s%squarantine_size_mb=4", o ? o : "", o && *o ? ":" : "");
  setenv("ASAN_OPTIONS", buf, 1);
}

Test(daemon_budget, non_reading_clients_hold_no_more_than_the_budget) {
  raise_nofile(N_BAD + 64);
  small_asan_quarantine();
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
  long grew_mib = (peak - before) / 1024;
  cr_log_info("VmRSS grew by %ld MiB with %d non-reading clients (budget 32 MiB)", grew_mib,
              N_BAD);
  /* budget + one 4.4 kB reply per connection + connection overhead */
  cr_assert_lt(grew_mib, 64, "VmRSS grew by %ld MiB with %d non-reading clients, budget 32 MiB",
               grew_mib, N_BAD);
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
  sleep_ms(500);
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
