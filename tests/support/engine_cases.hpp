// Test support for the speculative engine on the tiny preset: the policies the engine tests
// instantiate (EAGLE-3 over the tiny target's layers [0, 1, 2], EAGLE-1/2, n-gram, plain) and the
// requests they run (a batch of three of different lengths and budgets; one greedy request), the
// random draft they load, the CPU executor's last logits row (the exact distributions and
// near-ties) and the three-token distribution check any executor's engine must pass
// (check_three_token_distribution: chi-square against the exact top-k joint distribution).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "specdec/engine/spec_engine.hpp"
#include "specdec/model/eagle/random_checkpoint.hpp"
#include "specdec/policy/spec_policy.hpp"
#include "support/chi_square.hpp"
#include "support/kimi_model.hpp"
#include "support/testing.hpp"

namespace specdec::testing {

using TinyLayers = Layers<0, 1, 2>;
template <class Tree>
using E3 = SpecPolicy<Eagle3, TinyLayers, Tree, Eager>;
template <class Tree>
using EG = SpecPolicy<Eagle, Layers<>, Tree, Eager>;
template <class Tree>
using NG = SpecPolicy<NGram, Layers<>, Tree, Eager>;
using Plain = SpecPolicy<NoDraft, Layers<>, NoTree, Eager>;

// Writes a random draft of the tiny target into `dir` (seed 5): EAGLE-3 over TinyLayers, or
// EAGLE-1/2 (kind kEagle). Returns the layer set it reads (the policy's).
inline std::span<int const> write_tiny_draft(std::filesystem::path const& dir,
                                             io::DeepseekV3Config const& target, DraftKind kind) {
  bool const eagle3 = kind == DraftKind::kEagle3;
  std::span<int const> const layers = eagle3 ? TinyLayers::ids() : std::span<int const>{};
  Status const s = model::eagle::write_random_draft(
      dir.string(), target, layers, /*seed=*/5, {},
      eagle3 ? model::eagle::kEagle3Architecture : model::eagle::kEagleArchitecture);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return layers;
}

// write_tiny_draft, loaded on the CPU over `target`'s tensors.
inline void load_tiny_draft(std::filesystem::path const& dir,
                            model::kimi::KimiCpuModel const& target,
                            model::eagle::DraftCpuModel* out, DraftKind kind = DraftKind::kEagle3) {
  std::span<int const> const layers = write_tiny_draft(dir, target.config, kind);
  Status const s = model::eagle::load_draft_cpu_model(dir.string(), target.config,
                                                      model::eagle::target_tensors_of(target), kind,
                                                      layers, "the test policy", out);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

// The tiny target (int4 off, seed 11) and its random drafts, written and loaded once per test
// binary (tiny_engine_models()).
struct TinyEngineModels {
  TempDir tmp;
  TinyKimi tiny;
  model::kimi::KimiCpuModel target;
  model::eagle::DraftCpuModel draft;   // EAGLE-3 over TinyLayers
  model::eagle::DraftCpuModel draft1;  // EAGLE-1/2
};

inline TinyEngineModels const& tiny_engine_models() {
  static TinyEngineModels m;
  static bool const loaded = [] {
    load_tiny_kimi(m.tmp.path / "target", /*int4=*/false, /*seed=*/11, &m.tiny);
    Status s = model::kimi::load_kimi_cpu_model(m.tiny.weights, m.tiny.config, &m.target);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    load_tiny_draft(m.tmp.path / "draft", m.target, &m.draft);
    load_tiny_draft(m.tmp.path / "draft1", m.target, &m.draft1, DraftKind::kEagle);
    return true;
  }();
  (void)loaded;
  return m;
}

// The tiny draft of P's kind (null for NGRAM / NONE).
template <class P>
model::eagle::DraftCpuModel const* draft_for() {
  if constexpr (P::kKind == DraftKind::kEagle3) return &tiny_engine_models().draft;
  if constexpr (P::kKind == DraftKind::kEagle) return &tiny_engine_models().draft1;
  return nullptr;
}

// `requests` through a fresh SpecEngine<P, Exec> over `target` (and `draft` when P drafts with a
// model); every step must succeed.
template <class P, class Exec>
std::vector<engine::GenerationResult> run_engine(
    typename engine::SpecEngine<P, Exec>::TargetModel* target,
    typename engine::SpecEngine<P, Exec>::DraftModel* draft,
    std::vector<engine::GenerationRequest> const& requests, engine::SpecMetrics* total,
    engine::EngineOptions const& options = {}) {
  engine::SpecEngine<P, Exec> e;
  Status s = engine::SpecEngine<P, Exec>::create(
      target, engine::SpecEngine<P, Exec>::kDraftsWithModel ? draft : nullptr, options, &e);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<engine::GenerationResult> out;
  s = e.generate(requests, &out, total);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  REQUIRE(out.size() == requests.size());
  return out;
}

// Each request generated alone by `e` (a one-request generate each): what a request must get
// however it is batched.
template <class Engine>
std::vector<engine::GenerationResult> each_alone(
    Engine const& e, std::vector<engine::GenerationRequest> const& requests) {
  std::vector<engine::GenerationResult> out;
  for (engine::GenerationRequest const& r : requests) {
    std::vector<engine::GenerationResult> one;
    Status const s = e.generate({&r, 1}, &one, nullptr);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    out.push_back(one[0]);
  }
  return out;
}

// Three requests of different lengths and budgets; the first stops at an eos id when
// `first_stops_at_eos`.
inline std::vector<engine::GenerationRequest> mixed_requests(int vocab, bool first_stops_at_eos) {
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

// The CPU executor's last logits row [V] after `tokens` (a prefill on a fresh cache).
inline std::vector<float> last_logits_cpu(model::kimi::KimiCpuModel const& model,
                                          std::vector<int32_t> const& tokens) {
  model::kimi::MlaCache cache;
  int const pages = static_cast<int>(tokens.size()) / 16 + 1;
  REQUIRE(model::kimi::MlaCache::create_for(model.config, 16, pages, pages, &cache).ok());
  REQUIRE(cache.add_request(0).ok());
  model::kimi::RequestId const id = 0;
  int32_t const count = static_cast<int32_t>(tokens.size());
  std::vector<float> logits;
  Status const s = model::kimi::kimi_prefill(CpuExecutor{}, model, &cache, {&id, 1}, {&count, 1},
                                             tokens, {}, &logits, nullptr);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return std::vector<float>(logits.end() - model.config.vocab_size, logits.end());
}

// want and got agree, or part at a step where `oracle`'s (the fp32 CPU executor's) top-2 logit
// gap is within tol of its largest |logit|: a near-tie that bf16 rounding on the GPU may flip.
inline void check_same_or_near_tie(model::kimi::KimiCpuModel const& oracle, double tol,
                                   std::vector<int32_t> const& prompt,
                                   std::vector<int32_t> const& want,
                                   std::vector<int32_t> const& got) {
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  if (k == want.size() && k == got.size()) return;
  REQUIRE(k < want.size());
  REQUIRE(k < got.size());
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), want.begin(), want.begin() + static_cast<int64_t>(k));
  std::vector<float> row = last_logits_cpu(oracle, context);
  double scale = 0.0;
  for (float v : row) scale = std::max(scale, std::fabs(double(v)));
  std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
  double const gap = double(row[0]) - row[1];
  MESSAGE("parted at step ", k, ": ", want[k], " vs ", got[k], ", cpu top-2 gap ", gap,
          " (max |logit| ", scale, ")");
  CHECK_MESSAGE(gap <= tol * scale, "parting at step ", k, " is not at a near-tie");
}

// A greedy request of n new tokens after prompt, eos ignored.
inline engine::GenerationRequest greedy_request(std::vector<int32_t> prompt, int n) {
  engine::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  r.stop_at_eos = false;
  return r;
}

// The top-k / temperature-1 distribution of a logit row, in double (the definition of
// ops/sample/params.hpp: ties at the k-th largest logit are kept).
inline std::map<int32_t, double> top_k_distribution(float const* row, int64_t V, int k) {
  std::vector<float> sorted(row, row + V);
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<>());
  float const threshold = sorted[static_cast<size_t>(k - 1)];
  double max = -INFINITY, sum = 0.0;
  for (int64_t v = 0; v < V; ++v) max = std::max(max, static_cast<double>(row[v]));
  std::map<int32_t, double> p;
  for (int64_t v = 0; v < V; ++v) {
    if (row[v] >= threshold) sum += p[static_cast<int32_t>(v)] = std::exp(row[v] - max);
  }
  for (auto& [v, w] : p) w /= sum;
  return p;
}

