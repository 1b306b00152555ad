# GPU tests: the CUDA backend against the CPU backend (tests/gpu/). Built only when the CUDA backend
# is; without a visible device the test exits 77 and CTest reports it as skipped.
if(GTRAIN_HAVE_CUDA)
  gtrain_add_c_test(test_ops_cuda SOURCES ${GTRAIN_TEST_DIR}/gpu/test_ops_cuda.c LIBS gtrain_kernels LABELS gpu)
endif()
# Per-op timings at the 1B and 7B shapes beside their rooflines (tests/gpu/run.sh runs it; not a test:
# it asserts nothing).
if(GTRAIN_HAVE_CUDA)
  add_executable(bench_ops_cuda ${GTRAIN_TEST_DIR}/gpu/bench_ops_cuda.c)
  target_link_libraries(bench_ops_cuda PRIVATE gtrain_kernels)
endif()
