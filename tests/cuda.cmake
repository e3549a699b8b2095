# CUDA backend tests (label gpu): they skip cleanly when no GPU is present.
# sass_check runs everywhere cuobjdump exists (no GPU needed).
if(TARGET fp4idx_cuda)
  fp4idx_add_test(test_cuda SOURCES test_cuda.c
    LIBS fp4idx_cuda fp4idx_cpu fp4idx_test_util LABELS gpu)
  set_tests_properties(test_cuda PROPERTIES TIMEOUT 1500)
  # The top-k (kernels/cuda/topk.cu) against the CPU backend and a host sort.
  fp4idx_add_test(test_cuda_topk SOURCES test_cuda_topk.c
    LIBS fp4idx_cuda fp4idx_cpu fp4idx_test_util LABELS gpu)
  set_tests_properties(test_cuda_topk PROPERTIES TIMEOUT 1500)
  fp4idx_add_test(test_cuda_reqpath SOURCES test_cuda_reqpath.c
    LIBS fp4idx_cuda fp4idx_cpu fp4idx_test_util LABELS gpu)
  set_tests_properties(test_cuda_reqpath PROPERTIES TIMEOUT 900)
  add_test(NAME cuda_sass_check
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/sass_check.sh
                   $<TARGET_OBJECTS:fp4idx_cuda_score_obj>)
  set_tests_properties(cuda_sass_check PROPERTIES SKIP_RETURN_CODE 77 LABELS unit)
  # The daemon end to end, cpu vs cuda backend, through fp4idx-cli (skips: 77).
  add_test(NAME test_e2e_daemon_cuda
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/e2e_daemon.sh $<TARGET_FILE:fp4idxd>
                   $<TARGET_FILE:fp4idx-cli> ${FP4IDX_GOLDEN_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/e2e_daemon)
  set_tests_properties(test_e2e_daemon_cuda PROPERTIES SKIP_RETURN_CODE 77 LABELS gpu TIMEOUT 300)
endif()
if(TARGET fp4idx_cuda AND TARGET fp4idx_daemon_harness)
  # CUDA regions on the GPU: device buffers registered by IPC handle, scored
  # into, compared with the CPU backend through the socket. Skips without a GPU.
  fp4idx_add_test(test_cuda_regions SOURCES test_cuda_regions.c
    LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util CUDA::cudart
    LABELS gpu daemon)
  set_tests_properties(test_cuda_regions PROPERTIES TIMEOUT 600)
  # Channels called by a CUDA stream (cuStreamWriteValue / WaitValue, a
  # captured graph), against the socket's bytes. Skips without a GPU.
  fp4idx_add_test(test_cuda_channel SOURCES test_cuda_channel.c
    LIBS fp4idx::client fp4idx_daemon_harness fp4idx_test_util CUDA::cudart
    LABELS gpu daemon)
  set_tests_properties(test_cuda_channel PROPERTIES TIMEOUT 900)
endif()
