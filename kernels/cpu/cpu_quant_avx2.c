/* cpu_quant_avx2.c -- cpu_quant_kern.c compiled for AVX2 (see CMakeLists.txt). */
#define FP4IDX__QK_SUFFIX avx2
#include "cpu_quant_kern.c"
