# ctest cli.kimi: the specdec-kimi binary end to end on a fresh tiny checkpoint.
#   cmake -DKIMI=<specdec-kimi> -DDIR=<scratch dir> -P cli_test.cmake
# init-random writes it; generate --json must print one JSON object whose output_ids holds
# --max-new-tokens ids (--ignore-eos) inside the vocabulary and whose tokens_per_s is positive;
# the same seed must reproduce a sampled run; a malformed flag must exit 2 naming the flag;
# --device cuda must either run (9 ids) or, without a GPU or a CUDA build, be refused (exit 1)
# saying which. Speculation: init-random --draft eagle3 / --draft eagle write matching drafts;
# greedy EAGLE3 (chain and tree), EAGLE (chain and tree) and NGRAM output equal NONE's, with
# accept_length / per_position_accept / verify_ct in the JSON and the effective configuration on
# stderr; misconfigurations (EAGLE on an EAGLE-3 draft and the reverse, a chain whose node count
# is not steps + 1, an uncompiled tree, a draft path with NGRAM, a missing tree flag, --layers
# with --draft eagle) exit 1 (2 for init-random's usage) naming the fix.
# Text (-DHAVE_PCRE2=<SPECDEC_HAVE_PCRE2>): init-random writes a byte-level tokenizer either way.
# With PCRE2, tokenize gives ids whose --decode is the text exactly (Chinese, an emoji, a special
# token's text as its one id), a tokenizer's own pat_str is used, generate --prompt equals
# generate --input-ids of tokenize's ids and adds "prompt_ids" and "text" (= tokenize --decode of
# output_ids), --chat starts with <|im_user|> as tokenize --chat does. Without PCRE2, --prompt and
# tokenize exit 1 naming PCRE2. Either way both or neither of --prompt / --input-ids exit 2.
# init-random --config-only with generate --random-weights: see below. --speculative-config auto
# and capture: see their blocks; bench: the block at the end.
set(scratch "${DIR}-text.txt" "${DIR}-prompt.txt" "${DIR}-ids.txt" "${DIR}-special.txt"
    "${DIR}-pat")
file(REMOVE_RECURSE "${DIR}" "${DIR}-draft" "${DIR}-eagle" "${DIR}-config" "${DIR}-repeat"
     ${scratch})
