// verify_greedy on the H200: argmax over logits [B, N, V] plus the acceptance pass, batch
// {1,8,64,256} x nodes {4,8,16,32,64} x vocab {32000,163840} (logits over 4 GB skipped). Bytes per
// launch = the logits read once; compare bytes_per_second with BM_copy_floor. Input sets are
// rotated so at least 256 MB (>> 50 MB L2) separates two reads of the same logits.
#include <algorithm>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/core/philox.hpp"
#include "specdec/ops/verify_greedy/verify_greedy.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

// Random logits in (-8, 8), generated on the device (host generation of GBs dominated the run).
__global__ void fill_logits(float* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] = specdec::philox_uniform(seed, static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(i),
                                   0, 0) *
               16.0f -
           8.0f + 1e-3f;
  }
}

void BM_verify_greedy(benchmark::State& state) {
  int const B = static_cast<int>(state.range(0)), N = static_cast<int>(state.range(1));
  int const V = static_cast<int>(state.range(2)), P = N + 1;
  size_t const logit_count = static_cast<size_t>(B) * N * V;
  size_t const set_bytes = logit_count * sizeof(float);
  int const sets = static_cast<int>(std::max<size_t>(1, (size_t{256} << 20) / set_bytes + 1));
  specdec::DeviceBuffer<float> logits(logit_count * sets);
  fill_logits<<<1024, 256>>>(logits.data(), logit_count * sets, 1);
  specdec::bench::check_cuda(cudaDeviceSynchronize(), "fill_logits");
  specdec::testing::Rng rng(1);
  std::vector<int32_t> parents, tokens, depth(static_cast<size_t>(B) * N), status(B, 0);
  for (int b = 0; b < B; ++b) {
    auto par = specdec::testing::random_parents(rng, N, true);
    for (int i = 0; i < N; ++i) {
      depth[b * N + i] = i == 0 ? 0 : depth[b * N + par[i]] + 1;
      tokens.push_back(static_cast<int32_t>(rng() % V));
    }
    parents.insert(parents.end(), par.begin(), par.end());
  }
  specdec::DeviceBuffer<int32_t> d_tokens(tokens), d_parents(parents), d_depth(depth),
      d_status(status), argmax(static_cast<size_t>(B) * N), path(static_cast<size_t>(B) * P),
      num(B), next(B);
  specdec::ops::VerifyGreedyParams p;
  p.tree = {d_tokens.data(), d_parents.data(), nullptr, B, N};
  p.links.depth = d_depth.data();
  p.links.tree_status = d_status.data();
  p.vocab = V;
  p.argmax_scratch = argmax.data();
  p.out = {path.data(), num.data(), next.data(), P};
  specdec::bench::time_launches(state, static_cast<double>(set_bytes), [&](int i, cudaStream_t stream) {
    p.logits = logits.data() + (i % sets) * logit_count;
    auto s = specdec::ops::verify_greedy(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}

void verify_greedy_sizes(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8, 64, 256}) {
    for (int nodes : {4, 8, 16, 32, 64}) {
      for (int vocab : {32000, 163840}) {
        if (static_cast<double>(batch) * nodes * vocab * 4 > 4e9) continue;
        b->Args({batch, nodes, vocab});
      }
    }
  }
}
SPECDEC_CUDA_BENCHMARK(BM_verify_greedy)
    ->ArgNames({"B", "N", "V"})
    ->Apply(verify_greedy_sizes);

}  // namespace
