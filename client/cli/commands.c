/* commands.c -- the commands of fp4idx-cli. Each parses its own options
 * (getopt_long, GNU permutation so options may follow operands), connects
 * only after its arguments are known to be good, and reports one failure
 * through cli->err. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "fp4idx_codec.h"
#include "fp4idx_format.h"

/* ---- shared helpers -------------------------------------------------------- */

int fp4idx__cli_connect(fp4idx_cli_t *cli, fp4idx_client_t **out) {
  *out = NULL;
  fp4idx_client_t *c = fp4idx_client_new();
  if (c == NULL)
    return fp4idx__cli_fail(&cli->err, FP4IDX_ENOMEM, "out of memory");
  fp4idx_client_set_timeout(c, cli->timeout_ms);
  int st = fp4idx_client_connect(c, cli->socket);
  if (st != FP4IDX_OK) {
    fp4idx__cli_fail(&cli->err, st, "%s", fp4idx_client_last_error(c));
    fp4idx_client_close(c);
    return st;
  }
  *out = c;
  return 0;
}

/* Copies the connection's last error into cli->err. */
static int fail_from_client(fp4idx_cli_t *cli, fp4idx_client_t *c, int st) {
  return fp4idx__cli_fail(&cli->err, st, "%s", fp4idx_client_last_error(c));
}

static int parse_seq(fp4idx_cli_t *cli, const char *s, uint64_t *seq) {
  if (fp4idx__parse_u64(s, seq) != 0)
    return fp4idx__cli_usage(&cli->err, "SEQ '%s' is not an unsigned integer",
                             s);
  return 0;
}

int fp4idx__cli_parse_num(fp4idx_cli_t *cli, const char *opt, const char *s,
                          uint64_t *v) {
  if (fp4idx__parse_u64(s, v) != 0)
    return fp4idx__cli_usage(&cli->err, "%s: '%s' is not an unsigned integer",
                             opt, s);
  return 0;
}

int fp4idx__cli_next_opt(fp4idx_cli_t *cli, int argc, char **argv, const char *so,
                         const struct option *lo) {
  opterr = 0;
  int ch = getopt_long(argc, argv, so, lo, NULL);
  if (ch == '?' || ch == ':') {
    if (optopt)
      fp4idx__cli_usage(&cli->err, "option -%c: %s", optopt,
                        ch == ':' ? "needs a value" : "unknown option");
    else
      fp4idx__cli_usage(&cli->err, "unknown option or missing value: %s",
                        argv[optind - 1]);
    return '?';
  }
  return ch;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Opens --out ("-" or NULL = stdout). */
static FILE *open_out(fp4idx_cli_t *cli, const char *path) {
  if (path == NULL || strcmp(path, "-") == 0) return stdout;
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    fp4idx__cli_fail(&cli->err, FP4IDX_EIO, "%s: %s", path, strerror(errno));
  return f;
}

/* Closes an --out file, turning a late write error into EIO. */
static int close_out(fp4idx_cli_t *cli, FILE *f, const char *path, int rc) {
  if (f == NULL) return rc;
  int bad = ferror(f);
  if (f == stdout) bad |= fflush(f) != 0;
  else bad |= fclose(f) != 0;
  if (bad && rc == 0)
    return fp4idx__cli_fail(&cli->err, FP4IDX_EIO, "%s: write error",
                            path ? path : "stdout");
  return rc;
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* ---- info ------------------------------------------------------------------ */

/* --format for info and stats: text (default) or json. */
static int parse_text_json(fp4idx_cli_t *cli, const char *s, int *json) {
  if (strcmp(s, "text") == 0) *json = 0;
  else if (strcmp(s, "json") == 0) *json = 1;
  else
    return fp4idx__cli_usage(&cli->err, "--format '%s': expected text or json", s);
  return 0;
}

int fp4idx__cli_info(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'},
                                     {"format", required_argument, 0, 'f'},
                                     {0}};
  int ch, json = 0;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    if (ch == 'h') {
      puts("usage: fp4idx-cli [-s SOCKET] info [--format text|json]\n"
           "Prints the daemon's version, backend, device and pool.\n"
           "  --format json  one object: server, protocol, backend, device,\n"
           "                 page_size, pages_total, pages_free, sequences,\n"
           "                 max_frame, gpu_sharing, gpu_other_processes, channels\n"
           "gpu_sharing: mps, time_slice (other processes take turns with it:\n"
           "milliseconds of wait; run MPS), exclusive, unknown (no NVML) or none (CPU).");
      return 0;
    }
    if (ch == 'f') {
      if (parse_text_json(cli, optarg, &json)) return FP4IDX_EINVAL;
      continue;
    }
    return FP4IDX_EINVAL;
  }
  if (optind != argc)
    return fp4idx__cli_usage(&cli->err, "unexpected argument '%s'",
                             argv[optind]);
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  fp4idx_client_info_t in;
  fp4idx_client_sharing_t sh;
  uint64_t channels = 0;
  st = fp4idx_client_info(c, &in);
  if (st == 0) st = fp4idx_client_sharing(c, &sh);
  if (st == 0) st = fp4idx_client_channels(c, &channels);
  if (st) {
    fail_from_client(cli, c, st);
    goto out;
  }
  if (json) {
    fp4idx__write_info_json(stdout, &in, &sh, channels);
    goto out;
  }
  printf("server: %s\nprotocol: %u\nbackend: %s\ndevice: %s\n"
         "page_size: %llu\npages_total: %llu\npages_free: %llu\n"
         "sequences: %llu\nmax_frame: %llu\ngpu_sharing: %s\ngpu_other_processes: %llu\n"
         "channels: %llu\n",
         in.server, in.version, in.backend, in.device,
         (unsigned long long)in.page_size, (unsigned long long)in.pages_total,
         (unsigned long long)in.pages_free, (unsigned long long)in.sequences,
         (unsigned long long)in.max_frame, sh.mode[0] ? sh.mode : "not reported",
         (unsigned long long)sh.other_processes, (unsigned long long)channels);
out:
  fp4idx_client_close(c);
  return st;
}