function(run_kimi out_var rc_var)
  execute_process(COMMAND "${KIMI}" ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  set(${out_var} "${out}${err}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

run_kimi(out rc init-random --preset tiny --out "${DIR}" --seed 4 --draft eagle3 --layers 0,1,2
         --draft-out "${DIR}-draft")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "init-random failed (${rc}): ${out}")
endif()
if(NOT EXISTS "${DIR}/tiktoken.model" OR NOT EXISTS "${DIR}/tokenizer_config.json" OR
   NOT out MATCHES "wrote a byte-level tokenizer \\(vocab 512\\) to ")
  message(FATAL_ERROR "init-random wrote no tokenizer into ${DIR}: ${out}")
endif()
# An EAGLE-1/2 draft for the same target: init-random writes the target again into a scratch dir.
run_kimi(out rc init-random --preset tiny --out "${DIR}-eagle-target" --seed 4 --draft eagle
         --draft-out "${DIR}-eagle")
file(REMOVE_RECURSE "${DIR}-eagle-target")
if(NOT rc EQUAL 0 OR NOT out MATCHES "wrote a random EAGLE-1/2 draft")
  message(FATAL_ERROR "init-random --draft eagle failed (${rc}): ${out}")
endif()
run_kimi(out rc init-random --preset tiny --out "${DIR}-x" --draft eagle --layers 0,1
         --draft-out "${DIR}-y")
if(NOT rc EQUAL 2 OR NOT out MATCHES "--layers 0,1 with --draft eagle: an EAGLE-1/2 draft reads")
  message(FATAL_ERROR "--draft eagle --layers gave exit ${rc}: ${out}")
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

# Speculation through the binary: greedy output equals plain decoding.
set(greedy generate --model-path "${DIR}" --input-ids 7,300,12,7,300 --max-new-tokens 12
    --ignore-eos --json)
execute_process(COMMAND "${KIMI}" ${greedy} OUTPUT_VARIABLE plain RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "generate (NONE) failed (${rc}): ${plain}")
endif()
string(JSON plain_ids GET "${plain}" output_ids)

# The generate flags of spec "ALGO;steps;topk;nodes" (NONE: none), with the draft init-random wrote.
function(speculative_flags out_var spec)
  list(GET spec 0 algo)
  set(flags)
  if(NOT algo STREQUAL "NONE")
    list(GET spec 1 steps)
    list(GET spec 2 topk)
    list(GET spec 3 nodes)
    set(flags --speculative-algorithm ${algo} --speculative-num-steps ${steps}
        --speculative-eagle-topk ${topk} --speculative-num-draft-tokens ${nodes})
  endif()
  if(algo STREQUAL "EAGLE3")
    list(APPEND flags --speculative-draft-model-path "${DIR}-draft")
  elseif(algo STREQUAL "EAGLE")
    list(APPEND flags --speculative-draft-model-path "${DIR}-eagle")
  endif()
  set(${out_var} ${flags} PARENT_SCOPE)
endfunction()

foreach(spec "EAGLE3;3;1;4" "EAGLE3;3;4;8" "EAGLE;3;1;4" "EAGLE;3;4;8" "NGRAM;2;1;3")
  list(GET spec 0 algo)
  list(GET spec 1 steps)
  list(GET spec 2 topk)
  list(GET spec 3 nodes)
  speculative_flags(spec_flags "${spec}")
  execute_process(COMMAND "${KIMI}" ${greedy} ${spec_flags}
                  OUTPUT_VARIABLE spec_out ERROR_VARIABLE spec_err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "generate ${spec} failed (${rc}): ${spec_out}${spec_err}")
  endif()
  string(JSON spec_ids GET "${spec_out}" output_ids)
  if(NOT spec_ids STREQUAL plain_ids)
    message(FATAL_ERROR "${spec}: output ${spec_ids} differs from plain decoding ${plain_ids}")
  endif()
  string(JSON accept GET "${spec_out}" accept_length)
  string(JSON verifies GET "${spec_out}" verify_ct)
  string(JSON per_position LENGTH "${spec_out}" per_position_accept)
  if(accept LESS 1 OR verifies LESS 1 OR per_position LESS 1)
    message(FATAL_ERROR "${spec}: accept_length ${accept}, verify_ct ${verifies}: ${spec_out}")
  endif()
  if(NOT spec_err MATCHES "speculative config: ${algo} .*topk=${topk} steps=${steps} nodes=${nodes}")
    message(FATAL_ERROR "${spec}: no effective configuration line on stderr: ${spec_err}")
  endif()
endforeach()

# Tensor parallel on the CPU communicator: --tp-size 2 and 4 give the same greedy tokens.
foreach(spec "NONE" "EAGLE3;3;4;8" "EAGLE;3;1;4")
  speculative_flags(spec_flags "${spec}")
  foreach(tp 2 4)
    execute_process(COMMAND "${KIMI}" ${greedy} ${spec_flags} --tp-size ${tp}
                    OUTPUT_VARIABLE tp_out ERROR_VARIABLE tp_err RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "generate ${spec} --tp-size ${tp} failed (${rc}): ${tp_out}${tp_err}")
    endif()
    string(JSON tp_ids GET "${tp_out}" output_ids)
    if(NOT tp_ids STREQUAL plain_ids)
      message(FATAL_ERROR "${spec} --tp-size ${tp}: output ${tp_ids} differs from ${plain_ids}")
    endif()
    if(NOT tp_err MATCHES "; tp=${tp} \\(experts expert-parallel")
      message(FATAL_ERROR "${spec} --tp-size ${tp}: no tensor-parallel line on stderr: ${tp_err}")
    endif()
  endforeach()
endforeach()

# --config-only writes config.json alone; --random-weights SEED draws the weights on load: the
# same seed the same tokens (again, with EAGLE-3, at --tp-size 2: each rank draws its shard of the
# one model), another seed another model; the directory without --random-weights is refused
# naming the flag.
run_kimi(out rc init-random --preset tiny --int4 --config-only --out "${DIR}-config")
if(NOT rc EQUAL 0 OR NOT out MATCHES "no tensors: load it with --random-weights SEED" OR
   EXISTS "${DIR}-config/model.safetensors" OR NOT EXISTS "${DIR}-config/config.json")
  message(FATAL_ERROR "init-random --config-only (${rc}): ${out}")
endif()
set(random generate --model-path "${DIR}-config" --input-ids 7,300,12 --max-new-tokens 9
    --ignore-eos --json)
set(random_ids)
foreach(run "7;NONE" "7;NONE" "7;EAGLE3;3;1;4" "8;NONE" "7/2;NONE")
  list(POP_FRONT run seed_tp)
  string(REPLACE "/" ";" seed_tp "${seed_tp}")
  list(GET seed_tp 0 seed)
  set(tp_flags)
  if(seed_tp MATCHES ";")
    list(GET seed_tp 1 tp)
    set(tp_flags --tp-size ${tp})
  endif()
  speculative_flags(spec_flags "${run}")
  execute_process(COMMAND "${KIMI}" ${random} --random-weights ${seed} ${spec_flags} ${tp_flags}
                  OUTPUT_VARIABLE json ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "generate --random-weights ${seed} ${run} failed (${rc}): ${json}${err}")
  endif()
  string(JSON ids GET "${json}" output_ids)
  list(APPEND random_ids "${ids}")
endforeach()
list(GET random_ids 0 r7)
list(GET random_ids 1 r7_again)
list(GET random_ids 2 r7_eagle)
list(GET random_ids 3 r8)
list(GET random_ids 4 r7_tp2)
if(NOT r7 STREQUAL r7_again OR NOT r7 STREQUAL r7_eagle OR NOT r7 STREQUAL r7_tp2 OR
   r7 STREQUAL r8)
  message(FATAL_ERROR "--random-weights: seed 7 ${r7}, again ${r7_again}, EAGLE3 ${r7_eagle}, "
                      "--tp-size 2 ${r7_tp2}, seed 8 ${r8} (expected all but seed 8 equal)")
endif()
run_kimi(out rc generate --model-path "${DIR}-config" --input-ids 7 --max-new-tokens 2)
if(NOT rc EQUAL 1 OR NOT out MATCHES "init-random --config-only\\) is loaded by generate / serve with --random-weights SEED")
  message(FATAL_ERROR "a config-only directory without --random-weights: exit ${rc}: ${out}")
endif()

function(expect_refusal what pattern)
  run_kimi(out rc ${greedy} ${ARGN})
  if(NOT rc EQUAL 1 OR NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "${what}: exit ${rc}, expected 1 and /${pattern}/: ${out}")
  endif()
endfunction()
expect_refusal("EAGLE on an EAGLE-3 draft" "this checkpoint is an EAGLE-3 draft.*use --speculative-algorithm EAGLE3"
               --speculative-algorithm EAGLE --speculative-draft-model-path "${DIR}-draft"
               --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4)
expect_refusal("EAGLE3 on an EAGLE-1/2 draft" "this checkpoint is an EAGLE draft.*use --speculative-algorithm EAGLE"
               --speculative-algorithm EAGLE3 --speculative-draft-model-path "${DIR}-eagle"
               --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4)
expect_refusal("a chain of 16 nodes in 1 step" "must be --speculative-num-steps \\+ 1 = 2, got 16"
               --speculative-algorithm EAGLE3 --speculative-draft-model-path "${DIR}-draft"
               --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 16)
expect_refusal("an uncompiled tree" "no compiled policy for EAGLE3 layers=\\[0,1,2\\] topk=2.*compiled:"
               --speculative-algorithm EAGLE3 --speculative-draft-model-path "${DIR}-draft"
               --speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 4)
expect_refusal("a draft with NGRAM" "uses no draft model"
               --speculative-algorithm NGRAM --speculative-draft-model-path "${DIR}-draft"
               --speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3)
expect_refusal("heads that do not split" "rank [0-2] of 3: .*num_attention_heads 4 does not split over 3"
               --tp-size 3)
expect_refusal("a missing tree flag" "needs --speculative-num-steps, --speculative-eagle-topk"
               --speculative-algorithm NGRAM --speculative-num-steps 2)

# --disable-device-step belongs to the CUDA executor's EAGLE3 / EAGLE steps: elsewhere a usage
# error naming both.
set(device_step_refused "--disable-device-step is for --device cuda with "
                        "--speculative-algorithm EAGLE3 or EAGLE")
string(CONCAT device_step_refused ${device_step_refused})
run_kimi(out rc ${greedy} --disable-device-step)
if(NOT rc EQUAL 2 OR NOT out MATCHES "${device_step_refused}")
  message(FATAL_ERROR "--disable-device-step on a plain CPU run: exit ${rc}, expected 2: ${out}")
endif()

# --disable-cuda-graph belongs to the CUDA executor; an empty flag value (which would read as
# "not given") and a serve queue of 0 (every request refused) are usage errors by name. serve
# checks its flags before it needs the HTTP server, so these hold in every build.
run_kimi(out rc ${greedy} --disable-cuda-graph)
if(NOT rc EQUAL 2 OR NOT out MATCHES "--disable-cuda-graph is for --device cuda .*got --device cpu")
  message(FATAL_ERROR "--disable-cuda-graph on a CPU run: exit ${rc}, expected 2: ${out}")
endif()
# (execute_process itself: a function's ARGN would drop the empty argument)
foreach(case "generate --model-path" "generate --tokenizer" "serve --model-path" "serve --api-key")
  separate_arguments(args UNIX_COMMAND "${case}")
  execute_process(COMMAND "${KIMI}" ${args} "" OUTPUT_VARIABLE out ERROR_VARIABLE out
                  RESULT_VARIABLE rc)
  list(GET args 1 flag)
  if(NOT rc EQUAL 2 OR NOT out MATCHES "${flag} got an empty value: give one or leave the flag")
    message(FATAL_ERROR "${case} \"\": exit ${rc}, expected 2: ${out}")
  endif()
endforeach()
run_kimi(out rc serve --model-path "${DIR}" --max-queued-requests 0)
if(NOT rc EQUAL 2 OR NOT out MATCHES "--max-queued-requests 0: must be >= 1")
  message(FATAL_ERROR "serve --max-queued-requests 0: exit ${rc}, expected 2: ${out}")
endif()
run_kimi(out rc serve --model-path "${DIR}" --max-total-tokens 0)
if(NOT rc EQUAL 2 OR NOT out MATCHES "--max-total-tokens 0: must be >= 1")
  message(FATAL_ERROR "serve --max-total-tokens 0: exit ${rc}, expected 2: ${out}")
endif()
run_kimi(out rc serve --model-path "${DIR}" --max-total-tokens 1000 --page-size 64)
if(NOT rc EQUAL 2 OR NOT out MATCHES
   "--max-total-tokens 1000 is not a whole number of --page-size 64 pages .*give 960 or 1024")
  message(FATAL_ERROR "serve --max-total-tokens 1000 --page-size 64: exit ${rc}, expected 2: "
                      "${out}")
endif()
run_kimi(out rc generate --model-path "${DIR}" --input-ids 7 --max-new-tokens 2 --top-k -5)
if(NOT rc EQUAL 1 OR NOT out MATCHES "top_k -5 < -1")
  message(FATAL_ERROR "generate --top-k -5: exit ${rc}, expected 1: ${out}")
endif()
run_kimi(out rc generate --model-path "${DIR}" --input-ids 7 --max-new-tokens 2
         --temperature 1e-30)
if(NOT rc EQUAL 1 OR NOT out MATCHES "temperature 1e-30 is neither 0 \\(greedy\\) nor")
  message(FATAL_ERROR "generate --temperature 1e-30: exit ${rc}, expected 1: ${out}")
endif()

# --cuda-graph-bs states the compiled graph ladder (SGLang's spaced form or a comma list); any
# other ladder is a usage error naming the compiled one.
execute_process(COMMAND "${KIMI}" ${greedy} --cuda-graph-bs 1 2 4 8 16 32 64 128 256
                OUTPUT_VARIABLE ladder_out ERROR_VARIABLE ladder_err RESULT_VARIABLE rc)
string(JSON ladder_ids ERROR_VARIABLE ladder_json_error GET "${ladder_out}" output_ids)
if(NOT rc EQUAL 0 OR NOT ladder_ids STREQUAL plain_ids)
  message(FATAL_ERROR "--cuda-graph-bs with the compiled ladder: exit ${rc}, ids ${ladder_ids} "
                      "(plain ${plain_ids}): ${ladder_err}")
endif()
set(ladder_refused "--cuda-graph-bs \\[[0-9,]+\\]: this specdec-kimi's bundles are compiled "
                   "for the graph ladder \\[1,2,4,8,16,32,64,128,256\\]")
string(CONCAT ladder_refused ${ladder_refused})
foreach(ladder "1,2,4" "1;2;4;8;16;32;64;128;256;512")
  run_kimi(out rc ${greedy} --cuda-graph-bs ${ladder})
  if(NOT rc EQUAL 2 OR NOT out MATCHES "${ladder_refused}")
    message(FATAL_ERROR "--cuda-graph-bs ${ladder}: exit ${rc}, expected 2 and the compiled "
                        "ladder named: ${out}")
  endif()
endforeach()

# --speculative-draft-steps-by-batch: a batch of 1 from batch 1 on drafts 1 step of the chain
# of 3 (2 verified tokens), said in the configuration line; the output stays plain decoding's;
# bad text and a rule the policy cannot take are refused by name.
speculative_flags(chain_flags "EAGLE3;3;1;4")
execute_process(COMMAND "${KIMI}" ${greedy} ${chain_flags} --speculative-draft-steps-by-batch 1:1
                OUTPUT_VARIABLE steps_out ERROR_VARIABLE steps_err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--speculative-draft-steps-by-batch 1:1 failed (${rc}): ${steps_err}")
endif()
string(JSON steps_ids GET "${steps_out}" output_ids)
string(JSON steps_verifies GET "${steps_out}" verify_ct)
string(JSON steps_proposed GET "${steps_out}" proposed_drafts)
if(NOT steps_ids STREQUAL plain_ids OR NOT steps_proposed EQUAL steps_verifies OR
   NOT steps_err MATCHES "draft steps by batch size 1:1")
  message(FATAL_ERROR "--speculative-draft-steps-by-batch 1:1: ids ${steps_ids} (plain "
                      "${plain_ids}), ${steps_proposed} drafts in ${steps_verifies} verifies "
                      "(1 each expected): ${steps_err}")
endif()
run_kimi(out rc ${greedy} ${chain_flags} --speculative-draft-steps-by-batch 1-3)
if(NOT rc EQUAL 2 OR NOT out MATCHES "--speculative-draft-steps-by-batch: draft steps by batch: '1-3' is not BATCH:STEPS")
  message(FATAL_ERROR "bad --speculative-draft-steps-by-batch text: exit ${rc}: ${out}")
endif()
expect_refusal("a draft-steps rule deeper than the tree" "draft_steps_by_batch\\[1\\] = 4:5: steps must be in \\[0, 3\\]"
               ${chain_flags} --speculative-draft-steps-by-batch 1:3,4:5)

# --speculative-config auto: every compiled tree of the algorithm measured against plain
# decoding on the request, the best predicted one used. A random EAGLE-3 draft accepts nothing:
# plain decoding is chosen, and the output is plain decoding's. On a target whose greedy text
# repeats (--repeat-period), n-gram lookup accepts almost every draft; whether that pays on the
# tiny CPU model depends on the machine (it did on one, not on another), so the test checks that
# the choice is the best prediction and the output plain decoding's. Misuse is refused naming
# the fix.
execute_process(COMMAND "${KIMI}" ${greedy} --speculative-algorithm EAGLE3
                --speculative-draft-model-path "${DIR}-draft" --speculative-config auto
                OUTPUT_VARIABLE auto_json ERROR_VARIABLE auto_err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "generate --speculative-config auto (EAGLE3) failed (${rc}): ${auto_err}")
endif()
string(JSON auto_ids GET "${auto_json}" output_ids)
string(JSON auto_use GET "${auto_json}" advisor speculating)
string(JSON auto_candidates LENGTH "${auto_json}" advisor candidates)
# The six EAGLE-3 candidates share the draft's layers: it is loaded once, then reused.
if(NOT auto_ids STREQUAL plain_ids OR auto_use OR NOT auto_candidates EQUAL 7 OR
   NOT auto_err MATCHES "advisor \\(12 calibration tokens per configuration\\): not speculating" OR
   NOT auto_err MATCHES "-draft already loaded for these layers: reused")
  message(FATAL_ERROR "auto (a random EAGLE-3 draft): ${auto_json}${auto_err}")
endif()
run_kimi(out rc init-random --preset tiny --out "${DIR}-repeat" --seed 4 --repeat-period 8)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "init-random --repeat-period 8 failed (${rc}): ${out}")
endif()
set(repeat generate --model-path "${DIR}-repeat" --input-ids 0,1,2,3,4,5,6,7,0,1
    --max-new-tokens 48 --ignore-eos --json)
execute_process(COMMAND "${KIMI}" ${repeat} OUTPUT_VARIABLE repeat_plain ERROR_QUIET
                RESULT_VARIABLE rc)
execute_process(COMMAND "${KIMI}" ${repeat} --speculative-algorithm NGRAM --speculative-config auto
                OUTPUT_VARIABLE auto_json ERROR_VARIABLE auto_err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "generate --speculative-config auto (NGRAM) failed (${rc}): ${auto_err}")
endif()
string(JSON auto_ids GET "${auto_json}" output_ids)
string(JSON plain_repeat_ids GET "${repeat_plain}" output_ids)
string(JSON auto_use GET "${auto_json}" advisor speculating)
string(JSON auto_chosen GET "${auto_json}" advisor chosen)
string(JSON auto_config GET "${auto_json}" speculative_config)
# Which configuration wins depends on this machine's step costs; what must hold anywhere: the
# n-gram chain of 4 accepts on repeating text, the choice is the highest predicted throughput
# (plain decoding's when no tree beats it), the request ran with it, and the output is plain's.
string(JSON auto_n LENGTH "${auto_json}" advisor candidates)
set(best_tps 0)
set(best_config "")
set(chain_accept 0)
math(EXPR last "${auto_n} - 1")
foreach(i RANGE ${last})
  string(JSON tps GET "${auto_json}" advisor candidates ${i} predicted_tokens_per_s)
  string(JSON config GET "${auto_json}" advisor candidates ${i} speculative_config)
  if(tps GREATER best_tps)
    set(best_tps ${tps})
    set(best_config "${config}")
  endif()
  if(config MATCHES "^NGRAM .*topk=1 steps=4")
    string(JSON chain_accept GET "${auto_json}" advisor candidates ${i} measured_accept_length)
  endif()
endforeach()
set(speculating OFF)
if(best_config MATCHES "^NGRAM")
  set(speculating ON)
endif()
if(NOT auto_ids STREQUAL plain_repeat_ids OR NOT auto_n EQUAL 4 OR chain_accept LESS 2 OR
   NOT auto_chosen STREQUAL best_config OR NOT auto_config STREQUAL best_config OR
   NOT auto_use STREQUAL speculating OR
   NOT auto_err MATCHES "advisor \\(32 calibration tokens per configuration\\): (speculating with NGRAM|not speculating)")
  message(FATAL_ERROR "auto (n-gram on repeating text): ${auto_json}${auto_err}")
endif()
expect_refusal("auto with a tree flag" "--speculative-config auto chooses --speculative-num-steps"
               --speculative-algorithm NGRAM --speculative-config auto --speculative-num-steps 2)
expect_refusal("auto without an algorithm" "with NONE there is nothing to choose"
               --speculative-config auto)
expect_refusal("auto at --tp-size 2" "--speculative-config auto runs at --tp-size 1"
               --speculative-algorithm NGRAM --speculative-config auto --tp-size 2)
run_kimi(out rc ${greedy} --speculative-algorithm NGRAM --speculative-config fastest)
if(NOT rc EQUAL 2 OR NOT out MATCHES "--speculative-config fastest: the one value is auto")
  message(FATAL_ERROR "--speculative-config fastest gave exit ${rc}: ${out}")
endif()

# capture: each prompts line continued by plain decoding, then one prefill over the whole
# sequence, written to a safetensors file (model/kimi/capture.hpp). Read back here: every
# sequence is its prompt + generate's output for that prompt (greedy; sampled: line 0 is
# generate --seed's, and --batch does not change a sampled line), the greedy top-1 of each
# continuation row is the next token, --layers 2,0 swaps the halves of 0,2's aux rows, shards
# 0/2 + 1/2 hold the unsharded sequences, the draft's layer set is read from its config; bad
# lines and flags are refused naming the line or flag.
set(cap "${DIR}-capture")
file(REMOVE_RECURSE "${cap}")
file(MAKE_DIRECTORY "${cap}")
# A little-endian hex string (file(READ ... HEX)) as a number.
function(hex_le out_var hex)
  string(LENGTH "${hex}" n)
  set(be "")
  foreach(i RANGE 0 ${n} 2)
    if(i LESS n)
      string(SUBSTRING "${hex}" ${i} 2 byte)
      set(be "${byte}${be}")
    endif()
  endforeach()
  math(EXPR v "0x${be}")
  set(${out_var} ${v} PARENT_SCOPE)
endfunction()
# Tensor `name` of a safetensors file: its dtype, and its bytes as hex, or for I32 / I64 its
# values as a list.
function(read_tensor file name dtype_var values_var)
  file(READ "${file}" len_hex LIMIT 8 HEX)
  hex_le(len "${len_hex}")
  file(READ "${file}" header OFFSET 8 LIMIT ${len})
  string(JSON dtype GET "${header}" ${name} dtype)
  string(JSON begin GET "${header}" ${name} data_offsets 0)
  string(JSON end GET "${header}" ${name} data_offsets 1)
  math(EXPR offset "8 + ${len} + ${begin}")
  math(EXPR size "${end} - ${begin}")
  file(READ "${file}" hex OFFSET ${offset} LIMIT ${size} HEX)
  set(values "${hex}")
  if(dtype STREQUAL "I32" OR dtype STREQUAL "I64")
    set(width 8)
    if(dtype STREQUAL "I64")
      set(width 16)
    endif()
    set(values)
    math(EXPR last "${size} * 2 - ${width}")
    foreach(i RANGE 0 ${last} ${width})
      string(SUBSTRING "${hex}" ${i} ${width} word)
      hex_le(v "${word}")
      list(APPEND values ${v})
    endforeach()
  endif()
  set(${dtype_var} ${dtype} PARENT_SCOPE)
  set(${values_var} "${values}" PARENT_SCOPE)
endfunction()
# Sequence s of a capture file (its input_ids) into out_var, as "a;b;c".
function(capture_sequence file s out_var)
  read_tensor("${file}" input_ids dt ids)
  read_tensor("${file}" seq_starts dt starts)
  math(EXPR s1 "${s} + 1")
  list(GET starts ${s} begin)
  list(GET starts ${s1} end)
  math(EXPR n "${end} - ${begin}")
  list(SUBLIST ids ${begin} ${n} seq)
  set(${out_var} "${seq}" PARENT_SCOPE)
endfunction()
function(capture_metadata file key out_var)
  file(READ "${file}" len_hex LIMIT 8 HEX)
  hex_le(len "${len_hex}")
  file(READ "${file}" header OFFSET 8 LIMIT ${len})
  string(JSON v GET "${header}" __metadata__ ${key})
  set(${out_var} "${v}" PARENT_SCOPE)
endfunction()
# A JSON array "[1,2]" as "1;2".
function(json_ids out_var json)
  string(REGEX REPLACE "[][ ]" "" list "${json}")
  string(REPLACE "," ";" list "${list}")
  set(${out_var} "${list}" PARENT_SCOPE)
endfunction()

set(cap_prompts "7,300,12" "1,2,3,4,5,6,8" "9" "100,101,102,103")
file(WRITE "${cap}/p.jsonl" "{\"input_ids\": [7,300,12], \"text\": \"ignored\"}\n"
     "{\"input_ids\": [1,2,3,4,5,6,8]}\n{\"input_ids\": [9]}\n"
     "{\"id\": 3, \"input_ids\": [100,101,102,103]}\n")
set(capture_flags capture --model-path "${DIR}" --prompts "${cap}/p.jsonl" --max-new-tokens 7)
function(run_capture out_file)
  run_kimi(out rc ${capture_flags} --out "${out_file}" ${ARGN})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "capture ${ARGN} failed (${rc}): ${out}")
  endif()
  set(capture_out "${out}" PARENT_SCOPE)
