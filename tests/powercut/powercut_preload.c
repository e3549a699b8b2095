/* powercut_preload.c -- an LD_PRELOAD layer between a process and the disk
 * that simulates a power cut: writes to files under one folder are kept only
 * once an fsync/fdatasync of the file returned; at the cut, every write since
 * the file's last sync is undone and the process is killed (SIGKILL).
 *
 * Environment (read once, in the constructor):
 *   FP4IDX_POWERCUT_DIR    folder whose regular files are tracked (required;
 *                          without it the layer only passes calls through)
 *   FP4IDX_POWERCUT_MS     the cut comes this many ms after the first tracked
 *                          write (default: never)
 *   FP4IDX_POWERCUT_STAMP  file that receives the cut's CLOCK_REALTIME time in
 *                          ns (decimal), written just before the kill
 *
 * Model. Each tracked file (by inode) keeps an undo log: for every write,
 * writev, pwrite or ftruncate since its last fsync/fdatasync, the bytes it
 * overwrote and the file size before it. The cut replays the undo logs
 * backwards (old bytes back, size back), so the page cache -- what the next
 * process reads -- holds exactly what was synced. What this does not model:
 * metadata (create, rename, unlink) counts as durable at once, and a sync
 * keeps the whole file (no partial, reordered or torn sectors).
 *
 * Every intercepted write and the cut take one mutex, so the cut never lands
 * inside a write, and no write happens after the undo. Calls go on to the
 * next definition (dlsym RTLD_NEXT: libc, or a sanitizer's interceptor). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

typedef struct undo_s {
  off_t off;        /* where the overwritten bytes were */
  size_t len;       /* how many (old bytes inside the old size only) */
  off_t old_size;   /* file size before the call */
  uint64_t seq;     /* order of the calls on this file */
  unsigned char *old;
} undo_t;

typedef struct tracked_s {
  dev_t dev;
  ino_t ino;
  int rw;           /* our own O_RDWR fd on the inode (keeps it alive too) */
  undo_t *undo;
  size_t n, cap;
  uint64_t next_seq;
} tracked_t;

static ssize_t (*real_write)(int, const void *, size_t); /* for the stamp */
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char dir[PATH_MAX];
static size_t dir_len;
static long cut_ms = -1;
static char stamp[PATH_MAX];
static int timer_started;
static tracked_t *files;
static size_t n_files, cap_files;

