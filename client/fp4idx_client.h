/* fp4idx_client.h -- libfp4idx-client, the C client of the fp4idxd daemon.
 *
 * The daemon owns a paged FP4 index-key cache and scores verify rows against
 * it (see the daemon's documentation and protocol/PROTOCOL.md). This library
 * speaks its wire protocol over a Unix stream socket: 4-byte big-endian frame
 * length, then one msgpack map.
 *
 * Threads: one connection per thread. A connection (fp4idx_client_t) is not
 * thread-safe; separate connections are independent and may be used from
 * different threads at once. Calls are blocking: each sends one request and
 * waits for its response, bounded by the connection's timeout.
 *
 * Status: every call returns fp4idx_status_t (fp4idx_status.h): 0 = success,
 * a negative FP4IDX_E* code otherwise. Switch on codes, never on messages.
 * After a failed call fp4idx_client_last_error(c) gives a one-line message;
 * when the daemon answered with an error, that message is the daemon's text.
 * A call that fails never writes partial results to the caller's outputs
 * except where its documentation says so.
 *
 * Connection errors: FP4IDX_ECONN (daemon absent, closed the connection,
 * or the stream broke mid-response) and FP4IDX_ETIMEDOUT (the timeout
 * elapsed) leave the connection CLOSED -- the position in the response stream
 * is unknown -- and every later call returns FP4IDX_ECONN until
 * fp4idx_client_connect() succeeds again on the same handle. FP4IDX_EPROTO
 * from a malformed response closes it likewise, as do FP4IDX_E2BIG for a
 * response above FP4IDX_CLIENT_MAX_RESPONSE and FP4IDX_ENOMEM while a
 * response was being received. Errors reported by the daemon (ENOSEQ,
 * ERANGE, ESHAPE, EFULL, ...) and argument errors (EINVAL) leave the
 * connection usable; fp4idx_client_connected() tells which case you are in.
 *
 * Memory: results the library allocates (fp4idx_client_score,
 * fp4idx_client_read, fp4idx_client_stats) are single blocks owned by the
 * caller, released with fp4idx_client_free(). Results written into buffers
 * the caller provides (fp4idx_client_score_into, fp4idx_client_topk) stay
 * the caller's. Input arrays are only read during the call.
 *
 * Byte order: arrays are in host order; the wire is little-endian, and the
 * library is built for little-endian hosts only (x86-64, aarch64).
 *
 * bf16 values are passed as uint16_t bit patterns (the upper half of the
 * f32 pattern).
 */
#ifndef FP4IDX_CLIENT_H
#define FP4IDX_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "fp4idx_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FP4IDX_CLIENT_VERSION_MAJOR 0
#define FP4IDX_CLIENT_VERSION_MINOR 1
#define FP4IDX_CLIENT_VERSION_PATCH 0

/* Wire protocol version this library speaks. */
#define FP4IDX_CLIENT_PROTOCOL_VERSION 1

/* Largest response frame the library accepts (bytes); a larger announced
 * length gives FP4IDX_E2BIG and closes the connection. */
#define FP4IDX_CLIENT_MAX_RESPONSE (1024u * 1024u * 1024u)

/* Elements per key, bytes per packed FP4 key (64 payload + 4 scale). */
#define FP4IDX_CLIENT_HEAD_DIM 128
#define FP4IDX_CLIENT_SLOT_BYTES 68

/* An open (or closed) connection to fp4idxd. Opaque. */
typedef struct fp4idx_client_s fp4idx_client_t;

/* Element type of keys given to fp4idx_client_append(). */
typedef enum fp4idx_client_keys_e {
  FP4IDX_KEYS_BF16 = 1, /* [n,128] bf16 bit patterns (uint16_t) */
  FP4IDX_KEYS_F32 = 2,  /* [n,128] float */
  FP4IDX_KEYS_FP4 = 3   /* [n,68] packed slots (uint8_t), stored as is */
} fp4idx_client_keys_t;

/* How the daemon quantizes bf16/f32 keys (ignored for FP4 keys). */
typedef enum fp4idx_client_rounding_e {
  FP4IDX_ROUNDING_RNE = 0,      /* nearest, ties to the even code (default) */
  FP4IDX_ROUNDING_THRESHOLD = 1 /* code = number of thresholds below |v| */
} fp4idx_client_rounding_t;

/* ---- connection ----------------------------------------------------------- */

/* Allocates an unconnected handle (timeout: none).
 * Returns the handle, or NULL when out of memory. */
fp4idx_client_t *fp4idx_client_new(void);

/* Connects c to the daemon's socket.
 * Takes: c from fp4idx_client_new(); socket_path, or NULL for the default
 *   (fp4idx_client_default_socket()). If c is already connected, the old
 *   connection is closed first. The connect itself is bounded by the timeout.
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (c NULL, path too long for a Unix socket
 *   address); FP4IDX_ECONN (no daemon: socket missing, refused, ...);
 *   FP4IDX_ETIMEDOUT; FP4IDX_ENOMEM. */
fp4idx_status_t fp4idx_client_connect(fp4idx_client_t *c,
                                      const char *socket_path);

