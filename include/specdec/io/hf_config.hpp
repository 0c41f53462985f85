// Hugging Face config.json of a DeepseekV3ForCausalLM (DeepSeek-V3, Kimi-K2, Kimi-K2.5): every
// field the model needs, validated, plus derived values (YaRN mscale, softmax scale, MoE layers).
//
// Accepted layouts:
//   flat    model_type "deepseek_v3" | "kimi_k2", architectures containing
//           "DeepseekV3ForCausalLM"; tensors "model.*" and "lm_head.*".
//   nested  model_type "kimi_k25" (Kimi-K2.5, multimodal): the language model in `text_config`
//           (its model_type, when present, "deepseek_v3" | "kimi_k2"; its architectures, when
//           present, containing "DeepseekV3ForCausalLM"); tensors "language_model.model.*" and
//           "language_model.lm_head.*". bos/eos/pad_token_id, tie_word_embeddings, torch_dtype
//           (or "dtype") and quantization_config are read from text_config or, when absent
//           there, from the top level; present in both with different values is an error.
// Required fields are read from the file, never assumed. A field takes a default only where
// Hugging Face's DeepseekV3Config (or DeepSeek's own configuration_deepseek.py, which
// transformers' modeling code follows) has one that is right for every model; each such field
// says so below. Missing / wrongly typed fields are kMalformedInput, values that cannot work
// kInvalidArgument, valid values this engine does not implement kUnsupported; every message
// names the file, the field (e.g. "text_config.hidden_size") and the value.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/io/compressed_tensors.hpp"
#include "specdec/io/json_text.hpp"

namespace specdec::io {

enum class TopkMethod { kNoauxTc, kGreedy, kGroupLimitedGreedy };
enum class ScoringFunc { kSigmoid, kSoftmax };

inline char const* topk_method_name(TopkMethod m) {
  switch (m) {
    case TopkMethod::kNoauxTc: return "noaux_tc";
    case TopkMethod::kGreedy: return "greedy";
    case TopkMethod::kGroupLimitedGreedy: return "group_limited_greedy";
  }
  return "?";
}
inline char const* scoring_func_name(ScoringFunc f) {
  return f == ScoringFunc::kSigmoid ? "sigmoid" : "softmax";
}

// rope_scaling {"type" | "rope_type": "yarn", ...}; all six fields required.
struct YarnScaling {
  double factor = 1.0;                           // >= 1
  double beta_fast = 0.0;                        // > 0
  double beta_slow = 0.0;                        // > 0
  double mscale = 0.0;                           // >= 0
  double mscale_all_dim = 0.0;                   // >= 0
  int64_t original_max_position_embeddings = 0;  // > 0

  bool operator==(YarnScaling const&) const = default;
};

// 0.1 * m * ln(factor) + 1 for factor > 1, else 1 (yarn_get_mscale of DeepSeek / transformers).
inline double yarn_get_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

struct DeepseekV3Config {
  std::string source;          // the file read (or the name given to parse_config)
  std::string model_type;      // top level: "deepseek_v3" | "kimi_k2" | "kimi_k25"
  std::string wrapper_prefix;  // "" | "language_model." (Kimi-K2.5)
  std::string tensor_prefix;   // "model." | "language_model.model."
  std::string lm_head_prefix;  // "lm_head." | "language_model.lm_head."

  int hidden_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  std::optional<int> q_lora_rank;  // required key; null = q_proj [H*qk_head_dim, hidden] directly
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;  // even (interleaved rope pairs)
  int v_head_dim = 0;

  int n_routed_experts = 0;
  int num_experts_per_tok = 0;
  int n_shared_experts = 0;  // >= 0
  int moe_intermediate_size = 0;
  int intermediate_size = 0;      // dense MLP (layers < first_k_dense_replace)
  int first_k_dense_replace = 0;  // in [0, num_hidden_layers]
  int moe_layer_freq = 1;         // default 1 (configuration_deepseek.py; transformers: always 1)
  // Multi-token-prediction layers the checkpoint holds after the last one (DeepSeek-V3: 1, its
  // layers.61.*), which the causal LM does not run; default 0.
  int num_nextn_predict_layers = 0;
  int n_group = 0;
  int topk_group = 0;
  TopkMethod topk_method = TopkMethod::kNoauxTc;  // default "noaux_tc" (configuration_deepseek.py)
  ScoringFunc scoring_func = ScoringFunc::kSigmoid;  // default "sigmoid" (same)
  bool norm_topk_prob = false;
  double routed_scaling_factor = 0.0;

