/* output.c -- how fp4idx-cli prints: a score result (text, JSON or raw),
 * info and stats as JSON, and append's progress line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "cli.h"

const char *fp4idx__fmt_f32(char *buf, float v) {
  if (isnan(v)) return strcpy(buf, "nan");
  if (isinf(v)) return strcpy(buf, v < 0 ? "-inf" : "inf");
  /* 9 significant digits read back as the same binary32 value. */
  snprintf(buf, 32, "%.9g", (double)v);
  return buf;
}

/* JSON has no infinities: invisible positions (-inf) are null. */
static const char *json_f32(char *buf, float v) {
  if (!isfinite(v)) return strcpy(buf, "null");
  return fp4idx__fmt_f32(buf, v);
}

static int write_text(FILE *f, const fp4idx_client_result_t *r, int topk) {
  char b[32];
  for (uint32_t row = 0; row < r->rows; row++) {
    const float *l = r->logits + (size_t)row * r->width;
    if (topk) {
      const int32_t *p = r->positions + (size_t)row * r->width;
      int32_t cnt = r->counts[row];
      fprintf(f, "row %u:", row);
      for (int32_t i = 0; i < cnt && (uint32_t)i < r->width; i++)
        fprintf(f, " %d:%s", p[i], fp4idx__fmt_f32(b, l[i]));
      fputc('\n', f);
      continue;
    }
    uint32_t visible = 0, arg = 0;
    float best = -INFINITY;
    for (uint32_t i = 0; i < r->width; i++) {
      if (l[i] != -INFINITY) visible++;
      if (l[i] > best) {
        best = l[i];
        arg = i;
      }
    }
    fprintf(f, "row %u: %u of %u visible", row, visible, r->width);
    if (visible) fprintf(f, ", max %s at %u", fp4idx__fmt_f32(b, best), arg);
    fputs(" |", f);
    uint32_t show = r->width < 8 ? r->width : 8;
    for (uint32_t i = 0; i < show; i++)
      fprintf(f, " %s", fp4idx__fmt_f32(b, l[i]));
    if (show < r->width) fputs(" ...", f);
    fputc('\n', f);
  }
  return ferror(f) ? -1 : 0;
}

static int write_json(FILE *f, const fp4idx_client_result_t *r, int topk) {
  char b[32];
  fprintf(f, "{\"seq\":%llu,\"rows\":%u,\"%s\":%u,",
          (unsigned long long)r->seq, r->rows, topk ? "k" : "width", r->width);
  if (topk) {
    fputs("\"results\":[", f);
    for (uint32_t row = 0; row < r->rows; row++) {
      const float *l = r->logits + (size_t)row * r->width;
      const int32_t *p = r->positions + (size_t)row * r->width;
      int32_t cnt = r->counts[row];
      if (cnt < 0) cnt = 0;
      if ((uint32_t)cnt > r->width) cnt = (int32_t)r->width;
      fprintf(f, "%s{\"count\":%d,\"positions\":[", row ? "," : "", cnt);
      for (int32_t i = 0; i < cnt; i++) fprintf(f, "%s%d", i ? "," : "", p[i]);
      fputs("],\"logits\":[", f);
      for (int32_t i = 0; i < cnt; i++)
        fprintf(f, "%s%s", i ? "," : "", json_f32(b, l[i]));
      fputs("]}", f);
    }
    fputs("]}\n", f);
  } else {
    fputs("\"logits\":[", f);
    for (uint32_t row = 0; row < r->rows; row++) {
      const float *l = r->logits + (size_t)row * r->width;
      fputs(row ? ",[" : "[", f);
      for (uint32_t i = 0; i < r->width; i++)
        fprintf(f, "%s%s", i ? "," : "", json_f32(b, l[i]));
      fputc(']', f);
    }
    fputs("]}\n", f);
  }
  return ferror(f) ? -1 : 0;
}

static int write_raw(FILE *f, const fp4idx_client_result_t *r, int topk) {
  size_t n = (size_t)r->rows * r->width;
  if (topk && fwrite(r->positions, sizeof(int32_t), n, f) != n) return -1;
  if (fwrite(r->logits, sizeof(float), n, f) != n) return -1;
  return 0;
}

int fp4idx__write_result(FILE *f, fp4idx_format_t fmt,
                         const fp4idx_client_result_t *r, int topk) {
  switch (fmt) {
    case FP4IDX_FORMAT_TEXT: return write_text(f, r, topk);
    case FP4IDX_FORMAT_JSON: return write_json(f, r, topk);
    case FP4IDX_FORMAT_RAW: return write_raw(f, r, topk);
  }
  return -1;
}

