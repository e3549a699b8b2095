/* prom.c -- the daemon's stats in the Prometheus text exposition format
 * (version 0.0.4), for node_exporter's textfile collector.
 *
 * The daemon keeps plain per-bucket latency counts in microseconds; here
 * they become the cumulative _bucket{le="<seconds>"} series Prometheus
 * expects, ending with le="+Inf" == _count. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "prom.h"

/* Writes a label value with \\, \" and \n escaped. */
static void label(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '\\') fputs("\\\\", f);
    else if (*s == '"') fputs("\\\"", f);
    else if (*s == '\n') fputs("\\n", f);
    else fputc(*s, f);
  }
}

/* A Prometheus float: shortest round-trip-ish form, +Inf/-Inf/NaN spelled
 * the way the format wants. */
static void num(FILE *f, double v) {
  if (isnan(v)) fputs("NaN", f);
  else if (isinf(v)) fputs(v > 0 ? "+Inf" : "-Inf", f);
  else fprintf(f, "%.15g", v);
}

static void gauge(FILE *f, const char *name, const char *help, double v) {
  fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n%s ", name, help, name, name);
  num(f, v);
  fputc('\n', f);
}

/* One histogram series (name{key="o->op",le=...}) from per-bucket counts. */
static void histogram(FILE *f, const char *name, const char *key,
                      const fp4idx_client_op_stats_t *o) {
  uint64_t cum = 0;
  int have_inf = 0;
  for (uint32_t b = 0; b < o->nbuckets; b++) {
    cum += o->hist[b];
    fprintf(f, "%s_bucket{%s=\"", name, key);
    label(f, o->op);
    fputs("\",le=\"", f);
    if (isinf(o->bounds_us[b])) {
      fputs("+Inf", f);
      have_inf = 1;
    } else {
      fprintf(f, "%.9g", o->bounds_us[b] * 1e-6);
    }
    fprintf(f, "\"} %llu\n", (unsigned long long)cum);
  }
  /* The +Inf bucket is mandatory and equals _count. */
  uint64_t total = cum > o->count ? cum : o->count;
  if (!have_inf) {
    fprintf(f, "%s_bucket{%s=\"", name, key);
    label(f, o->op);
    fprintf(f, "\",le=\"+Inf\"} %llu\n", (unsigned long long)total);
  }
  fprintf(f, "%s_sum{%s=\"", name, key);
  label(f, o->op);
  fputs("\"} ", f);
  num(f, o->latency_sum_us * 1e-6);
  fprintf(f, "\n%s_count{%s=\"", name, key);
  label(f, o->op);
  fprintf(f, "\"} %llu\n", (unsigned long long)(have_inf ? cum : total));
}

static void counter(FILE *f, const char *name, const char *help, uint64_t v) {
  fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name,
          name, (unsigned long long)v);
}

