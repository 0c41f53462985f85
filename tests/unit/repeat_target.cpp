// The repeating random target (model/kimi/random_checkpoint.hpp, KimiRandomOptions::repeat_period
// P) on the tiny preset:
//   * the checkpoint is the plain one of the same seed except that every o_proj / down_proj is
//     zero and lm_head rows v < P point along the embedding row of (v - 1) mod P (bf16 and INT4);
//   * at every position of a random prompt, whatever the context, the argmax is the successor,
//     by a margin (P = vocab: every row is a successor row);
//   * greedy generation after a prompt ending in 3 continues 4, 5, .., P - 1, 0, 1, .. (bf16 and
//     INT4 experts; P = vocab wraps 511 -> 0);
//   * through the engine, an n-gram chain of N nodes gives plain decoding's output and, once the
//     prompt holds a period, takes N tokens per verify: ceil((n - 1) / N) verifies for n tokens;
//   * a period outside [2, vocab_size] or a tied lm_head is an error naming the numbers, and
//     nothing is written.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/engine/spec_engine.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/generate.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/weights.hpp"
#include "specdec/policy/spec_policy.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

namespace {

using namespace specdec;
namespace kimi = specdec::model::kimi;
using engine::GenerationRequest;
using engine::GenerationResult;
using engine::SpecEngine;
using engine::SpecMetrics;
using io::TensorView;
using testing::TempDir;

template <int Nodes>  // a chain of Nodes nodes: the root and Nodes - 1 drafts
using NGramChain = SpecPolicy<NGram, Layers<>, Chain<Nodes - 1>, Eager>;
using Plain = SpecPolicy<NoDraft, Layers<>, NoTree, Eager>;

constexpr int kVocab = 512;  // the tiny preset's
constexpr int kHidden = 128;

struct Loaded {
  io::DeepseekV3Config config;
  io::SafetensorsCheckpoint ckpt;
  kimi::KimiWeights weights;
  kimi::KimiCpuModel model;
};

void write_tiny(std::filesystem::path const& dir, uint64_t seed, bool int4, int period) {
  Status const s = kimi::write_random_preset(dir.string(), "tiny", seed, int4, /*shards=*/1, {}, {},
                                             kimi::KimiRandomOptions{period});
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

void load(std::filesystem::path const& dir, Loaded* m) {
  Status s = io::load_config(dir, &m->config);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = io::SafetensorsCheckpoint::open(dir.string(), &m->ckpt);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = kimi::load_kimi_weights(m->ckpt, m->config, &m->weights);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = kimi::load_kimi_cpu_model(m->weights, m->config, &m->model);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

// The cycle 0, 1, .., P - 1 continued from `first` for n tokens.
std::vector<int32_t> cycle_from(int first, int n, int P) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back((first + i) % P);
  return v;
}

std::vector<float> bf16_values(TensorView const& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, t.bytes.data() + 2 * i, 2);
    v[i] = bf16_to_float(b);
  }
  return v;
}

bool all_zero(std::span<std::byte const> b) {
  for (std::byte x : b) {
    if (x != std::byte{0}) return false;
  }
  return true;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::vector<GenerationResult> run_engine_cpu(kimi::KimiCpuModel* target, auto policy,
                                             GenerationRequest const& r, SpecMetrics* total) {
  using P = decltype(policy);
  SpecEngine<P, CpuExecutor> e;
  Status s = SpecEngine<P, CpuExecutor>::create(target, nullptr, {}, &e);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<GenerationResult> out;
  s = e.generate({&r, 1}, &out, total);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  REQUIRE(out.size() == 1);
  return out;
}

}  // namespace

