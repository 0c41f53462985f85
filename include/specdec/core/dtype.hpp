// Element types of tensors read from checkpoints, and bf16 / fp16 <-> float conversions.
// Dtype names follow safetensors ("BF16", "F16", "F32", "I32", "I64", "BOOL"); sizes are bytes per
// element. Conversions work on raw bit patterns (uint16_t) so they serve host code, the CPU
// references and device code alike:
//   bf16_to_float / fp16_to_float: exact (every bf16 / fp16 value is a float).
//   float_to_bf16 / float_to_fp16: round to nearest, ties to even; NaN stays NaN, overflow gives
//   +-inf, fp16 subnormals are produced (and read) exactly.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "specdec/core/macros.hpp"

namespace specdec {

enum class Dtype : uint8_t { kBF16, kF16, kF32, kI32, kI64, kBool };

inline constexpr Dtype kAllDtypes[] = {Dtype::kBF16, Dtype::kF16, Dtype::kF32,
                                       Dtype::kI32,  Dtype::kI64, Dtype::kBool};

// Bytes per element.
SPECDEC_HD constexpr int64_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::kBF16: return 2;
    case Dtype::kF16: return 2;
    case Dtype::kF32: return 4;
    case Dtype::kI32: return 4;
    case Dtype::kI64: return 8;
    case Dtype::kBool: return 1;
  }
  return 0;
}

// The safetensors spelling ("BF16", ...).
constexpr char const* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kBF16: return "BF16";
    case Dtype::kF16: return "F16";
    case Dtype::kF32: return "F32";
    case Dtype::kI32: return "I32";
    case Dtype::kI64: return "I64";
    case Dtype::kBool: return "BOOL";
  }
  return "?";
}

// The Dtype spelled `name` (exact, case-sensitive, as safetensors writes it); nullopt otherwise.
constexpr std::optional<Dtype> parse_dtype(std::string_view name) {
  for (Dtype d : kAllDtypes) {
    if (name == dtype_name(d)) return d;
  }
  return std::nullopt;
}

SPECDEC_HD inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

SPECDEC_HD inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

SPECDEC_HD inline float bf16_to_float(uint16_t bits) {
  return bits_float(static_cast<uint32_t>(bits) << 16);
}

SPECDEC_HD inline uint16_t float_to_bf16(float f) {
  uint32_t const u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  uint32_t const lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

SPECDEC_HD inline float fp16_to_float(uint16_t bits) {
  uint32_t const sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t const exp = (bits >> 10) & 0x1fu;
  uint32_t const man = bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in float.
    float const mag = static_cast<float>(man) * bits_float(0x33800000u);  // 2^-24
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

SPECDEC_HD inline uint16_t float_to_fp16(float f) {
  uint32_t const u = float_bits(f);
  uint16_t const sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t const a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Below the smallest normal 2^-14: subnormal result = round(|f| / 2^-24), ties to even.
    if (a < 0x33000000u) return sign;  // |f| <= 2^-25 rounds to zero (the tie goes to even 0)
    uint32_t const exp = a >> 23;      // 102..112
    uint32_t const man = (a & 0x7fffffu) | 0x800000u;  // 24 significant bits
    uint32_t const shift = 126u - exp;                 // value = man * 2^(exp-150) = q * 2^-24
    uint32_t q = man >> shift;
    uint32_t const rem = man & ((1u << shift) - 1u);
    uint32_t const half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);  // q == 0x400 carries into the smallest normal
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  uint32_t const lsb = (a >> 13) & 1u;
  uint32_t const r = a + 0xfffu + lsb;
  return static_cast<uint16_t>(sign | ((r - (112u << 23)) >> 13));
}

}  // namespace specdec
