// linear_bf16 on the H200 against cuBLAS (cublasGemmEx, bf16 in, fp32 accumulation and out: the
// call the forwards made before) on Kimi-K2.5's dense decode shapes, T = 1, 4, 8 tokens:
// q_a + kv_a stacked (2112 x 7168), q_b (12288 x 1536), o_proj (7168 x 8192), the shared
// expert's gate + up (4096 x 7168) and down (7168 x 2048), and the lm_head (163840 x 7168).
// Bytes per launch = the weight (read once) + x + y; the weights rotate over copies whose total
// exceeds 256 MB (5x the L2), so every launch streams its weight from HBM. GB/s against the copy
// floor (bench_copy_floor) is the fraction of the roofline reached.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/model/kimi/random_device.cuh"
#include "specdec/ops/linear_bf16/linear_bf16.hpp"
#include "support/bench.cuh"

namespace {

using specdec::bench::check_cuda;
namespace kimi = specdec::model::kimi;

void require_ok(specdec::Status const& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    std::abort();
  }
}

constexpr double kRotationBytes = 256.0 * (1 << 20);

struct Shape {
  int64_t out, in;
};
constexpr Shape kShapes[] = {{2112, 7168}, {12288, 1536}, {7168, 8192},
                             {4096, 7168}, {7168, 2048},  {163840, 7168}};

// Rotating copies of one [out, in] bf16 weight, x [T, in] bf16 and y [T, out] fp32.
struct Operands {
  std::vector<specdec::DeviceBuffer<uint16_t>> w;
  specdec::DeviceBuffer<uint16_t> x;
  specdec::DeviceBuffer<float> y;
  double bytes = 0;

  Operands(Shape s, int T) {
    double const wbytes = 2.0 * s.out * s.in;
    int const copies = std::max(1, static_cast<int>(std::ceil(kRotationBytes / wbytes)));
    kimi::RandomDraw draw;
    draw.half_width = 0.05f;
    for (int i = 0; i < copies; ++i) {
      w.emplace_back(static_cast<size_t>(s.out * s.in));
      draw.key = 11 + i;
      require_ok(kimi::fill_random_block(w.back().data(), draw, s.in, 0, s.out, 0, s.in, nullptr));
    }
    x = specdec::DeviceBuffer<uint16_t>(static_cast<size_t>(T * s.in));
    draw.key = 5;
    draw.half_width = 1.0f;
    require_ok(kimi::fill_random_block(x.data(), draw, s.in, 0, T, 0, s.in, nullptr));
    y = specdec::DeviceBuffer<float>(static_cast<size_t>(T * s.out));
    check_cuda(cudaDeviceSynchronize(), "fill");
    bytes = wbytes + 2.0 * T * s.in + 4.0 * T * s.out;
  }
};

void set_counters(benchmark::State& state, Shape s) {
  state.counters["out"] = static_cast<double>(s.out);
  state.counters["in"] = static_cast<double>(s.in);
}

void BM_linear_bf16(benchmark::State& state) {
  Shape const s = kShapes[state.range(0)];
  int const T = static_cast<int>(state.range(1));
  Operands ops(s, T);
  set_counters(state, s);
  specdec::ops::LinearBf16Params p;
  p.x = ops.x.data();
  p.ldx = s.in;
  p.tokens = T;
  p.out = s.out;
  p.in = s.in;
  p.y = ops.y.data();
  p.ldy = s.out;
  p.w_constant = true;  // weights, as in the forward
  specdec::bench::time_launches(state, ops.bytes, [&](int i, cudaStream_t stream) {
    specdec::ops::LinearBf16Params q = p;
    q.w = ops.w[static_cast<size_t>(i) % ops.w.size()].data();
    auto const st = specdec::ops::linear_bf16(specdec::CudaExecutor{stream}, q);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
}

void BM_linear_cublas(benchmark::State& state) {
  Shape const s = kShapes[state.range(0)];
  int const T = static_cast<int>(state.range(1));
  Operands ops(s, T);
  set_counters(state, s);
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    state.SkipWithError("cublasCreate failed");
    return;
  }
  float const alpha = 1.0f, beta = 0.0f;
  specdec::bench::time_launches(state, ops.bytes, [&](int i, cudaStream_t stream) {
    cublasSetStream(h, stream);
    cublasStatus_t const st = cublasGemmEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.out), T, static_cast<int>(s.in), &alpha,
        ops.w[static_cast<size_t>(i) % ops.w.size()].data(), CUDA_R_16BF,
        static_cast<int>(s.in), ops.x.data(), CUDA_R_16BF, static_cast<int>(s.in), &beta,
        ops.y.data(), CUDA_R_32F, static_cast<int>(s.out), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) state.SkipWithError("cublasGemmEx failed");
  });
  cublasDestroy(h);
}

void shapes_and_tokens(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "tokens"});
  for (int s = 0; s < static_cast<int>(std::size(kShapes)); ++s) {
    for (int T : {1, 4, 8}) b->Args({s, T});
  }
}

SPECDEC_CUDA_BENCHMARK(BM_linear_bf16)->Apply(shapes_and_tokens);
SPECDEC_CUDA_BENCHMARK(BM_linear_cublas)->Apply(shapes_and_tokens);

}  // namespace
