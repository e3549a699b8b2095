/* aof.h -- the append log: every acknowledged append, truncate, drop and fork,
 * written before the reply, replayed on start after the snapshot.
 *
 * Appends are logged as the packed 68-byte slots that were stored (64 payload
 * bytes then 4 scale bytes per key, the wire's fp4 layout), never as the
 * caller's bf16/f32 keys: replay then stores exactly the bytes that were
 * acknowledged, whatever rounding mode or backend produced them.
 *
 * File layout (little-endian):
 *   header, 32 bytes: "FP4IDXLG", u32 version (1), u32 header bytes (32),
 *     u64 generation, u32 zero, u32 CRC-32C of bytes 0..27
 *   records, each 40 + 68 * count bytes:
 *      0 u32 magic 0x52344650 ("PF4R")   4 u32 op (1 append, 2 truncate, 3 drop,
 *                                                  4 fork)
 *      8 u64 seq (fork: the new sequence) 16 u64 pos (append: first position;
 *                                            truncate, fork: new length; drop: 0)
 *     24 u64 count (append: keys; fork: the source sequence; else 0)
 *     32 u32 CRC-32C of bytes 0..31 (so a damaged length is never trusted)
 *     36 count * 68 bytes of slots (append only)
 *     then u32 CRC-32C of the whole record before it
 *
 * Generations tie the log to the snapshot: a snapshot records generation G,
 * the log that continues it has generation G. Saving a snapshot writes it with
 * G + 1 and then starts a fresh log of G + 1 (compaction). A log older than
 * the snapshot (crash between the two steps) is already contained in it and
 * is skipped; a log newer than the snapshot means the snapshot was lost and
 * is refused.
 *
 * Fsync policy, the Redis trade-off: always (fdatasync before the reply:
 * nothing acknowledged is ever lost, slowest), everysec (a thread syncs once
 * a second: at most about one second of acknowledged writes lost on a power
 * cut; a process crash loses nothing since the data is in the kernel), no
 * (the kernel decides).
 *
 * Checkpoints (logmark.h, "<log>.mark"): after an fdatasync covered the log
 * up to some length, that length and the generation are written to the mark
 * (pwrite + fdatasync), so a start can tell a log that lost acknowledged
 * records (cut, even at a record boundary, or deleted) from one that never
 * had them. The mark never claims more than a sync covered, so a power cut
 * can leave it behind the log but never ahead of it. How far it reaches:
 *   always    with every record, before the reply: it covers every
 *             acknowledged write (the price: a second fdatasync, of the
 *             40-byte mark, per record -- measured 250-375 us per 8-key
 *             append without it, 505-550 us with it, on an ext4 virtual
 *             disk);
 *   everysec  by the flusher, once a second, records or not: it trails the
 *             acknowledged writes by about a second while they arrive and
 *             catches up within a second once they stop (idle included);
 *   no        only at open, rewrite (save), sync and close: the log is never
 *             synced, so records since the last of those are not covered.
 *
 * Threading: one thread writes (the daemon's worker); the everysec thread
 * only calls fdatasync and writes the mark.
 */
#ifndef FP4IDX_AOF_H
#define FP4IDX_AOF_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { FP4IDX_AOF_HEADER_BYTES = 32, FP4IDX_AOF_RECORD_OVERHEAD = 40 };

typedef enum fp4idx_fsync_e {
  FP4IDX_FSYNC_ALWAYS = 0,
  FP4IDX_FSYNC_EVERYSEC = 1,
  FP4IDX_FSYNC_NO = 2
} fp4idx_fsync_t;

typedef enum fp4idx_aof_op_e {
  FP4IDX_AOF_APPEND = 1,
  FP4IDX_AOF_TRUNCATE = 2,
  FP4IDX_AOF_DROP = 3,
  FP4IDX_AOF_FORK = 4 /* a log with forks stops a daemon that predates them
                         (an invalid record): it refuses to start */
} fp4idx_aof_op_t;

/* One record as replay hands it over. */
typedef struct fp4idx_aof_record_s {
  fp4idx_aof_op_t op;
  uint64_t seq;
  int64_t pos;          /* append: first position; truncate, fork: new length */
  int64_t count;        /* append: keys */
  uint64_t src;         /* fork: the source sequence (seq is the new one) */
  const uint8_t *slots; /* append: [count, 68] packed slots (valid in the call) */
  int64_t offset;       /* byte offset of the record in the file */
} fp4idx_aof_record_t;

