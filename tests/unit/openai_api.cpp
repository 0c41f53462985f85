// openai_api: each parser's happy path with every field and its defaults; every error class
// (malformed JSON, non-object body, missing field, wrong type naming the path, out of range,
// non-integers, n != 1, batches, unsupported fields) by status, param and message; the
// max_completion_tokens and sampling_seed aliases; chat content parts; the response builders'
// exact layout; SSE framing; StopStringMatcher on hand-worked splits and against a brute-force
// oracle over random strings, stop sets and chunkings.
#include "specdec/serve/openai_api.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
using specdec::serve::ApiError;
using specdec::serve::Endpoint;
using specdec::serve::ParsedRequest;
using specdec::serve::StopStringMatcher;

constexpr int kDefaultMaxTokens = 77;

std::optional<ApiError> parse(Endpoint endpoint, std::string const& body, ParsedRequest* out) {
  switch (endpoint) {
    case Endpoint::kCompletions:
      return specdec::serve::parse_completions(body, kDefaultMaxTokens, out);
    case Endpoint::kChatCompletions:
      return specdec::serve::parse_chat_completions(body, kDefaultMaxTokens, out);
    case Endpoint::kGenerate:
      return specdec::serve::parse_generate(body, out);
  }
  return std::nullopt;
}

ParsedRequest accept(Endpoint endpoint, std::string const& body) {
  ParsedRequest r;
  auto const e = parse(endpoint, body, &r);
  REQUIRE_MESSAGE(!e.has_value(), "unexpected error: ", (e ? e->message : ""), " for ", body);
  CHECK(r.endpoint == endpoint);
  return r;
}

bool contains(std::string const& s, std::string const& part) {
  return s.find(part) != std::string::npos;
}

// Parses `body`, expects an error with `status` and `param` whose message names every part, and
// checks that the output was left untouched.
ApiError reject(Endpoint endpoint, std::string const& body, std::string const& param,
                std::vector<std::string> const& parts, int status = 400) {
  ParsedRequest r;
  r.model = "untouched";
  auto const e = parse(endpoint, body, &r);
  REQUIRE_MESSAGE(e.has_value(), "accepted: ", body);
  CHECK_MESSAGE(e->status == status, e->message);
  CHECK_MESSAGE(e->param == param, "param '", e->param, "' for: ", e->message);
  for (auto const& p : parts) {
    CHECK_MESSAGE(contains(e->message, p), "want '", p, "' in: ", e->message);
  }
  CHECK(r.model == "untouched");
  CHECK_FALSE(e->message.empty());
  // The body must always serialize (valid UTF-8 in every message).
  CHECK_NOTHROW((void)e->body().dump());
  return *e;
}

constexpr Endpoint kAll[] = {Endpoint::kCompletions, Endpoint::kChatCompletions,
                             Endpoint::kGenerate};

// A minimal valid body of `endpoint` with `extra` (JSON members, may be "") added to the top
// level (OpenAI) or to sampling_params (generate).
std::string body_with(Endpoint endpoint, std::string const& extra) {
  std::string const sep = extra.empty() ? "" : ", ";
  switch (endpoint) {
    case Endpoint::kCompletions:
      return R"({"prompt": "hi")" + sep + extra + "}";
    case Endpoint::kChatCompletions:
      return R"({"messages": [{"role": "user", "content": "hi"}])" + sep + extra + "}";
    case Endpoint::kGenerate:
      return R"({"text": "hi", "sampling_params": {)" + extra + "}}";
  }
  return "";
}

// The name a sampling field has in `endpoint` ("max_tokens" vs sampling_params.max_new_tokens).
std::string param_of(Endpoint endpoint, std::string const& key) {
  if (endpoint != Endpoint::kGenerate) return key;
  return "sampling_params." + (key == "max_tokens" ? std::string("max_new_tokens") : key);
}

// 'text' (how messages quote a field) and "key": value (a JSON member), built by appending.
std::string quoted(std::string const& s) {
  std::string out = "'";
  out += s;
  out += "'";
  return out;
}

std::string member(std::string const& key, std::string const& value) {
  std::string out = "\"";
  out += key;
  out += "\": ";
  out += value;
  return out;
}

std::string key_of(Endpoint endpoint, std::string const& key) {
  return endpoint == Endpoint::kGenerate && key == "max_tokens" ? "max_new_tokens" : key;
}

// ---- Happy paths --------------------------------------------------------------------------------

TEST_CASE("parse_completions: every field") {
  ParsedRequest const r = accept(Endpoint::kCompletions, R"({
    "model": "kimi-k2.5", "prompt": "Once upon", "max_tokens": 32, "temperature": 0.5,
    "top_p": 0.9, "top_k": 40, "seed": 18446744073709551615, "stop": ["\n\n", "END"],
    "stop_token_ids": [163586, 0], "ignore_eos": true, "n": 1, "stream": true,
    "stream_options": {"include_usage": true}, "echo": false, "logprobs": null, "best_of": 1,
    "suffix": null, "frequency_penalty": 0, "presence_penalty": 0.0, "user": "ignored",
    "some_future_field": {"x": 1}})");
  CHECK(r.model == "kimi-k2.5");
  REQUIRE(r.prompt_text.has_value());
  CHECK(*r.prompt_text == "Once upon");
  CHECK_FALSE(r.prompt_ids.has_value());
  CHECK(r.messages.empty());
  CHECK(r.sampling.max_tokens == 32);
  CHECK(r.sampling.temperature == 0.5f);
  CHECK(r.sampling.top_p == 0.9f);
  CHECK(r.sampling.top_k == 40);
  REQUIRE(r.sampling.seed.has_value());
  CHECK(*r.sampling.seed == 18446744073709551615ull);
  CHECK(r.sampling.stop == std::vector<std::string>{"\n\n", "END"});
  CHECK(r.sampling.stop_token_ids == std::vector<int32_t>{163586, 0});
  CHECK(r.sampling.ignore_eos);
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK_FALSE(r.rid.has_value());
  // Read by no rule, served as if absent, and named for the server's log (in key order).
  CHECK(r.ignored_fields == std::vector<std::string>{"some_future_field", "user"});
}

TEST_CASE("parse_completions: defaults") {
  ParsedRequest const r = accept(Endpoint::kCompletions, R"({"prompt": "x"})");
  CHECK(r.model.empty());
  CHECK(r.sampling.max_tokens == kDefaultMaxTokens);
  CHECK(r.sampling.temperature == 1.0f);
  CHECK(r.sampling.top_p == 1.0f);
  CHECK(r.sampling.top_k == -1);
  CHECK_FALSE(r.sampling.seed.has_value());
  CHECK(r.sampling.stop.empty());
  CHECK(r.sampling.stop_token_ids.empty());
  CHECK_FALSE(r.sampling.ignore_eos);
  CHECK_FALSE(r.stream);
  CHECK_FALSE(r.include_usage);

  // null means "not given" for every optional field.
  ParsedRequest const n = accept(Endpoint::kCompletions, R"({"prompt": "x", "model": null,
    "max_tokens": null, "temperature": null, "top_p": null, "top_k": null, "seed": null,
    "stop": null, "stop_token_ids": null, "ignore_eos": null, "n": null, "stream": null,
    "stream_options": null, "echo": null, "best_of": null})");
  CHECK(n.sampling.max_tokens == kDefaultMaxTokens);
  CHECK(n.sampling.temperature == 1.0f);
  CHECK_FALSE(n.sampling.seed.has_value());
}