/* Closes the connection (if any) and frees c. c may be NULL. */
void fp4idx_client_close(fp4idx_client_t *c);

/* Writes the default socket path into buf (NUL-terminated): $FP4IDX_SOCKET
 * if set and non-empty; else, for a non-root user with $XDG_RUNTIME_DIR set,
 * $XDG_RUNTIME_DIR/fp4idx/fp4idxd.sock; else /run/fp4idx/fp4idxd.sock (the
 * same rule as fp4idxd's --socket default).
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (buf NULL) or FP4IDX_E2BIG (the path
 *   does not fit in size bytes; buf then holds a truncated string). */
fp4idx_status_t fp4idx_client_default_socket(char *buf, size_t size);

/* Sets the time limit of each later blocking call (connect, and each
 * request's send + wait for its response) in milliseconds; 0 = no limit
 * (the default). A call that runs out returns FP4IDX_ETIMEDOUT and closes
 * the connection.
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (c NULL or timeout_ms < 0). */
fp4idx_status_t fp4idx_client_set_timeout(fp4idx_client_t *c, int timeout_ms);

/* The shortest automatic busy poll, and the fixed one of clients before
 * FP4IDX_CLIENT_BUSY_POLL_AUTO: a reply within it skips the wake-up. */
#define FP4IDX_CLIENT_BUSY_POLL_DEFAULT_US 50

/* fp4idx_client_set_busy_poll's automatic window, what a new client on a
 * host of at least 4 online CPUs starts with (on fewer, 0: the spin would
 * take the core the daemon needs): each wait spins about one and a half
 * times this connection's recent waits for a reply (at least
 * FP4IDX_CLIENT_BUSY_POLL_DEFAULT_US, at most 500 us; back to the least
 * where its replies take longer than 500 us: then the daemon is busy with
 * other clients, and a spinning thread would take a core from it). */
#define FP4IDX_CLIENT_BUSY_POLL_AUTO (-1)

/* Sets how long each wait for a response retries the socket before the
 * thread sleeps in poll(2): a window in microseconds (0 = sleep at once),
 * or FP4IDX_CLIENT_BUSY_POLL_AUTO, what a new client starts with on a host
 * of at least 4 CPUs (0 on fewer). A reply that comes within the window is
 * read without the scheduler's wake-up (on the H100 host ~7 us of a
 * small call's round trip; a few us at most of a long one), at
 * the price of the thread spinning meanwhile; the spin yields the CPU to
 * any other runnable thread (sched_yield) on each turn, so the daemon on
 * the same cores goes first. fp4idxd's own busy polling, --busy-poll-us, is
 * the other half. The call's timeout still applies.
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (c NULL, or us neither
 * FP4IDX_CLIENT_BUSY_POLL_AUTO nor within 0..1000000). */
fp4idx_status_t fp4idx_client_set_busy_poll(fp4idx_client_t *c, int us);

/* fp4idx_client_topk's results of at least this many bytes (4 rows of
 * top-512 and up) come back through the connection's reply region. */
#define FP4IDX_CLIENT_REPLY_REGION_DEFAULT ((size_t)16 << 10)

/* Sets the smallest result (bytes of positions, logits and counts) that
 * fp4idx_client_topk receives through the connection's reply region rather
 * than the socket: a host region (sealed memfd, PROTOCOL.md "Regions") the
 * client registers at the first such call and keeps for the connection,
 * into which the daemon's copy of the results lands; the socket then
 * carries only the reply's header. 0: always the socket (and a reply
 * region held now is released). A new client starts at
 * FP4IDX_CLIENT_REPLY_REGION_DEFAULT.
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (c NULL); the errors of a region
 *   release (min_bytes 0 with a region held: the setting still applies). */
fp4idx_status_t fp4idx_client_set_reply_region(fp4idx_client_t *c, size_t min_bytes);

/* Returns 1 when c holds an open connection, else 0. */
int fp4idx_client_connected(const fp4idx_client_t *c);

/* Returns the message of the last failed call on c ("" after a success).
 * The string belongs to c and stays valid until the next call on c.
 * Never NULL (for c == NULL: a static string). */
const char *fp4idx_client_last_error(const fp4idx_client_t *c);

/* Returns the status of the last call on c (FP4IDX_OK after a success). */
fp4idx_status_t fp4idx_client_last_status(const fp4idx_client_t *c);

/* Frees a block returned by fp4idx_client_score, fp4idx_client_read,
 * fp4idx_client_list or fp4idx_client_stats. p may be NULL. */
void fp4idx_client_free(void *p);

/* Returns the library version as "X.Y.Z" (static string). */
const char *fp4idx_client_version(void);

/* ---- hello / info --------------------------------------------------------- */

/* What hello and info report. Strings are NUL-terminated and truncated to
 * fit. Fields a call does not fill are zero / "". */
