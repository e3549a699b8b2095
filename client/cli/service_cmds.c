/* service_cmds.c -- fp4idx-cli save, export and import, what persistence
 * adds: a snapshot on demand, and one sequence to/from SGLang's page layout
 * (persist/export.h) so caches move between fp4idx and SGLang. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fp4idx_codec.h"
#include "fp4idx_format.h"
#include "export.h"

/* ---- save -------------------------------------------------------------------- */

int fp4idx__cli_save(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'}, {0}};
  int ch;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    if (ch == 'h') {
      puts("usage: fp4idx-cli [-s SOCKET] save\n"
           "Makes the daemon write its snapshot now (and start a fresh append\n"
           "log). Needs a daemon started with --data-dir.");
      return 0;
    }
    return FP4IDX_EINVAL;
  }
  if (optind != argc)
    return fp4idx__cli_usage(&cli->err, "unexpected argument '%s'", argv[optind]);
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  st = fp4idx_client_save(c);
  if (st) fp4idx__cli_fail(&cli->err, st, "%s", fp4idx_client_last_error(c));
  else puts("saved");
  fp4idx_client_close(c);
  return st;
}

/* ---- export -------------------------------------------------------------------- */

static const char export_help[] =
    "usage: fp4idx-cli [-s SOCKET] export SEQ FILE [--raw] [--page-size P]\n"
    "Writes sequence SEQ in SGLang's FP4 index-K page layout: ceil(n/P) pages\n"
    "of P*68 bytes (P payloads of 64 bytes, then P scale words of 4 bytes;\n"
    "unused slots of the last page zero). The file has a 64-byte header (seq,\n"
    "key count, page size, CRC-32C; numpy: np.fromfile(f, np.uint8,\n"
    "offset=64).reshape(-1, P*68)); --raw writes the pages alone.\n"
    "  --page-size P   page size of the file (default: the daemon's)\n"
    "  --raw           no header";

int fp4idx__cli_export(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'},
                                     {"raw", no_argument, 0, 'r'},
                                     {"page-size", required_argument, 0, 'p'},
                                     {0}};
  int ch, raw = 0;
  uint64_t seq, ps = 0;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    switch (ch) {
      case 'h': puts(export_help); return 0;
      case 'r': raw = 1; break;
      case 'p':
        if (fp4idx__cli_parse_num(cli, "--page-size", optarg, &ps)) return FP4IDX_EINVAL;
        break;
      default: return FP4IDX_EINVAL;
    }
  }
  if (argc - optind != 2) return fp4idx__cli_usage(&cli->err, "expected SEQ FILE");
  if (fp4idx__cli_parse_num(cli, "SEQ", argv[optind], &seq)) return FP4IDX_EINVAL;
  const char *path = argv[optind + 1];
  fp4idx_client_t *c;
  int st = fp4idx__cli_connect(cli, &c);
  if (st) return st;
  void *keys = NULL;
  size_t n = 0;
  if (ps == 0) {
    fp4idx_client_info_t in;
    st = fp4idx_client_info(c, &in);
    if (st) goto fail;
    ps = in.page_size;
  }
  /* Read in pieces of at most 1M keys (68 MB responses); a piece past the
   * end (ERANGE) is read again as "to the end". */
  const uint64_t piece = 1u << 20;
  for (;;) {
    void *part = NULL;
    size_t got = 0;
    st = fp4idx_client_read(c, seq, n, piece, 0, &part, &got);
    if (st == FP4IDX_ERANGE) st = fp4idx_client_read(c, seq, n, UINT64_MAX, 0, &part, &got);
    if (st) {
      free(keys);
      goto fail;
    }
    if (got) {
      void *grown = realloc(keys, (n + got) * FP4IDX_SLOT_BYTES);
      if (!grown) {
        fp4idx_client_free(part);
        free(keys);
        fp4idx_client_close(c);
        return fp4idx__cli_fail(&cli->err, FP4IDX_ENOMEM, "out of memory for %zu keys",
                                n + got);
      }
      keys = grown;
      memcpy((uint8_t *)keys + n * FP4IDX_SLOT_BYTES, part, got * FP4IDX_SLOT_BYTES);
      n += got;
    }
    fp4idx_client_free(part);
    if (got < piece) break;
  }
  char err[512] = "";
  st = fp4idx__export_write(path, seq, keys, (int64_t)n, (int32_t)ps,
                           raw ? FP4IDX_EXPORT_RAW : 0, err, sizeof err);
  if (st) fp4idx__cli_fail(&cli->err, st, "%s", err);
  else
    printf("seq %llu: exported %zu keys as %lld pages of %llu to %s\n",
           (unsigned long long)seq, n,
           (long long)((n + ps - 1) / ps), (unsigned long long)ps, path);
  free(keys);
  fp4idx_client_close(c);
  return st;
