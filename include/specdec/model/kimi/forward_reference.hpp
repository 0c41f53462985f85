// The plain-loop CPU reference of the DeepseekV3 / Kimi-K2.5 forward (one sequence, causal
// attention over the whole sequence, no KV cache): the oracle the CUDA model is compared with.
// It follows transformers' modeling_deepseek_v3.py (DeepseekV3ForCausalLM) step by step:
//
//   x_0 = embed_tokens[tokens]                                           [T, H]
//   per layer i:  h = x + Attn(rms(x, input_layernorm))
//                 x = h + Mlp_i(rms(h, post_attention_layernorm))
//   logits = lm_head(rms(x, norm))                                       [T, V]
//   rms(x, w) = w * x / sqrt(mean(x^2) + rms_norm_eps)
//   Attn (MLA, nh heads, dq nope + r rope dims, dv value dims, c kv_lora_rank):
//     q  = q_b_proj(rms(q_a_proj(x), q_a_layernorm))  or q_proj(x) when q_lora_rank is null
//          viewed [nh, dq + r] = [q_nope | q_pe]
//     kv_a_proj_with_mqa(x) = [c_kv (c) | k_pe (r, one for all heads)]
//     kv_b_proj(rms(c_kv, kv_a_layernorm)) viewed [nh, dq + dv] = [k_nope | v]
//     RoPE on q_pe and k_pe at position start_position + t, INTERLEAVED pairs (x[2i], x[2i+1])
//     rotated by angle pos * inv_freq[i] (YaRN inv_freq, rope_inv_freq below), cos and sin times
//     config.rope_cos_sin_scale() (1 for Kimi); transformers de-interleaves before rotate_half,
//     which permutes q_pe and k_pe alike and leaves every q.k unchanged.
//     p = softmax_{s <= t}(config.softmax_scale() * (q_nope.k_nope + q_pe.k_pe)); o = sum p v
//     out = o_proj(o viewed [nh * dv], head-major)
//   Mlp: dense SwiGLU down(silu(gate(x)) * up(x)) on layers where !config.is_moe_layer(i); MoE:
//     scores = sigmoid(gate.weight . x) (fp32), routed by moe_route_reference (ops/moe_route) with
//     e_score_correction_bias, n_group, topk_group, num_experts_per_tok, norm_topk_prob,
//     routed_scaling_factor; out = sum_k w_k Expert_{id_k}(x) + SharedExperts(x).
//   Weights: bf16 converted exactly to float; INT4 routed experts dequantised with
//   io::dequantize_int4_group (W = (nibble - 8) * scale per group, kimi.md).
//
// Precision: every activation is fp32 and every dot product accumulates in double; transformers
// with torch_dtype bfloat16 rounds to bf16 after each op (and its fp32 run computes rope angles
// and inv_freq in fp32), so parity with it is judged with a tolerance, never bit for bit.
// Causal masking is exact: the outputs for token t depend on tokens 0..t only.
//
// Supported configs: scoring_func "sigmoid" and topk_method "noaux_tc" (the only router
// transformers' DeepseekV3 implements; others are kUnsupported naming the field). Under YaRN,
// max_position_embeddings / original_max_position_embeddings must equal rope_scaling.factor
// (recent transformers use that ratio in place of factor, older ones use factor: equal for
// DeepSeek-V3, Kimi-K2, K2.5 and the tiny preset; a config where they differ is kUnsupported
// rather than silently picking one).
//
// Aux capture (policy/layers.hpp convention): aux_layers lists ids in [kEmbedding, L): id i = the
// residual stream after layer i, kEmbedding (-1) = the embedding output; each id once. *aux is
// [T, |aux_layers| * H]: row t is the ids' [H] vectors for token t concatenated in the given order.
//
// Public API (namespace specdec::model::kimi):
//   rms_norm_reference(x [n], weight [n], eps, out [n])
//   rope_inv_freq(config, *inv_freq [r/2])              YaRN (or plain) inverse frequencies
//   rope_interleaved_reference(x [r], position, inv_freq [r/2], cos_sin_scale)   in place
//   moe_route_reference(scores [E], bias [E] or empty, n_group, topk_group, top_k, norm, scale,
//                       *ids [top_k], *weights [top_k])
//   row_argmax_keys_reference(logits [T, n], T, n, first id, *keys [T]),
//   argmax_of_keys_reference(keys [P, T], P, T, *argmax [T])   a row argmax over vocabulary slices
//   kimi_forward_reference(weights, config, tokens [T], start_position, aux_layers,
//                          *logits [T, V], *aux [T, |aux| * H])
// Every error is a Status naming the function and the argument / tensor; nothing throws.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/compressed_tensors.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/model/kimi/weights.hpp"
#include "specdec/ops/moe_route/reference.hpp"
#include "specdec/policy/layers.hpp"