endfunction()
run_capture("${cap}/a.safetensors" --layers 0,2 --batch 3)
string(REGEX MATCH "{\"device\".*}" summary "${capture_out}")
string(JSON cap_sequences GET "${summary}" sequences)
string(JSON cap_tokens GET "${summary}" tokens)
string(JSON cap_tps GET "${summary}" tokens_per_s)
read_tensor("${cap}/a.safetensors" input_ids dt a_ids)
read_tensor("${cap}/a.safetensors" seq_starts dt a_starts)
read_tensor("${cap}/a.safetensors" prompt_lengths dt a_plen)
read_tensor("${cap}/a.safetensors" topk_ids dt a_topk)
read_tensor("${cap}/a.safetensors" aux_hidden aux_dt a_aux)
list(LENGTH a_ids total)
if(NOT cap_sequences EQUAL 4 OR NOT cap_tokens EQUAL total OR NOT cap_tps GREATER 0 OR
   NOT a_starts MATCHES "^0;" OR NOT aux_dt STREQUAL "BF16")
  message(FATAL_ERROR "capture: summary ${summary}, ${total} ids, starts ${a_starts}")
endif()
capture_metadata("${cap}/a.safetensors" format format)
capture_metadata("${cap}/a.safetensors" layers meta_layers)
if(NOT format STREQUAL "specdec-capture-v1" OR NOT meta_layers STREQUAL "0,2")
  message(FATAL_ERROR "capture metadata: format ${format}, layers ${meta_layers}")
