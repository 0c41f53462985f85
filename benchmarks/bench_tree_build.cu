// tree_build on the H200: batch {1, 8, 64, 256} x N {4, 8, 16, 32, 64}, random bushy trees,
// P = N. Bytes per launch = parents and prefix_len read once plus every output written once
// (mask, four [B, N] int32 arrays, leaf_paths [B, N, P], leaf_count, tree_status). The whole
// working set is under 5 MB, so it stays in the 50 MB L2 as it would in the engine: no rotation.
// Target: < 10 us at batch 1 (launch-latency bound).
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/tree_build/tree_build.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

void BM_tree_build(benchmark::State& state) {
  int const B = static_cast<int>(state.range(0)), N = static_cast<int>(state.range(1));
  int const P = N, W = (N + 31) / 32;
  size_t const rows = static_cast<size_t>(B) * N;
  specdec::testing::Rng rng(7);
  std::vector<int32_t> parents, prefix(B, 1000);
  for (int b = 0; b < B; ++b) {
    auto par = specdec::testing::random_parents(rng, N, b % 2 == 1);
    parents.insert(parents.end(), par.begin(), par.end());
  }
  specdec::DeviceBuffer<int32_t> d_par(parents), d_prefix(prefix), depth(rows), pos(rows), fc(rows),
      ns(rows), paths(rows * P), leaves(B), status(B);
  specdec::DeviceBuffer<uint32_t> mask(rows * W);
  specdec::ops::TreeBuildParams p;
  p.tree = {nullptr, d_par.data(), nullptr, B, N};
  p.prefix_len = d_prefix.data();
  p.out = {mask.data(),  depth.data(),  pos.data(),    fc.data(), ns.data(),
           paths.data(), leaves.data(), status.data(), P};
  double const bytes = 4.0 * (rows + B) + 4.0 * rows * (W + 4 + P) + 8.0 * B;
  specdec::bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    auto s = specdec::ops::tree_build(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}
SPECDEC_CUDA_BENCHMARK(BM_tree_build)
    ->ArgNames({"B", "N"})
    ->ArgsProduct({{1, 8, 64, 256}, {4, 8, 16, 32, 64}});

}  // namespace
