// compressed-tensors INT4 (W4A16, "pack-quantized"): the `quantization_config` of a Hugging Face
// config.json, which modules it quantizes, and the plain-loop INT4 pack / unpack reference.
//
// Accepted quantization_config (anything else is kUnsupported naming the field):
//   quant_method "compressed-tensors", format "pack-quantized", quantization_status absent or
//   "compressed", kv_cache_scheme absent/null, exactly one config group whose
//   weights = {num_bits 4, type "int", symmetric true, strategy "group", group_size G > 0,
//   dynamic absent/false, actorder absent/null}, input_activations / output_activations
//   absent/null, targets ["Linear"]; `ignore`: exact module names and "re:" regexes.
//
// Tensor layout of one quantized Linear [out, in] (compressed-tensors pack-quantized):
//   weight_packed  int32 [out, in/8]  value v in [-8, 7] stored as v + 8; element k+i of a word
//                                     (k % 8 == 0) in bits 4i..4i+3, least significant first
//   weight_scale   bf16  [out, in/G]  one scale per row n and group k/G
//   weight_shape   int32 [2]          = [out, in]
//   W[n, k] = (nibble(n, k) - 8) * scale[n, k/G]
//
// Matching (compressed-tensors `_match_name`): an ignore entry "re:P" matches when Python's
// re.match(P, name) does, i.e. P matches a PREFIX of the name (anchored at the start, not at the
// end); here std::regex (ECMAScript) searched with match_continuous, which is exactly that. Any
// other entry matches only the identical name. Names are module names, without ".weight".
// compressed-tensors applies the list to the module tree of the model object the config was
// written for, so exact entries like "lm_head" match "lm_head" but NOT "language_model.lm_head":
// callers pass names in that scope. For Kimi-K2.5, whose list may be written for either the
// wrapper ("language_model.lm_head") or the text model ("lm_head"), io::is_int4_module in
// hf_config.hpp ignores a module when the list matches it in either scope.
#pragma once

#include <cmath>
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"

namespace specdec::io {

inline constexpr int kInt4Bits = 4;
inline constexpr int kInt4PerWord = 8;  // nibbles per int32 of weight_packed
inline constexpr int kInt4Offset = 8;   // stored nibble = value + 8
inline constexpr int kInt4Min = -8;
inline constexpr int kInt4Max = 7;

// One entry of `ignore`: an exact module name, or a regex (the text after "re:").
struct IgnoreEntry {
  std::string text;  // as written in the config, "re:" included
  bool is_regex = false;
  std::regex regex;  // compiled pattern when is_regex
};

struct QuantizationConfig {
  std::string quant_method;          // "compressed-tensors"
  std::string format;                // "pack-quantized"
  std::string group_name;            // the config_groups key, e.g. "group_0"
  int num_bits = 0;                  // 4
  std::string type;                  // "int"
  bool symmetric = false;            // true
  std::string strategy;              // "group"
  int group_size = 0;                // 32 for Kimi-K2.5
  std::vector<std::string> targets;  // ["Linear"]
  std::vector<IgnoreEntry> ignore;
};

namespace detail {

using Json = nlohmann::json;

inline std::string json_type_name(Json const& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "value";
}

// Reads typed fields of one JSON object; errors name "<source>: field '<prefix><key>'".
struct FieldReader {
  std::string_view source;
  std::string prefix;  // path of `obj` inside the file, with a trailing '.', or empty
  Json const* obj;

