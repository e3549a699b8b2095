/* export.h -- one sequence in SGLang's page layout, to move caches between
 * fp4idx and SGLang's FP4 index-K pool (fp4idx_format.h, page layout).
 *
 * A sequence of n keys becomes ceil(n / P) pages of P * 68 bytes: first the P
 * 64-byte payloads (slot o at o * 64), then the P 4-byte scale words (slot o
 * at P * 64 + o * 4). Slots past n in the last page are zero. This is the
 * byte layout of SGLang's buffer of shape [pages, P * 68] uint8, so the pages
 * can be copied into (or out of) that buffer page by page.
 *
 * Export file (little-endian), unless FP4IDX_EXPORT_RAW is given:
 *   header, 64 bytes: "FP4IDXEX", u32 version (1), u32 header bytes (64),
 *     u32 page size P, u32 slot bytes (68), u64 seq id, u64 keys n,
 *     u64 pages, u32 CRC-32C of the pages, 12 zero bytes,
 *     u32 CRC-32C of bytes 0..59
 *   pages: pages * P * 68 bytes
 * In numpy: np.fromfile(f, np.uint8, offset=64).reshape(pages, P * 68).
 * A raw file is the pages alone (e.g. buffer[pages].numpy().tofile(f) on the
 * SGLang side); importing one needs n and P from the caller.
 */
#ifndef FP4IDX_EXPORT_H
#define FP4IDX_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  FP4IDX_EXPORT_HEADER_BYTES = 64,
  FP4IDX_EXPORT_RAW = 1 /* flag: pages only, no header */
};

typedef struct fp4idx_export_info_s {
  uint64_t seq;
  int64_t n_keys;
  int32_t page_size;
  int64_t n_pages;
} fp4idx_export_info_t;

/* Bytes of the pages for n keys at page size P: ceil(n / P) * P * 68. */
int64_t fp4idx__export_pages_bytes(int64_t n, int32_t page_size);

/* Packed slots [n,68] (payload then scales per key, the wire's layout) ->
 * pages (fp4idx__export_pages_bytes(n, P) bytes, unused slots zeroed).
 * Returns FP4IDX_OK or FP4IDX_EINVAL (n < 0, P not a power of two <= 65536,
 * NULL pointers with n > 0). */
int fp4idx__export_pack(const uint8_t *slots, int64_t n, int32_t page_size,
                       uint8_t *pages);

/* Pages -> packed slots [n,68]; the inverse of pack. Same errors. */
int fp4idx__export_unpack(const uint8_t *pages, int64_t n, int32_t page_size,
                         uint8_t *slots);

/* Writes sequence `seq` (n packed slots) as an export file at path (temp file
 * + fsync + rename). flags: 0 or FP4IDX_EXPORT_RAW.
 * Returns FP4IDX_OK, FP4IDX_EINVAL, FP4IDX_ENOMEM, FP4IDX_EIO (message). */
int fp4idx__export_write(const char *path, uint64_t seq, const uint8_t *slots,
                        int64_t n, int32_t page_size, int flags, char *err,
                        size_t errlen);

/* Reads an export file. With a header, info comes from it (the caller's
 * info->n_keys / page_size are ignored); with FP4IDX_EXPORT_RAW the caller
 * sets info->n_keys and info->page_size and the file size must match.
 * On success *slots_out is malloc'ed [n,68] (free()).
 * Unused slots of the last page are ignored (SGLang may leave old bytes there).
 * Returns FP4IDX_OK, FP4IDX_ECORRUPT (bad magic, header or page checksum, file
 * size), FP4IDX_EVERSION, FP4IDX_EINVAL, FP4IDX_ENOMEM, FP4IDX_EIO. */
int fp4idx__export_read(const char *path, int flags, fp4idx_export_info_t *info,
                       uint8_t **slots_out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_EXPORT_H */