typedef struct fp4idx_client_info_s {
  uint32_t version;      /* protocol version of the daemon */
  char server[64];       /* "fp4idxd X.Y.Z" */
  char backend[16];      /* "cpu" | "cuda"             (info only) */
  char device[128];      /* device name                (info only) */
  uint64_t page_size;    /* keys per page              (info only) */
  uint64_t pages_total;  /* pool capacity in pages     (info only) */
  uint64_t pages_free;   /* free pages                 (info only) */
  uint64_t sequences;    /* live sequences             (info only) */
  uint64_t max_frame;    /* largest request frame, bytes (info only) */
} fp4idx_client_info_t;

/* Version handshake: sends this library's protocol version and name.
 * Takes: c connected; out (may be NULL) receives version and server.
 * Returns: FP4IDX_OK; FP4IDX_EVERSION (the daemon does not speak version 1);
 *   FP4IDX_ECONN, FP4IDX_ETIMEDOUT, FP4IDX_EPROTO (see top of file). */
fp4idx_status_t fp4idx_client_hello(fp4idx_client_t *c, fp4idx_client_info_t *out);

/* Daemon and pool information.
 * Takes: c connected; out (required) receives every field.
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (out NULL); connection errors. */
fp4idx_status_t fp4idx_client_info(fp4idx_client_t *c, fp4idx_client_info_t *out);

/* How the daemon shares its GPU (info's gpu_sharing fields; a struct of its
 * own so that fp4idx_client_info_t keeps its size for programs built
 * against it). */
typedef struct fp4idx_client_sharing_s {
  char mode[16];                /* "mps" | "time_slice" | "exclusive" |
                                   "unknown" | "none" (CPU backend); "" from
                                   a daemon that does not report it */
  uint64_t other_processes;     /* other processes with a context on the GPU */
} fp4idx_client_sharing_t;

/* The channels open on the daemon now, of every connection (info's
 * "channels"; 0 from a daemon that does not report it), from one info
 * request.
 * Takes: c connected; open (required).
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (open NULL); connection errors. */
fp4idx_status_t fp4idx_client_channels(fp4idx_client_t *c, uint64_t *open);

/* The GPU sharing mode, from one info request.
 * Takes: c connected; out (required).
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (out NULL); connection errors. */
fp4idx_status_t fp4idx_client_sharing(fp4idx_client_t *c, fp4idx_client_sharing_t *out);

/* ---- keys ----------------------------------------------------------------- */

/* Appends n keys to sequence seq (created if unknown), all or nothing.
 * Takes: dtype and keys: FP4IDX_KEYS_BF16 -> uint16_t[n*128],
 *   FP4IDX_KEYS_F32 -> float[n*128], FP4IDX_KEYS_FP4 -> uint8_t[n*68];
 *   n >= 1; rounding for bf16/f32; first and length (each may be NULL)
 *   receive the position of the first new key and the new key count.
 * Returns: FP4IDX_OK; FP4IDX_EINVAL (bad argument, n == 0); FP4IDX_E2BIG
 *   (the request exceeds the daemon's frame limit: send fewer keys per
 *   call); FP4IDX_ENONFINITE (NaN/inf in a key, or a packed scale byte 0
 *   or 255); FP4IDX_EFULL (pool full); connection errors. On any error nothing was stored. */
fp4idx_status_t fp4idx_client_append(fp4idx_client_t *c, uint64_t seq,
                                     fp4idx_client_keys_t dtype,
                                     const void *keys, size_t n,
                                     fp4idx_client_rounding_t rounding,
                                     uint64_t *first, uint64_t *length);

/* Typed forms of fp4idx_client_append (same returns). */
fp4idx_status_t fp4idx_client_append_bf16(fp4idx_client_t *c, uint64_t seq,
                                          const uint16_t *keys, size_t n,
                                          fp4idx_client_rounding_t rounding,
                                          uint64_t *first, uint64_t *length);
fp4idx_status_t fp4idx_client_append_f32(fp4idx_client_t *c, uint64_t seq,
                                         const float *keys, size_t n,
                                         fp4idx_client_rounding_t rounding,
                                         uint64_t *first, uint64_t *length);
fp4idx_status_t fp4idx_client_append_fp4(fp4idx_client_t *c, uint64_t seq,
                                         const uint8_t *slots, size_t n,
                                         uint64_t *first, uint64_t *length);

/* The calls of the ops whose fields are all integers (truncate, drop,
 * fork, save, length), generated from the op table protocol/optable.py: each takes
 * the request's fields in order and a pointer per response field
 * (out_<field>, may be NULL). */
#include "fp4idx_client_ops.h"

/* One sequence as fp4idx_client_list reports it. */
typedef struct fp4idx_client_seq_info_s {
  uint64_t seq;   /* sequence id */
  uint64_t keys;  /* keys held */
  uint64_t pages; /* pages they take */
  uint64_t pages_shared; /* of which another sequence sees too (fork) */
} fp4idx_client_seq_info_t;

