// The token tree of one speculative step and the layouts shared by the ops that make and use it.
//
// Per request b of B, a tree has n_b <= N nodes in N slots (N = verified nodes, root included):
//   node 0       the root: the last committed token (its KV is not cached yet)
//   nodes 1..n-1 draft tokens; parents come before children (parents[i] < i)
//   slots n..N-1 unused (only when node_count is given)
//
// TreeInput (made by draft_select or ngram_lookup, read by tree_build and the verify ops):
//   tokens      [B, N] int32   token id of each node
//   parents     [B, N] int32   parents[b][0] == -1; 0 <= parents[b][i] < i for 0 < i < n_b
//   node_count  [B]    int32   n_b (1 <= n_b <= N), or nullptr: every request uses all N slots
//
// TreeTopology (made by tree_build; W = ceil(N / 32) mask words per row):
//   mask          [B, N, W] uint32  bit j of row i set iff j == i or j is an ancestor of i
//   depth         [B, N]    int32   0 for the root
//   positions     [B, N]    int32   prefix_len[b] + depth (the RoPE position of each node)
//   first_child   [B, N]    int32   smallest child index, -1 if none
//   next_sibling  [B, N]    int32   next larger index with the same parent, -1 if none
//   leaf_paths    [B, N, P] int32   row k: node indices root..leaf of the k-th leaf (leaves in
//                                   increasing index order), -1 padded; rows past the leaves -1
//   leaf_count    [B]       int32
//   tree_status   [B]       int32   TreeError of request b (kTreeOk when well formed)
// P (path capacity) = the deepest tree accepted + 1; a deeper tree is a kTreeTooDeep error.
// Unused slots get mask rows of zeros, depth/positions/links -1.
//
// Acceptance (made by verify_greedy / verify_sample, read by kv_commit and the engine):
//   accepted_path  [B, P] int32  node indices root first (accepted_path[b][0] == 0), -1 padded
//   num_accepted   [B]    int32  accepted draft nodes (0..P-1); tokens committed = num_accepted + 1
//   next_token     [B]    int32  the bonus (all drafts on the path accepted) or correction token
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/status.hpp"

namespace specdec {

// Per-request tree validation result, written to tree_status by tree_build on either executor.
enum TreeError : int32_t {
  kTreeOk = 0,
  kTreeBadNodeCount = 1,   // node_count outside [1, N]
  kTreeBadRoot = 2,        // parents[0] != -1
  kTreeBadParent = 3,      // some parents[i] outside [0, i) for 0 < i < n
  kTreeTooDeep = 4,        // depth + 1 > path capacity P
};

inline const char* tree_error_name(int32_t code) {
  switch (code) {
    case kTreeOk: return "ok";
    case kTreeBadNodeCount: return "node_count outside [1, N]";
    case kTreeBadRoot: return "root parent is not -1";
    case kTreeBadParent: return "a parent index is not in [0, node) (parents must precede children)";
    case kTreeTooDeep: return "tree deeper than the path capacity";
  }
  return "unknown tree error";
}

// Host-side: turns a downloaded tree_status array into a Status naming the first bad request.
inline Status check_tree_status(int32_t const* tree_status, int batch) {
  for (int b = 0; b < batch; ++b) {
    if (tree_status[b] != kTreeOk) {
      return Status::MalformedInput("tree of request " + std::to_string(b) + ": " +
                                    tree_error_name(tree_status[b]));
    }
  }
  return Status::Ok();
}

SPECDEC_HD inline int mask_words(int nodes) { return (nodes + 31) / 32; }

struct TreeInput {
  int32_t const* tokens = nullptr;      // [B, N]
  int32_t const* parents = nullptr;     // [B, N]
  int32_t const* node_count = nullptr;  // [B] or nullptr (all N)
  int batch = 0;                        // B
  int nodes = 0;                        // N

  SPECDEC_HD int count(int b) const { return node_count ? node_count[b] : nodes; }
};

struct TreeTopology {
  uint32_t* mask = nullptr;        // [B, N, ceil(N/32)]
  int32_t* depth = nullptr;        // [B, N]
  int32_t* positions = nullptr;    // [B, N]
  int32_t* first_child = nullptr;  // [B, N]
  int32_t* next_sibling = nullptr; // [B, N]
  int32_t* leaf_paths = nullptr;   // [B, N, P]
  int32_t* leaf_count = nullptr;   // [B]
  int32_t* tree_status = nullptr;  // [B]
  int path_capacity = 0;           // P
};

// Read-only view of the parts of a TreeTopology the verify ops walk.
struct TreeLinks {
  int32_t const* depth = nullptr;         // [B, N]
  int32_t const* first_child = nullptr;   // [B, N]
  int32_t const* next_sibling = nullptr;  // [B, N]
  int32_t const* tree_status = nullptr;   // [B]; requests with a bad tree are skipped
};

struct Acceptance {
  int32_t* accepted_path = nullptr;  // [B, P]
  int32_t* num_accepted = nullptr;   // [B]
  int32_t* next_token = nullptr;     // [B]
  int path_capacity = 0;             // P
};

}  // namespace specdec