/* Applies one record; returns FP4IDX_OK or a negative status, which stops
 * the replay. */
typedef int (*fp4idx_aof_apply_fn)(void *ctx, const fp4idx_aof_record_t *rec);

typedef struct fp4idx_aof_replay_s {
  int exists;           /* 0: no log file (nothing replayed, not an error) */
  int stale;            /* 1: log generation < expected: skipped */
  uint64_t gen;         /* the log's generation */
  int64_t records, appends, truncates, drops, forks, keys;
  int64_t valid_bytes;  /* end of the last good record */
  int64_t file_bytes;
  char warning[256];    /* non-empty when a torn tail was dropped */
} fp4idx_aof_replay_t;

typedef struct fp4idx_aof_s fp4idx_aof_t;

/* Parses "always", "everysec" or "no". Returns FP4IDX_OK or FP4IDX_EINVAL. */
int fp4idx__fsync_parse(const char *s, fp4idx_fsync_t *out);
/* Returns the policy's name ("always", ...). */
const char *fp4idx__fsync_name(fp4idx_fsync_t p);

/* Reads the log at path and calls apply for each record in order.
 * A log whose generation is below expect_gen is skipped (res->stale = 1).
 * A truncated or torn tail (an incomplete last record, or a last record whose
 * checksum fails, or zero bytes where a record should start) ends the replay
 * successfully at the last complete record: res->valid_bytes marks it and
 * res->warning says what was dropped; open the log for writing with
 * keep_bytes = res->valid_bytes to cut it off.
 * Returns FP4IDX_OK (also when the file does not exist: res->exists = 0);
 *   FP4IDX_ECORRUPT for a bad header, a generation above expect_gen, or a
 *   damaged record followed by more data (the message gives the offset);
 *   FP4IDX_EVERSION; FP4IDX_EIO; or apply's error (message gives the record).
 * Records applied before an error stay applied: the caller discards its state
 * (the daemon refuses to start). */
int fp4idx__aof_replay(const char *path, uint64_t expect_gen,
                      fp4idx_aof_apply_fn apply, void *ctx,
                      fp4idx_aof_replay_t *res, char *err, size_t errlen);

/* Opens the log for appending.
 * keep_bytes > 0: the existing log (generation gen, as replayed) is cut to
 *   keep_bytes and continued. keep_bytes == 0: a fresh log of generation gen
 *   replaces whatever is at path (atomically: temp file, fsync, rename).
 * Starts the everysec thread when policy says so.
 * Returns FP4IDX_OK, FP4IDX_EINVAL, FP4IDX_ENOMEM, FP4IDX_EIO (message). */
int fp4idx__aof_open(fp4idx_aof_t **out, const char *path, uint64_t gen,
                    fp4idx_fsync_t policy, int64_t keep_bytes, char *err,
                    size_t errlen);

/* Log records. Each is written with one writev and, under `always`,
 * fdatasync'ed before returning. On failure the log is cut back to where it
 * was (so it stays replayable) and FP4IDX_EIO is returned: the caller must
 * then undo the operation and fail the request.
 * append: n >= 1 packed slots [n,68] stored at positions pos..pos+n-1. */
int fp4idx__aof_append(fp4idx_aof_t *a, uint64_t seq, int64_t pos, int64_t n,
                      const uint8_t *slots);
int fp4idx__aof_truncate(fp4idx_aof_t *a, uint64_t seq, int64_t length);
int fp4idx__aof_drop(fp4idx_aof_t *a, uint64_t seq);
/* fork: dst became the first `length` keys of src. */
int fp4idx__aof_fork(fp4idx_aof_t *a, uint64_t src, uint64_t dst, int64_t length);

/* fdatasync now. Returns FP4IDX_OK or FP4IDX_EIO. */
int fp4idx__aof_sync(fp4idx_aof_t *a);

/* Compaction: atomically replaces the log with a fresh, empty one of
 * generation new_gen (call after a snapshot with log generation new_gen is
 * durable). Returns FP4IDX_OK or FP4IDX_EIO (the old log then stays). */
int fp4idx__aof_rewrite(fp4idx_aof_t *a, uint64_t new_gen);

/* Current generation and size in bytes. */
uint64_t fp4idx__aof_gen(const fp4idx_aof_t *a);
int64_t fp4idx__aof_size(const fp4idx_aof_t *a);

/* Syncs, stops the everysec thread, closes. NULL is a no-op. */
void fp4idx__aof_close(fp4idx_aof_t *a);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_AOF_H */