/* ---- stats ----------------------------------------------------------------- */

/* Upper bound (us) of the bucket holding quantile q, from per-bucket counts. */
static double quantile_us(const fp4idx_client_op_stats_t *o, double q) {
  uint64_t total = 0, cum = 0;
  for (uint32_t b = 0; b < o->nbuckets; b++) total += o->hist[b];
  if (total == 0) return 0;
  for (uint32_t b = 0; b < o->nbuckets; b++) {
    cum += o->hist[b];
    if ((double)cum >= q * (double)total) return o->bounds_us[b];
  }
  return INFINITY;
}

/* One table of counters (ops, or stages: no error column). */
static void print_counters(FILE *f, const char *what, const fp4idx_client_op_stats_t *v,
                           uint32_t n, int errors) {
  fprintf(f, "%-10s %10s %8s %12s %10s %10s\n", what, "requests", errors ? "errors" : "",
          "mean_us", "p50<=us", "p99<=us");
  for (uint32_t i = 0; i < n; i++) {
    const fp4idx_client_op_stats_t *o = &v[i];
    double mean = o->count ? o->latency_sum_us / (double)o->count : 0;
    char err[24] = "";
    if (errors) snprintf(err, sizeof err, "%llu", (unsigned long long)o->errors);
    fprintf(f, "%-10s %10llu %8s %12.1f %10g %10g\n", o->op, (unsigned long long)o->count,
            err, mean, quantile_us(o, 0.5), quantile_us(o, 0.99));
  }
}

static void print_stats(FILE *f, const fp4idx_client_stats_t *s) {
  fprintf(f, "uptime_s: %.3f\nbackend: %s\ndevice: %s\ngpu_sharing: %s\n", s->uptime_s,
          s->backend, s->device, s->gpu_sharing[0] ? s->gpu_sharing : "not reported");
  fp4idx_cli_count_t c[FP4IDX_CLI_STATS_COUNTS];
  size_t n = fp4idx__stats_counts(s, c);
  for (size_t i = 0; i < n; i++)
    fprintf(f, "%s: %llu\n", c[i].name, (unsigned long long)c[i].value);
  fputs("errors_by_status: ", f);
  fputs(fp4idx__write_status_errors(f, s, 0) ? "\n" : "none\n", f);
  print_counters(f, "op", s->ops, s->nops, 1);
  if (s->nstages > 0) print_counters(f, "stage", s->stages, s->nstages, 0);
}

int fp4idx__cli_stats(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'},
                                     {"prometheus", no_argument, 0, 'p'},
                                     {"out", required_argument, 0, 'o'},
                                     {"format", required_argument, 0, 'f'},
                                     {0}};
  int ch, prom = 0, json = 0;
  const char *out = NULL;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "hpo:", lo)) != -1) {
    switch (ch) {
      case 'h':
        puts("usage: fp4idx-cli [-s SOCKET] stats [--prometheus | --format text|json]\n"
             "                  [--out FILE]\n"
             "Prints the daemon's counters: per-op requests, errors and\n"
             "latency, pool pages, sequences, keys, connections, uptime.\n"
             "  --format json one object: the scalars by name and \"ops\":\n"
             "                [{\"op\",\"requests\",\"errors\",\"latency_sum_us\",\n"
             "                \"latency_buckets\":[{\"le_us\",\"count\"}]}]\n"
             "  --prometheus  Prometheus text format (node_exporter textfile\n"
             "                collector): fp4idx_requests_total{op},\n"
             "                fp4idx_request_errors_total{op},\n"
             "                fp4idx_request_latency_seconds{op} histogram,\n"
             "                gauges and fp4idx_info{...} 1\n"
             "  --out FILE    write FILE atomically (temp file + rename), as\n"
             "                the textfile collector needs");
        return 0;
      case 'p': prom = 1; break;
      case 'o': out = optarg; break;
      case 'f':
        if (parse_text_json(cli, optarg, &json)) return FP4IDX_EINVAL;
        break;
      default: return FP4IDX_EINVAL;
    }
  }
  if (prom && json)
    return fp4idx__cli_usage(&cli->err, "--prometheus and --format json exclude each other");
  if (optind != argc)
    return fp4idx__cli_usage(&cli->err, "unexpected argument '%s'",
                             argv[optind]);
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  fp4idx_client_stats_t *s = NULL;
  fp4idx_client_info_t in;
  char *tmp = NULL;
  FILE *f = NULL;
  st = fp4idx_client_stats(c, &s);
  if (st == 0 && prom) st = fp4idx_client_info(c, &in);
  if (st) {
    fail_from_client(cli, c, st);
    goto out;
  }
  if (out != NULL && strcmp(out, "-") != 0) {
    /* Same directory, so rename() is atomic: the collector never reads a
     * half-written file. */
    if (asprintf(&tmp, "%s.tmp.%ld", out, (long)getpid()) < 0) {
      tmp = NULL;
      st = fp4idx__cli_fail(&cli->err, FP4IDX_ENOMEM, "out of memory");
      goto out;
    }
    f = fopen(tmp, "w");
    if (f == NULL) {
      st = fp4idx__cli_fail(&cli->err, FP4IDX_EIO, "%s: %s", tmp,
                            strerror(errno));
      goto out;
    }
  } else {
    f = stdout;
  }
  if (prom) fp4idx__prom_write(f, s, &in);
  else if (json) fp4idx__write_stats_json(f, s);
  else print_stats(f, s);
  st = close_out(cli, f, tmp, 0);
  f = NULL;
  if (st == 0 && tmp != NULL && rename(tmp, out) != 0)
    st = fp4idx__cli_fail(&cli->err, FP4IDX_EIO, "rename %s -> %s: %s", tmp,
                          out, strerror(errno));
