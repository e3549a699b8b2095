/* test_aof.c -- the append log: exact replay, torn tails tolerated at every
 * cut, corruption in the middle reported, generations, compaction, the
 * fsync policies, and how each moves the log's mark. */
#include "persist_util.h"

#include <time.h>

#include "aof.h"
#include "fp4idx_status.h"
#include "logmark.h"

/* What replay handed over, flattened for comparison. */
typedef struct rec_copy_s {
  fp4idx_aof_op_t op;
  uint64_t seq;
  int64_t pos, count;
  unsigned char *slots;
} rec_copy_t;

typedef struct sink_s {
  rec_copy_t recs[64];
  int n;
  int fail_at; /* 1-based record index to fail with ERANGE, 0 = never */
} sink_t;

static int sink_apply(void *ctx, const fp4idx_aof_record_t *r) {
  sink_t *s = ctx;
  if (s->fail_at && s->n + 1 == s->fail_at) return FP4IDX_ERANGE;
  cr_assert_lt(s->n, 64);
  rec_copy_t *c = &s->recs[s->n++];
  c->op = r->op;
  c->seq = r->seq;
  c->pos = r->pos;
  c->count = r->count;
  c->slots = NULL;
  if (r->op == FP4IDX_AOF_APPEND) {
    c->slots = malloc((size_t)r->count * 68);
    memcpy(c->slots, r->slots, (size_t)r->count * 68);
  }
  return FP4IDX_OK;
}

static void sink_free(sink_t *s) {
  for (int i = 0; i < s->n; i++) free(s->recs[i].slots);
  s->n = 0;
}

/* The script every test writes: 5 records. Offsets of each record start are
 * stored in offs[0..5] (offs[5] = end). */
#define N_REC 5
static unsigned char keys_a[3 * 68], keys_b[1 * 68], keys_c[70 * 68];

static void write_script(const char *path, fp4idx_fsync_t pol, int64_t offs[N_REC + 1]) {
  fill_random(keys_a, sizeof keys_a, 1);
  fill_random(keys_b, sizeof keys_b, 2);
  fill_random(keys_c, sizeof keys_c, 3);
  fp4idx_aof_t *a = NULL;
  char err[256] = "";
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, pol, 0, err, sizeof err), FP4IDX_OK, "%s",
               err);
  offs[0] = fp4idx__aof_size(a);
  cr_assert_eq(offs[0], FP4IDX_AOF_HEADER_BYTES);
  cr_assert_eq(fp4idx__aof_append(a, 7, 0, 3, keys_a), FP4IDX_OK);
  offs[1] = fp4idx__aof_size(a);
  cr_assert_eq(fp4idx__aof_append(a, 1ull << 63, 0, 1, keys_b), FP4IDX_OK);
  offs[2] = fp4idx__aof_size(a);
  cr_assert_eq(fp4idx__aof_truncate(a, 7, 2), FP4IDX_OK);
  offs[3] = fp4idx__aof_size(a);
  cr_assert_eq(fp4idx__aof_drop(a, 1ull << 63), FP4IDX_OK);
  offs[4] = fp4idx__aof_size(a);
  cr_assert_eq(fp4idx__aof_append(a, 7, 2, 70, keys_c), FP4IDX_OK);
  offs[5] = fp4idx__aof_size(a);
  fp4idx__aof_close(a);
  cr_assert_eq(file_size(path), offs[5]);
}

