# A rank that dies ends the job with an error on every rank, never a hang (label mpi).
add_test(NAME rank_death_ends_the_job
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/rank_death_ends_job.sh between-steps $<TARGET_FILE:gtrain>
                 $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/rank_death_ends_the_job
                 ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
set_tests_properties(rank_death_ends_the_job PROPERTIES LABELS mpi TIMEOUT 300)
# The two run the same command line in different directories: the script tells its ranks apart by
# their working directory, so they may run at the same time.

# The same for a rank killed in the middle of a ZeRO-3 unit gather (src/core/zero.c, GTRAIN_TEST_DIE_IN_GATHER).
add_test(NAME rank_death_in_gather_ends_the_job
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/rank_death_ends_job.sh in-gather $<TARGET_FILE:gtrain>
                 $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/rank_death_in_gather_ends_the_job
                 ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
set_tests_properties(rank_death_in_gather_ends_the_job PROPERTIES LABELS mpi TIMEOUT 300)

# The GTRAIN_TEST_* hooks used above are refused without GTRAIN_TEST_HOOKS=1 (src/core/testhooks.h).
add_test(NAME test_hooks_need_the_flag
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/test_hooks_need_the_flag.sh $<TARGET_FILE:gtrain>
                 $<TARGET_FILE:gtrain-prep> ${PROJECT_SOURCE_DIR}/configs/tiny.ini ${CMAKE_CURRENT_BINARY_DIR}/test_hooks_need_the_flag
                 ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
set_tests_properties(test_hooks_need_the_flag PROPERTIES LABELS mpi TIMEOUT 300)
