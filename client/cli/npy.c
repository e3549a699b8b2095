/* npy.c -- input files of fp4idx-cli: whole-file reads (stdin too), the
 * .npy header (format 1.0/2.0/3.0), and the shape rules for keys and for the
 * q/w arrays of score (bf16, or f32 rounded to bf16). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fp4idx_format.h" /* fp4idx_f32_to_bf16: the project's one RNE rule */

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

int fp4idx__npy_is(const void *buf, size_t len) {
  return len >= 6 && memcmp(buf, npy_magic, 6) == 0;
}

/* ---- a tiny reader for the header's Python dict literal ------------------- */

typedef struct {
  const char *p, *end;
} scan_t;

static void skip_ws(scan_t *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' ||
                           *s->p == '\r'))
    s->p++;
}

static int eat(scan_t *s, char ch) {
  skip_ws(s);
  if (s->p < s->end && *s->p == ch) {
    s->p++;
    return 1;
  }
  return 0;
}

/* A quoted string ('...' or "..."), no escapes (none occur in headers). */
static int read_str(scan_t *s, char *out, size_t cap) {
  skip_ws(s);
  if (s->p >= s->end || (*s->p != '\'' && *s->p != '"')) return -1;
  char q = *s->p++;
  size_t n = 0;
  while (s->p < s->end && *s->p != q) {
    if (n + 1 >= cap) return -1;
    out[n++] = *s->p++;
  }
  if (s->p >= s->end) return -1;
  s->p++;
  out[n] = '\0';
  return 0;
}

static int read_word(scan_t *s, const char *w) {
  skip_ws(s);
  size_t n = strlen(w);
  if ((size_t)(s->end - s->p) >= n && memcmp(s->p, w, n) == 0) {
    s->p += n;
    return 1;
  }
  return 0;
}

static int read_uint(scan_t *s, uint64_t *v) {
  skip_ws(s);
  if (s->p >= s->end || *s->p < '0' || *s->p > '9') return -1;
  uint64_t x = 0;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
    uint64_t d = (uint64_t)(*s->p - '0');
    if (x > (UINT64_MAX - d) / 10) return -1;
    x = x * 10 + d;
    s->p++;
  }
  if (s->p < s->end && *s->p == 'L') s->p++; /* Python 2 longs */
  *v = x;
  return 0;
}

static int bad(fp4idx_cli_err_t *e, const char *why) {
  return fp4idx__cli_fail(e, FP4IDX_EINVAL, ".npy: %s", why);
}

