// The CPU executor's EAGLE-family draft (one Llama decoder layer; config.hpp's two layouts,
// reference/kimi.md "EAGLE-3 draft checkpoint") with its host KV cache, on a batch of requests:
//   draft_extend   committed entries: counts[b] >= 1 entries per request appended after its
//                  length, causal among themselves, each from its target feature; returns the
//                  LAST entry's hidden and logits per request; clears the request's scratch
//   draft_step     B x K scratch entries (the current proposal, never committed): each entry
//                  continues a parent (a scratch index of its request, or -1 = directly after
//                  the committed prefix) from the parent's own output hidden h''; returns every
//                  entry's hidden, logits and scratch index
//
// One entry, for input token t (a TARGET vocabulary id) and incoming hidden h [H]:
//   EAGLE-3    x = [rms(embed(t), input_layernorm) | rms(h, hidden_norm)] [2H], residual r = h,
//              where h = fc(target feature [|L| * Ht]) (extend) or the parent's h'' (step)
//   EAGLE-1/2  x = r = fc([embed(t) | h]) + fc.bias [H] (layer 0 has no input norm), where
//              h = rms(target feature, the TARGET's final norm) (extend: the target's last hidden
//              state as its lm_head reads it) or the parent's h'' (step)
//   q, k, v = x q_proj^T, x k_proj^T, x v_proj^T        [nh * hd], [nkv * hd], [nkv * hd]
//   NeoX rope (rotate-half: the pairs (i, i + hd/2)) on every head of q and k at the entry's
//   position, inv_freq_i = 1 / rope_theta^(2i / hd)
//   o_h = sum_u softmax_u(q_h . k_{u,g(h)} / sqrt(hd)) v_{u,g(h)}, g(h) = h / (nh / nkv) (GQA),
//   over the entries u visible to this one (itself included)
//   h'  = r + o_proj(o);  h'' = h' + down(silu(gate(n)) * up(n)), n = rms(h', post_attention_
//   layernorm)
//   EAGLE-3    logits = lm_head(rms(h'', norm))  [Vd] (draft vocabulary: target id = d + d2t[d])
//   EAGLE-1/2  logits = the target's lm_head(h'')  [V] (no norm; d2t is all 0)
// with rms(x, w) = w * x / sqrt(mean(x^2) + eps) (model/kimi's rms_norm_reference; the draft's
// rms_norm_eps, the target's for the target's final norm).
// Engine semantics: the extend entry at position i pairs token t_{i+1} with the target's
// features of token t_i (the residual streams config.feature_layers(), concatenated in order).
//
// Cache (DraftCache, per request): committed K (roped) and V [length, nkv * hd] each; scratch
// entries with parent and depth (0 for parent -1, parent's + 1 otherwise) at position length +
// depth. Visible to an extend entry at position length + i: committed [0, length) and this call's
// entries 0..i. Visible to a scratch entry: committed [0, length) and its scratch ancestors-or-self
// (tree attention: a branch sees only its own ancestors).
//
// Precision: Eigen fp32 products (float accumulation) on fp32 weights (bf16 / fp16 converted
// exactly once at load); norms and rope in double (model/kimi's helpers).
//
// Errors (Status naming the function and the numbers; a failed call changes neither the cache
// nor the outputs): model not loaded, cache width not the model's, unknown or repeated request,
// counts < 1 or not adding up, tokens / features / parent_hidden of the wrong size, a token outside
// the target vocabulary, parent_scratch outside [-1, scratch size of the request), a position past
// max_position_embeddings; at load, a target tensor the draft needs that was not given.
//
// Public API (namespace specdec::model::eagle):
//   DraftCpuModel, TargetTensors {embedding [V, Ht], lm_head [V, Ht], final_norm [Ht], eps},
//   target_tensors_of(KimiCpuModel), load_draft_cpu_model(dir, target_config, target_tensors,
//   policy_kind, policy_layers, policy_what, &model)
//   DraftCache (create_for, add_request, free_request, length, scratch_size, clear_scratch)
//   draft_extend(CpuExecutor, model, &cache, requests [B], counts [B], tokens [sum counts],
//                features [sum counts, feature_width], *hidden_last [B, H], *logits_last [B, Vd])
//   draft_step(CpuExecutor, model, &cache, requests [B], branches K, tokens [B * K],
//              parent_hidden [B * K, H], parent_scratch [B * K], *hidden [B * K, H],
//              *logits [B * K, Vd], *scratch_index [B * K])
//   rope_neox_inv_freq(head_dim, theta), rope_neox_reference(x [hd], position, inv_freq)
#pragma once

#include <Eigen/Dense>  // Eigen 3.4 (Eigen3::Eigen, linked by specdec::specdec)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/executor.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/eagle/config.hpp"
#include "specdec/model/eagle/weights.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/forward_reference.hpp"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/policy/draft.hpp"

