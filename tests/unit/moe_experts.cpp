// moe_experts (CPU front door): the reference on hand-worked bf16 and INT4 cases (the INT4 one
// places its nonzero nibbles off word boundaries to pin the least-significant-first order),
// against an independent computation (io::dequantize_int4_group / bf16 -> float and a plain float
// SwiGLU) on random experts, the refusal of ids outside [0, E), and every validate() /
// validate_cuda() error by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/io/compressed_tensors.hpp"
#include "specdec/ops/moe_experts/moe_experts.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

using namespace specdec;
using namespace specdec::ops;

namespace {

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// Experts in both formats, owning their matrices; tables() fills the params' pointer tables.
struct ExpertSet {
  int H = 0, I = 0, E = 0, G = 0;
  bool int4 = false;
  std::vector<std::vector<uint16_t>> gate, up, down;                // bf16 bits
  std::vector<std::vector<int32_t>> gate_p, up_p, down_p;           // INT4 packed
  std::vector<std::vector<uint16_t>> gate_s, up_s, down_s;          // INT4 scales
  std::vector<uint16_t const*> t_gate, t_up, t_down, t_gate_s, t_up_s, t_down_s;
  std::vector<int32_t const*> t_gate_p, t_up_p, t_down_p;

  void tables(MoeExpertWeights* w) {
    auto ptrs = [](auto const& mats, auto* table) {
      table->clear();
      for (auto const& m : mats) table->push_back(m.data());
      return table->data();
    };
    w->int4 = int4;
    w->group_size = G;
    if (int4) {
      w->gate_packed = ptrs(gate_p, &t_gate_p);
      w->up_packed = ptrs(up_p, &t_up_p);
      w->down_packed = ptrs(down_p, &t_down_p);
      w->gate_scale = ptrs(gate_s, &t_gate_s);
      w->up_scale = ptrs(up_s, &t_up_s);
      w->down_scale = ptrs(down_s, &t_down_s);
    } else {
      w->gate = ptrs(gate, &t_gate);
      w->up = ptrs(up, &t_up);
      w->down = ptrs(down, &t_down);
    }
  }

  // Matrix `which` (0 gate, 1 up, 2 down) of expert e as floats, by the library's own rules
  // (io::dequantize_int4_group, bf16_to_float): the independent side of the comparison.
  std::vector<float> as_float(int which, int e) const {
    int const rows = which == 2 ? H : I, cols = which == 2 ? I : H;
    std::vector<float> W(static_cast<size_t>(rows) * cols);
    if (int4) {
      auto const& p = which == 0 ? gate_p : which == 1 ? up_p : down_p;
      auto const& s = which == 0 ? gate_s : which == 1 ? up_s : down_s;
      REQUIRE(io::dequantize_int4_group(p[e].data(), s[e].data(), rows, cols, G, W.data()).ok());
    } else {
      auto const& m = which == 0 ? gate : which == 1 ? up : down;
      for (size_t i = 0; i < W.size(); ++i) W[i] = bf16_to_float(m[e][i]);
    }
    return W;
  }
};

// Random experts: float matrices N(0, 1/in), stored as bf16 or quantized by
// io::quantize_int4_group (group G).
ExpertSet random_experts(testing::Rng& rng, int H, int I, int E, bool int4, int G) {
  ExpertSet x;
  x.H = H, x.I = I, x.E = E, x.G = G, x.int4 = int4;
  auto matrix = [&](int rows, int cols) {
    std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
    std::vector<float> W(static_cast<size_t>(rows) * cols);
    for (float& v : W) v = dist(rng);
    return W;
  };
  auto add = [&](int rows, int cols, auto* bf16, auto* packed, auto* scale) {
    std::vector<float> const W = matrix(rows, cols);
    if (int4) {
      packed->emplace_back(static_cast<size_t>(rows) * cols / 8);
      scale->emplace_back(static_cast<size_t>(rows) * (cols / G));
      REQUIRE(io::quantize_int4_group(W.data(), rows, cols, G, packed->back().data(),
                                      scale->back().data())
                  .ok());
    } else {
      bf16->emplace_back(W.size());
      for (size_t i = 0; i < W.size(); ++i) bf16->back()[i] = float_to_bf16(W[i]);
    }
  };
  for (int e = 0; e < E; ++e) {
    add(I, H, &x.gate, &x.gate_p, &x.gate_s);
    add(I, H, &x.up, &x.up_p, &x.up_s);
    add(H, I, &x.down, &x.down_p, &x.down_s);
  }
  return x;
}

// y [T, H] by plain float loops over the dequantised matrices.
std::vector<float> float_swiglu(ExpertSet const& X, std::vector<float> const& x,
                                std::vector<int32_t> const& ids, std::vector<float> const& w,
                                int T, int K) {
  int const H = X.H, I = X.I;
  std::vector<float> y(static_cast<size_t>(T) * H, 0.0f);
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < K; ++k) {
      int const e = ids[static_cast<size_t>(t * K + k)];
      std::vector<float> const G = X.as_float(0, e), U = X.as_float(1, e), D = X.as_float(2, e);
      std::vector<float> h(static_cast<size_t>(I));
      for (int n = 0; n < I; ++n) {
        float g = 0.0f, u = 0.0f;
        for (int j = 0; j < H; ++j) {
          g += G[static_cast<size_t>(n) * H + j] * x[static_cast<size_t>(t) * H + j];
          u += U[static_cast<size_t>(n) * H + j] * x[static_cast<size_t>(t) * H + j];
        }
        h[static_cast<size_t>(n)] = g / (1.0f + std::exp(-g)) * u;
      }
      for (int j = 0; j < H; ++j) {
        float d = 0.0f;
        for (int n = 0; n < I; ++n) d += D[static_cast<size_t>(j) * I + n] * h[static_cast<size_t>(n)];
        y[static_cast<size_t>(t) * H + j] += w[static_cast<size_t>(t * K + k)] * d;
      }
    }
  }
  return y;
}