/* ---- info / stats as JSON ------------------------------------------------ */

/* A JSON string: quotes, backslashes and control characters escaped. */
static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

/* JSON numbers for doubles: finite ones in full precision, others null. */
static void json_num(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.17g", v);
  else fputs("null", f);
}

size_t fp4idx__stats_counts(const fp4idx_client_stats_t *s, fp4idx_cli_count_t *out) {
  const fp4idx_cli_count_t c[FP4IDX_CLI_STATS_COUNTS] = {
      {"connections", s->connections},       {"sequences", s->sequences},
      {"keys", s->keys},                     {"pages_total", s->pages_total},
      {"pages_free", s->pages_free},         {"pages_shared", s->pages_shared},
      {"keys_appended", s->keys_appended},
      {"rows_scored", s->rows_scored},       {"request_bytes", s->request_bytes},
      {"response_bytes", s->response_bytes}, {"queue_depth", s->queue_depth},
      {"device_mem_total", s->device_mem_total},
      {"device_mem_free", s->device_mem_free},
      {"gpu_other_processes", s->gpu_other_processes},
      {"buffered_bytes", s->buffered_bytes},
      {"buffered_bytes_peak", s->buffered_bytes_peak},
      {"buffer_budget", s->buffer_budget},   {"channels", s->channels},
      {"channel_calls", s->channel_calls},   {"channel_errors", s->channel_errors}};
  memcpy(out, c, sizeof c);
  return FP4IDX_CLI_STATS_COUNTS;
}

int fp4idx__write_status_errors(FILE *f, const fp4idx_client_stats_t *s, int json) {
  int n = 0;
  for (int k = 1; k < FP4IDX_CLIENT_MAX_STATUSES; k++) {
    if (!s->status_errors[k]) continue;
    fprintf(f, json ? "%s\"%s\":%llu" : "%s%s=%llu", n ? (json ? "," : " ") : "",
            fp4idx_status_name(-k), (unsigned long long)s->status_errors[k]);
    n++;
  }
  return n;
}

int fp4idx__write_info_json(FILE *f, const fp4idx_client_info_t *in,
                            const fp4idx_client_sharing_t *sh, uint64_t channels) {
  fputs("{\"server\":", f);
  json_str(f, in->server);
  fprintf(f, ",\"protocol\":%u,\"backend\":", in->version);
  json_str(f, in->backend);
  fputs(",\"device\":", f);
  json_str(f, in->device);
  fprintf(f,
          ",\"page_size\":%llu,\"pages_total\":%llu,\"pages_free\":%llu,"
          "\"sequences\":%llu,\"max_frame\":%llu,\"gpu_sharing\":",
          (unsigned long long)in->page_size, (unsigned long long)in->pages_total,
          (unsigned long long)in->pages_free, (unsigned long long)in->sequences,
          (unsigned long long)in->max_frame);
  json_str(f, sh->mode);
  fprintf(f, ",\"gpu_other_processes\":%llu,\"channels\":%llu}\n",
          (unsigned long long)sh->other_processes, (unsigned long long)channels);
  return ferror(f) ? -1 : 0;
}

int fp4idx__write_stats_json(FILE *f, const fp4idx_client_stats_t *s) {
  fputs("{\"uptime_s\":", f);
  json_num(f, s->uptime_s);
  fputs(",\"backend\":", f);
  json_str(f, s->backend);
  fputs(",\"device\":", f);
  json_str(f, s->device);
  fputs(",\"gpu_sharing\":", f);
  json_str(f, s->gpu_sharing);
  fp4idx_cli_count_t c[FP4IDX_CLI_STATS_COUNTS];
  size_t n = fp4idx__stats_counts(s, c);
  for (size_t i = 0; i < n; i++)
    fprintf(f, ",\"%s\":%llu", c[i].name, (unsigned long long)c[i].value);
  fputs(",\"errors_by_status\":{", f);
  fp4idx__write_status_errors(f, s, 1);
  fputs("},\"ops\":[", f);
  for (uint32_t i = 0; i < s->nops; i++) {
    const fp4idx_client_op_stats_t *o = &s->ops[i];
    fputs(i ? ",{\"op\":" : "{\"op\":", f);
    json_str(f, o->op);
    fprintf(f, ",\"requests\":%llu,\"errors\":%llu,\"latency_sum_us\":",
            (unsigned long long)o->count, (unsigned long long)o->errors);
    json_num(f, o->latency_sum_us);
    /* Per-bucket counts as the daemon keeps them; the last bound is +inf
     * (null). */
    fputs(",\"latency_buckets\":[", f);
    for (uint32_t b = 0; b < o->nbuckets; b++) {
      fputs(b ? ",{\"le_us\":" : "{\"le_us\":", f);
      json_num(f, o->bounds_us[b]);
      fprintf(f, ",\"count\":%llu}", (unsigned long long)o->hist[b]);
    }
    fputs("]}", f);
  }
  fputs("]}\n", f);
  return ferror(f) ? -1 : 0;
}