namespace specdec::model::eagle {

using kimi::CpuMatrix;
using RequestId = kimi::RequestId;

// inv_freq [head_dim / 2]: 1 / theta^(2i / head_dim) (Llama's unscaled rope).
inline std::vector<double> rope_neox_inv_freq(int head_dim, double theta) {
  std::vector<double> f(static_cast<size_t>(std::max(head_dim, 0) / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = 1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / head_dim);
  }
  return f;
}

// In place on x [2 * inv_freq.size()] (one head), NeoX / rotate-half layout: for i < d/2,
// a = position * inv_freq[i], (x_i, x_{i+d/2}) -> (x_i cos a - x_{i+d/2} sin a,
// x_{i+d/2} cos a + x_i sin a).
inline void rope_neox_reference(float* x, int64_t position, std::span<double const> inv_freq) {
  size_t const half = inv_freq.size();
  for (size_t i = 0; i < half; ++i) {
    double const a = static_cast<double>(position) * inv_freq[i];
    double const c = std::cos(a), s = std::sin(a);
    double const x1 = x[i], x2 = x[i + half];
    x[i] = static_cast<float>(x1 * c - x2 * s);
    x[i + half] = static_cast<float>(x2 * c + x1 * s);
  }
}

// The target's tensors a draft reads (fp32 on the host, NOT owned: each must outlive the draft).
struct TargetTensors {
  float const* embedding = nullptr;   // [V, Ht]: read by a draft without embed_tokens.weight
  float const* lm_head = nullptr;     // [V, Ht]: EAGLE-1/2's output head
  float const* final_norm = nullptr;  // [Ht]: EAGLE-1/2's feature is the target's final-normed
  double final_norm_eps = 0.0;        //       last hidden state (what lm_head reads)
};

// lm_head is null when the target holds a vocabulary slice of it (tensor parallel without
// replicate_lm_head): an EAGLE-1/2 draft, which needs the whole lm_head, is then refused.
inline TargetTensors target_tensors_of(kimi::KimiCpuModel const& m) {
  bool const whole = m.vocab.size() == m.config.vocab_size;
  return {m.embed_tokens.data(), whole ? m.lm_head.data() : nullptr, m.norm.data(),
          m.config.rms_norm_eps};
}

// Every weight as fp32 (row-major [out, in]), converted once.
struct DraftCpuModel {
  DraftConfig config;
  CpuMatrix fc;                                           // [H, fc_in_width]
  std::vector<float> fc_bias;                             // [H] or empty (EAGLE-1/2)
  std::vector<float> hidden_norm, input_layernorm, norm;  // [H] (EAGLE-3)
  std::vector<float> post_attention_layernorm;            // [H]
  CpuMatrix q_proj, k_proj, v_proj;  // [nh * hd, A], [nkv * hd, A], A = attention_in_width
  CpuMatrix o_proj;                  // [H, nh * hd]
  kimi::CpuMlpWeights mlp;           // gate / up [I, H], down [H, I]
  CpuMatrix lm_head;                 // [Vd, H] (EAGLE-3)
  bool has_embedding = false;
  CpuMatrix embed_tokens;           // [V, H] (has_embedding)
  TargetTensors target;             // the target's tensors this draft reads (NOT owned)
  std::vector<int> feature_layers;  // config.feature_layers(): the target streams read, in order
  std::vector<int64_t> d2t;         // [Vd]: target id = d + d2t[d] (ops::draft_expand's d2t)
  std::vector<uint8_t> t2d;         // [V]
  std::vector<double> inv_freq;     // [hd / 2]
  int64_t floats = 0;               // floats held (memory = 4 * floats bytes)

