// specdec-kimi: the Kimi-K2.5 reference binary.
//
//   specdec-kimi init-random --preset tiny|kimi-k2.5|kimi-k2.5-1gpu --out DIR [--seed S] [--int4]
//                            [--shards N] [--num-layers L] [--repeat-period P | --config-only]
//       writes a random checkpoint (config.json + safetensors) of the preset into a new or empty
//       DIR; --repeat-period P makes its greedy text repeat: the token after t < P is (t + 1) mod P
//       (model/kimi/random_checkpoint.hpp), text on which n-gram drafting is exact. Also a
//       byte-level tokenizer for the preset's vocabulary (io/tokenizer_files.hpp: tiktoken.model,
//       one id per byte, and tokenizer_config.json, Kimi's special tokens at the top of the
//       vocabulary: at 512, [BOS] 256, [EOS] 257, <|im_end|> 258, <|im_user|> 259, [PAD] 511), so
//       every random checkpoint serves text. The checkpoint's eos is its config.json's
//       eos_token_id (tiny: 2, a byte), not the tokenizer's [EOS]. --config-only writes no
//       tensors: generate / serve --random-weights SEED draw them when they load it (a model too
//       large for the disk, e.g. kimi-k2.5-1gpu's 118 GB)
//   specdec-kimi inspect --model-path DIR
//       loads config + weights (progress bar on stderr) and prints describe(config), the tensor
//       count and bytes, and whether the routed experts are INT4
//   specdec-kimi init-random ... --draft eagle3 --layers 0,1,2 --draft-out DIR [--draft-vocab V]
//   specdec-kimi init-random ... --draft eagle --draft-out DIR
//       also writes a random EAGLE-3 draft (SpecForge layout) or EAGLE-1/2 draft
//       (LlamaForCausalLMEagle: fc over [embedding, last hidden]) for that target into DIR
//   specdec-kimi tokenize --tokenizer DIR --input FILE [--json] [--decode | --chat]
//       text -> ids with the tokenizer in DIR (io/tokenizer.hpp: tiktoken.model and
//       tokenizer_config.json, whose "pat_str", when present, replaces Kimi's split pattern):
//       prints the ids of FILE's text, special tokens' texts (<|im_end|>) matched as their ids, as
//       "1,2,3" (--json: {"ids": [...], "count": N}); --chat: FILE's text is one user message in
//       Kimi's chat template, with the generation prompt (<|im_user|>user<|im_middle|>text
//       <|im_end|><|im_assistant|>assistant<|im_middle|>; the text cannot inject a special token).
//       --decode: FILE holds ids (a JSON array, or whole numbers separated by commas and / or
//       whitespace) and it prints their text exactly, no newline added (invalid UTF-8 as U+FFFD;
//       --json: {"text": "..."})
//   specdec-kimi generate [--model-path DIR] (--input-ids 1,2,3 | --prompt TEXT [--chat])
//                         --max-new-tokens N [--tokenizer DIR] [--temperature T]
//                         [--top-k K] [--top-p P] [--seed S] [--device cpu|cuda] [--ignore-eos]
//                         [--page-size P] [--json]
//                         [--speculative-algorithm EAGLE3|EAGLE|NGRAM|NONE]
//                         [--speculative-draft-model-path DIR] [--speculative-num-steps S]
//                         [--speculative-eagle-topk K] [--speculative-num-draft-tokens N]
//                         [--no-self-check] [--tp-size N] [--moe-split expert|tensor]
//                         [--nnodes N --node-rank R --dist-init-addr HOST:PORT]
//                         [--random-weights SEED] [--disable-cuda-graph]
//                         [--cuda-graph-bs B1 B2 ...] [--speculative-config auto]
//                         [--speculative-draft-steps-by-batch B:S,...] [--disable-device-step]
//       generation on the CPU or the CUDA executor (GPU 0; this binary is compiled as CUDA where
//       the build has CUDA). Every run goes through engine/spec_engine.hpp (NONE: plain decoding
//       in the same loop); the flags select one of ServedPolicies below (the
//       EAGLE3 layer set is the draft checkpoint's), an inconsistent or uncompiled combination is
//       an error naming the fix, and the effective configuration is printed in one line on
//       stderr. Unless --no-self-check, a few greedy steps on a built-in prompt run first and
//       warn when nothing is accepted. --device cuda runs SpecEngine<P, CudaExecutor> (the target
//       and the EAGLE draft on the GPU) on a stream of its own; the target's decode and verify
//       forwards, the draft's proposals and its extends after a verify run padded to the
//       bundles' graph ladder (ServedGraph) and are captured as CUDA graphs, one per ladder size
//       (up to kCudaGraphShapes shapes, replayed after), eagerly above it; --disable-cuda-graph
//       launches every kernel from the host; with EAGLE3 / EAGLE a CUDA step keeps the draft's
//       proposal and its tree on the device and waits once, at the acceptance
//       (EngineOptions::device_resident_step), and --disable-device-step reads the proposal back
//       to build the tree on the host (a second wait, to measure it; the same output); with any
//       other algorithm or device that flag is a usage error; --cuda-graph-bs (SGLang's flag)
//       may state the ladder, and anything but the compiled one is an error.
//       --speculative-config auto (with an algorithm, without the tree flags, at --tp-size 1)
//       measures plain decoding and every compiled tree of the algorithm on the request's first
//       32 tokens, predicts each one's throughput (engine/advisor.hpp) and runs the request with
//       the best, or plainly when none is predicted to gain; the JSON adds "advisor".
//       --speculative-draft-steps-by-batch
//       "1:3,8:1,32:0" (EngineOptions::draft_steps_by_batch; `bench --batch 1,8,32` prints the
//       advisor's plan in this form) drafts fewer steps, or none, from the given batch sizes on;
//       serve logs each change. --json prints one object:
//       output_ids, tokens_per_s (output tokens / wall time of the request, prefill and any
//       first-call set-up included), decode_tokens_per_s (tokens after the first / time of the
//       speculative steps), accept_length, accept_rate, per_position_accept, verify_ct and the
//       time split.
//       Without --model-path it runs the embedded demo (models/demo, found by find_demo_dir: a
//       small trained Kimi-architecture target) and, unless the flags name another
//       configuration, its EAGLE-3 draft as a chain of 3; serve likewise.
//       The prompt is --input-ids or --prompt TEXT (exactly one): the text encoded by the
//       tokenizer (--tokenizer DIR, default the --model-path DIR) with special tokens' texts
//       matched, or with --chat as one user message in Kimi's chat template plus the generation
//       prompt (as tokenize --chat). Whenever a tokenizer is at hand (--prompt, --tokenizer, or a
//       tiktoken.model in --model-path) the output adds "text" (decode_text of output_ids), and
//       with --prompt "prompt_ids"; the tokenizer's vocabulary must be the model's vocab_size.
//       Generation stops at config.json's eos_token_id(s) only (--ignore-eos: never), not at the
//       tokenizer's stop tokens (<|im_end|>, [EOS]) when the config does not list them.
//       --tp-size N shards the target over N ranks (dist/shard.hpp: heads, MLP widths, experts
//       split whole (--moe-split expert, the default) or by width (tensor), lm_head by
//       vocabulary; kept whole for an EAGLE-1/2 draft, which reads it); the draft is replicated.
//       --device cpu: N threads over the CPU communicator. --device cuda: GPUs 0..N-1 over NCCL
//       in this process, or N / nnodes GPUs per process with --nnodes, --node-rank and
//       --dist-init-addr (node 0's HOST:PORT, where it hands out the NCCL id). Rank 0 prints.
//   specdec-kimi bench [--model-path DIR] [--speculative-algorithm EAGLE3|EAGLE|NGRAM]
//                      [--speculative-draft-model-path DIR] [--speculative-num-steps S
//                       --speculative-eagle-topk K --speculative-num-draft-tokens N]
//                      [--prompts FILE.jsonl] [--count N] [--max-new-tokens M]
//                      [--batch B | --batch B1,B2,...]
//                      [--device cpu|cuda] [--json FILE] [--no-self-check] [--page-size P]
//                      [--random-weights SEED] [--disable-cuda-graph]
//       a speculation sweep measured in one run (engine/bench_sweep.hpp): plain decoding first,
//       then the configuration of the three tree flags, or without them every compiled tree of
//       the algorithm and the draft's layer set (as --speculative-config auto's candidates; the
//       demo: EAGLE-3 chains of 1 to 4 steps, trees 2x3/6 and 4x3/8). Each configuration
//       generates the first --count (16) lines' prompts of FILE.jsonl (capture's format, each
//       line checked; default without --model-path: the demo's eval_prompts.jsonl) greedily,
//       exactly --max-new-tokens (96, >= 2) tokens each, --batch (1) requests per
//       SpecEngine::generate call, the target loaded once and the draft once per layer set. Per
//       configuration: decode tokens/s (tokens after each request's first / seconds of the
//       speculative steps, all prompts), speedup over plain decoding's, accept length and rate,
//       per-position acceptance, efficiency = speedup / accept length, the time split, whether
//       every output equals plain decoding's, and the advisor's (engine/advisor.hpp) predicted
//       decode tokens/s from these runs at this batch size; its choice against the measured
//       best (within 5%?). Prints a markdown table and an advisor line on stdout (stderr says
//       "drafting does not pay at batch B" when the choice is plain decoding); --json FILE
//       writes bench_json's object (tools/bench_plot.py plots it). With several batch sizes
//       (--batch 1,4,16, increasing) the sweep runs at each, and a last line gives the drafting
//       plan (bench_sweep.hpp plan_bench) of the configuration chosen at the smallest: the
//       --speculative-draft-steps-by-batch rules for serve, each batch size's depth and predicted
//       speedup; the JSON is then {batches: [bench_json per batch], draft_steps_plan}.
//       --speculative-algorithm NONE
//       and --tp-size > 1 are refused. An output that differs from plain decoding's is an error
//       (exit 1, after the table and the JSON) on the CPU; on --device cuda it is reported
//       (near-ties of the bf16 verify, see generate).
//   specdec-kimi capture --model-path DIR --prompts FILE.jsonl --out FILE.safetensors
//                        (--layers 0,1,2 | --speculative-draft-model-path DRAFTDIR)
//                        --max-new-tokens N [--topk K] [--temperature T --seed S]
//                        [--device cpu|cuda] [--shard I/N] [--batch B] [--random-weights SEED]
//       training data for an EAGLE-3 draft, with the hidden states of THIS engine's forward
//       (model/kimi/capture.hpp has the file's layout). FILE.jsonl: one JSON object a line with
//       "input_ids": [ids] ("text" and other keys ignored); every line is checked first (a bad
//       one is an error naming its number); --shard I/N keeps the lines whose 0-based index % N
//       == I, so N processes share a file. The layer set is --layers (policy/layers.hpp ids: i =
//       after layer i, -1 = the embedding; kept in the order written) or the EAGLE-3 draft
//       checkpoint's eagle_aux_hidden_state_layer_ids (absent: its default), exactly one of the
//       two. Per --batch B prompts (default 16): plain decoding through SpecEngine (NONE) gives up
//       to N new tokens (stops at config.json's eos ids; greedy at --temperature 0, the default,
//       else sampled with Philox keyed on (--seed, the prompt's line, step): the same whatever
//       --batch / --shard), then one target prefill over each whole sequence gives every token's
//       aux row and the top K (default 8) of its log-softmax. --device cuda runs both on GPU 0
//       (bf16 activations: rows differ from the CPU's at bf16 rounding). Writes FILE.safetensors
//       through FILE.safetensors.tmp and a rename, never over an existing file; prints one JSON
//       line: sequences, tokens (all rows), new_tokens, seconds (decoding + capture forwards;
//       loading and writing excluded), tokens_per_s = tokens / seconds, and the split
//   specdec-kimi serve [--model-path DIR] [--tokenizer DIR] [--device cpu|cuda] [--page-size P]
//                      [--speculative-* as generate] [--no-self-check]
//                      [--host 127.0.0.1] [--port 30000] [--api-key KEY]
//                      [--served-model-name NAME] [--max-running-requests 16]
//                      [--max-total-tokens 65536] [--context-length L]
//                      [--chunked-prefill-size 512] [--max-queued-requests 4096]
//                      [--decode-log-interval 40] [--default-max-tokens 128]
//       the OpenAI / SGLang HTTP server (server.hpp: endpoints, errors, signals) over
//       engine/scheduler.hpp's continuous batching of SpecEngine<P, Exec> (the same policy
//       dispatch, self-check and configuration line as generate). The KV pool is
//       --max-total-tokens target tokens (whole --page-size pages); a request holds prompt +
//       max_tokens + the tree's positions, reserved when it is admitted (a full pool queues
//       requests). --context-length (default: the model's max_position_embeddings less the
//       tree's positions, within the pool) bounds prompt + max_tokens; larger is an error.
//       --port 0 takes a free port (the log line names it). --tp-size N shards the target as
//       generate does, its ranks in this process (engine/lockstep.hpp: rank 0 schedules, the
//       others replay its steps); --nnodes is generate's only. Needs cpp-httplib and PCRE2 at
//       build time.
//   specdec-kimi dequantize --model-path DIR --out DIR2
//       writes a copy of an INT4-expert checkpoint with float32 dense experts (exact) and no
//       quantization_config, for frameworks that read dense weights (scripts/hf_parity.py --int4)
//
// Flags are strict: an unknown flag, a missing value or a malformed number is an error naming the
// flag (exit 2); a failed load or write prints the Status (exit 1).
// The tokenizer needs PCRE2 (SPECDEC_HAVE_PCRE2; Debian's libpcre2-dev). Without it the flags
// still parse, and --prompt, --tokenizer and tokenize are an error naming the fix (exit 1);
// init-random writes the tokenizer either way.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/dist/nccl.cuh"
#include "specdec/model/eagle/forward_cuda.cuh"
#include "specdec/model/kimi/forward_cuda.cuh"
#endif
#include "specdec/core/dispatch.hpp"
#include "specdec/dist/communicator.hpp"
#include "specdec/dist/shard.hpp"
#include "specdec/engine/advisor.hpp"
#include "specdec/engine/bench_sweep.hpp"
#include "specdec/engine/scheduler.hpp"
#include "specdec/engine/self_check.hpp"
#include "specdec/engine/spec_engine.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/progress.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/io/tokenizer_files.hpp"
#if defined(SPECDEC_HAVE_PCRE2)
#include "specdec/io/tokenizer.hpp"
#endif
#if defined(SPECDEC_HAVE_SERVER)
#include "server.hpp"
#endif
#include "specdec/model/eagle/config.hpp"
#include "specdec/model/eagle/random_checkpoint.hpp"
#include "specdec/model/kimi/capture.hpp"
#include "specdec/model/kimi/dequantize_checkpoint.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/generate.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/random_weights.hpp"
#include "specdec/model/kimi/weights.hpp"

