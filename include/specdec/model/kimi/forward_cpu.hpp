// The CPU executor's Kimi-K2.5 / DeepseekV3 forward over the paged MLA latent cache (MlaCache,
// model/kimi/mla_cache.hpp), on a batch of requests, each with its own cache pages:
//   kimi_prefill  tokens [sum T_b] (counts [B]) appended after each request's length
//   kimi_decode   tokens [B], one per request, appended
//   kimi_verify   tree nodes tokens [B, N], positions [B, N], packed ancestor-or-self mask rows
//                 [B, N, ceil(N/32)] as ops::tree_build writes them; node i attends to the
//                 request's whole cached prefix and to its ancestors-or-self, its entry is written
//                 at slot length + i (staged, kv_commit's convention) and the length is NOT
//                 advanced (MlaCache::commit / truncate after acceptance)
// Each returns logits [tokens, V] fp32 (rows in batch order: request 0's tokens, then request
// 1's, ...; with LogitsMode::kArgmax (forward_plan.hpp), argmax [tokens] and only this rank's
// vocabulary slice of the logits) and, for aux_layers (policy/layers.hpp ids: i = the residual stream after layer i,
// kEmbedding -1 = the embedding output; each id once, any order), aux [tokens, |aux| * H]: row t is
// the listed streams of token t concatenated in the listed order.
//
// The model is forward_reference.hpp's, sharing its helpers (rms_norm_reference, rope_inv_freq,
// rope_interleaved_reference, moe_route_reference, detail::linear_to_float / view_to_float for the
// bf16 and INT4 weights, detail::silu). Attention runs in the latent space (WEIGHT ABSORPTION) in
// all three modes, one implementation. With c = kv_lora_rank, r = qk_rope_head_dim, per head h
// W_UK_h = kv_b_proj rows [h(dq+dv), h(dq+dv)+dq) [dq, c] and W_UV_h = the next dv rows [dv, c]:
//   cache entry of token u: e_u = [c_u = rms(c_kv_u, kv_a_layernorm) | k_pe_u roped at pos_u]
//   q_h = [q_nope_h | q_pe_h roped at pos_t];  qa_h = [W_UK_h^T q_nope_h | q_pe_h]   [c + r]
//   s_u = softmax_scale * (qa_h . e_u) = softmax_scale * (q_nope_h . W_UK_h c_u + q_pe_h . k_pe_u)
//   p = softmax over the visible u;  o_h = W_UV_h (sum_u p_u c_u);  out = o_proj(o [nh * dv])
// equal to the reference's k_nope = W_UK_h c_u, v = W_UV_h c_u in exact arithmetic. Visible u for
// a token at slot length + i: slots [0, length) and length + j with j <= i (prefill, decode) or
// bit j of its mask row (verify). RoPE positions: length + i (prefill, decode), positions[i]
// (= length + depth, checked) for verify. One head group shares the keys (MQA in latent space), so
// the scores of all heads of a request are one product [n * nh, c + r] x [c + r, S].
//
// Precision: Eigen fp32 matrix products (float accumulation) on fp32 weights; norms, RoPE and
// router use the reference helpers (double inside). The reference accumulates every dot product in
// double, so the two agree to float rounding (about 1e-6 relative), not bit for bit.
//
// Weights (KimiCpuModel, load_kimi_cpu_model): every matrix converted ONCE to a row-major fp32
// Eigen matrix [out, in] (bf16 exactly, INT4 dequantised). Memory: 4 bytes per parameter =
// 2 x the bf16 checkpoint, 8 x the packed INT4 experts (KimiCpuModel::num_floats() * 4 bytes).
// The tiny preset: ~0.63 M floats = 2.5 MB. Kimi-K2.5 (~1.03 T parameters) would need ~4.1 TB: this
// executor serves small checkpoints (tests, tiny presets, drafts); a real-size CPU run needs
// products that read bf16 / INT4 directly.
//
// Tensor parallel (dist/shard.hpp): load_kimi_cpu_model with a TpShard and the rank's
// CpuCommunicator gives a model holding that rank's heads, widths, experts and vocabulary slice;
// its forward all-reduces attention's and the MLP's partial outputs (the residual stream, and so
// the aux rows, the same on every rank) and gathers the logits' slices (LogitsMode::kFull) or one
// argmax key per row (kArgmax). Each rank runs the same calls with the same arguments.
//
// Errors (Status naming the function, the argument and the numbers; nothing is written to the
// cache and no length moves when a check fails): unknown or repeated request, cache geometry not
// the model's, counts / sizes that do not add up, a token outside the vocabulary, a position past
// max_position_embeddings, bad aux_layers, out of pages (MlaCache::reserve), a verify mask row that
// is not the ancestor-or-self set of a tree over nodes 0..N-1 (bit i set, no bit above i, row i =
// row of its parent (the highest other bit) plus bit i, the root's row = {0}), or positions that
// disagree with length + depth.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include <Eigen/Dense>  // Eigen 3.4 (Eigen3::Eigen, linked by specdec::specdec)

