// moe_experts on the H200: Kimi-K2.5's routed experts (H 7168, I = moe_intermediate_size 2048,
// E 384, top-8, INT4 group 32: 24.8 MB of packed weights and scales per expert), tokens
// {1, 8, 64, 256}, each token routed to 8 distinct uniformly random experts. Bytes per launch =
// packed weights + scales of the DISTINCT experts the routing touches (each must be read once)
// + x read + y written + ids and weights read; the workspace round trip (h, per-assignment
// outputs) is not counted, so GB/s against the copy floor is the fraction of the weight-stream
// roofline reached. All 384 experts (9.5 GB) stay resident for the process: a decode step's
// 8 .. 384 experts are far larger than L2, so every launch streams them from HBM.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/ops/moe_experts/moe_experts.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

constexpr int kHidden = 7168, kInter = 2048, kExperts = 384, kTopK = 8, kGroup = 32;

// Random packed words (uniform nibbles) from a hash of the index.
__global__ void fill_words(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    p[i] = static_cast<uint32_t>(z ^ (z >> 31));
  }
}

// bf16 scales in [0.5, 1.5) * base.
__global__ void fill_scales(uint16_t* p, size_t n, float base, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t const h = static_cast<uint32_t>((i + seed) * 2654435761u);
    float const v = base * (0.5f + static_cast<float>(h >> 8) * (1.0f / 16777216.0f));
    p[i] = static_cast<uint16_t>(__float_as_uint(v) >> 16);  // truncation is fine for a benchmark
  }
}

// The 384 INT4 experts, kept for the whole process (deliberately never freed: 9.5 GB would be
// reallocated by every repetition otherwise). The packed words are uniform random bits, so they
// stand for weights in the kernels' tiled order as they are (no conversion needed).
struct KimiExperts {
  specdec::DeviceBuffer<int32_t> packed[3];  // gate, up, down: all experts, expert-major
  specdec::DeviceBuffer<uint16_t> scale[3];
  specdec::DeviceBuffer<int32_t const*> t_packed[3];
  specdec::DeviceBuffer<uint16_t const*> t_scale[3];
  specdec::ops::MoeExpertWeights w;
  bool ok = true;

  KimiExperts() {
    for (int m = 0; m < 3; ++m) {
      int64_t const rows = m == 2 ? kHidden : kInter, cols = m == 2 ? kInter : kHidden;
      size_t const words = static_cast<size_t>(rows * cols / 8), groups = static_cast<size_t>(rows * (cols / kGroup));
      packed[m] = specdec::DeviceBuffer<int32_t>(words * kExperts);
      scale[m] = specdec::DeviceBuffer<uint16_t>(groups * kExperts);
      if (packed[m].size() == 0 || scale[m].size() == 0) {
        ok = false;
        return;
      }
      fill_words<<<1024, 256>>>(reinterpret_cast<uint32_t*>(packed[m].data()), packed[m].size(), 17u + m);
      fill_scales<<<1024, 256>>>(scale[m].data(), scale[m].size(),
                                 1.0f / (4.6f * std::sqrt(static_cast<float>(cols))), 5u + m);
      std::vector<int32_t const*> tp;
      std::vector<uint16_t const*> ts;
      for (int e = 0; e < kExperts; ++e) {
        tp.push_back(packed[m].data() + e * words);
        ts.push_back(scale[m].data() + e * groups);
      }
      t_packed[m] = specdec::DeviceBuffer<int32_t const*>(tp);
      t_scale[m] = specdec::DeviceBuffer<uint16_t const*>(ts);
    }
    specdec::bench::check_cuda(cudaDeviceSynchronize(), "fill experts");
    w.int4 = true;
    w.group_size = kGroup;
    w.gate_packed = t_packed[0].data(), w.up_packed = t_packed[1].data();
    w.down_packed = t_packed[2].data();
    w.gate_scale = t_scale[0].data(), w.up_scale = t_scale[1].data();
    w.down_scale = t_scale[2].data();
  }
  static double bytes_per_expert() {
    double const packed = 3.0 * kInter * kHidden / 2.0;
    double const scales = 3.0 * kInter * kHidden / kGroup * 2.0;
    return packed + scales;
  }
};

KimiExperts& kimi_experts() {
  static KimiExperts* experts = new KimiExperts();
  return *experts;
}

void BM_moe_experts_int4(benchmark::State& state) {
  int const T = static_cast<int>(state.range(0));
  KimiExperts& X = kimi_experts();
  if (!X.ok) {
    state.SkipWithError("could not allocate the 9.5 GB of Kimi-K2.5 experts");
    return;
  }
  specdec::testing::Rng rng(42);
  std::vector<int32_t> ids(static_cast<size_t>(T) * kTopK);
  std::vector<float> weights(ids.size());
  std::vector<int32_t> perm(kExperts);
  std::set<int32_t> distinct;
  std::uniform_real_distribution<float> wd(0.05f, 0.3f);
  for (int t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < kTopK; ++k) {
      ids[static_cast<size_t>(t) * kTopK + k] = perm[static_cast<size_t>(k)];
      weights[static_cast<size_t>(t) * kTopK + k] = wd(rng);
      distinct.insert(perm[static_cast<size_t>(k)]);
    }
  }
  specdec::DeviceBuffer<float> x(specdec::testing::random_logits(rng, T, kHidden, 1.0f));
  specdec::DeviceBuffer<int32_t> d_ids(ids);
  specdec::DeviceBuffer<float> d_weights(weights);
  specdec::DeviceBuffer<float> y(static_cast<size_t>(T) * kHidden);
  size_t const ws_bytes =
      specdec::ops::moe_experts_workspace_bytes(T, kTopK, kExperts, kHidden, kInter);
  specdec::DeviceBuffer<unsigned char> ws(ws_bytes);
  specdec::ops::MoeExpertsParams p;
  p.x = x.data();
  p.ids = d_ids.data();
  p.weights = d_weights.data();
  p.tokens = T;
  p.hidden = kHidden;
  p.inter = kInter;
  p.experts = kExperts;
  p.top_k = kTopK;
  p.w = X.w;
  p.y = y.data();
  p.workspace = ws.data();
  p.workspace_bytes = ws_bytes;
  double const bytes = static_cast<double>(distinct.size()) * KimiExperts::bytes_per_expert() +
                       2.0 * 4.0 * T * kHidden + 8.0 * T * kTopK;
  state.counters["experts"] = static_cast<double>(distinct.size());
  specdec::bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    auto const s = specdec::ops::moe_experts(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}
SPECDEC_CUDA_BENCHMARK(BM_moe_experts_int4)->ArgNames({"tokens"})->Arg(1)->Arg(8)->Arg(64)->Arg(256);

}  // namespace