namespace specdec::model::kimi {

// out[j] = weight[j] * x[j] / sqrt(mean(x^2) + eps); x, weight and out of one size n >= 1.
inline Status rms_norm_reference(std::span<float const> x, std::span<float const> weight,
                                 double eps, std::span<float> out) {
  if (x.empty() || weight.size() != x.size() || out.size() != x.size()) {
    return Status::InvalidArgument("rms_norm_reference: sizes x " + std::to_string(x.size()) +
                                   ", weight " + std::to_string(weight.size()) + ", out " +
                                   std::to_string(out.size()) + " must be equal and >= 1");
  }
  if (!(eps > 0.0)) return Status::InvalidArgument("rms_norm_reference: eps must be > 0");
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  double const inv = rms_inverse(ss, static_cast<int64_t>(x.size()), eps);
  for (size_t j = 0; j < x.size(); ++j) out[j] = rms_scaled(x[j], weight[j], inv);
  return Status::Ok();
}

// inv_freq [qk_rope_head_dim / 2] of config (transformers' _compute_yarn_parameters, kimi.md):
// d = qk_rope_head_dim, extra_i = 1 / theta^(2i/d); without rope_scaling inv_i = extra_i; with
// YaRN inter_i = extra_i / factor, cd(b) = d ln(orig / (2 pi b)) / (2 ln theta),
// low = max(floor(cd(beta_fast)), 0), high = min(ceil(cd(beta_slow)), d - 1) (high += 0.001 when
// equal), ramp_i = clamp((i - low) / (high - low), 0, 1), inv_i = inter_i ramp_i + extra_i
// (1 - ramp_i).
inline Status rope_inv_freq(DeepseekV3Config const& c, std::vector<double>* inv_freq) {
  if (inv_freq == nullptr) return Status::InvalidArgument("rope_inv_freq: inv_freq is null");
  int const d = c.qk_rope_head_dim;
  if (d < 2 || d % 2 != 0 || !(c.rope_theta > 0.0)) {
    return Status::InvalidArgument(c.source + ": rope_inv_freq: qk_rope_head_dim " +
                                   std::to_string(d) + " must be even and >= 2, rope_theta > 0");
  }
  double const base = c.rope_theta;
  inv_freq->assign(static_cast<size_t>(d / 2), 0.0);
  for (int i = 0; i < d / 2; ++i) {
    (*inv_freq)[static_cast<size_t>(i)] = 1.0 / std::pow(base, 2.0 * i / d);
  }
  if (!c.rope_scaling) return Status::Ok();
  io::YarnScaling const& y = *c.rope_scaling;
  double const ratio = static_cast<double>(c.max_position_embeddings) /
                       static_cast<double>(y.original_max_position_embeddings);
  if (std::fabs(ratio - y.factor) > 1e-9 * y.factor) {
    return Status::Unsupported(
        c.source + ": rope_scaling.factor " + std::to_string(y.factor) +
        " differs from max_position_embeddings / rope_scaling.original_max_position_embeddings = " +
        std::to_string(ratio) + ": transformers versions disagree on which one YaRN uses");
  }
  constexpr double kPi = 3.14159265358979323846;
  auto cd = [&](double rot) {
    return d * std::log(static_cast<double>(y.original_max_position_embeddings) / (rot * 2 * kPi)) /
           (2 * std::log(base));
  };
  double const low = std::max(std::floor(cd(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(cd(y.beta_slow)), static_cast<double>(d - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < d / 2; ++i) {
    double const extra = (*inv_freq)[static_cast<size_t>(i)];
    double const inter = extra / y.factor;
    double const ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    (*inv_freq)[static_cast<size_t>(i)] = inter * ramp + extra * (1.0 - ramp);
  }
  return Status::Ok();
}

// In place on x [2 * inv_freq.size()]: for each pair i, a = position * inv_freq[i],
// (x0, x1) = (x[2i], x[2i+1]) -> s (x0 cos a - x1 sin a, x1 cos a + x0 sin a), s = cos_sin_scale.
inline Status rope_interleaved_reference(std::span<float> x, int64_t position,
                                         std::span<double const> inv_freq, double cos_sin_scale) {
  if (x.size() != 2 * inv_freq.size() || x.empty()) {
    return Status::InvalidArgument("rope_interleaved_reference: x has " +
                                   std::to_string(x.size()) + " values, expected 2 * inv_freq (" +
                                   std::to_string(inv_freq.size()) + ") >= 2");
  }
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    double const a = static_cast<double>(position) * inv_freq[i];
    double const cs = std::cos(a) * cos_sin_scale, sn = std::sin(a) * cos_sin_scale;
    double const x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = static_cast<float>(x0 * cs - x1 * sn);
    x[2 * i + 1] = static_cast<float>(x1 * cs + x0 * sn);
  }
  return Status::Ok();
}

// Group-limited top-k routing of one token: the rule of ops/moe_route/params.hpp, whose CUDA
// kernel the GPU forward uses.
using ops::moe_route_reference;

// The argmax key of each row of a vocabulary slice: logits [T, n] holding ids [first, first + n);
// keys[t] = max_j pack_value_index(logits[t, j], first + j) (core/math.hpp: the larger logit, ties
// to the smaller id). The max over the ranks' keys of a row is the whole row's; its
// unpack_index is the argmax. The GPU form is cuda::row_argmax_keys (layer_kernels.cuh).
inline void row_argmax_keys_reference(float const* logits, int64_t T, int64_t n, int64_t first,
                                      uint64_t* keys) {
  for (int64_t t = 0; t < T; ++t) {
    uint64_t best = 0;
    for (int64_t j = 0; j < n; ++j) {
      best = std::max(best, pack_value_index(logits[t * n + j], static_cast<int32_t>(first + j)));
    }
    keys[t] = best;
  }
}

// argmax [T] from the ranks' keys [P, T] (row_argmax_keys_reference of each slice).
inline void argmax_of_keys_reference(uint64_t const* keys, int64_t P, int64_t T, int32_t* argmax) {
  for (int64_t t = 0; t < T; ++t) {
    uint64_t best = 0;
    for (int64_t q = 0; q < P; ++q) best = std::max(best, keys[q * T + t]);
    argmax[t] = unpack_index(best);
  }
}

namespace detail {

// A float copy of a BF16 / F32 tensor view of `n` elements (checked).
inline Status view_to_float(TensorView const& v, int64_t n, std::string_view what,
                            std::vector<float>* out) {
  if (v.numel() != n || static_cast<int64_t>(v.bytes.size()) != n * dtype_size(v.dtype) ||
      (v.dtype != Dtype::kBF16 && v.dtype != Dtype::kF32)) {
    return Status::InvalidArgument("kimi_forward_reference: tensor " + std::string(what) + " (\"" +
                                   std::string(v.name) + "\"): " + dtype_name(v.dtype) + " with " +
                                   std::to_string(v.numel()) + " elements, expected BF16/F32 with " +
                                   std::to_string(n) + " (weights not loaded for this config?)");
  }
  out->resize(static_cast<size_t>(n));
  if (v.dtype == Dtype::kF32) {
    if (n) std::memcpy(out->data(), v.bytes.data(), static_cast<size_t>(n) * 4);
    return Status::Ok();
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, v.bytes.data() + 2 * i, 2);
    (*out)[static_cast<size_t>(i)] = bf16_to_float(b);
  }
  return Status::Ok();
}

// Rows [r0, r1) x columns [c0, c1) of a [rows, cols] BF16 / F32 matrix as floats [r1-r0, c1-c0],
// reading only those bytes (checked).
inline Status view_block_to_float(TensorView const& v, int64_t rows, int64_t cols, int64_t r0,
                                  int64_t r1, int64_t c0, int64_t c1, std::string_view what,
                                  std::vector<float>* out) {
  int64_t const es = static_cast<int64_t>(dtype_size(v.dtype));
  if (v.numel() != rows * cols || static_cast<int64_t>(v.bytes.size()) != rows * cols * es ||
      (v.dtype != Dtype::kBF16 && v.dtype != Dtype::kF32) || r0 < 0 || r0 > r1 || r1 > rows ||
      c0 < 0 || c0 > c1 || c1 > cols) {
    return Status::InvalidArgument(
        "kimi_forward_reference: tensor " + std::string(what) + " (\"" + std::string(v.name) +
        "\"): " + dtype_name(v.dtype) + " with " + std::to_string(v.numel()) +
        " elements, expected BF16/F32 [" + std::to_string(rows) + ", " + std::to_string(cols) +
        "] holding rows [" + std::to_string(r0) + ", " + std::to_string(r1) + ") columns [" +
        std::to_string(c0) + ", " + std::to_string(c1) + ") (weights not loaded for this config?)");
  }
  int64_t const n = c1 - c0;
  out->resize(static_cast<size_t>((r1 - r0) * n));
  for (int64_t i = r0; i < r1; ++i) {
    std::byte const* src = v.bytes.data() + (i * cols + c0) * es;
    float* dst = out->data() + (i - r0) * n;
    if (v.dtype == Dtype::kF32) {
      if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      continue;
    }
    for (int64_t k = 0; k < n; ++k) {
      uint16_t b;
      std::memcpy(&b, src + 2 * k, 2);
      dst[k] = bf16_to_float(b);
    }
  }
  return Status::Ok();
}

// Rows [r0, r1) x columns [c0, c1) of W [out, in] as floats [r1-r0, c1-c0], reading only those
// bytes: bf16 converted, INT4 dequantised (c0, c1 multiples of the group size). A tensor-parallel
// rank loads its shard with it (dist/shard.hpp).
inline Status linear_block_to_float(LinearWeights const& l, int64_t out, int64_t in, int64_t r0,
                                    int64_t r1, int64_t c0, int64_t c1, std::string_view what,
                                    std::vector<float>* W) {
  if (l.out != out || l.in != in) {
    return Status::InvalidArgument("kimi_forward_reference: linear " + std::string(what) + " is [" +
                                   std::to_string(l.out) + ", " + std::to_string(l.in) +
                                   "], expected [" + std::to_string(out) + ", " +
                                   std::to_string(in) + "]");
  }
  if (!l.int4) return view_block_to_float(l.weight, out, in, r0, r1, c0, c1, what, W);
  int64_t const g = l.group_size;
  if (g <= 0 || in % g != 0 || in % io::kInt4PerWord != 0 ||
      l.weight_packed.dtype != Dtype::kI32 || l.weight_packed.numel() != out * (in / 8) ||
      l.weight_scale.dtype != Dtype::kBF16 || l.weight_scale.numel() != out * (in / g)) {
    return Status::InvalidArgument("kimi_forward_reference: INT4 linear " + std::string(what) +
                                   " (\"" + std::string(l.weight_packed.name) +
                                   "\"): packed / scale tensors do not match [" +
                                   std::to_string(out) + ", " + std::to_string(in) +
                                   "] with group " + std::to_string(g));
  }
  if (r0 < 0 || r0 > r1 || r1 > out || c0 < 0 || c0 > c1 || c1 > in || c0 % g != 0 ||
      c1 % g != 0 || c0 % io::kInt4PerWord != 0 || c1 % io::kInt4PerWord != 0) {
    return Status::InvalidArgument(
        "kimi_forward_reference: INT4 linear " + std::string(what) + ": rows [" +
        std::to_string(r0) + ", " + std::to_string(r1) + ") columns [" + std::to_string(c0) +
        ", " + std::to_string(c1) + ") is not a block of [" + std::to_string(out) + ", " +
        std::to_string(in) + "] on group-" + std::to_string(g) + " and 8-value word boundaries");
  }
  int64_t const rows = r1 - r0, cols = c1 - c0, words = in / 8, groups = in / g;
  std::vector<int32_t> packed(static_cast<size_t>(rows * (cols / 8)));
  std::vector<uint16_t> scale(static_cast<size_t>(rows * (cols / g)));
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(packed.data() + i * (cols / 8),
                l.weight_packed.bytes.data() + ((r0 + i) * words + c0 / 8) * 4,
                static_cast<size_t>(cols / 8) * 4);
    std::memcpy(scale.data() + i * (cols / g),
                l.weight_scale.bytes.data() + ((r0 + i) * groups + c0 / g) * 2,
                static_cast<size_t>(cols / g) * 2);
  }
  W->resize(static_cast<size_t>(rows * cols));
  return io::dequantize_int4_group(packed.data(), scale.data(), rows, cols, g, W->data());
}

// W [out, in] as floats: bf16 converted, INT4 dequantised.
inline Status linear_to_float(LinearWeights const& l, int64_t out, int64_t in,
                              std::string_view what, std::vector<float>* W) {
  return linear_block_to_float(l, out, in, 0, out, 0, in, what, W);
}

// y [out] = W [out, in] x [in], accumulated in double.
inline void matvec(std::vector<float> const& W, int64_t out, int64_t in, float const* x, float* y) {
  for (int64_t n = 0; n < out; ++n) {
    double acc = 0.0;
    float const* w = W.data() + n * in;
    for (int64_t k = 0; k < in; ++k) acc += static_cast<double>(w[k]) * x[k];
    y[n] = static_cast<float>(acc);
  }
}

// A SwiGLU MLP as floats.
struct FloatMlp {
  int64_t inter = 0, hidden = 0;
  std::vector<float> gate, up, down;
  Status load(MlpWeights const& m, int64_t h, int64_t i, std::string const& what) {
    hidden = h;
    inter = i;
    SPECDEC_RETURN_IF_ERROR(linear_to_float(m.gate_proj, i, h, what + ".gate_proj", &gate));
    SPECDEC_RETURN_IF_ERROR(linear_to_float(m.up_proj, i, h, what + ".up_proj", &up));
    return linear_to_float(m.down_proj, h, i, what + ".down_proj", &down);
  }
  // y [hidden] = down(silu(gate x) * up x)
  void run(float const* x, float* y) const {
    std::vector<float> g(static_cast<size_t>(inter)), u(static_cast<size_t>(inter));
    matvec(gate, inter, hidden, x, g.data());
    matvec(up, inter, hidden, x, u.data());
    for (int64_t k = 0; k < inter; ++k) g[k] = silu_times(g[k], u[k]);
    matvec(down, hidden, inter, g.data(), y);
  }
};

inline Status rms_rows(std::vector<float> const& x, int64_t rows, int64_t n,
                       std::vector<float> const& w, double eps, std::vector<float>* out) {
  out->resize(static_cast<size_t>(rows * n));
  for (int64_t t = 0; t < rows; ++t) {
    SPECDEC_RETURN_IF_ERROR(rms_norm_reference({x.data() + t * n, static_cast<size_t>(n)}, w, eps,
                                               {out->data() + t * n, static_cast<size_t>(n)}));
  }
  return Status::Ok();
}

// Attention of layer `li` over x [T, H] (already input_layernorm'd); adds o_proj output to *res.
inline Status mla_attention(LayerWeights const& l, DeepseekV3Config const& c, int li,
                            std::vector<float> const& xn, int64_t T, int64_t start,
                            std::vector<double> const& inv_freq, std::vector<float>* res) {
  int64_t const H = c.hidden_size, nh = c.num_attention_heads, dq = c.qk_nope_head_dim;
  int64_t const r = c.qk_rope_head_dim, dv = c.v_head_dim, ckv = c.kv_lora_rank;
  int64_t const qk = dq + r;
  std::string const p = "layers." + std::to_string(li) + ".self_attn.";
  double const eps = c.rms_norm_eps;
  std::vector<float> W, W2, nw;
  // q [T, nh * qk]
  std::vector<float> q(static_cast<size_t>(T * nh * qk));
  if (l.q_lora) {
    if (!c.q_lora_rank) {
      return Status::InvalidArgument("kimi_forward_reference: weights have q_a_proj but " +
                                     c.source + " has q_lora_rank null");
    }
    int64_t const ql = *c.q_lora_rank;
    SPECDEC_RETURN_IF_ERROR(linear_to_float(l.q_a_proj, ql, H, p + "q_a_proj", &W));
    SPECDEC_RETURN_IF_ERROR(linear_to_float(l.q_b_proj, nh * qk, ql, p + "q_b_proj", &W2));
    SPECDEC_RETURN_IF_ERROR(view_to_float(l.q_a_layernorm, ql, p + "q_a_layernorm", &nw));
    std::vector<float> qa(static_cast<size_t>(ql)), qan(static_cast<size_t>(ql));
    for (int64_t t = 0; t < T; ++t) {
      matvec(W, ql, H, xn.data() + t * H, qa.data());
      SPECDEC_RETURN_IF_ERROR(rms_norm_reference(qa, nw, eps, qan));
      matvec(W2, nh * qk, ql, qan.data(), q.data() + t * nh * qk);
    }
  } else {
    SPECDEC_RETURN_IF_ERROR(linear_to_float(l.q_proj, nh * qk, H, p + "q_proj", &W));
    for (int64_t t = 0; t < T; ++t) matvec(W, nh * qk, H, xn.data() + t * H, q.data() + t * nh * qk);
  }
  // k_pe [T, r], kv [T, nh * (dq + dv)]
  SPECDEC_RETURN_IF_ERROR(
      linear_to_float(l.kv_a_proj_with_mqa, ckv + r, H, p + "kv_a_proj_with_mqa", &W));
  SPECDEC_RETURN_IF_ERROR(linear_to_float(l.kv_b_proj, nh * (dq + dv), ckv, p + "kv_b_proj", &W2));
  SPECDEC_RETURN_IF_ERROR(view_to_float(l.kv_a_layernorm, ckv, p + "kv_a_layernorm", &nw));
  std::vector<float> kpe(static_cast<size_t>(T * r)), kv(static_cast<size_t>(T * nh * (dq + dv)));
  std::vector<float> a(static_cast<size_t>(ckv + r)), cn(static_cast<size_t>(ckv));
  double const cs = c.rope_cos_sin_scale();
  for (int64_t t = 0; t < T; ++t) {
    matvec(W, ckv + r, H, xn.data() + t * H, a.data());
    SPECDEC_RETURN_IF_ERROR(
        rms_norm_reference({a.data(), static_cast<size_t>(ckv)}, nw, eps, cn));
    matvec(W2, nh * (dq + dv), ckv, cn.data(), kv.data() + t * nh * (dq + dv));
    std::copy(a.begin() + ckv, a.end(), kpe.begin() + t * r);
    SPECDEC_RETURN_IF_ERROR(rope_interleaved_reference({kpe.data() + t * r, static_cast<size_t>(r)},
                                                       start + t, inv_freq, cs));
    for (int64_t h = 0; h < nh; ++h) {
      SPECDEC_RETURN_IF_ERROR(rope_interleaved_reference(
          {q.data() + (t * nh + h) * qk + dq, static_cast<size_t>(r)}, start + t, inv_freq, cs));
    }
  }
  // causal softmax attention, o [T, nh * dv]
  double const scale = c.softmax_scale();
  std::vector<float> o(static_cast<size_t>(T * nh * dv));
  std::vector<double> s(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      float const* qh = q.data() + (t * nh + h) * qk;
      double mx = -INFINITY;
      for (int64_t u = 0; u <= t; ++u) {
        float const* kn = kv.data() + (u * nh + h) * (dq + dv);
        float const* kp = kpe.data() + u * r;
        double d = 0.0;
        for (int64_t j = 0; j < dq; ++j) d += static_cast<double>(qh[j]) * kn[j];
        for (int64_t j = 0; j < r; ++j) d += static_cast<double>(qh[dq + j]) * kp[j];
        s[u] = d * scale;
        mx = std::max(mx, s[u]);
      }
      double z = 0.0;
      for (int64_t u = 0; u <= t; ++u) z += (s[u] = std::exp(s[u] - mx));
      for (int64_t j = 0; j < dv; ++j) {
        double acc = 0.0;
        for (int64_t u = 0; u <= t; ++u) acc += s[u] * kv[(u * nh + h) * (dq + dv) + dq + j];
        o[(t * nh + h) * dv + j] = static_cast<float>(acc / z);
      }
    }
  }
  SPECDEC_RETURN_IF_ERROR(linear_to_float(l.o_proj, H, nh * dv, p + "o_proj", &W));
  std::vector<float> y(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    matvec(W, H, nh * dv, o.data() + t * nh * dv, y.data());
    for (int64_t j = 0; j < H; ++j) (*res)[t * H + j] += y[j];
  }
  return Status::Ok();
}

// MLP (dense or MoE) of layer `li` over xn [T, H]; adds its output to *res.
inline Status mlp_block(LayerWeights const& l, DeepseekV3Config const& c, int li,
                        std::vector<float> const& xn, int64_t T, std::vector<float>* res) {
  int64_t const H = c.hidden_size;
  std::string const p = "layers." + std::to_string(li) + ".mlp";
  std::vector<float> y(static_cast<size_t>(H)), acc(static_cast<size_t>(H));
  if (!l.moe) {
    FloatMlp m;
    SPECDEC_RETURN_IF_ERROR(m.load(l.mlp, H, c.intermediate_size, p));
    for (int64_t t = 0; t < T; ++t) {
      m.run(xn.data() + t * H, y.data());
      for (int64_t j = 0; j < H; ++j) (*res)[t * H + j] += y[j];
    }
    return Status::Ok();
  }
  int64_t const E = c.n_routed_experts;
  if (static_cast<int64_t>(l.experts.size()) != E) {
    return Status::InvalidArgument("kimi_forward_reference: " + p + ".experts has " +
                                   std::to_string(l.experts.size()) + " experts, config " +
                                   std::to_string(E));
  }
  std::vector<float> gate, bias;
  SPECDEC_RETURN_IF_ERROR(view_to_float(l.gate, E * H, p + ".gate.weight", &gate));
  if (l.has_correction_bias) {
    SPECDEC_RETURN_IF_ERROR(
        view_to_float(l.e_score_correction_bias, E, p + ".gate.e_score_correction_bias", &bias));
  }
  FloatMlp shared;
  if (l.has_shared_experts) {
    SPECDEC_RETURN_IF_ERROR(shared.load(l.shared_experts, H,
                                        int64_t{c.n_shared_experts} * c.moe_intermediate_size,
                                        p + ".shared_experts"));
  }
  std::vector<FloatMlp> experts(static_cast<size_t>(E));  // converted on first use
  std::vector<bool> loaded(static_cast<size_t>(E), false);
  std::vector<float> scores(static_cast<size_t>(E));
  std::vector<int32_t> ids;
  std::vector<float> wts;
  for (int64_t t = 0; t < T; ++t) {
    float const* x = xn.data() + t * H;
    matvec(gate, E, H, x, scores.data());
    for (float& v : scores) v = ops::moe_router_score(v);
    SPECDEC_RETURN_IF_ERROR(moe_route_reference(
        scores, bias, c.n_group, c.topk_group, c.num_experts_per_tok, c.norm_topk_prob,
        static_cast<float>(c.routed_scaling_factor), &ids, &wts));
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (size_t k = 0; k < ids.size(); ++k) {
      size_t const e = static_cast<size_t>(ids[k]);
      if (!loaded[e]) {
        SPECDEC_RETURN_IF_ERROR(experts[e].load(l.experts[e], H, c.moe_intermediate_size,
                                                p + ".experts." + std::to_string(e)));
        loaded[e] = true;
      }
      experts[e].run(x, y.data());
      for (int64_t j = 0; j < H; ++j) acc[j] += wts[k] * y[j];
    }
    if (l.has_shared_experts) {
      shared.run(x, y.data());
      for (int64_t j = 0; j < H; ++j) acc[j] += y[j];
    }
    for (int64_t j = 0; j < H; ++j) (*res)[t * H + j] += acc[j];
  }
  return Status::Ok();
}

// The router the forwards implement: transformers' DeepseekV3 (sigmoid scores, noaux_tc top-k).
inline Status check_router_supported(io::DeepseekV3Config const& c, std::string const& fn) {
  if (c.scoring_func != io::ScoringFunc::kSigmoid) {
    return Status::Unsupported(fn + "scoring_func \"" + io::scoring_func_name(c.scoring_func) +
                               "\": only \"sigmoid\" (transformers' DeepseekV3 router)");
  }
  if (c.topk_method != io::TopkMethod::kNoauxTc) {
    return Status::Unsupported(fn + "topk_method \"" + io::topk_method_name(c.topk_method) +
                               "\": only \"noaux_tc\" (transformers' DeepseekV3 router)");
  }
  return Status::Ok();
}

// What an executor's loader checks before converting `w`: the router is supported and the weights'
// structure (layer count, dense / MoE per layer, q_lora, expert count) is the config's.
inline Status check_model_supported(KimiWeights const& w, DeepseekV3Config const& c,
                                    std::string const& fn) {
  SPECDEC_RETURN_IF_ERROR(check_router_supported(c, fn));
  int const L = c.num_hidden_layers;
  if (static_cast<int>(w.layers.size()) != L) {
    return Status::InvalidArgument(fn + "weights have " + std::to_string(w.layers.size()) +
                                   " layers, num_hidden_layers is " + std::to_string(L) +
                                   " (weights not loaded for this config?)");
  }
  for (int li = 0; li < L; ++li) {
    LayerWeights const& l = w.layers[static_cast<size_t>(li)];
    std::string const p = "layers." + std::to_string(li) + ".";
    if (l.moe != c.is_moe_layer(li)) {
      return Status::InvalidArgument(fn + p + "mlp: weights say " + (l.moe ? "MoE" : "dense") +
                                     ", the config the opposite");
    }
    if (l.q_lora != c.q_lora_rank.has_value()) {
      return Status::InvalidArgument(fn + p + "self_attn." + (l.q_lora ? "q_a_proj" : "q_proj") +
                                     " in the weights, but " + c.source + " has q_lora_rank " +
                                     (c.q_lora_rank ? "set" : "null"));
    }
    if (l.moe && static_cast<int64_t>(l.experts.size()) != c.n_routed_experts) {
      return Status::InvalidArgument(fn + p + "mlp.experts has " +
                                     std::to_string(l.experts.size()) + " experts, config " +
                                     std::to_string(c.n_routed_experts));
    }
  }
  return Status::Ok();
}

inline Status forward_impl(KimiWeights const& w, DeepseekV3Config const& c,
                           std::span<int32_t const> tokens, int start_position,
                           std::span<int const> aux_layers, std::vector<float>* logits,
                           std::vector<float>* aux) {
  std::string const fn = "kimi_forward_reference (" + c.source + "): ";
  if (logits == nullptr) return Status::InvalidArgument(fn + "logits is null");
  if (!aux_layers.empty() && aux == nullptr) {
    return Status::InvalidArgument(fn + "aux is null but " + std::to_string(aux_layers.size()) +
                                   " aux_layers were requested");
  }
  if (tokens.empty()) return Status::InvalidArgument(fn + "tokens is empty");
  int64_t const T = static_cast<int64_t>(tokens.size()), H = c.hidden_size, V = c.vocab_size;
  int const L = c.num_hidden_layers;
  if (start_position < 0 || start_position + T > c.max_position_embeddings) {
    return Status::InvalidArgument(fn + "positions [" + std::to_string(start_position) + ", " +
                                   std::to_string(start_position + T) +
                                   ") (start_position, tokens) not within [0, "
                                   "max_position_embeddings " +
                                   std::to_string(c.max_position_embeddings) + "]");
  }
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= V) {
      return Status::InvalidArgument(fn + "tokens[" + std::to_string(t) + "] = " +
                                     std::to_string(tokens[t]) + " not in [0, vocab_size " +
                                     std::to_string(V) + ")");
    }
  }
  for (size_t i = 0; i < aux_layers.size(); ++i) {
    int const id = aux_layers[i];
    if (id < kEmbedding || id >= L) {
      return Status::InvalidArgument(fn + "aux_layers[" + std::to_string(i) + "] = " +
                                     std::to_string(id) + " not in [kEmbedding -1, " +
                                     std::to_string(L) + ") (-1 = embedding, i = output of layer i)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (aux_layers[j] == id) {
        return Status::InvalidArgument(fn + "aux_layers[" + std::to_string(i) + "] = " +
                                       std::to_string(id) + " repeats aux_layers[" +
                                       std::to_string(j) + "]");
      }
    }
  }
  SPECDEC_RETURN_IF_ERROR(check_model_supported(w, c, fn));
  std::vector<double> inv_freq;
  SPECDEC_RETURN_IF_ERROR(rope_inv_freq(c, &inv_freq));

  int64_t const A = static_cast<int64_t>(aux_layers.size());
  if (aux) aux->assign(static_cast<size_t>(T * A * H), 0.0f);
  auto capture = [&](int id, std::vector<float> const& x) {
    for (int64_t i = 0; i < A; ++i) {
      if (aux_layers[i] != id) continue;
      for (int64_t t = 0; t < T; ++t) {
        std::copy(x.begin() + t * H, x.begin() + (t + 1) * H, aux->begin() + (t * A + i) * H);
      }
    }
  };

  // Embedding rows, exactly the bf16 values.
  if (w.embed_tokens.dtype != Dtype::kBF16 || w.embed_tokens.numel() != V * H ||
      static_cast<int64_t>(w.embed_tokens.bytes.size()) != V * H * 2) {
    return Status::InvalidArgument(fn + "tensor embed_tokens (\"" +
                                   std::string(w.embed_tokens.name) + "\") is not BF16 [" +
                                   std::to_string(V) + ", " + std::to_string(H) + "]");
  }
  std::vector<float> x(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < H; ++j) {
      uint16_t b;
      std::memcpy(&b, w.embed_tokens.bytes.data() + 2 * (tokens[t] * H + j), 2);
      x[t * H + j] = bf16_to_float(b);
    }
  }
  capture(kEmbedding, x);

  std::vector<float> nw, xn;
  for (int li = 0; li < L; ++li) {
    LayerWeights const& l = w.layers[static_cast<size_t>(li)];
    std::string const p = "layers." + std::to_string(li) + ".";
    SPECDEC_RETURN_IF_ERROR(view_to_float(l.input_layernorm, H, p + "input_layernorm", &nw));
    SPECDEC_RETURN_IF_ERROR(rms_rows(x, T, H, nw, c.rms_norm_eps, &xn));
    SPECDEC_RETURN_IF_ERROR(mla_attention(l, c, li, xn, T, start_position, inv_freq, &x));
    SPECDEC_RETURN_IF_ERROR(
        view_to_float(l.post_attention_layernorm, H, p + "post_attention_layernorm", &nw));
    SPECDEC_RETURN_IF_ERROR(rms_rows(x, T, H, nw, c.rms_norm_eps, &xn));
    SPECDEC_RETURN_IF_ERROR(mlp_block(l, c, li, xn, T, &x));
    capture(li, x);
  }

  SPECDEC_RETURN_IF_ERROR(view_to_float(w.norm, H, "norm", &nw));
  SPECDEC_RETURN_IF_ERROR(rms_rows(x, T, H, nw, c.rms_norm_eps, &xn));
  std::vector<float> head;
  SPECDEC_RETURN_IF_ERROR(view_to_float(w.lm_head, V * H, "lm_head", &head));
  logits->assign(static_cast<size_t>(T * V), 0.0f);
  for (int64_t t = 0; t < T; ++t) matvec(head, V, H, xn.data() + t * H, logits->data() + t * V);
  return Status::Ok();
}

}  // namespace detail

// The forward of one sequence (see the top of this file): logits [T, V] for every position, and
// the residual streams of aux_layers [T, |aux_layers| * H] (aux may be null when aux_layers is
// empty). Token t sits at position start_position + t.
inline Status kimi_forward_reference(KimiWeights const& weights, DeepseekV3Config const& config,
                                     std::span<int32_t const> tokens, int start_position,
                                     std::span<int const> aux_layers, std::vector<float>* logits,
                                     std::vector<float>* aux) {
  try {
    return detail::forward_impl(weights, config, tokens, start_position, aux_layers, logits, aux);
  } catch (std::exception const& e) {
    return Status::Internal("kimi_forward_reference (" + config.source + "): " + e.what());
  }
}

}  // namespace specdec::model::kimi
