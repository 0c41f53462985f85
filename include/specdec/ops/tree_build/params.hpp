// tree_build parameters and the per-node arithmetic shared by the CPU reference and the kernel:
// from a TreeInput (parents [B, N]) build the TreeTopology of core/tree.hpp (ancestor bitmask
// [B, N, W], depth / positions / first_child / next_sibling [B, N], leaf_paths [B, N, P],
// leaf_count [B], tree_status [B]).
//
// Per request b: n = tree.count(b) nodes. A request is well formed when 1 <= n <= N,
// parents[0] == -1, 0 <= parents[i] < i for 0 < i < n and every depth + 1 <= P. Checks run in
// that order; the first failing one is the request's TreeError. A malformed request, and every
// slot i >= n of a good one, gets the "unused" values: mask row 0, depth / positions / links -1,
// leaf_paths rows -1 (leaf_count 0 for a malformed request). Nothing reads parents past a failed
// check, so a bad request never reads or writes outside its own rows.
#pragma once

#include <bit>
#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"

namespace specdec::ops {

// One CUDA thread per node, one block per request: N is bounded by the block size.
constexpr int kTreeBuildMaxNodes = 1024;

struct TreeBuildParams {
  TreeInput tree;                       // parents [B, N] int32, node_count [B] int32 or nullptr;
                                        // tokens [B, N] is not read (may be nullptr)
  int32_t const* prefix_len = nullptr;  // [B] int32: committed tokens before the root
  TreeTopology out;                     // written: mask [B, N, W] uint32, depth / positions /
                                        // first_child / next_sibling [B, N] int32, leaf_paths
                                        // [B, N, P] int32, leaf_count [B], tree_status [B] int32
};

// parents[i] of node i > 0 is usable iff it precedes i.
SPECDEC_HD inline bool tree_parent_ok(int32_t parent, int i) { return parent >= 0 && parent < i; }

// Depth of node i (0 for the root) by walking its ancestors; requires every parents[k], 0 < k <= i,
// to pass tree_parent_ok (so the walk ends within i steps).
SPECDEC_HD inline int tree_node_depth(int32_t const* parents, int i) {
  int d = 0;
  for (int k = i; k > 0; k = parents[k]) ++d;
  return d;
}

// Writes the W words of node i's ancestor-or-self mask row in one walk: ancestors come in
// decreasing index order, so each word is complete when the walk leaves it. Same precondition as
// tree_node_depth.
SPECDEC_HD inline void tree_write_mask_row(int32_t const* parents, int i, int words,
                                           uint32_t* row) {
  int word = words - 1;
  uint32_t acc = 0;
  for (int k = i;; k = parents[k]) {
    int const w = k >> 5;
    for (; word > w; --word) {
      row[word] = acc;
      acc = 0;
    }
    acc |= 1u << (k & 31);
    if (k == 0) break;
  }
  for (; word >= 0; --word) {
    row[word] = acc;
    acc = 0;
  }
}

// Smallest child of node i among nodes (i, n), -1 if none.
SPECDEC_HD inline int32_t tree_first_child(int32_t const* parents, int n, int i) {
  for (int j = i + 1; j < n; ++j) {
    if (parents[j] == i) return j;
  }
  return -1;
}

// Next larger node with the same parent as node i, -1 if none (the root has no siblings).
SPECDEC_HD inline int32_t tree_next_sibling(int32_t const* parents, int n, int i) {
  if (i == 0) return -1;
  int32_t const parent = parents[i];
  for (int j = i + 1; j < n; ++j) {
    if (parents[j] == parent) return j;
  }
  return -1;
}

// Writes the path root..leaf of node `leaf` (depth d, d + 1 <= P) into row[0, P), -1 padded.
SPECDEC_HD inline void tree_write_leaf_path(int32_t const* parents, int leaf, int d,
                                            int path_capacity, int32_t* row) {
  for (int t = path_capacity - 1; t > d; --t) row[t] = -1;
  int k = leaf;
  for (int t = d; t >= 0; --t) {
    row[t] = k;
    k = t > 0 ? parents[k] : k;
  }
}

// Node at depth t of the path root..node, read from the node's mask row: ancestors have
// increasing indices with depth, so it is the row's t-th (0-based) set bit; -1 if t > depth.
// (The CUDA kernel writes leaf_paths with it, one coalesced row per warp.)
SPECDEC_HD inline int32_t tree_path_node(uint32_t const* mask_row, int words, int t) {
  for (int w = 0; w < words; ++w) {
    uint32_t bits = mask_row[w];
#if defined(__CUDA_ARCH__)
    int const c = __popc(bits);
#else
    int const c = std::popcount(bits);
#endif
    if (t < c) {
      for (int k = 0; k < t; ++k) bits &= bits - 1;  // clear the t lowest set bits
#if defined(__CUDA_ARCH__)
      return 32 * w + __ffs(bits) - 1;
#else
      return 32 * w + std::countr_zero(bits);
#endif
    }
    t -= c;
  }
  return -1;
}

inline Status validate(TreeBuildParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("tree_build: " + m); };
  int const n = p.tree.nodes, P = p.out.path_capacity;
  if (p.tree.batch < 1) return bad("batch " + std::to_string(p.tree.batch) + " < 1");
  if (n < 1 || n > kTreeBuildMaxNodes) {
    return bad("nodes N = " + std::to_string(n) + " outside [1, " +
               std::to_string(kTreeBuildMaxNodes) + "]: lower the number of draft tokens");
  }
  if (P < 1 || P > n) {
    return bad("path capacity P = " + std::to_string(P) + " outside [1, N = " + std::to_string(n) +
               "]: pass P = the deepest accepted tree depth + 1 (at most N)");
  }
  if (!p.tree.parents) return bad("tree.parents is null: pass the [B, N] parent indices");
  if (!p.prefix_len) return bad("prefix_len is null: pass the [B] committed lengths");
  if (!p.out.mask) return bad("out.mask is null: pass a uint32 buffer [B, N, ceil(N/32)]");
  if (!p.out.depth) return bad("out.depth is null: pass an int32 buffer [B, N]");
  if (!p.out.positions) return bad("out.positions is null: pass an int32 buffer [B, N]");
  if (!p.out.first_child) return bad("out.first_child is null: pass an int32 buffer [B, N]");
  if (!p.out.next_sibling) return bad("out.next_sibling is null: pass an int32 buffer [B, N]");
  if (!p.out.leaf_paths) return bad("out.leaf_paths is null: pass an int32 buffer [B, N, P]");
  if (!p.out.leaf_count) return bad("out.leaf_count is null: pass an int32 buffer [B]");
  if (!p.out.tree_status) return bad("out.tree_status is null: pass an int32 buffer [B]");
  return Status::Ok();
}

}  // namespace specdec::ops
