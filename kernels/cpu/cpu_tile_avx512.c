/* cpu_tile_avx512.c -- cpu_tile.c compiled for AVX-512 F/DQ/BW/VL (see
 * CMakeLists.txt). */
#define FP4IDX__TILE_NAME fp4idx__score_tile_avx512
#include "cpu_tile.c"
