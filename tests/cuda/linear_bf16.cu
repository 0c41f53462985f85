// linear_bf16 CUDA kernel vs the CPU reference over Kimi-K2.5's decode shapes (q_a + kv_a
// stacked, q_b, o_proj, the shared expert's gate + up and down, the draft's fc) cut in k where
// the reference would be slow, and ragged ones (out not a multiple of the 16-row block, in not a
// multiple of the 64-column chunk, row strides past the width), T = 1..8 tokens, fp32 y with
// beta 0 (y poisoned with NaN: never read) and beta 1 (accumulated), and bf16 y. Agreement to
// fp32 rounding: |gpu - cpu| <= 1e-4 sum_k |x w| (a wrong column, row or token pairing is off by
// the sum itself); bf16 y within one bf16 step more. Outside [T, out] nothing is written; a
// rerun gives the same bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/core/dtype.hpp"
#include "specdec/ops/linear_bf16/linear_bf16.hpp"
#include "support/testing.hpp"

using namespace specdec;
using namespace specdec::ops;

namespace {

std::vector<uint16_t> random_bf16(testing::Rng& rng, int64_t n, float scale) {
  std::vector<float> const f = testing::random_logits(rng, 1, n, scale);
  std::vector<uint16_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = float_to_bf16(f[i]);
  return out;
}

float nan_bits() {
  uint32_t const bits = 0xffffffffu;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

TEST_CASE("linear_bf16: GPU y equals the CPU reference to fp32 rounding") {
  struct Shape { int64_t out, in, ldx_pad, ldy_pad; };
  Shape const shapes[] = {
      {2112, 7168, 0, 0},   // q_a_proj + kv_a_proj_with_mqa, stacked
      {1536, 1536, 0, 0},   // q_b_proj's k (its 12288 rows cut)
      {1024, 8192, 0, 0},   // o_proj's k (7168 rows cut)
      {4096, 1024, 0, 0},   // shared expert gate + up (k cut)
      {7168, 2048, 0, 0},   // shared expert down
      {256, 21504, 0, 0},   // the EAGLE-3 draft's fc k (rows cut)
      {37, 200, 8, 5},      // ragged: 2 full tiles + 5 rows; 6 chunks + 8 columns; strided
      {1, 8, 0, 3},         // the smallest
      {300, 520, 16, 0},
  };
  testing::Rng rng(7);
  int64_t compared = 0;
  for (Shape const sh : shapes) {
    for (int T : {1, 2, 3, 4, 5, 8}) {
      for (int mode = 0; mode < 3; ++mode) {  // fp32 beta 0, fp32 beta 1, bf16
        CAPTURE(sh.out);
        CAPTURE(sh.in);
        CAPTURE(T);
        CAPTURE(mode);
        int64_t const ldx = sh.in + sh.ldx_pad, ldy = sh.out + sh.ldy_pad;
        std::vector<uint16_t> const x = random_bf16(rng, T * ldx, 1.0f);
        std::vector<uint16_t> const w = random_bf16(rng, sh.out * sh.in, 0.05f);
        LinearBf16Params p;
        p.ldx = ldx;
        p.tokens = T;
        p.out = sh.out;
        p.in = sh.in;
        p.ldy = ldy;
        p.y_bf16 = mode == 2;
        p.beta = mode == 1 ? 1.0f : 0.0f;
        p.w_constant = (T + mode) % 2 == 1;  // both kernel paths (first weights before the wait)
        // The host y starts as the device y does: random where accumulated, else poison.
        std::vector<float> y32 = testing::random_logits(rng, T, ldy, 1.0f);
        if (mode == 0) std::fill(y32.begin(), y32.end(), nan_bits());
        std::vector<uint16_t> y16(static_cast<size_t>(T * ldy), 0xffffu);
        p.x = x.data();
        p.w = w.data();
        p.y = p.y_bf16 ? static_cast<void*>(y16.data()) : static_cast<void*>(y32.data());
        std::vector<float> const y32_before = y32;
        REQUIRE(linear_bf16(CpuExecutor{}, p).ok());

        DeviceBuffer<uint16_t> dx(x), dw(w), dy16(y16.size());
        DeviceBuffer<float> dy32(y32_before);
        REQUIRE(dy16.fill_bytes(0xff).ok());
        LinearBf16Params dp = p;
        dp.x = dx.data();
        dp.w = dw.data();
        dp.y = p.y_bf16 ? static_cast<void*>(dy16.data()) : static_cast<void*>(dy32.data());
        REQUIRE(linear_bf16(CudaExecutor{}, dp).ok());
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        std::vector<float> const g32 = dy32.download();
        std::vector<uint16_t> const g16 = dy16.download();
        int bad = 0;
        for (int t = 0; t < T; ++t) {
          for (int64_t o = 0; o < ldy; ++o) {
            size_t const at = static_cast<size_t>(t * ldy + o);
            if (o >= sh.out) {  // past the width: untouched
              if (p.y_bf16) {
                bad += g16[at] != 0xffffu;
              } else {
                bad += std::memcmp(&g32[at], &y32_before[at], 4) != 0;
              }
              continue;
            }
            double sum_abs = 0.0;
            for (int64_t k = 0; k < sh.in; ++k) {
              sum_abs += std::fabs(bf16_to_float(x[static_cast<size_t>(t * ldx + k)]) *
                                   bf16_to_float(w[static_cast<size_t>(o * sh.in + k)]));
            }
            if (mode == 1) sum_abs += std::fabs(y32_before[at]);
            double const tol = 1e-4 * sum_abs + 1e-30;
            double const cpu = p.y_bf16 ? bf16_to_float(y16[at]) : y32[at];
            double const gpu = p.y_bf16 ? bf16_to_float(g16[at]) : g32[at];
            double const slack = p.y_bf16 ? std::fabs(cpu) / 128.0 : 0.0;
            if (!(std::fabs(gpu - cpu) <= tol + slack)) {
              if (bad < 5) MESSAGE("t " << t << " o " << o << ": gpu " << gpu << " cpu " << cpu);
              ++bad;
            }
          }
        }
        CHECK(bad == 0);
        // A rerun from the same inputs gives the same bits.
        if (mode != 1) {
          REQUIRE(linear_bf16(CudaExecutor{}, dp).ok());
          REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
          if (p.y_bf16) {
            CHECK(dy16.download() == g16);
          } else {
            std::vector<float> const again = dy32.download();
            CHECK(std::memcmp(again.data(), g32.data(), 4 * again.size()) == 0);
          }
        }
        compared += T * sh.out;
      }
    }
  }
  MESSAGE("compared " << compared << " outputs");
}

TEST_CASE("linear_bf16: batched products (one per attention head) equal the CPU reference") {
  // Kimi's W_UV per head: o_h [T, 128] = lat_h [T, 512] W_UV_h^T, W_UV_h the last 128 rows of
  // head h's 256 rows of kv_b_proj; lat and o interleave the heads in each token's row. Here 5
  // heads, plus a ragged shape with fp32 y accumulated.
  struct Shape { int batch; int64_t out, in, w_rows_per_batch; bool y_bf16; };
  Shape const shapes[] = {{5, 128, 512, 256, true}, {3, 37, 200, 40, false}};
  testing::Rng rng(11);
  for (Shape const sh : shapes) {
    for (int T : {1, 4, 8}) {
      CAPTURE(sh.batch);
      CAPTURE(sh.out);
      CAPTURE(T);
      int64_t const ldx = sh.batch * sh.in, ldy = sh.batch * sh.out;
      std::vector<uint16_t> const x = random_bf16(rng, T * ldx, 1.0f);
      std::vector<uint16_t> const w =
          random_bf16(rng, sh.batch * sh.w_rows_per_batch * sh.in, 0.05f);
      int64_t const w_at = (sh.w_rows_per_batch - sh.out) * sh.in;  // the last rows of each
      LinearBf16Params p;
      p.ldx = ldx;
      p.tokens = T;
      p.out = sh.out;
      p.in = sh.in;
      p.ldy = ldy;
      p.y_bf16 = sh.y_bf16;
      p.beta = sh.y_bf16 ? 0.0f : 1.0f;
      p.batch = sh.batch;
      p.x_batch = sh.in;
      p.w_batch = sh.w_rows_per_batch * sh.in;
      p.y_batch = sh.out;
      std::vector<float> y32 = testing::random_logits(rng, T, ldy, 1.0f);
      std::vector<uint16_t> y16(static_cast<size_t>(T * ldy), 0xffffu);
      std::vector<float> const y32_before = y32;
      p.x = x.data();
      p.w = w.data() + w_at;
      p.y = sh.y_bf16 ? static_cast<void*>(y16.data()) : static_cast<void*>(y32.data());
      REQUIRE(linear_bf16(CpuExecutor{}, p).ok());
      DeviceBuffer<uint16_t> dx(x), dw(w), dy16(y16.size());
      DeviceBuffer<float> dy32(y32_before);
      REQUIRE(dy16.fill_bytes(0xff).ok());
      LinearBf16Params dp = p;
      dp.x = dx.data();
      dp.w = dw.data() + w_at;
      dp.y = sh.y_bf16 ? static_cast<void*>(dy16.data()) : static_cast<void*>(dy32.data());
      REQUIRE(linear_bf16(CudaExecutor{}, dp).ok());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      std::vector<float> const g32 = dy32.download();
      std::vector<uint16_t> const g16 = dy16.download();
      int bad = 0;
      for (int b = 0; b < sh.batch; ++b) {
        for (int t = 0; t < T; ++t) {
          for (int64_t o = 0; o < sh.out; ++o) {
            size_t const at = static_cast<size_t>(t * ldy + b * sh.out + o);
            double sum_abs = sh.y_bf16 ? 0.0 : std::fabs(y32_before[at]);
            for (int64_t k = 0; k < sh.in; ++k) {
              sum_abs += std::fabs(
                  bf16_to_float(x[static_cast<size_t>(t * ldx + b * sh.in + k)]) *
                  bf16_to_float(w[static_cast<size_t>(w_at + b * p.w_batch + o * sh.in + k)]));
            }
            double const cpu = sh.y_bf16 ? bf16_to_float(y16[at]) : y32[at];
            double const gpu = sh.y_bf16 ? bf16_to_float(g16[at]) : g32[at];
            double const slack = sh.y_bf16 ? std::fabs(cpu) / 128.0 : 0.0;
            if (!(std::fabs(gpu - cpu) <= 1e-4 * sum_abs + 1e-30 + slack)) {
              if (bad < 5) {
                MESSAGE("b " << b << " t " << t << " o " << o << ": gpu " << gpu << " cpu " << cpu);
              }
              ++bad;
            }
          }
        }
      }
      CHECK(bad == 0);
    }
  }
}
