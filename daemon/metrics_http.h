/* metrics_http.h -- the Prometheus scrape endpoint of fp4idxd
 * (--metrics-listen ADDR:PORT; off by default).
 *
 * GET /metrics answers the Prometheus text format (0.0.4) that
 * `fp4idx-cli stats --prometheus` prints, built from the daemon's own
 * counters (metrics_text.h). HTTP is libmicrohttpd's, on its own thread, so
 * the event loop and the worker never see the scraper.
 *
 * The endpoint starts before the daemon exists (a taken port fails the
 * start before the pool is allocated) and answers 503 until
 * fp4idx__metrics_http_attach names the daemon.
 */
#ifndef FP4IDX_DAEMON_METRICS_HTTP_H
#define FP4IDX_DAEMON_METRICS_HTTP_H

#include <sys/socket.h>

struct fp4idx_daemon_s;

typedef struct fp4idx_metrics_http_s {
  struct MHD_Daemon *mhd;         /* NULL while stopped */
  struct fp4idx_daemon_s *daemon; /* whose counters scrapes read; NULL:
                                     503 (__atomic: the HTTP thread reads it) */
} fp4idx_metrics_http_t;

/* Parses --metrics-listen: "PORT" (loopback, 127.0.0.1), "IPv4:PORT" or
 * "[IPv6]:PORT", numeric addresses only, PORT 1..65535. Returns 0 and fills
 * *addr / *len, or -1. */
int fp4idx__metrics_parse_listen(const char *s, struct sockaddr_storage *addr,
                                 socklen_t *len);

/* Starts serving on `listen` (parsed as above); scrapes get 503 until
 * attached. Returns FP4IDX_OK, FP4IDX_EINVAL (bad address), or FP4IDX_EIO
 * (bind/listen failed, e.g. the port is taken; logged). */
int fp4idx__metrics_http_start(fp4idx_metrics_http_t *m, const char *listen);

/* Scrapes read d's counters from now on: call after fp4idx__daemon_init,
 * and stop the endpoint before fp4idx__daemon_fini. */
void fp4idx__metrics_http_attach(fp4idx_metrics_http_t *m, struct fp4idx_daemon_s *d);

/* Stops serving (waits for scrapes in progress); a no-op when stopped. */
void fp4idx__metrics_http_stop(fp4idx_metrics_http_t *m);

#endif /* FP4IDX_DAEMON_METRICS_HTTP_H */
