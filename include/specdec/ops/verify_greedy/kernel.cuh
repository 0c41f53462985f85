// verify_greedy CUDA kernels.
//   kernel 1 (verify_greedy_argmax_kernel): argmax of every row of logits [B*N, V] into
//     argmax_scratch [B, N] with 16-byte streaming loads. When B*N is small a row is split over a
//     thread-block cluster of `split` blocks (sm_90) that combine through distributed shared
//     memory, so a handful of rows still keeps the memory system busy.
//   kernel 2 (verify_greedy_accept_kernel): one block per request, one thread per node. The
//     tree goes into shared memory before the programmatic wait (behind the argmax kernel's
//     tail), the argmax after it. Each thread walks its ancestors (bounded by depth) checking
//     tokens against the parents' argmax; a block max-reduction over accept_key(depth, node)
//     picks the deepest accepted node.
// The accept kernel launches with programmatic dependent launch (core/cuda.cuh), and so does the
// argmax kernel where it splits rows over clusters (few rows, where its launch shows), so their
// blocks are in place when the kernel before ends; with whole rows a block each, in order.
// Launches never synchronise or read device data on the host (graph-capturable).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "specdec/core/cuda.cuh"
#include "specdec/core/warp.cuh"
#include "specdec/ops/verify_greedy/params.hpp"

