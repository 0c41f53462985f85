// EAGLE-family draft weights: the tensor schema of a draft checkpoint in either layout, read from
// its DraftConfig (model/eagle/config.hpp), and the loader that binds every tensor (views into
// the mmap'd safetensors, no copies) after checking its dtype and shape, plus the vocabulary maps.
//
// The schema (draft_schema is the ONE place that names tensors; H hidden, Ht target hidden,
// L the layer set, nh / nkv heads, hd head_dim, I intermediate, V vocab, Vd draft vocab):
// EAGLE-3 (SpecForge):
//   fc.weight                                                   [H, |L| * Ht]
//   midlayer.hidden_norm.weight, midlayer.input_layernorm.weight,
//   midlayer.post_attention_layernorm.weight, norm.weight        [H]
//   midlayer.self_attn.q_proj.weight [nh * hd, 2H], k_proj / v_proj [nkv * hd, 2H],
//   o_proj [H, nh * hd]
//   midlayer.mlp.gate_proj.weight / up_proj [I, H], down_proj [H, I]
//   lm_head.weight                                              [Vd, H]
//   d2t  I64  [Vd]   draft id d -> target id d + d2t[d]
//   t2d  BOOL [V]    true exactly at the Vd target ids that d2t reaches
// EAGLE-1/2 (SafeAILab's cnets layout as SGLang loads it; H == Ht, Vd == V):
//   fc.weight [H, 2H] over [embedding | target hidden], fc.bias [H] optional
//   layers.0.self_attn.q_proj.weight [nh * hd, H], k_proj / v_proj [nkv * hd, H],
//   o_proj [H, nh * hd]
//   layers.0.post_attention_layernorm.weight [H] (layer 0 has no input_layernorm)
//   layers.0.mlp.gate_proj.weight / up_proj [I, H], down_proj [H, I]
//   no final norm and no lm_head: the draft's output goes through the target's lm_head; the
//   vocabulary maps are the identity (d2t all 0, t2d all true)
// Both: embed_tokens.weight [V, H] optional: without it the draft reads the target's embedding,
// which needs H == Ht.
// Float tensors are BF16 (F16 and F32 accepted too); names ending in "rotary_emb.inv_freq" are
// skipped (a buffer some exporters save); any other tensor is an error listing it.
//
// Checks, each a Status naming the file / tensor and both numbers: every tensor present with its
// exact shape (fc's input width: "fc.weight input width 384 != |layer set [-1,1]| 2 x target
// hidden 128 = 256"); d2t length != Vd; any d + d2t[d] outside [0, V) or reached twice; t2d length
// != V, its true count != Vd, or t2d[d + d2t[d]] false; no embed_tokens and no target embedding;
// no embed_tokens and H != Ht.
//
// Public API (namespace specdec::model::eagle):
//   DraftWeights                                    the views, d2t, t2d (validated)
//   draft_schema(config, with_embedding, with_fc_bias)  the tensors (name, dtype, shape)
//   load_draft_weights(ckpt, config, target_embedding_given, &weights)
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/eagle/config.hpp"
#include "specdec/policy/layers.hpp"