  int64_t hidden() const { return config.hidden_size; }
  int64_t vocab() const { return config.vocab_size; }
  int64_t draft_vocab() const { return config.draft_vocab_size; }
  int64_t feature_width() const { return config.feature_width(); }
  int64_t kv_width() const { return config.kv_width(); }
  DraftKind kind() const { return config.kind; }
  // The policy's layer set (EAGLE-3's; empty for EAGLE-1/2).
  std::span<int const> layers() const { return config.layers; }
  int64_t draft_to_target(int64_t d) const { return d + d2t[static_cast<size_t>(d)]; }
  bool loaded() const { return !inv_freq.empty() && fc.rows() == config.hidden_size; }
  float const* embedding_row(int64_t token) const {
    return (has_embedding ? embed_tokens.data() : target.embedding) + token * config.hidden_size;
  }
};

namespace detail {

inline Status floats_of(TensorView const& v, std::vector<float>* out) {
  if (v.dtype != Dtype::kF16) return kimi::detail::view_to_float(v, v.numel(), v.name, out);
  out->resize(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out->size(); ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, v.bytes.data() + 2 * i, 2);
    (*out)[i] = fp16_to_float(bits);
  }
  return Status::Ok();
}

inline Status load_cpu_impl(std::string const& dir, io::DeepseekV3Config const& target,
                            TargetTensors const& target_tensors, DraftKind policy_kind,
                            std::span<int const> policy_layers, std::string_view policy_what,
                            DraftCpuModel* out) {
  DraftConfig c;
  SPECDEC_RETURN_IF_ERROR(read_draft_config(dir, target.num_hidden_layers, &c));
  SPECDEC_RETURN_IF_ERROR(check_draft_config_fits(c, policy_kind, policy_layers, policy_what));
  SPECDEC_RETURN_IF_ERROR(check_draft_target(c, target));
  if (!c.eagle3() && (target_tensors.lm_head == nullptr || target_tensors.final_norm == nullptr ||
                      !(target_tensors.final_norm_eps > 0.0))) {
    return Status::InvalidArgument(
        dir +
        ": an EAGLE-1/2 draft reads the target's lm_head and final norm (with its eps > 0); "
        "pass them in TargetTensors (target_tensors_of; a tensor-parallel target holds its "
        "whole lm_head only when loaded with TpShard::replicate_lm_head)");
  }
  io::SafetensorsCheckpoint ckpt;
  SPECDEC_RETURN_IF_ERROR(io::SafetensorsCheckpoint::open(dir, &ckpt));
  DraftWeights w;
  SPECDEC_RETURN_IF_ERROR(load_draft_weights(ckpt, c, target_tensors.embedding != nullptr, &w));

  DraftCpuModel m;
  m.config = c;
  std::vector<float> f;
  auto mat = [&](TensorView const& v, CpuMatrix* M) -> Status {
    SPECDEC_RETURN_IF_ERROR(floats_of(v, &f));
    *M = Eigen::Map<CpuMatrix const>(f.data(), v.shape[0], v.shape[1]);
    m.floats += v.numel();
    return Status::Ok();
  };
  auto vec = [&](TensorView const& v, std::vector<float>* o) -> Status {
    SPECDEC_RETURN_IF_ERROR(floats_of(v, o));
    m.floats += v.numel();
    return Status::Ok();
  };
  SPECDEC_RETURN_IF_ERROR(mat(w.fc, &m.fc));
  if (w.has_fc_bias) SPECDEC_RETURN_IF_ERROR(vec(w.fc_bias, &m.fc_bias));
  if (c.eagle3()) {
    SPECDEC_RETURN_IF_ERROR(vec(w.hidden_norm, &m.hidden_norm));
    SPECDEC_RETURN_IF_ERROR(vec(w.input_layernorm, &m.input_layernorm));
    SPECDEC_RETURN_IF_ERROR(vec(w.norm, &m.norm));
    SPECDEC_RETURN_IF_ERROR(mat(w.lm_head, &m.lm_head));
  }
  SPECDEC_RETURN_IF_ERROR(vec(w.post_attention_layernorm, &m.post_attention_layernorm));
  SPECDEC_RETURN_IF_ERROR(mat(w.q_proj, &m.q_proj));
  SPECDEC_RETURN_IF_ERROR(mat(w.k_proj, &m.k_proj));
  SPECDEC_RETURN_IF_ERROR(mat(w.v_proj, &m.v_proj));
  SPECDEC_RETURN_IF_ERROR(mat(w.o_proj, &m.o_proj));
  SPECDEC_RETURN_IF_ERROR(mat(w.gate_proj, &m.mlp.gate_proj));
  SPECDEC_RETURN_IF_ERROR(mat(w.up_proj, &m.mlp.up_proj));
  SPECDEC_RETURN_IF_ERROR(mat(w.down_proj, &m.mlp.down_proj));
  m.has_embedding = w.has_embedding;
  if (w.has_embedding) SPECDEC_RETURN_IF_ERROR(mat(w.embed_tokens, &m.embed_tokens));
  m.target = target_tensors;
  m.feature_layers = c.feature_layers();
  m.d2t = std::move(w.d2t);
  m.t2d = std::move(w.t2d);
  m.inv_freq = rope_neox_inv_freq(c.head_dim, c.rope_theta);
  *out = std::move(m);
  return Status::Ok();
}

}  // namespace detail

