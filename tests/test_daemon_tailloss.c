/* test_daemon_tailloss.c -- tail loss is detected, not silent (the log's
 * mark, persist/logmark.h): a log cut at a record boundary, a deleted log
 * whose mark says it had records, a deleted log that a snapshot says
 * continues it, a deleted snapshot whose log generation the mark knows --
 * each makes the real daemon refuse to start (exit 1, ECORRUPT, a message
 * naming what is missing), and --allow-data-loss starts it anyway with an
 * ERROR line. The mark covers every acknowledged write under --fsync always
 * (a burst, then kill -9, then the last record cut off is refused), and
 * under everysec an idle daemon's mark catches up with the log within the
 * flusher's second. */
#include "persist_util.h"

#include <signal.h>
#include <time.h>

#include "daemon_harness.h"
#include "fp4idx_status.h"
#include "logmark.h"

#define KEYS 8
#define RECS 10
#define BURST 20 /* records of a burst (more than RECS) */
#define REC_BYTES (40 + KEYS * 68)

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Removes a collected daemon's folder (no log dump: its exit was expected). */
static void daemon_forget(fp4idx_test_daemon_t *d) {
  if (d->pid > 0 && !d->collected) fp4idx_test_daemon_stop(d);
  unlink(d->sock);
  unlink(d->log);
  rmdir(d->dir);
}

static void paths(const char *data, char *logf, char *snap, size_t cap) {
  snprintf(logf, cap, "%s/appendonly.fp4log", data);
  snprintf(snap, cap, "%s/snapshot.fp4s", data);
}

