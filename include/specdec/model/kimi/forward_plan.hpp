// What the Kimi forwards of every executor share before and after the math: the argument checks of
// prefill / decode / tree verify, the per-request segments of a batch with their cache rows (pages
// reserved), and the cache bookkeeping once the forward succeeded. forward_cpu.hpp and
// forward_cuda.cuh call these, so both executors accept and refuse exactly the same inputs.
//   plan_prefill(fn, config, cache, requests [B], counts [B], tokens [sum counts], aux_layers, *plan)
//   plan_decode (fn, config, cache, requests [B], tokens [B], aux_layers, *plan)
//   plan_verify (fn, config, cache, requests [B], nodes N, tokens [B*N], positions [B*N],
//                mask [B*N*ceil(N/32)], aux_layers, *plan)
//   finish_forward(cache, requests, plan): prefill / decode append the tokens (lengths advance),
//                verify stages its N slots (lengths stay)
// Token rows are in batch order (request 0's tokens, then request 1's, ...). The errors are those
// listed at the top of forward_cpu.hpp; a failed plan changes nothing in the cache.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/policy/layers.hpp"

namespace specdec::model::kimi {

// What a forward returns beside aux:
//   kFull    logits [T, V] (a vocabulary-sharded model, dist/shard.hpp, gathers the ranks' slices)
//   kArgmax  argmax [T]: each row's argmax over the whole vocabulary (ties to the smaller id, the
//            rule of ops::verify_greedy; row_argmax_keys_reference), found from every rank's
//            slice by gathering one 8-byte key per row, never the [T, V] logits; the logits then
//            hold only this rank's slice [T, vocab.size()] (all of V at size 1). For batches
//            whose every request is greedy.
enum class LogitsMode { kFull, kArgmax };

// One request's tokens in a forward.
struct ForwardSegment {
  RequestId id = 0;
  int64_t first = 0;               // its first token row in the batch
  int64_t count = 0;               // n tokens
  int64_t base = 0;                // cache length before: token i goes to slot base + i
  uint32_t const* mask = nullptr;  // [n, words] tree rows (verify), nullptr = causal
  int words = 0;
  std::vector<int64_t> rows;  // cache row (within a layer) of slots [0, base + n)
};

enum class ForwardKind { kPrefill, kDecode, kVerify };

struct ForwardPlan {
  ForwardKind kind = ForwardKind::kPrefill;
  int nodes = 0;                        // verify: N per request
  std::vector<ForwardSegment> segments;  // [B]
  std::vector<int64_t> positions;       // [T] RoPE position of each token
  std::span<int32_t const> tokens;      // [T] (the caller's)
  std::span<uint32_t const> mask;       // verify: [T, words] (the caller's), else empty
  int words = 0;
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

namespace detail {

// Argument checks, segments and page reservation over counts [B] tokens per request, tokens
// [T], positions [T] (empty: base + i) and masks (verify's [B, N, words] rows, or empty).
inline Status plan_segments(std::string const& fn, io::DeepseekV3Config const& c, MlaCache* cache,
                            std::span<RequestId const> requests, std::span<int64_t const> counts,
                            std::span<int32_t const> tokens,
                            std::span<int32_t const> given_positions,
                            std::span<uint32_t const> masks, int words,
                            std::span<int const> aux_layers, ForwardPlan* plan) {
  if (cache == nullptr) return Status::InvalidArgument(fn + "cache is null");
  if (cache->num_layers() != c.num_hidden_layers || cache->kv_lora_rank() != c.kv_lora_rank ||
      cache->rope_dim() != c.qk_rope_head_dim) {
    return Status::InvalidArgument(
        fn + "cache has " + std::to_string(cache->num_layers()) + " layers of [" +
        std::to_string(cache->kv_lora_rank()) + " + " + std::to_string(cache->rope_dim()) +
        "] entries, the model (" + c.source + ") " + std::to_string(c.num_hidden_layers) +
        " layers of [kv_lora_rank " + std::to_string(c.kv_lora_rank) + " + qk_rope_head_dim " +
        std::to_string(c.qk_rope_head_dim) + "]: use MlaCache::create_for(config, ...)");
  }
  if (requests.empty()) return Status::InvalidArgument(fn + "no requests");
  int const L = c.num_hidden_layers;
  for (size_t i = 0; i < aux_layers.size(); ++i) {
    if (aux_layers[i] >= L) {
      return Status::InvalidArgument(fn + "aux_layers[" + std::to_string(i) +
                                     "] = " + std::to_string(aux_layers[i]) +
                                     " not in [kEmbedding -1, " + std::to_string(L) +
                                     ") (-1 = embedding, i = output of layer i)");
    }
  }
  LayerSetError const le = layer_set_error(aux_layers);
  if (le != LayerSetError::kOk) {
    return Status::InvalidArgument(fn + "aux_layers " + format_layers(aux_layers) +
                                   (le == LayerSetError::kDuplicate
                                        ? " lists a layer twice"
                                        : " has an id below kEmbedding -1") +
                                   " (-1 = embedding, i = output of layer i, each once)");
  }
  int64_t const V = c.vocab_size;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= V) {
      return Status::InvalidArgument(fn + "tokens[" + std::to_string(t) +
                                     "] = " + std::to_string(tokens[t]) +
                                     " not in [0, vocab_size " + std::to_string(V) + ")");
    }
  }
  std::vector<ForwardSegment> segs(requests.size());
  std::vector<int64_t> slots(requests.size());
  std::vector<int64_t> positions(tokens.size());
  int64_t first = 0;
  for (size_t b = 0; b < requests.size(); ++b) {
    std::string const rb = "requests[" + std::to_string(b) + "] = " + std::to_string(requests[b]);
    if (!cache->has_request(requests[b])) {
      return Status::InvalidArgument(fn + rb +
                                     ": unknown request (MlaCache::add_request it first)");
    }
    for (size_t k = 0; k < b; ++k) {
      if (requests[k] == requests[b]) {
        return Status::InvalidArgument(fn + rb + " repeats requests[" + std::to_string(k) +
                                       "]: one entry per request");
      }
    }
    ForwardSegment& s = segs[b];
    s.id = requests[b];
    s.first = first;
    s.count = counts[b];
    SPECDEC_RETURN_IF_ERROR(cache->length(s.id, &s.base));
    if (!masks.empty()) {
      s.mask = masks.data() + first * words;
      s.words = words;
    }
    for (int64_t i = 0; i < s.count; ++i) {
      int64_t const t = first + i;
      positions[t] = given_positions.empty() ? s.base + i : given_positions[t];
      if (positions[t] < 0 || positions[t] >= c.max_position_embeddings) {
        return Status::InvalidArgument(fn + rb + ": token " + std::to_string(i) + " at position " +
                                       std::to_string(positions[t]) +
                                       " not within [0, max_position_embeddings " +
                                       std::to_string(c.max_position_embeddings) + ")");
      }
    }
    slots[b] = s.base + s.count;
    first += s.count;
  }
  SPECDEC_RETURN_IF_ERROR(cache->reserve(requests, slots).prefixed(fn));
  for (ForwardSegment& s : segs) {
    std::span<int32_t const> pages;
    SPECDEC_RETURN_IF_ERROR(cache->pages(s.id, &pages));
    int64_t const ps = cache->page_size();
    s.rows.resize(static_cast<size_t>(s.base + s.count));
    for (int64_t u = 0; u < s.base + s.count; ++u) {
      s.rows[static_cast<size_t>(u)] = int64_t{pages[static_cast<size_t>(u / ps)]} * ps + u % ps;
    }
  }
  plan->segments = std::move(segs);
  plan->positions = std::move(positions);
  return Status::Ok();
}

// Checks request b's verify rows [N, words] (the top of this file) and positions [N] against
// the request's length.
inline Status check_tree_rows(std::string const& fn, int b, int N, int words, uint32_t const* mask,
                              int32_t const* positions, int64_t length) {
  auto bit = [&](int i, int j) { return ((mask[i * words + (j >> 5)] >> (j & 31)) & 1u) != 0; };
  std::string const rb = "request " + std::to_string(b) + ": mask row ";
  for (int i = 0; i < N; ++i) {
    uint32_t const* row = mask + i * words;
    if (!bit(i, i)) {
      return Status::MalformedInput(fn + rb + std::to_string(i) + " lacks bit " +
                                    std::to_string(i) +
                                    " (rows are ancestor-OR-SELF sets, as tree_build writes them)");
    }
    for (int wd = 0; wd < words; ++wd) {
      uint32_t above = row[wd];
      int const lo = 32 * wd;
      if (i + 1 > lo) above = (i + 1 - lo) >= 32 ? 0u : above & ~((1u << (i + 1 - lo)) - 1u);
      if (above != 0) {
        return Status::MalformedInput(fn + rb + std::to_string(i) + " sets bit " +
                                      std::to_string(lo + std::countr_zero(above)) + " > " +
                                      std::to_string(i) +
                                      ": ancestors precede their node (parents[i] < i)");
      }
    }
    int depth = 0;
    for (int wd = 0; wd < words; ++wd) depth += std::popcount(row[wd]);
    depth -= 1;
    if (i > 0) {
      int parent = -1;
      for (int j = i - 1; j >= 0 && parent < 0; --j) {
        if (bit(i, j)) parent = j;
      }
      bool same = parent >= 0;
      for (int wd = 0; same && wd < words; ++wd) {
        uint32_t const self = (wd == (i >> 5)) ? (1u << (i & 31)) : 0u;
        same = row[wd] == (mask[parent * words + wd] | self);
      }
      if (!same) {
        return Status::MalformedInput(
            fn + rb + std::to_string(i) + " is not the row of its parent (" +
            (parent < 0 ? std::string("none: bit 0, the root, is missing")
                        : "node " + std::to_string(parent) + ", its highest other bit") +
            ") plus itself: not the ancestor set of a tree over the N nodes");
      }
    }
    if (positions[i] != length + depth) {
      return Status::InvalidArgument(fn + "request " + std::to_string(b) + ": positions[" +
                                     std::to_string(i) + "] = " + std::to_string(positions[i]) +
                                     ", but the cached length " + std::to_string(length) +
                                     " + depth " + std::to_string(depth) +
                                     " (from the mask row) = " + std::to_string(length + depth) +
                                     " (tree_build's prefix_len must be the length)");
    }
  }
  return Status::Ok();
}

}  // namespace detail

