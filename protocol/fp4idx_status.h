/* fp4idx_status.h -- the one list of fp4idx status codes.
 *
 * Every layer (kernels, backends, daemon, wire, client, CLI) returns these.
 * 0 is success, errors are negative and their numbers are STABLE: they travel
 * on the wire (protocol/PROTOCOL.md lists them) and clients switch on them,
 * never on messages. Add new codes at the end with a new number; never reuse
 * or renumber one.
 *
 * The X-macro generates the enum and the name/message tables together, so a
 * code and its string never drift apart (the libuv UV_ERRNO_MAP idea).
 */
#ifndef FP4IDX_STATUS_H
#define FP4IDX_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, number, message) */
#define FP4IDX_STATUS_MAP(X)                                                   \
  X(OK, 0, "success")                                                          \
  X(EINVAL, -1, "invalid argument")                                            \
  X(EPROTO, -2, "malformed frame or message")                                  \
  X(E2BIG, -3, "frame or field exceeds a limit")                               \
  X(ETYPE, -4, "unknown request type")                                         \
  X(EVERSION, -5, "unsupported protocol version")                              \
  X(ESHAPE, -6, "tensor shape or dtype does not match")                        \
  X(ENOSEQ, -7, "unknown sequence")                                            \
  X(ERANGE, -8, "position or visible count out of range")                      \
  X(ENONFINITE, -9, "non-finite value (NaN or inf) in a key, q or w")          \
  X(EFULL, -10, "page pool is full")                                           \
  X(ENOMEM, -11, "out of host memory")                                         \
  X(ENODEV, -12, "no such device or backend not available")                    \
  X(EDEVICE, -13, "device (CUDA) error")                                       \
  X(ETIMEDOUT, -14, "timed out")                                               \
  X(ECONN, -15, "connection failed or closed")                                 \
  X(EIO, -16, "input/output error")                                            \
  X(ECORRUPT, -17, "corrupt snapshot or log")                                  \
  X(ESHUTDOWN, -18, "daemon is shutting down")                                 \
  X(EEXIST, -19, "already exists")                                             \
  X(EINTERNAL, -20, "internal error")                                          \
  X(EDISABLED, -21, "not enabled in this daemon")

typedef enum fp4idx_status_e {
#define FP4IDX__STATUS_ENUM(name, num, msg) FP4IDX_##name = (num),
  FP4IDX_STATUS_MAP(FP4IDX__STATUS_ENUM)
#undef FP4IDX__STATUS_ENUM
} fp4idx_status_t;

/* Returns a static, human-readable message for `status`; never NULL
 * ("unknown status" for numbers not in the list). */
const char *fp4idx_strerror(int status);

/* Returns the code's name without prefix ("EINVAL"); "UNKNOWN" if not listed. */
const char *fp4idx_status_name(int status);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_STATUS_H */
