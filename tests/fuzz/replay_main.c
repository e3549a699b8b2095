/* replay_main.c -- runs the libFuzzer target's inputs once each, without
 * libFuzzer: a main() for fuzz_codec.c in every build (gcc, ASan + UBSan),
 * so the seed corpus and every regression input are checked by ctest.
 *
 *   fuzz_codec_replay DIR|FILE...
 *
 * Each regular file (directories are read one level deep, in name order) is
 * passed to LLVMFuzzerTestOneInput; the harness aborts on a codec
 * inconsistency and the sanitizers on memory errors. Exit status 0 after
 * every input ran, 1 when an argument cannot be read or holds no input. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads the whole file into a malloc'd buffer; 0 or -1. */
static int replay_read(const char *path, uint8_t **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      uint8_t *b = realloc(buf, cap *= 2);
      if (!b) free(buf);
      buf = b;
    }
  }
  int bad = ferror(f) || !buf;
  fclose(f);
  if (bad) {
    free(buf);
    return -1;
  }
  *out = buf;
  *len = n;
  return 0;
}

static int replay_file(const char *path) {
  uint8_t *data;
  size_t len;
  if (replay_read(path, &data, &len)) {
    fprintf(stderr, "fuzz_codec_replay: cannot read %s\n", path);
    return -1;
  }
  LLVMFuzzerTestOneInput(data, len);
  free(data);
  return 0;
}

int main(int argc, char **argv) {
  long inputs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st)) {
      fprintf(stderr, "fuzz_codec_replay: %s: no such file or folder\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      if (replay_file(argv[i])) return 1;
      inputs++;
      continue;
    }
    struct dirent **names;
    int n = scandir(argv[i], &names, NULL, alphasort);
    if (n < 0) {
      fprintf(stderr, "fuzz_codec_replay: cannot list %s\n", argv[i]);
      return 1;
    }
    int rc = 0;
    for (int k = 0; k < n; k++) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
      if (!rc && names[k]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        rc = replay_file(path);
        inputs++;
      }
      free(names[k]);
    }
    free(names);
    if (rc) return 1;
  }
  printf("fuzz_codec_replay: %ld inputs, no failure\n", inputs);
  return inputs > 0 ? 0 : 1;
}