inline Status plan_prefill(std::string const& fn, io::DeepseekV3Config const& config,
                           MlaCache* cache, std::span<RequestId const> requests,
                           std::span<int32_t const> counts, std::span<int32_t const> tokens,
                           std::span<int const> aux_layers, ForwardPlan* plan) {
  if (counts.size() != requests.size()) {
    return Status::InvalidArgument(fn + std::to_string(requests.size()) + " requests but " +
                                   std::to_string(counts.size()) + " counts");
  }
  std::vector<int64_t> n(counts.size());
  int64_t total = 0;
  for (size_t b = 0; b < counts.size(); ++b) {
    if (counts[b] < 1) {
      return Status::InvalidArgument(fn + "counts[" + std::to_string(b) + "] = " +
                                     std::to_string(counts[b]) +
                                     " < 1: every request in a prefill batch needs a token");
    }
    n[b] = counts[b];
    total += counts[b];
  }
  if (total != static_cast<int64_t>(tokens.size())) {
    return Status::InvalidArgument(fn + "counts add up to " + std::to_string(total) +
                                   " tokens, tokens has " + std::to_string(tokens.size()));
  }
  plan->kind = ForwardKind::kPrefill;
  plan->tokens = tokens;
  return detail::plan_segments(fn, config, cache, requests, n, tokens, {}, {}, 0, aux_layers, plan);
}

