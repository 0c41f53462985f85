// moe_experts CPU reference (plain loops, the oracle of the CUDA kernels): for T tokens routed to
// top_k experts, y [T, H] = sum_k weights[t, k] * down_e(silu(gate_e x_t) * up_e x_t) with the
// expert weights in bf16 or compressed-tensors INT4 (params.hpp). Host pointers throughout.
//
// Arithmetic: each used expert's matrices are converted to float once per call (bf16 exactly;
// INT4 as (nibble - 8) * scale, exact in float); gate / up dot products accumulate in double;
// h = silu(g) * u is computed in double and rounded to float (the kernel's h is a float too);
// the down dot product accumulates in double over the float h and stays double; y[t, j] sums
// weights[t, k] * down_k in double in k order and is rounded to float once (then added to y in
// float when p.accumulate, then p.addend in float when given). x_bf16 is the CUDA path's; the
// reference rounds x itself where it needs bf16.
// bf16_operands (the oracle of the CUDA INT4 path, which multiplies on tensor cores): x and h
// are rounded to bf16 (nearest even) before their dot products, and so is each dequantized
// weight (nibble - 8) * scale of a matrix without moe_int4_scales_after_mma (params.hpp: the
// kernels round those, and multiply the others' exact weights); everything else as above.
// An id outside [0, E) is an error naming the token, the slot and the id (y untouched).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"
#include "specdec/ops/moe_experts/params.hpp"

namespace specdec::ops {
namespace moe_experts_ref {

// W [rows, cols] as floats from an INT4 packed [rows, cols/8] / scale [rows, cols/G] pair.
inline void int4_to_float(int32_t const* packed, uint16_t const* scale, int64_t rows, int64_t cols,
                          int64_t group, std::vector<float>* W) {
  W->resize(static_cast<size_t>(rows * cols));
  int64_t const words = cols / 8, groups = cols / group;
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; ++k) {
      uint32_t const word = static_cast<uint32_t>(packed[n * words + k / 8]);
      int const q = static_cast<int>((word >> (4 * (k % 8))) & 0xFu) - 8;
      (*W)[static_cast<size_t>(n * cols + k)] =
          static_cast<float>(q) * bf16_to_float(scale[n * groups + k / group]);
    }
  }
}

inline void bf16_matrix_to_float(uint16_t const* bits, int64_t rows, int64_t cols,
                                 std::vector<float>* W) {
  W->resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) (*W)[static_cast<size_t>(i)] = bf16_to_float(bits[i]);
}

// out [rows] = W [rows, cols] v [cols], accumulated in double.
inline void matvec_double(std::vector<float> const& W, int64_t rows, int64_t cols, float const* v,
                          double* out) {
  for (int64_t n = 0; n < rows; ++n) {
    float const* w = W.data() + n * cols;
    double acc = 0.0;
    for (int64_t k = 0; k < cols; ++k) acc += static_cast<double>(w[k]) * static_cast<double>(v[k]);
    out[n] = acc;
  }
}

inline void round_to_bf16(std::vector<float>* v) {
  for (float& f : *v) f = bf16_to_float(float_to_bf16(f));
}

}  // namespace moe_experts_ref

// dst = src [rows, cols/8] (row-major) in the tiled order of params.hpp (the words' places and
// each word's nibble order): plain loops over the words. The oracle of the CUDA conversion;
// validate_int4_tiling holds.
inline void moe_experts_tile_int4_cpu(int32_t const* src, int64_t rows, int64_t cols,
                                      int32_t* dst) {
  int64_t const words = cols / 8;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < words; ++k) {
      dst[moe_int4_tiled_word(cols, r, k)] =
          static_cast<int32_t>(moe_int4_pair_nibbles(static_cast<uint32_t>(src[r * words + k])));
    }
  }
}