MoeExpertsParams params_for(ExpertSet& X, std::vector<float> const& x,
                            std::vector<int32_t> const& ids, std::vector<float> const& w, int T,
                            int K, std::vector<float>* y) {
  MoeExpertsParams p;
  p.x = x.data();
  p.ids = ids.data();
  p.weights = w.data();
  p.tokens = T;
  p.hidden = X.H;
  p.inter = X.I;
  p.experts = X.E;
  p.top_k = K;
  X.tables(&p.w);
  p.y = y->data();
  return p;
}

}  // namespace

TEST_CASE("moe_experts: hand-worked bf16 case") {
  // H = I = 8, 2 experts, top-2. Expert 0: g_0 = 2 x_0, u_0 = x_1, down[0][0] = 1,
  // down[3][0] = -0.5. Expert 1: g_2 = u_2 = x_2, down[1][2] = 4. Every other weight 0, so
  // h_n = silu(0) * 0 = 0 elsewhere.
  ExpertSet X;
  X.H = X.I = 8;
  X.E = 2;
  for (int e = 0; e < 2; ++e) {
    X.gate.emplace_back(64, float_to_bf16(0.0f));
    X.up.emplace_back(64, float_to_bf16(0.0f));
    X.down.emplace_back(64, float_to_bf16(0.0f));
  }
  X.gate[0][0 * 8 + 0] = float_to_bf16(2.0f);
  X.up[0][0 * 8 + 1] = float_to_bf16(1.0f);
  X.down[0][0 * 8 + 0] = float_to_bf16(1.0f);
  X.down[0][3 * 8 + 0] = float_to_bf16(-0.5f);
  X.gate[1][2 * 8 + 2] = float_to_bf16(1.0f);
  X.up[1][2 * 8 + 2] = float_to_bf16(1.0f);
  X.down[1][1 * 8 + 2] = float_to_bf16(4.0f);
  // Token 0: x = (1, 3, 2, 0...), experts (0, 1) with weights (0.5, 0.25):
  //   expert 0: h_0 = silu(2) * 3, out = (h_0, 0, 0, -h_0 / 2, 0...)
  //   expert 1: h_2 = silu(2) * 2, out = (0, 4 h_2, 0...)
  //   y = silu(2) * (1.5, 2, 0, -0.75, 0, 0, 0, 0)
  // Token 1: x = (-1, 1, 0...), experts (1, 0) with weights (1, 2): expert 1 gives h_2 = 0;
  //   expert 0: h_0 = silu(-2) * 1; y = (2 h_0, 0, 0, -h_0, 0...)
  std::vector<float> x(16, 0.0f);
  x[0] = 1.0f, x[1] = 3.0f, x[2] = 2.0f;
  x[8] = -1.0f, x[9] = 1.0f;
  std::vector<int32_t> const ids{0, 1, 1, 0};
  std::vector<float> const w{0.5f, 0.25f, 1.0f, 2.0f};
  std::vector<float> y(16, -7.0f);
  MoeExpertsParams const p = params_for(X, x, ids, w, 2, 2, &y);
  REQUIRE(moe_experts(CpuExecutor{}, p).ok());
  double const s2 = silu(2.0), sm2 = silu(-2.0);  // 1.7615941559557649, -0.2384058440442351
  std::vector<double> const want{1.5 * s2, 2.0 * s2, 0, -0.75 * s2, 0, 0, 0, 0,
                                 2.0 * sm2, 0,        0, -sm2,       0, 0, 0, 0};
  for (int i = 0; i < 16; ++i) {
    CAPTURE(i);
    CHECK(y[static_cast<size_t>(i)] == doctest::Approx(want[static_cast<size_t>(i)]).epsilon(1e-6));
  }
}