// Reads the draft in `dir` (config.json + safetensors) for the target `target` served under the
// policy (`policy_kind`, `policy_layers`, described by `policy_what`, e.g. describe<P>()), checks
// everything config.hpp and weights.hpp list, and converts every weight to fp32.
// `target_tensors`: the target's fp32 tensors (target_tensors_of(KimiCpuModel)); the model keeps
// the pointers it needs (they must outlive it): the embedding for a draft without
// embed_tokens.weight, lm_head and the final norm for EAGLE-1/2.
inline Status load_draft_cpu_model(std::string const& dir, io::DeepseekV3Config const& target,
                                   TargetTensors const& target_tensors, DraftKind policy_kind,
                                   std::span<int const> policy_layers, std::string_view policy_what,
                                   DraftCpuModel* out) {
  std::string const fn = "load_draft_cpu_model: ";
  if (out == nullptr) return Status::InvalidArgument(fn + "out is null");
  return kimi::detail::cpu_guard(fn, [&]() -> Status {
    return detail::load_cpu_impl(dir, target, target_tensors, policy_kind, policy_layers,
                                 policy_what, out)
        .prefixed(fn);
  });
}

// ---------------------------------------------------------------------------------------------
// Cache.

// One request's draft KV (host, fp32). W = nkv * hd.
struct DraftSequence {
  int64_t length = 0;
  std::vector<float> k, v;                  // committed [length, W] each (K after rope)
  std::vector<float> scratch_k, scratch_v;  // [S, W]
  std::vector<int32_t> scratch_parent;      // [S]: -1 or an earlier scratch index
  std::vector<int32_t> scratch_depth;       // [S]: position = length + depth
  int64_t scratch_size() const { return static_cast<int64_t>(scratch_parent.size()); }
  void clear_scratch() {
    scratch_k.clear();
    scratch_v.clear();
    scratch_parent.clear();
    scratch_depth.clear();
  }
};

// The per-request bookkeeping every draft cache shares (DraftCache here, DraftCudaCache in
// forward_cuda.cuh): requests by id, each a Sequence with length, scratch_size() and
// clear_scratch(); `name` names the cache in messages.
template <class Sequence>
class DraftRequests {
 public:
  bool has_request(RequestId id) const { return seqs_.count(id) != 0; }
  Status length(RequestId id, int64_t* out) const {
    Sequence const* s = find(id);
    if (s == nullptr) return unknown(id);
    *out = s->length;
    return Status::Ok();
  }
  Status scratch_size(RequestId id, int64_t* out) const {
    Sequence const* s = find(id);
    if (s == nullptr) return unknown(id);
    *out = s->scratch_size();
    return Status::Ok();
  }
  Status clear_scratch(RequestId id) {
    Sequence* s = find(id);
    if (s == nullptr) return unknown(id);
    s->clear_scratch();
    return Status::Ok();
  }

  // The executors' access (nullptr for an unknown request).
  Sequence const* find(RequestId id) const {
    auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : &it->second;
  }
  Sequence* find(RequestId id) {
    auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : &it->second;
  }

 protected:
  explicit DraftRequests(char const* name) : name_(name) {}
  Status already_added(RequestId id) const {
    return Status::InvalidArgument(std::string(name_) + ": request " + std::to_string(id) +
                                   " is already in the cache");
  }
  Status unknown(RequestId id) const {
    return Status::InvalidArgument(std::string(name_) + ": request " + std::to_string(id) +
                                   " is not in the cache (add_request)");
  }
  std::map<RequestId, Sequence> seqs_;

 private:
  char const* name_;
};

class DraftCache : public DraftRequests<DraftSequence> {
 public:
  DraftCache() : DraftRequests("DraftCache") {}

  // A cache for entries of kv_width = nkv * hd floats (K and V each).
  static Status create(int64_t kv_width, DraftCache* out) {
    if (out == nullptr) return Status::InvalidArgument("DraftCache::create: out is null");
    if (kv_width < 1) {
      return Status::InvalidArgument("DraftCache::create: kv_width " + std::to_string(kv_width) +
                                     " must be >= 1");
    }
    DraftCache c;
    c.width_ = kv_width;
    *out = std::move(c);
    return Status::Ok();
  }
  static Status create_for(DraftConfig const& config, DraftCache* out) {
    return create(config.kv_width(), out);
  }

  int64_t kv_width() const { return width_; }

  Status add_request(RequestId id) {
    if (has_request(id)) return already_added(id);
    seqs_.emplace(id, DraftSequence{});
    return Status::Ok();
  }
  Status free_request(RequestId id) {
    if (seqs_.erase(id) == 0) return unknown(id);
    return Status::Ok();
  }

