// Kimi-K2.5 / DeepSeek-V3 weights: the tensor schema of a DeepseekV3ForCausalLM checkpoint, read
// from its DeepseekV3Config, and the loader that binds every tensor (views into the mmap'd
// safetensors, no copies) after checking its dtype and shape.
//
// The schema (walk_kimi_schema is the ONE place that names tensors; P = config.tensor_prefix,
// "model." or "language_model.model."; L = config.lm_head_prefix; H hidden, nh heads, dq/dv head
// dims, r rope dim, c kv_lora_rank, E n_routed_experts, I intermediate_size, M
// moe_intermediate_size, S n_shared_experts, V vocab):
//   P embed_tokens.weight                    BF16 [V, H]
//   P norm.weight                            BF16 [H]
//   L weight                                 BF16 [V, H]  (absent when tie_word_embeddings: the
//                                                          lm_head view is then the embedding)
//   per layer i, Q = P "layers.i.":
//   Q input_layernorm.weight, post_attention_layernorm.weight                 BF16 [H]
//   Q self_attn.q_a_proj.weight [q_lora, H], q_a_layernorm.weight [q_lora],
//     q_b_proj.weight [nh*(dq+r), q_lora]          (q_lora_rank set)
//   Q self_attn.q_proj.weight [nh*(dq+r), H]       (q_lora_rank null)
//   Q self_attn.kv_a_proj_with_mqa.weight [c+r, H], kv_a_layernorm.weight [c],
//     kv_b_proj.weight [nh*(dq+dv), c], o_proj.weight [H, nh*dv]
//   dense layers (!config.is_moe_layer(i)): Q mlp.{gate,up}_proj.weight [I, H], down_proj [H, I]
//   MoE layers: Q mlp.gate.weight BF16 [E, H]
//               Q mlp.gate.e_score_correction_bias F32 [E] (topk_method noaux_tc only). F32 and
//                 only F32: Kimi and DeepSeek ship it fp32 and the router adds it to fp32 sigmoid
//                 scores; a BF16 one is reported, never widened silently.
//               Q mlp.shared_experts.{gate,up}_proj [S*M, H], down_proj [H, S*M]  (S > 0)
//               Q mlp.experts.e.{gate,up}_proj [M, H], down_proj [H, M], e in [0, E):
//                 bf16 `.weight`, or INT4 when io::is_int4_module(config, module) says so:
//                 weight_packed I32 [out, in/8], weight_scale BF16 [out, in/G],
//                 weight_shape I32 [2] whose VALUES must be [out, in].
// The router gate (DeepSeek's MoEGate) and the embedding are not nn.Linear modules, so
// quantization_config never applies to them. Any other Linear that quantization_config would
// quantize (attention, dense / shared MLP, lm_head) is kUnsupported naming the module: only routed
// experts have an INT4 path. Every float tensor is BF16: torch_dtype other than "bfloat16" and
// attention_bias true are kUnsupported.
//
// Checkpoint tensors the schema does not name are an error listing them, except these documented
// skips: vision_tower.*, mm_projector.*, multi_modal_projector.* (Kimi-K2.5's vision side, not run
// here), names ending in "rotary_emb.inv_freq" (a buffer some exporters save; recomputed from the
// config), and P "layers.N.*" with num_hidden_layers <= N < num_hidden_layers +
// num_nextn_predict_layers (DeepSeek-V3's multi-token-prediction layer, e.g. layer 61 of 61,
// which the causal LM does not run). A layer past those is unknown: a config.json with fewer
// layers than the checkpoint is an error, never a shorter model.
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/progress.hpp"
#include "specdec/io/safetensors.hpp"

