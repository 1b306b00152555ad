# End-to-end: the real gtrain binary learns real text (label unit).
add_test(NAME training_lowers_the_loss
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/train_lowers_loss.sh $<TARGET_FILE:gtrain>
                 $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/training_lowers_the_loss)
set_tests_properties(training_lowers_the_loss PROPERTIES LABELS unit TIMEOUT 300)