namespace {

using specdec::Status;

// The bundles this binary serves: Kimi-K2.5's defaults (core/dispatch.hpp)
// and, for the tiny preset's and the demo's 4 layers, EAGLE-3 over layers [0, 1, 2] (what
// `init-random --draft eagle3 --layers 0,1,2` writes, and models/demo/draft) as chains of 1 to 4
// steps and two trees (what bench and --speculative-config auto sweep), plus EAGLE-1/2 and n-gram
// chains and trees (any target). Each bundle instantiates SpecEngine (and the server's
// scheduler) once more in this file: with bench, chains 1, 2, 4 and tree 2x3/6 took its g++ -O3
// compile from about 108 s to 120 s (median of 4-5 runs on a 2-core CI-like box, noisy +-10%)
// and its peak memory from 1.93 to 2.49 GB (0.43 GB of it the four bundles); nvcc: 162 -> 187 s.
// Every bundle has the graph ladder of KimiK25GraphLadder (batch sizes 1, 2, 4, .., 256): on the
// CUDA executor the target's step forwards and the draft's proposals and extends after a verify
// run padded to it, one CUDA graph per size, eagerly above 256 (policy/graph.hpp;
// --disable-cuda-graph keeps the padding and captures nothing). The CPU executor has no graphs.
// One ladder, not an Eager twin of each bundle, keeps the build lean.
using ServedGraph = specdec::KimiK25GraphLadder;
using TinyLayers = specdec::Layers<0, 1, 2>;
template <class Tree>
using TinyEagle3 = specdec::SpecPolicy<specdec::Eagle3, TinyLayers, Tree, ServedGraph>;
template <class Tree>
using EaglePolicy = specdec::SpecPolicy<specdec::Eagle, specdec::Layers<>, Tree, ServedGraph>;
template <class Tree>
using NGramPolicy = specdec::SpecPolicy<specdec::NGram, specdec::Layers<>, Tree, ServedGraph>;
using ServedPolicies = specdec::PolicyList<
    specdec::KimiK25Eagle3Chain<ServedGraph>, specdec::KimiK25Eagle3Top4<ServedGraph>,
    specdec::KimiK25Eagle3Top8<ServedGraph>, specdec::KimiK25NGramChain<ServedGraph>,
    specdec::KimiK25NoDraft<ServedGraph>, TinyEagle3<specdec::Chain<1>>,
    TinyEagle3<specdec::Chain<2>>, TinyEagle3<specdec::Chain<3>>, TinyEagle3<specdec::Chain<4>>,
    TinyEagle3<specdec::TreeShape<2, 3, 6>>, TinyEagle3<specdec::TreeShape<4, 3, 8>>,
    EaglePolicy<specdec::Chain<3>>,
    EaglePolicy<specdec::TreeShape<4, 3, 8>>, NGramPolicy<specdec::Chain<2>>,
    NGramPolicy<specdec::TreeShape<4, 2, 8>>>;

// --speculative-config auto's candidates: the compiled plain configuration first, then every
// compiled one of spec's algorithm and layer set.
std::vector<specdec::SpecConfig> auto_candidates(specdec::SpecConfig const& spec) {
  std::vector<specdec::SpecConfig> out;
  for (specdec::SpecConfig const& c : ServedPolicies::configs()) {
    if (c.algorithm == "NONE") out.insert(out.begin(), c);
  }
  for (specdec::SpecConfig c : ServedPolicies::configs()) {
    if (c.algorithm != spec.algorithm || c.layers != spec.layers) continue;
    c.num_target_layers = spec.num_target_layers;
    out.push_back(c);
  }
  return out;
}

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: specdec-kimi init-random --preset tiny|kimi-k2.5|kimi-k2.5-1gpu --out DIR\n"
               "                                [--seed S] [--int4] [--shards N] [--num-layers L]\n"
               "                                [--repeat-period P | --config-only]\n"
               "                                [--draft eagle3 --layers 0,1,2 --draft-out DIR\n"
               "                                 [--draft-vocab V] | --draft eagle --draft-out DIR]\n"
               "       specdec-kimi inspect --model-path DIR\n"
               "       specdec-kimi tokenize --tokenizer DIR --input FILE [--json]\n"
               "                             [--decode | --chat]\n"
               "       specdec-kimi generate [--model-path DIR] --max-new-tokens N\n"
               "                             (--input-ids 1,2,3 | --prompt TEXT [--chat])\n"
               "                             [--tokenizer DIR] [--json]\n"
               "                             [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
               "                             [--device cpu|cuda] [--ignore-eos] [--page-size P]\n"
               "                             [--speculative-algorithm EAGLE3|EAGLE|NGRAM|NONE]\n"
               "                             [--speculative-draft-model-path DIR]\n"
               "                             [--speculative-num-steps S] [--speculative-eagle-topk K]\n"
               "                             [--speculative-num-draft-tokens N] [--no-self-check]\n"
               "                             [--tp-size N] [--moe-split expert|tensor]\n"
               "                             [--nnodes N --node-rank R --dist-init-addr HOST:PORT]\n"
               "                             [--random-weights SEED] [--disable-cuda-graph]\n"
               "                             [--cuda-graph-bs B1 B2 ...] [--speculative-config auto]\n"
               "                             [--speculative-draft-steps-by-batch B:S,...]\n"
               "                             [--disable-device-step]\n"
               "       specdec-kimi capture --model-path DIR --prompts FILE.jsonl\n"
               "                            --out FILE.safetensors --max-new-tokens N\n"
               "                            (--layers 0,1,2 | --speculative-draft-model-path DIR)\n"
               "                            [--topk K] [--temperature T --seed S]\n"
               "                            [--device cpu|cuda] [--shard I/N] [--batch B]\n"
               "                            [--random-weights SEED]\n"
               "       specdec-kimi bench [--model-path DIR] [--speculative-algorithm A]\n"
               "                          [--speculative-draft-model-path DIR]\n"
               "                          [--speculative-num-steps S --speculative-eagle-topk K\n"
               "                           --speculative-num-draft-tokens N]\n"
               "                          [--prompts FILE.jsonl] [--count N] [--max-new-tokens M]\n"
               "                          [--batch B[,B2,...]] [--device cpu|cuda] [--json FILE]\n"
               "                          [generate's model and device flags]\n"
               "       specdec-kimi serve [--model-path DIR] [generate's model, device and\n"
               "                          speculative flags] [--host H] [--port P] [--api-key K]\n"
               "                          [--served-model-name NAME] [--max-running-requests N]\n"
               "                          [--max-total-tokens T] [--context-length L]\n"
               "                          [--chunked-prefill-size C] [--max-queued-requests Q]\n"
               "                          [--decode-log-interval I] [--default-max-tokens M]\n"
               "       specdec-kimi dequantize --model-path DIR --out DIR2\n"
               "init-random also writes a byte-level tokenizer (tiktoken.model and\n"
               "tokenizer_config.json) into --out; a random checkpoint's eos is its config.json's\n"
               "eos_token_id (tiny: 2), not the tokenizer's [EOS]. tokenize prints the ids of\n"
               "FILE's text (--chat: as one user message in Kimi's chat template), or with\n"
               "--decode the text of the ids in FILE. generate --prompt encodes TEXT with\n"
               "--tokenizer DIR (default: --model-path); the output adds \"text\" whenever a\n"
               "tokenizer is at hand. Generation stops at config.json's eos_token_id only, with\n"
               "--chat too (<|im_end|> stops it only where the config lists it).\n"
               "--random-weights SEED (generate, serve, capture): read only --model-path's\n"
               "config.json and draw the weights from SEED (on the GPU with --device cuda), e.g.\n"
               "for a directory init-random --config-only wrote.\n"
               "capture: each FILE.jsonl line {\"input_ids\": [...]} continued (plain decoding),\n"
               "then its rows written: input_ids, seq_starts, prompt_lengths, line_index,\n"
               "aux_hidden [T, |layers| * H] bf16 (the layers in the order given), topk_ids and\n"
               "topk_logprobs [T, K] (the next token's log-softmax, top K); --shard I/N takes\n"
               "the lines whose index % N == I.\n"
               "generate and serve without --model-path run the embedded demo (models/demo: a\n"
               "small trained Kimi-architecture model) with its EAGLE-3 draft as a chain of 3.\n"
               "bench: plain decoding, then every compiled tree of the algorithm (or the one of\n"
               "the tree flags), each over the same --count prompts (default 16 of the demo's\n"
               "eval_prompts.jsonl) x --max-new-tokens (96) tokens at --batch B (1): a markdown\n"
               "table of decode tokens/s, speedup, acceptance and the advisor's predictions, the\n"
               "advisor's choice against the measured best; --json FILE writes them.\n");
}

[[noreturn]] void fail_usage(std::string const& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  usage(stderr);
  std::exit(2);
}

// A flag's value as a number; anything but a whole number of that type is an error naming the flag.
template <class T>
T number(char const* flag, char const* text) {
  T value{};
  char const* end = text + std::strlen(text);
  auto const [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end || ptr == text) {
    fail_usage(std::string(flag) + (std::is_floating_point_v<T> ? " expects a number" : " expects a whole number") +
               ", got '" + text + "'");
  }
  return value;
}

int finish(Status const& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  return 0;
}

// The flags after the command, walked in order:
//   for (Flags f(argc, argv); f.next();) { if (f.is("--x")) x = f.value(); ... else f.unknown(); }
class Flags {
 public:
  Flags(int argc, char** argv) : argc_(argc), argv_(argv) {}
  bool next() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    return true;
  }
  bool is(char const* name) const { return flag_ == name; }
  // The flag's value; an empty one is refused (it would read as "not given": --api-key "" would
  // serve without a key, --model-path "" the embedded demo).
  char const* value() {
    if (i_ + 1 >= argc_) fail_usage(flag_ + " needs a value");
    char const* v = argv_[++i_];
    if (v[0] == '\0') fail_usage(flag_ + " got an empty value: give one or leave the flag out");
    return v;
  }
  template <class T>
  T number() {
    char const* text = value();
    return ::number<T>(flag_.c_str(), text);
  }
  // One or more numbers: the arguments up to the next flag, each a number or a comma list
  // (SGLang's "--cuda-graph-bs 1 2 4" and "--cuda-graph-bs 1,2,4").
  template <class T>
  std::vector<T> numbers() {
    std::vector<T> out;
    for (bool first = true; first || (i_ + 1 < argc_ && argv_[i_ + 1][0] != '-'); first = false) {
      std::string const text = value();
      for (size_t begin = 0; begin <= text.size();) {
        size_t const end = std::min(text.find(',', begin), text.size());
        out.push_back(::number<T>(flag_.c_str(), text.substr(begin, end - begin).c_str()));
        begin = end + 1;
      }
    }
    return out;
  }
  [[noreturn]] void unknown() const {
    fail_usage("unknown flag " + flag_ + " for " + argv_[1]);
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 1;  // argv[1] is the command
  std::string flag_;
};

// config.json, the safetensors and every weight of the checkpoint at `path` (progress on stderr).
struct LoadedCheckpoint {
  specdec::io::DeepseekV3Config config;
  specdec::io::SafetensorsCheckpoint ckpt;
  specdec::model::kimi::KimiWeights weights;
  bool config_loaded = false;  // config is valid even when a later step failed
  // --random-weights SEED: no checkpoint is read. CPU: `random` holds the weights drawn on the
  // host (weights views them); CUDA: every rank draws its shard on its GPU.
  std::optional<uint64_t> random_seed;
  std::optional<specdec::model::kimi::KimiRandomWeights> random;
};
Status load_checkpoint(std::string const& path, LoadedCheckpoint* m) {
  SPECDEC_RETURN_IF_ERROR(specdec::io::load_config(path, &m->config));
  m->config_loaded = true;
  Status const opened = specdec::io::SafetensorsCheckpoint::open(path, &m->ckpt);
  if (!opened.ok()) {
    return Status::InvalidArgument(opened.message() +
                                   "; a config.json alone (init-random --config-only) is loaded "
                                   "by generate / serve with --random-weights SEED");
  }
  specdec::io::ProgressBar bar("load " + path);
  Status const s = specdec::model::kimi::load_kimi_weights(m->ckpt, m->config, &m->weights,
                                                           bar.callback());
  bar.finish();
  return s;
}

// "1,2,3" -> {1, 2, 3}; any other text is a usage error naming the flag.
template <class T>
std::vector<T> number_list(char const* flag, std::string const& text) {
  std::vector<T> values;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t const end = std::min(text.find(',', begin), text.size());
    values.push_back(number<T>(flag, text.substr(begin, end - begin).c_str()));
    begin = end + 1;
  }
  return values;
}

