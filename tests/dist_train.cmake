# Data parallelism (src/core/train.c, src/core/optim.c): world sizes 1/2/4 train the same model.
# Label mpi; every test runs through mpiexec with OMP_NUM_THREADS=1 (CI has 2 cores, oversubscribed).
#
#   dist_step_np{1,2,4}       tests/test_dist_step.c: micro-batches call no collective; gt_optim_step
#                             calls exactly one gradient reduction (reduce-scatter + all-gather for
#                             shard=optimizer, all-reduce for shard=none) and comm.h's bytes_sent model
#                             holds for the padded slice; optim bytes = 12 * slice_len; parameters are
#                             identical on all ranks and match a one-process reference of the same
#                             global batch.
#   dist_train_prep           gtrain-prep on a small text corpus (fixture for the runs below)
#   dist_train_<run>          the real gtrain binary, 20 steps of a tiny model, same global batch:
#                             ZeRO-1 at W = 1, 2, 4, shard none, ZeRO-2 and ZeRO-3 at W = 1, 2, 4 under
#                             recompute full / selective / uniform:3 and grad_sync micro / step; each
#                             checks its metrics per step against the formulas of tests/dist/dist_train.py
#                             (optim_bytes, comm_bytes, collective calls, unit gathers, params and grads
#                             peaks, which also equal the planner's printed prediction, and MPI's
#                             reduce-scatter staging, comm_staging_bytes, equal to it too)
#   dist_train_resume_*       the ZeRO-3 W = 4 run's state at step 10 resumed at W = 2 ZeRO-1 and W = 1 none
#   dist_train_compare        losses and grad norms step by step within 1e-5 relative of w1_a4; the final
#                             weights (/model of the state file each run saves at its end) within 1e-5
#                             absolute (h5diff -d)
#   dist_train_tied_*         the same for a tied-embedding model (ZeRO-1 reference, ZeRO-3, ZeRO-2)
#   dist_train_buckets_*      dist.bucket_mb > 0 against 0 (grad_sync = step): equal bit for bit, buckets
#                             started during the last micro-batch's backward; the staging of at most two
#                             buckets in flight as predicted, and a memory.budget below the total with it
#                             refused before step 1

add_executable(test_dist_step ${GTRAIN_TEST_DIR}/test_dist_step.c)
target_link_libraries(test_dist_step PRIVATE gtrain_core)
target_include_directories(test_dist_step PRIVATE ${GTRAIN_TEST_DIR})
foreach(n 1 2 4)
  add_test(NAME dist_step_np${n}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${GTRAIN_MPIEXEC_FLAGS}
                   $<TARGET_FILE:test_dist_step>)
  set_tests_properties(dist_step_np${n} PROPERTIES
    LABELS mpi
    TIMEOUT 300
    SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()

if(NOT Python3_Interpreter_FOUND)
  message(WARNING "python3 not found: the end-to-end data-parallel tests (dist_train_*) are not registered")
  return()
endif()

set(_dt_script ${GTRAIN_TEST_DIR}/dist/dist_train.py)
set(_dt_work ${CMAKE_CURRENT_BINARY_DIR}/dist_train)
set(_dt_env "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")

add_test(NAME dist_train_prep
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} prep --work ${_dt_work} --prep $<TARGET_FILE:gtrain-prep>
                 --fallback-text ${PROJECT_SOURCE_DIR}/configs/README.md)
set_tests_properties(dist_train_prep PROPERTIES LABELS mpi TIMEOUT 120 FIXTURES_SETUP dist_train_data)

