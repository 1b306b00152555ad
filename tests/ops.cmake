# Kernel tests: the CPU backend of src/kernels/ops.h against finite differences and double references.
# One program, four tests (its groups): the ops but attention in fp32, attention, attention with
# document masks, and the bf16 table against the fp32 one.
add_executable(test_ops_cpu ${GTRAIN_TEST_DIR}/test_ops_cpu.c)
target_link_libraries(test_ops_cpu PRIVATE gtrain_kernels)
target_include_directories(test_ops_cpu PRIVATE ${GTRAIN_TEST_DIR})
foreach(group fp32 attention documents bf16)
  add_test(NAME test_ops_cpu_${group} COMMAND test_ops_cpu ${group} WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(test_ops_cpu_${group} PROPERTIES LABELS unit SKIP_RETURN_CODE 77)
endforeach()
# The bf16 table's matrix products on a CPU without bf16 units: oneDNN held below AVX512-BF16
# (DNNL_MAX_CPU_ISA) stands in for one, so the widened sgemm path is checked on every machine.
add_test(NAME test_ops_cpu_bf16_widened
         COMMAND ${CMAKE_COMMAND} "-DCMD=$<TARGET_FILE:test_ops_cpu>|bf16"
                 "-DEXPECT=matrix products: OpenBLAS sgemm, the bf16 operands widened" -DREJECT=FAIL
                 -P ${GTRAIN_TEST_DIR}/scripts/check_run.cmake)
set_tests_properties(test_ops_cpu_bf16_widened PROPERTIES LABELS "unit;bf16" ENVIRONMENT "DNNL_MAX_CPU_ISA=AVX512_CORE")