  int vocab_size = 0;
  double rms_norm_eps = 0.0;
  double rope_theta = 0.0;                  // "rope_theta", or rope_parameters.rope_theta
  std::optional<YarnScaling> rope_scaling;  // default none (transformers: rope_scaling None)
  int64_t max_position_embeddings = 0;

  int64_t bos_token_id = 0;
  std::vector<int64_t> eos_token_ids;   // eos_token_id: an id or a list of ids
  std::optional<int64_t> pad_token_id;  // default none (transformers: None)
  bool tie_word_embeddings = false;     // default false (transformers)
  std::string hidden_act = "silu";      // default "silu" (transformers); only "silu" accepted
  bool attention_bias = false;          // default false (transformers)
  std::string torch_dtype;              // "bfloat16" | "float16" | "float32"

  std::optional<QuantizationConfig> quantization;  // none: every weight is torch_dtype
  std::string quantization_path;  // where it was found, e.g. "text_config.quantization_config"

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Layer i runs a routed MoE (else the dense MLP).
  bool is_moe_layer(int i) const {
    return i >= 0 && i < num_hidden_layers && i >= first_k_dense_replace && i % moe_layer_freq == 0;
  }
  int num_moe_layers() const {
    int n = 0;
    for (int i = 0; i < num_hidden_layers; ++i) n += is_moe_layer(i) ? 1 : 0;
    return n;
  }
  // kimi.md's mscale: 0.1 * mscale_all_dim * ln(factor) + 1 (1 without YaRN or factor 1).
  double attention_mscale() const {
    return rope_scaling ? yarn_get_mscale(rope_scaling->factor, rope_scaling->mscale_all_dim) : 1.0;
  }
  // Softmax scale: qk_head_dim^-0.5, times attention_mscale()^2 under YaRN when mscale_all_dim
  // is non-zero (transformers' DeepseekV3Attention). K2.5: 192^-0.5 * 1.415888^2 = 0.144680.
  double softmax_scale() const {
    double const m = attention_mscale();
    return 1.0 / std::sqrt(static_cast<double>(qk_head_dim())) * m * m;
  }
  // Factor on cos / sin of the YaRN table (transformers' _compute_yarn_parameters:
  // get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are non-zero,
  // else get_mscale(factor, 1)). 1 without YaRN, and 1 when mscale == mscale_all_dim (Kimi).
  double rope_cos_sin_scale() const {
    if (!rope_scaling) return 1.0;
    YarnScaling const& y = *rope_scaling;
    if (y.mscale != 0.0 && y.mscale_all_dim != 0.0) {
      return yarn_get_mscale(y.factor, y.mscale) / yarn_get_mscale(y.factor, y.mscale_all_dim);
    }
    return yarn_get_mscale(y.factor, 1.0);
  }
};

// True when the checkpoint module `module_name` (full name, no ".weight", e.g.
// "language_model.model.layers.3.mlp.experts.17.down_proj") is stored as INT4. The ignore list
// is applied to the full name and, for names under wrapper_prefix, also to the name without it
// (a list written for the text model says "lm_head" for "language_model.lm_head"); a match in
// either scope means bf16.
inline bool is_int4_module(DeepseekV3Config const& config, std::string_view module_name) {
  if (!config.quantization) return false;
  if (!is_quantized(*config.quantization, module_name)) return false;
  std::string_view const w = config.wrapper_prefix;
  if (!w.empty() && module_name.substr(0, w.size()) == w &&
      !is_quantized(*config.quantization, module_name.substr(w.size()))) {
    return false;
  }
  return true;
}

namespace detail {

inline bool contains_string(Json const& array, std::string_view s) {
  if (!array.is_array()) return false;
  for (Json const& v : array) {
    if (v.is_string() && v.get<std::string>() == s) return true;
  }
  return false;
}

// The config's fields: `text` is the language model's object, `top` the file's top level
// (the same object for a flat config).
struct ConfigReader {
  FieldReader text;
  FieldReader top;
  bool nested;

