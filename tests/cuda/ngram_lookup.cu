// ngram_lookup CUDA kernel vs the CPU reference: exact trees over batch 1..256, max_len up to
// 8192, N 1..1024, branches {1,2,4,8}, several (min_n, max_n), small vocabularies (many matches),
// periodic and constant histories (many skipped continuations), and bad lengths; outputs poisoned
// before each run.
#include <doctest/doctest.h>

#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/ngram_lookup/ngram_lookup.hpp"
#include "support/testing.hpp"

namespace {

using specdec::DeviceBuffer;

struct SweepCase {
  int batch, max_len, nodes, branches, min_n, max_n, vocab;
  int pattern;  // 0 random, 1 periodic with noise, 2 constant
};

void run_case(SweepCase const& sc, uint64_t seed) {
  specdec::testing::Rng rng(seed);
  int const B = sc.batch, L = sc.max_len, N = sc.nodes;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * L), lengths(B);
  std::uniform_int_distribution<int> tok(0, sc.vocab - 1), len(1, L), coin(0, 15);
  for (int b = 0; b < B; ++b) {
    int const period = 2 + b % 7;
    for (int i = 0; i < L; ++i) {
      int32_t t = tok(rng);
      if (sc.pattern == 1 && coin(rng) != 0) t = (i % period) * 3 + 1;
      if (sc.pattern == 2) t = 5;
      tokens[static_cast<size_t>(b) * L + i] = t;
    }
    lengths[b] = b % 5 == 0 ? L : len(rng);
    if (B > 2 && b % 11 == 3) lengths[b] = 1;
    if (B > 2 && b % 13 == 4) lengths[b] = b % 2 ? 0 : L + 1;  // no tree
  }
  std::vector<int32_t> ref_tokens(static_cast<size_t>(B) * N), ref_parents(ref_tokens.size()),
      ref_count(B);
  specdec::ops::NgramLookupParams hp;
  hp.tokens = tokens.data();
  hp.lengths = lengths.data();
  hp.batch = B;
  hp.max_len = L;
  hp.min_n = sc.min_n;
  hp.max_n = sc.max_n;
  hp.nodes = N;
  hp.branches = sc.branches;
  hp.out_tokens = ref_tokens.data();
  hp.out_parents = ref_parents.data();
  hp.out_node_count = ref_count.data();
  REQUIRE(specdec::ops::ngram_lookup(specdec::CpuExecutor{}, hp).ok());

  DeviceBuffer<int32_t> d_tokens(tokens), d_lengths(lengths), d_out(ref_tokens.size()),
      d_parents(ref_tokens.size()), d_count(B);
  REQUIRE(d_out.fill_bytes(0xff).ok());
  REQUIRE(d_parents.fill_bytes(0xff).ok());
  REQUIRE(d_count.fill_bytes(0xff).ok());
  auto dp = hp;
  dp.tokens = d_tokens.data();
  dp.lengths = d_lengths.data();
  dp.out_tokens = d_out.data();
  dp.out_parents = d_parents.data();
  dp.out_node_count = d_count.data();
  auto s = specdec::ops::ngram_lookup(specdec::CudaExecutor{nullptr}, dp);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  INFO("B=" << B << " max_len=" << L << " N=" << N << " branches=" << sc.branches << " n=["
            << sc.min_n << "," << sc.max_n << "] vocab=" << sc.vocab << " pattern=" << sc.pattern);
  CHECK(d_count.download() == ref_count);
  CHECK(d_out.download() == ref_tokens);
  CHECK(d_parents.download() == ref_parents);
  int grown = 0;
  for (int c : ref_count) grown += c > 1;
  if (N > 1 && B >= 8) CHECK(grown > 0);  // the sweep really builds trees
}

}  // namespace

TEST_CASE("ngram_lookup cuda matches the CPU reference over a sweep") {
  std::vector<SweepCase> const cases = {
      {1, 16, 4, 1, 1, 3, 4, 0},        {1, 8192, 16, 1, 2, 4, 50, 1},
      {8, 8192, 64, 4, 1, 3, 8, 1},     {8, 1024, 1024, 8, 1, 2, 3, 0},
      {64, 1024, 16, 2, 1, 4, 6, 0},    {256, 1024, 4, 1, 3, 3, 4, 1},
      {256, 256, 64, 8, 1, 5, 5, 1},    {16, 512, 32, 4, 1, 2, 2, 2},
      {8, 300, 1, 4, 1, 2, 3, 0},       {32, 64, 64, 8, 2, 3, 3, 0},
      {4, 2048, 256, 8, 1, 3, 1000, 0},
  };
  uint64_t seed = 500;
  for (auto const& sc : cases) run_case(sc, seed++);
}
