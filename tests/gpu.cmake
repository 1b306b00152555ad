# GPU tests: the CUDA backend against the CPU backend (tests/gpu/). Built only when the CUDA backend
# is; without a visible device the test exits 77 and CTest reports it as skipped.
if(GTRAIN_HAVE_CUDA)
  gtrain_add_c_test(test_ops_cuda SOURCES ${GTRAIN_TEST_DIR}/gpu/test_ops_cuda.c LIBS gtrain_kernels LABELS gpu)
  # the cuDNN attention graphs without a device (skipped without libcudnn.so.9): their descriptors
  # finalize and their wiring holds; then, for a described H200, an engine compiles each of them
  gtrain_add_c_test(test_cudnn_graph SOURCES ${GTRAIN_TEST_DIR}/gpu/test_cudnn_graph.c LIBS gtrain_kernels)
  add_test(NAME test_cudnn_graph_aot
           COMMAND bash ${GTRAIN_TEST_DIR}/scripts/cudnn_graph_aot.sh $<TARGET_FILE:test_cudnn_graph>
                   ${GTRAIN_TEST_DIR}/gpu/h200-device.json ${CUDAToolkit_LIBRARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/cudnn_aot)
  set_tests_properties(test_cudnn_graph_aot PROPERTIES LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 120)
endif()
# Per-op timings at the 1B and 7B shapes beside their rooflines (tests/gpu/run.sh runs it; not a test:
# it asserts nothing).
if(GTRAIN_HAVE_CUDA)
  add_executable(bench_ops_cuda ${GTRAIN_TEST_DIR}/gpu/bench_ops_cuda.c)
  target_link_libraries(bench_ops_cuda PRIVATE gtrain_kernels)
endif()

# The mma attention's index math without a GPU (label unit): tests/gpu/emulate_mma_attention_fwd.py and
# _bwd.py run a transcription of cuda_attention_mma.cu's kernels on a numpy emulation of ldmatrix,
# mma.sync and shfl (tests/gpu/mma_emu.py) against a direct fp64 attention, then check that deliberately
# wrong fragment layouts fail. Pure numpy, about 5 and 16 s on one core; registered with or without
# the CUDA backend. GTRAIN_HF_PYTHON: a Python with numpy (tools/setup-venv.sh's venv); without numpy
# they fail, saying so, rather than skip.
if(Python3_Interpreter_FOUND)
  foreach(dir fwd bwd)
    set(_name mma_attention_forward_emulation_matches_fp64)
    if(dir STREQUAL "bwd")
      set(_name mma_attention_backward_emulation_matches_fp64)
    endif()
    add_test(NAME ${_name} COMMAND ${GTRAIN_HF_PYTHON} -B ${GTRAIN_TEST_DIR}/gpu/emulate_mma_attention_${dir}.py)
    set_tests_properties(${_name} PROPERTIES
      LABELS unit
      TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  endforeach()
else()
  message(WARNING "python3 not found: the mma attention emulation tests (mma_attention_*_emulation_*) are not registered")
endif()

# The GPU check script's CPU-side logic, here where there is no GPU: every phase says SKIP, the
# script exits 0, and summary.json parses with the seven phases in order (skipped where a GPU is
# visible: there the script would run for real). And shellcheck over the GPU scripts.
add_test(NAME gpu_run_script_skips_cleanly_without_gpu
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/gpu_run_dry.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/gpu_run_dry)
set_tests_properties(gpu_run_script_skips_cleanly_without_gpu PROPERTIES LABELS unit SKIP_RETURN_CODE 77 TIMEOUT 120)
find_program(GTRAIN_SHELLCHECK shellcheck)
if(GTRAIN_SHELLCHECK)
  add_test(NAME gpu_scripts_pass_shellcheck
           COMMAND ${GTRAIN_SHELLCHECK} ${GTRAIN_TEST_DIR}/gpu/run.sh ${CMAKE_SOURCE_DIR}/tools/bundle-runtime.sh
                   ${CMAKE_SOURCE_DIR}/tools/gpu-prepare.sh)
  set_tests_properties(gpu_scripts_pass_shellcheck PROPERTIES LABELS unit)
endif()
