# Hugging Face checkpoints in (model.init, src/core/hf_import.c) and out (tools/state_to_hf.py),
# against transformers itself (label hf). tests/hf/hf_test.py describes the cases:
#   hf_gqa_...       LLaMA-2 style GQA, fp32, split into several safetensors files; W = 1, 2, 4 import alike
#   hf_llama31_...   llama3 RoPE scaling, bf16 on disk, config.json with rope_theta + rope_scaling
#   hf_tied_...      tied embeddings, fp16 on disk; bf16 export; a state file wins over model.init
#   hf_broken_...    truncated files, lying offsets, unsupported dtypes, non-JSON headers, config mismatches
#   hf_llama3_configs_...  configs/llama3.2_1b.ini, llama3_8b.ini: as many parameters as transformers counts
#   hf_export_like_...  the export carries the init checkpoint's config keys, generation config and tokenizer
# Each: loss and gradients of the import equal transformers' within 1e-5; 20 steps of training; the export
# loads in transformers without warnings and its validation loss equals gtrain's within 1e-5.
# hf_grads is the test program that runs gtrain's model on an imported checkpoint.
add_executable(hf_grads ${GTRAIN_TEST_DIR}/hf/hf_grads.c)
target_link_libraries(hf_grads PRIVATE gtrain_core)

if(Python3_Interpreter_FOUND)
  # GTRAIN_HF_PYTHON: tests/CMakeLists.txt
  string(REPLACE ";" " " _hf_mpi_flags "${GTRAIN_MPIEXEC_FLAGS}")
  # test name (the property it shows) and hf_test.py --case
  set(_hf_cases
      hf_gqa_sharded_import_train_export_match_transformers gqa
      hf_llama31_rope_scaling_matches_transformers llama31
      hf_tied_embeddings_match_transformers tied
      hf_broken_checkpoints_exit_2 broken
      hf_llama3_configs_count_like_transformers configs
      hf_export_like_init_carries_config_tokenizer like)
  list(LENGTH _hf_cases _n)
  math(EXPR _last "${_n} - 1")
  foreach(i RANGE 0 ${_last} 2)
    math(EXPR j "${i} + 1")
    list(GET _hf_cases ${i} name)
    list(GET _hf_cases ${j} case)
    add_test(NAME ${name}
             COMMAND ${GTRAIN_HF_PYTHON} ${GTRAIN_TEST_DIR}/hf/hf_test.py --case ${case}
                     --gtrain $<TARGET_FILE:gtrain> --grads $<TARGET_FILE:hf_grads>
                     --tool ${PROJECT_SOURCE_DIR}/tools/state_to_hf.py
                     --mpiexec=${MPIEXEC_EXECUTABLE} "--mpiexec-flags=${_hf_mpi_flags}"
                     --work ${CMAKE_CURRENT_BINARY_DIR}/${name})
    set_tests_properties(${name} PROPERTIES
      LABELS hf
      TIMEOUT 600
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endif()
