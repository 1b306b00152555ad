# What a run reports: log.tensorboard's event files (src/core/tbevents.c) read by the tensorboard
# package's own reader, against the run's log.metrics. tests/metrics/tensorboard_test.py describes
# each scenario. Needs the venv of tools/setup-venv.sh (GTRAIN_HF_PYTHON), which has tensorboard.
string(REPLACE ";" " " _tb_mpi_flags "${GTRAIN_MPIEXEC_FLAGS}")
foreach(scenario read_by_tensorboard live ranks_and_errors mfu_with_peak)
  add_test(NAME tensorboard_${scenario}
           COMMAND ${GTRAIN_HF_PYTHON} ${GTRAIN_TEST_DIR}/metrics/tensorboard_test.py
                   --gtrain $<TARGET_FILE:gtrain> --prep $<TARGET_FILE:gtrain-prep>
                   --mpiexec=${MPIEXEC_EXECUTABLE} "--np-flag=${MPIEXEC_NUMPROC_FLAG}"
                   "--mpi-flags=${_tb_mpi_flags}"
                   --work ${CMAKE_CURRENT_BINARY_DIR}/tensorboard_${scenario}
                   ${scenario})
  set_tests_properties(tensorboard_${scenario} PROPERTIES LABELS unit TIMEOUT 300
                       ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()
set_tests_properties(tensorboard_ranks_and_errors PROPERTIES LABELS "unit;mpi")

# The MFU's peak by the GPU's name (src/core/mfu.c).
gtrain_add_c_test(test_mfu SOURCES ${GTRAIN_TEST_DIR}/test_mfu.c)

# A picture of the step (src/core/trace.c): gtrain --plan --trace's predicted step and log.trace's
# measured steps as Chrome trace JSON (tests/metrics/trace_test.py describes each scenario).
foreach(scenario plan measured)
  add_test(NAME trace_${scenario}
           COMMAND ${Python3_EXECUTABLE} ${GTRAIN_TEST_DIR}/metrics/trace_test.py
                   --gtrain $<TARGET_FILE:gtrain> --prep $<TARGET_FILE:gtrain-prep>
                   --mpiexec=${MPIEXEC_EXECUTABLE} "--np-flag=${MPIEXEC_NUMPROC_FLAG}"
                   "--mpi-flags=${_tb_mpi_flags}"
                   --work ${CMAKE_CURRENT_BINARY_DIR}/trace_${scenario}
                   ${scenario})
  set_tests_properties(trace_${scenario} PROPERTIES LABELS unit TIMEOUT 300
                       ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()
set_tests_properties(trace_measured PROPERTIES LABELS "unit;mpi")
