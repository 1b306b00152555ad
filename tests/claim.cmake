# One run per checkpoint.dir (src/core/runclaim.c): a second run on a directory in use is refused,
# a stale claim (kill -9, a reused pid, a reboot, the same Slurm job restarted) is taken over, a claim
# from another host needs checkpoint.takeover. tests/claim/claim_test.py describes each scenario.
if(Python3_Interpreter_FOUND)
  string(REPLACE ";" " " _claim_mpi_flags "${GTRAIN_MPIEXEC_FLAGS}")
  foreach(scenario second_run_refused stale_taken_over other_host slurm_restart slurm_steps slurm_clusters
                   multi_rank)
    add_test(NAME claim_${scenario}
             COMMAND ${Python3_EXECUTABLE} ${GTRAIN_TEST_DIR}/claim/claim_test.py
                     --gtrain $<TARGET_FILE:gtrain> --prep $<TARGET_FILE:gtrain-prep>
                     --mpiexec=${MPIEXEC_EXECUTABLE} "--np-flag=${MPIEXEC_NUMPROC_FLAG}"
                     "--mpi-flags=${_claim_mpi_flags}"
                     --work ${CMAKE_CURRENT_BINARY_DIR}/claim_${scenario}
                     ${scenario})
    set_tests_properties(claim_${scenario} PROPERTIES LABELS resume TIMEOUT 300
                         ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
  set_tests_properties(claim_multi_rank PROPERTIES LABELS "resume;mpi")
endif()