#include "specdec/core/executor.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/dist/communicator.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/model/kimi/forward_plan.hpp"
#include "specdec/model/kimi/forward_reference.hpp"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/model/kimi/shard.hpp"
#include "specdec/model/kimi/weights.hpp"
#include "specdec/policy/layers.hpp"

namespace specdec::model::kimi {

// Row-major fp32 matrix: a weight [out, in] or activations [tokens, features].
using CpuMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// SwiGLU down(silu(gate x) * up x): gate, up [I, H], down [H, I].
struct CpuMlpWeights {
  CpuMatrix gate_proj, up_proj, down_proj;
};

struct CpuLayerWeights {
  std::vector<float> input_layernorm, post_attention_layernorm;  // [H]
  bool q_lora = false;
  CpuMatrix q_a_proj;                 // [q_lora, H]        (q_lora)
  std::vector<float> q_a_layernorm;   // [q_lora]           (q_lora)
  CpuMatrix q_b_proj;                 // [nh*(dq+r), q_lora] (q_lora)
  CpuMatrix q_proj;                   // [nh*(dq+r), H]     (!q_lora)
  CpuMatrix kv_a_proj_with_mqa;       // [c+r, H]
  std::vector<float> kv_a_layernorm;  // [c]
  CpuMatrix kv_b_proj;                // [nh*(dq+dv), c]: W_UK_h, W_UV_h blocks (top of file)
  CpuMatrix o_proj;                   // [H, nh*dv]
  bool moe = false;
  CpuMlpWeights mlp;                           // dense layers
  CpuMatrix gate;                              // [E, H]             (moe)
  std::vector<float> e_score_correction_bias;  // [E] or empty (moe)
  bool has_shared_experts = false;
  CpuMlpWeights shared_experts;        // (moe)
  std::vector<CpuMlpWeights> experts;  // E entries (moe)
};

// The per-model cache of fp32 weights (see the top of this file for its memory cost). A
// tensor-parallel rank holds its shard (dist/shard.hpp): the matrices above then have the shard's
// rows / columns (nh -> heads, I -> I / P, E -> experts.size(), V -> vocab.size()).
struct KimiCpuModel {
  io::DeepseekV3Config config;
  std::vector<double> inv_freq;  // [r/2] rope_inv_freq(config)
  CpuMatrix embed_tokens;        // [V, H]
  CpuMatrix lm_head;             // [vocab.size(), H]: rows vocab of the whole lm_head
  std::vector<float> norm;       // [H]
  std::vector<CpuLayerWeights> layers;
  dist::TpShard shard;                    // the part of the checkpoint this model holds
  dist::CpuCommunicator* comm = nullptr;  // sums the ranks' partial outputs (null: size 1)
  int64_t heads = 0;                      // attention heads held: nh / P
  dist::Range experts;  // routed experts held (kExpertParallel: E / P of them; else all E)
  dist::Range vocab;    // lm_head rows held
  int64_t floats = 0;  // floats held (memory = 4 * floats bytes)
  int64_t num_floats() const { return floats; }
};

namespace detail {

inline Status load_cpu_model_impl(KimiWeights const& w, io::DeepseekV3Config const& c,
                                  dist::TpShard const& shard, dist::CpuCommunicator* comm,
                                  KimiCpuModel* out) {
  std::string const fn = "load_kimi_cpu_model (" + c.source + (shard.size > 1 ? ", rank " +
                         std::to_string(shard.rank) + " of " + std::to_string(shard.size) : "") +
                         "): ";
  SPECDEC_RETURN_IF_ERROR(check_model_supported(w, c, fn));
  ShardRanges R;
  SPECDEC_RETURN_IF_ERROR(check_shard_communicator(shard, comm).prefixed(fn));
  SPECDEC_RETURN_IF_ERROR(shard_ranges(w, c, shard, &R).prefixed(fn));
  int const L = c.num_hidden_layers;
  int64_t const H = c.hidden_size, V = c.vocab_size, nh = c.num_attention_heads;
  int64_t const dq = c.qk_nope_head_dim, r = c.qk_rope_head_dim, dv = c.v_head_dim;
  int64_t const ckv = c.kv_lora_rank, qk = dq + r;
  int64_t const h0 = R.heads.begin, h1 = R.heads.end;
  KimiCpuModel m;
  m.config = c;
  m.shard = shard;
  m.comm = comm;  // may be null at size 1; given at size 1, the partial-output path runs
  m.heads = R.heads.size();
  m.experts = R.experts;
  m.vocab = R.vocab;
  SPECDEC_RETURN_IF_ERROR(rope_inv_freq(c, &m.inv_freq).prefixed(fn));
  std::vector<float> f;
  // Rows [r0, r1) x columns [c0, c1) of the linear [o, i].
  auto block = [&](LinearWeights const& lw, int64_t o, int64_t i, int64_t r0, int64_t r1,
                   int64_t c0, int64_t c1, std::string const& what, CpuMatrix* M) -> Status {
    SPECDEC_RETURN_IF_ERROR(linear_block_to_float(lw, o, i, r0, r1, c0, c1, what, &f).prefixed(fn));
    *M = Eigen::Map<CpuMatrix const>(f.data(), r1 - r0, c1 - c0);
    m.floats += (r1 - r0) * (c1 - c0);
    return Status::Ok();
  };
  auto mat = [&](LinearWeights const& lw, int64_t o, int64_t i, std::string const& what,
                 CpuMatrix* M) { return block(lw, o, i, 0, o, 0, i, what, M); };
  auto vec = [&](TensorView const& v, int64_t n, std::string const& what,
                 std::vector<float>* out_vec) -> Status {
    SPECDEC_RETURN_IF_ERROR(view_to_float(v, n, what, out_vec).prefixed(fn));
    m.floats += n;
    return Status::Ok();
  };
  // gate / up rows and down columns `part` of an MLP of width inter.
  auto mlp = [&](MlpWeights const& mw, int64_t inter, dist::Range part, std::string const& p,
                 CpuMlpWeights* o) -> Status {
    SPECDEC_RETURN_IF_ERROR(
        block(mw.gate_proj, inter, H, part.begin, part.end, 0, H, p + ".gate_proj", &o->gate_proj));
    SPECDEC_RETURN_IF_ERROR(
        block(mw.up_proj, inter, H, part.begin, part.end, 0, H, p + ".up_proj", &o->up_proj));
    return block(mw.down_proj, H, inter, 0, H, part.begin, part.end, p + ".down_proj",
                 &o->down_proj);
  };
  SPECDEC_RETURN_IF_ERROR(vec(w.embed_tokens, V * H, "embed_tokens", &f));
  m.embed_tokens = Eigen::Map<CpuMatrix const>(f.data(), V, H);
  SPECDEC_RETURN_IF_ERROR(
      view_block_to_float(w.lm_head, V, H, R.vocab.begin, R.vocab.end, 0, H, "lm_head", &f)
          .prefixed(fn));
  m.lm_head = Eigen::Map<CpuMatrix const>(f.data(), R.vocab.size(), H);
  m.floats += R.vocab.size() * H;
  SPECDEC_RETURN_IF_ERROR(vec(w.norm, H, "norm", &m.norm));
  m.layers.resize(static_cast<size_t>(L));
  for (int li = 0; li < L; ++li) {
    LayerWeights const& l = w.layers[static_cast<size_t>(li)];
    CpuLayerWeights& o = m.layers[static_cast<size_t>(li)];
    std::string const p = "layers." + std::to_string(li) + ".";
    std::string const a = p + "self_attn.";
    SPECDEC_RETURN_IF_ERROR(vec(l.input_layernorm, H, p + "input_layernorm", &o.input_layernorm));
    SPECDEC_RETURN_IF_ERROR(vec(l.post_attention_layernorm, H, p + "post_attention_layernorm",
                                &o.post_attention_layernorm));
    o.q_lora = l.q_lora;
    if (l.q_lora) {
      int64_t const ql = *c.q_lora_rank;
      SPECDEC_RETURN_IF_ERROR(mat(l.q_a_proj, ql, H, a + "q_a_proj", &o.q_a_proj));
      SPECDEC_RETURN_IF_ERROR(vec(l.q_a_layernorm, ql, a + "q_a_layernorm", &o.q_a_layernorm));
      SPECDEC_RETURN_IF_ERROR(
          block(l.q_b_proj, nh * qk, ql, h0 * qk, h1 * qk, 0, ql, a + "q_b_proj", &o.q_b_proj));
    } else {
      SPECDEC_RETURN_IF_ERROR(
          block(l.q_proj, nh * qk, H, h0 * qk, h1 * qk, 0, H, a + "q_proj", &o.q_proj));
    }
    SPECDEC_RETURN_IF_ERROR(
        mat(l.kv_a_proj_with_mqa, ckv + r, H, a + "kv_a_proj_with_mqa", &o.kv_a_proj_with_mqa));
    SPECDEC_RETURN_IF_ERROR(vec(l.kv_a_layernorm, ckv, a + "kv_a_layernorm", &o.kv_a_layernorm));
    SPECDEC_RETURN_IF_ERROR(block(l.kv_b_proj, nh * (dq + dv), ckv, h0 * (dq + dv),
                                  h1 * (dq + dv), 0, ckv, a + "kv_b_proj", &o.kv_b_proj));
    SPECDEC_RETURN_IF_ERROR(
        block(l.o_proj, H, nh * dv, 0, H, h0 * dv, h1 * dv, a + "o_proj", &o.o_proj));
    o.moe = l.moe;
    if (!l.moe) {
      SPECDEC_RETURN_IF_ERROR(mlp(l.mlp, c.intermediate_size, R.dense, p + "mlp", &o.mlp));
      continue;
    }
    int64_t const E = c.n_routed_experts;
    SPECDEC_RETURN_IF_ERROR(vec(l.gate, E * H, p + "mlp.gate.weight", &f));
    o.gate = Eigen::Map<CpuMatrix const>(f.data(), E, H);
    if (l.has_correction_bias) {
      SPECDEC_RETURN_IF_ERROR(vec(l.e_score_correction_bias, E,
                                  p + "mlp.gate.e_score_correction_bias",
                                  &o.e_score_correction_bias));
    }
    o.has_shared_experts = l.has_shared_experts;
    if (l.has_shared_experts) {
      SPECDEC_RETURN_IF_ERROR(mlp(l.shared_experts,
                                  int64_t{c.n_shared_experts} * c.moe_intermediate_size, R.shared,
                                  p + "mlp.shared_experts", &o.shared_experts));
    }
    o.experts.resize(static_cast<size_t>(R.experts.size()));
    for (int64_t e = R.experts.begin; e < R.experts.end; ++e) {
      SPECDEC_RETURN_IF_ERROR(mlp(l.experts[static_cast<size_t>(e)], c.moe_intermediate_size,
                                  R.expert_width, p + "mlp.experts." + std::to_string(e),
                                  &o.experts[static_cast<size_t>(e - R.experts.begin)]));
    }
  }
  *out = std::move(m);
  return Status::Ok();
}

}  // namespace detail

// Converts the weights of `weights` (bound for `config`) that tensor-parallel rank shard.rank
// holds (dist/shard.hpp; all of them at size 1) to fp32 Eigen matrices, once, reading only those
// bytes of the checkpoint. `comm` is that rank's communicator (kept by the model: the forward sums
// the ranks' partial outputs through it); it may be null at size 1.
inline Status load_kimi_cpu_model(KimiWeights const& weights, io::DeepseekV3Config const& config,
                                  dist::TpShard const& shard, dist::CpuCommunicator* comm,
                                  KimiCpuModel* out) {
  if (out == nullptr) return Status::InvalidArgument("load_kimi_cpu_model: out is null");
  try {
    return detail::load_cpu_model_impl(weights, config, shard, comm, out);
  } catch (std::exception const& e) {
    return Status::Internal("load_kimi_cpu_model (" + config.source + "): " + e.what());
  }
}

inline Status load_kimi_cpu_model(KimiWeights const& weights, io::DeepseekV3Config const& config,
                                  KimiCpuModel* out) {
  return load_kimi_cpu_model(weights, config, dist::TpShard{}, nullptr, out);
}

namespace detail {

// The sum over the ranks of this rank's partial output (a no-op at tensor-parallel size 1).
inline Status cpu_all_reduce(KimiCpuModel const& m, CpuMatrix* part) {
  if (m.comm == nullptr) return Status::Ok();
  return m.comm->all_reduce_sum(part->data(), part->size());
}

// y = down(silu(x gate^T) * (x up^T)) for x [n, H] -> [n, H].
inline CpuMatrix cpu_swiglu(CpuMlpWeights const& w, CpuMatrix const& x) {
  CpuMatrix g = x * w.gate_proj.transpose();
  CpuMatrix const u = x * w.up_proj.transpose();
  g = g.binaryExpr(u, [](float a, float b) { return silu_times(a, b); });
  return g * w.down_proj.transpose();
}

inline Status cpu_rms_rows(CpuMatrix const& x, std::vector<float> const& w, double eps,
                           CpuMatrix* out) {
  out->resize(x.rows(), x.cols());
  size_t const n = static_cast<size_t>(x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    SPECDEC_RETURN_IF_ERROR(rms_norm_reference({x.data() + t * x.cols(), n}, w, eps,
                                               {out->data() + t * out->cols(), n}));
  }
  return Status::Ok();
}

// Attention of one layer for every segment; the layer's new cache entries are written first.
// xn [T, H] (input_layernorm'd), positions [T]; adds o_proj(o) (summed over the ranks) to *x.
// nh below is the rank's heads.
inline Status cpu_attention(KimiCpuModel const& m, int li, MlaCache* cache,
                            std::vector<ForwardSegment> const& segs, CpuMatrix const& xn,
                            std::span<int64_t const> positions, CpuMatrix* x) {
  io::DeepseekV3Config const& c = m.config;
  CpuLayerWeights const& l = m.layers[static_cast<size_t>(li)];
  int64_t const T = xn.rows(), nh = m.heads, dq = c.qk_nope_head_dim;
  int64_t const r = c.qk_rope_head_dim, dv = c.v_head_dim, ckv = c.kv_lora_rank;
  int64_t const qk = dq + r, W = ckv + r;
  double const eps = c.rms_norm_eps, cs = c.rope_cos_sin_scale();
  float const scale = static_cast<float>(c.softmax_scale());
  using Stride = Eigen::OuterStride<>;
  using MapC = Eigen::Map<CpuMatrix const, 0, Stride>;
  using MapW = Eigen::Map<CpuMatrix, 0, Stride>;

  CpuMatrix q;  // [T, nh * qk]
  if (l.q_lora) {
    CpuMatrix qa = xn * l.q_a_proj.transpose();
    CpuMatrix qan;
    SPECDEC_RETURN_IF_ERROR(cpu_rms_rows(qa, l.q_a_layernorm, eps, &qan));
    q = qan * l.q_b_proj.transpose();
  } else {
    q = xn * l.q_proj.transpose();
  }
  CpuMatrix const kva = xn * l.kv_a_proj_with_mqa.transpose();  // [T, c + r]
  float* layer = cache->layer(li);
  for (ForwardSegment const& s : segs) {
    for (int64_t i = 0; i < s.count; ++i) {
      int64_t const t = s.first + i;
      float* e = layer + s.rows[static_cast<size_t>(s.base + i)] * W;
      SPECDEC_RETURN_IF_ERROR(rms_norm_reference({kva.data() + t * W, static_cast<size_t>(ckv)},
                                                 l.kv_a_layernorm, eps,
                                                 {e, static_cast<size_t>(ckv)}));
      std::copy(kva.data() + t * W + ckv, kva.data() + (t + 1) * W, e + ckv);
      SPECDEC_RETURN_IF_ERROR(rope_interleaved_reference({e + ckv, static_cast<size_t>(r)},
                                                         positions[t], m.inv_freq, cs));
      for (int64_t h = 0; h < nh; ++h) {
        SPECDEC_RETURN_IF_ERROR(rope_interleaved_reference(
            {q.data() + t * nh * qk + h * qk + dq, static_cast<size_t>(r)}, positions[t],
            m.inv_freq, cs));
      }
    }
  }
  CpuMatrix o(T, nh * dv);
  for (ForwardSegment const& s : segs) {
    int64_t const n = s.count, S = s.base + n;
    CpuMatrix K(S, W);  // the request's entries, slots [0, S)
    for (int64_t u = 0; u < S; ++u) {
      float const* e = layer + s.rows[static_cast<size_t>(u)] * W;
      std::copy(e, e + W, K.data() + u * W);
    }
    CpuMatrix qa(n * nh, W);  // row i * nh + h = [W_UK_h^T q_nope_h | q_pe_h] of token i
    for (int64_t h = 0; h < nh; ++h) {
      float const* qh = q.data() + s.first * nh * qk + h * qk;
      MapW(qa.data() + h * W, n, ckv, Stride(nh * W)).noalias() =
          MapC(qh, n, dq, Stride(nh * qk)) * l.kv_b_proj.block(h * (dq + dv), 0, dq, ckv);
      MapW(qa.data() + h * W + ckv, n, r, Stride(nh * W)) = MapC(qh + dq, n, r, Stride(nh * qk));
    }
    CpuMatrix p = qa * K.transpose();  // [n * nh, S] scores, then probabilities
    for (int64_t i = 0; i < n; ++i) {
      uint32_t const* mrow = s.mask ? s.mask + i * s.words : nullptr;
      auto visible = [&](int64_t u) {
        if (u < s.base) return true;
        int64_t const j = u - s.base;
        return mrow ? ((mrow[j >> 5] >> (j & 31)) & 1u) != 0 : j <= i;
      };
      for (int64_t h = 0; h < nh; ++h) {
        float* row = p.data() + (i * nh + h) * S;
        float mx = -INFINITY;
        for (int64_t u = 0; u < S; ++u) {
          if (visible(u)) mx = std::max(mx, row[u] * scale);
        }
        float z = 0.0f;
        for (int64_t u = 0; u < S; ++u) {
          row[u] = visible(u) ? std::exp(row[u] * scale - mx) : 0.0f;
          z += row[u];
        }
        for (int64_t u = 0; u < S; ++u) row[u] /= z;
      }
    }
    CpuMatrix const lat = p * K.leftCols(ckv);  // [n * nh, c]: sum_u p_u c_u
    for (int64_t h = 0; h < nh; ++h) {
      MapW(o.data() + s.first * nh * dv + h * dv, n, dv, Stride(nh * dv)).noalias() =
          MapC(lat.data() + h * ckv, n, ckv, Stride(nh * ckv)) *
          l.kv_b_proj.block(h * (dq + dv) + dq, 0, dv, ckv).transpose();
    }
  }
  CpuMatrix part = o * l.o_proj.transpose();
  SPECDEC_RETURN_IF_ERROR(cpu_all_reduce(m, &part));
  *x += part;
  return Status::Ok();
}

// Dense or MoE MLP of one layer over xn [T, H]; adds its output (summed over the ranks) to *x.
// Every rank routes every token; it runs the experts it holds (m.experts) on their share.
inline Status cpu_mlp(KimiCpuModel const& m, int li, CpuMatrix const& xn, CpuMatrix* x) {
  io::DeepseekV3Config const& c = m.config;
  CpuLayerWeights const& l = m.layers[static_cast<size_t>(li)];
  if (!l.moe) {
    CpuMatrix part = cpu_swiglu(l.mlp, xn);
    SPECDEC_RETURN_IF_ERROR(cpu_all_reduce(m, &part));
    *x += part;
    return Status::Ok();
  }
  int64_t const T = xn.rows(), E = c.n_routed_experts;
  CpuMatrix const logit = xn * l.gate.transpose();  // [T, E]
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));
  std::vector<std::vector<float>> wts(static_cast<size_t>(E));
  std::vector<float> scores(static_cast<size_t>(E)), w;
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      scores[e] = ops::moe_router_score(logit(t, e));
    }
    SPECDEC_RETURN_IF_ERROR(moe_route_reference(
        scores, l.e_score_correction_bias, c.n_group, c.topk_group, c.num_experts_per_tok,
        c.norm_topk_prob, static_cast<float>(c.routed_scaling_factor), &ids, &w));
    for (size_t k = 0; k < ids.size(); ++k) {
      rows[static_cast<size_t>(ids[k])].push_back(t);
      wts[static_cast<size_t>(ids[k])].push_back(w[k]);
    }
  }
  CpuMatrix y = CpuMatrix::Zero(T, xn.cols());
  for (int64_t e = m.experts.begin; e < m.experts.end; ++e) {
    std::vector<int64_t> const& re = rows[static_cast<size_t>(e)];
    if (re.empty()) continue;
    CpuMatrix xe(static_cast<Eigen::Index>(re.size()), xn.cols());
    for (size_t k = 0; k < re.size(); ++k) xe.row(static_cast<Eigen::Index>(k)) = xn.row(re[k]);
    CpuMatrix const ye =
        cpu_swiglu(l.experts[static_cast<size_t>(e - m.experts.begin)], xe);
    for (size_t k = 0; k < re.size(); ++k) {
      y.row(re[k]) += wts[static_cast<size_t>(e)][k] * ye.row(static_cast<Eigen::Index>(k));
    }
  }
  if (l.has_shared_experts) y += cpu_swiglu(l.shared_experts, xn);
  SPECDEC_RETURN_IF_ERROR(cpu_all_reduce(m, &y));
  *x += y;
  return Status::Ok();
}

