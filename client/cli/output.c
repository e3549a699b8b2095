/* output.c -- how fp4idx-cli prints a score result: text, JSON or raw. */
#include <math.h>
#include <stdio.h>
#include <string.h>

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
