// config.json of an EAGLE-family draft checkpoint (reference/kimi.md "EAGLE-3 draft checkpoint"),
// validated, and the checks of a draft against the serving policy and the target. Two layouts
// share one Llama decoder layer (forward_cpu.hpp) and this config:
//   EAGLE-3    (SpecForge layout, what SGLang and vLLM load) architectures
//              ["LlamaForCausalLMEagle3"] (vLLM's alias "Eagle3LlamaForCausalLM" too)
//   EAGLE-1/2  (SafeAILab / SGLang "LlamaForCausalLMEagle", vLLM "EagleLlamaForCausalLM"): fc over
//              [embedding, the target's last hidden state]; DraftKind::kEagle
// Any other architectures value is kUnsupported naming it.
//
// Fields, both kinds:
//   num_hidden_layers   1 (one Llama decoder layer; others kUnsupported: EAGLE-3's midlayer is
//                       one layer, and public EAGLE-1/2 drafts have one, layers.0.*)
//   hidden_size H, intermediate_size I, num_attention_heads nh, vocab_size V (the target's),
//   rms_norm_eps, rope_theta (or rope_parameters {rope_type "default", rope_theta}; both
//   forms may be given when they agree),
//   max_position_embeddings                                                    required
//   num_key_value_heads nkv    default nh (transformers' LlamaConfig); nh % nkv == 0
//   head_dim hd                default H / nh (H % nh must then be 0); even (NeoX rope halves)
//   rope_scaling               absent or null (any scaling is kUnsupported naming it)
//   hidden_act "silu", attention_bias / mlp_bias false   when present (others kUnsupported)
// EAGLE-3 only:
//   draft_vocab_size Vd        default V; in [1, V]
//   target_hidden_size Ht      default H
//   eagle_config {eagle_aux_hidden_state_layer_ids: [...], use_aux_hidden_state: true}
//     ids in policy/layers.hpp's convention (id i = the residual stream after target layer i,
//     -1 the embedding output), in order. Absent ids (or no eagle_config): SGLang's documented
//     default, the inputs of layers 2, N/2, N-3 of an N-layer target = ids [1, N/2 - 1, N - 4]
//     (Kimi-K2.5, N = 61: [1, 29, 57]); layers_from_file records which. A default that is not a
//     valid layer set for the target (a duplicate or an id out of range: N = 4 gives [1,1,0]) is
//     an error saying to write the ids into eagle_config. use_aux_hidden_state false is
//     kUnsupported.
//   Every id must be in [-1, N): read_draft_config takes N (target_num_layers).
// EAGLE-1/2: Vd = V and Ht = H (the draft reads the target's embedding width and predicts in the
//   target's vocabulary through the target's lm_head); layers is empty (the policy's Layers<>),
//   and the feature it reads is the target's last hidden state: feature_layers() = [N - 1],
//   final-normed by the draft (forward_cpu.hpp). A draft_vocab_size or target_hidden_size other
//   than V / H, or an eagle_config, contradicts the architecture and is refused naming the field.
//
// Errors name the file and the field ("<dir>/config.json: field 'eagle_config.
// eagle_aux_hidden_state_layer_ids' ..."): missing / wrongly typed fields kMalformedInput, values
// that cannot work kInvalidArgument, valid values not implemented kUnsupported.
//
// Public API (namespace specdec::model::eagle):
//   DraftConfig                                     the fields above plus kind / source
//   read_draft_config(dir, target_num_layers, &config)          reads dir/config.json
//   parse_draft_config(json text, source, target_num_layers, &config)
//   eagle3_default_layers(target_num_layers)        [1, N/2 - 1, N - 4]
//   check_draft_config_fits(config, policy_kind, policy_layers, policy_what)
//     the algorithm and the layer set (order included) against the policy (check_draft_fits)
//   check_draft_target(config, target)              vocab_size and the hidden widths against
//                                                   the target's DeepseekV3Config
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/io/compressed_tensors.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/policy/draft.hpp"
#include "specdec/policy/layers.hpp"
#include "specdec/policy/spec_policy.hpp"

namespace specdec::model::eagle {

inline constexpr char const* kEagle3Architecture = "LlamaForCausalLMEagle3";
inline constexpr char const* kEagleArchitecture = "LlamaForCausalLMEagle";      // EAGLE-1/2
inline constexpr char const* kEagleArchitectureVllm = "EagleLlamaForCausalLM";  // its vLLM name

struct DraftConfig {
  std::string source;                   // the file read
  std::string architecture;             // the architectures entry that was recognised
  DraftKind kind = DraftKind::kEagle3;  // or kEagle (EAGLE-1/2)
  int target_num_layers = 0;            // N, as given to parse_draft_config

