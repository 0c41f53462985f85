// sample CPU reference: hand-worked distributions (log-probability logits), greedy ties, top-k and
// top-p kept sets with ties, temperature, per-request errors and every validation error.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "specdec/ops/sample/sample.hpp"

using namespace specdec;
using namespace specdec::ops;

namespace {

struct SampleCase {
  std::vector<float> logits;  // [B, V]
  int vocab;
  std::vector<float> temperature, top_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seed;
  std::vector<uint32_t> step;
  std::vector<int32_t> tokens, status;

  SampleCase(std::vector<float> l, int v, float t, int32_t k = 0, float p = 1.0f, uint64_t s = 7)
      : logits(std::move(l)), vocab(v) {
    int const batch = static_cast<int>(logits.size()) / vocab;
    temperature.assign(batch, t);
    top_k.assign(batch, k);
    top_p.assign(batch, p);
    seed.assign(batch, s);
    step.assign(batch, 3);
    tokens.assign(batch, -7);
    status.assign(batch, -7);
  }
  SampleParams params() {
    SampleParams p;
    p.logits = logits.data();
    p.batch = static_cast<int>(logits.size()) / vocab;
    p.vocab = vocab;
    p.config = {temperature.data(), top_k.data(), top_p.data()};
    p.keys.seed = seed.data();
    p.keys.step = step.data();
    p.tokens = tokens.data();
    p.status = status.data();
    return p;
  }
};

std::vector<float> logs(std::vector<double> probs) {
  std::vector<float> out;
  for (double x : probs) out.push_back(x > 0 ? static_cast<float>(std::log(x)) : -INFINITY);
  return out;
}

// Kept set of a row's distribution (weight > 0).
std::vector<int> kept(std::vector<float> const& row, float t, int32_t k, float p) {
  TargetDist d;
  REQUIRE(target_dist_reference(row.data(), static_cast<int>(row.size()), t, k, p, d) == kSampleOk);
  std::vector<int> out;
  for (int v = 0; v < static_cast<int>(row.size()); ++v) {
    if (d.weight(v, row[v]) > 0.0f) out.push_back(v);
  }
  return out;
}

}  // namespace

TEST_CASE("sample: inverse CDF of a hand-worked distribution, over many seeds") {
  // p = {0.1, 0.2, 0.3, 0.4}: CDF 0.1, 0.3, 0.6, 1.0 (worked by hand).
  double const cdf[4] = {0.1, 0.3, 0.6, 1.0};
  int hits[4] = {0, 0, 0, 0};
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SampleCase c(logs({0.1, 0.2, 0.3, 0.4}), 4, 1.0f, 0, 1.0f, seed);
    auto p = c.params();
    REQUIRE(sample(CpuExecutor{}, p).ok());
    double const u = p.keys.uniform(0, 0, 0);
    if (std::fabs(u - 0.1) < 1e-5 || std::fabs(u - 0.3) < 1e-5 || std::fabs(u - 0.6) < 1e-5) continue;
    int expected = 0;
    while (!(cdf[expected] > u)) ++expected;
    CHECK(c.status[0] == kSampleOk);
    CHECK(c.tokens[0] == expected);
    ++hits[c.tokens[0]];
  }
  for (int v = 0; v < 4; ++v) CHECK(hits[v] > 0);
}

TEST_CASE("sample: greedy takes the argmax, ties to the smallest id, for any seed") {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SampleCase c({1.0f, 3.0f, 3.0f, 2.0f, 0.5f, 3.0f, -1.0f, 0.0f}, 4, 0.0f, 0, 1.0f, seed);
    c.temperature[1] = -1.0f;  // negative temperature is greedy too
    auto p = c.params();
    REQUIRE(sample(CpuExecutor{}, p).ok());
    CHECK(c.tokens[0] == 1);
    CHECK(c.tokens[1] == 1);
    CHECK(c.status[0] == kSampleOk);
  }
}