inline Status moe_experts_cpu(MoeExpertsParams const& p, bool bf16_operands = false) {
  int64_t const T = p.tokens, H = p.hidden, I = p.inter, E = p.experts, K = p.top_k;
  int64_t const N = T * K;
  for (int64_t a = 0; a < N; ++a) {
    int32_t const e = p.ids[a];
    if (e < 0 || e >= E) {
      return Status::InvalidArgument("moe_experts: ids[" + std::to_string(a / K) + ", " +
                                     std::to_string(a % K) + "] = " + std::to_string(e) +
                                     " is not an expert in [0, " + std::to_string(E) + ")");
    }
  }
  MoeExpertWeights const& w = p.w;
  std::vector<double> down_out(static_cast<size_t>(N * H));  // per assignment a = t*K + k
  std::vector<float> G, U, D;
  std::vector<double> g(static_cast<size_t>(I)), u(static_cast<size_t>(I));
  std::vector<float> h(static_cast<size_t>(I)), xt;
  for (int64_t e = 0; e < E; ++e) {
    bool used = false;
    for (int64_t a = 0; a < N && !used; ++a) used = p.ids[a] == e;
    if (!used) continue;
    std::string const which = "moe_experts: expert " + std::to_string(e) + "'s ";
    if (w.int4) {
      if (!w.gate_packed[e] || !w.gate_scale[e] || !w.up_packed[e] || !w.up_scale[e] ||
          !w.down_packed[e] || !w.down_scale[e]) {
        return Status::InvalidArgument(which + "INT4 tensors include a null pointer");
      }
      moe_experts_ref::int4_to_float(w.gate_packed[e], w.gate_scale[e], I, H, w.group_size, &G);
      moe_experts_ref::int4_to_float(w.up_packed[e], w.up_scale[e], I, H, w.group_size, &U);
      moe_experts_ref::int4_to_float(w.down_packed[e], w.down_scale[e], H, I, w.group_size, &D);
      if (bf16_operands && !moe_int4_scales_after_mma(H, w.group_size)) {
        moe_experts_ref::round_to_bf16(&G);
        moe_experts_ref::round_to_bf16(&U);
      }
      if (bf16_operands && !moe_int4_scales_after_mma(I, w.group_size)) {
        moe_experts_ref::round_to_bf16(&D);
      }
    } else {
      if (!w.gate[e] || !w.up[e] || !w.down[e]) {
        return Status::InvalidArgument(which + "bf16 matrices include a null pointer");
      }
      moe_experts_ref::bf16_matrix_to_float(w.gate[e], I, H, &G);
      moe_experts_ref::bf16_matrix_to_float(w.up[e], I, H, &U);
      moe_experts_ref::bf16_matrix_to_float(w.down[e], H, I, &D);
    }
    for (int64_t a = 0; a < N; ++a) {
      if (p.ids[a] != e) continue;
      xt.assign(p.x + (a / K) * H, p.x + (a / K + 1) * H);
      if (bf16_operands) moe_experts_ref::round_to_bf16(&xt);
      moe_experts_ref::matvec_double(G, I, H, xt.data(), g.data());
      moe_experts_ref::matvec_double(U, I, H, xt.data(), u.data());
      for (int64_t n = 0; n < I; ++n) {
        double const gn = g[static_cast<size_t>(n)];
        h[static_cast<size_t>(n)] =
            static_cast<float>(gn / (1.0 + std::exp(-gn)) * u[static_cast<size_t>(n)]);
      }
      if (bf16_operands) moe_experts_ref::round_to_bf16(&h);
      moe_experts_ref::matvec_double(D, H, I, h.data(), down_out.data() + a * H);
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < H; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        acc += static_cast<double>(p.weights[t * K + k]) *
               down_out[static_cast<size_t>((t * K + k) * H + j)];
      }
      float const m = static_cast<float>(acc);
      float const y = p.accumulate ? p.y[t * H + j] + m : m;
      p.y[t * H + j] = p.addend ? y + p.addend[t * H + j] : y;
    }
  }
  return Status::Ok();
}

}  // namespace specdec::ops