int init_random(int argc, char** argv) {
  std::string preset, out, draft, draft_out, layers;
  uint64_t seed = 0;
  bool int4 = false;
  int shards = 1;
  std::optional<int> num_layers;
  specdec::model::eagle::DraftRandomOptions draft_options;
  specdec::model::kimi::KimiRandomOptions random_options;
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--preset")) preset = f.value();
    else if (f.is("--out")) out = f.value();
    else if (f.is("--seed")) seed = f.number<uint64_t>();
    else if (f.is("--int4")) int4 = true;
    else if (f.is("--shards")) shards = f.number<int>();
    else if (f.is("--num-layers")) num_layers = f.number<int>();
    else if (f.is("--draft")) draft = f.value();
    else if (f.is("--layers")) layers = f.value();
    else if (f.is("--draft-out")) draft_out = f.value();
    else if (f.is("--draft-vocab")) draft_options.draft_vocab_size = f.number<int>();
    else if (f.is("--repeat-period")) random_options.repeat_period = f.number<int>();
    else if (f.is("--config-only")) random_options.config_only = true;
    else f.unknown();
  }
  if (preset.empty()) {
    fail_usage(std::string("init-random needs --preset (") +
               specdec::model::kimi::kKimiPresets + ")");
  }
  if (out.empty()) fail_usage("init-random needs --out DIR");
  if (!draft.empty() && draft != "eagle3" && draft != "eagle") {
    fail_usage("--draft " + draft + ": use eagle3 (EAGLE-3) or eagle (EAGLE-1/2)");
  }
  bool const eagle3 = draft == "eagle3";
  if (draft.empty() != draft_out.empty() || (eagle3 && layers.empty())) {
    fail_usage("--draft and --draft-out go together, with --layers for eagle3 (e.g. --draft "
               "eagle3 --layers 0,1,2 --draft-out DIR, or --draft eagle --draft-out DIR)");
  }
  if (draft == "eagle" && !layers.empty()) {
    fail_usage("--layers " + layers +
               " with --draft eagle: an EAGLE-1/2 draft reads the target's last hidden state, "
               "not a layer set (use --draft eagle3 for a layer set)");
  }
  if (draft == "eagle" && draft_options.draft_vocab_size != 0) {
    fail_usage("--draft-vocab with --draft eagle: an EAGLE-1/2 draft predicts in the target's "
               "vocabulary (use --draft eagle3 for a reduced draft vocabulary)");
  }
  specdec::io::ProgressBar bar("write " + out);
  Status s = specdec::model::kimi::write_random_preset(out, preset, seed, int4, shards, num_layers,
                                                       bar.callback(), random_options);
  bar.finish();
  if (!s.ok()) return finish(s);
  std::string const period =
      random_options.repeat_period > 0
          ? ", repeat period " + std::to_string(random_options.repeat_period)
          : "";
  if (random_options.config_only) {
    std::printf("wrote %s config.json (%s, no tensors: load it with --random-weights SEED) to %s\n",
                preset.c_str(), int4 ? "INT4 experts" : "bf16", out.c_str());
  } else {
    std::printf("wrote %s checkpoint (%s, %d shard%s, seed %llu%s) to %s\n", preset.c_str(),
                int4 ? "INT4 experts" : "bf16", shards, shards == 1 ? "" : "s",
                static_cast<unsigned long long>(seed), period.c_str(), out.c_str());
  }
  specdec::io::DeepseekV3Config target;
  s = specdec::io::load_config(out, &target);
  if (!s.ok()) return finish(s);
  // Text for every random checkpoint; its eos stays config.json's (see the top).
  s = specdec::io::write_byte_level_tokenizer(out, target.vocab_size);
  if (!s.ok()) return finish(s);
  std::printf("wrote a byte-level tokenizer (vocab %d) to %s\n", target.vocab_size, out.c_str());
  if (draft.empty()) return 0;
  namespace eagle = specdec::model::eagle;
  std::vector<int> const ids = eagle3 ? number_list<int>("--layers", layers) : std::vector<int>{};
  s = eagle::write_random_draft(draft_out, target, ids, seed + 1, draft_options,
                                eagle3 ? eagle::kEagle3Architecture : eagle::kEagleArchitecture);
  if (s.ok() && eagle3) {
    std::printf("wrote a random EAGLE-3 draft (layers %s) to %s\n",
                specdec::format_layers(ids).c_str(), draft_out.c_str());
  } else if (s.ok()) {
    std::printf("wrote a random EAGLE-1/2 draft to %s\n", draft_out.c_str());
  }
  return finish(s);
}

int inspect(int argc, char** argv) {
  std::string path;
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--model-path")) path = f.value();
    else f.unknown();
  }
  if (path.empty()) fail_usage("inspect needs --model-path DIR");
  LoadedCheckpoint m;
  Status const s = load_checkpoint(path, &m);
  if (m.config_loaded) std::printf("%s\n", specdec::io::describe(m.config).c_str());
  if (!s.ok()) return finish(s);
  std::printf("tensors: %lld in %zu shard%s, %s (%llu bytes)\n",
              static_cast<long long>(m.weights.num_tensors), m.ckpt.num_shards(),
              m.ckpt.num_shards() == 1 ? "" : "s",
              specdec::io::format_bytes(static_cast<double>(m.weights.num_bytes)).c_str(),
              static_cast<unsigned long long>(m.weights.num_bytes));
  std::printf("routed experts: %s\n", m.weights.experts_int4 ? "INT4" : "bf16");
  return 0;
}

// The bytes of a file, as they are.
Status read_file(std::string const& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(path + ": cannot open (missing or unreadable)");
  text->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::InvalidArgument(path + ": read error");
  return Status::Ok();
}

#if defined(SPECDEC_HAVE_PCRE2)

// The ids of a tokenize --decode file: a JSON array of whole numbers, or whole numbers separated
// by commas and / or whitespace (no empty entry between two commas, none after the last).
Status parse_ids(std::string const& text, std::string const& file, std::vector<int32_t>* ids) {
  ids->clear();
  auto const space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  size_t i = 0;
  while (i < text.size() && space(text[i])) ++i;
  if (i < text.size() && text[i] == '[') {
    nlohmann::json const j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Status::MalformedInput(file + ": starts with '[' but is not JSON");
    for (size_t k = 0; k < j.size(); ++k) {
      if (!j[k].is_number_integer() || j[k].get<int64_t>() < std::numeric_limits<int32_t>::min() ||
          j[k].get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Status::MalformedInput(file + ": [" + std::to_string(k) + "] = " + j[k].dump() +
                                      " is not a token id (a whole number)");
      }
      ids->push_back(j[k].get<int32_t>());
    }
    return Status::Ok();
  }
  bool after_comma = false;
  while (true) {
    while (i < text.size() && space(text[i])) ++i;
    if (i == text.size() || text[i] == ',') {
      if (i == text.size() && !after_comma) return Status::Ok();
      return Status::MalformedInput(file + ": an empty entry at byte " + std::to_string(i) +
                                    " (ids are separated by one comma and / or whitespace)");
    }
    size_t const start = i;
    while (i < text.size() && !space(text[i]) && text[i] != ',') ++i;
    int32_t id = 0;
    auto const [end, ec] = std::from_chars(text.data() + start, text.data() + i, id);
    if (ec != std::errc() || end != text.data() + i) {
      return Status::MalformedInput(file + ": entry " + std::to_string(ids->size()) + " '" +
                                    text.substr(start, i - start) +
                                    "' is not a token id (a whole number)");
    }
    ids->push_back(id);
    while (i < text.size() && space(text[i])) ++i;
    after_comma = i < text.size() && text[i] == ',';
    if (after_comma) ++i;
  }
}
#else
// What the text features answer in a build without PCRE2 (the tokenizer's split pattern needs it).
Status no_tokenizer(std::string const& what) {
  return Status::Unsupported(what +
                             ": this specdec-kimi was built without PCRE2 (apt: libpcre2-dev): "
                             "--prompt / tokenize are unavailable; use --input-ids");
}
#endif

int tokenize(int argc, char** argv) {
  std::string dir, input;
  [[maybe_unused]] bool json = false;  // read only where PCRE2 is found
  bool decode = false, chat = false;
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--tokenizer")) dir = f.value();
    else if (f.is("--input")) input = f.value();
    else if (f.is("--json")) json = true;
    else if (f.is("--decode")) decode = true;
    else if (f.is("--chat")) chat = true;
    else f.unknown();
  }
  if (dir.empty()) {
    fail_usage("tokenize needs --tokenizer DIR (tiktoken.model + tokenizer_config.json)");
  }
  if (input.empty()) fail_usage("tokenize needs --input FILE");
  if (decode && chat) {
    fail_usage("--decode with --chat: --chat templates text, --decode reads ids");
  }