// The forward of validated segments whose slots are reserved: writes every layer's entries of
// slots [base, base + n) and fills *logits [T, V], *aux [T, |aux| * H].
inline Status cpu_forward(KimiCpuModel const& m, MlaCache* cache,
                          std::vector<ForwardSegment> const& segs, std::span<int32_t const> tokens,
                          std::span<int64_t const> positions, std::span<int const> aux_layers,
                          LogitsMode mode, std::vector<float>* logits,
                          std::vector<int32_t>* argmax, std::vector<float>* aux) {
  io::DeepseekV3Config const& c = m.config;
  int64_t const T = static_cast<int64_t>(tokens.size()), H = c.hidden_size, V = c.vocab_size;
  int64_t const A = static_cast<int64_t>(aux_layers.size());
  std::vector<float> aux_out(static_cast<size_t>(T * A * H));
  auto capture = [&](int id, CpuMatrix const& x) {
    for (int64_t a = 0; a < A; ++a) {
      if (aux_layers[a] != id) continue;
      for (int64_t t = 0; t < T; ++t) {
        std::copy(x.data() + t * H, x.data() + (t + 1) * H, aux_out.data() + (t * A + a) * H);
      }
    }
  };
  CpuMatrix x(T, H), xn;
  for (int64_t t = 0; t < T; ++t) x.row(t) = m.embed_tokens.row(tokens[t]);
  capture(kEmbedding, x);
  for (int li = 0; li < c.num_hidden_layers; ++li) {
    CpuLayerWeights const& l = m.layers[static_cast<size_t>(li)];
    SPECDEC_RETURN_IF_ERROR(cpu_rms_rows(x, l.input_layernorm, c.rms_norm_eps, &xn));
    SPECDEC_RETURN_IF_ERROR(cpu_attention(m, li, cache, segs, xn, positions, &x));
    SPECDEC_RETURN_IF_ERROR(cpu_rms_rows(x, l.post_attention_layernorm, c.rms_norm_eps, &xn));
    SPECDEC_RETURN_IF_ERROR(cpu_mlp(m, li, xn, &x));
    capture(li, x);
  }
  SPECDEC_RETURN_IF_ERROR(cpu_rms_rows(x, m.norm, c.rms_norm_eps, &xn));
  if (mode == LogitsMode::kArgmax) {  // this rank's slice, and one key per row from every rank
    int64_t const Vp = m.vocab.size(), P = m.comm ? m.comm->size() : 1;
    logits->resize(static_cast<size_t>(T * Vp));
    Eigen::Map<CpuMatrix>(logits->data(), T, Vp).noalias() = xn * m.lm_head.transpose();
    std::vector<uint64_t> keys(static_cast<size_t>(T)), all(static_cast<size_t>(P * T));
    row_argmax_keys_reference(logits->data(), T, Vp, m.vocab.begin, keys.data());
    if (m.comm) {
      SPECDEC_RETURN_IF_ERROR(m.comm->all_gather_bytes(
          reinterpret_cast<std::byte const*>(keys.data()), T * 8,
          reinterpret_cast<std::byte*>(all.data())));
    } else {
      all = keys;
    }
    argmax->resize(static_cast<size_t>(T));
    argmax_of_keys_reference(all.data(), P, T, argmax->data());
    if (aux) *aux = std::move(aux_out);
    return Status::Ok();
  }
  logits->resize(static_cast<size_t>(T * V));
  if (m.vocab.size() == V) {
    Eigen::Map<CpuMatrix>(logits->data(), T, V).noalias() = xn * m.lm_head.transpose();
  } else {  // the ranks' vocabulary slices [T, V / P], gathered [P, T, V / P], laid out [T, V]
    int64_t const Vp = m.vocab.size(), P = m.shard.size;
    CpuMatrix const local = xn * m.lm_head.transpose();
    std::vector<float> all(static_cast<size_t>(P * T * Vp));
    SPECDEC_RETURN_IF_ERROR(m.comm->all_gather(local.data(), T * Vp, all.data()));
    for (int64_t q = 0; q < P; ++q) {
      for (int64_t t = 0; t < T; ++t) {
        float const* src = all.data() + (q * T + t) * Vp;
        std::copy(src, src + Vp, logits->data() + t * V + q * Vp);
      }
    }
  }
  if (aux) *aux = std::move(aux_out);
  return Status::Ok();
}

