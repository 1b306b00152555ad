# check_run.cmake — runs a command and checks its exit code and output (stdout and stderr together),
# for command-line behaviour that is not a refusal (check_exit2.cmake has those).
#
#   cmake "-DCMD=prog|arg|..." [-DRC=0|NONZERO] "-DEXPECT=<regex>" ["-DREJECT=<regex>"] [-DUNSET=VAR] -P check_run.cmake
#
# CMD's words are separated by |. UNSET removes a variable from the environment first.
foreach(var CMD EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_run.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED RC)
  set(RC 0)
endif()
string(REPLACE "|" ";" cmd "${CMD}")
if(DEFINED UNSET)
  unset(ENV{${UNSET}})
endif()
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
set(all "${out}${err}")
if(RC STREQUAL "NONZERO")
  if(NOT rc MATCHES "^[0-9]+$" OR rc EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit code, got '${rc}'\ncommand: ${cmd}\noutput:\n${out}${err}")
  endif()
elseif(NOT rc STREQUAL "${RC}")
  message(FATAL_ERROR "expected exit code ${RC}, got '${rc}'\ncommand: ${cmd}\noutput:\n${all}")
endif()
if(NOT all MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}'\ncommand: ${cmd}\noutput:\n${all}")
endif()
if(DEFINED REJECT AND all MATCHES "${REJECT}")
  message(FATAL_ERROR "output matches '${REJECT}', which it must not\ncommand: ${cmd}\noutput:\n${all}")
endif()
message(STATUS "ok:\n${all}")
