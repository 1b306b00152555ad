# Documentation in step with the code and about the product alone.
# configs/README.md has a row for every key of the key table (gtrain --show-config), with its default.
add_test(NAME config_keys_documented
         COMMAND ${Python3_EXECUTABLE} ${GTRAIN_TEST_DIR}/scripts/keys_documented.py $<TARGET_FILE:gtrain>
                 ${CMAKE_SOURCE_DIR})
set_tests_properties(config_keys_documented PROPERTIES LABELS unit TIMEOUT 60)

# docs/architecture.md is the map: every file of src/ is in it, every path it names exists
# (tests/scripts/architecture_map.py).
add_test(NAME architecture_map_holds
         COMMAND ${Python3_EXECUTABLE} ${GTRAIN_TEST_DIR}/scripts/architecture_map.py ${CMAKE_SOURCE_DIR})
set_tests_properties(architecture_map_holds PROPERTIES LABELS unit TIMEOUT 60)

# No issue numbers, no words about how the work was organised, no machine paths, in any file
# (tests/scripts/product_words.py says what it looks for and what it skips).
add_test(NAME repository_speaks_of_the_product
         COMMAND ${Python3_EXECUTABLE} ${GTRAIN_TEST_DIR}/scripts/product_words.py ${CMAKE_SOURCE_DIR})
set_tests_properties(repository_speaks_of_the_product PROPERTIES LABELS unit TIMEOUT 60)

# tools/container/gtrain.def as far as a machine without Apptainer can check it: its sections, its
# packages against tools/setup-debian.sh, its shell, and (where nvcc is) its CMake configure line.
add_test(NAME container_recipe_checks
         COMMAND ${Python3_EXECUTABLE} ${GTRAIN_TEST_DIR}/scripts/container_recipe.py ${CMAKE_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/container_recipe_checks)
set_tests_properties(container_recipe_checks PROPERTIES LABELS unit TIMEOUT 300)

# README.md's data section, as written: a small Hugging Face checkpoint, shards, a blend, and an
# instruction-tuning run from the checkpoint on 2 ranks, two steps each (tests/scripts/readme_data_commands.py).
add_test(NAME readme_data_commands_run
         COMMAND ${Python3_EXECUTABLE} ${GTRAIN_TEST_DIR}/scripts/readme_data_commands.py ${CMAKE_SOURCE_DIR}
                 $<TARGET_FILE_DIR:gtrain> ${GTRAIN_HF_PYTHON} ${CMAKE_CURRENT_BINARY_DIR}/readme_data_commands)
set_tests_properties(readme_data_commands_run PROPERTIES LABELS mpi TIMEOUT 300
                     ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1")
