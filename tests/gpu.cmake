# GPU tests: the CUDA backend against the CPU backend (tests/gpu/). Built only when the CUDA backend
# is; without a visible device the test exits 77 and CTest reports it as skipped.
if(GTRAIN_HAVE_CUDA)
  gtrain_add_c_test(test_ops_cuda SOURCES ${GTRAIN_TEST_DIR}/gpu/test_ops_cuda.c LIBS gtrain_kernels LABELS gpu)
  # the cuDNN attention graphs without a device (skipped without libcudnn.so.9): their descriptors
  # finalize and their wiring holds; then, for a described H200, an engine compiles each of them.
  # Label gpu, not unit: they skip (77) where the CUDA libraries are missing, and only gpu tests may skip.
  gtrain_add_c_test(test_cudnn_graph SOURCES ${GTRAIN_TEST_DIR}/gpu/test_cudnn_graph.c LIBS gtrain_kernels
                    LABELS gpu)
  add_test(NAME test_cudnn_graph_aot
           COMMAND bash ${GTRAIN_TEST_DIR}/scripts/cudnn_graph_aot.sh $<TARGET_FILE:test_cudnn_graph>
                   ${GTRAIN_TEST_DIR}/gpu/h200-device.json ${CUDAToolkit_LIBRARY_DIR} ${CMAKE_CURRENT_BINARY_DIR}/cudnn_aot)
  set_tests_properties(test_cudnn_graph_aot PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
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

# The default path of the CUDA backend run on the CPU (label unit): tests/gpu/emu emulates the CUDA
# execution model (blocks in turn, each block's threads as fibers with real __syncthreads and warp
# barriers, guard pages after shared and device memory; cuda_emu.h says what it checks and what it
# cannot; docs/gpu.md), and test_ops_cuda.c, compiled with GT_CUDA_EMULATED, compares the real kernel
# sources of cuda_pointwise.cu, cuda_norm.cu, cuda_rope.cu, cuda_loss.cu, cuda_attention.cu,
# cuda_optimizer.cu, cuda_ops.cu and cuda_attention_mma.cu with the CPU backend. Copies of those .cu files are rewritten for the host compiler at build time
# (emu/emulate_cu.cmake: launches and __shared__ declarations only); emu/include comes first on their
# include path and stands in for the toolkit's cuda_runtime.h and for the backend's cuda_ptx.cuh (the
# mma file's inline-PTX wrappers), so the product sources name nothing of the emulation. cuBLASLt's
# matmul and the cuDNN attention variant are replaced by tests/gpu/emu/emu_stubs.cpp. Needs the
# toolkit's headers only (no GPU, no driver).
if(GTRAIN_HAVE_CUDA)
  enable_language(CXX)
  set(_emu_dir ${CMAKE_CURRENT_BINARY_DIR}/cuda_emu)
  set(_emu_src "")
  foreach(f cuda_pointwise cuda_norm cuda_rope cuda_loss cuda_attention cuda_optimizer cuda_ops cuda_attention_mma)
    add_custom_command(
      OUTPUT ${_emu_dir}/${f}.cpp
      COMMAND ${CMAKE_COMMAND} -DIN=${CMAKE_SOURCE_DIR}/src/kernels/cuda/${f}.cu -DOUT=${_emu_dir}/${f}.cpp
              -P ${GTRAIN_TEST_DIR}/gpu/emu/emulate_cu.cmake
      DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/cuda/${f}.cu ${GTRAIN_TEST_DIR}/gpu/emu/emulate_cu.cmake
      COMMENT "Rewriting ${f}.cu for the CPU emulation")
    list(APPEND _emu_src ${_emu_dir}/${f}.cpp)
  endforeach()
  add_executable(test_ops_cuda_emulated ${GTRAIN_TEST_DIR}/gpu/test_ops_cuda.c ${GTRAIN_KERNELS_CPU_SRC} ${_emu_src}
                 ${GTRAIN_TEST_DIR}/gpu/emu/cuda_emu.cpp ${GTRAIN_TEST_DIR}/gpu/emu/emu_stubs.cpp)
  # the CPU backend's sources as gtrain_kernels builds them (flags of the top-level CMakeLists.txt)
  target_include_directories(test_ops_cuda_emulated PRIVATE ${CMAKE_SOURCE_DIR}/src/kernels ${GTRAIN_CBLAS_INCLUDE})
  target_compile_options(test_ops_cuda_emulated PRIVATE $<$<COMPILE_LANGUAGE:C>:-fno-trapping-math -fno-math-errno>)
  if(GTRAIN_CPU_ARCH)
    target_compile_options(test_ops_cuda_emulated PRIVATE $<$<COMPILE_LANGUAGE:C>:-march=${GTRAIN_CPU_ARCH}>)
  endif()
  target_compile_definitions(test_ops_cuda_emulated PRIVATE GT_CUDA_EMULATED=1)
  # the emulated sources: the emulation's cuda_runtime.h first, then the toolkit's host headers (bf16,
  # vector types, the runtime API's declarations); no fused multiply-adds (the kernels' __fmul_rn etc.)
  set_source_files_properties(${_emu_src} ${GTRAIN_TEST_DIR}/gpu/emu/cuda_emu.cpp
                              ${GTRAIN_TEST_DIR}/gpu/emu/emu_stubs.cpp PROPERTIES
    INCLUDE_DIRECTORIES "${GTRAIN_TEST_DIR}/gpu/emu/include;${GTRAIN_TEST_DIR}/gpu/emu;${CMAKE_SOURCE_DIR}/src/kernels/cuda;${CUDAToolkit_INCLUDE_DIRS}"
    COMPILE_OPTIONS "-std=c++17;-ffp-contract=off;-Wno-unknown-pragmas")
  target_link_libraries(test_ops_cuda_emulated PRIVATE gtrain_blas OpenMP::OpenMP_C ${GTRAIN_LIBM})
  # twice: blocks and threads in launch order, then reversed (GT_EMU_SCHEDULE=reverse), so a kernel
  # that depends on the order its threads run in cannot pass both by luck (and cp.async copies land
  # at their wait_group, then at issue: GT_EMU_CP_ASYNC=eager); ~10 s each (most of it the mma
  # attention's checks). A third run, of the attention checks only, takes a block's warps one at a
  # time (GT_EMU_SCHEDULE=warps: each warp until all its lanes wait at __syncthreads), so a warp that
  # reads other warps' shared-memory writes without a block barrier between reads the poison (~9 s).
  add_test(NAME cuda_kernels_emulated_match_cpu COMMAND test_ops_cuda_emulated)
  add_test(NAME cuda_kernels_emulated_match_cpu_reverse_schedule COMMAND test_ops_cuda_emulated)
  add_test(NAME cuda_kernels_emulated_attention_warp_schedule COMMAND test_ops_cuda_emulated)
  set_tests_properties(cuda_kernels_emulated_match_cpu cuda_kernels_emulated_match_cpu_reverse_schedule
                       cuda_kernels_emulated_attention_warp_schedule PROPERTIES
    LABELS unit
    TIMEOUT 120)
  set_tests_properties(cuda_kernels_emulated_attention_warp_schedule PROPERTIES
    ENVIRONMENT "GT_TEST_QUICK=1;GT_TEST_ONLY=attention;GT_EMU_SCHEDULE=warps;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  set_tests_properties(cuda_kernels_emulated_match_cpu PROPERTIES
    ENVIRONMENT "GT_TEST_QUICK=1;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  set_tests_properties(cuda_kernels_emulated_match_cpu_reverse_schedule PROPERTIES
    ENVIRONMENT "GT_TEST_QUICK=1;GT_EMU_SCHEDULE=reverse;GT_EMU_CP_ASYNC=eager;OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endif()

# The trainer's CUDA path on the same emulation (label unit): gtrain_emulated is gtrain built from its
# own sources (core, dist, the CPU kernels: the lists of the top-level CMakeLists.txt) with the
# emulated CUDA backend above in place of the nvcc-built one, and linked to no CUDA library: the
# runtime functions the core and src/dist call come from cuda_emu.cpp (one emulated device), NCCL from
# emu_nccl.cpp (every call fails: dist.comm=nccl is not emulated). tests/scripts/trainer_emulated.sh
# runs configs/tiny.ini (shrunk) with train.device=cpu and cuda and compares the losses as
# tests/gpu/run.sh's trainer phase does on a GPU.
if(GTRAIN_HAVE_CUDA)
  add_custom_command(
    OUTPUT ${_emu_dir}/cuda_version.cpp
    COMMAND ${CMAKE_COMMAND} -DIN=${CMAKE_SOURCE_DIR}/src/kernels/cuda/cuda_version.cu -DOUT=${_emu_dir}/cuda_version.cpp
            -P ${GTRAIN_TEST_DIR}/gpu/emu/emulate_cu.cmake
    DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/cuda/cuda_version.cu ${GTRAIN_TEST_DIR}/gpu/emu/emulate_cu.cmake
    COMMENT "Rewriting cuda_version.cu for the CPU emulation")
  set(_emu_trainer_cxx ${_emu_src} ${_emu_dir}/cuda_version.cpp ${GTRAIN_TEST_DIR}/gpu/emu/cuda_emu.cpp
                       ${GTRAIN_TEST_DIR}/gpu/emu/emu_stubs.cpp ${GTRAIN_TEST_DIR}/gpu/emu/emu_nccl.cpp)
  add_executable(gtrain_emulated ${CMAKE_SOURCE_DIR}/src/core/gtrain_main.c ${GTRAIN_CORE_SRC} ${GTRAIN_DIST_SRC}
                 ${GTRAIN_KERNELS_CPU_SRC} ${_emu_trainer_cxx})
  # as the real gtrain is compiled: GTRAIN_HAVE_CUDA for core and dist (comm_nccl.c includes the
  # toolkit's cuda_runtime.h and nccl.h for declarations only), the kernels' flags for the CPU backend
  target_compile_definitions(gtrain_emulated PRIVATE GTRAIN_HAVE_CUDA=1 GT_CUDA_EMULATED=1
                             GTRAIN_VERSION="${PROJECT_VERSION}-cuda-emulated" GTRAIN_GIT_COMMIT="${GTRAIN_GIT_COMMIT}")
  target_include_directories(gtrain_emulated PRIVATE ${CMAKE_SOURCE_DIR}/src/core ${CMAKE_SOURCE_DIR}/src/dist
                             ${CMAKE_SOURCE_DIR}/src/kernels ${GTRAIN_CBLAS_INCLUDE}
                             $<$<COMPILE_LANGUAGE:C>:${GTRAIN_NCCL_INCLUDE}> $<$<COMPILE_LANGUAGE:C>:${CUDAToolkit_INCLUDE_DIRS}>)
  target_compile_options(gtrain_emulated PRIVATE $<$<COMPILE_LANGUAGE:C>:-fno-trapping-math -fno-math-errno>)
  if(GTRAIN_CPU_ARCH)
    target_compile_options(gtrain_emulated PRIVATE $<$<COMPILE_LANGUAGE:C>:-march=${GTRAIN_CPU_ARCH}>)
  endif()
  set_source_files_properties(${_emu_dir}/cuda_version.cpp ${GTRAIN_TEST_DIR}/gpu/emu/emu_nccl.cpp PROPERTIES
    INCLUDE_DIRECTORIES "${GTRAIN_TEST_DIR}/gpu/emu/include;${GTRAIN_TEST_DIR}/gpu/emu;${CMAKE_SOURCE_DIR}/src/kernels/cuda;${GTRAIN_NCCL_INCLUDE};${CUDAToolkit_INCLUDE_DIRS}"
    COMPILE_OPTIONS "-std=c++17;-ffp-contract=off;-Wno-unknown-pragmas")
  target_link_libraries(gtrain_emulated PRIVATE MPI::MPI_C hdf5::hdf5 PkgConfig::INIH PkgConfig::JANSSON gtrain_blas
                        OpenMP::OpenMP_C ${GTRAIN_LIBM})
  if(GTRAIN_HAVE_DNNL)   # the CPU's bf16 table too, so that the script can set it beside the emulated GPU's
    target_compile_definitions(gtrain_emulated PRIVATE GTRAIN_HAVE_DNNL=1)
    target_include_directories(gtrain_emulated PRIVATE ${GTRAIN_DNNL_INCLUDE})
    target_link_libraries(gtrain_emulated PRIVATE ${GTRAIN_DNNL_LIBRARY})
  endif()
  add_test(NAME trainer_on_emulated_cuda
           COMMAND bash ${GTRAIN_TEST_DIR}/scripts/trainer_emulated.sh $<TARGET_FILE:gtrain_emulated>
                   $<TARGET_FILE:gtrain-prep> ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/trainer_emulated)
  set_tests_properties(trainer_on_emulated_cuda PROPERTIES LABELS unit TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  # tests/gpu/run.sh's model phase (gtrain --calibrate on the CUDA backend, a run reading the file,
  # predicted_step_ms beside the measured step) on the emulated CUDA backend at a small shape
  add_test(NAME gpu_run_model_phase_emulated
           COMMAND bash ${GTRAIN_TEST_DIR}/scripts/gpu_run_model.sh ${CMAKE_SOURCE_DIR} $<TARGET_FILE:gtrain_emulated>
                   $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/gpu_run_model_emulated cuda ONLY_PASS)
  set_tests_properties(gpu_run_model_phase_emulated PROPERTIES LABELS unit TIMEOUT 300)
endif()

# The GPU check script's CPU-side logic, here where there is no GPU: every phase says SKIP, the
# script exits 0, and summary.json parses with the seven phases in order (where a GPU is visible, a
# stand-in nvidia-smi hides it). And shellcheck over the GPU scripts.
add_test(NAME gpu_run_script_skips_cleanly_without_gpu
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/gpu_run_dry.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/gpu_run_dry)
set_tests_properties(gpu_run_script_skips_cleanly_without_gpu PROPERTIES LABELS unit TIMEOUT 120)
# The model phase's path (calibrate, run, predicted beside measured, recorded in summary.json and
# results.tar.gz; FAIL when the metrics lack predicted_step_ms) with gtrain on the CPU backend
add_test(NAME gpu_run_model_phase_cpu
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/gpu_run_model.sh ${CMAKE_SOURCE_DIR} $<TARGET_FILE:gtrain>
                 $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/gpu_run_model_cpu cpu)
set_tests_properties(gpu_run_model_phase_cpu PROPERTIES LABELS unit TIMEOUT 300)
find_program(GTRAIN_SHELLCHECK shellcheck)
if(GTRAIN_SHELLCHECK)
  add_test(NAME gpu_scripts_pass_shellcheck
           COMMAND ${GTRAIN_SHELLCHECK} ${GTRAIN_TEST_DIR}/gpu/run.sh ${CMAKE_SOURCE_DIR}/tools/bundle-runtime.sh
                   ${CMAKE_SOURCE_DIR}/tools/gpu-prepare.sh)
  set_tests_properties(gpu_scripts_pass_shellcheck PROPERTIES LABELS unit)
endif()
