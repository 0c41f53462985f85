# Tokenizer tests (io/tokenizer.hpp needs PCRE2: cmake/FindSpecdecPcre2.cmake). The unit glob
# already put tests/unit/tokenizer*.cpp into specdec_unit_tests and registered unit.tokenizer and
# unit.tokenizer_reference; here:
#   PCRE2 found      specdec_unit_tests and the header check link specdec::tokenizer;
#                    tokenizer.reference_setup (fixture tiktoken_reference) runs
#                    tests/tiktoken_reference.cmake: npm ci of tools/tiktoken_reference into the
#                    build tree, the encodings exported and the corpus encoded by tiktoken itself;
#                    unit.tokenizer_reference compares with them (reported skipped, with the
#                    reason, where npm or its registry is unavailable)
#   PCRE2 missing    those sources and header checks are taken out and both tests are disabled
#                    (ctest lists them as "Not Run (Disabled)")
set(tokenizer_test_sources ${CMAKE_CURRENT_SOURCE_DIR}/unit/tokenizer.cpp
                           ${CMAKE_CURRENT_SOURCE_DIR}/unit/tokenizer_reference.cpp)
if(NOT SPECDEC_HAVE_PCRE2)
  get_target_property(unit_test_sources specdec_unit_tests SOURCES)
  list(REMOVE_ITEM unit_test_sources ${tokenizer_test_sources})
  set_property(TARGET specdec_unit_tests PROPERTY SOURCES ${unit_test_sources})
  get_target_property(header_check_sources specdec_header_check SOURCES)
  list(REMOVE_ITEM header_check_sources
       ${CMAKE_CURRENT_BINARY_DIR}/header_check/specdec_io_tokenizer_hpp.cpp
       ${CMAKE_CURRENT_BINARY_DIR}/header_check/specdec_io_tokenizer_pattern_hpp.cpp)
  set_property(TARGET specdec_header_check PROPERTY SOURCES ${header_check_sources})
  set_tests_properties(unit.tokenizer unit.tokenizer_reference PROPERTIES DISABLED TRUE)
  return()
endif()

target_link_libraries(specdec_unit_tests PRIVATE specdec::tokenizer)
target_link_libraries(specdec_header_check PRIVATE specdec::tokenizer)

set(tiktoken_reference_dir ${CMAKE_CURRENT_BINARY_DIR}/tiktoken_reference)
add_test(NAME tokenizer.reference_setup
         COMMAND ${CMAKE_COMMAND} -DTOOLS_DIR=${PROJECT_SOURCE_DIR}/tools/tiktoken_reference
                 -DWORK_DIR=${tiktoken_reference_dir}
                 -DCORPUS=${CMAKE_CURRENT_SOURCE_DIR}/fixtures/tokenizer_corpus.txt
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/tiktoken_reference.cmake)
set_tests_properties(tokenizer.reference_setup PROPERTIES FIXTURES_SETUP tiktoken_reference
                     TIMEOUT 900 LABELS tokenizer)
set_tests_properties(unit.tokenizer_reference PROPERTIES
                     FIXTURES_REQUIRED tiktoken_reference
                     ENVIRONMENT SPECDEC_TIKTOKEN_REFERENCE_DIR=${tiktoken_reference_dir}
                     SKIP_REGULAR_EXPRESSION "TIKTOKEN_REFERENCE_SKIPPED"
                     TIMEOUT 600 LABELS tokenizer)
