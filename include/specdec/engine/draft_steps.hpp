// Drafting by batch size: how many draft steps SpecEngine runs at a step of B decoding requests
// (EngineOptions::draft_steps_by_batch, engine/spec_engine.hpp), as rules and as text.
//   DraftStepsRule{from_batch, steps}      from this batch size on (up to the next rule's)
//   format_draft_steps(rules)              "1:3,8:1,32:0" ("" for none)
//   parse_draft_steps(text, &rules)        the reverse; checks the syntax only (the engine checks
//                                          the rules against its policy)
//   draft_nodes_at(topk, steps, nodes, d)  the nodes a tree of topk / steps / nodes verifies when
//                                          cut to d draft steps: 1 (the root) at d = 0, `nodes` at
//                                          d >= steps, else every candidate of the d steps (topk
//                                          + (d - 1) topk^2) up to `nodes`, root included
// engine/advisor.hpp's plan_draft_steps makes rules from measured costs.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/ops/draft_select/params.hpp"

namespace specdec::engine {

// From a batch size on (the step's decoding requests), how many draft steps the engine runs:
// see EngineOptions::draft_steps_by_batch.
struct DraftStepsRule {
  int from_batch = 1;
  int steps = 0;
  bool operator==(DraftStepsRule const&) const = default;
};

inline std::string format_draft_steps(std::span<DraftStepsRule const> rules) {
  std::string out;
  for (DraftStepsRule const& r : rules) {
    if (!out.empty()) out += ',';
    out += std::to_string(r.from_batch);
    out += ':';
    out += std::to_string(r.steps);
  }
  return out;
}
inline Status parse_draft_steps(std::string_view text, std::vector<DraftStepsRule>* out) {
  std::vector<DraftStepsRule> rules;
  auto number = [](std::string_view t, int* v) {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string_view::npos) {
      return false;
    }
    *v = std::stoi(std::string(t));
    return true;
  };
  while (!text.empty()) {
    size_t const comma = text.find(',');
    std::string_view const item = text.substr(0, comma);
    size_t const colon = item.find(':');
    DraftStepsRule r;
    if (colon == std::string_view::npos || !number(item.substr(0, colon), &r.from_batch) ||
        !number(item.substr(colon + 1), &r.steps)) {
      return Status::InvalidArgument("draft steps by batch: '" + std::string(item) +
                                     "' is not BATCH:STEPS (e.g. \"1:3,8:1,32:0\": 3 steps from "
                                     "batch 1, 1 from batch 8, none from batch 32)");
    }
    rules.push_back(r);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) {
      return Status::InvalidArgument("draft steps by batch: a trailing ','");
    }
  }
  *out = std::move(rules);
  return Status::Ok();
}

inline int draft_nodes_at(int topk, int steps, int nodes, int d) {
  if (d <= 0) return 1;
  if (d >= steps) return nodes;
  int const candidates = ops::draft_candidate_count(topk, d);
  return candidates + 1 < nodes ? candidates + 1 : nodes;
}

}  // namespace specdec::engine
