// compressed-tensors INT4: the Kimi-K2.5 quantization_config (both published ignore lists), every
// unsupported / malformed field, ignore-list matching (exact names, re.match prefix semantics),
// hand-packed INT4 words (worked out in the comments), per-group scales, the quantize ->
// dequantize error bound, and every shape error.
#include "specdec/io/compressed_tensors.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
using specdec::StatusCode;
using specdec::io::QuantizationConfig;

// Kimi-K2.5's quantization_config as kimi.md gives it.
json kimi_quant() {
  return json::parse(R"({
    "config_groups": {"group_0": {
      "input_activations": null, "output_activations": null, "targets": ["Linear"],
      "weights": {"actorder": null, "block_structure": null, "dynamic": false, "group_size": 32,
                  "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                  "symmetric": true, "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": null,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed"})");
}

specdec::Status parse(json const& j, QuantizationConfig* q) {
  return specdec::io::parse_quantization_config(j, "ckpt/config.json",
                                                "text_config.quantization_config", q);
}

// Mutates the Kimi config, parses, and checks the code and that the message names the file and
// `field` (its full path).
void expect_error(std::function<void(json&)> const& mutate, StatusCode code,
                  std::string const& field) {
  json j = kimi_quant();
  mutate(j);
  QuantizationConfig q;
  auto const s = parse(j, &q);
  INFO(s.to_string());
  CHECK(s.code() == code);
  CHECK(s.message().find("ckpt/config.json") != std::string::npos);
  CHECK(s.message().find(field) != std::string::npos);
}

uint16_t bf16(float f) { return specdec::float_to_bf16(f); }

}  // namespace

TEST_CASE("compressed_tensors: Kimi-K2.5 quantization_config parses") {
  QuantizationConfig q;
  REQUIRE(parse(kimi_quant(), &q).ok());
  CHECK(q.quant_method == "compressed-tensors");
  CHECK(q.format == "pack-quantized");
  CHECK(q.group_name == "group_0");
  CHECK(q.num_bits == 4);
  CHECK(q.type == "int");
  CHECK(q.symmetric);
  CHECK(q.strategy == "group");
  CHECK(q.group_size == 32);
  CHECK(q.targets == std::vector<std::string>{"Linear"});
  REQUIRE(q.ignore.size() == 4);
  CHECK(q.ignore[0].text == "lm_head");
  CHECK_FALSE(q.ignore[0].is_regex);
  CHECK(q.ignore[3].is_regex);
  // Optional keys may be absent.
  json j = kimi_quant();
  j.erase("quantization_status");
  j.erase("kv_cache_scheme");
  j.erase("ignore");
  j["config_groups"]["group_0"]["weights"].erase("actorder");
  j["config_groups"]["group_0"]["weights"].erase("dynamic");
  j["config_groups"]["group_0"].erase("input_activations");
  REQUIRE(parse(j, &q).ok());
  CHECK(q.ignore.empty());
}

TEST_CASE("compressed_tensors: unsupported schemes name the field") {
  auto W = [](json& j) -> json& { return j["config_groups"]["group_0"]["weights"]; };
  std::string const w = "text_config.quantization_config.config_groups.group_0.weights.";
  expect_error([](json& j) { j["quant_method"] = "fp8"; }, StatusCode::kUnsupported,
               "'text_config.quantization_config.quant_method'");
  expect_error([](json& j) { j["format"] = "float-quantized"; }, StatusCode::kUnsupported,
               "quantization_config.format");
  expect_error([](json& j) { j["quantization_status"] = "frozen"; }, StatusCode::kUnsupported,
               "quantization_status");
  expect_error(
      [](json& j) {
        j["kv_cache_scheme"] = json::object({{"num_bits", 8}});
      },
      StatusCode::kUnsupported, "kv_cache_scheme");
  expect_error([&](json& j) { W(j)["num_bits"] = 8; }, StatusCode::kUnsupported, w + "num_bits");
  expect_error(
      [&](json& j) {
        W(j)["symmetric"] = false;
      },
      StatusCode::kUnsupported, w + "symmetric");
  expect_error([&](json& j) { W(j)["type"] = "float"; }, StatusCode::kUnsupported, w + "type");
  expect_error(
      [&](json& j) {
        W(j)["strategy"] = "channel";
      },
      StatusCode::kUnsupported, w + "strategy");
  expect_error([&](json& j) { W(j)["dynamic"] = true; }, StatusCode::kUnsupported, w + "dynamic");
  expect_error(
      [&](json& j) {
        W(j)["actorder"] = "group";
      },
      StatusCode::kUnsupported, w + "actorder");
  expect_error(
      [](json& j) {
        j["config_groups"]["group_0"]["targets"] = {"Linear", "Embedding"};
      },
      StatusCode::kUnsupported, "group_0.targets");
  expect_error(
      [](json& j) {
        j["config_groups"]["group_0"]["input_activations"] = json::object({{"num_bits", 8}});
      },
      StatusCode::kUnsupported, "group_0.input_activations");
  expect_error([](json& j) { j["config_groups"]["group_0"]["format"] = "nvfp4-pack-quantized"; },
               StatusCode::kUnsupported, "group_0.format");
  expect_error([](json& j) { j["config_groups"]["group_1"] = j["config_groups"]["group_0"]; },
               StatusCode::kUnsupported, "config_groups");
}

TEST_CASE("compressed_tensors: malformed fields name the field") {
  auto W = [](json& j) -> json& { return j["config_groups"]["group_0"]["weights"]; };
  std::string const w = "text_config.quantization_config.config_groups.group_0.weights";
  expect_error([](json& j) { j.erase("quant_method"); }, StatusCode::kMalformedInput,
               "quantization_config.quant_method' is missing");
  expect_error([](json& j) { j.erase("config_groups"); }, StatusCode::kMalformedInput,
               "quantization_config.config_groups' is missing");
  expect_error([](json& j) { j["config_groups"]["group_0"].erase("weights"); },
               StatusCode::kMalformedInput, w + "' is missing");
  expect_error([&](json& j) { W(j).erase("group_size"); }, StatusCode::kMalformedInput,
               w + ".group_size' is missing");
  expect_error(
      [&](json& j) {
        W(j)["group_size"] = "32";
      },
      StatusCode::kMalformedInput, w + ".group_size' must be an integer");
  expect_error(
      [&](json& j) {
        W(j)["group_size"] = 0;
      },
      StatusCode::kInvalidArgument, w + ".group_size' = 0");
  expect_error(
      [&](json& j) {
        W(j)["num_bits"] = 4.5;
      },
      StatusCode::kMalformedInput, w + ".num_bits' must be an integer");
  expect_error(
      [&](json& j) {
        W(j)["symmetric"] = "true";
      },
      StatusCode::kMalformedInput, w + ".symmetric' must be a boolean");
  expect_error([](json& j) { j["ignore"] = "lm_head"; }, StatusCode::kMalformedInput,
               "quantization_config.ignore' must be an array");
  expect_error([](json& j) { j["ignore"].push_back(3); }, StatusCode::kMalformedInput,
               "quantization_config.ignore[4]' must be a string");
  expect_error([](json& j) { j["ignore"].push_back("re:(unclosed"); }, StatusCode::kMalformedInput,
               "quantization_config.ignore[4]' = \"re:(unclosed\": not a valid regex");
  QuantizationConfig q;
  auto const s = parse(json::array(), &q);
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(s.message().find("text_config.quantization_config' must be an object") !=
        std::string::npos);
}

TEST_CASE("compressed_tensors: is_quantized on Kimi module names") {
  QuantizationConfig q;
  REQUIRE(parse(kimi_quant(), &q).ok());
  using specdec::io::is_quantized;
  CHECK(is_quantized(q, "language_model.model.layers.3.mlp.experts.17.down_proj"));
  CHECK(is_quantized(q, "model.layers.60.mlp.experts.383.gate_proj"));
  CHECK(is_quantized(q, "model.layers.1.mlp.experts.0.up_proj"));
  CHECK_FALSE(is_quantized(q, "language_model.model.layers.3.self_attn.q_a_proj"));
  CHECK_FALSE(is_quantized(q, "model.layers.3.self_attn.kv_b_proj"));
  CHECK_FALSE(is_quantized(q, "language_model.model.layers.3.mlp.shared_experts.gate_proj"));
  CHECK_FALSE(is_quantized(q, "language_model.model.layers.0.mlp.gate_proj"));
  CHECK_FALSE(is_quantized(q, "model.layers.0.mlp.down_proj"));
  CHECK_FALSE(is_quantized(q, "lm_head"));
  // Exact entries match only the identical name (compressed-tensors' rule): the scope matters.
  CHECK(is_quantized(q, "language_model.lm_head"));
  CHECK(is_quantized(q, "lm_head2"));
}

TEST_CASE("compressed_tensors: 're:' is re.match, anchored at the start only") {
  json j = kimi_quant();
  j["ignore"] = {"re:vision_tower.*", "re:.*lm_head", "re:mm_projector"};
  QuantizationConfig q;
  REQUIRE(parse(j, &q).ok());
  using specdec::io::is_quantized;
  CHECK_FALSE(is_quantized(q, "vision_tower.blocks.0.attn"));
  CHECK(is_quantized(q, "language_model.vision_tower.x"));  // not at the start
  CHECK_FALSE(is_quantized(q, "language_model.lm_head"));
  CHECK_FALSE(is_quantized(q, "language_model.lm_head_extra"));  // a prefix match suffices
  CHECK_FALSE(is_quantized(q, "mm_projector.proj.0"));           // likewise, no trailing .*
  CHECK(is_quantized(q, "model.layers.1.mlp.experts.0.up_proj"));
}

TEST_CASE("compressed_tensors: hand-packed words dequantize") {
  // Row 0, values [-8 -1 0 1 2 3 7 -5] -> nibbles (v+8) [0 7 8 9 A B F 3], element i in bits
  // 4i..4i+3: the word read from the top nibble down is 0x3FBA9870. Scale 0.5.
  // Row 1, values [7 7 7 7 7 7 7 0] -> nibbles [F F F F F F F 8] -> 0x8FFFFFFF, a negative int32
  // (2415919103 - 2^32 = -1879048193). Scale 2.
  std::vector<int32_t> packed = {0x3FBA9870, -1879048193};
  std::vector<uint16_t> scales = {0x3F00, 0x4000};  // bf16 0.5, 2.0
  std::vector<float> W(16, -99.0f);
  REQUIRE(specdec::io::dequantize_int4_group(packed.data(), scales.data(), 2, 8, 8, W.data()).ok());
  std::vector<float> const want = {-4, -0.5f, 0,  0.5f, 1,  1.5f, 3.5f, -2.5f,
                                   14, 14,    14, 14,   14, 14,   14,   0};
  CHECK(W == want);
}

TEST_CASE("compressed_tensors: one scale per (row, group)") {
  // One row, in 16, group 8: group 0 all +1 (nibble 9: 0x99999999), scale 0.25 (bf16 0x3E80);
  // group 1 all -2 (nibble 6: 0x66666666), scale 3 (bf16 0x4040).
  std::vector<int32_t> packed = {static_cast<int32_t>(0x99999999u), 0x66666666};
  std::vector<uint16_t> scales = {0x3E80, 0x4040};
  std::vector<float> W(16);
  REQUIRE(
      specdec::io::dequantize_int4_group(packed.data(), scales.data(), 1, 16, 8, W.data()).ok());
  for (int k = 0; k < 8; ++k) CHECK(W[k] == 0.25f);
  for (int k = 8; k < 16; ++k) CHECK(W[k] == -6.0f);

  // Quantizing: group 0 max |W| 7 -> scale 1; group 1 max |W| 14 -> scale 2.
  std::vector<float> src = {7, -7, 2.5f, -2.5f, 3.5f, 0.6f, 0, -0.4f, 14, 1, 1, 1, 1, 1, 1, -3};
  std::vector<int32_t> p(2);
  std::vector<uint16_t> s(2);
  REQUIRE(specdec::io::quantize_int4_group(src.data(), 1, 16, 8, p.data(), s.data()).ok());
  CHECK(s == std::vector<uint16_t>{0x3F80, 0x4000});
  // Group 0: q = [7 -7 2 -2 4 1 0 0] (2.5 and -2.5 tie to even, 3.5 to 4, -0.4 to 0)
  // -> nibbles [F 1 A 6 C 9 8 8] -> 0x889C6A1F.
  CHECK(static_cast<uint32_t>(p[0]) == 0x889C6A1Fu);
  // Group 1 / 2: [7 0.5 0.5 0.5 0.5 0.5 0.5 -1.5] -> q [7 0 0 0 0 0 0 -2] (0.5 ties to 0,
  // -1.5 to -2) -> nibbles [F 8 8 8 8 8 8 6] -> 0x6888888F.
  CHECK(static_cast<uint32_t>(p[1]) == 0x6888888Fu);
}

TEST_CASE("compressed_tensors: quantize -> dequantize round trip error bound") {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  int64_t const out = 5, in = 96, group = 32, groups = in / group;
  std::vector<float> W(out * in);
  for (auto& x : W) x = dist(rng);
  W[3] = 1.0f;  // an outlier in row 0, group 0: that group's scale is 1/7 (in bf16)
  std::vector<int32_t> packed(out * in / 8);
  std::vector<uint16_t> scales(out * groups);
  REQUIRE(specdec::io::quantize_int4_group(W.data(), out, in, group, packed.data(), scales.data())
              .ok());
  std::vector<float> back(out * in);
  REQUIRE(
      specdec::io::dequantize_int4_group(packed.data(), scales.data(), out, in, group, back.data())
          .ok());
  CHECK(scales[0] == bf16(1.0f / 7.0f));
  for (int64_t n = 0; n < out; ++n) {
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (int64_t k = g * group; k < (g + 1) * group; ++k)
        amax = std::max(amax, std::fabs(W[n * in + k]));
      float const scale = specdec::bf16_to_float(scales[n * groups + g]);
      CHECK(scale == specdec::bf16_to_float(bf16(amax / 7.0f)));
      float const bound = std::max(scale / 2, amax - 7 * scale) * (1 + 1e-5f);
      for (int64_t k = g * group; k < (g + 1) * group; ++k) {
        CHECK(std::fabs(back[n * in + k] - W[n * in + k]) <= bound);
        // Dequantized values are integer multiples of the scale in [-8, 7].
        float const q = back[n * in + k] / scale;
        CHECK(q == std::nearbyint(q));
        CHECK(q >= -8);
        CHECK(q <= 7);
      }
    }
  }
  // An all-zero group: scale 0, every value 0 (nibble 8).
  std::vector<float> zero(8, 0.0f);
  REQUIRE(
      specdec::io::quantize_int4_group(zero.data(), 1, 8, 8, packed.data(), scales.data()).ok());
  CHECK(scales[0] == 0);
  CHECK(static_cast<uint32_t>(packed[0]) == 0x88888888u);
}

