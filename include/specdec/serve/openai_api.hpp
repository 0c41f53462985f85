// The OpenAI- and SGLang-compatible HTTP API as pure functions (no sockets, no engine types):
// request bodies parsed and validated into a ParsedRequest, response and streaming-chunk JSON
// built, and stop strings matched over streamed text.
//
//   parse_completions(body, default_max_tokens, &req)       POST /v1/completions
//   parse_chat_completions(body, default_max_tokens, &req)  POST /v1/chat/completions
//   parse_generate(body, &req)                              POST /generate (SGLang)
//       body: the request's JSON text. Returns nullopt and fills *req, or an ApiError (HTTP
//       status, OpenAI error type, a message naming the field, its value and the allowed range
//       or the fix, and param = the field's path such as "messages[2].content") and leaves *req
//       untouched. Unknown fields are ignored (as OpenAI's clients expect) and named in
//       req.ignored_fields by their paths ("user", "sampling_params.foo", "messages[].name"),
//       for the server to report; known fields this server cannot honour (echo,
//       logprobs, best_of > 1, suffix, tools, penalties, vLLM's min_tokens, guided_* and
//       skip_special_tokens false, ...) are refused with 400 when given a value other than their
//       default, never dropped; so are /generate's sampling fields outside sampling_params (and
//       OpenAI's max_tokens inside it), an empty model or rid (it would read as not given), and
//       numbers past the double range or too small for a float. JSON null means "not given" for
//       every optional field, as in OpenAI's API.
//   Request shapes:
//       prompt (completions)   a string | [token ids] | [one string] | [[token ids]] (one prompt)
//       messages (chat)        >= 1 {role: system|user|assistant|tool|developer,
//                              content: string | [{"type": "text", "text": string}, ...]}
//       text | input_ids       (generate) exactly one; a string / [token ids], no batches
//       token ids              integers in [0, 2^31 - 1]; the vocabulary is the server's check
//       integers               JSON numbers with no fractional part (128 or 128.0, not 2.5)
//       temperature            0 (greedy) or in [ops::kSampleMinTemperature = 1e-6, 2]
//   Sampling defaults (SamplingFields): max_tokens = the caller's default_max_tokens (OpenAI) or
//   128 (SGLang's max_new_tokens), temperature 1, top_p 1, top_k -1 (off), no seed, no stop
//   strings or ids, ignore_eos false, n 1 (the only value served).
//
//   check_vocabulary(req, vocab_size)   the ids a parsed request gave (prompt, stop_token_ids)
//                                        outside [0, vocab_size): a 400 naming the element
//
//   usage_json, completion_response, completion_chunk, chat_response, chat_chunk, usage_chunk,
//   models_response   OpenAI's response objects, field for field (see each builder)
//   sse_data(json)    "data: <compact JSON>\n\n";  sse_done()  "data: [DONE]\n\n"
//   dump_json(json)   compact JSON text that never throws (invalid UTF-8 becomes U+FFFD)
//
//   StopStringMatcher(stops)   feed(delta, &stopped) returns the streamed text that is safe to
//                              send: everything before the stop string that completes first
//                              (the stop string itself is never sent, as in OpenAI's API), with
//                              the longest tail that could still start a stop string held back;
//                              flush() returns that tail when generation ends without a stop.
//                              Byte-wise; stop strings may span any number of feeds, and the
//                              result does not depend on how the text was cut into feeds.
//                              "Completes first": generation stops at the first byte that ends
//                              an occurrence (ties: the earliest start). This is the earliest
//                              occurrence except where a stop string lies strictly inside a
//                              longer one's occurrence (stops "c" and "abcd" on "abcd" stop at
//                              "c", emitting "ab": the stream cannot wait for the "d").
// The parsers never throw (JSON errors become ApiErrors, an allocation failure a 500 ApiError);
// the builders, dump_json and StopStringMatcher throw nothing but std::bad_alloc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/ops/sample/params.hpp"

namespace specdec::serve {

// An HTTP error in OpenAI's shape. param is the path of the offending field ("" when the request
// as a whole is at fault); code is OpenAI's machine-readable code ("" for none).
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;
  std::string code;

  // {"object": "error", "error": {"message", "type", "param" (null when empty), "code" (null
  // when empty)}}
  nlohmann::json body() const {
    nlohmann::json const param_json =
        param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    nlohmann::json const code_json = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
    return {{"object", "error"},
            {"error",
             {{"message", message}, {"type", type}, {"param", param_json}, {"code", code_json}}}};
  }
};

// The sampling part of a request, every field validated.
struct SamplingFields {
  int max_tokens = 16;            // >= 1: tokens to generate at most (OpenAI's completions default)
  float temperature = 1.0f;       // 0 (greedy) or [1e-6, 2]
  float top_p = 1.0f;             // (0, 1]; 1: no top-p
  int32_t top_k = -1;             // -1 or 0: no top-k; else >= 1 (kept as given)
  std::optional<uint64_t> seed;   // absent: the server picks one
  std::vector<std::string> stop;  // <= 16 non-empty stop strings
  std::vector<int32_t> stop_token_ids;  // further ids that end generation (SGLang / vLLM)
  bool ignore_eos = false;              // true: do not stop at the model's eos ids
  bool max_tokens_given = false;        // max_tokens came from the request, not the default
};

enum class Endpoint { kCompletions, kChatCompletions, kGenerate };

inline char const* endpoint_name(Endpoint e) {
  switch (e) {
    case Endpoint::kCompletions:
      return "/v1/completions";
    case Endpoint::kChatCompletions:
      return "/v1/chat/completions";
    case Endpoint::kGenerate:
      return "/generate";
  }
  return "unknown";
}

