// sample kernel vs the CPU reference over batch, vocab, temperature, top-k, top-p and seeds
// (tokens exact except draws whose uniform lies within float rounding of a CDF or top-p boundary,
// detected by recomputing in double), plus a chi-square check of the GPU token histogram.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/sample/sample.hpp"
#include "support/testing.hpp"

using namespace specdec;
using namespace specdec::ops;

namespace {

// The CUDA path's workspace for B rows of V logits, attached to `p`.
DeviceBuffer<uint64_t> attach_workspace(SampleParams& p) {
  size_t const bytes = sample_workspace_bytes(p.batch, p.vocab);
  DeviceBuffer<uint64_t> workspace((bytes + 7) / 8);
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.size() * sizeof(uint64_t);
  return workspace;
}

struct Host {
  std::vector<float> logits, temperature, top_p;
  std::vector<int32_t> top_k, tokens, status;
  std::vector<uint64_t> seed;
  std::vector<uint32_t> step;
  SampleParams params(int batch, int vocab) {
    SampleParams p;
    p.logits = logits.data();
    p.batch = batch;
    p.vocab = vocab;
    p.config = {temperature.data(), top_k.data(), top_p.data()};
    p.keys.seed = seed.data();
    p.keys.step = step.data();
    p.tokens = tokens.data();
    p.status = status.data();
    return p;
  }
};

// Whether the CPU draw of row b sits within rounding of a boundary (CDF prefix or top-p mass).
bool near_boundary(float const* row, int vocab, float t, int32_t k, float top_p, float u) {
  TargetDist d;
  if (target_dist_reference(row, vocab, t, k, top_p, d) != kSampleOk || d.greedy_token >= 0) return false;
  if (sample_uses_top_p(top_p)) {
    TargetDist lo, hi;
    (void)target_dist_reference(row, vocab, t, k, top_p * (1 - 1e-4f), lo);
    (void)target_dist_reference(row, vocab, t, k, std::min(1.0f, top_p * (1 + 1e-4f)), hi);
    if (lo.min_key != hi.min_key) return true;
  }
  double total = 0;
  for (int v = 0; v < vocab; ++v) total += d.weight(v, row[v]);
  double const target = u * total, tol = 1e-4 * total;
  double prefix = 0;
  for (int v = 0; v < vocab; ++v) {
    prefix += d.weight(v, row[v]);
    if (std::fabs(prefix - target) < tol) return true;
    if (prefix > target + tol) break;
  }
  return false;
}

}  // namespace

TEST_CASE("sample: GPU matches the CPU reference over a sweep") {
  struct Size { int batch, vocab; };
  // {2, 300000}: slices longer than the threshold kernel keeps in shared memory (re-read passes).
  Size const sizes[] = {{1, 163840}, {8, 163840}, {64, 32000}, {256, 32000},
                        {7, 1003},   {3, 5},      {2, 300000}};
  float const temps[] = {0.0f, 0.7f, 1.3f};
  int64_t compared = 0, skipped = 0;
  testing::Rng rng(2024);
  for (Size s : sizes) {
    for (float t : temps) {
      // plain, top_p 0.9, top_k 50 (candidate lists), top_k 1000 + top_p 0.8 (the whole-row
      // passes); 4: no top-k / top-p arrays (no threshold launch); 5: top_k 20 + top_p 0.9 (lists)
      for (int variant = 0; variant < 6; ++variant) {
        int const B = s.batch, V = s.vocab;
        Host h;
        h.logits = testing::random_logits(rng, B, V);
        h.temperature.assign(B, t);
        int32_t const k_of[] = {0, 0, 50, 1000, 0, 20};
        float const p_of[] = {1.0f, 0.9f, 1.0f, 0.8f, 1.0f, 0.9f};
        h.top_k.assign(B, k_of[variant]);
        h.top_p.assign(B, p_of[variant]);
        for (int b = 0; b < B; ++b) {
          h.seed.push_back(rng());
          h.step.push_back(static_cast<uint32_t>(rng()));
        }
        if (B > 2) h.temperature[1] = 0.0f;  // greedy requests mixed in
        h.tokens.assign(B, -2);
        h.status.assign(B, -2);
        bool const arrays = variant != 4;
        auto hp = h.params(B, V);
        if (!arrays) hp.config.top_k = nullptr, hp.config.top_p = nullptr;
        REQUIRE(sample(CpuExecutor{}, hp).ok());
        DeviceBuffer<float> logits(h.logits), temperature(h.temperature), top_p(h.top_p);
        DeviceBuffer<int32_t> top_k(h.top_k), tokens(B), status(B);
        DeviceBuffer<uint64_t> seed(h.seed);
        DeviceBuffer<uint32_t> step(h.step);
        REQUIRE(tokens.fill_bytes(0xff).ok());
        REQUIRE(status.fill_bytes(0xff).ok());
        SampleParams dp{logits.data(), B, V, {temperature.data(), top_k.data(), top_p.data()},
                        {seed.data(), step.data(), nullptr}, tokens.data(), status.data()};
        if (!arrays) dp.config.top_k = nullptr, dp.config.top_p = nullptr;
        auto const workspace = attach_workspace(dp);
        REQUIRE(sample(CudaExecutor{}, dp).ok());
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        auto gt = tokens.download();
        auto gs = status.download();
        for (int b = 0; b < B; ++b) {
          CHECK(gs[b] == h.status[b]);
          ++compared;
          if (gt[b] == h.tokens[b]) continue;
          float const* row = h.logits.data() + static_cast<size_t>(b) * V;
          bool const nb = near_boundary(row, V, h.temperature[b], h.top_k[b], h.top_p[b],
                                        hp.keys.uniform(b, 0, 0));
          CHECK_MESSAGE(nb, "B=" << B << " V=" << V << " T=" << t << " variant " << variant
                                 << " b=" << b << ": gpu " << gt[b] << " cpu " << h.tokens[b]);
          ++skipped;
        }
      }
    }
  }
  MESSAGE("compared " << compared << ", near-boundary " << skipped);
  CHECK(skipped * 100 < compared);
}

