# demo.tokenizer_matches: the demo model's BPE tokenizer (tools/demo/bpe.py, Python) and
# specdec-kimi tokenize (C++, io/tokenizer.hpp) give the same ids (tools/demo/check_tokenizer.py):
# prepare_data.py --max-bytes 300000 --ranks 1024 builds a small corpus from python3's standard
# library, its tokenizer and its token streams into the build tree; then the streams, the corpus
# text, a non-ASCII stress text, a pseudo-random mix and special tokens' texts are compared, and
# the special-token block against init-random's tokenizer_config.json. A few seconds. Exit 77
# (reported skipped) when specdec-kimi is built without PCRE2 (no tokenize).
#
# specdec-kimi is defined in examples/, added after tests/, so the test is registered by a call
# deferred to the end of the top-level directory (as serve.cmake does; run ctest from the build
# root). Without specdec-kimi or python3 it is registered DISABLED with the reason.
function(specdec_register_demo_tokenizer source_dir binary_dir)
  set(reason "")
  find_program(SPECDEC_PYTHON3 python3)
  if(NOT TARGET specdec-kimi)
    set(reason "specdec-kimi is not built (SPECDEC_BUILD_EXAMPLES=${SPECDEC_BUILD_EXAMPLES})")
  elseif(NOT SPECDEC_PYTHON3)
    set(reason "python3 not found")
  endif()
  set(script ${source_dir}/tools/demo/check_tokenizer.py)
  set(work_dir ${binary_dir}/demo_tokenizer)
  if(reason STREQUAL "")
    add_test(NAME demo.tokenizer_matches
             COMMAND ${SPECDEC_PYTHON3} ${script} --kimi $<TARGET_FILE:specdec-kimi>
                     --work ${work_dir})
    set_tests_properties(demo.tokenizer_matches PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
                                                           LABELS demo)
  else()
    message(STATUS "specdec: demo.tokenizer_matches disabled: ${reason}")
    add_test(NAME demo.tokenizer_matches COMMAND python3 ${script} --kimi specdec-kimi
                                                 --work ${work_dir})
    set_tests_properties(demo.tokenizer_matches PROPERTIES DISABLED TRUE TIMEOUT 120
                                                           SKIP_RETURN_CODE 77 LABELS demo)
  endif()
endfunction()

# The paths are fixed now ([[...]] keeps them verbatim); the call runs after examples/.
cmake_language(EVAL CODE "
  cmake_language(DEFER DIRECTORY [[${PROJECT_SOURCE_DIR}]]
                 CALL specdec_register_demo_tokenizer [[${PROJECT_SOURCE_DIR}]]
                      [[${CMAKE_CURRENT_BINARY_DIR}]])
")

# demo.bench_plot: tools/bench_plot.py (the PNG chart of a specdec-kimi bench --json sweep) renders
# its built-in sample, reads the PNG back (chunks, CRCs, zlib, filter bytes) and checks its size,
# the bars' heights against the values, the advisor's choice colour, and that bad JSON is refused
# (exit 2). Standard-library Python only; under a second.
find_program(SPECDEC_PYTHON3 python3)
if(SPECDEC_PYTHON3)
  add_test(NAME demo.bench_plot
           COMMAND ${SPECDEC_PYTHON3} ${PROJECT_SOURCE_DIR}/tools/bench_plot.py --self-test)
  set_tests_properties(demo.bench_plot PROPERTIES TIMEOUT 60 LABELS demo)
else()
  message(STATUS "specdec: demo.bench_plot disabled: python3 not found")
  add_test(NAME demo.bench_plot COMMAND python3 tools/bench_plot.py --self-test)
  set_tests_properties(demo.bench_plot PROPERTIES DISABLED TRUE LABELS demo)
endif()

# demo.eval_accept: tools/demo/eval_accept.py --self-test, its count of repeated 5-grams (how
# repetitive the target's greedy text is) against counts written out by hand. Under a second.
if(SPECDEC_PYTHON3)
  add_test(NAME demo.eval_accept
           COMMAND ${SPECDEC_PYTHON3} ${PROJECT_SOURCE_DIR}/tools/demo/eval_accept.py --self-test)
  set_tests_properties(demo.eval_accept PROPERTIES TIMEOUT 60 LABELS demo)
else()
  message(STATUS "specdec: demo.eval_accept disabled: python3 not found")
  add_test(NAME demo.eval_accept COMMAND python3 tools/demo/eval_accept.py --self-test)
  set_tests_properties(demo.eval_accept PROPERTIES DISABLED TRUE LABELS demo)
endif()

# demo.prepare_data: tools/demo/prepare_data.py --unseen-dir (prompts from text the target never
# trained on) on a small corpus: a copy of a corpus file is left out, the new file's prompts are
# windows of its own token stream, __pycache__ is not read, a non-UTF-8 file is skipped;
# --extra-train-fraction writes the chosen files' stream and keeps them out of the unseen prompts;
# a missing directory and bad fractions are refused by name. Standard-library Python only.
if(SPECDEC_PYTHON3)
  add_test(NAME demo.prepare_data
           COMMAND ${SPECDEC_PYTHON3} ${PROJECT_SOURCE_DIR}/tools/demo/test_prepare_data.py)
  set_tests_properties(demo.prepare_data PROPERTIES TIMEOUT 120 LABELS demo)
else()
  message(STATUS "specdec: demo.prepare_data disabled: python3 not found")
  add_test(NAME demo.prepare_data COMMAND python3 tools/demo/test_prepare_data.py)
  set_tests_properties(demo.prepare_data PROPERTIES DISABLED TRUE LABELS demo)
endif()
