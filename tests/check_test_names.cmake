# ctest runs each doctest case by name; CMake splits a name at ';', so a case named with one would be
# registered under a truncated name that matches nothing and "passes" without running. Refuse them.
execute_process(COMMAND ${BIN} --list-test-cases OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BIN} --list-test-cases failed (${rc})")
endif()
string(FIND "${out}" ";" pos)
if(NOT pos EQUAL -1)
  message(FATAL_ERROR "a test case name contains ';' (ctest would run nothing for it): use ',' instead")
endif()
