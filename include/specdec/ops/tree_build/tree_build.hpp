// tree_build: the topology of a batch of token trees. From parents [B, N] (TreeInput) and
// prefix_len [B], writes the TreeTopology of core/tree.hpp: ancestor-or-self bitmask [B, N, W]
// (W = ceil(N/32)), depth / positions / first_child / next_sibling [B, N], leaf_paths [B, N, P],
// leaf_count [B] and tree_status [B]. Same call on a CpuExecutor (host pointers; returns
// MalformedInput for a bad tree) or a CudaExecutor (device pointers; writes tree_status only,
// turn it into a Status with check_tree_status after a download).
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/tree_build/params.hpp"
#include "specdec/ops/tree_build/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/tree_build/kernel.cuh"
#endif

namespace specdec::ops {

inline Status tree_build(CpuExecutor, TreeBuildParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return tree_build_reference(p);
}

#if defined(__CUDACC__)
inline Status tree_build(CudaExecutor e, TreeBuildParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return tree_build_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
