/* test_daemon_sharing.c -- the GPU sharing mode (daemon/sharing.c): what
 * the driver's MPS attribute and NVML's process lists make of it, and the
 * daemon's info/stats on the CPU backend; plus the NVML probe where NVML is
 * missing (it must answer -1, never fail). */
#include <criterion/criterion.h>
#include <string.h>

#include "sharing.h"

#define SELF 1000u

static fp4idx_sharing_t decide(int gpu, int mps, int known, const fp4idx_gpu_proc_t *p,
                               size_t n) {
  fp4idx_sharing_in_t in = {.gpu = gpu,
                            .mps = mps,
                            .procs_known = known,
                            .procs = p,
                            .nprocs = n,
                            .self = SELF,
                            .device = "NVIDIA H200 (00000000:19:00.0)",
                            .device_index = 3};
  fp4idx_sharing_t out;
  memset(&out, 0x5a, sizeof out);
  fp4idx__sharing_decide(&in, &out);
  return out;
}

Test(sharing, names) {
  cr_assert_str_eq(fp4idx__sharing_name(FP4IDX_SHARING_NONE), "none");
  cr_assert_str_eq(fp4idx__sharing_name(FP4IDX_SHARING_UNKNOWN), "unknown");
  cr_assert_str_eq(fp4idx__sharing_name(FP4IDX_SHARING_EXCLUSIVE), "exclusive");
  cr_assert_str_eq(fp4idx__sharing_name(FP4IDX_SHARING_TIME_SLICE), "time_slice");
  cr_assert_str_eq(fp4idx__sharing_name(FP4IDX_SHARING_MPS), "mps");
  cr_assert_str_eq(fp4idx__sharing_name((fp4idx_sharing_mode_t)99), "unknown");
}

Test(sharing, cpu_backend_is_none) {
  fp4idx_gpu_proc_t p[] = {{SELF, 0}, {7, 0}};
  fp4idx_sharing_t s = decide(0, 0, 1, p, 2);
  cr_assert_eq(s.mode, FP4IDX_SHARING_NONE);
  cr_assert_eq(s.other_processes, 0);
  cr_assert_str_eq(s.warning, "");
  fp4idx__sharing_decide(NULL, &s);
  cr_assert_eq(s.mode, FP4IDX_SHARING_NONE);
}

Test(sharing, alone_is_exclusive) {
  fp4idx_gpu_proc_t p[] = {{SELF, 0}};
  fp4idx_sharing_t s = decide(1, 0, 1, p, 1);
  cr_assert_eq(s.mode, FP4IDX_SHARING_EXCLUSIVE);
  cr_assert_eq(s.other_processes, 0);
  cr_assert_str_eq(s.warning, "");
  /* an empty list (our context not listed yet) is alone too */
  s = decide(1, 0, 1, NULL, 0);
  cr_assert_eq(s.mode, FP4IDX_SHARING_EXCLUSIVE);
  cr_assert_eq(s.other_processes, 0);
}

Test(sharing, others_without_mps_are_time_slices) {
  fp4idx_gpu_proc_t p[] = {{SELF, 0}, {7, 0}, {8, 0}, {7, 0}};
  fp4idx_sharing_t s = decide(1, 0, 1, p, 4);
  cr_assert_eq(s.mode, FP4IDX_SHARING_TIME_SLICE);
  cr_assert_eq(s.other_processes, 2, "pid 7 listed twice counts once");
  cr_assert(strstr(s.warning, "time slices") != NULL, "%s", s.warning);
  cr_assert(strstr(s.warning, "2 other process") != NULL, "%s", s.warning);
  cr_assert(strstr(s.warning, "fp4idx-mps@3") != NULL, "names the unit: %s", s.warning);
  cr_assert(strstr(s.warning, "NVIDIA H200 (00000000:19:00.0)") != NULL, "%s", s.warning);
  cr_assert(strstr(s.warning, "deploy/README.md") != NULL, "%s", s.warning);
}