namespace specdec::model::kimi {

using io::DeepseekV3Config;
using io::TensorView;

// How the random-checkpoint writer fills a tensor (the loader ignores it).
enum class TensorInit {
  kEmbedding,  // N(0, 1)
  kNorm,       // 1 + N(0, 0.1^2)
  kMatrix,     // N(0, 1/fan_in)
  kBias,       // N(0, 0.01^2)
};

struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kBF16;
  std::vector<int64_t> shape;
  TensorInit init = TensorInit::kMatrix;
  int64_t bytes() const {
    int64_t n = dtype_size(dtype);
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A Linear module y = x W^T with W [out, in]: bf16 `<module>.weight` or INT4.
struct LinearSpec {
  std::string module_name;  // e.g. "model.layers.3.mlp.experts.17.down_proj"
  int64_t out = 0;
  int64_t in = 0;
  bool int4 = false;
  int group_size = 0;  // INT4 only

  // The tensors stored for it: [weight], or [weight_packed, weight_scale, weight_shape].
  std::vector<TensorSpec> tensors() const {
    if (!int4) return {{module_name + ".weight", Dtype::kBF16, {out, in}, TensorInit::kMatrix}};
    return {{module_name + ".weight_packed", Dtype::kI32, {out, in / io::kInt4PerWord},
             TensorInit::kMatrix},
            {module_name + ".weight_scale", Dtype::kBF16, {out, in / group_size}, TensorInit::kMatrix},
            {module_name + ".weight_shape", Dtype::kI32, {2}, TensorInit::kMatrix}};
  }
};

struct LinearWeights {
  int64_t out = 0;
  int64_t in = 0;
  bool int4 = false;
  int group_size = 0;
  TensorView weight;         // BF16 [out, in]            (!int4)
  TensorView weight_packed;  // I32 [out, in/8]           (int4)
  TensorView weight_scale;   // BF16 [out, in/group_size] (int4)
  TensorView weight_shape;   // I32 [2] = [out, in]       (int4)
};

// SwiGLU: down(silu(gate(x)) * up(x)).
struct MlpWeights {
  LinearWeights gate_proj;  // [inter, H]
  LinearWeights up_proj;    // [inter, H]
  LinearWeights down_proj;  // [H, inter]
};

struct LayerWeights {
  TensorView input_layernorm;           // BF16 [H]
  TensorView post_attention_layernorm;  // BF16 [H]
  bool q_lora = false;
  LinearWeights q_a_proj;     // [q_lora, H]          (q_lora)
  TensorView q_a_layernorm;   // BF16 [q_lora]        (q_lora)
  LinearWeights q_b_proj;     // [nh*(dq+r), q_lora]  (q_lora)
  LinearWeights q_proj;       // [nh*(dq+r), H]       (!q_lora)
  LinearWeights kv_a_proj_with_mqa;  // [c+r, H]
  TensorView kv_a_layernorm;         // BF16 [c]
  LinearWeights kv_b_proj;           // [nh*(dq+dv), c]
  LinearWeights o_proj;              // [H, nh*dv]

  bool moe = false;
  MlpWeights mlp;                     // dense layers
  TensorView gate;                    // BF16 [E, H]            (moe)
  bool has_correction_bias = false;   // topk_method noaux_tc
  TensorView e_score_correction_bias; // F32 [E]                (moe, noaux_tc)
  bool has_shared_experts = false;    // n_shared_experts > 0
  MlpWeights shared_experts;          // [S*M, H] / [H, S*M]    (moe)
  std::vector<MlpWeights> experts;    // E entries               (moe)
};

struct KimiWeights {
  TensorView embed_tokens;  // BF16 [V, H]
  TensorView norm;          // BF16 [H]
  TensorView lm_head;       // BF16 [V, H] (the embedding when tied)
  std::vector<LayerWeights> layers;
  bool experts_int4 = false;  // every routed expert projection is INT4
  int64_t num_tensors = 0;    // tensors bound (schema tensors)
  uint64_t num_bytes = 0;     // their bytes
};

namespace detail {

inline std::string layer_prefix(DeepseekV3Config const& c, int i) {
  return c.tensor_prefix + "layers." + std::to_string(i) + ".";
}

// Walks the schema in a fixed order, calling
//   Status sink.tensor(TensorSpec const&, TensorView* slot)
//   Status sink.linear(LinearSpec const&, LinearWeights* slot)
// `w` receives the structure (layers, experts sized; flags set); the sink fills the views.
template <class Sink>
Status walk_kimi_schema(DeepseekV3Config const& c, KimiWeights* w, Sink& sink) {
  std::string const& src = c.source;
  if (c.torch_dtype != "bfloat16") {
    return Status::Unsupported(src + ": torch_dtype \"" + c.torch_dtype +
                               "\": only bfloat16 checkpoints are supported");
  }
  if (c.attention_bias) {
    return Status::Unsupported(src + ": attention_bias true: attention biases are not supported");
  }
  int64_t const H = c.hidden_size, V = c.vocab_size, nh = c.num_attention_heads;
  int64_t const qk = c.qk_head_dim(), dv = c.v_head_dim, dq = c.qk_nope_head_dim;
  int64_t const r = c.qk_rope_head_dim, ckv = c.kv_lora_rank;
  int const group = c.quantization ? c.quantization->group_size : 0;

  auto vec = [&](std::string name, int64_t n, TensorView* slot, TensorInit init = TensorInit::kNorm,
                 Dtype dt = Dtype::kBF16) {
    return sink.tensor(TensorSpec{std::move(name), dt, {n}, init}, slot);
  };
  // A Linear that must stay bf16 (only routed experts have an INT4 path).
  auto dense = [&](std::string module_name, int64_t out, int64_t in, LinearWeights* slot) -> Status {
    if (io::is_int4_module(c, module_name)) {
      return Status::Unsupported(src + ": " + c.quantization_path + " quantizes module \"" +
                                 module_name +
                                 "\" (no ignore entry matches it): only routed experts "
                                 "(mlp.experts.*) can be INT4");
    }
    slot->out = out;
    slot->in = in;
    slot->int4 = false;
    return sink.linear(LinearSpec{std::move(module_name), out, in, false, 0}, slot);
  };
  auto expert = [&](std::string module_name, int64_t out, int64_t in, LinearWeights* slot) -> Status {
    bool const q = io::is_int4_module(c, module_name);
    if (q && (in % io::kInt4PerWord != 0 || in % group != 0)) {
      return Status::InvalidArgument(src + ": INT4 module \"" + module_name + "\" has in = " +
                                     std::to_string(in) + ", not a multiple of 8 and of " +
                                     c.quantization_path + " group_size " + std::to_string(group));
    }
    slot->out = out;
    slot->in = in;
    slot->int4 = q;
    slot->group_size = q ? group : 0;
    return sink.linear(LinearSpec{std::move(module_name), out, in, q, q ? group : 0}, slot);
  };
  auto mlp = [&](std::string const& p, int64_t inter, MlpWeights* m, bool routed) -> Status {
    auto lin = [&](std::string module_name, int64_t out, int64_t in, LinearWeights* slot) {
      return routed ? expert(std::move(module_name), out, in, slot)
                    : dense(std::move(module_name), out, in, slot);
    };
    SPECDEC_RETURN_IF_ERROR(lin(p + "gate_proj", inter, H, &m->gate_proj));
    SPECDEC_RETURN_IF_ERROR(lin(p + "up_proj", inter, H, &m->up_proj));
    return lin(p + "down_proj", H, inter, &m->down_proj);
  };

  *w = KimiWeights{};
  w->layers.resize(static_cast<size_t>(c.num_hidden_layers));
  SPECDEC_RETURN_IF_ERROR(sink.tensor(
      TensorSpec{c.tensor_prefix + "embed_tokens.weight", Dtype::kBF16, {V, H},
                 TensorInit::kEmbedding},
      &w->embed_tokens));
  bool any_expert = false, all_int4 = true;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w->layers[static_cast<size_t>(i)];
    std::string const p = layer_prefix(c, i);
    std::string const a = p + "self_attn.";
    SPECDEC_RETURN_IF_ERROR(vec(p + "input_layernorm.weight", H, &l.input_layernorm));
    l.q_lora = c.q_lora_rank.has_value();
    if (l.q_lora) {
      int64_t const ql = *c.q_lora_rank;
      SPECDEC_RETURN_IF_ERROR(dense(a + "q_a_proj", ql, H, &l.q_a_proj));
      SPECDEC_RETURN_IF_ERROR(vec(a + "q_a_layernorm.weight", ql, &l.q_a_layernorm));
      SPECDEC_RETURN_IF_ERROR(dense(a + "q_b_proj", nh * qk, ql, &l.q_b_proj));
    } else {
      SPECDEC_RETURN_IF_ERROR(dense(a + "q_proj", nh * qk, H, &l.q_proj));
    }
    SPECDEC_RETURN_IF_ERROR(dense(a + "kv_a_proj_with_mqa", ckv + r, H, &l.kv_a_proj_with_mqa));
    SPECDEC_RETURN_IF_ERROR(vec(a + "kv_a_layernorm.weight", ckv, &l.kv_a_layernorm));
    SPECDEC_RETURN_IF_ERROR(dense(a + "kv_b_proj", nh * (dq + dv), ckv, &l.kv_b_proj));
    SPECDEC_RETURN_IF_ERROR(dense(a + "o_proj", H, nh * dv, &l.o_proj));
    SPECDEC_RETURN_IF_ERROR(
        vec(p + "post_attention_layernorm.weight", H, &l.post_attention_layernorm));
    l.moe = c.is_moe_layer(i);
    if (!l.moe) {
      SPECDEC_RETURN_IF_ERROR(mlp(p + "mlp.", c.intermediate_size, &l.mlp, false));
      continue;
    }
    int64_t const E = c.n_routed_experts;
    SPECDEC_RETURN_IF_ERROR(sink.tensor(
        TensorSpec{p + "mlp.gate.weight", Dtype::kBF16, {E, H}, TensorInit::kMatrix}, &l.gate));
    l.has_correction_bias = c.topk_method == io::TopkMethod::kNoauxTc;
    if (l.has_correction_bias) {
      SPECDEC_RETURN_IF_ERROR(vec(p + "mlp.gate.e_score_correction_bias", E,
                                  &l.e_score_correction_bias, TensorInit::kBias, Dtype::kF32));
    }
    l.has_shared_experts = c.n_shared_experts > 0;
    if (l.has_shared_experts) {
      SPECDEC_RETURN_IF_ERROR(mlp(p + "mlp.shared_experts.",
                                  int64_t{c.n_shared_experts} * c.moe_intermediate_size,
                                  &l.shared_experts, false));
    }
    l.experts.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      MlpWeights& m = l.experts[static_cast<size_t>(e)];
      SPECDEC_RETURN_IF_ERROR(
          mlp(p + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size, &m, true));
      any_expert = true;
      all_int4 = all_int4 && m.gate_proj.int4 && m.up_proj.int4 && m.down_proj.int4;
    }
  }
  SPECDEC_RETURN_IF_ERROR(vec(c.tensor_prefix + "norm.weight", H, &w->norm));
  if (c.tie_word_embeddings) {
    w->lm_head = w->embed_tokens;
  } else {
    LinearWeights head;
    SPECDEC_RETURN_IF_ERROR(dense(c.lm_head_prefix.substr(0, c.lm_head_prefix.size() - 1), V, H,
                                  &head));
    w->lm_head = head.weight;
  }
  w->experts_int4 = any_expert && all_int4;
  return Status::Ok();
}

struct ListSink {
  std::vector<TensorSpec>* out;
  Status tensor(TensorSpec const& s, TensorView*) {
    out->push_back(s);
    return Status::Ok();
  }
  Status linear(LinearSpec const& s, LinearWeights*) {
    for (TensorSpec& t : s.tensors()) out->push_back(std::move(t));
    return Status::Ok();
  }
};

// A documented skip (see the top of this file).
inline bool is_skipped_tensor(DeepseekV3Config const& c, std::string_view name) {
  for (std::string_view p : {"vision_tower.", "mm_projector.", "multi_modal_projector."}) {
    if (name.substr(0, p.size()) == p) return true;
  }
  std::string_view const inv = "rotary_emb.inv_freq";
  if (name.size() >= inv.size() && name.substr(name.size() - inv.size()) == inv) return true;
  std::string const layers = c.tensor_prefix + "layers.";
  if (name.substr(0, layers.size()) == layers) {
    std::string_view rest = name.substr(layers.size());
    size_t const dot = rest.find('.');
    std::string_view const num = rest.substr(0, dot);
    if (num.empty() || num.size() > 9 || dot == std::string_view::npos) return false;
    int64_t n = 0;
    for (char ch : num) {
      if (ch < '0' || ch > '9') return false;
      n = n * 10 + (ch - '0');
    }
    // DeepSeek-V3's MTP layer(s); any other layer past the config's is unknown (a config with
    // fewer layers than the checkpoint must not load as a shorter model).
    return n >= c.num_hidden_layers &&
           n < int64_t{c.num_hidden_layers} + c.num_nextn_predict_layers;
  }
  return false;
}

// Reads the I32 [2] weight_shape values.
inline void read_shape_values(TensorView const& v, int32_t* a, int32_t* b) {
  std::memcpy(a, v.bytes.data(), 4);
  std::memcpy(b, v.bytes.data() + 4, 4);
}

struct LoadSink {
  io::SafetensorsCheckpoint const* ckpt;
  io::ProgressFn const* progress;
  std::set<std::string, std::less<>>* seen;
  uint64_t done = 0;
  uint64_t total = 0;
  int64_t count = 0;