TEST_CASE("repeat target: only the residual writers and lm_head rows < P differ") {
  int constexpr P = 16;
  for (bool const int4 : {false, true}) {
    CAPTURE(int4);
    TempDir tmp;
    write_tiny(tmp.path / "plain", 21, int4, 0);
    write_tiny(tmp.path / "repeat", 21, int4, P);
    io::SafetensorsCheckpoint plain, repeat;
    REQUIRE(io::SafetensorsCheckpoint::open(tmp.file("plain"), &plain).ok());
    REQUIRE(io::SafetensorsCheckpoint::open(tmp.file("repeat"), &repeat).ok());
    REQUIRE(plain.names() == repeat.names());
    int zeroed = 0, int4_zeroed = 0;
    for (std::string_view name : plain.names()) {
      CAPTURE(name);
      TensorView const a = *plain.find(name), b = *repeat.find(name);
      REQUIRE(a.dtype == b.dtype);
      REQUIRE(a.shape == b.shape);
      bool const writer = name.find(".o_proj.") != std::string_view::npos ||
                          name.find(".down_proj.") != std::string_view::npos;
      if (writer && ends_with(name, ".weight")) {
        CHECK(all_zero(b.bytes));
        ++zeroed;
      } else if (writer && ends_with(name, ".weight_scale")) {
        CHECK(all_zero(b.bytes));  // every dequantized value q * 0 = 0
        ++int4_zeroed;
      } else if (writer && ends_with(name, ".weight_packed")) {
        // any q dequantizes to 0 under a zero scale
      } else if (name == "lm_head.weight") {
        std::vector<float> const head = bf16_values(b), was = bf16_values(a);
        std::vector<float> const emb = bf16_values(*repeat.find("model.embed_tokens.weight"));
        // Rows v >= P: as drawn. Rows v < P: kRepeatHeadNorm * e_u / |e_u|, u = (v - 1) mod P.
        CHECK(std::equal(head.begin() + P * kHidden, head.end(), was.begin() + P * kHidden));
        for (int v = 0; v < P; ++v) {
          CAPTURE(v);
          float const* row = head.data() + v * kHidden;
          float const* e = emb.data() + ((v + P - 1) % P) * kHidden;
          double dot = 0, rr = 0, ee = 0;
          for (int i = 0; i < kHidden; ++i) {
            dot += double(row[i]) * e[i];
            rr += double(row[i]) * row[i];
            ee += double(e[i]) * e[i];
          }
          CHECK(std::sqrt(rr) == doctest::Approx(4.0).epsilon(0.01));
          CHECK(dot / std::sqrt(rr * ee) > 0.9999);  // parallel up to bf16 rounding
        }
      } else {
        CHECK(std::equal(a.bytes.begin(), a.bytes.end(), b.bytes.begin(), b.bytes.end()));
      }
    }
    // 4 layers: 4 o_proj + 1 dense down_proj + 3 x (1 shared + 8 routed) down_proj.
    CHECK(zeroed + int4_zeroed == 4 + 1 + 3 * 9);
    CHECK(int4_zeroed == (int4 ? 3 * 8 : 0));
  }
}

TEST_CASE("repeat target: every position's argmax is its token's successor, by a margin") {
  TempDir tmp;
  write_tiny(tmp.path / "m", 22, false, kVocab);
  Loaded m;
  load(tmp.path / "m", &m);
  std::mt19937 rng(4);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  std::vector<int32_t> prompt(200);
  for (int32_t& t : prompt) t = token(rng);
  kimi::MlaCache cache;
  REQUIRE(kimi::MlaCache::create_for(m.config, 16, 16, 16, &cache).ok());
  REQUIRE(cache.add_request(0).ok());
  kimi::RequestId const id = 0;
  int32_t const count = static_cast<int32_t>(prompt.size());
  std::vector<float> logits;
  Status const s = kimi::kimi_prefill(CpuExecutor{}, m.model, &cache, {&id, 1}, {&count, 1}, prompt,
                                      {}, &logits, nullptr);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  REQUIRE(logits.size() == prompt.size() * kVocab);
  // The successor's logit is about 4 * sqrt(128) = 45.3; every other about 4 * N(0, 1), whose
  // largest of 511 x 200 draws is about 4 * 4.4 = 18: a margin of about 27.
  double min_margin = 1e9;
  for (size_t t = 0; t < prompt.size(); ++t) {
    CAPTURE(t);
    float const* row = logits.data() + t * kVocab;
    int const want = (prompt[t] + 1) % kVocab;
    float other = -INFINITY;
    for (int v = 0; v < kVocab; ++v) {
      if (v != want) other = std::max(other, row[v]);
    }
    CHECK(row[want] == doctest::Approx(45.25).epsilon(0.05));
    min_margin = std::min(min_margin, double(row[want]) - other);
  }
  MESSAGE("smallest margin of the successor's logit: " << min_margin);
  CHECK(min_margin > 20.0);
}

