/* test_daemon_memory.c -- what a client can make the real daemon allocate.
 *
 * Regression: the frame reader used to malloc the whole announced body when
 * the 4-byte header arrived, so connections that each announce max_frame
 * (64 MiB) and send nothing more made the daemon allocate 64 MiB apiece
 * (1024 connections: 64 GiB of address space, all of it committed under
 * strict overcommit). The reader now grows its buffer as bytes arrive
 * (protocol/frame.c). Measured on the daemon's VmData (private writable
 * mappings: what malloc took, touched or not), which the old reader raised
 * by 64 MiB per connection. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_harness.h"

#define NCONN 64

Test(daemon_memory, announced_frames_do_not_allocate_their_length) {
  fp4idx_test_daemon_t d;
  int fds[NCONN];
  fp4idx_info_t info;
  memset(&d, 0, sizeof d);
  cr_assert_eq(fp4idx_test_daemon_start(&d, NULL), 0);
  int ctl = fp4idx_test_connect(d.sock);
  cr_assert_geq(ctl, 0);
  cr_assert_eq(fp4idx_test_info(ctl, &info), 0);
  cr_assert_eq(info.max_frame, (uint64_t)FP4IDX_MAX_FRAME_DEFAULT);
  long before = fp4idx_test_proc_kib(d.pid, "VmData");
  cr_assert_gt(before, 0);

  /* Each connection: a header announcing exactly max_frame (allowed), then
   * 10 body bytes, then silence. */
  unsigned char msg[14];
  fp4idx_frame_header_put(msg, (uint32_t)info.max_frame);
  memcpy(msg + 4, "0123456789", 10);
  for (int i = 0; i < NCONN; i++) {
    fds[i] = fp4idx_test_connect(d.sock);
    cr_assert_geq(fds[i], 0, "connection %d", i);
    cr_assert_eq(fp4idx_test_send_all(fds[i], msg, sizeof msg), 0);
  }
  /* The loop reads them in its own time (they stay mid-frame, so nothing
   * answers on them): sample for 200 ms, with a round trip on the control
   * connection before each sample, and keep the peak. */
  long peak = before;
  for (int t = 0; t < 20; t++) {
    cr_assert_eq(fp4idx_test_info(ctl, &info), 0, "daemon still answers");
    long now = fp4idx_test_proc_kib(d.pid, "VmData");
    if (now > peak) peak = now;
    usleep(10000);
  }
  long grew = peak - before;
  cr_log_info("VmData grew by %ld KiB for %d connections", grew, NCONN);
  /* Old reader: >= NCONN x 64 MiB = 4 GiB. Now: per connection the 64 KiB
   * scratch buffer plus a 4 KiB body; allow allocator slack. */
  cr_assert_lt(grew, 64L * 1024, "VmData grew by %ld KiB for %d connections announcing %llu B",
               grew, NCONN, (unsigned long long)info.max_frame);

  /* The daemon is fine and drops the partial frames when the peers leave. */
  for (int i = 0; i < NCONN; i++) close(fds[i]);
  cr_assert_eq(fp4idx_test_info(ctl, &info), 0);
  close(ctl);
  cr_assert_eq(fp4idx_test_daemon_stop(&d), 0, "daemon exit code");
}