TEST_CASE("moe_experts: hand-worked INT4 case (nibble order, groups, scales)") {
  // H = I = 32, G = 16 (two groups per row), one expert, top-1. Packed word 0x88888888 is all
  // zeros (nibble 8 = value 0). Nonzeros:
  //   gate row 5, column 9 (word 1, nibble 1: bits 4..7) = nibble 11 -> +3, scale[5][0] = 0.5
  //     -> g_5 = 1.5 x_9
  //   up row 5, column 20 (word 2, nibble 4: bits 16..19) = nibble 6 -> -2, scale[5][1] = 0.25
  //     -> u_5 = -0.5 x_20
  //   down row 31, column 5 (word 0, nibble 5: bits 20..23) = nibble 15 -> +7, scale[31][0] = 2
  //     -> out_31 = 14 h_5
  // x_9 = 2, x_20 = 4, weight 0.75: h_5 = silu(3) * (-2), y_31 = 0.75 * 14 * h_5 = -21 silu(3).
  ExpertSet X;
  X.H = X.I = 32;
  X.E = 1;
  X.G = 16;
  X.int4 = true;
  auto zeros_p = [] { return std::vector<int32_t>(32 * 4, static_cast<int32_t>(0x88888888u)); };
  auto ones_s = [] { return std::vector<uint16_t>(32 * 2, float_to_bf16(1.0f)); };
  X.gate_p.push_back(zeros_p());
  X.up_p.push_back(zeros_p());
  X.down_p.push_back(zeros_p());
  X.gate_s.push_back(ones_s());
  X.up_s.push_back(ones_s());
  X.down_s.push_back(ones_s());
  X.gate_p[0][5 * 4 + 1] = static_cast<int32_t>(0x888888B8u);  // nibbles 8, 11, 8, 8, 8, 8, 8, 8
  X.gate_s[0][5 * 2 + 0] = float_to_bf16(0.5f);
  X.up_p[0][5 * 4 + 2] = static_cast<int32_t>(0x88868888u);  // nibble 4 = 6
  X.up_s[0][5 * 2 + 1] = float_to_bf16(0.25f);
  X.down_p[0][31 * 4 + 0] = static_cast<int32_t>(0x88F88888u);  // nibble 5 = 15
  X.down_s[0][31 * 2 + 0] = float_to_bf16(2.0f);
  std::vector<float> x(32, 0.0f);
  x[9] = 2.0f;
  x[20] = 4.0f;
  std::vector<int32_t> const ids{0};
  std::vector<float> const w{0.75f};
  std::vector<float> y(32, -7.0f);
  MoeExpertsParams p = params_for(X, x, ids, w, 1, 1, &y);
  REQUIRE(moe_experts(CpuExecutor{}, p).ok());
  for (int j = 0; j < 32; ++j) {
    CAPTURE(j);
    double const want = j == 31 ? -21.0 * silu(3.0) : 0.0;
    CHECK(y[static_cast<size_t>(j)] == doctest::Approx(want).epsilon(1e-6));
  }
  // accumulate: the same sum added to what y held (here 1 everywhere).
  std::fill(y.begin(), y.end(), 1.0f);
  p.accumulate = true;
  REQUIRE(moe_experts(CpuExecutor{}, p).ok());
  for (int j = 0; j < 32; ++j) {
    CAPTURE(j);
    double const want = 1.0 + (j == 31 ? -21.0 * silu(3.0) : 0.0);
    CHECK(y[static_cast<size_t>(j)] == doctest::Approx(want).epsilon(1e-6));
  }
  // addend: added after the sum, in float, as a second add: (y + m) + addend.
  std::vector<float> addend(32);
  for (int j = 0; j < 32; ++j) addend[static_cast<size_t>(j)] = 0.5f * static_cast<float>(j);
  std::vector<float> const y_before = y;
  std::fill(y.begin(), y.end(), 1.0f);
  p.addend = addend.data();
  REQUIRE(moe_experts(CpuExecutor{}, p).ok());
  for (int j = 0; j < 32; ++j) {
    CAPTURE(j);
    size_t const i = static_cast<size_t>(j);
    CHECK(y[i] == y_before[i] + addend[i]);  // exact: the same float adds
  }
}

