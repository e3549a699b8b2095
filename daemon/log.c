/* log.c -- stderr logging, one line per event (see log.h). */
#define _GNU_SOURCE
#include "log.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static atomic_int fp4idx__log_level = FP4IDX_LOG_INFO;
static atomic_int fp4idx__log_format = FP4IDX_LOG_FORMAT_TEXT;

static const char *const fp4idx__log_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
/* syslog(3) priorities of the levels: LOG_ERR, LOG_WARNING, LOG_INFO,
 * LOG_DEBUG -- what journald reads from a "<N>" prefix. */
static const int fp4idx__log_priorities[] = {3, 4, 6, 7};

void fp4idx__log_set_level(fp4idx_log_level_t level) {
  atomic_store(&fp4idx__log_level, (int)level);
}

int fp4idx__log_parse_level(const char *name, fp4idx_log_level_t *out) {
  if (!name || !out) return -1;
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(name, fp4idx__log_names[i]) == 0 ||
        (i == 1 && strcasecmp(name, "warning") == 0)) {
      *out = (fp4idx_log_level_t)i;
      return 0;
    }
  }
  return -1;
}

int fp4idx__log_parse_format(const char *name, fp4idx_log_format_t *out) {
  static const char *const names[] = {"auto", "text", "journal"};
  if (!name || !out) return -1;
  for (int i = 0; i < 3; i++) {
    if (strcmp(name, names[i]) == 0) {
      *out = (fp4idx_log_format_t)i;
      return 0;
    }
  }
  return -1;
}

int fp4idx__log_stderr_is_journal(void) {
  /* systemd sets JOURNAL_STREAM=DEV:INODE for a journal stdout/stderr; a
   * redirected stderr (2>file) keeps the variable but not the inode. */
  const char *e = getenv("JOURNAL_STREAM");
  if (!e || !*e) return 0;
  char *end;
  uintmax_t dev = strtoumax(e, &end, 10);
  if (end == e || *end != ':') return 0;
  const char *p = end + 1;
  uintmax_t ino = strtoumax(p, &end, 10);
  if (end == p || *end) return 0;
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) return 0;
  return (uintmax_t)st.st_dev == dev && (uintmax_t)st.st_ino == ino;
}

fp4idx_log_format_t fp4idx__log_set_format(fp4idx_log_format_t format) {
  if (format != FP4IDX_LOG_FORMAT_TEXT && format != FP4IDX_LOG_FORMAT_JOURNAL)
    format = fp4idx__log_stderr_is_journal() ? FP4IDX_LOG_FORMAT_JOURNAL
                                             : FP4IDX_LOG_FORMAT_TEXT;
  atomic_store(&fp4idx__log_format, (int)format);
  return format;
}

size_t fp4idx__log_escape(char *out, size_t cap, const char *in, size_t len) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  if (cap == 0) return 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)in[i];
    int plain = ch >= 0x20 && ch < 0x7f && ch != '\\';
    size_t need = plain ? 1 : (ch == '\\' ? 2 : 4);
    if (o + need > cap - 1) break; /* whole escapes only */
    if (plain) {
      out[o++] = (char)ch;
    } else if (ch == '\\') {
      out[o++] = '\\';
      out[o++] = '\\';
    } else {
      out[o++] = '\\';
      out[o++] = 'x';
      out[o++] = hex[ch >> 4];
      out[o++] = hex[ch & 15];
    }
  }
  out[o] = '\0';
  return o;
}

int fp4idx__log_enabled(fp4idx_log_level_t level) {
  return (int)level <= atomic_load(&fp4idx__log_level);
}

void fp4idx__log(fp4idx_log_level_t level, const char *fmt, ...) {
  if (!fp4idx__log_enabled(level)) return;
  char line[1024];
  int lv = level < 0 || level > 3 ? 0 : (int)level;
  int n;
  if (atomic_load(&fp4idx__log_format) == FP4IDX_LOG_FORMAT_JOURNAL) {
    /* journald stamps time, pid and unit itself. */
    n = snprintf(line, sizeof line, "<%d>", fp4idx__log_priorities[lv]);
  } else {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(line, sizeof line,
                 "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ fp4idxd[%ld] %-5s ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                 tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L, (long)getpid(),
                 fp4idx__log_names[lv]);
  }
  if (n < 0) return;
  size_t head = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
  /* The message is formatted apart and copied in escaped: it may quote
   * client bytes (an op name, a message), and a control byte (ESC, CR, a
   * newline) must neither reach a terminal nor forge a line. */
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t mlen = m < 0 ? 0 : ((size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1);
  /* A library's message may end in its own newline: the line ends once. */
  while (mlen && msg[mlen - 1] == '\n') mlen--;
  size_t len = fp4idx__log_escape(line + head, sizeof line - head - 1, msg, mlen) + head;
  line[len++] = '\n'; /* fits: the escape left one byte */
  /* One write per line: lines from different threads never interleave. */
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}
