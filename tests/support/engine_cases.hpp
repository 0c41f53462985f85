// Test support for the speculative engine on the tiny preset: the policies the
// engine tests instantiate (EAGLE-3 over the tiny target's layers [0, 1, 2],
// EAGLE-1/2, n-gram, plain) and the requests they run (a batch of three of
// different lengths and budgets; one greedy request), the random draft they
// load and the CPU executor's last logits row (the exact distributions and
// near-ties).
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include "specdec/engine/spec_engine.hpp"
#include "specdec/model/eagle/random_checkpoint.hpp"
#include "specdec/policy/spec_policy.hpp"
#include "support/kimi_model.hpp"

namespace specdec::testing {

using TinyLayers = Layers<0, 1, 2>;
template <class Tree> using E3 = SpecPolicy<Eagle3, TinyLayers, Tree, Eager>;
template <class Tree> using EG = SpecPolicy<Eagle, Layers<>, Tree, Eager>;
template <class Tree> using NG = SpecPolicy<NGram, Layers<>, Tree, Eager>;
using Plain = SpecPolicy<NoDraft, Layers<>, NoTree, Eager>;

// Writes a random draft of the tiny target into `dir` (seed 5) and loads it
// over `target`'s tensors: EAGLE-3 over TinyLayers, or EAGLE-1/2 (kind kEagle).
inline void load_tiny_draft(std::filesystem::path const &dir,
                            model::kimi::KimiCpuModel const &target,
                            model::eagle::DraftCpuModel *out,
                            DraftKind kind = DraftKind::kEagle3) {
  bool const eagle3 = kind == DraftKind::kEagle3;
  std::span<int const> const layers =
      eagle3 ? TinyLayers::ids() : std::span<int const>{};
  Status s = model::eagle::write_random_draft(
      dir.string(), target.config, layers, /*seed=*/5, {},
      eagle3 ? model::eagle::kEagle3Architecture
             : model::eagle::kEagleArchitecture);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = model::eagle::load_draft_cpu_model(
      dir.string(), target.config, model::eagle::target_tensors_of(target),
      kind, layers, "the test policy", out);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

// `requests` through a fresh SpecEngine<P, Exec> over `target` (and `draft`
// when P drafts with a model); every step must succeed.
template <class P, class Exec>
std::vector<engine::GenerationResult>
run_engine(typename engine::SpecEngine<P, Exec>::TargetModel *target,
           model::eagle::DraftCpuModel const *draft,
           std::vector<engine::GenerationRequest> const &requests,
           engine::SpecMetrics *total) {
  engine::SpecEngine<P, Exec> e;
  Status s = engine::SpecEngine<P, Exec>::create(
      target, engine::SpecEngine<P, Exec>::kDraftsWithModel ? draft : nullptr,
      {}, &e);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<engine::GenerationResult> out;
  s = e.generate(requests, &out, total);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  REQUIRE(out.size() == requests.size());
  return out;
}

// Three requests of different lengths and budgets; the first stops at an eos id
// when `first_stops_at_eos`.
inline std::vector<engine::GenerationRequest>
mixed_requests(int vocab, bool first_stops_at_eos) {
  std::mt19937 rng(3);
  std::vector<engine::GenerationRequest> r(3);
  r[0].prompt = random_tokens(rng, 3, vocab);
  r[0].max_new_tokens = 21;
  r[0].stop_at_eos = first_stops_at_eos;
  r[1].prompt = {40, 41, 42, 43, 40, 41, 42, 43, 40, 41, 42};
  r[1].max_new_tokens = 13;
  r[1].stop_at_eos = false;
  r[2].prompt = random_tokens(rng, 17, vocab);
  r[2].max_new_tokens = 26;
  r[2].stop_at_eos = false;
  return r;
}

// The CPU executor's last logits row [V] after `tokens` (a prefill on a fresh
// cache).
inline std::vector<float>
last_logits_cpu(model::kimi::KimiCpuModel const &model,
                std::vector<int32_t> const &tokens) {
  model::kimi::MlaCache cache;
  int const pages = static_cast<int>(tokens.size()) / 16 + 1;
  REQUIRE(
      model::kimi::MlaCache::create_for(model.config, 16, pages, pages, &cache)
          .ok());
  REQUIRE(cache.add_request(0).ok());
  model::kimi::RequestId const id = 0;
  int32_t const count = static_cast<int32_t>(tokens.size());
  std::vector<float> logits;
  Status const s =
      model::kimi::kimi_prefill(CpuExecutor{}, model, &cache, {&id, 1},
                                {&count, 1}, tokens, {}, &logits, nullptr);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return std::vector<float>(logits.end() - model.config.vocab_size,
                            logits.end());
}

// A greedy request of n new tokens after prompt, eos ignored.
inline engine::GenerationRequest greedy_request(std::vector<int32_t> prompt,
                                                int n) {
  engine::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  r.stop_at_eos = false;
  return r;
}

} // namespace specdec::testing