// One chat message; content is the concatenation of its text parts.
struct Message {
  std::string role;  // system | user | assistant | tool | developer
  std::string content;
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                               // "" when not given (always for /generate)
  std::optional<std::string> prompt_text;          // completions / generate: a non-empty text,
  std::optional<std::vector<int32_t>> prompt_ids;  // or >= 1 token ids (exactly one is set)
  std::string prompt_ids_path;  // where the ids were: "prompt", "prompt[0]" or "input_ids"
  std::vector<Message> messages;                   // chat: >= 1
  SamplingFields sampling;
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage (only with stream)
  std::optional<std::string> rid;  // /generate's request id
  // Fields no rule of the endpoint reads (a typo such as "max_token", or a field OpenAI's
  // clients send that changes nothing here, such as "user"), by path in key order: at the top
  // level and inside every object a rule reads fields of ("sampling_params.foo"; an array's
  // elements as "messages[].name"). Served as if absent, listed so the server can say so.
  std::vector<std::string> ignored_fields;
};

namespace detail {

using nlohmann::json;

inline constexpr size_t kMaxStopStrings = 16;
inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Bytes outside printable ASCII as \xNN, so a message is valid UTF-8 whatever it quotes.
inline std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

// A value as it appears in an error message: compact JSON, cut at 80 bytes.
inline std::string shown(json const& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

inline std::string path_of(std::string const& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
}

inline std::string indexed(std::string const& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

inline ApiError invalid(std::string message, std::string param) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

inline ApiError missing(std::string const& path, std::string_view what) {
  return invalid("'" + path + "' is required (" + std::string(what) + ")", path);
}

inline ApiError wrong_type(std::string const& path, std::string_view want, json const& got) {
  ApiError e =
      invalid("'" + path + "' must be " + std::string(want) + ", got " + got.type_name(), path);
  e.code = "invalid_type";
  return e;
}

inline ApiError out_of_range(std::string const& path, std::string_view allowed, json const& got) {
  ApiError e =
      invalid("'" + path + "' must be " + std::string(allowed) + ", got " + shown(got), path);
  e.code = "invalid_value";
  return e;
}

inline ApiError unsupported(std::string const& path, json const& got, std::string_view fix) {
  ApiError e = invalid("'" + path + "' = " + shown(got) + " is not supported by this server (" +
                           std::string(fix) + ")",
                       path);
  e.code = "unsupported_parameter";
  return e;
}

// The (object, key) pairs field() was asked for while a parse runs on this thread
// (with_json_object): the other keys of those objects and of the top level are
// ParsedRequest::ignored_fields.
using FieldRead = std::pair<json const*, std::string>;
using FieldReads = std::vector<FieldRead>;
inline thread_local FieldReads* field_reads = nullptr;
// FieldReads' order: by object (std::less: a total order on pointers), then key.
inline bool read_before(FieldRead const& a, FieldRead const& b) {
  if (a.first != b.first) return std::less<json const*>{}(a.first, b.first);
  return a.second < b.second;
}

// The field `key` of `obj`, or nullptr when it is absent or null.
inline json const* field(json const& obj, std::string_view key) {
  if (field_reads != nullptr) field_reads->emplace_back(&obj, key);
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// A JSON number with a fractional part where an integer belongs (2.5 for max_tokens).
inline std::optional<ApiError> not_whole(json const& v, double d, std::string const& path) {
  if (!std::isfinite(d) || std::floor(d) == d) return std::nullopt;
  ApiError e = invalid("'" + path + "' must be an integer, got number " + shown(v), path);
  e.code = "invalid_type";
  return e;
}

// A whole number in [lo, hi] (hi <= 2^53 so doubles compare exactly). `allowed` describes the
// range for the message.
inline std::optional<ApiError> read_integer(json const& v, std::string const& path, int64_t lo,
                                            int64_t hi, std::string_view allowed, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t const u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo))) {
      return out_of_range(path, allowed, v);
    }
    *out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    int64_t const s = v.get<int64_t>();
    if (s < lo || s > hi) return out_of_range(path, allowed, v);
    *out = s;
    return std::nullopt;
  }
  if (v.is_number_float()) {
    double const d = v.get<double>();
    if (auto e = not_whole(v, d, path)) return e;
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi))) {
      return out_of_range(path, allowed, v);
    }
    *out = static_cast<int64_t>(d);
    return std::nullopt;
  }
  return wrong_type(path, "an integer", v);
}

inline std::optional<ApiError> read_int(json const& obj, std::string const& prefix,
                                        std::string_view key, int64_t lo, int64_t hi,
                                        std::string_view allowed, int* out) {
  json const* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  int64_t x = 0;
  if (auto e = read_integer(*v, path_of(prefix, key), lo, hi, allowed, &x)) return e;
  *out = static_cast<int>(x);
  return std::nullopt;
}

// A seed: a whole number in [0, 2^64 - 1].
inline std::optional<ApiError> read_seed(json const& v, std::string const& path, uint64_t* out) {
  constexpr std::string_view kAllowed = "an integer between 0 and 18446744073709551615";
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    int64_t const s = v.get<int64_t>();
    if (s < 0) return out_of_range(path, kAllowed, v);
    *out = static_cast<uint64_t>(s);
    return std::nullopt;
  }
  if (v.is_number_float()) {
    double const d = v.get<double>();
    if (auto e = not_whole(v, d, path)) return e;
    if (!(d >= 0.0 && d < 18446744073709551616.0)) return out_of_range(path, kAllowed, v);
    *out = static_cast<uint64_t>(d);
    return std::nullopt;
  }
  return wrong_type(path, "an integer", v);
}

