// Speculation metrics of one request or of a whole run (DESIGN.md "One speculative step").
//
// Counters, per verify (one target verify forward of one request):
//   verify_ct                     verifies
//   committed                     output tokens from verifies (accepted drafts + the bonus /
//                                 correction token each, fewer where the request stopped); the
//                                 prefill's first token is not counted
//   proposed_at_depth [D]         draft nodes proposed at depth d (index 0, the root, unused)
//   accepted_at_depth [D]         verifies whose accepted path reached depth d
// Derived:
//   accept_length()               committed / verify_ct: tokens per verify, bonus included (1.0
//                                 without speculation)
//   accept_rate()                 accepted drafts / proposed drafts
//   per_position_accept()[d-1]    accepted_at_depth[d] / verify_ct, d = 1..D-1: the fraction of
//                                 verifies that accepted the draft at depth d
// Time (seconds, wall clock of the batch phases the request took part in): prefill (target
// prefill + first draw + draft prefill), draft (propose), build (tree_build), verify (target
// verify forward), commit (accept + KV commit + outputs), extend (draft extend). On the CUDA
// executor a step's phases are timed on the engine's stream between events at their boundaries
// (the verify and the extend are queued without a host wait), so each holds its own GPU work;
// a step's extend time is counted at the next step's commit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace specdec::engine {

struct SpecMetrics {
  int64_t verify_ct = 0;
  int64_t committed = 0;
  std::vector<int64_t> proposed_at_depth;
  std::vector<int64_t> accepted_at_depth;
  double prefill_s = 0.0;
  double draft_s = 0.0;
  double build_s = 0.0;
  double verify_s = 0.0;
  double commit_s = 0.0;
  double extend_s = 0.0;

  // One verify: proposed_by_depth[d] draft nodes proposed at depth d >= 1 (index 0, the root,
  // is not read), `accepted` the accepted drafts the output took (the path reaches depths
  // 1..accepted), `tokens` the tokens the output took: accepted + 1 (the bonus / correction), or
  // fewer when the request stopped inside the path (eos, max_new_tokens).
  void record_verify_counts(std::span<int32_t const> proposed_by_depth, int accepted,
                            int tokens) {
    ++verify_ct;
    committed += tokens;
    for (size_t d = 1; d < proposed_by_depth.size(); ++d) {
      if (proposed_by_depth[d] == 0) continue;
      grow(static_cast<int>(d));
      proposed_at_depth[d] += proposed_by_depth[d];
    }
    for (int d = 1; d <= accepted; ++d) {
      grow(d);
      ++accepted_at_depth[static_cast<size_t>(d)];
    }
  }
  // The same with the depth of every proposed draft node listed.
  void record_verify(std::vector<int> const& proposed_depths, int accepted, int tokens) {
    std::vector<int32_t> by_depth;
    for (int d : proposed_depths) {
      if (d >= static_cast<int>(by_depth.size())) by_depth.resize(static_cast<size_t>(d) + 1, 0);
      ++by_depth[static_cast<size_t>(d)];
    }
    record_verify_counts(by_depth, accepted, tokens);
  }

  // Depths 1..max_depth reported even when nothing reached them (a policy's tree depth).
  void reserve_depth(int max_depth) { grow(max_depth); }

  void merge(SpecMetrics const& o) {
    verify_ct += o.verify_ct;
    committed += o.committed;
    for (size_t d = 0; d < o.proposed_at_depth.size(); ++d) {
      grow(static_cast<int>(d));
      proposed_at_depth[d] += o.proposed_at_depth[d];
      accepted_at_depth[d] += o.accepted_at_depth[d];
    }
    prefill_s += o.prefill_s;
    draft_s += o.draft_s;
    build_s += o.build_s;
    verify_s += o.verify_s;
    commit_s += o.commit_s;
    extend_s += o.extend_s;
  }

  int64_t proposed() const { return sum(proposed_at_depth); }
  int64_t accepted() const { return sum(accepted_at_depth); }
  double accept_length() const {
    return verify_ct ? static_cast<double>(committed) / static_cast<double>(verify_ct) : 0.0;
  }
  double accept_rate() const {
    int64_t const p = proposed();
    return p ? static_cast<double>(accepted()) / static_cast<double>(p) : 0.0;
  }
  std::vector<double> per_position_accept() const {
    std::vector<double> out;
    for (size_t d = 1; d < accepted_at_depth.size(); ++d) {
      out.push_back(verify_ct
                        ? static_cast<double>(accepted_at_depth[d]) / static_cast<double>(verify_ct)
                        : 0.0);
    }
    return out;
  }

 private:
  void grow(int d) {
    size_t const need = static_cast<size_t>(d) + 1;
    if (proposed_at_depth.size() < need) {
      proposed_at_depth.resize(need, 0);
      accepted_at_depth.resize(need, 0);
    }
  }
  static int64_t sum(std::vector<int64_t> const& v) {
    int64_t s = 0;
    for (int64_t x : v) s += x;
    return s;
  }
};

}  // namespace specdec::engine