 private:
  int64_t width_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Forward.

namespace detail {

// Rows of K and V [rows, W] visible to an entry.
struct KvBlock {
  float const* k = nullptr;
  float const* v = nullptr;
  int64_t rows = 0;
};

// The entries one call computes: row r has input token, incoming hidden h.row(r), position, the
// cache blocks it sees, and the range [fresh_begin, r] of this call's rows it sees (self last).
struct DraftRows {
  CpuMatrix h;                               // [n, H]
  std::vector<int32_t> tokens;               // [n]
  std::vector<int64_t> positions;            // [n]
  std::vector<std::vector<KvBlock>> blocks;  // [n]
  std::vector<int64_t> fresh_begin;          // [n]
};

// K, V [n, W] (K roped), h'' [n, H] and logits [n, Vd] of the rows.
inline Status draft_forward(DraftCpuModel const& m, DraftRows const& rows, CpuMatrix* k_new,
                            CpuMatrix* v_new, CpuMatrix* hidden, CpuMatrix* logits) {
  DraftConfig const& c = m.config;
  int64_t const n = rows.h.rows(), H = c.hidden_size, hd = c.head_dim;
  int64_t const nh = c.num_attention_heads, group = nh / c.num_key_value_heads;
  int64_t const W = c.kv_width(), Q = c.q_width();
  double const eps = c.rms_norm_eps;
  CpuMatrix e(n, H);
  for (int64_t r = 0; r < n; ++r) {
    e.row(r) = Eigen::Map<Eigen::RowVectorXf const>(m.embedding_row(rows.tokens[r]), H);
  }
  // The attention input x and the residual it adds to.
  CpuMatrix x(n, c.attention_in_width()), residual;
  if (c.eagle3()) {
    CpuMatrix en, hn;
    SPECDEC_RETURN_IF_ERROR(kimi::detail::cpu_rms_rows(e, m.input_layernorm, eps, &en));
    SPECDEC_RETURN_IF_ERROR(kimi::detail::cpu_rms_rows(rows.h, m.hidden_norm, eps, &hn));
    x.leftCols(H) = en;
    x.rightCols(H) = hn;
    residual = rows.h;
  } else {
    CpuMatrix eh(n, 2 * H);
    eh.leftCols(H) = e;
    eh.rightCols(H) = rows.h;
    x.noalias() = eh * m.fc.transpose();
    if (!m.fc_bias.empty()) {
      x.rowwise() += Eigen::Map<Eigen::RowVectorXf const>(m.fc_bias.data(), H);
    }
    residual = x;
  }
  CpuMatrix q = x * m.q_proj.transpose();
  *k_new = x * m.k_proj.transpose();
  *v_new = x * m.v_proj.transpose();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < nh; ++h) {
      rope_neox_reference(q.data() + r * Q + h * hd, rows.positions[r], m.inv_freq);
    }
    for (int64_t g = 0; g < c.num_key_value_heads; ++g) {
      rope_neox_reference(k_new->data() + r * W + g * hd, rows.positions[r], m.inv_freq);
    }
  }
  using Stride = Eigen::OuterStride<>;
  using MapC = Eigen::Map<CpuMatrix const, 0, Stride>;
  float const scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  CpuMatrix o(n, Q);
  std::vector<KvBlock> all;
  Eigen::VectorXf s;
  for (int64_t r = 0; r < n; ++r) {
    all = rows.blocks[r];
    int64_t const a = rows.fresh_begin[r];
    all.push_back({k_new->data() + a * W, v_new->data() + a * W, r - a + 1});
    int64_t S = 0;
    for (KvBlock const& b : all) S += b.rows;
    s.resize(S);
    for (int64_t h = 0; h < nh; ++h) {
      int64_t const col = (h / group) * hd;
      Eigen::Map<Eigen::VectorXf const> qh(q.data() + r * Q + h * hd, hd);
      int64_t off = 0;
      for (KvBlock const& b : all) {
        if (b.rows == 0) continue;
        s.segment(off, b.rows).noalias() = MapC(b.k + col, b.rows, hd, Stride(W)) * qh;
        off += b.rows;
      }
      s *= scale;
      s = (s.array() - s.maxCoeff()).exp();
      s /= s.sum();
      Eigen::Map<Eigen::VectorXf> oh(o.data() + r * Q + h * hd, hd);
      oh.setZero();
      off = 0;
      for (KvBlock const& b : all) {
        if (b.rows == 0) continue;
        oh.noalias() += MapC(b.v + col, b.rows, hd, Stride(W)).transpose() * s.segment(off, b.rows);
        off += b.rows;
      }
    }
  }
  CpuMatrix h1 = std::move(residual);
  h1.noalias() += o * m.o_proj.transpose();
  CpuMatrix n1;
  SPECDEC_RETURN_IF_ERROR(kimi::detail::cpu_rms_rows(h1, m.post_attention_layernorm, eps, &n1));
  *hidden = h1 + kimi::detail::cpu_swiglu(m.mlp, n1);
  if (c.eagle3()) {
    CpuMatrix n2;
    SPECDEC_RETURN_IF_ERROR(kimi::detail::cpu_rms_rows(*hidden, m.norm, eps, &n2));
    *logits = n2 * m.lm_head.transpose();
  } else {
    using MapTarget = Eigen::Map<CpuMatrix const>;
    logits->noalias() = *hidden * MapTarget(m.target.lm_head, m.vocab(), H).transpose();
  }
  return Status::Ok();
}

