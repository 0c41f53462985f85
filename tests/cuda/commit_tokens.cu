// commit_tokens CUDA kernel vs the CPU reference: batch {1, 7, 64, 300} x nodes {2, 5, 33, 64},
// path capacity 1 .. N, random trees (depths from their parents), node counts given or not,
// num_accepted from -1 to P (out of range clamped), tokens from a small vocabulary so that eos
// ids, per-request stop ids (0 to 3 each) and budgets of 1 .. 4 tokens stop requests inside
// their paths; every record compared exactly after poisoning (0xff).
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/commit_tokens/commit_tokens.hpp"
#include "support/testing.hpp"

namespace {

using specdec::DeviceBuffer;
using namespace specdec::ops;

void run_case(int B, int N, bool with_count, uint64_t seed) {
  CAPTURE(B);
  CAPTURE(N);
  CAPTURE(with_count);
  specdec::testing::Rng rng(seed);
  std::uniform_int_distribution<int> vocab(0, 11), p_cap(1, N), stops(0, 3), budget(1, 4),
      coin(0, 1);
  int const P = p_cap(rng);
  size_t const BN = static_cast<size_t>(B) * N;
  std::vector<int32_t> tokens(BN), depth(BN), count(B), path(static_cast<size_t>(B) * P),
      accepted(B), next(B), at_eos(B), remaining(B), offsets{0}, stop_ids, eos{3, 7};
  for (int b = 0; b < B; ++b) {
    auto const parents = specdec::testing::random_parents(rng, N, coin(rng) == 1);
    std::uniform_int_distribution<int> n_of(1, N);
    count[b] = with_count ? n_of(rng) : N;
    for (int i = 0; i < N; ++i) {
      size_t const at = static_cast<size_t>(b) * N + i;
      tokens[at] = vocab(rng);
      depth[at] = i == 0 ? 0 : depth[static_cast<size_t>(b) * N + parents[i]] + 1;
    }
    std::uniform_int_distribution<int> acc(-1, P), node(0, N - 1);
    accepted[b] = acc(rng);
    for (int k = 0; k < P; ++k) path[static_cast<size_t>(b) * P + k] = k == 0 ? 0 : node(rng);
    next[b] = vocab(rng);
    at_eos[b] = coin(rng);
    remaining[b] = budget(rng);
    for (int s = stops(rng); s > 0; --s) stop_ids.push_back(vocab(rng));
    offsets.push_back(static_cast<int32_t>(stop_ids.size()));
  }
  int const width = commit_record_width(P);
  std::vector<int32_t> want(static_cast<size_t>(B) * width, -7);
  CommitTokensParams p;
  p.tree = specdec::TreeInput{tokens.data(), nullptr, with_count ? count.data() : nullptr, B, N};
  p.depth = depth.data();
  p.acceptance = specdec::Acceptance{path.data(), accepted.data(), next.data(), P};
  p.eos = eos.data();
  p.num_eos = static_cast<int>(eos.size());
  p.stop_at_eos = at_eos.data();
  p.stop_offsets = offsets.data();
  p.stop_ids = stop_ids.data();
  p.remaining = remaining.data();
  p.record = want.data();
  REQUIRE(commit_tokens(specdec::CpuExecutor{}, p).ok());

  DeviceBuffer<int32_t> d_tokens(tokens), d_depth(depth), d_count(count), d_path(path),
      d_accepted(accepted), d_next(next), d_eos(eos), d_at_eos(at_eos), d_offsets(offsets),
      d_stop(stop_ids.empty() ? std::vector<int32_t>{0} : stop_ids), d_remaining(remaining),
      d_record(want.size());
  REQUIRE(d_record.fill_bytes(0xff).ok());
  CommitTokensParams d = p;
  d.tree = specdec::TreeInput{d_tokens.data(), nullptr, with_count ? d_count.data() : nullptr, B,
                              N};
  d.depth = d_depth.data();
  d.acceptance = specdec::Acceptance{d_path.data(), d_accepted.data(), d_next.data(), P};
  d.eos = d_eos.data();
  d.stop_at_eos = d_at_eos.data();
  d.stop_offsets = d_offsets.data();
  d.stop_ids = d_stop.data();
  d.remaining = d_remaining.data();
  d.record = d_record.data();
  specdec::Status const s = commit_tokens(specdec::CudaExecutor{}, d);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<int32_t> const got = d_record.download();
  CHECK(got == want);
  // The cases must stop requests every way, or the comparison proves little (the largest
  // batch, where each way is all but certain).
  if (B >= 300) {
    int stopped[4] = {};
    for (int b = 0; b < B; ++b) ++stopped[want[static_cast<size_t>(b) * width + 1]];
    for (int reason = kCommitGoOn; reason <= kCommitLength; ++reason) {
      CAPTURE(reason);
      CHECK(stopped[reason] > 0);
    }
  }
}

}  // namespace

TEST_CASE("commit_tokens cuda: sweep vs reference") {
  uint64_t seed = 1;
  for (int B : {1, 7, 64, 300}) {
    for (int N : {2, 5, 33, 64}) {
      for (bool with_count : {false, true}) run_case(B, N, with_count, seed++);
    }
  }
}
