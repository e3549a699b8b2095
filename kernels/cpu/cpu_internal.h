/* cpu_internal.h -- private pieces of the CPU backend shared by its files. */
#ifndef FP4IDX_CPU_INTERNAL_H
#define FP4IDX_CPU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "fp4idx_backend.h"

/* A persistent pool of worker threads. fp4idx__threads_run() calls
 * fn(arg, tid) once for every tid in 0..n-1, tid 0 on the calling thread,
 * and returns when all calls have returned. Workers sleep on a condition
 * variable between runs, so a call costs a wake-up, not a thread spawn. */
typedef struct fp4idx__threads_s fp4idx__threads_t;
typedef void (*fp4idx__thread_fn)(void *arg, int tid);

/* Starts n - 1 workers (n >= 1). Returns FP4IDX_OK or FP4IDX_ENOMEM. */
int fp4idx__threads_create(fp4idx__threads_t **out, int n);
int fp4idx__threads_count(const fp4idx__threads_t *t);
void fp4idx__threads_run(fp4idx__threads_t *t, fp4idx__thread_fn fn, void *arg);
void fp4idx__threads_destroy(fp4idx__threads_t *t);

/* The CPU backend's state (backend->impl). */
typedef struct fp4idx__cpu_s {
  fp4idx__threads_t *threads;
  uint8_t *pool;        /* n_pages * page_size * 68 bytes, NULL before pool_create */
  int64_t pool_bytes;
  int isa;              /* FP4IDX__ISA_*: which compiled tile kernel runs */
} fp4idx__cpu_t;

enum { FP4IDX__ISA_GENERIC = 0, FP4IDX__ISA_AVX2 = 1, FP4IDX__ISA_AVX512 = 2 };

/* The best tile kernel this CPU runs, lowered by $FP4IDX_CPU_ISA
 * (generic|avx2|avx512) if set; and its name. */
int fp4idx__cpu_pick_isa(void);
const char *fp4idx__cpu_isa_name(int isa);

/* The scorer (cpu_score.c); arguments already validated by the caller. */
int fp4idx__cpu_score(fp4idx_backend_t *b, const fp4idx_backend_batch_t *batch);

/* Rounds a double to the nearest bf16 (ties to even), returned as the f32
 * of that bf16 value (exact). Covers bf16 subnormals and overflow to inf. */
float fp4idx__f64_to_bf16f(double x);

#endif
