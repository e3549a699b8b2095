/* fp4idx_cuda.h -- extern "C" launchers of the CUDA kernels (kernels/cuda).
 *
 * Every pointer in the param structs is a DEVICE pointer. Every launcher
 * enqueues on `stream`, never synchronizes, and returns FP4IDX_OK or
 * FP4IDX_EDEVICE (launch error; the message goes to stderr) / FP4IDX_EINVAL.
 * All of them are safe inside CUDA graph capture.
 */
#ifndef FP4IDX_CUDA_H
#define FP4IDX_CUDA_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "fp4idx_format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- a kernel launch as data (cuda_launch.c) ---------------------------- */

enum { FP4IDX_CUDA_LAUNCH_ARGS = 8, FP4IDX_CUDA_LAUNCH_ARGV = 24 };

/* One kernel launch, described: what fp4idx_cuda_score_describe and
 * fp4idx_cuda_topk_describe fill and fp4idx_cuda_launch_run enqueues (the
 * backend builds a call's operations as data, then enqueues them). The
 * argument values are copied into argv, arg_off[i] bytes in; the struct
 * may be copied. */
typedef struct fp4idx_cuda_launch_s {
  const void *func;         /* the __global__ function; NULL: nothing to launch */
  uint32_t grid, block;     /* 1-D */
  uint32_t cluster;         /* blocks per cluster; 0: no cluster attribute */
  uint32_t pdl;             /* 1: programmatic stream serialization */
  size_t smem;              /* dynamic shared memory per block */
  int32_t n_args;
  uint32_t argv_used;       /* bytes of argv holding arguments */
  uint16_t arg_off[FP4IDX_CUDA_LAUNCH_ARGS];
  uint64_t argv[FP4IDX_CUDA_LAUNCH_ARGV];
} fp4idx_cuda_launch_t;

/* Enqueues *l on stream (cudaLaunchKernelExC with its cluster and PDL
 * attributes; nothing for func == NULL). FP4IDX_OK or FP4IDX_EDEVICE. */
int fp4idx_cuda_launch_run(const fp4idx_cuda_launch_t *l, cudaStream_t stream);

/* ---- scorer (score.cu, score_sm90.cu) ---------------------------------- */

/* Which scorer kernel a plan is for: one per architecture, chosen once per
 * device (fp4idx_cuda_scorer_for_device), passed to the planner by argument. */
typedef enum fp4idx_cuda_scorer_e {
  FP4IDX_CUDA_SCORER_MMA = 0,   /* mma.sync, 32-key tiles (score.cu): sm_80+ */
  FP4IDX_CUDA_SCORER_WGMMA = 1  /* wgmma, 64-key tiles (score_sm90.cu): sm_90a only */
} fp4idx_cuda_scorer_t;

/* The scorer of device `device`: WGMMA on compute capability 9.0, else MMA.
 * Returns FP4IDX_OK, or FP4IDX_EDEVICE when the capability cannot be read
 * (*out is MMA then). */
int fp4idx_cuda_scorer_for_device(int device, fp4idx_cuda_scorer_t *out);

/* One sequence of a score launch. */
typedef struct fp4idx_cuda_seq_s {
  const int32_t *pages;  /* [ceil(width / P)] page ids in position order */
  const uint16_t *q;     /* [rows, H, 128] bf16 */
  const uint16_t *w;     /* [rows, H] bf16 */
  const int32_t *lens;   /* [rows] visible counts (read on the device) */
  const uint8_t *mask;   /* [rows, width] or NULL */
  float *out;            /* [rows, width] f32 logits */
  int64_t width;         /* columns; positions >= width are never touched */
  int32_t rows;
  int32_t _pad;
} fp4idx_cuda_seq_t;

/* A unit of work: rows [row0, row0+nrows) of one sequence, whose query
 * vectors fit in one block's shared memory, over all its 32-key tiles.
 * tile_begin is the prefix sum of tiles over earlier works. */
typedef struct fp4idx_cuda_work_s {
  int64_t tile_begin;
  int32_t seq;
  int32_t row0;
  int32_t nrows;
  int32_t _pad;
} fp4idx_cuda_work_t;

