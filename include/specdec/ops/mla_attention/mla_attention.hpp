// mla_attention: absorbed MLA attention of T new tokens over the paged latent KV cache of one
// layer: q [T, heads, c + r] (absorbed queries) -> out [T, heads, c] (latent context per head),
// each token attending to its request's cached slots and its visible new tokens (causal, or a tree
// verify mask); the rule, the shapes and the data contract are in mla_attention/params.hpp.
//   ops::mla_attention(CpuExecutor{}, params)        host pointers, the plain-loop reference
//   ops::mla_attention(CudaExecutor{stream}, params) device pointers and a workspace of
//                                                    mla_attention_workspace_bytes(T, heads, c,
//                                                    max_slots); flash-decoding split over chunks
//                                                    of slots, no host sync, graph-capturable
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/mla_attention/params.hpp"
#include "specdec/ops/mla_attention/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/mla_attention/kernel.cuh"
#endif

namespace specdec::ops {

inline Status mla_attention(CpuExecutor, MlaAttentionParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return mla_attention_cpu(p);
}

#if defined(__CUDACC__)
inline Status mla_attention(CudaExecutor e, MlaAttentionParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  SPECDEC_RETURN_IF_ERROR(validate_cuda(p));
  return mla_attention_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
