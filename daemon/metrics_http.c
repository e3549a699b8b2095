/* metrics_http.c -- GET /metrics over HTTP for Prometheus (see
 * metrics_http.h). libmicrohttpd (Debian libmicrohttpd12) does the HTTP:
 * a well-kept server library instead of a parser of our own on a port that
 * anything on the network may reach. */
#define _GNU_SOURCE
#include "metrics_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp4idx_status.h"
#include "log.h"
#include "metrics_text.h"

int fp4idx__metrics_parse_listen(const char *s, struct sockaddr_storage *addr,
                                 socklen_t *len) {
  if (!s || !*s || !addr || !len) return -1;
  char host[64] = "127.0.0.1";
  const char *port_s = s;
  const char *colon = strrchr(s, ':');
  if (s[0] == '[') { /* [IPv6]:PORT */
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':' || (size_t)(close - s - 1) >= sizeof host) return -1;
    memcpy(host, s + 1, (size_t)(close - s - 1));
    host[close - s - 1] = '\0';
    port_s = close + 2;
  } else if (colon) { /* IPv4:PORT */
    if ((size_t)(colon - s) >= sizeof host || colon == s) return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    port_s = colon + 1;
  }
  unsigned port = 0;
  if (!*port_s) return -1;
  for (const char *d = port_s; *d; d++) {
    if (*d < '0' || *d > '9' || (port = port * 10 + (unsigned)(*d - '0')) > 65535) return -1;
  }
  if (port < 1) return -1;
  memset(addr, 0, sizeof *addr);
  struct sockaddr_in *a4 = (struct sockaddr_in *)addr;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)addr;
  if (s[0] != '[' && inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    *len = sizeof *a4;
    return 0;
  }
  if (s[0] == '[' && inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    *len = sizeof *a6;
    return 0;
  }
  return -1;
}

static enum MHD_Result fp4idx__metrics_reply(struct MHD_Connection *conn, unsigned code,
                                             const char *type, char *body, size_t len,
                                             enum MHD_ResponseMemoryMode mode) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
  if (!r) {
    if (mode == MHD_RESPMEM_MUST_FREE) free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  enum MHD_Result ok = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result fp4idx__metrics_handler(void *cls, struct MHD_Connection *conn,
                                               const char *url, const char *method,
                                               const char *version, const char *upload,
                                               size_t *upload_size, void **req_cls) {
  (void)version;
  (void)upload;
  fp4idx_metrics_http_t *m = cls;
  static const char plain[] = "text/plain; charset=utf-8";
  if (*upload_size != 0) return MHD_NO; /* no request bodies here */
  (void)req_cls;
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
    static char msg[] = "only GET /metrics\n";
    return fp4idx__metrics_reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, plain, msg,
                                 sizeof msg - 1, MHD_RESPMEM_PERSISTENT);
  }
  if (strcmp(url, "/metrics") != 0) {
    static char msg[] = "not found: the metrics are at /metrics\n";
    return fp4idx__metrics_reply(conn, MHD_HTTP_NOT_FOUND, plain, msg, sizeof msg - 1,
                                 MHD_RESPMEM_PERSISTENT);
  }
  fp4idx_daemon_t *d = __atomic_load_n(&m->daemon, __ATOMIC_ACQUIRE);
  if (!d) {
    static char msg[] = "fp4idxd is starting: no counters yet\n";
    return fp4idx__metrics_reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, plain, msg,
                                 sizeof msg - 1, MHD_RESPMEM_PERSISTENT);
  }
  char *text = NULL;
  size_t len = 0;
  if (fp4idx__metrics_text(d, &text, &len) != FP4IDX_OK) {
    static char msg[] = "fp4idxd: out of memory for the metrics\n";
    return fp4idx__metrics_reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, plain, msg,
                                 sizeof msg - 1, MHD_RESPMEM_PERSISTENT);
  }
  return fp4idx__metrics_reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                               text, len, MHD_RESPMEM_MUST_FREE);
}

/* libmicrohttpd's messages, into our log. */
static void fp4idx__metrics_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  fp4idx__log_warn("metrics http: %s", buf);
}

int fp4idx__metrics_http_start(fp4idx_metrics_http_t *m, const char *listen) {
  struct sockaddr_storage addr;
  socklen_t alen;
  memset(m, 0, sizeof *m);
  if (fp4idx__metrics_parse_listen(listen, &addr, &alen) != 0) {
    fp4idx__log_error("--metrics-listen '%s': expected PORT, IPv4:PORT or [IPv6]:PORT", listen);
    return FP4IDX_EINVAL;
  }
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  uint16_t port = addr.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&addr)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&addr)->sin_port);
  /* A handful of scrapers at most; a stalled one is dropped after 10 s. */
  m->mhd = MHD_start_daemon(flags, port, NULL, NULL, fp4idx__metrics_handler, m,
                            MHD_OPTION_EXTERNAL_LOGGER, fp4idx__metrics_log, NULL,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_CONNECTION_LIMIT, 16u,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_END);
  if (!m->mhd) {
    fp4idx__log_error("metrics: cannot listen on %s (address in use or not local?)", listen);
    return FP4IDX_EIO;
  }
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&addr)->sin6_addr, host, sizeof host);
  else
    inet_ntop(AF_INET, &((struct sockaddr_in *)&addr)->sin_addr, host, sizeof host);
  fp4idx__log_info("metrics on http://%s%s%s:%u/metrics", addr.ss_family == AF_INET6 ? "[" : "",
                   host, addr.ss_family == AF_INET6 ? "]" : "", (unsigned)port);
  return FP4IDX_OK;
}

void fp4idx__metrics_http_attach(fp4idx_metrics_http_t *m, fp4idx_daemon_t *d) {
  __atomic_store_n(&m->daemon, d, __ATOMIC_RELEASE);
}

void fp4idx__metrics_http_stop(fp4idx_metrics_http_t *m) {
  if (m && m->mhd) {
    MHD_stop_daemon(m->mhd);
    m->mhd = NULL;
    __atomic_store_n(&m->daemon, NULL, __ATOMIC_RELEASE);
  }
}