#if defined(SPECDEC_HAVE_PCRE2)
  std::string text;
  Status s = read_file(input, &text);
  if (!s.ok()) return finish(s);
  specdec::io::Tokenizer tok;
  s = specdec::io::Tokenizer::load(dir, &tok);
  if (!s.ok()) return finish(s);
  std::vector<int32_t> ids;
  if (decode) {
    std::string out;
    s = parse_ids(text, input, &ids);
    if (s.ok()) s = tok.decode_text(ids, &out).prefixed(input + ": ");
    if (!s.ok()) return finish(s);
    if (json) {
      std::printf("%s\n", nlohmann::json{{"text", out}}.dump().c_str());
    } else {
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
    return 0;
  }
  if (chat) {
    specdec::io::ChatMessage const message{"user", text};
    s = tok.encode_chat({&message, 1}, /*add_generation_prompt=*/true, &ids);
  } else {
    s = tok.encode(text, &ids);
  }
  if (!s.ok()) return finish(s.prefixed(input + ": "));
  if (json) {
    std::printf("%s\n", nlohmann::json{{"ids", ids}, {"count", ids.size()}}.dump().c_str());
    return 0;
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
  return 0;
#else
  return finish(no_tokenizer("tokenize"));
#endif
}

// The generate flags of one run.
struct GenerateFlags {
  std::string path, device = "cpu", input, draft_path;
  std::optional<std::string> prompt;  // --prompt TEXT, instead of --input-ids
  std::string tokenizer_dir;          // --tokenizer; empty: --model-path
  bool chat = false;
  specdec::model::kimi::GenerateOptions o;
  int32_t top_k = 0;
  float top_p = 1.0f;
  bool json = false, self_check = true;
  bool cuda_graph = true;  // --disable-cuda-graph: every CUDA forward eager (still padded)
  bool device_step = true;  // --disable-device-step: the proposal read back to the host
  // algorithm NONE: steps 0, topk 0, nodes 1; the served bundles' graph ladder
  specdec::SpecConfig spec = [] {
    specdec::SpecConfig c;
    auto const ladder = ServedGraph::batch_sizes();
    c.cuda_graph_bs.assign(ladder.begin(), ladder.end());
    return c;
  }();
  bool have_algorithm = false, have_steps = false, have_topk = false, have_nodes = false;
  bool auto_config = false;  // --speculative-config auto (generate): calibrate, then choose
  bool sweep = false;        // bench without the tree flags: every compiled tree of the algorithm
  int tp_size = 1, nnodes = 1, node_rank = 0;
  specdec::dist::MoeSplit moe_split = specdec::dist::MoeSplit::kExpertParallel;
  std::string dist_init_addr;
  std::optional<uint64_t> random_weights;  // --random-weights SEED
  // --speculative-draft-steps-by-batch B:S,...: EngineOptions::draft_steps_by_batch
  std::vector<specdec::engine::DraftStepsRule> draft_steps;
};

// The timings and speculation figures of the JSON output.
void add_metrics(specdec::engine::SpecMetrics const& m, nlohmann::json* j) {
  (*j)["accept_length"] = m.accept_length();
  (*j)["accept_rate"] = m.accept_rate();
  (*j)["per_position_accept"] = m.per_position_accept();
  (*j)["verify_ct"] = m.verify_ct;
  (*j)["proposed_drafts"] = m.proposed();
  (*j)["accepted_drafts"] = m.accepted();
  (*j)["time_s"] = {{"prefill", m.prefill_s}, {"draft", m.draft_s},   {"build", m.build_s},
                    {"verify", m.verify_s},   {"commit", m.commit_s}, {"extend", m.extend_s}};
}

// The draft for P on the executor of `target`: the CPU draft over the target's host tensors, or
// the CUDA draft over its device tensors.
template <class P>
Status load_draft(GenerateFlags const& g, LoadedCheckpoint const& m,
                  specdec::model::kimi::KimiCpuModel const& target,
                  specdec::model::eagle::DraftCpuModel* draft) {
  namespace eagle = specdec::model::eagle;
  return eagle::load_draft_cpu_model(g.draft_path, m.config, eagle::target_tensors_of(target),
                                     P::kKind, P::Layers::ids(), specdec::describe<P>(), draft);
}
#if defined(__CUDACC__)
template <class P>
Status load_draft(GenerateFlags const& g, LoadedCheckpoint const& m,
                  specdec::model::kimi::KimiCudaModel const& target,
                  specdec::model::eagle::DraftCudaModel* draft) {
  namespace eagle = specdec::model::eagle;
  return eagle::load_draft_cuda_model(g.draft_path, m.config, eagle::cuda_target_tensors_of(target),
                                      P::kKind, P::Layers::ids(), specdec::describe<P>(), draft);
}
#endif

// A draft model held across engines: loaded for the first P that needs one, lent again to a P
// with the same draft kind and layer set (generate --speculative-config auto's candidates differ
// only in the tree), loaded anew for any other. It must outlive the engines it is lent to.
template <class Exec>
struct HeldDraft {
  std::remove_const_t<typename specdec::engine::detail::DraftFor<Exec>::Model> model;
  bool loaded = false;
  specdec::DraftKind kind{};
  std::vector<int> layers;
};

// Decode / verify forward shapes the CUDA target keeps as graphs (KimiCudaModel::graphs: least
// recently used leave); a steady decode uses one per batch size and 256-slot context bucket.
// The draft keeps as many proposals and as many extends (DraftCudaModel::step_graphs).
constexpr size_t kCudaGraphShapes = 16;

// The executor an engine runs on: the host, or a stream of this rank's GPU made for the engine
// (a created stream: the legacy default stream cannot be captured into a graph).
template <class Exec>
struct EngineExecutor {
  Exec exec{};
  Status create() { return Status::Ok(); }
};
#if defined(__CUDACC__)
template <>
struct EngineExecutor<specdec::CudaExecutor> {
  specdec::CudaExecutor exec{};
  EngineExecutor() = default;
  EngineExecutor(EngineExecutor const&) = delete;
  EngineExecutor& operator=(EngineExecutor const&) = delete;
  ~EngineExecutor() {
    if (exec.stream != nullptr) cudaStreamDestroy(exec.stream);
  }
  Status create() {
    return specdec::cuda_status(cudaStreamCreate(&exec.stream), "cudaStreamCreate");
  }
};
#endif

// SpecEngine<P, Exec> over `target`: the draft loaded for P on Exec (load_draft) into *draft
// (or the one it holds lent again, when its kind and layers are P's),
// the engine created, its configuration printed, the self-check run (also the warm-up, so a
// timed request does not carry the first call's set-up). Every tensor-parallel rank runs it;
// rank 0 (`leader`) prints.
template <class P, class Exec>
Status start_engine(GenerateFlags const& g, LoadedCheckpoint const& m,
                    typename specdec::engine::SpecEngine<P, Exec>::TargetModel* target, bool leader,
                    HeldDraft<Exec>* draft, Exec exec,
                    specdec::engine::SpecEngine<P, Exec>* engine) {
  using Engine = specdec::engine::SpecEngine<P, Exec>;
  if constexpr (Engine::kDraftsWithModel) {
    std::span<int const> const layers = P::Layers::ids();
    bool const held = draft->loaded && draft->kind == P::kKind &&
                      std::ranges::equal(draft->layers, layers);
    if (held) {
      if (leader) {
        std::fprintf(stderr, "specdec-kimi: draft %s already loaded for these layers: reused\n",
                     g.draft_path.c_str());
      }
    } else {
      draft->loaded = false;
      std::optional<specdec::io::ProgressBar> bar;
      if (leader) bar.emplace("load draft " + g.draft_path);
      Status const s = load_draft<P>(g, m, *target, &draft->model);
      if (bar) bar->finish();
      SPECDEC_RETURN_IF_ERROR(s);
      draft->loaded = true;
      draft->kind = P::kKind;
      draft->layers.assign(layers.begin(), layers.end());
    }
  }
  specdec::engine::EngineOptions eo;
  eo.page_size = g.o.page_size;
  eo.draft_steps_by_batch = g.draft_steps;
  eo.device_resident_step = g.device_step;
  SPECDEC_RETURN_IF_ERROR(Engine::create(target, Engine::kDraftsWithModel ? &draft->model : nullptr,
                                         eo, engine, exec));
  std::string tail;  // the configuration line's graphs and draft-steps parts
#if defined(__CUDACC__)
  if constexpr (std::is_same_v<Exec, specdec::CudaExecutor>) {
    target->graphs.set_capacity(g.cuda_graph ? kCudaGraphShapes : 0);
    if constexpr (Engine::kDraftsWithModel) {
      draft->model.step_graphs = g.cuda_graph ? kCudaGraphShapes : 0;
    }
    std::string const ladder = specdec::format_layers(ServedGraph::batch_sizes());
    tail = g.cuda_graph ? std::string("; cuda graph: decode and verify forwards") +
                                (Engine::kDraftsWithModel ? ", the draft's proposals and extends"
                                                          : "") +
                                " padded to batch sizes " + ladder + ", eager above (up to " +
                                std::to_string(kCudaGraphShapes) + " shapes each)"
                          : "; cuda graph: off (--disable-cuda-graph; forwards still padded to " +
                                ladder + ")";
    if constexpr (Engine::kDraftsWithModel) {
      tail += g.device_step ? "; one host wait per step (the proposal stays on the device)"
                            : "; two host waits per step (--disable-device-step: the proposal "
                              "read back)";
    }
  }
#endif
  if (!g.draft_steps.empty()) {
    tail += "; draft steps by batch size " + specdec::engine::format_draft_steps(g.draft_steps);
  }
  if (leader) {
    std::fprintf(stderr, "specdec-kimi: speculative config: %s%s; tp=%d%s%s\n",
                 specdec::describe<P>().c_str(),
                 g.draft_path.empty() ? "" : (" draft=" + g.draft_path).c_str(), g.tp_size,
                 g.tp_size == 1 ? ""
                                : (std::string(" (experts ") +
                                   specdec::dist::moe_split_name(g.moe_split) + "-parallel, lm_head " +
                                   (P::kKind == specdec::DraftKind::kEagle
                                        ? "whole on every rank for the EAGLE-1/2 draft)"
                                        : "split by vocabulary)"))
                                      .c_str(),
                 tail.c_str());
  }
  if (g.self_check) {
    specdec::engine::SelfCheckReport report;
    SPECDEC_RETURN_IF_ERROR(specdec::engine::self_check(*engine, m.config.vocab_size, &report));
    if (leader) {
      std::fprintf(stderr, "specdec-kimi: self-check: accept length %.3f over %lld verifies\n",
                   report.metrics.accept_length(),
                   static_cast<long long>(report.metrics.verify_ct));
      if (!report.warning.empty()) std::fprintf(stderr, "%s\n", report.warning.c_str());
    }
  }
  return Status::Ok();
}

// One request through SpecEngine<P, Exec> (start_engine, then the generation). Every
// tensor-parallel rank runs it (the same steps, the same collectives); rank 0 (`leader`) prints
// and fills *j.
template <class P, class Exec>
Status run_engine(GenerateFlags const& g, LoadedCheckpoint const& m,
                  typename specdec::engine::SpecEngine<P, Exec>::TargetModel* target,
                  std::vector<int32_t> const& ids, bool leader, nlohmann::json* j,
                  specdec::engine::SpecMetrics* metrics = nullptr,
                  HeldDraft<Exec>* held = nullptr) {
  using Engine = specdec::engine::SpecEngine<P, Exec>;
  HeldDraft<Exec> own;
  EngineExecutor<Exec> exec;
  SPECDEC_RETURN_IF_ERROR(exec.create());
  Engine engine;
  SPECDEC_RETURN_IF_ERROR((start_engine<P, Exec>(g, m, target, leader, held ? held : &own,
                                                 exec.exec, &engine)));
  specdec::engine::GenerationRequest r;
  r.prompt = ids;
  r.max_new_tokens = g.o.max_new_tokens;
  r.temperature = g.o.temperature;
  r.top_k = g.top_k;
  r.top_p = g.top_p;
  r.seed = g.o.seed;
  r.stop_at_eos = g.o.stop_at_eos;
  std::vector<specdec::engine::GenerationResult> out;
  specdec::engine::SpecMetrics total;
  auto const t0 = std::chrono::steady_clock::now();
  SPECDEC_RETURN_IF_ERROR(engine.generate({&r, 1}, &out, &total));
  double const seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // After the prefill (and its first token): the speculative steps alone.
  double const steps_s = total.draft_s + total.build_s + total.verify_s + total.commit_s +
                         total.extend_s;
  if (metrics != nullptr) *metrics = total;
  if (!leader) return Status::Ok();
  size_t const n = out[0].output_ids.size();
  *j = {{"output_ids", out[0].output_ids},
        {"finish_reason", specdec::engine::finish_reason_name(out[0].finish_reason)},
        {"prompt_tokens", ids.size()},
        {"device", g.device},
        {"speculative_config", specdec::describe<P>()},
        {"device_resident_step",
         g.device == "cuda" && g.device_step && Engine::kDraftsWithModel},
        {"tp_size", g.tp_size},
        {"tokens_per_s", seconds > 0 ? n / seconds : 0.0},
        {"decode_tokens_per_s", steps_s > 0 && n > 1 ? (n - 1) / steps_s : 0.0},
        {"seconds", seconds}};
  add_metrics(total, j);
  return Status::Ok();
}

// Tokens each configuration generates to be measured by --speculative-config auto.
constexpr int kAutoCalibrationTokens = 32;

// --speculative-config auto (at --tp-size 1): every candidate (auto_candidates: plain decoding
// and each compiled tree of the algorithm) generates up to kAutoCalibrationTokens tokens of the
// request itself; engine/advisor.hpp turns the runs' acceptance and per-phase times into
// predicted throughputs and picks the best, or plain decoding when no tree is predicted to gain;
// the request then runs whole with the choice. *j is that run's JSON plus "advisor".
template <class Exec>
Status run_auto(GenerateFlags const& g, LoadedCheckpoint const& m, auto* target,
                std::vector<int32_t> const& ids, nlohmann::json* j) {
  namespace se = specdec::engine;
  std::vector<specdec::SpecConfig> const configs = auto_candidates(g.spec);
  int const calibration = std::min(g.o.max_new_tokens, kAutoCalibrationTokens);
  std::vector<se::MeasuredRun> runs;
  std::vector<double> measured_tps;
  HeldDraft<Exec> draft;  // loaded once for the candidates' (one) layer set
  for (specdec::SpecConfig const& c : configs) {
    GenerateFlags gc = g;
    gc.spec = c;
    gc.auto_config = false;
    gc.o.max_new_tokens = calibration;
    nlohmann::json jc;
    se::SpecMetrics metrics;
    SPECDEC_RETURN_IF_ERROR(specdec::dispatch<ServedPolicies>(c, [&]<class P>() -> Status {
      return run_engine<P, Exec>(gc, m, target, ids, true, &jc, &metrics, &draft);
    }));
    if (metrics.verify_ct < 1) {
      return Status::InvalidArgument(
          "--speculative-config auto: " + specdec::describe(c) + " made no verify in " +
          std::to_string(calibration) + " tokens (--max-new-tokens 2 or more, and a request that "
          "does not stop at its first token, are needed to measure a step)");
    }
    runs.push_back({c, metrics});
    measured_tps.push_back(jc.value("decode_tokens_per_s", 0.0));
  }
  se::StepCosts costs;
  std::vector<se::Candidate> candidates;
  SPECDEC_RETURN_IF_ERROR(se::costs_from_runs(runs, &costs, &candidates));
  se::Advice advice;
  SPECDEC_RETURN_IF_ERROR(se::advise(costs, candidates, &advice));
  specdec::SpecConfig const chosen =
      advice.use ? advice.predictions[static_cast<size_t>(advice.best)].config : configs.front();
  std::fprintf(stderr, "specdec-kimi: advisor (%d calibration tokens per configuration): %s\n",
               calibration, advice.summary.c_str());
  GenerateFlags gf = g;
  gf.spec = chosen;
  gf.auto_config = false;
  SPECDEC_RETURN_IF_ERROR(specdec::dispatch<ServedPolicies>(chosen, [&]<class P>() -> Status {
    return run_engine<P, Exec>(gf, m, target, ids, true, j, nullptr, &draft);
  }));
  nlohmann::json table = nlohmann::json::array();
  for (size_t i = 0; i < advice.predictions.size(); ++i) {
    se::Prediction const& p = advice.predictions[i];
    table.push_back({{"speculative_config", specdec::describe(p.config)},
                     {"measured_accept_length", runs[i].metrics.accept_length()},
                     {"measured_decode_tokens_per_s", measured_tps[i]},
                     {"predicted_accept_length", p.accept_length},
                     {"predicted_step_ms", 1e3 * p.step_s},
                     {"predicted_tokens_per_s", p.tokens_per_s},
                     {"predicted_speedup", p.speedup},
                     {"extrapolated", p.extrapolated},
                     {"timed_by_own_run", p.own_costs}});
  }
  (*j)["advisor"] = {{"speculating", advice.use},
                     {"chosen", specdec::describe(chosen)},
                     {"summary", advice.summary},
                     {"calibration_tokens", calibration},
                     {"candidates", std::move(table)}};
  return Status::Ok();
}

#if defined(__CUDACC__)
// This process's NCCL communicators: GPUs 0..tp-1 (one process), or GPUs 0..tp/nnodes-1 as
// global ranks node_rank * tp/nnodes + i, initialised together from node 0's id.
Status nccl_communicators(GenerateFlags const& g, std::vector<specdec::dist::NcclCommunicator>* out) {
  int visible = 0;
  SPECDEC_CUDA_TRY(cudaGetDeviceCount(&visible));
  int const local = g.tp_size / g.nnodes;
  if (local > visible) {
    return Status::InvalidArgument("--tp-size " + std::to_string(g.tp_size) +
                                   (g.nnodes > 1 ? " over " + std::to_string(g.nnodes) + " nodes" : "") +
                                   " needs " + std::to_string(local) + " GPUs in this process; " +
                                   std::to_string(visible) + " visible");
  }
  std::vector<int> devices(static_cast<size_t>(local));
  for (int i = 0; i < local; ++i) devices[static_cast<size_t>(i)] = i;
  if (g.nnodes == 1) return specdec::dist::nccl_init_all(devices, out);
  specdec::dist::NcclUniqueId id{};
  SPECDEC_RETURN_IF_ERROR(
      specdec::dist::nccl_unique_id(g.nnodes, g.node_rank, g.dist_init_addr, &id));
  out->resize(static_cast<size_t>(local));
  std::vector<Status> status(static_cast<size_t>(local));
  std::vector<std::thread> threads;  // ncclCommInitRank waits for every rank: all at once
  for (int i = 0; i < local; ++i) {
    threads.emplace_back([&, i] {
      status[static_cast<size_t>(i)] = specdec::dist::nccl_init_rank(
          id, g.tp_size, g.node_rank * local + i, i, &(*out)[static_cast<size_t>(i)]);
    });
  }
  for (auto& t : threads) t.join();
  for (Status const& st : status) SPECDEC_RETURN_IF_ERROR(st);
  return Status::Ok();
}
#endif

#if defined(SPECDEC_HAVE_PCRE2)
// The tokenizer's vocabulary is the model's.
Status check_tokenizer_fits(specdec::io::Tokenizer const& tokenizer, std::string const& dir,
                            specdec::io::DeepseekV3Config const& config) {
  if (tokenizer.vocab_size() == config.vocab_size) return Status::Ok();
  return Status::InvalidArgument(
      "the tokenizer in " + dir + " has " + std::to_string(tokenizer.vocab_size()) +
      " ids, the model (config.json vocab_size) " + std::to_string(config.vocab_size) +
      ": not this model's tokenizer (--tokenizer DIR names the right one)");
}
#endif

// Usage errors of the shared flags (exit 2).
void check_common_flags(GenerateFlags const& g) {
  if (g.device != "cpu" && g.device != "cuda") fail_usage("--device " + g.device + ": use cpu or cuda");
  if (g.tp_size < 1) fail_usage("--tp-size " + std::to_string(g.tp_size) + ": must be >= 1");
  if (g.nnodes < 1 || g.node_rank < 0 || g.node_rank >= g.nnodes) {
    fail_usage("--nnodes " + std::to_string(g.nnodes) + " --node-rank " +
               std::to_string(g.node_rank) + ": need nnodes >= 1 and 0 <= node-rank < nnodes");
  }
  if (g.nnodes > 1 && g.device != "cuda") {
    fail_usage("--nnodes " + std::to_string(g.nnodes) +
               " needs --device cuda (the CPU communicator is threads of one process)");
  }
  if (g.nnodes > 1 && (g.tp_size % g.nnodes != 0 || g.dist_init_addr.empty())) {
    fail_usage("--nnodes " + std::to_string(g.nnodes) + " needs --tp-size a multiple of it (got " +
               std::to_string(g.tp_size) + ") and --dist-init-addr HOST:PORT of node 0");
  }
  if (!g.device_step &&
      (g.device != "cuda" || (g.spec.algorithm != "EAGLE3" && g.spec.algorithm != "EAGLE"))) {
    fail_usage("--disable-device-step is for --device cuda with --speculative-algorithm EAGLE3 "
               "or EAGLE (the steps that keep the proposal on the device); got --device " +
               g.device + " and " + g.spec.algorithm);
  }
  if (!g.cuda_graph && g.device != "cuda") {
    fail_usage("--disable-cuda-graph is for --device cuda (the CPU executor captures no graphs); "
               "got --device " + g.device);
  }
  if (g.nnodes == 1 && !g.dist_init_addr.empty()) {
    fail_usage("--dist-init-addr is for --nnodes > 1 (one process needs no rendezvous)");
  }
  // The graph ladder is the bundles' (compile time): the flag states it, never changes it.
  auto const ladder = ServedGraph::batch_sizes();
  if (!std::equal(ladder.begin(), ladder.end(), g.spec.cuda_graph_bs.begin(),
                  g.spec.cuda_graph_bs.end())) {
    fail_usage("--cuda-graph-bs " + specdec::format_layers(g.spec.cuda_graph_bs) +
               ": this specdec-kimi's bundles are compiled for the graph ladder " +
               specdec::format_layers(ladder) +
               " (ServedGraph, policy/graph.hpp's GraphLadder): give that, or leave the flag "
               "out; --disable-cuda-graph captures nothing");
  }
}

// The tree flags all given, and the device at hand.
Status check_device(GenerateFlags const& g) {
  if (g.auto_config) {
    if (g.spec.algorithm == "NONE") {
      return Status::InvalidArgument(
          "--speculative-config auto chooses a tree for --speculative-algorithm EAGLE3, EAGLE or "
          "NGRAM; with NONE there is nothing to choose");
    }
    if (g.have_steps || g.have_topk || g.have_nodes) {
      return Status::InvalidArgument(
          "--speculative-config auto chooses --speculative-num-steps, --speculative-eagle-topk "
          "and --speculative-num-draft-tokens itself: drop them, or drop --speculative-config");
    }
    if (g.tp_size != 1) {
      return Status::InvalidArgument(
          "--speculative-config auto runs at --tp-size 1 (the ranks would each measure, and "
          "must not choose differently)");
    }
  } else if (g.spec.algorithm != "NONE" && !g.sweep &&
             !(g.have_steps && g.have_topk && g.have_nodes)) {
    // The tree shape is never guessed: every flag of it is given, so nothing is adjusted.
    return Status::InvalidArgument(
        "--speculative-algorithm " + g.spec.algorithm +
        " needs --speculative-num-steps, --speculative-eagle-topk and "
        "--speculative-num-draft-tokens (e.g. 3, 1, 4 for a 3-step EAGLE chain, or 4, 1, 5 "
        "for Kimi-K2.5's n-gram chain); none is defaulted");
  }
#if defined(__CUDACC__)
  if (g.device == "cuda" && !specdec::cuda_device_available()) {
    return Status::Unsupported("--device cuda: no CUDA device is visible; use --device cpu");
  }
#else
  if (g.device == "cuda") {
    return Status::Unsupported(
        "--device cuda: this specdec-kimi was built without CUDA; use --device cpu");
  }
#endif
  return Status::Ok();
}

// The speculative flags against the target's config and the draft checkpoint's (the EAGLE-3
// layer set is the checkpoint's record), matched to a compiled bundle (a dry dispatch) before
// any weight loads.
Status check_speculation(specdec::io::DeepseekV3Config const& target_config, GenerateFlags* gp,
                         specdec::DraftKind* kind_out) {
  GenerateFlags& g = *gp;
  g.spec.num_target_layers = target_config.num_hidden_layers;
  specdec::DraftKind kind{};
  if (!specdec::parse_draft_kind(g.spec.algorithm, &kind)) return specdec::validate(g.spec);
  *kind_out = kind;
  bool const drafts_with_model =
      kind == specdec::DraftKind::kEagle3 || kind == specdec::DraftKind::kEagle;
  if (drafts_with_model && g.draft_path.empty()) {
    return Status::InvalidArgument("--speculative-algorithm " + g.spec.algorithm +
                                   " needs --speculative-draft-model-path DIR");
  }
  if (!drafts_with_model && !g.draft_path.empty()) {
    return Status::InvalidArgument("--speculative-algorithm " + g.spec.algorithm +
                                   " uses no draft model, but "
                                   "--speculative-draft-model-path was given: drop it, or "
                                   "use EAGLE3 / EAGLE for a draft model");
  }
  if (drafts_with_model) {
    specdec::model::eagle::DraftConfig draft;
    SPECDEC_RETURN_IF_ERROR(specdec::model::eagle::read_draft_config(
        g.draft_path, target_config.num_hidden_layers, &draft));
    SPECDEC_RETURN_IF_ERROR(specdec::model::eagle::check_draft_config_fits(
        draft, kind, draft.layers, "--speculative-algorithm " + g.spec.algorithm));
    if (kind == specdec::DraftKind::kEagle3) g.spec.layers = draft.layers;
  }
  if (g.auto_config || g.sweep) {
    if (auto_candidates(g.spec).size() < 2) {
      std::string const who = g.auto_config ? "--speculative-config auto" : "bench";
      return Status::Unsupported(who + ": no compiled " + g.spec.algorithm +
                                 " configuration with layers " +
                                 specdec::format_layers(g.spec.layers) + "; compiled: " +
                                 specdec::describe_list<ServedPolicies>());
    }
    return Status::Ok();
  }
  return specdec::dispatch<ServedPolicies>(g.spec, [](auto) -> Status { return Status::Ok(); });
}

// The flags generate and serve share (model, tokenizer, device, speculation, tensor parallel);
// false when f's flag is none of them.
bool common_flag(Flags& f, GenerateFlags& g) {
  if (f.is("--model-path")) g.path = f.value();
  else if (f.is("--tokenizer")) g.tokenizer_dir = f.value();
  else if (f.is("--device")) g.device = f.value();
  else if (f.is("--page-size")) g.o.page_size = f.number<int>();
  else if (f.is("--no-self-check")) g.self_check = false;
  else if (f.is("--disable-cuda-graph")) g.cuda_graph = false;
  else if (f.is("--disable-device-step")) g.device_step = false;
  else if (f.is("--cuda-graph-bs")) g.spec.cuda_graph_bs = f.numbers<int>();
  else if (f.is("--speculative-algorithm")) g.spec.algorithm = f.value(), g.have_algorithm = true;
  else if (f.is("--speculative-draft-model-path")) g.draft_path = f.value();
  else if (f.is("--speculative-num-steps")) g.spec.num_steps = f.number<int>(), g.have_steps = true;
  else if (f.is("--speculative-eagle-topk")) g.spec.eagle_topk = f.number<int>(), g.have_topk = true;
  else if (f.is("--speculative-num-draft-tokens"))
    g.spec.num_draft_tokens = f.number<int>(), g.have_nodes = true;
  else if (f.is("--tp-size")) g.tp_size = f.number<int>();
  else if (f.is("--moe-split")) {
    Status const ms = specdec::dist::parse_moe_split(f.value(), &g.moe_split);
    if (!ms.ok()) fail_usage(ms.message());
  }
  else if (f.is("--nnodes")) g.nnodes = f.number<int>();
  else if (f.is("--node-rank")) g.node_rank = f.number<int>();
  else if (f.is("--dist-init-addr")) g.dist_init_addr = f.value();
  else if (f.is("--random-weights")) g.random_weights = f.number<uint64_t>();
  else if (f.is("--speculative-draft-steps-by-batch")) {
    Status const ds = specdec::engine::parse_draft_steps(f.value(), &g.draft_steps);
    if (!ds.ok()) fail_usage("--speculative-draft-steps-by-batch: " + ds.message());
  }
  else return false;
  return true;
}

// The embedded demo (models/demo: a trained target and its EAGLE-3 draft, tools/demo), found in
// $SPECDEC_DEMO_DIR, else the source tree this binary was built from, else the install tree
// (<prefix>/share/specdec/models/demo beside <prefix>/bin); empty when none holds it.
std::string find_demo_dir(char const* argv0) {
  std::vector<std::filesystem::path> candidates;
  if (char const* env = std::getenv("SPECDEC_DEMO_DIR")) candidates.emplace_back(env);
#if defined(SPECDEC_DEMO_DIR)
  candidates.emplace_back(SPECDEC_DEMO_DIR);
#endif
  std::error_code ec;
  std::filesystem::path const exe = std::filesystem::canonical("/proc/self/exe", ec);
  std::filesystem::path const bin = ec ? std::filesystem::path(argv0).parent_path()
                                       : exe.parent_path();
  candidates.push_back(bin / ".." / "share" / "specdec" / "models" / "demo");
  for (std::filesystem::path const& dir : candidates) {
    if (std::filesystem::is_regular_file(dir / "target" / "config.json", ec)) return dir.string();
  }
  return "";
}

// No --model-path: generate, serve and bench run the embedded demo, with speculation on: its
// EAGLE-3 draft as a chain of 3 (steps 3, topk 1, 4 draft tokens; bench's sweep: every compiled
// tree) unless the flags name another configuration (--speculative-algorithm NONE runs the target
// alone). Says so on stderr.
void use_embedded_demo(GenerateFlags& g, char const* argv0, std::string const& command) {
  if (g.random_weights) fail_usage(command + " --random-weights needs --model-path DIR");
  std::string const dir = find_demo_dir(argv0);
  if (dir.empty()) {
    fail_usage(command + " needs --model-path DIR (the embedded demo model is not here: set "
                         "SPECDEC_DEMO_DIR to the repository's models/demo)");
  }
  g.path = dir + "/target";
  if (!g.have_algorithm) g.spec.algorithm = "EAGLE3";
  if (g.spec.algorithm == "EAGLE3" && g.draft_path.empty()) {
    g.draft_path = dir + "/draft";
    if (!g.sweep && !g.have_steps && !g.have_topk && !g.have_nodes) {
      g.spec.num_steps = 3, g.spec.eagle_topk = 1, g.spec.num_draft_tokens = 4;
      g.have_steps = g.have_topk = g.have_nodes = true;
    }
  }
  std::fprintf(stderr, "specdec-kimi: no --model-path: the embedded demo model %s%s\n",
               g.path.c_str(),
               g.draft_path.empty() ? "" : (", EAGLE-3 draft " + g.draft_path).c_str());
}

// The target of the flags: --model-path's checkpoint, or with --random-weights its config.json
// alone and weights drawn from the seed (random_weights.hpp: on the host for --device cpu, on
// each rank's GPU for cuda).
Status load_target(GenerateFlags const& g, LoadedCheckpoint* m) {
  if (!g.random_weights) return load_checkpoint(g.path, m);
  SPECDEC_RETURN_IF_ERROR(specdec::io::load_config(g.path, &m->config));
  m->config_loaded = true;
  m->random_seed = g.random_weights;
  if (g.device != "cpu") return Status::Ok();
  m->random.emplace();
  SPECDEC_RETURN_IF_ERROR(specdec::model::kimi::KimiRandomWeights::create(
      m->config, *g.random_weights, &*m->random, /*host_bytes=*/true));
  m->weights = m->random->weights;
  return Status::Ok();
}

// The ranks' sharding from the flags (rank set by each rank): --tp-size, --moe-split, and the
// lm_head kept whole for an EAGLE-1/2 draft, which reads it.
specdec::dist::TpShard shard_of(GenerateFlags const& g, specdec::DraftKind kind) {
  specdec::dist::TpShard shard;
  shard.size = g.tp_size;
  shard.moe = g.moe_split;
  shard.replicate_lm_head = kind == specdec::DraftKind::kEagle;
  return shard;
}

// Runs fn.template operator()<Exec>(rank, &target) on every tensor-parallel rank, target the
// rank's shard of m (all of it at --tp-size 1) on --device's executor: CPU ranks are threads over
// the CPU communicator, CUDA ranks GPUs over NCCL (nccl_communicators). The first failing rank's
// error is returned.
template <class Fn>
Status for_each_rank(GenerateFlags const& g, LoadedCheckpoint const& m,
                     specdec::dist::TpShard const& shard, Fn const& fn) {
  auto cpu_rank = [&](int rank, specdec::dist::CpuCommunicator* comm) -> Status {
    specdec::dist::TpShard mine = shard;
    mine.rank = rank;
    specdec::model::kimi::KimiCpuModel target;
    SPECDEC_RETURN_IF_ERROR(
        specdec::model::kimi::load_kimi_cpu_model(m.weights, m.config, mine, comm, &target));
    return fn.template operator()<specdec::CpuExecutor>(rank, &target);
  };
  if (g.device == "cpu" && g.tp_size == 1) return cpu_rank(0, nullptr);
  if (g.device == "cpu") {
    return specdec::dist::run_ranks(g.tp_size, [&](int rank, specdec::dist::CpuCommunicator& c) {
      return cpu_rank(rank, &c);
    });
  }
#if defined(__CUDACC__)
  auto cuda_rank = [&](int rank, specdec::dist::NcclCommunicator* comm) -> Status {
    specdec::dist::TpShard mine = shard;
    mine.rank = rank;
    specdec::model::kimi::KimiCudaModel target;
    SPECDEC_RETURN_IF_ERROR(
        m.random_seed
            ? specdec::model::kimi::generate_kimi_cuda_model(m.config, *m.random_seed, mine, comm,
                                                             &target)
            : specdec::model::kimi::load_kimi_cuda_model(m.weights, m.config, mine, comm, &target));
    return fn.template operator()<specdec::CudaExecutor>(rank, &target);
  };
  if (g.tp_size == 1) return cuda_rank(0, nullptr);
  std::vector<specdec::dist::NcclCommunicator> comms;
  SPECDEC_RETURN_IF_ERROR(nccl_communicators(g, &comms));
  return specdec::dist::run_nccl_ranks(comms, [&](int rank, specdec::dist::NcclCommunicator& c) {
    return cuda_rank(rank, &c);
  });
#else
  return Status::Unsupported("--device " + g.device + ": this specdec-kimi was built without CUDA");
#endif
}

int generate(int argc, char** argv) {
  GenerateFlags g;
  bool have_max = false, have_input = false;
  for (Flags f(argc, argv); f.next();) {
    if (common_flag(f, g)) continue;
    if (f.is("--input-ids")) g.input = f.value(), have_input = true;
    else if (f.is("--prompt")) g.prompt = f.value();
    else if (f.is("--chat")) g.chat = true;
    else if (f.is("--max-new-tokens")) g.o.max_new_tokens = f.number<int>(), have_max = true;
    else if (f.is("--temperature")) g.o.temperature = f.number<float>();
    else if (f.is("--top-k")) g.top_k = f.number<int32_t>();
    else if (f.is("--top-p")) g.top_p = f.number<float>();
    else if (f.is("--seed")) g.o.seed = f.number<uint64_t>();
    else if (f.is("--ignore-eos")) g.o.stop_at_eos = false;
    else if (f.is("--json")) g.json = true;
    else if (f.is("--speculative-config")) {
      std::string const v = f.value();
      if (v != "auto") {
        fail_usage("--speculative-config " + v +
                   ": the one value is auto (measure each compiled tree, then choose)");
      }
      g.auto_config = true;
    } else f.unknown();
  }
  if (g.path.empty()) use_embedded_demo(g, argv[0], "generate");
  if (have_input == g.prompt.has_value()) {
    fail_usage(std::string("generate needs exactly one of --input-ids (comma-separated token ids) "
                           "and --prompt TEXT; got ") +
               (have_input ? "both" : "neither"));
  }
  if (g.chat && !g.prompt) {
    fail_usage("--chat applies Kimi's chat template to --prompt TEXT (not to --input-ids)");
  }
  if (!have_max) fail_usage("generate needs --max-new-tokens N");
  check_common_flags(g);
  Status s = check_device(g);
  if (!s.ok()) return finish(s);
  // The prompt's ids: --input-ids, or --prompt through the tokenizer, which also decodes the
  // output whenever it is at hand (--prompt, --tokenizer, or a tiktoken.model in --model-path).
  std::string const tokenizer_dir = g.tokenizer_dir.empty() ? g.path : g.tokenizer_dir;
  std::error_code no_file;
  bool const has_tokenizer =
      g.prompt || !g.tokenizer_dir.empty() ||
      std::filesystem::exists(std::filesystem::path(tokenizer_dir) / "tiktoken.model", no_file);
  std::vector<int32_t> ids;
#if defined(SPECDEC_HAVE_PCRE2)
  std::optional<specdec::io::Tokenizer> tokenizer;
  if (has_tokenizer) {
    Status ts = specdec::io::Tokenizer::load(tokenizer_dir, &tokenizer.emplace());
    if (!ts.ok()) return finish(ts.prefixed("tokenizer (--tokenizer DIR, default --model-path): "));
    if (g.prompt && g.chat) {
      specdec::io::ChatMessage const message{"user", *g.prompt};
      ts = tokenizer->encode_chat({&message, 1}, /*add_generation_prompt=*/true, &ids);
    } else if (g.prompt) {
      ts = tokenizer->encode(*g.prompt, &ids);
    }
    if (!ts.ok()) return finish(ts.prefixed("--prompt: "));
  }
#else
  if (g.prompt) return finish(no_tokenizer("--prompt"));
  if (!g.tokenizer_dir.empty()) return finish(no_tokenizer("--tokenizer"));
  if (has_tokenizer) {
    std::fprintf(stderr,
                 "specdec-kimi: %s has a tokenizer, but this specdec-kimi was built without PCRE2 "
                 "(apt: libpcre2-dev): the output has no \"text\"\n",
                 tokenizer_dir.c_str());
  }
#endif
  if (!g.prompt) ids = number_list<int32_t>("--input-ids", g.input);
  // The configuration is checked against both config.json files before any weight is read.
  specdec::io::DeepseekV3Config target_config;
  s = specdec::io::load_config(g.path, &target_config);
  if (!s.ok()) return finish(s);
#if defined(SPECDEC_HAVE_PCRE2)
  if (tokenizer) {
    s = check_tokenizer_fits(*tokenizer, tokenizer_dir, target_config);
    if (!s.ok()) return finish(s);
  }
#endif
  specdec::DraftKind kind{};
  s = check_speculation(target_config, &g, &kind);
  if (!s.ok()) return finish(s);
  LoadedCheckpoint m;
  s = load_target(g, &m);
  if (!s.ok()) return finish(s);
  nlohmann::json j;
  // Every rank: its shard of the target (all of it at --tp-size 1), then the engine.
  specdec::dist::TpShard const shard = shard_of(g, kind);
  s = for_each_rank(g, m, shard, [&]<class Exec>(int rank, auto* target) -> Status {
    if (g.auto_config) return run_auto<Exec>(g, m, target, ids, &j);
    return specdec::dispatch<ServedPolicies>(g.spec, [&]<class P>() -> Status {
      return run_engine<P, Exec>(g, m, target, ids, rank == 0, &j);
    });
  });
  if (!s.ok()) return finish(s);
  if (j.is_null()) return 0;  // a process of --nnodes > 1 without global rank 0
#if defined(SPECDEC_HAVE_PCRE2)
  // An output id without a token (a gap in the special ids) leaves "text" out: an error after
  // the output is printed.
  if (tokenizer) {
    if (g.prompt) j["prompt_ids"] = ids;
    std::string text;
    s = tokenizer->decode_text(j["output_ids"].get<std::vector<int32_t>>(), &text)
            .prefixed("\"text\": ");
    if (s.ok()) j["text"] = text;
  }
#endif
  std::printf("%s\n", g.json ? j.dump().c_str() : j.dump(2).c_str());
  return finish(s);
}

// The capture flags beyond the model, device and sampling ones GenerateFlags holds.
struct CaptureFlags {
  std::string prompts, out, layers, draft_path;
  int topk = 8, batch = 16;
  specdec::model::kimi::CaptureShard shard;
};

// --shard I/N: a usage error unless 0 <= I < N.
specdec::model::kimi::CaptureShard parse_shard(std::string const& text) {
  size_t const slash = text.find('/');
  if (slash == std::string::npos) {
    fail_usage("--shard " + text + ": use I/N (this process takes the lines whose index % N == I)");
  }
  specdec::model::kimi::CaptureShard s;
  s.index = number<int>("--shard", text.substr(0, slash).c_str());
  s.count = number<int>("--shard", text.substr(slash + 1).c_str());
  if (s.count < 1 || s.index < 0 || s.index >= s.count) {
    fail_usage("--shard " + text + ": need N >= 1 and 0 <= I < N");
  }
  return s;
}

// The capture's layer set: --layers as written, or the EAGLE-3 draft checkpoint's record
// (model/eagle/config.hpp: eagle_aux_hidden_state_layer_ids, or its documented default), checked
// against the target's layer count as the engine checks a draft's.
Status capture_layers(CaptureFlags const& cf, specdec::io::DeepseekV3Config const& target,
                      std::vector<int>* layers) {
  namespace eagle = specdec::model::eagle;
  int const L = target.num_hidden_layers;
  if (!cf.layers.empty()) {
    *layers = number_list<int>("--layers", cf.layers);
    return eagle::detail::check_layer_ids(*layers, L, "--layers", "");
  }
  eagle::DraftConfig draft;
  SPECDEC_RETURN_IF_ERROR(eagle::read_draft_config(cf.draft_path, L, &draft));
  if (!draft.eagle3()) {
    return Status::InvalidArgument(
        "--speculative-draft-model-path " + cf.draft_path + " is an " + draft.kind_name() +
        " draft (" + draft.architecture + "), which reads no aux layer set: capture feeds "
        "EAGLE-3 drafts (name the layers with --layers)");
  }
  *layers = draft.layers;
  std::fprintf(stderr, "specdec-kimi: capture layers %s from %s%s\n",
               specdec::format_layers(*layers).c_str(), draft.source.c_str(),
               draft.layers_from_file ? "" : " (eagle_aux_hidden_state_layer_ids absent: default)");
  return Status::Ok();
}

// The seconds of a capture's phases.
struct CaptureTimes {
  double generate_s = 0.0, forward_s = 0.0;
  int64_t new_tokens = 0;
};

// The capture on one target (--tp-size 1), `batch` prompts at a time: SpecEngine<NONE> decodes
// the batch's continuations (one session; a request's Philox stream is its line, so a sampled
// continuation is the same whatever --batch and --shard), then capture_batch runs the target's
// prefill over the batch's whole sequences.
template <class Exec>
Status capture_on(GenerateFlags const& g, CaptureFlags const& cf, auto* target,
                  std::vector<specdec::model::kimi::CapturePrompt> const& prompts,
                  specdec::model::kimi::CaptureRows* rows, CaptureTimes* times) {
  namespace kimi = specdec::model::kimi;
  namespace se = specdec::engine;
  using Engine = se::SpecEngine<specdec::KimiK25NoDraft<ServedGraph>, Exec>;
  using Clock = std::chrono::steady_clock;
  EngineExecutor<Exec> exec;
  SPECDEC_RETURN_IF_ERROR(exec.create());
#if defined(__CUDACC__)
  if constexpr (std::is_same_v<Exec, specdec::CudaExecutor>) {
    target->graphs.set_capacity(kCudaGraphShapes);
  }
#endif
  se::EngineOptions eo;
  eo.page_size = g.o.page_size;
  Engine engine;
  SPECDEC_RETURN_IF_ERROR(Engine::create(target, nullptr, eo, &engine, exec.exec));
  kimi::CaptureOptions co;
  co.page_size = g.o.page_size;
  size_t const batch = static_cast<size_t>(cf.batch);
  auto last_line = Clock::now();  // of progress on stderr: one every 10 s, and the last
  for (size_t first = 0; first < prompts.size(); first += batch) {
    size_t const n = std::min(batch, prompts.size() - first);
    auto const t0 = Clock::now();
    std::vector<se::GenerationRequest> requests(n);
    std::vector<kimi::CaptureSequence> seqs(n);
    se::SessionOptions so;
    so.max_running = static_cast<int>(n);
    for (size_t i = 0; i < n; ++i) {
      kimi::CapturePrompt const& p = prompts[first + i];
      se::GenerationRequest& r = requests[i];
      r.prompt = p.ids;
      r.max_new_tokens = g.o.max_new_tokens;
      r.temperature = g.o.temperature;
      r.seed = g.o.seed;
      int64_t const tokens = static_cast<int64_t>(p.ids.size()) + r.max_new_tokens;
      so.num_pages += engine.pages_for(tokens);
      so.max_request_tokens = std::max(so.max_request_tokens, tokens);
      so.max_prefill_tokens += static_cast<int64_t>(p.ids.size());  // every prompt in one step
      seqs[i].line = p.line;
      seqs[i].tokens = p.ids;
      seqs[i].prompt_length = static_cast<int32_t>(p.ids.size());
    }
    typename Engine::Session session(engine);
    SPECDEC_RETURN_IF_ERROR(session.open(so));
    for (size_t i = 0; i < n; ++i) {
      std::string const who = "line " + std::to_string(prompts[first + i].line + 1) + ": ";
      SPECDEC_RETURN_IF_ERROR(session
                                  .admit(static_cast<kimi::RequestId>(i), requests[i],
                                         static_cast<uint32_t>(prompts[first + i].line))
                                  .prefixed(who));
    }
    std::vector<se::StepEvent> events;
    while (!session.idle()) {
      SPECDEC_RETURN_IF_ERROR(session.step(&events));
      for (se::StepEvent const& ev : events) {
        std::vector<int32_t>& t = seqs[static_cast<size_t>(ev.id)].tokens;
        t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
        times->new_tokens += static_cast<int64_t>(ev.tokens.size());
      }
    }
    auto const t1 = Clock::now();
    SPECDEC_RETURN_IF_ERROR(kimi::capture_batch(exec.exec, *target, seqs, co, rows));
    auto const t2 = Clock::now();
    times->generate_s += std::chrono::duration<double>(t1 - t0).count();
    times->forward_s += std::chrono::duration<double>(t2 - t1).count();
    if (t2 - last_line >= std::chrono::seconds(10) || first + n == prompts.size()) {
      last_line = t2;
      std::fprintf(stderr, "specdec-kimi: capture: %zu / %zu sequences, %lld tokens\n",
                   first + n, prompts.size(), static_cast<long long>(rows->tokens()));
    }
  }
  return Status::Ok();
}

int capture(int argc, char** argv) {
  GenerateFlags g;
  CaptureFlags cf;
  bool have_max = false;
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--model-path")) g.path = f.value();
    else if (f.is("--prompts")) cf.prompts = f.value();
    else if (f.is("--out")) cf.out = f.value();
    else if (f.is("--layers")) cf.layers = f.value();
    else if (f.is("--speculative-draft-model-path")) cf.draft_path = f.value();
    else if (f.is("--max-new-tokens")) g.o.max_new_tokens = f.number<int>(), have_max = true;
    else if (f.is("--topk")) cf.topk = f.number<int>();
    else if (f.is("--temperature")) g.o.temperature = f.number<float>();
    else if (f.is("--seed")) g.o.seed = f.number<uint64_t>();
    else if (f.is("--device")) g.device = f.value();
    else if (f.is("--shard")) cf.shard = parse_shard(f.value());
    else if (f.is("--batch")) cf.batch = f.number<int>();
    else if (f.is("--random-weights")) g.random_weights = f.number<uint64_t>();
    else f.unknown();
  }
  if (g.path.empty()) fail_usage("capture needs --model-path DIR");
  if (cf.prompts.empty()) fail_usage("capture needs --prompts FILE.jsonl");
  if (cf.out.empty()) fail_usage("capture needs --out FILE.safetensors");
  if (!have_max) fail_usage("capture needs --max-new-tokens N");
  if (cf.layers.empty() == cf.draft_path.empty()) {
    fail_usage(std::string("capture needs exactly one of --layers (e.g. 0,1,2) and "
                           "--speculative-draft-model-path DIR (its EAGLE-3 layer set); got ") +
               (cf.layers.empty() ? "neither" : "both"));
  }
  if (g.o.max_new_tokens < 1 || cf.topk < 1 || cf.batch < 1) {
    fail_usage("--max-new-tokens, --topk and --batch must be >= 1");
  }
  if (!(g.o.temperature >= 0.0f) || std::isinf(g.o.temperature)) {
    fail_usage("--temperature must be a finite number >= 0 (0: greedy)");
  }
  check_common_flags(g);
  Status s = check_device(g);
  if (!s.ok()) return finish(s);
  std::error_code no_file;
  if (std::filesystem::exists(cf.out, no_file)) {
    return finish(Status::InvalidArgument("--out " + cf.out +
                                          " exists: capture never overwrites (remove it, or "
                                          "name another file)"));
  }
  // The layers and every prompt are checked against config.json before any weight is read.
  specdec::io::DeepseekV3Config config;
  s = specdec::io::load_config(g.path, &config);
  if (!s.ok()) return finish(s);
  std::vector<int> layers;
  s = capture_layers(cf, config, &layers);
  if (!s.ok()) return finish(s);
  namespace kimi = specdec::model::kimi;
  kimi::CaptureRows rows;
  s = kimi::CaptureRows::start(config, layers, cf.topk, &rows);
  if (!s.ok()) return finish(s.prefixed("--topk / --layers: "));
  std::vector<kimi::CapturePrompt> prompts;
  s = kimi::read_capture_prompts(cf.prompts, config, g.o.max_new_tokens, cf.shard, &prompts);
  if (!s.ok()) return finish(s);
  std::string const shard_text =
      std::to_string(cf.shard.index) + "/" + std::to_string(cf.shard.count);
  if (prompts.empty()) {
    std::fprintf(stderr, "specdec-kimi: capture: shard %s holds no line of %s: the file has no "
                 "sequence\n", shard_text.c_str(), cf.prompts.c_str());
  }
  LoadedCheckpoint m;
  s = load_target(g, &m);
  if (!s.ok()) return finish(s);
  CaptureTimes times;
  s = for_each_rank(g, m, shard_of(g, specdec::DraftKind::kNone),
                    [&]<class Exec>(int, auto* target) -> Status {
                      return capture_on<Exec>(g, cf, target, prompts, &rows, &times);
                    });
  if (!s.ok()) return finish(s);
  double const seconds = times.generate_s + times.forward_s;
  char temperature[32];
  std::snprintf(temperature, sizeof temperature, "%g", static_cast<double>(g.o.temperature));
  s = kimi::write_capture(cf.out, rows,
                          {{"model_path", g.path},
                           {"temperature", temperature},
                           {"max_new_tokens", std::to_string(g.o.max_new_tokens)},
                           {"seed", std::to_string(g.o.seed)},
                           {"device", g.device},
                           {"shard", shard_text},
                           {"prompts", cf.prompts}});
  if (!s.ok()) return finish(s.prefixed("--out: "));
  int64_t const tokens = rows.tokens();
  nlohmann::json const j = {{"out", cf.out},
                            {"sequences", rows.sequences()},
                            {"tokens", tokens},
                            {"new_tokens", times.new_tokens},
                            {"layers", layers},
                            {"shard", shard_text},
                            {"device", g.device},
                            {"seconds", seconds},
                            {"tokens_per_s", seconds > 0 ? tokens / seconds : 0.0},
                            {"generate_seconds", times.generate_s},
                            {"forward_seconds", times.forward_s}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// The bench flags beyond the model, device and speculation ones GenerateFlags holds.
struct BenchFlags {
  std::string prompts;  // --prompts FILE.jsonl (the demo's eval_prompts.jsonl without a model)
  std::string json;     // --json FILE
  int count = 16;       // --count: the file's first N lines
  std::vector<int> batches{1};  // --batch B or B1,B2,...: requests per generate call
};

// --batch's value: one batch size or several, increasing ("1,4,16").
std::vector<int> parse_batches(std::string const& v) {
  std::vector<int> out = number_list<int>("--batch", v);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] < 1 || (i > 0 && out[i] <= out[i - 1])) {
      fail_usage("--batch " + v + ": batch sizes must be >= 1 and increasing (B, or B1,B2,...)");
    }
  }
  return out;
}

