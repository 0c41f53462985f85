// moe_route CUDA kernel vs the CPU reference: ids and weights bit for bit over router shapes
// (Kimi-K2.5 384 experts / 1 group / top-8, DeepSeek-V3 256 / 8 groups / 4 kept / top-8, the tiny
// preset 8 / 2 / 1 / top-2, and others up to 1024 experts and top-64), token counts 1..300, with
// and without bias and normalisation, on random logits and on logits drawn from a few values
// (ties everywhere: the lower id / group must win on both sides). Outputs poisoned before a run.
#include <doctest/doctest.h>

#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/moe_route/moe_route.hpp"
#include "support/testing.hpp"

using namespace specdec;
using namespace specdec::ops;

TEST_CASE("moe_route: GPU ids and weights equal the CPU reference") {
  struct Shape { int experts, n_group, topk_group, top_k; bool norm; float scale; };
  Shape const shapes[] = {
      {384, 1, 1, 8, true, 2.827f},   // Kimi-K2.5
      {256, 8, 4, 8, true, 2.5f},     // DeepSeek-V3
      {8, 2, 1, 2, true, 2.5f},       // the tiny preset
      {64, 4, 2, 6, false, 1.0f},
      {1024, 32, 3, 64, true, 1.5f},  // the kernel's limits
      {96, 3, 3, 1, true, 1.0f},
  };
  testing::Rng rng(31);
  int64_t compared = 0;
  for (Shape const sh : shapes) {
    for (int tokens : {1, 7, 64, 300}) {
      for (int variant = 0; variant < 3; ++variant) {  // random; ties (few values); no bias
        int const E = sh.experts, K = sh.top_k;
        std::vector<float> logits = testing::random_logits(rng, tokens, E, 2.0f);
        if (variant == 1) {
          for (float& x : logits) x = static_cast<float>(static_cast<int>(x) % 3);  // -2..2: ties
        }
        std::vector<float> bias = testing::random_logits(rng, 1, E, 0.1f);
        MoeRouteParams p;
        p.tokens = tokens;
        p.experts = E;
        p.n_group = sh.n_group;
        p.topk_group = sh.topk_group;
        p.top_k = K;
        p.norm = sh.norm;
        p.scale = sh.scale;
        std::vector<int32_t> ids(static_cast<size_t>(tokens) * K);
        std::vector<float> weights(ids.size());
        p.logits = logits.data();
        p.bias = variant == 2 ? nullptr : bias.data();
        p.ids = ids.data();
        p.weights = weights.data();
        REQUIRE(moe_route(CpuExecutor{}, p).ok());

        DeviceBuffer<float> d_logits(logits), d_bias(bias), d_weights(weights.size());
        DeviceBuffer<int32_t> d_ids(ids.size());
        REQUIRE(d_ids.fill_bytes(0xff).ok());
        REQUIRE(d_weights.fill_bytes(0xff).ok());
        MoeRouteParams dp = p;
        dp.logits = d_logits.data();
        dp.bias = variant == 2 ? nullptr : d_bias.data();
        dp.ids = d_ids.data();
        dp.weights = d_weights.data();
        REQUIRE(moe_route(CudaExecutor{}, dp).ok());
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        CAPTURE(E);
        CAPTURE(tokens);
        CAPTURE(variant);
        CHECK(d_ids.download() == ids);
        CHECK(d_weights.download() == weights);
        compared += tokens;
      }
    }
  }
  MESSAGE("compared " << compared << " routed tokens");
}
