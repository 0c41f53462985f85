// moe_route on the H200: tokens {1, 8, 64, 256} for the Kimi-K2.5 router (384 experts, 1 group,
// top-8, scale 2.827) and DeepSeek-V3's (256 experts, 8 groups, 4 kept, top-8). Bytes per launch
// = logits [T, E] + bias [E] read once + ids and weights [T, 8] written (latency-bound: one warp
// per token, top_k rounds of warp reductions).
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/moe_route/moe_route.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

void BM_moe_route(benchmark::State& state) {
  int const T = static_cast<int>(state.range(0));
  bool const kimi = state.range(1) == 0;
  int const E = kimi ? 384 : 256, K = 8;
  specdec::testing::Rng rng(9);
  specdec::DeviceBuffer<float> logits(specdec::testing::random_logits(rng, T, E, 2.0f));
  specdec::DeviceBuffer<float> bias(specdec::testing::random_logits(rng, 1, E, 0.1f));
  specdec::DeviceBuffer<int32_t> ids(static_cast<size_t>(T) * K);
  specdec::DeviceBuffer<float> weights(static_cast<size_t>(T) * K);
  specdec::ops::MoeRouteParams p;
  p.logits = logits.data();
  p.bias = bias.data();
  p.tokens = T;
  p.experts = E;
  p.n_group = kimi ? 1 : 8;
  p.topk_group = kimi ? 1 : 4;
  p.top_k = K;
  p.scale = kimi ? 2.827f : 2.5f;
  p.ids = ids.data();
  p.weights = weights.data();
  double const bytes = 4.0 * (static_cast<double>(T) * E + E + 2.0 * T * K);
  specdec::bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    auto const s = specdec::ops::moe_route(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}
SPECDEC_CUDA_BENCHMARK(BM_moe_route)
    ->ArgNames({"tokens", "router"})  // router 0: Kimi-K2.5, 1: DeepSeek-V3
    ->ArgsProduct({{1, 8, 64, 256}, {0, 1}});

}  // namespace
