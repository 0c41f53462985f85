// tree_build CPU reference (plain loops over requests and nodes; host pointers). Shapes as in
// params.hpp: parents [B, N] -> mask [B, N, W], depth / positions / links [B, N],
// leaf_paths [B, N, P], leaf_count [B], tree_status [B]. Every request's outputs are written;
// returns MalformedInput naming the first bad request and node when some tree is malformed.
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/ops/tree_build/params.hpp"

namespace specdec::ops {

inline Status tree_build_reference(TreeBuildParams const& p) {
  int const N = p.tree.nodes, W = mask_words(N), P = p.out.path_capacity;
  std::string first_error;  // message for the first malformed request, empty when none
  for (int b = 0; b < p.tree.batch; ++b) {
    int32_t const* par = p.tree.parents + static_cast<int64_t>(b) * N;
    int64_t const row0 = static_cast<int64_t>(b) * N;
    int const count = p.tree.count(b);
    int32_t status = kTreeOk;
    int bad_node = -1;
    if (count < 1 || count > N) {
      status = kTreeBadNodeCount;
    } else if (par[0] != -1) {
      status = kTreeBadRoot;
      bad_node = 0;
    } else {
      for (int i = 1; i < count && status == kTreeOk; ++i) {
        if (!tree_parent_ok(par[i], i)) status = kTreeBadParent, bad_node = i;
      }
      for (int i = 1; i < count && status == kTreeOk; ++i) {
        if (tree_node_depth(par, i) + 1 > P) status = kTreeTooDeep, bad_node = i;
      }
    }
    p.out.tree_status[b] = status;
    int const n = status == kTreeOk ? count : 0;  // nodes written as used
    int leaves = 0;
    for (int i = 0; i < N; ++i) {
      uint32_t* mrow = p.out.mask + (row0 + i) * W;
      if (i < n) {
        int const d = tree_node_depth(par, i);
        tree_write_mask_row(par, i, W, mrow);
        p.out.depth[row0 + i] = d;
        p.out.positions[row0 + i] = p.prefix_len[b] + d;
        p.out.first_child[row0 + i] = tree_first_child(par, n, i);
        p.out.next_sibling[row0 + i] = tree_next_sibling(par, n, i);
        if (p.out.first_child[row0 + i] == -1) {
          tree_write_leaf_path(par, i, d, P, p.out.leaf_paths + (row0 + leaves) * P);
          ++leaves;
        }
      } else {
        for (int w = 0; w < W; ++w) mrow[w] = 0;
        p.out.depth[row0 + i] = -1;
        p.out.positions[row0 + i] = -1;
        p.out.first_child[row0 + i] = -1;
        p.out.next_sibling[row0 + i] = -1;
      }
    }
    for (int k = leaves; k < N; ++k) {
      for (int t = 0; t < P; ++t) p.out.leaf_paths[(row0 + k) * P + t] = -1;
    }
    p.out.leaf_count[b] = leaves;
    if (status != kTreeOk && first_error.empty()) {
      std::string where = "tree of request " + std::to_string(b);
      if (status == kTreeBadNodeCount) {
        where +=
            ": node_count " + std::to_string(count) + " outside [1, N = " + std::to_string(N) + "]";
      } else {
        where += ", node " + std::to_string(bad_node) + ": " + tree_error_name(status);
        if (status == kTreeBadRoot || status == kTreeBadParent) {
          where += " (parent " + std::to_string(par[bad_node]) + ")";
        } else {
          where += " (depth " + std::to_string(tree_node_depth(par, bad_node)) +
                   " + 1 > P = " + std::to_string(P) + ": raise the path capacity)";
        }
      }
      first_error = where;
    }
  }
  return first_error.empty() ? Status::Ok() : Status::MalformedInput(first_error);
}

}  // namespace specdec::ops