/* One step of a scan over the daemon's sequences, like Redis SCAN: start
 * with cursor 0, pass each returned *next_cursor to the next call, stop when
 * it is 0. Each step does bounded work on the daemon: about `count`
 * sequences (a few more may come), possibly none while the scan is not
 * complete. Every sequence that exists for the whole scan is returned at
 * least once; one added or dropped meanwhile may or may not be; one may come
 * twice if the daemon's table grew.
 * Takes: count 1..10000, or 0 for the daemon's default (100); next_cursor,
 *   seqs and n required.
 * Returns: FP4IDX_OK with *seqs a block for fp4idx_client_free() (NULL when
 *   *n == 0); FP4IDX_E2BIG (count above 10000); connection errors. On error
 *   *seqs = NULL, *n = 0, *next_cursor = 0. */
fp4idx_status_t fp4idx_client_list(fp4idx_client_t *c, uint64_t cursor,
                                   uint32_t count, uint64_t *next_cursor,
                                   fp4idx_client_seq_info_t **seqs, size_t *n);

/* Reads keys [from, from+count) of seq; count = UINT64_MAX: to the end.
 * Takes: dequant 0: packed slots, *keys = uint8_t[n*68]; dequant 1: decoded
 *   values, *keys = float[n*128]. keys and n required.
 * Returns: FP4IDX_OK with *keys a block for fp4idx_client_free() (NULL when
 *   *n == 0) and *n the number of keys; FP4IDX_ENOSEQ; FP4IDX_ERANGE (range
 *   outside the sequence); connection errors. On error *keys = NULL, *n = 0. */
fp4idx_status_t fp4idx_client_read(fp4idx_client_t *c, uint64_t seq,
                                   uint64_t from, uint64_t count, int dequant,
                                   void **keys, size_t *n);

/* ---- scoring -------------------------------------------------------------- */

/* One sequence of a score request: R verify rows of H heads. */
typedef struct fp4idx_client_seq_s {
  uint64_t seq;
  uint32_t rows;         /* R >= 1 */
  const uint16_t *q;     /* [R,H,128] bf16 */
  const uint16_t *w;     /* [R,H] bf16 */
  const int32_t *lens;   /* [R] visible keys per row, or NULL: all keys */
  const uint8_t *mask;   /* [R,mask_width] 0 hides a position, or NULL */
  uint32_t mask_width;   /* W = max(lens) when mask is given */
} fp4idx_client_seq_t;

/* The result for one sequence. Without topk: logits [rows,width], width =
 * max(lens) (or the key count), -inf where a position is invisible;
 * positions and counts are NULL. With topk: width = k, positions and logits
 * [rows,k] sorted by logit descending (ties: lower position first), counts
 * [rows] valid pairs per row, unused entries position -1 and logit -inf. */
typedef struct fp4idx_client_result_s {
  uint64_t seq;
  uint32_t rows;
  uint32_t width;
  float *logits;
  int32_t *positions;
  int32_t *counts;
} fp4idx_client_result_t;

/* Scores one or more sequences in one request.
 * Takes: heads H in 1..128; topk 0 (full logits) or k >= 1; seqs[nseqs],
 *   nseqs >= 1; out receives the results.
 * Returns: FP4IDX_OK with *out an array of nseqs results, in order, in one
 *   block (all arrays inside it) for fp4idx_client_free(); FP4IDX_EINVAL;
 *   FP4IDX_ENOSEQ (a sequence is unknown); FP4IDX_ERANGE (lens[r] above the
 *   key count or negative); FP4IDX_ENONFINITE (NaN or inf in a q or w);
 *   FP4IDX_ESHAPE; FP4IDX_E2BIG; connection errors. On error *out = NULL. */
fp4idx_status_t fp4idx_client_score(fp4idx_client_t *c, uint32_t heads,
                                    uint32_t topk,
                                    const fp4idx_client_seq_t *seqs,
                                    size_t nseqs,
                                    fp4idx_client_result_t **out);

/* Full logits of one sequence into a caller buffer.
 * Takes: seq, heads H, rows R, q [R,H,128], w [R,H], lens [R] or NULL;
 *   logits: room for cap floats; width receives W (required).
 * Returns: FP4IDX_OK with logits[R*W] filled; FP4IDX_E2BIG when R*W > cap
 *   (*width still tells W; logits untouched); else as fp4idx_client_score.
 * The logits are received from the socket straight into `logits` (no
 * intermediate buffer), so after a connection error or EPROTO (connection
 * closed) they may hold part of the response. */
fp4idx_status_t fp4idx_client_score_into(fp4idx_client_t *c, uint64_t seq,
                                         uint32_t heads, uint32_t rows,
                                         const uint16_t *q, const uint16_t *w,
                                         const int32_t *lens, float *logits,
                                         size_t cap, uint32_t *width);

/* Top-k positions of one sequence into caller buffers.
 * Takes: as fp4idx_client_score_into plus k >= 1; positions and logits:
 *   room for R*k values each (required); counts: room for R (may be NULL).
 * Returns: FP4IDX_OK with [R,k] pairs per row (see fp4idx_client_result_t);
 *   else as fp4idx_client_score. Received in place like
 *   fp4idx_client_score_into (partly written after a connection error).
 * Results of at least the reply-region size (fp4idx_client_set_reply_region;
 * 16 KiB by default) come back through a host region that the client
 * creates for the connection (and grows, up to 64 MiB), then are copied
 * into the caller's buffers: the same values, with no result bytes on the
 * socket; where no region can be had (memfd, mmap or the daemon's region
 * limits), this and later calls use the socket. */