out:
  if (tmp != NULL) unlink(tmp); /* no-op after a successful rename */
  free(tmp);
  fp4idx_client_free(s);
  fp4idx_client_close(c);
  return st;
}

/* ---- append ---------------------------------------------------------------- */

/* Keys per request through a region (256 MiB of bf16 keys). */
#define FP4IDX_CLI_REGION_KEYS ((size_t)1 << 20)

static void progress(uint64_t done, uint64_t total, double t0, int final) {
  char line[512];
  size_t n = fp4idx__progress_line(line, sizeof line,
                                   fp4idx__term_cols(STDERR_FILENO), done,
                                   total, now_s() - t0);
  /* \r + line + clear to the end of the line (a shorter line after a
   * resize leaves no stale characters). */
  fprintf(stderr, "\r%.*s\033[K%s", (int)n, line, final ? "\n" : "");
  fflush(stderr);
}

/* SIGINT/SIGTERM during append: the request in flight finishes (the
 * library retries its poll on EINTR), then the loop stops and says how far
 * it got. SA_RESETHAND: a second signal ends the program at once. */
static volatile sig_atomic_t append_signal;
static void on_append_signal(int sig) { append_signal = sig; }

static const char append_help[] =
    "usage: fp4idx-cli [-s SOCKET] append SEQ FILE [options]\n"
    "       fp4idx-cli [-s SOCKET] append SEQ --random N [--seed S] [options]\n"
    "Appends keys to sequence SEQ (created if unknown).\n"
    "FILE: raw little-endian keys [n,128] (bf16 or f32) or [n,68] (fp4\n"
    "slots), a .npy file ('<u2' = bf16 bit patterns, '<f4', '|u1'; C order),\n"
    "or - for stdin. A .npy file carries its own dtype and shape.\n"
    "  --dtype bf16|f32|fp4       element type of raw input (default bf16)\n"
    "  --rounding rne|threshold   quantizer rounding (default rne)\n"
    "  --random N                 append N generated keys (normal(0,1);\n"
    "                             fp4: random codes) instead of FILE\n"
    "  --seed S                   seed for --random (default 0)\n"
    "  --chunk K                  keys per request (default 8192 through\n"
    "                             the socket, 1048576 through a region);\n"
    "                             each request is all-or-nothing, the\n"
    "                             whole input is not\n"
    "  --no-region                send the keys through the socket\n"
    "Inputs larger than one chunk go through a shared-memory region (the\n"
    "keys never cross the socket; PROTOCOL.md \"Regions\"), or through the\n"
    "socket when the daemon refuses the region.\n"
    "Prints 'seq SEQ: appended N keys at FIRST, length LEN'. A progress bar\n"
    "(terminal width, rate, ETA) goes to stderr when it is a terminal and the\n"
    "input spans requests. Ctrl-C (or SIGTERM) lets the request in flight\n"
    "finish, then stops and says how many keys were stored and the\n"
    "sequence's length (exit 130; a second Ctrl-C ends it at once).";

/* One append: its options, its input and how it travels. */
typedef struct append_job_s {
  /* options */
  int dtype, rounding, have_random, no_region, chunk_given;
  uint64_t nrandom, seed, chunk, seq;
  /* input: n keys of key_bytes, from the file (keys points into file) or
   * generated chunk by chunk into gen (or straight into the region) */
  unsigned char *file, *gen;
  const unsigned char *keys;
  size_t n, key_bytes;
  /* transport: a host region for large inputs (region 0: the socket) */
  fp4idx_client_t *c;
  uint64_t region;
  void *rmem;
  size_t rsize;
  /* what the daemon answered: the first position, the length after */
  uint64_t first, length;
} append_job_t;

/* append, phase 1: options and operands into j. Returns 0 to go on, 1
 * after --help, or a status (cli->err filled). */