TEST_CASE("max_tokens_given: whether the request set max_tokens (the server cuts only defaults)") {
  auto given = [](auto parse, std::string const& body) {
    ParsedRequest r;
    std::optional<ApiError> const e = parse(body, &r);
    REQUIRE_FALSE(e.has_value());
    return r.sampling.max_tokens_given;
  };
  auto completions = [](std::string_view b, ParsedRequest* r) {
    return specdec::serve::parse_completions(b, 64, r);
  };
  auto chat = [](std::string_view b, ParsedRequest* r) {
    return specdec::serve::parse_chat_completions(b, 64, r);
  };
  auto generate = [](std::string_view b, ParsedRequest* r) {
    return specdec::serve::parse_generate(b, r);
  };
  std::string const msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  CHECK_FALSE(given(completions, R"({"prompt": "x"})"));
  CHECK_FALSE(given(completions, R"({"prompt": "x", "max_tokens": null})"));
  CHECK(given(completions, R"({"prompt": "x", "max_tokens": 64})"));
  CHECK_FALSE(given(chat, "{" + msgs + "}"));
  CHECK(given(chat, "{" + msgs + R"(, "max_tokens": 3})"));
  CHECK(given(chat, "{" + msgs + R"(, "max_completion_tokens": 3})"));
  CHECK_FALSE(given(generate, R"({"text": "x"})"));
  CHECK_FALSE(given(generate, R"({"text": "x", "sampling_params": {"temperature": 0}})"));
  CHECK(given(generate, R"({"text": "x", "sampling_params": {"max_new_tokens": 128}})"));
}

TEST_CASE("ignored_fields: a top-level field no rule reads, e.g. a typo, is named, not refused") {
  // "max_token" for max_tokens: the default stands, and the field is listed for the server's log.
  ParsedRequest const r =
      accept(Endpoint::kCompletions, R"({"prompt": "x", "max_token": 5, "temperature": null})");
  CHECK(r.sampling.max_tokens == kDefaultMaxTokens);
  CHECK(r.ignored_fields == std::vector<std::string>{"max_token"});  // null is "not given": read
  // Inside the objects a rule reads, by path (an array's elements as "[]"); an ignored field's
  // own contents are not searched.
  ParsedRequest const g = accept(Endpoint::kGenerate, R"({"input_ids": [1, 2],
      "sampling_params": {"foo": 1, "temperature": 0}, "bar": {"baz": 1}})");
  CHECK(g.ignored_fields == std::vector<std::string>{"bar", "sampling_params.foo"});
  ParsedRequest const c = accept(Endpoint::kChatCompletions, R"({"messages": [
      {"role": "user", "content": "x", "foo": 1},
      {"role": "user", "content": [{"type": "text", "text": "y", "cache_control": {}}],
       "foo": 2}]})");
  CHECK(c.ignored_fields ==
        std::vector<std::string>{"messages[].foo", "messages[].content[].cache_control"});
  ParsedRequest const known = accept(Endpoint::kChatCompletions,
                                     R"({"messages": [{"role": "user", "content": "x"}]})");
  CHECK(known.ignored_fields.empty());
  // A refused request fills nothing.
  ParsedRequest bad;
  CHECK(parse(Endpoint::kCompletions, R"({"prompt": "x", "max_token": 5, "n": 2})", &bad));
  CHECK(bad.ignored_fields.empty());
}

TEST_CASE("parse_completions: the prompt forms") {
  ParsedRequest r = accept(Endpoint::kCompletions, R"({"prompt": [1, 2, 2147483647, 0]})");
  REQUIRE(r.prompt_ids.has_value());
  CHECK(*r.prompt_ids == std::vector<int32_t>{1, 2, 2147483647, 0});
  CHECK_FALSE(r.prompt_text.has_value());

  r = accept(Endpoint::kCompletions, R"({"prompt": ["one string"]})");
  REQUIRE(r.prompt_text.has_value());
  CHECK(*r.prompt_text == "one string");

  r = accept(Endpoint::kCompletions, R"({"prompt": [[5, 6, 7]]})");
  REQUIRE(r.prompt_ids.has_value());
  CHECK(*r.prompt_ids == std::vector<int32_t>{5, 6, 7});

  // Whole numbers written as floats are integers.
  r = accept(Endpoint::kCompletions, R"({"prompt": [3.0, 4], "max_tokens": 1e2})");
  CHECK(*r.prompt_ids == std::vector<int32_t>{3, 4});
  CHECK(r.sampling.max_tokens == 100);

  // UTF-8 text passes through byte for byte.
  r = accept(Endpoint::kCompletions, "{\"prompt\": \"\xE4\xBD\xA0\xE5\xA5\xBD \\u00e9\"}");
  CHECK(*r.prompt_text == "\xE4\xBD\xA0\xE5\xA5\xBD \xC3\xA9");
}

TEST_CASE("parse_chat_completions: every field") {
  ParsedRequest const r = accept(Endpoint::kChatCompletions, R"({
    "model": "kimi-k2.5",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "developer", "content": ""},
      {"role": "user", "content": [{"type": "text", "text": "Hello, "},
                                   {"type": "text", "text": "world"}], "name": "ignored"},
      {"role": "assistant", "content": "Hi."},
      {"role": "tool", "content": []},
      {"role": "user", "content": "again"}],
    "max_completion_tokens": 64, "temperature": 0, "top_p": 1, "top_k": 0, "seed": 7,
    "stop": "###", "stop_token_ids": [163586], "ignore_eos": false, "n": 1, "stream": true,
    "stream_options": {"include_usage": false}, "tools": [], "tool_choice": "none",
    "response_format": {"type": "text"}, "logprobs": false, "top_logprobs": null,
    "parallel_tool_calls": false})");
  CHECK(r.model == "kimi-k2.5");
  REQUIRE(r.messages.size() == 6);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[0].content == "Be brief.");
  CHECK(r.messages[1].role == "developer");
  CHECK(r.messages[1].content.empty());
  CHECK(r.messages[2].role == "user");
  CHECK(r.messages[2].content == "Hello, world");
  CHECK(r.messages[3].role == "assistant");
  CHECK(r.messages[4].role == "tool");
  CHECK(r.messages[4].content.empty());
  CHECK(r.messages[5].content == "again");
  CHECK_FALSE(r.prompt_text.has_value());
  CHECK_FALSE(r.prompt_ids.has_value());
  CHECK(r.sampling.max_tokens == 64);
  CHECK(r.sampling.temperature == 0.0f);
  CHECK(r.sampling.top_p == 1.0f);
  CHECK(r.sampling.top_k == 0);
  CHECK(r.sampling.seed == std::optional<uint64_t>(7));
  CHECK(r.sampling.stop == std::vector<std::string>{"###"});
  CHECK(r.sampling.stop_token_ids == std::vector<int32_t>{163586});
  CHECK_FALSE(r.sampling.ignore_eos);
  CHECK(r.stream);
  CHECK_FALSE(r.include_usage);
  CHECK(r.ignored_fields == std::vector<std::string>{"messages[].name", "parallel_tool_calls"});
}

