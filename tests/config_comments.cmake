# The configs' comments: the --plan output they quote is what --plan prints (configs/*.ini).
add_test(NAME config_comments_match_plan
         COMMAND ${GTRAIN_TEST_DIR}/scripts/config_comments_match_plan.sh $<TARGET_FILE:gtrain> ${CMAKE_SOURCE_DIR})
set_tests_properties(config_comments_match_plan PROPERTIES LABELS unit TIMEOUT 300)
