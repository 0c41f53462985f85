# Installs specdec into a scratch prefix, then builds and runs tests/consumer against it through
# find_package(specdec): proves the installed package is usable from another project.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed: ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
run_step(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/lib -G ${GENERATOR}
         -DSPECDEC_BUILD_TESTS=OFF -DSPECDEC_BUILD_EXAMPLES=OFF -DSPECDEC_BUILD_BENCHMARKS=OFF
         -DSPECDEC_ENABLE_CUDA=${ENABLE_CUDA} -DCMAKE_INSTALL_PREFIX=${prefix})
run_step(${CMAKE_COMMAND} --install ${WORK_DIR}/lib)
run_step(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/app -G ${GENERATOR}
         -DCMAKE_PREFIX_PATH=${prefix})
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/app)
run_step(${WORK_DIR}/app/specdec_consumer)
message(STATUS "consumer built against ${prefix} and ran")
