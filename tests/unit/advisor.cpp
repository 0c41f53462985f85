// The speculation advisor (engine/advisor.hpp): cost curves against hand values, the accept
// length of a chain predicted from a deeper chain's per-position acceptance against a simulation
// of the shorter chain (SpecMetrics recording both), advice against step costs computed by hand,
// "draft nothing" when nothing beats plain decoding, and every refused input named.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "specdec/engine/advisor.hpp"
#include "specdec/engine/metrics.hpp"
#include "support/status_checks.hpp"

namespace {

using specdec::SpecConfig;
using specdec::StatusCode;
using specdec::engine::Advice;
using specdec::engine::Candidate;
using specdec::engine::CostCurve;
using specdec::engine::expected_accept_length;
using specdec::engine::SpecMetrics;
using specdec::engine::StepCosts;

SpecConfig config(char const* algorithm, int steps, int topk, int nodes) {
  SpecConfig c;
  c.algorithm = algorithm;
  c.num_steps = steps;
  c.eagle_topk = topk;
  c.num_draft_tokens = nodes;
  return c;
}

// A chain of `depth` drafts whose draft d is accepted with probability rates[d - 1] once d - 1
// were: the metrics of n verifies.
SpecMetrics simulate_chain(std::vector<double> const& rates, int depth, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int> proposed;
  for (int d = 1; d <= depth; ++d) proposed.push_back(d);
  SpecMetrics m;
  for (int i = 0; i < n; ++i) {
    int accepted = 0;
    while (accepted < depth && u(rng) < rates[static_cast<size_t>(accepted)]) ++accepted;
    m.record_verify(proposed, accepted, accepted + 1);
  }
  return m;
}

StepCosts costs_ms(double plain, CostCurve verify, CostCurve draft, double overhead) {
  auto seconds = [](CostCurve c) {
    for (auto& pt : c.points) pt.second *= 1e-3;
    return c;
  };
  return StepCosts{plain * 1e-3, seconds(verify), seconds(draft), overhead * 1e-3};
}

}  // namespace

TEST_CASE("advisor: a cost curve is piecewise linear through its points, extended at both ends") {
  CostCurve const c{{{1, 1.0}, {4, 1.3}, {8, 2.1}}};
  REQUIRE(c.check("verify").ok());
  CHECK(c.at(1) == doctest::Approx(1.0));
  CHECK(c.at(2) == doctest::Approx(1.1));
  CHECK(c.at(4) == doctest::Approx(1.3));
  CHECK(c.at(6) == doctest::Approx(1.7));
  CHECK(c.at(16) == doctest::Approx(3.7));  // the last segment's slope, 0.2 per node
  CHECK(CostCurve{{{3, 0.5}}}.at(64) == doctest::Approx(0.5));
  specdec::testing::check_error(CostCurve{}.check("verify"), StatusCode::kInvalidArgument,
                                {"verify: no measured point"});
  specdec::testing::check_error(CostCurve{{{4, 1.0}, {2, 2.0}}}.check("verify"),
                                StatusCode::kInvalidArgument, {"sizes must increase, got 4 then 2"});
  specdec::testing::check_error(CostCurve{{{1, -1.0}}}.check("draft"), StatusCode::kInvalidArgument,
                                {"draft: point (1, -1", "seconds finite, >= 0"});
}

TEST_CASE("advisor: expected accept length, with the geometric tail past the measured depth") {
  std::vector<double> const p{0.8, 0.6, 0.45};
  bool tail = true;
  CHECK(expected_accept_length(p, 0, &tail) == doctest::Approx(1.0));
  CHECK(expected_accept_length(p, 2, &tail) == doctest::Approx(2.4));
  CHECK_FALSE(tail);
  CHECK(expected_accept_length(p, 3, &tail) == doctest::Approx(2.85));
  CHECK_FALSE(tail);
  // Past depth 3 the conditional rate 0.45 / 0.6 = 0.75 holds: 0.3375, 0.253125.
  CHECK(expected_accept_length(p, 5, &tail) == doctest::Approx(3.440625));
  CHECK(tail);
  CHECK(expected_accept_length({}, 4) == doctest::Approx(1.0));
}

TEST_CASE("advisor: a shorter chain's accept length, predicted from a deeper chain's metrics") {
  std::vector<double> const rates{0.9, 0.7, 0.6, 0.5, 0.4};
  int const n = 200000;
  SpecMetrics const deep = simulate_chain(rates, 5, n, 1);
  for (int depth : {1, 2, 3, 4}) {
    CAPTURE(depth);
    SpecMetrics const direct = simulate_chain(rates, depth, n, 2 + depth);
    // Accept lengths vary by at most ~1.5 per verify: a standard error under 0.004.
    CHECK(expected_accept_length(deep.per_position_accept(), depth) ==
          doctest::Approx(direct.accept_length()).epsilon(0.01));
  }
  // And the deep chain's own accept length is its metrics' (the formula, not an estimate).
  CHECK(expected_accept_length(deep.per_position_accept(), 5) ==
        doctest::Approx(deep.accept_length()).epsilon(1e-9));
}

