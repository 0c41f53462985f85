# ctest cli.kimi: the specdec-kimi binary end to end on a fresh tiny checkpoint.
#   cmake -DKIMI=<specdec-kimi> -DDIR=<scratch dir> -P cli_test.cmake
# init-random writes it; generate --json must print one JSON object whose output_ids holds
# --max-new-tokens ids (--ignore-eos) inside the vocabulary and whose tokens_per_s is positive;
# the same seed must reproduce a sampled run; a malformed flag must exit 2 naming the flag;
# --device cuda must either run (9 ids) or, without a GPU or a CUDA build, be refused (exit 1)
# saying which.
file(REMOVE_RECURSE "${DIR}")
function(run_kimi out_var rc_var)
  execute_process(COMMAND "${KIMI}" ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  set(${out_var} "${out}${err}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

run_kimi(out rc init-random --preset tiny --out "${DIR}" --seed 4)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "init-random failed (${rc}): ${out}")
endif()

set(generate generate --model-path "${DIR}" --input-ids 7,300,12 --max-new-tokens 9 --ignore-eos)
execute_process(COMMAND "${KIMI}" ${generate} --temperature 0.9 --seed 5 --json
                OUTPUT_VARIABLE first RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "generate --json failed (${rc})")
endif()
string(JSON n LENGTH "${first}" output_ids)
if(NOT n EQUAL 9)
  message(FATAL_ERROR "output_ids has ${n} ids, expected 9: ${first}")
endif()
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON id GET "${first}" output_ids ${i})
  if(id LESS 0 OR id GREATER_EQUAL 512)
    message(FATAL_ERROR "output id ${id} outside the tiny vocabulary: ${first}")
  endif()
endforeach()
string(JSON tps GET "${first}" tokens_per_s)
if(NOT tps GREATER 0)
  message(FATAL_ERROR "tokens_per_s ${tps} not positive: ${first}")
endif()
execute_process(COMMAND "${KIMI}" ${generate} --temperature 0.9 --seed 5 --json
                OUTPUT_VARIABLE second RESULT_VARIABLE rc ERROR_QUIET)
string(JSON ids_first GET "${first}" output_ids)
string(JSON ids_second GET "${second}" output_ids)
if(NOT ids_first STREQUAL ids_second)
  message(FATAL_ERROR "the same seed gave ${ids_first} then ${ids_second}")
endif()

run_kimi(out rc ${generate} --max-new-tokens 2x)
if(NOT rc EQUAL 2 OR NOT out MATCHES "--max-new-tokens expects a whole number, got '2x'")
  message(FATAL_ERROR "a malformed --max-new-tokens gave exit ${rc}: ${out}")
endif()
execute_process(COMMAND "${KIMI}" ${generate} --device cuda --json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0)
  string(JSON n LENGTH "${out}" output_ids)
  string(JSON dev GET "${out}" device)
  if(NOT n EQUAL 9 OR NOT dev STREQUAL "cuda")
    message(FATAL_ERROR "generate --device cuda: ${n} ids on '${dev}': ${out}")
  endif()
elseif(NOT rc EQUAL 1 OR NOT "${out}${err}" MATCHES "--device cuda: (no CUDA device is visible|this specdec-kimi was built without CUDA)")
  message(FATAL_ERROR "--device cuda gave exit ${rc}: ${out}${err}")
endif()
message(STATUS "cli.kimi: generate gave ${ids_first} at ${tps} tokens/s")
file(REMOVE_RECURSE "${DIR}")
