// ngram_lookup CUDA kernel: one block per request. An occurrence of the n-token suffix at start s
// ends at e = s + n - 1 and proposes tokens[e + 1 ..], which depends on e only. So each thread
// takes candidate ends e in [0, len-2] and computes l(e) = the common suffix length of
// tokens[.. e] and tokens[.. len-1] (capped at max_n); the definition's order (n descending, then
// s descending, skipping continuations already in the trie) is the order of key (l(e), e)
// descending over candidates with l(e) >= min_n, each end taken once. Each round a block
// max-reduction picks the largest key whose continuation would still add a node (the trie only
// grows, so a skipped candidate stays skipped), and thread 0 inserts it into the shared-memory
// trie. At most `branches` (and at most N-1) rounds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/macros.hpp"
#include "specdec/core/warp.cuh"
#include "specdec/ops/ngram_lookup/params.hpp"

namespace specdec::ops {
namespace ngram_lookup_detail {

// 512 threads: len 8192 gives 16 candidate ends per thread per round, two batches of loads.
constexpr int kThreads = 512;
constexpr int kBatch = 8;

// Common suffix length of row[.. e] and row[.. len-1], at most min(max_n, e + 1).
__device__ __forceinline__ int suffix_match_length(int32_t const* row, int len, int e, int max_n) {
  int const cap = min(max_n, e + 1);
  int l = 0;
  while (l < cap && __ldg(row + e - l) == __ldg(row + len - 1 - l)) ++l;
  return l;
}

static __global__ void __launch_bounds__(kThreads)
    ngram_lookup_kernel(__grid_constant__ NgramLookupParams const p) {
  await_prior_kernels();
  extern __shared__ int32_t trie_arrays[];  // tokens, parents, first_child, next_sibling: N each
  __shared__ uint64_t warp_best[kThreads / 32];
  __shared__ uint64_t round_best;
  __shared__ int trie_count;
  int const b = blockIdx.x, tid = threadIdx.x, nodes = p.nodes;
  int32_t const* row = p.tokens + static_cast<int64_t>(b) * p.max_len;
  int32_t* out_tokens = p.out_tokens + static_cast<int64_t>(b) * nodes;
  int32_t* out_parents = p.out_parents + static_cast<int64_t>(b) * nodes;
  int const len = p.lengths[b];
  if (len < 1 || len > p.max_len) {  // uniform over the block
    for (int i = tid; i < nodes; i += kThreads) out_tokens[i] = out_parents[i] = -1;
    if (tid == 0) p.out_node_count[b] = 0;
    return;
  }
  NgramTrie trie{
      trie_arrays, trie_arrays + nodes, trie_arrays + 2 * nodes, trie_arrays + 3 * nodes, 0, nodes};
  if (tid == 0) {
    ngram_trie_init(trie, row[len - 1]);
    trie_count = trie.count;
  }
  __syncthreads();
  int32_t const last = __ldg(row + len - 1);
  int const rounds = nodes > 1 && len - 1 >= p.min_n ? min(p.branches, nodes - 1) : 0;
  for (int round = 0; round < rounds; ++round) {
    trie.count = trie_count;
    uint64_t best = 0;
    // kBatch candidate ends at a time: their tokens are loaded together (independent loads in
    // flight), and only ends whose token equals the last one go on to the suffix compare.
    for (int e0 = tid; e0 <= len - 2; e0 += kThreads * kBatch) {
      int32_t x[kBatch];
      SPECDEC_UNROLL
      for (int j = 0; j < kBatch; ++j) {
        int const e = e0 + j * kThreads;
        x[j] = e <= len - 2 ? __ldg(row + e) : ~last;
      }
      for (int j = 0; j < kBatch; ++j) {
        int const e = e0 + j * kThreads;
        if (e > len - 2 || x[j] != last) continue;  // l(e) = 0 < min_n (min_n >= 1)
        int const l = suffix_match_length(row, len, e, p.max_n);
        if (l < p.min_n) continue;
        uint64_t const key = (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(e);
        if (key <= best) continue;
        if (round > 0) {  // the first round's trie is just the root: every candidate adds a node
          int const m = ngram_continuation_length(e + 1, len, nodes);
          if (ngram_trie_match(trie, row + e + 1, m) == m) continue;
        }
        best = key;
      }
    }
    best = warp_max_u64(best);
    if ((tid & 31) == 0) warp_best[tid >> 5] = best;
    __syncthreads();
    if (tid < 32) {
      best = warp_max_u64(tid < kThreads / 32 ? warp_best[tid] : 0);
      if (tid == 0) {
        round_best = best;
        if (best != 0) {
          int const start = static_cast<int>(static_cast<uint32_t>(best)) + 1;
          ngram_trie_insert(trie, row + start, ngram_continuation_length(start, len, nodes));
          trie_count = trie.count;
        }
      }
    }
    __syncthreads();
    if (round_best == 0 || trie_count == nodes) break;  // uniform: shared values after the barrier
  }
  int const count = trie_count;
  for (int i = tid; i < nodes; i += kThreads) {
    out_tokens[i] = i < count ? trie.tokens[i] : -1;
    out_parents[i] = i < count ? trie.parents[i] : -1;
  }
  if (tid == 0) p.out_node_count[b] = count;
}

}  // namespace ngram_lookup_detail

inline Status ngram_lookup_cuda(NgramLookupParams const& p, cudaStream_t stream) {
  size_t const shared = 4 * sizeof(int32_t) * static_cast<size_t>(p.nodes);
  return launch_kernel("ngram_lookup_kernel", ngram_lookup_detail::ngram_lookup_kernel,
                       dim3(p.batch), ngram_lookup_detail::kThreads, shared, stream, p);
}

}  // namespace specdec::ops
