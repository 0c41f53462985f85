// sample: one token per request from the target distribution of a logit row (greedy where
// temperature <= 0, else temperature / top-k / top-p; definition in sample/params.hpp).
// Shapes: logits [B, V] float, config arrays [B], keys [B], tokens [B] int32, status [B] int32.
//   ops::sample(CpuExecutor{}, params)        host pointers, the plain-loop reference
//   ops::sample(CudaExecutor{stream}, params) device pointers and a workspace of
//                                             sample_workspace_bytes(B, V); no host sync
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/sample/params.hpp"
#include "specdec/ops/sample/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/sample/kernel.cuh"
#endif

namespace specdec::ops {

inline Status sample(CpuExecutor, SampleParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return sample_reference(p);
}

#if defined(__CUDACC__)
inline Status sample(CudaExecutor e, SampleParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  SPECDEC_RETURN_IF_ERROR(validate_workspace(p));
  return sample_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