TEST_CASE("moe_experts: reference matches dequantise + float SwiGLU on random experts") {
  testing::Rng rng(7);
  struct Case {
    bool int4;
    int H, I, E, K, T, G;
  };
  Case const cases[] = {{false, 64, 40, 6, 3, 5, 0},  {true, 64, 32, 6, 3, 5, 32},
                        {true, 96, 64, 4, 2, 3, 8},   {true, 128, 32, 8, 2, 4, 32},
                        {false, 128, 32, 8, 2, 9, 0}};
  for (Case const c : cases) {
    CAPTURE(c.int4);
    CAPTURE(c.H);
    ExpertSet X = random_experts(rng, c.H, c.I, c.E, c.int4, c.G);
    std::vector<float> const x = testing::random_logits(rng, c.T, c.H, 1.0f);
    std::vector<int32_t> ids(static_cast<size_t>(c.T) * c.K);
    std::vector<float> w(ids.size());
    std::uniform_int_distribution<int> pick(0, c.E - 1);
    std::uniform_real_distribution<float> weight(0.1f, 1.0f);
    for (size_t a = 0; a < ids.size(); ++a) {
      ids[a] = pick(rng);  // repeats within a token allowed: each slot counts
      w[a] = weight(rng);
    }
    std::vector<float> y(static_cast<size_t>(c.T) * c.H, NAN);
    MoeExpertsParams const p = params_for(X, x, ids, w, c.T, c.K, &y);
    REQUIRE(moe_experts(CpuExecutor{}, p).ok());
    std::vector<float> const want = float_swiglu(X, x, ids, w, c.T, c.K);
    for (int t = 0; t < c.T; ++t) {
      float scale = 0.0f;
      for (int j = 0; j < c.H; ++j) scale = std::max(scale, std::fabs(want[static_cast<size_t>(t) * c.H + j]));
      REQUIRE(scale > 0.0f);
      for (int j = 0; j < c.H; ++j) {
        size_t const i = static_cast<size_t>(t) * c.H + j;
        CHECK_MESSAGE(std::fabs(y[i] - want[i]) <= 1e-5f * scale, "t ", t, " j ", j, ": ", y[i],
                      " vs ", want[i]);
      }
    }
  }
}

