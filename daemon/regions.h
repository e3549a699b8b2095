/* regions.h -- the memory regions of one connection (PROTOCOL.md "Regions").
 *
 * A client on the same host registers a region once (a sealed memfd passed
 * with SCM_RIGHTS, or a cudaIpcMemHandle_t) and then names {region, offset,
 * dtype, shape} instead of sending tensor bytes. The table belongs to the
 * connection that registered the regions: no other connection can name
 * them, and they are released when it closes.
 *
 * Safety: the daemon keeps its own mapping (host) or opened handle (CUDA),
 * so a client that closes its fd or unmaps its side changes nothing here. A
 * host region must be a memfd sealed with F_SEAL_SHRINK and at least `size`
 * bytes long, so the file can never shrink under the mapping (which would
 * make a read SIGBUS); every reference is checked against the region's size
 * and its dtype's alignment before a request touches anything.
 *
 * Threading: worker thread only (the handlers and the release job), so
 * regions are in order with the requests that use them.
 */
#ifndef FP4IDX_DAEMON_REGIONS_H
#define FP4IDX_DAEMON_REGIONS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fp4idx_codec.h"
#include "worker.h"

typedef struct fp4idx_region_s {
  uint64_t id;    /* 0: the slot is free */
  int kind;       /* FP4IDX_REGION_HOST | FP4IDX_REGION_CUDA */
  uint8_t *base;  /* host: the daemon's own mapping; cuda: device pointer */
  uint64_t size;  /* bytes */
  int pinned;     /* host region registered with cudaHostRegister */
} fp4idx_region_t;

typedef struct fp4idx_regions_s {
  fp4idx_region_t r[FP4IDX_PROTO_MAX_REGIONS];
  uint64_t bytes;      /* sum of the sizes */
  uint64_t next_id;    /* ids are never reused on a connection */
  uint64_t conn_id;    /* for logs */
  pid_t pid;           /* SO_PEERCRED of the connection, for logs */
  uid_t uid;
  gid_t gid;
  int cuda_device;     /* the daemon's CUDA device, -1 on the CPU backend */
  fp4idx_job_t release; /* the job that frees the table when the connection closes */
  /* The connection's channels (channel.h), closed by fp4idx__regions_clear
   * through on_clear before the regions go (worker thread). */
  struct fp4idx_channel_s *channels;
  uint64_t next_channel_id; /* channel ids are never reused on a connection */
  void (*on_clear)(struct fp4idx_regions_s *rs);
} fp4idx_regions_t;

/* Initialises an empty table for connection conn_id; cuda_device is the
 * CUDA backend's device ordinal, or -1 (host regions are then not pinned
 * and CUDA regions are refused). */
void fp4idx__regions_init(fp4idx_regions_t *rs, uint64_t conn_id, int cuda_device);

/* Registers a host region: maps `size` bytes of the memfd `fd` shared and
 * read-write (and pins them on the CUDA backend). The caller closes fd
 * afterwards either way. Sets *id. Returns FP4IDX_OK, FP4IDX_EREGION (no
 * fd, not a regular file, not sealed with F_SEAL_SHRINK, shorter than size,
 * not mappable read-write), FP4IDX_E2BIG (the connection's caps on regions
 * or bytes), with the reason in msg. */
int fp4idx__regions_add_host(fp4idx_regions_t *rs, int fd, uint64_t size, uint64_t *id,
                             char *msg, size_t cap);

/* Registers a CUDA region from the bytes of a cudaIpcMemHandle_t exported
 * on device `device` (an ordinal of the daemon's numbering). Sets *id.
 * Returns FP4IDX_OK, FP4IDX_EREGION (CPU backend, another device, a handle
 * the driver refuses, an allocation smaller than size), FP4IDX_E2BIG
 * (caps), FP4IDX_EDEVICE. */
int fp4idx__regions_add_cuda(fp4idx_regions_t *rs, const void *handle, size_t handle_len,
                             uint64_t device, uint64_t size, uint64_t *id, char *msg,
                             size_t cap);

/* Releases region `id`. FP4IDX_OK or FP4IDX_ENOREGION. */
int fp4idx__regions_remove(fp4idx_regions_t *rs, uint64_t id, char *msg, size_t cap);

/* Checks that fd is a memfd sealed with F_SEAL_SHRINK and at least `size`
 * bytes long, and maps `size` bytes of it shared and read-write into *base
 * (the caller munmaps it). Returns FP4IDX_OK, FP4IDX_EREGION (the reason in
 * msg) or FP4IDX_E2BIG (size above SIZE_MAX). */
int fp4idx__memfd_map(int fd, uint64_t size, void **base, char *msg, size_t cap);

/* Releases every region (the connection closed), its channels first. */
void fp4idx__regions_clear(fp4idx_regions_t *rs);

/* The region registered as `id` on rs, or NULL (also for id 0 and rs NULL). */
const fp4idx_region_t *fp4idx__regions_find(const fp4idx_regions_t *rs, uint64_t id);

/* Checks a reference (t->region != 0) named `what` in messages: the region
 * exists on this connection (FP4IDX_ENOREGION; also when rs is NULL), the
 * offset is a multiple of the dtype's size and [offset, offset + nbytes)
 * lies inside the region (FP4IDX_EREGION). Sets *out. */
int fp4idx__regions_check(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t,
                          const char *what, const fp4idx_region_t **out, char *msg,
                          size_t cap);

/* Copies n bytes at offset off of a checked region into dst / from src
 * (memcpy for host regions, cudaMemcpy for CUDA ones). FP4IDX_OK or
 * FP4IDX_EDEVICE. */
int fp4idx__region_read(const fp4idx_region_t *r, uint64_t off, void *dst, size_t n);
int fp4idx__region_write(const fp4idx_region_t *r, uint64_t off, const void *src, size_t n);

/* ---- the CUDA side (regions_cuda.c; stubs without the CUDA backend) ------ */

/* Pins / unpins a host mapping (cudaHostRegister) on `device`. */
int fp4idx__region_cuda_pin(int device, void *base, uint64_t size);
void fp4idx__region_cuda_unpin(int device, void *base);

/* Opens a cudaIpcMemHandle_t on `device`; checks that the allocation behind
 * it holds at least `size` bytes from the returned pointer. FP4IDX_OK,
 * FP4IDX_EREGION (msg says why) or FP4IDX_ENODEV (no CUDA in this build). */
int fp4idx__region_cuda_open(int device, const void *handle, uint64_t size, void **ptr,
                             char *msg, size_t cap);
void fp4idx__region_cuda_close(int device, void *ptr);

/* cudaMemcpy between a device region and host memory. FP4IDX_OK or
 * FP4IDX_EDEVICE. */
int fp4idx__region_cuda_copy(int device, void *dst, const void *src, size_t n, int to_device);

/* Snapshots of device regions, several per wait: _start queues a copy of n
 * bytes from device memory src to host memory dst on the calling thread's
 * own copy stream (asynchronous when dst is pinned, e.g. from the backend's
 * host_alloc: the copies of one request then overlap instead of paying a
 * DMA round trip each); _wait returns once every copy this thread started
 * has landed. On the current device. FP4IDX_OK, FP4IDX_EDEVICE (logged), or
 * FP4IDX_ENODEV without CUDA in this build. */
int fp4idx__region_cuda_read_start(void *dst, const void *src, size_t n);
int fp4idx__region_cuda_read_wait(void);

#endif /* FP4IDX_DAEMON_REGIONS_H */
