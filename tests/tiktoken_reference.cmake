# The tokenizer's reference data, run by ctest as tokenizer.reference_setup (tests/tokenizer.cmake):
#   cmake -DTOOLS_DIR=<tools/tiktoken_reference> -DWORK_DIR=<dir> -DCORPUS=<corpus.txt> -P this
# 1. copies the node scripts and package(-lock).json to WORK_DIR/npm and runs `npm ci` there (the
#    pinned `tiktoken`; skipped when WORK_DIR/npm already holds this package-lock's install);
# 2. per encoding (cl100k_base, o200k_base, o200k_kimi): node export.js -> WORK_DIR/<encoding>/
#    (tiktoken.model, tokenizer_config.json), node encode.js -> WORK_DIR/<encoding>/corpus_ids.json.
# Without node or npm, or when npm ci fails (no registry, offline), it writes WORK_DIR/SKIPPED
# with the reason and succeeds: unit.tokenizer_reference then reports itself skipped with that
# reason. A failure of the scripts themselves (with the package installed) is an error.
foreach(var TOOLS_DIR WORK_DIR CORPUS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "tiktoken_reference.cmake: -D${var}=... is required")
  endif()
endforeach()

file(MAKE_DIRECTORY ${WORK_DIR})
file(REMOVE ${WORK_DIR}/SKIPPED)
set(encodings cl100k_base o200k_base o200k_kimi)
foreach(encoding ${encodings})
  file(REMOVE_RECURSE ${WORK_DIR}/${encoding})
endforeach()

function(skip reason)
  file(WRITE ${WORK_DIR}/SKIPPED "${reason}")
  message("TIKTOKEN_REFERENCE_SKIPPED (setup): ${reason}")
  return()
endfunction()

find_program(NODE NAMES node nodejs)
find_program(NPM NAMES npm)
if(NOT NODE OR NOT NPM)
  skip("node or npm not found (node: '${NODE}', npm: '${NPM}'): the reference encoder is npm's tiktoken")
  return()
endif()

set(npm_dir ${WORK_DIR}/npm)
file(MAKE_DIRECTORY ${npm_dir})
file(GLOB scripts ${TOOLS_DIR}/*.js)
file(COPY ${TOOLS_DIR}/package.json ${TOOLS_DIR}/package-lock.json ${scripts}
     DESTINATION ${npm_dir})
set(stamp ${npm_dir}/node_modules/.specdec-package-lock.json)
file(READ ${TOOLS_DIR}/package-lock.json lock)
set(installed "")
if(EXISTS ${stamp})
  file(READ ${stamp} installed)
endif()
if(NOT installed STREQUAL lock)
  message("npm ci in ${npm_dir}")
  execute_process(COMMAND ${NPM} ci --no-audit --no-fund --fetch-retries=1
                          --fetch-timeout=60000
                  WORKING_DIRECTORY ${npm_dir} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err TIMEOUT 600)
  if(NOT rc EQUAL 0)
    string(LENGTH "${err}" n)
    if(n GREATER 1500)
      math(EXPR from "${n} - 1500")
      string(SUBSTRING "${err}" ${from} -1 err)
    endif()
    skip("npm ci failed (${rc}): the npm registry or npm itself is unavailable: ${err}")
    return()
  endif()
  file(WRITE ${stamp} "${lock}")
endif()

foreach(encoding ${encodings})
  foreach(step "export.js;${encoding};${WORK_DIR}/${encoding}"
               "encode.js;${encoding};${CORPUS};${WORK_DIR}/${encoding}/corpus_ids.json")
    execute_process(COMMAND ${NODE} ${step} WORKING_DIRECTORY ${npm_dir} RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "node ${step} failed (${rc})")
    endif()
  endforeach()
endforeach()
