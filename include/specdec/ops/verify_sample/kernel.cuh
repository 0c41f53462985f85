// verify_sample CUDA kernels. First sample_chunk_partials_kernel and
// sample_row_thresholds_kernel (sample/kernel.cuh) reduce every logit row [B, N] across the whole
// GPU into chunk partials and, for requests with top-k / top-p, the row's threshold key. Then one
// block of kSampleThreads per request:
//   1. stages the request's tree (tokens, first_child, next_sibling) and each node's two Philox
//      uniforms in shared memory, and one thread per node loads the logit of each child's token
//      in the node's row: the op's inputs, read before the programmatic wait (core/cuda.cuh),
//      behind the partials kernel's tail;
//   2. after the wait, one warp per row turns its chunk partials into the row's TargetDist and
//      mass, then one thread per node its loaded logit into its weight;
//   3. walks the tree of verify_sample/params.hpp from shared memory: each node decides which
//      child it would accept (one thread per node, in parallel; sampled drafts: whether its
//      first child passes), then thread 0 follows the decisions from the root. Sampled drafts:
//      from the first node whose first child fails, the block walks, O(1) per child plus a
//      residual-mass pass before each sibling of a rejected child. Then one inverse-CDF
//      draw: one chunk scanned. A sampled draft's residual after a rejected child is left to
//      the last kernel (the request's row, C and uniform, in the workspace).
// With sampled drafts, verify_sample_residual_kernel then draws those residuals, the row's
// chunks summed by as many blocks. Measured on an H100 (benchmarks/RESULTS.md, "A sampled
// draft's residual over the whole GPU"): drafts rejected at the root 37.0 -> 14.3 us at batch 1,
// V 163840, where the walk's block had passed over the row alone; the launch costs requests
// whose drafts are all accepted 1.0-1.5 us at batch 1.
// Outside thread 0's walk every thread takes the same decisions (shared values and block
// reductions hand every thread the same values). Shapes: tokens [B, N], links [B, N], logits
// [B, N, V], draft_probs [B, N, V] or nullptr, accepted_path [B, P], num_accepted [B],
// next_token [B], status [B], workspace (verify_sample_workspace_bytes, device memory).
// No host synchronisation, allocation or host read of device data: graph-capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/sample/kernel.cuh"
#include "specdec/ops/verify_sample/params.hpp"

namespace specdec::ops {
namespace verify_sample_detail {

// The request's per-node arrays in dynamic shared memory, N entries each.
struct NodeArrays {
  uint64_t* child_logit;  // (parent << 32) | bits of the child's token logit in the parent's row;
                          // parent 0xffffffff: not loaded (out-of-vocabulary token or bad link)
  TargetDist* row_dist;   // each row's distribution, its mass and its error
  float* row_mass;
  int32_t* row_error;
  float* child_weight;    // the loaded child logit's weight in its parent's row
  float* child_q;         // sampled drafts: the child token's draft probability in that row
  int32_t* decision;      // the child the node accepts (verify_sample_kernel's step 2c)
  float* u_accept;        // the node's uniforms: its accept test (index 0), and the draw at it
  float* u_draw;          // (index 1)
  int32_t* token;
  int32_t* first_child;
  int32_t* next_sibling;
  int32_t* rejected;      // rejected sibling tokens of the visited node
  int32_t* path;          // accepted nodes

  static constexpr size_t kBytesPerNode =
      sizeof(uint64_t) + sizeof(TargetDist) + 5 * sizeof(float) + 7 * sizeof(int32_t);