  Status tensor(TensorSpec const& s, TensorView* slot) {
    SPECDEC_RETURN_IF_ERROR(ckpt->get(s.name, s.dtype, s.shape, slot));
    seen->insert(s.name);
    ++count;
    done += slot->bytes.size();
    if (*progress) (*progress)(done, total, s.name);
    return Status::Ok();
  }
  Status linear(LinearSpec const& s, LinearWeights* slot) {
    std::vector<TensorSpec> const t = s.tensors();
    if (!s.int4) return tensor(t[0], &slot->weight);
    SPECDEC_RETURN_IF_ERROR(tensor(t[0], &slot->weight_packed));
    SPECDEC_RETURN_IF_ERROR(tensor(t[1], &slot->weight_scale));
    SPECDEC_RETURN_IF_ERROR(tensor(t[2], &slot->weight_shape));
    int32_t a = 0, b = 0;
    read_shape_values(slot->weight_shape, &a, &b);
    if (a != s.out || b != s.in) {
      return Status::MalformedInput(
          ckpt->dir() + "/" + std::string(ckpt->shard_of(t[2].name)) + ": tensor \"" + t[2].name +
          "\": values [" + std::to_string(a) + ", " + std::to_string(b) + "], expected [" +
          std::to_string(s.out) + ", " + std::to_string(s.in) + "] = [out, in] from the config");
    }
    return Status::Ok();
  }
};

}  // namespace detail