TEST_CASE("sample: top-k keeps the ties at the k-th value") {
  std::vector<float> row = {1.0f, 3.0f, 2.0f, 2.0f, 0.0f};
  CHECK(kept(row, 1.0f, 1, 1.0f) == std::vector<int>{1});
  CHECK(kept(row, 1.0f, 2, 1.0f) == std::vector<int>{1, 2, 3});  // 2nd largest = 2, tied
  CHECK(kept(row, 1.0f, 3, 1.0f) == std::vector<int>{1, 2, 3});
  CHECK(kept(row, 1.0f, 4, 1.0f) == std::vector<int>{0, 1, 2, 3});
  CHECK(kept(row, 1.0f, 0, 1.0f) == std::vector<int>{0, 1, 2, 3, 4});   // 0: all
  CHECK(kept(row, 1.0f, -3, 1.0f) == std::vector<int>{0, 1, 2, 3, 4});  // negative: all
  CHECK(kept(row, 1.0f, 5, 1.0f) == std::vector<int>{0, 1, 2, 3, 4});   // k >= V: all
  CHECK(kept(row, 1.0f, 9, 1.0f) == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("sample: top-p keeps the smallest high-probability set reaching the mass, with ties") {
  auto row = logs({0.1, 0.2, 0.3, 0.4});
  // By hand: sorted 0.4 (mass 0.4), 0.3 (0.7), 0.2 (0.9), 0.1 (1.0).
  CHECK(kept(row, 1.0f, 0, 0.35f) == std::vector<int>{3});
  CHECK(kept(row, 1.0f, 0, 0.5f) == std::vector<int>{2, 3});
  CHECK(kept(row, 1.0f, 0, 0.75f) == std::vector<int>{1, 2, 3});
  CHECK(kept(row, 1.0f, 0, 0.95f) == std::vector<int>{0, 1, 2, 3});
  CHECK(kept(row, 1.0f, 0, 1.0f) == std::vector<int>{0, 1, 2, 3});
  // Ties: {0.1, 0.3, 0.3, 0.3}: the 0.3 group reaches 0.9 at once, so all three stay.
  auto tied = logs({0.1, 0.3, 0.3, 0.3});
  CHECK(kept(tied, 1.0f, 0, 0.2f) == std::vector<int>{1, 2, 3});
  // top-k then top-p over the renormalised kept set: k = 2 keeps {0.4, 0.3} -> {4/7, 3/7};
  // top_p 0.5 then keeps 4/7 >= 0.5 alone.
  CHECK(kept(row, 1.0f, 2, 0.5f) == std::vector<int>{3});
  CHECK(kept(row, 1.0f, 2, 0.6f) == std::vector<int>{2, 3});
}

TEST_CASE("sample: temperature 0.5 squares the probabilities") {
  auto row = logs({0.1, 0.2, 0.3, 0.4});
  TargetDist d;
  REQUIRE(target_dist_reference(row.data(), 4, 0.5f, 0, 1.0f, d) == kSampleOk);
  // p^2 = {0.01, 0.04, 0.09, 0.16} / 0.30 (by hand); compare weight ratios to the largest.
  double const w3 = d.weight(3, row[3]);
  CHECK(d.weight(0, row[0]) / w3 == doctest::Approx(0.01 / 0.16).epsilon(1e-5));
  CHECK(d.weight(1, row[1]) / w3 == doctest::Approx(0.04 / 0.16).epsilon(1e-5));
  CHECK(d.weight(2, row[2]) / w3 == doctest::Approx(0.09 / 0.16).epsilon(1e-5));
  // top-p 0.5 at T = 0.5: sorted 0.16/0.3 = 0.533 >= 0.5 -> only token 3.
  CHECK(kept(row, 0.5f, 0, 0.5f) == std::vector<int>{3});
}

TEST_CASE("sample: a token with zero probability is never drawn") {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    SampleCase c(logs({0.5, 0.0, 0.5, 0.0}), 4, 1.0f, 0, 1.0f, seed);
    auto p = c.params();
    REQUIRE(sample(CpuExecutor{}, p).ok());
    CHECK((c.tokens[0] == 0 || c.tokens[0] == 2));
  }
}

TEST_CASE("sample: invalid per-request values write a status and token -1, others unaffected") {
  float const inf = std::numeric_limits<float>::infinity();
  float const nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> l = {0.f, 1.f, 2.f, 0.f, 1.f, 2.f, 0.f, 1.f, 2.f, 0.f, 1.f, 2.f,
                          0.f, 1.f, 2.f, -inf, -inf, -inf, nan, 1.f, 2.f, 0.f, 1.f, 2.f,
                          0.f, 1.f, 2.f, 0.f, 1.f, 2.f};
  SampleCase c(l, 3, 1.0f);
  // Row 8: a positive temperature below the smallest (1 / T would overflow ordinary logits);
  // row 9: the smallest itself, sampled (near-greedy: token 2).
  c.temperature[8] = 1e-38f;
  c.temperature[9] = kSampleMinTemperature;
  c.temperature[0] = nan;
  c.temperature[1] = inf;
  c.top_p[2] = 0.0f;
  c.top_p[3] = 1.5f;
  c.top_p[4] = nan;
  c.temperature[6] = 0.0f;  // greedy over a NaN row: the NaN key is the max
  auto p = c.params();
  REQUIRE(sample(CpuExecutor{}, p).ok());
  CHECK(c.status[0] == kSampleBadTemperature);
  CHECK(c.status[1] == kSampleBadTemperature);
  CHECK(c.status[2] == kSampleBadTopP);
  CHECK(c.status[3] == kSampleBadTopP);
  CHECK(c.status[4] == kSampleBadTopP);
  CHECK(c.status[5] == kSampleBadLogits);
  CHECK(c.status[6] == kSampleBadLogits);
  CHECK(c.status[7] == kSampleOk);
  CHECK(c.status[8] == kSampleBadTemperature);
  CHECK(c.status[9] == kSampleOk);
  CHECK(c.tokens[9] == 2);
  for (int b = 0; b < 7; ++b) CHECK(c.tokens[b] == -1);
  CHECK(c.tokens[8] == -1);
  CHECK(c.tokens[7] >= 0);
  Status s = check_sample_status(c.status.data(), 8);
  CHECK(!s.ok());
  CHECK(s.message().find("request 0") != std::string::npos);
  CHECK(s.message().find("temperature") != std::string::npos);
}

TEST_CASE("sample: validation names the problem") {
  SampleCase c(logs({0.5, 0.5}), 2, 1.0f);
  auto expect_error = [](SampleParams p, char const* what) {
    Status s = sample(CpuExecutor{}, p);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find(what) != std::string::npos, s.message());
  };
  auto p = c.params();
  { auto q = p; q.batch = 0; expect_error(q, "batch"); }
  { auto q = p; q.vocab = 0; expect_error(q, "vocab"); }
  { auto q = p; q.vocab = kSampleMaxVocab + 1; expect_error(q, "vocab"); }
  { auto q = p; q.logits = nullptr; expect_error(q, "logits"); }
  { auto q = p; q.tokens = nullptr; expect_error(q, "tokens"); }
  { auto q = p; q.status = nullptr; expect_error(q, "status"); }
  { auto q = p; q.config.temperature = nullptr; expect_error(q, "temperature"); }
  { auto q = p; q.keys.seed = nullptr; expect_error(q, "seed"); }
  { auto q = p; q.keys.step = nullptr; expect_error(q, "step"); }
  // top_k / top_p may be null: no top-k / top-p.
  { auto q = p; q.config.top_k = nullptr; q.config.top_p = nullptr; CHECK(sample(CpuExecutor{}, q).ok()); }
}

