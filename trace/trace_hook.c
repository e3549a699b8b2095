/* -finstrument-functions hook: SIGUSR1 toggles recording of function entries
 * and exits (thread, depth, offset in the executable); written to
 * $FP4IDX_TRACE_OUT at exit. Benchmark-only tracing aid. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#define NOI __attribute__((no_instrument_function))
enum { CAP = 1 << 20 };
static struct { long tid; int depth; int enter; unsigned long off; } ev[CAP];
static atomic_int n_ev, on;
static __thread int depth;
static unsigned long base;
NOI static void dump(void) {
  const char *p = getenv("FP4IDX_TRACE_OUT");
  FILE *f = fopen(p ? p : "/tmp/fp4idx_trace.txt", "w");
  if (!f) return;
  int n = atomic_load(&n_ev); if (n > CAP) n = CAP;
  for (int i = 0; i < n; i++) fprintf(f, "%ld %d %d 0x%lx\n", ev[i].tid, ev[i].depth, ev[i].enter, ev[i].off);
  fclose(f);
}
NOI static void usr1(int sig) { (void)sig; atomic_store(&on, !atomic_load(&on)); }
NOI __attribute__((constructor)) static void init(void) {
  Dl_info d; if (dladdr((void *)init, &d)) base = (unsigned long)d.dli_fbase;
  signal(SIGUSR1, usr1);
  atexit(dump);
}
NOI static void rec(void *fn, int enter) {
  if (!atomic_load_explicit(&on, memory_order_relaxed)) return;
  int i = atomic_fetch_add(&n_ev, 1);
  if (i >= CAP) return;
  ev[i].tid = syscall(SYS_gettid); ev[i].depth = depth; ev[i].enter = enter; ev[i].off = (unsigned long)fn - base;
}
NOI void __cyg_profile_func_enter(void *fn, void *caller) { (void)caller; rec(fn, 1); depth++; }
NOI void __cyg_profile_func_exit(void *fn, void *caller) { (void)caller; depth--; rec(fn, 0); }
