/* bench_threads.h -- the CPU time of a daemon's threads, from /proc (Linux),
 * to say which thread bounds a run: the worker (fp4idx-worker), the I/O
 * loops (the main thread and fp4idx-io*), or the rest (the CPU backend's
 * pool, the CUDA driver's threads).
 */
#ifndef FP4IDX_BENCH_THREADS_H
#define FP4IDX_BENCH_THREADS_H

#include <stdint.h>
#include <sys/types.h>

#define BENCH_THREADS_MAX 512

typedef struct bench_threads_s {
  pid_t pid;
  int n;
  struct {
    int tid;
    char name[20];
    uint64_t ns; /* on-CPU time so far (schedstat) */
  } t[BENCH_THREADS_MAX];
} bench_threads_t;

/* The pid of the process that answers on Unix socket `sock` (SO_PEERCRED
 * of a connection of its own, closed at once), or -1. */
pid_t bench_threads_peer(const char *sock);

/* Every thread of pid, its name and on-CPU time, into *s. 0, or -1 when
 * /proc does not say (s->n is then 0). */
int bench_threads_take(pid_t pid, bench_threads_t *s);

/* Each group's share of one CPU between two takes `wall_us` apart, in %:
 * the worker, the I/O loops together and the busiest loop, and the other
 * threads together (a thread in only one take counts from 0 or not at
 * all). NAN where a take is empty. */
typedef struct bench_threads_use_s {
  double worker, loops, loop_max, other;
  int nloops;
} bench_threads_use_t;
void bench_threads_use(const bench_threads_t *a, const bench_threads_t *b, double wall_us,
                       bench_threads_use_t *u);

#endif /* FP4IDX_BENCH_THREADS_H */