static int append_options(fp4idx_cli_t *cli, int argc, char **argv, append_job_t *j) {
  static const struct option lo[] = {
      {"help", no_argument, 0, 'h'},         {"dtype", required_argument, 0, 'd'},
      {"rounding", required_argument, 0, 'r'}, {"random", required_argument, 0, 'R'},
      {"seed", required_argument, 0, 'S'},   {"chunk", required_argument, 0, 'c'},
      {"no-region", no_argument, 0, 'N'},    {0}};
  int ch;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    switch (ch) {
      case 'h': puts(append_help); return 1;
      case 'd':
        if ((j->dtype = fp4idx__parse_dtype(optarg)) < 0)
          return fp4idx__cli_usage(&cli->err,
                                   "--dtype '%s': expected bf16, f32 or fp4",
                                   optarg);
        break;
      case 'r':
        if ((j->rounding = fp4idx__parse_rounding(optarg)) < 0)
          return fp4idx__cli_usage(&cli->err,
                                   "--rounding '%s': expected rne or threshold",
                                   optarg);
        break;
      case 'R':
        if (fp4idx__cli_parse_num(cli, "--random", optarg, &j->nrandom)) return FP4IDX_EINVAL;
        if (j->nrandom == 0)
          return fp4idx__cli_usage(&cli->err, "--random: N must be >= 1");
        j->have_random = 1;
        break;
      case 'S':
        if (fp4idx__cli_parse_num(cli, "--seed", optarg, &j->seed)) return FP4IDX_EINVAL;
        break;
      case 'c':
        if (fp4idx__cli_parse_num(cli, "--chunk", optarg, &j->chunk)) return FP4IDX_EINVAL;
        if (j->chunk == 0 || j->chunk > (1u << 24))
          return fp4idx__cli_usage(&cli->err, "--chunk: K must be 1..16777216");
        j->chunk_given = 1;
        break;
      case 'N': j->no_region = 1; break;
      default: return FP4IDX_EINVAL;
    }
  }
  int nops = argc - optind;
  if (nops < 1)
    return fp4idx__cli_usage(&cli->err, "missing SEQ (see append --help)");
  if (parse_seq(cli, argv[optind], &j->seq)) return FP4IDX_EINVAL;
  if (j->have_random ? nops != 1 : nops != 2)
    return fp4idx__cli_usage(&cli->err,
                             j->have_random ? "--random takes no FILE"
                                            : "expected SEQ FILE (or --random N)");
  return 0;
}

/* append, phase 2: the keys, from `path` (raw or .npy) or --random, and
 * their size. Returns 0 or a status (cli->err filled). */
static int append_input(fp4idx_cli_t *cli, const char *path, append_job_t *j) {
  int st = 0;
  if (j->have_random) {
    if (j->dtype == 0) j->dtype = FP4IDX_KEYS_BF16;
    j->n = (size_t)j->nrandom;
  } else {
    size_t len;
    fp4idx_array_t a;
    const void *k;
    if ((st = fp4idx__read_file(path, &j->file, &len, &cli->err)) ||
        (st = fp4idx__array_from_buffer(j->file, len, &a, &cli->err)) ||
        (st = fp4idx__keys_from_array(&a, &j->dtype, &k, &j->n, &cli->err)))
      return st;
    j->keys = k;
  }
  j->key_bytes = j->dtype == FP4IDX_KEYS_BF16  ? 2 * FP4IDX_CLIENT_HEAD_DIM
                 : j->dtype == FP4IDX_KEYS_F32 ? 4 * FP4IDX_CLIENT_HEAD_DIM
                                               : FP4IDX_CLIENT_SLOT_BYTES;
  return 0;
}

/* append, phase 3: connects, and picks how the keys travel and in what
 * chunks. A large input goes through a host region: each chunk is written
 * into shared memory and named by reference, so a 10-million-key injection
 * is bound by the quantizer, not by the socket. Through the socket each
 * request stays under the daemon's frame limit (--max-frame), less room
 * for the map around the keys. Returns 0 or a status (cli->err filled). */
static int append_transport(fp4idx_cli_t *cli, append_job_t *j) {
  int st;
  if ((st = fp4idx__cli_connect(cli, &j->c))) return st;
  if (!j->no_region && j->n > (j->chunk_given ? j->chunk : 8192)) {
    size_t rkeys = j->chunk_given ? (size_t)j->chunk : FP4IDX_CLI_REGION_KEYS;
    if (rkeys > j->n) rkeys = j->n;
    if (fp4idx_client_region_create(j->c, rkeys * j->key_bytes, &j->region, &j->rmem) ==
        FP4IDX_OK) {
      j->rsize = rkeys * j->key_bytes;
      j->chunk = rkeys;
    } else {
      j->region = 0; /* e.g. a daemon on another host: the socket it is */
    }
  }
  if (j->have_random && !j->region &&
      (j->gen = malloc((size_t)j->chunk * j->key_bytes)) == NULL)
    return fp4idx__cli_fail(&cli->err, FP4IDX_ENOMEM, "out of memory");
  fp4idx_client_info_t in;
  if (!j->region && fp4idx_client_info(j->c, &in) == FP4IDX_OK && in.max_frame > 4096) {
    uint64_t fit = (in.max_frame - 1024) / j->key_bytes;
    if (fit >= 1 && fit < j->chunk) j->chunk = fit;
  }
  return 0;
}

/* The interruption of an append after `done` keys, as cli->err. */
static int append_interrupted(fp4idx_cli_t *cli, const append_job_t *j, size_t done) {
  int st;
  if (done == 0)
    st = fp4idx__cli_fail(&cli->err, FP4IDX_EIO,
                          "interrupted: no key was stored (0 of %zu)", j->n);
  else
    st = fp4idx__cli_fail(&cli->err, FP4IDX_EIO,
                          "interrupted: %zu of %zu keys were stored (at "
                          "%llu); seq %llu has length %llu",
                          done, j->n, (unsigned long long)j->first,
                          (unsigned long long)j->seq,
                          (unsigned long long)j->length);
  cli->err.signal = append_signal;
  return st;
}

/* append, phase 4: the keys, chunk by chunk, until done, a failure or
 * SIGINT/SIGTERM (a signal the caller ignores, as under nohup or `cmd &`
 * in a script, stays ignored). Returns 0 or a status (cli->err filled). */
