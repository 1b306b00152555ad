# The time model (src/core/timemodel.c, planner.c gt_plan_time, ops_dry.c's op costs) and its
# calibration (calib.c, calibrate.c, gtrain --calibrate; docs/planner.md).
#   test_timemodel                      unit: a hand-built schedule's step time equals the hand
#                                       computation; the dry schedule's matmul time equals the model's
#                                       FLOPs at the rate; the spans of --plan --trace (times by hand,
#                                       one per op call of the dry micro-batch, none overlapping on a
#                                       stream); the calibration file round-trips and another key is
#                                       refused; a run reads the file of its ranks per node, else the
#                                       nearest count's, saying so; auto's recompute plan is the fastest that fits, not
#                                       the least FLOPs; dist.bucket_mb = auto by hand and searched;
#                                       the calibration runs each GEMM once before timing any; the
#                                       collectives priced per link kind (within a node, between nodes
#                                       when the world spans nodes, the defaults' for a kind not measured)
#   cli_calibrate_then_plan_reads_it    gtrain --plan says its figures are defaults, gtrain --calibrate
#                                       writes the keyed file, --plan then reads it (a plan of 2 ranks per
#                                       node as the nearest, saying so); a broken file is named and not
#                                       used (tests/scripts/calibrate_plan.sh)
#   calibrate_rounds_fastest            three of --calibrate's five rounds slowed by 10 ms a call (a test
#                                       hook, as a burst of load) set no figure of the file: each is its
#                                       fastest round's (tests/scripts/calibrate_rounds.sh)
#   calibrate_in_step_factor            --calibrate keeps a micro-batch run whole over its kernels one by
#                                       one (in_step_factor, printed and in the file); --plan's compute
#                                       doubles with the factor set to 2, the optimizer's does not, a file
#                                       without the key prices as 1 (tests/scripts/calibrate_in_step.sh)
#   calibrate_two_ranks                 mpirun -np 2 gtrain --calibrate: both ranks measured each figure,
#                                       the file is keyed 2 ranks per node, a 2-rank plan and run read it
#                                       as theirs, a 1-rank plan as the nearest, saying so; the
#                                       collectives measured within the node, then (each rank a node)
#                                       between nodes, both kept in the file (tests/scripts/calibrate_ranks.sh)
#   pace_against_prediction             the trainer's one pace line: the median of steps 2-6 against the
#                                       predicted step, said slower with a calibration 20x too fast,
#                                       faster with one 20x too slow; a 3-step run says it at its last
#                                       step, a resumed start from its own (tests/scripts/pace_check.sh)
#   test_pace                           unit: the pace line's window (the first step out), its median,
#                                       its bounds (1.24x within, 1.26x slower, 0.79x faster), a
#                                       prediction from the defaults, none without one (src/core/pace.c)
gtrain_add_c_test(test_timemodel SOURCES ${GTRAIN_TEST_DIR}/test_timemodel.c LABELS unit)
gtrain_add_c_test(test_pace SOURCES ${GTRAIN_TEST_DIR}/test_pace.c LABELS unit)
add_test(NAME cli_calibrate_then_plan_reads_it
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/calibrate_plan.sh $<TARGET_FILE:gtrain> ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/calibrate_plan)
set_tests_properties(cli_calibrate_then_plan_reads_it PROPERTIES LABELS unit TIMEOUT 300)
add_test(NAME calibrate_rounds_fastest
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/calibrate_rounds.sh $<TARGET_FILE:gtrain> ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/calibrate_rounds)
set_tests_properties(calibrate_rounds_fastest PROPERTIES LABELS unit TIMEOUT 300)
add_test(NAME calibrate_in_step_factor
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/calibrate_in_step.sh $<TARGET_FILE:gtrain> ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/calibrate_in_step)
set_tests_properties(calibrate_in_step_factor PROPERTIES LABELS unit TIMEOUT 300)
add_test(NAME calibrate_two_ranks
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/calibrate_ranks.sh $<TARGET_FILE:gtrain> $<TARGET_FILE:gtrain-prep>
                 "${MPIEXEC_EXECUTABLE};${GTRAIN_MPIEXEC_FLAGS}" ${CMAKE_CURRENT_BINARY_DIR}/calibrate_two_ranks)
set_tests_properties(calibrate_two_ranks PROPERTIES LABELS mpi TIMEOUT 300)
add_test(NAME pace_against_prediction
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/pace_check.sh $<TARGET_FILE:gtrain> $<TARGET_FILE:gtrain-prep>
                 "${MPIEXEC_EXECUTABLE};${GTRAIN_MPIEXEC_FLAGS}" ${CMAKE_CURRENT_BINARY_DIR}/pace_against_prediction)
set_tests_properties(pace_against_prediction PROPERTIES LABELS unit TIMEOUT 300)
# auto ranked by the time model on the command line (planner.c gt_plan_auto_all, gt_plan_report_time):
#   plan_auto_lists_fastest             --plan with micro_batch = auto and a global batch: the header has
#                                       the chosen micro-batch, and the five fastest plans that fit follow
#   plan_global_batch_needs_world       a global batch the world size does not divide: exit 2, one line
#                                       naming the key
add_test(NAME plan_auto_lists_fastest
         COMMAND ${CMAKE_COMMAND} "-DCMD=$<TARGET_FILE:gtrain>|--plan|${PROJECT_SOURCE_DIR}/configs/tiny.ini|--world|2|train.micro_batch=auto|train.global_batch=8|dist.shard=auto"
                 "-DEXPECT=\nmicro-batch [124] x 128 tokens, grad_accum [124],[^\n]*\n.*\nthe 5 fastest plans that fit[^\n]*\n  #  dist.shard / grad_sync[^\n]*\n  1  ZeRO-"
                 -P ${GTRAIN_TEST_DIR}/scripts/check_run.cmake)
set_tests_properties(plan_auto_lists_fastest PROPERTIES LABELS unit)
add_test(NAME plan_global_batch_needs_world
         COMMAND ${CMAKE_COMMAND} "-DCMD=$<TARGET_FILE:gtrain>|--plan|${PROJECT_SOURCE_DIR}/configs/tiny.ini|--world|3|train.global_batch=8"
                 -DRC=2 "-DEXPECT=^gtrain: command line: train.global_batch=8: global_batch 8 is not a multiple of the 3 ranks [^\n]*\n$"
                 -P ${GTRAIN_TEST_DIR}/scripts/check_run.cmake)
set_tests_properties(plan_global_batch_needs_world PROPERTIES LABELS unit)
# dist.bucket_mb = auto in a run (planner.c option_bucket, train.c resolve_plan):
#   bucket_auto_run                     two ranks of ZeRO-1 calibrate, then train 2 steps with the
#                                       collective latency set to 0 (a size > 0 chosen, printed, and the
#                                       step reduces in buckets) and to a second (0 chosen, no bucket)
#                                       (tests/scripts/bucket_auto_run.sh)
add_test(NAME bucket_auto_run
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/bucket_auto_run.sh $<TARGET_FILE:gtrain> $<TARGET_FILE:gtrain-prep>
                 "${MPIEXEC_EXECUTABLE};${GTRAIN_MPIEXEC_FLAGS}" ${CMAKE_CURRENT_BINARY_DIR}/bucket_auto_run)
set_tests_properties(bucket_auto_run PROPERTIES LABELS mpi TIMEOUT 300)
