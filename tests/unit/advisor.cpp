// The speculation advisor (engine/advisor.hpp): cost curves against hand values, the accept
// length of a chain predicted from a deeper chain's per-position acceptance against a simulation
// of the shorter chain (SpecMetrics recording both), advice against step costs computed by hand,
// "draft nothing" when nothing beats plain decoding, step costs from measured runs against hand
// values, a measured configuration timed by its own run, and every refused input named.
#include <doctest/doctest.h>

#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "specdec/engine/advisor.hpp"
#include "specdec/engine/metrics.hpp"
#include "support/status_checks.hpp"

namespace {

using specdec::SpecConfig;
using specdec::StatusCode;
using specdec::engine::Advice;
using specdec::testing::check_error;
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

namespace {

// A measured run's metrics: `verifies` verifies of the given proposed depths, each accepting
// `accepted`, and the phases' total seconds.
SpecMetrics measured(int64_t verifies, double draft, double build, double verify, double commit,
                     double extend, std::vector<int> const& proposed = {}, int accepted = 0) {
  SpecMetrics m;
  for (int64_t i = 0; i < verifies; ++i) m.record_verify(proposed, accepted, accepted + 1);
  m.draft_s = draft;
  m.build_s = build;
  m.verify_s = verify;
  m.commit_s = commit;
  m.extend_s = extend;
  return m;
}

}  // namespace

TEST_CASE("advisor: costs_from_runs turns measured runs into step costs and candidates") {
  std::vector<specdec::engine::MeasuredRun> runs{
      {config("NONE", 0, 0, 1), measured(10, 0.0, 0.0, 0.100, 0.010, 0.0)},
      {config("NGRAM", 2, 1, 3), measured(5, 0.010, 0.001, 0.060, 0.004, 0.0, {1, 2}, 2)},
      {config("NGRAM", 4, 1, 5), measured(4, 0.016, 0.002, 0.056, 0.004, 0.0, {1, 2, 3, 4}, 1)},
      {config("NGRAM", 2, 4, 5), measured(8, 0.032, 0.004, 0.080, 0.008, 0.0, {1, 1, 2, 2}, 1)},
  };
  StepCosts costs;
  std::vector<Candidate> candidates;
  REQUIRE(specdec::engine::costs_from_runs(runs, &costs, &candidates).ok());
  CHECK(costs.plain_step_s == doctest::Approx(0.011));
  // verify: 1 node 10 ms; 3 nodes 12 ms; 5 nodes (14 + 10) / 2 ms.
  REQUIRE(costs.verify.points.size() == 3);
  CHECK(costs.verify.points[0].first == 1);
  CHECK(costs.verify.points[0].second == doctest::Approx(0.010));
  CHECK(costs.verify.points[1].first == 3);
  CHECK(costs.verify.points[1].second == doctest::Approx(0.012));
  CHECK(costs.verify.points[2].first == 5);
  CHECK(costs.verify.points[2].second == doctest::Approx(0.012));
  // draft step: rows 1 ((10 / 5 / 2) + (16 / 4 / 4)) / 2 ms; rows 4: 32 / 8 / 2 ms.
  REQUIRE(costs.draft_step.points.size() == 2);
  CHECK(costs.draft_step.points[0].second == doctest::Approx(0.001));
  CHECK(costs.draft_step.points[1].first == 4);
  CHECK(costs.draft_step.points[1].second == doctest::Approx(0.002));
  // overhead per verify: (1 + 4) / 5, (2 + 4) / 4, (4 + 8) / 8 = 1.0, 1.5, 1.5 ms, averaged.
  CHECK(costs.overhead_s == doctest::Approx((0.001 + 0.0015 + 0.0015) / 3));
  REQUIRE(candidates.size() == 4);
  CHECK(candidates[0].per_position_accept.empty());
  // Each speculative candidate keeps its own run's costs per verify; the plain one has none.
  CHECK_FALSE(candidates[0].own.has_value());
  REQUIRE(candidates[2].own.has_value());
  CHECK(candidates[2].own->draft_s == doctest::Approx(0.004));
  CHECK(candidates[2].own->verify_s == doctest::Approx(0.014));
  CHECK(candidates[2].own->overhead_s == doctest::Approx(0.0015));
  CHECK(candidates[1].per_position_accept == std::vector<double>{1.0, 1.0});
  CHECK(candidates[2].per_position_accept == std::vector<double>{1.0, 0.0, 0.0, 0.0});
  Advice a;
  REQUIRE(specdec::engine::advise(costs, candidates, &a).ok());
  CHECK(a.use);
  CHECK(a.best == 1);  // 3 tokens per 2 + 12 + 1 ms (its own run), against 1 per 11 ms plain
  CHECK(a.predictions[1].own_costs);
  CHECK(a.predictions[1].step_s == doctest::Approx(0.015));
  CHECK(a.predictions[2].step_s == doctest::Approx(0.004 + 0.014 + 0.0015));
  // The tree (topk 4, 2 steps) is predicted at its own measured depth: 1 + 1 + 0 tokens. A tree
  // measured deeper than its steps (an n-gram tree's continuation) keeps every measured depth.
  CHECK(a.predictions[3].accept_length == doctest::Approx(2.0));
  std::vector<Candidate> deep = {candidates[0], {config("NGRAM", 2, 4, 8), {1.0, 1.0, 0.5, 0.5}}};
  REQUIRE(specdec::engine::advise(costs, deep, &a).ok());
  CHECK(a.predictions[1].accept_length == doctest::Approx(4.0));
  CHECK_FALSE(a.predictions[1].extrapolated);

  using specdec::testing::check_error;
  std::vector<specdec::engine::MeasuredRun> bad = {runs[1]};
  check_error(specdec::engine::costs_from_runs(bad, &costs, &candidates),
              StatusCode::kInvalidArgument, {"exactly one plain run", "got 0"});
  bad = {runs[0], runs[0], runs[1]};
  check_error(specdec::engine::costs_from_runs(bad, &costs, &candidates),
              StatusCode::kInvalidArgument, {"a second plain run"});
  bad = {runs[0]};
  check_error(specdec::engine::costs_from_runs(bad, &costs, &candidates),
              StatusCode::kInvalidArgument, {"no speculative run"});
  bad = {runs[0], {config("NGRAM", 2, 1, 3), SpecMetrics{}}};
  check_error(specdec::engine::costs_from_runs(bad, &costs, &candidates),
              StatusCode::kInvalidArgument, {"NGRAM", "made no verify"});
}

// Two chains whose rest of the step (build + commit + extend) grows with depth, as the H200
// demo's did: averaged over the runs, that cost makes the deep chain look faster than it ran;
// each run's own costs choose the chain that was faster. Per verify: plain 11 ms; chain 1 draft
// 1 + verify 10 + rest 1 = 12 ms, accept length 1.9 (158.3 tokens/s); chain 4 draft 4 + verify
// 11 + rest 16 = 31 ms, accept length 4.6 (148.4 tokens/s). With the rest averaged (8.5 ms):
// chain 1 1.9 / 19.5 ms = 97.4 tokens/s, chain 4 4.6 / 23.5 ms = 195.7.
TEST_CASE("advisor: a measured configuration is predicted from its own run's costs") {
  // verifies, draft, build, verify, commit, extend (seconds over the run); accepted drafts of
  // each verify of a chain of `depth`.
  auto run = [](int depth, std::vector<int> const& accepted, double draft, double build,
                double verify, double commit, double extend) {
    std::vector<int> proposed;
    for (int d = 1; d <= depth; ++d) proposed.push_back(d);
    SpecMetrics m;
    for (int a : accepted) m.record_verify(proposed, a, a + 1);
    m.draft_s = draft, m.build_s = build, m.verify_s = verify;
    m.commit_s = commit, m.extend_s = extend;
    return m;
  };
  std::vector<specdec::engine::MeasuredRun> const runs{
      {config("NONE", 0, 0, 1), measured(10, 0.0, 0.0, 0.100, 0.010, 0.0)},
      {config("EAGLE3", 1, 1, 2),
       run(1, {1, 1, 1, 1, 1, 1, 1, 1, 1, 0}, 0.010, 0.005, 0.100, 0.005, 0.0)},
      {config("EAGLE3", 4, 1, 5),
       run(4, {4, 4, 4, 4, 4, 4, 3, 3, 3, 3}, 0.040, 0.050, 0.110, 0.050, 0.060)},
  };
  StepCosts costs;
  std::vector<Candidate> candidates;
  REQUIRE(specdec::engine::costs_from_runs(runs, &costs, &candidates).ok());
  CHECK(costs.overhead_s == doctest::Approx(0.0085));
  Advice a;
  REQUIRE(specdec::engine::advise(costs, candidates, &a).ok());
  CHECK(a.predictions[1].own_costs);
  CHECK(a.predictions[1].tokens_per_s == doctest::Approx(1.9 / 0.012));
  CHECK(a.predictions[2].tokens_per_s == doctest::Approx(4.6 / 0.031));
  CHECK(a.best == 1);
  // The same candidates without their own costs: the averaged curves choose the deep chain.
  for (Candidate& c : candidates) c.own.reset();
  REQUIRE(specdec::engine::advise(costs, candidates, &a).ok());
  CHECK_FALSE(a.predictions[2].own_costs);
  CHECK(a.predictions[2].tokens_per_s == doctest::Approx(4.6 / 0.0235));
  CHECK(a.best == 2);
  // A run's own costs must be real times.
  candidates[1].own = specdec::engine::RunCosts{0.001, -0.002, 0.0};
  check_error(specdec::engine::advise(costs, candidates, &a), StatusCode::kInvalidArgument,
              {"EAGLE3", "own run's costs", "finite and >= 0"});
}

// plan_draft_steps against step costs computed by hand at two batch sizes for a chain of 3
// (acceptance 0.8, 0.6, 0.4): alone, the whole chain wins; at batch 16 every depth loses to plain
// decoding; at batch 4 one step is best. Then a top-4 tree cut to 1 step verifies 5 nodes.
TEST_CASE("advisor: plan_draft_steps chooses the depth per batch size from costs by hand") {
  using specdec::engine::DraftStepsPlan;
  using specdec::engine::DraftStepsRule;
  auto costs = [](double plain, double verify4, double draft, double overhead) {
    StepCosts c;
    c.plain_step_s = plain;
    c.verify.points = {{1, plain}, {4, verify4}};
    c.draft_step.points = {{1, draft}};
    c.overhead_s = overhead;
    return c;
  };
  // Batch 1: d tokens/s = (1 + sum p) / (d * 0.1 + verify(d + 1) + 0.05), verify(n) = 1 +
  // 0.1 (n - 1) / 3: d=1 1.8/1.183, d=2 2.4/1.317, d=3 2.8/1.45 = 1.931 (the best); plain 1.
  // Batch 4: plain 0.9, verify(n) = 0.9 + 1.6 (n - 1) / 3, draft 0.4, overhead 0.1: d=1 0.931,
  // d=2 1.014, d=3 0.737, plain 1 / 0.9 = 1.111 wins. Batch 16: every depth below 0.67.
  std::vector<std::pair<int, StepCosts>> const by_batch{
      {1, costs(1.0, 1.1, 0.1, 0.05)}, {4, costs(0.9, 2.5, 0.4, 0.1)},
      {16, costs(1.0, 4.0, 0.5, 0.2)}};
  Candidate chain{config("EAGLE3", 3, 1, 4), {0.8, 0.6, 0.4}};
  DraftStepsPlan plan;
  REQUIRE(specdec::engine::plan_draft_steps(by_batch, chain, &plan).ok());
  CHECK(plan.rules == std::vector<DraftStepsRule>{{1, 3}, {4, 0}});
  REQUIRE(plan.chosen.size() == 3);
  CHECK(plan.chosen[0].second.tokens_per_s == doctest::Approx(2.8 / 1.45));
  CHECK(plan.chosen[1].second.config.num_steps == 0);
  CHECK(plan.chosen[1].second.tokens_per_s == doctest::Approx(1 / 0.9));
  // Batch 4 with a cheaper verify: 1 step pays (1.8 / (0.4 + 1.0 + 0.5 / 3 + 0.1) = 1.08 > 1.0)
  // and 2 steps do not (2.4 / (0.8 + 1.0 + 1.0 / 3 + 0.1) = 1.075 < 1.08).
  std::vector<std::pair<int, StepCosts>> const cheaper{{1, costs(1.0, 1.1, 0.1, 0.05)},
                                                      {4, costs(1.0, 1.5, 0.4, 0.1)}};
  REQUIRE(specdec::engine::plan_draft_steps(cheaper, chain, &plan).ok());
  CHECK(plan.rules == std::vector<DraftStepsRule>{{1, 3}, {4, 1}});
  CHECK(plan.chosen[1].second.tokens_per_s == doctest::Approx(1.8 / (0.4 + 1.0 + 0.5 / 3 + 0.1)));
  // The chain's own run at batch 1 drafted at 0.3 per step (the curve says 0.1): cut to d steps
  // it costs 0.3 d + verify (its own 1.1 at 3 steps, the curve below) + its rest 0.05, so
  // d=3 2.8 / 2.05 = 1.366, d=2 2.4 / (0.6 + 1.0 + 0.2 / 3 + 0.05) = 1.398 (the best), d=1
  // 1.8 / 1.383 = 1.301. Batches without an own run keep the curves.
  std::vector<std::optional<specdec::engine::RunCosts>> const own{
      specdec::engine::RunCosts{0.9, 1.1, 0.05}, std::nullopt, std::nullopt};
  REQUIRE(specdec::engine::plan_draft_steps(by_batch, chain, &plan, own).ok());
  CHECK(plan.rules == std::vector<DraftStepsRule>{{1, 2}, {4, 0}});
  CHECK(plan.chosen[0].second.own_costs);
  CHECK(plan.chosen[0].second.tokens_per_s == doctest::Approx(2.4 / (0.6 + 1.0 + 0.2 / 3 + 0.05)));
  check_error(specdec::engine::plan_draft_steps(by_batch, chain, &plan,
                                                std::span(own).first(2)),
              StatusCode::kInvalidArgument, {"policy_own has 2 entries for 3 batch sizes"});
  // A top-4 tree of 3 steps and 8 nodes cut to 1 step verifies 1 + 4 nodes; its acceptance is
  // taken to that depth only.
  CHECK(specdec::engine::draft_nodes_at(4, 3, 8, 1) == 5);
  CHECK(specdec::engine::draft_nodes_at(4, 3, 8, 2) == 8);
  CHECK(specdec::engine::draft_nodes_at(1, 3, 4, 2) == 3);
  CHECK(specdec::engine::draft_nodes_at(4, 3, 8, 0) == 1);
  Candidate tree{config("EAGLE3", 3, 4, 8), {0.9, 0.7, 0.5}};
  std::vector<std::pair<int, StepCosts>> const one{{1, costs(1.0, 1.3, 0.5, 0.0)}};
  REQUIRE(specdec::engine::plan_draft_steps(one, tree, &plan).ok());
  // d=1: 1.9 / (0.5 + verify(5) = 1.4) = 1.0; d=2: 2.6 / (1.0 + verify(8) = 1.7) = 0.963;
  // d=3: 3.1 / (1.5 + 1.7) = 0.969; plain 1.0: ties go to the shallower (plain).
  CHECK(plan.rules == std::vector<DraftStepsRule>{{1, 0}});

  check_error(specdec::engine::plan_draft_steps({}, chain, &plan), StatusCode::kInvalidArgument,
              {"plan_draft_steps", "no batch size"});
  std::vector<std::pair<int, StepCosts>> const down{{4, costs(1.0, 1.1, 0.1, 0.05)},
                                                   {2, costs(1.0, 1.1, 0.1, 0.05)}};
  check_error(specdec::engine::plan_draft_steps(down, chain, &plan), StatusCode::kInvalidArgument,
              {"plan_draft_steps", "increase"});
  check_error(specdec::engine::plan_draft_steps(one, Candidate{config("NONE", 0, 0, 1), {}}, &plan),
              StatusCode::kInvalidArgument, {"plan_draft_steps", "no depth to plan"});
}

TEST_CASE("draft steps by batch: text form both ways, and bad text named") {
  using specdec::engine::DraftStepsRule;
  std::vector<DraftStepsRule> rules;
  REQUIRE(specdec::engine::parse_draft_steps("1:3,8:1,32:0", &rules).ok());
  CHECK(rules == std::vector<DraftStepsRule>{{1, 3}, {8, 1}, {32, 0}});
  CHECK(specdec::engine::format_draft_steps(rules) == "1:3,8:1,32:0");
  REQUIRE(specdec::engine::parse_draft_steps("", &rules).ok());
  CHECK(rules.empty());
  for (char const* bad : {"1:3,", "1-3", "a:1", "1:", "1:-2", "1:3,,2:1"}) {
    CAPTURE(bad);
    check_error(specdec::engine::parse_draft_steps(bad, &rules), StatusCode::kInvalidArgument,
                {"draft steps by batch"});
  }
}
