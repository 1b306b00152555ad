# Activation checkpointing (src/core/recompute.c, model.c, planner.c).
#
# This file has two roles:
#   - included by tests/CMakeLists.txt (project mode), it registers the tests below;
#   - run as `cmake -DMODE=... -P tests/recompute.cmake` (script mode), it is the checker those
#     tests run (kept here, not in tests/scripts/, so the recompute tests live in one file).
#
# Tests:
#   test_recompute                 unit: bit-identical gradients under every plan, measured activation
#                                  peak == planner prediction, recomputed counts, policy parsing, auto
#   recompute_plan_llama7b         `gtrain --plan --world 8 configs/llama7b.ini`: exit 0 and every
#                                  policy named (only when configs/llama7b.ini exists at configure time)
#   recompute_run_<policy>         the real binary on a tiny model made from a text file with
#                                  gtrain-prep, 3 steps, grad_accum 2: every metrics line has
#                                  recomputed_blocks == per-micro-batch count x 2 and act_peak_bytes ==
#                                  the planner's exact prediction (test_recompute --predict);
#                                  auto runs at a budget 1/4 of the way from full's total to none's
#   recompute_run_bad_policy       memory.recompute=uniform:9 on 3 layers via an override: exit 2
#   recompute_run_documents        selective with data.document_mask and reset_positions (each line of
#                                  the text a document): the same checks

