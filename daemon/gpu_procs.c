/* gpu_procs.c -- the processes on a GPU, from NVML (sharing.h).
 *
 * NVML is the driver's libnvidia-ml.so.1, opened with dlopen on the first
 * call and kept: the daemon neither links it nor needs its header, and a
 * host without it (a container without the driver's utilities) gets -1 and
 * mode "unknown" or "mps", never a failed start. Only the few entry points
 * used are declared, with the layouts of NVML's v2 process record (the one
 * the _v3 list functions fill).
 */
#define _GNU_SOURCE /* dlopen flags */
#include "sharing.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int nvml_return_t; /* nvmlReturn_t: 0 success */
typedef struct nvml_device_s *nvml_device_t;
typedef struct nvml_process_info_s { /* nvmlProcessInfo_v2_t */
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
} nvml_process_info_t;

#define FP4IDX__NVML_INSUFFICIENT_SIZE 7
#define FP4IDX__NVML_MAX_PROCS 256

typedef nvml_return_t (*nvml_init_fn)(void);
typedef nvml_return_t (*nvml_handle_fn)(const char *bus, nvml_device_t *dev);
typedef nvml_return_t (*nvml_procs_fn)(nvml_device_t dev, unsigned int *count,
                                       nvml_process_info_t *infos);
typedef nvml_return_t (*nvml_name_fn)(unsigned int pid, char *name, unsigned int len);

static struct {
  int tried, ok;
  nvml_handle_fn handle;
  nvml_procs_fn compute, mps;
  nvml_name_fn name;
} fp4idx__nvml;

static int fp4idx__nvml_load(void) {
  if (fp4idx__nvml.tried) return fp4idx__nvml.ok;
  fp4idx__nvml.tried = 1;
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  nvml_init_fn init = (nvml_init_fn)dlsym(lib, "nvmlInit_v2");
  fp4idx__nvml.handle = (nvml_handle_fn)dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
  fp4idx__nvml.compute = (nvml_procs_fn)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
  fp4idx__nvml.mps = (nvml_procs_fn)dlsym(lib, "nvmlDeviceGetMPSComputeRunningProcesses_v3");
  fp4idx__nvml.name = (nvml_name_fn)dlsym(lib, "nvmlSystemGetProcessName");
  if (!init || !fp4idx__nvml.handle || !fp4idx__nvml.compute || init() != 0) {
    dlclose(lib);
    return 0;
  }
  /* kept open and initialized for the process's life */
  fp4idx__nvml.ok = 1;
  return 1;
}

/* 1 when pid's executable is the MPS server: NVML's name, else /proc. */
static int fp4idx__is_mps_server(unsigned int pid) {
  char name[256] = "";
  if (fp4idx__nvml.name == NULL || fp4idx__nvml.name(pid, name, sizeof name) != 0) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (f) {
      if (!fgets(name, sizeof name, f)) name[0] = '\0';
      fclose(f);
    }
  }
  return strstr(name, "nvidia-cuda-mps-server") != NULL;
}

/* Appends one NVML list to procs; -1 when it cannot be read. */
static int fp4idx__nvml_list(nvml_procs_fn fn, nvml_device_t dev, fp4idx_gpu_proc_t *procs,
                             size_t cap, size_t *n) {
  static nvml_process_info_t infos[FP4IDX__NVML_MAX_PROCS];
  unsigned int count = FP4IDX__NVML_MAX_PROCS;
  nvml_return_t rc = fn(dev, &count, infos);
  if (rc == FP4IDX__NVML_INSUFFICIENT_SIZE) count = FP4IDX__NVML_MAX_PROCS; /* the first ones */
  else if (rc != 0) return -1;
  if (count > FP4IDX__NVML_MAX_PROCS) count = FP4IDX__NVML_MAX_PROCS;
  for (unsigned int i = 0; i < count && *n < cap; i++) {
    procs[*n].pid = infos[i].pid;
    procs[*n].mps_server = fp4idx__is_mps_server(infos[i].pid);
    (*n)++;
  }
  return 0;
}

int fp4idx__gpu_procs(const char *bus, fp4idx_gpu_proc_t *procs, size_t cap) {
  if (!bus || !bus[0] || !procs || !fp4idx__nvml_load()) return -1;
  nvml_device_t dev = NULL;
  if (fp4idx__nvml.handle(bus, &dev) != 0) return -1;
  size_t n = 0;
  if (fp4idx__nvml_list(fp4idx__nvml.compute, dev, procs, cap, &n)) return -1;
  /* The MPS list names the MPS clients; a driver without it has only the
   * compute list. */
  if (fp4idx__nvml.mps) (void)fp4idx__nvml_list(fp4idx__nvml.mps, dev, procs, cap, &n);
  return (int)n;
}
