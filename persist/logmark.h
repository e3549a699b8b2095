/* logmark.h -- how far the append log is known to have reached: a small
 * file beside the log ("<log>.mark") holding the log's generation and a
 * length the log had reached *on disk* (written only after an fdatasync of
 * the log covered that length). On start, a log shorter than its mark, or a
 * missing log whose mark says it had records, is tail loss -- acknowledged
 * writes rolled back -- and is refused (ECORRUPT) instead of replayed
 * silently (see daemon/service.c; --allow-data-loss starts anyway).
 *
 * Layout, 40 bytes, little-endian:
 *    0 "FP4IDXMK"   8 u32 version (1)   12 u32 bytes (40)
 *   16 u64 log generation               24 u64 log bytes reached
 *   32 u32 zero                         36 u32 CRC-32C of bytes 0..35
 * Rewritten in place (one pwrite of 40 bytes, then fdatasync) through an fd
 * kept open (fp4idx__logmark_open, fp4idx__logmark_put): the append log
 * rewrites it as often as every record (aof.h says when, per fsync policy).
 * A torn write fails the CRC and the mark is then ignored with a warning (it
 * can only under-report, never refuse a good log).
 */
#ifndef FP4IDX_LOGMARK_H
#define FP4IDX_LOGMARK_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_status.h"

enum { FP4IDX_LOGMARK_BYTES = 40, FP4IDX_LOGMARK_NONE = 1 };

/* The mark's path for the log at log_path ("<log_path>.mark") into buf.
 * Returns FP4IDX_OK or FP4IDX_E2BIG (does not fit in cap). */
int fp4idx__logmark_path(const char *log_path, char *buf, size_t cap);

/* Opens the mark for rewriting with fp4idx__logmark_put, creating the file
 * when missing (and then syncing its folder). Returns an fd open for writing,
 * or -1 with errno set. */
int fp4idx__logmark_open(const char *mark_path);

/* Records that the log of generation gen had reached `bytes` on disk (the
 * caller synced the log first) in the mark open at fd: one pwrite of the 40
 * bytes, then fdatasync. Returns FP4IDX_OK, FP4IDX_EINVAL or FP4IDX_EIO
 * (errno set). */
int fp4idx__logmark_put(int fd, uint64_t gen, uint64_t bytes);

/* Open, put and close in one call. Returns FP4IDX_OK, FP4IDX_EINVAL or
 * FP4IDX_EIO (message in err). */
int fp4idx__logmark_write(const char *mark_path, uint64_t gen, uint64_t bytes, char *err,
                         size_t errlen);

/* Reads the mark: FP4IDX_OK with *gen and *bytes; FP4IDX_LOGMARK_NONE when
 * there is no mark file; FP4IDX_ECORRUPT when it is not a valid mark (torn
 * or damaged: message in err, treat as absent); FP4IDX_EIO; FP4IDX_EINVAL. */
int fp4idx__logmark_read(const char *mark_path, uint64_t *gen, uint64_t *bytes, char *err,
                        size_t errlen);

#endif /* FP4IDX_LOGMARK_H */
