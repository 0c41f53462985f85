// sample: batch {1, 8, 64, 256} x V {32000, 163840}; temperature 1, greedy (both without top-k /
// top-p arrays), top-p 0.9, top-k 50.
// bytes_per_launch = the logits read once (B * V * 4) + tokens/status written. Input sets are
// rotated so that together they exceed L2 (50 MB) and each launch reads its logits from HBM.
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/sample/sample.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

using namespace specdec;

void BM_sample(benchmark::State& state) {
  int const B = static_cast<int>(state.range(0)), V = static_cast<int>(state.range(1));
  int const mode = static_cast<int>(state.range(2));  // 0 T=1, 1 top_p 0.9, 2 top_k 50, 3 greedy
  size_t const row_bytes = static_cast<size_t>(B) * V * sizeof(float);
  int const sets = static_cast<int>(std::max<size_t>(1, (128ull << 20) / row_bytes + 1));
  testing::Rng rng(1);
  auto host = testing::random_logits(rng, B, V);
  std::vector<DeviceBuffer<float>> logits;
  for (int s = 0; s < sets; ++s) logits.emplace_back(host);
  DeviceBuffer<float> temperature(std::vector<float>(B, mode == 3 ? 0.0f : 1.0f));
  DeviceBuffer<float> top_p(std::vector<float>(B, mode == 1 ? 0.9f : 1.0f));
  DeviceBuffer<int32_t> top_k(std::vector<int32_t>(B, mode == 2 ? 50 : 0));
  DeviceBuffer<uint64_t> seed(std::vector<uint64_t>(B, 42));
  DeviceBuffer<uint32_t> step(std::vector<uint32_t>(B, 1));
  DeviceBuffer<int32_t> tokens(B), status(B);
  // Temperature and greedy rows pass no top-k / top-p arrays, as the engine does for a batch
  // without them (CudaTarget::put_sampling), so no threshold kernel is launched.
  bool const filtered = mode == 1 || mode == 2;
  ops::SampleParams p{nullptr, B, V,
                      {temperature.data(), filtered ? top_k.data() : nullptr,
                       filtered ? top_p.data() : nullptr},
                      {seed.data(), step.data(), nullptr}, tokens.data(), status.data()};
  DeviceBuffer<uint64_t> workspace((ops::sample_workspace_bytes(B, V) + 7) / 8);
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.size() * sizeof(uint64_t);
  bench::time_launches(state, row_bytes + 8.0 * B, [&](int i, cudaStream_t stream) {
    p.logits = logits[i % sets].data();
    Status const status = ops::sample(CudaExecutor{stream}, p);
    if (!status.ok()) state.SkipWithError(status.to_string().c_str());
  });
}
SPECDEC_CUDA_BENCHMARK(BM_sample)
    ->ArgNames({"batch", "vocab", "mode"})
    ->ArgsProduct({{1, 8, 64, 256}, {32000, 163840}, {0, 3, 1, 2}});

}  // namespace
