// bf16 copies of fp32 device values: to_bf16_cuda(x [n] fp32, n, y [n] bf16 bits, stream), each
// value rounded as core/dtype.hpp's float_to_bf16 (nearest even; NaN stays NaN, overflow gives
// +-inf), one value per thread. Launched with programmatic dependent launch (core/cuda.cuh); no
// host synchronisation, so a forward that converts its activations can be captured. Its CPU rule
// is float_to_bf16 itself (tests/cuda/convert.cu compares them bit for bit).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"

namespace specdec {

static __global__ void to_bf16_kernel(float const* __restrict__ x, int64_t n,
                                      uint16_t* __restrict__ y) {
  await_prior_kernels();
  int64_t const i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = float_to_bf16(x[i]);
}

inline Status to_bf16_cuda(float const* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  if (n < 0) return Status::InvalidArgument("to_bf16_cuda: n = " + std::to_string(n) + " < 0");
  if (n == 0) return Status::Ok();
  constexpr int kThreads = 256;
  return launch_kernel("to_bf16", to_bf16_kernel,
                       static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream,
                       x, n, y);
}

}  // namespace specdec