TEST_CASE("parse_chat_completions: max_tokens and its alias max_completion_tokens") {
  std::string const m = R"("messages": [{"role": "user", "content": "q"}])";
  CHECK(accept(Endpoint::kChatCompletions, "{" + m + "}").sampling.max_tokens == kDefaultMaxTokens);
  CHECK(accept(Endpoint::kChatCompletions, "{" + m + R"(, "max_tokens": 5})").sampling.max_tokens ==
        5);
  CHECK(accept(Endpoint::kChatCompletions, "{" + m + R"(, "max_completion_tokens": 6})")
            .sampling.max_tokens == 6);
  CHECK(accept(Endpoint::kChatCompletions,
               "{" + m + R"(, "max_tokens": 8, "max_completion_tokens": 8})")
            .sampling.max_tokens == 8);
  CHECK(accept(Endpoint::kChatCompletions,
               "{" + m + R"(, "max_tokens": null, "max_completion_tokens": 9})")
            .sampling.max_tokens == 9);
  ApiError const e = reject(
      Endpoint::kChatCompletions, "{" + m + R"(, "max_tokens": 8, "max_completion_tokens": 9})",
      "max_completion_tokens", {"'max_tokens' = 8", "'max_completion_tokens' = 9", "alias"});
  CHECK(e.type == "invalid_request_error");
  reject(Endpoint::kChatCompletions, "{" + m + R"(, "max_completion_tokens": 0})",
         "max_completion_tokens", {"'max_completion_tokens'", "between 1 and 2147483647", "0"});
}

TEST_CASE("parse_generate: every field") {
  ParsedRequest r = accept(Endpoint::kGenerate, R"({
    "text": "The capital of France is", "stream": true, "rid": "req-42",
    "sampling_params": {"max_new_tokens": 20, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
      "stop": ["."], "stop_token_ids": [2], "ignore_eos": true, "n": 1, "sampling_seed": 123,
      "skip_special_tokens": true, "frequency_penalty": 0.0, "repetition_penalty": 1.0},
    "return_logprob": false, "model": "ignored"})");
  REQUIRE(r.prompt_text.has_value());
  CHECK(*r.prompt_text == "The capital of France is");
  CHECK(r.model.empty());
  CHECK(r.sampling.max_tokens == 20);
  CHECK(r.sampling.temperature == 0.7f);
  CHECK(r.sampling.top_p == 0.8f);
  CHECK(r.sampling.top_k == 20);
  CHECK(r.sampling.stop == std::vector<std::string>{"."});
  CHECK(r.sampling.stop_token_ids == std::vector<int32_t>{2});
  CHECK(r.sampling.ignore_eos);
  CHECK(r.sampling.seed == std::optional<uint64_t>(123));
  CHECK(r.stream);
  CHECK_FALSE(r.include_usage);
  CHECK(r.rid == std::optional<std::string>("req-42"));
  CHECK(r.ignored_fields == std::vector<std::string>{"model"});  // OpenAI's, not SGLang's

  r = accept(Endpoint::kGenerate, R"({"input_ids": [9, 8, 7], "sampling_params": {"seed": 5}})");
  REQUIRE(r.prompt_ids.has_value());
  CHECK(*r.prompt_ids == std::vector<int32_t>{9, 8, 7});
  CHECK_FALSE(r.prompt_text.has_value());
  CHECK(r.sampling.seed == std::optional<uint64_t>(5));

  // seed and sampling_seed are aliases: equal is fine, different is an error.
  r = accept(Endpoint::kGenerate,
             R"({"text": "a", "sampling_params": {"seed": 5, "sampling_seed": 5}})");
  CHECK(r.sampling.seed == std::optional<uint64_t>(5));
  reject(Endpoint::kGenerate,
         R"({"text": "a", "sampling_params": {"seed": 5, "sampling_seed": 6}})",
         "sampling_params.sampling_seed", {"sampling_params.seed", "5", "6", "alias"});
}

TEST_CASE("parse_generate: SGLang's defaults") {
  for (std::string const body : {R"({"text": "a"})", R"({"text": "a", "sampling_params": {}})",
                                 R"({"text": "a", "sampling_params": null})"}) {
    ParsedRequest const r = accept(Endpoint::kGenerate, body);
    CHECK(r.sampling.max_tokens == 128);
    CHECK(r.sampling.temperature == 1.0f);
    CHECK(r.sampling.top_p == 1.0f);
    CHECK(r.sampling.top_k == -1);
    CHECK_FALSE(r.sampling.seed.has_value());
    CHECK_FALSE(r.sampling.ignore_eos);
    CHECK_FALSE(r.stream);
    CHECK_FALSE(r.rid.has_value());
  }
}

// ---- Errors -------------------------------------------------------------------------------------

TEST_CASE("errors: malformed JSON and a body that is not an object") {
  for (Endpoint ep : kAll) {
    CAPTURE(specdec::serve::endpoint_name(ep));
    ApiError e = reject(ep, R"({"prompt": "x",})", "", {"malformed JSON: ", "parse_error"});
    CHECK(e.type == "invalid_request_error");
    reject(ep, "", "", {"malformed JSON: "});
    reject(ep, R"({"text": "unterminated)", "", {"malformed JSON: "});
    // Invalid UTF-8 inside a string: still a clean message that serializes.
    reject(ep, "{\"text\": \"\xFF\xFE\"}", "", {"malformed JSON: "});
    reject(ep, R"([1, 2])", "", {"must be a JSON object", "got array"});
    reject(ep, R"("text")", "", {"must be a JSON object", "got string"});
    reject(ep, "null", "", {"must be a JSON object", "got null"});
    // A number past the double range: a malformed body (400), not a server error.
    reject(ep, body_with(ep, member(key_of(ep, "max_tokens"), "1e400")), "",
           {"malformed JSON: ", "1e400"});
    reject(ep, body_with(ep, R"("temperature": -1e999)"), "", {"malformed JSON: "});
  }
}

TEST_CASE("errors: missing required fields") {
  reject(Endpoint::kCompletions, R"({"model": "m"})", "prompt", {"'prompt' is required"});
  reject(Endpoint::kCompletions, R"({"prompt": null})", "prompt", {"'prompt' is required"});
  reject(Endpoint::kChatCompletions, R"({"model": "m"})", "messages", {"'messages' is required"});
  reject(Endpoint::kChatCompletions, R"({"messages": [{"content": "x"}]})", "messages[0].role",
         {"'messages[0].role' is required"});
  reject(Endpoint::kChatCompletions,
         R"({"messages": [{"role": "user", "content": "a"}, {"role": "user"}]})",
         "messages[1].content", {"'messages[1].content' is required"});
  reject(Endpoint::kChatCompletions,
         R"({"messages": [{"role": "user", "content": [{"text": "x"}]}]})",
         "messages[0].content[0].type", {"'messages[0].content[0].type' is required"});
  reject(Endpoint::kChatCompletions,
         R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
         "messages[0].content[0].text", {"'messages[0].content[0].text' is required"});
  reject(Endpoint::kGenerate, R"({"sampling_params": {}})", "text",
         {"'text'", "'input_ids'", "required"});
  reject(Endpoint::kGenerate, R"({"text": "a", "input_ids": [1]})", "input_ids",
         {"'text'", "'input_ids'", "exactly one"});
}

