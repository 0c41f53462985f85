// verify_greedy parameters: greedy acceptance of a token tree against the target's argmax.
//
// Per request b of B with N tree slots and vocabulary V:
//   tree.tokens / tree.parents [B, N] int32, tree.node_count [B] int32 or nullptr (TreeInput)
//   links.depth [B, N] int32 and links.tree_status [B] int32 (from tree_build; first_child and
//     next_sibling are not read and may be nullptr)
//   logits [B, N, V] float          target logits of every node (row b*N + i), or
//   target_argmax [B, N] int32      the target argmax of every node computed elsewhere (a
//                                   vocabulary-sharded target: model/kimi's LogitsMode::kArgmax);
//                                   logits is then not read
//   argmax_scratch [B, N] int32     written: target argmax of every node, -1 for unused slots and
//                                   skipped requests (with target_argmax: a copy of it)
//   out (Acceptance)                accepted_path [B, P], num_accepted [B], next_token [B]
// Node i > 0 is accepted iff its parent is accepted and tokens[i] == argmax(parent); the root is
// always accepted. The deepest accepted node (ties: smaller index) gives the path, num_accepted =
// its depth and next_token = its argmax (the bonus). Argmax ties go to the smallest token id under
// float_order_key's total order. Requests with tree_status != 0 are skipped: num_accepted 0,
// accepted_path [0, -1, ...], next_token -1.
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"

namespace specdec::ops {

// The CUDA acceptance kernel runs one thread per node; the key packing below needs N < 65536.
constexpr int kVerifyGreedyMaxNodes = 1024;

struct VerifyGreedyParams {
  TreeInput tree;                     // tokens [B, N], parents [B, N], node_count [B] or nullptr
  TreeLinks links;                    // depth [B, N], tree_status [B] (others unused)
  float const* logits = nullptr;      // [B, N, V] float (null when target_argmax is given)
  int32_t const* target_argmax = nullptr;  // [B, N] int32 or null: argmax computed elsewhere
  int vocab = 0;                      // V
  int32_t* argmax_scratch = nullptr;  // [B, N] int32, written
  Acceptance out;                     // accepted_path [B, P], num_accepted [B], next_token [B]
};

// Row argmax: the max over pack_value_index(logit, token) (core/math.hpp), ties to the smaller id.

// Accepted-node order as one 32-bit key: deeper first, then smaller index. 0 means "none".
SPECDEC_HD inline uint32_t accept_key(int depth, int node) {
  return (static_cast<uint32_t>(depth + 1) << 16) | (0xffffu - static_cast<uint32_t>(node));
}
SPECDEC_HD inline int accept_key_node(uint32_t key) {
  return static_cast<int>(0xffffu - (key & 0xffffu));
}
SPECDEC_HD inline int accept_key_depth(uint32_t key) { return static_cast<int>(key >> 16) - 1; }

// Nodes of request b that take part (0 when the request is skipped: bad tree or bad count).
SPECDEC_HD inline int verify_greedy_request_nodes(VerifyGreedyParams const& p, int b) {
  if (p.links.tree_status[b] != kTreeOk) return 0;
  int const n = p.tree.count(b);
  return (n >= 1 && n <= p.tree.nodes) ? n : 0;
}

inline Status validate(VerifyGreedyParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("verify_greedy: " + m); };
  if (p.tree.batch < 1) return bad("batch " + std::to_string(p.tree.batch) + " < 1");
  if (p.tree.nodes < 1 || p.tree.nodes > kVerifyGreedyMaxNodes) {
    return bad("nodes " + std::to_string(p.tree.nodes) + " outside [1, " +
               std::to_string(kVerifyGreedyMaxNodes) + "]");
  }
  if (p.vocab < 1) return bad("vocab " + std::to_string(p.vocab) + " < 1");
  if (p.out.path_capacity < 1) {
    return bad("path capacity P " + std::to_string(p.out.path_capacity) +
               " < 1: pass P = max tree depth + 1 (the P given to tree_build)");
  }
  if (!p.tree.tokens) return bad("tree.tokens is null: pass the [B, N] draft tokens");
  if (!p.tree.parents) return bad("tree.parents is null: pass the [B, N] parent indices");
  if (!p.links.depth) return bad("links.depth is null: pass tree_build's depth [B, N]");
  if (!p.links.tree_status)
    return bad("links.tree_status is null: pass tree_build's tree_status [B]");
  if (!p.logits && !p.target_argmax) {
    return bad("logits is null: pass the target logits [B, N, V] (or target_argmax [B, N])");
  }
  if (!p.argmax_scratch) return bad("argmax_scratch is null: pass an int32 buffer [B, N]");
  if (!p.out.accepted_path) return bad("out.accepted_path is null: pass an int32 buffer [B, P]");
  if (!p.out.num_accepted) return bad("out.num_accepted is null: pass an int32 buffer [B]");
  if (!p.out.next_token) return bad("out.next_token is null: pass an int32 buffer [B]");
  return Status::Ok();
}

}  // namespace specdec::ops
