# Multi-node: launch/gtrain.sbatch across Slurm nodes (two at a time, of three) that
# tests/cluster/cluster.sh makes on this machine (network, UTS and mount namespaces on a bridge;
# munged, slurmctld, a slurmd per node): the two-node job's losses and final state equal a one-node
# mpirun run's (srun with PMIx, and mpirun); its state file resumes on one node with the global batch
# kept; a node-local checkpoint.dir and another build on one node are refused by name; SIGINT ->
# exit 75 -> requeue; a stopped rank, a killed node and a node whose link goes down each end the step
# and the script runs it again on the node left, to a COMPLETED job; a job on a node that died just
# before is requeued naming it; a hang and a lost node with no re-run left (GTRAIN_RETRIES=0) each
# requeue the job, which resumes; a
# three-node job that loses a node, whose two nodes left cannot keep its global batch (exit 2), requeues
# at its full size and resumes on three once the node is back. Needs root and tools/setup-debian.sh
# --slurm; exits 77 (skipped) without them. About 4 to 6 minutes on 2 loaded cores; every wait inside
# has a deadline, and the cluster is taken down on any exit.
add_test(NAME cluster_two_nodes
         COMMAND bash ${GTRAIN_TEST_DIR}/cluster/run_cluster_test.sh $<TARGET_FILE_DIR:gtrain> ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/cluster_two_nodes)
set_tests_properties(cluster_two_nodes PROPERTIES
                     LABELS cluster SKIP_RETURN_CODE 77 TIMEOUT 900 RUN_SERIAL TRUE)

# A rank on another build (a stale copy on one node) is refused at start-up by name; label mpi, since
# it needs no cluster (the cluster test repeats it across two nodes).
add_test(NAME mismatched_binary_named
         COMMAND bash ${GTRAIN_TEST_DIR}/cluster/mismatched_binary.sh $<TARGET_FILE:gtrain> ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/mismatched_binary ${MPIEXEC_EXECUTABLE} ${GTRAIN_MPIEXEC_FLAGS})
set_tests_properties(mismatched_binary_named PROPERTIES LABELS mpi TIMEOUT 120
                     ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")

# cluster.sh's `--link RATE`: a token-bucket filter on every node's link while the cluster is up, shown
# by `status`, gone with `down`; a bad RATE exits 2 (tests/cluster/link_shaping.sh; about 10 s).
add_test(NAME cluster_link_shaping
         COMMAND bash ${GTRAIN_TEST_DIR}/cluster/link_shaping.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/cluster_link_shaping)
set_tests_properties(cluster_link_shaping PROPERTIES
                     LABELS cluster SKIP_RETURN_CODE 77 TIMEOUT 300 RUN_SERIAL TRUE)
