// tree_build CUDA kernel: one block per request, one thread per node (blockDim = N rounded up to
// a warp, N <= 1024). The request's parents are staged in shared memory; each thread walks its own
// ancestors (O(depth), bounded by a prior block-wide check of every parent) for depth and its
// mask row, takes its first child from a shared atomicMin over the children, scans the parents
// once (O(N)) for its next sibling, and a leaf writes its index at its rank among the leaves (a
// block prefix count of leaf flags); then one thread per leaf_paths row builds the path by
// walking up from the leaf through the shared parents, into shared memory when the [N, P] rows
// fit in kTreeBuildStagedBytes (then the block writes them out whole, coalesced), else straight
// to memory.
// Validation checks are block-wide ORs, so a bad request stops before any walk. The launcher does
// no host synchronisation, allocation or host read of device data (graph-capturable).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/tree.hpp"
#include "specdec/ops/tree_build/params.hpp"

namespace specdec::ops {
namespace tree_build_detail {

constexpr int kWarps = kTreeBuildMaxNodes / 32;
// leaf_paths rows staged in dynamic shared memory (stride P + 1 words) up to this size; with the
// static arrays below the block stays under the default 48 KB.
constexpr size_t kTreeBuildStagedBytes = 24 * 1024;
inline size_t staged_path_bytes(int nodes, int path_capacity) {
  return static_cast<size_t>(nodes) * (path_capacity + 1) * sizeof(int32_t);
}

static __global__ void __launch_bounds__(kTreeBuildMaxNodes)
    tree_build_kernel(__grid_constant__ TreeBuildParams const p, bool const staged) {
  await_prior_kernels();
  extern __shared__ int32_t s_paths[];  // [N, P + 1] when staged
  __shared__ int32_t s_par[kTreeBuildMaxNodes];
  __shared__ int32_t s_first[kTreeBuildMaxNodes];  // smallest child index, INT32_MAX for none
  __shared__ int32_t s_warp_leaves[kWarps];
  __shared__ int32_t s_leaf[kTreeBuildMaxNodes];   // node index of the k-th leaf
  __shared__ int32_t s_depth[kTreeBuildMaxNodes];  // -1 for unused nodes
  int const b = blockIdx.x;
  int const i = threadIdx.x;
  int const N = p.tree.nodes, W = mask_words(N), P = p.out.path_capacity;
  int64_t const row0 = static_cast<int64_t>(b) * N;
  int const count = p.tree.count(b);  // block-uniform, so every branch below on status is too

  int32_t status = (count < 1 || count > N) ? kTreeBadNodeCount : kTreeOk;
  if (status == kTreeOk && i < count) s_par[i] = p.tree.parents[row0 + i];
  __syncthreads();
  if (status == kTreeOk) {
    if (s_par[0] != -1) {
      status = kTreeBadRoot;
    } else if (__syncthreads_or(i > 0 && i < count && !tree_parent_ok(s_par[i], i))) {
      status = kTreeBadParent;
    }
  }
  int depth = -1;
  if (status == kTreeOk) {
    if (i < count) depth = tree_node_depth(s_par, i);
    if (__syncthreads_or(depth + 1 > P)) status = kTreeTooDeep;
  }
  int const n = status == kTreeOk ? count : 0;
  bool const used = i < n;
  if (i < N) s_first[i] = INT32_MAX;
  __syncthreads();
  if (used && i > 0) atomicMin(&s_first[s_par[i]], i);
  __syncthreads();

  int32_t first_child = -1;
  if (i < N) {
    uint32_t* mrow = p.out.mask + (row0 + i) * W;
    int32_t next_sibling = -1;
    if (used) {
      tree_write_mask_row(s_par, i, W, mrow);
      first_child = s_first[i] == INT32_MAX ? -1 : s_first[i];
      next_sibling = tree_next_sibling(s_par, n, i);
    } else {
      for (int w = 0; w < W; ++w) mrow[w] = 0;
    }
    p.out.depth[row0 + i] = used ? depth : -1;
    p.out.positions[row0 + i] = used ? p.prefix_len[b] + depth : -1;
    p.out.first_child[row0 + i] = first_child;
    p.out.next_sibling[row0 + i] = next_sibling;
  }

  // Leaf rank = leaves with a smaller index: warp ballots, then a scan of the per-warp counts.
  bool const leaf = used && first_child == -1;
  int const lane = i & 31, warp = i >> 5;
  unsigned const ballot = __ballot_sync(0xffffffffu, leaf);
  if (lane == 0) s_warp_leaves[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    int const c = s_warp_leaves[w];
    before += w < warp ? c : 0;
    total += c;
  }
  int const rank = before + __popc(ballot & ((1u << lane) - 1u));
  if (leaf) s_leaf[rank] = i;
  if (i < N) s_depth[i] = used ? depth : -1;
  __syncthreads();
  // leaf_paths: one thread per row; the k-th leaf's row holds its ancestors by depth, found by
  // one walk up the shared parents (d <= P - 1 steps), then -1 padding.
  for (int k = i; k < N; k += blockDim.x) {
    int32_t* row = staged ? s_paths + k * (P + 1) : p.out.leaf_paths + (row0 + k) * P;
    int const leaf_k = k < total ? s_leaf[k] : -1;
    int const d = leaf_k >= 0 ? s_depth[leaf_k] : -1;
    for (int t = d + 1; t < P; ++t) row[t] = -1;
    for (int t = d, node = leaf_k; t >= 0; --t, node = s_par[node]) row[t] = node;
  }
  if (staged) {
    __syncthreads();
    int32_t* const out = p.out.leaf_paths + row0 * P;
    for (int e = i; e < N * P; e += blockDim.x) out[e] = s_paths[(e / P) * (P + 1) + e % P];
  }
  if (i == 0) {
    p.out.leaf_count[b] = total;
    p.out.tree_status[b] = status;
  }
}

}  // namespace tree_build_detail

// Launches tree_build on `stream`; all pointers in p are device memory.
inline Status tree_build_cuda(TreeBuildParams const& p, cudaStream_t stream) {
  namespace d = tree_build_detail;
  int const threads = (p.tree.nodes + 31) / 32 * 32;
  size_t const bytes = d::staged_path_bytes(p.tree.nodes, p.out.path_capacity);
  bool const staged = bytes <= d::kTreeBuildStagedBytes;
  return launch_kernel("tree_build_kernel", d::tree_build_kernel, dim3(p.tree.batch), threads,
                       staged ? bytes : 0, stream, p, staged);
}

}  // namespace specdec::ops