static int append_send(fp4idx_cli_t *cli, append_job_t *j) {
  int bar = isatty(STDERR_FILENO) && j->n > j->chunk;
  double t0 = now_s();
  int st = 0;
  struct sigaction sa = {.sa_handler = on_append_signal,
                         .sa_flags = SA_RESETHAND}, old_int, old_term;
  sigemptyset(&sa.sa_mask);
  append_signal = 0;
  sigaction(SIGINT, NULL, &old_int);
  sigaction(SIGTERM, NULL, &old_term);
  if (old_int.sa_handler != SIG_IGN) sigaction(SIGINT, &sa, NULL);
  if (old_term.sa_handler != SIG_IGN) sigaction(SIGTERM, &sa, NULL);
  for (size_t done = 0; done < j->n;) {
    if (append_signal) {
      if (bar) fputc('\n', stderr);
      st = append_interrupted(cli, j, done);
      break;
    }
    size_t m = j->n - done < j->chunk ? j->n - done : (size_t)j->chunk;
    const void *p;
    if (j->have_random) {
      fp4idx__gen_keys(j->dtype, j->seed, done, m, j->region ? j->rmem : j->gen);
      p = j->gen;
    } else {
      p = j->keys + done * j->key_bytes;
      if (j->region) memcpy(j->rmem, p, m * j->key_bytes);
    }
    uint64_t f1, len1;
    if (j->region)
      st = fp4idx_client_append_region(j->c, j->seq, (fp4idx_client_keys_t)j->dtype, j->region,
                                       0, m, (fp4idx_client_rounding_t)j->rounding, &f1, &len1);
    else
      st = fp4idx_client_append(j->c, j->seq, (fp4idx_client_keys_t)j->dtype, p, m,
                                (fp4idx_client_rounding_t)j->rounding, &f1, &len1);
    if (st) {
      if (bar) fputc('\n', stderr);
      if (done > 0)
        fp4idx__cli_fail(&cli->err, st,
                         "after %zu of %zu keys were stored: %s", done, j->n,
                         fp4idx_client_last_error(j->c));
      else
        fail_from_client(cli, j->c, st);
      break;
    }
    if (done == 0) j->first = f1;
    j->length = len1;
    done += m;
    if (bar) progress(done, j->n, t0, done == j->n);
  }
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  return st;
}

int fp4idx__cli_append(fp4idx_cli_t *cli, int argc, char **argv) {
  append_job_t j = {.rounding = FP4IDX_ROUNDING_RNE, .chunk = 8192};
  int st = append_options(cli, argc, argv, &j);
  if (st == 1) return 0; /* --help */
  if (st) return st;
  if (!(st = append_input(cli, j.have_random ? NULL : argv[optind + 1], &j)) &&
      !(st = append_transport(cli, &j)) && !(st = append_send(cli, &j)))
    printf("seq %llu: appended %zu keys at %llu, length %llu\n",
           (unsigned long long)j.seq, j.n, (unsigned long long)j.first,
           (unsigned long long)j.length);
  if (j.rmem) fp4idx_client_region_destroy(j.c, j.region, j.rmem, j.rsize);
  fp4idx_client_close(j.c);
  free(j.file);
  free(j.gen);
  return st;
}

/* ---- score ----------------------------------------------------------------- */

static const char score_help[] =
    "usage: fp4idx-cli [-s SOCKET] score SEQ --q FILE --w FILE --heads H\n"
    "                  [--lens L1,L2,...] [--topk K] [--format text|json|raw]\n"
    "                  [--out FILE]\n"
    "Scores R verify rows of sequence SEQ against its keys.\n"
    "  --q FILE        queries [R,H,128] (raw little-endian or .npy); R is\n"
    "                  derived from the size\n"
    "  --w FILE        head weights [R,H]\n"
    "  --dtype bf16|f32  element type of raw --q/--w files (default bf16;\n"
    "                  a .npy file carries its own: '<u2' bf16, '<f4' f32).\n"
    "                  f32 values are rounded to bf16 (nearest, ties to\n"
    "                  even) before they are sent: the daemon scores bf16\n"
    "  --heads H       heads per row, 1..128\n"
    "  --lens L,...    visible keys per row (R values; default: all keys)\n"
    "  --topk K        only the K best (position, logit) pairs per row\n"
    "  --format FMT    text (default): top-k -> 'row r: pos:logit ...' per\n"
    "                  row; full logits -> a summary line per row\n"
    "                  json: {\"seq\",\"rows\",\"width\",\"logits\":[[..]]} or\n"
    "                  {\"seq\",\"rows\",\"k\",\"results\":[{\"count\",\n"
    "                  \"positions\",\"logits\"}]}; -inf is null\n"
    "                  raw: logits [R,W] f32 little-endian (W = max lens);\n"
    "                  with --topk: positions [R,K] i32, then logits [R,K] f32\n"
    "  --out FILE      write there instead of stdout";