// The first `count` lines of a prompts file, each checked as capture checks a line (a JSON object
// with "input_ids", whole ids in the vocabulary, room for the new tokens; a bad one is an error
// naming its number); a file of fewer lines is an error, never a smaller run.
Status read_bench_prompts(std::string const& path, specdec::io::DeepseekV3Config const& config,
                          int max_new_tokens, int count,
                          std::vector<specdec::model::kimi::CapturePrompt>* prompts) {
  std::string text;
  SPECDEC_RETURN_IF_ERROR(read_file(path, &text).prefixed("--prompts "));
  size_t end = 0;
  int lines = 0;
  while (lines < count && end < text.size()) {
    size_t const newline = text.find('\n', end);
    end = newline == std::string::npos ? text.size() : newline + 1;
    ++lines;
  }
  if (lines < count) {
    return Status::InvalidArgument("--count " + std::to_string(count) + ": --prompts " + path +
                                   " holds " + std::to_string(lines) + " line" +
                                   (lines == 1 ? "" : "s") + " (one prompt a line)");
  }
  return specdec::model::kimi::parse_capture_prompts(std::string_view(text).substr(0, end), path,
                                                     config, max_new_tokens, {}, prompts);
}

// One configuration of bench: SpecEngine<P, Exec> (start_engine: the draft held across the
// configurations, the self-check its warm-up) generates every prompt greedily, exactly
// --max-new-tokens tokens each, `batch` requests per generate call (the last call takes what is
// left); *run gets the merged metrics, the calls' wall time and the outputs. On CUDA one untimed
// call over the first batch goes first, so that the timed calls do not capture its graphs.
template <class P, class Exec>
Status bench_config(GenerateFlags const& g, LoadedCheckpoint const& m,
                    typename specdec::engine::SpecEngine<P, Exec>::TargetModel* target,
                    std::span<specdec::model::kimi::CapturePrompt const> prompts, int batch,
                    HeldDraft<Exec>* draft, specdec::engine::BenchRun* run) {
  namespace se = specdec::engine;
  using Engine = se::SpecEngine<P, Exec>;
  EngineExecutor<Exec> exec;
  SPECDEC_RETURN_IF_ERROR(exec.create());
  Engine engine;
  SPECDEC_RETURN_IF_ERROR((start_engine<P, Exec>(g, m, target, true, draft, exec.exec, &engine)));
  std::vector<se::GenerationRequest> requests;
  auto batch_from = [&](size_t first) {
    size_t const n = std::min(static_cast<size_t>(batch), prompts.size() - first);
    requests.assign(n, se::GenerationRequest{});
    for (size_t i = 0; i < n; ++i) {
      requests[i].prompt = prompts[first + i].ids;
      requests[i].max_new_tokens = g.o.max_new_tokens;
      requests[i].stop_at_eos = false;  // temperature 0: greedy
    }
  };
  std::vector<se::GenerationResult> out;
  se::SpecMetrics metrics;
#if defined(__CUDACC__)
  if constexpr (std::is_same_v<Exec, specdec::CudaExecutor>) {
    batch_from(0);
    SPECDEC_RETURN_IF_ERROR(engine.generate(requests, &out, &metrics));
  }
#endif
  *run = se::BenchRun{};
  run->config = g.spec;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(batch)) {
    batch_from(first);
    auto const t0 = std::chrono::steady_clock::now();
    SPECDEC_RETURN_IF_ERROR(engine.generate(requests, &out, &metrics));
    run->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    run->metrics.merge(metrics);
    for (se::GenerationResult& r : out) {
      int64_t const n = static_cast<int64_t>(r.output_ids.size());
      run->output_tokens += n;
      run->decode_tokens += std::max<int64_t>(n - 1, 0);
      run->outputs.push_back(std::move(r.output_ids));
    }
  }
  return Status::Ok();
}

