// hf_config: a Kimi-K2.5-shaped config.json (nested text_config, quantization_config with the
// exact ignore list) and a flat DeepSeek-V3 / Kimi-K2 one, written to a temp dir and loaded;
// derived values worked out by hand; every missing field, wrong type and unworkable value.
#include "specdec/io/hf_config.hpp"
#include "support/testing.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
using specdec::StatusCode;
using specdec::io::DeepseekV3Config;

// Kimi-K2.5's config.json with the values of kimi.md (vision_config abridged).
json kimi_k25() {
  return json::parse(R"({
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839,
    "tie_word_embeddings": false,
    "vision_config": {"vt_hidden_size": 1152},
    "text_config": {
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
      "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 64,
      "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1,
      "moe_intermediate_size": 2048, "intermediate_size": 18432,
      "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
      "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
      "routed_scaling_factor": 2.827, "vocab_size": 163840, "rms_norm_eps": 1e-05,
      "rope_theta": 50000.0,
      "rope_scaling": {"type": "yarn", "factor": 64.0, "beta_fast": 32.0, "beta_slow": 1.0,
                       "mscale": 1.0, "mscale_all_dim": 1.0,
                       "original_max_position_embeddings": 4096},
      "max_position_embeddings": 262144,
      "bos_token_id": 163584, "eos_token_id": 163585, "pad_token_id": 163839,
      "hidden_act": "silu", "attention_bias": false, "torch_dtype": "bfloat16",
      "quantization_config": {
        "config_groups": {"group_0": {
          "input_activations": null, "output_activations": null, "targets": ["Linear"],
          "weights": {"actorder": null, "dynamic": false, "group_size": 32, "num_bits": 4,
                      "strategy": "group", "symmetric": true, "type": "int"}}},
        "format": "pack-quantized",
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                   "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
        "kv_cache_scheme": null, "quant_method": "compressed-tensors",
        "quantization_status": "compressed"}
    }})");
}

// A flat DeepseekV3 config (Kimi-K2-Instruct values of kimi.md), unquantized.
json flat_k2() {
  json j = kimi_k25()["text_config"];
  j.erase("quantization_config");
  j["model_type"] = "kimi_k2";
  j["rms_norm_eps"] = 1e-6;
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = json::parse(R"({"type": "yarn", "factor": 32.0, "beta_fast": 1.0,
      "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
      "original_max_position_embeddings": 4096})");
  return j;
}

specdec::Status parse(json const& j, DeepseekV3Config* c) {
  return specdec::io::parse_config(j.dump(), "ckpt/config.json", c);
}

// Mutates `base`, parses it, checks the code and that the message names the file and `text`.
void expect_error(json base, std::function<void(json&)> const& mutate, StatusCode code,
                  std::string const& text) {
  mutate(base);
  DeepseekV3Config c;
  auto const s = parse(base, &c);
  INFO(s.to_string());
  CHECK(s.code() == code);
  CHECK(s.message().find("ckpt/config.json") != std::string::npos);
  CHECK(s.message().find(text) != std::string::npos);
}

}  // namespace

