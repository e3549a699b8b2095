/* sharing.h -- how the daemon shares its GPU with other processes.
 *
 * A GPU that several processes use is shared in one of two ways. Without
 * MPS the contexts take turns in time slices of milliseconds: a request
 * that arrives while another process's slice runs waits for it (a 64-key
 * score: 71 us on an idle H200, 4.9 ms beside a busy engine). Under MPS
 * (the CUDA Multi-Process Service) the clients' kernels run side by side
 * on the SMs and a request waits only for the SMs it needs to drain (208 us
 * there). fp4idx__sharing_decide turns what the driver and NVML report into
 * the mode that info, stats and the metrics show, and the warning that the
 * daemon logs once when the GPU is shared by time slices. It is pure: the
 * probe that gathers its input is fp4idx__gpu_procs (gpu_procs.c).
 *
 * Modes:
 *   none        the CPU backend (no GPU)
 *   mps         the daemon is an MPS client (driver attribute
 *               cudaDevAttrMpsEnabled, or an nvidia-cuda-mps-server
 *               process on the GPU when the attribute is not known)
 *   time_slice  not under MPS, and other processes hold contexts on the GPU
 *   exclusive   not under MPS, and no other process holds one
 *   unknown     not under MPS, and the process list cannot be read (no
 *               NVML: libnvidia-ml.so.1 missing or failing)
 * other_processes counts the processes other than the daemon that hold a
 * compute context on the GPU (under MPS: the other MPS clients; the MPS
 * server itself is not counted).
 */
#ifndef FP4IDX_DAEMON_SHARING_H
#define FP4IDX_DAEMON_SHARING_H

#include <stddef.h>
#include <stdint.h>

#define FP4IDX_SHARING_MODE_MAP(X) \
  X(NONE, "none")                  \
  X(UNKNOWN, "unknown")            \
  X(EXCLUSIVE, "exclusive")        \
  X(TIME_SLICE, "time_slice")      \
  X(MPS, "mps")

typedef enum fp4idx_sharing_mode_e {
#define FP4IDX__SHARING_ENUM(id, name) FP4IDX_SHARING_##id,
  FP4IDX_SHARING_MODE_MAP(FP4IDX__SHARING_ENUM)
#undef FP4IDX__SHARING_ENUM
  FP4IDX_SHARING__COUNT
} fp4idx_sharing_mode_t;

/* One process with a context on the GPU, as NVML lists it. A pid may come
 * twice (the compute and the MPS lists). */
typedef struct fp4idx_gpu_proc_s {
  uint32_t pid;
  int mps_server; /* 1: the process is nvidia-cuda-mps-server */
} fp4idx_gpu_proc_t;

typedef struct fp4idx_sharing_in_s {
  int gpu;                        /* 0: the CPU backend (mode none) */
  int mps;                        /* driver: 1 MPS client, 0 not, -1 not known */
  int procs_known;                /* 1: procs is the GPU's process list */
  const fp4idx_gpu_proc_t *procs; /* [nprocs] */
  size_t nprocs;
  uint32_t self;                  /* the daemon's pid */
  const char *device;             /* for the warning, e.g. "NVIDIA H200 (...)" */
  int device_index;               /* CUDA ordinal, for the warning's unit name */
} fp4idx_sharing_in_t;

typedef struct fp4idx_sharing_s {
  fp4idx_sharing_mode_t mode;
  uint64_t other_processes;
  char warning[384]; /* "" unless mode is time_slice */
} fp4idx_sharing_t;

/* Decides the mode from `in` (see the top of this file). The daemon's own
 * pid may be missing from procs (NVML lists host pids, a container has its
 * own): then one of the listed processes is taken to be the daemon. */
void fp4idx__sharing_decide(const fp4idx_sharing_in_t *in, fp4idx_sharing_t *out);

/* "none", "mps", ...; "unknown" for a value out of range. */
const char *fp4idx__sharing_name(fp4idx_sharing_mode_t mode);

/* The processes with a compute context on the GPU with PCI bus id `bus`
 * (cudaDeviceGetPCIBusId's form), from NVML's compute and MPS lists, into
 * procs[0..cap). NVML is libnvidia-ml.so.1 opened at run time: the daemon
 * runs without it. Returns the number of entries (at most cap), or -1 when
 * NVML is missing or cannot read the list. Not thread-safe: one caller
 * thread (the daemon's loop). */
int fp4idx__gpu_procs(const char *bus, fp4idx_gpu_proc_t *procs, size_t cap);

#endif /* FP4IDX_DAEMON_SHARING_H */
