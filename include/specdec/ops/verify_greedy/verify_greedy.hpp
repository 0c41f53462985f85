// verify_greedy: greedy acceptance of a token tree. For every request, the target argmax of each
// node (argmax_scratch [B, N]), the deepest node whose whole path matches the target argmax
// (accepted_path [B, P], num_accepted [B]) and the bonus token at that node (next_token [B]).
// Inputs: TreeInput tokens/parents [B, N], TreeLinks depth [B, N] / tree_status [B], logits
// [B, N, V] float. Same call on a CpuExecutor (host pointers) or a CudaExecutor (device pointers).
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/verify_greedy/params.hpp"
#include "specdec/ops/verify_greedy/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/verify_greedy/kernel.cuh"
#endif

namespace specdec::ops {

inline Status verify_greedy(CpuExecutor, VerifyGreedyParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return verify_greedy_reference(p);
}

#if defined(__CUDACC__)
inline Status verify_greedy(CudaExecutor e, VerifyGreedyParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return verify_greedy_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