TEST_CASE("hf_config: Kimi-K2.5 from a checkpoint directory") {
  specdec::testing::TempDir const scratch;
  auto const& dir = scratch.path;
  { std::ofstream(dir / "config.json") << kimi_k25().dump(2); }
  DeepseekV3Config c;
  auto const s = specdec::io::load_config(dir, &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(c.source == (dir / "config.json").string());
  CHECK(c.model_type == "kimi_k25");
  CHECK(c.wrapper_prefix == "language_model.");
  CHECK(c.tensor_prefix == "language_model.model.");
  CHECK(c.lm_head_prefix == "language_model.lm_head.");
  CHECK(c.hidden_size == 7168);
  CHECK(c.num_hidden_layers == 61);
  CHECK(c.num_attention_heads == 64);
  REQUIRE(c.q_lora_rank.has_value());
  CHECK(*c.q_lora_rank == 1536);
  CHECK(c.kv_lora_rank == 512);
  CHECK(c.qk_nope_head_dim == 128);
  CHECK(c.qk_rope_head_dim == 64);
  CHECK(c.v_head_dim == 128);
  CHECK(c.qk_head_dim() == 192);
  CHECK(c.n_routed_experts == 384);
  CHECK(c.num_experts_per_tok == 8);
  CHECK(c.n_shared_experts == 1);
  CHECK(c.moe_intermediate_size == 2048);
  CHECK(c.intermediate_size == 18432);
  CHECK(c.first_k_dense_replace == 1);
  CHECK(c.moe_layer_freq == 1);
  CHECK(c.n_group == 1);
  CHECK(c.topk_group == 1);
  CHECK(c.topk_method == specdec::io::TopkMethod::kNoauxTc);
  CHECK(c.scoring_func == specdec::io::ScoringFunc::kSigmoid);
  CHECK(c.norm_topk_prob);
  CHECK(c.routed_scaling_factor == 2.827);
  CHECK(c.vocab_size == 163840);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.rope_theta == 50000.0);
  REQUIRE(c.rope_scaling.has_value());
  CHECK(c.rope_scaling->factor == 64.0);
  CHECK(c.rope_scaling->beta_fast == 32.0);
  CHECK(c.rope_scaling->beta_slow == 1.0);
  CHECK(c.rope_scaling->mscale == 1.0);
  CHECK(c.rope_scaling->mscale_all_dim == 1.0);
  CHECK(c.rope_scaling->original_max_position_embeddings == 4096);
  CHECK(c.max_position_embeddings == 262144);
  CHECK(c.bos_token_id == 163584);
  CHECK(c.eos_token_ids == std::vector<int64_t>{163585});
  REQUIRE(c.pad_token_id.has_value());
  CHECK(*c.pad_token_id == 163839);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.hidden_act == "silu");
  CHECK_FALSE(c.attention_bias);
  CHECK(c.torch_dtype == "bfloat16");
  REQUIRE(c.quantization.has_value());
  CHECK(c.quantization_path == "text_config.quantization_config");
  CHECK(c.quantization->group_size == 32);
  CHECK(c.quantization->ignore.size() == 4);

  // Layer 0 dense, 1..60 MoE.
  CHECK_FALSE(c.is_moe_layer(0));
  CHECK(c.is_moe_layer(1));
  CHECK(c.is_moe_layer(60));
  CHECK_FALSE(c.is_moe_layer(61));
  CHECK_FALSE(c.is_moe_layer(-1));
  CHECK(c.num_moe_layers() == 60);
  // mscale = 0.1 * ln 64 + 1 = 1.4158883; scale = 192^-0.5 * mscale^2 = 0.0721688 * 2.0047399.
  CHECK(c.attention_mscale() == doctest::Approx(1.4158883).epsilon(1e-7));
  CHECK(c.softmax_scale() == doctest::Approx(0.144680).epsilon(1e-5));
  CHECK(c.rope_cos_sin_scale() == 1.0);  // mscale == mscale_all_dim

  std::string const d = specdec::io::describe(c);
  INFO(d);
  CHECK(d.find('\n') == std::string::npos);
  CHECK(d.find("kimi_k25") != std::string::npos);
  CHECK(d.find("61 layers (1 dense, 60 MoE)") != std::string::npos);
  CHECK(d.find("experts 384 top-8") != std::string::npos);
  CHECK(d.find("yarn x64") != std::string::npos);
  CHECK(d.find("softmax scale 0.144680") != std::string::npos);
  CHECK(d.find("int4 group 32") != std::string::npos);

  // The same file by its path; a missing one is an error naming it.
  REQUIRE(specdec::io::load_config(dir / "config.json", &c).ok());
  auto const missing = specdec::io::load_config(dir / "nope", &c);
  CHECK(missing.code() == StatusCode::kInvalidArgument);
  CHECK(missing.message().find((dir / "nope").string()) != std::string::npos);
  // Invalid JSON names the file.
  { std::ofstream(dir / "config.json") << "{\"model_type\": "; }
  auto const bad = specdec::io::load_config(dir, &c);
  CHECK(bad.code() == StatusCode::kMalformedInput);
  CHECK(bad.message().find("config.json: not valid JSON") != std::string::npos);
  // A key given twice (nlohmann would keep the last) names the key.
  { std::ofstream(dir / "config.json") << R"({"vocab_size": 999999, "vocab_size": 512})"; }
  auto const twice = specdec::io::load_config(dir, &c);
  CHECK(twice.code() == StatusCode::kMalformedInput);
  CHECK_MESSAGE(twice.message().find("config.json: duplicate key \"vocab_size\" at the top "
                                     "level") != std::string::npos,
                twice.message());
}

