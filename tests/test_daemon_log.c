/* test_daemon_log.c -- the daemon's log lines (daemon/log.c): the text form
 * on a terminal or file, sd-daemon "<N>" priority prefixes when stderr is
 * the journal ($JOURNAL_STREAM = stderr's device:inode), --log-format, and
 * the real fp4idxd logging in journal form under such a stderr. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <fcntl.h>
#include <regex.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "fp4idx_status.h"
#include "log.h"

extern char **environ;

/* stderr -> a fresh temp file (Criterion forks per test, so this stays in
 * the test); returns the file's path in buf. */
static void stderr_to_file(char *buf, size_t cap) {
  snprintf(buf, cap, "/tmp/fp4idx-log-XXXXXX");
  int fd = mkstemp(buf);
  cr_assert(fd >= 0);
  cr_assert(dup2(fd, STDERR_FILENO) == STDERR_FILENO);
  close(fd);
}

static void set_journal_stream_of(int fd) {
  struct stat st;
  cr_assert_eq(fstat(fd, &st), 0);
  char v[64];
  snprintf(v, sizeof v, "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
  setenv("JOURNAL_STREAM", v, 1);
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert(f);
  static char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

Test(log, text_form_on_a_plain_file) {
  char path[64];
  stderr_to_file(path, sizeof path);
  unsetenv("JOURNAL_STREAM");
  cr_assert_eq(fp4idx__log_set_format(FP4IDX_LOG_FORMAT_AUTO), FP4IDX_LOG_FORMAT_TEXT);
  fp4idx__log_error("boom %d", 7);
  fp4idx__log_info("two\nlines");
  char *s = slurp(path);
  unlink(path);
  regex_t re;
  cr_assert_eq(regcomp(&re,
                       "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                       "fp4idxd\\[[0-9]+\\] ERROR boom 7\n"
                       "[0-9T:.Z-]+ fp4idxd\\[[0-9]+\\] INFO  two\\\\x0alines\n$",
                       REG_EXTENDED),
               0);
  cr_assert_eq(regexec(&re, s, 0, NULL, 0), 0, "text lines: [%s]", s);
  regfree(&re);
}

Test(log, journal_prefixes_when_stderr_is_the_journal) {
  char path[64];
  stderr_to_file(path, sizeof path);
  set_journal_stream_of(STDERR_FILENO);
  cr_assert(fp4idx__log_stderr_is_journal());
  cr_assert_eq(fp4idx__log_set_format(FP4IDX_LOG_FORMAT_AUTO), FP4IDX_LOG_FORMAT_JOURNAL);
  fp4idx__log_set_level(FP4IDX_LOG_DEBUG);
  fp4idx__log_error("e %s", "x");
  fp4idx__log_warn("w");
  fp4idx__log_info("i");
  fp4idx__log_debug("d");
  char *s = slurp(path);
  unlink(path);
  cr_assert_str_eq(s, "<3>e x\n<4>w\n<6>i\n<7>d\n");
}

Test(log, journal_stream_of_another_file_is_text) {
  /* systemd's variable survives a `2>file` redirection; the inode does not. */
  char path[64], other[64] = "/tmp/fp4idx-log-other-XXXXXX";
  stderr_to_file(path, sizeof path);
  int fd = mkstemp(other);
  cr_assert(fd >= 0);
  set_journal_stream_of(fd);
  close(fd);
  unlink(other);
  cr_assert_not(fp4idx__log_stderr_is_journal());
  cr_assert_eq(fp4idx__log_set_format(FP4IDX_LOG_FORMAT_AUTO), FP4IDX_LOG_FORMAT_TEXT);
  fp4idx__log_error("plain");
  char *s = slurp(path);
  unlink(path);
  cr_assert(strstr(s, " ERROR plain\n") != NULL && s[0] != '<', "[%s]", s);
}

Test(log, malformed_journal_stream_is_not_the_journal) {
  const char *bad[] = {"", "12", "a:b", "1:", ":1", "1:2x", "1:2:3"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("JOURNAL_STREAM", bad[i], 1);
    cr_assert_not(fp4idx__log_stderr_is_journal(), "'%s'", bad[i]);
  }
}

Test(log, forced_forms_override_detection) {
  char path[64];
  stderr_to_file(path, sizeof path);
  set_journal_stream_of(STDERR_FILENO);
  cr_assert_eq(fp4idx__log_set_format(FP4IDX_LOG_FORMAT_TEXT), FP4IDX_LOG_FORMAT_TEXT);
  fp4idx__log_warn("t");
  unsetenv("JOURNAL_STREAM");
  cr_assert_eq(fp4idx__log_set_format(FP4IDX_LOG_FORMAT_JOURNAL), FP4IDX_LOG_FORMAT_JOURNAL);
  fp4idx__log_warn("j");
  char *s = slurp(path);
  unlink(path);
  cr_assert(strstr(s, " WARN  t\n") != NULL, "[%s]", s);
  cr_assert(strstr(s, "\n<4>j\n") != NULL, "[%s]", s);
}

Test(log, parse_format_and_option) {
  fp4idx_log_format_t f;
  cr_assert_eq(fp4idx__log_parse_format("journal", &f), 0);
  cr_assert_eq(f, FP4IDX_LOG_FORMAT_JOURNAL);
  cr_assert_eq(fp4idx__log_parse_format("text", &f), 0);
  cr_assert_eq(f, FP4IDX_LOG_FORMAT_TEXT);
  cr_assert_eq(fp4idx__log_parse_format("auto", &f), 0);
  cr_assert_eq(f, FP4IDX_LOG_FORMAT_AUTO);
  cr_assert_eq(fp4idx__log_parse_format("syslog", &f), -1);

  fp4idx_config_t cfg;
  FILE *sink = fopen("/dev/null", "w");
  char *ok[] = {"fp4idxd", "--log-format", "journal", NULL};
  fp4idx__config_defaults(&cfg);
  cr_assert_eq(cfg.log_format, FP4IDX_LOG_FORMAT_AUTO);
  cr_assert_eq(fp4idx__config_parse(&cfg, 3, ok, sink, sink), 0);
  cr_assert_eq(cfg.log_format, FP4IDX_LOG_FORMAT_JOURNAL);
  char *bad[] = {"fp4idxd", "--log-format", "xml", NULL};
  fp4idx__config_defaults(&cfg);
  cr_assert_eq(fp4idx__config_parse(&cfg, 3, bad, sink, sink), FP4IDX_EINVAL);
  fclose(sink);
}

/* The real daemon, with a stderr that JOURNAL_STREAM names: every line it
 * writes from start to SIGTERM carries a priority prefix. */
Test(log, daemon_writes_journal_lines) {
  char dir[] = "/tmp/fp4idx-logd-XXXXXX";
  cr_assert(mkdtemp(dir));
  char logp[128], sock[128];
  snprintf(logp, sizeof logp, "%s/stderr", dir);
  snprintf(sock, sizeof sock, "%s/d.sock", dir);
  int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert(fd >= 0);
  set_journal_stream_of(fd);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, STDERR_FILENO);
  const char *bin = getenv("FP4IDXD") ? getenv("FP4IDXD") : FP4IDXD_PATH;
  char *argv[] = {(char *)bin, "--socket", sock, "--backend", "cpu",
                  "--cache-bytes", "1M", "--threads", "1", NULL};
  pid_t pid;
  cr_assert_eq(posix_spawn(&pid, bin, &fa, NULL, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(fd);
  struct stat st;
  for (int i = 0; i < 200 && stat(sock, &st) != 0; i++) usleep(25000);
  cr_assert_eq(stat(sock, &st), 0, "daemon did not listen");
  kill(pid, SIGTERM);
  int ws;
  cr_assert_eq(waitpid(pid, &ws, 0), pid);
  cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  char *s = slurp(logp);
  unlink(logp);
  rmdir(dir);
  cr_assert(s[0] != '\0', "no log lines");
  int lines = 0;
  for (char *p = s; *p; lines++) {
    cr_assert(p[0] == '<' && p[1] >= '3' && p[1] <= '7' && p[2] == '>',
              "line without a priority prefix: [%s]", p);
    char *nl = strchr(p, '\n');
    cr_assert(nl);
    p = nl + 1;
  }
  cr_assert(strstr(s, "<6>") != NULL, "[%s]", s);
  cr_assert_geq(lines, 2);
}