static void expect_script(const sink_t *s, int n) {
  cr_assert_eq(s->n, n);
  const rec_copy_t *r = s->recs;
  if (n > 0) {
    cr_assert(r[0].op == FP4IDX_AOF_APPEND && r[0].seq == 7 && r[0].pos == 0 &&
              r[0].count == 3);
    cr_assert_eq(memcmp(r[0].slots, keys_a, sizeof keys_a), 0);
  }
  if (n > 1) {
    cr_assert(r[1].op == FP4IDX_AOF_APPEND && r[1].seq == (1ull << 63) &&
              r[1].count == 1);
    cr_assert_eq(memcmp(r[1].slots, keys_b, sizeof keys_b), 0);
  }
  if (n > 2) cr_assert(r[2].op == FP4IDX_AOF_TRUNCATE && r[2].seq == 7 && r[2].pos == 2);
  if (n > 3) cr_assert(r[3].op == FP4IDX_AOF_DROP && r[3].seq == (1ull << 63));
  if (n > 4) {
    cr_assert(r[4].op == FP4IDX_AOF_APPEND && r[4].seq == 7 && r[4].pos == 2 &&
              r[4].count == 70);
    cr_assert_eq(memcmp(r[4].slots, keys_c, sizeof keys_c), 0);
  }
}

static void with_log(char *dir, size_t dcap, char *path, size_t pcap) {
  tmpdir_make(dir, dcap);
  snprintf(path, pcap, "%s/appendonly.fp4log", dir);
}

Test(aof, fsync_policy_names) {
  fp4idx_fsync_t p;
  cr_assert_eq(fp4idx__fsync_parse("always", &p), FP4IDX_OK);
  cr_assert_eq(p, FP4IDX_FSYNC_ALWAYS);
  cr_assert_eq(fp4idx__fsync_parse("everysec", &p), FP4IDX_OK);
  cr_assert_eq(p, FP4IDX_FSYNC_EVERYSEC);
  cr_assert_eq(fp4idx__fsync_parse("no", &p), FP4IDX_OK);
  cr_assert_eq(p, FP4IDX_FSYNC_NO);
  cr_assert_eq(fp4idx__fsync_parse("sometimes", &p), FP4IDX_EINVAL);
  cr_assert_str_eq(fp4idx__fsync_name(FP4IDX_FSYNC_EVERYSEC), "everysec");
}

Test(aof, replay_is_exact_for_every_policy) {
  fp4idx_fsync_t pols[] = {FP4IDX_FSYNC_ALWAYS, FP4IDX_FSYNC_EVERYSEC, FP4IDX_FSYNC_NO};
  for (int i = 0; i < 3; i++) {
    char dir[64], path[128];
    int64_t offs[N_REC + 1];
    with_log(dir, sizeof dir, path, sizeof path);
    write_script(path, pols[i], offs);
    cr_assert_eq(offs[5] - offs[4], 40 + 70 * 68);
    sink_t s = {0};
    fp4idx_aof_replay_t res;
    char err[256] = "";
    cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, err, sizeof err),
                 FP4IDX_OK, "%s", err);
    cr_assert(res.exists && !res.stale);
    cr_assert_eq(res.gen, 1);
    cr_assert_eq(res.records, 5);
    cr_assert_eq(res.appends, 3);
    cr_assert_eq(res.truncates, 1);
    cr_assert_eq(res.drops, 1);
    cr_assert_eq(res.keys, 74);
    cr_assert_eq(res.valid_bytes, offs[5]);
    cr_assert_eq(res.warning[0], 0);
    expect_script(&s, 5);
    sink_free(&s);
    tmpdir_rm(dir);
  }
}

Test(aof, missing_log_is_empty) {
  char dir[64], path[128];
  with_log(dir, sizeof dir, path, sizeof path);
  sink_t s = {0};
  fp4idx_aof_replay_t res;
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, NULL, 0), FP4IDX_OK);
  cr_assert_eq(res.exists, 0);
  cr_assert_eq(s.n, 0);
  tmpdir_rm(dir);
}

/* Cutting the file anywhere inside the last record (or inside any record)
 * keeps every complete record before the cut, warns, and the log can then be
 * continued after the last good record. */
