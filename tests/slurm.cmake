# Slurm launch (launch/gtrain.sbatch) on a real one-node cluster that the test starts itself (munged,
# slurmctld, slurmd from Debian's munge and slurm-wlm, all private to a temp dir): a job stopped by
# SIGTERM and by the batch-shell SIGUSR1 saves, exits 75, requeues itself, resumes, and ends with the
# weights and optimizer state of an uninterrupted run. Needs root and tools/setup-debian.sh --slurm;
# exits 77 (skipped) without them. About a minute on 2 cores.
add_test(NAME slurm_sbatch_stop_requeue_resume
         COMMAND bash ${GTRAIN_TEST_DIR}/slurm/run_slurm_test.sh $<TARGET_FILE_DIR:gtrain> ${CMAKE_SOURCE_DIR})
set_tests_properties(slurm_sbatch_stop_requeue_resume PROPERTIES
                     LABELS slurm SKIP_RETURN_CODE 77 TIMEOUT 900 RUN_SERIAL TRUE)