typedef struct fp4idx_cuda_score_params_s {
  const uint8_t *pool;             /* page pool, P*68 bytes per page */
  const fp4idx_cuda_seq_t *seqs;   /* [n_seqs] */
  const fp4idx_cuda_work_t *works; /* [n_works] */
  int32_t n_works;
  int32_t heads;      /* H */
  int32_t hp;         /* H rounded up to 8 */
  int32_t ntp;        /* n-tiles (8 query vectors) per work, padded to 4 */
  int32_t log2_page;  /* log2(P) */
  int32_t grid;       /* blocks launched (set by the planner) */
  int32_t tile_keys;  /* 64: wgmma kernel; 32: mma.sync kernel (planner) */
  int32_t scorer;     /* fp4idx_cuda_scorer_t the plan was made for */
  int64_t total_tiles;
  /* Optional, for a plan of one work (n_works == 1): has_seq0 = 1 and seq0
   * a copy of that work's descriptor (seqs[works[0].seq]); the sm_90a
   * kernel then reads neither works nor seqs from memory (two dependent
   * loads less before the first tile). has_seq0 = 0: both from memory. */
  int32_t has_seq0;
  int32_t _pad0;
  fp4idx_cuda_seq_t seq0;
} fp4idx_cuda_score_params_t;

/* Host-side plan for scorer `scorer`: for n_seqs sequences with rows[i]
 * rows and width[i] columns and H heads, fills works (capacity max_works)
 * and the launch shape in *p (n_works, hp, ntp, total_tiles, grid, scorer;
 * `sms` = multiprocessor count of the current device). Returns the number
 * of works needed (> max_works means: call again with more room), or
 * FP4IDX_EINVAL (bad shape or unknown scorer). */
int fp4idx_cuda_score_plan(fp4idx_cuda_scorer_t scorer, int32_t heads, int32_t n_seqs,
                           const int32_t *rows,
                           const int64_t *width, int sms,
                           fp4idx_cuda_work_t *works, int32_t max_works,
                           fp4idx_cuda_score_params_t *p);

/* For a plan of one work (p->n_works == 1): copies that work's descriptor,
 * descs[works[0].seq] (host copies of what p->seqs holds on the device),
 * into p->seq0 and sets p->has_seq0, so the kernel reads neither from
 * memory before its first tile. Any other plan: nothing changes. */
void fp4idx_cuda_score_use_seq0(fp4idx_cuda_score_params_t *p, const fp4idx_cuda_work_t *works,
                                const fp4idx_cuda_seq_t *descs);

/* Enqueues the scorer the plan was made for. p->pool, seqs, works must be
 * set (device pointers). The sm_90a scorer is launched with programmatic
 * stream serialization: it may start while the previous kernel of the
 * stream finishes, and reads or writes no global memory before that
 * kernel has completed (same ordering as a plain launch, also in a
 * captured graph). Returns FP4IDX_OK (also for a plan with no tiles:
 * nothing is launched), FP4IDX_EINVAL for a malformed plan, FP4IDX_EDEVICE. */
int fp4idx_cuda_score_launch(const fp4idx_cuda_score_params_t *p, cudaStream_t stream);

/* The launch fp4idx_cuda_score_launch makes, as data in *l (l->func NULL
 * for a plan with no tiles). The kernels' shared-memory attributes are set
 * once per device, here the first time. FP4IDX_OK, FP4IDX_EINVAL for a
 * malformed plan, FP4IDX_EDEVICE. */
int fp4idx_cuda_score_describe(const fp4idx_cuda_score_params_t *p, fp4idx_cuda_launch_t *l);

/* Largest n_works a plan makes for a batch (an upper bound for allocation). */
int32_t fp4idx_cuda_score_max_works(int32_t heads, int32_t n_seqs, const int32_t *rows);

/* ---- top-k (topk.cu) ---------------------------------------------------- */

enum {
  FP4IDX_CUDA_TOPK_MAX = 1 << 20,     /* every k the protocol allows */
  FP4IDX_CUDA_TOPK_SMEM_K = 8192,     /* k above this: CUB segmented sort */
  FP4IDX_CUDA_TOPK_CLUSTER_K = 4096,  /* k up to this: the cluster path may run */
  /* the widest row the cluster path holds (16 blocks of 32,000 keys, where
   * the device runs 16-block clusters) */
  FP4IDX_CUDA_TOPK_CLUSTER_WIDTH = 16 * 32000,
  /* the widest row the row-sort path holds (one block of 1,024 threads) */
  FP4IDX_CUDA_TOPK_ROWSORT_WIDTH = 16384
};