TEST_CASE("moe_experts: an id outside [0, E) is refused by name, y untouched") {
  testing::Rng rng(3);
  ExpertSet X = random_experts(rng, 32, 32, 4, true, 32);
  std::vector<float> const x = testing::random_logits(rng, 2, 32, 1.0f);
  std::vector<float> const w{0.5f, 0.5f, 0.5f, 0.5f};
  for (int32_t const badid : {4, -1, 1000}) {
    std::vector<int32_t> const ids{0, 1, badid, 2};
    std::vector<float> y(64, -7.0f);
    MoeExpertsParams const p = params_for(X, x, ids, w, 2, 2, &y);
    testing::check_error(moe_experts(CpuExecutor{}, p), StatusCode::kInvalidArgument,
                         {"ids[1, 0] = " + std::to_string(badid), "[0, 4)"});
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == -7.0f; }));
  }
}

TEST_CASE("moe_experts: validate names every bad input") {
  testing::Rng rng(5);
  ExpertSet bf = random_experts(rng, 64, 32, 2, false, 0);
  ExpertSet q = random_experts(rng, 64, 32, 2, true, 32);
  std::vector<float> const x(64 * 2, 1.0f), w(4, 0.5f);
  std::vector<int32_t> const ids{0, 1, 1, 0};
  std::vector<float> y(64 * 2);
  auto check = [&](ExpertSet& X, auto edit, std::vector<std::string> const& parts) {
    MoeExpertsParams p = params_for(X, x, ids, w, 2, 2, &y);
    edit(p);
    testing::check_error(validate(p), StatusCode::kInvalidArgument, parts);
    testing::check_error(moe_experts(CpuExecutor{}, p), StatusCode::kInvalidArgument, parts);
  };
  using P = MoeExpertsParams;
  check(bf, [](P& p) { p.tokens = -1; }, {"tokens -1 < 0"});
  check(bf, [](P& p) { p.experts = 0; }, {"experts 0 < 1"});
  check(bf, [](P& p) { p.experts = 2000; }, {"experts 2000 > 1024"});
  check(bf, [](P& p) { p.top_k = 0; }, {"top_k 0 < 1"});
  check(bf, [](P& p) { p.tokens = 1 << 29; p.top_k = 8; }, {"tokens * top_k = 4294967296",
                                                             "2^31 - 1"});
  check(bf, [](P& p) { p.hidden = 0; }, {"hidden 0 < 1"});
  check(bf, [](P& p) { p.inter = -3; }, {"inter -3 < 1"});
  check(bf, [](P& p) { p.hidden = 60; }, {"multiples of 8", "hidden 60"});
  check(bf, [](P& p) { p.inter = 36; }, {"multiples of 8", "inter 36"});
  check(q, [](P& p) { p.w.group_size = 0; }, {"group_size 0 < 1"});
  check(q, [](P& p) { p.w.group_size = 48; }, {"group_size 48 does not divide hidden 64",
                                               "inter 32"});
  check(q, [](P& p) { p.w.group_size = 4; }, {"group_size 4 is not a multiple of 8"});
  check(q, [](P& p) { p.hidden = 48; p.w.group_size = 16; }, {"multiples of 32", "hidden 48"});
  check(q, [](P& p) { p.inter = 24; p.w.group_size = 8; }, {"multiples of 32", "inter 24"});
  check(q, [](P& p) { p.hidden = 40; p.w.group_size = 8; }, {"multiples of 32", "hidden 40"});
  check(bf, [](P& p) { p.x = nullptr; }, {"x is null", "[2, 64]"});
  check(bf, [](P& p) { p.ids = nullptr; }, {"ids is null", "[2, 2]"});
  check(bf, [](P& p) { p.weights = nullptr; }, {"weights is null"});
  check(bf, [](P& p) { p.y = nullptr; }, {"y is null"});
  check(bf, [](P& p) { p.w.up = nullptr; }, {"w.up is null", "bf16"});
  check(bf, [](P& p) { p.w.int4 = true; p.w.group_size = 32; }, {"w.gate_packed is null", "INT4"});
  check(q, [](P& p) { p.w.down_scale = nullptr; }, {"w.down_scale is null"});
  check(q, [](P& p) { p.w.int4 = false; }, {"w.gate is null", "w.int4 is false"});

  // Nothing to do: no pointers needed.
  MoeExpertsParams empty = params_for(bf, x, ids, w, 0, 2, &y);
  empty.x = nullptr;
  empty.ids = nullptr;
  empty.weights = nullptr;
  empty.y = nullptr;
  empty.w = MoeExpertWeights{};
  CHECK(moe_experts(CpuExecutor{}, empty).ok());
}