fail:
  fp4idx__cli_fail(&cli->err, st, "%s", fp4idx_client_last_error(c));
  fp4idx_client_close(c);
  return st;
}

/* ---- import -------------------------------------------------------------------- */

static const char import_help[] =
    "usage: fp4idx-cli [-s SOCKET] import SEQ FILE [--raw --count N --page-size P]\n"
    "Appends the keys of an export file (or of raw SGLang pages with --raw)\n"
    "to sequence SEQ, as packed FP4 slots stored verbatim.\n"
    "  --raw           FILE holds pages only: give --count and --page-size\n"
    "  --count N       keys in a raw FILE\n"
    "  --page-size P   page size of a raw FILE\n"
    "  --chunk K       keys per request (default 65536); each request is\n"
    "                  all-or-nothing, the whole import is not";

int fp4idx__cli_import(fp4idx_cli_t *cli, int argc, char **argv) {
  static const struct option lo[] = {{"help", no_argument, 0, 'h'},
                                     {"raw", no_argument, 0, 'r'},
                                     {"count", required_argument, 0, 'n'},
                                     {"page-size", required_argument, 0, 'p'},
                                     {"chunk", required_argument, 0, 'k'},
                                     {0}};
  int ch, raw = 0;
  uint64_t seq, count = 0, ps = 0, chunk = 65536;
  while ((ch = fp4idx__cli_next_opt(cli, argc, argv, "h", lo)) != -1) {
    switch (ch) {
      case 'h': puts(import_help); return 0;
      case 'r': raw = 1; break;
      case 'n':
        if (fp4idx__cli_parse_num(cli, "--count", optarg, &count)) return FP4IDX_EINVAL;
        break;
      case 'p':
        if (fp4idx__cli_parse_num(cli, "--page-size", optarg, &ps)) return FP4IDX_EINVAL;
        break;
      case 'k':
        if (fp4idx__cli_parse_num(cli, "--chunk", optarg, &chunk)) return FP4IDX_EINVAL;
        if (chunk < 1 || chunk > (1u << 24))
          return fp4idx__cli_usage(&cli->err, "--chunk: K must be 1..16777216");
        break;
      default: return FP4IDX_EINVAL;
    }
  }
  if (argc - optind != 2) return fp4idx__cli_usage(&cli->err, "expected SEQ FILE");
  if (fp4idx__cli_parse_num(cli, "SEQ", argv[optind], &seq)) return FP4IDX_EINVAL;
  if (raw && (count == 0 || ps == 0))
    return fp4idx__cli_usage(&cli->err, "--raw needs --count N and --page-size P");
  const char *path = argv[optind + 1];
  fp4idx_export_info_t info = {.n_keys = (int64_t)count, .page_size = (int32_t)ps};
  uint8_t *slots = NULL;
  char err[512] = "";
  int st = fp4idx__export_read(path, raw ? FP4IDX_EXPORT_RAW : 0, &info, &slots, err,
                              sizeof err);
  if (st) return fp4idx__cli_fail(&cli->err, st, "%s", err);
  fp4idx_client_t *c;
  st = fp4idx__cli_connect(cli, &c);
  if (st) {
    free(slots);
    return st;
  }
  uint64_t first = 0, len = 0, done = 0;
  while (done < (uint64_t)info.n_keys) {
    uint64_t k = (uint64_t)info.n_keys - done;
    if (k > chunk) k = chunk;
    uint64_t f;
    st = fp4idx_client_append_fp4(c, seq, slots + done * FP4IDX_SLOT_BYTES, k, &f, &len);
    if (st) {
      fp4idx__cli_fail(&cli->err, st, "after %llu of %lld keys: %s",
                       (unsigned long long)done, (long long)info.n_keys,
                       fp4idx_client_last_error(c));
      break;
    }
    if (done == 0) first = f;
    done += k;
  }
  if (!st)
    printf("seq %llu: imported %lld keys at %llu, length %llu\n",
           (unsigned long long)seq, (long long)info.n_keys, (unsigned long long)first,
           (unsigned long long)len);
  free(slots);
  fp4idx_client_close(c);
  return st;
}