/* Which top-k path a plan uses. AUTO picks from the shape, once, in the
 * planner: the row-sort path (topk_rowsort.cu: one block of 1,024 threads
 * per row, a radix select and a stable block sort of the candidates in
 * shared memory, ONE kernel node, no workspace) when the device is sm_90+,
 * k <= FP4IDX_CUDA_TOPK_CLUSTER_K, every row has at most
 * FP4IDX_CUDA_TOPK_ROWSORT_WIDTH positions and the batch has more rows than
 * a quarter of the SMs and at most as many as the SMs; else the cluster
 * path (topk_cluster.cu: one thread-block cluster of 1..16 blocks per row,
 * the row in shared memory, ONE kernel node, no workspace, no memset) when the device is sm_90+, k <=
 * FP4IDX_CUDA_TOPK_CLUSTER_K and every row has at most
 * FP4IDX_CUDA_TOPK_CLUSTER_WIDTH positions; else the chunked path (topk.cu:
 * a memset and histogram, compaction and a counting-rank finish over the
 * whole GPU; one block per row only for rows with a big threshold bin; CUB's
 * segmented sort for k > FP4IDX_CUDA_TOPK_SMEM_K). ROWSORT, CLUSTER and
 * CHUNKED force one path (tests, benches). Every path gives the same pairs
 * bit for bit. */
typedef enum fp4idx_cuda_topk_path_e {
  FP4IDX_CUDA_TOPK_AUTO = 0,
  FP4IDX_CUDA_TOPK_CHUNKED = 1,
  FP4IDX_CUDA_TOPK_CLUSTER = 2,
  FP4IDX_CUDA_TOPK_ROWSORT = 3
} fp4idx_cuda_topk_path_t;

typedef struct fp4idx_cuda_topk_row_s {
  const float *logits;  /* [width] device */
  int64_t width;        /* 0 .. INT32_MAX positions */
  int64_t chunk0;       /* first chunk of the row: set by fp4idx_cuda_topk_plan */
} fp4idx_cuda_topk_row_t;

/* Launch shape and workspace layout of one top-k launch (host-side). */
typedef struct fp4idx_cuda_topk_plan_s {
  int32_t n_rows, k;
  int64_t chunk_len;     /* positions per block of the histogram/compact passes */
  int64_t total_chunks;  /* blocks of those passes, all rows together */
  int32_t large_k;       /* k > FP4IDX_CUDA_TOPK_SMEM_K */
  int32_t rank_blocks;   /* blocks per row of the counting-rank finish (k <= SMEM_K) */
  int32_t bucket_cap;    /* largest candidate bucket (one bin) rank_kernel takes */
  int32_t cluster;       /* > 0: the cluster path with this many blocks per row */
  int32_t rowsort;       /* 1: the row-sort path (one block per row) */
  int64_t slice;         /* cluster path: positions per block */
  size_t cluster_smem;   /* cluster path: dynamic shared memory per block */
  size_t memset_bytes;   /* zeroed at the start of every launch */
  size_t o_hist, o_seg, o_ccount, o_cand, o_sorted, o_cub, cub_bytes;
  size_t o_info, o_cursor, o_bucket;  /* per-row state of the counting-rank finish */
  size_t ws_bytes;       /* device workspace the launch needs (256-aligned) */
} fp4idx_cuda_topk_plan_t;

/* Plans a top-k of k over n_rows rows: reads rows[i].width, sets
 * rows[i].chunk0 (rows is a HOST array; upload it afterwards) and fills *p.
 * Returns FP4IDX_OK, FP4IDX_EINVAL (k outside 1..FP4IDX_CUDA_TOPK_MAX, a
 * width outside 0..INT32_MAX), FP4IDX_E2BIG (the large-k sort's 2^31
 * candidate limit) or FP4IDX_EDEVICE (CUB's size query failed). */
int fp4idx_cuda_topk_plan(fp4idx_cuda_topk_row_t *rows, int32_t n_rows, int32_t k,
                          fp4idx_cuda_topk_plan_t *p);

/* fp4idx_cuda_topk_plan with the path chosen by the caller (tests, benches):
 * AUTO is fp4idx_cuda_topk_plan; CHUNKED always plans the chunked path;
 * CLUSTER and ROWSORT return FP4IDX_ENODEV where that path cannot run
 * (device before sm_90, k > FP4IDX_CUDA_TOPK_CLUSTER_K, a row too wide, no
 * rows).
 * Other returns as fp4idx_cuda_topk_plan, and FP4IDX_EINVAL for an unknown
 * path. */
int fp4idx_cuda_topk_plan_path(fp4idx_cuda_topk_row_t *rows, int32_t n_rows, int32_t k,
                               fp4idx_cuda_topk_path_t path, fp4idx_cuda_topk_plan_t *p);

