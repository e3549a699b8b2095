/* config.c -- getopt_long parsing of the fp4idxd command line. */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aof.h"
#include "fp4idx_format.h"
#include "fp4idx_status.h"

void fp4idx__config_defaults(fp4idx_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->backend = FP4IDX_BACKEND_AUTO;
  cfg->device = 0;
  cfg->cache_bytes = 0;
  cfg->page_size = FP4IDX_DEFAULT_PAGE_SIZE;
  cfg->max_frame = 64u << 20;
  cfg->threads = 0;
  cfg->log_level = FP4IDX_LOG_INFO;
  cfg->log_format = FP4IDX_LOG_FORMAT_AUTO;
  cfg->fsync_policy = FP4IDX_FSYNC_EVERYSEC;
  cfg->socket_mode = 0660;
  cfg->socket_gid = -1;
  cfg->buffer_budget = 0;
  cfg->buffer_timeout_s = 30;
  cfg->busy_poll_us = -1;
}

/* A group name or number -> gid; -1 when unknown. */
static long fp4idx__config_group(const char *s) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!errno && end != s && !*end && v >= 0 && v < INT32_MAX) return v;
  struct group gr, *res = NULL;
  char buf[4096];
  if (getgrnam_r(s, &gr, buf, sizeof buf, &res) || !res) return -1;
  return (long)res->gr_gid;
}

int fp4idx__config_parse_size(const char *s, uint64_t *out) {
  if (!s || !out || !*s) return -1;
  errno = 0;
  char *end = NULL;
  if (*s == '-') return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return -1;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
  }
  if (shift && *end == 'i') end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end) return -1;
  if (shift && v > (UINT64_MAX >> shift)) return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

int fp4idx__config_default_socket(char *buf, size_t cap) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  if (geteuid() != 0 && xdg && *xdg)
    n = snprintf(buf, cap, "%s/fp4idx/fp4idxd.sock", xdg);
  else
    n = snprintf(buf, cap, "/run/fp4idx/fp4idxd.sock");
  return (n < 0 || (size_t)n >= cap) ? FP4IDX_E2BIG : FP4IDX_OK;
}

static void fp4idx__config_usage(FILE *out) {
  fprintf(out,
    "Usage: fp4idxd [OPTIONS]\n"
    "FP4 index-key cache daemon: holds paged FP4 keys and scores verify rows\n"
    "for clients on a Unix socket.\n\n"
    "  -s, --socket PATH      listening socket (default\n"
    "                         $XDG_RUNTIME_DIR/fp4idx/fp4idxd.sock, or\n"
    "                         /run/fp4idx/fp4idxd.sock as root)\n"
    "  -b, --backend KIND     auto|cuda|cpu (default auto: CUDA when a GPU is\n"
    "                         present, else the CPU)\n"
    "  -d, --device N         CUDA device ordinal (default 0)\n"
    "  -c, --cache-bytes SIZE page pool size, suffixes K/M/G (default: CUDA\n"
    "                         50%% of free device memory, CPU min(25%% of RAM, 4G))\n"
    "  -p, --page-size N      keys per page, a power of two (default 64)\n"
    "  -m, --max-frame SIZE   largest request frame (default 64M)\n"
    "  -t, --threads N        CPU backend threads (default: one per core)\n"
    "  -l, --log-level LEVEL  error|warn|info|debug (default info)\n"
    "      --log-format FMT   auto|text|journal (default auto: journal, i.e.\n"
    "                         \"<3>message\" priority prefixes, when stderr is\n"
    "                         systemd's journal ($JOURNAL_STREAM), else text)\n"
    "  -D, --data-dir DIR     keep the cache across restarts: snapshot and\n"
    "                         append log in DIR (default: none)\n"
    "      --fsync POLICY     append log flush: always|everysec|no\n"
    "                         (default everysec)\n"
    "      --metrics-listen ADDR:PORT\n"
    "                         serve Prometheus metrics at\n"
    "                         http://ADDR:PORT/metrics (default off; PORT\n"
    "                         alone = 127.0.0.1:PORT; [IPv6]:PORT)\n"
    "      --allow-data-loss  start even when the append log is shorter than it\n"
    "                         is known to have been, or missing (default: refuse)\n"
    "      --socket-mode MODE permissions of the socket file, octal (default\n"
    "                         0660; the umask is not used)\n"
    "      --socket-group GRP group of the socket file, a name or a number\n"
    "                         (default: the daemon's)\n"
    "      --buffer-budget SIZE  bytes all connections together may make the\n"
    "                         daemon buffer (unsent replies, requests not yet\n"
    "                         run); at the budget the connections holding the\n"
    "                         most are not read (default: RAM/64, 64M..2G)\n"
    "      --buffer-timeout S close a connection that holds its share of unsent\n"
    "                         replies and reads nothing for S seconds (default 30)\n"
    "      --busy-poll-us N   after each event, and while requests run, the loop\n"
    "                         and the worker poll for N us instead of sleeping\n"
    "                         (0 = off; default 200 with the CUDA backend, 0\n"
    "                         with the CPU backend, which needs the cores)\n"
    "      --io-threads N     event loops serving the connections, each on its\n"
    "                         own thread (1..64; default 1: the main loop\n"
    "                         alone)\n"
    "  -h, --help             show this help and exit\n"
    "  -V, --version          show the version and exit\n\n"
    "SIGINT/SIGTERM stop the daemon gracefully (in-flight requests finish;\n"
    "with --data-dir a snapshot is written). SIGHUP writes a snapshot.\n");
}