Test(aof, truncated_tail_tolerated_at_every_cut) {
  char dir[64], path[128], good[160];
  int64_t offs[N_REC + 1];
  with_log(dir, sizeof dir, path, sizeof path);
  write_script(path, FP4IDX_FSYNC_NO, offs);
  snprintf(good, sizeof good, "%s/good", dir);
  file_copy(path, good);
  int cuts = 0;
  for (int64_t cut = offs[0]; cut < offs[5]; cut += (cut < offs[4] ? 1 : 53)) {
    int complete = 0;
    while (complete < N_REC && offs[complete + 1] <= cut) complete++;
    file_copy(good, path);
    file_truncate(path, cut);
    sink_t s = {0};
    fp4idx_aof_replay_t res;
    char err[256] = "";
    int rc = fp4idx__aof_replay(path, 1, sink_apply, &s, &res, err, sizeof err);
    cr_assert_eq(rc, FP4IDX_OK, "cut %lld: %s", (long long)cut, err);
    expect_script(&s, complete);
    cr_assert_eq(res.valid_bytes, offs[complete]);
    if (cut != offs[complete])
      cr_assert_neq(res.warning[0], 0, "cut %lld: no warning", (long long)cut);
    else
      cr_assert_eq(res.warning[0], 0);
    sink_free(&s);
    cuts++;
  }
  cr_assert_gt(cuts, 200);

  /* Continue a torn log: cut mid-record 5, reopen keeping the good part,
   * append, and replay sees records 1-4 then the new one. */
  file_copy(good, path);
  file_truncate(path, offs[4] + 100);
  sink_t s = {0};
  fp4idx_aof_replay_t res;
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, NULL, 0), FP4IDX_OK);
  sink_free(&s);
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_ALWAYS, res.valid_bytes,
                               NULL, 0),
               FP4IDX_OK);
  cr_assert_eq(fp4idx__aof_append(a, 7, 2, 70, keys_c), FP4IDX_OK);
  fp4idx__aof_close(a);
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, NULL, 0), FP4IDX_OK);
  expect_script(&s, 5);
  cr_assert_eq(res.warning[0], 0);
  sink_free(&s);
  tmpdir_rm(dir);
}

Test(aof, zero_filled_tail_tolerated) {
  char dir[64], path[128];
  int64_t offs[N_REC + 1];
  with_log(dir, sizeof dir, path, sizeof path);
  write_script(path, FP4IDX_FSYNC_NO, offs);
  file_truncate(path, offs[5] + 4096); /* the file system extended with zeros */
  sink_t s = {0};
  fp4idx_aof_replay_t res;
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, NULL, 0), FP4IDX_OK);
  expect_script(&s, 5);
  cr_assert_eq(res.valid_bytes, offs[5]);
  cr_assert_neq(res.warning[0], 0);
  sink_free(&s);
  tmpdir_rm(dir);
}

/* A damaged record with more data after it is corruption, not a torn tail:
 * any flipped byte in records 1-4 (header, payload or checksum) is reported
 * with its offset. */
Test(aof, corrupted_middle_reported) {
  char dir[64], path[128], good[160];
  int64_t offs[N_REC + 1];
  with_log(dir, sizeof dir, path, sizeof path);
  write_script(path, FP4IDX_FSYNC_NO, offs);
  snprintf(good, sizeof good, "%s/good", dir);
  file_copy(path, good);
  for (int64_t off = offs[0]; off < offs[4]; off++) {
    int rec = 0;
    while (offs[rec + 1] <= off) rec++;
    file_copy(good, path);
    file_flip(path, off, 0x10);
    sink_t s = {0};
    fp4idx_aof_replay_t res;
    char err[256] = "";
    int rc = fp4idx__aof_replay(path, 1, sink_apply, &s, &res, err, sizeof err);
    cr_assert_eq(rc, FP4IDX_ECORRUPT, "flip at %lld: rc %d", (long long)off, rc);
    char want[32];
    snprintf(want, sizeof want, "offset %lld", (long long)offs[rec]);
    cr_assert_not_null(strstr(err, want), "flip at %lld: %s", (long long)off, err);
    cr_assert_eq(s.n, rec); /* the records before it were handed over */
    sink_free(&s);
  }
  /* The file header too. */
  for (int64_t off = 0; off < offs[0]; off++) {
    file_copy(good, path);
    file_flip(path, off, 0x01);
    sink_t s = {0};
    fp4idx_aof_replay_t res;
    cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, NULL, 0),
                 FP4IDX_ECORRUPT, "header flip at %lld", (long long)off);
    cr_assert_eq(s.n, 0);
  }
  tmpdir_rm(dir);
}

