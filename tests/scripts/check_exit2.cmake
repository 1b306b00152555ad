# (Kept out of tests/*.cmake: tests/CMakeLists.txt includes every file there as a test area.)
# check_exit2.cmake — runs gtrain on a bad configuration and checks that it refuses it the documented
# way: exit code 2 and a one-line message on stderr naming the file, line and key.
#
#   cmake -DGTRAIN=path/to/gtrain -DCONFIG=bad.ini [-DOVERRIDE=section.key=value]
#         -DEXPECT=<regex matched against stderr> -P check_exit2.cmake
foreach(var GTRAIN CONFIG EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_exit2.cmake: -D${var}=... is required")
  endif()
endforeach()

set(cmd ${GTRAIN} ${CONFIG})
if(DEFINED OVERRIDE)
  list(APPEND cmd "${OVERRIDE}")
endif()
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)

if(NOT rc STREQUAL "2")
  message(FATAL_ERROR "expected exit code 2, got '${rc}'\ncommand: ${cmd}\nstdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT err MATCHES "${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}'\ncommand: ${cmd}\nstderr:\n${err}")
endif()
message(STATUS "exit 2 with: ${err}")