TEST_CASE("errors: wrong types name the field's path and the JSON type") {
  reject(Endpoint::kCompletions, R"({"prompt": 5})", "prompt",
         {"'prompt' must be a string or an array of token ids, got number"});
  reject(Endpoint::kCompletions, R"({"prompt": [1, "x"]})", "prompt[1]",
         {"'prompt[1]' must be an integer", "got string"});
  reject(Endpoint::kCompletions, R"({"prompt": [[1, 2, true]]})", "prompt[0][2]",
         {"'prompt[0][2]' must be an integer", "got boolean"});
  reject(Endpoint::kCompletions, R"({"prompt": [{"a": 1}]})", "prompt[0]",
         {"'prompt[0]' must be", "got object"});
  reject(Endpoint::kCompletions, R"({"prompt": "x", "model": 3})", "model",
         {"'model' must be a string, got number"});
  reject(Endpoint::kCompletions, R"({"prompt": "x", "stream": "yes"})", "stream",
         {"'stream' must be a boolean, got string"});
  reject(Endpoint::kCompletions, R"({"prompt": "x", "stream": true, "stream_options": []})",
         "stream_options", {"'stream_options' must be an object, got array"});
  reject(Endpoint::kCompletions,
         R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})",
         "stream_options.include_usage",
         {"'stream_options.include_usage' must be a boolean, got number"});
  reject(Endpoint::kChatCompletions, R"({"messages": {"role": "user"}})", "messages",
         {"'messages' must be an array of messages, got object"});
  reject(Endpoint::kChatCompletions, R"({"messages": ["hello"]})", "messages[0]",
         {"'messages[0]' must be an object", "got string"});
  reject(Endpoint::kChatCompletions,
         R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                          {"role": "user", "content": 17}]})",
         "messages[2].content",
         {"'messages[2].content' must be a string or an array of content parts, got number"});
  reject(Endpoint::kChatCompletions, R"({"messages": [{"role": 1, "content": "a"}]})",
         "messages[0].role", {"'messages[0].role' must be a string, got number"});
  reject(Endpoint::kChatCompletions,
         R"({"messages": [{"role": "user", "content": ["just a string"]}]})",
         "messages[0].content[0]", {"'messages[0].content[0]' must be an object", "got string"});
  reject(Endpoint::kChatCompletions,
         R"({"messages": [{"role": "user", "content": [{"type": "text", "text": null}]}]})",
         "messages[0].content[0].text", {"'messages[0].content[0].text' is required"});
  reject(Endpoint::kChatCompletions,
         R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 4}]}]})",
         "messages[0].content[0].text",
         {"'messages[0].content[0].text' must be a string, got number"});
  reject(Endpoint::kGenerate, R"({"text": 12})", "text", {"'text' must be a string, got number"});
  reject(Endpoint::kGenerate, R"({"input_ids": "1 2 3"})", "input_ids",
         {"'input_ids' must be an array of token ids, got string"});
  reject(Endpoint::kGenerate, R"({"text": "a", "sampling_params": [1]})", "sampling_params",
         {"'sampling_params' must be an object, got array"});
  reject(Endpoint::kGenerate, R"({"text": "a", "rid": ["a", "b"]})", "rid",
         {"'rid' must be a string, got array"});
  reject(Endpoint::kGenerate, R"({"text": "a", "stream": 1})", "stream",
         {"'stream' must be a boolean, got number"});

  // The sampling fields, in each endpoint's spelling.
  for (Endpoint ep : kAll) {
    CAPTURE(specdec::serve::endpoint_name(ep));
    auto const wrong = [&](std::string const& key, std::string const& value,
                           std::string const& want, std::string const& got) {
      std::string const k = key_of(ep, key), p = param_of(ep, key);
      reject(ep, body_with(ep, "\"" + k + "\": " + value), p,
             {"'" + p + "' must be " + want, "got " + got});
    };
    wrong("max_tokens", "\"16\"", "an integer", "string");
    wrong("max_tokens", "2.5", "an integer", "number 2.5");
    wrong("temperature", "\"hot\"", "a number", "string");
    wrong("top_p", "[1]", "a number", "array");
    wrong("top_k", "1.5", "an integer", "number 1.5");
    wrong("top_k", "false", "an integer", "boolean");
    wrong("seed", "\"7\"", "an integer", "string");
    wrong("seed", "0.5", "an integer", "number 0.5");
    wrong("stop", "5", "a string or an array of strings", "number");
    wrong("ignore_eos", "\"true\"", "a boolean", "string");
    wrong("n", "\"1\"", "an integer", "string");
    wrong("stop_token_ids", "{}", "an array of token ids", "object");
    std::string const p = param_of(ep, "stop");
    reject(ep, body_with(ep, R"("stop": ["a", 3])"), p + "[1]",
           {"'" + p + "[1]' must be a string, got number"});
    std::string const q = param_of(ep, "stop_token_ids");
    reject(ep, body_with(ep, R"("stop_token_ids": [1, "2"])"), q + "[1]",
           {"'" + q + "[1]' must be an integer", "got string"});
  }
}