/* A flipped byte in the very last record cannot be told from a torn write:
 * it is dropped with a warning (the documented limit). */
Test(aof, damaged_last_record_is_a_torn_tail) {
  char dir[64], path[128];
  int64_t offs[N_REC + 1];
  with_log(dir, sizeof dir, path, sizeof path);
  write_script(path, FP4IDX_FSYNC_NO, offs);
  file_flip(path, offs[4] + 40 + 1000, 0x80);
  sink_t s = {0};
  fp4idx_aof_replay_t res;
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, NULL, 0), FP4IDX_OK);
  expect_script(&s, 4);
  cr_assert_not_null(strstr(res.warning, "checksum"), "%s", res.warning);
  sink_free(&s);
  tmpdir_rm(dir);
}

Test(aof, generations_and_rewrite) {
  char dir[64], path[128];
  int64_t offs[N_REC + 1];
  with_log(dir, sizeof dir, path, sizeof path);
  write_script(path, FP4IDX_FSYNC_NO, offs);
  sink_t s = {0};
  fp4idx_aof_replay_t res;
  char err[256] = "";
  /* Older than the snapshot: skipped, nothing applied. */
  cr_assert_eq(fp4idx__aof_replay(path, 2, sink_apply, &s, &res, NULL, 0), FP4IDX_OK);
  cr_assert(res.stale);
  cr_assert_eq(s.n, 0);
  /* Newer than the snapshot: refused. */
  cr_assert_eq(fp4idx__aof_replay(path, 0, sink_apply, &s, &res, err, sizeof err),
               FP4IDX_ECORRUPT);
  cr_assert_not_null(strstr(err, "newer"), "%s", err);
  cr_assert_eq(s.n, 0);

  /* Compaction: a fresh log of generation 2, then more records. */
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_EVERYSEC, offs[5], NULL, 0),
               FP4IDX_OK);
  cr_assert_eq(fp4idx__aof_rewrite(a, 2), FP4IDX_OK);
  cr_assert_eq(fp4idx__aof_gen(a), 2);
  cr_assert_eq(fp4idx__aof_size(a), FP4IDX_AOF_HEADER_BYTES);
  cr_assert_eq(fp4idx__aof_drop(a, 9), FP4IDX_OK);
  fp4idx__aof_close(a);
  cr_assert_eq(fp4idx__aof_replay(path, 2, sink_apply, &s, &res, NULL, 0), FP4IDX_OK);
  cr_assert_eq(res.gen, 2);
  cr_assert_eq(s.n, 1);
  cr_assert(s.recs[0].op == FP4IDX_AOF_DROP && s.recs[0].seq == 9);
  sink_free(&s);
  char tmp[160];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  cr_assert_neq(access(tmp, F_OK), 0);
  tmpdir_rm(dir);
}

Test(aof, apply_error_stops_replay) {
  char dir[64], path[128];
  int64_t offs[N_REC + 1];
  with_log(dir, sizeof dir, path, sizeof path);
  write_script(path, FP4IDX_FSYNC_NO, offs);
  sink_t s = {0};
  s.fail_at = 3;
  fp4idx_aof_replay_t res;
  char err[256] = "";
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, err, sizeof err),
               FP4IDX_ERANGE);
  cr_assert_eq(s.n, 2);
  char want[32];
  snprintf(want, sizeof want, "offset %lld", (long long)offs[2]);
  cr_assert_not_null(strstr(err, want), "%s", err);
  sink_free(&s);
  tmpdir_rm(dir);
}

