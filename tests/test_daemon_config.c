/* test_daemon_config.c -- fp4idxd command line parsing (daemon/config.c). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "config.h"
#include "fp4idx_status.h"

static int parse(fp4idx_config_t *cfg, const char *const *args) {
  char *argv[32];
  int argc = 0;
  argv[argc++] = (char *)"fp4idxd";
  for (int i = 0; args[i]; i++) argv[argc++] = (char *)args[i];
  argv[argc] = NULL;
  fp4idx__config_defaults(cfg);
  FILE *sink = fopen("/dev/null", "w");
  int rc = fp4idx__config_parse(cfg, argc, argv, sink, sink);
  fclose(sink);
  return rc;
}

Test(config, defaults) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){NULL}), 0);
  cr_assert_eq(cfg.backend, FP4IDX_BACKEND_AUTO);
  cr_assert_eq(cfg.page_size, 64);
  cr_assert_eq(cfg.max_frame, 64u << 20);
  cr_assert_eq(cfg.cache_bytes, 0);
  cr_assert_eq(cfg.socket_path[0], '\0');
}

Test(config, all_options) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket", "/tmp/x.sock", "--backend", "cpu",
                                            "--device", "3", "--cache-bytes", "512M",
                                            "--page-size", "128", "--max-frame", "1M",
                                            "--threads", "2", "--log-level", "debug", NULL}),
               0);
  cr_assert_str_eq(cfg.socket_path, "/tmp/x.sock");
  cr_assert_eq(cfg.backend, FP4IDX_BACKEND_CPU);
  cr_assert_eq(cfg.device, 3);
  cr_assert_eq(cfg.cache_bytes, 512ull << 20);
  cr_assert_eq(cfg.page_size, 128);
  cr_assert_eq(cfg.max_frame, 1u << 20);
  cr_assert_eq(cfg.threads, 2);
  cr_assert_eq(cfg.log_level, FP4IDX_LOG_DEBUG);
  cr_assert_eq(parse(&cfg, (const char *[]){"-b", "cuda", "-c", "2G", NULL}), 0);
  cr_assert_eq(cfg.backend, FP4IDX_BACKEND_CUDA);
  cr_assert_eq(cfg.cache_bytes, 2ull << 30);
}

Test(config, sizes) {
  uint64_t v;
  cr_assert_eq(fp4idx__config_parse_size("123", &v), 0);
  cr_assert_eq(v, 123);
  cr_assert_eq(fp4idx__config_parse_size("4K", &v), 0);
  cr_assert_eq(v, 4096);
  cr_assert_eq(fp4idx__config_parse_size("3m", &v), 0);
  cr_assert_eq(v, 3u << 20);
  cr_assert_eq(fp4idx__config_parse_size("1GiB", &v), 0);
  cr_assert_eq(v, 1u << 30);
  cr_assert_eq(fp4idx__config_parse_size("2T", &v), 0);
  cr_assert_eq(v, 2ull << 40);
  cr_assert_eq(fp4idx__config_parse_size("", &v), -1);
  cr_assert_eq(fp4idx__config_parse_size("-1", &v), -1);
  cr_assert_eq(fp4idx__config_parse_size("12X", &v), -1);
  cr_assert_eq(fp4idx__config_parse_size("M", &v), -1);
  cr_assert_eq(fp4idx__config_parse_size("99999999999999999999", &v), -1);
  cr_assert_eq(fp4idx__config_parse_size("17179869184G", &v), -1); /* overflow */
}

Test(config, rejects_bad_values) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){"--page-size", "48", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--page-size", "0", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--backend", "tpu", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--cache-bytes", "lots", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--cache-bytes", "0", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--max-frame", "10", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--device", "-1", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--log-level", "loud", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--frobnicate", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"extra", NULL}), FP4IDX_EINVAL);
  char longp[200];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = '\0';
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket", longp, NULL}), FP4IDX_EINVAL);
}

Test(config, help_and_version_say_exit_zero) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){"--help", NULL}), 1);
  cr_assert_eq(parse(&cfg, (const char *[]){"-V", NULL}), 1);
}

Test(config, default_socket_path) {
  char buf[108];
  setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
  cr_assert_eq(fp4idx__config_default_socket(buf, sizeof buf), 0);
  if (geteuid() == 0)
    cr_assert_str_eq(buf, "/run/fp4idx/fp4idxd.sock");
  else
    cr_assert_str_eq(buf, "/run/user/1234/fp4idx/fp4idxd.sock");
  unsetenv("XDG_RUNTIME_DIR");
  cr_assert_eq(fp4idx__config_default_socket(buf, sizeof buf), 0);
  cr_assert_str_eq(buf, "/run/fp4idx/fp4idxd.sock");
  cr_assert_eq(fp4idx__config_default_socket(buf, 8), FP4IDX_E2BIG);
}