TEST_CASE("errors: values out of range name the field, the value and the range") {
  for (Endpoint ep : kAll) {
    CAPTURE(specdec::serve::endpoint_name(ep));
    // `at` is "" or the index of the offending element ("[1]").
    auto const out = [&](std::string const& key, std::string const& value,
                         std::vector<std::string> parts, std::string const& at = "") {
      std::string const p = param_of(ep, key) + at;
      parts.push_back(quoted(p));
      ApiError const e = reject(ep, body_with(ep, member(key_of(ep, key), value)), p, parts);
      CHECK(e.status == 400);
    };
    out("max_tokens", "0", {"between 1 and 2147483647", "got 0"});
    out("max_tokens", "-3", {"between 1 and 2147483647", "got -3"});
    out("max_tokens", "2147483648", {"between 1 and 2147483647", "got 2147483648"});
    out("max_tokens", "1e300", {"between 1 and 2147483647"});
    out("max_tokens", "18446744073709551615", {"got 18446744073709551615"});
    out("temperature", "-0.1", {"0 (greedy) or a number between 1e-06 and 2", "got -0.1"});
    out("temperature", "2.5", {"between 1e-06 and 2", "got 2.5"});
    // Above 0 but below the smallest temperature (1 / T would overflow the scaled logits), and
    // below the smallest float (it would read as 0, greedy): refused, never rounded.
    out("temperature", "1e-38", {"between 1e-06 and 2", "got 1e-38"});
    out("temperature", "1e-50", {"between 1e-06 and 2", "got 1e-50"});
    out("top_p", "1e-50", {"greater than 0 and at most 1", "32-bit float", "got 1e-50"});
    out("top_p", "0", {"greater than 0 and at most 1", "got 0"});
    out("top_p", "1.01", {"greater than 0 and at most 1", "got 1.01"});
    out("top_k", "-2", {"-1 or 0", "between 1 and 2147483647", "got -2"});
    out("seed", "-1", {"between 0 and 18446744073709551615", "got -1"});
    out("seed", "1e20", {"between 0 and 18446744073709551615"});
    out("stop_token_ids", "[-1]", {"between 0 and 2147483647", "got -1"}, "[0]");
    out("stop", "\"\"", {"empty string"});
    out("stop", "[\"a\", \"\"]", {"empty string"}, "[1]");
    // stop_token_ids errors name the element.
    std::string const q = param_of(ep, "stop_token_ids");
    reject(ep, body_with(ep, R"("stop_token_ids": [4, 2147483648])"), q + "[1]",
           {"'" + q + "[1]'", "between 0 and 2147483647", "2147483648"});
    // At most 16 stop strings; 16 are fine.
    std::string sixteen = "[";
    for (int i = 0; i < 16; ++i) sixteen += (i ? ", \"s" : "\"s") + std::to_string(i) + "\"";
    CHECK(accept(ep, body_with(ep, "\"stop\": " + sixteen + "]")).sampling.stop.size() == 16);
    reject(ep, body_with(ep, "\"stop\": " + sixteen + ", \"x\"]"), param_of(ep, "stop"),
           {"17 stop strings", "at most 16"});
    // Edges that are in range.
    ParsedRequest const r =
        accept(ep, body_with(ep, "\"" + key_of(ep, "max_tokens") +
                                     "\": 2147483647, \"temperature\": 2, \"top_p\": 1e-9, "
                                     "\"top_k\": -1, \"seed\": 0, \"stop_token_ids\": []"));
    CHECK(r.sampling.max_tokens == 2147483647);
    CHECK(r.sampling.temperature == 2.0f);
    CHECK(accept(ep, body_with(ep, R"("temperature": 1e-6)")).sampling.temperature ==
          specdec::ops::kSampleMinTemperature);
    CHECK(r.sampling.top_k == -1);
    CHECK(r.sampling.seed == std::optional<uint64_t>(0));
    CHECK(r.sampling.stop_token_ids.empty());
  }
  reject(Endpoint::kCompletions, R"({"prompt": [5, -1]})", "prompt[1]",
         {"'prompt[1]'", "between 0 and 2147483647", "got -1"});
  reject(Endpoint::kGenerate, R"({"input_ids": [2147483648]})", "input_ids[0]",
         {"'input_ids[0]'", "between 0 and 2147483647", "got 2147483648"});
  reject(Endpoint::kCompletions, R"({"prompt": ""})", "prompt", {"'prompt' is an empty string"});
  reject(Endpoint::kCompletions, R"({"prompt": []})", "prompt", {"'prompt' is an empty array"});
  reject(Endpoint::kCompletions, R"({"prompt": [[]]})", "prompt[0]",
         {"'prompt[0]' is an empty array"});
  reject(Endpoint::kGenerate, R"({"text": ""})", "text", {"'text' is an empty string"});
  reject(Endpoint::kGenerate, R"({"input_ids": []})", "input_ids",
         {"'input_ids' is an empty array"});
  reject(Endpoint::kChatCompletions, R"({"messages": []})", "messages", {"'messages' is empty"});
  reject(Endpoint::kChatCompletions, R"({"messages": [{"role": "robot", "content": "x"}]})",
         "messages[0].role",
         {"'messages[0].role'", "system, user, assistant, tool, developer", "\"robot\""});
  reject(Endpoint::kCompletions, R"({"prompt": "x", "stream_options": {"include_usage": true}})",
         "stream_options", {"'stream_options'", "'stream': true"});
  reject(Endpoint::kCompletions,
         R"({"prompt": "x", "stream": false, "stream_options": {"include_usage": true}})",
         "stream_options", {"'stream_options'", "'stream': true"});
  reject(Endpoint::kCompletions, R"({"prompt": "x", "best_of": 0})", "best_of",
         {"'best_of'", "between 1 and 2147483647", "got 0"});
}

TEST_CASE("errors: n other than 1") {
  for (Endpoint ep : kAll) {
    CAPTURE(specdec::serve::endpoint_name(ep));
    for (std::string const n : {"2", "0", "-1", "1.5", "100000000000"}) {
      ApiError const e = reject(ep, body_with(ep, member("n", n)), param_of(ep, "n"),
                                {quoted(param_of(ep, "n")) + " = " + n, "only 1 is supported"});
      CHECK(e.code == "unsupported_value");
    }
    CHECK(accept(ep, body_with(ep, R"("n": 1.0)")).sampling.max_tokens >= 1);
  }
}

TEST_CASE("errors: batches of prompts") {
  reject(Endpoint::kCompletions, R"({"prompt": ["a", "b"]})", "prompt",
         {"'prompt' holds 2 prompts", "one prompt per request"});
  reject(Endpoint::kCompletions, R"({"prompt": [[1], [2], [3]]})", "prompt",
         {"'prompt' holds 3 prompts", "one prompt per request"});
  reject(Endpoint::kGenerate, R"({"text": ["a"]})", "text",
         {"'text' holds 1 prompts", "one request per call"});
  reject(Endpoint::kGenerate, R"({"input_ids": [[1, 2], [3]]})", "input_ids",
         {"'input_ids' holds 2 prompts", "one request per call"});
}

TEST_CASE("errors: fields this server does not support") {
  auto const unsupported = [](Endpoint ep, std::string const& body, std::string const& param) {
    ApiError const e = reject(ep, body, param, {"'" + param + "'", "not supported"});
    CHECK(e.code == "unsupported_parameter");
  };
  Endpoint const c = Endpoint::kCompletions, chat = Endpoint::kChatCompletions,
                 g = Endpoint::kGenerate;
  unsupported(c, R"({"prompt": "x", "echo": true})", "echo");
  unsupported(c, R"({"prompt": "x", "logprobs": 5})", "logprobs");
  unsupported(c, R"({"prompt": "x", "logprobs": 0})", "logprobs");
  unsupported(c, R"({"prompt": "x", "best_of": 2})", "best_of");
  unsupported(c, R"({"prompt": "x", "suffix": "tail"})", "suffix");
  unsupported(c, R"({"prompt": "x", "frequency_penalty": 0.5})", "frequency_penalty");
  unsupported(c, R"({"prompt": "x", "presence_penalty": -1})", "presence_penalty");
  unsupported(c, R"({"prompt": "x", "logit_bias": {"50256": -100}})", "logit_bias");
  std::string const m = R"("messages": [{"role": "user", "content": "q"}])";
  unsupported(chat, "{" + m + R"(, "tools": [{"type": "function", "function": {"name": "f"}}]})",
              "tools");
  unsupported(chat, "{" + m + R"(, "tool_choice": "auto"})", "tool_choice");
  unsupported(chat, "{" + m + R"(, "response_format": {"type": "json_object"}})",
              "response_format");
  unsupported(chat, "{" + m + R"(, "logprobs": true})", "logprobs");
  unsupported(chat, "{" + m + R"(, "top_logprobs": 3})", "top_logprobs");
  unsupported(chat, "{" + m + R"(, "repetition_penalty": 1.1})", "repetition_penalty");
  unsupported(g, R"({"text": "a", "return_logprob": true})", "return_logprob");
  unsupported(g, R"({"text": "a", "sampling_params": {"regex": "[a-z]+"}})",
              "sampling_params.regex");
  unsupported(g, R"({"text": "a", "sampling_params": {"min_new_tokens": 4}})",
              "sampling_params.min_new_tokens");
  unsupported(g, R"({"text": "a", "sampling_params": {"no_stop_trim": true}})",
              "sampling_params.no_stop_trim");
  unsupported(g, R"({"text": "a", "sampling_params": {"skip_special_tokens": false}})",
              "sampling_params.skip_special_tokens");
  // vLLM's extensions of the OpenAI endpoints.
  for (Endpoint ep : {c, chat}) {
    unsupported(ep, body_with(ep, R"("min_tokens": 3)"), "min_tokens");
    unsupported(ep, body_with(ep, R"("use_beam_search": true)"), "use_beam_search");
    unsupported(ep, body_with(ep, R"("guided_json": {"type": "object"})"), "guided_json");
    unsupported(ep, body_with(ep, R"("guided_regex": "[0-9]+")"), "guided_regex");
    unsupported(ep, body_with(ep, R"("guided_choice": ["a", "b"])"), "guided_choice");
    unsupported(ep, body_with(ep, R"("skip_special_tokens": false)"), "skip_special_tokens");
    accept(ep, body_with(ep, R"("min_tokens": 0, "use_beam_search": false, "guided_json": null,
                                "skip_special_tokens": true)"));
  }
  unsupported(chat, "{" + m + R"(, "add_generation_prompt": false})", "add_generation_prompt");
  unsupported(chat, "{" + m + R"(, "continue_final_message": true})", "continue_final_message");
  unsupported(chat, "{" + m + R"(, "chat_template_kwargs": {"thinking": true}})",
              "chat_template_kwargs");
  unsupported(chat, "{" + m + R"(, "echo": true})", "echo");
  unsupported(chat,
              R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant",
                  "content": "", "tool_calls": [{"id": "1", "type": "function"}]}]})",
              "messages[1].tool_calls");
  accept(chat, R"({"messages": [{"role": "user", "content": "q", "tool_calls": []}],
                   "add_generation_prompt": true, "chat_template_kwargs": {}})");
  // Non-text content parts name the part's type.
  ApiError const e =
      reject(chat,
             R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"},
          {"type": "image_url", "image_url": {"url": "http://x"}}]}]})",
             "messages[0].content[1].type",
             {"'messages[0].content[1].type'", "\"image_url\"", "not supported", "text"});
  CHECK(e.code == "unsupported_value");
}

