// Small arithmetic helpers shared by the CPU references and the CUDA kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "specdec/core/macros.hpp"

namespace specdec {

template <class T>
SPECDEC_HD constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// The model's element rules, one definition for the CPU references and the kernels that apply
// them (model/kimi's norms and SwiGLU):
//   rms_inverse(ss, n, eps)  1 / sqrt(ss / n + eps): RMSNorm's scale of a row of n values whose
//                            squares sum (in double) to ss
//   rms_scaled(x, w, inv)    weight * (x * inv) in double, rounded to float: RMSNorm's value
//   silu_times(g, u)         silu(g) (in double, rounded to float) * u: SwiGLU's value
SPECDEC_HD inline double rms_inverse(double ss, int64_t n, double eps) {
  return 1.0 / sqrt(ss / static_cast<double>(n) + eps);
}
SPECDEC_HD inline float rms_scaled(float x, float weight, double inv) {
  return static_cast<float>(static_cast<double>(weight) * (static_cast<double>(x) * inv));
}
SPECDEC_HD inline float silu_times(float g, float u) {
  return static_cast<float>(g / (1.0 + exp(-static_cast<double>(g)))) * u;
}

// Maps a float to an unsigned key whose unsigned order is the float's total order
// (-inf < ... < -0 < +0 < ... < +inf; NaNs sort above +inf). Used by radix selection and by
// argmax tie-breaking so the CPU and the GPU order values identically.
SPECDEC_HD inline uint32_t float_order_key(float x) {
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(x);
#else
  std::memcpy(&bits, &x, sizeof bits);
#endif
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

SPECDEC_HD inline float float_from_order_key(uint32_t key) {
  uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float x;
#if defined(__CUDA_ARCH__)
  x = __uint_as_float(bits);
#else
  std::memcpy(&x, &bits, sizeof x);
#endif
  return x;
}

// A value and its index as one 64-bit key whose unsigned order is "larger value first, then smaller
// index first": max-reducing keys gives the argmax with ties to the smallest index, and sorting
// keys descending gives a deterministic top-k. 0 sorts below every packed key ("none").
SPECDEC_HD inline uint64_t pack_value_index(float value, int32_t index) {
  return (static_cast<uint64_t>(float_order_key(value)) << 32) |
         static_cast<uint64_t>(0xffffffffu - static_cast<uint32_t>(index));
}
SPECDEC_HD inline int32_t unpack_index(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}
SPECDEC_HD inline float unpack_value(uint64_t key) {
  return float_from_order_key(static_cast<uint32_t>(key >> 32));
}

}  // namespace specdec
