// score_work.cuh -- which work item a tile belongs to, shared by the sm_80
// (score.cu) and sm_90a (score_sm90.cu) scorers.
//
// The host flattens a batch into works (one sequence's group of verify rows,
// sorted by tile_begin) and gives each block a contiguous range of tiles;
// a block finds the work holding its current tile by binary search.
#pragma once

#include "fp4idx_cuda.h"

// Index of the last work with tile_begin <= tile. Arguments by value: taking
// the address of a kernel parameter could move it to local memory.
__device__ __forceinline__ int fp4idx__work_of_tile(const fp4idx_cuda_work_t *works,
                                                    int n_works, int64_t tile) {
  int lo = 0, hi = n_works - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (works[mid].tile_begin <= tile) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The work holding tile `cur` of a block's tile range [.., te); *seg_end =
// where that work's tiles end within the range (the segment the block
// stages the work's queries for).
__device__ __forceinline__ fp4idx_cuda_work_t fp4idx__segment_of(
    const fp4idx_cuda_score_params_t &prm, int64_t cur, int64_t te, int64_t *seg_end) {
  const int lo = fp4idx__work_of_tile(prm.works, prm.n_works, cur);
  const int64_t wend = lo + 1 < prm.n_works ? prm.works[lo + 1].tile_begin : prm.total_tiles;
  *seg_end = wend < te ? wend : te;
  return prm.works[lo];
}

// fp4idx__segment_of, and the segment's sequence: from the parameters
// where the plan is one work whose descriptor the caller copied there
// (has_seq0), else from memory.
__device__ __forceinline__ fp4idx_cuda_work_t fp4idx__segment_seq(
    const fp4idx_cuda_score_params_t &prm, int64_t cur, int64_t te, int64_t *seg_end,
    fp4idx_cuda_seq_t *sq) {
  if (prm.has_seq0 && prm.n_works == 1) {
    *seg_end = te;  // te <= total_tiles, the one work's end
    *sq = prm.seq0;
    fp4idx_cuda_work_t wk;
    wk.tile_begin = 0;
    wk.seq = 0;
    wk.row0 = 0;
    wk.nrows = prm.seq0.rows;
    wk._pad = 0;
    return wk;
  }
  const fp4idx_cuda_work_t wk = fp4idx__segment_of(prm, cur, te, seg_end);
  *sq = prm.seqs[wk.seq];
  return wk;
}
