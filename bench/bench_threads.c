/* bench_threads.c -- a daemon's threads' CPU time (see bench_threads.h). */
#define _GNU_SOURCE
#include "bench_threads.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

pid_t bench_threads_peer(const char *sock) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (!sock || strlen(sock) >= sizeof a.sun_path) return -1;
  strcpy(a.sun_path, sock);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct ucred cr = {0};
  socklen_t len = sizeof cr;
  pid_t pid = -1;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.pid > 0)
    pid = cr.pid;
  close(fd);
  return pid;
}

/* The first line of /proc/<pid>/task/<tid>/<what> into buf, or -1. */
static int bench_threads_line(pid_t pid, const char *tid, const char *what, char *buf,
                              size_t cap) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/task/%.24s/%s", (int)pid, tid, what);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int ok = fgets(buf, (int)cap, f) != NULL;
  fclose(f);
  if (!ok) return -1;
  buf[strcspn(buf, "\n")] = 0;
  return 0;
}

int bench_threads_take(pid_t pid, bench_threads_t *s) {
  s->pid = pid;
  s->n = 0;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = pid > 0 ? opendir(path) : NULL;
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d)) && s->n < BENCH_THREADS_MAX;) {
    if (e->d_name[0] == '.') continue;
    char stat[64], name[20];
    /* schedstat: on-CPU ns, wait ns, timeslices */
    if (bench_threads_line(pid, e->d_name, "schedstat", stat, sizeof stat) ||
        bench_threads_line(pid, e->d_name, "comm", name, sizeof name))
      continue;
    s->t[s->n].tid = atoi(e->d_name);
    snprintf(s->t[s->n].name, sizeof s->t[s->n].name, "%s", name);
    s->t[s->n].ns = strtoull(stat, NULL, 10);
    s->n++;
  }
  closedir(d);
  return s->n ? 0 : -1;
}

void bench_threads_use(const bench_threads_t *a, const bench_threads_t *b, double wall_us,
                       bench_threads_use_t *u) {
  *u = (bench_threads_use_t){0};
  if (!a->n || !b->n || wall_us <= 0) {
    u->worker = u->loops = u->loop_max = u->other = NAN;
    return;
  }
  for (int i = 0; i < b->n; i++) {
    uint64_t before = 0;
    for (int j = 0; j < a->n; j++)
      if (a->t[j].tid == b->t[i].tid) before = a->t[j].ns;
    double pct = 100.0 * (double)(b->t[i].ns - before) / (wall_us * 1e3);
    const char *name = b->t[i].name;
    if (strcmp(name, "fp4idx-worker") == 0) {
      u->worker += pct;
    } else if (b->t[i].tid == b->pid || strncmp(name, "fp4idx-io", 9) == 0) {
      u->loops += pct; /* the main thread runs loop 0 */
      u->nloops++;
      if (pct > u->loop_max) u->loop_max = pct;
    } else {
      u->other += pct;
    }
  }
}
