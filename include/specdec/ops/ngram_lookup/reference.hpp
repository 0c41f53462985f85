// ngram_lookup CPU reference (plain loops, the definition's order): for n from max_n down to
// min_n, for start s from len-1-n down to 0, compare tokens[s, s+n) with the suffix and insert the
// continuation into the trie. Shapes: see params.hpp (tokens [B, max_len], outputs [B, N] / [B]).
#pragma once

#include <cstdint>
#include <vector>

#include "specdec/ops/ngram_lookup/params.hpp"

namespace specdec::ops {

inline Status ngram_lookup_reference(NgramLookupParams const& p) {
  int const nodes = p.nodes;
  std::vector<int32_t> tok(nodes), par(nodes), first(nodes), next(nodes);
  for (int b = 0; b < p.batch; ++b) {
    int32_t const* row = p.tokens + static_cast<int64_t>(b) * p.max_len;
    int32_t* out_tokens = p.out_tokens + static_cast<int64_t>(b) * nodes;
    int32_t* out_parents = p.out_parents + static_cast<int64_t>(b) * nodes;
    int const len = p.lengths[b];
    for (int i = 0; i < nodes; ++i) out_tokens[i] = out_parents[i] = -1;
    if (len < 1 || len > p.max_len) {
      p.out_node_count[b] = 0;
      continue;
    }
    NgramTrie trie{tok.data(), par.data(), first.data(), next.data(), 0, nodes};
    ngram_trie_init(trie, row[len - 1]);
    int used = 0;
    bool done = nodes == 1;
    for (int n = p.max_n < len - 1 ? p.max_n : len - 1; n >= p.min_n && !done; --n) {
      for (int s = len - 1 - n; s >= 0 && !done; --s) {
        bool match = true;
        for (int j = 0; j < n; ++j) match = match && row[s + j] == row[len - n + j];
        if (!match) continue;
        int const start = s + n;
        if (ngram_trie_insert(trie, row + start, ngram_continuation_length(start, len, nodes)))
          ++used;
        done = used == p.branches || trie.count == nodes;
      }
    }
    for (int i = 0; i < trie.count; ++i) {
      out_tokens[i] = tok[i];
      out_parents[i] = par[i];
    }
    p.out_node_count[b] = trie.count;
  }
  return Status::Ok();
}

}  // namespace specdec::ops
