/* notify.h -- systemd integration: readiness notification (Type=notify),
 * status lines, the watchdog, and socket activation (LISTEN_FDS).
 *
 * Built on libsystemd's sd_notify/sd_listen_fds when the build found it
 * (FP4IDX_HAVE_SYSTEMD); otherwise a small built-in implementation of the
 * same (documented, stable) protocols, so the daemon behaves the same either
 * way. Without NOTIFY_SOCKET in the environment every notify call is a no-op
 * returning 0, so the daemon runs unchanged outside systemd.
 *
 * Daemon usage: take the listening fd from fp4idx_notify_listen_fd() before
 * binding; send READY once the socket listens; ping the watchdog from a loop
 * timer every fp4idx_notify_watchdog_usec() / 2; send STOPPING when shutdown
 * begins.
 */
#ifndef FP4IDX_NOTIFY_H
#define FP4IDX_NOTIFY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Socket activation. If LISTEN_PID is this process and LISTEN_FDS is 1, checks
 * that fd 3 is a listening Unix stream socket, marks it close-on-exec, clears
 * the LISTEN_* variables (so children don't inherit them) and stores it in
 * *fd. Returns 1 (fd inherited), 0 (not socket-activated), or a negative
 * fp4idx status: FP4IDX_EINVAL when several fds or a socket of the wrong kind
 * were passed (message in err). */
int fp4idx_notify_listen_fd(int *fd, char *err, size_t errlen);

/* Sends "READY=1" plus "STATUS=<status>" when status is not NULL.
 * Returns 1 (sent), 0 (no NOTIFY_SOCKET), or FP4IDX_EIO. */
int fp4idx_notify_ready(const char *status);

/* Sends "STOPPING=1" plus the optional status line. Same returns. */
int fp4idx_notify_stopping(const char *status);

/* Sends "STATUS=<printf format>" (one line; newlines are replaced by spaces).
 * Same returns. */
int fp4idx_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Sends "WATCHDOG=1". Same returns. */
int fp4idx_notify_watchdog(void);

/* The watchdog interval systemd expects pings within (WATCHDOG_USEC, for this
 * process per WATCHDOG_PID), in microseconds; 0 when no watchdog is set. */
uint64_t fp4idx_notify_watchdog_usec(void);

/* Sends an arbitrary notification (newline-separated VAR=value lines). Same
 * returns. */
int fp4idx_notify_raw(const char *state);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_NOTIFY_H */