endif()
set(s 0)
foreach(prompt ${cap_prompts})
  execute_process(COMMAND "${KIMI}" generate --model-path "${DIR}" --input-ids ${prompt}
                  --max-new-tokens 7 --json OUTPUT_VARIABLE gen ERROR_QUIET RESULT_VARIABLE rc)
  string(JSON gen_ids GET "${gen}" output_ids)
  json_ids(gen_ids "${gen_ids}")
  string(REPLACE "," ";" want "${prompt}")
  list(LENGTH want plen)
  list(APPEND want ${gen_ids})
  capture_sequence("${cap}/a.safetensors" ${s} got)
  list(GET a_plen ${s} got_plen)
  if(NOT got STREQUAL want OR NOT got_plen EQUAL plen)
    message(FATAL_ERROR "capture sequence ${s}: ${got} (prompt ${got_plen}), generate gives "
                        "${want} (prompt ${plen})")
  endif()
  # Greedy: the top-1 of every row from the prompt's last to the one before the end is the
  # next token.
  list(GET a_starts ${s} begin)
  list(LENGTH got n)
  math(EXPR first "${begin} + ${plen} - 1")
  math(EXPR last "${begin} + ${n} - 2")
  if(first LESS_EQUAL last)
    foreach(t RANGE ${first} ${last})
      math(EXPR k "${t} * 8")
      math(EXPR t1 "${t} + 1")
      list(GET a_topk ${k} top)
      list(GET a_ids ${t1} next)
      if(NOT top EQUAL next)
        message(FATAL_ERROR "capture row ${t}: top-1 ${top}, next token ${next}")
      endif()
    endforeach()
  endif()
  math(EXPR s "${s} + 1")