// The checks every executor's extend and step share: model, cache, a batch of distinct known
// requests. `loader` and `cache_name` name the executor's load function and cache type in hints.
template <class Model, class Cache>
Status check_batch(std::string const& fn, Model const& m, Cache const* cache,
                   std::span<RequestId const> requests, std::string_view loader,
                   std::string_view cache_name) {
  std::string const cache_type(cache_name);
  if (!m.loaded()) {
    return Status::InvalidArgument(fn + "the model is not loaded (" + std::string(loader) + ")");
  }
  if (cache == nullptr) return Status::InvalidArgument(fn + "cache is null");
  if (cache->kv_width() != m.kv_width()) {
    return Status::InvalidArgument(fn + "cache kv_width " + std::to_string(cache->kv_width()) +
                                   " != the model's num_key_value_heads x head_dim " +
                                   std::to_string(m.kv_width()) + " (" + cache_type +
                                   "::create_for)");
  }
  if (requests.empty()) return Status::InvalidArgument(fn + "no requests (batch of 0)");
  for (size_t b = 0; b < requests.size(); ++b) {
    if (!cache->has_request(requests[b])) {
      return Status::InvalidArgument(fn + "requests[" + std::to_string(b) +
                                     "] = " + std::to_string(requests[b]) +
                                     " is not in the cache (" + cache_type + "::add_request)");
    }
    for (size_t a = 0; a < b; ++a) {
      if (requests[a] == requests[b]) {
        return Status::InvalidArgument(fn + "request " + std::to_string(requests[b]) +
                                       " appears twice in the batch (rows " + std::to_string(a) +
                                       " and " + std::to_string(b) + ")");
      }
    }
  }
  return Status::Ok();
}

inline Status check_token(std::string const& fn, DraftCpuModel const& m, size_t i, int32_t t) {
  if (t < 0 || t >= m.vocab()) {
    return Status::InvalidArgument(fn + "tokens[" + std::to_string(i) + "] = " + std::to_string(t) +
                                   " is outside the target vocabulary [0, " +
                                   std::to_string(m.vocab()) + ")");
  }
  return Status::Ok();
}

template <class Model>
Status check_position(std::string const& fn, Model const& m, RequestId id, int64_t last_position) {
  if (last_position >= m.config.max_position_embeddings) {
    return Status::InvalidArgument(fn + "request " + std::to_string(id) + ": position " +
                                   std::to_string(last_position) +
                                   " is past the draft's max_position_embeddings " +
                                   std::to_string(m.config.max_position_embeddings));
  }
  return Status::Ok();
}

template <class T>
std::string size_mismatch(std::string const& fn, char const* what, std::span<T const> got,
                          int64_t want, std::string const& why) {
  return fn + what + " has " + std::to_string(got.size()) + " values, expected " +
         std::to_string(want) + " (" + why + ")";
}

// draft_extend's counts: one per request (B), each >= 1; *T = their sum, the entries to extend.
inline Status extend_entries(std::string const& fn, std::span<int32_t const> counts, int64_t B,
                             int64_t* T) {
  if (static_cast<int64_t>(counts.size()) != B) {
    return Status::InvalidArgument(size_mismatch(fn, "counts", counts, B, "one per request"));
  }
  *T = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (counts[b] < 1) {
      return Status::InvalidArgument(fn + "counts[" + std::to_string(b) + "] = " +
                                     std::to_string(counts[b]) + " must be >= 1");
    }
    *T += counts[b];
  }
  return Status::Ok();
}

}  // namespace detail

