# The source tree's shape: no include rings among the modules of src/ (tools/include_cycles.py;
# docs/architecture.md states the rule).
if(Python3_Interpreter_FOUND)
  add_test(NAME src_has_no_include_rings
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tools/include_cycles.py ${CMAKE_SOURCE_DIR}/src)
  set_tests_properties(src_has_no_include_rings PROPERTIES LABELS unit TIMEOUT 60)
endif()
