/* cpu_quant_avx512.c -- cpu_quant_kern.c compiled for AVX-512 (F/BW/VL). */
#define FP4IDX__QK_SUFFIX avx512
#include "cpu_quant_kern.c"