template <class Fn>
Status cpu_guard(std::string const& fn, Fn&& f) {
  try {
    return f();
  } catch (std::exception const& e) {
    return Status::Internal(fn + e.what());
  }
}

// The forward of a planned batch, then the cache bookkeeping.
inline Status cpu_run(KimiCpuModel const& m, MlaCache* cache,
                      ForwardPlan const& plan, std::span<int const> aux_layers, LogitsMode mode,
                      std::vector<float>* logits, std::vector<int32_t>* argmax,
                      std::vector<float>* aux) {
  SPECDEC_RETURN_IF_ERROR(cpu_forward(m, cache, plan.segments, plan.tokens, plan.positions,
                                      aux_layers, mode, logits, argmax, aux));
  return finish_forward(cache, plan);
}

// The model is loaded and the outputs are there.
inline Status cpu_check(std::string const& fn, KimiCpuModel const& m,
                        std::span<int const> aux_layers, std::vector<float> const* logits,
                        std::vector<float> const* aux, LogitsMode mode,
                        std::vector<int32_t> const* argmax) {
  if (logits == nullptr) return Status::InvalidArgument(fn + "logits is null");
  if (mode == LogitsMode::kArgmax && argmax == nullptr) {
    return Status::InvalidArgument(fn + "argmax is null with LogitsMode::kArgmax");
  }
  if (!aux_layers.empty() && aux == nullptr) {
    return Status::InvalidArgument(fn + "aux is null but " + std::to_string(aux_layers.size()) +
                                   " aux_layers were requested");
  }
  if (static_cast<int>(m.layers.size()) != m.config.num_hidden_layers || m.inv_freq.empty() ||
      m.heads <= 0) {
    return Status::InvalidArgument(fn + "the model is not loaded (load_kimi_cpu_model)");
  }
  return Status::Ok();
}

}  // namespace detail