int fp4idx__cli_score(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {
      {"help", no_argument, 0, 'h'},       {"q", required_argument, 0, 'q'},
      {"w", required_argument, 0, 'w'},    {"heads", required_argument, 0, 'H'},
      {"lens", required_argument, 0, 'l'}, {"topk", required_argument, 0, 'k'},
      {"format", required_argument, 0, 'f'}, {"out", required_argument, 0, 'o'},
      {"dtype", required_argument, 0, 'd'}, {0}};
  int ch, fmt = FP4IDX_FORMAT_TEXT, raw_elem = 2;
  const char *qpath = NULL, *wpath = NULL, *lens_s = NULL, *out = NULL;
  uint64_t heads = 0, topk = 0, seq;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    switch (ch) {
      case 'h': puts(score_help); return 0;
      case 'q': qpath = optarg; break;
      case 'w': wpath = optarg; break;
      case 'l': lens_s = optarg; break;
      case 'o': out = optarg; break;
      case 'H':
        if (fp4idx__cli_parse_num(cli, "--heads", optarg, &heads)) return FP4IDX_EINVAL;
        if (heads < 1 || heads > FP4IDX_PROTO_MAX_HEADS)
          return fp4idx__cli_usage(&cli->err, "--heads: H must be 1..128");
        break;
      case 'k':
        if (fp4idx__cli_parse_num(cli, "--topk", optarg, &topk)) return FP4IDX_EINVAL;
        if (topk < 1 || topk > UINT32_MAX)
          return fp4idx__cli_usage(&cli->err, "--topk: K must be >= 1");
        break;
      case 'f':
        if ((fmt = fp4idx__parse_format(optarg)) < 0)
          return fp4idx__cli_usage(&cli->err,
                                   "--format '%s': expected text, json or raw",
                                   optarg);
        break;
      case 'd': {
        int dt = fp4idx__parse_dtype(optarg);
        if (dt != FP4IDX_KEYS_BF16 && dt != FP4IDX_KEYS_F32)
          return fp4idx__cli_usage(&cli->err,
                                   "--dtype '%s': expected bf16 or f32", optarg);
        raw_elem = dt == FP4IDX_KEYS_F32 ? 4 : 2;
        break;
      }
      default: return FP4IDX_EINVAL;
    }
  }
  if (argc - optind != 1)
    return fp4idx__cli_usage(&cli->err, argc - optind < 1
                                            ? "missing SEQ (see score --help)"
                                            : "unexpected argument");
  if (parse_seq(cli, argv[optind], &seq)) return FP4IDX_EINVAL;
  if (qpath == NULL || wpath == NULL || heads == 0)
    return fp4idx__cli_usage(&cli->err, "--q, --w and --heads are required");

  unsigned char *qbuf = NULL, *wbuf = NULL;
  uint16_t *q16 = NULL, *w16 = NULL;
  int32_t *lens = NULL;
  size_t nlens = 0, len;
  fp4idx_client_t *c = NULL;
  fp4idx_client_result_t *res = NULL;
  FILE *f = NULL;
  fp4idx_array_t qa, wa;
  uint32_t rq, rw;
  int st, qel, wel;
  if (lens_s != NULL && fp4idx__parse_lens(lens_s, &lens, &nlens) != 0)
    return fp4idx__cli_usage(&cli->err,
                             "--lens '%s': expected comma-separated counts",
                             lens_s);
  if ((st = fp4idx__read_file(qpath, &qbuf, &len, &cli->err)) ||
      (st = fp4idx__array_from_buffer(qbuf, len, &qa, &cli->err)) ||
      (st = fp4idx__score_rows(&qa, heads, FP4IDX_CLIENT_HEAD_DIM, raw_elem,
                               "--q", &rq, &qel, &cli->err)))
    goto out;
  if ((st = fp4idx__read_file(wpath, &wbuf, &len, &cli->err)) ||
      (st = fp4idx__array_from_buffer(wbuf, len, &wa, &cli->err)) ||
      (st = fp4idx__score_rows(&wa, heads, 1, raw_elem, "--w", &rw, &wel,
                               &cli->err)))
    goto out;
  /* Raw files carry no head count; when --lens fixes the rows, a q that
   * divides into them with another head count names that count. */
  uint64_t qvals = (uint64_t)rq * heads * FP4IDX_CLIENT_HEAD_DIM;
  if (lens != NULL && nlens != rq && nlens > 0 &&
      qvals % ((uint64_t)nlens * FP4IDX_CLIENT_HEAD_DIM) == 0) {
    st = fp4idx__cli_fail(&cli->err, FP4IDX_ESHAPE,
                          "--lens gives %zu rows: --q would then have %llu "
                          "heads, but --heads is %llu", nlens,
                          (unsigned long long)(qvals / ((uint64_t)nlens *
                                                        FP4IDX_CLIENT_HEAD_DIM)),
                          (unsigned long long)heads);
    goto out;
  }
  if (rq != rw) {
    st = fp4idx__cli_fail(&cli->err, FP4IDX_ESHAPE,
                          "--q holds %u rows of %llu heads, --w holds %u", rq,
                          (unsigned long long)heads, rw);
    goto out;
  }
  if (lens != NULL && nlens != rq) {
    st = fp4idx__cli_fail(&cli->err, FP4IDX_ESHAPE,
                          "--lens gives %zu counts for %u rows", nlens, rq);
    goto out;
  }
  /* bf16 copies (f32 rounded RNE); file buffers sit at any offset, the
   * copies are aligned. */
  q16 = fp4idx__to_bf16(qa.data, qvals, qel);
  w16 = fp4idx__to_bf16(wa.data, (uint64_t)rw * heads, wel);
  if (q16 == NULL || w16 == NULL) {
    st = fp4idx__cli_fail(&cli->err, FP4IDX_ENOMEM, "out of memory");
    goto out;
  }
  fp4idx_client_seq_t s = {.seq = seq, .rows = rq, .q = q16, .w = w16,
                           .lens = lens};
  if ((st = fp4idx__cli_connect(cli, &c))) goto out;
  st = fp4idx_client_score(c, (uint32_t)heads, (uint32_t)topk, &s, 1, &res);
  if (st) {
    fail_from_client(cli, c, st);
    goto out;
  }
  if ((f = open_out(cli, out)) == NULL) {
    st = cli->err.status;
    goto out;
  }
  if (fp4idx__write_result(f, (fp4idx_format_t)fmt, &res[0], topk != 0) != 0)
    st = fp4idx__cli_fail(&cli->err, FP4IDX_EIO, "%s: write error",
                          out ? out : "stdout");
  st = close_out(cli, f, out, st);
