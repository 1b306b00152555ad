# The optimizer end to end against torch.optim.AdamW in float64 (tests/optim/optim_vs_reference.py):
# 6 steps of gtrain from a transformers-made checkpoint, warm-up 2 then cosine or linear, clipping on
# every step, weight decay 0.1 (not on the RMSNorm weights); the final master weights, each step's lr
# and grad_norm equal the reference's. At world size 1 and 2 and every ZeRO stage, ZeRO-2/3 with
# dist.grad_sync both step and micro (cosine), and at
# W = 1 and ZeRO-3 W = 2 (linear).
if(Python3_Interpreter_FOUND)
  string(REPLACE ";" " " _optim_mpi_flags "${GTRAIN_MPIEXEC_FLAGS}")
  foreach(case "cosine;1:none,2:none,2:optimizer,2:gradients,2:parameters,2:gradients:micro,2:parameters:micro" "linear;1:none,2:parameters")
    list(GET case 0 schedule)
    list(GET case 1 runs)
    set(name optim_${schedule}_matches_torch_adamw)
    add_test(NAME ${name}
             COMMAND ${GTRAIN_HF_PYTHON} ${GTRAIN_TEST_DIR}/optim/optim_vs_reference.py
                     --gtrain $<TARGET_FILE:gtrain> --mpiexec=${MPIEXEC_EXECUTABLE}
                     "--mpiexec-flags=${_optim_mpi_flags}" --schedule ${schedule} --runs ${runs}
                     --work ${CMAKE_CURRENT_BINARY_DIR}/${name})
    set_tests_properties(${name} PROPERTIES
      LABELS "hf;optim" TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endforeach()
endif()
