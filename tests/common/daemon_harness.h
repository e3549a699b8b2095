/* daemon_harness.h -- run the real fp4idxd on a temporary socket, and talk to
 * it with the wire codec (protocol/fp4idx_codec.h).
 *
 * The daemon binary is $FP4IDXD when set, else FP4IDXD_PATH (compiled in by
 * tests/daemon.cmake). Each daemon gets its own temporary folder holding the
 * socket ("d.sock") and its log ("daemon.log"); the daemon dies with the test
 * process (PR_SET_PDEATHSIG), so a failed assertion leaves nothing behind.
 * Nothing here calls Criterion: functions return 0 / negative and tests
 * assert.
 */
#ifndef FP4IDX_DAEMON_HARNESS_H
#define FP4IDX_DAEMON_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fp4idx_codec.h"

typedef struct fp4idx_test_daemon_s {
  pid_t pid;          /* 0 when not running */
  char dir[128];      /* temporary folder */
  char sock[160];     /* dir/d.sock */
  char log[160];      /* dir/daemon.log */
  int status;         /* waitpid status once collected */
  int collected;
} fp4idx_test_daemon_t;

/* Spawns fp4idxd --socket DIR/d.sock --backend cpu --log-level debug
 * --cache-bytes 8M plus the
 * NULL-terminated extra args (e.g. "--cache-bytes", "1M", NULL; may be NULL),
 * and waits until the socket accepts a connection (10 s at most). Returns 0,
 * or -1 when the daemon did not come up (its log is printed to stderr). */
int fp4idx_test_daemon_start(fp4idx_test_daemon_t *d, const char *const *extra);

/* Spawns the daemon with --socket DIR/d.sock and exactly the NULL-terminated
 * args (may be NULL; no --backend, --log-level or --cache-bytes added) and
 * waits until the socket accepts a connection (10 s at most), as
 * fp4idx_test_daemon_start does. For a daemon binary ($FP4IDXD) that takes
 * other options, e.g. bench/fp4idxd-nowork. Returns 0 or -1. */
int fp4idx_test_daemon_start_args(fp4idx_test_daemon_t *d, const char *const *args);

/* Starts fp4idxd --backend cuda --cache-bytes cache_bytes --log-level debug
 * (zero *d first) and waits up to 30 s for its socket. Returns 0 when it
 * answers, 1 when it exited first (no usable GPU: *exit_code tells its exit
 * code, d is stopped), -1 on other failures. */
int fp4idx_test_daemon_start_cuda(fp4idx_test_daemon_t *d, const char *cache_bytes,
                                  int *exit_code);

/* Makes d's temporary folder and fills d->dir, d->sock and d->log (once;
 * zero *d first). 0 or -1. */
int fp4idx_test_daemon_prepare(fp4idx_test_daemon_t *d);

/* Like start (zero *d first), but with a caller-chosen socket path (no --socket added when
 * sock is NULL) and without waiting; for tests of start-up failures. */
int fp4idx_test_daemon_spawn(fp4idx_test_daemon_t *d, const char *sock,
                             const char *const *args);

/* Sends a signal. 0 or -1. */
int fp4idx_test_daemon_kill(fp4idx_test_daemon_t *d, int sig);

/* Waits up to timeout_ms for the daemon to exit; returns its exit code
 * (0..255), 128+signal when killed, or -1 on timeout. */
int fp4idx_test_daemon_wait(fp4idx_test_daemon_t *d, int timeout_ms);

/* True (1) while the process runs. */
int fp4idx_test_daemon_alive(fp4idx_test_daemon_t *d);

/* SIGTERM, wait (5 s, then SIGKILL), remove the folder. Returns the exit
 * code as fp4idx_test_daemon_wait does. */
int fp4idx_test_daemon_stop(fp4idx_test_daemon_t *d);

/* A "NAME: N kB" field of /proc/PID/status (e.g. "VmRSS", "VmData") in
 * KiB, or -1. */
long fp4idx_test_proc_kib(pid_t pid, const char *field);

/* Under AddressSanitizer freed blocks wait in a quarantine (256 MB by
 * default) and count in RSS: keeps it small (4 MB) for the daemons spawned
 * from here on, so that RSS measures what the daemon holds. Appends to
 * ASAN_OPTIONS; no effect on other builds. */
void fp4idx_test_small_asan_quarantine(void);

/* 1 when the daemon under test is built with ThreadSanitizer (the tests
 * themselves are not: tests/tsan_daemon.sh says so by setting
 * FP4IDX_TEST_DAEMON_SANITIZER=thread), else 0. Its shadow and
 * synchronization metadata grow with every address and lock the daemon
 * touches, by tens of MiB, so an RSS bound does not measure the daemon. */