int fp4idx__npy_parse(const void *buf, size_t len, fp4idx_npy_t *out,
                      fp4idx_cli_err_t *e) {
  const unsigned char *b = buf;
  if (buf == NULL || out == NULL) return bad(e, "no data");
  memset(out, 0, sizeof *out);
  if (!fp4idx__npy_is(buf, len) || len < 10) return bad(e, "no NUMPY magic");
  unsigned major = b[6];
  size_t hlen, hstart;
  if (major == 1) {
    hlen = (size_t)b[8] | (size_t)b[9] << 8;
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (len < 12) return bad(e, "truncated header");
    hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 |
           (size_t)b[11] << 24;
    hstart = 12;
  } else {
    return bad(e, "unsupported format version");
  }
  if (hlen > len - hstart) return bad(e, "truncated header");

  scan_t s = {(const char *)b + hstart, (const char *)b + hstart + hlen};
  char descr[32] = "";
  int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
  if (!eat(&s, '{')) return bad(e, "header is not a dict");
  for (;;) {
    if (eat(&s, '}')) break;
    char key[32];
    if (read_str(&s, key, sizeof key) != 0 || !eat(&s, ':'))
      return bad(e, "bad header dict");
    if (strcmp(key, "descr") == 0) {
      if (read_str(&s, descr, sizeof descr) != 0)
        return bad(e, "descr is not a simple dtype string (structured?)");
      have_descr = 1;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (read_word(&s, "True")) fortran = 1;
      else if (read_word(&s, "False")) fortran = 0;
      else return bad(e, "bad fortran_order");
      have_order = 1;
    } else if (strcmp(key, "shape") == 0) {
      if (!eat(&s, '(')) return bad(e, "shape is not a tuple");
      out->ndim = 0;
      while (!eat(&s, ')')) {
        if (out->ndim >= FP4IDX_NPY_MAX_NDIM) return bad(e, "too many dims");
        if (read_uint(&s, &out->shape[out->ndim]) != 0)
          return bad(e, "bad shape entry");
        out->ndim++;
        if (!eat(&s, ',')) {
          if (!eat(&s, ')')) return bad(e, "bad shape tuple");
          break;
        }
      }
      have_shape = 1;
    } else {
      return bad(e, "unknown header key");
    }
    if (!eat(&s, ',')) {
      if (!eat(&s, '}')) return bad(e, "bad header dict");
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape)
    return bad(e, "header lacks descr, fortran_order or shape");
  if (fortran) return bad(e, "Fortran-order arrays are not supported (use C order)");

  /* descr: byte order, kind, item size ("<f4", "|u1"). */
  char order = descr[0];
  if (order != '<' && order != '|' && order != '=' && order != '>')
    return bad(e, "unsupported dtype");
  char kind = descr[1];
  char *endp = NULL;
  long isz = strtol(descr + 2, &endp, 10);
  if (kind == '\0' || endp == descr + 2 || *endp != '\0' || isz <= 0 ||
      isz > 16)
    return bad(e, "unsupported dtype");
  if (order == '>' && isz > 1)
    return bad(e, "big-endian arrays are not supported");
  out->kind = kind;
  out->itemsize = (int)isz;

  uint64_t count = 1;
  for (int i = 0; i < out->ndim; i++) {
    if (out->shape[i] != 0 && count > UINT64_MAX / out->shape[i])
      return bad(e, "shape overflows");
    count *= out->shape[i];
  }
  out->count = count;
  out->data_offset = hstart + hlen;
  size_t have = len - out->data_offset;
  if (count > SIZE_MAX / (size_t)isz || count * (size_t)isz != have)
    return fp4idx__cli_fail(e, FP4IDX_EINVAL,
                            ".npy: header says %llu elements of %ld bytes, "
                            "file holds %zu data bytes",
                            (unsigned long long)count, isz, have);
  return 0;
}

int fp4idx__npy_write_header(FILE *f, const char *descr, int ndim,
                             const uint64_t *shape) {
  char dict[256];
  int n = snprintf(dict, sizeof dict,
                   "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < ndim; i++)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s%llu",
                  i ? ", " : "", (unsigned long long)shape[i]);
  if (ndim == 1) n += snprintf(dict + n, sizeof dict - (size_t)n, ",");
  n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
  /* Pad with spaces so that magic + 4 + dict + '\n' is a multiple of 64. */
  size_t total = 10 + (size_t)n + 1;
  size_t pad = (64 - total % 64) % 64;
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
  size_t hlen = (size_t)n + pad + 1;
  pre[8] = (unsigned char)(hlen & 0xff);
  pre[9] = (unsigned char)(hlen >> 8);
  if (fwrite(pre, 1, 10, f) != 10) return -1;
  if (fwrite(dict, 1, (size_t)n, f) != (size_t)n) return -1;
  for (size_t i = 0; i < pad; i++)
    if (fputc(' ', f) == EOF) return -1;
  return fputc('\n', f) == EOF ? -1 : 0;
}

int fp4idx__read_file(const char *path, unsigned char **buf, size_t *len,
                      fp4idx_cli_err_t *e) {
  *buf = NULL;
  *len = 0;
  int is_stdin = strcmp(path, "-") == 0;
  FILE *f = is_stdin ? stdin : fopen(path, "rb");
  if (f == NULL)
    return fp4idx__cli_fail(e, FP4IDX_EIO, "%s: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  unsigned char *b = malloc(cap);
  int rc = 0;
  if (b == NULL) {
    rc = fp4idx__cli_fail(e, FP4IDX_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  for (;;) {
    if (n == cap) {
      unsigned char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(b, cap * 2);
      if (nb == NULL) {
        rc = fp4idx__cli_fail(e, FP4IDX_ENOMEM, "%s: out of memory", path);
        goto out;
      }
      b = nb;
      cap *= 2;
    }
    size_t r = fread(b + n, 1, cap - n, f);
    n += r;
    if (r == 0) {
      if (ferror(f)) {
        rc = fp4idx__cli_fail(e, FP4IDX_EIO, "%s: read error: %s", path,
                              strerror(errno));
        goto out;
      }
      break;
    }
  }
out:
  if (!is_stdin) fclose(f);
  if (rc != 0) {
    free(b);
    return rc;
  }
  *buf = b;
  *len = n;
  return 0;
}

int fp4idx__array_from_buffer(const unsigned char *buf, size_t len,
                              fp4idx_array_t *a, fp4idx_cli_err_t *e) {
  memset(a, 0, sizeof *a);
  if (fp4idx__npy_is(buf, len)) {
    int rc = fp4idx__npy_parse(buf, len, &a->npy, e);
    if (rc != 0) return rc;
    a->is_npy = 1;
    a->data = buf + a->npy.data_offset;
    a->nbytes = len - a->npy.data_offset;
    return 0;
  }
  a->data = buf;
  a->nbytes = len;
  return 0;
}

static const char *dtype_name(int dt) {
  return dt == FP4IDX_KEYS_BF16  ? "bf16"
         : dt == FP4IDX_KEYS_F32 ? "f32"
         : dt == FP4IDX_KEYS_FP4 ? "fp4"
                                 : "?";
}

int fp4idx__keys_from_array(const fp4idx_array_t *a, int *dtype,
                            const void **keys, size_t *n,
                            fp4idx_cli_err_t *e) {
  int dt = *dtype;
  if (a->is_npy) {
    const fp4idx_npy_t *h = &a->npy;
    int from;
    if (h->itemsize == 2 && (h->kind == 'u' || h->kind == 'i' || h->kind == 'V'))
      from = FP4IDX_KEYS_BF16; /* bf16 bit patterns saved as uint16 */
    else if (h->itemsize == 4 && h->kind == 'f')
      from = FP4IDX_KEYS_F32;
    else if (h->itemsize == 1 && (h->kind == 'u' || h->kind == 'i' || h->kind == 'V'))
      from = FP4IDX_KEYS_FP4;
    else if (h->itemsize == 2 && h->kind == 'f')
      return fp4idx__cli_fail(e, FP4IDX_EINVAL,
                              ".npy holds float16, not bf16: save bf16 bit "
                              "patterns as uint16 (x.view(torch.uint16))");
    else
      return fp4idx__cli_fail(e, FP4IDX_EINVAL,
                              ".npy dtype %c%d is not bf16 (<u2), f32 (<f4) "
                              "or fp4 slots (|u1)",
                              h->kind, h->itemsize);
    if (dt != 0 && dt != from)
      return fp4idx__cli_fail(e, FP4IDX_EINVAL,
                              "--dtype %s but the .npy holds %s data",
                              dtype_name(dt), dtype_name(from));
    uint64_t cols = from == FP4IDX_KEYS_FP4 ? FP4IDX_CLIENT_SLOT_BYTES
                                            : FP4IDX_CLIENT_HEAD_DIM;
    if (h->ndim != 2 || h->shape[1] != cols || h->shape[0] == 0)
      return fp4idx__cli_fail(e, FP4IDX_ESHAPE,
                              ".npy shape must be [n,%llu] with n >= 1 for "
                              "%s keys",
                              (unsigned long long)cols, dtype_name(from));
    *dtype = from;
    *keys = a->data;
    *n = (size_t)h->shape[0];
    return 0;
  }
  if (dt == 0) dt = FP4IDX_KEYS_BF16;
  size_t key_bytes = dt == FP4IDX_KEYS_BF16  ? 2 * FP4IDX_CLIENT_HEAD_DIM
                     : dt == FP4IDX_KEYS_F32 ? 4 * FP4IDX_CLIENT_HEAD_DIM
                                             : FP4IDX_CLIENT_SLOT_BYTES;
  if (a->nbytes == 0 || a->nbytes % key_bytes != 0)
    return fp4idx__cli_fail(e, FP4IDX_ESHAPE,
                            "%zu bytes is not a whole number of %s keys "
                            "(%zu bytes each)",
                            a->nbytes, dtype_name(dt), key_bytes);
  *dtype = dt;
  *keys = a->data;
  *n = a->nbytes / key_bytes;
  return 0;
}

/* "[4,32,128]" */
static const char *shape_str(char *buf, size_t cap, const fp4idx_npy_t *h) {
  size_t o = 0;
  buf[0] = '\0';
  o += (size_t)snprintf(buf + o, cap - o, "[");
  for (int i = 0; i < h->ndim && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? "," : "",
                          (unsigned long long)h->shape[i]);
  if (o < cap) snprintf(buf + o, cap - o, "]");
  return buf;
}

int fp4idx__score_rows(const fp4idx_array_t *a, uint64_t heads,
                       uint64_t per_head, int raw_elem, const char *what,
                       uint32_t *rows, int *elem, fp4idx_cli_err_t *e) {
  uint64_t per_row = heads * per_head, elems;
  int el = raw_elem;
  if (a->is_npy) {
    const fp4idx_npy_t *h = &a->npy;
    char sh[160];
    if (h->itemsize == 4 && h->kind == 'f') el = 4;
    else if (h->itemsize == 2 && h->kind != 'f') el = 2;
    else
      return fp4idx__cli_fail(e, FP4IDX_EINVAL,
                              "%s: .npy must hold bf16 bit patterns (<u2) or "
                              "f32 (<f4)", what);
    uint64_t tail = 1;
    for (int i = 1; i < h->ndim; i++) tail *= h->shape[i];
    if (h->ndim < 1 || tail != per_row) {
      /* Name the head count the file has when its shape shows one:
       * q [R,H,128] or w [R,H]. */
      int hd = per_head == 1 ? h->ndim - 1 : h->ndim - 2;
      if (hd >= 1 && (per_head == 1 || h->shape[h->ndim - 1] == per_head) &&
          h->shape[hd] != heads)
        return fp4idx__cli_fail(e, FP4IDX_ESHAPE,
                                "%s has %llu heads (.npy shape %s) but "
                                "--heads is %llu",
                                what, (unsigned long long)h->shape[hd],
                                shape_str(sh, sizeof sh, h),
                                (unsigned long long)heads);
      return fp4idx__cli_fail(e, FP4IDX_ESHAPE,
                              "%s: .npy shape %s does not end in %llu heads x "
                              "%llu values per row (--heads %llu)",
                              what, shape_str(sh, sizeof sh, h),
                              (unsigned long long)heads,
                              (unsigned long long)per_head,
                              (unsigned long long)heads);
    }
    elems = h->count;
  } else {
    if (a->nbytes % (size_t)el != 0)
      return fp4idx__cli_fail(e, FP4IDX_ESHAPE,
                              "%s: %zu bytes are not a whole number of %s "
                              "values", what, a->nbytes,
                              el == 4 ? "f32" : "bf16");
    elems = a->nbytes / (size_t)el;
  }
  if (elems == 0 || elems % per_row != 0 || elems / per_row > UINT32_MAX)
    return fp4idx__cli_fail(e, FP4IDX_ESHAPE,
                            "%s: %llu values are not a whole number of rows "
                            "of %llu heads x %llu",
                            what, (unsigned long long)elems,
                            (unsigned long long)heads,
                            (unsigned long long)per_head);
  *rows = (uint32_t)(elems / per_row);
  *elem = el;
  return 0;
}

uint16_t *fp4idx__to_bf16(const unsigned char *data, size_t n, int elem) {
  uint16_t *out = malloc(n ? n * sizeof *out : 1);
  if (out == NULL) return NULL;
  if (elem == 2) {
    memcpy(out, data, n * sizeof *out);
    return out;
  }
  for (size_t i = 0; i < n; i++) {
    float f;
    memcpy(&f, data + 4 * i, 4); /* file buffers carry no alignment */
    out[i] = fp4idx_f32_to_bf16(f);
  }
  return out;
}