// Every configuration of bench on one target (--tp-size 1), in order, each a BenchRun.
template <class Exec>
Status bench_on(GenerateFlags const& g, LoadedCheckpoint const& m, auto* target,
                std::vector<specdec::SpecConfig> const& configs,
                std::span<specdec::model::kimi::CapturePrompt const> prompts, int batch,
                std::vector<specdec::engine::BenchRun>* runs) {
  HeldDraft<Exec> draft;  // loaded once for the configurations' (one) layer set
  for (specdec::SpecConfig const& c : configs) {
    GenerateFlags gc = g;
    gc.spec = c;
    if (c.algorithm == "NONE") gc.draft_path.clear();  // (its configuration line names none)
    specdec::engine::BenchRun run;
    SPECDEC_RETURN_IF_ERROR(specdec::dispatch<ServedPolicies>(c, [&]<class P>() -> Status {
      return bench_config<P, Exec>(gc, m, target, prompts, batch, &draft, &run);
    }));
    specdec::engine::SpecMetrics const& r = run.metrics;
    double const steps_s = r.draft_s + r.build_s + r.verify_s + r.commit_s + r.extend_s;
    std::fprintf(stderr,
                 "specdec-kimi: bench: %s: %lld tokens in %.3f s, decode %.1f tokens/s, accept "
                 "length %.3f\n",
                 specdec::engine::bench_name(c).c_str(), static_cast<long long>(run.output_tokens),
                 run.seconds, steps_s > 0 ? static_cast<double>(run.decode_tokens) / steps_s : 0.0,
                 r.accept_length());
    runs->push_back(std::move(run));
  }
  return Status::Ok();
}