# One end-to-end run: SPEC is "name world grad_accum shard [options]"; MODE the script's leading
# arguments (run, run --tied, resume --from NAME); then FIXTURES_REQUIRED, FIXTURES_SETUP, DEPENDS lists.
function(gtrain_dist_run spec mode)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "FIXTURES_REQUIRED;FIXTURES_SETUP;DEPENDS")
  string(REPLACE " " ";" spec "${spec}")
  list(GET spec 0 name)
  list(GET spec 1 w)
  list(GET spec 2 accum)
  list(GET spec 3 shard)
  set(opts)
  list(LENGTH spec n)
  if(n GREATER 4)
    list(SUBLIST spec 4 -1 opts)
  endif()
  string(REPLACE " " ";" mode "${mode}")
  add_test(NAME dist_train_${name}
           COMMAND ${Python3_EXECUTABLE} ${_dt_script} ${mode} --work ${_dt_work} --name ${name} --world ${w}
                   --accum ${accum} --shard ${shard} ${opts} --
                   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${w} ${GTRAIN_MPIEXEC_FLAGS}
                   $<TARGET_FILE:gtrain>)
  # RESOURCE_LOCK: one run at a time: they share 2 cores and each is timed
  set_tests_properties(dist_train_${name} PROPERTIES
    LABELS mpi TIMEOUT 600 ENVIRONMENT "${_dt_env}" RESOURCE_LOCK dist_train_cpu
    FIXTURES_REQUIRED "${arg_FIXTURES_REQUIRED}" FIXTURES_SETUP "${arg_FIXTURES_SETUP}" DEPENDS "${arg_DEPENDS}")
endfunction()

# name world grad_accum shard [options]   (the CI subset of the equivalence grid; the full grid W x shard x
# recompute x grad_accum is bench/zero_grid.sh). Every run checks per step: optim_bytes, comm_bytes,
# collective call counts, ZeRO-3 unit gathers (one per block in backward, recompute or not), params and
# grads peaks equal to the formulas and to the planner's printed prediction (tests/dist/dist_train.py).
set(_dt_runs
  "w1_a4 1 4 optimizer"
  "w2_a2 2 2 optimizer"
  "w4_a1 4 1 optimizer"
  "w2_none 2 2 none"
  "w2_a2_grad_sel 2 2 gradients --recompute selective --sync micro"
  "w4_a1_param_full 4 1 parameters --recompute full --save-half"
  "w2_a2_param_uni_step 2 2 parameters --recompute uniform:3 --sync step --prefetch 0"
  "w1_a4_param 1 4 parameters --recompute full --prefetch 2")
set(_dt_names)
foreach(run ${_dt_runs})
  string(REGEX REPLACE " .*" "" name "${run}")
  list(APPEND _dt_names ${name})
  gtrain_dist_run("${run}" run FIXTURES_REQUIRED dist_train_data FIXTURES_SETUP dist_train_runs)
endforeach()

# Save at W = 4 under ZeRO-3 (w4_a1_param_full writes step 10), resume at W = 2 ZeRO-1 and at W = 1 none.
foreach(run "resume_w2_opt 2 2 optimizer" "resume_w1_none 1 4 none")
  gtrain_dist_run("${run}" "resume --from w4_a1_param_full" DEPENDS dist_train_w4_a1_param_full
                  FIXTURES_REQUIRED dist_train_data dist_train_runs FIXTURES_SETUP dist_train_resumed)
endforeach()

add_test(NAME dist_train_compare
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work}
                 --ref w1_a4 ${_dt_names} resume_w2_opt resume_w1_none)
set_tests_properties(dist_train_compare PROPERTIES LABELS mpi TIMEOUT 120
                     FIXTURES_REQUIRED "dist_train_runs;dist_train_data;dist_train_resumed")

# Gradient buckets (dist.bucket_mb, grad_sync = step): the same 6 steps unbucketed and bucketed must give
# EQUAL losses, grad norms and final weights (every MPI reduce-scatter sums in rank order; W = 4, since at
# W = 2 any order gives a + b), the expected number of buckets, those above block 0 started before its
# backward ended, and the same bytes. w2_a2: only the last micro-batch's backward starts buckets; w4_p3:
# ZeRO-3 with buckets of several units; tied: the head's use of the embedding keeps its bucket open;
# gather: also dist.overlap_param_gather (the weights' gather per unit, waited for in the next forward).
foreach(run "buckets_w4_opt 4 1 optimizer --bucket-mb 0.05" "buckets_w2_a2 2 2 optimizer --bucket-mb 0.05"
            "buckets_w4_param 4 1 parameters --bucket-mb 0.3 --recompute full"
            "buckets_w4_tied 4 1 gradients --bucket-mb 0.05 --tied"
            "buckets_w4_gather 4 1 optimizer --bucket-mb 0.05 --param-gather")
  gtrain_dist_run("${run}" buckets FIXTURES_REQUIRED dist_train_data)
endforeach()