  __device__ static NodeArrays carve(void* base, int n) {
    NodeArrays a;
    auto* p = static_cast<unsigned char*>(base);
    auto take = [&](auto*& out, size_t bytes) {
      out = reinterpret_cast<std::remove_reference_t<decltype(out)>>(p);
      p += bytes * static_cast<size_t>(n);
    };
    take(a.child_logit, sizeof(uint64_t));
    take(a.row_dist, sizeof(TargetDist));
    take(a.row_mass, sizeof(float));
    take(a.row_error, sizeof(int32_t));
    take(a.child_weight, sizeof(float));
    take(a.child_q, sizeof(float));
    take(a.decision, sizeof(int32_t));
    take(a.u_accept, sizeof(float));
    take(a.u_draw, sizeof(float));
    take(a.token, sizeof(int32_t));
    take(a.first_child, sizeof(int32_t));
    take(a.next_sibling, sizeof(int32_t));
    take(a.rejected, sizeof(int32_t));
    take(a.path, sizeof(int32_t));
    return a;
  }
};

constexpr uint64_t kNotLoaded = ~uint64_t{0};

}  // namespace verify_sample_detail

// A template (on the block size, which must be kSampleThreads) for inline linkage across TUs, and
// on whether the drafts are sampled (draft_probs given): each form leaves the other's walk out,
// and both keep to 64 registers without spilling (ptxas, sm_90).
// Launched with programmatic dependent launch, its blocks wait for the kernels before.
template <int kThreads, bool kSampled>
__global__ void __launch_bounds__(kThreads, 1)
    verify_sample_kernel(__grid_constant__ VerifySampleParams const p) {
  static_assert(kThreads == kSampleThreads, "the block agents assume kSampleThreads threads");
  using verify_sample_detail::kNotLoaded;
  __shared__ SampleShared sh;
  extern __shared__ uint64_t node_memory[];
  int const b = blockIdx.x;
  int const N = p.tree.nodes, V = p.vocab, P = p.out.path_capacity, chunks = sample_chunks(V);
  auto const a = verify_sample_detail::NodeArrays::carve(node_memory, N);
  int32_t const count = p.tree.count(b);
  float const temperature = p.config.temperature_of(b);
  SampleChunkPartial const* partials = static_cast<SampleChunkPartial const*>(p.workspace);
  uint32_t const* min_keys =
      sample_min_keys(p.workspace, static_cast<int64_t>(p.tree.batch) * N, V);
  int32_t status = p.links.tree_status[b] != kTreeOk ? kSampleBadTree : kSampleOk;
  if (count < 1 || count > N) status = kSampleBadTree;
  if (status == kSampleOk) status = sample_config_error(temperature, p.config.top_p_of(b));
  int64_t const row0 = static_cast<int64_t>(b) * N;
  uint64_t const seed = p.keys.seed[b];
  uint32_t const step = p.keys.step[b];
  uint32_t const request_id = p.keys.request_id ? p.keys.request_id[b] : static_cast<uint32_t>(b);
  if (status == kSampleOk) {
    // 1a. The tree into shared memory, and each node's two uniforms (the walk then reads them
    //     instead of running Philox on its chain of decisions).
    for (int i = threadIdx.x; i < count; i += kThreads) {
      a.token[i] = p.tree.tokens[row0 + i];
      a.first_child[i] = p.links.first_child[row0 + i];
      a.next_sibling[i] = p.links.next_sibling[row0 + i];
      a.child_logit[i] = kNotLoaded;
      a.u_accept[i] = philox_uniform(seed, request_id, step, static_cast<uint32_t>(i), 0);
      a.u_draw[i] = philox_uniform(seed, request_id, step, static_cast<uint32_t>(i), 1);
    }
    __syncthreads();
    // 1b. The children's logits (one thread per node), and for sampled drafts their draft
    //     probabilities.
    for (int n = threadIdx.x; n < count; n += kThreads) {
      float const* row = p.logits + (row0 + n) * V;
      float const* q_row = kSampled ? p.draft_probs + (row0 + n) * V : nullptr;
      // Links only move forward (verify_sample_link_ok), so the list ends within N steps. A node
      // on two lists (malformed links) is tagged with one parent; the walk checks the tag.
      for (int32_t c = a.first_child[n], after = n; c != -1 && verify_sample_link_ok(c, after, count);
           after = c, c = a.next_sibling[c]) {
        int32_t const x = a.token[c];
        if (x >= 0 && x < V) {
          a.child_logit[c] = (static_cast<uint64_t>(n) << 32) | __float_as_uint(__ldg(row + x));
          if (q_row) a.child_q[c] = __ldg(q_row + x);
        }
      }
    }
  }
  // Everything above reads the op's inputs, which the kernels before verify_sample_cuda's first
  // launch wrote: that kernel's blocks passed their own wait before this grid could launch, so
  // the inputs are complete here. Only the workspace (partials, thresholds) needs the wait.
  await_prior_kernels();
  // Sampled drafts: the node whose residual max(w - C q, 0) the walk leaves to the next kernel
  // (-1: none), and its C.
  __shared__ int32_t residual_node;
  __shared__ float residual_c;
  if (threadIdx.x == 0) residual_node = -1;
  if (status == kSampleOk) {
    // 2. Row distributions (one warp per row).
    for (int n = threadIdx.x >> 5; n < count; n += kSampleWarps) {
      TargetDist d;
      float mass;
      uint32_t const min_key = sample_detail::row_min_key(p.config, b, V, min_keys, row0 + n);
      int32_t const e = sample_detail::warp_dist_from_partials(
          partials + (row0 + n) * chunks, chunks, temperature, min_key, d, mass);
      if ((threadIdx.x & 31) == 0) {
        a.row_dist[n] = d;
        a.row_mass[n] = mass;
        a.row_error[n] = e;
      }
    }
    __syncthreads();
    // 2b. Each loaded child's weight in its parent's row (one thread per node).
    for (int c = threadIdx.x; c < count; c += kThreads) {
      uint64_t const e = a.child_logit[c];
      if (e != kNotLoaded) {
        a.child_weight[c] = a.row_dist[static_cast<int32_t>(e >> 32)].weight(
            a.token[c], __uint_as_float(static_cast<uint32_t>(e)));
      }
    }
    __syncthreads();
  }
  int len = 1, n = 0, n_rejected = 0;
  int32_t next_token = -1;
  int32_t* rejected = a.rejected;
  auto row_of = [&](int32_t node) { return p.logits + (static_cast<int64_t>(b) * N + node) * V; };
  auto parts_of = [&](int32_t node) { return partials + (static_cast<int64_t>(b) * N + node) * chunks; };
  // Whether step 1b loaded child c's values from node's row (c is tagged with the node).
  auto loaded_by = [&](int32_t c, int32_t node) {
    return (a.child_logit[c] >> 32) == static_cast<uint64_t>(node);
  };
  // Weight in node's row of child c's token x: step 2b's when step 1b loaded it.
  auto w_child = [&](int32_t node, TargetDist const& dist, int32_t c, int32_t x) {
    if (x < 0 || x >= V) return 0.0f;
    return loaded_by(c, node) ? a.child_weight[c] : dist.weight(x, __ldg(row_of(node) + x));
  };
  // Deterministic drafts: node's children tried in sibling order by the calling thread alone
  // (the children's tokens are distinct rejected tokens or repeats of them until one is
  // accepted). Returns the accepted child, -1 when every child is rejected, kBrokenLink when a
  // link is malformed. Which child a node accepts does not depend on the path to it, so every
  // node decides in parallel (step 2c) and the walk follows the decisions.
  constexpr int32_t kBrokenLink = -2;
  auto decide = [&](int32_t node) {
    TargetDist const& dist = a.row_dist[node];
    float const total = a.row_mass[node];
    float rejected_mass = 0.0f;
    int32_t const child0 = a.first_child[node];
    for (int32_t c = child0, after = node; c != -1; after = c, c = a.next_sibling[c]) {
      if (!verify_sample_link_ok(c, after, count)) return kBrokenLink;
      int32_t const x = a.token[c];
      bool repeat = false;  // an earlier sibling's token: rejected already
      for (int32_t e = child0; e != c && !repeat; e = a.next_sibling[e]) repeat = a.token[e] == x;
      if (repeat) continue;
      float const wx = w_child(node, dist, c, x);
      if (sample_accept_deterministic(a.u_accept[c], total - rejected_mass, wx)) return c;
      rejected_mass += wx;
    }
    return int32_t{-1};
  };
  // Sampled drafts: node's first child if its accept test (no sibling rejected yet) passes, else
  // -1 (a rejected first child or a malformed link: the block's walk takes the node from there).
  auto decide_first = [&](int32_t node) {
    int32_t const c = a.first_child[node];
    if (c == -1 || !verify_sample_link_ok(c, node, count)) return int32_t{-1};
    int32_t const x = a.token[c];
    if (x < 0 || x >= V) return int32_t{-1};  // q_x = 0: never accepted
    float const qx =
        loaded_by(c, node) ? a.child_q[c] : __ldg(p.draft_probs + (row0 + node) * V + x);
    float const rx = sample_residual_weight(w_child(node, a.row_dist[node], c, x), qx, 0.0f);
    return sample_accept_sampled(a.u_accept[c], a.row_mass[node], qx, rx) ? c : int32_t{-1};
  };
  // The draw at node from w less the rejected tokens (block-wide): deterministic drafts'
  // correction, and with sampled drafts the bonus where no child was rejected.
  auto correction = [&](int32_t node, TargetDist const& dist) {
    if (dist.greedy_token >= 0 && !sample_detail::is_excluded(dist.greedy_token, rejected, n_rejected)) {
      return dist.greedy_token;  // what the one-hot inverse CDF returns for any u
    }
    float const* row = row_of(node);
    auto w = [&](int v, float l) { return dist.weight(v, l); };
    float const u = a.u_draw[node];
    int32_t token = sample_detail::block_row_sample(row, V, parts_of(node), dist, rejected,
                                                    n_rejected, u, sh);
    if (token < 0) {  // rounding only: stay inside the residual's support
      token = sample_detail::block_argmax_weight(row, V, w, rejected, n_rejected, sh);
    }
    if (token < 0) token = sample_detail::block_sample(row, V, w, nullptr, 0, u, sh);
    return token;
  };
  constexpr bool sampled = kSampled;
  if (status == kSampleOk) {
    // 2c. Every node's decision (one thread per node; a row in error decides nothing).
    for (int i = threadIdx.x; i < count; i += kThreads) {
      if (a.row_error[i] == kSampleOk) a.decision[i] = sampled ? decide_first(i) : decide(i);
    }
    __syncthreads();
    // 3. Thread 0 follows the decisions from the root until a node accepts nothing or the path
    //    is full. Deterministic drafts: it lists the distinct tokens of that node's children (all
    //    rejected) unless the path is full, then the block draws the correction. Sampled drafts:
    //    the block's walk goes on from that node.
    __shared__ int32_t walk[4];  // status, len, node where the walk stopped, its rejected count
    if (threadIdx.x == 0) {
      while (true) {
        status = a.row_error[n];
        if (status != kSampleOk || len >= P) break;
        int32_t const d = a.decision[n];
        if (d == kBrokenLink) status = kSampleBadTree;
        if (d < 0) break;
        a.path[len++] = d;
        n = d;
      }
      if (!sampled && status == kSampleOk && len < P) {
        for (int32_t c = a.first_child[n]; c != -1; c = a.next_sibling[c]) {
          if (!sample_detail::is_excluded(a.token[c], rejected, n_rejected)) {
            rejected[n_rejected++] = a.token[c];
          }
        }
      }
      walk[0] = status, walk[1] = len, walk[2] = n, walk[3] = n_rejected;
    }
    __syncthreads();
    status = walk[0], len = walk[1], n = walk[2], n_rejected = walk[3];
    if (!sampled && status == kSampleOk) next_token = correction(n, a.row_dist[n]);
  }
  while (sampled && status == kSampleOk) {  // sampled drafts: the block walks on
    float const* row = row_of(n);
    TargetDist const dist = a.row_dist[n];
    float const total = a.row_mass[n];
    status = a.row_error[n];
    if (status != kSampleOk) break;
    int32_t accepted = -1;
    float const* q = p.draft_probs + (static_cast<int64_t>(b) * N + n) * V;
    float c_mass = 0.0f, residual_mass = total;
    bool summed = true;  // residual_mass is the current residual's (summed when a sibling needs it)
    auto residual = [&](int v, float l) {
      return sample_residual_weight(dist.weight(v, l), __ldg(q + v), c_mass);
    };
    int32_t const child0 = len < P ? a.first_child[n] : -1;
    for (int32_t c = child0, after = n; c != -1; after = c, c = a.next_sibling[c]) {
      if (!verify_sample_link_ok(c, after, count)) {
        status = kSampleBadTree;
        break;
      }
      if (!summed) residual_mass = sample_detail::block_weight_sum(row, V, residual, sh);
      summed = true;
      int32_t const x = a.token[c];
      bool const in_vocab = x >= 0 && x < V;
      float const qx = in_vocab ? (loaded_by(c, n) ? a.child_q[c] : __ldg(q + x)) : 0.0f;
      float const rx = in_vocab ? sample_residual_weight(w_child(n, dist, c, x), qx, c_mass) : 0.0f;
      if (sample_accept_sampled(a.u_accept[c], residual_mass, qx, rx)) {
        accepted = c;
        break;
      }
      c_mass += residual_mass;
      summed = false;
    }
    if (status != kSampleOk) break;
    if (accepted < 0 && c_mass == 0.0f) {
      // No child was rejected (a leaf, or the path is full): the residual is the target's own
      // distribution, drawn from the chunk partials as the deterministic correction is.
      next_token = correction(n, dist);
    } else if (accepted < 0) {
      // The residual's draw is verify_sample_residual_kernel's, over the whole GPU.
      if (threadIdx.x == 0) {
        residual_node = n;
        residual_c = c_mass;
      }
    }
    if (accepted < 0) break;
    if (threadIdx.x == 0) a.path[len] = accepted;
    ++len;
    n = accepted;
  }
  __syncthreads();
  int32_t* path = p.out.accepted_path + static_cast<int64_t>(b) * P;
  bool const ok = status == kSampleOk;
  for (int i = threadIdx.x; i < P; i += kSampleThreads) {
    path[i] = i == 0 ? 0 : (ok && i < len ? a.path[i] : -1);
  }
  if (threadIdx.x == 0) {
    p.out.num_accepted[b] = ok ? len - 1 : 0;
    p.out.next_token[b] = ok ? next_token : -1;
    p.status[b] = status;
    if (sampled) {
      VerifyResidualDraw draw;
      if (ok && residual_node >= 0) {
        draw.dist = a.row_dist[residual_node];
        draw.c_mass = residual_c;
        draw.u = a.u_draw[residual_node];
        draw.node = residual_node;
      }
      verify_residual_draws(p.workspace, p.tree.batch, N, V)[b] = draw;
    }
  }
}

// Sampled drafts: the residual draws the walks left. grid (B, ceil(V / kSampleChunk)): block
// (b, c) sums chunk c of request b's residual max(w - C q, 0) (4 values per thread, read once)
// into the workspace, and the last of the request's blocks to finish draws the token from those
// masses and one pass over the chosen chunk (block_sample_chunks); where rounding leaves the
// residual no mass, from w (the row's chunk partials). Requests without a draw leave at once.
template <int kThreads>
__global__ void __launch_bounds__(kThreads, 1)
    verify_sample_residual_kernel(__grid_constant__ VerifySampleParams const p) {
  static_assert(kThreads == kSampleThreads, "the block agents assume kSampleThreads threads");
  await_prior_kernels();
  __shared__ SampleShared sh;
  __shared__ bool last;
  int const b = blockIdx.x, chunk = blockIdx.y;
  int const N = p.tree.nodes, V = p.vocab, chunks = sample_chunks(V);
  VerifyResidualDraw* draws = verify_residual_draws(p.workspace, p.tree.batch, N, V);
  VerifyResidualDraw const draw = draws[b];
  if (draw.node < 0) return;
  int64_t const row_index = static_cast<int64_t>(b) * N + draw.node;
  float const* row = p.logits + row_index * V;
  float const* q = p.draft_probs + row_index * V;
  auto residual = [&](int v, float l, float qv) {
    return sample_residual_weight(draw.dist.weight(v, l), qv, draw.c_mass);
  };
  auto residual_of = [&](int v) { return residual(v, __ldg(row + v), __ldg(q + v)); };
  float mine = 0.0f;
  int const v0 = chunk * kSampleChunk + 4 * static_cast<int>(threadIdx.x);
  if (v0 + 3 < V && (reinterpret_cast<uintptr_t>(row + v0) & 15u) == 0 &&
      (reinterpret_cast<uintptr_t>(q + v0) & 15u) == 0) {
    float4 const l = __ldg(reinterpret_cast<float4 const*>(row + v0));
    float4 const x = __ldg(reinterpret_cast<float4 const*>(q + v0));
    mine = residual(v0, l.x, x.x) + residual(v0 + 1, l.y, x.y) + residual(v0 + 2, l.z, x.z) +
           residual(v0 + 3, l.w, x.w);
  } else {
    for (int j = 0; j < 4; ++j) mine += v0 + j < V ? residual_of(v0 + j) : 0.0f;
  }
  float const mass = sample_detail::block_sum(mine, sh);
  float* masses = verify_residual_masses(p.workspace, p.tree.batch, N, V) + int64_t{b} * chunks;
  if (threadIdx.x == 0) {
    masses[chunk] = mass;
    __threadfence();  // the mass is visible before the count says so
    last = atomicAdd(&draws[b].arrived, 1u) == static_cast<uint32_t>(chunks - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  auto chunk_weight = [&](int c) { return __ldcg(masses + c); };  // other blocks' writes: L2
  int32_t token = sample_detail::block_sample_chunks(V, chunk_weight, residual_of, draw.u, sh);
  if (token < 0) {
    SampleChunkPartial const* parts =
        static_cast<SampleChunkPartial const*>(p.workspace) + row_index * chunks;
    token = sample_detail::block_row_sample(row, V, parts, draw.dist, nullptr, 0, draw.u, sh);
  }
  if (threadIdx.x == 0) p.out.next_token[b] = token;
}

inline Status verify_sample_cuda(VerifySampleParams const& p, cudaStream_t stream) {
  SPECDEC_RETURN_IF_ERROR(launch_sample_chunk_partials(
      p.logits, static_cast<int64_t>(p.tree.batch) * p.tree.nodes, p.vocab, p.tree.nodes, p.config,
      p.workspace, stream));
  SPECDEC_RETURN_IF_ERROR(launch_sample_row_thresholds(
      p.logits, static_cast<int64_t>(p.tree.batch) * p.tree.nodes, p.vocab, p.tree.nodes, p.config,
      p.workspace, stream));
  size_t const node_bytes = verify_sample_detail::NodeArrays::kBytesPerNode * p.tree.nodes;
  auto const kernel = p.draft_probs ? verify_sample_kernel<kSampleThreads, true>
                                    : verify_sample_kernel<kSampleThreads, false>;
  if (node_bytes + sizeof(SampleShared) > 48 * 1024) {
    // Above the default 48 KB per block: opt in (a function attribute, no stream work).
    cudaError_t const err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(node_bytes));
    if (err != cudaSuccess) return cuda_status(err, "verify_sample: cudaFuncSetAttribute");
  }
  SPECDEC_RETURN_IF_ERROR(launch_kernel("verify_sample_kernel", kernel, dim3(p.tree.batch),
                                       kSampleThreads, node_bytes, stream, p));
  if (p.draft_probs == nullptr) return Status::Ok();
  return launch_kernel("verify_sample_residual_kernel",
                       verify_sample_residual_kernel<kSampleThreads>,
                       dim3(p.tree.batch, sample_chunks(p.vocab)), kSampleThreads, 0, stream, p);
}

}  // namespace specdec::ops
