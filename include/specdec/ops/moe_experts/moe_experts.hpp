// moe_experts: the routed experts of a DeepseekV3 / Kimi-K2.5 MoE layer. For x [T, H], ids /
// weights [T, top_k] (moe_route's outputs) and per-expert weight tables (bf16 or INT4
// compressed-tensors), y [T, H] = sum_k weights[t, k] * down_e(silu(gate_e x_t) * up_e x_t);
// the contract is in moe_experts/params.hpp.
//   ops::moe_experts(CpuExecutor{}, params)        host pointers, the plain-loop reference
//                                                  (an id outside [0, E) is an error)
//   ops::moe_experts(CudaExecutor{stream}, params) device pointers and a workspace of
//                                                  moe_experts_workspace_bytes(T, K, E, H, I);
//                                                  each expert's weights read once per launch,
//                                                  no host sync, graph-capturable (an id outside
//                                                  [0, E) contributes 0)
//   ops::moe_experts_tile_int4(executor, src, rows, cols, dst)
//                                                  an INT4 packed matrix [rows, cols/8],
//                                                  row-major, into the tiled order the CUDA
//                                                  kernels read (params.hpp), out of place
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/moe_experts/params.hpp"
#include "specdec/ops/moe_experts/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/moe_experts/kernel.cuh"
#endif

namespace specdec::ops {

inline Status moe_experts(CpuExecutor, MoeExpertsParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return moe_experts_cpu(p);
}

inline Status moe_experts_tile_int4(CpuExecutor, int32_t const* src, int64_t rows, int64_t cols,
                                    int32_t* dst) {
  SPECDEC_RETURN_IF_ERROR(validate_int4_tiling(src, dst, rows, cols));
  moe_experts_tile_int4_cpu(src, rows, cols, dst);
  return Status::Ok();
}

#if defined(__CUDACC__)
inline Status moe_experts(CudaExecutor e, MoeExpertsParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  SPECDEC_RETURN_IF_ERROR(validate_cuda(p));
  return moe_experts_cuda(p, e.stream);
}

inline Status moe_experts_tile_int4(CudaExecutor e, int32_t const* src, int64_t rows,
                                    int64_t cols, int32_t* dst) {
  SPECDEC_RETURN_IF_ERROR(validate_int4_tiling(src, dst, rows, cols));
  return moe_experts_tile_int4_cuda(src, rows, cols, dst, e.stream);
}
#endif

}  // namespace specdec::ops
