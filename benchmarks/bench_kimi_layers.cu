// The Kimi CUDA forward's dense layer ops on the H200 at Kimi-K2.5 dimensions (kimi.md: H 7168,
// 64 heads, q_lora 1536, kv_lora 512 + rope 64, dense intermediate 18432, vocab 163840), tokens
// T in {1, 8, 64} (decode batches / verify trees):
//   BM_kimi_gemm/T/which  the cuBLAS bf16 GEMMs Y [T, out] = X [T, in] W^T (fp32 out), which:
//                         0 q_a_proj 1536x7168, 1 q_b_proj 12288x1536, 2 kv_a_proj 576x7168,
//                         3 o_proj 7168x8192, 4 dense gate/up 18432x7168, 5 lm_head 163840x7168
//                         bytes = W (bf16) + X (bf16) + Y (fp32): the weight stream dominates at
//                         these T, so the copy floor is the bound
//   BM_kimi_rms_norm/T    rms_norm_rows over [T, 7168] fp32 -> bf16 (+ the bf16 weight)
//   BM_kimi_query_rows/T  query_rows on the queries [T, 64 heads, 128 + 64]: the nope parts to
//                         bf16, the rope parts roped into the absorbed query (read + write)
// Weights are rotated over enough copies to exceed twice the 50 MB L2, so every launch streams
// them from HBM; inputs are random, never zeros.
#include <cublas_v2.h>

#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/model/kimi/forward_cuda.cuh"
#include "specdec/model/kimi/layer_kernels.cuh"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

using specdec::DeviceBuffer;

constexpr int64_t kL2Bytes = 50LL << 20;

// n random bf16 values: a random block of up to 2^20 (host), repeated on the device by doubling
// copies (drawing a 1 G-value matrix on the host would take minutes).
DeviceBuffer<uint16_t> random_bf16(specdec::testing::Rng& rng, int64_t n, float scale) {
  int64_t const block = std::min<int64_t>(n, 1 << 20);
  std::vector<float> const f = specdec::testing::random_logits(rng, 1, block, scale);
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = specdec::float_to_bf16(f[i]);
  DeviceBuffer<uint16_t> d(static_cast<size_t>(n));
  specdec::bench::check_cuda(cudaMemcpy(d.data(), b.data(), block * 2, cudaMemcpyHostToDevice),
                             "upload block");
  for (int64_t have = block; have < n; have *= 2) {
    specdec::bench::check_cuda(cudaMemcpy(d.data() + have, d.data(), std::min(have, n - have) * 2,
                                          cudaMemcpyDeviceToDevice),
                               "repeat block");
  }
  return d;
}