inline Status plan_decode(std::string const& fn, io::DeepseekV3Config const& config,
                          MlaCache* cache, std::span<RequestId const> requests,
                          std::span<int32_t const> tokens, std::span<int const> aux_layers,
                          ForwardPlan* plan) {
  if (tokens.size() != requests.size()) {
    return Status::InvalidArgument(fn + std::to_string(requests.size()) + " requests but " +
                                   std::to_string(tokens.size()) + " tokens (one each)");
  }
  std::vector<int64_t> const n(requests.size(), 1);
  plan->kind = ForwardKind::kDecode;
  plan->tokens = tokens;
  return detail::plan_segments(fn, config, cache, requests, n, tokens, {}, {}, 0, aux_layers, plan);
}

inline Status plan_verify(std::string const& fn, io::DeepseekV3Config const& config,
                          MlaCache* cache, std::span<RequestId const> requests, int nodes,
                          std::span<int32_t const> tokens, std::span<int32_t const> positions,
                          std::span<uint32_t const> mask, std::span<int const> aux_layers,
                          ForwardPlan* plan) {
  if (nodes < 1) return Status::InvalidArgument(fn + "nodes N = " + std::to_string(nodes) + " < 1");
  if (cache == nullptr) return Status::InvalidArgument(fn + "cache is null");
  int const W = mask_words(nodes);
  size_t const B = requests.size(), N = static_cast<size_t>(nodes);
  if (tokens.size() != B * N || positions.size() != B * N || mask.size() != B * N * W) {
    return Status::InvalidArgument(
        fn + "for B = " + std::to_string(B) + " requests of N = " + std::to_string(N) +
        " nodes: tokens has " + std::to_string(tokens.size()) + " (want B*N), positions " +
        std::to_string(positions.size()) + " (want B*N), mask " + std::to_string(mask.size()) +
        " words (want B*N*" + std::to_string(W) + ")");
  }
  for (size_t b = 0; b < B; ++b) {
    if (!cache->has_request(requests[b])) {
      return Status::InvalidArgument(fn + "requests[" + std::to_string(b) + "] = " +
                                     std::to_string(requests[b]) +
                                     ": unknown request (MlaCache::add_request it first)");
    }
    int64_t length = 0;
    SPECDEC_RETURN_IF_ERROR(cache->length(requests[b], &length));
    SPECDEC_RETURN_IF_ERROR(detail::check_tree_rows(fn, static_cast<int>(b), nodes, W,
                                                    mask.data() + b * N * W,
                                                    positions.data() + b * N, length));
  }
  std::vector<int64_t> const n(B, nodes);
  plan->kind = ForwardKind::kVerify;
  plan->nodes = nodes;
  plan->tokens = tokens;
  plan->mask = mask;
  plan->words = W;
  return detail::plan_segments(fn, config, cache, requests, n, tokens, positions, mask, W,
                               aux_layers, plan);
}

// After a successful forward: lengths advance (prefill, decode) or the nodes are staged (verify).
inline Status finish_forward(MlaCache* cache, ForwardPlan const& plan) {
  for (ForwardSegment const& s : plan.segments) {
    SPECDEC_RETURN_IF_ERROR(plan.kind == ForwardKind::kVerify ? cache->stage(s.id, s.count)
                                                              : cache->append(s.id, s.count));
  }
  return Status::Ok();
}

}  // namespace specdec::model::kimi
