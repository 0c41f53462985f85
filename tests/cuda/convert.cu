// to_bf16_cuda (core/convert.cuh) vs float_to_bf16 on the host, bit for bit: n from 1 to past
// one block and odd (a partial last block), random bit patterns (every exponent: subnormals,
// NaNs with payloads, infinities) and the rounding's hard cases (ties to even both ways, the
// largest values that round to +-inf, +-0); the element past n is left untouched; a launch is
// captured into a CUDA graph and replayed with new input.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "specdec/core/convert.cuh"
#include "specdec/core/dtype.hpp"
#include "support/cuda_stream.cuh"
#include "support/testing.hpp"

namespace {

using specdec::bits_float;
using specdec::DeviceBuffer;
using specdec::float_to_bf16;

std::vector<float> inputs(int64_t n, uint64_t seed) {
  specdec::testing::Rng rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  // Exact ties (low 16 bits 0x8000, even and odd kept bit), just above / below a tie, NaNs,
  // infinities, zeros, the largest finite float, the smallest subnormal.
  std::vector<uint32_t> const hard{0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,
                                   0x7f7f8000u, 0xff7f8000u, 0x7f7fffffu, 0x7fc00001u,
                                   0xffa00000u, 0x7f800000u, 0xff800000u, 0x00000000u,
                                   0x80000000u, 0x00000001u, 0x00008000u, 0x80018000u};
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[i] = bits_float(i % 4 == 0 ? hard[(i / 4) % hard.size()] : bits(rng));
  }
  return x;
}

std::vector<uint16_t> expected(std::vector<float> const& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float_to_bf16(x[i]);
  return y;
}

}  // namespace

TEST_CASE("to_bf16_cuda: bit for bit with float_to_bf16") {
  specdec::testing::Stream stream;
  uint64_t seed = 1;
  for (int64_t n : {1, 7, 255, 256, 257, 4099, 32768}) {
    CAPTURE(n);
    std::vector<float> const x = inputs(n, seed++);
    DeviceBuffer<float> dx(x);
    DeviceBuffer<uint16_t> dy(static_cast<size_t>(n) + 1);
    REQUIRE(dx.size() == x.size());
    REQUIRE(dy.fill_bytes(0xab).ok());
    REQUIRE(specdec::to_bf16_cuda(dx.data(), n, dy.data(), stream.s).ok());
    REQUIRE(cudaStreamSynchronize(stream.s) == cudaSuccess);
    std::vector<uint16_t> y = dy.download();
    CHECK(y.back() == 0xabab);  // past n: not written
    y.pop_back();
    CHECK(y == expected(x));
  }
}

TEST_CASE("to_bf16_cuda: captured, replayed with new input") {
  specdec::testing::Stream stream;
  int64_t const n = 1000;
  std::vector<float> const first = inputs(n, 11), second = inputs(n, 12);
  DeviceBuffer<float> dx(first);
  DeviceBuffer<uint16_t> dy(static_cast<size_t>(n));
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  REQUIRE(specdec::to_bf16_cuda(dx.data(), n, dy.data(), stream.s).ok());
  REQUIRE(cudaStreamEndCapture(stream.s, &graph) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (auto const* x : {&first, &second}) {
    REQUIRE(dx.upload(*x).ok());
    REQUIRE(cudaGraphLaunch(exec, stream.s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream.s) == cudaSuccess);
    CHECK(dy.download() == expected(*x));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_CASE("to_bf16_cuda: a negative count is an error that names it") {
  specdec::testing::Stream stream;
  specdec::Status const s = specdec::to_bf16_cuda(nullptr, -3, nullptr, stream.s);
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("n = -3 < 0") != std::string::npos);
}