// Every tensor the checkpoint of `config` must hold, in schema order.
inline Status kimi_tensor_schema(DeepseekV3Config const& config, std::vector<TensorSpec>* out) {
  if (out == nullptr) return Status::InvalidArgument("kimi_tensor_schema: out is null");
  out->clear();
  try {
    KimiWeights scratch;
    detail::ListSink sink{out};
    return detail::walk_kimi_schema(config, &scratch, sink);
  } catch (std::exception const& e) {
    return Status::Internal(config.source + ": building the tensor schema: " + e.what());
  }
}

namespace detail {
inline Status load_kimi_weights_impl(io::SafetensorsCheckpoint const& ckpt,
                                     DeepseekV3Config const& config, KimiWeights* out,
                                     io::ProgressFn const& progress);
}  // namespace detail

// Binds every schema tensor of `ckpt` into *out (views: valid while `ckpt` lives), checking dtype,
// shape and INT4 weight_shape values; then reports checkpoint tensors the schema does not know
// (documented skips aside). `progress`, when set, is called after each tensor with bytes bound so
// far and the schema's total.
inline Status load_kimi_weights(io::SafetensorsCheckpoint const& ckpt,
                                DeepseekV3Config const& config, KimiWeights* out,
                                io::ProgressFn progress = {}) {
  if (out == nullptr) return Status::InvalidArgument("load_kimi_weights: out is null");
  try {
    return detail::load_kimi_weights_impl(ckpt, config, out, progress);
  } catch (std::exception const& e) {
    return Status::Internal(ckpt.dir() + ": loading weights: " + e.what());
  }
}

