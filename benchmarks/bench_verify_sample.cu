// verify_sample: batch {1, 8, 64, 256} x nodes {4, 8, 16, 32, 64} x V {32000, 163840} with
// deterministic drafts, and batch {1, 8, 64, 256} x nodes {4, 16} x V with sampled drafts and
// with deterministic ones filtered (top-k 50 and top-p 0.9); temperature 1; cases whose inputs
// exceed kMaxInputBytes skipped. Trees are chains (top-k 1) whose drafts are the target argmax,
// so every node is accepted: the worst case (one row visited per depth).
// BM_verify_sample_rejected: the same chains of 4 whose drafts the target gives ~0, so the root's
// child is rejected and the correction drawn there (with sampled drafts: from the residual).
// bytes_per_launch = what the kernels must read: the logit rows, B * N * V * 4, and with sampled
// drafts rejected at the root each request's root draft row (the residual's), B * V * 4
// (accepted drafts need one draft probability each). Inputs are not rotated (up to 4 GB); the
// largest cases exceed L2 by themselves.
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/verify_sample/verify_sample.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

using namespace specdec;

// Row r's dominant token, and with `shift` 1 the token after it (random logit, p ~ e^-60).
__host__ __device__ inline int32_t row_token(size_t r, int V, int shift) {
  return static_cast<int32_t>((r * 7919 + 1 + static_cast<size_t>(shift)) % V);
}

// logits [rows, V]: every row `base` with its dominant token raised to 60 (p ~ 1); q [rows, V]
// (where given): 0.5 / V everywhere plus 0.5 on token row_token(r, V, shift). Filled on the
// device, since a case holds up to 4 GB and the setup runs once per repetition.
__global__ void fill_rows(float const* base, size_t rows, int V, int shift, float* logits,
                          float* q) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < rows * V;
       i += size_t{gridDim.x} * blockDim.x) {
    size_t const r = i / V;
    int const v = static_cast<int>(i % V);
    logits[i] = v == row_token(r, V, 0) ? 60.0f : base[v];
    if (q) q[i] = 0.5f / V + (v == row_token(r, V, shift) ? 0.5f : 0.0f);
  }
}

void run_verify_sample(benchmark::State& state, int B, int N, int V, bool sampled, bool filtered,
                       bool rejected) {
  size_t const rows = static_cast<size_t>(B) * N;
  testing::Rng rng(3);
  DeviceBuffer<float> base(testing::random_logits(rng, 1, V)), d_logits(rows * V),
      d_q(sampled ? rows * V : 0);
  if (d_logits.size() != rows * V || (sampled && d_q.size() != rows * V)) {
    state.SkipWithError("verify_sample: the inputs do not fit the device");
    return;
  }
  fill_rows<<<1024, 256>>>(base.data(), rows, V, rejected ? 1 : 0, d_logits.data(),
                           sampled ? d_q.data() : nullptr);
  bench::check_cuda(cudaDeviceSynchronize(), "fill_rows");
  // A chain per request whose drafts are the dominant tokens (rejected: the tokens after them).
  std::vector<int32_t> tokens(rows), parents(rows), depth(rows), fc(rows), ns(rows, -1);
  for (size_t r = 0; r < rows; ++r) {
    int const i = static_cast<int>(r % N);
    parents[r] = i - 1;
    depth[r] = i;
    fc[r] = i + 1 < N ? i + 1 : -1;
    if (i > 0) tokens[r] = row_token(r - 1, V, rejected ? 1 : 0);
  }
  DeviceBuffer<int32_t> d_tokens(tokens), d_parents(parents), d_depth(depth), d_fc(fc), d_ns(ns);
  DeviceBuffer<int32_t> d_ts(std::vector<int32_t>(B, 0));
  DeviceBuffer<float> temperature(std::vector<float>(B, 1.0f)), top_p(std::vector<float>(B, 0.9f));
  DeviceBuffer<int32_t> top_k(std::vector<int32_t>(B, 50));
  DeviceBuffer<uint64_t> seed(std::vector<uint64_t>(B, 5));
  DeviceBuffer<uint32_t> step(std::vector<uint32_t>(B, 2));
  DeviceBuffer<int32_t> path(rows), num(B), next(B), status(B);
  ops::VerifySampleParams p;
  p.tree = {d_tokens.data(), d_parents.data(), nullptr, B, N};
  p.links = {d_depth.data(), d_fc.data(), d_ns.data(), d_ts.data()};
  p.logits = d_logits.data();
  p.draft_probs = sampled ? d_q.data() : nullptr;
  p.vocab = V;
  p.config = {temperature.data(), filtered ? top_k.data() : nullptr,
              filtered ? top_p.data() : nullptr};
  p.keys = {seed.data(), step.data(), nullptr};
  p.out = {path.data(), num.data(), next.data(), N};
  p.status = status.data();
  DeviceBuffer<uint64_t> workspace((ops::verify_sample_workspace_bytes(B, N, V) + 7) / 8);
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.size() * sizeof(uint64_t);
  double const bytes = (static_cast<double>(rows) + (sampled && rejected ? B : 0)) * V * 4.0;
  bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    Status const status = ops::verify_sample(CudaExecutor{stream}, p);
    if (!status.ok()) state.SkipWithError(status.to_string().c_str());
  });
}

void BM_verify_sample(benchmark::State& state) {
  run_verify_sample(state, static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
                    static_cast<int>(state.range(2)), state.range(3) != 0, state.range(4) != 0,
                    false);
}

void BM_verify_sample_rejected(benchmark::State& state) {
  run_verify_sample(state, static_cast<int>(state.range(0)), 4, static_cast<int>(state.range(1)),
                    state.range(2) != 0, false, true);
}

// Logits and draft probabilities a case may hold on the device.
constexpr double kMaxInputBytes = 4e9;

void verify_sample_sizes(benchmark::internal::Benchmark* b) {
  for (int mode : {0, 1, 2}) {  // deterministic drafts, sampled drafts, filtered
    for (int batch : {1, 8, 64, 256}) {
      for (int nodes : {4, 8, 16, 32, 64}) {
        if (mode != 0 && nodes != 4 && nodes != 16) continue;
        for (int vocab : {32000, 163840}) {
          double const bytes =
              static_cast<double>(batch) * nodes * vocab * 4 * (mode == 1 ? 2 : 1);
          if (bytes <= kMaxInputBytes) b->Args({batch, nodes, vocab, mode == 1, mode == 2});
        }
      }
    }
  }
}
SPECDEC_CUDA_BENCHMARK(BM_verify_sample)
    ->ArgNames({"batch", "nodes", "vocab", "sampled", "filtered"})
    ->Apply(verify_sample_sizes);
SPECDEC_CUDA_BENCHMARK(BM_verify_sample_rejected)
    ->ArgNames({"batch", "vocab", "sampled"})
    ->ArgsProduct({{1, 8}, {32000, 163840}, {0, 1}});

}  // namespace