// The first three tokens that SpecEngine<P, Exec> over `target` (and `draft` when P drafts with a
// model) samples for `draws` requests like `base` (seeds 7000 + i, batches of 250) follow the
// exact joint distribution of base's top-k at temperature 1, computed from `oracle`'s logits (the
// CPU executor): chi-square at p-value 1e-4, nothing outside the top-k support; n-gram drafts are
// accepted and every draft proposes.
template <class P, class Exec>
void check_three_token_distribution(model::kimi::KimiCpuModel const& oracle,
                                    typename engine::SpecEngine<P, Exec>::TargetModel* target,
                                    typename engine::SpecEngine<P, Exec>::DraftModel* draft,
                                    engine::GenerationRequest const& base, int draws) {
  CAPTURE(describe<P>());
  int64_t const V = oracle.config.vocab_size;
  auto last_logits = [&](std::vector<int32_t> const& tokens) {
    return last_logits_cpu(oracle, tokens);
  };
  // Exact joint distribution of (x1, x2, x3): x1 from the prefill, x2 and x3 from verifies (a
  // draft accepted at depth 1, then the bonus or a deeper draft, decides x3).
  using Cell = std::vector<int32_t>;
  std::map<Cell, double> exact;
  for (auto const& [x1, p1] : top_k_distribution(last_logits(base.prompt).data(), V, base.top_k)) {
    std::vector<int32_t> c1 = base.prompt;
    c1.push_back(x1);
    for (auto const& [x2, p2] : top_k_distribution(last_logits(c1).data(), V, base.top_k)) {
      std::vector<int32_t> c2 = c1;
      c2.push_back(x2);
      for (auto const& [x3, p3] : top_k_distribution(last_logits(c2).data(), V, base.top_k)) {
        exact[{x1, x2, x3}] = p1 * p2 * p3;
      }
    }
  }
  engine::SpecMetrics total;
  std::map<Cell, int64_t> seen;
  int constexpr kBatch = 250;
  for (int first = 0; first < draws; first += kBatch) {
    std::vector<engine::GenerationRequest> requests(
        static_cast<size_t>(std::min(kBatch, draws - first)), base);
    for (size_t i = 0; i < requests.size(); ++i) requests[i].seed = 7000 + first + i;
    engine::SpecMetrics part;
    auto const out = run_engine<P, Exec>(target, draft, requests, &part);
    total.merge(part);
    for (auto const& r : out) {
      REQUIRE(r.output_ids.size() == 3);
      ++seen[r.output_ids];
    }
  }
  std::vector<int64_t> counts;
  std::vector<double> probs;
  for (auto const& [cell, p] : exact) {
    counts.push_back(seen.count(cell) ? seen.at(cell) : 0);
    probs.push_back(p);
  }
  int64_t outside = draws;
  for (int64_t c : counts) outside -= c;
  CHECK(outside == 0);  // nothing outside the top-k support
  auto const [stat, dof] = chi2(counts, probs);
  double const pv = chi2_pvalue(stat, dof);
  MESSAGE(describe<P>() << ": chi2 " << stat << " dof " << dof << " p-value " << pv
                        << ", accepted drafts " << total.accepted() << " of " << total.proposed());
  CHECK(pv >= 1e-4);
  if constexpr (P::kKind == DraftKind::kNGram) CHECK(total.accepted() > 0);
  if constexpr (P::kKind != DraftKind::kNone) CHECK(total.proposed() > 0);
}

}  // namespace specdec::testing
