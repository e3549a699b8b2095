# CUDA backend tests (label gpu): they skip cleanly when no GPU is present.
# sass_check runs everywhere cuobjdump exists (no GPU needed).
if(TARGET fp4idx_cuda)
  fp4idx_add_test(test_cuda SOURCES test_cuda.c
    LIBS fp4idx_cuda fp4idx_cpu fp4idx_test_util LABELS gpu)
  set_tests_properties(test_cuda PROPERTIES TIMEOUT 1500)
  add_test(NAME cuda_sass_check
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/sass_check.sh
                   $<TARGET_OBJECTS:fp4idx_cuda_score_obj>)
  set_tests_properties(cuda_sass_check PROPERTIES SKIP_RETURN_CODE 77 LABELS unit)
endif()
if(TARGET fp4idx_cuda AND TARGET fp4idx_daemon_harness)
  # CUDA regions on the GPU: device buffers registered by IPC handle, scored
  # into, compared with the CPU backend through the socket. Skips without a GPU.
  fp4idx_add_test(test_cuda_regions SOURCES test_cuda_regions.c
    LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util CUDA::cudart
    LABELS gpu daemon)
  set_tests_properties(test_cuda_regions PROPERTIES TIMEOUT 600)
endif()
