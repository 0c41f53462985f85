// Kimi / DeepSeek-V3 weights: the schema (tensor names, dtypes, shapes counted by hand for the tiny
// preset and for a 2-layer Kimi-K2.5), the random-checkpoint writer (bf16 and INT4, one file and 3
// shards, deterministic from the seed) read back through load_kimi_weights (views into the mmap,
// values bit-exact, INT4 within the quantisation error), every loader error (missing tensor, wrong
// shape, wrong dtype, unknown tensor vs documented skips, INT4 weight_shape values, config /
// checkpoint mismatch, quantized non-expert module), the writer's errors, and the progress line.
#include "specdec/io/progress.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/weights.hpp"
#include "support/testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace kimi = specdec::model::kimi;
using nlohmann::json;
using specdec::Dtype;
using specdec::Status;
using specdec::StatusCode;
using specdec::io::DeepseekV3Config;
using specdec::io::SafetensorsCheckpoint;
using specdec::io::TensorToWrite;
using specdec::testing::TempDir;

bool contains(std::string const& s, std::string const& part) {
  return s.find(part) != std::string::npos;
}

void check_error(Status const& s, StatusCode code, std::vector<std::string> const& parts) {
  CHECK_MESSAGE(s.code() == code, s.to_string());
  for (auto const& p : parts) CHECK_MESSAGE(contains(s.message(), p), "want '", p, "' in: ", s.message());
}