TEST_CASE("errors: /generate's sampling fields outside sampling_params, or by OpenAI's names") {
  Endpoint const g = Endpoint::kGenerate;
  for (std::string const key : {"temperature", "max_new_tokens", "max_tokens", "top_k", "stop",
                                "regex", "skip_special_tokens"}) {
    reject(g, R"({"text": "a", ")" + key + R"(": 0})", key,
           {"'" + key + "' = 0", "belongs in sampling_params"});
  }
  for (std::string const key : {"max_tokens", "max_completion_tokens"}) {
    reject(g, R"({"text": "a", "sampling_params": {")" + key + R"(": 5}})",
           "sampling_params." + key, {"OpenAI's name", "max_new_tokens"});
  }
}

TEST_CASE("errors: an empty model or rid, which would read as not given") {
  for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChatCompletions}) {
    reject(ep, body_with(ep, R"("model": "")"), "model", {"'model' is an empty string"});
  }
  reject(Endpoint::kGenerate, R"({"text": "a", "rid": ""})", "rid",
         {"'rid' is an empty string"});
  CHECK(accept(Endpoint::kGenerate, R"({"text": "a", "rid": "r-1"})").rid ==
        std::optional<std::string>("r-1"));
  CHECK_FALSE(accept(Endpoint::kGenerate, R"({"text": "a", "rid": null})").rid.has_value());
}

TEST_CASE("check_vocabulary names the first id outside the vocabulary by its element") {
  auto const outside = [](Endpoint ep, std::string const& body, std::string const& param,
                          std::string const& value) {
    ParsedRequest const r = accept(ep, body);
    auto const e = specdec::serve::check_vocabulary(r, 512);
    REQUIRE(e.has_value());
    CHECK(e->status == 400);
    CHECK(e->param == param);
    CHECK(e->code == "invalid_value");
    CHECK_MESSAGE(contains(e->message, "'" + param + "' = " + value +
                                           " is outside the model's vocabulary [0, 512)"),
                  e->message);
  };
  outside(Endpoint::kCompletions, R"({"prompt": [1, 511, 512]})", "prompt[2]", "512");
  outside(Endpoint::kCompletions, R"({"prompt": [[7, 9000]]})", "prompt[0][1]", "9000");
  outside(Endpoint::kGenerate, R"({"input_ids": [600]})", "input_ids[0]", "600");
  outside(Endpoint::kCompletions, R"({"prompt": "x", "stop_token_ids": [3, 512]})",
          "stop_token_ids[1]", "512");
  outside(Endpoint::kGenerate, R"({"text": "x", "sampling_params": {"stop_token_ids": [999]}})",
          "sampling_params.stop_token_ids[0]", "999");
  // Inside it, and a text prompt (the tokenizer's ids are the model's): no error.
  CHECK_FALSE(specdec::serve::check_vocabulary(
      accept(Endpoint::kCompletions, R"({"prompt": [0, 511], "stop_token_ids": [511]})"), 512));
  CHECK_FALSE(specdec::serve::check_vocabulary(accept(Endpoint::kGenerate, R"({"text": "x"})"),
                                               512));
}

TEST_CASE("errors: a server default below 1 is a server bug (500)") {
  ParsedRequest r;
  auto e = specdec::serve::parse_completions(R"({"prompt": "x"})", 0, &r);
  REQUIRE(e.has_value());
  CHECK(e->status == 500);
  CHECK(e->type == "server_error");
  CHECK(contains(e->message, "default_max_tokens = 0"));
  e = specdec::serve::parse_chat_completions(R"({"messages": []})", -1, &r);
  REQUIRE(e.has_value());
  CHECK(e->status == 500);
}

TEST_CASE("ApiError::body is OpenAI's error object") {
  ApiError e;
  e.message = "'top_p' must be ...";
  e.param = "top_p";
  json const b = e.body();
  CHECK(b.size() == 2);
  CHECK(b.at("object") == "error");
  json const& inner = b.at("error");
  CHECK(inner.size() == 4);
  CHECK(inner.at("message") == "'top_p' must be ...");
  CHECK(inner.at("type") == "invalid_request_error");
  CHECK(inner.at("param") == "top_p");
  CHECK(inner.at("code").is_null());

  ApiError f{503, "server_error", "overloaded", "", "queue_full"};
  json const c = f.body();
  CHECK(c.at("error").at("param").is_null());
  CHECK(c.at("error").at("code") == "queue_full");
  CHECK(c.at("error").at("type") == "server_error");
}

// ---- Responses ----------------------------------------------------------------------------------

std::vector<std::string> keys(json const& j) {
  std::vector<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.push_back(it.key());
  std::sort(k.begin(), k.end());
  return k;
}

using Keys = std::vector<std::string>;

TEST_CASE("usage_json") {
  json const u = specdec::serve::usage_json(12, 30);
  CHECK(keys(u) == Keys{"completion_tokens", "prompt_tokens", "total_tokens"});
  CHECK(u.at("prompt_tokens") == 12);
  CHECK(u.at("completion_tokens") == 30);
  CHECK(u.at("total_tokens") == 42);
}