Test(aof, bad_arguments) {
  char dir[64], path[128];
  with_log(dir, sizeof dir, path, sizeof path);
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_NO, 5, NULL, 0),
               FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_NO, 100, NULL, 0),
               FP4IDX_EIO); /* keep_bytes of a log that does not exist */
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_NO, 0, NULL, 0), FP4IDX_OK);
  unsigned char k[68] = {0};
  cr_assert_eq(fp4idx__aof_append(a, 1, 0, 0, k), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__aof_append(a, 1, -1, 1, k), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__aof_truncate(a, 1, -1), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__aof_size(a), FP4IDX_AOF_HEADER_BYTES);
  fp4idx__aof_close(a);
  /* A file that is not a log. */
  FILE *f = fopen(path, "w");
  fputs("this is not an append log, just text of some length", f);
  fclose(f);
  sink_t s = {0};
  fp4idx_aof_replay_t res;
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, NULL, 0),
               FP4IDX_ECORRUPT);
  tmpdir_rm(dir);
}

/* A write that fails (here: the file size limit, EFBIG) returns EIO and cuts
 * the partial record off, so the log stays replayable and later records
 * land after the last good one. Run in a child: it lowers RLIMIT_FSIZE. */
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

Test(aof, failed_write_leaves_a_replayable_log) {
  char dir[64], path[128];
  with_log(dir, sizeof dir, path, sizeof path);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    fp4idx_aof_t *a = NULL;
    unsigned char small[2 * 68], big[1000 * 68];
    fill_random(small, sizeof small, 4);
    fill_random(big, sizeof big, 5);
    if (fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_ALWAYS, 0, NULL, 0)) _exit(10);
    if (fp4idx__aof_append(a, 1, 0, 2, small)) _exit(11);
    struct rlimit rl = {.rlim_cur = 20000, .rlim_max = RLIM_INFINITY};
    if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(12);
    int64_t before = fp4idx__aof_size(a);
    /* 68 KB do not fit under 20000 bytes: a partial write, then EFBIG. */
    if (fp4idx__aof_append(a, 1, 2, 1000, big) != FP4IDX_EIO) _exit(13);
    if (fp4idx__aof_size(a) != before) _exit(14);
    struct stat st;
    if (stat(path, &st) || st.st_size != before) _exit(15);
    if (fp4idx__aof_append(a, 1, 2, 2, small)) _exit(16);
    fp4idx__aof_close(a);
    _exit(0);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child step %d failed",
            WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  sink_t s = {0};
  fp4idx_aof_replay_t res;
  char err[256] = "";
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, err, sizeof err),
               FP4IDX_OK, "%s", err);
  cr_assert_eq(s.n, 2);
  cr_assert(s.recs[0].pos == 0 && s.recs[0].count == 2);
  cr_assert(s.recs[1].pos == 2 && s.recs[1].count == 2);
  cr_assert_eq(res.warning[0], 0);
  sink_free(&s);
  tmpdir_rm(dir);
}

/* The fork record: dst and length come back as written, with no payload;
 * a fork record cut anywhere is a torn tail. */
Test(aof, fork_record_round_trip_and_torn_tail) {
  char dir[64], path[128];
  with_log(dir, sizeof dir, path, sizeof path);
  fill_random(keys_a, sizeof keys_a, 1);
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_NO, 0, NULL, 0), FP4IDX_OK);
  cr_assert_eq(fp4idx__aof_append(a, 7, 0, 3, keys_a), FP4IDX_OK);
  int64_t before = fp4idx__aof_size(a);
  cr_assert_eq(fp4idx__aof_fork(a, 7, UINT64_MAX, 2), FP4IDX_OK);
  int64_t after = fp4idx__aof_size(a);
  cr_assert_eq(after - before, FP4IDX_AOF_RECORD_OVERHEAD, "no payload");
  cr_assert_eq(fp4idx__aof_fork(a, 7, 8, -1), FP4IDX_EINVAL);
  cr_assert_eq(fp4idx__aof_truncate(a, 7, 1), FP4IDX_OK);
  fp4idx__aof_close(a);
  sink_t s = {0};
  fp4idx_aof_replay_t res;
  char err[256] = "";
  cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, err, sizeof err), FP4IDX_OK,
               "%s", err);
  cr_assert_eq(res.records, 3);
  cr_assert_eq(res.forks, 1);
  cr_assert_eq(res.appends, 1);
  cr_assert_eq(res.truncates, 1);
  cr_assert(s.recs[1].op == FP4IDX_AOF_FORK && s.recs[1].seq == UINT64_MAX &&
            s.recs[1].pos == 2 && s.recs[1].count == 0);
  cr_assert(s.recs[2].op == FP4IDX_AOF_TRUNCATE && s.recs[2].pos == 1);
  sink_free(&s);
  char good[160];
  snprintf(good, sizeof good, "%s/good", dir);
  file_copy(path, good);
  for (int64_t cut = before + 1; cut < after; cut++) {
    file_copy(good, path);
    file_truncate(path, cut);
    cr_assert_eq(fp4idx__aof_replay(path, 1, sink_apply, &s, &res, err, sizeof err), FP4IDX_OK,
                 "cut %lld: %s", (long long)cut, err);
    cr_assert_eq(res.records, 1, "cut %lld", (long long)cut);
    cr_assert_eq(res.valid_bytes, before);
    cr_assert_neq(res.warning[0], 0);
    sink_free(&s);
  }
  tmpdir_rm(dir);
}