static const struct option fp4idx__config_options[] = {
    {"socket", required_argument, NULL, 's'},
    {"backend", required_argument, NULL, 'b'},
    {"device", required_argument, NULL, 'd'},
    {"cache-bytes", required_argument, NULL, 'c'},
    {"page-size", required_argument, NULL, 'p'},
    {"max-frame", required_argument, NULL, 'm'},
    {"threads", required_argument, NULL, 't'},
    {"log-level", required_argument, NULL, 'l'},
    {"log-format", required_argument, NULL, 'L'},
    {"data-dir", required_argument, NULL, 'D'},
    {"fsync", required_argument, NULL, 'F'},
    {"metrics-listen", required_argument, NULL, 'M'},
    {"socket-mode", required_argument, NULL, 'O'},
    {"socket-group", required_argument, NULL, 'G'},
    {"buffer-budget", required_argument, NULL, 'B'},
    {"buffer-timeout", required_argument, NULL, 'T'},
    {"allow-data-loss", no_argument, NULL, 'A'},
    {"busy-poll-us", required_argument, NULL, 'P'},
    {"io-threads", required_argument, NULL, 'I'},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0}};

/* Each option group below sets the cfg fields of option `o` from `arg`, or
 * prints a one-line reason to `err` and returns FP4IDX_EINVAL. */

/* The backend and its pool: --backend, --device, --threads, --cache-bytes,
 * --page-size, --max-frame. */
static int fp4idx__config_engine_option(fp4idx_config_t *cfg, int o, const char *arg,
                                        FILE *err) {
  char *end = NULL;
  long v;
  uint64_t sz;
  switch (o) {
    case 'b':
      if (!strcmp(arg, "auto")) cfg->backend = FP4IDX_BACKEND_AUTO;
      else if (!strcmp(arg, "cuda")) cfg->backend = FP4IDX_BACKEND_CUDA;
      else if (!strcmp(arg, "cpu")) cfg->backend = FP4IDX_BACKEND_CPU;
      else {
        fprintf(err, "fp4idxd: --backend: '%s' is not auto, cuda or cpu\n", arg);
        return FP4IDX_EINVAL;
      }
      return FP4IDX_OK;
    case 'd':
    case 't':
      errno = 0;
      v = strtol(arg, &end, 10);
      if (errno || end == arg || *end || v < 0 || v > 4096) {
        fprintf(err, "fp4idxd: --%s: '%s' is not a number in 0..4096\n",
                o == 'd' ? "device" : "threads", arg);
        return FP4IDX_EINVAL;
      }
      if (o == 'd') cfg->device = (int)v; else cfg->threads = (int)v;
      return FP4IDX_OK;
    case 'c':
      if (fp4idx__config_parse_size(arg, &sz) || sz == 0) {
        fprintf(err, "fp4idxd: --cache-bytes: '%s' is not a size (e.g. 512M, 4G)\n", arg);
        return FP4IDX_EINVAL;
      }
      cfg->cache_bytes = sz;
      return FP4IDX_OK;
    case 'p':
      errno = 0;
      v = strtol(arg, &end, 10);
      if (errno || end == arg || *end || !fp4idx_page_size_valid(v)) {
        fprintf(err, "fp4idxd: --page-size: '%s' is not a power of two in 1..65536\n", arg);
        return FP4IDX_EINVAL;
      }
      cfg->page_size = (int32_t)v;
      return FP4IDX_OK;
    default: /* 'm' */
      /* Below 64 bytes no request fits; above 1 GiB a single client could
       * pin that much memory per connection. */
      if (fp4idx__config_parse_size(arg, &sz) || sz < 64 || sz > (1u << 30)) {
        fprintf(err, "fp4idxd: --max-frame: '%s' is not a size in 64..1G\n", arg);
        return FP4IDX_EINVAL;
      }
      cfg->max_frame = sz;
      return FP4IDX_OK;
  }
}