endforeach()
# Layer order: 2,0 holds 0,2's halves swapped (a row: 2 x 128 bf16 = 1024 hex digits), bit for
# bit with the same batches (other batches change the forwards' float rounding).
run_capture("${cap}/b.safetensors" --layers 2,0 --batch 3)
read_tensor("${cap}/b.safetensors" aux_hidden dt b_aux)
read_tensor("${cap}/b.safetensors" input_ids dt b_ids)
if(NOT b_ids STREQUAL a_ids)
  message(FATAL_ERROR "capture --layers 2,0 gave other sequences: ${b_ids}")
endif()
math(EXPR last "${total} - 1")
foreach(t RANGE ${last})
  math(EXPR lo "${t} * 1024")
  math(EXPR hi "${lo} + 512")
  string(SUBSTRING "${a_aux}" ${lo} 512 a_lo)
  string(SUBSTRING "${a_aux}" ${hi} 512 a_hi)
  string(SUBSTRING "${b_aux}" ${lo} 512 b_lo)
  string(SUBSTRING "${b_aux}" ${hi} 512 b_hi)
  if(NOT a_lo STREQUAL b_hi OR NOT a_hi STREQUAL b_lo OR a_lo STREQUAL a_hi)
    message(FATAL_ERROR "capture row ${t}: --layers 2,0 is not 0,2 with its halves swapped")
  endif()
endforeach()
# Shards 0/2 and 1/2: lines 0, 2 and 1, 3, each sequence as in the unsharded file.
foreach(index 0 1)
  run_capture("${cap}/shard${index}.safetensors" --layers 0,2 --shard ${index}/2 --batch 1)
  read_tensor("${cap}/shard${index}.safetensors" line_index dt lines)
  math(EXPR other "${index} + 2")
  if(NOT lines STREQUAL "${index};${other}")
    message(FATAL_ERROR "capture --shard ${index}/2 holds lines ${lines}")
  endif()
  foreach(s 0 1)
    list(GET lines ${s} line)
    capture_sequence("${cap}/shard${index}.safetensors" ${s} got)
    capture_sequence("${cap}/a.safetensors" ${line} want)
    if(NOT got STREQUAL want)
      message(FATAL_ERROR "capture --shard ${index}/2 line ${line}: ${got}, unsharded ${want}")
    endif()
  endforeach()
endforeach()
# A shard that gets no line writes a file of no sequence.
run_capture("${cap}/empty.safetensors" --layers 0 --shard 4/5)
read_tensor("${cap}/empty.safetensors" seq_starts dt starts)
if(NOT starts STREQUAL "0" OR NOT capture_out MATCHES "\"sequences\":0,")
  message(FATAL_ERROR "capture --shard 4/5 of 4 lines: seq_starts ${starts}: ${capture_out}")
endif()
# The EAGLE-3 draft's layers (init-random --layers 0,1,2).
run_capture("${cap}/draft.safetensors" --speculative-draft-model-path "${DIR}-draft" --topk 3)
capture_metadata("${cap}/draft.safetensors" layers meta_layers)
read_tensor("${cap}/draft.safetensors" topk_ids dt d_topk)
list(LENGTH d_topk n)
math(EXPR want "${total} * 3")
if(NOT meta_layers STREQUAL "0,1,2" OR NOT n EQUAL want OR
   NOT capture_out MATCHES "capture layers \\[0,1,2\\] from ")
  message(FATAL_ERROR "capture with the draft: layers ${meta_layers}, ${n} top-k ids: "
                      "${capture_out}")
endif()
# Sampled: line 0 is generate --seed's request; --batch does not change any line.
run_capture("${cap}/s4.safetensors" --layers 1 --temperature 0.9 --seed 5 --batch 4)
run_capture("${cap}/s1.safetensors" --layers 1 --temperature 0.9 --seed 5 --batch 1)
read_tensor("${cap}/s4.safetensors" input_ids dt s4_ids)
read_tensor("${cap}/s1.safetensors" input_ids dt s1_ids)
execute_process(COMMAND "${KIMI}" generate --model-path "${DIR}" --input-ids 7,300,12
                --max-new-tokens 7 --temperature 0.9 --seed 5 --json OUTPUT_VARIABLE gen
                ERROR_QUIET)
string(JSON gen_ids GET "${gen}" output_ids)
json_ids(gen_ids "${gen_ids}")
set(want 7 300 12 ${gen_ids})
capture_sequence("${cap}/s4.safetensors" 0 got)
if(NOT s4_ids STREQUAL s1_ids OR NOT got STREQUAL want OR s4_ids STREQUAL a_ids)
  message(FATAL_ERROR "sampled capture: --batch 4 ${s4_ids}, --batch 1 ${s1_ids}; line 0 ${got}, "
                      "generate --seed 5 ${want}")
endif()

function(expect_capture_error code pattern)
  run_kimi(out rc ${ARGN})
  if(NOT rc EQUAL code OR NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "capture ${ARGN}: exit ${rc}, expected ${code} and /${pattern}/: ${out}")
  endif()
endfunction()
set(cap_new ${capture_flags} --out "${cap}/new.safetensors")
file(WRITE "${cap}/bad.jsonl" "{\"input_ids\": [1]}\n{\"input_ids\": [2]}\n"
     "{\"input_ids\": [3, 512]}\n")
expect_capture_error(1 "bad.jsonl line 3: \"input_ids\"\\[1\\] = 512 is outside the vocabulary"
                     capture --model-path "${DIR}" --prompts "${cap}/bad.jsonl" --layers 0
                     --max-new-tokens 2 --out "${cap}/new.safetensors")