TEST_CASE("completion_response and completion_chunk") {
  json const usage = specdec::serve::usage_json(3, 4);
  json const r = json::parse(
      specdec::serve::completion_response("cmpl-1", 1700000000, "kimi", "hello", "stop", usage)
          .dump());
  CHECK(keys(r) == Keys{"choices", "created", "id", "model", "object", "usage"});
  CHECK(r.at("id") == "cmpl-1");
  CHECK(r.at("object") == "text_completion");
  CHECK(r.at("created") == 1700000000);
  CHECK(r.at("model") == "kimi");
  CHECK(r.at("usage") == usage);
  REQUIRE(r.at("choices").is_array());
  REQUIRE(r.at("choices").size() == 1);
  json const& c = r.at("choices")[0];
  CHECK(keys(c) == Keys{"finish_reason", "index", "logprobs", "text"});
  CHECK(c.at("index") == 0);
  CHECK(c.at("text") == "hello");
  CHECK(c.at("logprobs").is_null());
  CHECK(c.at("finish_reason") == "stop");

  json const k = specdec::serve::completion_chunk("cmpl-1", 5, "kimi", "he", std::nullopt);
  CHECK(keys(k) == Keys{"choices", "created", "id", "model", "object"});
  CHECK(k.at("object") == "text_completion");
  CHECK(keys(k.at("choices")[0]) == Keys{"finish_reason", "index", "logprobs", "text"});
  CHECK(k.at("choices")[0].at("text") == "he");
  CHECK(k.at("choices")[0].at("finish_reason").is_null());
  json const last = specdec::serve::completion_chunk("cmpl-1", 5, "kimi", "", "length", true);
  CHECK(last.at("choices")[0].at("finish_reason") == "length");
  CHECK(last.at("usage").is_null());
  CHECK(keys(last) == Keys{"choices", "created", "id", "model", "object", "usage"});
}

TEST_CASE("chat_response and chat_chunk") {
  json const usage = specdec::serve::usage_json(10, 2);
  json const r = specdec::serve::chat_response("chatcmpl-9", 77, "kimi", "Hi!", "length", usage);
  CHECK(keys(r) == Keys{"choices", "created", "id", "model", "object", "usage"});
  CHECK(r.at("object") == "chat.completion");
  CHECK(r.at("id") == "chatcmpl-9");
  CHECK(r.at("created") == 77);
  CHECK(r.at("usage").at("total_tokens") == 12);
  REQUIRE(r.at("choices").size() == 1);
  json const& c = r.at("choices")[0];
  CHECK(keys(c) == Keys{"finish_reason", "index", "logprobs", "message"});
  CHECK(c.at("index") == 0);
  CHECK(c.at("message") == json{{"role", "assistant"}, {"content", "Hi!"}});
  CHECK(c.at("logprobs").is_null());
  CHECK(c.at("finish_reason") == "length");

  json const first =
      specdec::serve::chat_chunk("chatcmpl-9", 77, "kimi", "assistant", "", std::nullopt);
  CHECK(keys(first) == Keys{"choices", "created", "id", "model", "object"});
  CHECK(first.at("object") == "chat.completion.chunk");
  json const& fc = first.at("choices")[0];
  CHECK(keys(fc) == Keys{"delta", "finish_reason", "index", "logprobs"});
  CHECK(fc.at("delta") == json{{"role", "assistant"}, {"content", ""}});
  CHECK(fc.at("finish_reason").is_null());

  json const mid =
      specdec::serve::chat_chunk("chatcmpl-9", 77, "kimi", std::nullopt, "lo", std::nullopt);
  CHECK(mid.at("choices")[0].at("delta") == json{{"content", "lo"}});

  json const end = specdec::serve::chat_chunk("chatcmpl-9", 77, "kimi", std::nullopt, std::nullopt,
                                              "stop", true);
  CHECK(end.at("choices")[0].at("delta").is_object());
  CHECK(end.at("choices")[0].at("delta").empty());
  CHECK(end.at("choices")[0].at("finish_reason") == "stop");
  CHECK(end.at("usage").is_null());
  CHECK(specdec::serve::sse_data(end).find("\"delta\":{}") != std::string::npos);
}

TEST_CASE("usage_chunk and models_response") {
  json const usage = specdec::serve::usage_json(1, 2);
  json const u =
      specdec::serve::usage_chunk("chatcmpl-1", 3, "kimi", "chat.completion.chunk", usage);
  CHECK(keys(u) == Keys{"choices", "created", "id", "model", "object", "usage"});
  CHECK(u.at("object") == "chat.completion.chunk");
  CHECK(u.at("choices").is_array());
  CHECK(u.at("choices").empty());
  CHECK(u.at("usage") == usage);
  CHECK(specdec::serve::sse_data(u).find("\"choices\":[]") != std::string::npos);

  json const m = specdec::serve::models_response("kimi-k2.5", 1700000000, "specdec", 262144);
  CHECK(keys(m) == Keys{"data", "object"});
  CHECK(m.at("object") == "list");
  REQUIRE(m.at("data").size() == 1);
  json const& d = m.at("data")[0];
  CHECK(keys(d) == Keys{"created", "id", "max_model_len", "object", "owned_by", "root"});
  CHECK(d.at("id") == "kimi-k2.5");
  CHECK(d.at("object") == "model");
  CHECK(d.at("created") == 1700000000);
  CHECK(d.at("owned_by") == "specdec");
  CHECK(d.at("root") == "kimi-k2.5");
  CHECK(d.at("max_model_len") == 262144);
}

TEST_CASE("sse framing") {
  json const j = {{"a", 1}, {"b", "x y"}};
  CHECK(specdec::serve::sse_data(j) == "data: {\"a\":1,\"b\":\"x y\"}\n\n");
  CHECK(specdec::serve::sse_done() == "data: [DONE]\n\n");
  // A newline inside text is escaped, so one event stays on one line.
  std::string const s = specdec::serve::sse_data(json{{"text", "a\nb"}});
  CHECK(s == "data: {\"text\":\"a\\nb\"}\n\n");
  CHECK(std::count(s.begin(), s.end(), '\n') == 2);
  // A token cut mid-character does not throw; it becomes U+FFFD.
  std::string const cut = "ok \xE4\xBD";
  std::string out;
  CHECK_NOTHROW(out = specdec::serve::sse_data(json{{"text", cut}}));
  CHECK(out.find("ok \xEF\xBF\xBD") != std::string::npos);
}

// ---- StopStringMatcher --------------------------------------------------------------------------

struct Fed {
  std::string emitted;
  bool stopped = false;
};

// Feeds `chunks` in order, then flushes when no stop matched.
Fed run_matcher(std::vector<std::string> const& stops, std::vector<std::string> const& chunks) {
  StopStringMatcher m(stops);
  Fed f;
  for (auto const& c : chunks) {
    bool stopped = false;
    std::string const out = m.feed(c, &stopped);
    if (f.stopped) CHECK(out.empty());
    f.emitted += out;
    f.stopped = stopped;
    CHECK(m.stopped() == stopped);
  }
  if (!f.stopped) f.emitted += m.flush();
  CHECK(m.flush().empty());
  return f;
}

std::vector<std::string> bytes_of(std::string const& s) {
  std::vector<std::string> out;
  for (char c : s) out.push_back(std::string(1, c));
  return out;
}

