# Compile-failure check for one source. The source must compile as it is (the control: the harness
# and the valid part are fine) and must fail to compile with -DSPECDEC_COMPILE_FAIL, printing the
# message given on its `// expect-error: <regex>` line.
file(STRINGS ${SOURCE} expect_line REGEX "^// expect-error: ")
if(NOT expect_line)
  message(FATAL_ERROR "${SOURCE}: no '// expect-error: <regex>' line")
endif()
string(REGEX REPLACE "^// expect-error: " "" expected "${expect_line}")

set(cmd ${COMPILER} -std=c++20 -fsyntax-only -I${INCLUDE_DIR} ${SOURCE})
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "control failed: ${SOURCE} must compile without SPECDEC_COMPILE_FAIL\n${err}")
endif()
execute_process(COMMAND ${cmd} -DSPECDEC_COMPILE_FAIL RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled with SPECDEC_COMPILE_FAIL; it must not")
endif()
if(NOT "${err}" MATCHES "${expected}")
  message(FATAL_ERROR "${SOURCE} failed to compile, but without the message /${expected}/:\n${err}")
endif()
message(STATUS "failed to compile as expected, with /${expected}/")
