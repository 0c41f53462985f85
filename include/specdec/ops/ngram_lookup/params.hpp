// ngram_lookup parameters: prompt-lookup drafting. Per request b, the last max_n..min_n tokens of
// tokens[b][0 .. lengths[b]) are searched for earlier occurrences; the tokens that followed an
// occurrence become draft nodes under the root tokens[b][len-1].
//   tokens      [B, max_len] int32   prompt + generated tokens
//   lengths     [B]          int32   len_b; 1 <= len_b <= max_len (else node_count 0, no tree)
//   out_tokens  [B, N]       int32   TreeInput tokens (unused slots -1)
//   out_parents [B, N]       int32   TreeInput parents (root -1, unused slots -1)
//   out_node_count [B]       int32   nodes written, 1 when nothing matched
// Order of occurrences: n from min(max_n, len-1) down to min_n, then start s descending, with
// s + n <= len - 1. Each proposes tokens[s+n ..] (at most N-1 tokens, not past len-1). branches =
// 1: the first occurrence as a chain. branches > 1: continuations merged into a trie under the root
// (new nodes appended, so parents precede children), skipping continuations already fully in the
// trie, until `branches` continuations added nodes or the N slots are full.
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/status.hpp"

namespace specdec::ops {

// The CUDA kernel keeps the trie in shared memory: 16 bytes per slot.
constexpr int kNgramMaxNodes = 1024;

struct NgramLookupParams {
  int32_t const* tokens = nullptr;    // [B, max_len] int32
  int32_t const* lengths = nullptr;   // [B] int32
  int batch = 0;                      // B
  int max_len = 0;                    // row stride of tokens
  int min_n = 1;                      // shortest suffix matched, >= 1
  int max_n = 1;                      // longest suffix matched, >= min_n
  int nodes = 0;                      // N tree slots, root included
  int branches = 1;                   // 1: chain; > 1: up to this many merged continuations
  int32_t* out_tokens = nullptr;      // [B, N] int32
  int32_t* out_parents = nullptr;     // [B, N] int32
  int32_t* out_node_count = nullptr;  // [B] int32
};

// A token trie in caller-provided arrays of `capacity` slots; node 0 is the root. Children form a
// linked list (first_child / next_sibling); sibling tokens are distinct.
struct NgramTrie {
  int32_t* tokens;
  int32_t* parents;
  int32_t* first_child;
  int32_t* next_sibling;
  int count;
  int capacity;
};

SPECDEC_HD inline void ngram_trie_init(NgramTrie& t, int32_t root_token) {
  t.tokens[0] = root_token;
  t.parents[0] = -1;
  t.first_child[0] = -1;
  t.next_sibling[0] = -1;
  t.count = 1;
}

SPECDEC_HD inline int ngram_trie_child(NgramTrie const& t, int node, int32_t token) {
  int c = t.first_child[node];
  for (int steps = 0; c != -1 && steps < t.count; ++steps, c = t.next_sibling[c]) {
    if (t.tokens[c] == token) return c;
  }
  return -1;
}

// How many leading tokens of seq[0, m) already form a path from the root.
SPECDEC_HD inline int ngram_trie_match(NgramTrie const& t, int32_t const* seq, int m) {
  int node = 0, j = 0;
  for (; j < m; ++j) {
    int const c = ngram_trie_child(t, node, seq[j]);
    if (c < 0) break;
    node = c;
  }
  return j;
}

// Adds seq[0, m) under the root (stopping when the trie is full); true if a node was added.
SPECDEC_HD inline bool ngram_trie_insert(NgramTrie& t, int32_t const* seq, int m) {
  int node = 0;
  bool added = false;
  for (int j = 0; j < m; ++j) {
    int c = ngram_trie_child(t, node, seq[j]);
    if (c < 0) {
      if (t.count >= t.capacity) break;
      c = t.count++;
      t.tokens[c] = seq[j];
      t.parents[c] = node;
      t.first_child[c] = -1;
      t.next_sibling[c] = t.first_child[node];
      t.first_child[node] = c;
      added = true;
    }
    node = c;
  }
  return added;
}

// Tokens an occurrence whose continuation starts at `start` proposes: up to N-1, not past len-1.
SPECDEC_HD inline int ngram_continuation_length(int start, int len, int nodes) {
  int const left = len - start;
  return left < nodes - 1 ? left : nodes - 1;
}

inline Status validate(NgramLookupParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("ngram_lookup: " + m); };
  if (p.batch < 1) return bad("batch " + std::to_string(p.batch) + " < 1");
  if (p.max_len < 1) return bad("max_len " + std::to_string(p.max_len) + " < 1");
  if (p.min_n < 1) return bad("min_n " + std::to_string(p.min_n) + " < 1");
  if (p.max_n < p.min_n) {
    return bad("max_n " + std::to_string(p.max_n) + " < min_n " + std::to_string(p.min_n));
  }
  if (p.nodes < 1 || p.nodes > kNgramMaxNodes) {
    return bad("nodes " + std::to_string(p.nodes) + " outside [1, " +
               std::to_string(kNgramMaxNodes) + "]");
  }
  if (p.branches < 1) return bad("branches " + std::to_string(p.branches) + " < 1 (1 = chain)");
  if (!p.tokens) return bad("tokens is null: pass the [B, max_len] token history");
  if (!p.lengths) return bad("lengths is null: pass the [B] history lengths");
  if (!p.out_tokens) return bad("out_tokens is null: pass an int32 buffer [B, N]");
  if (!p.out_parents) return bad("out_parents is null: pass an int32 buffer [B, N]");
  if (!p.out_node_count) return bad("out_node_count is null: pass an int32 buffer [B]");
  return Status::Ok();
}

}  // namespace specdec::ops