/* The source of a fork record as the replay hands it over. */
static int src_apply(void *ctx, const fp4idx_aof_record_t *r) {
  if (r->op == FP4IDX_AOF_FORK) *(uint64_t *)ctx = r->src;
  return FP4IDX_OK;
}

Test(aof, fork_record_carries_the_source) {
  char dir[64], path[128];
  with_log(dir, sizeof dir, path, sizeof path);
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_NO, 0, NULL, 0), FP4IDX_OK);
  cr_assert_eq(fp4idx__aof_fork(a, 1ull << 63 | 5, 9, 0), FP4IDX_OK);
  fp4idx__aof_close(a);
  uint64_t src = 0;
  fp4idx_aof_replay_t res;
  cr_assert_eq(fp4idx__aof_replay(path, 1, src_apply, &src, &res, NULL, 0), FP4IDX_OK);
  cr_assert_eq(src, 1ull << 63 | 5);
  tmpdir_rm(dir);
}

/* ---- the mark (logmark.h) under each policy ------------------------------- */

/* The length the mark beside path holds; -1 when there is no valid mark. */
static int64_t mark_of(const char *path, uint64_t *gen) {
  char mark[200];
  uint64_t g = 0, bytes = 0;
  cr_assert_eq(fp4idx__logmark_path(path, mark, sizeof mark), FP4IDX_OK);
  if (fp4idx__logmark_read(mark, &g, &bytes, NULL, 0) != FP4IDX_OK) return -1;
  if (gen) *gen = g;
  return (int64_t)bytes;
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

Test(aof, mark_covers_every_record_under_always) {
  char dir[64], path[128];
  unsigned char k[4 * 68];
  fill_random(k, sizeof k, 9);
  with_log(dir, sizeof dir, path, sizeof path);
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_ALWAYS, 0, NULL, 0), FP4IDX_OK);
  cr_assert_eq(mark_of(path, NULL), FP4IDX_AOF_HEADER_BYTES);
  /* A burst far faster than a second: each record is marked as it returns. */
  for (int i = 0; i < 20; i++) {
    cr_assert_eq(fp4idx__aof_append(a, 1, 4 * i, 4, k), FP4IDX_OK);
    cr_assert_eq(mark_of(path, NULL), fp4idx__aof_size(a), "after record %d", i);
  }
  cr_assert_eq(fp4idx__aof_truncate(a, 1, 3), FP4IDX_OK);
  cr_assert_eq(mark_of(path, NULL), fp4idx__aof_size(a));
  /* Compaction: generation 2, marked at its header; then its records. */
  uint64_t gen = 0;
  cr_assert_eq(fp4idx__aof_rewrite(a, 2), FP4IDX_OK);
  cr_assert_eq(mark_of(path, &gen), FP4IDX_AOF_HEADER_BYTES);
  cr_assert_eq(gen, 2);
  cr_assert_eq(fp4idx__aof_drop(a, 1), FP4IDX_OK);
  cr_assert_eq(mark_of(path, &gen), fp4idx__aof_size(a));
  cr_assert_eq(gen, 2);
  fp4idx__aof_close(a);
  tmpdir_rm(dir);
}

