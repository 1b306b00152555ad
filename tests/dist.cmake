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
