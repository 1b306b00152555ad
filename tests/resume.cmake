# Training-state files (src/core/state*.c, runstate*.c): end-to-end scenarios driving the real gtrain
# binary under mpiexec (label resume), and the Hugging Face export (tools/state_to_hf.py), which
# fails where GTRAIN_HF_PYTHON lacks h5py, safetensors, torch or transformers.
# tests/resume/resume_test.py describes each scenario; state_check is its outside reader of the files.

# checkpoint.every = auto's arithmetic: Young's interval, Daly's bound, the lineage's history record,
# the key (src/core/autosave.c); the scenario resume_auto_cadence runs it end to end.
gtrain_add_c_test(test_autosave SOURCES ${GTRAIN_TEST_DIR}/test_autosave.c LABELS unit)

add_executable(state_check ${GTRAIN_TEST_DIR}/resume/state_check.c)
target_link_libraries(state_check PRIVATE hdf5::hdf5 MPI::MPI_C ${GTRAIN_LIBM})

if(Python3_Interpreter_FOUND)
  string(REPLACE ";" " " _resume_mpi_flags "${GTRAIN_MPIEXEC_FLAGS}")
  foreach(scenario kill9_bitwise kill_during_save reshard global_batch_kept corrupt_fallback shape_mismatch sigterm
                   bad_files_never_count_toward_keep unusable_dir dir_not_shared full_disk nonfinite model_change time_cadence
                   memory_preflight save_is_durable leftover_tmp_removed_at_start
                   async_equals_sync async_kill_during_write async_missing_rank_file rank_file_incomplete async_sigterm async_full_disk
                   resave_is_atomic save_failure_names_every_rank eio_mid_save
                   lineage_other_run rollback_branch bad_set_aside_twice failed_saves_escalate read_errors
                   memsnap_kill9 memsnap_torn memsnap_unverified memsnap_fallbacks memsnap_partner memsnap_auto
                   auto_cadence)
    add_test(NAME resume_${scenario}
             COMMAND ${Python3_EXECUTABLE} ${GTRAIN_TEST_DIR}/resume/resume_test.py
                     --gtrain $<TARGET_FILE:gtrain> --prep $<TARGET_FILE:gtrain-prep>
                     --check $<TARGET_FILE:state_check>
                     --mpiexec=${MPIEXEC_EXECUTABLE} "--np-flag=${MPIEXEC_NUMPROC_FLAG}"
                     "--mpi-flags=${_resume_mpi_flags}"
                     --work ${CMAKE_CURRENT_BINARY_DIR}/resume_${scenario}
                     ${scenario})
    set_tests_properties(resume_${scenario} PROPERTIES
      LABELS resume
      TIMEOUT 300
      SKIP_RETURN_CODE 77
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()

  # GTRAIN_HF_PYTHON: tests/CMakeLists.txt
  add_test(NAME resume_state_to_hf
           COMMAND ${GTRAIN_HF_PYTHON} ${GTRAIN_TEST_DIR}/resume/state_to_hf_test.py
                   --gtrain $<TARGET_FILE:gtrain> --prep $<TARGET_FILE:gtrain-prep>
                   --tool ${PROJECT_SOURCE_DIR}/tools/state_to_hf.py
                   --work ${CMAKE_CURRENT_BINARY_DIR}/resume_state_to_hf)
  set_tests_properties(resume_state_to_hf PROPERTIES
    LABELS resume
    TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1")
endif()

# The asynchronous save's host copy is counted in the memory check before step 1 (preflight.c).
add_test(NAME async_snapshot_counted_before_step_1
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/async_snapshot_memory.sh $<TARGET_FILE:gtrain>
                 $<TARGET_FILE:gtrain-prep> ${PROJECT_SOURCE_DIR}/configs/tiny.ini
                 ${CMAKE_CURRENT_BINARY_DIR}/async_snapshot_memory)
set_tests_properties(async_snapshot_counted_before_step_1 PROPERTIES LABELS resume TIMEOUT 120)
