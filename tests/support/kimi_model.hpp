// Test support: the tiny random Kimi / DeepseekV3 checkpoint written to a folder and loaded back
// (config, safetensors, weights), as `specdec-kimi init-random --preset tiny` writes it (1 shard).
// doctest REQUIREs stop the calling test on any failure.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>

#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/weights.hpp"

namespace specdec::testing {

struct TinyKimi {
  io::DeepseekV3Config config;
  io::SafetensorsCheckpoint ckpt;
  model::kimi::KimiWeights weights;
};

// Writes the tiny preset (INT4 experts when `int4`, else bf16) with `seed` into `dir` and loads it.
inline void load_tiny_kimi(std::filesystem::path const& dir, bool int4, uint64_t seed, TinyKimi* m) {
  Status s = model::kimi::write_random_preset(dir.string(), "tiny", seed, int4, /*shards=*/1);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = io::load_config(dir, &m->config);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = io::SafetensorsCheckpoint::open(dir.string(), &m->ckpt);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = model::kimi::load_kimi_weights(m->ckpt, m->config, &m->weights);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

}  // namespace specdec::testing