  int hidden_size = 0;          // H
  int intermediate_size = 0;    // I
  int num_attention_heads = 0;  // nh
  int num_key_value_heads = 0;  // nkv, divides nh
  int head_dim = 0;             // hd, even
  double rms_norm_eps = 0.0;
  double rope_theta = 0.0;
  int64_t max_position_embeddings = 0;
  int vocab_size = 0;          // V, the target's vocabulary
  int draft_vocab_size = 0;    // Vd <= V
  int target_hidden_size = 0;  // Ht
  std::vector<int> layers;     // EAGLE-3: eagle_aux_hidden_state_layer_ids (or the default), in
                               // order; EAGLE-1/2: empty (the policy's Layers<>)
  bool layers_from_file = false;

  bool eagle3() const { return kind == DraftKind::kEagle3; }
  int64_t q_width() const { return int64_t{num_attention_heads} * head_dim; }
  int64_t kv_width() const { return int64_t{num_key_value_heads} * head_dim; }
  // The target residual streams the draft reads, in order: EAGLE-3 its layer set, EAGLE-1/2 the
  // last layer's output (final-normed by the draft).
  std::vector<int> feature_layers() const {
    return eagle3() ? layers : std::vector<int>{target_num_layers - 1};
  }
  // |feature_layers| * Ht: the width of the target feature per token.
  int64_t feature_width() const {
    return static_cast<int64_t>(feature_layers().size()) * target_hidden_size;
  }
  // fc's input width: EAGLE-3 the feature, EAGLE-1/2 [embedding H | feature H].
  int64_t fc_in_width() const { return eagle3() ? feature_width() : 2 * int64_t{hidden_size}; }
  // The attention projections' input width: EAGLE-3 [embedding | hidden] 2H, EAGLE-1/2 H.
  int64_t attention_in_width() const { return (eagle3() ? 2 : 1) * int64_t{hidden_size}; }
  char const* kind_name() const { return eagle3() ? "EAGLE-3" : "EAGLE-1/2"; }
};

// SGLang's default capture for an N-layer target in this project's convention.
inline std::vector<int> eagle3_default_layers(int target_num_layers) {
  int const n = target_num_layers;
  return {1, n / 2 - 1, n - 4};
}

namespace detail {

using io::detail::FieldReader;
using io::detail::Json;

inline bool is_one_of(std::string const& s, std::initializer_list<char const*> names) {
  for (char const* n : names) {
    if (s == n) return true;
  }
  return false;
}

// Layer ids: a valid set (policy/layers.hpp) with every id < target_num_layers. `what` says where
// they came from; `fix` is appended to the message.
inline Status check_layer_ids(std::vector<int> const& ids, int target_num_layers,
                              std::string const& what, std::string const& fix) {
  if (ids.empty()) return Status::InvalidArgument(what + " is empty" + fix);
  switch (layer_set_error(ids)) {
    case LayerSetError::kOk:
      break;
    case LayerSetError::kBelowEmbedding:
      return Status::InvalidArgument(what + " " + format_layers(ids) +
                                     " has an id below -1 (the embedding output)" + fix);
    case LayerSetError::kDuplicate:
      return Status::InvalidArgument(what + " " + format_layers(ids) + " lists a layer twice" +
                                     fix);
  }
  for (int id : ids) {
    if (id >= target_num_layers) {
      return Status::InvalidArgument(
          what + " " + format_layers(ids) + " has id " + std::to_string(id) + " >= the target's " +
          std::to_string(target_num_layers) + " layers (ids are outputs of layers 0.." +
          std::to_string(target_num_layers - 1) + ", -1 the embedding)" + fix);
    }
  }
  return Status::Ok();
}

inline Status parse_eagle_config(FieldReader const& top, int target_num_layers, DraftConfig* c) {
  std::string const key = "eagle_aux_hidden_state_layer_ids";
  FieldReader e{top.source, "eagle_config.", nullptr};
  bool const has_eagle = !top.absent_or_null("eagle_config");
  if (has_eagle) SPECDEC_RETURN_IF_ERROR(top.get_object("eagle_config", &e));
  if (has_eagle && e.has("use_aux_hidden_state")) {
    bool use_aux = true;
    SPECDEC_RETURN_IF_ERROR(e.get_bool("use_aux_hidden_state", &use_aux));
    if (!use_aux) {
      return e.unsupported("use_aux_hidden_state", Json(false),
                           "only drafts that read the target's aux hidden states are supported");
    }
  }
  if (!has_eagle || e.absent_or_null(key)) {
    c->layers = eagle3_default_layers(target_num_layers);
    c->layers_from_file = false;
    return check_layer_ids(
        c->layers, target_num_layers,
        std::string(top.source) + ": " + e.field(key) +
            " is absent and the default [1, N/2 - 1, N - 4] for the " +
            std::to_string(target_num_layers) + "-layer target",
        " (not a valid layer set); write the ids the draft was trained with into eagle_config");
  }
  Json const& v = *e.find(key);
  if (!v.is_array()) return e.wrong_type(key, v, "an array of integers");
  c->layers.clear();
  for (Json const& id : v) {
    if (!id.is_number_integer() || id.get<int64_t>() < -1 || id.get<int64_t>() > int64_t{1} << 30) {
      return e.bad_value(key, v, "every entry must be an integer layer id >= -1");
    }
    c->layers.push_back(static_cast<int>(id.get<int64_t>()));
  }
  c->layers_from_file = true;
  return check_layer_ids(c->layers, target_num_layers, e.where(key), "");
}

// The Llama decoder fields both kinds share.
inline Status parse_llama_fields(FieldReader const& t, DraftConfig* c) {
  Json const& j = *t.obj;
  int layers = 0;
  SPECDEC_RETURN_IF_ERROR(t.get_int32("num_hidden_layers", 1, &layers));
  if (layers != 1) {
    return t.unsupported("num_hidden_layers", j["num_hidden_layers"],
                         c->eagle3() ? "an EAGLE-3 draft has one decoder layer (midlayer.*)"
                                     : "EAGLE-1/2 drafts run with one decoder layer (layers.0.*, "
                                       "the layout of every public EAGLE-1/2 draft)");
  }
  SPECDEC_RETURN_IF_ERROR(t.get_int32("hidden_size", 1, &c->hidden_size));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("intermediate_size", 1, &c->intermediate_size));
  SPECDEC_RETURN_IF_ERROR(t.get_int32("num_attention_heads", 1, &c->num_attention_heads));
  c->num_key_value_heads = c->num_attention_heads;
  if (!t.absent_or_null("num_key_value_heads")) {
    SPECDEC_RETURN_IF_ERROR(t.get_int32("num_key_value_heads", 1, &c->num_key_value_heads));
  }
  if (c->num_attention_heads % c->num_key_value_heads != 0) {
    return t.bad_value(
        "num_key_value_heads", j["num_key_value_heads"],
        "does not divide num_attention_heads " + std::to_string(c->num_attention_heads));
  }
  if (!t.absent_or_null("head_dim")) {
    SPECDEC_RETURN_IF_ERROR(t.get_int32("head_dim", 2, &c->head_dim));
  } else if (c->hidden_size % c->num_attention_heads != 0) {
    return t.bad_value("hidden_size", j["hidden_size"],
                       "not divisible by num_attention_heads " +
                           std::to_string(c->num_attention_heads) +
                           " and no head_dim given: write head_dim");
  } else {
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  if (c->head_dim % 2 != 0) {
    return Status::InvalidArgument(t.where("head_dim") + " = " + std::to_string(c->head_dim) +
                                   ": must be even (rope rotates the two halves of a head)");
  }
  SPECDEC_RETURN_IF_ERROR(t.get_double("rms_norm_eps", &c->rms_norm_eps));
  if (!(c->rms_norm_eps > 0.0))
    return t.bad_value("rms_norm_eps", j["rms_norm_eps"], "must be > 0");
  // The target's reading of rope_theta / rope_scaling / rope_parameters (both forms, which must
  // agree); the draft runs unscaled NeoX rope only.
  std::optional<io::YarnScaling> scaling;
  SPECDEC_RETURN_IF_ERROR(io::detail::parse_rope(t, &c->rope_theta, &scaling));
  if (scaling) {
    char const* key = t.absent_or_null("rope_scaling") ? "rope_parameters" : "rope_scaling";
    return t.unsupported(key, j[key],
                         "the draft runs unscaled NeoX rope only: no YaRN scaling");
  }
  SPECDEC_RETURN_IF_ERROR(t.get_int("max_position_embeddings", &c->max_position_embeddings));
  if (c->max_position_embeddings <= 0) {
    return t.bad_value("max_position_embeddings", j["max_position_embeddings"], "must be > 0");
  }
  SPECDEC_RETURN_IF_ERROR(t.get_int32("vocab_size", 1, &c->vocab_size));
  c->draft_vocab_size = c->vocab_size;
  c->target_hidden_size = c->hidden_size;
  if (t.has("hidden_act")) {
    std::string act;
    SPECDEC_RETURN_IF_ERROR(t.get_string("hidden_act", &act));
    if (act != "silu") {
      return t.unsupported("hidden_act", j["hidden_act"], "only \"silu\" (SwiGLU) is supported");
    }
  }
  for (char const* bias : {"attention_bias", "mlp_bias"}) {
    if (t.absent_or_null(bias)) continue;
    bool b = false;
    SPECDEC_RETURN_IF_ERROR(t.get_bool(bias, &b));
    if (b) return t.unsupported(bias, Json(true), "biases are not supported");
  }
  return Status::Ok();
}

// EAGLE-3's own fields: the draft vocabulary, the target width and the layer set.
inline Status parse_eagle3_fields(FieldReader const& t, int target_num_layers, DraftConfig* c) {
  Json const& j = *t.obj;
  if (!t.absent_or_null("draft_vocab_size")) {
    SPECDEC_RETURN_IF_ERROR(t.get_int32("draft_vocab_size", 1, &c->draft_vocab_size));
    if (c->draft_vocab_size > c->vocab_size) {
      return t.bad_value("draft_vocab_size", j["draft_vocab_size"],
                         "more than vocab_size " + std::to_string(c->vocab_size));
    }
  }
  if (!t.absent_or_null("target_hidden_size")) {
    SPECDEC_RETURN_IF_ERROR(t.get_int32("target_hidden_size", 1, &c->target_hidden_size));
  }
  return parse_eagle_config(t, target_num_layers, c);
}

// EAGLE-1/2: the EAGLE-3 fields, which this architecture does not read, must not say something
// else (a smaller draft vocabulary, other target widths, aux layers): the config would then
// contradict its own architectures.
inline Status reject_eagle3_fields(FieldReader const& t, DraftConfig const& c) {
  Json const& j = *t.obj;
  std::string const why = "is an EAGLE-3 field, and architectures names an EAGLE-1/2 draft (" +
                          c.architecture + "): ";
  for (auto [key, want] : {std::pair<char const*, int>{"draft_vocab_size", c.vocab_size},
                           std::pair<char const*, int>{"target_hidden_size", c.hidden_size}}) {
    if (t.absent_or_null(key)) continue;
    int v = 0;
    SPECDEC_RETURN_IF_ERROR(t.get_int32(key, 1, &v));
    if (v != want) {
      return t.bad_value(key, j[key],
                         why + "an EAGLE-1/2 draft has " + std::to_string(want) +
                             " (its vocab_size / hidden_size)");
    }
  }
  if (!t.absent_or_null("eagle_config")) {
    return t.unsupported("eagle_config", j["eagle_config"], why + "remove it");
  }
  return Status::Ok();
}

}  // namespace detail

// Parses config.json text of a draft for a target of `target_num_layers` layers. `source` names
// the file in every message.
inline Status parse_draft_config(std::string_view json_text, std::string_view source,
                                 int target_num_layers, DraftConfig* out) {
  using detail::FieldReader;
  using detail::Json;
  if (out == nullptr) return Status::InvalidArgument("parse_draft_config: out is null");
  if (target_num_layers < 1) {
    return Status::InvalidArgument(std::string(source) + ": target_num_layers " +
                                   std::to_string(target_num_layers) + " must be >= 1");
  }
  try {
    Json root;
    SPECDEC_RETURN_IF_ERROR(io::detail::parse_json_object(json_text, source, &root));
    DraftConfig c;
    c.source = std::string(source);
    c.target_num_layers = target_num_layers;
    FieldReader top{source, "", &root};
    std::vector<std::string> archs;
    SPECDEC_RETURN_IF_ERROR(top.get_string_list("architectures", &archs));
    bool found = false;
    for (std::string const& a : archs) {
      if (detail::is_one_of(a, {kEagle3Architecture, "Eagle3LlamaForCausalLM"})) {
        c.kind = DraftKind::kEagle3;
      } else if (detail::is_one_of(a, {kEagleArchitecture, kEagleArchitectureVllm})) {
        c.kind = DraftKind::kEagle;
      } else {
        continue;
      }
      c.architecture = a;
      found = true;
      break;
    }
    if (!found) {
      return top.unsupported("architectures", root["architectures"],
                             "not an EAGLE draft: expected \"LlamaForCausalLMEagle3\" (EAGLE-3; "
                             "or \"Eagle3LlamaForCausalLM\"), or \"LlamaForCausalLMEagle\" / "
                             "\"EagleLlamaForCausalLM\" (EAGLE-1/2)");
    }
    SPECDEC_RETURN_IF_ERROR(detail::parse_llama_fields(top, &c));
    if (c.eagle3()) {
      SPECDEC_RETURN_IF_ERROR(detail::parse_eagle3_fields(top, target_num_layers, &c));
    } else {
      SPECDEC_RETURN_IF_ERROR(detail::reject_eagle3_fields(top, c));
    }
    *out = std::move(c);
    return Status::Ok();
  } catch (std::exception const& e) {
    return Status::Internal(std::string(source) + ": " + e.what());
  }
}

// Reads `dir`/config.json (or `dir` itself when it is a file).
inline Status read_draft_config(std::string const& dir, int target_num_layers, DraftConfig* out) {
  std::string file, text;
  SPECDEC_RETURN_IF_ERROR(io::read_config_file(dir, "the draft's config", &file, &text));
  return parse_draft_config(text, file, target_num_layers, out);
}

// The draft's algorithm and layer set against the serving policy's (policy/spec_policy.hpp's
// check_draft_fits; the layer sets compared in order). A wrong algorithm reads
// "<file>: this checkpoint is an EAGLE-3 draft (architectures LlamaForCausalLMEagle3); use
// --speculative-algorithm EAGLE3: the draft checkpoint was trained as EAGLE3 ...".
inline Status check_draft_config_fits(DraftConfig const& c, DraftKind policy_kind,
                                      std::span<int const> policy_layers,
                                      std::string_view policy_what) {
  Status const s = check_draft_fits(c.kind, c.layers, policy_kind, policy_layers, policy_what);
  if (s.ok()) return s;
  if (c.kind != policy_kind) {
    return s.prefixed(
        c.source + ": this checkpoint is an " +
        (c.kind == DraftKind::kEagle3 ? std::string("EAGLE-3") : std::string("EAGLE")) +
        " draft (architectures " + c.architecture + "); use --speculative-algorithm " +
        draft_name(c.kind) + ": ");
  }
  return s.prefixed(c.source + (c.layers_from_file
                                    ? ": eagle_config.eagle_aux_hidden_state_layer_ids: "
                                    : ": the default layer ids (eagle_config has none): "));
}

// vocab_size and the hidden widths (target_hidden_size; EAGLE-1/2: hidden_size) against the
// target model.
inline Status check_draft_target(DraftConfig const& c, io::DeepseekV3Config const& target) {
  if (c.target_num_layers != target.num_hidden_layers) {
    return Status::InvalidArgument(c.source + ": parsed for a " +
                                   std::to_string(c.target_num_layers) +
                                   "-layer target, the target (" + target.source + ") has " +
                                   std::to_string(target.num_hidden_layers));
  }
  if (!c.eagle3() && c.hidden_size != target.hidden_size) {
    return Status::InvalidArgument(
        c.source + ": hidden_size " + std::to_string(c.hidden_size) +
        " != the target's hidden_size " + std::to_string(target.hidden_size) + " (" +
        target.source +
        "): an EAGLE-1/2 draft's fc reads [embedding | the target's last hidden state], both of "
        "the target's width");
  }
  if (c.vocab_size != target.vocab_size) {
    return Status::InvalidArgument(c.source + ": vocab_size " + std::to_string(c.vocab_size) +
                                   " != the target's vocab_size " +
                                   std::to_string(target.vocab_size) + " (" + target.source +
                                   "): the draft was trained for another tokenizer");
  }
  if (c.target_hidden_size != target.hidden_size) {
    return Status::InvalidArgument(c.source + ": target_hidden_size " +
                                   std::to_string(c.target_hidden_size) +
                                   " (hidden_size when absent) != the target's hidden_size " +
                                   std::to_string(target.hidden_size) + " (" + target.source +
                                   "): the draft was trained on another target");
  }
  return Status::Ok();
}

}  // namespace specdec::model::eagle
