// draft_select CPU references (plain loops; host pointers). Shapes as in params.hpp:
//   draft_expand_reference:   logits [B, K_in, Vd] -> this step's candidate slots [B, C] and the
//                             next frontier [B, topk]
//   draft_finalize_reference: candidates [B, C] + root_tokens [B] -> tokens / parents /
//                             node_slot [B, N] (+ node_scores), status [B]; MalformedInput naming
//                             the first request and slot whose parent was not chosen.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/ops/draft_select/params.hpp"

namespace specdec::ops {

inline Status draft_expand_reference(DraftExpandParams const& p) {
  int const K = p.topk, Vd = p.vocab, K_in = draft_branches(K, p.step);
  int const C = draft_candidate_count(K, p.steps), base = draft_step_base(K, p.step);
  std::vector<uint64_t> keys(static_cast<size_t>(Vd));
  std::vector<uint64_t> child_keys(static_cast<size_t>(K_in) * K);
  std::vector<int32_t> child_draft(static_cast<size_t>(K_in) * K);
  for (int b = 0; b < p.batch; ++b) {
    for (int i = 0; i < K_in; ++i) {
      int64_t const row = static_cast<int64_t>(b) * K_in + i;
      float const* x = p.logits + row * Vd;
      float max = -INFINITY;
      for (int d = 0; d < Vd; ++d) max = std::max(max, x[d]);
      double sum = 0.0;
      for (int d = 0; d < Vd; ++d) sum += x[d] == -INFINITY ? 0.0 : std::exp(double(x[d]) - max);
      float const lse = draft_log_sum_exp(max, static_cast<float>(sum));
      for (int d = 0; d < Vd; ++d) keys[d] = pack_value_index(x[d], d);
      std::partial_sort(keys.begin(), keys.begin() + K, keys.end(), std::greater<uint64_t>());
      for (int j = 0; j < K; ++j) {
        int32_t const d = unpack_index(keys[j]);
        int const slot = base + i * K + j;
        int64_t const at = static_cast<int64_t>(b) * C + slot;
        float const score = draft_child_score(p.frontier_scores[row], x[d], lse);
        p.cand_tokens[at] = draft_target_token(p.d2t, d);
        p.cand_scores[at] = score;
        p.cand_parent[at] = p.frontier_slots[row];
        child_keys[i * K + j] = pack_value_index(score, slot);
        child_draft[i * K + j] = d;
      }
    }
    // Next frontier: the best K children by score (ties: smaller slot), best first.
    std::vector<uint64_t> order = child_keys;
    std::sort(order.begin(), order.end(), std::greater<uint64_t>());
    for (int r = 0; r < K; ++r) {
      int const slot = unpack_index(order[r]);
      int const c = slot - base;  // child index i * K + j
      int64_t const at = static_cast<int64_t>(b) * K + r;
      p.next_scores[at] = unpack_value(order[r]);
      p.next_slots[at] = slot;
      p.next_tokens[at] = draft_target_token(p.d2t, child_draft[c]);
      p.next_draft_tokens[at] = child_draft[c];
      p.next_branch[at] = c / K;
    }
  }
  return Status::Ok();
}

inline Status draft_finalize_reference(DraftFinalizeParams const& p) {
  int const C = draft_candidate_count(p.topk, p.steps), N = p.nodes;
  std::string first_error;
  std::vector<uint64_t> keys(static_cast<size_t>(C));
  std::vector<int32_t> node_of(static_cast<size_t>(C));
  for (int b = 0; b < p.batch; ++b) {
    int64_t const c0 = static_cast<int64_t>(b) * C, n0 = static_cast<int64_t>(b) * N;
    for (int c = 0; c < C; ++c) keys[c] = pack_value_index(p.cand_scores[c0 + c], c);
    std::partial_sort(keys.begin(), keys.begin() + (N - 1), keys.end(), std::greater<uint64_t>());
    std::vector<int32_t> chosen;
    for (int r = 0; r < N - 1; ++r) chosen.push_back(unpack_index(keys[r]));
    std::sort(chosen.begin(), chosen.end());
    std::fill(node_of.begin(), node_of.end(), -1);
    for (int k = 0; k < N - 1; ++k) node_of[chosen[k]] = k + 1;
    p.tokens[n0] = p.root_tokens[b];
    p.parents[n0] = -1;
    p.node_slot[n0] = -1;
    if (p.node_scores) p.node_scores[n0] = 0.0f;
    int32_t status = kDraftSelectOk;
    for (int k = 0; k < N - 1; ++k) {
      int const c = chosen[k];
      int32_t const ps = p.cand_parent[c0 + c];
      int32_t parent = ps == -1 ? 0 : (ps >= 0 && ps < c ? node_of[ps] : -1);
      p.tokens[n0 + k + 1] = p.cand_tokens[c0 + c];
      p.parents[n0 + k + 1] = parent;
      p.node_slot[n0 + k + 1] = c;
      if (p.node_scores) p.node_scores[n0 + k + 1] = p.cand_scores[c0 + c];
      if (parent == -1) {
        status = kDraftParentMissing;
        if (first_error.empty()) {
          first_error = "draft_finalize: request " + std::to_string(b) + ", candidate slot " +
                        std::to_string(c) + " (node " + std::to_string(k + 1) +
                        "): its parent slot " + std::to_string(ps) + " is not among the chosen " +
                        std::to_string(N - 1) +
                        " candidates; scores must be cumulative log-probs (a child's score <= its "
                        "parent's)";
        }
      }
    }
    p.status[b] = status;
  }
  return first_error.empty() ? Status::Ok() : Status::MalformedInput(first_error);
}

}  // namespace specdec::ops