file(WRITE "${cap}/bad.jsonl" "{\"input_ids\": [1]}\n[1, 2]\n")
expect_capture_error(1 "bad.jsonl line 2: top level must be an object"
                     capture --model-path "${DIR}" --prompts "${cap}/bad.jsonl" --layers 0
                     --max-new-tokens 2 --out "${cap}/new.safetensors")
expect_capture_error(1 "line 2: 7 prompt tokens \\+ 250 new tokens exceed max_position_emb"
                     capture --model-path "${DIR}" --prompts "${cap}/p.jsonl" --layers 0
                     --max-new-tokens 250 --out "${cap}/new.safetensors")
expect_capture_error(2 "exactly one of --layers .* got both" ${cap_new} --layers 0
                     --speculative-draft-model-path "${DIR}-draft")
expect_capture_error(2 "exactly one of --layers .* got neither" ${cap_new})
expect_capture_error(1 "--layers \\[0,4\\] has id 4 >= the target's 4 layers" ${cap_new}
                     --layers 0,4)
expect_capture_error(1 "--layers \\[1,1\\] lists a layer twice" ${cap_new} --layers 1,1)
expect_capture_error(1 "is an EAGLE-1/2 draft .* which reads no aux layer set" ${cap_new}
                     --speculative-draft-model-path "${DIR}-eagle")
expect_capture_error(1 "--out .*a.safetensors exists: capture never overwrites" ${capture_flags}
                     --out "${cap}/a.safetensors" --layers 0)
expect_capture_error(2 "--shard 2/2: need N >= 1 and 0 <= I < N" ${cap_new} --layers 0
                     --shard 2/2)
expect_capture_error(2 "--shard expects a whole number, got 'x'" ${cap_new} --layers 0
                     --shard x/2)
expect_capture_error(2 "--topk and --batch must be >= 1" ${cap_new} --layers 0 --topk 0)
if(EXISTS "${cap}/new.safetensors" OR EXISTS "${cap}/new.safetensors.tmp")
  message(FATAL_ERROR "a refused capture left a file in ${cap}")
endif()
run_kimi(out rc ${cap_new} --layers 0 --device cuda)
set(no_cuda "--device cuda: (no CUDA device is visible|this specdec-kimi was built without CUDA)")
if(NOT rc EQUAL 0 AND (NOT rc EQUAL 1 OR NOT out MATCHES "${no_cuda}"))
  message(FATAL_ERROR "capture --device cuda gave exit ${rc}: ${out}")
endif()
message(STATUS "cli.kimi: capture of ${cap_sequences} sequences, ${cap_tokens} tokens at "
               "${cap_tps} tokens/s")
file(REMOVE_RECURSE "${cap}")