/* ---- append's progress line ---------------------------------------------- */

int fp4idx__term_cols(int fd) {
  struct winsize ws;
  if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const char *c = getenv("COLUMNS");
  uint64_t v;
  if (c && fp4idx__parse_u64(c, &v) == 0 && v > 0 && v < 10000) return (int)v;
  return 80;
}

/* 1234567 -> "1.2M" (k, M, G; plain below 10000). */
static void human(char *buf, size_t cap, double v) {
  if (v < 1e4) snprintf(buf, cap, "%.0f", v);
  else if (v < 1e6) snprintf(buf, cap, "%.1fk", v / 1e3);
  else if (v < 1e9) snprintf(buf, cap, "%.1fM", v / 1e6);
  else snprintf(buf, cap, "%.1fG", v / 1e9);
}

size_t fp4idx__progress_line(char *buf, size_t cap, int cols, uint64_t done,
                             uint64_t total, double elapsed_s) {
  if (cap == 0) return 0;
  double rate = elapsed_s > 0 ? (double)done / elapsed_s : 0;
  char r[16], d[16], t[16], eta[24];
  human(r, sizeof r, rate);
  human(d, sizeof d, (double)done);
  human(t, sizeof t, (double)total);
  if (done >= total) {
    snprintf(eta, sizeof eta, "in %.1fs", elapsed_s);
  } else if (rate > 0) {
    double left = (double)(total - done) / rate;
    if (left > 359999) left = 359999;
    unsigned sec = (unsigned)(left + 0.5);
    if (sec >= 3600)
      snprintf(eta, sizeof eta, "ETA %u:%02u:%02u", sec / 3600, sec / 60 % 60, sec % 60);
    else
      snprintf(eta, sizeof eta, "ETA %u:%02u", sec / 60, sec % 60);
  } else {
    snprintf(eta, sizeof eta, "ETA --:--");
  }
  int pct = total ? (int)(done * 100 / total) : 100;
  /* At most cols - 1 characters: a full last column would wrap the line on
   * terminals that auto-wrap, and \r would then redraw on a new line. */
  size_t room = cols > 1 ? (size_t)cols - 1 : 0;
  if (room > cap - 1) room = cap - 1;
  /* Widest form that leaves the bar 10 columns: label, counts and rate;
   * then the bar, percentage, rate and ETA; then the numbers alone. */
  char text[2][128];
  int tl[2];
  tl[0] = snprintf(text[0], sizeof text[0], " %3d%% %s/%s keys %s keys/s %s",
                   pct, d, t, r, eta);
  tl[1] = snprintf(text[1], sizeof text[1], " %3d%% %s/s %s", pct, r, eta);
  size_t n = 0;
  for (int form = 0; form < 2; form++) {
    const char *label = form == 0 ? "append " : "";
    size_t ll = strlen(label);
    long bar = (long)room - (long)ll - 2 - tl[form]; /* "[" bar "]" */
    if (bar < 10 || tl[form] < 0) continue;
    if (bar > 60) bar = 60;
    long fill = total ? (long)((double)done / (double)total * (double)bar) : bar;
    memcpy(buf, label, ll);
    n = ll;
    buf[n++] = '[';
    for (long i = 0; i < bar; i++) buf[n++] = i < fill ? '#' : '.';
    buf[n++] = ']';
    memcpy(buf + n, text[form], (size_t)tl[form]);
    n += (size_t)tl[form];
    buf[n] = '\0';
    return n;
  }
  /* Too narrow for a bar: the numbers, cut to fit. */
  const char *p = text[1] + 1;
  size_t pl = strlen(p);
  n = pl < room ? pl : room;
  memcpy(buf, p, n);
  buf[n] = '\0';
  return n;
}
