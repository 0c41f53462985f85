// Small arithmetic helpers shared by the CPU references and the CUDA kernels.
#pragma once

#include <cstdint>
#include <cstring>

#include "specdec/core/macros.hpp"

namespace specdec {

template <class T>
SPECDEC_HD constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
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

}  // namespace specdec
