/* args.c -- fp4idx-cli's error record and strict argument parsers. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int fp4idx__cli_fail(fp4idx_cli_err_t *e, int status, const char *fmt, ...) {
  e->status = status;
  e->usage = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return status;
}

int fp4idx__cli_usage(fp4idx_cli_err_t *e, const char *fmt, ...) {
  e->status = FP4IDX_EINVAL;
  e->usage = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return FP4IDX_EINVAL;
}

int fp4idx__parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || *s < '0' || *s > '9') return -1;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return -1;
    uint64_t d = (uint64_t)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

int fp4idx__parse_lens(const char *s, int32_t **lens, size_t *n) {
  *lens = NULL;
  *n = 0;
  if (s == NULL || *s == '\0') return -1;
  size_t cnt = 1;
  for (const char *p = s; *p; p++) cnt += *p == ',';
  int32_t *v = malloc(cnt * sizeof *v);
  if (v == NULL) return -1;
  const char *p = s;
  for (size_t i = 0; i < cnt; i++) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char tmp[24];
    uint64_t x;
    if (len == 0 || len >= sizeof tmp) goto bad;
    memcpy(tmp, p, len);
    tmp[len] = '\0';
    if (fp4idx__parse_u64(tmp, &x) != 0 || x > INT32_MAX) goto bad;
    v[i] = (int32_t)x;
    p = end ? end + 1 : p + len;
  }
  *lens = v;
  *n = cnt;
  return 0;
bad:
  free(v);
  return -1;
}

int fp4idx__parse_dtype(const char *s) {
  if (s == NULL) return -1;
  if (strcmp(s, "bf16") == 0) return FP4IDX_KEYS_BF16;
  if (strcmp(s, "f32") == 0) return FP4IDX_KEYS_F32;
  if (strcmp(s, "fp4") == 0) return FP4IDX_KEYS_FP4;
  return -1;
}

int fp4idx__parse_rounding(const char *s) {
  if (s == NULL) return -1;
  if (strcmp(s, "rne") == 0) return FP4IDX_ROUNDING_RNE;
  if (strcmp(s, "threshold") == 0) return FP4IDX_ROUNDING_THRESHOLD;
  return -1;
}

int fp4idx__parse_format(const char *s) {
  if (s == NULL) return -1;
  if (strcmp(s, "text") == 0) return FP4IDX_FORMAT_TEXT;
  if (strcmp(s, "json") == 0) return FP4IDX_FORMAT_JSON;
  if (strcmp(s, "raw") == 0) return FP4IDX_FORMAT_RAW;
  return -1;
}
