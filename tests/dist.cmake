# Tests of src/dist: the communicator (label mpi, run under mpiexec with 1..4 ranks) and the ZeRO
# slice arithmetic (label unit).

gtrain_add_c_test(test_shard SOURCES ${GTRAIN_TEST_DIR}/test_shard.c LIBS gtrain_dist LABELS unit)

add_executable(test_comm ${GTRAIN_TEST_DIR}/test_comm.c)
target_link_libraries(test_comm PRIVATE gtrain_dist)
target_include_directories(test_comm PRIVATE ${GTRAIN_TEST_DIR})
foreach(n 1 2 3 4)
  add_test(NAME comm_np${n}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${GTRAIN_MPIEXEC_FLAGS}
                   $<TARGET_FILE:test_comm>)
  set_tests_properties(comm_np${n} PROPERTIES
    LABELS mpi
    TIMEOUT 300
    SKIP_RETURN_CODE 77
    ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()

# A failed MPI call ends the job with gtrain's own message, not silently (tests/comm_error_ends_the_job.c).
add_executable(comm_error_ends_the_job ${GTRAIN_TEST_DIR}/comm_error_ends_the_job.c)
target_link_libraries(comm_error_ends_the_job PRIVATE gtrain_dist)
string(REPLACE ";" "|" _mpiexec_flags_bar "${GTRAIN_MPIEXEC_FLAGS}")
add_test(NAME comm_error_ends_the_job
         COMMAND ${CMAKE_COMMAND} "-DCMD=${MPIEXEC_EXECUTABLE}|${MPIEXEC_NUMPROC_FLAG}|2|${_mpiexec_flags_bar}|$<TARGET_FILE:comm_error_ends_the_job>"
                 -DRC=NONZERO "-DEXPECT=\\[rank 1\\] [^\n]*comm_mpi\\.c:[0-9]+: MPI_Bcast[^\n]* failed: MPI_ERR_TRUNCATE"
                 "-DREJECT=\\[rank 1\\] the mismatched broadcast returned" -P ${GTRAIN_TEST_DIR}/scripts/check_run.cmake)
set_tests_properties(comm_error_ends_the_job PROPERTIES LABELS mpi TIMEOUT 120)
