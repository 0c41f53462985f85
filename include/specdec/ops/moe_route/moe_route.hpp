// moe_route: DeepseekV3 / Kimi-K2.5 group-limited top-k routing of T tokens from router logits
// [T, E] (+ e_score_correction_bias [E]) to expert ids and weights [T, top_k]; the rule is in
// moe_route/params.hpp.
//   ops::moe_route(CpuExecutor{}, params)        host pointers, the plain-loop reference
//   ops::moe_route(CudaExecutor{stream}, params) device pointers, one warp per token, no host sync
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/moe_route/params.hpp"
#include "specdec/ops/moe_route/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/moe_route/kernel.cuh"
#endif

namespace specdec::ops {

inline Status moe_route(CpuExecutor, MoeRouteParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return moe_route_cpu(p);
}

#if defined(__CUDACC__)
inline Status moe_route(CudaExecutor e, MoeRouteParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return moe_route_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
