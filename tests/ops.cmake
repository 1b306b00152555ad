# Kernel tests: the CPU backend of src/kernels/ops.h against finite differences and double references.
gtrain_add_c_test(test_ops_cpu SOURCES ${GTRAIN_TEST_DIR}/test_ops_cpu.c LIBS gtrain_kernels LABELS unit)