  std::string field(std::string_view key) const {
    return "field '" + prefix + std::string(key) + "'";
  }
  std::string where(std::string_view key) const { return std::string(source) + ": " + field(key); }
  Json const* find(std::string_view key) const {
    auto it = obj->find(std::string(key));
    return it == obj->end() ? nullptr : &*it;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  Status missing(std::string_view key) const {
    return Status::MalformedInput(where(key) + " is missing");
  }
  Status wrong_type(std::string_view key, Json const& v, char const* want) const {
    return Status::MalformedInput(where(key) + " must be " + want + ", got " + json_type_name(v) +
                                  " " + v.dump());
  }
  Status bad_value(std::string_view key, Json const& v, std::string const& why) const {
    return Status::InvalidArgument(where(key) + " = " + v.dump() + ": " + why);
  }
  Status unsupported(std::string_view key, Json const& v, std::string const& why) const {
    return Status::Unsupported(where(key) + " = " + v.dump() + ": " + why);
  }

  Status get_int(std::string_view key, int64_t* out) const {
    Json const* v = find(key);
    if (!v) return missing(key);
    if (!v->is_number_integer()) return wrong_type(key, *v, "an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
      return bad_value(key, *v, "out of range");
    }
    *out = v->get<int64_t>();
    return Status::Ok();
  }
  // An int that must fit int32 and be >= min_value.
  Status get_int32(std::string_view key, int min_value, int* out) const {
    int64_t x = 0;
    SPECDEC_RETURN_IF_ERROR(get_int(key, &x));
    if (x < min_value || x > INT32_MAX) {
      return bad_value(key, *find(key),
                       "must be in [" + std::to_string(min_value) + ", 2147483647]");
    }
    *out = static_cast<int>(x);
    return Status::Ok();
  }
  Status get_double(std::string_view key, double* out) const {
    Json const* v = find(key);
    if (!v) return missing(key);
    if (!v->is_number()) return wrong_type(key, *v, "a number");
    *out = v->get<double>();
    if (!std::isfinite(*out)) return bad_value(key, *v, "must be finite");
    return Status::Ok();
  }
  Status get_bool(std::string_view key, bool* out) const {
    Json const* v = find(key);
    if (!v) return missing(key);
    if (!v->is_boolean()) return wrong_type(key, *v, "a boolean");
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status get_string(std::string_view key, std::string* out) const {
    Json const* v = find(key);
    if (!v) return missing(key);
    if (!v->is_string()) return wrong_type(key, *v, "a string");
    *out = v->get<std::string>();
    return Status::Ok();
  }
  Status get_string_list(std::string_view key, std::vector<std::string>* out) const {
    Json const* v = find(key);
    if (!v) return missing(key);
    if (!v->is_array()) return wrong_type(key, *v, "an array of strings");
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) {
        return wrong_type(std::string(key) + "[" + std::to_string(i) + "]", (*v)[i], "a string");
      }
      out->push_back((*v)[i].get<std::string>());
    }
    return Status::Ok();
  }
  // A nested object, as a reader of its own.
  Status get_object(std::string_view key, FieldReader* out) const {
    Json const* v = find(key);
    if (!v) return missing(key);
    if (!v->is_object()) return wrong_type(key, *v, "an object");
    *out = FieldReader{source, prefix + std::string(key) + ".", v};
    return Status::Ok();
  }
  // The field is absent or null (for "must be unset" checks).
  bool absent_or_null(std::string_view key) const {
    Json const* v = find(key);
    return v == nullptr || v->is_null();
  }
};

}  // namespace detail

// Parses a `quantization_config` object. `source` names the file and `path` the object's place
// in it (e.g. "text_config.quantization_config"), both used in every error message.
inline Status parse_quantization_config(nlohmann::json const& obj, std::string_view source,
                                        std::string_view path, QuantizationConfig* out) {
  using detail::FieldReader;
  using detail::Json;
  if (out == nullptr) return Status::InvalidArgument("parse_quantization_config: out is null");
  std::string const prefix = path.empty() ? std::string() : std::string(path) + ".";
  if (!obj.is_object()) {
    return Status::MalformedInput(std::string(source) + ": field '" + std::string(path) +
                                  "' must be an object, got " + detail::json_type_name(obj));
  }
  try {
    FieldReader r{source, prefix, &obj};
    QuantizationConfig q;
    SPECDEC_RETURN_IF_ERROR(r.get_string("quant_method", &q.quant_method));
    if (q.quant_method != "compressed-tensors") {
      return r.unsupported("quant_method", obj["quant_method"],
                           "only \"compressed-tensors\" (pack-quantized INT4) is supported");
    }
    SPECDEC_RETURN_IF_ERROR(r.get_string("format", &q.format));
    if (q.format != "pack-quantized") {
      return r.unsupported("format", obj["format"], "only \"pack-quantized\" is supported");
    }
    if (r.has("quantization_status")) {
      std::string status;
      SPECDEC_RETURN_IF_ERROR(r.get_string("quantization_status", &status));
      if (status != "compressed") {
        return r.unsupported("quantization_status", obj["quantization_status"],
                             "only \"compressed\" checkpoints are supported");
      }
    }
    if (!r.absent_or_null("kv_cache_scheme")) {
      return r.unsupported("kv_cache_scheme", obj["kv_cache_scheme"],
                           "a quantized KV cache is not supported");
    }
    FieldReader groups;
    SPECDEC_RETURN_IF_ERROR(r.get_object("config_groups", &groups));
    if (groups.obj->size() != 1) {
      return r.unsupported("config_groups", Json(groups.obj->size()),
                           "exactly one config group is supported (this is the group count)");
    }
    q.group_name = groups.obj->begin().key();
    FieldReader g;
    SPECDEC_RETURN_IF_ERROR(groups.get_object(q.group_name, &g));
    if (g.has("format")) {
      std::string group_format;
      SPECDEC_RETURN_IF_ERROR(g.get_string("format", &group_format));
      if (group_format != "pack-quantized") {
        return g.unsupported("format", (*g.obj)["format"], "only \"pack-quantized\" is supported");
      }
    }
    SPECDEC_RETURN_IF_ERROR(g.get_string_list("targets", &q.targets));
    if (q.targets != std::vector<std::string>{"Linear"}) {
      return g.unsupported("targets", (*g.obj)["targets"], "only [\"Linear\"] is supported");
    }
    for (char const* act : {"input_activations", "output_activations"}) {
      if (!g.absent_or_null(act)) {
        return g.unsupported(act, (*g.obj)[act],
                             "activation quantization is not supported (W4A16 only)");
      }
    }
    FieldReader w;
    SPECDEC_RETURN_IF_ERROR(g.get_object("weights", &w));
    Json const& wj = *w.obj;
    SPECDEC_RETURN_IF_ERROR(w.get_int32("num_bits", 1, &q.num_bits));
    if (q.num_bits != kInt4Bits)
      return w.unsupported("num_bits", wj["num_bits"], "only 4 is supported");
    SPECDEC_RETURN_IF_ERROR(w.get_string("type", &q.type));
    if (q.type != "int") return w.unsupported("type", wj["type"], "only \"int\" is supported");
    SPECDEC_RETURN_IF_ERROR(w.get_bool("symmetric", &q.symmetric));
    if (!q.symmetric) {
      return w.unsupported("symmetric", wj["symmetric"],
                           "asymmetric (zero-point) INT4 is not supported");
    }
    SPECDEC_RETURN_IF_ERROR(w.get_string("strategy", &q.strategy));
    if (q.strategy != "group") {
      return w.unsupported("strategy", wj["strategy"], "only \"group\" is supported");
    }
    SPECDEC_RETURN_IF_ERROR(w.get_int32("group_size", 1, &q.group_size));
    if (w.has("dynamic")) {
      bool dynamic = false;
      SPECDEC_RETURN_IF_ERROR(w.get_bool("dynamic", &dynamic));
      if (dynamic)
        return w.unsupported("dynamic", wj["dynamic"], "only static scales are supported");
    }
    if (!w.absent_or_null("actorder")) {
      return w.unsupported("actorder", wj["actorder"],
                           "activation ordering (weight_g_idx) is not supported");
    }
    std::vector<std::string> ignore;
    if (r.has("ignore")) SPECDEC_RETURN_IF_ERROR(r.get_string_list("ignore", &ignore));
    for (size_t i = 0; i < ignore.size(); ++i) {
      IgnoreEntry e;
      e.text = ignore[i];
      if (e.text.rfind("re:", 0) == 0) {
        e.is_regex = true;
        try {
          e.regex = std::regex(e.text.substr(3), std::regex::ECMAScript);
        } catch (std::regex_error const& err) {
          return Status::MalformedInput(r.where("ignore[" + std::to_string(i) + "]") + " = \"" +
                                        e.text + "\": not a valid regex (" + err.what() + ")");
        }
      }
      q.ignore.push_back(std::move(e));
    }
    *out = std::move(q);
    return Status::Ok();
  } catch (std::exception const& e) {
    return Status::Internal(std::string(source) + ": reading '" + std::string(path) +
                            "': " + e.what());
  }
}

// True when `module_name` (e.g. "model.layers.3.mlp.experts.17.down_proj", no ".weight") is an
// INT4 Linear under `config`: no ignore entry matches it (see the matching rule at the top).
// The caller knows the module is a Linear (the only target); non-Linear modules (norms,
// embeddings, the router gate's bias) are never quantized whatever this returns.
inline bool is_quantized(QuantizationConfig const& config, std::string_view module_name) {
  std::string const name(module_name);
  for (IgnoreEntry const& e : config.ignore) {
    if (e.is_regex) {
      if (std::regex_search(name, e.regex, std::regex_constants::match_continuous)) return false;
    } else if (e.text == name) {
      return false;
    }
  }
  return true;
}

namespace detail {

inline Status check_int4_shape(char const* fn, void const* a, void const* b, void const* c,
                               int64_t out, int64_t in, int64_t group) {
  std::string const f = std::string(fn) + ": ";
  if (!a || !b || !c) return Status::InvalidArgument(f + "null pointer argument");
  if (out <= 0 || in <= 0) {
    return Status::InvalidArgument(f + "shape [" + std::to_string(out) + ", " + std::to_string(in) +
                                   "] must be positive");
  }
  if (group <= 0) {
    return Status::InvalidArgument(f + "group size " + std::to_string(group) + " must be > 0");
  }
  if (in % kInt4PerWord != 0) {
    return Status::InvalidArgument(f + "in = " + std::to_string(in) +
                                   " is not a multiple of 8 (8 INT4 values per int32 word)");
  }
  if (in % group != 0) {
    return Status::InvalidArgument(f + "in = " + std::to_string(in) +
                                   " is not a multiple of the group size " + std::to_string(group));
  }
  return Status::Ok();
}

}  // namespace detail

// W [out, in] (row-major float) = unpack(packed [out, in/8]) * scale [out, in/group] (bf16 bits).
inline Status dequantize_int4_group(int32_t const* packed, uint16_t const* scale_bits, int64_t out,
                                    int64_t in, int64_t group, float* W) {
  SPECDEC_RETURN_IF_ERROR(
      detail::check_int4_shape("dequantize_int4_group", packed, scale_bits, W, out, in, group));
  int64_t const words = in / kInt4PerWord, groups = in / group;
  for (int64_t n = 0; n < out; ++n) {
    for (int64_t k = 0; k < in; ++k) {
      uint32_t const word = static_cast<uint32_t>(packed[n * words + k / kInt4PerWord]);
      int const shift = kInt4Bits * static_cast<int>(k % kInt4PerWord);
      int const q = static_cast<int>((word >> shift) & 0xFu) - kInt4Offset;
      W[n * in + k] = static_cast<float>(q) * bf16_to_float(scale_bits[n * groups + k / group]);
    }
  }
  return Status::Ok();
}

// The inverse, for writing INT4 checkpoints: per (row n, group g) scale = max|W| / 7 rounded to
// bf16; q = nearest integer to W / scale (ties to even, like torch.round), clamped to [-8, 7]
// (q = 0 where the scale is 0). Dequantizing gives |W - W'| <= scale / 2 except where the bf16
// rounding of the scale pushed |W| / scale above 7.5, which the clamp bounds by |W| - 7*scale.
// Non-finite W is an error naming the element.
inline Status quantize_int4_group(float const* W, int64_t out, int64_t in, int64_t group,
                                  int32_t* packed, uint16_t* scale_bits) {
  SPECDEC_RETURN_IF_ERROR(
      detail::check_int4_shape("quantize_int4_group", W, packed, scale_bits, out, in, group));
  int64_t const words = in / kInt4PerWord, groups = in / group;
  for (int64_t n = 0; n < out; ++n) {
    for (int64_t k = 0; k < in; ++k) {
      if (!std::isfinite(W[n * in + k])) {
        return Status::InvalidArgument("quantize_int4_group: W[" + std::to_string(n) + ", " +
                                       std::to_string(k) + "] is not finite");
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0.0f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k)
        amax = std::fmax(amax, std::fabs(W[n * in + k]));
      scale_bits[n * groups + g] = float_to_bf16(amax / static_cast<float>(kInt4Max));
    }
    for (int64_t w = 0; w < words; ++w) {
      uint32_t word = 0;
      for (int i = 0; i < kInt4PerWord; ++i) {
        int64_t const k = w * kInt4PerWord + i;
        float const scale = bf16_to_float(scale_bits[n * groups + k / group]);
        float q = scale > 0.0f ? std::nearbyint(W[n * in + k] / scale) : 0.0f;
        q = std::fmin(std::fmax(q, static_cast<float>(kInt4Min)), static_cast<float>(kInt4Max));
        uint32_t const nibble = static_cast<uint32_t>(static_cast<int>(q) + kInt4Offset);
        word |= nibble << (kInt4Bits * i);
      }
      packed[n * words + w] = static_cast<int32_t>(word);
    }
  }
  return Status::Ok();
}

}  // namespace specdec::io