TEST_CASE("repeat target: greedy generation continues the cycle") {
  struct Case {
    int period;
    bool int4;
    std::vector<int32_t> prompt;
  };
  for (Case const& c : {Case{16, false, {100, 7, 300, 3}}, Case{16, true, {100, 7, 300, 3}},
                        Case{kVocab, false, {5, 509}}}) {
    CAPTURE(c.period);
    CAPTURE(c.int4);
    TempDir tmp;
    write_tiny(tmp.path / "m", 23, c.int4, c.period);
    Loaded m;
    load(tmp.path / "m", &m);
    kimi::GenerateOptions o;
    o.max_new_tokens = 40;
    o.stop_at_eos = false;
    kimi::GenerateResult r;
    Status const s = kimi::kimi_generate(CpuExecutor{}, m.model, m.config, c.prompt, o, &r);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    CHECK(r.output_ids == cycle_from(c.prompt.back() + 1, 40, c.period));
  }
}

TEST_CASE("repeat target: n-gram chains take a whole chain per verify, output unchanged") {
  int constexpr P = 16, n = 40;
  TempDir tmp;
  write_tiny(tmp.path / "m", 24, false, P);
  Loaded m;
  load(tmp.path / "m", &m);
  // One period, then 0 1 2 3: after the first token (4, from the prefill) the suffix 1 2 3 4
  // occurs P tokens back, and from then on the latest occurrence of any suffix is one period back,
  // whose continuation (P tokens) fills a chain: every verify accepts N - 1 drafts and adds the
  // bonus, except that the last one stops at max_new_tokens.
  GenerationRequest r;
  r.prompt = cycle_from(0, P + 4, P);
  r.max_new_tokens = n;
  r.stop_at_eos = false;
  std::vector<int32_t> const want = cycle_from(4, n, P);

  SpecMetrics plain_total;
  auto const plain = run_engine_cpu(&m.model, Plain{}, r, &plain_total);
  CHECK(plain[0].output_ids == want);
  CHECK(plain_total.verify_ct == n - 1);

  SpecMetrics t4, t5;
  auto const c4 = run_engine_cpu(&m.model, NGramChain<4>{}, r, &t4);
  auto const c5 = run_engine_cpu(&m.model, NGramChain<5>{}, r, &t5);
  CHECK(c4[0].output_ids == want);
  CHECK(c5[0].output_ids == want);
  MESSAGE("n-gram chain of 4 nodes: accept length "
          << t4.accept_length() << " over " << t4.verify_ct
          << " verifies; 5 nodes: " << t5.accept_length() << " over " << t5.verify_ct);
  CHECK(t4.committed == n - 1);
  CHECK(t5.committed == n - 1);
  CHECK(t4.verify_ct == (n - 1 + 3) / 4);  // 10: 39 tokens, 4 per verify
  CHECK(t5.verify_ct == (n - 1 + 4) / 5);  // 8: 5 per verify
  CHECK(t4.accept_length() >= 3.0);        // 3.9
  CHECK(t5.accept_length() >= 4.0);        // 4.875
  // Every verify but the last accepted all its drafts.
  CHECK(t4.accepted() >= (t4.verify_ct - 1) * 3);
  CHECK(t5.accepted() >= (t5.verify_ct - 1) * 4);
}

TEST_CASE("repeat target: bad periods and a tied lm_head are errors; nothing is written") {
  TempDir tmp;
  for (int const P : {1, -3, kVocab + 1}) {
    CAPTURE(P);
    std::string const dir = tmp.file("p" + std::to_string(P + 10));
    testing::check_error(
        kimi::write_random_preset(dir, "tiny", 1, false, 1, {}, {}, kimi::KimiRandomOptions{P}),
        StatusCode::kInvalidArgument,
        {"repeat_period " + std::to_string(P), "vocab_size 512", "[2,"});
    CHECK_FALSE(std::filesystem::exists(dir));
  }
  nlohmann::json tied;
  REQUIRE(kimi::kimi_preset_config("tiny", {}, &tied).ok());
  tied["tie_word_embeddings"] = true;
  std::string const dir = tmp.file("tied");
  testing::check_error(
      kimi::write_random_checkpoint(dir, tied, 1, false, 1, {}, kimi::KimiRandomOptions{8}),
      StatusCode::kInvalidArgument, {"repeat_period 8", "tie_word_embeddings"});
  CHECK_FALSE(std::filesystem::exists(dir));
}
