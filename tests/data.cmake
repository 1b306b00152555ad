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

# Real tokenizers and other shard formats, end to end (tests/data/hf_data_test.py says what each
# scenario shows). GTRAIN_HF_PYTHON: a Python with the `tokenizers` package (tools/run-tests.sh passes
# the venv of tools/setup-venv.sh); these tests fail rather than skip without it.
if(Python3_Interpreter_FOUND)
  string(REPLACE ";" " " _hf_mpi_flags "${GTRAIN_MPIEXEC_FLAGS}")
  foreach(scenario tokenizer_prep_train_sample_roundtrip prep_jsonl_4byte_ids_bos_separator llmc_shard_is_trained_on
                   shards_same_samples_any_world_size bad_shards_and_globs_exit_2 blend_same_samples_any_world_size
                   chat_loss_mask_matches_transformers)
    add_test(NAME data_${scenario}
             COMMAND ${GTRAIN_HF_PYTHON} ${GTRAIN_TEST_DIR}/data/hf_data_test.py ${scenario}
                     --gtrain $<TARGET_FILE:gtrain> --sample $<TARGET_FILE:gtrain-sample>
                     --prep-tool ${PROJECT_SOURCE_DIR}/tools/prep_tokenized.py
                     --mpiexec=${MPIEXEC_EXECUTABLE} "--np-flag=${MPIEXEC_NUMPROC_FLAG}"
                     "--mpi-flags=${_hf_mpi_flags}"
                     --work ${CMAKE_CURRENT_BINARY_DIR}/data_${scenario})
    set(_labels unit)
    if(scenario MATCHES "same_samples_any_world_size|chat_loss_mask")
      set(_labels mpi)
    endif()
    set_tests_properties(data_${scenario} PROPERTIES LABELS ${_labels} TIMEOUT 300
                         ENVIRONMENT "OMP_NUM_THREADS=1")
  endforeach()
else()
  message(WARNING "python3 not found: the tokenizer and shard tests (data_*) are not registered")
endif()
