// verify_sample: lossless speculative sampling over a token tree (deterministic drafts: target-only
// rule; sampled drafts: SpecInfer recursion), producing an Acceptance. Definition in
// verify_sample/params.hpp. Shapes: tokens [B, N], links [B, N], logits [B, N, V], draft_probs
// [B, N, V] or nullptr, accepted_path [B, P], num_accepted [B], next_token [B], status [B].
//   ops::verify_sample(CpuExecutor{}, params)        host pointers, the plain-loop reference
//   ops::verify_sample(CudaExecutor{stream}, params) device pointers and a workspace of
//                                                    verify_sample_workspace_bytes(B, N, V)
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/verify_sample/params.hpp"
#include "specdec/ops/verify_sample/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/verify_sample/kernel.cuh"
#endif

namespace specdec::ops {

inline Status verify_sample(CpuExecutor, VerifySampleParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return verify_sample_reference(p);
}

#if defined(__CUDACC__)
inline Status verify_sample(CudaExecutor e, VerifySampleParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  SPECDEC_RETURN_IF_ERROR(validate_workspace(p));
  return verify_sample_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
