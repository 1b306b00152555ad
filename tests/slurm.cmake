# Slurm launch (launch/gtrain.sbatch) on a real one-node cluster that the test starts itself (munged,
# slurmctld, slurmd from Debian's munge and slurm-wlm, all private to a temp dir): a job stopped by
# SIGTERM and by the batch-shell SIGUSR1 saves, exits 75, requeues itself, resumes, and ends with the
# weights and optimizer state of an uninterrupted run; a job whose binary exits 74 is requeued held
# and freed by scontrol release. Needs root and tools/setup-debian.sh --slurm;
# exits 77 (skipped) without them. About a minute on 2 cores.
add_test(NAME slurm_sbatch_stop_requeue_resume
         COMMAND bash ${GTRAIN_TEST_DIR}/slurm/run_slurm_test.sh $<TARGET_FILE_DIR:gtrain> ${CMAKE_SOURCE_DIR})
set_tests_properties(slurm_sbatch_stop_requeue_resume PROPERTIES
                     LABELS slurm SKIP_RETURN_CODE 77 TIMEOUT 900 RUN_SERIAL TRUE)

# launch/gtrain.sbatch's decisions with stand-ins for srun, scontrol and sinfo (no Slurm needed): a stop
# to the batch shell before the first run, between two runs, just before a run starts, missed by a
# starting step, or that kills the ranks, ends in a requeue; exit 74 (saves keep failing) holds the job
# with one line; a hang or a lost node with no re-run left, and a re-run on fewer nodes that gtrain
# refuses, requeue the job (at its full size after a lost node). About 15 s.
add_test(NAME sbatch_stops_requeue
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/sbatch_stops.sh ${CMAKE_SOURCE_DIR}/launch/gtrain.sbatch
                 ${CMAKE_CURRENT_BINARY_DIR}/sbatch_stops_requeue)
set_tests_properties(sbatch_stops_requeue PROPERTIES LABELS resume TIMEOUT 300)
