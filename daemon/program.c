/* program.c -- fp4idxd as a program (see program.h). */
#define _GNU_SOURCE
#include "program.h"

#include <stdio.h>

#include "config.h"
#include "daemon.h"
#include "fp4idx_status.h"
#include "log.h"
#include "metrics_http.h"
#include "server.h"
#include "service.h"

int fp4idx__program_main(int argc, char **argv) {
  fp4idx_config_t cfg;
  fp4idx__config_defaults(&cfg);
  int rc = fp4idx__config_parse(&cfg, argc, argv, stdout, stderr);
  if (rc == 1) return 0;   /* --help / --version */
  if (rc < 0) return 2;    /* usage error, already explained */
  fp4idx__log_set_level(cfg.log_level);
  fp4idx__log_set_format(cfg.log_format);

  /* systemd socket activation: take fd 3 before anything else runs. */
  int listen_fd = -1;
  int activated = fp4idx__service_listen_fd(&listen_fd);
  if (activated < 0) return 1;

  /* A busy socket refuses the start before the pool (half the GPU's free
   * memory by default) is allocated. */
  if (!activated) {
    if (!cfg.socket_path[0] &&
        fp4idx__config_default_socket(cfg.socket_path, sizeof cfg.socket_path)) {
      fp4idx__log_error("the default socket path is too long; use --socket");
      return 1;
    }
    if (fp4idx__server_check_path(cfg.socket_path) != FP4IDX_OK) return 1;
  }
  /* The scrape endpoint (off unless asked): a taken port also fails the
   * start before the pool exists. */
  fp4idx_metrics_http_t metrics = {0};
  if (cfg.metrics_listen[0] &&
      fp4idx__metrics_http_start(&metrics, cfg.metrics_listen) != FP4IDX_OK)
    return 1;

  fp4idx_daemon_t d;
  if (fp4idx__daemon_init(&d, &cfg) != FP4IDX_OK) {
    fp4idx__metrics_http_stop(&metrics);
    return 1;
  }
  fp4idx__metrics_http_attach(&metrics, &d);
  fp4idx_service_t svc; /* sd_notify, watchdog, snapshot + append log */
  fp4idx__service_attach(&svc, &d);
  int code = 1;
  rc = activated ? fp4idx__daemon_listen_fd(&d, listen_fd)
                  : fp4idx__daemon_listen_default(&d);
  if (rc == FP4IDX_OK) code = fp4idx__daemon_run(&d);
  fp4idx__metrics_http_stop(&metrics);
  fp4idx__service_detach(&svc);
  fp4idx__daemon_fini(&d);
  return code;
}