  // A field of text_config that may instead sit at the top level (nested configs only).
  // Sets *reader to the one holding it (or nullptr when neither does).
  Status shared(std::string_view key, FieldReader const** reader) const {
    Json const* in_text = text.find(key);
    Json const* in_top = nested ? top.find(key) : nullptr;
    if (in_text && in_top && *in_text != *in_top) {
      return Status::InvalidArgument(text.where(key) + " = " + in_text->dump() + " and " +
                                     top.field(key) + " = " + in_top->dump() + " disagree");
    }
    *reader = in_text ? &text : in_top ? &top : nullptr;
    return Status::Ok();
  }
};

inline Status check_positive(FieldReader const& r, std::string_view key, double v) {
  if (!(v > 0.0)) return r.bad_value(key, Json(v), "must be > 0");
  return Status::Ok();
}

inline Status parse_yarn(FieldReader const& s, YarnScaling* y) {
  SPECDEC_RETURN_IF_ERROR(s.get_double("factor", &y->factor));
  if (y->factor < 1.0) return s.bad_value("factor", Json(y->factor), "YaRN factor must be >= 1");
  SPECDEC_RETURN_IF_ERROR(s.get_double("beta_fast", &y->beta_fast));
  SPECDEC_RETURN_IF_ERROR(check_positive(s, "beta_fast", y->beta_fast));
  SPECDEC_RETURN_IF_ERROR(s.get_double("beta_slow", &y->beta_slow));
  SPECDEC_RETURN_IF_ERROR(check_positive(s, "beta_slow", y->beta_slow));
  SPECDEC_RETURN_IF_ERROR(s.get_double("mscale", &y->mscale));
  if (y->mscale < 0.0) return s.bad_value("mscale", Json(y->mscale), "must be >= 0");
  SPECDEC_RETURN_IF_ERROR(s.get_double("mscale_all_dim", &y->mscale_all_dim));
  if (y->mscale_all_dim < 0.0) {
    return s.bad_value("mscale_all_dim", Json(y->mscale_all_dim), "must be >= 0");
  }
  SPECDEC_RETURN_IF_ERROR(
      s.get_int("original_max_position_embeddings", &y->original_max_position_embeddings));
  if (y->original_max_position_embeddings <= 0) {
    return s.bad_value("original_max_position_embeddings",
                       Json(y->original_max_position_embeddings), "must be > 0");
  }
  return Status::Ok();
}

// The rope scaling object `s` (rope_scaling, or rope_parameters when `is_params`): YaRN into *out,
// none for rope_parameters of type "default"; any other type is unsupported.
inline Status parse_scaling(FieldReader const& s, bool is_params, std::optional<YarnScaling>* out) {
  std::string type;
  char const* type_key = s.has("type") ? "type" : "rope_type";
  SPECDEC_RETURN_IF_ERROR(s.get_string(type_key, &type));
  if (s.has("type") && s.has("rope_type") && *s.find("type") != *s.find("rope_type")) {
    return Status::InvalidArgument(s.where("type") + " = " + s.find("type")->dump() + " and " +
                                   s.field("rope_type") + " = " + s.find("rope_type")->dump() +
                                   " disagree");
  }
  if (type == "default" && is_params) {  // rope_parameters without scaling
    out->reset();
    return Status::Ok();
  }
  if (type != "yarn") {
    return s.unsupported(type_key, *s.find(type_key),
                         "only \"yarn\" rope scaling (or none) is supported");
  }
  YarnScaling y;
  SPECDEC_RETURN_IF_ERROR(parse_yarn(s, &y));
  *out = y;
  return Status::Ok();
}

// rope_theta and rope_scaling, from the classic keys or transformers v5's rope_parameters; where
// a config gives both forms they must agree (neither is ignored). The target's config and the
// EAGLE draft's read rope through here.
inline Status parse_rope(FieldReader const& t, double* rope_theta,
                         std::optional<YarnScaling>* rope_scaling) {
  FieldReader params{t.source, t.prefix, nullptr};
  bool const has_params = !t.absent_or_null("rope_parameters");
  if (has_params) SPECDEC_RETURN_IF_ERROR(t.get_object("rope_parameters", &params));
  if (t.has("rope_theta") || !has_params) {
    SPECDEC_RETURN_IF_ERROR(t.get_double("rope_theta", rope_theta));
    SPECDEC_RETURN_IF_ERROR(check_positive(t, "rope_theta", *rope_theta));
  }
  if (has_params && params.has("rope_theta")) {
    double theta = 0.0;
    SPECDEC_RETURN_IF_ERROR(params.get_double("rope_theta", &theta));
    SPECDEC_RETURN_IF_ERROR(check_positive(params, "rope_theta", theta));
    if (t.has("rope_theta") && theta != *rope_theta) {
      return Status::InvalidArgument(t.where("rope_theta") + " = " + t.find("rope_theta")->dump() +
                                     " and " + params.field("rope_theta") + " = " +
                                     params.find("rope_theta")->dump() + " disagree");
    }
    *rope_theta = theta;
  } else if (!t.has("rope_theta")) {
    SPECDEC_RETURN_IF_ERROR(params.get_double("rope_theta", rope_theta));  // names it missing
  }
  bool const has_scaling = !t.absent_or_null("rope_scaling");
  if (has_scaling) {
    FieldReader s{t.source, t.prefix, nullptr};
    SPECDEC_RETURN_IF_ERROR(t.get_object("rope_scaling", &s));
    SPECDEC_RETURN_IF_ERROR(parse_scaling(s, false, rope_scaling));
  }
  if (!has_params) {
    if (!has_scaling) rope_scaling->reset();
    return Status::Ok();
  }
  std::optional<YarnScaling> from_params;
  SPECDEC_RETURN_IF_ERROR(parse_scaling(params, true, &from_params));
  if (has_scaling && *rope_scaling != from_params) {
    return Status::InvalidArgument(t.where("rope_scaling") + " and " + t.field("rope_parameters") +
                                   " disagree: give one of them, or the same scaling in both");
  }
  *rope_scaling = from_params;
  return Status::Ok();
}

inline Status parse_token_ids(ConfigReader const& cr, DeepseekV3Config* c) {
  FieldReader const* r = nullptr;
  auto in_vocab = [&](FieldReader const& rd, std::string_view key, Json const& v,
                      int64_t id) -> Status {
    if (id < 0 || id >= c->vocab_size) {
      return rd.bad_value(
          key, v, "not a token id in [0, vocab_size " + std::to_string(c->vocab_size) + ")");
    }
    return Status::Ok();
  };
  SPECDEC_RETURN_IF_ERROR(cr.shared("bos_token_id", &r));
  if (!r) return cr.text.missing("bos_token_id");
  SPECDEC_RETURN_IF_ERROR(r->get_int("bos_token_id", &c->bos_token_id));
  SPECDEC_RETURN_IF_ERROR(in_vocab(*r, "bos_token_id", *r->find("bos_token_id"), c->bos_token_id));

  SPECDEC_RETURN_IF_ERROR(cr.shared("eos_token_id", &r));
  if (!r) return cr.text.missing("eos_token_id");
  Json const& eos = *r->find("eos_token_id");
  c->eos_token_ids.clear();
  if (eos.is_number_integer()) {
    int64_t id = 0;
    SPECDEC_RETURN_IF_ERROR(r->get_int("eos_token_id", &id));
    c->eos_token_ids.push_back(id);
  } else if (eos.is_array() && !eos.empty()) {
    for (Json const& v : eos) {
      if (!v.is_number_integer()) {
        return r->wrong_type("eos_token_id", eos, "an integer or a non-empty list of integers");
      }
      c->eos_token_ids.push_back(v.get<int64_t>());
    }
  } else {
    return r->wrong_type("eos_token_id", eos, "an integer or a non-empty list of integers");
  }
  for (int64_t id : c->eos_token_ids) {
    SPECDEC_RETURN_IF_ERROR(in_vocab(*r, "eos_token_id", eos, id));
  }

  SPECDEC_RETURN_IF_ERROR(cr.shared("pad_token_id", &r));
  c->pad_token_id.reset();
  if (r && !r->find("pad_token_id")->is_null()) {
    int64_t id = 0;
    SPECDEC_RETURN_IF_ERROR(r->get_int("pad_token_id", &id));
    SPECDEC_RETURN_IF_ERROR(in_vocab(*r, "pad_token_id", *r->find("pad_token_id"), id));
    c->pad_token_id = id;
  }
  return Status::Ok();
}

inline Status parse_text_config(ConfigReader const& cr, DeepseekV3Config* c) {
  FieldReader const& t = cr.text;
  auto const& j = *t.obj;
  // Sizes: required (transformers' defaults are DeepSeek-V3's sizes, wrong for any other model).
  SPECDEC_RETURN_IF_ERROR(t.get_int32("hidden_size", 1, &c->hidden_size));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("num_hidden_layers", 1, &c->num_hidden_layers));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("num_attention_heads", 1, &c->num_attention_heads));
  if (c->hidden_size % c->num_attention_heads != 0) {
    return t.bad_value(
        "hidden_size", j["hidden_size"],
        "not divisible by num_attention_heads " + std::to_string(c->num_attention_heads));
  }
  // q_lora_rank: the key is required; null means no q compression.
  if (!t.has("q_lora_rank")) return t.missing("q_lora_rank");
  if (j["q_lora_rank"].is_null()) {
    c->q_lora_rank.reset();
  } else {
    int q = 0;
    SPECDEC_RETURN_IF_ERROR(t.get_int32("q_lora_rank", 1, &q));
    c->q_lora_rank = q;
  }
  SPECDEC_RETURN_IF_ERROR(t.get_int32("kv_lora_rank", 1, &c->kv_lora_rank));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("qk_nope_head_dim", 1, &c->qk_nope_head_dim));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("qk_rope_head_dim", 2, &c->qk_rope_head_dim));
  if (c->qk_rope_head_dim % 2 != 0) {
    return t.bad_value("qk_rope_head_dim", j["qk_rope_head_dim"], "must be even (rope pairs)");
  }
  SPECDEC_RETURN_IF_ERROR(t.get_int32("v_head_dim", 1, &c->v_head_dim));

  SPECDEC_RETURN_IF_ERROR(t.get_int32("n_routed_experts", 1, &c->n_routed_experts));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("num_experts_per_tok", 1, &c->num_experts_per_tok));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("n_shared_experts", 0, &c->n_shared_experts));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("moe_intermediate_size", 1, &c->moe_intermediate_size));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("intermediate_size", 1, &c->intermediate_size));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("first_k_dense_replace", 0, &c->first_k_dense_replace));
  if (c->first_k_dense_replace > c->num_hidden_layers) {
    return t.bad_value("first_k_dense_replace", j["first_k_dense_replace"],
                       "more than num_hidden_layers " + std::to_string(c->num_hidden_layers));
  }
  c->moe_layer_freq = 1;
  if (t.has("moe_layer_freq")) {
    SPECDEC_RETURN_IF_ERROR(t.get_int32("moe_layer_freq", 1, &c->moe_layer_freq));
  }
  c->num_nextn_predict_layers = 0;
  if (t.has("num_nextn_predict_layers")) {
    SPECDEC_RETURN_IF_ERROR(
        t.get_int32("num_nextn_predict_layers", 0, &c->num_nextn_predict_layers));
  }
  SPECDEC_RETURN_IF_ERROR(t.get_int32("n_group", 1, &c->n_group));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("topk_group", 1, &c->topk_group));
  if (c->topk_group > c->n_group) {
    return t.bad_value("topk_group", j["topk_group"],
                       "more than n_group " + std::to_string(c->n_group));
  }
  if (c->n_routed_experts % c->n_group != 0) {
    return t.bad_value("n_routed_experts", j["n_routed_experts"],
                       "not divisible by n_group " + std::to_string(c->n_group));
  }
  if (c->num_experts_per_tok > c->n_routed_experts) {
    return t.bad_value("num_experts_per_tok", j["num_experts_per_tok"],
                       "more than n_routed_experts " + std::to_string(c->n_routed_experts));
  }
  int64_t const selectable = int64_t{c->topk_group} * (c->n_routed_experts / c->n_group);
  if (c->num_experts_per_tok > selectable) {
    return t.bad_value(
        "num_experts_per_tok", j["num_experts_per_tok"],
        "more than the " + std::to_string(selectable) + " experts in topk_group groups");
  }
  std::string s;
  c->topk_method = TopkMethod::kNoauxTc;
  if (t.has("topk_method")) {
    SPECDEC_RETURN_IF_ERROR(t.get_string("topk_method", &s));
    if (s == "noaux_tc") {
      c->topk_method = TopkMethod::kNoauxTc;
    } else if (s == "greedy") {
      c->topk_method = TopkMethod::kGreedy;
    } else if (s == "group_limited_greedy") {
      c->topk_method = TopkMethod::kGroupLimitedGreedy;
    } else {
      return t.bad_value("topk_method", j["topk_method"],
                         "unknown (noaux_tc, greedy, group_limited_greedy)");
    }
  }
  c->scoring_func = ScoringFunc::kSigmoid;
  if (t.has("scoring_func")) {
    SPECDEC_RETURN_IF_ERROR(t.get_string("scoring_func", &s));
    if (s == "sigmoid") {
      c->scoring_func = ScoringFunc::kSigmoid;
    } else if (s == "softmax") {
      c->scoring_func = ScoringFunc::kSoftmax;
    } else {
      return t.bad_value("scoring_func", j["scoring_func"], "unknown (sigmoid, softmax)");
    }
  }
  SPECDEC_RETURN_IF_ERROR(t.get_bool("norm_topk_prob", &c->norm_topk_prob));
  SPECDEC_RETURN_IF_ERROR(t.get_double("routed_scaling_factor", &c->routed_scaling_factor));
  SPECDEC_RETURN_IF_ERROR(check_positive(t, "routed_scaling_factor", c->routed_scaling_factor));

  SPECDEC_RETURN_IF_ERROR(t.get_int32("vocab_size", 1, &c->vocab_size));
  SPECDEC_RETURN_IF_ERROR(t.get_double("rms_norm_eps", &c->rms_norm_eps));
  SPECDEC_RETURN_IF_ERROR(check_positive(t, "rms_norm_eps", c->rms_norm_eps));
  SPECDEC_RETURN_IF_ERROR(parse_rope(t, &c->rope_theta, &c->rope_scaling));
  SPECDEC_RETURN_IF_ERROR(t.get_int("max_position_embeddings", &c->max_position_embeddings));
  if (c->max_position_embeddings <= 0) {
    return t.bad_value("max_position_embeddings", j["max_position_embeddings"], "must be > 0");
  }
  SPECDEC_RETURN_IF_ERROR(parse_token_ids(cr, c));

  c->hidden_act = "silu";
  if (t.has("hidden_act")) {
    SPECDEC_RETURN_IF_ERROR(t.get_string("hidden_act", &c->hidden_act));
    if (c->hidden_act != "silu") {
      return t.unsupported("hidden_act", j["hidden_act"], "only \"silu\" (SwiGLU) is supported");
    }
  }
  c->attention_bias = false;
  if (t.has("attention_bias"))
    SPECDEC_RETURN_IF_ERROR(t.get_bool("attention_bias", &c->attention_bias));

  FieldReader const* r = nullptr;
  SPECDEC_RETURN_IF_ERROR(cr.shared("tie_word_embeddings", &r));
  c->tie_word_embeddings = false;
  if (r) SPECDEC_RETURN_IF_ERROR(r->get_bool("tie_word_embeddings", &c->tie_word_embeddings));

  // torch_dtype (transformers < 5) or dtype (transformers 5): required, no usable default.
  std::string dtype_key = "torch_dtype";
  SPECDEC_RETURN_IF_ERROR(cr.shared(dtype_key, &r));
  if (!r) {
    dtype_key = "dtype";
    SPECDEC_RETURN_IF_ERROR(cr.shared(dtype_key, &r));
  }
  if (!r) return cr.text.missing("torch_dtype");
  SPECDEC_RETURN_IF_ERROR(r->get_string(dtype_key, &c->torch_dtype));
  if (c->torch_dtype != "bfloat16" && c->torch_dtype != "float16" && c->torch_dtype != "float32") {
    return r->unsupported(dtype_key, *r->find(dtype_key),
                          "expected \"bfloat16\", \"float16\" or \"float32\"");
  }

  SPECDEC_RETURN_IF_ERROR(cr.shared("quantization_config", &r));
  c->quantization.reset();
  c->quantization_path.clear();
  if (r) {
    c->quantization_path = r->prefix + "quantization_config";
    QuantizationConfig q;
    SPECDEC_RETURN_IF_ERROR(parse_quantization_config(*r->find("quantization_config"), r->source,
                                                      c->quantization_path, &q));
    c->quantization = std::move(q);
  }
  return Status::Ok();
}

