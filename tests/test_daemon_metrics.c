/* test_daemon_metrics.c -- the daemon-wide metrics (daemon/stats.c) and the
 * scrape endpoint (daemon/metrics_http.c): --metrics-listen parsing, exact
 * counters after known traffic (keys appended, rows scored, bytes, errors by
 * status, queue depth, device memory) in `stats` and at GET /metrics, read
 * from the counters (a scrape is no client), 404 / 405, loopback by
 * default, off by default. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon_harness.h"
#include "fp4idx_client.h"
#include "metrics_http.h"

Test(metrics, parse_listen) {
  struct sockaddr_storage a;
  socklen_t len;
  struct sockaddr_in *a4 = (struct sockaddr_in *)&a;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&a;
  cr_assert_eq(fp4idx__metrics_parse_listen("9464", &a, &len), 0);
  cr_expect_eq(a4->sin_family, AF_INET);
  cr_expect_eq(ntohs(a4->sin_port), 9464);
  cr_expect_eq(ntohl(a4->sin_addr.s_addr), INADDR_LOOPBACK, "PORT alone is loopback");
  cr_assert_eq(fp4idx__metrics_parse_listen("0.0.0.0:80", &a, &len), 0);
  cr_expect_eq(a4->sin_addr.s_addr, htonl(INADDR_ANY));
  cr_expect_eq(ntohs(a4->sin_port), 80);
  cr_assert_eq(fp4idx__metrics_parse_listen("[::1]:65535", &a, &len), 0);
  cr_expect_eq(a6->sin6_family, AF_INET6);
  cr_expect_eq(ntohs(a6->sin6_port), 65535);
  cr_expect_eq(len, sizeof *a6);
  const char *bad[] = {"", "0", "65536", "x", "localhost:80", "1.2.3:80", "1.2.3.4:",
                       ":80", "[::1]", "[::1]80", "::1:80", "1.2.3.4:80x", "[1.2.3.4]:80"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_expect_eq(fp4idx__metrics_parse_listen(bad[i], &a, &len), -1, "'%s'", bad[i]);
}

/* A port nobody listens on now (the kernel's pick; free again after close). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &l) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

/* One HTTP/1.0 request to 127.0.0.1:port; the whole answer into buf. */
static size_t http(int port, const char *method, const char *path, char *buf, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert(fd >= 0);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect to :%d", port);
  char req[256];
  int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: test\r\n\r\n", method, path);
  cr_assert_eq(write(fd, req, (size_t)n), n);
  size_t got = 0;
  ssize_t r;
  while (got < cap - 1 && (r = read(fd, buf + got, cap - 1 - got)) > 0) got += (size_t)r;
  buf[got] = '\0';
  close(fd);
  return got;
}

static unsigned long long metric(const char *text, const char *line_start) {
  const char *p = text;
  size_t n = strlen(line_start);
  while ((p = strstr(p, line_start)) != NULL) {
    if ((p == text || p[-1] == '\n') && p[n] == ' ') return strtoull(p + n + 1, NULL, 10);
    p += n;
  }
  cr_assert_fail("no line '%s'", line_start);
  return 0;
}