fp4idx_status_t fp4idx_client_topk(fp4idx_client_t *c, uint64_t seq,
                                   uint32_t heads, uint32_t rows,
                                   const uint16_t *q, const uint16_t *w,
                                   const int32_t *lens, uint32_t k,
                                   int32_t *positions, float *logits,
                                   int32_t *counts);

/* ---- regions: zero copy on the same host (PROTOCOL.md "Regions") ---------- */

/* A region is memory the daemon and this process share: host memory (a
 * sealed memfd both map) or a CUDA allocation (opened by the daemon through
 * CUDA IPC). Once registered, append can read its keys from a region and
 * score can write its results into one, instead of copying them through the
 * socket.
 *
 * Lifetimes: a region belongs to the connection that registered it: no
 * other connection (not even another handle of this process) can name it,
 * and the daemon releases it when fp4idx_client_region_unregister succeeds
 * or the connection closes (fp4idx_client_close, a connection error, a
 * reconnect). The daemon keeps its own mapping of a host region, so
 * unmapping or closing this side never affects it; the memory the caller
 * sees stays valid until the caller unmaps it (fp4idx_client_region_destroy
 * does both). While a request runs the daemon reads or writes the region:
 * do not change the bytes of a request's inputs, or read its outputs, until
 * the call has returned.
 *
 * Errors common to the calls below: FP4IDX_ENOREGION (the id is not
 * registered on this connection), FP4IDX_EREGION (the daemon refused the
 * region, or a reference is misaligned, outside the region, or an output
 * overlaps another tensor of the request), FP4IDX_E2BIG (more than 16
 * regions or 64 GiB of regions on one connection), FP4IDX_EINVAL (bad
 * argument, connection kept), and the connection errors at the top of this
 * file. A refused request changes nothing in the cache or the region. */

/* Bytes of a cudaIpcMemHandle_t. */
#define FP4IDX_CLIENT_CUDA_HANDLE_BYTES 64

/* Creates a host region of `size` bytes: a memfd sealed against shrinking,
 * mapped here read-write, passed to the daemon (which maps it too).
 * Takes: size >= 1; region and ptr required.
 * Returns: FP4IDX_OK with *region its id and *ptr this process's mapping
 *   (zero-filled, page-aligned, `size` bytes; release it with
 *   fp4idx_client_region_destroy); FP4IDX_ENOMEM (memfd or mmap failed);
 *   the common errors. On error *region = 0 and *ptr = NULL. */
fp4idx_status_t fp4idx_client_region_create(fp4idx_client_t *c, size_t size,
                                            uint64_t *region, void **ptr);

/* Registers the caller's own memfd (first `size` bytes) as a host region.
 * The daemon requires it to be sealed with F_SEAL_SHRINK (fcntl
 * F_ADD_SEALS; create it with MFD_ALLOW_SEALING) and at least size bytes
 * long; POSIX shm objects and plain files are refused (they can shrink under
 * the daemon's mapping). The caller keeps fd (it may close it at once).
 * Returns: FP4IDX_OK with *region; FP4IDX_EREGION (unsealed, too short, not
 *   a memfd, not mappable read-write); the common errors. */
fp4idx_status_t fp4idx_client_region_register_fd(fp4idx_client_t *c, int fd,
                                                 size_t size,
                                                 uint64_t *region);

/* Registers CUDA device memory by its IPC handle: the 64 bytes of a
 * cudaIpcMemHandle_t from cudaIpcGetMemHandle (this library does not link
 * CUDA; see fp4idx_client_region_register_device below), `size` bytes from
 * the start of the handle's allocation, on `device`, an ordinal in the
 * daemon's numbering (the same as this process's when both see the same
 * CUDA_VISIBLE_DEVICES).
 * Returns: FP4IDX_OK with *region; FP4IDX_EREGION (the daemon runs the CPU
 *   backend or another device, the driver refuses the handle, size is above
 *   the allocation); the common errors. */
fp4idx_status_t fp4idx_client_region_register_cuda(fp4idx_client_t *c,
                                                   const void *ipc_handle,
                                                   size_t size,
                                                   uint32_t device,
                                                   uint64_t *region);

/* Releases region `region` on the daemon (the caller's memory is not
 * touched). Returns: FP4IDX_OK; FP4IDX_ENOREGION; connection errors. */
fp4idx_status_t fp4idx_client_region_unregister(fp4idx_client_t *c,
                                                uint64_t region);

/* Unregisters `region` (when c is connected) and unmaps ptr[0..size) (when
 * ptr is not NULL): the undo of fp4idx_client_region_create. The memory is
 * unmapped even when the unregister fails. Returns what unregister
 * returned (FP4IDX_OK when not connected). */
fp4idx_status_t fp4idx_client_region_destroy(fp4idx_client_t *c,
                                             uint64_t region, void *ptr,
                                             size_t size);