Test(sharing, self_missing_is_another_pid_namespace) {
  /* NVML lists host pids; in a container ours differs: one of them is us */
  fp4idx_gpu_proc_t one[] = {{41, 0}};
  fp4idx_sharing_t s = decide(1, 0, 1, one, 1);
  cr_assert_eq(s.mode, FP4IDX_SHARING_EXCLUSIVE);
  cr_assert_eq(s.other_processes, 0);
  fp4idx_gpu_proc_t two[] = {{41, 0}, {42, 0}};
  s = decide(1, 0, 1, two, 2);
  cr_assert_eq(s.mode, FP4IDX_SHARING_TIME_SLICE);
  cr_assert_eq(s.other_processes, 1);
}

Test(sharing, mps_from_the_driver) {
  /* the MPS server holds the context; the clients are us and the engine */
  fp4idx_gpu_proc_t p[] = {{5, 1}, {SELF, 0}, {7, 0}};
  fp4idx_sharing_t s = decide(1, 1, 1, p, 3);
  cr_assert_eq(s.mode, FP4IDX_SHARING_MPS);
  cr_assert_eq(s.other_processes, 1, "the server is not counted");
  cr_assert_str_eq(s.warning, "");
  /* alone under MPS */
  fp4idx_gpu_proc_t q[] = {{5, 1}, {SELF, 0}};
  s = decide(1, 1, 1, q, 2);
  cr_assert_eq(s.mode, FP4IDX_SHARING_MPS);
  cr_assert_eq(s.other_processes, 0);
  /* MPS without NVML: still mps (the driver says so), nobody counted */
  s = decide(1, 1, 0, NULL, 0);
  cr_assert_eq(s.mode, FP4IDX_SHARING_MPS);
  cr_assert_eq(s.other_processes, 0);
}

Test(sharing, mps_from_the_server_when_the_driver_does_not_say) {
  fp4idx_gpu_proc_t p[] = {{5, 1}, {SELF, 0}, {7, 0}, {9, 0}};
  fp4idx_sharing_t s = decide(1, -1, 1, p, 4);
  cr_assert_eq(s.mode, FP4IDX_SHARING_MPS);
  cr_assert_eq(s.other_processes, 2);
  /* no server, attribute unknown: the list decides */
  fp4idx_gpu_proc_t q[] = {{SELF, 0}, {7, 0}};
  s = decide(1, -1, 1, q, 2);
  cr_assert_eq(s.mode, FP4IDX_SHARING_TIME_SLICE);
}

Test(sharing, driver_says_no_mps_despite_a_server) {
  /* an MPS server for other users or an earlier start: we are not its client */
  fp4idx_gpu_proc_t p[] = {{5, 1}, {SELF, 0}};
  fp4idx_sharing_t s = decide(1, 0, 1, p, 2);
  cr_assert_eq(s.mode, FP4IDX_SHARING_EXCLUSIVE);
  cr_assert_eq(s.other_processes, 0);
}

Test(sharing, no_nvml_is_unknown) {
  fp4idx_sharing_t s = decide(1, 0, 0, NULL, 0);
  cr_assert_eq(s.mode, FP4IDX_SHARING_UNKNOWN);
  cr_assert_eq(s.other_processes, 0);
  cr_assert_str_eq(s.warning, "");
  /* procs ignored when not known */
  fp4idx_gpu_proc_t p[] = {{SELF, 0}, {7, 0}};
  s = decide(1, -1, 0, p, 2);
  cr_assert_eq(s.mode, FP4IDX_SHARING_UNKNOWN);
}

Test(sharing, probe_without_a_gpu_answers_minus_one) {
  fp4idx_gpu_proc_t p[4];
  cr_assert_eq(fp4idx__gpu_procs(NULL, p, 4), -1);
  cr_assert_eq(fp4idx__gpu_procs("", p, 4), -1);
  /* a bus id no GPU has: NVML missing or the device unknown, -1 either way */
  cr_assert_eq(fp4idx__gpu_procs("0000:ff:1f.7", p, 4), -1);
}
