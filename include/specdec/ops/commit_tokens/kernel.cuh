// commit_tokens CUDA kernel: one thread per request runs commit_tokens_row (reference.hpp), the
// CPU reference's own per-request function; a step's batch is at most a few hundred requests of
// a few tokens each. No host synchronisation, allocation or host read (graph-capturable).
#pragma once

#include <cuda_runtime.h>

#include "specdec/core/cuda.cuh"
#include "specdec/core/math.hpp"
#include "specdec/ops/commit_tokens/reference.hpp"

namespace specdec::ops {
namespace commit_tokens_detail {

constexpr int kThreads = 128;

static __global__ void commit_tokens_kernel(__grid_constant__ CommitTokensParams const p) {
  await_prior_kernels();
  int const b = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (b < p.tree.batch) commit_tokens_row(p, b);
}

}  // namespace commit_tokens_detail

// Launches commit_tokens on `stream`; all pointers in p are device memory.
inline Status commit_tokens_cuda(CommitTokensParams const& p, cudaStream_t stream) {
  if (p.tree.batch == 0) return Status::Ok();
  unsigned const blocks =
      static_cast<unsigned>(ceil_div(p.tree.batch, commit_tokens_detail::kThreads));
  return launch_kernel("commit_tokens_kernel", commit_tokens_detail::commit_tokens_kernel,
                       dim3(blocks), commit_tokens_detail::kThreads, 0, stream, p);
}

}  // namespace specdec::ops
