/* cli.h -- internals of fp4idx-cli shared by its commands and unit tests:
 * .npy headers, argument parsers, key generation, output formats and the
 * Prometheus text form of the daemon's stats. Not installed. */
#ifndef FP4IDX_CLI_H
#define FP4IDX_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fp4idx_client.h"
#include "prom.h"

/* ---- errors ---------------------------------------------------------------- */

/* Where a command reports its failure; main prints it as
 * "fp4idx-cli: <op>: <msg> (<CODE>)" and exits non-zero. */
typedef struct fp4idx_cli_err_s {
  int status;       /* fp4idx status code */
  int usage;        /* 1: bad command line (exit 2), 0: runtime error (exit 1) */
  int signal;       /* SIGINT/SIGTERM stopped the command (exit 128 + it) */
  char msg[512];
} fp4idx_cli_err_t;

/* Records an error (status, printf message); returns status. */
int fp4idx__cli_fail(fp4idx_cli_err_t *e, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Same, marked as a usage error (exit status 2). */
int fp4idx__cli_usage(fp4idx_cli_err_t *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- .npy ---------------------------------------------------------------- */

#define FP4IDX_NPY_MAX_NDIM 8

/* A parsed .npy header (format versions 1.0, 2.0 and 3.0). */
typedef struct fp4idx_npy_s {
  char kind;          /* 'u', 'i', 'f', 'V' (raw bytes) */
  int itemsize;       /* bytes per element */
  int ndim;
  uint64_t shape[FP4IDX_NPY_MAX_NDIM];
  uint64_t count;     /* product of shape (1 for ndim 0) */
  size_t data_offset; /* where the array data starts in the file */
} fp4idx_npy_t;

/* True when buf starts with the .npy magic "\x93NUMPY". */
int fp4idx__npy_is(const void *buf, size_t len);

/* Parses the .npy header at buf[0..len). Accepts little-endian ('<'), native
 * ('=') and byte-order-free ('|') dtypes, C order only; checks that the data
 * after the header holds exactly count * itemsize bytes.
 * Returns 0, or FP4IDX_EINVAL with a message in e (not an npy file, bad
 * header, big-endian, Fortran order, size mismatch). */
int fp4idx__npy_parse(const void *buf, size_t len, fp4idx_npy_t *out,
                      fp4idx_cli_err_t *e);

/* Writes a version 1.0 .npy header for descr ("<f4", "|u1", "<i4") and the
 * given shape; the data must follow. Returns 0 or -1 (write error). */
int fp4idx__npy_write_header(FILE *f, const char *descr, int ndim,
                             const uint64_t *shape);

/* ---- input files --------------------------------------------------------- */

/* Reads a whole file ("-" = stdin) into a malloc'ed buffer. Returns 0 or
 * FP4IDX_EIO with a message. */
int fp4idx__read_file(const char *path, unsigned char **buf, size_t *len,
                      fp4idx_cli_err_t *e);

/* An array loaded from a raw or .npy file: data points into the file buffer. */
typedef struct fp4idx_array_s {
  const unsigned char *data;
  size_t nbytes;
  int is_npy;
  fp4idx_npy_t npy;   /* valid when is_npy */
} fp4idx_array_t;

/* Splits a file buffer into header and data (.npy detected by its magic).
 * Returns 0 or FP4IDX_EINVAL. */
int fp4idx__array_from_buffer(const unsigned char *buf, size_t len,
                              fp4idx_array_t *a, fp4idx_cli_err_t *e);

/* Resolves keys for append: *dtype is the --dtype choice (0 = not given).
 * For .npy, the dtype comes from the header ('<u2'/'<i2'/'<V2' -> bf16,
 * '<f4' -> f32, '|u1' -> fp4) and the shape must be [n,128] or [n,68]; a
 * conflicting --dtype is an error. Raw data defaults to bf16 and its size
 * must be a whole number of keys. Sets *dtype, *keys, *n.
 * Returns 0 or FP4IDX_EINVAL / FP4IDX_ESHAPE with a message. */
int fp4idx__keys_from_array(const fp4idx_array_t *a, int *dtype,
                            const void **keys, size_t *n,
                            fp4idx_cli_err_t *e);

/* Checks a score input of `heads` heads x `per_head` values per row (q:
 * per_head 128, w: per_head 1) and sets *rows and *elem (2: bf16 bit
 * patterns, 4: f32). A .npy file carries its element type ('<u2'/'<i2'/'<V2'
 * bf16, '<f4' f32) and its trailing dims must multiply to heads*per_head; a
 * shape showing another head count ([R,H,128] / [R,H]) says so. Raw data
 * is `raw_elem` bytes per value (--dtype). `what` names the option for
 * messages ("--q"). Returns 0 or ESHAPE/EINVAL with a message. */
int fp4idx__score_rows(const fp4idx_array_t *a, uint64_t heads,
                       uint64_t per_head, int raw_elem, const char *what,
                       uint32_t *rows, int *elem, fp4idx_cli_err_t *e);

/* n values as bf16 bit patterns in a malloc'ed array: copied when elem is
 * 2, rounded to nearest even (fp4idx_f32_to_bf16, kernels/fp4idx_format.h)
 * when elem is 4 (f32). data needs no alignment. Returns NULL when out of
 * memory. */
uint16_t *fp4idx__to_bf16(const unsigned char *data, size_t n, int elem);

/* ---- argument parsers ---------------------------------------------------- */

/* Parses a whole decimal unsigned integer (no sign, no junk, no overflow).
 * Returns 0 or -1. */
int fp4idx__parse_u64(const char *s, uint64_t *out);

/* Parses "L1,L2,..." into a malloc'ed int32 array (each 0..INT32_MAX).
 * Returns 0 or -1 (empty item, junk, out of range, out of memory). */
int fp4idx__parse_lens(const char *s, int32_t **lens, size_t *n);

/* "bf16" | "f32" | "fp4" -> FP4IDX_KEYS_*, else -1. */
int fp4idx__parse_dtype(const char *s);

/* "rne" | "threshold" -> FP4IDX_ROUNDING_*, else -1. */
int fp4idx__parse_rounding(const char *s);

typedef enum fp4idx_format_e {
  FP4IDX_FORMAT_TEXT = 0,
  FP4IDX_FORMAT_JSON = 1,
  FP4IDX_FORMAT_RAW = 2
} fp4idx_format_t;

/* "text" | "json" | "raw" -> FP4IDX_FORMAT_*, else -1. */
int fp4idx__parse_format(const char *s);

/* ---- key generation (--random) ------------------------------------------- */

/* Fills keys [n,128] (bf16 or f32) with normal(0,1) values, or [n,68] fp4
 * slots with uniform codes and scale bytes 120..134, from a splitmix64
 * stream seeded with seed; `first` is the index of the first key so that
 * chunks of one stream can be generated separately (key i depends only on
 * seed and i). */
void fp4idx__gen_keys(int dtype, uint64_t seed, uint64_t first, size_t n,
                      void *keys);

/* ---- output -------------------------------------------------------------- */

/* Writes one score result (full logits or top-k) in the chosen format.
 * text: top-k -> one line per row "row R: pos:logit pos:logit ..."; full
 *   logits -> one line per row with visible count, max and argmax and the
 *   first values. json: {"seq":..,"rows":..,"width":..,...} with -inf as
 *   null. raw: logits [R,W] f32 little-endian; with top-k: positions
 *   [R,k] i32 then logits [R,k] f32.
 * Returns 0 or -1 (write error). */
int fp4idx__write_result(FILE *f, fp4idx_format_t fmt,
                         const fp4idx_client_result_t *r, int topk);

/* Prints a float in the shortest form that reads back as the same f32
 * ("%.9g" with -inf/inf/nan spelled out). buf needs 32 bytes. */
const char *fp4idx__fmt_f32(char *buf, float v);

/* The integer fields of stats, by name, in the order the text and JSON
 * forms print them (connections .. gpu_other_processes). Fills out[] (room for
 * FP4IDX_CLI_STATS_COUNTS) and returns how many. */
#define FP4IDX_CLI_STATS_COUNTS 20
typedef struct fp4idx_cli_count_s {
  const char *name;
  uint64_t value;
} fp4idx_cli_count_t;
size_t fp4idx__stats_counts(const fp4idx_client_stats_t *s, fp4idx_cli_count_t *out);

/* Writes the nonzero errors by status: "ENOSEQ=1 ERANGE=2" (text) or
 * "\"ENOSEQ\":1,\"ERANGE\":2" (json, the inside of an object). Returns how
 * many were written. */
int fp4idx__write_status_errors(FILE *f, const fp4idx_client_stats_t *s, int json);

/* info / stats as one JSON object each (a line): info's fields by name;
 * stats' scalars and "ops":[{"op","requests","errors","latency_sum_us",
 * "latency_buckets":[{"le_us","count"}]}] (per-bucket counts, the last
 * bound +inf written as null). Returns 0 or -1 (write error). */
int fp4idx__write_info_json(FILE *f, const fp4idx_client_info_t *in,
                            const fp4idx_client_sharing_t *sh, uint64_t channels);
int fp4idx__write_stats_json(FILE *f, const fp4idx_client_stats_t *s);

/* Width of the terminal on fd (TIOCGWINSZ), else $COLUMNS, else 80. */
int fp4idx__term_cols(int fd);

/* Formats append's progress line for a terminal `cols` wide, without \r or
 * \n, in at most cols - 1 characters (and cap - 1): "append [###...] 42%
 * 4.2M/10.0M keys 1.3M keys/s ETA 0:04"; the bar takes the width the
 * numbers leave (10..60 columns); narrower terminals get "[###...] 42%
 * 1.3M/s ETA 0:04", then the numbers alone, cut to fit; when done == total
 * the ETA becomes the elapsed time. Returns the length written. */
size_t fp4idx__progress_line(char *buf, size_t cap, int cols, uint64_t done,
                             uint64_t total, double elapsed_s);

/* ---- Prometheus: fp4idx__prom_write (prom.h) ------------------------------ */

/* ---- commands (commands.c) ------------------------------------------------ */

/* What main() hands every command. */
typedef struct fp4idx_cli_s {
  const char *socket;   /* -s PATH, or NULL for the default */
  int timeout_ms;       /* -t MS, 0 = none */
  fp4idx_cli_err_t err; /* the failure to report */
} fp4idx_cli_t;

/* Each command parses its own argv (argv[0] = command name) and returns
 * 0, or a negative status with cli->err filled in. A command's --help prints
 * to stdout and returns 0. */
typedef int (*fp4idx_cli_cmd_fn)(fp4idx_cli_t *cli, int argc, char **argv);

/* Helpers the commands share (commands.c). */
struct option;
/* Opens a connection to cli->socket with cli->timeout_ms; on failure records
 * the client's message in cli->err and returns its status (*out = NULL). */
int fp4idx__cli_connect(fp4idx_cli_t *cli, fp4idx_client_t **out);
/* getopt_long with our error reporting: returns the option, -1 at the end,
 * or '?' after recording a usage error. */
int fp4idx__cli_next_opt(fp4idx_cli_t *cli, int argc, char **argv, const char *so,
                         const struct option *lo);
/* Parses an unsigned integer for option/operand `opt`; a usage error
 * (FP4IDX_EINVAL) naming it otherwise. */
int fp4idx__cli_parse_num(fp4idx_cli_t *cli, const char *opt, const char *s,
                          uint64_t *v);

int fp4idx__cli_info(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_stats(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_append(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_score(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_truncate(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_drop(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_fork(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_read(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_list(fp4idx_cli_t *cli, int argc, char **argv);
/* service_cmds.c: save, export, import (what persistence adds). */
int fp4idx__cli_save(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_export(fp4idx_cli_t *cli, int argc, char **argv);
int fp4idx__cli_import(fp4idx_cli_t *cli, int argc, char **argv);

/* table_cmds.c: the ops of the protocol's op table whose fields are all
 * integers, as commands. */
/* Returns the op named `name` of fp4idx_client_ops(), or NULL. */
const fp4idx_client_op_t *fp4idx__cli_table_op(const char *name);
/* The operands of op ("SEQ LENGTH": its request fields, upper-cased) into
 * buf[cap] (cut to fit); returns buf. */
const char *fp4idx__cli_table_operands(const fp4idx_client_op_t *op, char *buf, size_t cap);
/* Runs op with argv[1..argc) as its request fields; prints the response
 * fields. Returns 0 or a status with cli->err set, as a command. */
int fp4idx__cli_table_call(fp4idx_cli_t *cli, const fp4idx_client_op_t *op, int argc,
                           char **argv);

#endif /* FP4IDX_CLI_H */