if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.24)
  # ============================================================== script mode: the checkers
  function(run_checked)
    cmake_parse_arguments(R "" "EXPECT_RC;OUT;ERR" "COMMAND" ${ARGN})
    execute_process(COMMAND ${R_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT "${rc}" STREQUAL "${R_EXPECT_RC}")
      string(REPLACE ";" " " shown "${R_COMMAND}")
      message(FATAL_ERROR "expected exit ${R_EXPECT_RC}, got '${rc}'\ncommand: ${shown}\nstdout:\n${out}\nstderr:\n${err}")
    endif()
    if(R_OUT)
      set(${R_OUT} "${out}" PARENT_SCOPE)
    endif()
    if(R_ERR)
      set(${R_ERR} "${err}" PARENT_SCOPE)
    endif()
  endfunction()

  if(MODE STREQUAL "plan")
    # -DGTRAIN= -DCONFIG= -DWORLD=
    string(TIMESTAMP t0 "%s%f")
    run_checked(COMMAND ${GTRAIN} --plan --world ${WORLD} ${CONFIG} EXPECT_RC 0 OUT out)
    string(TIMESTAMP t1 "%s%f")
    math(EXPR us "${t1} - ${t0}")
    message("${out}")
    message(STATUS "gtrain --plan took ${us} us (informational, not checked)")
    foreach(name none selective "blocks:[0-9]+" "uniform:[0-9]+" sqrt full "auto:")
      if(NOT out MATCHES "\n  ${name}|\n${name}")
        message(FATAL_ERROR "the plan report does not name the policy '${name}'")
      endif()
    endforeach()
    if(NOT out MATCHES "world 8")
      message(FATAL_ERROR "the plan report is not for world 8")
    endif()
    return()
  endif()

  # the tiny training runs: -DGTRAIN= -DPREP= -DPREDICT= -DWORK= -DTEXT= -DRECOMPUTE= [-DBAD=1]
  file(REMOVE_RECURSE ${WORK})
  file(MAKE_DIRECTORY ${WORK})
  run_checked(COMMAND ${PREP} --val-fraction 0 -o ${WORK}/text ${TEXT} EXPECT_RC 0)
  set(N 3)
  set(ACCUM 2)
  set(STEPS 3)
  file(WRITE ${WORK}/tiny.ini
"; written by tests/recompute.cmake
[model]
dim = 32
n_layers = ${N}
n_heads = 4
n_kv_heads = 2
vocab_size = 256
ffn_dim = 96
max_seq_len = 32
dropout = 0.1
[train]
seq_len = 32
micro_batch = 2
grad_accum = 1
steps = ${STEPS}
warmup_steps = 1
seed = 7
device = cpu
precision = fp32
[memory]
recompute = none
budget = 1GiB
[dist]
shard = none
[data]
train = ${WORK}/text.train.bin
val =
[checkpoint]
dir =
[log]
metrics =
")
  set(overrides memory.recompute=${RECOMPUTE} train.grad_accum=${ACCUM} log.metrics=${WORK}/metrics.jsonl)
  if(DOCS)
    # documents inside the windows: each line of the text (the newline byte ends a document)
    list(APPEND overrides data.document_mask=true data.reset_positions=true data.separator=10)
  endif()
  if(RECOMPUTE STREQUAL "auto")
    # a budget a quarter of the way from full's total to none's, so auto must give something up
    foreach(p none full)
      run_checked(COMMAND ${PREDICT} --predict ${WORK}/tiny.ini memory.recompute=${p} EXPECT_RC 0 OUT pred)
      string(REGEX MATCH "total_bytes ([0-9]+)" _ "${pred}")
      set(total_${p} ${CMAKE_MATCH_1})
      string(REGEX MATCH "act_peak_bytes ([0-9]+)" _ "${pred}")
      set(act_${p} ${CMAKE_MATCH_1})
    endforeach()
    math(EXPR budget "${total_full} + (${total_none} - ${total_full}) / 4")
    list(APPEND overrides memory.budget=${budget})
  endif()

  if(BAD)
    run_checked(COMMAND ${GTRAIN} ${WORK}/tiny.ini ${overrides} EXPECT_RC 2 ERR err)
    if(NOT err MATCHES "recompute" OR NOT err MATCHES "1\\.\\.${N}")
      message(FATAL_ERROR "the message for recompute=${RECOMPUTE} should name the key and the range 1..${N}:\n${err}")
    endif()
    message(STATUS "exit 2 with: ${err}")
    return()
  endif()

  run_checked(COMMAND ${PREDICT} --predict ${WORK}/tiny.ini ${overrides} EXPECT_RC 0 OUT pred)
  string(REGEX MATCH "act_peak_bytes ([0-9]+)" _ "${pred}")
  set(want_act ${CMAKE_MATCH_1})
  string(REGEX MATCH "recomputed_blocks ([0-9]+)" _ "${pred}")
  math(EXPR want_rec "${CMAKE_MATCH_1} * ${ACCUM}")
  if(RECOMPUTE STREQUAL "auto" AND NOT want_act LESS act_none)
    message(FATAL_ERROR "auto at a budget below none's total should keep less than none (${act_none}):\n${pred}")
  endif()
  string(REGEX MATCH "state_bytes ([0-9]+)" _ "${pred}")
  set(state ${CMAKE_MATCH_1})
  message(STATUS "predicted: ${pred}")

  run_checked(COMMAND ${GTRAIN} ${WORK}/tiny.ini ${overrides} EXPECT_RC 0 OUT out)
  message("${out}")
  file(STRINGS ${WORK}/metrics.jsonl lines)
  set(n_steps 0)
  foreach(line IN LISTS lines)
    string(JSON has_rec ERROR_VARIABLE no_rec GET "${line}" recomputed_blocks)
    if(no_rec)
      continue() # a validation line
    endif()
    math(EXPR n_steps "${n_steps} + 1")
    string(JSON step GET "${line}" step)
    string(JSON act GET "${line}" act_peak_bytes)
    string(JSON total GET "${line}" mem_peak_bytes)
    message(STATUS "step ${step}: recomputed_blocks ${has_rec}, act_peak_bytes ${act}, mem_peak_bytes ${total}")
    if(NOT has_rec EQUAL want_rec)
      message(FATAL_ERROR "step ${step}: recomputed_blocks ${has_rec}, expected ${want_rec} "
                          "(the plan's per micro-batch x grad_accum ${ACCUM}) for recompute=${RECOMPUTE}")
    endif()
    if(NOT act STREQUAL want_act)
      message(FATAL_ERROR "step ${step}: act_peak_bytes ${act}, the planner predicts ${want_act} for recompute=${RECOMPUTE}")
    endif()
    # the total peak holds the model state and the activation peak at least (CMake's integers
    # are 64-bit, ample here)
    math(EXPR floor "${state} + ${act}")
    if(total LESS floor)
      message(FATAL_ERROR "step ${step}: mem_peak_bytes ${total} < model state ${state} + activations ${act}")
    endif()
  endforeach()
  if(NOT n_steps EQUAL STEPS)
    message(FATAL_ERROR "${n_steps} step lines in the metrics, expected ${STEPS}")
  endif()
  return()
endif()

# ================================================================ project mode: the tests
gtrain_add_c_test(test_recompute SOURCES ${GTRAIN_TEST_DIR}/test_recompute.c LABELS unit)

if(EXISTS ${PROJECT_SOURCE_DIR}/configs/llama7b.ini)
  add_test(NAME recompute_plan_llama7b
           COMMAND ${CMAKE_COMMAND} -DMODE=plan -DGTRAIN=$<TARGET_FILE:gtrain> -DWORLD=8
                   -DCONFIG=configs/llama7b.ini -P ${CMAKE_CURRENT_LIST_FILE}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(recompute_plan_llama7b PROPERTIES LABELS unit)
endif()

if(EXISTS /usr/share/common-licenses/GPL-3)
  set(_recompute_text /usr/share/common-licenses/GPL-3)
else()
  set(_recompute_text ${GTRAIN_TEST_DIR}/test_recompute.c)
endif()
function(gtrain_recompute_run name policy)
  add_test(NAME recompute_run_${name}
           COMMAND ${CMAKE_COMMAND} -DMODE=run -DGTRAIN=$<TARGET_FILE:gtrain> -DPREP=$<TARGET_FILE:gtrain-prep>
                   -DPREDICT=$<TARGET_FILE:test_recompute> -DWORK=${CMAKE_CURRENT_BINARY_DIR}/recompute_run_${name}
                   -DTEXT=${_recompute_text} -DRECOMPUTE=${policy} ${ARGN} -P ${CMAKE_CURRENT_LIST_FILE})
  set_tests_properties(recompute_run_${name} PROPERTIES LABELS unit)
endfunction()
gtrain_recompute_run(full full)
gtrain_recompute_run(selective selective)
gtrain_recompute_run(blocks1 blocks:1)
gtrain_recompute_run(auto auto)
gtrain_recompute_run(bad_policy uniform:9 -DBAD=1)
gtrain_recompute_run(documents selective -DDOCS=1)