// Committed entries: request requests[b] gets counts[b] >= 1 entries (tokens and features taken
// in order: request 0's, then request 1's, ...) at positions length + i; its length advances by
// counts[b] and its scratch is cleared. hidden_last [B, H] / logits_last [B, Vd]: the last entry's
// h'' and draft logits per request.
inline Status draft_extend(CpuExecutor, DraftCpuModel const& model, DraftCache* cache,
                           std::span<RequestId const> requests, std::span<int32_t const> counts,
                           std::span<int32_t const> tokens, std::span<float const> features,
                           std::vector<float>* hidden_last, std::vector<float>* logits_last) {
  std::string const fn = "draft_extend (cpu): ";
  return kimi::detail::cpu_guard(fn, [&]() -> Status {
    SPECDEC_RETURN_IF_ERROR(
        detail::check_batch(fn, model, cache, requests, "load_draft_cpu_model", "DraftCache"));
    if (hidden_last == nullptr || logits_last == nullptr) {
      return Status::InvalidArgument(fn + "hidden_last or logits_last is null");
    }
    int64_t const B = static_cast<int64_t>(requests.size()), H = model.hidden();
    int64_t const F = model.feature_width(), W = model.kv_width();
    int64_t T = 0;
    SPECDEC_RETURN_IF_ERROR(detail::extend_entries(fn, counts, B, &T));
    if (static_cast<int64_t>(tokens.size()) != T) {
      return Status::InvalidArgument(
          detail::size_mismatch(fn, "tokens", tokens, T, "sum of counts"));
    }
    if (static_cast<int64_t>(features.size()) != T * F) {
      return Status::InvalidArgument(detail::size_mismatch(
          fn, "features", features, T * F,
          "sum of counts " + std::to_string(T) + " x feature width " + std::to_string(F) +
              " = |target streams " + format_layers(model.feature_layers) + "| x target hidden " +
              std::to_string(model.config.target_hidden_size)));
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      SPECDEC_RETURN_IF_ERROR(detail::check_token(fn, model, i, tokens[i]));
    }
    detail::DraftRows rows;
    rows.tokens.assign(tokens.begin(), tokens.end());
    rows.positions.resize(static_cast<size_t>(T));
    rows.blocks.resize(static_cast<size_t>(T));
    rows.fresh_begin.resize(static_cast<size_t>(T));
    std::vector<DraftSequence*> seqs(static_cast<size_t>(B));
    for (int64_t b = 0, first = 0; b < B; first += counts[b], ++b) {
      DraftSequence* seq = cache->find(requests[b]);
      seqs[b] = seq;
      SPECDEC_RETURN_IF_ERROR(
          detail::check_position(fn, model, requests[b], seq->length + counts[b] - 1));
      for (int64_t i = 0; i < counts[b]; ++i) {
        size_t const r = static_cast<size_t>(first + i);
        rows.positions[r] = seq->length + i;
        rows.blocks[r] = {{seq->k.data(), seq->v.data(), seq->length}};
        rows.fresh_begin[r] = first;
      }
    }
    // The incoming hidden of each entry: EAGLE-3 fc(feature); EAGLE-1/2 the target's
    // final-normed last hidden state (fc runs in draft_forward, over [embedding | it]).
    Eigen::Map<CpuMatrix const> const feature(features.data(), T, F);
    if (model.config.eagle3()) {
      rows.h = feature * model.fc.transpose();
    } else {
      std::vector<float> w(model.target.final_norm, model.target.final_norm + F);
      SPECDEC_RETURN_IF_ERROR(
          kimi::detail::cpu_rms_rows(feature, w, model.target.final_norm_eps, &rows.h));
    }
    CpuMatrix k, v, hidden, logits;
    SPECDEC_RETURN_IF_ERROR(detail::draft_forward(model, rows, &k, &v, &hidden, &logits));

    int64_t const Vd = model.draft_vocab();
    std::vector<float> h_out(static_cast<size_t>(B * H)), l_out(static_cast<size_t>(B * Vd));
    for (int64_t b = 0, first = 0; b < B; first += counts[b], ++b) {
      DraftSequence* seq = seqs[b];
      int64_t const n = counts[b], last = first + n - 1;
      seq->k.insert(seq->k.end(), k.data() + first * W, k.data() + (first + n) * W);
      seq->v.insert(seq->v.end(), v.data() + first * W, v.data() + (first + n) * W);
      seq->length += n;
      seq->clear_scratch();
      std::copy(hidden.data() + last * H, hidden.data() + (last + 1) * H, h_out.data() + b * H);
      std::copy(logits.data() + last * Vd, logits.data() + (last + 1) * Vd, l_out.data() + b * Vd);
    }
    *hidden_last = std::move(h_out);
    *logits_last = std::move(l_out);
    return Status::Ok();
  });
}

