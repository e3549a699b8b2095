/* crc32c.h -- CRC-32C (Castagnoli), the checksum of snapshots and the log.
 *
 * Why CRC-32C and not zlib's crc32 or xxhash: it detects every burst error up
 * to 32 bits and all 1-3 bit errors in records of our sizes (what a checksum
 * of a file must catch), it needs no extra library, and x86-64 has an
 * instruction for it (SSE4.2 crc32), so checksumming a multi-GB pool runs at
 * memory speed (about 20 GB/s with three interleaved streams) rather than
 * the 1-4 GB/s of a table CRC. Other CPUs get a slice-by-8 table version with
 * identical results. The same CRC guards iSCSI, ext4 metadata and LevelDB logs.
 */
#ifndef FP4IDX_CRC32C_H
#define FP4IDX_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Extends `crc` (0 for a fresh checksum) over len bytes at buf and returns the
 * new CRC-32C (standard: initial ~0, reflected, final xor ~0, so that
 * crc32c(0, "123456789", 9) == 0xE3069283). Chained calls equal one call
 * over the concatenation. buf may be NULL when len is 0. Thread-safe. */
uint32_t fp4idx__crc32c(uint32_t crc, const void *buf, size_t len);

/* The portable table version (for tests that compare both paths). */
uint32_t fp4idx__crc32c_sw(uint32_t crc, const void *buf, size_t len);

/* 1 when fp4idx__crc32c uses the CPU instruction, else 0. */
int fp4idx__crc32c_hw(void);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_CRC32C_H */
