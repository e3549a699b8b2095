# Format tests, and the shared test helper library (tests/common/test_util.h)
# that every later area links: this file is included first.
add_library(fp4idx_test_util STATIC ${CMAKE_CURRENT_SOURCE_DIR}/common/test_util.c)
target_include_directories(fp4idx_test_util PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/common)
target_link_libraries(fp4idx_test_util PUBLIC fp4idx_format m)
target_compile_definitions(fp4idx_test_util PRIVATE
  FP4IDX_GOLDEN_DIR_DEFAULT="${FP4IDX_GOLDEN_DIR}")

fp4idx_add_test(test_format SOURCES test_format.c
  LIBS fp4idx_test_util fp4idx_format LABELS unit)
