/* log.h -- the daemon's log: stderr, one line per event, in one of two forms.
 *
 * text (a terminal, a file):
 *   "2026-11-30T03:30:00.123Z fp4idxd[pid] LEVEL message"
 * journal (stderr is systemd's journal stream): the sd-daemon(3) priority
 *   prefix and the message, "<3>message" (3 err, 4 warning, 6 info, 7 debug);
 *   journald adds time, pid and unit, and `journalctl -p err` finds errors.
 * --log-format auto (the default) picks journal when $JOURNAL_STREAM names
 * stderr's device:inode (systemd.exec(5)), text otherwise.
 *
 * Safe to call from any thread (each line is formatted into one buffer and
 * written with a single write(2), so lines never interleave).
 */
#ifndef FP4IDX_DAEMON_LOG_H
#define FP4IDX_DAEMON_LOG_H

#include <stdarg.h>
#include <stddef.h>

typedef enum fp4idx_log_level_e {
  FP4IDX_LOG_ERROR = 0,
  FP4IDX_LOG_WARN = 1,
  FP4IDX_LOG_INFO = 2,
  FP4IDX_LOG_DEBUG = 3
} fp4idx_log_level_t;

typedef enum fp4idx_log_format_e {
  FP4IDX_LOG_FORMAT_AUTO = 0,    /* journal when stderr is the journal */
  FP4IDX_LOG_FORMAT_TEXT = 1,    /* timestamp, pid, level name */
  FP4IDX_LOG_FORMAT_JOURNAL = 2  /* "<N>" priority prefix only */
} fp4idx_log_format_t;

/* Sets the most verbose level that is written (default INFO). */
void fp4idx__log_set_level(fp4idx_log_level_t level);

/* Parses "error", "warn", "info" or "debug" (case-insensitive). Returns 0 and
 * sets *out, or -1 for an unknown name. */
int fp4idx__log_parse_level(const char *name, fp4idx_log_level_t *out);

/* Parses "auto", "text" or "journal". Returns 0 and sets *out, or -1. */
int fp4idx__log_parse_format(const char *name, fp4idx_log_format_t *out);

/* True when $JOURNAL_STREAM ("DEV:INODE", decimal) names the file that
 * stderr is open on now. */
int fp4idx__log_stderr_is_journal(void);

/* Sets the line form; AUTO is resolved here, once, with
 * fp4idx__log_stderr_is_journal(). Returns the form in use (TEXT or
 * JOURNAL). Default before any call: TEXT. */
fp4idx_log_format_t fp4idx__log_set_format(fp4idx_log_format_t format);

/* Copies len bytes of `in` into `out` (cap bytes, NUL-terminated), printable
 * ASCII as is, a backslash as two, every other byte as \xNN; stops before an
 * escape that would not fit. Returns the bytes written (without the NUL). */
size_t fp4idx__log_escape(char *out, size_t cap, const char *in, size_t len);

/* True when `level` would be written. */
int fp4idx__log_enabled(fp4idx_log_level_t level);

/* Writes one line (a trailing newline is added). The message is escaped
 * (fp4idx__log_escape): a control byte, a byte >= 0x7f or a backslash in it
 * -- e.g. quoted from a client -- never reaches the log raw, so one event
 * stays one line and a terminal reading the log sees no escape sequence. */
void fp4idx__log(fp4idx_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define fp4idx__log_error(...) fp4idx__log(FP4IDX_LOG_ERROR, __VA_ARGS__)
#define fp4idx__log_warn(...) fp4idx__log(FP4IDX_LOG_WARN, __VA_ARGS__)
#define fp4idx__log_info(...) fp4idx__log(FP4IDX_LOG_INFO, __VA_ARGS__)
#define fp4idx__log_debug(...) \
  do { if (fp4idx__log_enabled(FP4IDX_LOG_DEBUG)) fp4idx__log(FP4IDX_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif /* FP4IDX_DAEMON_LOG_H */
