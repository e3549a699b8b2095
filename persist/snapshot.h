/* snapshot.h -- the snapshot file: the page pool and the sequence table on
 * disk, written atomically, checked on load, never half-loaded.
 *
 * The module knows nothing of the cache or the backend: the caller hands it
 * the sequence table (id, key count, page ids) and a callback that copies a
 * contiguous range of pool pages to host memory (the backend's read_pages);
 * loading calls back to write pages into a fresh, empty pool.
 *
 * File layout (all integers little-endian):
 *
 *   header, 128 bytes
 *     0  magic "FP4IDXSN"            8  u32 version (1, or 2 when pages are shared)
 *    12  u32 header bytes (128)     16  u32 page size P
 *    20  u32 slot bytes (68)        24  u64 sequences
 *    32  u64 stored pages           40  u64 table bytes
 *    48  u64 pool bytes (= stored pages * P * 68)
 *    56  u64 keys (sum over sequences)
 *    64  u64 log generation (the append log that continues this snapshot)
 *    72  u64 creation time, ns since the epoch
 *    80  u32 CRC-32C of the table   84  u32 CRC-32C of the pool section
 *    88  36 reserved zero bytes    124  u32 CRC-32C of bytes 0..123
 *   sequence table, per sequence:
 *     u64 id, u64 keys, then ceil(keys / P) u32 stored-page indices
 *   pool section: the stored pages, P * 68 bytes each in SGLang's page layout
 *     (fp4idx_format.h, page layout), in ascending order of their page id at save time.
 *
 * Shared pages (forks, protocol/PROTOCOL.md): several sequences name the same
 * stored page, each once; a page is stored once. Such a file is version 2,
 * so a reader of version 1 refuses it (EVERSION) rather than misreading it;
 * a file without sharing stays version 1.
 *
 * Only pages that sequences use are stored. Loading puts stored page i at pool
 * page i, so a snapshot loads into a pool of any size that has room (the page
 * size must match). The file size must equal 128 + table + pool bytes exactly:
 * anything else is a truncated or corrupt file and is refused.
 */
#ifndef FP4IDX_SNAPSHOT_H
#define FP4IDX_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  FP4IDX_SNAPSHOT_VERSION = 2, /* the newest read and written (1: no sharing) */
  FP4IDX_SNAPSHOT_HEADER_BYTES = 128,
  FP4IDX_SNAPSHOT_NONE = 1 /* fp4idx__snapshot_load: no file (not an error) */
};

/* One sequence of the table. */
typedef struct fp4idx_snap_seq_s {
  uint64_t id;
  int64_t n_keys;
  int32_t *pages; /* [ceil(n_keys / page_size)] page ids in position order */
} fp4idx_snap_seq_t;

/* Copies pool pages [first, first + count) to out (count * P * 68 bytes).
 * Returns FP4IDX_OK or a negative status. */
typedef int (*fp4idx_snap_read_fn)(void *ctx, int64_t first, int64_t count,
                                   void *out);
/* Copies count pages from in to pool pages [first, first + count). */
typedef int (*fp4idx_snap_write_fn)(void *ctx, int64_t first, int64_t count,
                                    const void *in);

/* What a snapshot holds (header fields). */
typedef struct fp4idx_snap_info_s {
  uint32_t version;
  int32_t page_size;
  int64_t n_seqs;
  int64_t n_pages;   /* stored pages */
  int64_t n_keys;
  uint64_t log_gen;
  uint64_t created_ns;
  uint64_t file_bytes;
} fp4idx_snap_info_t;

/* Writes a snapshot of n_seqs sequences to `path`, atomically: into
 * "<path>.tmp", fsync, rename over path, fsync of the folder. A crash at any
 * point leaves either the old snapshot or the new one, never a mix.
 * Takes: page_size P (power of two), pool_pages (every page id must be in
 *   [0, pool_pages) and listed once per sequence; several sequences may
 *   share it), the table, log_gen
 *   (recorded for the append log that follows), read (bulk page copies, called
 *   with ascending ranges of at most a few MiB), info (optional, filled on
 *   success), err/errlen (optional message buffer).
 * Returns FP4IDX_OK; FP4IDX_EINVAL (bad arguments, a page id out of range or
 *   twice in one sequence), FP4IDX_ENOMEM, FP4IDX_EIO (file system, message names the path
 *   and errno), or the read callback's error. On error the old snapshot, if
 *   any, is untouched and the temporary file removed. */
int fp4idx__snapshot_save(const char *path, int32_t page_size, int64_t pool_pages,
                         const fp4idx_snap_seq_t *seqs, int64_t n_seqs,
                         uint64_t log_gen, fp4idx_snap_read_fn read, void *ctx,
                         fp4idx_snap_info_t *info, char *err, size_t errlen);

/* Loads the snapshot at `path` into an empty pool of pool_pages pages of
 * page_size slots: stored page i goes to pool page i through `write`.
 * On success *seqs_out is one malloc'ed block (free it with free()) holding
 * *n_seqs_out sequences whose page lists name those pool pages.
 * The header, table and pool checksums, the file size and the table's
 * consistency are all checked. write is called while the pool section is
 * read, before its checksum is known: on an error return the written pages
 * hold garbage, but no sequence is returned, so the caller installs nothing
 * (the pool is still empty as far as the cache is concerned).
 * Returns FP4IDX_OK; FP4IDX_SNAPSHOT_NONE (1) when path does not exist;
 *   FP4IDX_ECORRUPT (bad magic, checksum, size, truncation, inconsistent
 *   table: the message says which and where); FP4IDX_EVERSION (newer format);
 *   FP4IDX_EINVAL (page size differs from page_size); FP4IDX_EFULL (the pool
 *   has fewer pages than the snapshot stores); FP4IDX_ENOMEM; FP4IDX_EIO;
 *   or the write callback's error. */
int fp4idx__snapshot_load(const char *path, int32_t page_size, int64_t pool_pages,
                         fp4idx_snap_write_fn write, void *ctx,
                         fp4idx_snap_seq_t **seqs_out, int64_t *n_seqs_out,
                         fp4idx_snap_info_t *info, char *err, size_t errlen);

/* Reads and checks only the header of `path` (a cheap look, e.g. for the
 * log generation before replay). Same returns as load for the header part. */
int fp4idx__snapshot_probe(const char *path, fp4idx_snap_info_t *info, char *err,
                          size_t errlen);

/* fsyncs the folder that holds `path` (after a rename into it).
 * Returns FP4IDX_OK or FP4IDX_EIO. Shared with the append log. */
int fp4idx__fsync_parent(const char *path);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_SNAPSHOT_H */