/* Enqueues the top-k planned in *p: rows is the DEVICE copy of the planned
 * rows, ws a device workspace of p->ws_bytes. Per row, the k largest visible
 * logits (not -inf, not NaN), logit descending then position ascending;
 * pos/val [n_rows, k] (unused: -1 / -inf), count [n_rows]. No host
 * synchronization (capturable). FP4IDX_EINVAL on a bad plan or NULL
 * pointer, FP4IDX_E2BIG when the large-k write grid would overflow. */
int fp4idx_cuda_topk_launch(const fp4idx_cuda_topk_plan_t *p, const fp4idx_cuda_topk_row_t *rows,
                            void *ws, int32_t *pos, float *val, int32_t *count,
                            cudaStream_t stream);

/* The launch of a top-k plan that is one kernel (the row-sort and cluster
 * paths) as data
 * in *l, arguments as fp4idx_cuda_topk_launch's. FP4IDX_OK; FP4IDX_ENODEV
 * for a plan of several operations (the chunked path: use
 * fp4idx_cuda_topk_launch) or where the device cannot run it;
 * FP4IDX_EINVAL on a bad plan or NULL pointer. */
int fp4idx_cuda_topk_describe(const fp4idx_cuda_topk_plan_t *p, const fp4idx_cuda_topk_row_t *rows,
                              int32_t *pos, float *val, int32_t *count, fp4idx_cuda_launch_t *l);

/* ---- store / read (store.cu) -------------------------------------------- */

/* Quantizes n keys (bf16 or f32 [n,128]) into the pool at slots[i], in two
 * kernels: a check that sets *flag (device int, zeroed by this call) when a
 * key holds NaN/inf, then the store, which writes nothing if *flag != 0. */
int fp4idx_cuda_store_launch(uint8_t *pool, int32_t log2_page, const void *keys,
                             fp4idx_dtype_t dtype, int64_t n, const int64_t *slots,
                             fp4idx_rounding_t mode, int32_t *flag, cudaStream_t stream);

/* Stores n packed [n,68] slots verbatim. */
int fp4idx_cuda_store_packed_launch(uint8_t *pool, int32_t log2_page,
                                    const uint8_t *packed, int64_t n,
                                    const int64_t *slots, cudaStream_t stream);

/* Gathers n slots: dequant == 0 -> [n,68] bytes, else [n,128] f32 (exact). */
int fp4idx_cuda_read_launch(const uint8_t *pool, int32_t log2_page,
                            const int64_t *slots, int64_t n, int dequant,
                            void *out, cudaStream_t stream);

/* Decodes every (E2M1 code, UE8M0 byte) pair with the scorer's decoder:
 * out[s * 16 + c] = bf16 bits of code c at scale byte s ([256*16], device). */
int fp4idx_cuda_decode_table_launch(uint16_t *out, cudaStream_t stream);

/* Internal (topk_cluster.cu): fills the cluster fields and ws_bytes of *p
 * (n_rows and k already set) for rows (host array): clusters of a power of
 * two up to max_cluster blocks (the planner passes 16, benches cap it),
 * about one block per SM over the batch while a block keeps 4,096 keys or
 * more, as many as the widest row's slices of at most 32,000 keys need.
 * Returns FP4IDX_OK, or FP4IDX_ENODEV where the cluster path cannot run or
 * would need clusters of more than max_cluster blocks. */
int fp4idx__cuda_topk_cluster_plan(const fp4idx_cuda_topk_row_t *rows, int32_t n_rows, int32_t k,
                                   int32_t max_cluster, fp4idx_cuda_topk_plan_t *p);

/* Internal (topk_rowsort.cu): sets rowsort and ws_bytes of *p (n_rows and k
 * already set) for rows (host array). FP4IDX_OK, or FP4IDX_ENODEV where the
 * row-sort path cannot run (device before sm_90, k >
 * FP4IDX_CUDA_TOPK_CLUSTER_K, a row wider than
 * FP4IDX_CUDA_TOPK_ROWSORT_WIDTH, no rows) or, with automatic != 0, where
 * the planner's rule does not take it (n_rows outside (SMs / 4, SMs]). */
int fp4idx__cuda_topk_rowsort_plan(const fp4idx_cuda_topk_row_t *rows, int32_t n_rows, int32_t k,
                                   int automatic, fp4idx_cuda_topk_plan_t *p);