// Scratch entries: row r = b * K + j continues parent_scratch[r] (a scratch index of
// requests[b], or -1 = right after its committed prefix) with token tokens[r] (a target id) from
// the parent's hidden parent_hidden [r, H] (h'' of the entry that produced the token). Appended
// to the request's scratch, not committed. hidden [B * K, H], logits [B * K, Vd], scratch_index
// [B * K] (the new entries' scratch indices, for the next step's parent_scratch).
inline Status draft_step(CpuExecutor, DraftCpuModel const& model, DraftCache* cache,
                         std::span<RequestId const> requests, int branches,
                         std::span<int32_t const> tokens, std::span<float const> parent_hidden,
                         std::span<int32_t const> parent_scratch, std::vector<float>* hidden,
                         std::vector<float>* logits, std::vector<int32_t>* scratch_index) {
  std::string const fn = "draft_step (cpu): ";
  return kimi::detail::cpu_guard(fn, [&]() -> Status {
    SPECDEC_RETURN_IF_ERROR(
        detail::check_batch(fn, model, cache, requests, "load_draft_cpu_model", "DraftCache"));
    if (hidden == nullptr || logits == nullptr || scratch_index == nullptr) {
      return Status::InvalidArgument(fn + "hidden, logits or scratch_index is null");
    }
    if (branches < 1) {
      return Status::InvalidArgument(fn + "branches " + std::to_string(branches) + " must be >= 1");
    }
    int64_t const B = static_cast<int64_t>(requests.size()), K = branches, BK = B * K;
    int64_t const H = model.hidden(), W = model.kv_width(), Vd = model.draft_vocab();
    std::string const rows_why = "batch " + std::to_string(B) + " x branches " + std::to_string(K);
    if (static_cast<int64_t>(tokens.size()) != BK) {
      return Status::InvalidArgument(detail::size_mismatch(fn, "tokens", tokens, BK, rows_why));
    }
    if (static_cast<int64_t>(parent_scratch.size()) != BK) {
      return Status::InvalidArgument(
          detail::size_mismatch(fn, "parent_scratch", parent_scratch, BK, rows_why));
    }
    if (static_cast<int64_t>(parent_hidden.size()) != BK * H) {
      return Status::InvalidArgument(detail::size_mismatch(
          fn, "parent_hidden", parent_hidden, BK * H, rows_why + " x hidden " + std::to_string(H)));
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      SPECDEC_RETURN_IF_ERROR(detail::check_token(fn, model, i, tokens[i]));
    }
    detail::DraftRows rows;
    rows.tokens.assign(tokens.begin(), tokens.end());
    rows.positions.resize(static_cast<size_t>(BK));
    rows.blocks.resize(static_cast<size_t>(BK));
    rows.fresh_begin.resize(static_cast<size_t>(BK));
    std::vector<DraftSequence*> seqs(static_cast<size_t>(B));
    std::vector<int32_t> depth(static_cast<size_t>(BK));
    for (int64_t b = 0; b < B; ++b) {
      DraftSequence* seq = cache->find(requests[b]);
      seqs[b] = seq;
      int64_t const S = seq->scratch_size();
      for (int64_t j = 0; j < K; ++j) {
        int64_t const r = b * K + j;
        int32_t const p = parent_scratch[r];
        if (p < -1 || p >= S) {
          return Status::InvalidArgument(
              fn + "parent_scratch[" + std::to_string(r) + "] = " + std::to_string(p) +
              " is outside [-1, " + std::to_string(S) + "): request " +
              std::to_string(requests[b]) + " has " + std::to_string(S) + " scratch entries");
        }
        depth[r] = p < 0 ? 0 : seq->scratch_depth[p] + 1;
        rows.positions[r] = seq->length + depth[r];
        SPECDEC_RETURN_IF_ERROR(detail::check_position(fn, model, requests[b], rows.positions[r]));
        std::vector<detail::KvBlock>& blocks = rows.blocks[r];
        blocks.push_back({seq->k.data(), seq->v.data(), seq->length});
        std::vector<int32_t> chain;
        for (int32_t a = p; a >= 0; a = seq->scratch_parent[a]) chain.push_back(a);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          blocks.push_back({seq->scratch_k.data() + *it * W, seq->scratch_v.data() + *it * W, 1});
        }
        rows.fresh_begin[r] = r;
      }
    }
    rows.h = Eigen::Map<CpuMatrix const>(parent_hidden.data(), BK, H);
    CpuMatrix k, v, h_new, l_new;
    SPECDEC_RETURN_IF_ERROR(detail::draft_forward(model, rows, &k, &v, &h_new, &l_new));

    std::vector<int32_t> index(static_cast<size_t>(BK));
    for (int64_t b = 0; b < B; ++b) {
      DraftSequence* seq = seqs[b];
      for (int64_t j = 0; j < K; ++j) {
        int64_t const r = b * K + j;
        index[r] = static_cast<int32_t>(seq->scratch_size());
        seq->scratch_k.insert(seq->scratch_k.end(), k.data() + r * W, k.data() + (r + 1) * W);
        seq->scratch_v.insert(seq->scratch_v.end(), v.data() + r * W, v.data() + (r + 1) * W);
        seq->scratch_parent.push_back(parent_scratch[r]);
        seq->scratch_depth.push_back(depth[r]);
      }
    }
    hidden->assign(h_new.data(), h_new.data() + BK * H);
    logits->assign(l_new.data(), l_new.data() + BK * Vd);
    *scratch_index = std::move(index);
    return Status::Ok();
  });
}

}  // namespace specdec::model::eagle