# Tied embeddings: the head uses the embedding unit (gathered again for the head, one gradient
# accumulator from the head's backward to the embedding's): ZeRO-3 and ZeRO-2 against ZeRO-1.
foreach(run "tied_w1_a4 1 4 optimizer" "tied_w4_a1_param 4 1 parameters --recompute full"
            "tied_w2_a2_grad 2 2 gradients --sync micro"
            "tied_w2_a2_param_p0 2 2 parameters --recompute selective --prefetch 0")
  gtrain_dist_run("${run}" "run --tied" FIXTURES_REQUIRED dist_train_data FIXTURES_SETUP dist_train_tied)
endforeach()
add_test(NAME dist_train_tied_compare
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work}
                 --ref tied_w1_a4 tied_w4_a1_param tied_w2_a2_grad tied_w2_a2_param_p0)
set_tests_properties(dist_train_tied_compare PROPERTIES LABELS mpi TIMEOUT 120
                     FIXTURES_REQUIRED "dist_train_tied;dist_train_data")

# Documents and loss masks (docs/data-format.md) across world sizes, ZeRO stages and recompute policies:
#   dist_train_doc_compare    document_mask + reset_positions at W = 2 and 4 under ZeRO-1/2/3 against W = 1
#                             ZeRO-1, within the fp32 runs' 1e-5 (only the gradient summation order differs)
#   dist_train_doc_exact      the same run under recompute full, selective, sqrt (uniform:2 for 3 blocks) and
#                             blocks:2: bit-identical (tolerance 0),
#                             as docs/recompute.md promises (the replay uses the same masks and positions)
#   dist_train_mask_compare   a loss mask whose counts differ between samples, micro-batches and ranks (the
#                             loss is the mean over the counted targets of the global batch): W = 2 and 4
#                             under ZeRO-3 against W = 1 ZeRO-1, within 1e-5
#   dist_train_mask_exact     the masked run under recompute full, selective, uniform:3 and blocks:2: bit-identical
#   dist_train_sep_exact      data.separator_loss = false (the targets predicted at the separator not counted)
#                             is bit for bit the run on a copy of the data whose loss mask leaves out those
#                             targets (the mask path is checked against transformers by
#                             data_chat_loss_mask_matches_transformers)
#   dist_train_sep_compare    separator_loss = false at W = 4 under ZeRO-3 against W = 1, within 1e-5
set(_dt_docmask_runs
  "doc_w1_a4 1 4 optimizer --docs"
  "doc_w2_a2 2 2 optimizer --docs"
  "doc_w2_a2_grad 2 2 gradients --docs --recompute selective --sync micro"
  "doc_w4_a1_param 4 1 parameters --docs --recompute full"
  "doc_w1_a4_full 1 4 optimizer --docs --recompute full"
  "doc_w1_a4_sel 1 4 optimizer --docs --recompute selective"
  "doc_w1_a4_sqrt 1 4 optimizer --docs --recompute sqrt"
  "doc_w1_a4_blocks 1 4 optimizer --docs --recompute blocks:2"
  "mask_w1_a4 1 4 optimizer --masked"
  "mask_w4_a1_param 4 1 parameters --masked"
  "mask_w2_a2_param_sel 2 2 parameters --masked --recompute selective"
  "mask_w1_a4_full 1 4 optimizer --masked --recompute full"
  "mask_w1_a4_sel 1 4 optimizer --masked --recompute selective"
  "mask_w1_a4_uni 1 4 optimizer --masked --recompute uniform:3"
  "mask_w1_a4_blocks 1 4 optimizer --masked --recompute blocks:2"
  "sep_w1_a4_mask 1 4 optimizer --sep-masked"
  "sep_w1_a4 1 4 optimizer --no-sep-loss"
  "sep_w4_a1_param 4 1 parameters --no-sep-loss")
foreach(run ${_dt_docmask_runs})
  string(REGEX REPLACE "_.*" "" group "${run}") # doc, mask or sep
  gtrain_dist_run("${run}" run FIXTURES_REQUIRED dist_train_data FIXTURES_SETUP dist_train_${group})
endforeach()
add_test(NAME dist_train_doc_compare
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work}
                 --ref doc_w1_a4 doc_w2_a2 doc_w2_a2_grad doc_w4_a1_param)
add_test(NAME dist_train_doc_exact
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work} --loss-rtol 0 --grad-norm-rtol 0
                 --weight-atol 0 --ref doc_w1_a4 doc_w1_a4_full doc_w1_a4_sel doc_w1_a4_sqrt doc_w1_a4_blocks)
