// linear_bf16: the CPU reference against exact integer arithmetic (small integers are exact in
// bf16 and their sums in fp32), beta accumulation, bf16 rounding of y, strides; and every
// contract violation refused with a message naming it.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/ops/linear_bf16/linear_bf16.hpp"
#include "support/testing.hpp"

using namespace specdec;
using namespace specdec::ops;

TEST_CASE("linear_bf16 reference: exact on integer inputs, with strides, beta and bf16 y") {
  int const T = 3;
  int64_t const out = 5, in = 24, ldx = 32, ldy = 7;
  testing::Rng rng(3);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<int> xi(static_cast<size_t>(T * ldx)), wi(static_cast<size_t>(out * in));
  for (int& v : xi) v = small(rng);
  for (int& v : wi) v = small(rng);
  std::vector<uint16_t> x(xi.size()), w(wi.size());
  for (size_t i = 0; i < xi.size(); ++i) x[i] = float_to_bf16(static_cast<float>(xi[i]));
  for (size_t i = 0; i < wi.size(); ++i) w[i] = float_to_bf16(static_cast<float>(wi[i]));
  auto exact = [&](int t, int64_t o) {
    int64_t s = 0;
    for (int64_t k = 0; k < in; ++k) {
      s += int64_t{xi[static_cast<size_t>(t * ldx + k)]} * wi[static_cast<size_t>(o * in + k)];
    }
    return s;
  };
  LinearBf16Params p;
  p.x = x.data();
  p.ldx = ldx;
  p.w = w.data();
  p.tokens = T;
  p.out = out;
  p.in = in;
  p.ldy = ldy;
  std::vector<float> y(static_cast<size_t>(T * ldy), 1000.0f);
  p.y = y.data();
  p.beta = 0.5f;  // y = 500 + x W^T
  REQUIRE(linear_bf16(CpuExecutor{}, p).ok());
  for (int t = 0; t < T; ++t) {
    for (int64_t o = 0; o < ldy; ++o) {
      float const want = o < out ? 500.0f + static_cast<float>(exact(t, o)) : 1000.0f;
      CHECK(y[static_cast<size_t>(t * ldy + o)] == want);
    }
  }
  std::vector<uint16_t> y16(static_cast<size_t>(T * ldy), 0);
  p.y = y16.data();
  p.y_bf16 = true;
  p.beta = 0.0f;
  REQUIRE(linear_bf16(CpuExecutor{}, p).ok());
  for (int t = 0; t < T; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      float const e = static_cast<float>(exact(t, o));
      CHECK(y16[static_cast<size_t>(t * ldy + o)] == float_to_bf16(e));
    }
  }
}

TEST_CASE("linear_bf16 reference: batched products each take their own x, w and y") {
  // 2 products of out 2, in 8, T 1: x_b all (b + 1), w_b rows all 1 and all -1 (rows of the
  // second product 3 rows further on); y = [8 (b + 1), -8 (b + 1)] per product, 3 floats apart.
  std::vector<uint16_t> x(16), w(5 * 8);
  for (int b = 0; b < 2; ++b) {
    for (int k = 0; k < 8; ++k) x[static_cast<size_t>(8 * b + k)] = float_to_bf16(b + 1.0f);
  }
  for (int r = 0; r < 5; ++r) {
    for (int k = 0; k < 8; ++k) {
      float const v = r % 3 == 0 ? 1.0f : r % 3 == 1 ? -1.0f : 9.0f;
      w[static_cast<size_t>(8 * r + k)] = float_to_bf16(v);
    }
  }
  std::vector<float> y(6, 1234.0f);
  LinearBf16Params p;
  p.x = x.data();
  p.ldx = 16;
  p.w = w.data();
  p.tokens = 1;
  p.out = 2;
  p.in = 8;
  p.y = y.data();
  p.ldy = 6;
  p.batch = 2;
  p.x_batch = 8;
  p.w_batch = 24;
  p.y_batch = 3;
  REQUIRE(linear_bf16(CpuExecutor{}, p).ok());
  CHECK(y == std::vector<float>{8.0f, -8.0f, 1234.0f, 16.0f, -16.0f, 1234.0f});
}

TEST_CASE("linear_bf16: contract violations are refused, naming the problem") {
  alignas(16) static uint16_t x[64] = {}, w[64] = {};
  alignas(16) static float y[64] = {};
  auto base = [&] {
    LinearBf16Params p;
    p.x = x;
    p.ldx = 8;
    p.w = w;
    p.tokens = 2;
    p.out = 4;
    p.in = 8;
    p.y = y;
    p.ldy = 4;
    return p;
  };
  REQUIRE(validate(base()).ok());
  auto refused = [](LinearBf16Params const& p, std::string const& says) {
    Status const s = validate(p);
    CHECK_FALSE(s.ok());
    CHECK_MESSAGE(s.to_string().find(says) != std::string::npos, s.to_string());
    CHECK_FALSE(linear_bf16(CpuExecutor{}, p).ok());
  };
  LinearBf16Params p = base();
  p.tokens = 0;
  refused(p, "tokens 0 not in [1, 8]");
  p.tokens = 9;
  refused(p, "use a GEMM");
  p = base();
  p.in = 12;
  p.ldx = 16;
  refused(p, "in 12 is not a multiple of 8");
  p = base();
  p.ldx = 4;
  refused(p, "ldx 4");
  p = base();
  p.ldy = 3;
  refused(p, "ldy 3 < out 4");
  p = base();
  p.w = w + 1;
  refused(p, "16-byte aligned");
  p = base();
  p.y = nullptr;
  refused(p, "must not be null");
  p = base();
  p.batch = 0;
  refused(p, "batch 0 not in [1, 65535]");
  p = base();
  p.batch = 2;
  p.x_batch = 4;
  refused(p, "x_batch 4 and w_batch 0 must be non-negative multiples of 8");
  p = base();
  p.y_bf16 = true;
  p.beta = 1.0f;
  refused(p, "beta must be 0 with a bf16 y");
}