TEST_CASE("hf_config: is_int4_module applies the ignore list in both scopes") {
  DeepseekV3Config c;
  REQUIRE(parse(kimi_k25(), &c).ok());
  using specdec::io::is_int4_module;
  CHECK(is_int4_module(c, "language_model.model.layers.3.mlp.experts.17.down_proj"));
  CHECK(is_int4_module(c, "language_model.model.layers.60.mlp.experts.0.gate_proj"));
  CHECK_FALSE(is_int4_module(c, "language_model.model.layers.3.self_attn.q_a_proj"));
  CHECK_FALSE(is_int4_module(c, "language_model.model.layers.3.mlp.shared_experts.gate_proj"));
  CHECK_FALSE(is_int4_module(c, "language_model.model.layers.0.mlp.gate_proj"));
  CHECK_FALSE(is_int4_module(c, "language_model.lm_head"));  // "lm_head" in the text scope
  CHECK_FALSE(is_int4_module(c, "lm_head"));
  // Without a quantization_config nothing is INT4.
  REQUIRE(parse(flat_k2(), &c).ok());
  CHECK_FALSE(is_int4_module(c, "model.layers.3.mlp.experts.17.down_proj"));
}

TEST_CASE("hf_config: flat Kimi-K2 / DeepSeek-V3 configs") {
  DeepseekV3Config c;
  auto s = parse(flat_k2(), &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(c.model_type == "kimi_k2");
  CHECK(c.tensor_prefix == "model.");
  CHECK(c.lm_head_prefix == "lm_head.");
  CHECK(c.wrapper_prefix.empty());
  CHECK_FALSE(c.quantization.has_value());
  CHECK(c.rms_norm_eps == 1e-6);
  // mscale = 0.1 * ln 32 + 1 = 1.3465736; scale = 192^-0.5 * 1.8132604 = 0.130861.
  CHECK(c.softmax_scale() == doctest::Approx(0.130861).epsilon(1e-5));

  // DeepSeek-V3 shape: 128 heads, 256 experts in 8 groups (top-4 groups), first 3 dense,
  // optional keys absent (moe_layer_freq 1, noaux_tc, sigmoid, silu, no bias, no pad), eos list,
  // no rope_scaling; fp8 quantization is unsupported, so dropped here.
  json j = flat_k2();
  j["model_type"] = "deepseek_v3";
  j["num_attention_heads"] = 128;
  j["n_routed_experts"] = 256;
  j["n_group"] = 8;
  j["topk_group"] = 4;
  j["first_k_dense_replace"] = 3;
  j["vocab_size"] = 129280;
  j["bos_token_id"] = 0;
  j["eos_token_id"] = {1, 2};
  j["rope_scaling"] = nullptr;
  for (char const* k : {"moe_layer_freq", "topk_method", "scoring_func", "hidden_act",
                        "attention_bias", "pad_token_id", "tie_word_embeddings"}) {
    j.erase(k);
  }
  s = parse(j, &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(c.moe_layer_freq == 1);
  CHECK(c.num_nextn_predict_layers == 0);
  CHECK(c.topk_method == specdec::io::TopkMethod::kNoauxTc);
  CHECK(c.scoring_func == specdec::io::ScoringFunc::kSigmoid);
  CHECK(c.hidden_act == "silu");
  CHECK_FALSE(c.pad_token_id.has_value());
  CHECK(c.eos_token_ids == std::vector<int64_t>{1, 2});
  CHECK_FALSE(c.rope_scaling.has_value());
  CHECK(c.num_moe_layers() == 58);
  CHECK(c.softmax_scale() == doctest::Approx(1.0 / std::sqrt(192.0)));
  CHECK(c.rope_cos_sin_scale() == 1.0);

  // moe_layer_freq 2: layers >= 1 and even. q_lora_rank null: no q compression.
  j["moe_layer_freq"] = 2;
  j["first_k_dense_replace"] = 1;
  j["q_lora_rank"] = nullptr;
  j["num_hidden_layers"] = 6;
  REQUIRE(parse(j, &c).ok());
  CHECK_FALSE(c.q_lora_rank.has_value());
  CHECK_FALSE(c.is_moe_layer(0));
  CHECK_FALSE(c.is_moe_layer(1));
  CHECK(c.is_moe_layer(2));
  CHECK_FALSE(c.is_moe_layer(3));
  CHECK(c.is_moe_layer(4));
  CHECK(c.num_moe_layers() == 2);

  // transformers 5: "dtype" and rope_parameters instead of torch_dtype / rope_theta+rope_scaling.
  json v5 = flat_k2();
  v5.erase("torch_dtype");
  v5["dtype"] = "bfloat16";
  v5.erase("rope_theta");
  v5["rope_parameters"] = v5["rope_scaling"];
  v5.erase("rope_scaling");
  v5["rope_parameters"]["rope_theta"] = 50000.0;
  v5["rope_parameters"]["rope_type"] = v5["rope_parameters"]["type"];
  v5["rope_parameters"].erase("type");
  s = parse(v5, &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(c.rope_theta == 50000.0);
  REQUIRE(c.rope_scaling.has_value());
  CHECK(c.rope_scaling->factor == 32.0);
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  REQUIRE(parse(v5, &c).ok());
  CHECK(c.rope_theta == 10000.0);
  CHECK_FALSE(c.rope_scaling.has_value());

  // Both forms in one config: read when they agree, an error naming both when not.
  json both = flat_k2();
  both["rope_parameters"] = both["rope_scaling"];
  both["rope_parameters"]["rope_theta"] = both["rope_theta"];
  s = parse(both, &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(c.rope_scaling->factor == 32.0);
  json theta = both;
  theta["rope_parameters"]["rope_theta"] = 1234.0;
  s = parse(theta, &c);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(s.message().find("rope_theta' = 50000.0 and") != std::string::npos, s.message());
  CHECK_MESSAGE(s.message().find("rope_parameters.rope_theta' = 1234.0 disagree") !=
                    std::string::npos,
                s.message());
  json scaling = both;
  scaling["rope_parameters"]["factor"] = 8.0;
  s = parse(scaling, &c);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(s.message().find("rope_scaling' and") != std::string::npos, s.message());
  CHECK_MESSAGE(s.message().find("rope_parameters' disagree") != std::string::npos, s.message());
  scaling["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 50000.0}};
  CHECK(parse(scaling, &c).code() == StatusCode::kInvalidArgument);  // YaRN against none
}

TEST_CASE("hf_config: YaRN cos/sin scale follows transformers") {
  // mscale 0.707 = mscale_all_dim: ratio 1. mscale 1, mscale_all_dim 0 (or absent in the
  // attention): cos/sin scaled by 0.1 ln(40) + 1 = 1.3688879, softmax scale unscaled.
  json j = flat_k2();
  j["rope_scaling"]["factor"] = 40.0;
  j["rope_scaling"]["mscale"] = 0.707;
  j["rope_scaling"]["mscale_all_dim"] = 0.707;
  DeepseekV3Config c;
  REQUIRE(parse(j, &c).ok());
  CHECK(c.rope_cos_sin_scale() == doctest::Approx(1.0));
  // mscale = 0.1 * 0.707 * ln 40 + 1 = 1.2608037
  CHECK(c.attention_mscale() == doctest::Approx(1.2608037).epsilon(1e-7));
  j["rope_scaling"]["mscale"] = 1.0;
  j["rope_scaling"]["mscale_all_dim"] = 0.0;
  REQUIRE(parse(j, &c).ok());
  CHECK(c.rope_cos_sin_scale() == doctest::Approx(1.3688879).epsilon(1e-7));
  CHECK(c.softmax_scale() == doctest::Approx(1.0 / std::sqrt(192.0)));
  // factor 1: no scaling at all.
  j["rope_scaling"]["factor"] = 1.0;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  REQUIRE(parse(j, &c).ok());
  CHECK(c.attention_mscale() == 1.0);
}

TEST_CASE("hf_config: every required field missing is an error naming it") {
  for (char const* k : {"hidden_size",
                        "num_hidden_layers",
                        "num_attention_heads",
                        "q_lora_rank",
                        "kv_lora_rank",
                        "qk_nope_head_dim",
                        "qk_rope_head_dim",
                        "v_head_dim",
                        "n_routed_experts",
                        "num_experts_per_tok",
                        "n_shared_experts",
                        "moe_intermediate_size",
                        "intermediate_size",
                        "first_k_dense_replace",
                        "n_group",
                        "topk_group",
                        "norm_topk_prob",
                        "routed_scaling_factor",
                        "vocab_size",
                        "rms_norm_eps",
                        "rope_theta",
                        "max_position_embeddings"}) {
    expect_error(
        kimi_k25(), [&](json& j) { j["text_config"].erase(k); }, StatusCode::kMalformedInput,
        std::string("field 'text_config.") + k + "' is missing");
    expect_error(
        flat_k2(), [&](json& j) { j.erase(k); }, StatusCode::kMalformedInput,
        std::string("field '") + k + "' is missing");
  }
  for (char const* k : {"factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                        "original_max_position_embeddings"}) {
    expect_error(
        kimi_k25(), [&](json& j) { j["text_config"]["rope_scaling"].erase(k); },
        StatusCode::kMalformedInput,
        std::string("field 'text_config.rope_scaling.") + k + "' is missing");
  }
  // Fields that may sit in text_config or at the top level: missing from both.
  for (char const* k : {"bos_token_id", "eos_token_id", "torch_dtype"}) {
    expect_error(
        kimi_k25(),
        [&](json& j) {
          j.erase(k);
          j["text_config"].erase(k);
        },
        StatusCode::kMalformedInput, std::string("'text_config.") + k + "' is missing");
  }
  expect_error(
      kimi_k25(), [](json& j) { j.erase("text_config"); }, StatusCode::kMalformedInput,
      "field 'text_config' is missing");
  expect_error(
      kimi_k25(), [](json& j) { j.erase("model_type"); }, StatusCode::kMalformedInput,
      "field 'model_type' is missing");
  expect_error(
      flat_k2(), [](json& j) { j.erase("architectures"); }, StatusCode::kMalformedInput,
      "field 'architectures' is missing");
  expect_error(
      flat_k2(), [](json& j) { j["rope_scaling"].erase("type"); }, StatusCode::kMalformedInput,
      "field 'rope_scaling.rope_type' is missing");
}

TEST_CASE("hf_config: top-level fallback and disagreement") {
  // bos / eos / pad / dtype / quantization_config only at the top level are used.
  json j = kimi_k25();
  json& t = j["text_config"];
  for (char const* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) t.erase(k);
  t.erase("torch_dtype");
  j["torch_dtype"] = "bfloat16";
  j["quantization_config"] = t["quantization_config"];
  t.erase("quantization_config");
  DeepseekV3Config c;
  REQUIRE(parse(j, &c).ok());
  CHECK(c.bos_token_id == 163584);
  CHECK(c.eos_token_ids == std::vector<int64_t>{163585});
  CHECK(c.pad_token_id == 163839);
  CHECK(c.quantization_path == "quantization_config");
  REQUIRE(c.quantization.has_value());
  // Present in both with different values: an error naming both places.
  expect_error(
      kimi_k25(), [](json& j) { j["eos_token_id"] = 163586; }, StatusCode::kInvalidArgument,
      "'text_config.eos_token_id' = 163585 and");
  expect_error(
      kimi_k25(), [](json& j) { j["eos_token_id"] = 163586; }, StatusCode::kInvalidArgument,
      "'eos_token_id' = 163586 disagree");
  expect_error(
      kimi_k25(),
      [](json& j) {
        j["quantization_config"] = j["text_config"]["quantization_config"];
        j["quantization_config"]["ignore"] = json::array();
      },
      StatusCode::kInvalidArgument, "'text_config.quantization_config' = ");
  // Errors inside the quantization_config carry its path.
  expect_error(
      kimi_k25(),
      [](json& j) {
        j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] =
            8;
      },
      StatusCode::kUnsupported,
      "'text_config.quantization_config.config_groups.group_0.weights.num_bits' = 8");
}

TEST_CASE("hf_config: wrong JSON types name the field") {
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"]["hidden_size"] = "7168"; },
      StatusCode::kMalformedInput,
      "'text_config.hidden_size' must be an integer, got string \"7168\"");
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"]["num_attention_heads"] = 64.0; },
      StatusCode::kMalformedInput, "'text_config.num_attention_heads' must be an integer");
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"]["norm_topk_prob"] = 1; },
      StatusCode::kMalformedInput, "'text_config.norm_topk_prob' must be a boolean");
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"]["rope_theta"] = "50000"; },
      StatusCode::kMalformedInput, "'text_config.rope_theta' must be a number");
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"]["rope_scaling"] = "yarn"; },
      StatusCode::kMalformedInput, "'text_config.rope_scaling' must be an object");
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"]["scoring_func"] = 1; },
      StatusCode::kMalformedInput, "'text_config.scoring_func' must be a string");
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"]["q_lora_rank"] = true; },
      StatusCode::kMalformedInput, "'text_config.q_lora_rank' must be an integer");
  expect_error(
      kimi_k25(),
      [](json& j) {
        j.erase("eos_token_id");
        j["text_config"]["eos_token_id"] = "</s>";
      },
      StatusCode::kMalformedInput, "'text_config.eos_token_id' must be an integer or");
  expect_error(
      kimi_k25(),
      [](json& j) {
        j.erase("eos_token_id");
        j["text_config"]["eos_token_id"] = json::array();
      },
      StatusCode::kMalformedInput, "'text_config.eos_token_id' must be an integer or");
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"] = json::array(); }, StatusCode::kMalformedInput,
      "'text_config' must be an object");
  expect_error(
      flat_k2(), [](json& j) { j["architectures"] = "DeepseekV3ForCausalLM"; },
      StatusCode::kMalformedInput, "'architectures' must be an array of strings");
  DeepseekV3Config c;
  auto const s = specdec::io::parse_config("[1, 2]", "ckpt/config.json", &c);
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(s.message().find("ckpt/config.json: top level must be an object") != std::string::npos);
}