// Prefill: request requests[b] gets counts[b] >= 1 tokens, taken in order from tokens
// [sum counts], at slots / positions length + i; its length advances by counts[b].
// logits [sum counts, V]; aux [sum counts, |aux_layers| * H] (may be null when aux_layers empty).
inline Status kimi_prefill(CpuExecutor, KimiCpuModel const& model, MlaCache* cache,
                           std::span<RequestId const> requests, std::span<int32_t const> counts,
                           std::span<int32_t const> tokens, std::span<int const> aux_layers,
                           std::vector<float>* logits, std::vector<float>* aux,
                           LogitsMode mode = LogitsMode::kFull,
                           std::vector<int32_t>* argmax = nullptr) {
  std::string const fn = "kimi_prefill (cpu): ";
  return detail::cpu_guard(fn, [&]() -> Status {
    SPECDEC_RETURN_IF_ERROR(detail::cpu_check(fn, model, aux_layers, logits, aux, mode, argmax));
    ForwardPlan plan;
    SPECDEC_RETURN_IF_ERROR(
        plan_prefill(fn, model.config, cache, requests, counts, tokens, aux_layers, &plan));
    return detail::cpu_run(model, cache, plan, aux_layers, mode, logits, argmax, aux);
  });
}

// Decode: one token per request (tokens [B]) at slot / position length; lengths advance by 1.
// logits [B, V]; aux [B, |aux_layers| * H].
inline Status kimi_decode(CpuExecutor, KimiCpuModel const& model, MlaCache* cache,
                          std::span<RequestId const> requests, std::span<int32_t const> tokens,
                          std::span<int const> aux_layers, std::vector<float>* logits,
                          std::vector<float>* aux, LogitsMode mode = LogitsMode::kFull,
                          std::vector<int32_t>* argmax = nullptr) {
  std::string const fn = "kimi_decode (cpu): ";
  return detail::cpu_guard(fn, [&]() -> Status {
    SPECDEC_RETURN_IF_ERROR(detail::cpu_check(fn, model, aux_layers, logits, aux, mode, argmax));
    ForwardPlan plan;
    SPECDEC_RETURN_IF_ERROR(plan_decode(fn, model.config, cache, requests, tokens, aux_layers, &plan));
    return detail::cpu_run(model, cache, plan, aux_layers, mode, logits, argmax, aux);
  });
}