/* Appends n keys read from `region` at byte `offset` (bulk ingest; the
 * keys never cross the socket). Layout as fp4idx_client_append; offset a
 * multiple of the element size (2 for bf16, 4 for f32, 1 for fp4).
 * Returns: as fp4idx_client_append, plus the common region errors. */
fp4idx_status_t fp4idx_client_append_region(
    fp4idx_client_t *c, uint64_t seq, fp4idx_client_keys_t dtype,
    uint64_t region, uint64_t offset, size_t n,
    fp4idx_client_rounding_t rounding, uint64_t *first, uint64_t *length);

/* Full logits of one sequence written into `region` at `offset` as f32
 * [rows,width] (C order); the reply carries no logits.
 * Takes: as fp4idx_client_score_into; width = W of the result, max(lens)
 *   (or the sequence's key count without lens); offset a multiple of 4.
 * Returns: FP4IDX_OK once the logits are in the region; FP4IDX_ESHAPE
 *   (width is not W); else as fp4idx_client_score plus the region errors. */
fp4idx_status_t fp4idx_client_score_region(
    fp4idx_client_t *c, uint64_t seq, uint32_t heads, uint32_t rows,
    const uint16_t *q, const uint16_t *w, const int32_t *lens, uint32_t width,
    uint64_t region, uint64_t offset);

/* Top-k of one sequence written into `region`: positions i32 [rows,k] at
 * positions_offset, logits f32 [rows,k] at logits_offset, counts i32
 * [rows] at counts_offset (offsets multiples of 4, the three ranges
 * disjoint). Order and padding as fp4idx_client_result_t.
 * Returns: as fp4idx_client_topk plus the region errors. */
fp4idx_status_t fp4idx_client_topk_region(
    fp4idx_client_t *c, uint64_t seq, uint32_t heads, uint32_t rows,
    const uint16_t *q, const uint16_t *w, const int32_t *lens, uint32_t k,
    uint64_t region, uint64_t positions_offset, uint64_t logits_offset,
    uint64_t counts_offset);

/* A tensor in a region: the region's id and a byte offset in it. */
typedef struct fp4idx_client_ref_s {
  uint64_t region; /* 0: no tensor (where one is optional) */
  uint64_t offset;
} fp4idx_client_ref_t;

/* One sequence's score with every tensor in regions: nothing but the
 * request's header crosses the socket (the zero-copy path of a serving
 * process whose q and w already lie in device memory, CUDA regions).
 * q bf16 [rows,heads,128] and w bf16 [rows,heads] (offsets multiples of 2),
 * lens i32 [rows] (multiple of 4; region 0: no lens); the outputs as
 * fp4idx_client_score_region (topk 0: logits f32 [rows,width]) or
 * fp4idx_client_topk_region (positions, logits, counts). */
typedef struct fp4idx_client_region_score_s {
  uint64_t seq;
  uint32_t heads, rows;
  uint32_t topk;  /* 0: full logits */
  uint32_t width; /* full logits: W, as fp4idx_client_score_region */
  fp4idx_client_ref_t q, w, lens;
  fp4idx_client_ref_t logits, positions, counts; /* positions, counts: topk only */
} fp4idx_client_region_score_t;

/* Runs the score *call (above). The daemon reads the inputs where they lie
 * (a CUDA daemon checks CUDA-region inputs on the device) and writes the
 * outputs only when every input passes: a refused call leaves the output
 * ranges as they were.
 * Takes: call with rows >= 1, heads 1..128, q, w and the outputs named
 *   (region != 0; for topk >= 1 all three outputs).
 * Returns: FP4IDX_OK once the outputs are in their regions; FP4IDX_EINVAL
 *   (call NULL or a required tensor unnamed); FP4IDX_ENONFINITE (NaN or inf
 *   in q or w), FP4IDX_ERANGE (lens), FP4IDX_ESHAPE (width), FP4IDX_ENOSEQ;
 *   the region errors common to these calls (above). */
fp4idx_status_t fp4idx_client_score_regions(fp4idx_client_t *c,
                                            const fp4idx_client_region_score_t *call);

#if defined(__CUDA_RUNTIME_H__) || defined(__CUDA_RUNTIME_API_H__)
/* With cuda_runtime.h included first: registers the device allocation that
 * starts at dptr (size bytes, from cudaMalloc) on the current device.
 * Returns: FP4IDX_EDEVICE when CUDA cannot export the handle; else as
 * fp4idx_client_region_register_cuda. */
static inline fp4idx_status_t fp4idx_client_region_register_device(
    fp4idx_client_t *c, void *dptr, size_t size, uint64_t *region) {
  cudaIpcMemHandle_t h;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaIpcGetMemHandle(&h, dptr) != cudaSuccess)
    return FP4IDX_EDEVICE;
  return fp4idx_client_region_register_cuda(c, &h, size, (uint32_t)dev,
                                            region);
}
#endif

/* ---- channels: calls made by a CUDA stream ------------------------------- */

