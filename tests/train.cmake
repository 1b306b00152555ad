# End-to-end: the real gtrain binary learns real text (label unit).
add_test(NAME training_lowers_the_loss
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/train_lowers_loss.sh $<TARGET_FILE:gtrain>
                 $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/training_lowers_the_loss)
set_tests_properties(training_lowers_the_loss PROPERTIES LABELS unit TIMEOUT 300)

# train.device = cuda without a GPU (CUDA_VISIBLE_DEVICES= hides one): exit 2 with a message naming the key.
add_test(NAME cuda_device_without_gpu_exits_2
         COMMAND bash ${GTRAIN_TEST_DIR}/scripts/cuda_without_gpu.sh $<TARGET_FILE:gtrain>
                 $<TARGET_FILE:gtrain-prep> ${CMAKE_CURRENT_BINARY_DIR}/cuda_device_without_gpu)
set_tests_properties(cuda_device_without_gpu_exits_2 PROPERTIES LABELS unit TIMEOUT 120)