Test(config, socket_mode_and_group) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){NULL}), 0);
  cr_assert_eq(cfg.socket_mode, 0660);
  cr_assert_eq(cfg.socket_gid, -1);
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket-mode", "0600", "--socket-group", "0", NULL}),
               0);
  cr_assert_eq(cfg.socket_mode, 0600);
  cr_assert_eq(cfg.socket_gid, 0);
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket-group", "root", NULL}), 0);
  cr_assert_eq(cfg.socket_gid, 0);
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket-mode", "0888", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket-mode", "01777", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket-mode", "rw", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--socket-group", "no-such-group-fp4", NULL}),
               FP4IDX_EINVAL);
}

Test(config, buffer_budget_and_timeout) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){NULL}), 0);
  cr_assert_eq(cfg.buffer_budget, 0, "0: sized from RAM at start");
  cr_assert_float_eq(cfg.buffer_timeout_s, 30.0, 1e-9);
  cr_assert_eq(parse(&cfg, (const char *[]){"--buffer-budget", "256M", "--buffer-timeout", "2.5",
                                            NULL}),
               0);
  cr_assert_eq(cfg.buffer_budget, 256ull << 20);
  cr_assert_float_eq(cfg.buffer_timeout_s, 2.5, 1e-9);
  cr_assert_eq(parse(&cfg, (const char *[]){"--buffer-budget", "1M", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--buffer-budget", "lots", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--buffer-timeout", "0", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--buffer-timeout", "1e9", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--buffer-timeout", "x", NULL}), FP4IDX_EINVAL);
}

Test(config, busy_poll) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){NULL}), 0);
  cr_assert_eq(cfg.busy_poll_us, -1, "-1: chosen from the backend at start");
  cr_assert_eq(parse(&cfg, (const char *[]){"--busy-poll-us", "500", NULL}), 0);
  cr_assert_eq(cfg.busy_poll_us, 500);
  cr_assert_eq(parse(&cfg, (const char *[]){"--busy-poll-us", "0", NULL}), 0);
  cr_assert_eq(cfg.busy_poll_us, 0);
  cr_assert_eq(parse(&cfg, (const char *[]){"--busy-poll-us", "-1", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--busy-poll-us", "2000000", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--busy-poll-us", "5ms", NULL}), FP4IDX_EINVAL);
}

Test(config, io_threads) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){NULL}), 0);
  cr_assert_eq(cfg.io_threads, 0, "0: FP4IDX_CONFIG_IO_THREADS_DEFAULT at start");
  cr_assert_eq(parse(&cfg, (const char *[]){"--io-threads", "4", NULL}), 0);
  cr_assert_eq(cfg.io_threads, 4);
  cr_assert_eq(parse(&cfg, (const char *[]){"--io-threads", "1", NULL}), 0);
  cr_assert_eq(cfg.io_threads, 1);
  cr_assert_eq(parse(&cfg, (const char *[]){"--io-threads", "0", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--io-threads", "65", NULL}), FP4IDX_EINVAL);
  cr_assert_eq(parse(&cfg, (const char *[]){"--io-threads", "2x", NULL}), FP4IDX_EINVAL);
}

Test(config, buffer_budget_default_follows_ram) {
  cr_assert_eq(fp4idx__budget_default(0), 64ull << 20, "unknown RAM: the floor");
  cr_assert_eq(fp4idx__budget_default(512ull << 20), 64ull << 20);
  cr_assert_eq(fp4idx__budget_default(24ull << 30), 384ull << 20);
  cr_assert_eq(fp4idx__budget_default(1ull << 40), 2ull << 30, "the ceiling");
}

Test(config, allow_data_loss) {
  fp4idx_config_t cfg;
  cr_assert_eq(parse(&cfg, (const char *[]){NULL}), 0);
  cr_assert_eq(cfg.allow_data_loss, 0);
  cr_assert_eq(parse(&cfg, (const char *[]){"--allow-data-loss", NULL}), 0);
  cr_assert_eq(cfg.allow_data_loss, 1);
  cr_assert_eq(parse(&cfg, (const char *[]){"--allow-data-loss=yes", NULL}), FP4IDX_EINVAL);
}
