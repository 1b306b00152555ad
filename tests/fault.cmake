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

# A hung rank (stopped by SIGSTOP, computing forever, or stuck or stopped inside a save) ends the job
# within dist.timeout plus a margin, exit 76, with one line naming it (src/dist/watchdog.h;
# GTRAIN_TEST_HANG_AT and GTRAIN_TEST_HANG_IN_SAVE: src/core/testhooks.h); a save that is slow but
# writes (GTRAIN_TEST_SLOW_SAVE=0:MS) finishes however much longer than dist.timeout it takes. With
# dist.timeout = 600, dist.liveness_timeout (5 s) names a stopped or a wedged rank within the test's
# minute, and a rank stopped for 2 s again and again finishes.

foreach(mode stop spin save asyncsave slowstop savestop slowsave slowsave1rank slowasyncsave slowrankasyncsave
        livestop livespin stopcycles)
  add_test(NAME watchdog_names_hung_rank_${mode}
           COMMAND bash ${GTRAIN_TEST_DIR}/scripts/watchdog_names_hung_rank.sh ${mode} $<TARGET_FILE:gtrain>
                   $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/watchdog_names_hung_rank_${mode}
                   ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
  set_tests_properties(watchdog_names_hung_rank_${mode} PROPERTIES LABELS mpi TIMEOUT 300)
endforeach()

# docs/launch.md's table "how a run stops", row by row: gtrain, launch/local.sh with 1 and 2 ranks
# and mpirun by hand, each sent SIGINT, SIGTERM or SIGUSR1 (labels resume and mpi).
add_test(NAME stops_table_holds
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/stops_table.sh $<TARGET_FILE:gtrain> $<TARGET_FILE:gtrain-prep>
                 ${PROJECT_SOURCE_DIR}/launch/local.sh ${CMAKE_CURRENT_BINARY_DIR}/stops_table_holds)
set_tests_properties(stops_table_holds PROPERTIES LABELS "resume;mpi" TIMEOUT 600)

# A rank killed while a non-blocking ZeRO-3 gather is in flight (GTRAIN_TEST_DIE_IN_GATHER=K:RANK:started
# in zero.c) ends the job within dist.timeout plus a margin with one line naming the rank, on 2 and 3
# ranks, ended by mpirun or (mpirun told not to) by the watchdog; the state files written before resume.
foreach(mode launcher watchdog)
  foreach(n 2 3)
    add_test(NAME peer_death_in_prefetch_${mode}_${n}_ranks
             COMMAND bash ${GTRAIN_TEST_DIR}/scripts/peer_death_in_prefetch.sh ${mode} ${n} $<TARGET_FILE:gtrain>
                     $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/peer_death_in_prefetch_${mode}_${n}_ranks
                     ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
    set_tests_properties(peer_death_in_prefetch_${mode}_${n}_ranks PROPERTIES LABELS mpi TIMEOUT 300)
  endforeach()
endforeach()

# train.spike_zscore: a gradient-norm or loss outlier at step 30 is skipped and counted (metrics, state
# file); with the default 0 the same outlier is applied (GTRAIN_TEST_NAN_AT=...:spike|lossspike, testhooks.h).
foreach(mode norm loss off)
  add_test(NAME spike_skip_${mode}
           COMMAND bash ${GTRAIN_TEST_DIR}/scripts/spike_skip.sh ${mode} $<TARGET_FILE:gtrain>
                   $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/spike_skip_${mode}
                   ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
  set_tests_properties(spike_skip_${mode} PROPERTIES LABELS mpi TIMEOUT 300)
endforeach()

# The watchdog runs its on-fire hook (the NCCL abort, comm_nccl.c) after its line and before exit 76;
# a hook that never returns still lets the process exit 76 (tests/watchdog_runs_abort_hook.c).
add_executable(watchdog_runs_abort_hook ${GTRAIN_TEST_DIR}/watchdog_runs_abort_hook.c)
target_link_libraries(watchdog_runs_abort_hook PRIVATE gtrain_dist)
add_test(NAME watchdog_runs_abort_hook_returns
         COMMAND ${CMAKE_COMMAND} "-DCMD=$<TARGET_FILE:watchdog_runs_abort_hook>|returns|${CMAKE_CURRENT_BINARY_DIR}/watchdog_runs_abort_hook_returns"
                 -DRC=76 "-DEXPECT=gtrain: watchdog: rank 0 finished no step[^\n]*exit 76\nabort hook ran\n"
                 -P ${GTRAIN_TEST_DIR}/scripts/check_run.cmake)
add_test(NAME watchdog_runs_abort_hook_hangs
         COMMAND ${CMAKE_COMMAND} "-DCMD=$<TARGET_FILE:watchdog_runs_abort_hook>|hangs|${CMAKE_CURRENT_BINARY_DIR}/watchdog_runs_abort_hook_hangs"
                 -DRC=76 "-DEXPECT=exit 76\nabort hook entered\n" -P ${GTRAIN_TEST_DIR}/scripts/check_run.cmake)
set_tests_properties(watchdog_runs_abort_hook_returns watchdog_runs_abort_hook_hangs PROPERTIES LABELS mpi TIMEOUT 60)

# train.precision = auto on the CPU: bf16 where every rank has bf16 instructions, else fp32, said in one
# line; checked by the losses it computes, with oneDNN held below AVX512-BF16 and with one such rank.
add_test(NAME precision_auto_takes_the_faster
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/precision_auto.sh $<TARGET_FILE:gtrain> $<TARGET_FILE:gtrain-prep>
                 ${CMAKE_CURRENT_BINARY_DIR}/precision_auto ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
set_tests_properties(precision_auto_takes_the_faster PROPERTIES LABELS "mpi;bf16" TIMEOUT 300)

# A stop signal forwarded to the ranks while they start (before MPI_Init, across gtrain's restart of
# itself) ends in a save after the first step and exit 75, the resumed-from file kept
# (GTRAIN_TEST_START_DELAY_MS in gtrain_main.c; src/core/signals.c).
add_test(NAME stop_during_startup_saves
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/stop_during_startup.sh $<TARGET_FILE:gtrain> $<TARGET_FILE:gtrain-prep>
                 ${CMAKE_CURRENT_BINARY_DIR}/stop_during_startup_saves ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
set_tests_properties(stop_during_startup_saves PROPERTIES LABELS "resume;mpi" TIMEOUT 300)
