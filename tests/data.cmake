# Token data layer (src/core/data.c) and gtrain-prep.
gtrain_add_c_test(test_data SOURCES ${GTRAIN_TEST_DIR}/test_data.c ARGS $<TARGET_FILE:gtrain-prep>)
add_dependencies(test_data gtrain-prep)

# gtrain-prep's exit status on bad invocations: exactly 2, with a message (cmake -P script).
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/data_prep_empty.txt "")
function(gtrain_data_prep_expect name regex)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2 "-DEXPECT_ERR=${regex}"
                   -P ${GTRAIN_TEST_DIR}/data/expect_exit.cmake $<TARGET_FILE:gtrain-prep> ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS unit)
endfunction()
set(_src ${GTRAIN_TEST_DIR}/test_data.c)
set(_out ${CMAKE_CURRENT_BINARY_DIR}/data_prep_out)
gtrain_data_prep_expect(data_prep_no_output "-o PREFIX" ${_src})
gtrain_data_prep_expect(data_prep_missing_file "gtrain-no-such-input" -o ${_out} /nonexistent/gtrain-no-such-input)
gtrain_data_prep_expect(data_prep_bad_fraction "val-fraction" --val-fraction 1.5 -o ${_out} ${_src})
gtrain_data_prep_expect(data_prep_empty_input "empty input" -o ${_out} ${CMAKE_CURRENT_BINARY_DIR}/data_prep_empty.txt)
