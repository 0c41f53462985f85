// verify_greedy CPU reference (plain loops): row argmax, then acceptance in node order
// (accepted[i] = accepted[parent] && tokens[i] == argmax[parent]) and the deepest accepted node.
// Shapes: see params.hpp (logits [B, N, V], tokens/parents/depth [B, N], out [B, P] / [B]).
#pragma once

#include <cstdint>
#include <vector>

#include "specdec/ops/verify_greedy/params.hpp"

namespace specdec::ops {

inline Status verify_greedy_reference(VerifyGreedyParams const& p) {
  int const batch = p.tree.batch, nodes = p.tree.nodes, vocab = p.vocab;
  int const cap = p.out.path_capacity;
  std::vector<char> accepted(static_cast<size_t>(nodes));
  std::vector<int> depth(static_cast<size_t>(nodes));
  for (int b = 0; b < batch; ++b) {
    int const n = verify_greedy_request_nodes(p, b);
    int32_t* argmax = p.argmax_scratch + static_cast<int64_t>(b) * nodes;
    for (int i = 0; i < nodes; ++i) {
      argmax[i] = -1;
      if (p.target_argmax) {
        argmax[i] = p.target_argmax[static_cast<int64_t>(b) * nodes + i];
        continue;
      }
      if (i >= n) continue;
      float const* row = p.logits + (static_cast<int64_t>(b) * nodes + i) * vocab;
      uint64_t best = 0;
      for (int v = 0; v < vocab; ++v) {
        uint64_t const key = pack_value_index(row[v], v);
        if (key > best) best = key;
      }
      argmax[i] = unpack_index(best);
    }
    int32_t* path = p.out.accepted_path + static_cast<int64_t>(b) * cap;
    for (int k = 0; k < cap; ++k) path[k] = k == 0 ? 0 : -1;
    if (n == 0) {
      p.out.num_accepted[b] = 0;
      p.out.next_token[b] = -1;
      continue;
    }
    int32_t const* tokens = p.tree.tokens + static_cast<int64_t>(b) * nodes;
    int32_t const* parents = p.tree.parents + static_cast<int64_t>(b) * nodes;
    accepted[0] = 1;
    depth[0] = 0;
    uint32_t best = accept_key(0, 0);
    for (int i = 1; i < n; ++i) {
      int const parent = parents[i];
      depth[i] = depth[parent] + 1;
      accepted[i] = accepted[parent] && tokens[i] == argmax[parent];
      if (accepted[i] && accept_key(depth[i], i) > best) best = accept_key(depth[i], i);
    }
    int const node = accept_key_node(best), d = depth[node];
    for (int k = d, j = node; k >= 0; --k, j = parents[j]) {
      if (k < cap) path[k] = j;
    }
    p.out.num_accepted[b] = d;
    p.out.next_token[b] = argmax[node];
  }
  return Status::Ok();
}

}  // namespace specdec::ops
