// The parts of a paged attention batch that the mla_attention tests (CPU and CUDA) build alike:
// the batch's host arrays and their MlaAttentionParams, the page table [B, max_pages] with pages
// handed out in turns from a shuffled pool, the token list (request, index) in request order or
// shuffled, and the tree-verify mask rows [T, words].
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "specdec/ops/mla_attention/params.hpp"
#include "support/testing.hpp"

namespace specdec::testing {

// A paged MLA batch on the host: request b's tokens see its slots [0, base[b] + count[b]) through
// its row of the page table; entries are W = c + r wide.
struct PagedMlaBatch {
  int heads = 1, c = 0, r = 0, page_size = 1, batch = 0, tokens = 0, words = 0;
  int max_pages = 0, num_pages = 0;
  std::vector<int32_t> base, count;
  std::vector<int32_t> page_table;  // [B, max_pages], -1 padded
  std::vector<float> cache;         // [num_pages * page_size, W]
  std::vector<int32_t> token_request, token_index;
  std::vector<uint32_t> mask;  // [T, words] or empty (causal)
  std::vector<float> q;        // [T, heads, W]
  int width() const { return c + r; }

  // The op's parameters over these host arrays, *out [T, heads, c] first filled with `poison`.
  ops::MlaAttentionParams params(std::vector<float>* out, float poison, int max_slots,
                                 float scale) {
    out->assign(static_cast<size_t>(tokens) * heads * c, poison);
    ops::MlaAttentionParams p;
    p.q = q.data();
    p.cache = cache.data();
    p.token_request = token_request.data();
    p.token_index = token_index.data();
    p.base = base.data();
    p.page_table = page_table.data();
    p.mask = mask.empty() ? nullptr : mask.data();
    p.tokens = tokens;
    p.heads = heads;
    p.kv_lora_rank = c;
    p.rope_dim = r;
    p.batch = batch;
    p.page_size = page_size;
    p.max_pages = max_pages;
    p.num_pages = num_pages;
    p.words = words;
    p.max_slots = max_slots;
    p.scale = scale;
    p.out = out->data();
    return p;
  }
};

// Page table [pages_of.size(), max_pages], -1 padded: request b gets pages_of[b] pages of a
// shuffled pool of num_pages, handed out in turns between the requests so that their pages
// interleave (non-contiguous tables).
inline std::vector<int32_t> interleaved_page_table(Rng& rng, std::vector<int> const& pages_of,
                                                   int max_pages, int num_pages) {
  std::vector<int32_t> pool(static_cast<size_t>(num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  int const batch = static_cast<int>(pages_of.size());
  std::vector<int32_t> table(static_cast<size_t>(batch) * max_pages, -1);
  size_t next = 0;
  for (int k = 0; k < max_pages; ++k) {
    for (int b = 0; b < batch; ++b) {
      if (k < pages_of[b]) table[static_cast<size_t>(b) * max_pages + k] = pool[next++];
    }
  }
  return table;
}

// The batch's tokens: request b's count[b] tokens as (request, index in the request), in request
// order, or shuffled.
inline void list_tokens(Rng& rng, std::vector<int32_t> const& count, bool shuffle,
                        std::vector<int32_t>* request, std::vector<int32_t>* index) {
  request->clear();
  index->clear();
  for (int b = 0; b < static_cast<int>(count.size()); ++b) {
    for (int i = 0; i < count[b]; ++i) {
      request->push_back(b);
      index->push_back(i);
    }
  }
  if (!shuffle) return;
  std::vector<int> order(request->size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> r, i;
  for (int o : order) {
    r.push_back((*request)[o]);
    i.push_back((*index)[o]);
  }
  *request = std::move(r);
  *index = std::move(i);
}

// Tree-verify mask rows [T, words]: token t (node index[t] of request request[t]) sees node j
// of its request where j is on its path to the root (parents[b][j], -1 at the root).
inline std::vector<uint32_t> ancestor_mask(std::vector<int32_t> const& request,
                                           std::vector<int32_t> const& index,
                                           std::vector<std::vector<int32_t>> const& parents,
                                           int words) {
  std::vector<uint32_t> mask(request.size() * words, 0u);
  for (size_t t = 0; t < request.size(); ++t) {
    for (int j = index[t]; j >= 0; j = parents[request[t]][j]) {
      mask[t * words + j / 32] |= 1u << (j % 32);
    }
  }
  return mask;
}

}  // namespace specdec::testing