TEST_CASE("hf_config: values that cannot work name the field and the value") {
  auto T = [](json& j) -> json& { return j["text_config"]; };
  auto bad = [&](char const* key, json value, std::string const& text,
                 StatusCode code = StatusCode::kInvalidArgument) {
    expect_error(
        kimi_k25(),
        [&](json& j) {
          T(j)[key] = value;
        },
        code, text);
  };
  bad("hidden_size", 7000,
      "'text_config.hidden_size' = 7000: not divisible by num_attention_heads 64");
  bad("hidden_size", 0, "'text_config.hidden_size' = 0: must be in [1,");
  bad("num_attention_heads", -1, "'text_config.num_attention_heads' = -1");
  bad("qk_rope_head_dim", 63, "'text_config.qk_rope_head_dim' = 63: must be even");
  bad("n_shared_experts", -1, "'text_config.n_shared_experts' = -1: must be in [0,");
  bad("topk_group", 2, "'text_config.topk_group' = 2: more than n_group 1");
  bad("num_experts_per_tok", 385,
      "'text_config.num_experts_per_tok' = 385: more than n_routed_experts 384");
  bad("first_k_dense_replace", 62,
      "'text_config.first_k_dense_replace' = 62: more than num_hidden_layers 61");
  bad("moe_layer_freq", 0, "'text_config.moe_layer_freq' = 0");
  bad("num_nextn_predict_layers", -1, "'text_config.num_nextn_predict_layers' = -1");
  bad("scoring_func", "softplus", "'text_config.scoring_func' = \"softplus\": unknown");
  bad("topk_method", "aux_tc", "'text_config.topk_method' = \"aux_tc\": unknown");
  bad("routed_scaling_factor", 0.0, "'text_config.routed_scaling_factor' = 0.0: must be > 0");
  bad("rms_norm_eps", -1e-6, "'text_config.rms_norm_eps' = -1e-06: must be > 0");
  bad("rope_theta", 0, "'text_config.rope_theta' = 0");
  bad("max_position_embeddings", 0, "'text_config.max_position_embeddings' = 0: must be > 0");
  bad("hidden_size", 4294967296LL, "'text_config.hidden_size' = 4294967296");
  expect_error(
      kimi_k25(),
      [](json& j) {
        j["bos_token_id"] = 163840;
        j["text_config"]["bos_token_id"] = 163840;
      },
      StatusCode::kInvalidArgument,
      "'text_config.bos_token_id' = 163840: not a token id in [0, vocab_size 163840)");
  bad("hidden_act", "gelu", "'text_config.hidden_act' = \"gelu\": only \"silu\"",
      StatusCode::kUnsupported);
  bad("model_type", "llama", "'text_config.model_type' = \"llama\"", StatusCode::kUnsupported);
  bad("architectures", {"LlamaForCausalLM"}, "'text_config.architectures' = [\"LlamaForCausalLM\"]",
      StatusCode::kUnsupported);
  // n_routed_experts % n_group: 384 experts in 5 groups.
  expect_error(
      kimi_k25(),
      [](json& j) {
        j["text_config"]["n_group"] = 5;
        j["text_config"]["topk_group"] = 5;
      },
      StatusCode::kInvalidArgument,
      "'text_config.n_routed_experts' = 384: not divisible by n_group 5");
  // 8 experts per token from 1 of 64 groups of 6.
  expect_error(
      kimi_k25(),
      [](json& j) {
        j["text_config"]["n_group"] = 64;
        j["text_config"]["topk_group"] = 1;
      },
      StatusCode::kInvalidArgument,
      "'text_config.num_experts_per_tok' = 8: more than the 6 experts in topk_group groups");
  // eos / pad out of the vocabulary.
  expect_error(
      kimi_k25(),
      [](json& j) {
        j["eos_token_id"] = {1, 200000};
        j["text_config"]["eos_token_id"] = {1, 200000};
      },
      StatusCode::kInvalidArgument, "'text_config.eos_token_id' = [1,200000]: not a token id");
  expect_error(
      kimi_k25(),
      [](json& j) {
        j.erase("pad_token_id");
        j["text_config"]["pad_token_id"] = -1;
      },
      StatusCode::kInvalidArgument, "'text_config.pad_token_id' = -1: not a token id");
  // rope_scaling.
  auto rope = [&](char const* key, json value, std::string const& text,
                  StatusCode code = StatusCode::kInvalidArgument) {
    expect_error(
        kimi_k25(),
        [&](json& j) {
          T(j)["rope_scaling"][key] = value;
        },
        code, text);
  };
  rope("factor", 0.5, "'text_config.rope_scaling.factor' = 0.5: YaRN factor must be >= 1");
  rope("type", "linear", "'text_config.rope_scaling.type' = \"linear\": only \"yarn\"",
       StatusCode::kUnsupported);
  rope("rope_type", "dynamic",
       "'text_config.rope_scaling.type' = \"yarn\" and field 'text_config.rope_scaling.rope_type' "
       "= \"dynamic\" disagree");
  rope("beta_fast", 0, "'text_config.rope_scaling.beta_fast' = 0");
  rope("mscale_all_dim", -1.0, "'text_config.rope_scaling.mscale_all_dim' = -1.0: must be >= 0");
  rope("original_max_position_embeddings", 0,
       "'text_config.rope_scaling.original_max_position_embeddings' = 0: must be > 0");
  rope("original_max_position_embeddings", 4096.5,
       "'text_config.rope_scaling.original_max_position_embeddings' must be an integer",
       StatusCode::kMalformedInput);
  // Top level.
  expect_error(
      kimi_k25(), [](json& j) { j["model_type"] = "qwen3"; }, StatusCode::kUnsupported,
      "field 'model_type' = \"qwen3\"");
  expect_error(
      flat_k2(), [](json& j) { j["architectures"] = {"LlamaForCausalLM"}; },
      StatusCode::kUnsupported, "field 'architectures' = [\"LlamaForCausalLM\"]");
  expect_error(
      kimi_k25(), [](json& j) { j["text_config"]["torch_dtype"] = "float8"; },
      StatusCode::kUnsupported, "'text_config.torch_dtype' = \"float8\"");
}
