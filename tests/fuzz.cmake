# Fuzz harnesses (tests/fuzz/fuzz_<name>.c, each a libFuzzer LLVMFuzzerTestOneInput) and their corpora
# (tests/fuzz/corpus/<name>/). docs/fuzzing.md says how to run them.
#
# Every build: fuzz_replay_<name> (label unit) feeds every file of the committed corpus to the
# harness, built with the normal compiler (and with ASan+UBSan in the GTRAIN_SANITIZE build), so CI
# replays every input that once found a bug. With -DGTRAIN_FUZZ=ON (clang, a build dir of its own)
# the real fuzzers fuzz_<name> are built as well.
#
# A new harness is one name in this list, its .c file and a corpus directory.
set(GTRAIN_FUZZ_HARNESSES
  config   # the INI parser with validation and overrides (gt_config_load_string)
  data     # token-shard header and loader (gt_data_open and the batch functions)
  state    # the training-state reader (gt_state_read) on crafted HDF5 files
  safetensors  # the safetensors header parser of model.init (src/core/safetensors.c)
)

foreach(name ${GTRAIN_FUZZ_HARNESSES})
  set(harness ${GTRAIN_TEST_DIR}/fuzz/fuzz_${name}.c)
  add_executable(fuzz_replay_${name} ${harness} ${GTRAIN_TEST_DIR}/fuzz/replay_main.c)
  target_link_libraries(fuzz_replay_${name} PRIVATE gtrain_core)
  target_compile_definitions(fuzz_replay_${name} PRIVATE GTRAIN_FUZZ_STATE_INI="${GTRAIN_TEST_DIR}/fuzz/state_model.ini")
  add_test(NAME fuzz_replay_${name} COMMAND fuzz_replay_${name} ${GTRAIN_TEST_DIR}/fuzz/corpus/${name})
  set_tests_properties(fuzz_replay_${name} PROPERTIES LABELS unit TIMEOUT 300)
  if(GTRAIN_FUZZ)
    add_executable(fuzz_${name} ${harness})
    target_link_libraries(fuzz_${name} PRIVATE gtrain_core)
    target_compile_definitions(fuzz_${name} PRIVATE GTRAIN_FUZZ_STATE_INI="${GTRAIN_TEST_DIR}/fuzz/state_model.ini")
    target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
  endif()
endforeach()
