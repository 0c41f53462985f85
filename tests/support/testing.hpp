// Shared test helpers: seeded random inputs (never zeros) for trees and logits; scratch directories.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace specdec::testing {

using Rng = std::mt19937_64;

// Logits [rows, vocab] drawn from N(0, scale^2): a spread-out but non-degenerate distribution.
inline std::vector<float> random_logits(Rng& rng, int64_t rows, int64_t vocab, float scale = 3.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(static_cast<size_t>(rows * vocab));
  for (auto& x : out) x = dist(rng);
  return out;
}

// A random well-formed parent list of n nodes: parents[0] = -1, parents[i] uniform in [0, i),
// biased toward recent nodes when `deep` (long chains) and toward the root otherwise (bushy).
inline std::vector<int32_t> random_parents(Rng& rng, int n, bool deep) {
  std::vector<int32_t> parents(static_cast<size_t>(n), -1);
  for (int i = 1; i < n; ++i) {
    if (deep) {
      std::uniform_int_distribution<int> back(1, std::min(i, 3));
      parents[i] = i - back(rng);
    } else {
      std::uniform_int_distribution<int> any(0, i - 1);
      parents[i] = any(rng) / 2;
    }
  }
  return parents;
}

// A fresh directory under the system temp dir, removed with everything in it on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "specdec_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + tmpl);
    path = tmpl;
  }
  TempDir(TempDir const&) = delete;
  TempDir& operator=(TempDir const&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(std::string const& name) const { return (path / name).string(); }
};

}  // namespace specdec::testing