Test(aof, mark_catches_up_within_a_second_when_idle_under_everysec) {
  char dir[64], path[128];
  unsigned char k[4 * 68];
  fill_random(k, sizeof k, 10);
  with_log(dir, sizeof dir, path, sizeof path);
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_EVERYSEC, 0, NULL, 0), FP4IDX_OK);
  for (int i = 0; i < 20; i++) cr_assert_eq(fp4idx__aof_append(a, 1, 4 * i, 4, k), FP4IDX_OK);
  /* Nothing more is written: the flusher's next wake syncs and marks the
   * whole burst. Polled (a condition), 5 s at most. */
  double t0 = mono_s(), waited = -1;
  while (mono_s() - t0 < 5.0) {
    if (mark_of(path, NULL) == fp4idx__aof_size(a)) {
      waited = mono_s() - t0;
      break;
    }
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  cr_log_info("everysec: the mark caught up %.3f s after the burst", waited);
  cr_assert_geq(waited, 0, "the mark holds %lld, the log %lld", (long long)mark_of(path, NULL),
                (long long)fp4idx__aof_size(a));
  cr_assert_lt(waited, 2.5);
  fp4idx__aof_close(a);
  tmpdir_rm(dir);
}

/* `no` never syncs the log, and the mark claims only synced lengths: it
 * moves at open, sync, rewrite and close, not with the records. */
Test(aof, mark_moves_only_on_sync_under_no) {
  char dir[64], path[128];
  unsigned char k[4 * 68];
  fill_random(k, sizeof k, 11);
  with_log(dir, sizeof dir, path, sizeof path);
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_NO, 0, NULL, 0), FP4IDX_OK);
  for (int i = 0; i < 5; i++) cr_assert_eq(fp4idx__aof_append(a, 1, 4 * i, 4, k), FP4IDX_OK);
  cr_assert_eq(mark_of(path, NULL), FP4IDX_AOF_HEADER_BYTES);
  cr_assert_eq(fp4idx__aof_sync(a), FP4IDX_OK);
  cr_assert_eq(mark_of(path, NULL), fp4idx__aof_size(a));
  cr_assert_eq(fp4idx__aof_append(a, 1, 20, 4, k), FP4IDX_OK);
  int64_t end = fp4idx__aof_size(a);
  cr_assert_lt(mark_of(path, NULL), end);
  fp4idx__aof_close(a);
  cr_assert_eq(mark_of(path, NULL), end);
  tmpdir_rm(dir);
}

/* A mark file removed while the log is open is written again by the next
 * save (rewrite), which reopens it by its name. */
Test(aof, a_removed_mark_is_recreated_by_the_next_rewrite) {
  char dir[64], path[128], mark[200];
  unsigned char k[4 * 68];
  fill_random(k, sizeof k, 12);
  with_log(dir, sizeof dir, path, sizeof path);
  cr_assert_eq(fp4idx__logmark_path(path, mark, sizeof mark), FP4IDX_OK);
  fp4idx_aof_t *a = NULL;
  cr_assert_eq(fp4idx__aof_open(&a, path, 1, FP4IDX_FSYNC_ALWAYS, 0, NULL, 0), FP4IDX_OK);
  cr_assert_eq(unlink(mark), 0);
  cr_assert_eq(fp4idx__aof_append(a, 1, 0, 4, k), FP4IDX_OK);
  cr_assert_eq(mark_of(path, NULL), -1);
  cr_assert_eq(fp4idx__aof_rewrite(a, 2), FP4IDX_OK);
  cr_assert_eq(fp4idx__aof_append(a, 1, 4, 4, k), FP4IDX_OK);
  cr_assert_eq(mark_of(path, NULL), fp4idx__aof_size(a));
  fp4idx__aof_close(a);
  tmpdir_rm(dir);
}