/* The log: --log-level, --log-format. */
static int fp4idx__config_log_option(fp4idx_config_t *cfg, int o, const char *arg, FILE *err) {
  if (o == 'l' && fp4idx__log_parse_level(arg, &cfg->log_level)) {
    fprintf(err, "fp4idxd: --log-level: '%s' is not error, warn, info or debug\n", arg);
    return FP4IDX_EINVAL;
  }
  if (o == 'L' && fp4idx__log_parse_format(arg, &cfg->log_format)) {
    fprintf(err, "fp4idxd: --log-format: '%s' is not auto, text or journal\n", arg);
    return FP4IDX_EINVAL;
  }
  return FP4IDX_OK;
}

/* Persistence: --data-dir, --fsync, --allow-data-loss. */
static int fp4idx__config_persist_option(fp4idx_config_t *cfg, int o, const char *arg,
                                         FILE *err) {
  fp4idx_fsync_t pol;
  switch (o) {
    case 'D':
      if (!*arg || strlen(arg) >= sizeof cfg->data_dir - 32) {
        fprintf(err, "fp4idxd: --data-dir: path empty or too long\n");
        return FP4IDX_EINVAL;
      }
      strcpy(cfg->data_dir, arg);
      return FP4IDX_OK;
    case 'F':
      if (fp4idx__fsync_parse(arg, &pol)) {
        fprintf(err, "fp4idxd: --fsync: '%s' is not always, everysec or no\n", arg);
        return FP4IDX_EINVAL;
      }
      cfg->fsync_policy = (int)pol;
      return FP4IDX_OK;
    default: /* 'A' */
      cfg->allow_data_loss = 1;
      return FP4IDX_OK;
  }
}

/* Where clients reach the daemon: --socket, --socket-mode, --socket-group,
 * --metrics-listen. */
static int fp4idx__config_listen_option(fp4idx_config_t *cfg, int o, const char *arg,
                                        FILE *err) {
  char *end = NULL;
  long v;
  switch (o) {
    case 's':
      if (!*arg || strlen(arg) >= sizeof cfg->socket_path) {
        fprintf(err, "fp4idxd: --socket: path empty or longer than %zu bytes\n",
                sizeof cfg->socket_path - 1);
        return FP4IDX_EINVAL;
      }
      strcpy(cfg->socket_path, arg);
      return FP4IDX_OK;
    case 'O':
      errno = 0;
      v = strtol(arg, &end, 8);
      if (errno || end == arg || *end || v < 0 || v > 0777) {
        fprintf(err, "fp4idxd: --socket-mode: '%s' is not an octal mode in 0..0777\n", arg);
        return FP4IDX_EINVAL;
      }
      cfg->socket_mode = (int)v;
      return FP4IDX_OK;
    case 'G':
      cfg->socket_gid = *arg ? fp4idx__config_group(arg) : -1;
      if (cfg->socket_gid < 0) {
        fprintf(err, "fp4idxd: --socket-group: no group '%s'\n", arg);
        return FP4IDX_EINVAL;
      }
      return FP4IDX_OK;
    default: /* 'M' */
      /* Syntax only here; metrics_http.c parses it into an address. */
      if (!*arg || strlen(arg) >= sizeof cfg->metrics_listen ||
          strspn(arg, "0123456789abcdefABCDEF.:[]") != strlen(arg)) {
        fprintf(err, "fp4idxd: --metrics-listen: '%s' is not PORT, IPv4:PORT or "
                     "[IPv6]:PORT\n", arg);
        return FP4IDX_EINVAL;
      }
      strcpy(cfg->metrics_listen, arg);
      return FP4IDX_OK;
  }
}

