// moe_route (CPU front door): the op routes each token of logits [T, E] exactly as the per-token
// rule does on sigmoid scores (checked on a hand-built case with group masking), and the shape
// and kernel limits are refused by name, for both executors alike.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "specdec/ops/moe_route/moe_route.hpp"

using namespace specdec;
using namespace specdec::ops;

TEST_CASE("moe_route: logits to ids and weights, group-limited") {
  // 8 experts in 2 groups; logits chosen so group 1 (experts 4..7) wins on its top-2 sum even
  // though expert 0 has the single largest score.
  std::vector<float> const logits{3.0f, -4.0f, -4.0f, -4.0f, 2.0f, 1.9f, -1.0f, 0.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  MoeRouteParams p;
  p.logits = logits.data();
  p.tokens = 1;
  p.experts = 8;
  p.n_group = 2;
  p.topk_group = 1;
  p.top_k = 2;
  p.norm = true;
  p.scale = 2.0f;
  p.ids = ids.data();
  p.weights = w.data();
  REQUIRE(moe_route(CpuExecutor{}, p).ok());
  CHECK(ids == std::vector<int32_t>{4, 5});
  double const s4 = 1.0 / (1.0 + std::exp(-2.0)), s5 = 1.0 / (1.0 + std::exp(-1.9));
  CHECK(w[0] == doctest::Approx(2.0 * s4 / (s4 + s5)).epsilon(1e-6));
  CHECK(w[1] == doctest::Approx(2.0 * s5 / (s4 + s5)).epsilon(1e-6));
  // With both groups kept, expert 0 leads.
  p.topk_group = 2;
  REQUIRE(moe_route(CpuExecutor{}, p).ok());
  CHECK(ids == std::vector<int32_t>{0, 4});
}

TEST_CASE("moe_route: refusals name the limit") {
  std::vector<float> logits(2048);
  std::vector<int32_t> ids(128);
  std::vector<float> w(128);
  auto refused = [&](auto edit, std::string const& what) {
    MoeRouteParams p;
    p.logits = logits.data();
    p.tokens = 1;
    p.experts = 16;
    p.n_group = 2;
    p.topk_group = 1;
    p.top_k = 2;
    p.ids = ids.data();
    p.weights = w.data();
    edit(p);
    Status const s = moe_route(CpuExecutor{}, p);
    CHECK_MESSAGE(s.to_string().find(what) != std::string::npos, s.to_string());
  };
  refused([](MoeRouteParams& p) { p.n_group = 3; }, "n_group 3 does not divide the 16 experts");
  refused([](MoeRouteParams& p) { p.n_group = 16; }, "the group score needs 2");
  refused([](MoeRouteParams& p) { p.topk_group = 3; }, "topk_group 3 not in [1, n_group 2]");
  refused([](MoeRouteParams& p) { p.top_k = 9; }, "top_k 9 not in [1, 8]");
  refused([](MoeRouteParams& p) { p.experts = 2048; p.n_group = 1; }, "experts 2048 > 1024");
  refused([](MoeRouteParams& p) { p.experts = 128; p.n_group = 64; }, "n_group 64 > 32");
  refused([](MoeRouteParams& p) { p.experts = 128; p.n_group = 1; p.top_k = 65; }, "top_k 65 > 64");
  refused([](MoeRouteParams& p) { p.ids = nullptr; }, "must not be null");
  refused([](MoeRouteParams& p) { p.scale = NAN; }, "scale (routed_scaling_factor) is not finite");
}