static void keys_of(unsigned char *k, int rec) {
  fill_random(k, KEYS * 68, (uint64_t)rec + 100);
  for (int i = 0; i < KEYS; i++) memset(k + i * 68 + 64, 120 + rec % 8, 4);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The length the mark of data's log holds (0 when there is no valid mark). */
static uint64_t mark_bytes(const char *data) {
  char logf[128], mark[160];
  uint64_t gen = 0, bytes = 0;
  snprintf(logf, sizeof logf, "%s/appendonly.fp4log", data);
  cr_assert_eq(fp4idx__logmark_path(logf, mark, sizeof mark), FP4IDX_OK);
  return fp4idx__logmark_read(mark, &gen, &bytes, NULL, 0) == FP4IDX_OK ? bytes : 0;
}

/* Polls the mark until it holds `bytes` (up to ms); returns the seconds it
 * took, or -1 when it never got there. A condition, not a fixed sleep. */
static double wait_mark(const char *data, uint64_t bytes, int ms) {
  double t0 = now_s();
  for (;;) {
    if (mark_bytes(data) == bytes) return now_s() - t0;
    if (now_s() - t0 > ms / 1000.0) return -1;
    sleep_ms(10);
  }
}

/* Starts the daemon on data with --fsync policy and appends n records of
 * KEYS keys to sequence 1 back to back, each acknowledged before the next;
 * leaves it running (d) and returns the burst's seconds. */
static double burst(fp4idx_test_daemon_t *d, const char *data, const char *policy, int n) {
  const char *args[] = {"--data-dir", data, "--fsync", policy, NULL};
  cr_assert_eq(fp4idx_test_daemon_start(d, args), 0);
  int fd = fp4idx_test_connect(d->sock);
  cr_assert_geq(fd, 0);
  unsigned char k[KEYS * 68];
  double t0 = now_s();
  for (int r = 0; r < n; r++) {
    keys_of(k, r);
    cr_assert_eq(fp4idx_test_append(fd, 1, FP4IDX_WIRE_U8, KEYS, k, NULL, NULL), 0);
  }
  double dt = now_s() - t0;
  close(fd);
  return dt;
}

static void kill9(fp4idx_test_daemon_t *d) {
  cr_assert_eq(fp4idx_test_daemon_kill(d, SIGKILL), 0);
  cr_assert_eq(fp4idx_test_daemon_wait(d, 5000), 128 + SIGKILL);
}

/* Starts the daemon on data (everysec), appends RECS records of KEYS keys to
 * sequence 1, waits until the everysec thread has marked them all, then
 * kill -9 (no snapshot: the log holds them). */
static void fill_log(const char *data) {
  fp4idx_test_daemon_t d;
  burst(&d, data, "everysec", RECS);
  cr_assert_geq(wait_mark(data, 32 + RECS * REC_BYTES, 10000), 0, "the mark caught up");
  kill9(&d);
  daemon_forget(&d);
}

/* Runs the daemon on data with extra args until it exits (or 1 s after it
 * listens: then it is stopped). Returns its exit code (0 when it served) and
 * its log in log[cap]; *keys gets sequence 1's length when it served. */
static int run(const char *data, const char *extra, char *log, size_t cap, uint64_t *keys) {
  fp4idx_test_daemon_t d;
  memset(&d, 0, sizeof d);
  const char *args[] = {"--backend", "cpu", "--cache-bytes", "8M", "--data-dir", data,
                        extra, NULL};
  cr_assert_eq(fp4idx_test_daemon_prepare(&d), 0);
  cr_assert_eq(fp4idx_test_daemon_spawn(&d, d.sock, args), 0);
  int code = -1, fd = -1;
  for (int waited = 0; waited < 10000 && fd < 0; waited += 10) {
    fd = fp4idx_test_connect(d.sock);
    if (fd < 0 && !fp4idx_test_daemon_alive(&d)) break;
    if (fd < 0) sleep_ms(10);
  }
  if (fd >= 0) {
    unsigned char one[68];
    uint64_t got = 0;
    if (keys) {
      *keys = 0;
      /* sequence 1's length: the largest n with read(1, n-1, 1) fine */
      for (uint64_t n = BURST * KEYS; n > 0; n--)
        if (fp4idx_test_read(fd, 1, n - 1, 1, one, &got) == 0) {
          *keys = n;
          break;
        }
    }
    close(fd);
    fp4idx_test_daemon_kill(&d, SIGTERM);
  }
  code = fp4idx_test_daemon_wait(&d, 10000);
  FILE *f = fopen(d.log, "r");
  size_t n = f ? fread(log, 1, cap - 1, f) : 0;
  log[n] = 0;
  if (f) fclose(f);
  daemon_forget(&d);
  return code;
}

Test(daemon_tailloss, a_log_cut_at_a_record_boundary_is_refused) {
  char data[64], logf[128], snap[128], log[32768];
  uint64_t keys = 0;
  tmpdir_make(data, sizeof data);
  paths(data, logf, snap, sizeof logf);
  fill_log(data);
  cr_assert_eq(file_size(logf), 32 + RECS * REC_BYTES);
  /* Cut after record 5, exactly at its end: every record left is whole. */
  off_t cut = 32 + 5 * REC_BYTES;
  file_truncate(logf, cut);
  cr_assert_eq(run(data, NULL, log, sizeof log, NULL), 1, "refused:\n%s", log);
  char want[160];
  snprintf(want, sizeof want, "ends at byte %lld (5 records replayed)", (long long)cut);
  cr_assert_not_null(strstr(log, want), "names the cut:\n%s", log);
  cr_assert_not_null(strstr(log, "appendonly.fp4log"), "names the file:\n%s", log);
  cr_assert_not_null(strstr(log, "ECORRUPT"), "%s", log);
  cr_assert_eq(file_size(logf), cut, "the refused start changed nothing");

  /* Anyway: starts with what is left, says so loudly. */
  cr_assert_eq(run(data, "--allow-data-loss", log, sizeof log, &keys), 0, "%s", log);
  cr_assert_not_null(strstr(log, "ERROR DATA LOSS"), "%s", log);
  cr_assert_eq(keys, 5 * KEYS);
  /* ... and from then on that is the state: a plain start is fine. */
  cr_assert_eq(run(data, NULL, log, sizeof log, &keys), 0, "%s", log);
  cr_assert_eq(keys, 5 * KEYS);
  tmpdir_rm(data);
}

Test(daemon_tailloss, a_deleted_log_without_snapshot_is_refused) {
  char data[64], logf[128], snap[128], log[32768];
  tmpdir_make(data, sizeof data);
  paths(data, logf, snap, sizeof logf);
  fill_log(data);
  cr_assert_eq(unlink(logf), 0);
  cr_assert_eq(run(data, NULL, log, sizeof log, NULL), 1, "%s", log);
  cr_assert_not_null(strstr(log, "is missing; it had reached"), "%s", log);
  uint64_t keys = 1;
  cr_assert_eq(run(data, "--allow-data-loss", log, sizeof log, &keys), 0, "%s", log);
  cr_assert_not_null(strstr(log, "DATA LOSS"), "%s", log);
  cr_assert_eq(keys, 0);
  tmpdir_rm(data);
}

Test(daemon_tailloss, a_deleted_log_or_snapshot_with_the_other_kept_is_refused) {
  char data[64], logf[128], snap[128], log[32768];
  tmpdir_make(data, sizeof data);
  paths(data, logf, snap, sizeof logf);
  fill_log(data);
  /* A clean start and stop: the snapshot holds everything (generation 2)
   * and a fresh log of generation 2 continues it. */
  uint64_t keys = 0;
  cr_assert_eq(run(data, NULL, log, sizeof log, &keys), 0, "%s", log);
  cr_assert_eq(keys, RECS * KEYS);
  file_copy(logf, "/tmp/fp4idx-tailloss-log.keep");

  cr_assert_eq(unlink(logf), 0);
  cr_assert_eq(run(data, NULL, log, sizeof log, NULL), 1, "%s", log);
  cr_assert_not_null(strstr(log, "is continued by append log generation 2, but the log"),
                     "%s", log);

  /* The log back, the snapshot gone: the mark knows generation 2 existed. */
  file_copy("/tmp/fp4idx-tailloss-log.keep", logf);
  unlink("/tmp/fp4idx-tailloss-log.keep");
  cr_assert_eq(unlink(snap), 0);
  cr_assert_eq(run(data, NULL, log, sizeof log, NULL), 1, "%s", log);
  cr_assert_not_null(strstr(log, "snapshot"), "%s", log);
  tmpdir_rm(data);
}

Test(daemon_tailloss, an_intact_data_dir_starts_after_kill_and_after_stop) {
  char data[64], logf[128], snap[128], log[32768];
  uint64_t keys = 0;
  tmpdir_make(data, sizeof data);
  paths(data, logf, snap, sizeof logf);
  fill_log(data);
  cr_assert_eq(run(data, NULL, log, sizeof log, &keys), 0, "after kill -9:\n%s", log);
  cr_assert_eq(keys, RECS * KEYS);
  cr_assert_eq(run(data, NULL, log, sizeof log, &keys), 0, "after a stop:\n%s", log);
  cr_assert_eq(keys, RECS * KEYS);
  cr_assert_null(strstr(log, "DATA LOSS"), "%s", log);
  tmpdir_rm(data);
}

/* Under always every acknowledged record is on disk before its reply, and so
 * is the mark that covers it: a burst far faster than a second, kill -9 right
 * after the last reply, and cutting off only the last record is refused. */
Test(daemon_tailloss, a_burst_under_fsync_always_then_kill_and_a_cut_log_is_refused) {
  char data[64], logf[128], snap[128], log[32768], want[160];
  uint64_t keys = 0;
  tmpdir_make(data, sizeof data);
  paths(data, logf, snap, sizeof logf);
  fp4idx_test_daemon_t d;
  double dt = burst(&d, data, "always", BURST);
  kill9(&d);
  daemon_forget(&d);
  cr_log_info("always: %d appends in %.3f s, then kill -9", BURST, dt);
  off_t full = 32 + BURST * REC_BYTES;
  cr_assert_eq(file_size(logf), full);

  /* The last acknowledged record cut off, at its boundary. */
  off_t cut = full - REC_BYTES;
  file_truncate(logf, cut);
  cr_assert_eq(run(data, NULL, log, sizeof log, NULL), 1, "refused:\n%s", log);
  snprintf(want, sizeof want, "ends at byte %lld (%d records replayed)", (long long)cut,
           BURST - 1);
  cr_assert_not_null(strstr(log, want), "names the cut:\n%s", log);
  cr_assert_not_null(strstr(log, "ERROR"), "%s", log);
  cr_assert_not_null(strstr(log, "ECORRUPT"), "%s", log);
  cr_assert_eq(file_size(logf), cut, "the refused start changed nothing");
  cr_assert_eq(mark_bytes(data), (uint64_t)full, "the mark covers the last acknowledged record");

  /* Half of it gone: refused as well. */
  cut = 32 + (BURST / 2) * REC_BYTES;
  file_truncate(logf, cut);
  cr_assert_eq(run(data, NULL, log, sizeof log, NULL), 1, "refused:\n%s", log);
  snprintf(want, sizeof want, "ends at byte %lld (%d records replayed)", (long long)cut,
           BURST / 2);
  cr_assert_not_null(strstr(log, want), "names the cut:\n%s", log);

  /* Anyway: starts with what is left, says so loudly; then that is the state. */
  cr_assert_eq(run(data, "--allow-data-loss", log, sizeof log, &keys), 0, "%s", log);
  cr_assert_not_null(strstr(log, "ERROR DATA LOSS"), "%s", log);
  cr_assert_eq(keys, (BURST / 2) * KEYS);
  cr_assert_eq(run(data, NULL, log, sizeof log, &keys), 0, "%s", log);
  cr_assert_eq(keys, (BURST / 2) * KEYS);
  tmpdir_rm(data);
}

Test(daemon_tailloss, a_burst_under_fsync_always_then_kill_and_a_deleted_log_is_refused) {
  char data[64], logf[128], snap[128], log[32768];
  tmpdir_make(data, sizeof data);
  paths(data, logf, snap, sizeof logf);
  fp4idx_test_daemon_t d;
  double dt = burst(&d, data, "always", BURST);
  kill9(&d);
  daemon_forget(&d);
  cr_log_info("always: %d appends in %.3f s, then kill -9", BURST, dt);
  cr_assert_eq(unlink(logf), 0);
  cr_assert_eq(run(data, NULL, log, sizeof log, NULL), 1, "refused:\n%s", log);
  cr_assert_not_null(strstr(log, "is missing; it had reached"), "%s", log);
  cr_assert_not_null(strstr(log, "ECORRUPT"), "%s", log);
  uint64_t keys = 1;
  cr_assert_eq(run(data, "--allow-data-loss", log, sizeof log, &keys), 0, "%s", log);
  cr_assert_not_null(strstr(log, "ERROR DATA LOSS"), "%s", log);
  cr_assert_eq(keys, 0);
  tmpdir_rm(data);
}

/* Under everysec the mark trails the log by up to the flusher's second while
 * records arrive, and catches up once they stop: an idle daemon after a
 * burst has its whole log marked, so the same damage is refused. */
Test(daemon_tailloss, an_idle_daemon_under_everysec_catches_its_mark_up_after_a_burst) {
  char data[64], logf[128], snap[128], log[32768];
  tmpdir_make(data, sizeof data);
  paths(data, logf, snap, sizeof logf);
  fp4idx_test_daemon_t d;
  double dt = burst(&d, data, "everysec", BURST);
  off_t full = 32 + BURST * REC_BYTES;
  double caught = wait_mark(data, (uint64_t)full, 5000);
  cr_log_info("everysec: %d appends in %.3f s, mark caught up %.3f s later", BURST, dt,
              caught);
  cr_assert_geq(caught, 0, "the mark reached the log's end (%lld) within 5 s; it holds %llu",
                (long long)full, (unsigned long long)mark_bytes(data));
  kill9(&d);
  daemon_forget(&d);
  cr_assert_eq(file_size(logf), full);
  file_truncate(logf, full - REC_BYTES);
  cr_assert_eq(run(data, NULL, log, sizeof log, NULL), 1, "refused:\n%s", log);
  cr_assert_not_null(strstr(log, "ECORRUPT"), "%s", log);
  tmpdir_rm(data);
}