namespace specdec::ops {
namespace verify_greedy_detail {

// 256 threads x kUnroll float4 loads in flight per thread per step: 8 (32 KiB per block) where
// rows are split over clusters (few rows: latency-bound, a block's share streams in few round
// trips), 4 (16 KiB) for whole rows, where up to 8 blocks per SM already cover H200 latency x
// bandwidth and 8 measured ~20% slower at 1024 rows. (See bench_verify_greedy.)
constexpr int kArgmaxThreads = 256;
constexpr int kSplitUnroll = 8;
constexpr int kRowUnroll = 4;
// Largest cluster size on sm_90 (16 is beyond the portable 8: the kernel opts in).
constexpr int kMaxSplit = 16;
// Split rows until the grid has at least this many blocks (~2 per SM on a 132-SM H200)...
constexpr int kTargetBlocks = 264;
// ...but keep at least this many float4 vectors per block so the split pays for its combine.
constexpr int kMinVectorsPerBlock = 1024;
constexpr int kAcceptMaxThreads = kVerifyGreedyMaxNodes;

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ void consume4(uint64_t& best, float4 const x, int32_t index) {
  uint64_t k0 = pack_value_index(x.x, index), k1 = pack_value_index(x.y, index + 1);
  uint64_t k2 = pack_value_index(x.z, index + 2), k3 = pack_value_index(x.w, index + 3);
  k0 = k1 > k0 ? k1 : k0;
  k2 = k3 > k2 ? k3 : k2;
  k0 = k2 > k0 ? k2 : k0;
  best = k0 > best ? k0 : best;
}

// grid.x = B * N * split; blocks [row*split, row*split + split) form one cluster when split > 1.
template <int kArgmaxUnroll>
__global__ void __launch_bounds__(kArgmaxThreads)
    verify_greedy_argmax_kernel(__grid_constant__ VerifyGreedyParams const p, int const split) {
  await_prior_kernels();
  int64_t const row = blockIdx.x / split;
  int const rank = static_cast<int>(blockIdx.x % split);
  int const nodes = p.tree.nodes;
  int const b = static_cast<int>(row / nodes), i = static_cast<int>(row % nodes);
  // Uniform over the cluster (all its blocks share the row), so a whole cluster leaves together.
  if (i >= verify_greedy_request_nodes(p, b)) {
    if (rank == 0 && threadIdx.x == 0) p.argmax_scratch[row] = -1;
    return;
  }
  int const vocab = p.vocab;
  float const* x = p.logits + row * vocab;
  // Scalar head up to 16-byte alignment, float4 body split over the cluster, scalar tail.
  int const head =
      min(static_cast<int>((4 - ((reinterpret_cast<uintptr_t>(x) >> 2) & 3)) & 3), vocab);
  int const vectors = (vocab - head) >> 2;
  int const tail_start = head + 4 * vectors;
  float4 const* xv = reinterpret_cast<float4 const*>(x + head);
  int const v_begin = static_cast<int>(static_cast<int64_t>(vectors) * rank / split);
  int const v_end = static_cast<int>(static_cast<int64_t>(vectors) * (rank + 1) / split);
  int const tid = threadIdx.x;
  uint64_t best = 0;
  int v = v_begin + tid;
  for (; v + (kArgmaxUnroll - 1) * kArgmaxThreads < v_end; v += kArgmaxUnroll * kArgmaxThreads) {
    float4 buf[kArgmaxUnroll];
#pragma unroll
    for (int u = 0; u < kArgmaxUnroll; ++u) buf[u] = __ldcs(xv + v + u * kArgmaxThreads);
#pragma unroll
    for (int u = 0; u < kArgmaxUnroll; ++u)
      consume4(best, buf[u], head + 4 * (v + u * kArgmaxThreads));
  }
  for (; v < v_end; v += kArgmaxThreads) consume4(best, __ldcs(xv + v), head + 4 * v);
  if (rank == 0) {
    if (tid < head) {
      uint64_t const k = pack_value_index(x[tid], tid);
      best = k > best ? k : best;
    }
    if (tail_start + tid < vocab) {
      uint64_t const k = pack_value_index(x[tail_start + tid], tail_start + tid);
      best = k > best ? k : best;
    }
  }
  __shared__ uint64_t warp_best[kArgmaxThreads / 32];
  __shared__ uint64_t block_best;
  best = warp_max_u64(best);
  if ((tid & 31) == 0) warp_best[tid >> 5] = best;
  __syncthreads();
  if (tid < 32) {
    best = warp_max_u64(tid < kArgmaxThreads / 32 ? warp_best[tid] : 0);
    if (tid == 0) block_best = best;
  }
  if (split > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's block_best is written
    if (rank == 0 && tid == 0) {
      for (int r = 1; r < split; ++r) {
        uint64_t const other = *cluster.map_shared_rank(&block_best, r);
        best = other > best ? other : best;
      }
    }
    cluster.sync();  // no block leaves while rank 0 still reads its shared memory
#else
    __trap();  // the launcher only splits rows on devices with clusters (sm_90+)
#endif
  }
  if (rank == 0 && tid == 0) p.argmax_scratch[row] = unpack_index(best);
}

// grid.x = B, blockDim.x = min(1024, N rounded up to a warp).
static __global__ void __launch_bounds__(kAcceptMaxThreads)
    verify_greedy_accept_kernel(__grid_constant__ VerifyGreedyParams const p) {
  int const b = blockIdx.x, nodes = p.tree.nodes, cap = p.out.path_capacity;
  int const tid = threadIdx.x;
  __shared__ int32_t tokens[kVerifyGreedyMaxNodes];
  __shared__ int32_t parents[kVerifyGreedyMaxNodes];
  __shared__ int32_t depths[kVerifyGreedyMaxNodes];
  __shared__ int32_t argmax[kVerifyGreedyMaxNodes];
  __shared__ uint32_t warp_best[kAcceptMaxThreads / 32];
  __shared__ uint32_t best_key;
  // The request's tree is the op's input, read before the wait: this kernel follows the argmax
  // kernel, whose blocks passed their own wait first, or a copy (a full dependency), so the
  // kernels that wrote it are complete (core/cuda.cuh). Only argmax_scratch needs the wait.
  int const n = verify_greedy_request_nodes(p, b);
  int64_t const base = static_cast<int64_t>(b) * nodes;
  for (int i = tid; i < n; i += blockDim.x) {
    tokens[i] = p.tree.tokens[base + i];
    parents[i] = p.tree.parents[base + i];
    depths[i] = min(max(p.links.depth[base + i], 0), n - 1);
  }
  await_prior_kernels();
  int32_t* path = p.out.accepted_path + static_cast<int64_t>(b) * cap;
  if (n == 0) {  // skipped request (uniform over the block)
    for (int k = tid; k < cap; k += blockDim.x) path[k] = k == 0 ? 0 : -1;
    if (tid == 0) {
      p.out.num_accepted[b] = 0;
      p.out.next_token[b] = -1;
    }
    return;
  }
  for (int i = tid; i < n; i += blockDim.x) argmax[i] = p.argmax_scratch[base + i];
  __syncthreads();
  uint32_t key = 0;
  for (int i = tid; i < n; i += blockDim.x) {
    int const d = depths[i];
    int node = i;
    bool ok = true;
    for (int s = 0; s < d && ok; ++s) {  // at most N-1 steps
      int const parent = parents[node];
      ok = parent >= 0 && parent < node && tokens[node] == argmax[parent];
      node = parent;
    }
    if (ok && node == 0) key = max(key, accept_key(d, i));
  }
  key = warp_max_u32(key);
  if ((tid & 31) == 0) warp_best[tid >> 5] = key;
  __syncthreads();
  if (tid < 32) {
    int const warps = (blockDim.x + 31) >> 5;
    key = warp_max_u32(tid < warps ? warp_best[tid] : 0u);
    if (tid == 0) best_key = key;
  }
  __syncthreads();
  int const best = accept_key_node(best_key), d = accept_key_depth(best_key);
  for (int k = d + 1 + tid; k < cap; k += blockDim.x) path[k] = -1;
  if (tid == best % blockDim.x) {  // the path: d <= N-1 shared-memory steps
    int j = best;
    for (int k = d; k >= 0; --k) {
      if (k < cap) path[k] = j;
      j = k > 0 ? parents[j] : j;
    }
    p.out.num_accepted[b] = d;
    p.out.next_token[b] = argmax[best];
  }
}

// Blocks per row: powers of two up to kMaxSplit while the grid is small and rows are long.
inline int argmax_split(int64_t rows, int vocab, bool clusters) {
  if (!clusters) return 1;
  int split = 1;
  while (split < kMaxSplit && rows * split < kTargetBlocks &&
         vocab / 4 / (split * 2) >= kMinVectorsPerBlock) {
    split *= 2;
  }
  return split;
}

}  // namespace verify_greedy_detail

inline Status verify_greedy_cuda(VerifyGreedyParams const& p, cudaStream_t stream) {
  namespace d = verify_greedy_detail;
  int64_t const rows = static_cast<int64_t>(p.tree.batch) * p.tree.nodes;
  int const threads = std::min(d::kAcceptMaxThreads, (p.tree.nodes + 31) / 32 * 32);
  if (p.target_argmax != nullptr) {  // computed elsewhere (a vocabulary-sharded target)
    SPECDEC_CUDA_TRY(cudaMemcpyAsync(p.argmax_scratch, p.target_argmax,
                                     static_cast<size_t>(rows) * sizeof(int32_t),
                                     cudaMemcpyDeviceToDevice, stream));
    return launch_kernel("verify_greedy_accept_kernel", d::verify_greedy_accept_kernel,
                         dim3(p.tree.batch), threads, 0, stream, p);
  }
  bool clusters = false;
  SPECDEC_RETURN_IF_ERROR(current_device_has_clusters(clusters));
  int const split = d::argmax_split(rows, p.vocab, clusters);
  if (split > 8) {
    // A function attribute (no stream work), set before each launch that needs it: cheap, and
    // right on whichever device is current.
    SPECDEC_CUDA_TRY(cudaFuncSetAttribute(d::verify_greedy_argmax_kernel<d::kSplitUnroll>,
                                          cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  if (rows * split > 0x7fffffff) {
    return Status::InvalidArgument("verify_greedy: B*N = " + std::to_string(rows) +
                                   " rows exceed the grid limit");
  }
  auto const argmax = split > 1 ? d::verify_greedy_argmax_kernel<d::kSplitUnroll>
                                : d::verify_greedy_argmax_kernel<d::kRowUnroll>;
  SPECDEC_RETURN_IF_ERROR(launch_cluster_kernel("verify_greedy_argmax_kernel", argmax,
                                                dim3(static_cast<unsigned>(rows * split)),
                                                d::kArgmaxThreads, 0, stream, split,
                                                split > 1 ? ClusterLaunch::kAwaits
                                                          : ClusterLaunch::kInOrder,
                                                p, split));
  return launch_kernel("verify_greedy_accept_kernel", d::verify_greedy_accept_kernel,
                       dim3(p.tree.batch), threads, 0, stream, p);
}

}  // namespace specdec::ops