static void resolve(void) {
  if (real_write) return;
  real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
  real_writev = (ssize_t(*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
  real_pwrite = (ssize_t(*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  real_ftruncate = (int (*)(int, off_t))dlsym(RTLD_NEXT, "ftruncate");
  real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
}

__attribute__((constructor)) static void powercut_init(void) {
  resolve();
  const char *d = getenv("FP4IDX_POWERCUT_DIR");
  if (d && *d && realpath(d, dir)) dir_len = strlen(dir);
  const char *ms = getenv("FP4IDX_POWERCUT_MS");
  if (ms && *ms) cut_ms = strtol(ms, NULL, 10);
  const char *st = getenv("FP4IDX_POWERCUT_STAMP");
  if (st) snprintf(stamp, sizeof stamp, "%s", st);
}

/* The tracked entry of fd's file, or NULL when fd is not a regular file
 * under the folder. Called with mu held. */
static tracked_t *lookup(int fd) {
  struct stat st;
  if (!dir_len || fstat(fd, &st) || !S_ISREG(st.st_mode)) return NULL;
  for (size_t i = 0; i < n_files; i++)
    if (files[i].dev == st.st_dev && files[i].ino == st.st_ino) return &files[i];
  char link[64], path[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return NULL;
  path[n] = '\0';
  if (strncmp(path, dir, dir_len) != 0 || path[dir_len] != '/') return NULL;
  int rw = open(link, O_RDWR | O_CLOEXEC);
  if (rw < 0) return NULL;
  if (n_files == cap_files) {
    size_t cap = cap_files ? 2 * cap_files : 16;
    tracked_t *f = realloc(files, cap * sizeof *f);
    if (!f) {
      close(rw);
      return NULL;
    }
    files = f;
    cap_files = cap;
  }
  tracked_t *t = &files[n_files++];
  memset(t, 0, sizeof *t);
  t->dev = st.st_dev;
  t->ino = st.st_ino;
  t->rw = rw;
  return t;
}

static void cut_now(void);

static void *timer_main(void *arg) {
  (void)arg;
  struct timespec ts = {cut_ms / 1000, (cut_ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
  cut_now();
  return NULL;
}

/* Before a tracked file changes at [off, off+len) (len 0: a size change
 * only): saves what is there. Called with mu held. Returns 0 or -1 (the call
 * is then refused with EIO: an untracked change would break the model). */
static int remember(tracked_t *t, off_t off, size_t len) {
  struct stat st;
  if (fstat(t->rw, &st)) return -1;
  if (t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 64;
    undo_t *u = realloc(t->undo, cap * sizeof *u);
    if (!u) return -1;
    t->undo = u;
    t->cap = cap;
  }
  undo_t *u = &t->undo[t->n];
  memset(u, 0, sizeof *u);
  u->off = off;
  u->old_size = st.st_size;
  u->seq = t->next_seq++;
  if (off < st.st_size && len > 0) {
    u->len = (size_t)(st.st_size - off) < len ? (size_t)(st.st_size - off) : len;
    u->old = malloc(u->len);
    if (!u->old || pread(t->rw, u->old, u->len, off) != (ssize_t)u->len) {
      free(u->old);
      return -1;
    }
  }
  t->n++;
  if (!timer_started && cut_ms >= 0) {
    pthread_t th;
    timer_started = 1;
    if (pthread_create(&th, NULL, timer_main, NULL) == 0) pthread_detach(th);
  }
  return 0;
}

/* The changes made before change number `upto` are durable now: drop their
 * undo entries (the oldest ones). */
static void forget(tracked_t *t, uint64_t upto) {
  size_t n = 0;
  while (n < t->n && t->undo[n].seq < upto) n++;
  for (size_t i = 0; i < n; i++) free(t->undo[i].old);
  memmove(t->undo, t->undo + n, (t->n - n) * sizeof *t->undo);
  t->n -= n;
}

static void cut_now(void) {
  pthread_mutex_lock(&mu); /* never released: the process ends here */
  for (size_t i = 0; i < n_files; i++) {
    tracked_t *t = &files[i];
    for (size_t k = t->n; k-- > 0;) {
      undo_t *u = &t->undo[k];
      if (u->len) (void)real_pwrite(t->rw, u->old, u->len, u->off);
      (void)real_ftruncate(t->rw, u->old_size);
    }
  }
  if (stamp[0]) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%lld\n",
                     (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    int fd = open(stamp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      (void)real_write(fd, buf, (size_t)n);
      close(fd);
    }
  }
  kill(getpid(), SIGKILL);
  for (;;) pause();
}

/* The offset a write at the file position of fd lands at. */
static off_t write_offset(int fd, tracked_t *t) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0 && (fl & O_APPEND)) {
    struct stat st;
    return fstat(t->rw, &st) ? -1 : st.st_size;
  }
  return lseek(fd, 0, SEEK_CUR);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
  resolve();
  pthread_mutex_lock(&mu);
  tracked_t *t = lookup(fd);
  size_t n = 0;
  for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
  ssize_t r;
  off_t off;
  if (t && ((off = write_offset(fd, t)) < 0 || remember(t, off, n))) {
    errno = EIO;
    r = -1;
  } else {
    r = real_writev(fd, iov, cnt);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

/* write(2) is a writev of one piece here (the same effect on any fd). */
ssize_t write(int fd, const void *buf, size_t n) {
  struct iovec one = {(void *)buf, n};
  return writev(fd, &one, 1);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  resolve();
  pthread_mutex_lock(&mu);
  tracked_t *t = lookup(fd);
  ssize_t r;
  if (t && remember(t, off, n)) {
    errno = EIO;
    r = -1;
  } else {
    r = real_pwrite(fd, buf, n, off);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }

int ftruncate(int fd, off_t len) {
  resolve();
  pthread_mutex_lock(&mu);
  tracked_t *t = lookup(fd);
  struct stat st;
  int r;
  /* A shrink loses [len, size): those bytes come back at the cut. */
  if (t && (fstat(t->rw, &st) ||
            remember(t, len, len < st.st_size ? (size_t)(st.st_size - len) : 0))) {
    errno = EIO;
    r = -1;
  } else {
    r = real_ftruncate(fd, len);
  }
  pthread_mutex_unlock(&mu);
  return r;
}

int ftruncate64(int fd, off_t len) { return ftruncate(fd, len); }

/* The sync itself runs without the lock (as in the kernel, writers go on
 * meanwhile); the writes that were complete when it started are durable once
 * it returns, the ones made during it stay undoable (a conservative choice). */
static int sync_common(int fd, int (*real)(int)) {
  resolve();
  pthread_mutex_lock(&mu);
  tracked_t *t = lookup(fd);
  dev_t dev = t ? t->dev : 0;
  ino_t ino = t ? t->ino : 0;
  uint64_t before = t ? t->next_seq : 0;
  pthread_mutex_unlock(&mu);
  int r = real(fd);
  if (r == 0 && before) {
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n_files; i++) /* files may have moved (realloc) */
      if (files[i].dev == dev && files[i].ino == ino) forget(&files[i], before);
    pthread_mutex_unlock(&mu);
  }
  return r;
}

int fsync(int fd) { return sync_common(fd, real_fsync); }
int fdatasync(int fd) { return sync_common(fd, real_fdatasync); }
