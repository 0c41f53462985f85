# serve.e2e: `specdec-kimi serve` end to end (tests/serve/e2e.sh): a tiny random checkpoint and
# EAGLE-3 draft served on a free 127.0.0.1 port; curl checks of the OpenAI / SGLang endpoints,
# errors, metrics, --api-key and SIGTERM; then the official `openai` npm client
# (tools/openai_client: npm ci into the build tree) for streamed == non-streamed, 64 concurrent
# clients == each alone, and a disconnect that cancels. Exit 77 (reported skipped) only when node,
# npm or the npm registry is unavailable for the client part; the curl part still runs and fails.
#
# The test exists only where specdec-kimi has its server: examples/CMakeLists.txt adds
# kimi/server.cpp to it when cpp-httplib and PCRE2 are found (its SPECDEC_HAVE_SERVER is local to
# examples/). tests/ is added before examples/ (top-level CMakeLists.txt), so the target is not
# known yet here: the test is registered by a call deferred to the end of the top-level
# directory, which looks for server.cpp among specdec-kimi's sources. (So serve.e2e lives in the
# top-level directory's test list: run ctest from the build root.) Otherwise it is registered
# DISABLED with the reason.
function(specdec_register_serve_e2e source_dir binary_dir)
  set(reason "")
  find_program(SPECDEC_BASH bash)
  if(NOT TARGET specdec-kimi)
    set(reason "specdec-kimi is not built (SPECDEC_BUILD_EXAMPLES=${SPECDEC_BUILD_EXAMPLES})")
  else()
    get_target_property(kimi_sources specdec-kimi SOURCES)
    list(FILTER kimi_sources INCLUDE REGEX "(^|/)server\\.cpp$")
    if(NOT kimi_sources)
      set(reason "specdec-kimi was built without its HTTP server (needs cpp-httplib and PCRE2)")
    elseif(NOT SPECDEC_BASH)
      set(reason "bash not found")
    endif()
  endif()
  set(work_dir ${binary_dir}/serve_e2e)
  set(tools_dir ${source_dir}/tools/openai_client)
  if(reason STREQUAL "")
    add_test(NAME serve.e2e
             COMMAND ${SPECDEC_BASH} ${source_dir}/tests/serve/e2e.sh $<TARGET_FILE:specdec-kimi>
                     ${work_dir} ${tools_dir})
    set_tests_properties(serve.e2e PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS serve)
  else()
    message(STATUS "specdec: serve.e2e disabled: ${reason}")
    add_test(NAME serve.e2e COMMAND bash ${source_dir}/tests/serve/e2e.sh specdec-kimi
                                    ${work_dir} ${tools_dir})
    set_tests_properties(serve.e2e PROPERTIES DISABLED TRUE TIMEOUT 600 SKIP_RETURN_CODE 77
                                              LABELS serve)
  endif()
endfunction()

# The paths are fixed now ([[...]] keeps them verbatim); the call runs after examples/.
cmake_language(EVAL CODE "
  cmake_language(DEFER DIRECTORY [[${PROJECT_SOURCE_DIR}]]
                 CALL specdec_register_serve_e2e [[${PROJECT_SOURCE_DIR}]] [[${CMAKE_CURRENT_BINARY_DIR}]])
")
