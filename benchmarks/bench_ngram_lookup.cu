// ngram_lookup on the H200: batch {1,8,64,256} x max_len {1024, 8192}, N = 16, n in [1, 3],
// chain (branches 1) and tree (branches 4), histories periodic with noise so matches exist.
// Bytes per launch = the histories read once + the trees written (it is latency-bound: one block
// per request, a few block-wide reductions).
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/ngram_lookup/ngram_lookup.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

void BM_ngram_lookup(benchmark::State& state) {
  int const B = static_cast<int>(state.range(0)), L = static_cast<int>(state.range(1));
  int const branches = static_cast<int>(state.range(2)), N = 16;
  specdec::testing::Rng rng(5);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * L), lengths(B, L);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] =
        rng() % 8 == 0 ? static_cast<int32_t>(rng() % 32000) : static_cast<int32_t>(i % 37) * 11;
  }
  specdec::DeviceBuffer<int32_t> d_tokens(tokens), d_lengths(lengths),
      out(static_cast<size_t>(B) * N), parents(static_cast<size_t>(B) * N), count(B);
  specdec::ops::NgramLookupParams p;
  p.tokens = d_tokens.data();
  p.lengths = d_lengths.data();
  p.batch = B;
  p.max_len = L;
  p.min_n = 1;
  p.max_n = 3;
  p.nodes = N;
  p.branches = branches;
  p.out_tokens = out.data();
  p.out_parents = parents.data();
  p.out_node_count = count.data();
  double const bytes = 4.0 * B * (L + 2.0 * N + 2);
  specdec::bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    auto s = specdec::ops::ngram_lookup(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}
SPECDEC_CUDA_BENCHMARK(BM_ngram_lookup)
    ->ArgNames({"B", "max_len", "branches"})
    ->ArgsProduct({{1, 8, 64, 256}, {1024, 8192}, {1, 4}});

}  // namespace
