// kimi_generate (model/kimi/generate.hpp): greedy generation through the CPU executor's cached
// forward reproduces transformers' 64 greedy tokens of the parity fixture (prefill + 63 cached
// decode steps against 64 full forwards in transformers); sampled generation is reproducible from
// its seed and depends on it; eos stops generation; bad options are refused by name.
#include "specdec/model/kimi/generate.hpp"
#include "support/kimi_model.hpp"
#include "support/testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#ifndef SPECDEC_TEST_FIXTURES_DIR
#error "SPECDEC_TEST_FIXTURES_DIR must name tests/fixtures"
#endif

namespace {

namespace kimi = specdec::model::kimi;
using specdec::CpuExecutor;
using specdec::Status;
using specdec::testing::TempDir;

using Loaded = specdec::testing::TinyKimiCpu;

void load(TempDir const& tmp, uint64_t seed, Loaded* m) {
  specdec::testing::load_tiny_kimi_cpu(tmp.path / "ckpt", seed, m);
}

kimi::GenerateResult run(Loaded const& m, std::vector<int32_t> const& prompt,
                         kimi::GenerateOptions const& o) {
  kimi::GenerateResult r;
  Status const s = kimi::kimi_generate(CpuExecutor{}, m.model, m.tiny.config, prompt, o, &r);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return r;
}

}  // namespace

TEST_CASE("generate: greedy tokens equal transformers' (parity fixture)") {
  std::string const path = std::string(SPECDEC_TEST_FIXTURES_DIR) + "/hf_parity_tiny.json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read ", path, " (scripts/hf_parity.py writes it)");
  nlohmann::json const fx = nlohmann::json::parse(in);
  REQUIRE(fx.at("seed") == 1);
  TempDir tmp;
  Loaded m;
  load(tmp, 1, &m);
  kimi::GenerateOptions o;
  o.max_new_tokens = 64;
  o.stop_at_eos = false;  // the fixture's loop never stops on eos
  o.page_size = 5;        // pages cross token boundaries at odd places
  auto const want = fx.at("greedy_tokens").at("float32").get<std::vector<int32_t>>();
  kimi::GenerateResult const r = run(m, fx.at("input_ids").get<std::vector<int32_t>>(), o);
  CHECK(r.output_ids == want);
  CHECK(!r.stopped_at_eos);
  CHECK(r.tokens_per_s > 0.0);
  MESSAGE("tiny CPU generate: ", r.tokens_per_s, " tokens/s (decode ", r.decode_tokens_per_s,
          " tokens/s)");
}

TEST_CASE("generate: sampling follows the seed, eos stops") {
  TempDir tmp;
  Loaded m;
  load(tmp, 2, &m);
  std::vector<int32_t> const prompt{5, 17, 99, 230, 41};
  kimi::GenerateOptions o;
  o.max_new_tokens = 24;
  o.temperature = 1.5f;  // flat enough that two seeds part ways within 24 tokens
  o.stop_at_eos = false;
  o.seed = 7;
  auto const a = run(m, prompt, o).output_ids;
  auto const b = run(m, prompt, o).output_ids;
  o.seed = 8;
  auto const c = run(m, prompt, o).output_ids;
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a.size() == 24);

  // With the 3rd sampled token as the only eos id, generation ends at its first occurrence.
  o.seed = 7;
  o.stop_at_eos = true;
  m.tiny.config.eos_token_ids = {a[2]};
  size_t const first = static_cast<size_t>(std::find(a.begin(), a.end(), a[2]) - a.begin());
  kimi::GenerateResult const r = run(m, prompt, o);
  CHECK(r.stopped_at_eos);
  CHECK(r.output_ids == std::vector<int32_t>(a.begin(), a.begin() + first + 1));
}

TEST_CASE("generate: refusals") {
  TempDir tmp;
  Loaded m;
  load(tmp, 3, &m);
  auto refused = [&](std::vector<int32_t> const& prompt, kimi::GenerateOptions const& o,
                     std::string const& what) {
    kimi::GenerateResult r;
    Status const s = kimi::kimi_generate(CpuExecutor{}, m.model, m.tiny.config, prompt, o, &r);
    CHECK_MESSAGE(s.to_string().find(what) != std::string::npos, s.to_string());
  };
  kimi::GenerateOptions o;
  refused({}, o, "prompt (input ids) is empty");
  refused({1, 512}, o, "input id 512 at index 1 is outside the vocabulary [0, 512)");
  o.max_new_tokens = 0;
  refused({1}, o, "max_new_tokens 0 < 1");
  o.max_new_tokens = static_cast<int>(m.tiny.config.max_position_embeddings);
  refused({1}, o, "exceed max_position_embeddings");
  o.max_new_tokens = 4;
  o.temperature = -0.5f;
  refused({1}, o, "temperature -0.5 is neither 0 (greedy) nor a finite value >= 1e-06");
  o.temperature = 1e-38f;
  refused({1}, o, "temperature 1e-38 is neither 0 (greedy) nor a finite value >= 1e-06");
  o.temperature = 0.0f;
  o.page_size = 0;
  refused({1}, o, "page_size 0 < 1");
}