/* Internal (topk_rowsort.cu): the launch of a row-sort plan (n_rows >= 1)
 * as data. FP4IDX_EINVAL on a malformed plan, FP4IDX_ENODEV where the
 * device cannot run it. */
int fp4idx__cuda_topk_rowsort_describe(const fp4idx_cuda_topk_plan_t *p,
                                       const fp4idx_cuda_topk_row_t *rows, int32_t *pos,
                                       float *val, int32_t *count, fp4idx_cuda_launch_t *l);

/* Internal (topk_cluster.cu): the launch of a cluster-path plan (n_rows >=
 * 1) as data. FP4IDX_EINVAL on a malformed plan, FP4IDX_ENODEV where the
 * device cannot run it. */
int fp4idx__cuda_topk_cluster_describe(const fp4idx_cuda_topk_plan_t *p,
                                       const fp4idx_cuda_topk_row_t *rows, int32_t *pos,
                                       float *val, int32_t *count, fp4idx_cuda_launch_t *l);

/* Logs "fp4idx cuda: <what>: <cuda error string>" to stderr when err != 0
 * and returns FP4IDX_EDEVICE; returns FP4IDX_OK for cudaSuccess. */
int fp4idx__cuda_check(cudaError_t err, const char *what);

/* ---- inputs in device memory: checked, then the outputs published
 *      (check_publish.cu) ------------------------------------------------ */

/* Which tensor a check entry is; also the order of failures (q first). */
enum { FP4IDX_CUDA_CHECK_Q = 0, FP4IDX_CUDA_CHECK_W = 1, FP4IDX_CUDA_CHECK_LENS = 2 };
#define FP4IDX_CUDA_CHECK_INDEX_MASK ((1ull << 44) - 1)
/* Inputs and outputs one publish kernel (one block) takes, in bytes each. */
#define FP4IDX_CUDA_PUBLISH_MAX ((size_t)1 << 20)

/* One input tensor to check: q or w (n bf16 values: none may be NaN or
 * inf) or lens (n int32: each in 0..bound). seq: its sequence's index in
 * the call (reported with a failure). */
typedef struct fp4idx_cuda_check_in_s {
  const void *data;
  uint64_t n;
  int32_t seq;
  int32_t tensor;  /* FP4IDX_CUDA_CHECK_* */
  int32_t bound;   /* lens: the greatest length allowed */
  int32_t _pad;
} fp4idx_cuda_check_in_t;

/* One output copy (device to device, any alignment). */
typedef struct fp4idx_cuda_copy_s {
  void *dst;
  const void *src;
  uint64_t bytes;
} fp4idx_cuda_copy_t;

typedef struct fp4idx_cuda_publish_params_s {
  const fp4idx_cuda_check_in_t *ins;  /* [n_ins] */
  const fp4idx_cuda_copy_t *copies;   /* [n_copies], done only if every input passed */
  int32_t n_ins, n_copies;
  /* A mapped host word (its device address): ~0 when every input passed,
   * else the first failure's key (fp4idx_cuda_check_verdict reads it). */
  unsigned long long *verdict;
  /* Optional (NULL: none): a mapped host word stored last, after the
   * copies, with done_value | -status (status 0, FP4IDX_ENONFINITE or
   * FP4IDX_ERANGE) in its low 16 bits: a channel's completion word. */
  uint32_t *done;
  uint32_t done_value;
  uint32_t _pad;
} fp4idx_cuda_publish_params_t;

/* The check-and-publish launch (one block of 1,024 threads) of *p into
 * *out; pdl = 1 (only where the device runs the sm_90 build) launches it
 * with programmatic stream serialization: its check of the inputs runs
 * under the previous kernel's tail, its copies after that kernel ends.
 * FP4IDX_OK, or FP4IDX_EINVAL (no verdict word, negative counts). */
int fp4idx_cuda_publish_describe(const fp4idx_cuda_publish_params_t *p, int pdl,
                                 fp4idx_cuda_launch_t *out);

/* A verdict word as the kernel left it: FP4IDX_OK (~0: every input passed),
 * FP4IDX_ENONFINITE (q or w) or FP4IDX_ERANGE (lens), with the failure's
 * sequence index, tensor (FP4IDX_CUDA_CHECK_*) and element index in *seq,
 * *tensor, *index (each may be NULL). */
int fp4idx_cuda_check_verdict(uint64_t verdict, int32_t *seq, int32_t *tensor,
                              uint64_t *index);

#ifdef __cplusplus
}
#endif
#endif /* FP4IDX_CUDA_H */