TEST_CASE("sample: the deterministic acceptance test never accepts a zero-weight token") {
  // Rounding can leave the remaining mass S - R a hair below zero once every kept token has been
  // rejected; a token outside the kept set (weight 0) must still be rejected.
  CHECK_FALSE(specdec::ops::sample_accept_deterministic(0.5f, -1e-7f, 0.0f));
  CHECK_FALSE(specdec::ops::sample_accept_deterministic(0.0f, 0.0f, 0.0f));
  CHECK(specdec::ops::sample_accept_deterministic(0.0f, 1.0f, 1e-30f));
  CHECK(specdec::ops::sample_accept_deterministic(0.25f, 2.0f, 0.51f));        // 0.5 < 0.51
  CHECK_FALSE(specdec::ops::sample_accept_deterministic(0.25f, 2.0f, 0.5f));   // 0.5 < 0.5 fails
}

TEST_CASE("sample: the CUDA workspace holds the chunk partials, the threshold keys, the lists") {
  // The layout the CUDA kernels index: partials [rows, chunks] from the start, min_keys [rows]
  // right after them, then kSampleListCap list entries per chunk where the vocabulary has at
  // most kSampleListMaxChunks chunks (none beyond), all inside sample_workspace_bytes.
  struct Shape { int64_t rows; int vocab; int64_t list_entries; };
  Shape const shapes[] = {{1, 5, kSampleListCap},
                          {7, 1003, kSampleListCap},
                          {64, 32000, 8 * kSampleListCap},
                          {16 * 64, 163840, 40 * kSampleListCap},
                          {3, kSampleListMaxChunks * kSampleChunk, 96 * kSampleListCap},
                          {3, kSampleListMaxChunks * kSampleChunk + 1, 0}};
  for (Shape s : shapes) {
    CHECK(sample_list_entries(s.vocab) == s.list_entries);
    size_t const bytes = sample_workspace_bytes(s.rows, s.vocab);
    std::vector<uint64_t> workspace((bytes + 7) / 8);
    auto* base = reinterpret_cast<unsigned char*>(workspace.data());
    uint32_t* const min_keys = sample_min_keys(workspace.data(), s.rows, s.vocab);
    auto* keys = reinterpret_cast<unsigned char*>(min_keys);
    auto* lists = reinterpret_cast<unsigned char*>(
        sample_candidate_lists(workspace.data(), s.rows, s.vocab));
    size_t const partial_bytes =
        static_cast<size_t>(s.rows) * sample_chunks(s.vocab) * sizeof(SampleChunkPartial);
    size_t const list_bytes = static_cast<size_t>(s.rows * s.list_entries) * sizeof(uint32_t);
    CHECK(keys - base == static_cast<std::ptrdiff_t>(partial_bytes));
    CHECK(lists - keys == static_cast<std::ptrdiff_t>(s.rows * sizeof(uint32_t)));
    CHECK(partial_bytes + static_cast<size_t>(s.rows) * sizeof(uint32_t) + list_bytes == bytes);
    CHECK(reinterpret_cast<uintptr_t>(keys) % alignof(uint32_t) == 0);
  }
  CHECK(sample_row_lists_fit(50, 163840));
  CHECK_FALSE(sample_row_lists_fit(kSampleListMaxTopK + 1, 163840));
  CHECK_FALSE(sample_row_lists_fit(0, 163840));
  CHECK_FALSE(sample_row_lists_fit(50, kSampleListMaxChunks * kSampleChunk + 1));
  CHECK(sample_chunks(kSampleChunk) == 1);
  CHECK(sample_chunks(kSampleChunk + 1) == 2);
}