/* How connections and requests are served: --buffer-budget,
 * --buffer-timeout, --busy-poll-us, --io-threads. */
static int fp4idx__config_serving_option(fp4idx_config_t *cfg, int o, const char *arg,
                                         FILE *err) {
  char *end = NULL;
  long v;
  uint64_t sz;
  double t;
  switch (o) {
    case 'B':
      if (fp4idx__config_parse_size(arg, &sz) || sz < (16u << 20)) {
        fprintf(err, "fp4idxd: --buffer-budget: '%s' is not a size of at least 16M\n", arg);
        return FP4IDX_EINVAL;
      }
      cfg->buffer_budget = sz;
      return FP4IDX_OK;
    case 'T':
      errno = 0;
      t = strtod(arg, &end);
      if (errno || end == arg || *end || !(t >= 0.01 && t <= 86400)) {
        fprintf(err, "fp4idxd: --buffer-timeout: '%s' is not a number of seconds in 0.01..86400\n",
                arg);
        return FP4IDX_EINVAL;
      }
      cfg->buffer_timeout_s = t;
      return FP4IDX_OK;
    case 'I':
      errno = 0;
      v = strtol(arg, &end, 10);
      if (errno || end == arg || *end || v < 1 || v > 64) {
        fprintf(err, "fp4idxd: --io-threads: '%s' is not a number of loops in 1..64\n", arg);
        return FP4IDX_EINVAL;
      }
      cfg->io_threads = (int)v;
      return FP4IDX_OK;
    default: /* 'P' */
      errno = 0;
      v = strtol(arg, &end, 10);
      if (errno || end == arg || *end || v < 0 || v > 1000000) {
        fprintf(err, "fp4idxd: --busy-poll-us: '%s' is not a number of us in 0..1000000\n",
                arg);
        return FP4IDX_EINVAL;
      }
      cfg->busy_poll_us = (int)v;
      return FP4IDX_OK;
  }
}

int fp4idx__config_parse(fp4idx_config_t *cfg, int argc, char **argv,
                         FILE *out, FILE *err) {
  if (!cfg || argc < 1 || !argv) return FP4IDX_EINVAL;
  optind = 1;
  opterr = 0;
  int o, rc = FP4IDX_OK;
  while (rc == FP4IDX_OK &&
         (o = getopt_long(argc, argv, ":s:b:d:c:p:m:t:l:D:hV", fp4idx__config_options,
                          NULL)) != -1) {
    switch (o) {
      case 'b': case 'd': case 't': case 'c': case 'p': case 'm':
        rc = fp4idx__config_engine_option(cfg, o, optarg, err);
        break;
      case 'l': case 'L':
        rc = fp4idx__config_log_option(cfg, o, optarg, err);
        break;
      case 'D': case 'F': case 'A':
        rc = fp4idx__config_persist_option(cfg, o, optarg, err);
        break;
      case 's': case 'O': case 'G': case 'M':
        rc = fp4idx__config_listen_option(cfg, o, optarg, err);
        break;
      case 'B': case 'T': case 'P': case 'I':
        rc = fp4idx__config_serving_option(cfg, o, optarg, err);
        break;
      case 'h':
        fp4idx__config_usage(out);
        return 1;
      case 'V':
        fprintf(out, "fp4idxd %s\n", FP4IDXD_VERSION_STRING);
        return 1;
      case ':':
        fprintf(err, "fp4idxd: option '%s' needs a value (see --help)\n", argv[optind - 1]);
        return FP4IDX_EINVAL;
      default:
        fprintf(err, "fp4idxd: unknown option '%s' (see --help)\n", argv[optind - 1]);
        return FP4IDX_EINVAL;
    }
  }
  if (rc != FP4IDX_OK) return rc;
  if (optind < argc) {
    fprintf(err, "fp4idxd: unexpected argument '%s' (see --help)\n", argv[optind]);
    return FP4IDX_EINVAL;
  }
  return FP4IDX_OK;
}