int bench(int argc, char** argv) {
  GenerateFlags g;
  BenchFlags bf;
  g.o.max_new_tokens = 96;
  g.o.stop_at_eos = false;  // every request generates exactly --max-new-tokens
  for (Flags f(argc, argv); f.next();) {
    if (common_flag(f, g)) continue;
    if (f.is("--prompts")) bf.prompts = f.value();
    else if (f.is("--count")) bf.count = f.number<int>();
    else if (f.is("--max-new-tokens")) g.o.max_new_tokens = f.number<int>();
    else if (f.is("--batch")) bf.batches = parse_batches(f.value());
    else if (f.is("--json")) bf.json = f.value();
    else f.unknown();
  }
  int const tree_flags = int{g.have_steps} + int{g.have_topk} + int{g.have_nodes};
  if (tree_flags == 1 || tree_flags == 2) {
    fail_usage("bench takes all three of --speculative-num-steps, --speculative-eagle-topk and "
               "--speculative-num-draft-tokens (that configuration against plain decoding) or "
               "none (every compiled tree of the algorithm)");
  }
  g.sweep = tree_flags == 0;
  if (g.path.empty()) {
    use_embedded_demo(g, argv[0], "bench");
    if (bf.prompts.empty()) {
      bf.prompts = (std::filesystem::path(g.path).parent_path() / "eval_prompts.jsonl").string();
    }
  }
  if (bf.prompts.empty()) {
    fail_usage("bench --model-path needs --prompts FILE.jsonl (one {\"input_ids\": [...]} a line)");
  }
  if (bf.count < 1 || g.o.max_new_tokens < 2) {
    fail_usage("--count must be >= 1 and --max-new-tokens >= 2 (a speculative step to time)");
  }
  if (bf.batches.back() > bf.count) {
    fail_usage("--batch " + std::to_string(bf.batches.back()) + " > --count " +
               std::to_string(bf.count) +
               ": a batch of B requests needs B prompts");
  }
  check_common_flags(g);
  if (!bf.json.empty()) {  // before the run, which takes a while
    std::filesystem::path const dir = std::filesystem::path(bf.json).parent_path();
    std::error_code no_dir;
    if (!dir.empty() && !std::filesystem::is_directory(dir, no_dir)) {
      return finish(Status::InvalidArgument("--json " + bf.json + ": no directory " +
                                            dir.string()));
    }
  }
  if (g.spec.algorithm == "NONE") {
    std::string const draft_given =
        g.draft_path.empty() ? ""
                             : " (--speculative-draft-model-path was given: name EAGLE3 or "
                               "EAGLE for it; NONE is the default)";
    return finish(Status::InvalidArgument(
        "bench measures speculation against plain decoding: with --speculative-algorithm NONE "
        "alone there is nothing to compare (name EAGLE3, EAGLE or NGRAM)" + draft_given));
  }
  if (g.tp_size != 1) {
    return finish(Status::InvalidArgument(
        "bench runs at --tp-size 1 (it compares configurations on one target; --tp-size " +
        std::to_string(g.tp_size) + " is generate's and serve's)"));
  }
  Status s = check_device(g);
  if (!s.ok()) return finish(s);
  specdec::io::DeepseekV3Config target_config;
  s = specdec::io::load_config(g.path, &target_config);
  if (!s.ok()) return finish(s);
  specdec::DraftKind kind{};
  s = check_speculation(target_config, &g, &kind);
  if (!s.ok()) return finish(s);
  std::vector<specdec::model::kimi::CapturePrompt> prompts;
  s = read_bench_prompts(bf.prompts, target_config, g.o.max_new_tokens, bf.count, &prompts);
  if (!s.ok()) return finish(s);
  // Plain decoding first (the baseline), then the sweep (by topk, steps, draft tokens) or the one
  // configuration of the flags.
  std::vector<specdec::SpecConfig> configs = auto_candidates(g.spec);
  if (!g.sweep) configs = {configs.front(), g.spec};
  std::stable_sort(configs.begin() + 1, configs.end(), [](auto const& a, auto const& b) {
    return std::tie(a.eagle_topk, a.num_steps, a.num_draft_tokens) <
           std::tie(b.eagle_topk, b.num_steps, b.num_draft_tokens);
  });
  LoadedCheckpoint m;
  s = load_target(g, &m);
  if (!s.ok()) return finish(s);
  std::vector<specdec::engine::BenchReport> reports;
  for (int batch : bf.batches) {
    std::vector<specdec::engine::BenchRun> runs;
    s = for_each_rank(g, m, shard_of(g, kind), [&]<class Exec>(int, auto* target) -> Status {
      return bench_on<Exec>(g, m, target, configs, prompts, batch, &runs);
    });
    if (!s.ok()) return finish(s);
    specdec::engine::BenchSetup setup;
    setup.model_path = g.path;
    setup.draft_path = g.draft_path;
    setup.prompts_file = bf.prompts;
    setup.device = g.device;
    setup.batch = batch;
    setup.prompts = bf.count;
    setup.max_new_tokens = g.o.max_new_tokens;
    specdec::engine::BenchReport& report = reports.emplace_back();
    s = specdec::engine::summarize_bench(setup, runs, &report);
    if (!s.ok()) return finish(s);
    auto const& choice = report.rows[static_cast<size_t>(report.choice)];
    auto const& best = report.rows[static_cast<size_t>(report.measured_best)];
    if (report.speculating) {
      std::fprintf(stderr, "specdec-kimi: advisor at batch %d: %s\n", batch,
                   report.summary.c_str());
    } else {
      std::fprintf(stderr, "specdec-kimi: drafting does not pay at batch %d: %s\n", batch,
                   report.summary.c_str());
    }
    std::printf("%s\nadvisor at batch %d: %s (predicted %.1f, measured %.1f decode tokens/s%s); "
                "measured best: %s (%.1f); the choice measured %.3f of the best (%s 5%%)\n",
                specdec::engine::bench_table(report).c_str(), batch, choice.name.c_str(),
                choice.predicted_decode_tokens_per_s, choice.decode_tokens_per_s,
                report.speculating ? "" : ": drafting does not pay", best.name.c_str(),
                best.decode_tokens_per_s, report.choice_vs_best,
                report.choice_within_5_percent ? "within" : "not within");
  }
  // Several batch sizes: the drafting depth of the smallest batch's choice at each of them.
  nlohmann::json out_json;
  if (reports.size() == 1) {
    out_json = specdec::engine::bench_json(reports[0]);
  } else {
    specdec::engine::BenchPlan plan;
    s = specdec::engine::plan_bench(reports, &plan);
    if (!s.ok()) return finish(s);
    std::printf("%s\n", plan.summary.c_str());
    out_json["batches"] = nlohmann::json::array();
    for (auto const& r : reports) out_json["batches"].push_back(specdec::engine::bench_json(r));
    out_json["draft_steps_plan"] = specdec::engine::bench_plan_json(plan);
  }
  if (!bf.json.empty()) {
    std::ofstream out(bf.json, std::ios::binary | std::ios::trunc);
    out << out_json.dump(2) << "\n";
    out.close();
    if (!out) return finish(Status::InvalidArgument("--json " + bf.json + ": cannot write"));
  }
  // Greedy speculation is lossless: token for token on the CPU; on CUDA a near-tie may round
  // differently in a verify of N rows (spec_engine.hpp), so a difference is reported, not failed.
  std::string differing;
  for (specdec::engine::BenchReport const& report : reports) {
    for (specdec::engine::BenchRow const& row : report.rows) {
      if (row.prompts_differing == 0) continue;
      differing += (differing.empty() ? "" : ", ") + row.name + " at batch " +
                   std::to_string(report.setup.batch) + " on " +
                   std::to_string(row.prompts_differing) + " of " + std::to_string(bf.count) +
                   " prompts";
    }
  }
  if (differing.empty()) return 0;
  if (g.device == "cuda") {
    std::fprintf(stderr,
                 "specdec-kimi: bench: output differs from plain decoding (%s): near-ties of the "
                 "bf16 verify forward, see same_tokens_as_plain\n",
                 differing.c_str());
    return 0;
  }
  return finish(Status::Internal("greedy speculation must equal plain decoding token for token "
                                 "on the CPU; it differs: " + differing));
}

