// linear_bf16: y [T, out] = beta y + x [T, in] W^T for T <= 8 rows, bf16 x and W [out, in], fp32 or
// bf16 y; the rule is in linear_bf16/params.hpp. The decode and verify steps' dense layers: the
// weight is read once at the memory's speed, where a GEMM library pads T to a tile and splits k.
//   ops::linear_bf16(CpuExecutor{}, params)        host pointers, the plain-loop reference
//   ops::linear_bf16(CudaExecutor{stream}, params) device pointers, tensor cores, no host sync
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/linear_bf16/params.hpp"
#include "specdec/ops/linear_bf16/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/linear_bf16/kernel.cuh"
#endif

namespace specdec::ops {

inline Status linear_bf16(CpuExecutor, LinearBf16Params const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return linear_bf16_cpu(p);
}

#if defined(__CUDACC__)
inline Status linear_bf16(CudaExecutor e, LinearBf16Params const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return linear_bf16_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
