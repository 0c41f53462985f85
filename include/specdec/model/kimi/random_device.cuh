// Random Kimi / DeepSeek-V3 weights drawn straight into device memory, for models too large to
// write to disk and read back (the kimi-k2.5-1gpu preset holds ~118 GB): random_weights.hpp's
// rule, on the GPU.
//   fill_random_block(dst, draw, cols, r0, r1, c0, c1, stream)
//       rows [r0, r1) x columns [c0, c1) of the row-major [*, cols] tensor drawn as `draw`, packed
//       into dst (bf16 / fp32 / int32 as draw.kind says): element (i, j) is store_random_at's
//       element i * cols + j, as the host draws it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "specdec/core/cuda.cuh"
#include "specdec/core/status.hpp"
#include "specdec/model/kimi/random_weights.hpp"

namespace specdec::model::kimi {
namespace detail {

static __global__ void fill_random_kernel(void* dst, RandomDraw d, int64_t cols, int64_t r0,
                                          int64_t c0, int64_t block_cols, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    int64_t const i = e / block_cols, j = e - i * block_cols;
    store_random_at(d, static_cast<uint64_t>((r0 + i) * cols + c0 + j), dst, e);
  }
}

}  // namespace detail

inline Status fill_random_block(void* dst, RandomDraw const& draw, int64_t cols, int64_t r0,
                                int64_t r1, int64_t c0, int64_t c1, cudaStream_t stream) {
  int64_t const n = (r1 - r0) * (c1 - c0);
  if (n <= 0) return Status::Ok();
  int64_t const blocks = std::min<int64_t>((n + 255) / 256, int64_t{132} * 32);
  detail::fill_random_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      dst, draw, cols, r0, c0, c1 - c0, n);
  return cuda_launch_status("fill_random_kernel");
}

}  // namespace specdec::model::kimi