/* A channel (protocol/PROTOCOL.md "Channels") lets a CUDA stream call the
 * daemon with no host round trip, so that the call can sit inside a
 * captured CUDA graph: fp4idx_client_channel_score / _topk enqueue on the
 * stream the writes of a slot's descriptor and doorbell and a wait for the
 * slot's completion word; the daemon runs the score on the channel's
 * regions and writes the completion word after the outputs. This library
 * does not link CUDA: the driver is loaded at run time
 * (dlopen("libcuda.so.1")), and streams are passed as void * (a CUstream or
 * cudaStream_t; NULL, the legacy default stream, is allowed).
 *
 * Replays: a captured call writes the same values each time the graph is
 * replayed, and the daemon takes each ring as a new call. What changes per
 * step -- q, w, lens -- must be in the regions, updated by the caller's
 * kernels before the call (the offsets in the descriptor are fixed).
 *
 * Failures never hang a stream: a bad call completes with its error; a
 * thread of the channel watches the connection and, once it is closed (the
 * daemon died, or fp4idx_client_close), writes every pending completion
 * word with FP4IDX_ECONN, and keeps doing so for later calls until
 * fp4idx_client_channel_close. A stream's wait ends in every case; read the
 * call's status with fp4idx_client_channel_status. */
typedef struct fp4idx_client_channel_s fp4idx_client_channel_t;

/* One call. Offsets are bytes in the channel's regions (see
 * fp4idx_client_channel_open); every tensor is C-ordered. */
typedef struct fp4idx_client_channel_call_s {
  uint64_t seq;              /* the sequence to score */
  uint32_t rows;             /* R, 1..65536 */
  uint32_t heads;            /* H, 1..128 */
  uint64_t q_offset;         /* q bf16 [R,H,128] in the q region (multiple of 2) */
  uint64_t w_offset;         /* w bf16 [R,H] in the w region (multiple of 2) */
  int64_t lens_offset;       /* lens i32 [R] in the lens region, or -1: none */
  uint64_t logits_offset;    /* out: f32 [R,W] (score) or [R,k] (topk) */
  uint64_t positions_offset; /* out, topk: i32 [R,k] */
  uint64_t counts_offset;    /* out, topk: i32 [R] */
} fp4idx_client_channel_call_t;

/* Opens a channel of `slots` slots (1..1024; calls that may be in flight
 * together need a slot each, calls of one stream take one at a time) whose
 * calls read q, w and lens from regions q_region, w_region, lens_region (0:
 * calls pass no lens) and write into out_region -- regions registered on c
 * (CUDA regions for calls by a GPU stream; host regions work too). The
 * control block is a sealed memfd mapped here and registered with the CUDA
 * driver (cuMemHostRegister) when one can be loaded; without a driver the
 * channel opens for host calls only (stream NULL with
 * FP4IDX_CLIENT_CHANNEL_HOST, below).
 * Returns: FP4IDX_OK with *out (release it with
 *   fp4idx_client_channel_close); FP4IDX_EINVAL; FP4IDX_ENOMEM (memfd,
 *   mmap, thread); FP4IDX_EDEVICE (the driver refused to register the
 *   block); the daemon's FP4IDX_ENOREGION (a region not registered on c),
 *   FP4IDX_EREGION, FP4IDX_E2BIG (more than 4 channels), FP4IDX_ESHAPE (slots
 *   out of range); connection errors. */
fp4idx_status_t fp4idx_client_channel_open(fp4idx_client_t *c, uint32_t slots,
                                           uint64_t q_region, uint64_t w_region,
                                           uint64_t lens_region, uint64_t out_region,
                                           fp4idx_client_channel_t **out);

/* `stream` value for a call made by the calling thread instead of a CUDA
 * stream: it writes the slot with CPU stores and waits (spinning, then
 * napping) for the completion word; for hosts without a GPU and tests. */
#define FP4IDX_CLIENT_CHANNEL_HOST ((void *)(intptr_t)-1)

/* Enqueues on `stream` a full-logits call: logits f32 [R,width] at
 * call->logits_offset of the output region, width = W (max(lens), or the
 * sequence's length without lens; ESHAPE otherwise, as a region score).
 * The call is one cuStreamBatchMemOp on the stream (reset the completion
 * word, write the descriptor, ring, wait; the same operations one by one
 * where the driver lacks or refuses the batch), capturable in a CUDA graph.
 * The stream continues once the call completed. *ticket (may be NULL)
 * names the call for fp4idx_client_channel_status.
 * Returns: FP4IDX_OK once enqueued (the call's own status comes with its
 *   completion word); FP4IDX_EINVAL (bad argument, checked here: rows,
 *   heads, NULL); FP4IDX_ENODEV (a stream given and no CUDA driver);
 *   FP4IDX_EDEVICE (the driver refused a stream operation); FP4IDX_ECONN
 *   (the channel is closed or its connection lost). With
 *   FP4IDX_CLIENT_CHANNEL_HOST the call has completed on return, and the
 *   return value is its status. */
fp4idx_status_t fp4idx_client_channel_score(fp4idx_client_channel_t *ch, void *stream,
                                            const fp4idx_client_channel_call_t *call,
                                            uint32_t width, uint32_t *ticket);

/* The same for a top-k call: positions i32 [R,k], logits f32 [R,k], counts
 * i32 [R] at the call's offsets (k in 1..1048576). */