TEST_CASE("compressed_tensors: shape errors name the problem") {
  std::vector<int32_t> p(64);
  std::vector<uint16_t> s(64);
  std::vector<float> w(256, 1.0f);
  auto deq = [&](int64_t out, int64_t in, int64_t group) {
    return specdec::io::dequantize_int4_group(p.data(), s.data(), out, in, group, w.data());
  };
  auto q = [&](int64_t out, int64_t in, int64_t group) {
    return specdec::io::quantize_int4_group(w.data(), out, in, group, p.data(), s.data());
  };
  for (auto const& f : {std::function<specdec::Status(int64_t, int64_t, int64_t)>(deq),
                        std::function<specdec::Status(int64_t, int64_t, int64_t)>(q)}) {
    auto st = f(2, 12, 4);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find("in = 12 is not a multiple of 8") != std::string::npos);
    st = f(2, 16, 12);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find("in = 16 is not a multiple of the group size 12") != std::string::npos);
    st = f(2, 16, 0);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find("group size 0") != std::string::npos);
    st = f(0, 16, 8);
    CHECK(st.code() == StatusCode::kInvalidArgument);
    CHECK(st.message().find("shape [0, 16]") != std::string::npos);
  }
  auto st = specdec::io::dequantize_int4_group(nullptr, s.data(), 1, 8, 8, w.data());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("dequantize_int4_group: null pointer") != std::string::npos);
  w[9] = std::nanf("");
  st = q(2, 16, 8);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("W[0, 9] is not finite") != std::string::npos);
}