// `json_text` parsed into *out, which must be an object with no key repeated; errors name
// `source`.
inline Status parse_json_object(std::string_view json_text, std::string_view source, Json* out) {
  SPECDEC_RETURN_IF_ERROR(parse_json_no_duplicates(json_text, std::string(source), out));
  if (!out->is_object()) {
    return Status::MalformedInput(std::string(source) + ": top level must be an object, got " +
                                  json_type_name(*out));
  }
  return Status::Ok();
}

}  // namespace detail

// Parses config.json text. `source` (a path or a name) appears in every error message.
inline Status parse_config(std::string_view json_text, std::string_view source,
                           DeepseekV3Config* out) {
  using detail::FieldReader;
  using detail::Json;
  if (out == nullptr) return Status::InvalidArgument("parse_config: out is null");
  try {
    Json root;
    SPECDEC_RETURN_IF_ERROR(detail::parse_json_object(json_text, source, &root));
    DeepseekV3Config c;
    c.source = std::string(source);
    FieldReader top{source, "", &root};
    SPECDEC_RETURN_IF_ERROR(top.get_string("model_type", &c.model_type));
    detail::ConfigReader cr{top, top, false};
    if (c.model_type == "kimi_k25") {
      cr.nested = true;
      SPECDEC_RETURN_IF_ERROR(top.get_object("text_config", &cr.text));
      if (cr.text.has("model_type")) {
        std::string text_type;
        SPECDEC_RETURN_IF_ERROR(cr.text.get_string("model_type", &text_type));
        if (text_type != "deepseek_v3" && text_type != "kimi_k2") {
          return cr.text.unsupported("model_type", *cr.text.find("model_type"),
                                     "expected \"deepseek_v3\" or \"kimi_k2\"");
        }
      }
      if (cr.text.has("architectures") &&
          !detail::contains_string(*cr.text.find("architectures"), "DeepseekV3ForCausalLM")) {
        return cr.text.unsupported("architectures", *cr.text.find("architectures"),
                                   "must contain \"DeepseekV3ForCausalLM\"");
      }
      c.wrapper_prefix = "language_model.";
    } else if (c.model_type == "deepseek_v3" || c.model_type == "kimi_k2") {
      std::vector<std::string> archs;
      SPECDEC_RETURN_IF_ERROR(top.get_string_list("architectures", &archs));
      if (!detail::contains_string(root["architectures"], "DeepseekV3ForCausalLM")) {
        return top.unsupported("architectures", root["architectures"],
                               "must contain \"DeepseekV3ForCausalLM\"");
      }
    } else {
      return top.unsupported("model_type", root["model_type"],
                             "expected \"deepseek_v3\", \"kimi_k2\" or \"kimi_k25\"");
    }
    c.tensor_prefix = c.wrapper_prefix + "model.";
    c.lm_head_prefix = c.wrapper_prefix + "lm_head.";
    SPECDEC_RETURN_IF_ERROR(detail::parse_text_config(cr, &c));
    *out = std::move(c);
    return Status::Ok();
  } catch (std::exception const& e) {
    return Status::Internal(std::string(source) + ": " + e.what());
  }
}

