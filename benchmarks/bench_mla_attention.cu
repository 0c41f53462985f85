// mla_attention on the H200: the Kimi-K2.5 shape (64 heads, c 512, r 64: W = 576 fp32 = 2304
// bytes per cache row, page_size 64, pages interleaved between requests), decode B {1, 8, 64} x
// context {1024, 8192, 32768} slots (max_slots = the context). Bytes per launch = cache rows read
// once (B * ctx * 2304) + q [B, 64, 576] + out [B, 64, 512] (fp32). Input sets rotate (page tables
// into separate copies of the cache, up to one per captured launch: 20) until the rows read over
// the rotation exceed 200 MB; B 1 at 1024 slots still reads only 47 MB over 20 sets, about the
// H200's L2, so that row is partly served from L2.
// Floor to compare with: HBM, bytes at the measured copy rate (RESULTS.md). Counter
// fma_per_second: the B * ctx * 64 * (576 + 512) products of the scores and the context per
// second. The kernel forms each as three bf16 tensor-core products (split operands), so the fp32
// FMA rate (~33.5 T/s on the H200) no longer bounds it as it bound the CUDA-core kernel before.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/mla_attention/mla_attention.hpp"
#include "support/bench.cuh"

namespace {

// Uniform values in [-1, 1) from a hash of the index (never all zeros).
__global__ void fill_uniform(float* x, size_t n, uint32_t seed) {
  for (size_t k = blockIdx.x * size_t{blockDim.x} + threadIdx.x; k < n;
       k += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(k) * 0x9e3779b9u ^ seed ^ static_cast<uint32_t>(k >> 32);
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    x[k] = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

void BM_mla_attention_decode(benchmark::State& state) {
  int const B = static_cast<int>(state.range(0)), ctx = static_cast<int>(state.range(1));
  int const H = 64, C = 512, R = 64, W = C + R, kPage = 64;
  int const pages_per_request = (ctx + kPage - 1) / kPage;
  double const set_bytes = double(B) * pages_per_request * kPage * W * 4;
  int const sets = std::clamp(static_cast<int>(200e6 / set_bytes) + 1, 1,
                              specdec::bench::kLaunchesPerIteration);
  int const num_pages = sets * B * pages_per_request;
  specdec::DeviceBuffer<float> cache(size_t(num_pages) * kPage * W);
  specdec::DeviceBuffer<float> q(size_t(B) * H * W), out(size_t(B) * H * C);
  specdec::DeviceBuffer<float> workspace(specdec::ops::mla_attention_workspace_bound_bytes(C) / 4);
  if (!cache.valid() || !q.valid() || !out.valid() || !workspace.valid()) {
    state.SkipWithError("out of device memory");
    return;
  }
  fill_uniform<<<1024, 256>>>(cache.data(), cache.size(), 1u);
  fill_uniform<<<256, 256>>>(q.data(), q.size(), 2u);
  specdec::bench::check_cuda(cudaDeviceSynchronize(), "fill");
  // Set s, request b: pages s * B * P + k * B + b (requests interleaved).
  std::vector<int32_t> tables(size_t(sets) * B * pages_per_request);
  for (int s = 0; s < sets; ++s) {
    for (int b = 0; b < B; ++b) {
      for (int k = 0; k < pages_per_request; ++k) {
        tables[(size_t(s) * B + b) * pages_per_request + k] =
            s * B * pages_per_request + k * B + b;
      }
    }
  }
  std::vector<int32_t> token_request(B), token_index(B, 0), base(B, ctx - 1);
  for (int b = 0; b < B; ++b) token_request[b] = b;
  specdec::DeviceBuffer<int32_t> d_tables(tables), d_request(token_request),
      d_index(token_index), d_base(base);
  specdec::ops::MlaAttentionParams p;
  p.q = q.data();
  p.cache = cache.data();
  p.token_request = d_request.data();
  p.token_index = d_index.data();
  p.base = d_base.data();
  p.tokens = B;
  p.heads = H;
  p.kv_lora_rank = C;
  p.rope_dim = R;
  p.batch = B;
  p.page_size = kPage;
  p.max_pages = pages_per_request;
  p.num_pages = num_pages;
  p.max_slots = ctx;
  p.scale = 0.0722f;  // ~ Kimi-K2.5's softmax_scale
  p.out = out.data();
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.size() * sizeof(float);
  double const bytes = double(B) * ctx * W * 4 + double(B) * H * (W + C) * 4;
  specdec::bench::time_launches(state, bytes, [&](int i, cudaStream_t stream) {
    p.page_table = d_tables.data() + size_t(i % sets) * B * pages_per_request;
    auto const s = specdec::ops::mla_attention(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
  state.counters["fma_per_second"] = benchmark::Counter(
      double(B) * ctx * H * (W + C), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["sets"] = sets;
}
SPECDEC_CUDA_BENCHMARK(BM_mla_attention_decode)
    ->ArgNames({"batch", "context"})
    ->ArgsProduct({{1, 8, 64}, {1024, 8192, 32768}});

}  // namespace