add_test(NAME dist_train_mask_compare
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work}
                 --ref mask_w1_a4 mask_w4_a1_param mask_w2_a2_param_sel)
add_test(NAME dist_train_mask_exact
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work} --loss-rtol 0 --grad-norm-rtol 0
                 --weight-atol 0 --ref mask_w1_a4 mask_w1_a4_full mask_w1_a4_sel mask_w1_a4_uni mask_w1_a4_blocks)
add_test(NAME dist_train_sep_exact
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work} --loss-rtol 0 --grad-norm-rtol 0
                 --weight-atol 0 --ref sep_w1_a4_mask sep_w1_a4)
add_test(NAME dist_train_sep_compare
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work} --ref sep_w1_a4 sep_w4_a1_param)
set_tests_properties(dist_train_sep_exact dist_train_sep_compare PROPERTIES LABELS mpi TIMEOUT 120
                     FIXTURES_REQUIRED "dist_train_sep;dist_train_data")
set_tests_properties(dist_train_doc_compare dist_train_doc_exact PROPERTIES LABELS mpi TIMEOUT 120
                     FIXTURES_REQUIRED "dist_train_doc;dist_train_data")
set_tests_properties(dist_train_mask_compare dist_train_mask_exact PROPERTIES LABELS mpi TIMEOUT 120
                     FIXTURES_REQUIRED "dist_train_mask;dist_train_data")

# The big configs' memory arithmetic: `gtrain --plan` finds a plan within the 70 GiB budget (of 80 GB).
foreach(cfg "llama13b 8" "llama70b 64")
  string(REPLACE " " ";" cfg ${cfg})
  list(GET cfg 0 name)
  list(GET cfg 1 w)
  # check_run.cmake checks the exit code too (PASS_REGULAR_EXPRESSION alone would pass a crash after the print)
  add_test(NAME plan_${name}_fits
           COMMAND ${CMAKE_COMMAND} "-DCMD=$<TARGET_FILE:gtrain>|--plan|${PROJECT_SOURCE_DIR}/configs/${name}.ini|--world|${w}"
                   "-DEXPECT=\nauto: dist.shard [a-z]+, grad_sync micro, recompute [^\n]*\n  total [0-9.]+ GiB [^\n]*fits the budget 70.00 GiB"
                   -P ${GTRAIN_TEST_DIR}/scripts/check_run.cmake)
  set_tests_properties(plan_${name}_fits PROPERTIES LABELS unit)
endforeach()

# bf16 on the CPU (train.precision = bf16, the bf16 table of src/kernels/cpu/), label bf16 too. The same
# per-step checks with the working parameters at 2 bytes: ZeRO-1/2 all-gathers, ZeRO-3 gathers and
# the params peak move and hold bf16, gradients and their reductions stay fp32, and the planner's
# printed prediction equals what the run measured. Then:
#   dist_train_bf16_exact     recompute full and a second run of the reference: bit-identical (tolerance 0)
#   dist_train_bf16_compare   world sizes 1/2/4, ZeRO-1/2/3 and the widened products (below) against
#                             bf16_w1_a4: as in fp32, only the fp32 gradient summation order differs, but a last-bit difference in an fp32
#                             master weight can flip the bf16 rounding of its working copy; observed
#                             up to 2e-4 relative on the losses and 1.2e-3 on the grad norms over 20
#                             steps, so 1e-3 and 1e-2 (the fp32 runs' 1e-5 would fail on that rounding);
#                             final weights within 0.02: Adam turns a rare token's tiny embedding gradient
#                             into a step of about lr = 1e-3 whatever its size, so a flipped sign costs up
#                             to 2 lr a step (observed 0.006, three elements of one embedding row)
#   dist_train_bf16_vs_fp32   bf16 against fp32 (w1_a4): losses within 2% over the 20 steps, and the state
#                             files interchange: a bf16 run resumed from an fp32 run's step-10 file and an
#                             fp32 run resumed from a bf16 run's, both within the same 2% of the fp32 run
set(_dt_bf16_runs
  "bf16_w1_a4 1 4 optimizer --precision bf16"
  "bf16_w1_a4_again 1 4 optimizer --precision bf16"
  "bf16_w1_a4_full 1 4 optimizer --precision bf16 --recompute full"
  "bf16_w2_a2 2 2 optimizer --precision bf16"
  "bf16_w4_a1 4 1 optimizer --precision bf16"
  "bf16_w2_a2_grad_sel 2 2 gradients --precision bf16 --recompute selective --sync micro"
  "bf16_w2_a2_param_full 2 2 parameters --precision bf16 --recompute full --save-half"
  "bf16_w4_a1_param 4 1 parameters --precision bf16 --recompute uniform:3 --prefetch 2")