TEST_CASE("advisor: advice from costs computed by hand") {
  // Plain step 10 ms; verify 10 / 11 / 13 ms at 1 / 4 / 8 nodes; a draft step 0.5 ms over one
  // row, 0.8 over four; 0.3 ms of build, commit and extend.
  StepCosts const costs = costs_ms(10.0, CostCurve{{{1, 10.0}, {4, 11.0}, {8, 13.0}}},
                                   CostCurve{{{1, 0.5}, {4, 0.8}}}, 0.3);
  std::vector<Candidate> const candidates{
      {config("NONE", 0, 0, 1), {}},
      {config("EAGLE3", 3, 1, 4), {0.8, 0.6, 0.45}},
      {config("EAGLE3", 3, 4, 8), {0.9, 0.75, 0.6}},
  };
  Advice a;
  REQUIRE(specdec::engine::advise(costs, candidates, &a).ok());
  REQUIRE(a.predictions.size() == 3);
  CHECK(a.predictions[0].speedup == doctest::Approx(1.0));
  // Chain: 3 x 0.5 + 11 + 0.3 = 12.8 ms for 2.85 tokens; tree: 3 x 0.8 + 13 + 0.3 = 15.7 ms for
  // 3.25 tokens.
  CHECK(a.predictions[1].step_s == doctest::Approx(12.8e-3));
  CHECK(a.predictions[1].speedup == doctest::Approx(2.85 / 1.28));
  CHECK(a.predictions[2].step_s == doctest::Approx(15.7e-3));
  CHECK(a.predictions[2].speedup == doctest::Approx(3.25 / 1.57));
  CHECK(a.best == 1);
  CHECK(a.use);
  CHECK(a.summary.find("speculating with EAGLE3 layers=[] topk=1 steps=3 nodes=4") == 0);
  // The same advice refuses a gain under a demanded 2.5x.
  REQUIRE(specdec::engine::advise(costs, candidates, &a, 2.5).ok());
  CHECK(a.best == 1);
  CHECK_FALSE(a.use);
  CHECK(a.summary.find("not speculating") == 0);
}

TEST_CASE("advisor: draft nothing where no configuration is predicted to gain") {
  // A verify of 4 nodes three times a plain step (a large batch): the chain's 2.85 tokens cost
  // 31.8 ms against 28.5 ms plainly.
  StepCosts const costs = costs_ms(10.0, CostCurve{{{1, 10.0}, {4, 30.0}}},
                                   CostCurve{{{1, 0.5}}}, 0.3);
  Advice a;
  REQUIRE(specdec::engine::advise(costs,
                                  {{config("NONE", 0, 0, 1), {}},
                                   {config("NGRAM", 3, 1, 4), {0.8, 0.6, 0.45}}},
                                  &a)
              .ok());
  CHECK(a.best == 0);
  CHECK_FALSE(a.use);
  CHECK(a.predictions[1].speedup == doctest::Approx(2.85 / 3.18));
  CHECK(a.summary.find("not speculating: no configuration is predicted to beat plain decoding") ==
        0);
}

TEST_CASE("advisor: refused inputs name the problem") {
  StepCosts const costs = costs_ms(10.0, CostCurve{{{1, 10.0}, {4, 11.0}}},
                                   CostCurve{{{1, 0.5}}}, 0.3);
  Advice a;
  using specdec::testing::check_error;
  check_error(specdec::engine::advise(costs, {}, &a), StatusCode::kInvalidArgument,
              {"no candidate configuration"});
  check_error(specdec::engine::advise(costs, {{config("EAGLE3", 3, 1, 4), {0.5, 0.6}}}, &a),
              StatusCode::kInvalidArgument,
              {"per_position_accept rises from 0.5", "depth 1 to 0.6", "at depth 2"});
  check_error(specdec::engine::advise(costs, {{config("EAGLE3", 3, 1, 4), {1.5}}}, &a),
              StatusCode::kInvalidArgument, {"per_position_accept[0] = 1.5", "not a rate"});
  check_error(specdec::engine::advise(costs, {{config("EAGLE3", 3, 1, 1), {0.5}}}, &a),
              StatusCode::kInvalidArgument, {"steps 3, topk 1, nodes 1 do not describe a draft"});
  StepCosts no_plain = costs;
  no_plain.plain_step_s = 0.0;
  check_error(specdec::engine::advise(no_plain, {{config("NONE", 0, 0, 1), {}}}, &a),
              StatusCode::kInvalidArgument, {"plain_step_s 0", "must be > 0"});
  StepCosts no_draft = costs;
  no_draft.draft_step = CostCurve{};
  check_error(specdec::engine::advise(no_draft, {{config("EAGLE3", 3, 1, 4), {0.5}}}, &a),
              StatusCode::kInvalidArgument, {"draft step costs: no measured point"});
  check_error(specdec::engine::advise(costs, {{config("NONE", 0, 0, 1), {}}}, nullptr),
              StatusCode::kInvalidArgument, {"advise: out is null"});
}