namespace specdec::model::eagle {

using io::TensorView;

struct DraftWeights {
  DraftConfig config;
  TensorView fc;                            // [H, fc_in_width]
  bool has_fc_bias = false;                 // EAGLE-1/2 only
  TensorView fc_bias;                       // [H] (has_fc_bias)
  TensorView hidden_norm, input_layernorm;  // [H] (EAGLE-3)
  TensorView post_attention_layernorm;      // [H]
  TensorView q_proj, k_proj, v_proj;        // [nh * hd, A], [nkv * hd, A], A = attention_in_width
  TensorView o_proj;                        // [H, nh * hd]
  TensorView gate_proj, up_proj;            // [I, H]
  TensorView down_proj;                     // [H, I]
  TensorView norm;                          // [H] (EAGLE-3)
  TensorView lm_head;                       // [Vd, H] (EAGLE-3)
  bool has_embedding = false;
  TensorView embed_tokens;   // [V, H] (has_embedding)
  std::vector<int64_t> d2t;  // [Vd]: target id = d + d2t[d] (EAGLE-1/2: all 0)
  std::vector<uint8_t> t2d;  // [V]: 1 at the target ids in the draft vocabulary (EAGLE-1/2: all)
};

// One tensor of the schema. `slot` is where load_draft_weights binds it (nullptr: d2t / t2d,
// read into vectors).
struct DraftTensorSpec {
  std::string name;
  Dtype dtype = Dtype::kBF16;  // as written by the random writer; floats accept BF16/F16/F32
  std::vector<int64_t> shape;
  TensorView DraftWeights::*slot = nullptr;
  bool norm = false;  // a norm weight (the random writer draws 1 + N(0, 0.1^2))
};

inline constexpr char const* kDraftEmbedTokens = "embed_tokens.weight";
inline constexpr char const* kDraftFcBias = "fc.bias";

// The tensors of `c` in order (embed_tokens.weight last, only when `with_embedding`; fc.bias only
// for EAGLE-1/2 with `with_fc_bias`).
inline std::vector<DraftTensorSpec> draft_schema(DraftConfig const& c, bool with_embedding,
                                                 bool with_fc_bias = false) {
  using W = DraftWeights;
  int64_t const H = c.hidden_size, I = c.intermediate_size, F = c.fc_in_width();
  int64_t const Q = c.q_width(), KV = c.kv_width();
  std::vector<DraftTensorSpec> s;
  if (!c.eagle3()) {
    s = {
        {"fc.weight", Dtype::kBF16, {H, F}, &W::fc, false},
        {"layers.0.self_attn.q_proj.weight", Dtype::kBF16, {Q, H}, &W::q_proj, false},
        {"layers.0.self_attn.k_proj.weight", Dtype::kBF16, {KV, H}, &W::k_proj, false},
        {"layers.0.self_attn.v_proj.weight", Dtype::kBF16, {KV, H}, &W::v_proj, false},
        {"layers.0.self_attn.o_proj.weight", Dtype::kBF16, {H, Q}, &W::o_proj, false},
        {"layers.0.post_attention_layernorm.weight",
         Dtype::kBF16,
         {H},
         &W::post_attention_layernorm,
         true},
        {"layers.0.mlp.gate_proj.weight", Dtype::kBF16, {I, H}, &W::gate_proj, false},
        {"layers.0.mlp.up_proj.weight", Dtype::kBF16, {I, H}, &W::up_proj, false},
        {"layers.0.mlp.down_proj.weight", Dtype::kBF16, {H, I}, &W::down_proj, false},
    };
    if (with_fc_bias) s.push_back({kDraftFcBias, Dtype::kBF16, {H}, &W::fc_bias, false});
    if (with_embedding) {
      s.push_back({kDraftEmbedTokens, Dtype::kBF16, {c.vocab_size, H}, &W::embed_tokens, false});
    }
    return s;
  }
  s = {
      {"fc.weight", Dtype::kBF16, {H, F}, &W::fc, false},
      {"midlayer.hidden_norm.weight", Dtype::kBF16, {H}, &W::hidden_norm, true},
      {"midlayer.input_layernorm.weight", Dtype::kBF16, {H}, &W::input_layernorm, true},
      {"midlayer.post_attention_layernorm.weight",
       Dtype::kBF16,
       {H},
       &W::post_attention_layernorm,
       true},
      {"midlayer.self_attn.q_proj.weight", Dtype::kBF16, {Q, 2 * H}, &W::q_proj, false},
      {"midlayer.self_attn.k_proj.weight", Dtype::kBF16, {KV, 2 * H}, &W::k_proj, false},
      {"midlayer.self_attn.v_proj.weight", Dtype::kBF16, {KV, 2 * H}, &W::v_proj, false},
      {"midlayer.self_attn.o_proj.weight", Dtype::kBF16, {H, Q}, &W::o_proj, false},
      {"midlayer.mlp.gate_proj.weight", Dtype::kBF16, {I, H}, &W::gate_proj, false},
      {"midlayer.mlp.up_proj.weight", Dtype::kBF16, {I, H}, &W::up_proj, false},
      {"midlayer.mlp.down_proj.weight", Dtype::kBF16, {H, I}, &W::down_proj, false},
      {"norm.weight", Dtype::kBF16, {H}, &W::norm, true},
      {"lm_head.weight", Dtype::kBF16, {c.draft_vocab_size, H}, &W::lm_head, false},
      {"d2t", Dtype::kI64, {c.draft_vocab_size}, nullptr, false},
      {"t2d", Dtype::kBool, {c.vocab_size}, nullptr, false},
  };
  if (with_embedding) {
    s.push_back({kDraftEmbedTokens, Dtype::kBF16, {c.vocab_size, H}, &W::embed_tokens, false});
  }
  return s;
}

namespace detail {

inline bool is_float_dtype(Dtype d) {
  return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32;
}

inline Status bind_tensor(io::SafetensorsCheckpoint const& ckpt, DraftTensorSpec const& spec,
                          DraftConfig const& c, TensorView* out) {
  std::string const where = ckpt.dir() + ": tensor \"" + spec.name + "\"";
  std::optional<TensorView> v = ckpt.find(spec.name);
  if (!v) {
    return Status::MalformedInput(ckpt.dir() + ": missing tensor \"" + spec.name + "\" (an " +
                                  c.kind_name() + " draft has it)");
  }
  bool const dtype_ok =
      spec.dtype == Dtype::kBF16 ? is_float_dtype(v->dtype) : v->dtype == spec.dtype;
  if (!dtype_ok) {
    return Status::MalformedInput(where + ": dtype " + dtype_name(v->dtype) + ", expected " +
                                  (spec.dtype == Dtype::kBF16
                                       ? std::string("BF16, F16 or F32")
                                       : std::string(dtype_name(spec.dtype))));
  }
  if (spec.name == "fc.weight" && v->shape.size() == 2 && v->shape[0] == spec.shape[0] &&
      v->shape[1] != spec.shape[1] && !c.eagle3()) {
    return Status::MalformedInput(where + ": fc.weight input width " + std::to_string(v->shape[1]) +
                                  " != 2 x hidden " + std::to_string(c.hidden_size) + " = " +
                                  std::to_string(spec.shape[1]) +
                                  " ([embedding | target hidden], EAGLE-1/2)" +
                                  (v->shape[1] % c.hidden_size == 0
                                       ? ": a wider fc reads several layers, as an EAGLE-3 draft "
                                         "does"
                                       : ""));
  }
  if (spec.name == "fc.weight" && v->shape.size() == 2 && v->shape[0] == spec.shape[0] &&
      v->shape[1] != spec.shape[1]) {
    return Status::MalformedInput(
        where + ": fc.weight input width " + std::to_string(v->shape[1]) + " != |layer set " +
        format_layers(c.layers) + "| " + std::to_string(c.layers.size()) + " x target hidden " +
        std::to_string(c.target_hidden_size) + " = " + std::to_string(spec.shape[1]) +
        ": the draft was trained on another layer set or target");
  }
  if ((spec.name == "d2t" || spec.name == "t2d") && v->shape.size() == 1 &&
      v->shape[0] != spec.shape[0]) {
    return Status::MalformedInput(
        where + ": " + spec.name + " length " + std::to_string(v->shape[0]) + " != " +
        (spec.name == "d2t" ? "draft_vocab_size " + std::to_string(c.draft_vocab_size)
                            : "vocab_size " + std::to_string(c.vocab_size)) +
        " (" + c.source + ")");
  }
  if (v->shape != spec.shape) {
    return Status::MalformedInput(where + ": shape " + io::format_shape(v->shape) + ", expected " +
                                  io::format_shape(spec.shape) + " for " + c.source);
  }
  *out = std::move(*v);
  return Status::Ok();
}

// d2t [Vd] and t2d [V] read and checked against each other.
inline Status read_vocab_maps(std::string const& dir, TensorView const& d2t_view,
                              TensorView const& t2d_view, DraftConfig const& c, DraftWeights* w) {
  int64_t const V = c.vocab_size, Vd = c.draft_vocab_size;
  w->d2t.resize(static_cast<size_t>(Vd));
  if (Vd) std::memcpy(w->d2t.data(), d2t_view.bytes.data(), static_cast<size_t>(Vd) * 8);
  w->t2d.resize(static_cast<size_t>(V));
  if (V) std::memcpy(w->t2d.data(), t2d_view.bytes.data(), static_cast<size_t>(V));
  int64_t count = 0;
  for (int64_t t = 0; t < V; ++t) {
    uint8_t const b = w->t2d[static_cast<size_t>(t)];
    if (b > 1) {
      return Status::MalformedInput(dir + ": tensor \"t2d\": byte " + std::to_string(b) +
                                    " at target id " + std::to_string(t) + " is not a bool (0/1)");
    }
    count += b;
  }
  if (count != Vd) {
    return Status::MalformedInput(dir + ": tensor \"t2d\" marks " + std::to_string(count) +
                                  " target ids, != draft_vocab_size " + std::to_string(Vd) + " (" +
                                  c.source + ")");
  }
  std::vector<int64_t> reached_by(static_cast<size_t>(V), -1);
  for (int64_t d = 0; d < Vd; ++d) {
    int64_t const off = w->d2t[static_cast<size_t>(d)];
    // d + off without overflow: off is any int64.
    bool const in_range = off >= -d && off < V - d;
    if (!in_range) {
      return Status::MalformedInput(dir + ": tensor \"d2t\": d2t[" + std::to_string(d) +
                                    "] = " + std::to_string(off) + " maps draft id " +
                                    std::to_string(d) + " outside the target vocabulary [0, " +
                                    std::to_string(V) + ")");
    }
    int64_t const t = d + off;
    if (!w->t2d[static_cast<size_t>(t)]) {
      return Status::MalformedInput(dir + ": d2t maps draft id " + std::to_string(d) +
                                    " to target id " + std::to_string(t) + " but t2d[" +
                                    std::to_string(t) + "] is false: the two maps disagree");
    }
    int64_t& first = reached_by[static_cast<size_t>(t)];
    if (first >= 0) {
      return Status::MalformedInput(dir + ": d2t maps draft ids " + std::to_string(first) +
                                    " and " + std::to_string(d) + " to the same target id " +
                                    std::to_string(t));
    }
    first = d;
  }
  return Status::Ok();
}

}  // namespace detail

// Binds every tensor of `ckpt` for `config` (check_draft_target first) and reads d2t / t2d
// (EAGLE-3) or makes them the identity (EAGLE-1/2). `target_embedding_given`: the caller has the
// target's embedding [V, Ht] for a checkpoint without embed_tokens.weight. The views stay valid
// while `ckpt` lives.
inline Status load_draft_weights(io::SafetensorsCheckpoint const& ckpt, DraftConfig const& config,
                                 bool target_embedding_given, DraftWeights* out) {
  if (out == nullptr) return Status::InvalidArgument("load_draft_weights: out is null");
  DraftConfig const& c = config;
  try {
    DraftWeights w;
    w.config = c;
    w.has_embedding = ckpt.contains(kDraftEmbedTokens);
    w.has_fc_bias = !c.eagle3() && ckpt.contains(kDraftFcBias);
    if (!w.has_embedding) {
      if (!target_embedding_given) {
        return Status::InvalidArgument(
            ckpt.dir() +
            ": the draft has no embed_tokens.weight and no target embedding was "
            "given: pass the target's embedding [" +
            std::to_string(c.vocab_size) + ", " + std::to_string(c.target_hidden_size) + "]");
      }
      if (c.hidden_size != c.target_hidden_size) {
        return Status::InvalidArgument(
            ckpt.dir() +
            ": the draft has no embed_tokens.weight, so it reads the target's "
            "embedding, which needs its hidden_size (" +
            std::to_string(c.hidden_size) + ") to equal target_hidden_size (" +
            std::to_string(c.target_hidden_size) + ") (" + c.source + ")");
      }
    }
    std::vector<DraftTensorSpec> const schema = draft_schema(c, w.has_embedding, w.has_fc_bias);
    std::map<std::string, bool, std::less<>> known;
    for (DraftTensorSpec const& s : schema) known.emplace(s.name, true);
    std::vector<std::string> unknown;
    for (std::string_view n : ckpt.names()) {
      std::string_view const skip = "rotary_emb.inv_freq";
      bool const skipped = n.size() >= skip.size() && n.substr(n.size() - skip.size()) == skip;
      if (!skipped && known.find(n) == known.end()) unknown.emplace_back(n);
    }
    if (!unknown.empty()) {
      std::string list;
      for (size_t i = 0; i < unknown.size() && i < 8; ++i) {
        list += (i ? ", \"" : "\"") + unknown[i] + "\"";
      }
      if (unknown.size() > 8) list += ", ... (" + std::to_string(unknown.size()) + " in all)";
      return Status::MalformedInput(ckpt.dir() + ": tensors that are not part of an " +
                                    c.kind_name() + " draft (" + c.source + "): " + list);
    }
    TensorView d2t, t2d;
    for (DraftTensorSpec const& s : schema) {
      TensorView* slot = s.slot ? &(w.*s.slot) : s.name == "d2t" ? &d2t : &t2d;
      SPECDEC_RETURN_IF_ERROR(detail::bind_tensor(ckpt, s, c, slot));
    }
    if (c.eagle3()) {
      SPECDEC_RETURN_IF_ERROR(detail::read_vocab_maps(ckpt.dir(), d2t, t2d, c, &w));
    } else {
      w.d2t.assign(static_cast<size_t>(c.vocab_size), 0);
      w.t2d.assign(static_cast<size_t>(c.vocab_size), 1);
    }
    *out = std::move(w);
    return Status::Ok();
  } catch (std::exception const& e) {
    return Status::Internal(ckpt.dir() + ": load_draft_weights: " + e.what());
  }
}

}  // namespace specdec::model::eagle
