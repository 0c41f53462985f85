// EAGLE-3 draft weights: the tensor schema of a SpecForge-layout draft checkpoint, read from its
// Eagle3Config (model/eagle3/config.hpp), and the loader that binds every tensor (views into the
// mmap'd safetensors, no copies) after checking its dtype and shape, plus the vocabulary maps.
//
// The schema (eagle3_schema is the ONE place that names tensors; H hidden, Ht target hidden,
// L the layer set, nh / nkv heads, hd head_dim, I intermediate, V vocab, Vd draft vocab):
//   fc.weight                                                   [H, |L| * Ht]
//   midlayer.hidden_norm.weight, midlayer.input_layernorm.weight,
//   midlayer.post_attention_layernorm.weight, norm.weight        [H]
//   midlayer.self_attn.q_proj.weight [nh * hd, 2H], k_proj / v_proj [nkv * hd, 2H],
//   o_proj [H, nh * hd]
//   midlayer.mlp.gate_proj.weight / up_proj [I, H], down_proj [H, I]
//   lm_head.weight                                              [Vd, H]
//   embed_tokens.weight                                         [V, H]  optional: without it the
//                                                               draft reads the target's embedding,
//                                                               which needs H == Ht
//   d2t  I64  [Vd]   draft id d -> target id d + d2t[d]
//   t2d  BOOL [V]    true exactly at the Vd target ids that d2t reaches
// Float tensors are BF16 (F16 and F32 accepted too); names ending in "rotary_emb.inv_freq" are
// skipped (a buffer some exporters save); any other tensor is an error listing it.
//
// Checks, each a Status naming the file / tensor and both numbers: every tensor present with its
// exact shape (fc's input width: "fc.weight input width 384 != |layer set [-1,1]| 2 x target
// hidden 128 = 256"); d2t length != Vd; any d + d2t[d] outside [0, V) or reached twice; t2d length
// != V, its true count != Vd, or t2d[d + d2t[d]] false; no embed_tokens and no target embedding;
// no embed_tokens and H != Ht.
//
// Public API (namespace specdec::model::eagle3):
//   Eagle3Weights                                   the views, d2t, t2d (validated)
//   eagle3_schema(config, with_embedding)           the tensors (name, dtype, shape) of a config
//   load_eagle3_weights(ckpt, config, target_embedding_given, &weights)
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
#include "specdec/model/eagle3/config.hpp"
#include "specdec/policy/layers.hpp"

namespace specdec::model::eagle3 {

using io::TensorView;

struct Eagle3Weights {
  Eagle3Config config;
  TensorView fc;                                                      // [H, |L| * Ht]
  TensorView hidden_norm, input_layernorm, post_attention_layernorm;  // [H]
  TensorView q_proj, k_proj, v_proj;  // [nh * hd, 2H], [nkv * hd, 2H], [nkv * hd, 2H]
  TensorView o_proj;                  // [H, nh * hd]
  TensorView gate_proj, up_proj;      // [I, H]
  TensorView down_proj;               // [H, I]
  TensorView norm;                    // [H]
  TensorView lm_head;                 // [Vd, H]
  bool has_embedding = false;
  TensorView embed_tokens;   // [V, H] (has_embedding)
  std::vector<int64_t> d2t;  // [Vd]: target id = d + d2t[d]
  std::vector<uint8_t> t2d;  // [V]: 1 at the target ids in the draft vocabulary
};

// One tensor of the schema. `slot` is where load_eagle3_weights binds it (nullptr: d2t / t2d,
// read into vectors).
struct Eagle3TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kBF16;  // as written by the random writer; floats accept BF16/F16/F32
  std::vector<int64_t> shape;
  TensorView Eagle3Weights::*slot = nullptr;
  bool norm = false;  // a norm weight (the random writer draws 1 + N(0, 0.1^2))
};

inline constexpr char const* kEagle3EmbedTokens = "embed_tokens.weight";

// The tensors of `c` in order (embed_tokens.weight last, only when `with_embedding`).
inline std::vector<Eagle3TensorSpec> eagle3_schema(Eagle3Config const& c, bool with_embedding) {
  using W = Eagle3Weights;
  int64_t const H = c.hidden_size, I = c.intermediate_size, F = c.feature_width();
  int64_t const Q = c.q_width(), KV = c.kv_width();
  std::vector<Eagle3TensorSpec> s = {
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
    s.push_back({kEagle3EmbedTokens, Dtype::kBF16, {c.vocab_size, H}, &W::embed_tokens, false});
  }
  return s;
}

namespace detail {

inline bool is_float_dtype(Dtype d) {
  return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32;
}

inline Status bind_tensor(io::SafetensorsCheckpoint const& ckpt, Eagle3TensorSpec const& spec,
                          Eagle3Config const& c, TensorView* out) {
  std::string const where = ckpt.dir() + ": tensor \"" + spec.name + "\"";
  std::optional<TensorView> v = ckpt.find(spec.name);
  if (!v) {
    return Status::MalformedInput(ckpt.dir() + ": missing tensor \"" + spec.name +
                                  "\" (an EAGLE-3 draft has it)");
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
                              TensorView const& t2d_view, Eagle3Config const& c, Eagle3Weights* w) {
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

// Binds every tensor of `ckpt` for `config` (an EAGLE-3 config: check_eagle3_target first) and
// reads d2t / t2d. `target_embedding_given`: the caller has the target's embedding [V, Ht] for a
// checkpoint without embed_tokens.weight. The views stay valid while `ckpt` lives.
inline Status load_eagle3_weights(io::SafetensorsCheckpoint const& ckpt, Eagle3Config const& config,
                                  bool target_embedding_given, Eagle3Weights* out) {
  if (out == nullptr) return Status::InvalidArgument("load_eagle3_weights: out is null");
  Eagle3Config const& c = config;
  if (c.kind != DraftKind::kEagle3) {
    return Status::Unsupported(c.source + ": architectures " + c.architecture +
                               " is not an EAGLE-3 draft");
  }
  try {
    Eagle3Weights w;
    w.config = c;
    w.has_embedding = ckpt.contains(kEagle3EmbedTokens);
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
    std::vector<Eagle3TensorSpec> const schema = eagle3_schema(c, w.has_embedding);
    std::map<std::string, bool, std::less<>> known;
    for (Eagle3TensorSpec const& s : schema) known.emplace(s.name, true);
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
      return Status::MalformedInput(ckpt.dir() +
                                    ": tensors that are not part of an EAGLE-3 draft: " + list);
    }
    TensorView d2t, t2d;
    for (Eagle3TensorSpec const& s : schema) {
      TensorView* slot = s.slot ? &(w.*s.slot) : s.name == "d2t" ? &d2t : &t2d;
      SPECDEC_RETURN_IF_ERROR(detail::bind_tensor(ckpt, s, c, slot));
    }
    SPECDEC_RETURN_IF_ERROR(detail::read_vocab_maps(ckpt.dir(), d2t, t2d, c, &w));
    *out = std::move(w);
    return Status::Ok();
  } catch (std::exception const& e) {
    return Status::Internal(ckpt.dir() + ": load_eagle3_weights: " + e.what());
  }
}

}  // namespace specdec::model::eagle3