# Text in and out.
function(kimi_stdout out_var)  # stdout exactly; a non-zero exit fails the test
  execute_process(COMMAND "${KIMI}" ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "specdec-kimi ${ARGN} failed (${rc}): ${out}${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
set(text "Hello, world! 你好，世界 🙂 <|im_end|> done\n")
set(prompt "Hello 你好 🙂")
file(WRITE "${DIR}-text.txt" "${text}")
file(WRITE "${DIR}-prompt.txt" "${prompt}")
set(short generate --model-path "${DIR}" --max-new-tokens 6 --ignore-eos --json)
run_kimi(out rc ${short} --prompt "${prompt}" --input-ids 1,2)
if(NOT rc EQUAL 2 OR NOT out MATCHES "exactly one of --input-ids .* and --prompt TEXT; got both")
  message(FATAL_ERROR "--prompt with --input-ids gave exit ${rc}: ${out}")
endif()
run_kimi(out rc ${short})
if(NOT rc EQUAL 2 OR NOT out MATCHES "exactly one of --input-ids .* and --prompt TEXT; got neither")
  message(FATAL_ERROR "neither --prompt nor --input-ids gave exit ${rc}: ${out}")
endif()
if(HAVE_PCRE2)
  # A special token's text is its one id, above the 256 bytes.
  foreach(name im_end im_user)
    set(special "<|${name}|>")
    file(WRITE "${DIR}-special.txt" "${special}")
    kimi_stdout(id tokenize --tokenizer "${DIR}" --input "${DIR}-special.txt")
    string(STRIP "${id}" id)
    if(NOT id MATCHES "^[0-9]+$" OR id LESS 256)
      message(FATAL_ERROR "tokenize of ${special} gave '${id}', expected one special id")
    endif()
    set(id_${name} ${id})
  endforeach()
  # Byte-level: one id a byte, the special's 10 bytes one id; --decode gives the text back.
  kimi_stdout(ids tokenize --tokenizer "${DIR}" --input "${DIR}-text.txt")
  kimi_stdout(ids_json tokenize --tokenizer "${DIR}" --input "${DIR}-text.txt" --json)
  string(STRIP "${ids}" ids)
  string(LENGTH "${text}" bytes)
  math(EXPR expected "${bytes} - 10 + 1")
  string(JSON count GET "${ids_json}" count)
  string(JSON n LENGTH "${ids_json}" ids)
  if(NOT count EQUAL expected OR NOT n EQUAL expected OR NOT ids MATCHES ",${id_im_end},")
    message(FATAL_ERROR "tokenize: ${count} / ${n} ids, expected ${expected} with "
                        "<|im_end|> = ${id_im_end}: ${ids} / ${ids_json}")
  endif()
  file(WRITE "${DIR}-ids.txt" "${ids}\n")
  kimi_stdout(back tokenize --tokenizer "${DIR}" --input "${DIR}-ids.txt" --decode)
  if(NOT back STREQUAL text)
    message(FATAL_ERROR "tokenize --decode of ${ids} gave '${back}', expected '${text}'")
  endif()
  string(JSON ids_array GET "${ids_json}" ids)
  file(WRITE "${DIR}-ids.txt" "${ids_array}")
  kimi_stdout(back_json tokenize --tokenizer "${DIR}" --input "${DIR}-ids.txt" --decode --json)
  string(JSON back GET "${back_json}" text)
  if(NOT back STREQUAL text)
    message(FATAL_ERROR "tokenize --decode --json of ${ids_array} gave ${back_json}")
  endif()
  file(WRITE "${DIR}-ids.txt" "72, 105\n33,x")
  run_kimi(out rc tokenize --tokenizer "${DIR}" --input "${DIR}-ids.txt" --decode)
  if(NOT rc EQUAL 1 OR NOT out MATCHES "entry 3 'x' is not a token id")
    message(FATAL_ERROR "tokenize --decode of a malformed id gave exit ${rc}: ${out}")
  endif()
  # A tokenizer's own pat_str replaces Kimi's pattern (this one leaves the space unmatched).
  file(MAKE_DIRECTORY "${DIR}-pat")
  file(COPY "${DIR}/tiktoken.model" DESTINATION "${DIR}-pat")
  file(WRITE "${DIR}-pat/tokenizer_config.json" "{\"pat_str\": \"[a-z]+\"}")
  file(WRITE "${DIR}-special.txt" "hi there")
  run_kimi(out rc tokenize --tokenizer "${DIR}-pat" --input "${DIR}-special.txt")
  if(NOT rc EQUAL 1 OR NOT out MATCHES "split pattern \"\\[a-z\\]\\+\" matches nothing at byte 2")
    message(FATAL_ERROR "tokenize with pat_str [a-z]+ gave exit ${rc}: ${out}")
  endif()

  # generate --prompt == generate --input-ids of tokenize's ids; "text" = their decode.
  kimi_stdout(prompt_ids tokenize --tokenizer "${DIR}" --input "${DIR}-prompt.txt")
  kimi_stdout(prompt_json tokenize --tokenizer "${DIR}" --input "${DIR}-prompt.txt" --json)
  string(STRIP "${prompt_ids}" prompt_ids)
  kimi_stdout(from_text ${short} --prompt "${prompt}")
  kimi_stdout(from_ids ${short} --input-ids ${prompt_ids})
  string(JSON text_ids GET "${from_text}" output_ids)
  string(JSON ids_ids GET "${from_ids}" output_ids)
  string(JSON got_prompt GET "${from_text}" prompt_ids)
  string(JSON want_prompt GET "${prompt_json}" ids)
  if(NOT text_ids STREQUAL ids_ids OR NOT got_prompt STREQUAL want_prompt)
    message(FATAL_ERROR "generate --prompt: output ${text_ids}, prompt_ids ${got_prompt}; "
                        "--input-ids ${prompt_ids}: output ${ids_ids}")
  endif()
  string(JSON gen_text GET "${from_text}" text)
  string(JSON ids_text GET "${from_ids}" text)
  file(WRITE "${DIR}-ids.txt" "${text_ids}")
  kimi_stdout(decoded tokenize --tokenizer "${DIR}" --input "${DIR}-ids.txt" --decode --json)
  string(JSON decoded GET "${decoded}" text)
  if(NOT gen_text STREQUAL decoded OR NOT ids_text STREQUAL decoded)
    message(FATAL_ERROR "\"text\" '${gen_text}' / '${ids_text}', tokenize --decode of "
                        "${text_ids}: '${decoded}'")
  endif()
  # --chat: Kimi's template around the prompt, as tokenize --chat; it starts with <|im_user|>.
  kimi_stdout(chat ${short} --prompt "${prompt}" --chat)
  kimi_stdout(chat_json tokenize --tokenizer "${DIR}" --input "${DIR}-prompt.txt" --chat --json)
  string(JSON chat_ids GET "${chat}" prompt_ids)
  string(JSON first_id GET "${chat}" prompt_ids 0)
  string(JSON want_chat GET "${chat_json}" ids)
  if(NOT chat_ids STREQUAL want_chat OR NOT first_id EQUAL id_im_user)
    message(FATAL_ERROR "generate --chat prompt_ids ${chat_ids}, tokenize --chat ${want_chat}, "
                        "<|im_user|> = ${id_im_user}")
  endif()
  set(text_summary "text round trip exact, --prompt == --input-ids")
else()
  set(no_pcre2 "built without PCRE2 \\(apt: libpcre2-dev\\): --prompt / tokenize are unavailable; use --input-ids")
  run_kimi(out rc ${short} --prompt "${prompt}")
  if(NOT rc EQUAL 1 OR NOT out MATCHES "--prompt: this specdec-kimi was ${no_pcre2}")
    message(FATAL_ERROR "generate --prompt without PCRE2 gave exit ${rc}: ${out}")
  endif()
  run_kimi(out rc tokenize --tokenizer "${DIR}" --input "${DIR}-text.txt")
  if(NOT rc EQUAL 1 OR NOT out MATCHES "tokenize: this specdec-kimi was ${no_pcre2}")
    message(FATAL_ERROR "tokenize without PCRE2 gave exit ${rc}: ${out}")
  endif()
  execute_process(COMMAND "${KIMI}" ${short} --input-ids 7,300,12 OUTPUT_VARIABLE out
                  ERROR_VARIABLE err RESULT_VARIABLE rc)
  string(JSON has_text ERROR_VARIABLE no_text GET "${out}" text)
  if(NOT rc EQUAL 0 OR NOT no_text OR NOT err MATCHES "built without PCRE2.*no \"text\"")
    message(FATAL_ERROR "generate --input-ids without PCRE2 (exit ${rc}): ${out}${err}")
  endif()
  set(text_summary "no PCRE2: text features refused")
endif()

# No --model-path: the embedded demo (models/demo) with its EAGLE-3 draft as a chain of 3. Its
# greedy output equals the demo target's alone (--speculative-algorithm NONE), it drafts (accept
# length > 1 over 48 tokens of Python), and stderr names the demo. --random-weights without a
# model path is refused.
set(demo_prompt 275,329,99,2754,272,841,259,275,329,1605,272,399,259,294,334,329)
set(demo generate --input-ids ${demo_prompt} --max-new-tokens 48 --ignore-eos --json)
run_kimi(out rc ${demo})
set(demo_line "no --model-path: the embedded demo model [^\n]*target, EAGLE-3 draft [^\n]*draft")
if(NOT rc EQUAL 0 OR NOT out MATCHES "${demo_line}")
  message(FATAL_ERROR "generate without --model-path failed (${rc}): ${out}")
endif()
kimi_stdout(demo_spec ${demo})
kimi_stdout(demo_plain ${demo} --speculative-algorithm NONE)
string(JSON demo_config GET "${demo_spec}" speculative_config)
string(JSON demo_accept GET "${demo_spec}" accept_length)
string(JSON demo_spec_ids GET "${demo_spec}" output_ids)
string(JSON demo_plain_ids GET "${demo_plain}" output_ids)
if(NOT demo_config MATCHES "^EAGLE3 layers=\\[0,1,2\\] topk=1 steps=3 nodes=4" OR
   NOT demo_spec_ids STREQUAL demo_plain_ids OR NOT demo_accept GREATER 1.2)
  message(FATAL_ERROR "the embedded demo: config '${demo_config}', accept length ${demo_accept}, "
                      "EAGLE-3 ${demo_spec_ids} vs plain ${demo_plain_ids}")
endif()
run_kimi(out rc generate --random-weights 1 --input-ids 1,2 --max-new-tokens 2)
if(NOT rc EQUAL 2 OR NOT out MATCHES "--random-weights needs --model-path DIR")
  message(FATAL_ERROR "--random-weights without --model-path gave exit ${rc}: ${out}")
endif()

# bench on the embedded demo: plain decoding, then every compiled EAGLE-3 tree of the demo's
# layer set (chains of 1 to 4 steps, trees 2x3/6 and 4x3/8), each over the first 2 prompts of
# eval_prompts.jsonl x 16 tokens. The JSON (tools/bench_plot.py's input) parses; NONE comes first
# at speedup 1; every configuration's outputs equal plain decoding's; the EAGLE-3 ones accept
# (accept length > 1); the advisor's choice is a configuration and choice_within_5_percent /
# measured_best agree with the reported decode tokens/s (recomputed here in thousandths, CMake
# having no floating point arithmetic). The tree flags give one configuration against plain
# decoding (here at --batch 2). NONE alone, --tp-size 2, a bad prompts line and too few lines
# are refused, naming why.
list(APPEND scratch "${DIR}-bench.json" "${DIR}-bench-one.json" "${DIR}-prompts.jsonl")
# "463.912..." -> 463912 (thousandths, truncated).
function(to_milli value out_var)
  if(NOT value MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    message(FATAL_ERROR "bench: '${value}' is not a plain decimal number")
  endif()
  set(frac "${CMAKE_MATCH_3}000")
  string(SUBSTRING "${frac}" 0 3 frac)
  math(EXPR milli "${CMAKE_MATCH_1} * 1000 + 1${frac} - 1000")
  set(${out_var} ${milli} PARENT_SCOPE)
endfunction()
run_kimi(out rc bench --count 2 --max-new-tokens 16 --json "${DIR}-bench.json")
if(NOT rc EQUAL 0 OR NOT EXISTS "${DIR}-bench.json" OR
   NOT out MATCHES "\\| config \\| accept length \\| per-position \\| decode tok/s \\|" OR
   NOT out MATCHES "advisor at batch 1: ")
  message(FATAL_ERROR "bench on the demo failed (${rc}): ${out}")
endif()
file(READ "${DIR}-bench.json" bench)
string(JSON bench_n ERROR_VARIABLE bench_error LENGTH "${bench}" configs)
if(bench_error OR bench_n LESS 5)
  message(FATAL_ERROR "bench --json: ${bench_n} configurations (${bench_error}): ${bench}")
endif()
string(JSON plain_name GET "${bench}" configs 0 name)
string(JSON plain_speedup GET "${bench}" configs 0 speedup)
string(JSON bench_prompts GET "${bench}" prompts)
string(JSON bench_tokens GET "${bench}" max_new_tokens)
if(NOT plain_name STREQUAL "NONE" OR NOT plain_speedup EQUAL 1 OR NOT bench_prompts EQUAL 2 OR
   NOT bench_tokens EQUAL 16)
  message(FATAL_ERROR "bench: configs[0] ${plain_name} at speedup ${plain_speedup}, "
                      "${bench_prompts} prompts x ${bench_tokens} tokens: ${bench}")
endif()
string(JSON choice GET "${bench}" advisor choice)
string(JSON reported_best GET "${bench}" advisor measured_best)
string(JSON choice_vs_best GET "${bench}" advisor choice_vs_best)
string(JSON within_type TYPE "${bench}" advisor choice_within_5_percent)
string(JSON within GET "${bench}" advisor choice_within_5_percent)
set(names "")
set(best_milli -1)
set(choice_milli -1)
math(EXPR last "${bench_n} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${bench}" configs ${i} name)
  string(JSON algorithm GET "${bench}" configs ${i} algorithm)
  string(JSON same GET "${bench}" configs ${i} same_tokens_as_plain)
  string(JSON accept GET "${bench}" configs ${i} accept_length)
  string(JSON tps GET "${bench}" configs ${i} decode_tokens_per_s)
  string(JSON verifies GET "${bench}" configs ${i} verify_ct)
  if(NOT same OR accept LESS 1 OR (algorithm STREQUAL "EAGLE3" AND NOT accept GREATER 1) OR
     NOT verifies GREATER 0 OR NOT tps GREATER 0)
    message(FATAL_ERROR "bench: ${name} (${algorithm}): same tokens as plain ${same}, accept "
                        "length ${accept}, ${verifies} verifies, ${tps} decode tokens/s")
  endif()
  if(i GREATER 0 AND NOT algorithm STREQUAL "EAGLE3")
    message(FATAL_ERROR "bench: configs[${i}] is ${algorithm}, not the demo's EAGLE-3")
  endif()
  list(APPEND names "${name}")
  to_milli(${tps} milli)
  if(milli GREATER best_milli)
    set(best_milli ${milli})
    set(best_name "${name}")
  endif()
  if(name STREQUAL choice)
    set(choice_milli ${milli})
  endif()
endforeach()
list(REMOVE_DUPLICATES names)
list(LENGTH names distinct)
if(NOT distinct EQUAL bench_n OR choice_milli LESS 0 OR NOT within_type STREQUAL "BOOLEAN")
  message(FATAL_ERROR "bench: names ${names}, advisor choice '${choice}', "
                      "choice_within_5_percent of type ${within_type}")
endif()
math(EXPR ratio_milli "${choice_milli} * 1000 / ${best_milli}")
to_milli(${choice_vs_best} reported_ratio)
math(EXPR ratio_error "${ratio_milli} - ${reported_ratio}")
set(expect_within OFF)
if(ratio_milli GREATER_EQUAL 950)
  set(expect_within ON)
endif()
if(NOT reported_best STREQUAL best_name OR ratio_error GREATER 1 OR ratio_error LESS -1 OR
   NOT within STREQUAL expect_within)
  message(FATAL_ERROR "bench: advisor ${choice} at ${choice_milli} / best ${best_name} at "
                      "${best_milli} thousandths of a token/s: ratio ${ratio_milli}, within "
                      "${expect_within}; reported best ${reported_best}, choice_vs_best "
                      "${choice_vs_best}, within ${within}")
endif()
# One configuration of the tree flags against plain decoding, two requests a generate call.
run_kimi(out rc bench --count 2 --max-new-tokens 16 --batch 2 --speculative-num-steps 3
         --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
         --json "${DIR}-bench-one.json")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench with the tree flags at --batch 2 failed (${rc}): ${out}")
endif()
file(READ "${DIR}-bench-one.json" bench_one)
string(JSON one_n LENGTH "${bench_one}" configs)
string(JSON one_name GET "${bench_one}" configs 1 name)
string(JSON one_same GET "${bench_one}" configs 1 same_tokens_as_plain)
string(JSON one_batch GET "${bench_one}" batch)
if(NOT one_n EQUAL 2 OR NOT one_name STREQUAL "chain 3" OR NOT one_same OR NOT one_batch EQUAL 2)
  message(FATAL_ERROR "bench --batch 2 with chain 3's flags: ${bench_one}")
endif()
run_kimi(out rc bench --speculative-algorithm NONE --count 2 --max-new-tokens 16)
if(NOT rc EQUAL 1 OR NOT out MATCHES "with --speculative-algorithm NONE alone there is nothing to")
  message(FATAL_ERROR "bench --speculative-algorithm NONE gave exit ${rc}: ${out}")
endif()
run_kimi(out rc bench --tp-size 2 --count 2 --max-new-tokens 16)
if(NOT rc EQUAL 1 OR NOT out MATCHES "bench runs at --tp-size 1")
  message(FATAL_ERROR "bench --tp-size 2 gave exit ${rc}: ${out}")
endif()
file(WRITE "${DIR}-prompts.jsonl" "{\"input_ids\": [275, 329]}\n{\"input_ids\": [275, \"x\"]}\n")
# A model and a draft path but no algorithm (NONE, generate's default): the refusal says so.
run_kimi(out rc bench --model-path "${DIR}" --speculative-draft-model-path "${DIR}-draft"
         --prompts "${DIR}-prompts.jsonl" --count 2 --max-new-tokens 16)
if(NOT rc EQUAL 1 OR NOT out MATCHES "draft-model-path was given: name EAGLE3 or EAGLE for it")
  message(FATAL_ERROR "bench with a draft path and no algorithm gave exit ${rc}: ${out}")
endif()
run_kimi(out rc bench --prompts "${DIR}-prompts.jsonl" --count 2 --max-new-tokens 16)
if(NOT rc EQUAL 1 OR NOT out MATCHES "prompts.jsonl line 2: \"input_ids\"\\[1\\] = \"x\" is not a")
  message(FATAL_ERROR "bench with a bad prompts line gave exit ${rc}: ${out}")
endif()
run_kimi(out rc bench --prompts "${DIR}-prompts.jsonl" --count 3 --max-new-tokens 16)
if(NOT rc EQUAL 1 OR NOT out MATCHES "--count 3: --prompts .*prompts.jsonl holds 2 lines")
  message(FATAL_ERROR "bench --count 3 over 2 lines gave exit ${rc}: ${out}")
endif()

message(STATUS "cli.kimi: generate gave ${ids_first} at ${tps} tokens/s; speculation lossless; "
               "${text_summary}; the embedded demo: accept length ${demo_accept}; bench: "
               "${bench_n} configurations lossless, advisor ${choice} (best ${best_name})")
file(REMOVE_RECURSE "${DIR}" "${DIR}-draft" "${DIR}-eagle" "${DIR}-config" "${DIR}-repeat"
     ${scratch})