set(_dt_bf16_names)
foreach(run ${_dt_bf16_runs})
  string(REGEX REPLACE " .*" "" name "${run}")
  list(APPEND _dt_bf16_names ${name})
  gtrain_dist_run("${run}" run FIXTURES_REQUIRED dist_train_data FIXTURES_SETUP dist_train_bf16)
  set_property(TEST dist_train_${name} APPEND PROPERTY LABELS bf16)
endforeach()
gtrain_dist_run("bf16_resume_fp32 2 2 optimizer --precision bf16" "resume --from w4_a1_param_full"
                DEPENDS dist_train_w4_a1_param_full FIXTURES_REQUIRED dist_train_data dist_train_runs
                FIXTURES_SETUP dist_train_bf16_resumed)
gtrain_dist_run("fp32_resume_bf16 2 2 optimizer" "resume --from bf16_w2_a2_param_full"
                DEPENDS dist_train_bf16_w2_a2_param_full FIXTURES_REQUIRED dist_train_data dist_train_bf16
                FIXTURES_SETUP dist_train_bf16_resumed)
set_property(TEST dist_train_bf16_resume_fp32 dist_train_fp32_resume_bf16 APPEND PROPERTY LABELS bf16)
add_test(NAME dist_train_bf16_exact
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work} --loss-rtol 0 --grad-norm-rtol 0
                 --weight-atol 0 --ref bf16_w1_a4 bf16_w1_a4_again bf16_w1_a4_full)
add_test(NAME dist_train_bf16_compare
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work} --loss-rtol 1e-3 --grad-norm-rtol 1e-2
                 --weight-atol 0.02 --ref bf16_w1_a4 ${_dt_bf16_names} bf16_widened_w2_a2)
add_test(NAME dist_train_bf16_vs_fp32
         COMMAND ${Python3_EXECUTABLE} ${_dt_script} compare --work ${_dt_work} --loss-rtol 0.02 --grad-norm-rtol 0.1
                 --weight-atol 0.01 --ref w1_a4 bf16_w1_a4 bf16_resume_fp32 fp32_resume_bf16)
set_tests_properties(dist_train_bf16_exact dist_train_bf16_compare dist_train_bf16_vs_fp32 PROPERTIES
                     LABELS "mpi;bf16" TIMEOUT 120
                     FIXTURES_REQUIRED "dist_train_bf16;dist_train_data;dist_train_runs;dist_train_bf16_resumed")

# bf16 on a CPU without bf16 instructions: oneDNN held below AVX512-BF16 (DNNL_MAX_CPU_ISA) stands in
# for one; the run widens its matrix products to sgemm, says so, and dist_train_bf16_compare holds it
# to the reference run's losses within the same bounds as the other world sizes and stages.
gtrain_dist_run("bf16_widened_w2_a2 2 2 optimizer --precision bf16 --expect-out widened" run FIXTURES_REQUIRED dist_train_data
                FIXTURES_SETUP dist_train_bf16)
set_property(TEST dist_train_bf16_widened_w2_a2 APPEND PROPERTY LABELS bf16)
set_property(TEST dist_train_bf16_widened_w2_a2 APPEND PROPERTY ENVIRONMENT "DNNL_MAX_CPU_ISA=AVX512_CORE")
# --plan counts bf16 on the CPU as on the GPU: 2-byte activations and working parameters.
add_test(NAME plan_cpu_bf16
         COMMAND ${CMAKE_COMMAND}
                 "-DCMD=$<TARGET_FILE:gtrain>|--plan|${PROJECT_SOURCE_DIR}/configs/llama100m.ini|train.precision=bf16"
                 "-DEXPECT=\\(cpu backend assumed: bf16 activations\\)[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*2-byte activations"
                 -P ${GTRAIN_TEST_DIR}/scripts/check_run.cmake)
set_tests_properties(plan_cpu_bf16 PROPERTIES LABELS "unit;bf16")
