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
    "  -h, --help             show this help and exit\n"
    "  -V, --version          show the version and exit\n\n"
    "SIGINT/SIGTERM stop the daemon gracefully (in-flight requests finish;\n"
    "with --data-dir a snapshot is written). SIGHUP writes a snapshot.\n");
}

int fp4idx__config_parse(fp4idx_config_t *cfg, int argc, char **argv,
                         FILE *out, FILE *err) {
  static const struct option opts[] = {
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
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0}};
  if (!cfg || argc < 1 || !argv) return FP4IDX_EINVAL;
  optind = 1;
  opterr = 0;
  for (;;) {
    int o = getopt_long(argc, argv, ":s:b:d:c:p:m:t:l:D:hV", opts, NULL);
    if (o == -1) break;
    char *end = NULL;
    long v;
    uint64_t sz;
    switch (o) {
      case 's':
        if (!*optarg || strlen(optarg) >= sizeof cfg->socket_path) {
          fprintf(err, "fp4idxd: --socket: path empty or longer than %zu bytes\n",
                  sizeof cfg->socket_path - 1);
          return FP4IDX_EINVAL;
        }
        strcpy(cfg->socket_path, optarg);
        break;
      case 'b':
        if (!strcmp(optarg, "auto")) cfg->backend = FP4IDX_BACKEND_AUTO;
        else if (!strcmp(optarg, "cuda")) cfg->backend = FP4IDX_BACKEND_CUDA;
        else if (!strcmp(optarg, "cpu")) cfg->backend = FP4IDX_BACKEND_CPU;
        else {
          fprintf(err, "fp4idxd: --backend: '%s' is not auto, cuda or cpu\n", optarg);
          return FP4IDX_EINVAL;
        }
        break;
      case 'd':
      case 't':
        errno = 0;
        v = strtol(optarg, &end, 10);
        if (errno || end == optarg || *end || v < 0 || v > 4096) {
          fprintf(err, "fp4idxd: --%s: '%s' is not a number in 0..4096\n",
                  o == 'd' ? "device" : "threads", optarg);
          return FP4IDX_EINVAL;
        }
        if (o == 'd') cfg->device = (int)v; else cfg->threads = (int)v;
        break;
      case 'c':
        if (fp4idx__config_parse_size(optarg, &sz) || sz == 0) {
          fprintf(err, "fp4idxd: --cache-bytes: '%s' is not a size (e.g. 512M, 4G)\n", optarg);
          return FP4IDX_EINVAL;
        }
        cfg->cache_bytes = sz;
        break;
      case 'p':
        errno = 0;
        v = strtol(optarg, &end, 10);
        if (errno || end == optarg || *end || !fp4idx_page_size_valid(v)) {
          fprintf(err, "fp4idxd: --page-size: '%s' is not a power of two in 1..65536\n", optarg);
          return FP4IDX_EINVAL;
        }
        cfg->page_size = (int32_t)v;
        break;
      case 'm':
        /* Below 64 bytes no request fits; above 1 GiB a single client could
         * pin that much memory per connection. */
        if (fp4idx__config_parse_size(optarg, &sz) || sz < 64 || sz > (1u << 30)) {
          fprintf(err, "fp4idxd: --max-frame: '%s' is not a size in 64..1G\n", optarg);
          return FP4IDX_EINVAL;
        }
        cfg->max_frame = sz;
        break;
      case 'l':
        if (fp4idx__log_parse_level(optarg, &cfg->log_level)) {
          fprintf(err, "fp4idxd: --log-level: '%s' is not error, warn, info or debug\n", optarg);
          return FP4IDX_EINVAL;
        }
        break;
      case 'L':
        if (fp4idx__log_parse_format(optarg, &cfg->log_format)) {
          fprintf(err, "fp4idxd: --log-format: '%s' is not auto, text or journal\n", optarg);
          return FP4IDX_EINVAL;
        }
        break;
      case 'D':
        if (!*optarg || strlen(optarg) >= sizeof cfg->data_dir - 32) {
          fprintf(err, "fp4idxd: --data-dir: path empty or too long\n");
          return FP4IDX_EINVAL;
        }
        strcpy(cfg->data_dir, optarg);
        break;
      case 'F': {
        fp4idx_fsync_t pol;
        if (fp4idx__fsync_parse(optarg, &pol)) {
          fprintf(err, "fp4idxd: --fsync: '%s' is not always, everysec or no\n", optarg);
          return FP4IDX_EINVAL;
        }
        cfg->fsync_policy = (int)pol;
        break;
      }
      case 'M':
        /* Syntax only here; metrics_http.c parses it into an address. */
        if (!*optarg || strlen(optarg) >= sizeof cfg->metrics_listen ||
            strspn(optarg, "0123456789abcdefABCDEF.:[]") != strlen(optarg)) {
          fprintf(err, "fp4idxd: --metrics-listen: '%s' is not PORT, IPv4:PORT or "
                       "[IPv6]:PORT\n", optarg);
          return FP4IDX_EINVAL;
        }
        strcpy(cfg->metrics_listen, optarg);
        break;
      case 'O':
        errno = 0;
        v = strtol(optarg, &end, 8);
        if (errno || end == optarg || *end || v < 0 || v > 0777) {
          fprintf(err, "fp4idxd: --socket-mode: '%s' is not an octal mode in 0..0777\n", optarg);
          return FP4IDX_EINVAL;
        }
        cfg->socket_mode = (int)v;
        break;
      case 'G':
        cfg->socket_gid = *optarg ? fp4idx__config_group(optarg) : -1;
        if (cfg->socket_gid < 0) {
          fprintf(err, "fp4idxd: --socket-group: no group '%s'\n", optarg);
          return FP4IDX_EINVAL;
        }
        break;
      case 'B':
        if (fp4idx__config_parse_size(optarg, &sz) || sz < (16u << 20)) {
          fprintf(err, "fp4idxd: --buffer-budget: '%s' is not a size of at least 16M\n", optarg);
          return FP4IDX_EINVAL;
        }
        cfg->buffer_budget = sz;
        break;
      case 'T': {
        errno = 0;
        double t = strtod(optarg, &end);
        if (errno || end == optarg || *end || !(t >= 0.01 && t <= 86400)) {
          fprintf(err, "fp4idxd: --buffer-timeout: '%s' is not a number of seconds in 0.01..86400\n",
                  optarg);
          return FP4IDX_EINVAL;
        }
        cfg->buffer_timeout_s = t;
        break;
      }
      case 'A':
        cfg->allow_data_loss = 1;
        break;
      case 'P':
        errno = 0;
        v = strtol(optarg, &end, 10);
        if (errno || end == optarg || *end || v < 0 || v > 1000000) {
          fprintf(err, "fp4idxd: --busy-poll-us: '%s' is not a number of us in 0..1000000\n",
                  optarg);
          return FP4IDX_EINVAL;
        }
        cfg->busy_poll_us = (int)v;
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
  if (optind < argc) {
    fprintf(err, "fp4idxd: unexpected argument '%s' (see --help)\n", argv[optind]);
    return FP4IDX_EINVAL;
  }
  return FP4IDX_OK;
}