int fp4idx__prom_write(FILE *f, const fp4idx_client_stats_t *s,
                       const fp4idx_client_info_t *info) {
  fputs("# HELP fp4idx_info Daemon identity; the value is always 1.\n"
        "# TYPE fp4idx_info gauge\nfp4idx_info{", f);
  if (info != NULL) {
    fputs("server=\"", f);
    label(f, info->server);
    fprintf(f, "\",protocol=\"%u\",", info->version);
  }
  fputs("backend=\"", f);
  label(f, s->backend);
  fputs("\",device=\"", f);
  label(f, s->device);
  fputs("\"} 1\n", f);

  gauge(f, "fp4idx_uptime_seconds", "Seconds since the daemon started.",
        s->uptime_s);
  gauge(f, "fp4idx_connections", "Open client connections.",
        (double)s->connections);
  gauge(f, "fp4idx_sequences", "Live sequences in the cache.",
        (double)s->sequences);
  gauge(f, "fp4idx_keys", "Keys stored in the cache.", (double)s->keys);
  gauge(f, "fp4idx_pool_pages", "Pages in the key pool.",
        (double)s->pages_total);
  gauge(f, "fp4idx_pool_pages_free", "Free pages in the key pool.",
        (double)s->pages_free);
  gauge(f, "fp4idx_pool_pages_shared",
        "Pages in use that two sequences or more see (forks).",
        (double)s->pages_shared);
  if (info != NULL && info->page_size != 0)
    gauge(f, "fp4idx_pool_page_size_keys", "Keys per page.",
          (double)info->page_size);

  /* One series per mode, 1 for the current one (an enum gauge): a rule
   * matches fp4idx_gpu_sharing{mode="time_slice"} == 1. Nothing from a
   * daemon that does not report it. */
  if (s->gpu_sharing[0]) {
    static const char *const modes[] = {"mps", "time_slice", "exclusive", "unknown", "none"};
    fputs("# HELP fp4idx_gpu_sharing How the GPU is shared with other processes (1: this "
          "mode); time_slice costs milliseconds per request, run MPS.\n"
          "# TYPE fp4idx_gpu_sharing gauge\n", f);
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
      fprintf(f, "fp4idx_gpu_sharing{mode=\"%s\"} %d\n", modes[i],
              strcmp(modes[i], s->gpu_sharing) == 0);
    gauge(f, "fp4idx_gpu_other_processes",
          "Other processes holding a compute context on the daemon's GPU.",
          (double)s->gpu_other_processes);
  }
  gauge(f, "fp4idx_queue_depth", "Requests received and waiting for the worker.",
        (double)s->queue_depth);
  if (s->buffer_budget != 0) { /* nothing from a daemon that does not report it */
    gauge(f, "fp4idx_buffered_bytes",
          "Bytes held for connections: requests read and not run, replies not yet written.",
          (double)s->buffered_bytes);
    gauge(f, "fp4idx_buffered_bytes_peak", "The most fp4idx_buffered_bytes has been.",
          (double)s->buffered_bytes_peak);
    gauge(f, "fp4idx_buffer_budget_bytes", "The buffer budget (--buffer-budget).",
          (double)s->buffer_budget);
  }
  gauge(f, "fp4idx_device_memory_free_bytes",
        "Free memory of the backend's device (host memory on the CPU backend).",
        (double)s->device_mem_free);
  gauge(f, "fp4idx_device_memory_used_bytes",
        "Used memory of the backend's device (host memory on the CPU backend).",
        (double)(s->device_mem_total - (s->device_mem_free < s->device_mem_total
                                             ? s->device_mem_free
                                             : s->device_mem_total)));
  counter(f, "fp4idx_keys_appended_total", "Keys of acknowledged appends.",
          s->keys_appended);
  counter(f, "fp4idx_rows_scored_total", "Verify rows of answered scores.",
          s->rows_scored);
  counter(f, "fp4idx_request_bytes_total",
          "Bytes of request frames received (length prefix included).",
          s->request_bytes);
  counter(f, "fp4idx_response_bytes_total",
          "Bytes of response frames sent (length prefix included).",
          s->response_bytes);
  /* Every status this build knows, zeros included: a rate over a series
   * that appears late loses its first increment. */
  fputs("# HELP fp4idx_errors_total Requests answered with an error, by "
        "status.\n# TYPE fp4idx_errors_total counter\n", f);
#define FP4IDX__PROM_STATUS(name, code, msg)                                 \
  if ((code) < 0 && -(code) < FP4IDX_CLIENT_MAX_STATUSES)                                            \
    fprintf(f, "fp4idx_errors_total{status=\"%s\"} %llu\n", #name,            \
            (unsigned long long)s->status_errors[-(code)]);
  FP4IDX_STATUS_MAP(FP4IDX__PROM_STATUS)
#undef FP4IDX__PROM_STATUS

  fputs("# HELP fp4idx_requests_total Requests handled, by operation.\n"
        "# TYPE fp4idx_requests_total counter\n", f);
  for (uint32_t i = 0; i < s->nops; i++) {
    fputs("fp4idx_requests_total{op=\"", f);
    label(f, s->ops[i].op);
    fprintf(f, "\"} %llu\n", (unsigned long long)s->ops[i].count);
  }
  fputs("# HELP fp4idx_request_errors_total Requests answered with an error, "
        "by operation.\n# TYPE fp4idx_request_errors_total counter\n", f);
  for (uint32_t i = 0; i < s->nops; i++) {
    fputs("fp4idx_request_errors_total{op=\"", f);
    label(f, s->ops[i].op);
    fprintf(f, "\"} %llu\n", (unsigned long long)s->ops[i].errors);
  }
  fputs("# HELP fp4idx_request_latency_seconds Request latency in the daemon, "
        "by operation.\n# TYPE fp4idx_request_latency_seconds histogram\n", f);
  for (uint32_t i = 0; i < s->nops; i++)
    histogram(f, "fp4idx_request_latency_seconds", "op", &s->ops[i]);
  if (s->nstages > 0)
    fputs("# HELP fp4idx_stage_latency_seconds Time requests spent in each "
          "stage of the request path.\n"
          "# TYPE fp4idx_stage_latency_seconds histogram\n", f);
  for (uint32_t i = 0; i < s->nstages; i++)
    histogram(f, "fp4idx_stage_latency_seconds", "stage", &s->stages[i]);
  return ferror(f) ? -1 : 0;
}
