/* regions.c -- a connection's host and CUDA regions: register (checks,
 * mapping), references (bounds, alignment), release. See regions.h. */
#define _GNU_SOURCE
#include "regions.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "fp4idx_fail.h"
#include "log.h"

void fp4idx__regions_init(fp4idx_regions_t *rs, uint64_t conn_id, int cuda_device) {
  memset(rs, 0, sizeof *rs);
  rs->conn_id = conn_id;
  rs->cuda_device = cuda_device;
  rs->pid = -1;
  rs->uid = (uid_t)-1;
  rs->gid = (gid_t)-1;
}

/* A free slot after the caps on count and bytes, or NULL with the error. */
static fp4idx_region_t *fp4idx__regions_slot(fp4idx_regions_t *rs, uint64_t size, int *rc,
                                             char *msg, size_t cap) {
  if (size > FP4IDX_PROTO_MAX_REGION_BYTES - rs->bytes) {
    *rc = fp4idx__fail(msg, cap, FP4IDX_E2BIG,
                       "region of %" PRIu64 " bytes: the connection would hold more than "
                       "%" PRIu64 " bytes of regions",
                       size, FP4IDX_PROTO_MAX_REGION_BYTES);
    return NULL;
  }
  for (unsigned i = 0; i < FP4IDX_PROTO_MAX_REGIONS; i++)
    if (rs->r[i].id == 0) return &rs->r[i];
  *rc = fp4idx__fail(msg, cap, FP4IDX_E2BIG, "the connection already holds %u regions",
                     FP4IDX_PROTO_MAX_REGIONS);
  return NULL;
}

static void fp4idx__regions_log_added(const fp4idx_regions_t *rs, const fp4idx_region_t *r) {
  fp4idx__log_info("connection %" PRIu64 " (pid %ld uid %ld gid %ld): registered %s region %" PRIu64
                   ", %" PRIu64 " bytes%s",
                   rs->conn_id, (long)rs->pid, (long)rs->uid, (long)rs->gid,
                   r->kind == FP4IDX_REGION_HOST ? "host" : "cuda", r->id, r->size,
                   r->pinned ? ", pinned" : "");
}

int fp4idx__memfd_map(int fd, uint64_t size, void **base, char *msg, size_t cap) {
  *base = NULL;
  if (fd < 0)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "a host region needs its memfd sent with SCM_RIGHTS in the same "
                        "sendmsg as the request");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return fp4idx__fail(msg, cap, FP4IDX_EREGION, "the file descriptor is not a memfd");
  /* Only a file that cannot shrink is safe to map: a shrunk file makes the
   * daemon's next access to the lost pages SIGBUS. */
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "the file descriptor cannot be sealed (a POSIX shm object or a "
                        "file could shrink under the mapping): use memfd_create with "
                        "MFD_ALLOW_SEALING and seal it with F_SEAL_SHRINK");
  if (!(seals & F_SEAL_SHRINK))
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "the memfd is not sealed with F_SEAL_SHRINK (it could shrink "
                        "under the mapping)");
  if ((uint64_t)st.st_size < size)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "size %" PRIu64 " is larger than the memfd (%lld bytes)", size,
                        (long long)st.st_size);
  if (size > SIZE_MAX) return fp4idx__fail(msg, cap, FP4IDX_E2BIG, "size too large");
  void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "cannot map the memfd read-write: %s (is it sealed against "
                        "writes?)",
                        strerror(errno));
  *base = p;
  return FP4IDX_OK;
}

int fp4idx__regions_add_host(fp4idx_regions_t *rs, int fd, uint64_t size, uint64_t *id,
                             char *msg, size_t cap) {
  int rc = FP4IDX_OK;
  void *base = NULL;
  rc = fp4idx__memfd_map(fd, size, &base, msg, cap);
  if (rc) return rc;
  fp4idx_region_t *r = fp4idx__regions_slot(rs, size, &rc, msg, cap);
  if (!r) {
    munmap(base, (size_t)size);
    return rc;
  }
  *r = (fp4idx_region_t){.id = ++rs->next_id, .kind = FP4IDX_REGION_HOST, .base = base,
                         .size = size};
  /* Pinned pages let the CUDA backend's copies go straight in and out. A
   * region that cannot be pinned (memlock limit) still works, more slowly. */
  if (rs->cuda_device >= 0) {
    if (fp4idx__region_cuda_pin(rs->cuda_device, base, size) == FP4IDX_OK)
      r->pinned = 1;
    else
      fp4idx__log_warn("connection %" PRIu64 ": host region %" PRIu64
                       " could not be pinned; copies will be staged",
                       rs->conn_id, r->id);
  }
  rs->bytes += size;
  *id = r->id;
  fp4idx__regions_log_added(rs, r);
  return FP4IDX_OK;
}