out:
  fp4idx_client_free(res);
  fp4idx_client_close(c);
  free(qbuf);
  free(wbuf);
  free(q16);
  free(w16);
  free(lens);
  return st;
}

/* ---- truncate / drop ------------------------------------------------------- */

int fp4idx__cli_truncate(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
  int ch;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    if (ch == 'h') {
      puts("usage: fp4idx-cli [-s SOCKET] truncate SEQ N\n"
           "Keeps the first N keys of SEQ (drops rejected speculative keys);\n"
           "N above the key count is an error (ERANGE).");
      return 0;
    }
    return FP4IDX_EINVAL;
  }
  uint64_t seq, n;
  if (argc - optind != 2)
    return fp4idx__cli_usage(&cli->err, "expected SEQ N");
  if (parse_seq(cli, argv[optind], &seq) ||
      fp4idx__cli_parse_num(cli, "N", argv[optind + 1], &n))
    return FP4IDX_EINVAL;
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  uint64_t len;
  st = fp4idx_client_truncate(c, seq, n, &len);
  if (st) fail_from_client(cli, c, st);
  else printf("seq %llu: length %llu\n", (unsigned long long)seq,
              (unsigned long long)len);
  fp4idx_client_close(c);
  return st;
}

int fp4idx__cli_fork(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
  int ch;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    if (ch == 'h') {
      puts("usage: fp4idx-cli [-s SOCKET] fork SRC DST LENGTH\n"
           "Makes the new sequence DST the first LENGTH keys of SRC without\n"
           "copying them (the pages are shared; appends to either never show\n"
           "in the other). DST must not exist (EEXIST); LENGTH above SRC's\n"
           "key count is an error (ERANGE).");
      return 0;
    }
    return FP4IDX_EINVAL;
  }
  uint64_t src, dst, n;
  if (argc - optind != 3)
    return fp4idx__cli_usage(&cli->err, "expected SRC DST LENGTH");
  if (parse_seq(cli, argv[optind], &src) || parse_seq(cli, argv[optind + 1], &dst) ||
      fp4idx__cli_parse_num(cli, "LENGTH", argv[optind + 2], &n))
    return FP4IDX_EINVAL;
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  uint64_t len;
  st = fp4idx_client_fork(c, src, dst, n, &len);
  if (st) fail_from_client(cli, c, st);
  else printf("seq %llu: length %llu, forked from seq %llu\n", (unsigned long long)dst,
              (unsigned long long)len, (unsigned long long)src);
  fp4idx_client_close(c);
  return st;
}

int fp4idx__cli_drop(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
  int ch;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    if (ch == 'h') {
      puts("usage: fp4idx-cli [-s SOCKET] drop SEQ\n"
           "Drops sequence SEQ and frees its pages (ENOSEQ if unknown).");
      return 0;
    }
    return FP4IDX_EINVAL;
  }
  uint64_t seq;
  if (argc - optind != 1) return fp4idx__cli_usage(&cli->err, "expected SEQ");
  if (parse_seq(cli, argv[optind], &seq)) return FP4IDX_EINVAL;
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  st = fp4idx_client_drop(c, seq);
  if (st) fail_from_client(cli, c, st);
  else printf("seq %llu: dropped\n", (unsigned long long)seq);
  fp4idx_client_close(c);
  return st;
}

/* ---- read ------------------------------------------------------------------ */

int fp4idx__cli_read(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {
      {"help", no_argument, 0, 'h'},        {"from", required_argument, 0, 'F'},
      {"count", required_argument, 0, 'n'}, {"dequant", no_argument, 0, 'd'},
      {"out", required_argument, 0, 'o'},   {0}};
  int ch, dequant = 0;
  uint64_t from = 0, count = UINT64_MAX, seq;
  const char *out = NULL;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    switch (ch) {
      case 'h':
        puts("usage: fp4idx-cli [-s SOCKET] read SEQ [--from I] [--count N]\n"
             "                  [--dequant] --out FILE\n"
             "Writes keys [I, I+N) of SEQ (default: all) to FILE (- = stdout):\n"
             "packed FP4 slots u8 [n,68], or with --dequant the decoded values\n"
             "f32 [n,128]; raw little-endian, or .npy when FILE ends in .npy.");
        return 0;
      case 'F':
        if (fp4idx__cli_parse_num(cli, "--from", optarg, &from)) return FP4IDX_EINVAL;
        break;
      case 'n':
        if (fp4idx__cli_parse_num(cli, "--count", optarg, &count)) return FP4IDX_EINVAL;
        break;
      case 'd': dequant = 1; break;
      case 'o': out = optarg; break;
      default: return FP4IDX_EINVAL;
    }
  }
  if (argc - optind != 1) return fp4idx__cli_usage(&cli->err, "expected SEQ");
  if (parse_seq(cli, argv[optind], &seq)) return FP4IDX_EINVAL;
  if (out == NULL) return fp4idx__cli_usage(&cli->err, "--out FILE is required");
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  void *keys = NULL;
  size_t n = 0;
  FILE *f = NULL;
  st = fp4idx_client_read(c, seq, from, count, dequant, &keys, &n);
  if (st) {
    fail_from_client(cli, c, st);
    goto out;
  }
  if ((f = open_out(cli, out)) == NULL) {
    st = cli->err.status;
    goto out;
  }
  size_t cols = dequant ? FP4IDX_CLIENT_HEAD_DIM : FP4IDX_CLIENT_SLOT_BYTES;
  size_t bytes = n * cols * (dequant ? 4 : 1);
  if (ends_with(out, ".npy")) {
    uint64_t shape[2] = {n, cols};
    if (fp4idx__npy_write_header(f, dequant ? "<f4" : "|u1", 2, shape) != 0)
      st = fp4idx__cli_fail(&cli->err, FP4IDX_EIO, "%s: write error", out);
  }
  if (st == 0 && bytes && fwrite(keys, 1, bytes, f) != bytes)
    st = fp4idx__cli_fail(&cli->err, FP4IDX_EIO, "%s: write error", out);
  int to_stdout = f == stdout;
  st = close_out(cli, f, out, st);
  if (st == 0 && !to_stdout)
    printf("seq %llu: read %zu keys from %llu\n", (unsigned long long)seq, n,
           (unsigned long long)from);