fp4idx_status_t fp4idx_client_channel_topk(fp4idx_client_channel_t *ch, void *stream,
                                           const fp4idx_client_channel_call_t *call,
                                           uint32_t k, uint32_t *ticket);

/* The status of the latest call with `ticket`, read from its completion
 * word (host side; after the stream passed the call, e.g. after a
 * synchronize). Returns: the call's status (FP4IDX_OK or the daemon's
 * error, FP4IDX_ECONN when the channel or connection closed first);
 * FP4IDX_EINVAL when the call has not completed (or ch is NULL). */
fp4idx_status_t fp4idx_client_channel_status(const fp4idx_client_channel_t *ch,
                                             uint32_t ticket);

/* Device pointer (as a 64-bit integer) of the control block's mapping in
 * the CUDA address space, for kernels that write a descriptor field or read
 * a completion word themselves; 0 without CUDA. Slot i starts at
 * 64 + 128 i (PROTOCOL.md "Channels"). */
uint64_t fp4idx_client_channel_device_block(const fp4idx_client_channel_t *ch);

/* Closes the channel: asks the daemon to close it (when connected), writes
 * FP4IDX_ECONN into every pending completion word, stops the watcher,
 * unregisters and unmaps the block, frees ch. Streams must have no call of
 * the channel still to come (synchronize them first: a call already
 * waiting is released with ECONN, and then the channel's CUDA context is
 * synchronized before the block is unregistered, so that the stream has
 * read its completion word). Returns what the daemon answered
 * (FP4IDX_OK when not connected); ch is freed either way. */
fp4idx_status_t fp4idx_client_channel_close(fp4idx_client_channel_t *ch);

/* ---- stats ---------------------------------------------------------------- */

/* Per-op counters. Latency histogram: hist[i] requests took <= bounds_us[i]
 * (and more than bounds_us[i-1]); plain per-bucket counts, not cumulative;
 * the last bound is +inf (INFINITY). */
typedef struct fp4idx_client_op_stats_s {
  char op[32];
  uint64_t count;
  uint64_t errors;
  double latency_sum_us;
  uint32_t nbuckets;
  const double *bounds_us;  /* [nbuckets], inside the same block */
  const uint64_t *hist;     /* [nbuckets] */
} fp4idx_client_op_stats_t;

#define FP4IDX_CLIENT_MAX_STATUSES 64 /* status codes 0..-63 */

typedef struct fp4idx_client_stats_s {
  double uptime_s;
  uint64_t connections;
  uint64_t sequences;
  uint64_t keys;
  uint64_t pages_total;
  uint64_t pages_free;
  char backend[16];
  char device[128];
  uint32_t nops;
  fp4idx_client_op_stats_t *ops;   /* [nops], sorted by op name */
  /* Time per stage of the request path (PROTOCOL.md "stats" "stages"):
   * op holds the stage name ("read", "queue", ..., "write"), in path order;
   * errors is 0. nstages is 0 with a daemon that does not report stages. */
  uint32_t nstages;
  fp4idx_client_op_stats_t *stages; /* [nstages], inside the same block */
  /* Since the daemon started (0 from daemons that do not send them): */
  uint64_t keys_appended;          /* keys of acknowledged appends */
  uint64_t rows_scored;            /* verify rows of answered scores */
  uint64_t request_bytes;          /* request frames received, prefix included */
  uint64_t response_bytes;         /* response frames sent, prefix included */
  /* errors by status: status_errors[-code] answers with that code
   * (fp4idx_status.h; index 0 unused), e.g. [-FP4IDX_ENOSEQ]. */
  uint64_t status_errors[FP4IDX_CLIENT_MAX_STATUSES];
  /* Now: */
  uint64_t queue_depth;            /* requests waiting for the worker */
  uint64_t device_mem_total;       /* bytes of device (CPU: host) memory */
  uint64_t device_mem_free;        /* of which free */
  uint64_t pages_shared;           /* pages two sequences or more see (forks;
                                      0 from a daemon without fork) */
  char gpu_sharing[16];            /* as fp4idx_client_sharing_t.mode */
  uint64_t gpu_other_processes;    /* as fp4idx_client_sharing_t.other_processes */
  /* The buffer budget (0 from daemons that do not send them): */
  uint64_t buffered_bytes;         /* held for connections now: requests read and
                                      not run, replies not yet written out */
  uint64_t buffered_bytes_peak;    /* the most buffered_bytes has been */
  uint64_t buffer_budget;          /* --buffer-budget, bytes */
  /* Channels (0 from daemons without them): */
  uint64_t channels;               /* open now */
  uint64_t channel_calls;          /* calls completed since start */
  uint64_t channel_errors;         /* of which with an error status */
} fp4idx_client_stats_t;

/* Daemon counters.
 * Returns: FP4IDX_OK with *out one block for fp4idx_client_free();
 *   FP4IDX_EINVAL (out NULL); connection errors. On error *out = NULL. */
fp4idx_status_t fp4idx_client_stats(fp4idx_client_t *c, fp4idx_client_stats_t **out);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_CLIENT_H */