int fp4idx__regions_add_cuda(fp4idx_regions_t *rs, const void *handle, size_t handle_len,
                             uint64_t device, uint64_t size, uint64_t *id, char *msg,
                             size_t cap) {
  int rc = FP4IDX_OK;
  if (rs->cuda_device < 0)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "CUDA regions need the CUDA backend; this daemon runs the CPU "
                        "backend");
  if (device != (uint64_t)rs->cuda_device)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "the handle is from device %" PRIu64 ", the daemon runs on device %d",
                        device, rs->cuda_device);
  if (handle_len != FP4IDX_PROTO_CUDA_HANDLE)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION, "a CUDA IPC handle has %u bytes",
                        FP4IDX_PROTO_CUDA_HANDLE);
  fp4idx_region_t *r = fp4idx__regions_slot(rs, size, &rc, msg, cap);
  if (!r) return rc;
  void *ptr = NULL;
  rc = fp4idx__region_cuda_open(rs->cuda_device, handle, size, &ptr, msg, cap);
  if (rc) return rc;
  *r = (fp4idx_region_t){.id = ++rs->next_id, .kind = FP4IDX_REGION_CUDA, .base = ptr,
                         .size = size};
  rs->bytes += size;
  *id = r->id;
  fp4idx__regions_log_added(rs, r);
  return FP4IDX_OK;
}

static void fp4idx__region_release(fp4idx_regions_t *rs, fp4idx_region_t *r) {
  if (r->kind == FP4IDX_REGION_HOST) {
    if (r->pinned) fp4idx__region_cuda_unpin(rs->cuda_device, r->base);
    munmap(r->base, (size_t)r->size);
  } else {
    fp4idx__region_cuda_close(rs->cuda_device, r->base);
  }
  rs->bytes -= r->size;
  memset(r, 0, sizeof *r);
}

const fp4idx_region_t *fp4idx__regions_find(const fp4idx_regions_t *rs, uint64_t id) {
  for (unsigned i = 0; rs && id && i < FP4IDX_PROTO_MAX_REGIONS; i++)
    if (rs->r[i].id == id) return &rs->r[i];
  return NULL;
}

int fp4idx__regions_remove(fp4idx_regions_t *rs, uint64_t id, char *msg, size_t cap) {
  const fp4idx_region_t *r = fp4idx__regions_find(rs, id);
  if (r) {
    fp4idx__region_release(rs, &rs->r[r - rs->r]);
    return FP4IDX_OK;
  }
  return fp4idx__fail(msg, cap, FP4IDX_ENOREGION,
                      "region %" PRIu64 " is not registered on this connection", id);
}

void fp4idx__regions_clear(fp4idx_regions_t *rs) {
  if (rs->on_clear) rs->on_clear(rs); /* its channels first: they use the regions */
  rs->on_clear = NULL;
  for (unsigned i = 0; i < FP4IDX_PROTO_MAX_REGIONS; i++)
    if (rs->r[i].id) fp4idx__region_release(rs, &rs->r[i]);
}

int fp4idx__regions_check(const fp4idx_regions_t *rs, const fp4idx_tensor_t *t,
                          const char *what, const fp4idx_region_t **out, char *msg,
                          size_t cap) {
  const fp4idx_region_t *r = fp4idx__regions_find(rs, t->region);
  if (!r)
    return fp4idx__fail(msg, cap, FP4IDX_ENOREGION,
                        "%s: region %" PRIu64 " is not registered on this connection", what,
                        t->region);
  size_t item = fp4idx_wire_dtype_size(t->dtype);
  if (item == 0 || t->offset % item != 0)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "%s: offset %" PRIu64 " is not a multiple of %zu (the size of %s)",
                        what, t->offset, item, fp4idx_wire_dtype_name(t->dtype));
  if (t->offset > r->size || t->nbytes > r->size - t->offset)
    return fp4idx__fail(msg, cap, FP4IDX_EREGION,
                        "%s: bytes [%" PRIu64 ", %" PRIu64 " + %zu) are outside region %" PRIu64
                        " (%" PRIu64 " bytes)",
                        what, t->offset, t->offset, t->nbytes, r->id, r->size);
  *out = r;
  return FP4IDX_OK;
}

int fp4idx__region_read(const fp4idx_region_t *r, uint64_t off, void *dst, size_t n) {
  if (n == 0) return FP4IDX_OK;
  if (r->kind == FP4IDX_REGION_HOST) {
    memcpy(dst, r->base + off, n);
    return FP4IDX_OK;
  }
  return fp4idx__region_cuda_copy(-1, dst, r->base + off, n, 0);
}

int fp4idx__region_write(const fp4idx_region_t *r, uint64_t off, const void *src, size_t n) {
  if (n == 0) return FP4IDX_OK;
  if (r->kind == FP4IDX_REGION_HOST) {
    memcpy(r->base + off, src, n);
    return FP4IDX_OK;
  }
  return fp4idx__region_cuda_copy(-1, r->base + off, src, n, 1);
}