std::string read_file(fs::path const& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct Loaded {
  DeepseekV3Config config;
  SafetensorsCheckpoint ckpt;
  kimi::KimiWeights weights;
};

// Loads config + checkpoint + weights of `dir`; returns the weights' Status (config and
// checkpoint must open).
Status load(fs::path const& dir, Loaded* out, specdec::io::ProgressFn progress = {}) {
  Status s = specdec::io::load_config(dir, &out->config);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = SafetensorsCheckpoint::open(dir.string(), &out->ckpt);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return kimi::load_kimi_weights(out->ckpt, out->config, &out->weights, std::move(progress));
}

// A tensor copied out of a checkpoint (owning its bytes) for rewriting.
struct Owned {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

// Copies `src` into a single-file checkpoint at `dst` after `edit` changes the tensor list and
// `edit_config` the config.json.
void rewrite(fs::path const& src, fs::path const& dst,
             std::function<void(std::vector<Owned>&)> const& edit,
             std::function<void(json&)> const& edit_config = {}) {
  SafetensorsCheckpoint c;
  Status s = SafetensorsCheckpoint::open(src.string(), &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<Owned> tensors;
  for (std::string_view n : c.names()) {
    auto v = c.find(n);
    REQUIRE(v.has_value());
    tensors.push_back({std::string(n), v->dtype, v->shape,
                       std::vector<std::byte>(v->bytes.begin(), v->bytes.end())});
  }
  edit(tensors);
  std::vector<TensorToWrite> w;
  for (auto const& t : tensors) w.push_back({t.name, t.dtype, t.shape, t.bytes});
  fs::create_directories(dst);
  s = specdec::io::write_safetensors((dst / "model.safetensors").string(), w);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  json config = json::parse(read_file(src / "config.json"));
  if (edit_config) edit_config(config);
  std::ofstream(dst / "config.json") << config.dump(2);
}

Owned* find(std::vector<Owned>& ts, std::string const& name) {
  for (auto& t : ts) {
    if (t.name == name) return &t;
  }
  FAIL("no tensor " << name);
  return nullptr;
}

uint16_t bf16_at(specdec::io::TensorView const& v, size_t i) {
  uint16_t b;
  std::memcpy(&b, v.bytes.data() + 2 * i, 2);
  return b;
}

void write_tiny(fs::path const& dir, bool int4, int shards, uint64_t seed = 7) {
  Status const s = kimi::write_random_preset(dir.string(), "tiny", seed, int4, shards);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

}  // namespace

TEST_CASE("kimi_weights: tiny schema, counted by hand") {
  json j;
  REQUIRE(kimi::kimi_preset_config("tiny", {}, &j).ok());
  DeepseekV3Config c;
  REQUIRE(specdec::io::parse_config(j.dump(), "tiny/config.json", &c).ok());
  std::vector<kimi::TensorSpec> schema;
  REQUIRE(kimi::kimi_tensor_schema(c, &schema).ok());
  // embed + norm + lm_head; layer 0: 9 attention/norm tensors + 3 dense MLP; layers 1..3: 9 +
  // gate + bias + 3 shared + 8 experts * 3.
  CHECK(schema.size() == 3 + 12 + 3 * (9 + 2 + 3 + 24));
  std::map<std::string, kimi::TensorSpec> by;
  for (auto const& t : schema) CHECK_MESSAGE(by.emplace(t.name, t).second, "duplicate ", t.name);
  auto expect = [&](std::string const& n, Dtype d, std::vector<int64_t> shape) {
    REQUIRE_MESSAGE(by.count(n), n);
    CHECK_MESSAGE(by[n].dtype == d, n);
    CHECK_MESSAGE(by[n].shape == shape, n);
  };
  expect("model.embed_tokens.weight", Dtype::kBF16, {512, 128});
  expect("model.norm.weight", Dtype::kBF16, {128});
  expect("lm_head.weight", Dtype::kBF16, {512, 128});
  expect("model.layers.0.self_attn.q_a_proj.weight", Dtype::kBF16, {64, 128});
  expect("model.layers.0.self_attn.q_a_layernorm.weight", Dtype::kBF16, {64});
  expect("model.layers.0.self_attn.q_b_proj.weight", Dtype::kBF16, {4 * 24, 64});
  expect("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", Dtype::kBF16, {32 + 8, 128});
  expect("model.layers.0.self_attn.kv_a_layernorm.weight", Dtype::kBF16, {32});
  expect("model.layers.0.self_attn.kv_b_proj.weight", Dtype::kBF16, {4 * (16 + 16), 32});
  expect("model.layers.0.self_attn.o_proj.weight", Dtype::kBF16, {128, 4 * 16});
  expect("model.layers.0.mlp.gate_proj.weight", Dtype::kBF16, {96, 128});
  expect("model.layers.0.mlp.down_proj.weight", Dtype::kBF16, {128, 96});
  expect("model.layers.3.input_layernorm.weight", Dtype::kBF16, {128});
  expect("model.layers.3.post_attention_layernorm.weight", Dtype::kBF16, {128});
  expect("model.layers.1.mlp.gate.weight", Dtype::kBF16, {8, 128});
  expect("model.layers.1.mlp.gate.e_score_correction_bias", Dtype::kF32, {8});
  expect("model.layers.2.mlp.shared_experts.up_proj.weight", Dtype::kBF16, {32, 128});
  expect("model.layers.2.mlp.shared_experts.down_proj.weight", Dtype::kBF16, {128, 32});
  expect("model.layers.3.mlp.experts.7.up_proj.weight", Dtype::kBF16, {32, 128});
  expect("model.layers.3.mlp.experts.7.down_proj.weight", Dtype::kBF16, {128, 32});
  CHECK(by.count("model.layers.0.mlp.gate.weight") == 0);
  CHECK(by.count("model.layers.1.mlp.gate_proj.weight") == 0);
  CHECK(by.count("model.layers.3.mlp.experts.8.up_proj.weight") == 0);

  // q_lora_rank null: q_proj [heads * 24, hidden] instead of q_a / q_b.
  j["q_lora_rank"] = nullptr;
  REQUIRE(specdec::io::parse_config(j.dump(), "tiny/config.json", &c).ok());
  REQUIRE(kimi::kimi_tensor_schema(c, &schema).ok());
  CHECK(schema.size() == 3 + 10 + 3 * (7 + 2 + 3 + 24));
  bool found = false;
  for (auto const& t : schema) {
    CHECK(!contains(t.name, "q_a_proj"));
    if (t.name == "model.layers.2.self_attn.q_proj.weight") {
      found = true;
      CHECK(t.shape == std::vector<int64_t>{96, 128});
    }
  }
  CHECK(found);
}

TEST_CASE("kimi_weights: Kimi-K2.5 preset schema (2 layers, INT4) with real dimensions") {
  json j;
  REQUIRE(kimi::kimi_preset_config("kimi-k2.5", 2, &j).ok());
  j["text_config"]["quantization_config"] = kimi::kimi_int4_quantization_config();
  DeepseekV3Config c;
  Status s = specdec::io::parse_config(j.dump(), "k25/config.json", &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<kimi::TensorSpec> schema;
  REQUIRE(kimi::kimi_tensor_schema(c, &schema).ok());
  // 3 + layer 0 (9 + 3) + layer 1 (9 + 2 + 3 shared + 384 experts * 3 projections * 3 tensors).
  CHECK(schema.size() == 3 + 12 + 9 + 2 + 3 + 384 * 9);
  std::map<std::string, kimi::TensorSpec> by;
  for (auto const& t : schema) by.emplace(t.name, t);
  auto shape = [&](std::string const& n) {
    REQUIRE_MESSAGE(by.count(n), n);
    return by[n].shape;
  };
  using V = std::vector<int64_t>;
  CHECK(shape("language_model.model.embed_tokens.weight") == V{163840, 7168});
  CHECK(shape("language_model.lm_head.weight") == V{163840, 7168});
  CHECK(shape("language_model.model.layers.0.self_attn.q_b_proj.weight") == V{12288, 1536});
  CHECK(shape("language_model.model.layers.0.self_attn.kv_a_proj_with_mqa.weight") == V{576, 7168});
  CHECK(shape("language_model.model.layers.0.self_attn.kv_b_proj.weight") == V{16384, 512});
  CHECK(shape("language_model.model.layers.0.self_attn.o_proj.weight") == V{7168, 8192});
  CHECK(shape("language_model.model.layers.0.mlp.gate_proj.weight") == V{18432, 7168});
  CHECK(shape("language_model.model.layers.1.mlp.shared_experts.gate_proj.weight") == V{2048, 7168});
  CHECK(shape("language_model.model.layers.1.mlp.gate.weight") == V{384, 7168});
  CHECK(shape("language_model.model.layers.1.mlp.experts.383.gate_proj.weight_packed") ==
        V{2048, 896});
  CHECK(shape("language_model.model.layers.1.mlp.experts.383.gate_proj.weight_scale") ==
        V{2048, 224});
  CHECK(shape("language_model.model.layers.1.mlp.experts.0.down_proj.weight_packed") ==
        V{7168, 256});
  CHECK(shape("language_model.model.layers.1.mlp.experts.0.down_proj.weight_shape") == V{2});
  CHECK(by["language_model.model.layers.1.mlp.experts.0.down_proj.weight_packed"].dtype ==
        Dtype::kI32);
  CHECK(by.count("language_model.model.layers.1.mlp.experts.0.down_proj.weight") == 0);
}

TEST_CASE("kimi_weights: tiny bf16, one file: write, load, every tensor through the schema") {
  TempDir const tmp;
  fs::path const dir = tmp.path / "tiny";
  write_tiny(dir, false, 1);
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK(!fs::exists(dir / "model.safetensors.index.json"));
  Loaded l;
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  Status s = load(dir, &l, [&](uint64_t done, uint64_t total, std::string_view) {
    calls.push_back({done, total});
  });
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  kimi::KimiWeights const& w = l.weights;
  CHECK(w.num_tensors == 129);
  CHECK(l.ckpt.size() == 129);
  CHECK(!w.experts_int4);
  REQUIRE(w.layers.size() == 4);
  CHECK(!w.layers[0].moe);
  CHECK(w.layers[1].moe);
  CHECK(w.layers[3].experts.size() == 8);
  CHECK(w.layers[1].has_correction_bias);
  CHECK(w.layers[1].has_shared_experts);

  std::vector<kimi::TensorSpec> schema;
  REQUIRE(kimi::kimi_tensor_schema(l.config, &schema).ok());
  uint64_t bytes = 0;
  for (auto const& t : schema) {
    auto v = l.ckpt.find(t.name);
    REQUIRE_MESSAGE(v.has_value(), t.name);
    CHECK_MESSAGE(v->dtype == t.dtype, t.name);
    CHECK_MESSAGE(v->shape == t.shape, t.name);
    bytes += v->bytes.size();
  }
  CHECK(w.num_bytes == bytes);
  // By hand: embed + lm_head 2 * 512*128*2 = 262144; norm 256; layer attention (64*128 + 64 +
  // 96*64 + 40*128 + 32 + 128*32 + 128*64 + 2*128) * 2 = 64192 per layer; dense MLP 3*96*128*2 =
  // 73728; MoE layer: gate 8*128*2 = 2048, bias 32, shared 3*32*128*2 = 24576, experts 8 * 24576.
  CHECK(bytes == 262144 + 256 + 4 * 64192 + 73728 + 3 * (2048 + 32 + 24576 + 8 * 24576));

  // Views, not copies: the loader's view is the mapped bytes.
  CHECK(w.embed_tokens.bytes.data() == l.ckpt.find("model.embed_tokens.weight")->bytes.data());
  CHECK(w.layers[2].experts[5].down_proj.weight.bytes.data() ==
        l.ckpt.find("model.layers.2.mlp.experts.5.down_proj.weight")->bytes.data());
  CHECK(w.layers[2].experts[5].down_proj.out == 128);
  CHECK(w.layers[2].experts[5].down_proj.in == 32);
  CHECK(w.lm_head.name == "lm_head.weight");

  // Values: regenerated from the documented recipe, bit-exact after bf16 rounding.
  auto const norm = kimi::detail::random_normals(7, "model.layers.1.input_layernorm.weight", 128,
                                                 1.0, 0.1);
  for (size_t i = 0; i < 128; ++i) {
    CHECK(bf16_at(w.layers[1].input_layernorm, i) == specdec::float_to_bf16(norm[i]));
  }
  auto const bias = kimi::detail::random_normals(
      7, "model.layers.3.mlp.gate.e_score_correction_bias", 8, 0.0, 0.01);
  REQUIRE(w.layers[3].e_score_correction_bias.dtype == Dtype::kF32);
  for (size_t i = 0; i < 8; ++i) {
    float f;
    std::memcpy(&f, w.layers[3].e_score_correction_bias.bytes.data() + 4 * i, 4);
    CHECK(f == bias[i]);
    CHECK(f != 0.0f);
  }
  kimi::LinearSpec const spec{"model.layers.0.self_attn.o_proj", 128, 64, false, 0};
  auto const o = kimi::detail::random_linear(7, spec);
  for (size_t i : {size_t{0}, size_t{1}, size_t{4095}, size_t{128 * 64 - 1}}) {
    CHECK(bf16_at(w.layers[0].o_proj.weight, i) == specdec::float_to_bf16(o[i]));
  }
  // Matrix scale: N(0, 1/64) -> the sample variance of 8192 values is within 10% of 1/64.
  double var = 0;
  for (float x : o) var += double(x) * x;
  var /= double(o.size());
  CHECK(var == doctest::Approx(1.0 / 64).epsilon(0.1));

  // Progress: monotone, ends at total = the bytes bound.
  REQUIRE(calls.size() == 129);
  for (size_t i = 1; i < calls.size(); ++i) CHECK(calls[i].first > calls[i - 1].first);
  CHECK(calls.back().first == bytes);
  CHECK(calls.back().second == bytes);

  // Deterministic: the same seed gives the same file, another seed another one.
  fs::path const again = tmp.path / "again", other = tmp.path / "other";
  write_tiny(again, false, 1);
  write_tiny(other, false, 1, 8);
  CHECK(read_file(again / "model.safetensors") == read_file(dir / "model.safetensors"));
  CHECK(read_file(other / "model.safetensors") != read_file(dir / "model.safetensors"));
  CHECK(read_file(again / "config.json") == read_file(dir / "config.json"));
}

TEST_CASE("kimi_weights: tiny, 3 shards: same tensors as one file") {
  TempDir const tmp;
  write_tiny(tmp.path / "one", false, 1);
  write_tiny(tmp.path / "three", false, 3);
  CHECK(!fs::exists(tmp.path / "three" / "model.safetensors"));
  CHECK(fs::exists(tmp.path / "three" / "model.safetensors.index.json"));
  for (char const* f : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors"}) {
    CHECK_MESSAGE(fs::exists(tmp.path / "three" / f), f);
  }
  Loaded a, b;
  Status s = load(tmp.path / "one", &a);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = load(tmp.path / "three", &b);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(b.ckpt.num_shards() == 3);
  CHECK(b.weights.num_tensors == a.weights.num_tensors);
  CHECK(b.weights.num_bytes == a.weights.num_bytes);
  CHECK(b.ckpt.index_metadata()["total_size"] == a.weights.num_bytes);
  std::set<std::string> shards;
  for (std::string_view n : a.ckpt.names()) {
    auto va = a.ckpt.find(n), vb = b.ckpt.find(n);
    REQUIRE_MESSAGE(vb.has_value(), n);
    CHECK_MESSAGE(std::equal(va->bytes.begin(), va->bytes.end(), vb->bytes.begin(),
                             vb->bytes.end()),
                  n);
    shards.insert(std::string(b.ckpt.shard_of(n)));
  }
  CHECK(shards.size() == 3);
}

TEST_CASE("kimi_weights: tiny INT4 (one file and 3 shards): experts dequantise to the bf16 draw") {
  TempDir const tmp;
  for (int shards : {1, 3}) {
    CAPTURE(shards);
    fs::path const dir = tmp.path / ("int4_" + std::to_string(shards));
    write_tiny(dir, true, shards);
    Loaded l;
    Status s = load(dir, &l);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    REQUIRE(l.config.quantization.has_value());
    CHECK(l.config.quantization->group_size == 32);
    CHECK(l.weights.experts_int4);
    CHECK(l.weights.num_tensors == 3 + 12 + 3 * (9 + 2 + 3 + 72));
    auto const& lay = l.weights.layers[2];
    CHECK(!lay.shared_experts.gate_proj.int4);  // ignored by "re:.*shared_experts.*"
    CHECK(!lay.q_a_proj.int4);
    CHECK(l.ckpt.contains("model.layers.2.mlp.shared_experts.gate_proj.weight"));
    CHECK(l.ckpt.contains("model.layers.0.mlp.gate_proj.weight"));  // dense MLP ignored too
    CHECK(l.ckpt.contains("model.layers.2.mlp.gate.weight"));       // router gate: not a Linear
    for (auto const* lin : {&lay.experts[3].gate_proj, &lay.experts[6].down_proj}) {
      REQUIRE(lin->int4);
      CHECK(lin->group_size == 32);
      int32_t sh[2];
      std::memcpy(sh, lin->weight_shape.bytes.data(), 8);
      CHECK(sh[0] == lin->out);
      CHECK(sh[1] == lin->in);
      CHECK(lin->weight_packed.shape == std::vector<int64_t>{lin->out, lin->in / 8});
      CHECK(lin->weight_scale.shape == std::vector<int64_t>{lin->out, lin->in / 32});
      std::vector<int32_t> packed(static_cast<size_t>(lin->out * lin->in / 8));
      std::vector<uint16_t> scale(static_cast<size_t>(lin->out * lin->in / 32));
      std::memcpy(packed.data(), lin->weight_packed.bytes.data(), packed.size() * 4);
      std::memcpy(scale.data(), lin->weight_scale.bytes.data(), scale.size() * 2);
      std::vector<float> deq(static_cast<size_t>(lin->out * lin->in));
      REQUIRE(specdec::io::dequantize_int4_group(packed.data(), scale.data(), lin->out, lin->in,
                                                 32, deq.data())
                  .ok());
      std::string const module_name(lin->weight_packed.name.substr(
          0, lin->weight_packed.name.size() - std::string(".weight_packed").size()));
      auto const W = kimi::detail::random_linear(
          7, kimi::LinearSpec{module_name, lin->out, lin->in, false, 0});
      int nonzero = 0;
      for (int64_t n = 0; n < lin->out; ++n) {
        for (int64_t k = 0; k < lin->in; ++k) {
          size_t const i = static_cast<size_t>(n * lin->in + k);
          float const sc = specdec::bf16_to_float(scale[static_cast<size_t>(n * (lin->in / 32) + k / 32)]);
          float const tol = std::max(0.5f * sc, std::fabs(W[i]) - 7.0f * sc) * 1.0001f;
          CHECK(std::fabs(deq[i] - W[i]) <= tol);
          nonzero += deq[i] != 0.0f;
        }
      }
      CHECK(nonzero > lin->out * lin->in / 2);
    }
  }
}

TEST_CASE("kimi_weights: loader errors name the tensor and both sides") {
  TempDir const tmp;
  fs::path const src = tmp.path / "src";
  write_tiny(src, false, 1);
  int case_no = 0;
  auto run = [&](std::function<void(std::vector<Owned>&)> const& edit,
                 std::function<void(json&)> const& edit_config = {}) {
    fs::path const dst = tmp.path / ("case" + std::to_string(case_no++));
    rewrite(src, dst, edit, edit_config);
    Loaded l;
    return load(dst, &l);
  };

  SUBCASE("unchanged copy loads") { CHECK(run([](auto&) {}).ok()); }
  SUBCASE("missing tensor") {
    Status s = run([](std::vector<Owned>& ts) {
      std::erase_if(ts, [](Owned const& t) {
        return t.name == "model.layers.2.self_attn.kv_b_proj.weight";
      });
    });
    check_error(s, StatusCode::kMalformedInput,
                {"missing tensor \"model.layers.2.self_attn.kv_b_proj.weight\"",
                 "model.safetensors"});
  }
  SUBCASE("wrong shape") {
    Status s = run([](std::vector<Owned>& ts) {
      Owned* t = find(ts, "model.norm.weight");
      t->shape = {127};
      t->bytes.resize(254);
    });
    check_error(s, StatusCode::kMalformedInput,
                {"\"model.norm.weight\"", "expected BF16 [128]", "found BF16 [127]"});
  }
  SUBCASE("wrong dtype: a BF16 correction bias") {
    Status s = run([](std::vector<Owned>& ts) {
      Owned* t = find(ts, "model.layers.1.mlp.gate.e_score_correction_bias");
      t->dtype = Dtype::kBF16;
      t->bytes.resize(16);
    });
    check_error(s, StatusCode::kMalformedInput,
                {"\"model.layers.1.mlp.gate.e_score_correction_bias\"", "expected F32 [8]",
                 "found BF16 [8]"});
  }
  SUBCASE("unknown tensors are listed; documented skips are not") {
    auto add = [](std::vector<Owned>& ts, std::string name) {
      ts.push_back({std::move(name), Dtype::kBF16, {2}, std::vector<std::byte>(4)});
    };
    Status ok = run(
        [&](std::vector<Owned>& ts) {
          add(ts, "vision_tower.blocks.0.weight");
          add(ts, "mm_projector.proj.weight");
          add(ts, "multi_modal_projector.linear.weight");
          add(ts, "model.layers.0.self_attn.rotary_emb.inv_freq");
          add(ts, "model.layers.4.eh_proj.weight");  // MTP layer (index 4 of 4 layers)
        },
        [](json& j) { j["num_nextn_predict_layers"] = 1; });
    CHECK_MESSAGE(ok.ok(), ok.to_string());
    // Without num_nextn_predict_layers a layer past the config's is unknown.
    Status mtp = run([&](std::vector<Owned>& ts) { add(ts, "model.layers.4.eh_proj.weight"); });
    check_error(mtp, StatusCode::kMalformedInput,
                {"1 tensor(s)", "\"model.layers.4.eh_proj.weight\""});
    Status s = run([&](std::vector<Owned>& ts) {
      add(ts, "model.layers.1.mlp.experts.8.up_proj.weight");
      add(ts, "model.layers.x.foo");
    });
    check_error(s, StatusCode::kMalformedInput,
                {"2 tensor(s)", "\"model.layers.1.mlp.experts.8.up_proj.weight\"",
                 "\"model.layers.x.foo\"", "config.json"});
  }
  SUBCASE("config / checkpoint mismatch: 2 layers in config, 4 in the tensors") {
    Status s = run([](auto&) {}, [](json& j) { j["num_hidden_layers"] = 2; });
    check_error(s, StatusCode::kMalformedInput,
                {"tensor(s) that the DeepseekV3 schema", "\"model.layers.2.", "and "});
  }
  SUBCASE("config / checkpoint mismatch: hidden_size 64 in config, 128 in the tensors") {
    Status s = run([](auto&) {}, [](json& j) { j["hidden_size"] = 64; });
    check_error(s, StatusCode::kMalformedInput,
                {"\"model.embed_tokens.weight\"", "expected BF16 [512, 64]",
                 "found BF16 [512, 128]"});
  }
  SUBCASE("config / checkpoint mismatch: 10 experts in config, 8 in the checkpoint") {
    Status s = run([](auto&) {}, [](json& j) { j["n_routed_experts"] = 10; });
    check_error(s, StatusCode::kMalformedInput,
                {"\"model.layers.1.mlp.gate.weight\"", "expected BF16 [10, 128]",
                 "found BF16 [8, 128]"});
  }
  SUBCASE("config / checkpoint mismatch: 16 experts, more tensors than the checkpoint holds") {
    // At least 6 tensors x 4 layers + 3 linears x 16 experts x 3 MoE layers = 168; the tiny
    // checkpoint holds 129 (layer 0: 9 attention + 3 mlp; each MoE layer 9 + gate and bias + 3
    // shared + 8 x 3 experts = 38; embedding, norm, lm_head).
    Status s = run([](auto&) {}, [](json& j) { j["n_routed_experts"] = 16; });
    check_error(s, StatusCode::kMalformedInput,
                {"config.json names at least 168 tensors", "n_routed_experts 16 in each of 3",
                 "the checkpoint holds 129"});
  }
  SUBCASE("config / checkpoint mismatch: sizes past the checkpoint, refused before the walk") {
    // 2^28 experts (or 2^30 layers) would ask for gigabytes of bookkeeping before a shape check.
    // At least 6 tensors x 4 layers + 3 linears x 2^28 experts x 3 MoE layers (1, 2, 3).
    Status s = run([](auto&) {}, [](json& j) { j["n_routed_experts"] = 1 << 28; });
    check_error(s, StatusCode::kMalformedInput,
                {"config.json names at least 2415919128 tensors", "n_routed_experts 268435456",
                 "in each of 3 MoE layers", "the checkpoint holds", "does not match"});
    s = run([](auto&) {}, [](json& j) { j["num_hidden_layers"] = 1 << 30; });
    check_error(s, StatusCode::kMalformedInput,
                {"num_hidden_layers 1073741824", "does not match the checkpoint"});
  }
  SUBCASE("INT4 config over a bf16 checkpoint") {
    Status s = run([](auto&) {}, [](json& j) {
      j["quantization_config"] = kimi::kimi_int4_quantization_config();
    });
    check_error(s, StatusCode::kMalformedInput,
                {"missing tensor \"model.layers.1.mlp.experts.0.gate_proj.weight_packed\""});
  }
  SUBCASE("a quantization_config that would quantize attention") {
    Status s = run([](auto&) {}, [](json& j) {
      j["quantization_config"] = kimi::kimi_int4_quantization_config();
      j["quantization_config"]["ignore"] = json::array({"lm_head"});
    });
    check_error(s, StatusCode::kUnsupported,
                {"config.json", "quantization_config", "\"model.layers.0.self_attn.q_a_proj\"",
                 "only routed experts"});
  }
  SUBCASE("torch_dtype float32") {
    Status s = run([](auto&) {}, [](json& j) { j["torch_dtype"] = "float32"; });
    check_error(s, StatusCode::kUnsupported, {"config.json", "torch_dtype", "float32"});
  }
}

TEST_CASE("kimi_weights: INT4 weight_shape values must equal [out, in]") {
  TempDir const tmp;
  fs::path const src = tmp.path / "src";
  write_tiny(src, true, 1);
  rewrite(src, tmp.path / "bad", [](std::vector<Owned>& ts) {
    Owned* t = find(ts, "model.layers.3.mlp.experts.5.down_proj.weight_shape");
    int32_t const v[2] = {128, 16};
    std::memcpy(t->bytes.data(), v, 8);
  });
  Loaded l;
  Status s = load(tmp.path / "bad", &l);
  check_error(s, StatusCode::kMalformedInput,
              {"\"model.layers.3.mlp.experts.5.down_proj.weight_shape\"", "values [128, 16]",
               "expected [128, 32]", "model.safetensors"});
  // Wrong dtype of the packed weight (I64 instead of I32, same bytes per row pair).
  rewrite(src, tmp.path / "bad2", [](std::vector<Owned>& ts) {
    Owned* t = find(ts, "model.layers.1.mlp.experts.0.up_proj.weight_packed");
    t->dtype = Dtype::kI64;
    t->shape = {32, 8};
  });
  Loaded l2;
  s = load(tmp.path / "bad2", &l2);
  check_error(s, StatusCode::kMalformedInput,
              {"\"model.layers.1.mlp.experts.0.up_proj.weight_packed\"", "expected I32 [32, 16]",
               "found I64 [32, 8]"});
}

TEST_CASE("kimi_weights: writer errors") {
  TempDir const tmp;
  json tiny;
  REQUIRE(kimi::kimi_preset_config("tiny", {}, &tiny).ok());
  check_error(kimi::write_random_preset(tmp.file("a"), "huge", 1, false, 1),
              StatusCode::kInvalidArgument, {"unknown preset \"huge\"", "tiny, kimi-k2.5"});
  check_error(kimi::write_random_preset(tmp.file("a"), "tiny", 1, false, 1, 0),
              StatusCode::kInvalidArgument, {"num_layers 0", "must be >= 1"});
  check_error(kimi::write_random_checkpoint(tmp.file("a"), tiny, 1, false, 0),
              StatusCode::kInvalidArgument, {"shards = 0", "[1, 129]"});
  check_error(kimi::write_random_checkpoint(tmp.file("a"), tiny, 1, false, 130),
              StatusCode::kInvalidArgument, {"shards = 130", "[1, 129]"});
  json q = tiny;
  q["quantization_config"] = kimi::kimi_int4_quantization_config();
  check_error(kimi::write_random_checkpoint(tmp.file("a"), q, 1, true, 1),
              StatusCode::kInvalidArgument, {"config.json", "already has a quantization_config"});
  json bad = tiny;
  bad["hidden_size"] = 130;  // not divisible by 4 heads
  check_error(kimi::write_random_checkpoint(tmp.file("a"), bad, 1, false, 1),
              StatusCode::kInvalidArgument, {"config.json", "hidden_size"});
  CHECK(!fs::exists(tmp.path / "a"));
  // An existing, non-empty directory is never written into.
  fs::create_directories(tmp.path / "full");
  std::ofstream(tmp.path / "full" / "notes.txt") << "keep";
  check_error(kimi::write_random_checkpoint(tmp.file("full"), tiny, 1, false, 1),
              StatusCode::kInvalidArgument, {"full", "not empty"});
  CHECK(read_file(tmp.path / "full" / "notes.txt") == "keep");
  // 129 shards (one tensor each) is the most there can be, and loads.
  Status s = kimi::write_random_checkpoint(tmp.file("many"), tiny, 1, false, 129);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  Loaded l;
  s = load(tmp.path / "many", &l);
  CHECK_MESSAGE(s.ok(), s.to_string());
  CHECK(l.ckpt.num_shards() == 129);
  // Nested Kimi-K2.5 form at toy size: prefix "language_model.", loads.
  json k;
  REQUIRE(kimi::kimi_preset_config("kimi-k2.5", 2, &k).ok());
  json& t = k["text_config"];
  t["hidden_size"] = 64;
  t["num_attention_heads"] = 2;
  t["q_lora_rank"] = 32;
  t["kv_lora_rank"] = 16;
  t["qk_nope_head_dim"] = 8;
  t["qk_rope_head_dim"] = 4;
  t["v_head_dim"] = 8;
  t["n_routed_experts"] = 4;
  t["num_experts_per_tok"] = 2;
  t["moe_intermediate_size"] = 32;
  t["intermediate_size"] = 64;
  t["vocab_size"] = 163840;
  s = kimi::write_random_checkpoint(tmp.file("k25"), k, 3, true, 2);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  Loaded lk;
  s = load(tmp.path / "k25", &lk);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(lk.config.model_type == "kimi_k25");
  CHECK(lk.weights.experts_int4);
  CHECK(lk.weights.lm_head.name == "language_model.lm_head.weight");
  CHECK(lk.ckpt.contains("language_model.model.layers.1.mlp.experts.3.down_proj.weight_packed"));
}

TEST_CASE("kimi_weights: progress line and plain-log progress bar") {
  using specdec::io::format_progress;
  uint64_t const MiB = 1 << 20;
  CHECK(format_progress("load", 512 * MiB, 1024 * MiB, 2.0, 10, "x") ==
        "load [#####.....]  50.0%  512.0 MiB / 1.0 GiB  256.0 MiB/s  ETA 2s  x");
  CHECK(format_progress("load", 0, 100, 0.0, 0) == "load   0.0%  0 B / 100 B  ETA ?");
  CHECK(format_progress("w", 3 * MiB, 3 * MiB, 1.0, 4) ==
        "w [####] 100.0%  3.0 MiB / 3.0 MiB  3.0 MiB/s  ETA 0s");
  CHECK(specdec::io::format_duration(3725) == "1h02m");
  CHECK(specdec::io::format_duration(187) == "3m07s");

  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    specdec::io::ProgressBar bar("load", f);
    CHECK(!bar.is_tty());
    auto cb = bar.callback();
    for (uint64_t d = 0; d <= 100; d += 5) cb(d, 100, "t");
    bar.finish();
  }
  std::rewind(f);
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof buf, f)) text += buf;
  std::fclose(f);
  // Lines at 0%, 25%, 50%, 75%, 100%, nothing more; no carriage returns in a log.
  CHECK(std::count(text.begin(), text.end(), '\n') == 5);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(contains(text, " 25.0%"));
  CHECK(contains(text, "100.0%"));

  // finish() without any update prints nothing (a failure before any work).
  f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    specdec::io::ProgressBar bar("load", f);
    bar.finish();
  }
  CHECK(std::ftell(f) == 0);
  std::fclose(f);
}
