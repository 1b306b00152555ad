# The time model (src/core/timemodel.c, planner.c gt_plan_time, ops_dry.c's op costs) and its
# calibration (calib.c, calibrate.c, gtrain --calibrate; docs/planner.md).
#   test_timemodel                      unit: a hand-built schedule's step time equals the hand
#                                       computation; the dry schedule's matmul time equals the model's
#                                       FLOPs at the rate; the spans of --plan --trace (times by hand,
#                                       one per op call of the dry micro-batch, none overlapping on a
#                                       stream); the calibration file round-trips and another key is
#                                       refused
#   cli_calibrate_then_plan_reads_it    gtrain --plan says its figures are defaults, gtrain --calibrate
#                                       writes the keyed file, --plan then reads it; a broken file is
#                                       named and not used (tests/scripts/calibrate_plan.sh)
gtrain_add_c_test(test_timemodel SOURCES ${GTRAIN_TEST_DIR}/test_timemodel.c LABELS unit)
add_test(NAME cli_calibrate_then_plan_reads_it
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/calibrate_plan.sh $<TARGET_FILE:gtrain> ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/calibrate_plan)
set_tests_properties(cli_calibrate_then_plan_reads_it PROPERTIES LABELS unit TIMEOUT 300)