TEST_CASE("StopStringMatcher: hand-worked cases") {
  SUBCASE("a stop string split across feeds; the text after it is never emitted") {
    StopStringMatcher m({"STOP"});
    bool stopped = true;
    CHECK(m.feed("hello ST", &stopped) == "hello ");  // "ST" could start STOP
    CHECK_FALSE(stopped);
    CHECK(m.feed("O", &stopped) == "");
    CHECK_FALSE(stopped);
    CHECK(m.feed("P and more", &stopped) == "");
    CHECK(stopped);
    CHECK(m.feed("later", &stopped) == "");
    CHECK(stopped);
    CHECK(m.flush() == "");
  }
  SUBCASE("a false start is released") {
    StopStringMatcher m({"STOP"});
    bool stopped = true;
    CHECK(m.feed("ST", &stopped) == "");
    CHECK(m.feed("OX", &stopped) == "STOX");
    CHECK_FALSE(stopped);
    CHECK(m.flush() == "");
  }
  SUBCASE("one byte at a time") {
    Fed const f = run_matcher({"<|end|>"}, bytes_of("abc<|en<|end|>tail"));
    CHECK(f.emitted == "abc<|en");
    CHECK(f.stopped);
  }
  SUBCASE("overlapping prefixes: abcabd in abcabcabd") {
    Fed f = run_matcher({"abcabd"}, bytes_of("abcabcabd"));
    CHECK(f.emitted == "abc");
    CHECK(f.stopped);
    f = run_matcher({"abcabd"}, {"abcab", "cabd"});
    CHECK(f.emitted == "abc");
    CHECK(f.stopped);
    StopStringMatcher m({"abcabd"});
    bool stopped = false;
    CHECK(m.feed("abcab", &stopped) == "");  // all five bytes could start abcabd
    CHECK(m.feed("c", &stopped) == "abc");   // "abcabc": only the last "abc" still could
    CHECK(m.feed("abd!", &stopped) == "");
    CHECK(stopped);
  }
  SUBCASE("several stop strings: the earliest occurrence wins") {
    Fed f = run_matcher({"world", "lo w"}, {"hel", "lo wor", "ld"});
    CHECK(f.emitted == "hel");
    f = run_matcher({"xyz", "b"}, {"aaxy", "zb"});
    CHECK(f.emitted == "aa");
    // A shorter stop string that completes first wins over a longer one that started earlier.
    f = run_matcher({"abcd", "c"}, {"ab", "cd"});
    CHECK(f.emitted == "ab");
    f = run_matcher({"bcd", "abcx"}, bytes_of("zabcd"));
    CHECK(f.emitted == "za");
  }
  SUBCASE("no match: flush returns the held tail") {
    StopStringMatcher m({"</s>", "###"});
    bool stopped = true;
    CHECK(m.feed("answer </", &stopped) == "answer ");
    CHECK_FALSE(stopped);
    CHECK(m.feed("##", &stopped) == "</");  // "</##": "##" could start ###
    CHECK(m.flush() == "##");
    CHECK(m.flush() == "");
  }
  SUBCASE("stop string at the very start; empty feeds; no stop strings") {
    Fed f = run_matcher({"x"}, {"", "xyz"});
    CHECK(f.emitted == "");
    CHECK(f.stopped);
    f = run_matcher({}, {"a", "", "bc"});
    CHECK(f.emitted == "abc");
    CHECK_FALSE(f.stopped);
    StopStringMatcher m;
    CHECK(m.feed("plain", nullptr) == "plain");
  }
  SUBCASE("UTF-8 stop strings cut the text at a character boundary") {
    std::string const stop = "\xE3\x80\x82";  // U+3002 IDEOGRAPHIC FULL STOP
    Fed const f = run_matcher({stop}, bytes_of("\xE4\xBD\xA0\xE5\xA5\xBD" + stop + "\xE5\x86\x8D"));
    CHECK(f.emitted == "\xE4\xBD\xA0\xE5\xA5\xBD");
    CHECK(f.stopped);
  }
}

// The oracle: the start of the stop-string occurrence that completes first (smallest end; ties:
// smallest start), npos when none. With one stop string this is its earliest occurrence.
size_t first_stop(std::string const& text, std::vector<std::string> const& stops) {
  for (size_t end = 0; end <= text.size(); ++end) {
    size_t best = std::string::npos;
    for (auto const& s : stops) {
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) {
        best = std::min(best, end - s.size());
      }
    }
    if (best != std::string::npos) return best;
  }
  return std::string::npos;
}

// What may have been emitted after `text` was fed: the prefix before the first stop string, or
// else all but the longest tail that is a proper prefix of some stop string.
std::string expected_so_far(std::string const& text, std::vector<std::string> const& stops) {
  size_t const at = first_stop(text, stops);
  if (at != std::string::npos) return text.substr(0, at);
  for (size_t k = text.size(); k > 0; --k) {
    std::string const tail = text.substr(text.size() - k);
    for (auto const& s : stops) {
      if (s.size() > k && s.compare(0, k, tail) == 0) return text.substr(0, text.size() - k);
    }
  }
  return text;
}

TEST_CASE("StopStringMatcher: random strings against a brute-force oracle") {
  std::mt19937_64 rng(20240611);
  auto const uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::string const alphabet = "abc";
  auto const random_string = [&](int lo, int hi) {
    std::string s(static_cast<size_t>(uniform(lo, hi)), 'a');
    for (char& c : s) c = alphabet[static_cast<size_t>(uniform(0, 2))];
    return s;
  };
  int stopped_cases = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<std::string> stops(static_cast<size_t>(uniform(0, 3)));
    for (auto& s : stops) s = random_string(1, 5);
    std::string const text = random_string(0, 40);
    StopStringMatcher m(stops);
    std::string fed, emitted;
    bool stopped = false;
    size_t pos = 0;
    while (pos < text.size() || uniform(0, 3) == 0) {
      size_t const len = std::min(text.size() - pos, static_cast<size_t>(uniform(0, 7)));
      std::string const chunk = text.substr(pos, len);
      pos += len;
      fed += chunk;
      emitted += m.feed(chunk, &stopped);
      // After every feed the output is exactly the oracle's, and the flag says whether the text
      // fed so far holds a stop string.
      REQUIRE_MESSAGE(emitted == expected_so_far(fed, stops), "trial ", trial, " fed '", fed, "'");
      REQUIRE(stopped == (first_stop(fed, stops) != std::string::npos));
      if (pos == text.size() && uniform(0, 1) == 0) break;
    }
    if (!stopped) emitted += m.flush();
    size_t const at = first_stop(text, stops);
    std::string const want = at == std::string::npos ? text : text.substr(0, at);
    REQUIRE_MESSAGE(emitted == want, "trial ", trial, " text '", text, "'");
    stopped_cases += stopped ? 1 : 0;
  }
  // Both outcomes were exercised many times.
  CHECK(stopped_cases > 5000);
  CHECK(stopped_cases < 15000);
}

TEST_CASE("StopStringMatcher: one stop string, the earliest occurrence (text.find)") {
  std::mt19937_64 rng(77);
  auto const uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  auto const random_string = [&](int lo, int hi) {
    std::string s(static_cast<size_t>(uniform(lo, hi)), 'a');
    for (char& c : s) c = "ab"[uniform(0, 1)];
    return s;
  };
  for (int trial = 0; trial < 20000; ++trial) {
    std::string const stop = random_string(1, 6), text = random_string(0, 30);
    std::vector<std::string> chunks;
    for (size_t pos = 0; pos < text.size();) {
      size_t const len = std::min(text.size() - pos, static_cast<size_t>(uniform(1, 5)));
      chunks.push_back(text.substr(pos, len));
      pos += len;
    }
    Fed const f = run_matcher({stop}, chunks);
    size_t const at = text.find(stop);
    REQUIRE_MESSAGE(f.emitted == text.substr(0, at), "stop '", stop, "' text '", text, "'");
    REQUIRE(f.stopped == (at != std::string::npos));
  }
}

}  // namespace