out:
  fp4idx_client_free(keys);
  fp4idx_client_close(c);
  return st;
}

/* ---- list ------------------------------------------------------------------ */

static int seq_info_cmp(const void *a, const void *b) {
  const fp4idx_client_seq_info_t *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

int fp4idx__cli_list(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'},
                                     {"count", required_argument, 0, 'n'},
                                     {"cursor", required_argument, 0, 'c'},
                                     {"format", required_argument, 0, 'f'},
                                     {0}};
  uint64_t count = 0, cursor = 0;
  int one_step = 0, fmt = FP4IDX_FORMAT_TEXT, ch;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "hn:c:f:", lo)) != -1) {
    switch (ch) {
      case 'h':
        puts("usage: fp4idx-cli [-s SOCKET] list [--count N] [--cursor C]\n"
             "                  [--format text|json]\n"
             "Lists the daemon's sequences with their key and page counts,\n"
             "sorted by id. The daemon answers in bounded steps (like Redis\n"
             "SCAN) of about N sequences (1..10000, default 100); without\n"
             "--cursor all steps are walked. --cursor C runs the one step at\n"
             "cursor C (0 starts) and prints the next cursor (0: complete).");
        return 0;
      case 'n':
        if (fp4idx__cli_parse_num(cli, "--count", optarg, &count)) return FP4IDX_EINVAL;
        if (count < 1 || count > FP4IDX_PROTO_MAX_LIST_COUNT)
          return fp4idx__cli_usage(&cli->err, "--count: N must be 1..%u",
                                   FP4IDX_PROTO_MAX_LIST_COUNT);
        break;
      case 'c':
        if (fp4idx__cli_parse_num(cli, "--cursor", optarg, &cursor)) return FP4IDX_EINVAL;
        one_step = 1;
        break;
      case 'f':
        fmt = fp4idx__parse_format(optarg);
        if (fmt != FP4IDX_FORMAT_TEXT && fmt != FP4IDX_FORMAT_JSON)
          return fp4idx__cli_usage(&cli->err, "--format: expected text or json");
        break;
      default: return FP4IDX_EINVAL;
    }
  }
  if (optind != argc)
    return fp4idx__cli_usage(&cli->err, "unexpected argument '%s'", argv[optind]);
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  fp4idx_client_seq_info_t *all = NULL;
  size_t n_all = 0;
  do {
    fp4idx_client_seq_info_t *part;
    size_t n;
    st = fp4idx_client_list(c, cursor, (uint32_t)count, &cursor, &part, &n);
    if (st) {
      fail_from_client(cli, c, st);
      goto out;
    }
    if (n) {
      fp4idx_client_seq_info_t *grown = realloc(all, (n_all + n) * sizeof *all);
      if (!grown) {
        fp4idx_client_free(part);
        st = fp4idx__cli_fail(&cli->err, FP4IDX_ENOMEM, "out of memory for %zu sequences",
                              n_all + n);
        goto out;
      }
      all = grown;
      memcpy(all + n_all, part, n * sizeof *part);
    }
    n_all += n;
    fp4idx_client_free(part);
  } while (!one_step && cursor != 0);
  /* sorted, and once each: a walk may meet a sequence twice when the
   * daemon's table grew under it */
  if (n_all) qsort(all, n_all, sizeof *all, seq_info_cmp);
  size_t u = 0;
  for (size_t i = 0; i < n_all; i++)
    if (u == 0 || all[i].seq != all[u - 1].seq) all[u++] = all[i];
  if (fmt == FP4IDX_FORMAT_JSON) {
    printf("{");
    if (one_step) printf("\"cursor\":%llu,", (unsigned long long)cursor);
    printf("\"sequences\":[");
    for (size_t i = 0; i < u; i++)
      printf("%s{\"seq\":%llu,\"keys\":%llu,\"pages\":%llu,\"pages_shared\":%llu}",
             i ? "," : "", (unsigned long long)all[i].seq, (unsigned long long)all[i].keys,
             (unsigned long long)all[i].pages, (unsigned long long)all[i].pages_shared);
    printf("]}\n");
  } else {
    printf("seq keys pages shared\n");
    for (size_t i = 0; i < u; i++)
      printf("%llu %llu %llu %llu\n", (unsigned long long)all[i].seq,
             (unsigned long long)all[i].keys, (unsigned long long)all[i].pages,
             (unsigned long long)all[i].pages_shared);
    if (one_step) printf("cursor: %llu\n", (unsigned long long)cursor);
  }
out:
  free(all);
  fp4idx_client_close(c);
  return st;
}
