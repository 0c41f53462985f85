// moe_route CUDA kernel: one warp per token (moe_route_token, also run by the Kimi forward's
// router_logits_route), kTokensPerBlock tokens per block. The warp keeps the token's scores s and
// selection values b (E <= kMoeRouteMaxExperts floats each) in shared memory:
//   1. lanes over experts: s = moe_router_score(logit), b = s + bias
//   2. lane g < n_group: top-2 sum of its group; keep rank(g) < topk_group (ties: lower group)
//   3. b of experts outside the kept groups = 0.0
//   4. top_k rounds of a warp argmax over pack_value_index(b, id) (ties: lower id), each expert
//      taken once (a bit per owned expert and lane)
//   5. lane 0: the weights, summed and divided in double exactly as the reference does.
// Shapes: logits [T, E], bias [E] or nullptr, ids / weights [T, top_k] (device memory).
// No host synchronisation or allocation: graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/math.hpp"
#include "specdec/core/warp.cuh"
#include "specdec/ops/moe_route/params.hpp"

namespace specdec::ops {

// Token t's routing by one whole warp (the steps above), writing ids / weights [t]. score and b
// hold E floats each and picked top_k ints, all the warp's own shared memory. The logits are read
// through L2 (__ldcg): router_logits_route's last block reads what the grid's other blocks wrote.
__device__ inline void moe_route_token(MoeRouteParams const& p, int t, float* score, float* b,
                                       int32_t* picked, int lane) {
  int const E = p.experts, per = E / p.n_group, K = p.top_k;
  float const* logits = p.logits + static_cast<int64_t>(t) * E;
  for (int e = lane; e < E; e += 32) {
    float const s = moe_router_score(__ldcg(logits + e));
    score[e] = s;
    b[e] = s + (p.bias ? p.bias[e] : 0.0f);
  }
  __syncwarp();
  if (p.n_group > 1) {
    float group = -INFINITY;
    if (lane < p.n_group) {
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int e = lane * per; e < (lane + 1) * per; ++e) {
        float const v = b[e];
        if (v > m1) {
          m2 = m1;
          m1 = v;
        } else if (v > m2) {
          m2 = v;
        }
      }
      group = m1 + m2;
    }
    int rank = 0;
    for (int h = 0; h < p.n_group; ++h) {
      float const other = __shfl_sync(0xffffffffu, group, h);
      rank += (other > group || (other == group && h < lane)) ? 1 : 0;
    }
    unsigned const kept = __ballot_sync(0xffffffffu, lane < p.n_group && rank < p.topk_group);
    for (int e = lane; e < E; e += 32) {
      if (!((kept >> (e / per)) & 1u)) b[e] = 0.0f;
    }
    __syncwarp();
  }
  uint32_t taken = 0;  // bit j: expert lane + 32 * j chosen
  for (int k = 0; k < K; ++k) {
    uint64_t best = 0;
    for (int e = lane, j = 0; e < E; e += 32, ++j) {
      if (!((taken >> j) & 1u)) {
        uint64_t const key = pack_value_index(b[e], e);
        best = key > best ? key : best;
      }
    }
    best = warp_max_u64(best);
    int32_t const id = unpack_index(best);
    if (lane == (id & 31)) taken |= 1u << (id >> 5);
    if (lane == 0) picked[k] = id;
  }
  __syncwarp();
  if (lane == 0) {
    int32_t* ids = p.ids + static_cast<int64_t>(t) * K;
    float* weights = p.weights + static_cast<int64_t>(t) * K;
    double sum = 0.0;
    for (int k = 0; k < K; ++k) sum += score[picked[k]];
    for (int k = 0; k < K; ++k) {
      double w = score[picked[k]];
      if (p.norm) w /= sum + 1e-20;
      ids[k] = picked[k];
      weights[k] = static_cast<float>(w * p.scale);
    }
  }
}

namespace moe_route_detail {

constexpr int kTokensPerBlock = 4;

static __global__ void __launch_bounds__(kTokensPerBlock * 32)
    moe_route_kernel(__grid_constant__ MoeRouteParams const p) {
  await_prior_kernels();
  __shared__ float s_score[kTokensPerBlock][kMoeRouteMaxExperts];
  __shared__ float s_b[kTokensPerBlock][kMoeRouteMaxExperts];
  __shared__ int32_t s_ids[kTokensPerBlock][kMoeRouteMaxTopK];
  int const warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int const t = blockIdx.x * kTokensPerBlock + warp;
  if (t >= p.tokens) return;  // whole warps leave together
  moe_route_token(p, t, s_score[warp], s_b[warp], s_ids[warp], lane);
}

}  // namespace moe_route_detail

inline Status moe_route_cuda(MoeRouteParams const& p, cudaStream_t stream) {
  if (p.tokens == 0) return Status::Ok();
  int const blocks =
      (p.tokens + moe_route_detail::kTokensPerBlock - 1) / moe_route_detail::kTokensPerBlock;
  return launch_kernel("moe_route_kernel", moe_route_detail::moe_route_kernel,
                       static_cast<unsigned>(blocks), moe_route_detail::kTokensPerBlock * 32, 0,
                       stream, p);
}

}  // namespace specdec::ops
