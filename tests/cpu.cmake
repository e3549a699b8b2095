# CPU backend tests: golden scorer cases, randomized dyadic cases against the
# float64 reference of tests/common, top-k, store/read, argument errors.
fp4idx_add_test(test_cpu SOURCES test_cpu.c
  LIBS fp4idx_cpu fp4idx_test_util LABELS unit)
fp4idx_add_test(test_cpu_random SOURCES test_cpu_random.c
  LIBS fp4idx_cpu fp4idx_test_util LABELS unit)
# The fast quantizer of the CPU store (kernels/cpu/cpu_quant.c) against
# fp4idx_quantize_key, byte for byte, on every ISA path.
fp4idx_add_test(test_cpu_quant SOURCES test_cpu_quant.c
  LIBS fp4idx_cpu fp4idx_test_util LABELS unit)
