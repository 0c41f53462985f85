// commit_tokens parameters: what a verified step commits to each request, up to its stop.
//
// Request b committed the accepted drafts and then the bonus / correction token:
//   tokens[b, path[b, k]] for k = 1 .. num_accepted[b], then next_token[b]
// (the tree [B, N] and the acceptance [B, P] of core/tree.hpp, as verify_greedy / verify_sample
// write them). The request keeps them in order until one of them stops it (commit_stop, below):
// that token is its last. record [B, commit_record_width(P)] says per request:
//   [0]          count: the tokens kept (1 .. num_accepted + 1)
//   [1]          reason: CommitStop of the last kept token (kCommitGoOn when none stopped it)
//   [2, 2 + P)   the kept tokens, -1 after count
//   [2 + P, 2 + 2P)  proposed: at index d (1 <= d < P) the tree's nodes of depth d (the drafts
//                proposed at position d), 0 at index 0
// so that a step's host reads back only what it commits, with the counts its metrics need.
// Per request the stop inputs are: stop_at_eos[b] (the shared eos ids end it), its own stop ids
// (stop_ids[stop_offsets[b] .. stop_offsets[b + 1])) and remaining[b] (>= 1: the tokens it may
// still produce; the remaining-th is its last).
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"

namespace specdec::ops {

// Why a committed token is a request's last; the order of the checks when several hold.
enum CommitStop : int32_t {
  kCommitGoOn = 0,    // not a stop: the request runs on
  kCommitEos = 1,     // an eos id of the model, the request stopping at eos
  kCommitStopId = 2,  // one of the request's own stop ids
  kCommitLength = 3,  // its max_new_tokens-th token
};

// The stop rule for one token, the produced-th (1-based) of a request that may produce
// max_new tokens: the engine's host path and the kernel call this one function.
template <class EosId, class StopId>
SPECDEC_HD inline int32_t commit_stop(int32_t token, bool stop_at_eos, EosId const* eos,
                                      int num_eos, StopId const* stop_ids, int num_stop_ids,
                                      int64_t produced, int64_t max_new) {
  if (stop_at_eos) {
    for (int i = 0; i < num_eos; ++i) {
      if (static_cast<int64_t>(eos[i]) == token) return kCommitEos;
    }
  }
  for (int i = 0; i < num_stop_ids; ++i) {
    if (static_cast<int64_t>(stop_ids[i]) == token) return kCommitStopId;
  }
  return produced >= max_new ? kCommitLength : kCommitGoOn;
}

SPECDEC_HD inline int commit_record_width(int path_capacity) { return 2 + 2 * path_capacity; }

struct CommitTokensParams {
  TreeInput tree;  // tokens [B, N], node_count [B] or nullptr (parents unread)
  int32_t const* depth = nullptr;         // [B, N] (tree_build's)
  Acceptance acceptance;                  // accepted_path [B, P], num_accepted [B], next_token [B]
  int32_t const* eos = nullptr;           // [num_eos]
  int num_eos = 0;
  int32_t const* stop_at_eos = nullptr;   // [B] 0 / 1
  int32_t const* stop_offsets = nullptr;  // [B + 1]
  int32_t const* stop_ids = nullptr;      // [stop_offsets[B]]
  int32_t const* remaining = nullptr;     // [B] >= 1
  int32_t* record = nullptr;              // [B, commit_record_width(P)] written
};

// The arguments' shapes and pointers (the values are the device's, read there).
inline Status validate(CommitTokensParams const& p) {
  std::string const fn = "commit_tokens: ";
  int const P = p.acceptance.path_capacity;
  if (p.tree.batch < 0 || p.tree.nodes < 1 || P < 1 || P > p.tree.nodes || p.num_eos < 0) {
    return Status::InvalidArgument(fn + "batch " + std::to_string(p.tree.batch) + ", nodes " +
                                   std::to_string(p.tree.nodes) + ", path capacity " +
                                   std::to_string(P) + ", eos ids " + std::to_string(p.num_eos) +
                                   ": need batch >= 0, 1 <= path capacity <= nodes, eos >= 0");
  }
  if (p.tree.batch == 0) return Status::Ok();
  if (p.tree.tokens == nullptr || p.depth == nullptr || p.acceptance.accepted_path == nullptr ||
      p.acceptance.num_accepted == nullptr || p.acceptance.next_token == nullptr ||
      p.stop_at_eos == nullptr || p.stop_offsets == nullptr || p.remaining == nullptr ||
      p.record == nullptr || (p.num_eos > 0 && p.eos == nullptr)) {
    return Status::InvalidArgument(fn + "a required array is null (tokens, depth, acceptance, "
                                        "stop_at_eos, stop_offsets, remaining, record; eos)");
  }
  return Status::Ok();
}

}  // namespace specdec::ops
