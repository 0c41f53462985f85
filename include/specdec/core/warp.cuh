// Warp-level reductions shared by the kernels (all 32 lanes take part and get the result).
#pragma once

#include <cstdint>

namespace specdec {

// Max of a 64-bit key over the warp (e.g. pack_value_index keys: a warp argmax).
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    uint64_t const other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Sum over the warp, in the same butterfly order on every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace specdec