TEST_CASE("sample: the threshold kernel's keys equal the reference's (top-k exactly)") {
  // Each case twice: the threshold kernel alone (every row by the passes over the whole row), and
  // after the chunk partials, where rows with top-k <= kSampleListMaxTopK take their threshold
  // from the chunks' candidate lists. Rows split over 1 block (no cluster), 3, 4, 8 and 16
  // blocks; logits continuous, on a grid of 1/4 (many ties at the thresholds: some chosen
  // distance bins hold more keys than the candidate list, so both selects run), flat (every key
  // in one distance bin: the radix passes; every chunk overflows its list) and continuous with
  // one flat chunk (that chunk overflows: the row takes the whole-row passes), and continuous
  // with one dominant token 60 above the rest (the whole-row select and the dominant token's
  // chunk's list bin again below it), and in tiers: a dominant token, 20 tokens near 30, the rest
  // (the whole-row select bins three times); V = 300000 and V = 163840 over 4 blocks (10 chunks
  // each) re-read their slices instead of caching them (the radix passes).
  enum Logits { kContinuous, kGrid, kFlat, kOneFlatChunk, kDominant, kTiers };
  struct Case { int vocab, max_blocks; Logits logits; };
  Case const cases[] = {{1003, 1, kContinuous},   {32000, 3, kGrid},       {32000, 16, kContinuous},
                        {163840, 16, kGrid},      {163840, 1, kContinuous}, {300000, 16, kGrid},
                        {163840, 16, kFlat},      {32000, 8, kContinuous},
                        {163840, 4, kGrid},       {32000, 16, kOneFlatChunk},
                        {163840, 16, kDominant},  {32000, 8, kDominant},
                        {163840, 16, kTiers},     {32000, 4, kTiers}};
  struct Setting { int32_t top_k; float top_p; };
  Setting const settings[] = {{1, 1.0f}, {50, 1.0f},  {4000, 1.0f}, {0, 0.5f},
                              {0, 0.9f}, {0, 0.99f}, {50, 0.9f},   {4000, 0.3f}};
  int const B = static_cast<int>(std::size(settings));
  testing::Rng rng(31);
  int64_t compared = 0, near = 0, listed_rows = 0;
  for (Case c : cases) for (bool lists : {false, true}) {
    int const V = c.vocab;
    std::vector<float> logits = testing::random_logits(rng, B, V);
    if (c.logits == kGrid) {
      for (float& l : logits) l = std::round(l * 4.0f) / 4.0f;
    } else if (c.logits == kFlat) {
      std::fill(logits.begin(), logits.end(), 1.5f);
    } else if (c.logits == kDominant || c.logits == kTiers) {
      for (int b = 0; b < B; ++b) {
        float* row = logits.data() + static_cast<size_t>(b) * V;
        row[(b * 7919 + 1) % V] = 60.0f;
        for (int j = 1; c.logits == kTiers && j <= 20; ++j) {
          row[(b * 7919 + 1 + 977 * j) % V] = 30.0f + 0.01f * static_cast<float>(j);
        }
      }
    } else if (c.logits == kOneFlatChunk) {
      for (int b = 0; b < B; ++b) {
        std::fill_n(logits.begin() + static_cast<size_t>(b) * V + kSampleChunk, kSampleChunk, 9.0f);
      }
    }
    std::vector<float> temperature(B, 0.8f), top_p(B);
    std::vector<int32_t> top_k(B);
    for (int b = 0; b < B; ++b) top_k[b] = settings[b].top_k, top_p[b] = settings[b].top_p;
    DeviceBuffer<float> d_logits(logits), d_temperature(temperature), d_top_p(top_p);
    DeviceBuffer<int32_t> d_top_k(top_k);
    DeviceBuffer<uint64_t> workspace((sample_workspace_bytes(B, V) + 7) / 8);
    REQUIRE(workspace.fill_bytes(0xff).ok());
    SamplingConfig const config{d_temperature.data(), d_top_k.data(), d_top_p.data()};
    SampleListUse const use = lists ? SampleListUse::kAlways : SampleListUse::kNever;
    if (lists) {
      REQUIRE(launch_sample_chunk_partials(d_logits.data(), B, V, 1, config, workspace.data(),
                                           nullptr, use).ok());
    }
    REQUIRE(launch_sample_row_thresholds(d_logits.data(), B, V, 1, config, workspace.data(),
                                         nullptr, c.max_blocks, use).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<uint64_t> bytes = workspace.download();
    uint32_t const* keys = sample_min_keys(bytes.data(), B, V);
    auto const* parts = reinterpret_cast<SampleChunkPartial const*>(bytes.data());
    int const chunks = sample_chunks(V);
    for (int b = 0; b < B; ++b) {
      float const* row = logits.data() + static_cast<size_t>(b) * V;
      bool const listed = std::all_of(parts + b * chunks, parts + (b + 1) * chunks,
                                      [](SampleChunkPartial const& q) { return q.listed >= 0; });
      listed_rows += listed;
      if (!lists || !sample_row_lists_fit(top_k[b], V) || c.logits == kFlat ||
          c.logits == kOneFlatChunk) {
        CHECK_MESSAGE(!listed, "V=" << V << " top_k " << top_k[b] << " logits " << c.logits);
      } else if (c.logits == kContinuous || c.logits == kDominant || c.logits == kTiers) {
        CHECK_MESSAGE(listed, "V=" << V << " top_k " << top_k[b]);
      }
      if (!sample_uses_top_k(top_k[b], V) && !sample_uses_top_p(top_p[b])) {
        CHECK(keys[b] == 0xffffffffu);  // left to the chunk partials: not written
        continue;
      }
      TargetDist want;
      REQUIRE(target_dist_reference(row, V, 0.8f, top_k[b], top_p[b], want) == kSampleOk);
      ++compared;
      if (keys[b] == want.min_key) continue;
      bool boundary = false;  // top-p whose mass target lies within rounding of a partial sum
      if (sample_uses_top_p(top_p[b])) {
        TargetDist lo, hi;
        (void)target_dist_reference(row, V, 0.8f, top_k[b], top_p[b] * (1 - 1e-4f), lo);
        (void)target_dist_reference(row, V, 0.8f, top_k[b], top_p[b] * (1 + 1e-4f), hi);
        boundary = lo.min_key != hi.min_key;
      }
      CHECK_MESSAGE(boundary, "V=" << V << " blocks<=" << c.max_blocks << " logits " << c.logits
                                   << " lists " << lists << " listed " << listed << " top_k "
                                   << top_k[b] << " top_p " << top_p[b]
                                   << ": gpu key " << keys[b] << " cpu key " << want.min_key);
      ++near;
    }
  }
  MESSAGE("compared " << compared << ", top-p near a boundary " << near << ", from lists "
                       << listed_rows);
  CHECK(near * 20 < compared);
  CHECK(listed_rows > 0);
}

TEST_CASE("sample: invalid per-request values on the GPU") {
  int const B = 4, V = 64;
  testing::Rng rng(5);
  Host h;
  h.logits = testing::random_logits(rng, B, V);
  h.temperature = {NAN, 1.0f, 1.0f, 1.0f};
  h.top_p = {1.0f, 0.0f, 1.0f, 1.0f};
  h.top_k = {0, 0, 0, 0};
  for (int v = 0; v < V; ++v) h.logits[2 * V + v] = -INFINITY;
  h.seed = {1, 2, 3, 4};
  h.step = {0, 0, 0, 0};
  DeviceBuffer<float> logits(h.logits), temperature(h.temperature), top_p(h.top_p);
  DeviceBuffer<int32_t> top_k(h.top_k), tokens(B), status(B);
  DeviceBuffer<uint64_t> seed(h.seed);
  DeviceBuffer<uint32_t> step(h.step);
  SampleParams dp{logits.data(), B, V, {temperature.data(), top_k.data(), top_p.data()},
                  {seed.data(), step.data(), nullptr}, tokens.data(), status.data()};
  SampleParams no_workspace = dp;
  Status const refused = sample(CudaExecutor{}, no_workspace);
  CHECK(refused.to_string().find("sample_workspace_bytes(batch, vocab)") != std::string::npos);
  auto const workspace = attach_workspace(dp);
  REQUIRE(sample(CudaExecutor{}, dp).ok());
  auto gt = tokens.download();
  auto gs = status.download();
  CHECK(gs == std::vector<int32_t>{kSampleBadTemperature, kSampleBadTopP, kSampleBadLogits, kSampleOk});
  CHECK(gt[0] == -1);
  CHECK(gt[1] == -1);
  CHECK(gt[2] == -1);
  CHECK(gt[3] >= 0);
}

TEST_CASE("sample: GPU token histogram matches p (chi-square)") {
  // One row of V = 8 repeated over B requests with distinct seeds; p = {1..8}/36 at T = 1.
  int const B = 200000, V = 8;
  std::vector<float> row(V);
  for (int v = 0; v < V; ++v) row[v] = std::log(static_cast<float>(v + 1));
  std::vector<float> logits;
  for (int b = 0; b < B; ++b) logits.insert(logits.end(), row.begin(), row.end());
  std::vector<uint64_t> seeds(B);
  for (int b = 0; b < B; ++b) seeds[b] = 0x12345ull * (b + 1);
  DeviceBuffer<float> d_logits(logits), temperature(std::vector<float>(B, 1.0f));
  DeviceBuffer<uint64_t> seed(seeds);
  DeviceBuffer<uint32_t> step(std::vector<uint32_t>(B, 9));
  DeviceBuffer<int32_t> tokens(B), status(B);
  SampleParams dp{d_logits.data(), B, V, {temperature.data(), nullptr, nullptr},
                  {seed.data(), step.data(), nullptr}, tokens.data(), status.data()};
  auto const workspace = attach_workspace(dp);
  REQUIRE(sample(CudaExecutor{}, dp).ok());
  auto gt = tokens.download();
  std::vector<double> counts(V, 0);
  for (int b = 0; b < B; ++b) {
    REQUIRE((gt[b] >= 0 && gt[b] < V));
    counts[gt[b]] += 1;
  }
  double chi2 = 0;
  for (int v = 0; v < V; ++v) {
    double const e = B * (v + 1) / 36.0;
    chi2 += (counts[v] - e) * (counts[v] - e) / e;
  }
  // Critical value of chi-square with 7 degrees of freedom at p = 1e-4 (table): 29.88.
  MESSAGE("chi2 = " << chi2);
  CHECK(chi2 < 29.88);
}

TEST_CASE("sample: GPU output is bitwise reproducible run to run (top-k and top-p thresholds)") {
  int const B = 64, V = 163840;
  testing::Rng rng(77);
  Host h;
  h.logits = testing::random_logits(rng, B, V, 1.0f);  // flat rows: many tokens share the top-p mass
  for (int b = 0; b < B; ++b) {
    h.temperature.push_back(0.8f);
    h.top_k.push_back(b % 2 ? 4000 : (b % 4 == 0 ? 40 : 0));  // 40: candidate lists
    h.top_p.push_back(b % 3 ? 0.9f : 1.0f);  // b % 12 == 6: temperature alone (chunked path)
    h.seed.push_back(rng());
    h.step.push_back(static_cast<uint32_t>(b));
  }
  DeviceBuffer<float> logits(h.logits), temperature(h.temperature), top_p(h.top_p);
  DeviceBuffer<int32_t> top_k(h.top_k), tokens(B), status(B);
  DeviceBuffer<uint64_t> seed(h.seed);
  DeviceBuffer<uint32_t> step(h.step);
  SampleParams dp{logits.data(), B, V, {temperature.data(), top_k.data(), top_p.data()},
                  {seed.data(), step.data(), nullptr}, tokens.data(), status.data()};
  auto const workspace = attach_workspace(dp);
  std::vector<int32_t> first;
  for (int run = 0; run < 8; ++run) {
    REQUIRE(tokens.fill_bytes(0xff).ok());
    REQUIRE(sample(CudaExecutor{}, dp).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<int32_t> const got = tokens.download();
    for (int32_t t : got) REQUIRE(t >= 0);
    if (run == 0) first = got;
    CHECK(got == first);
  }
}