int fp4idx_test_daemon_under_tsan(void);

/* Prints the daemon log to stderr (for failing tests). */
void fp4idx_test_daemon_dump_log(const fp4idx_test_daemon_t *d);

/* ---- raw socket I/O ------------------------------------------------------ */

/* Connects a blocking Unix stream socket with 10 s send/receive timeouts.
 * Returns the fd or -1. */
int fp4idx_test_connect(const char *path);

/* Writes all bytes. 0 or -1. */
int fp4idx_test_send_all(int fd, const void *buf, size_t len);

/* Reads one frame body (malloc'd into *body, length *len). 0, or -1 on EOF,
 * timeout or error. */
int fp4idx_test_recv_frame(int fd, unsigned char **body, size_t *len);

/* 1 when the peer has closed (EOF within timeout_ms), 0 when the connection
 * is still open (nothing arrives), -1 when unexpected bytes arrive. */
int fp4idx_test_peer_closed(int fd, int timeout_ms);

/* ---- calls through the codec --------------------------------------------- */

/* Encodes req (req->id as given), sends it, receives and decodes the answer
 * as a response to req->op. *body keeps the response bytes alive (tensors in
 * *resp are views into it): free it after fp4idx_response_clear(resp).
 * Returns 0 when a response was decoded (check resp->status), or a negative
 * fp4idx code for transport/codec failures (then *resp is zeroed, so
 * fp4idx_response_clear(resp) and free(*body) are still safe). */
int fp4idx_test_call(int fd, const fp4idx_request_t *req, fp4idx_response_t *resp,
                     unsigned char **body);

/* Sends only (pipelining): encodes and writes req. 0 or negative. */
int fp4idx_test_send_request(int fd, const fp4idx_request_t *req);

/* Receives and decodes the next response as an answer to `op`. */
int fp4idx_test_recv_response(int fd, fp4idx_op_t op, fp4idx_response_t *resp,
                              unsigned char **body);

/* Convenience ops; each returns the response status (0 or negative) or a
 * transport error. */
int fp4idx_test_append(int fd, uint64_t seq, fp4idx_wire_dtype_t dtype, uint64_t n,
                       const void *keys, uint64_t *first, uint64_t *length);
int fp4idx_test_info(int fd, fp4idx_info_t *info);
/* The buffer budget's counts from `stats`: bytes held now, the most held
 * since start, the budget. */
int fp4idx_test_buffered(int fd, uint64_t *held, uint64_t *peak, uint64_t *budget);
/* The daemon's open connections, from `stats`. */
int fp4idx_test_connections(int fd, uint64_t *n);

/* Barriers on a connection's socket (an order of events a test needs,
 * observed rather than slept for), each waiting at most ms: 0 once the
 * condition holds, -1 at the deadline. _sent: the daemon has read every
 * byte written on fd (the socket's send queue, SIOCOUTQ, is empty);
 * _unread: at least `bytes` of replies wait unread on fd (FIONREAD). */
int fp4idx_test_wait_sent(int fd, int ms);
int fp4idx_test_wait_unread(int fd, size_t bytes, int ms);
int fp4idx_test_truncate(int fd, uint64_t seq, uint64_t length);
int fp4idx_test_drop(int fd, uint64_t seq);
/* Reads packed slots [from, from+count) into out (count*68 bytes). */
int fp4idx_test_read(int fd, uint64_t seq, uint64_t from, uint64_t count, void *out,
                     uint64_t *got);
/* Fills *req (zeroed first) as a score of one sequence *s: q bf16
 * [R,H,128], w bf16 [R,H], lens (NULL = all), top-k k (0 = full logits).
 * The views point at the caller's arrays. 0 or a codec status. */
int fp4idx_test_score_request(fp4idx_request_t *req, fp4idx_score_seq_t *s, uint64_t id,
                              uint64_t seq, uint32_t heads, uint32_t topk, uint32_t rows,
                              const uint16_t *q, const uint16_t *w, const int32_t *lens);

/* Full-logit score of one sequence: q bf16 [R,H,128], w bf16 [R,H], lens
 * (NULL = all). *logits malloc'd [R, *width] f32. */
int fp4idx_test_score(int fd, uint64_t seq, uint32_t heads, uint32_t rows,
                      const uint16_t *q, const uint16_t *w, const int32_t *lens,
                      float **logits, uint64_t *width);

#endif /* FP4IDX_DAEMON_HARNESS_H */