Test(metrics, counters_in_stats_and_at_the_scrape_endpoint) {
  int port = free_port();
  char listen[16];
  snprintf(listen, sizeof listen, "%d", port);
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, (const char *[]){"--metrics-listen", listen, NULL}), 0);
  fp4idx_client_t *c = fp4idx_client_new();
  cr_assert_eq(fp4idx_client_connect(c, d.sock), FP4IDX_OK);
  /* Known traffic: 300 + 200 keys, a score of 3 rows and one of 2, an
   * ENOSEQ drop and an ERANGE truncate. */
  static uint16_t keys[300 * 128], q[3 * 4 * 128], w[3 * 4];
  for (size_t i = 0; i < sizeof keys / 2; i++) keys[i] = (uint16_t)(0x3f80 + i % 64);
  for (size_t i = 0; i < sizeof q / 2; i++) q[i] = 0x3f80;
  for (size_t i = 0; i < sizeof w / 2; i++) w[i] = 0x3f80;
  cr_assert_eq(fp4idx_client_append_bf16(c, 1, keys, 300, FP4IDX_ROUNDING_RNE, NULL, NULL), 0);
  cr_assert_eq(fp4idx_client_append_bf16(c, 2, keys, 200, FP4IDX_ROUNDING_RNE, NULL, NULL), 0);
  int32_t pos[3 * 5], cnt[3];
  float lg[3 * 5];
  cr_assert_eq(fp4idx_client_topk(c, 1, 4, 3, q, w, NULL, 5, pos, lg, cnt), 0);
  cr_assert_eq(fp4idx_client_topk(c, 2, 4, 2, q, w, NULL, 5, pos, lg, cnt), 0);
  cr_assert_eq(fp4idx_client_drop(c, 99), FP4IDX_ENOSEQ);
  cr_assert_eq(fp4idx_client_truncate(c, 1, 301, NULL), FP4IDX_ERANGE);

  fp4idx_client_stats_t *s = NULL;
  cr_assert_eq(fp4idx_client_stats(c, &s), 0);
  cr_expect_eq(s->keys_appended, 500);
  cr_expect_eq(s->rows_scored, 5);
  cr_expect_eq(s->status_errors[-FP4IDX_ENOSEQ], 1);
  cr_expect_eq(s->status_errors[-FP4IDX_ERANGE], 1);
  cr_expect_eq(s->status_errors[-FP4IDX_EINVAL], 0);
  /* The appends alone carry 500 keys x 256 bytes. */
  cr_expect_gt(s->request_bytes, 500u * 256);
  cr_expect_gt(s->response_bytes, 6u * 4);
  cr_expect_eq(s->queue_depth, 0, "nothing waits while we wait for the reply");
  cr_expect_gt(s->device_mem_total, 0);
  cr_expect_leq(s->device_mem_free, s->device_mem_total);
  /* the CPU backend shares no GPU */
  cr_expect_str_eq(s->gpu_sharing, "none");
  cr_expect_eq(s->gpu_other_processes, 0);
  fp4idx_client_sharing_t sh;
  cr_assert_eq(fp4idx_client_sharing(c, &sh), 0);
  cr_expect_str_eq(sh.mode, "none");
  cr_expect_eq(sh.other_processes, 0);
  uint64_t req_bytes = s->request_bytes;
  fp4idx_client_free(s);

  static char body[1 << 16];
  http(port, "GET", "/metrics", body, sizeof body);
  cr_assert(strncmp(body, "HTTP/1.1 200", 12) == 0 || strncmp(body, "HTTP/1.0 200", 12) == 0,
            "%.200s", body);
  cr_expect(strstr(body, "Content-Type: text/plain; version=0.0.4") != NULL, "%.400s", body);
  cr_expect_eq(metric(body, "fp4idx_keys_appended_total"), 500);
  cr_expect_eq(metric(body, "fp4idx_rows_scored_total"), 5);
  cr_expect_eq(metric(body, "fp4idx_errors_total{status=\"ENOSEQ\"}"), 1);
  cr_expect_eq(metric(body, "fp4idx_errors_total{status=\"ERANGE\"}"), 1);
  cr_expect_eq(metric(body, "fp4idx_errors_total{status=\"EFULL\"}"), 0);
  cr_expect_eq(metric(body, "fp4idx_queue_depth"), 0);
  cr_expect_gt(metric(body, "fp4idx_request_bytes_total"), req_bytes, "the stats request counts");
  cr_expect_gt(metric(body, "fp4idx_device_memory_free_bytes"), 0);
  cr_expect_gt(metric(body, "fp4idx_device_memory_used_bytes"), 0);
  cr_expect_eq(metric(body, "fp4idx_keys"), 500);
  cr_expect(strstr(body, "fp4idx_info{server=\"fp4idxd ") != NULL);
  cr_expect_eq(metric(body, "fp4idx_gpu_sharing{mode=\"none\"}"), 1);
  cr_expect_eq(metric(body, "fp4idx_gpu_sharing{mode=\"time_slice\"}"), 0);
  cr_expect_eq(metric(body, "fp4idx_gpu_other_processes"), 0);

  http(port, "GET", "/", body, sizeof body);
  cr_expect(strstr(body, " 404 ") != NULL, "%.200s", body);
  http(port, "POST", "/metrics", body, sizeof body);
  cr_expect(strstr(body, " 405 ") != NULL, "%.200s", body);

  /* Loopback when only a port is given (the log names the address). */
  FILE *f = fopen(d.log, "r");
  char line[512], want[96];
  int found = 0;
  snprintf(want, sizeof want, "metrics on http://127.0.0.1:%d/metrics", port);
  while (f && fgets(line, sizeof line, f)) found |= strstr(line, want) != NULL;
  if (f) fclose(f);
  cr_expect(found, "log lacks '%s'", want);

  /* A scrape reads the daemon's counters; it is no client: with the last
   * client gone it sees no connection, and scrapes change no request or
   * byte counter. */
  fp4idx_client_close(c);
  unsigned long long conns = 1;
  for (int i = 0; i < 200 && conns != 0; i++) {
    http(port, "GET", "/metrics", body, sizeof body);
    conns = metric(body, "fp4idx_connections");
    if (conns != 0) usleep(10000);
  }
  cr_expect_eq(conns, 0, "the scrape counts as a connection");
  unsigned long long bytes = metric(body, "fp4idx_request_bytes_total");
  unsigned long long stats = metric(body, "fp4idx_requests_total{op=\"stats\"}");
  unsigned long long info = metric(body, "fp4idx_requests_total{op=\"info\"}");
  http(port, "GET", "/metrics", body, sizeof body);
  cr_expect_eq(metric(body, "fp4idx_request_bytes_total"), bytes);
  cr_expect_eq(metric(body, "fp4idx_requests_total{op=\"stats\"}"), stats);
  cr_expect_eq(metric(body, "fp4idx_requests_total{op=\"info\"}"), info);
  cr_expect_eq(metric(body, "fp4idx_connections"), 0);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}

