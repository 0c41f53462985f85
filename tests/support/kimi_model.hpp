// Test support: the tiny random Kimi / DeepseekV3 checkpoint written to a folder and loaded back
// (config, safetensors, weights), as `specdec-kimi init-random --preset tiny` writes it (1 shard),
// or any checkpoint folder loaded (load_kimi_dir), the tiny preset as the CPU executor's model
// (load_tiny_kimi_cpu),
// and what the forward tests share (MaxDiff, random_tokens, Tree).
// doctest REQUIREs stop the calling test on any failure.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "specdec/io/hf_config.hpp"
#include "specdec/io/safetensors.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/random_checkpoint.hpp"
#include "specdec/model/kimi/weights.hpp"
#include "specdec/ops/tree_build/tree_build.hpp"

namespace specdec::testing {

struct TinyKimi {
  io::DeepseekV3Config config;
  io::SafetensorsCheckpoint ckpt;
  model::kimi::KimiWeights weights;
};

// Loads the checkpoint in `dir` (config, safetensors, weights), e.g. the demo's models/demo/target.
inline void load_kimi_dir(std::filesystem::path const& dir, TinyKimi* m) {
  Status s = io::load_config(dir, &m->config);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = io::SafetensorsCheckpoint::open(dir.string(), &m->ckpt);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  s = model::kimi::load_kimi_weights(m->ckpt, m->config, &m->weights);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

// Writes the tiny preset (INT4 experts when `int4`, else bf16) with `seed` into `dir` and loads it.
// `patch`, when given, edits config.json before the load (the weights stay as written).
inline void load_tiny_kimi(std::filesystem::path const& dir, bool int4, uint64_t seed, TinyKimi* m,
                           std::function<void(nlohmann::json&)> const& patch = {}) {
  Status s = model::kimi::write_random_preset(dir.string(), "tiny", seed, int4, /*shards=*/1);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  if (patch) {
    std::filesystem::path const cfg = dir / "config.json";
    std::ifstream in(cfg);
    nlohmann::json j = nlohmann::json::parse(in);
    in.close();
    patch(j);
    std::ofstream(cfg) << j.dump(2);
  }
  load_kimi_dir(dir, m);
}

// The tiny preset (bf16, `seed`) written into `dir`, loaded, and as the CPU executor's model.
struct TinyKimiCpu {
  TinyKimi tiny;
  model::kimi::KimiCpuModel model;
};
inline void load_tiny_kimi_cpu(std::filesystem::path const& dir, uint64_t seed, TinyKimiCpu* m) {
  load_tiny_kimi(dir, /*int4=*/false, seed, &m->tiny);
  Status const s = model::kimi::load_kimi_cpu_model(m->tiny.weights, m->tiny.config, &m->model);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

// Largest |got - want| and |want| over the values compared (forward comparisons).
struct MaxDiff {
  double abs = 0.0, ref = 0.0;
  void add(float const* got, float const* want, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      abs = std::max(abs, std::fabs(double(got[i]) - want[i]));
      ref = std::max(ref, std::fabs(double(want[i])));
    }
  }
  double rel() const { return ref > 0.0 ? abs / ref : abs; }
};

// n token ids uniform in [0, vocab).
template <class Rng>
std::vector<int32_t> random_tokens(Rng& rng, int n, int vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = d(rng);
  return t;
}

// tree_build's outputs for B requests of N nodes.
struct Tree {
  int B = 0, N = 0, W = 0;
  std::vector<int32_t> parents, prefix, depth, positions, first_child, next_sibling, leaf_paths,
      leaf_count, status;
  std::vector<uint32_t> mask;

  void build(std::vector<int32_t> const& par, std::vector<int32_t> const& prefix_len, int nodes) {
    B = static_cast<int>(prefix_len.size());
    N = nodes;
    W = specdec::mask_words(N);
    parents = par;
    prefix = prefix_len;
    size_t const BN = size_t(B) * N;
    mask.assign(BN * W, 0);
    depth.assign(BN, 0);
    positions.assign(BN, 0);
    first_child.assign(BN, 0);
    next_sibling.assign(BN, 0);
    leaf_paths.assign(BN * N, 0);
    leaf_count.assign(B, 0);
    status.assign(B, 0);
    specdec::ops::TreeBuildParams p;
    p.tree = specdec::TreeInput{nullptr, parents.data(), nullptr, B, N};
    p.prefix_len = prefix.data();
    p.out = specdec::TreeTopology{mask.data(),        depth.data(),        positions.data(),
                                  first_child.data(), next_sibling.data(), leaf_paths.data(),
                                  leaf_count.data(),  status.data(),       N};
    Status const s = specdec::ops::tree_build(specdec::CpuExecutor{}, p);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  // Node indices root..i of request b.
  std::vector<int> path(int b, int i) const {
    std::vector<int> out;
    for (int k = i; k >= 0; k = parents[size_t(b) * N + k]) out.push_back(k);
    std::reverse(out.begin(), out.end());
    return out;
  }
};

}  // namespace specdec::testing
