/* cpu_tile_avx2.c -- cpu_tile.c compiled for AVX2 + FMA (see CMakeLists.txt). */
#define FP4IDX__TILE_NAME fp4idx__score_tile_avx2
#include "cpu_tile.c"
