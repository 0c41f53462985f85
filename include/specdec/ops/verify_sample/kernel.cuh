// verify_sample CUDA kernels. First sample_chunk_partials_kernel (sample/kernel.cuh) reduces
// every logit row [B, N] in chunks across the whole GPU (rows of requests with top-k / top-p are
// skipped); then one block of kSampleThreads per request walks the tree of verify_sample/params.hpp.
// Per visited node: the target distribution of its logit row and the row's mass (from the chunk
// partials: O(V / kSampleChunk); top-k / top-p rows: block passes over the row), then O(1)
// acceptance decisions per child (plus, for sampled drafts, one residual-mass pass per rejected
// child), and at the end one inverse-CDF draw (chunked: one chunk scanned). Every thread takes the
// same decisions (block reductions hand every thread the same values). Shapes: tokens [B, N],
// links [B, N], logits [B, N, V], draft_probs [B, N, V] or nullptr, accepted_path [B, P],
// num_accepted [B], next_token [B], status [B], workspace [B, N, ceil(V / kSampleChunk)]
// SampleChunkPartial (device memory).
// No host synchronisation, allocation or host read of device data: graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/sample/kernel.cuh"
#include "specdec/ops/verify_sample/params.hpp"

namespace specdec::ops {

// A template (on the block size, which must be kSampleThreads) for inline linkage across TUs.
template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1)
    verify_sample_kernel(__grid_constant__ VerifySampleParams const p) {
  static_assert(kThreads == kSampleThreads, "the block agents assume kSampleThreads threads");
  __shared__ SampleShared sh;
  __shared__ int32_t rejected[kVerifySampleMaxNodes];
  __shared__ int32_t path_shared[kVerifySampleMaxNodes];
  int const b = blockIdx.x;
  int const N = p.tree.nodes, V = p.vocab, P = p.out.path_capacity;
  int32_t const* tokens = p.tree.tokens + static_cast<int64_t>(b) * N;
  int32_t const* first_child = p.links.first_child + static_cast<int64_t>(b) * N;
  int32_t const* next_sibling = p.links.next_sibling + static_cast<int64_t>(b) * N;
  int32_t const count = p.tree.count(b);
  SampleChunkPartial const* partials = static_cast<SampleChunkPartial const*>(p.workspace);
  bool const chunked = sample_row_is_chunked(p.config, b, V);
  int32_t status = p.links.tree_status[b] != kTreeOk ? kSampleBadTree : kSampleOk;
  if (count < 1 || count > N) status = kSampleBadTree;
  int len = 1, n = 0;
  int32_t next_token = -1;
  while (status == kSampleOk) {
    int64_t const row_index = static_cast<int64_t>(b) * N + n;
    float const* row = p.logits + row_index * V;
    SampleChunkPartial const* parts = partials + row_index * sample_chunks(V);
    TargetDist dist;
    float total = 0.0f;
    status = sample_detail::block_row_dist(row, V, parts, p.config, b, dist, total, sh);
    if (status != kSampleOk) break;
    auto w = [&](int v, float l) { return dist.weight(v, l); };
    auto w_at = [&](int32_t x) { return (x >= 0 && x < V) ? dist.weight(x, __ldg(row + x)) : 0.0f; };
    int32_t const child0 = len < P ? first_child[n] : -1;
    int32_t accepted = -1;
    float const u_final = p.keys.uniform(b, static_cast<uint32_t>(n), 1);
    if (p.draft_probs == nullptr) {
      int n_rejected = 0;
      float rejected_mass = 0.0f;
      for (int32_t c = child0, after = n; c != -1; after = c, c = next_sibling[c]) {
        if (!verify_sample_link_ok(c, after, count)) {
          status = kSampleBadTree;
          break;
        }
        int32_t const x = tokens[c];
        if (sample_detail::is_excluded(x, rejected, n_rejected)) continue;
        float const wx = w_at(x);
        if (sample_accept_deterministic(p.keys.uniform(b, static_cast<uint32_t>(c), 0),
                                        total - rejected_mass, wx)) {
          accepted = c;
          break;
        }
        __syncthreads();  // everyone has read the list before it grows
        if (threadIdx.x == 0) rejected[n_rejected] = x;
        __syncthreads();
        ++n_rejected;
        rejected_mass += wx;
      }
      if (status != kSampleOk) break;
      if (accepted < 0) {
        if (dist.greedy_token >= 0 && !sample_detail::is_excluded(dist.greedy_token, rejected, n_rejected)) {
          next_token = dist.greedy_token;  // what the one-hot inverse CDF returns for any u
        } else {
          next_token = sample_detail::block_row_sample(row, V, parts, chunked, dist, rejected,
                                                       n_rejected, u_final, sh);
          if (next_token < 0) {  // rounding only: stay inside the residual's support
            next_token = sample_detail::block_argmax_weight(row, V, w, rejected, n_rejected, sh);
          }
          if (next_token < 0) next_token = sample_detail::block_sample(row, V, w, nullptr, 0, u_final, sh);
        }
      }
    } else {
      float const* q = p.draft_probs + (static_cast<int64_t>(b) * N + n) * V;
      float c_mass = 0.0f, residual_mass = total;
      auto residual = [&](int v, float l) {
        return sample_residual_weight(dist.weight(v, l), __ldg(q + v), c_mass);
      };
      for (int32_t c = child0, after = n; c != -1; after = c, c = next_sibling[c]) {
        if (!verify_sample_link_ok(c, after, count)) {
          status = kSampleBadTree;
          break;
        }
        int32_t const x = tokens[c];
        bool const in_vocab = x >= 0 && x < V;
        float const qx = in_vocab ? __ldg(q + x) : 0.0f;
        float const rx = in_vocab ? sample_residual_weight(w_at(x), qx, c_mass) : 0.0f;
        if (sample_accept_sampled(p.keys.uniform(b, static_cast<uint32_t>(c), 0), residual_mass,
                                  qx, rx)) {
          accepted = c;
          break;
        }
        c_mass += residual_mass;
        residual_mass = sample_detail::block_weight_sum(row, V, residual, sh);
      }
      if (status != kSampleOk) break;
      if (accepted < 0) {
        next_token = sample_detail::block_sample(row, V, residual, nullptr, 0, u_final, sh);
        if (next_token < 0) next_token = sample_detail::block_sample(row, V, w, nullptr, 0, u_final, sh);
      }
    }
    if (accepted < 0) break;
    if (threadIdx.x == 0) path_shared[len] = accepted;
    ++len;
    n = accepted;
  }
  __syncthreads();
  int32_t* path = p.out.accepted_path + static_cast<int64_t>(b) * P;
  bool const ok = status == kSampleOk;
  for (int i = threadIdx.x; i < P; i += kSampleThreads) {
    path[i] = i == 0 ? 0 : (ok && i < len ? path_shared[i] : -1);
  }
  if (threadIdx.x == 0) {
    p.out.num_accepted[b] = ok ? len - 1 : 0;
    p.out.next_token[b] = ok ? next_token : -1;
    p.status[b] = status;
  }
}

inline Status verify_sample_cuda(VerifySampleParams const& p, cudaStream_t stream) {
  SPECDEC_RETURN_IF_ERROR(launch_sample_chunk_partials(
      p.logits, static_cast<int64_t>(p.tree.batch) * p.tree.nodes, p.vocab, p.tree.nodes, p.config,
      p.workspace, stream));
  verify_sample_kernel<kSampleThreads><<<p.tree.batch, kSampleThreads, 0, stream>>>(p);
  return cuda_launch_status("verify_sample_kernel");
}

}  // namespace specdec::ops
