// linear_bf16 parameters: y = beta y + x W^T for a few rows x (decode and verify: T <= 8 tokens),
// the bf16 weight streamed from memory once.
//
//   x  [T, in]  bf16, row stride ldx (>= in)
//   w  [out, in] bf16 (a Hugging Face Linear weight, row-major)
//   y  [T, out] fp32 (y_bf16 false) or bf16 (y_bf16 true), row stride ldy (>= out)
//   y[t, o] = beta * y[t, o] + sum_k x[t, k] w[o, k]     (beta only with fp32 y; 0 ignores y)
// Batched (batch > 1, e.g. one product per attention head): product b takes x + b x_batch,
// w + b w_batch and y + b y_batch (element offsets), the same shapes and strides.
// Products of bf16 values are exact in fp32 and the sums are fp32: the reference sums k in order,
// the kernel in its own fixed order (a split of k over warps and a fixed reduction: the same
// inputs give the same bits on every run), so the two agree to fp32 rounding, not bit for bit.
// Needs 1 <= T <= kLinearBf16MaxTokens (more rows are a GEMM: cuBLAS), in % 8 == 0 and
// ldx % 8 == 0 (16-byte rows), and x and w 16-byte aligned (checked for both executors: one
// contract).
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/dtype.hpp"
#include "specdec/core/macros.hpp"
#include "specdec/core/status.hpp"

namespace specdec::ops {

constexpr int kLinearBf16MaxTokens = 8;

struct LinearBf16Params {
  uint16_t const* x = nullptr;  // [T, in] bf16
  int64_t ldx = 0;
  uint16_t const* w = nullptr;  // [out, in] bf16
  int tokens = 0;               // T
  int64_t out = 0;
  int64_t in = 0;
  void* y = nullptr;            // [T, out] fp32 or bf16
  bool y_bf16 = false;
  int64_t ldy = 0;
  float beta = 0.0f;            // fp32 y only
  int batch = 1;                // independent products
  int64_t x_batch = 0, w_batch = 0, y_batch = 0;  // element offsets from one to the next
  // w is not written by work queued before this op on its stream (model weights): the CUDA
  // kernel may then load its first weights before it waits for the kernel before it
  // (programmatic dependent launch, core/cuda.cuh). Left false, w is read in stream order.
  bool w_constant = false;
};

// Writes output (b, t, o) = sum (+ beta y where beta != 0: y is never read otherwise), as fp32 or
// bf16: the reference and the kernel store through this one rule.
SPECDEC_HD inline void linear_bf16_store(LinearBf16Params const& p, int b, int t, int64_t o,
                                         float sum) {
  int64_t const at = b * p.y_batch + t * p.ldy + o;
  if (p.y_bf16) {
    static_cast<uint16_t*>(p.y)[at] = float_to_bf16(sum);
  } else {
    float* y = static_cast<float*>(p.y);
    y[at] = p.beta != 0.0f ? sum + p.beta * y[at] : sum;
  }
}

// Whether the shapes and pointers fit the op (the callers with a GEMM fallback ask first).
inline std::string linear_bf16_error(LinearBf16Params const& p) {
  auto num = [](int64_t v) { return std::to_string(v); };
  if (p.tokens < 1 || p.tokens > kLinearBf16MaxTokens) {
    return "tokens " + num(p.tokens) + " not in [1, " + num(kLinearBf16MaxTokens) +
           "] (more rows: use a GEMM)";
  }
  if (p.out < 1 || p.in < 8) return "out " + num(p.out) + " < 1 or in " + num(p.in) + " < 8";
  if (p.in % 8 != 0) return "in " + num(p.in) + " is not a multiple of 8 (16-byte weight rows)";
  if (p.ldx < p.in || p.ldx % 8 != 0) {
    return "ldx " + num(p.ldx) + " is below in " + num(p.in) + " or not a multiple of 8";
  }
  if (p.ldy < p.out) return "ldy " + num(p.ldy) + " < out " + num(p.out);
  if (!p.x || !p.w || !p.y) return "x, w and y must not be null";
  if (reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || reinterpret_cast<uintptr_t>(p.w) % 16 != 0) {
    return "x and w must be 16-byte aligned";
  }
  if (p.batch < 1 || p.batch > 65535) return "batch " + num(p.batch) + " not in [1, 65535]";
  if (p.batch > 1 && (p.x_batch % 8 != 0 || p.w_batch % 8 != 0 || p.x_batch < 0 ||
                      p.w_batch < 0 || p.y_batch < 0)) {
    return "x_batch " + num(p.x_batch) + " and w_batch " + num(p.w_batch) +
           " must be non-negative multiples of 8 (16-byte aligned products), y_batch " +
           num(p.y_batch) + " non-negative";
  }
  if (p.y_bf16 && p.beta != 0.0f) return "beta must be 0 with a bf16 y (no accumulation in bf16)";
  return "";
}

inline Status validate(LinearBf16Params const& p) {
  std::string const e = linear_bf16_error(p);
  return e.empty() ? Status::Ok() : Status::InvalidArgument("linear_bf16: " + e);
}

}  // namespace specdec::ops