void BM_kimi_gemm(benchmark::State& state) {
  int64_t const T = state.range(0);
  struct Shape { int64_t out, in; };
  Shape const shapes[] = {{1536, 7168}, {12288, 1536}, {576, 7168},
                          {7168, 8192}, {18432, 7168}, {163840, 7168}};
  Shape const sh = shapes[state.range(1)];
  int64_t const wbytes = sh.out * sh.in * 2;
  int const copies = static_cast<int>(std::max<int64_t>(1, (2 * kL2Bytes + wbytes - 1) / wbytes));
  specdec::testing::Rng rng(3);
  // One random matrix, copied `copies` times (generating each on the host would be slow).
  DeviceBuffer<uint16_t> const w0 = random_bf16(rng, sh.out * sh.in, 0.05f);
  DeviceBuffer<uint16_t> w(static_cast<size_t>(sh.out * sh.in * copies));
  for (int k = 0; k < copies; ++k) {
    specdec::bench::check_cuda(cudaMemcpy(w.data() + k * sh.out * sh.in, w0.data(), wbytes,
                                          cudaMemcpyDeviceToDevice),
                               "copy weights");
  }
  DeviceBuffer<uint16_t> const x = random_bf16(rng, T * sh.in, 1.0f);
  DeviceBuffer<float> y(static_cast<size_t>(T * sh.out));
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    state.SkipWithError("cublasCreate failed");
    return;
  }
  double const bytes = static_cast<double>(wbytes) + 2.0 * T * sh.in + 4.0 * T * sh.out;
  specdec::bench::time_launches(state, bytes, [&](int i, cudaStream_t stream) {
    cublasSetStream(h, stream);
    auto const s = specdec::model::kimi::detail::gemm_bf16(
        h, T, sh.out, sh.in, x.data(), sh.in, w.data() + (i % copies) * sh.out * sh.in, y.data(),
        CUDA_R_32F, sh.out, 0.0f, "bench gemm");
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
  cublasDestroy(h);
}
BENCHMARK(BM_kimi_gemm)
    ->ArgNames({"T", "which"})
    ->ArgsProduct({{1, 8, 64}, {0, 1, 2, 3, 4, 5}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->MinTime(specdec::bench::kRepetitionSeconds / specdec::bench::kLaunchesPerIteration);

void BM_kimi_rms_norm(benchmark::State& state) {
  int64_t const T = state.range(0), H = 7168;
  specdec::testing::Rng rng(4);
  DeviceBuffer<float> x(specdec::testing::random_logits(rng, T, H, 2.0f));
  DeviceBuffer<uint16_t> const w = random_bf16(rng, H, 1.0f);
  DeviceBuffer<uint16_t> out(static_cast<size_t>(T * H));
  double const bytes = 4.0 * T * H + 2.0 * H + 2.0 * T * H;
  specdec::bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    auto const s = specdec::model::kimi::cuda::rms_norm_rows(x.data(), H, w.data(), T,
                                                             static_cast<int>(H), 1e-6, nullptr, 0,
                                                             nullptr, out.data(), H, stream);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}
BENCHMARK(BM_kimi_rms_norm)->ArgNames({"T"})->Arg(1)->Arg(8)->Arg(64)
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true)
    ->MinTime(specdec::bench::kRepetitionSeconds / specdec::bench::kLaunchesPerIteration);

void BM_kimi_query_rows(benchmark::State& state) {
  int64_t const T = state.range(0);
  int const heads = 64, qk = 192, W = 576;
  specdec::testing::Rng rng(5);
  DeviceBuffer<float> q(specdec::testing::random_logits(rng, T, heads * qk, 1.0f));
  DeviceBuffer<float> qabs(static_cast<size_t>(T * heads * W));
  DeviceBuffer<uint16_t> q_bf(static_cast<size_t>(T * heads * qk));
  std::vector<double> inv(32);
  for (int i = 0; i < 32; ++i) inv[i] = 1.0 / std::pow(50000.0, i / 32.0);
  DeviceBuffer<double> dinv(inv);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(1000 + 37 * t);
  DeviceBuffer<int32_t> dpos(pos);
  specdec::model::kimi::cuda::QueryRows p;
  p.q = q.data();
  p.q_bf = q_bf.data();
  p.qabs = qabs.data();
  p.qabs_head_stride = W;
  p.pe_at = 512;
  p.tokens = T;
  p.heads = heads;
  p.nope = 128;
  p.pairs = 32;
  p.positions = dpos.data();
  p.inv_freq = dinv.data();
  // q read (fp32), the nope parts written as bf16, the rope parts written as fp32.
  double const bytes = T * heads * (4.0 * qk + 2.0 * 128 + 4.0 * 64);
  specdec::bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    auto const s = specdec::model::kimi::cuda::query_rows(p, stream);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}
BENCHMARK(BM_kimi_query_rows)->ArgNames({"T"})->Arg(1)->Arg(8)->Arg(64)
    ->UseManualTime()->Unit(benchmark::kMicrosecond)->Repetitions(5)->ReportAggregatesOnly(true)
    ->MinTime(specdec::bench::kRepetitionSeconds / specdec::bench::kLaunchesPerIteration);

}  // namespace