// The serve flags beyond generate's shared ones.
struct ServeFlags {
  int max_running = 16;                // --max-running-requests
  int64_t max_total_tokens = 65536;    // --max-total-tokens: the target KV pool, in tokens
  int64_t context_length = 0;          // --context-length: 0 = the model's, within the pool
  int64_t chunked_prefill_size = 512;  // --chunked-prefill-size
  int max_queued = 4096;               // --max-queued-requests
  int decode_log_interval = 40;        // --decode-log-interval
  std::string served_model_name;       // --served-model-name (default: --model-path)
#if defined(SPECDEC_HAVE_SERVER)
  specdec::kimi_server::ServerOptions server;
#endif
};

#if defined(SPECDEC_HAVE_SERVER)
// The session every rank opens: the flags' batch, pool, context and prefill chunk.
specdec::engine::SessionOptions session_options(GenerateFlags const& g, ServeFlags const& sf) {
  specdec::engine::SessionOptions o;
  o.max_running = sf.max_running;
  o.num_pages = static_cast<int>(specdec::ceil_div<int64_t>(sf.max_total_tokens, g.o.page_size));
  o.max_request_tokens = sf.context_length;
  o.max_prefill_tokens = sf.chunked_prefill_size;
  return o;
}

// One rank of the server: SpecEngine<P, Exec> over its shard. Rank 0 runs the Scheduler (its
// session's admits, cancels and steps replayed on the others through `lockstep` when there are
// several ranks) behind the HTTP server until a signal stops it; every other rank follows.
template <class P, class Exec>
Status serve_rank(GenerateFlags const& g, ServeFlags const& sf, LoadedCheckpoint const& m,
                  typename specdec::engine::SpecEngine<P, Exec>::TargetModel* target,
                  specdec::io::Tokenizer const& tokenizer, int rank,
                  specdec::engine::LockstepChannel* lockstep) {
  using Engine = specdec::engine::SpecEngine<P, Exec>;
  HeldDraft<Exec> draft;
  EngineExecutor<Exec> exec;
  SPECDEC_RETURN_IF_ERROR(exec.create());
  Engine engine;
  bool const leader = rank == 0;
  SPECDEC_RETURN_IF_ERROR(
      (start_engine<P, Exec>(g, m, target, leader, &draft, exec.exec, &engine)));
  specdec::engine::SessionOptions const so = session_options(g, sf);
  if (!leader) {
    typename Engine::Session session(engine);
    SPECDEC_RETURN_IF_ERROR(session.open(so));
    specdec::engine::follow_lockstep(*lockstep, rank, &session);
    return Status::Ok();
  }
  specdec::engine::SchedulerOptions o;
  o.session = so;
  o.max_queued = sf.max_queued;
  o.decode_log_interval = sf.decode_log_interval;
#if defined(__CUDACC__)
  if constexpr (std::is_same_v<Exec, specdec::CudaExecutor>) {
    int device = 0;  // the scheduler's thread runs the engine on this rank's GPU
    SPECDEC_CUDA_TRY(cudaGetDevice(&device));
    o.on_worker_start = [device] { cudaSetDevice(device); };
  }
#endif
  specdec::engine::ServingInfo info;
  info.model_name = sf.served_model_name;
  info.model_path = g.path;
  info.speculative_config = specdec::describe<P>() +
                            (g.draft_path.empty() ? "" : " draft=" + g.draft_path) +
                            " tp=" + std::to_string(g.tp_size);
  info.speculative_algorithm = g.spec.algorithm;
  info.speculative_num_steps = P::kSteps;
  info.speculative_eagle_topk = P::kTopK;
  info.speculative_num_draft_tokens = P::kNodes;
  info.device = g.device;
#if defined(__CUDACC__)
  info.cuda_graph = std::is_same_v<Exec, specdec::CudaExecutor> && g.cuda_graph;
  if constexpr (std::is_same_v<Exec, specdec::CudaExecutor>) {
    info.cuda_graph_bs.assign(P::Graph::batch_sizes().begin(), P::Graph::batch_sizes().end());
  }
#endif
  info.context_length = sf.context_length;
  info.vocab_size = m.config.vocab_size;
  for (int64_t id : m.config.eos_token_ids) info.eos_ids.push_back(static_cast<int32_t>(id));
  std::unique_ptr<specdec::engine::Scheduler<Engine>> scheduler;
  SPECDEC_RETURN_IF_ERROR(specdec::engine::Scheduler<Engine>::create(
      &engine, o, info, &scheduler, g.tp_size > 1 ? lockstep : nullptr));
  std::fprintf(stderr,
               "specdec-kimi: scheduler: max running %d, KV pool %lld tokens (%d pages of %d), "
               "context %lld, chunked prefill %lld, queue %d, tp %d\n",
               sf.max_running, static_cast<long long>(sf.max_total_tokens), so.num_pages,
               g.o.page_size, static_cast<long long>(sf.context_length),
               static_cast<long long>(sf.chunked_prefill_size), sf.max_queued, g.tp_size);
  Status const s = specdec::kimi_server::run_server(sf.server, *scheduler, tokenizer);
  scheduler->shutdown(/*cancel_running=*/true);  // before the followers stop
  return s;
}
#endif

int serve(int argc, char** argv) {
  GenerateFlags g;
  ServeFlags sf;
  std::string host = "127.0.0.1", api_key;
  int port = 30000, default_max_tokens = 128;
  for (Flags f(argc, argv); f.next();) {
    if (common_flag(f, g)) continue;
    if (f.is("--speculative-config")) {
      fail_usage("--speculative-config auto is generate's (it calibrates on the request); serve "
                 "takes --speculative-num-steps, --speculative-eagle-topk and "
                 "--speculative-num-draft-tokens");
    }
    if (f.is("--host")) host = f.value();
    else if (f.is("--port")) port = f.number<int>();
    else if (f.is("--api-key")) api_key = f.value();
    else if (f.is("--served-model-name")) sf.served_model_name = f.value();
    else if (f.is("--max-running-requests")) sf.max_running = f.number<int>();
    else if (f.is("--max-total-tokens")) sf.max_total_tokens = f.number<int64_t>();
    else if (f.is("--context-length")) sf.context_length = f.number<int64_t>();
    else if (f.is("--chunked-prefill-size")) sf.chunked_prefill_size = f.number<int64_t>();
    else if (f.is("--max-queued-requests")) sf.max_queued = f.number<int>();
    else if (f.is("--decode-log-interval")) sf.decode_log_interval = f.number<int>();
    else if (f.is("--default-max-tokens")) default_max_tokens = f.number<int>();
    else f.unknown();
  }
  if (g.path.empty()) use_embedded_demo(g, argv[0], "serve");
  check_common_flags(g);
  if (port < 0 || port > 65535) fail_usage("--port " + std::to_string(port) + ": use 0..65535");
  auto const at_least = [](char const* flag, int64_t value, int64_t least, char const* why) {
    if (value < least) {
      fail_usage(std::string(flag) + " " + std::to_string(value) + ": must be >= " +
                 std::to_string(least) + why);
    }
  };
  at_least("--max-running-requests", sf.max_running, 1, "");
  at_least("--max-total-tokens", sf.max_total_tokens, 1, "");
  at_least("--chunked-prefill-size", sf.chunked_prefill_size, 1, "");
  at_least("--default-max-tokens", default_max_tokens, 1, "");
  at_least("--max-queued-requests", sf.max_queued, 1,
           " (with no room to wait every request would be refused)");
  at_least("--context-length", sf.context_length, 0, " (0: the model's)");
  at_least("--decode-log-interval", sf.decode_log_interval, 0, " (0: no decode log)");
  int64_t const pages =
      g.o.page_size >= 1 ? specdec::ceil_div<int64_t>(sf.max_total_tokens, g.o.page_size) : 0;
  if (g.o.page_size >= 1 && sf.max_total_tokens % g.o.page_size != 0) {
    int64_t const down = (pages - 1) * g.o.page_size, up = pages * g.o.page_size;
    fail_usage("--max-total-tokens " + std::to_string(sf.max_total_tokens) +
               " is not a whole number of --page-size " + std::to_string(g.o.page_size) +
               " pages (the pool holds whole pages): give " +
               (down > 0 ? std::to_string(down) + " or " : std::string()) + std::to_string(up));
  }
  if (pages > std::numeric_limits<int>::max()) {
    fail_usage("--max-total-tokens " + std::to_string(sf.max_total_tokens) + " is " +
               std::to_string(pages) + " pages of " + std::to_string(g.o.page_size) +
               " tokens, past the pool's limit of " +
               std::to_string(std::numeric_limits<int>::max()) + " pages");
  }
#if !defined(SPECDEC_HAVE_SERVER)
  (void)host, (void)api_key, (void)default_max_tokens;
  return finish(Status::Unsupported(
      "serve: this specdec-kimi was built without its HTTP server, which needs cpp-httplib "
      "(apt: libcpp-httplib-dev) and PCRE2 for the tokenizer (apt: libpcre2-dev); "
      "scripts/setup.sh installs both, then rebuild"));
#else
  if (g.nnodes != 1) {
    return finish(Status::Unsupported(
        "serve runs its tensor-parallel ranks in one process: --nnodes " +
        std::to_string(g.nnodes) + " is for generate (use --tp-size N over this host's GPUs)"));
  }
  Status s = check_device(g);
  if (!s.ok()) return finish(s);
  specdec::io::DeepseekV3Config target_config;
  s = specdec::io::load_config(g.path, &target_config);
  if (!s.ok()) return finish(s);
  std::string const tokenizer_dir = g.tokenizer_dir.empty() ? g.path : g.tokenizer_dir;
  specdec::io::Tokenizer tokenizer;
  s = specdec::io::Tokenizer::load(tokenizer_dir, &tokenizer);
  if (!s.ok()) return finish(s.prefixed("tokenizer (--tokenizer DIR, default --model-path): "));
  s = check_tokenizer_fits(tokenizer, tokenizer_dir, target_config);
  if (!s.ok()) return finish(s);
  // A request holds prompt + new tokens + the tree's positions past them (at most
  // num_draft_tokens): the context is the model's less those, within the KV pool, unless
  // --context-length gives a smaller one; a larger one is an error, never trimmed.
  int64_t const margin = std::max(g.spec.num_draft_tokens, 1);
  int64_t const model_context = target_config.max_position_embeddings - margin;
  int64_t const pool_context = sf.max_total_tokens - margin;
  if (sf.context_length > model_context) {
    return finish(Status::InvalidArgument(
        "--context-length " + std::to_string(sf.context_length) + " + " + std::to_string(margin) +
        " speculative positions exceed the model's max_position_embeddings " +
        std::to_string(target_config.max_position_embeddings)));
  }
  if (sf.context_length > pool_context) {
    return finish(Status::InvalidArgument(
        "--context-length " + std::to_string(sf.context_length) + " + " + std::to_string(margin) +
        " speculative positions exceed --max-total-tokens " + std::to_string(sf.max_total_tokens) +
        " (the KV pool): one request could never fit"));
  }
  if (sf.context_length == 0) sf.context_length = std::min(model_context, pool_context);
  if (sf.context_length < 2) {
    return finish(Status::InvalidArgument("the context (" + std::to_string(sf.context_length) +
                                          " tokens) has no room for a prompt and a token"));
  }
  if (sf.served_model_name.empty()) sf.served_model_name = g.path;
  sf.server.host = host;
  sf.server.port = port;
  sf.server.api_key = api_key;
  sf.server.default_max_tokens = default_max_tokens;
  specdec::DraftKind kind{};
  s = check_speculation(target_config, &g, &kind);
  if (!s.ok()) return finish(s);
  LoadedCheckpoint m;
  s = load_target(g, &m);
  if (!s.ok()) return finish(s);
  // Every rank: its shard of the target (all of it at --tp-size 1), then serve_rank; rank 0 stops
  // the followers however it ends.
  specdec::dist::TpShard const shard = shard_of(g, kind);
  specdec::engine::LockstepChannel lockstep(g.tp_size);
  // (An idle server's ranks wait in the lockstep channel, not in a collective, so the
  // collectives' timeout holds.)
  s = for_each_rank(g, m, shard, [&]<class Exec>(int rank, auto* target) -> Status {
    specdec::engine::LockstepLeaderScope const stop(lockstep, rank == 0);
    return specdec::dispatch<ServedPolicies>(g.spec, [&]<class P>() -> Status {
      return serve_rank<P, Exec>(g, sf, m, target, tokenizer, rank, &lockstep);
    });
  });
  return finish(s);
#endif
}

int dequantize(int argc, char** argv) {
  std::string path, out;
  for (Flags f(argc, argv); f.next();) {
    if (f.is("--model-path")) path = f.value();
    else if (f.is("--out")) out = f.value();
    else f.unknown();
  }
  if (path.empty()) fail_usage("dequantize needs --model-path DIR");
  if (out.empty()) fail_usage("dequantize needs --out DIR2");
  Status const s = specdec::model::kimi::write_dequantized_copy(path, out);
  if (s.ok()) std::printf("wrote the float32-expert copy of %s to %s\n", path.c_str(), out.c_str());
  return finish(s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fail_usage("missing command (init-random, inspect, generate, capture, bench, serve, tokenize, "
               "dequantize)");
  }
  std::string const cmd = argv[1];
  if (cmd == "--help" || cmd == "-h") {
    usage(stdout);
    return 0;
  }
  try {
    if (cmd == "init-random") return init_random(argc, argv);
    if (cmd == "inspect") return inspect(argc, argv);
    if (cmd == "dequantize") return dequantize(argc, argv);
    if (cmd == "generate") return generate(argc, argv);
    if (cmd == "capture") return capture(argc, argv);
    if (cmd == "bench") return bench(argc, argv);
    if (cmd == "serve") return serve(argc, argv);
    if (cmd == "tokenize") return tokenize(argc, argv);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  fail_usage("unknown command '" + cmd +
             "' (init-random, inspect, generate, capture, bench, serve, tokenize, dequantize)");
}