Test(metrics, off_by_default_and_a_taken_port_fails_the_start) {
  fp4idx_test_daemon_t d;
  cr_assert_eq(fp4idx_test_daemon_start(&d, NULL), 0);
  FILE *f = fopen(d.log, "r");
  char line[512];
  int found = 0;
  while (f && fgets(line, sizeof line, f)) found |= strstr(line, "metrics on") != NULL;
  if (f) fclose(f);
  cr_expect_not(found, "an endpoint without --metrics-listen");

  /* A port held by someone else: exit 1, before the pool is made. */
  int hold = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t l = sizeof a;
  cr_assert(bind(hold, (struct sockaddr *)&a, sizeof a) == 0 && listen(hold, 1) == 0 &&
            getsockname(hold, (struct sockaddr *)&a, &l) == 0);
  char port[16];
  snprintf(port, sizeof port, "%d", ntohs(a.sin_port));
  fp4idx_test_daemon_t d2;
  memset(&d2, 0, sizeof d2);
  cr_assert_eq(fp4idx_test_daemon_prepare(&d2), 0);
  cr_assert_eq(fp4idx_test_daemon_spawn(&d2, d2.sock, (const char *[]){"--backend", "cpu",
               "--cache-bytes", "1M", "--metrics-listen", port, NULL}), 0);
  cr_expect_eq(fp4idx_test_daemon_wait(&d2, 10000), 1);
  f = fopen(d2.log, "r");
  found = 0;
  int pool = 0;
  while (f && fgets(line, sizeof line, f)) {
    found |= strstr(line, "metrics: cannot listen on") != NULL;
    pool |= strstr(line, "pool") != NULL;
  }
  if (f) fclose(f);
  cr_expect(found, "no log line about the port");
  cr_expect_not(pool, "the pool was allocated before the port was tried");
  close(hold);
  fp4idx_test_daemon_stop(&d2);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0);
}