inline std::optional<ApiError> read_bool(json const& obj, std::string const& prefix,
                                         std::string_view key, bool* out) {
  json const* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return wrong_type(path_of(prefix, key), "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

inline std::optional<ApiError> read_string(json const& obj, std::string const& prefix,
                                           std::string_view key, std::string* out) {
  json const* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return wrong_type(path_of(prefix, key), "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

// A number in [lo, hi], or in (lo, hi] when `open_low`.
inline std::optional<ApiError> read_float(json const& obj, std::string const& prefix,
                                          std::string_view key, double lo, bool open_low, double hi,
                                          std::string_view allowed, float* out) {
  json const* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  std::string const path = path_of(prefix, key);
  if (!v->is_number()) return wrong_type(path, "a number", *v);
  double const d = v->get<double>();
  bool const low_ok = open_low ? d > lo : d >= lo;
  if (!(low_ok && d <= hi)) return out_of_range(path, allowed, *v);
  float const f = static_cast<float>(d);
  if (f == 0.0f && d != 0.0) {  // below the smallest float: it would be read as 0
    return out_of_range(path, std::string(allowed) + " that a 32-bit float can hold", *v);
  }
  *out = f;
  return std::nullopt;
}

// Token ids: a non-empty array of integers in [0, 2^31 - 1].
inline std::optional<ApiError> read_ids(json const& v, std::string const& path, bool allow_empty,
                                        std::vector<int32_t>* out) {
  if (!v.is_array()) return wrong_type(path, "an array of token ids", v);
  if (v.empty() && !allow_empty) {
    return invalid("'" + path + "' is an empty array: give at least one token id", path);
  }
  out->clear();
  out->reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t id = 0;
    std::string const at = indexed(path, i);
    if (!v[i].is_number()) return wrong_type(at, "an integer (a token id)", v[i]);
    if (auto e = read_integer(v[i], at, 0, kInt32Max, "a token id between 0 and 2147483647", &id)) {
      return e;
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

// stop: a non-empty string or an array of at most 16 non-empty strings.
inline std::optional<ApiError> read_stop(json const& obj, std::string const& prefix,
                                         std::vector<std::string>* out) {
  json const* v = field(obj, "stop");
  if (v == nullptr) return std::nullopt;
  std::string const path = path_of(prefix, "stop");
  auto const one = [&](json const& s, std::string const& at) -> std::optional<ApiError> {
    if (!s.is_string()) return wrong_type(at, "a string", s);
    if (s.get_ref<std::string const&>().empty()) {
      return invalid("'" + at + "' is an empty string: stop strings must be non-empty", at);
    }
    out->push_back(s.get<std::string>());
    return std::nullopt;
  };
  out->clear();
  if (v->is_string()) return one(*v, path);
  if (!v->is_array()) return wrong_type(path, "a string or an array of strings", *v);
  if (v->size() > kMaxStopStrings) {
    return invalid("'" + path + "' holds " + std::to_string(v->size()) + " stop strings; at most " +
                       std::to_string(kMaxStopStrings) + " are allowed",
                   path);
  }
  for (size_t i = 0; i < v->size(); ++i) {
    if (auto e = one((*v)[i], indexed(path, i))) return e;
  }
  return std::nullopt;
}

// temperature, top_p, top_k, stop, stop_token_ids, ignore_eos, n: named the same in OpenAI's
// body and in SGLang's sampling_params (`prefix` is "" or "sampling_params").
inline std::optional<ApiError> read_common_sampling(json const& obj, std::string const& prefix,
                                                    SamplingFields* s) {
  std::string const temperatures =
      "0 (greedy) or a number between " + float_text(ops::kSampleMinTemperature) + " and 2";
  if (auto e = read_float(obj, prefix, "temperature", 0.0, false, 2.0, temperatures,
                          &s->temperature)) {
    return e;
  }
  if (s->temperature > 0.0f && s->temperature < ops::kSampleMinTemperature) {
    return out_of_range(path_of(prefix, "temperature"), temperatures,
                        *field(obj, "temperature"));
  }
  if (auto e = read_float(obj, prefix, "top_p", 0.0, true, 1.0,
                          "a number greater than 0 and at most 1 (1: no top-p)", &s->top_p)) {
    return e;
  }
  int top_k = s->top_k;
  if (auto e = read_int(obj, prefix, "top_k", -1, kInt32Max,
                        "-1 or 0 (no top-k) or an integer between 1 and 2147483647", &top_k)) {
    return e;
  }
  s->top_k = top_k;
  if (auto e = read_stop(obj, prefix, &s->stop)) return e;
  if (json const* v = field(obj, "stop_token_ids")) {
    if (auto e = read_ids(*v, path_of(prefix, "stop_token_ids"), true, &s->stop_token_ids)) {
      return e;
    }
  }
  if (auto e = read_bool(obj, prefix, "ignore_eos", &s->ignore_eos)) return e;
  if (json const* v = field(obj, "n")) {
    std::string const path = path_of(prefix, "n");
    if (!v->is_number()) return wrong_type(path, "an integer", *v);
    if (v->get<double>() != 1.0) {
      ApiError e = invalid("'" + path + "' = " + shown(*v) +
                               " is not supported: only 1 is supported (one choice per request; "
                               "send several requests for several choices)",
                           path);
      e.code = "unsupported_value";
      return e;
    }
  }
  return std::nullopt;
}

// A known field this server does not implement: fine when absent, null or `is_default`.
using DefaultTest = bool (*)(json const&);
inline bool is_false(json const& v) { return v.is_boolean() && !v.get<bool>(); }
inline bool is_true(json const& v) { return v.is_boolean() && v.get<bool>(); }
inline bool is_zero(json const& v) { return v.is_number() && v.get<double>() == 0.0; }
inline bool is_one(json const& v) { return v.is_number() && v.get<double>() == 1.0; }
inline bool is_empty(json const& v) {
  return (v.is_array() || v.is_object() || v.is_string()) && v.empty();
}
inline bool is_empty_string(json const& v) {
  return v.is_string() && v.get_ref<std::string const&>().empty();
}
inline bool is_none(json const& v) { return v.is_string() && v.get<std::string>() == "none"; }
inline bool is_text_format(json const& v) {
  if (!v.is_object()) return false;
  auto it = v.find("type");
  return it != v.end() && it->is_string() && it->get<std::string>() == "text";
}

struct UnsupportedField {
  std::string_view key;
  DefaultTest is_default;
  std::string_view fix;
};

inline std::optional<ApiError> reject_unsupported(json const& obj, std::string const& prefix,
                                                  std::initializer_list<UnsupportedField> fields) {
  for (auto const& f : fields) {
    json const* v = field(obj, f.key);
    if (v != nullptr && !f.is_default(*v)) return unsupported(path_of(prefix, f.key), *v, f.fix);
  }
  return std::nullopt;
}

// Penalties and constraints that OpenAI, vLLM and SGLang all spell the same way.
inline std::optional<ApiError> reject_penalties(json const& obj, std::string const& prefix) {
  return reject_unsupported(
      obj, prefix,
      {{"frequency_penalty", is_zero, "leave it out or set it to 0"},
       {"presence_penalty", is_zero, "leave it out or set it to 0"},
       {"repetition_penalty", is_one, "leave it out or set it to 1"},
       {"min_p", is_zero, "leave it out or set it to 0"},
       {"logit_bias", is_empty, "leave it out"},
       {"include_stop_str_in_output", is_false, "leave it out or set it to false"},
       {"no_stop_trim", is_false, "leave it out or set it to false"}});
}

// vLLM's extensions of OpenAI's two endpoints that this server does not honour.
inline std::optional<ApiError> reject_vllm_extras(json const& obj) {
  return reject_unsupported(
      obj, "",
      {{"min_tokens", is_zero, "leave it out or set it to 0"},
       {"use_beam_search", is_false, "leave it out or set it to false"},
       {"guided_json", is_empty, "leave it out: no constrained decoding"},
       {"guided_regex", is_empty_string, "leave it out: no constrained decoding"},
       {"guided_choice", is_empty, "leave it out: no constrained decoding"},
       {"guided_grammar", is_empty_string, "leave it out: no constrained decoding"},
       {"skip_special_tokens", is_true,
        "leave it out or set it to true: the text never holds special tokens"}});
}

// A string that is absent, null, or not empty (an empty one would read as "not given").
inline std::optional<ApiError> read_nonempty_string(json const& obj, std::string_view key,
                                                    std::string_view fix, std::string* out) {
  json const* v = field(obj, key);
  if (v != nullptr && v->is_string() && v->get_ref<std::string const&>().empty()) {
    std::string const path(key);
    return invalid("'" + path + "' is an empty string: " + std::string(fix), path);
  }
  return read_string(obj, "", key, out);
}

// model: an optional, non-empty string.
inline std::optional<ApiError> read_model(json const& obj, std::string* model) {
  return read_nonempty_string(obj, "model", "leave it out or name the served model", model);
}

// stream (bool) and stream_options {include_usage: bool}, the latter only with stream = true.
inline std::optional<ApiError> read_stream(json const& obj, ParsedRequest* r) {
  if (auto e = read_bool(obj, "", "stream", &r->stream)) return e;
  json const* options = field(obj, "stream_options");
  if (options == nullptr) return std::nullopt;
  if (!options->is_object()) return wrong_type("stream_options", "an object", *options);
  if (!r->stream) {
    return invalid(
        "'stream_options' is only allowed with 'stream': true (set stream or leave it out)",
        "stream_options");
  }
  return read_bool(*options, "stream_options", "include_usage", &r->include_usage);
}

inline std::optional<ApiError> read_max_tokens(json const& obj, std::string const& prefix,
                                               std::string_view key, int* out) {
  return read_int(obj, prefix, key, 1, kInt32Max, "an integer between 1 and 2147483647", out);
}

inline std::optional<ApiError> read_optional_seed(json const& obj, std::string const& prefix,
                                                  std::string_view key,
                                                  std::optional<uint64_t>* out) {
  json const* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  uint64_t seed = 0;
  if (auto e = read_seed(*v, path_of(prefix, key), &seed)) return e;
  *out = seed;
  return std::nullopt;
}

// A prompt text: a non-empty string.
inline std::optional<ApiError> read_prompt_text(json const& v, std::string const& path,
                                                std::optional<std::string>* out) {
  if (v.get_ref<std::string const&>().empty()) {
    return invalid("'" + path + "' is an empty string: give some text or token ids", path);
  }
  *out = v.get<std::string>();
  return std::nullopt;
}

// Completions' prompt: a string, [ids], [string] or [[ids]].
inline std::optional<ApiError> read_completions_prompt(json const& v, ParsedRequest* r) {
  constexpr std::string_view kWant = "a string or an array of token ids";
  if (v.is_string()) return read_prompt_text(v, "prompt", &r->prompt_text);
  if (!v.is_array()) return wrong_type("prompt", kWant, v);
  if (v.empty()) {
    return invalid("'prompt' is an empty array: give some text or token ids", "prompt");
  }
  json const& first = v[0];
  if (first.is_number()) {
    std::vector<int32_t> ids;
    if (auto e = read_ids(v, "prompt", false, &ids)) return e;
    r->prompt_ids = std::move(ids);
    r->prompt_ids_path = "prompt";
    return std::nullopt;
  }
  if (!first.is_string() && !first.is_array()) {
    return wrong_type("prompt[0]", "a token id, a string or an array of token ids", first);
  }
  if (v.size() > 1) {
    return invalid("'prompt' holds " + std::to_string(v.size()) +
                       " prompts; this server takes one prompt per request (send them as "
                       "separate requests)",
                   "prompt");
  }
  if (first.is_string()) return read_prompt_text(first, "prompt[0]", &r->prompt_text);
  std::vector<int32_t> ids;
  if (auto e = read_ids(first, "prompt[0]", false, &ids)) return e;
  r->prompt_ids = std::move(ids);
  r->prompt_ids_path = "prompt[0]";
  return std::nullopt;
}

// Chat messages: >= 1 {role, content: string | [text parts]}.
inline std::optional<ApiError> read_messages(json const& obj, std::vector<Message>* out) {
  json const* v = field(obj, "messages");
  if (v == nullptr) return missing("messages", "a non-empty array of {role, content} objects");
  if (!v->is_array()) return wrong_type("messages", "an array of messages", *v);
  if (v->empty()) return invalid("'messages' is empty: give at least one message", "messages");
  out->clear();
  for (size_t i = 0; i < v->size(); ++i) {
    json const& m = (*v)[i];
    std::string const at = indexed("messages", i);
    if (!m.is_object()) return wrong_type(at, "an object with role and content", m);
    Message msg;
    json const* role = field(m, "role");
    if (role == nullptr) {
      return missing(at + ".role", "one of system, user, assistant, tool, developer");
    }
    if (!role->is_string()) return wrong_type(at + ".role", "a string", *role);
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool" && msg.role != "developer") {
      return out_of_range(at + ".role", "one of system, user, assistant, tool, developer", *role);
    }
    if (json const* calls = field(m, "tool_calls"); calls != nullptr && !is_empty(*calls)) {
      return unsupported(at + ".tool_calls", *calls,
                         "leave it out: this server does not call tools");
    }
    json const* content = field(m, "content");
    std::string const content_at = at + ".content";
    if (content == nullptr) return missing(content_at, "a string or an array of text parts");
    if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        json const& part = (*content)[j];
        std::string const part_at = indexed(content_at, j);
        if (!part.is_object()) return wrong_type(part_at, "an object {type, text}", part);
        json const* type = field(part, "type");
        if (type == nullptr) return missing(part_at + ".type", "\"text\"");
        if (!type->is_string()) return wrong_type(part_at + ".type", "a string", *type);
        if (type->get<std::string>() != "text") {
          ApiError e = invalid("'" + part_at + ".type' = " + shown(*type) +
                                   " is not supported: this server takes text only (send "
                                   "{\"type\": \"text\", \"text\": ...} parts)",
                               part_at + ".type");
          e.code = "unsupported_value";
          return e;
        }
        json const* text = field(part, "text");
        if (text == nullptr) return missing(part_at + ".text", "a string");
        if (!text->is_string()) return wrong_type(part_at + ".text", "a string", *text);
        msg.content += text->get_ref<std::string const&>();
      }
    } else {
      return wrong_type(content_at, "a string or an array of content parts", *content);
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

// The keys no rule read, by path (ParsedRequest::ignored_fields), under `v` at `path`: an
// object's unread keys where it is the top level or a rule read any of its fields, and the
// values of the keys read, searched the same way. reads: sorted by read_before.
inline void collect_ignored(json const& v, std::string const& path, bool top,
                            FieldReads const& reads, std::vector<std::string>* out) {
  if (v.is_array()) {
    for (json const& e : v) collect_ignored(e, path + "[]", false, reads, out);
    return;
  }
  if (!v.is_object()) return;
  auto const first = std::lower_bound(reads.begin(), reads.end(), FieldRead{&v, ""}, read_before);
  bool const inspected = top || (first != reads.end() && first->first == &v);
  if (!inspected) return;
  for (auto const& [key, value] : v.items()) {
    std::string const at = path_of(path, key);
    if (std::binary_search(first, reads.end(), FieldRead{&v, key}, read_before)) {
      collect_ignored(value, at, false, reads, out);
    } else if (std::find(out->begin(), out->end(), at) == out->end()) {  // once per path
      out->push_back(at);
    }
  }
}

// Parses `body` as a JSON object and runs `fn` on it (which fills *out on success; then the
// fields `fn` never asked field() for are added to out->ignored_fields: collect_ignored); every
// exception stops here.
template <class Fn>
std::optional<ApiError> with_json_object(std::string_view body, ParsedRequest* out, Fn&& fn) {
  try {
    json j;
    try {
      j = json::parse(body.begin(), body.end());
    } catch (json::parse_error const& e) {
      return invalid("malformed JSON: " + printable(e.what()), "");
    } catch (json::out_of_range const& e) {  // a number past the double range, such as 1e400
      return invalid("malformed JSON: " + printable(e.what()), "");
    }
    if (!j.is_object()) {
      return invalid(std::string("the request body must be a JSON object, got ") + j.type_name(),
                     "");
    }
    FieldReads reads;
    field_reads = &reads;
    struct Unset {
      ~Unset() { field_reads = nullptr; }
    } const unset;
    std::optional<ApiError> e = fn(j);
    if (!e) {  // fn filled *out
      std::sort(reads.begin(), reads.end(), read_before);
      collect_ignored(j, "", true, reads, &out->ignored_fields);
    }
    return e;
  } catch (std::exception const& e) {
    return ApiError{500, "server_error",
                    "internal error while reading the request: " + printable(e.what()), "", ""};
  }
}

inline std::optional<ApiError> check_default_max_tokens(int default_max_tokens) {
  if (default_max_tokens >= 1) return std::nullopt;
  return ApiError{500, "server_error",
                  "default_max_tokens = " + std::to_string(default_max_tokens) +
                      " < 1 (a server bug: pass a default of at least 1)",
                  "", ""};
}

}  // namespace detail

// POST /v1/completions.
inline std::optional<ApiError> parse_completions(std::string_view body, int default_max_tokens,
                                                 ParsedRequest* out) {
  return detail::with_json_object(body, out, [&](nlohmann::json const& j)
                                                 -> std::optional<ApiError> {
    using namespace detail;
    if (auto e = check_default_max_tokens(default_max_tokens)) return e;
    ParsedRequest r;
    r.endpoint = Endpoint::kCompletions;
    if (auto e = read_model(j, &r.model)) return e;
    json const* prompt = field(j, "prompt");
    if (prompt == nullptr) return missing("prompt", "a string or an array of token ids");
    if (auto e = read_completions_prompt(*prompt, &r)) return e;
    r.sampling.max_tokens = default_max_tokens;
    if (auto e = read_max_tokens(j, "", "max_tokens", &r.sampling.max_tokens)) return e;
    r.sampling.max_tokens_given = field(j, "max_tokens") != nullptr;
    if (auto e = read_common_sampling(j, "", &r.sampling)) return e;
    if (auto e = read_optional_seed(j, "", "seed", &r.sampling.seed)) return e;
    if (auto e = read_stream(j, &r)) return e;
    if (json const* v = field(j, "best_of")) {
      int64_t best_of = 0;
      if (auto e = read_integer(*v, "best_of", 1, kInt32Max, "an integer between 1 and 2147483647",
                                &best_of)) {
        return e;
      }
      if (best_of > 1) return unsupported("best_of", *v, "leave it out or set it to 1");
    }
    if (auto e = reject_unsupported(j, "",
                                    {{"echo", is_false, "leave it out or set it to false"},
                                     {"logprobs", is_false, "leave it out"},
                                     {"suffix", is_empty_string, "leave it out"}})) {
      return e;
    }
    if (auto e = reject_penalties(j, "")) return e;
    if (auto e = reject_vllm_extras(j)) return e;
    *out = std::move(r);
    return std::nullopt;
  });
}

// POST /v1/chat/completions. max_completion_tokens is an alias of max_tokens.
inline std::optional<ApiError> parse_chat_completions(std::string_view body, int default_max_tokens,
                                                      ParsedRequest* out) {
  return detail::with_json_object(body, out, [&](nlohmann::json const& j)
                                                 -> std::optional<ApiError> {
    using namespace detail;
    if (auto e = check_default_max_tokens(default_max_tokens)) return e;
    ParsedRequest r;
    r.endpoint = Endpoint::kChatCompletions;
    if (auto e = read_model(j, &r.model)) return e;
    if (auto e = read_messages(j, &r.messages)) return e;
    int max_tokens = 0, max_completion_tokens = 0;
    if (auto e = read_max_tokens(j, "", "max_tokens", &max_tokens)) return e;
    if (auto e = read_max_tokens(j, "", "max_completion_tokens", &max_completion_tokens)) return e;
    if (max_tokens != 0 && max_completion_tokens != 0 && max_tokens != max_completion_tokens) {
      return invalid("'max_tokens' = " + std::to_string(max_tokens) +
                         " and 'max_completion_tokens' = " + std::to_string(max_completion_tokens) +
                         " disagree (they are aliases: give one of them)",
                     "max_completion_tokens");
    }
    r.sampling.max_tokens = max_completion_tokens != 0 ? max_completion_tokens
                            : max_tokens != 0          ? max_tokens
                                                       : default_max_tokens;
    r.sampling.max_tokens_given = max_tokens != 0 || max_completion_tokens != 0;
    if (auto e = read_common_sampling(j, "", &r.sampling)) return e;
    if (auto e = read_optional_seed(j, "", "seed", &r.sampling.seed)) return e;
    if (auto e = read_stream(j, &r)) return e;
    if (auto e = reject_unsupported(
            j, "",
            {{"tools", is_empty, "leave it out: this server does not call tools"},
             {"tool_choice", is_none, "leave it out or set it to \"none\""},
             {"functions", is_empty, "leave it out: this server does not call functions"},
             {"function_call", is_none, "leave it out or set it to \"none\""},
             {"response_format", is_text_format, "leave it out or set it to {\"type\": \"text\"}"},
             {"logprobs", is_false, "leave it out or set it to false"},
             {"top_logprobs", is_zero, "leave it out"},
             {"echo", is_false, "leave it out or set it to false"},
             {"add_generation_prompt", is_true,
              "leave it out or set it to true: the reply always follows the template's "
              "assistant prompt"},
             {"continue_final_message", is_false, "leave it out or set it to false"},
             {"chat_template_kwargs", is_empty, "leave it out: the chat template is fixed"}})) {
      return e;
    }
    if (auto e = reject_penalties(j, "")) return e;
    if (auto e = reject_vllm_extras(j)) return e;
    *out = std::move(r);
    return std::nullopt;
  });
}

// POST /generate (SGLang): text | input_ids, sampling_params {...}, stream, rid.
inline std::optional<ApiError> parse_generate(std::string_view body, ParsedRequest* out) {
  return detail::with_json_object(body, out, [&](nlohmann::json const& j)
                                                 -> std::optional<ApiError> {
    using namespace detail;
    ParsedRequest r;
    r.endpoint = Endpoint::kGenerate;
    json const* text = field(j, "text");
    json const* ids = field(j, "input_ids");
    if (text != nullptr && ids != nullptr) {
      return invalid("both 'text' and 'input_ids' are given: give exactly one of them",
                     "input_ids");
    }
    if (text == nullptr && ids == nullptr) {
      return invalid("'text' or 'input_ids' is required (a string, or an array of token ids)",
                     "text");
    }
    if (text != nullptr) {
      if (text->is_array()) {
        return invalid("'text' holds " + std::to_string(text->size()) +
                           " prompts; this server takes one request per call (send them as "
                           "separate calls)",
                       "text");
      }
      if (!text->is_string()) return wrong_type("text", "a string", *text);
      if (auto e = read_prompt_text(*text, "text", &r.prompt_text)) return e;
    } else {
      if (ids->is_array() && !ids->empty() && (*ids)[0].is_array()) {
        return invalid("'input_ids' holds " + std::to_string(ids->size()) +
                           " prompts; this server takes one request per call (send them as "
                           "separate calls)",
                       "input_ids");
      }
      std::vector<int32_t> prompt;
      if (auto e = read_ids(*ids, "input_ids", false, &prompt)) return e;
      r.prompt_ids = std::move(prompt);
      r.prompt_ids_path = "input_ids";
    }
    r.sampling.max_tokens = 128;
    if (json const* sp = field(j, "sampling_params")) {
      std::string const prefix = "sampling_params";
      if (!sp->is_object()) return wrong_type(prefix, "an object", *sp);
      if (auto e = read_max_tokens(*sp, prefix, "max_new_tokens", &r.sampling.max_tokens)) {
        return e;
      }
      r.sampling.max_tokens_given = field(*sp, "max_new_tokens") != nullptr;
      if (auto e = read_common_sampling(*sp, prefix, &r.sampling)) return e;
      std::optional<uint64_t> seed, sampling_seed;
      if (auto e = read_optional_seed(*sp, prefix, "seed", &seed)) return e;
      if (auto e = read_optional_seed(*sp, prefix, "sampling_seed", &sampling_seed)) return e;
      if (seed && sampling_seed && *seed != *sampling_seed) {
        return invalid(
            "'sampling_params.seed' = " + std::to_string(*seed) +
                " and 'sampling_params.sampling_seed' = " + std::to_string(*sampling_seed) +
                " disagree (they are aliases: give one of them)",
            "sampling_params.sampling_seed");
      }
      r.sampling.seed = sampling_seed ? sampling_seed : seed;
      if (auto e = reject_unsupported(*sp, prefix,
                                      {{"min_new_tokens", is_zero, "leave it out or set it to 0"},
                                       {"json_schema", is_empty_string, "leave it out"},
                                       {"regex", is_empty_string, "leave it out"},
                                       {"ebnf", is_empty_string, "leave it out"},
                                       {"skip_special_tokens", is_true,
                                        "leave it out or set it to true: the text never holds "
                                        "special tokens"}})) {
        return e;
      }
      for (std::string_view key : {"max_tokens", "max_completion_tokens"}) {
        if (json const* v = field(*sp, key)) {
          return invalid("'" + path_of(prefix, key) + "' = " + shown(*v) +
                             " is OpenAI's name: SGLang's sampling_params call it max_new_tokens",
                         path_of(prefix, key));
        }
      }
      if (auto e = reject_penalties(*sp, prefix)) return e;
    }
    if (auto e = read_bool(j, "", "stream", &r.stream)) return e;
    std::string rid;
    if (auto e = read_nonempty_string(j, "rid", "leave it out or give an id", &rid)) return e;
    if (field(j, "rid") != nullptr) r.rid = std::move(rid);
    // A sampling parameter at the top level would otherwise be ignored (SGLang reads them from
    // sampling_params only).
    for (std::string_view key :
         {"temperature", "top_p", "top_k", "max_new_tokens", "max_tokens", "stop",
          "stop_token_ids", "ignore_eos", "n", "seed", "sampling_seed", "min_new_tokens",
          "json_schema", "regex", "ebnf", "frequency_penalty", "presence_penalty",
          "repetition_penalty", "min_p", "skip_special_tokens"}) {
      if (json const* v = field(j, key)) {
        std::string const name(key);
        return invalid("'" + name + "' = " + shown(*v) +
                           " belongs in sampling_params: send {\"sampling_params\": {\"" + name +
                           "\": ...}}",
                       name);
      }
    }
    if (auto e =
            reject_unsupported(j, "",
                               {{"return_logprob", is_false, "leave it out or set it to false"},
                                {"image_data", is_empty, "leave it out: text only"},
                                {"input_embeds", is_empty, "leave it out"},
                                {"lora_path", is_empty_string, "leave it out"}})) {
      return e;
    }
    *out = std::move(r);
    return std::nullopt;
  });
}

// The token ids the request gave (its prompt ids and stop_token_ids) against a vocabulary of
// `vocab_size` ids: the first outside [0, vocab_size) as a 400 naming its element
// ("input_ids[3]"), which the engine's own refusal could not.
inline std::optional<ApiError> check_vocabulary(ParsedRequest const& r, int64_t vocab_size) {
  auto const check = [&](std::vector<int32_t> const& ids,
                         std::string const& path) -> std::optional<ApiError> {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= vocab_size) {
        std::string const at = detail::indexed(path, i);
        ApiError e = detail::invalid("'" + at + "' = " + std::to_string(ids[i]) +
                                         " is outside the model's vocabulary [0, " +
                                         std::to_string(vocab_size) + ")",
                                     at);
        e.code = "invalid_value";
        return e;
      }
    }
    return std::nullopt;
  };
  if (r.prompt_ids) {
    if (auto e = check(*r.prompt_ids, r.prompt_ids_path)) return e;
  }
  return check(r.sampling.stop_token_ids,
               r.endpoint == Endpoint::kGenerate ? "sampling_params.stop_token_ids"
                                                 : "stop_token_ids");
}

// ---- Responses -------------------------------------------------------------------------------

// {"prompt_tokens", "completion_tokens", "total_tokens"}
inline nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace detail {
inline nlohmann::json optional_string(std::optional<std::string> const& s) {
  return s ? nlohmann::json(*s) : nlohmann::json(nullptr);
}
inline nlohmann::json envelope(std::string const& id, char const* object, int64_t created,
                               std::string const& model) {
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}
}  // namespace detail

// {"id", "object": "text_completion", "created", "model", "choices": [{"index": 0, "text",
// "logprobs": null, "finish_reason"}], "usage"}
inline nlohmann::json completion_response(std::string const& id, int64_t created,
                                          std::string const& model, std::string const& text,
                                          std::string const& finish_reason,
                                          nlohmann::json const& usage) {
  nlohmann::json j = detail::envelope(id, "text_completion", created, model);
  j["choices"] = nlohmann::json::array(
      {{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish_reason}}});
  j["usage"] = usage;
  return j;
}

// A streamed completion chunk: as completion_response with the new text only, finish_reason null
// until the last chunk, and no usage (or "usage": null when include_usage, as OpenAI sends it).
inline nlohmann::json completion_chunk(std::string const& id, int64_t created,
                                       std::string const& model, std::string const& text,
                                       std::optional<std::string> const& finish_reason,
                                       bool include_usage = false) {
  nlohmann::json j = detail::envelope(id, "text_completion", created, model);
  j["choices"] =
      nlohmann::json::array({{{"index", 0},
                              {"text", text},
                              {"logprobs", nullptr},
                              {"finish_reason", detail::optional_string(finish_reason)}}});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

// {"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0, "message":
// {"role": "assistant", "content"}, "logprobs": null, "finish_reason"}], "usage"}
inline nlohmann::json chat_response(std::string const& id, int64_t created,
                                    std::string const& model, std::string const& content,
                                    std::string const& finish_reason, nlohmann::json const& usage) {
  nlohmann::json j = detail::envelope(id, "chat.completion", created, model);
  j["choices"] = nlohmann::json::array({{{"index", 0},
                                         {"message", {{"role", "assistant"}, {"content", content}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", finish_reason}}});
  j["usage"] = usage;
  return j;
}

// {"id", "object": "chat.completion.chunk", "created", "model", "choices": [{"index": 0,
// "delta": {only the given of "role", "content"}, "logprobs": null, "finish_reason": string or
// null}]} (+ "usage": null when include_usage).
inline nlohmann::json chat_chunk(std::string const& id, int64_t created, std::string const& model,
                                 std::optional<std::string> const& role,
                                 std::optional<std::string> const& content,
                                 std::optional<std::string> const& finish_reason,
                                 bool include_usage = false) {
  nlohmann::json delta = nlohmann::json::object();
  if (role) delta["role"] = *role;
  if (content) delta["content"] = *content;
  nlohmann::json j = detail::envelope(id, "chat.completion.chunk", created, model);
  j["choices"] =
      nlohmann::json::array({{{"index", 0},
                              {"delta", delta},
                              {"logprobs", nullptr},
                              {"finish_reason", detail::optional_string(finish_reason)}}});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

// The last chunk of a stream with stream_options.include_usage: {"id", "object" (object_name:
// "text_completion" or "chat.completion.chunk"), "created", "model", "choices": [], "usage"}.
inline nlohmann::json usage_chunk(std::string const& id, int64_t created, std::string const& model,
                                  std::string const& object_name, nlohmann::json const& usage) {
  nlohmann::json j = detail::envelope(id, object_name.c_str(), created, model);
  j["choices"] = nlohmann::json::array();
  j["usage"] = usage;
  return j;
}

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by",
// "root" (= id), "max_model_len"}]}
inline nlohmann::json models_response(std::string const& model_id, int64_t created,
                                      std::string const& owned_by, int64_t max_model_len) {
  nlohmann::json model = {{"id", model_id},     {"object", "model"},
                          {"created", created}, {"owned_by", owned_by},
                          {"root", model_id},   {"max_model_len", max_model_len}};
  return {{"object", "list"}, {"data", nlohmann::json::array({model})}};
}

// Compact JSON text; invalid UTF-8 in strings (a token cut mid-character) becomes U+FFFD instead
// of throwing.
inline std::string dump_json(nlohmann::json const& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One server-sent event: "data: <compact JSON>\n\n".
inline std::string sse_data(nlohmann::json const& j) { return "data: " + dump_json(j) + "\n\n"; }

// The end of an OpenAI stream.
inline std::string sse_done() { return "data: [DONE]\n\n"; }

// ---- Stop strings ----------------------------------------------------------------------------

// Finds stop strings in streamed text (see the top). An empty stop string matches at once.
// Cost per feed: O(stops x (held + delta) x stop length), held < the longest stop string.
class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    for (auto const& s : stops_) longest_ = std::max(longest_, s.size());
  }

  // Appends `text`; returns what is now safe to emit. *stopped (when not null) is set to whether
  // a stop string has matched, now or before; once it has, every call returns "".
  std::string feed(std::string_view text, bool* stopped) {
    if (stopped_) {
      if (stopped != nullptr) *stopped = true;
      return {};
    }
    held_.append(text.data(), text.size());
    // The occurrence that completes first (the one a byte-by-byte stream would meet first);
    // of those ending at the same byte, the one that starts earliest.
    size_t first = std::string::npos, first_end = std::string::npos;
    for (auto const& s : stops_) {
      size_t const at = held_.find(s);
      if (at == std::string::npos) continue;
      size_t const end = at + s.size();
      if (end < first_end || (end == first_end && at < first)) first = at, first_end = end;
    }
    if (first != std::string::npos) {
      std::string out = held_.substr(0, first);
      held_.clear();
      stopped_ = true;
      if (stopped != nullptr) *stopped = true;
      return out;
    }
    size_t const emit = held_.size() - held_tail_length();
    std::string out = held_.substr(0, emit);
    held_.erase(0, emit);
    if (stopped != nullptr) *stopped = false;
    return out;
  }

  // The held-back tail, at the end of generation ("" after a stop string matched).
  std::string flush() {
    std::string out = std::move(held_);
    held_.clear();
    return out;
  }

  bool stopped() const { return stopped_; }
  std::vector<std::string> const& stops() const { return stops_; }

 private:
  // The length of the longest suffix of held_ that is a proper prefix of some stop string.
  size_t held_tail_length() const {
    size_t const most = std::min(held_.size(), longest_ == 0 ? 0 : longest_ - 1);
    std::string_view const held(held_);
    for (size_t k = most; k > 0; --k) {
      std::string_view const tail = held.substr(held.size() - k);
      for (auto const& s : stops_) {
        if (s.size() > k && std::string_view(s).substr(0, k) == tail) return k;
      }
    }
    return 0;
  }

  std::vector<std::string> stops_;
  size_t longest_ = 0;
  std::string held_;  // fed, not yet emitted: always shorter than the longest stop string
  bool stopped_ = false;
};

}  // namespace specdec::serve