TEST_CASE("moe_experts: the INT4 tiled order, worked by hand") {
  // 32 rows x 160 columns: 20 words (5 pieces) per row, so each band has a full chunk (words
  // 0-15, transposed 4 x 4) and a last chunk of one piece (words 16-19, in order); 640 words.
  int64_t const rows = 32, cols = 160;
  struct At {
    int64_t r, k, want;
  };
  At const cases[] = {
      // band 0, chunk 0: word k = 4 b + j (block b, word j of it) lands as word b of slot j
      {0, 0, 0},     {0, 1, 4},     {0, 4, 1},     {0, 6, 9},    {0, 15, 15},
      {2, 13, 39},   {15, 15, 255},
      {0, 16, 256},  {1, 18, 262},  {15, 19, 319},                  // its 1-piece chunk
      {16, 0, 320},  {17, 9, 342},  {31, 15, 575}, {16, 16, 576}, {31, 19, 639}  // band 1
  };
  for (At const& a : cases) {
    CAPTURE(a.r);
    CAPTURE(a.k);
    CHECK(moe_int4_tiled_word(cols, a.r, a.k) == a.want);
  }
  // A permutation of the words for every shape the experts can have (up to partial chunks of
  // 1, 2 and 3 pieces).
  for (int64_t c : {32, 64, 96, 128, 160, 224, 256, 7168}) {
    std::vector<int> seen(static_cast<size_t>(48 * (c / 8)), 0);
    for (int64_t r = 0; r < 48; ++r) {
      for (int64_t k = 0; k < c / 8; ++k) ++seen[static_cast<size_t>(moe_int4_tiled_word(c, r, k))];
    }
    CAPTURE(c);
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
  // The scales multiply the mma's sums where each group is 32 columns and every chunk is full.
  CHECK(moe_int4_scales_after_mma(7168, 32));
  CHECK(moe_int4_scales_after_mma(2048, 32));
  CHECK_FALSE(moe_int4_scales_after_mma(160, 32));
  CHECK_FALSE(moe_int4_scales_after_mma(2048, 64));
  CHECK_FALSE(moe_int4_scales_after_mma(2048, 8));
  // A word's nibbles (column k's at bits 4k) go to the order 0 2 4 6 1 3 5 7: columns 2i, 2i + 1
  // in nibbles i, i + 4.
  CHECK(moe_int4_pair_nibbles(0x76543210u) == 0x75316420u);
  CHECK(moe_int4_pair_nibbles(0x000000F0u) == 0x000F0000u);  // column 1 -> nibble 4
  CHECK(moe_int4_pair_nibbles(0xF0000000u) == 0xF0000000u);         // column 7 -> nibble 7
  // The conversion moves words to the places above, their nibbles reordered.
  std::vector<int32_t> src(static_cast<size_t>(rows * cols / 8)), dst(src.size(), -1);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(0x9E3779B9u * (i + 1));
  REQUIRE(moe_experts_tile_int4(CpuExecutor{}, src.data(), rows, cols, dst.data()).ok());
  auto moved = [&](int64_t r, int64_t k) {
    uint32_t const word = static_cast<uint32_t>(src[static_cast<size_t>(r * 20 + k)]);
    return static_cast<int32_t>(moe_int4_pair_nibbles(word));
  };
  CHECK(dst[4] == moved(0, 1));
  CHECK(dst[1] == moved(0, 4));
  CHECK(dst[39] == moved(2, 13));
  CHECK(dst[262] == moved(1, 18));
  CHECK(dst[342] == moved(17, 9));
  CHECK(dst[639] == moved(31, 19));

  // Shapes without a tiled order, null and overlapping buffers are refused by name.
  testing::check_error(moe_experts_tile_int4(CpuExecutor{}, src.data(), 24, cols, dst.data()),
                       StatusCode::kInvalidArgument, {"24 x 160", "multiple of 16"});
  testing::check_error(moe_experts_tile_int4(CpuExecutor{}, src.data(), rows, 48, dst.data()),
                       StatusCode::kInvalidArgument, {"32 x 48", "columns of 32"});
  testing::check_error(moe_experts_tile_int4(CpuExecutor{}, nullptr, rows, cols, dst.data()),
                       StatusCode::kInvalidArgument, {"src is null"});
  testing::check_error(
      moe_experts_tile_int4(CpuExecutor{}, src.data(), rows, cols, src.data() + 8),
      StatusCode::kInvalidArgument, {"overlap", "out of place"});
}

TEST_CASE("moe_experts: CUDA workspace size, layout and its refusal") {
  // Kimi-K2.5 decode, 64 tokens: the per-assignment h and out dominate.
  MoeExpertsWorkspaceLayout const l = moe_experts_workspace_layout(64, 8, 384, 7168, 2048);
  CHECK(l.offsets == 0);
  for (size_t at : {l.active, l.sorted, l.h, l.out, l.xb, l.bytes}) CHECK(at % 256 == 0);
  CHECK(l.active >= 385 * 4);
  CHECK(l.sorted >= l.active + 384 * 4);
  CHECK(l.h >= l.sorted + 512 * 4);
  CHECK(l.out >= l.h + size_t{512} * 2048 * 4);
  CHECK(l.xb >= l.out + size_t{512} * 7168 * 4);
  CHECK(l.bytes >= l.xb + size_t{64} * 7168 * 2);
  CHECK(l.bytes < l.xb + size_t{64} * 7168 * 2 + 256);
  CHECK(moe_experts_workspace_bytes(64, 8, 384, 7168, 2048) == l.bytes);
  // Fewer assignments than experts: active holds min(E, T*K) slots.
  MoeExpertsWorkspaceLayout const one = moe_experts_workspace_layout(1, 8, 384, 7168, 2048);
  CHECK(one.sorted - one.active == 256);

  testing::Rng rng(11);
  ExpertSet X = random_experts(rng, 64, 32, 2, false, 0);
  std::vector<float> const x(64 * 2, 1.0f), w(4, 0.5f);
  std::vector<int32_t> const ids{0, 1, 1, 0};
  std::vector<float> y(64 * 2);
  MoeExpertsParams p = params_for(X, x, ids, w, 2, 2, &y);
  size_t const need = moe_experts_workspace_bytes(2, 2, 2, 64, 32);
  std::vector<float> ws(need / 4 + 8);
  p.workspace = ws.data();
  p.workspace_bytes = need - 4;
  testing::check_error(validate_cuda(p), StatusCode::kInvalidArgument,
                       {"workspace of " + std::to_string(need - 4) + " bytes < " +
                            std::to_string(need),
                        "moe_experts_workspace_bytes(tokens, top_k, experts, hidden, inter)"});
  p.workspace = nullptr;
  p.workspace_bytes = need;
  testing::check_error(validate_cuda(p), StatusCode::kInvalidArgument, {"workspace of 0 bytes"});
  p.workspace = ws.data();
  CHECK(validate_cuda(p).ok());
  p.workspace = reinterpret_cast<char*>(ws.data()) + 4;
  testing::check_error(validate_cuda(p), StatusCode::kInvalidArgument,
                       {"workspace is not 16-byte aligned"});
  p.workspace = ws.data();
  p.x = x.data() + 1;
  testing::check_error(validate_cuda(p), StatusCode::kInvalidArgument, {"x is not 16-byte aligned"});
  p.x = x.data();
  p.addend = x.data() + 2;
  testing::check_error(validate_cuda(p), StatusCode::kInvalidArgument,
                       {"addend is not 16-byte aligned"});
  p.addend = x.data();
  std::vector<uint16_t> const xb(64 * 2 + 8);
  p.x_bf16 = xb.data() + 1;
  testing::check_error(validate_cuda(p), StatusCode::kInvalidArgument,
                       {"x_bf16 is not 16-byte aligned"});
}
