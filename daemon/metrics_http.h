/* metrics_http.h -- the Prometheus scrape endpoint of fp4idxd
 * (--metrics-listen ADDR:PORT; off by default).
 *
 * GET /metrics answers the Prometheus text format (0.0.4) that
 * `fp4idx-cli stats --prometheus` prints, built the same way: a client of
 * the daemon's own socket asks for "stats" and "info" (protocol/PROTOCOL.md)
 * and client/prom/prom.c writes the text. HTTP is libmicrohttpd's (its own
 * thread), so the event loop and the worker never see the scraper.
 */
#ifndef FP4IDX_DAEMON_METRICS_HTTP_H
#define FP4IDX_DAEMON_METRICS_HTTP_H

#include <sys/socket.h>

typedef struct fp4idx_metrics_http_s {
  struct MHD_Daemon *mhd;     /* NULL while stopped */
  char socket_path[108];      /* the daemon's socket, where scrapes ask */
  int timeout_ms;             /* per scrape's stats/info round trip */
} fp4idx_metrics_http_t;

/* Parses --metrics-listen: "PORT" (loopback, 127.0.0.1), "IPv4:PORT" or
 * "[IPv6]:PORT", numeric addresses only, PORT 1..65535. Returns 0 and fills
 * *addr / *len, or -1. */
int fp4idx__metrics_parse_listen(const char *s, struct sockaddr_storage *addr,
                                 socklen_t *len);

/* Starts serving on `listen` (parsed as above) for the daemon whose socket
 * is `socket_path`. Returns FP4IDX_OK, FP4IDX_EINVAL (bad address or path),
 * or FP4IDX_EIO (bind/listen failed, e.g. the port is taken; logged). */
int fp4idx__metrics_http_start(fp4idx_metrics_http_t *m, const char *listen,
                               const char *socket_path);

/* Stops serving (waits for scrapes in progress); a no-op when stopped. */
void fp4idx__metrics_http_stop(fp4idx_metrics_http_t *m);

#endif /* FP4IDX_DAEMON_METRICS_HTTP_H */
