// The bench report (engine/bench_sweep.hpp) from runs whose metrics are built by hand: per row the
// decode rate (decode tokens / seconds of the speculative steps), speedup, efficiency, the
// outputs that differ from plain decoding, the advisor's choice against the measured best; and
// plan_bench over the reports of two batch sizes: the choice at the smallest batch, its drafting
// depth per batch size (timed by its own run at each batch size) as the serve flag.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "specdec/engine/bench_sweep.hpp"
#include "support/status_checks.hpp"

namespace {

using specdec::StatusCode;
using specdec::engine::BenchPlan;
using specdec::engine::BenchReport;
using specdec::engine::BenchRun;
using specdec::engine::BenchSetup;
using specdec::engine::DraftStepsRule;
using specdec::engine::SpecMetrics;
using specdec::testing::check_error;

// A chain of `depth` drafts over `verifies` verifies: `accepted[k]` of them accept k drafts
// (k = 0..depth); per verify draft_s / verify_s / commit_s seconds.
BenchRun chain_run(int depth, std::vector<int> const& accepted, double draft_s, double verify_s,
                   double commit_s, int prompts, std::vector<int32_t> const& output) {
  BenchRun r;
  r.config.algorithm = depth == 0 ? "NONE" : "EAGLE3";  // plain decoding, or a chain
  r.config.num_steps = depth;
  r.config.eagle_topk = depth == 0 ? 0 : 1;
  r.config.num_draft_tokens = depth + 1;
  std::vector<int> proposed;
  for (int d = 1; d <= depth; ++d) proposed.push_back(d);
  for (int k = 0; k < static_cast<int>(accepted.size()); ++k) {
    for (int i = 0; i < accepted[static_cast<size_t>(k)]; ++i) {
      r.metrics.record_verify(proposed, k, k + 1);
    }
  }
  double const n = static_cast<double>(r.metrics.verify_ct);
  r.metrics.draft_s = draft_s * n;
  r.metrics.verify_s = verify_s * n;
  r.metrics.commit_s = commit_s * n;
  r.metrics.prefill_s = 0.5;  // not in the decode rate
  r.outputs.assign(static_cast<size_t>(prompts), output);
  r.decode_tokens = r.metrics.committed;
  r.output_tokens = r.decode_tokens + prompts;
  r.seconds = r.metrics.draft_s + r.metrics.verify_s + r.metrics.commit_s + r.metrics.prefill_s;
  return r;
}

BenchSetup setup(int batch) {
  BenchSetup s;
  s.batch = batch;
  s.prompts = 2;
  s.max_new_tokens = 8;
  return s;
}

TEST_CASE("bench: the report's rates, speedups and choice from runs built by hand") {
  std::vector<int32_t> const text{5, 6, 7};
  // Plain: 100 verifies of 1 token at 1 ms. Chain 2: 50 verifies, 10 accept 0, 20 accept 1,
  // 20 accept 2 (110 tokens: accept length 2.2) at 0.2 + 1.2 + 0.1 ms. Chain 1: 60 verifies,
  // 30 accept 0, 30 accept 1 (90 tokens) at 0.1 + 1.1 + 0.1 ms; one of its outputs differs.
  // (A draft step costs 0.1 ms in both, so the advisor's costs are exact.)
  std::vector<BenchRun> runs{chain_run(0, {100}, 0.0, 1e-3, 0.0, 2, text),
                             chain_run(1, {30, 30}, 1e-4, 1.1e-3, 1e-4, 2, text),
                             chain_run(2, {10, 20, 20}, 2e-4, 1.2e-3, 1e-4, 2, text)};
  runs[1].outputs[1] = {5, 6, 8};
  BenchReport r;
  REQUIRE(specdec::engine::summarize_bench(setup(1), runs, &r).ok());
  REQUIRE(r.rows.size() == 3);
  CHECK(r.rows[0].name == "NONE");
  CHECK(r.rows[1].name == "chain 1");
  CHECK(r.rows[2].name == "chain 2");
  double const plain = 100 / 0.1, chain1 = 90 / (60 * 1.3e-3), chain2 = 110 / (50 * 1.5e-3);
  CHECK(r.rows[0].decode_tokens_per_s == doctest::Approx(plain));
  CHECK(r.rows[1].decode_tokens_per_s == doctest::Approx(chain1));
  CHECK(r.rows[2].decode_tokens_per_s == doctest::Approx(chain2));
  CHECK(r.rows[2].speedup == doctest::Approx(chain2 / plain));
  CHECK(r.rows[2].accept_length == doctest::Approx(2.2));
  CHECK(r.rows[2].efficiency == doctest::Approx(chain2 / plain / 2.2));
  CHECK(r.rows[2].per_position_accept == std::vector<double>{0.8, 0.4});
  CHECK(r.rows[1].prompts_differing == 1);
  CHECK(r.rows[2].prompts_differing == 0);
  CHECK(r.measured_best == 2);
  // The advisor predicts the chain of 2 from these costs (its own run: exact) and chooses it.
  CHECK(r.speculating);
  CHECK(r.choice == 2);
  CHECK(r.choice_within_5_percent);
  CHECK(r.rows[2].predicted_decode_tokens_per_s == doctest::Approx(chain2));
  CHECK(r.rows[1].predicted_decode_tokens_per_s == doctest::Approx(chain1));
  std::string const table = specdec::engine::bench_table(r);
  CHECK(table.find("| chain 2 | 2.200 | 0.80 0.40 |") != std::string::npos);
  nlohmann::json const j = specdec::engine::bench_json(r);
  CHECK(j["advisor"]["choice"] == "chain 2");
  CHECK(j["configs"][1]["prompts_differing_from_plain"] == 1);

  check_error(specdec::engine::summarize_bench(setup(1), {runs.begin() + 1, runs.end()}, &r),
              StatusCode::kInvalidArgument, {"summarize_bench", "not plain decoding"});
}

TEST_CASE("bench: plan_bench turns the reports of several batch sizes into the serve flag") {
  std::vector<int32_t> const text{5, 6, 7};
  // Batch 1 as above: the chain of 2 wins. Batch 4: the same acceptance, but a verify of 3
  // tokens costs 3x a plain one and a draft step as much as a plain step: plain decoding wins.
  auto runs_at = [&](double verify2, double verify3, double draft) {
    return std::vector<BenchRun>{chain_run(0, {100}, 0.0, 1e-3, 0.0, 2, text),
                                 chain_run(1, {30, 30}, draft, verify2, 1e-4, 2, text),
                                 chain_run(2, {10, 20, 20}, 2 * draft, verify3, 1e-4, 2, text)};
  };
  std::vector<BenchReport> reports(2);
  REQUIRE(specdec::engine::summarize_bench(setup(1), runs_at(1.1e-3, 1.2e-3, 1e-4),
                                           &reports[0]).ok());
  REQUIRE(specdec::engine::summarize_bench(setup(4), runs_at(2e-3, 3e-3, 1e-3),
                                           &reports[1]).ok());
  CHECK(reports[0].speculating);
  CHECK_FALSE(reports[1].speculating);
  BenchPlan plan;
  REQUIRE(specdec::engine::plan_bench(reports, &plan).ok());
  CHECK(plan.planned);
  CHECK(plan.config.num_steps == 2);
  CHECK(plan.plan.rules == std::vector<DraftStepsRule>{{1, 2}, {4, 0}});
  // At batch 1 the whole chain is timed by its own run there: its measured rate.
  CHECK(plan.plan.chosen[0].second.own_costs);
  CHECK(plan.plan.chosen[0].second.tokens_per_s == doctest::Approx(110 / (50 * 1.5e-3)));
  CHECK(plan.summary.find("drafting plan for chain 2: "
                          "--speculative-draft-steps-by-batch 1:2,4:0") != std::string::npos);
  nlohmann::json const j = specdec::engine::bench_plan_json(plan);
  CHECK(j["draft_steps_by_batch"] == "1:2,4:0");
  CHECK(j["by_batch"][1]["steps"] == 0);
  // Plain decoding chosen at the smallest batch: nothing to plan, and it says so.
  std::vector<BenchReport> plain_first{reports[1]};
  REQUIRE(specdec::engine::plan_bench(plain_first, &plan).ok());
  CHECK_FALSE(plan.planned);
  CHECK(plan.summary.find("no drafting plan") != std::string::npos);
}

}  // namespace