namespace detail {

inline Status load_kimi_weights_impl(io::SafetensorsCheckpoint const& ckpt,
                                     DeepseekV3Config const& config, KimiWeights* out,
                                     io::ProgressFn const& progress) {
  // A config naming more tensors than the checkpoint holds cannot match it: refused before the
  // walk sizes its layers and experts (a mistyped n_routed_experts of 2^28 would first ask for
  // gigabytes of bookkeeping). Every layer holds at least its 6 attention and norm tensors,
  // every routed expert its 3 linears.
  int64_t const held = static_cast<int64_t>(ckpt.names().size());
  int64_t const moe_layers = config.num_moe_layers();
  int64_t const least = int64_t{6} * config.num_hidden_layers +
                        int64_t{3} * config.n_routed_experts * moe_layers;
  if (least > held) {
    return Status::MalformedInput(
        ckpt.dir() + ": " + config.source + " names at least " + std::to_string(least) +
        " tensors (num_hidden_layers " + std::to_string(config.num_hidden_layers) +
        ", n_routed_experts " + std::to_string(config.n_routed_experts) + " in each of " +
        std::to_string(moe_layers) + " MoE layers), the checkpoint holds " +
        std::to_string(held) + ": a config that does not match the checkpoint");
  }
  std::vector<TensorSpec> schema;
  SPECDEC_RETURN_IF_ERROR(kimi_tensor_schema(config, &schema));
  std::set<std::string, std::less<>> seen;
  detail::LoadSink sink{&ckpt, &progress, &seen};
  for (TensorSpec const& s : schema) sink.total += static_cast<uint64_t>(s.bytes());
  KimiWeights w;
  SPECDEC_RETURN_IF_ERROR(detail::walk_kimi_schema(config, &w, sink));
  std::vector<std::string_view> unknown;
  for (std::string_view n : ckpt.names()) {
    if (!seen.count(n) && !detail::is_skipped_tensor(config, n)) unknown.push_back(n);
  }
  if (!unknown.empty()) {
    std::string list;
    for (size_t i = 0; i < unknown.size() && i < 8; ++i) {
      list += (i ? ", \"" : "\"") + std::string(unknown[i]) + "\"";
    }
    if (unknown.size() > 8) list += " and " + std::to_string(unknown.size() - 8) + " more";
    return Status::MalformedInput(
        ckpt.dir() + ": " + std::to_string(unknown.size()) +
        " tensor(s) that the DeepseekV3 schema of " + config.source + " does not know: " + list +
        " (a different model, or a config that does not match the checkpoint?)");
  }
  w.num_tensors = sink.count;
  w.num_bytes = sink.done;
  *out = std::move(w);
  return Status::Ok();
}

}  // namespace detail

}  // namespace specdec::model::kimi
