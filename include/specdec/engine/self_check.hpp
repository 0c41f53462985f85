// The startup self-check: a few greedy speculative steps on a built-in prompt, and a loud warning
// naming the likely causes when the draft never matched the target (accept length 1.0).
//   SelfCheckReport report;
//   Status s = self_check(engine, vocab_size, &report);   // any engine with generate()
//   if (!report.warning.empty()) print it
// The prompt is a fixed id sequence that repeats (so a working draft, n-gram lookup included, has
// something to match), every id inside [0, vocab). Plain decoding (NONE) never warns.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/engine/metrics.hpp"
#include "specdec/engine/spec_engine.hpp"
#include "specdec/policy/draft.hpp"

namespace specdec::engine {

inline constexpr int kSelfCheckTokens = 16;

struct SelfCheckReport {
  SpecMetrics metrics;
  std::string warning;  // empty when the accept length is above 1.0 (or nothing drafts)
};

// The built-in prompt: 6 distinct ids spread over the vocabulary, three times.
inline std::vector<int32_t> self_check_prompt(int64_t vocab) {
  std::vector<int32_t> prompt;
  for (int rep = 0; rep < 3; ++rep) {
    for (int i = 0; i < 6; ++i) {
      prompt.push_back(static_cast<int32_t>((vocab / 7) * (i + 1) % vocab));
    }
  }
  return prompt;
}

// The warning for a run whose metrics show no accepted draft; "" otherwise.
inline std::string self_check_warning(DraftKind kind, SpecMetrics const& m) {
  if (kind == DraftKind::kNone || m.verify_ct == 0 || m.accept_length() > 1.0) return "";
  std::string w = "WARNING: speculative self-check: accept length " +
                  std::to_string(m.accept_length()) + " over " + std::to_string(m.verify_ct) +
                  " verifies on the built-in prompt: " +
                  (m.proposed() == 0 ? std::string("no draft token was proposed")
                                     : "the target rejected every draft token (" +
                                           std::to_string(m.proposed()) + " proposed)") +
                  ". Speculation only costs time like this. Likely causes: ";
  if (kind == DraftKind::kNGram) {
    return w +
           "the text has no repeated n-grams (normal for some prompts; n-gram drafting pays "
           "off on repetitive text), or the n-gram sizes are too long.";
  }
  return w +
         "the hidden-state layer set or its order differs from training (check "
         "eagle_aux_hidden_state_layer_ids against the target); the algorithm is wrong "
         "(an EAGLE-3 draft run as EAGLE or the reverse); the draft's vocabulary map "
         "(d2t / t2d) belongs to another tokenizer; the draft was trained for another target "
         "(or has random weights). Skip this check with --no-self-check.";
}

template <class Engine>
Status self_check(Engine const& engine, int64_t vocab, SelfCheckReport* out) {
  if (out == nullptr) return Status::InvalidArgument("self_check: out is null");
  GenerationRequest r;
  r.prompt = self_check_prompt(vocab);
  r.max_new_tokens = kSelfCheckTokens;
  r.stop_at_eos = false;
  std::vector<GenerationResult> results;
  SelfCheckReport report;
  SPECDEC_RETURN_IF_ERROR(
      engine.generate(std::span<GenerationRequest const>(&r, 1), &results, &report.metrics)
          .prefixed("self-check: "));
  report.warning = self_check_warning(Engine::kKind, report.metrics);
  *out = std::move(report);
  return Status::Ok();
}

}  // namespace specdec::engine