// Tree verify: per request b, N nodes tokens [B, N] at positions [B, N] (= length + depth) with
// ancestor-or-self rows mask [B, N, ceil(N/32)] (ops::tree_build's depth / positions / mask with
// prefix_len = the lengths). Node i's entry goes to slot length + i and is staged
// (MlaCache::stage); lengths do not move. logits [B * N, V]; aux [B * N, |aux_layers| * H].
inline Status kimi_verify(CpuExecutor, KimiCpuModel const& model, MlaCache* cache,
                          std::span<RequestId const> requests, int nodes,
                          std::span<int32_t const> tokens, std::span<int32_t const> positions,
                          std::span<uint32_t const> mask, std::span<int const> aux_layers,
                          std::vector<float>* logits, std::vector<float>* aux,
                          LogitsMode mode = LogitsMode::kFull,
                          std::vector<int32_t>* argmax = nullptr) {
  std::string const fn = "kimi_verify (cpu): ";
  return detail::cpu_guard(fn, [&]() -> Status {
    SPECDEC_RETURN_IF_ERROR(detail::cpu_check(fn, model, aux_layers, logits, aux, mode, argmax));
    ForwardPlan plan;
    SPECDEC_RETURN_IF_ERROR(plan_verify(fn, model.config, cache, requests, nodes, tokens,
                                        positions, mask, aux_layers, &plan));
    return detail::cpu_run(model, cache, plan, aux_layers, mode, logits, argmax, aux);
  });
}

}  // namespace specdec::model::kimi