// Reads `path`: a config.json file, or a checkpoint directory holding one.
// The text of path/config.json (or of path itself when it is a file) into *text, its path into
// *file; `what` names the config in the errors ("config", "the draft's config").
inline Status read_config_file(std::filesystem::path const& path, std::string_view what,
                               std::string* file, std::string* text) {
  std::error_code ec;
  std::filesystem::path f = path;
  if (std::filesystem::is_directory(path, ec)) f = path / "config.json";
  *file = f.string();
  std::ifstream in(f, std::ios::binary);
  if (!in) {
    return Status::InvalidArgument(*file + ": cannot open " + std::string(what) +
                                   " (missing or unreadable)");
  }
  text->assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::InvalidArgument(*file + ": read error");
  return Status::Ok();
}

inline Status load_config(std::filesystem::path const& path, DeepseekV3Config* out) {
  std::string file, text;
  SPECDEC_RETURN_IF_ERROR(read_config_file(path, "config", &file, &text));
  return parse_config(text, file, out);
}

// One line for logs, e.g. "kimi_k25 DeepseekV3 (config.json, tensors 'language_model.model.'):
// 61 layers (1 dense, 60 MoE), hidden 7168, MLA 64 heads ...".
inline std::string describe(DeepseekV3Config const& c) {
  char buf[128];
  std::string s =
      c.model_type + " DeepseekV3 (" + c.source + ", tensors '" + c.tensor_prefix +
      "'): " + std::to_string(c.num_hidden_layers) + " layers (" +
      std::to_string(c.num_hidden_layers - c.num_moe_layers()) + " dense, " +
      std::to_string(c.num_moe_layers()) + " MoE), hidden " + std::to_string(c.hidden_size) +
      ", MLA " + std::to_string(c.num_attention_heads) + " heads q_lora " +
      (c.q_lora_rank ? std::to_string(*c.q_lora_rank) : std::string("none")) + " kv_lora " +
      std::to_string(c.kv_lora_rank) + " qk " + std::to_string(c.qk_nope_head_dim) + "+" +
      std::to_string(c.qk_rope_head_dim) + " v " + std::to_string(c.v_head_dim) + ", experts " +
      std::to_string(c.n_routed_experts) + " top-" + std::to_string(c.num_experts_per_tok) + " +" +
      std::to_string(c.n_shared_experts) + " shared (" + std::to_string(c.moe_intermediate_size) +
      " wide, groups " + std::to_string(c.topk_group) + "/" + std::to_string(c.n_group) + ", " +
      scoring_func_name(c.scoring_func) + " " + topk_method_name(c.topk_method);
  std::snprintf(buf, sizeof buf, " x%g", c.routed_scaling_factor);
  s += buf;
  s += "), vocab " + std::to_string(c.vocab_size) + ", rope theta ";
  std::snprintf(buf, sizeof buf, "%g", c.rope_theta);
  s += buf;
  if (c.rope_scaling) {
    std::snprintf(buf, sizeof buf, " yarn x%g", c.rope_scaling->factor);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, ", softmax scale %.6f, %s", c.softmax_scale(),
                c.torch_dtype.c_str());
  s += buf;
  if (c.quantization) {
    s += " + int4 group " + std::to_string(c.quantization->group_size) + " (" +
         c.quantization->quant_method + ")";
  }
  return s;
}

}  // namespace specdec::io
