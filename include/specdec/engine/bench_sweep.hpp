// A configuration sweep measured in one run (what `specdec-kimi bench` reports): C
// configurations, plain decoding first, each having generated the same P prompts; per
// configuration its throughput, speedup over plain decoding, acceptance and time split, whether
// its outputs equal plain decoding's, and the advisor's (engine/advisor.hpp) predicted throughput
// from these runs, its choice and how that choice measured against the measured best.
//
//   BenchRun{config, metrics, seconds, output_tokens, decode_tokens, outputs [P][n_p]}
//       one configuration measured: metrics merged over its generate calls (SpecMetrics::merge;
//       phase times once per batch step), seconds their wall time, output_tokens sum_p n_p,
//       decode_tokens sum_p (n_p - 1) (the tokens after each request's first), outputs each
//       prompt's output ids, in the prompts' order
//   bench_name(config)       "NONE", "chain 3" (topk 1, 3 steps), "tree 4x3/8" (topk x steps /
//                            draft tokens, root included)
//   summarize_bench(setup, runs [C], &report)
//       report.rows [C]: per run, decode_tokens_per_s = decode_tokens / the seconds of its
//       speculative steps (draft + build + verify + commit + extend: prefill excluded, as
//       specdec-kimi generate's decode_tokens_per_s), tokens_per_s = output_tokens / seconds,
//       speedup = decode_tokens_per_s / runs[0]'s, efficiency = speedup / accept length,
//       per_position_accept to the deepest depth proposed, prompts_differing from runs[0]'s
//       outputs; predicted_decode_tokens_per_s from costs_from_runs + advise over all the runs
//       (at the runs' batch size: the metrics count verifies per request, the times per step, so
//       a prediction is the batch's aggregate rate). report.choice: the advisor's best, or 0
//       (plain) when none is predicted to gain; report.measured_best: the highest measured
//       decode_tokens_per_s; choice_vs_best = choice's / best's; within 5 percent: >= 0.95
//   plan_bench(reports [batch sizes, increasing], &plan)
//                            the configuration the advisor chose at the smallest batch size
//                            (plan.planned false when it chose plain decoding), its drafting
//                            depth per batch size (plan_draft_steps over each report's costs
//                            and the configuration's own run in each report):
//                            plan.summary names the serve flag, "--speculative-draft-steps-by-
//                            batch 1:3,4:0"; bench_plan_json(plan) its JSON {planned, config,
//                            draft_steps_by_batch, by_batch [{batch, steps, draft_tokens,
//                            predicted_speedup, predicted_accept_length}], summary}
//   bench_table(report)      (a summarize_bench report) markdown: config | accept length |
//                            per-position | decode tok/s | speedup | efficiency | predicted
//                            tok/s, one row per configuration
//   bench_json(report)       the JSON (tools/bench_plot.py reads it):
//       {model_path, draft_path, prompts_file, device, batch, prompts, max_new_tokens,
//        configs: [{name, algorithm, steps, topk, draft_tokens, speculative_config,
//                   decode_tokens_per_s, tokens_per_s, speedup, accept_length, accept_rate,
//                   per_position_accept [D], efficiency, verify_ct,
//                   time_s {prefill, draft, build, verify, commit, extend},
//                   same_tokens_as_plain, prompts_differing_from_plain,
//                   predicted_decode_tokens_per_s}],
//        advisor: {choice, measured_best, choice_vs_best, choice_within_5_percent, speculating,
//                  summary}}   (choice and measured_best are config names)
//
// Errors (Status): no runs, runs[0] not plain (steps 0), a run with no verify (nothing to time:
// max_new_tokens >= 2 is needed), runs with different prompt counts, no speculative run, and
// whatever costs_from_runs / advise refuse (acceptance outside [0, 1], ...).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "specdec/core/status.hpp"
#include "specdec/engine/advisor.hpp"
#include "specdec/engine/metrics.hpp"
#include "specdec/policy/spec_policy.hpp"

namespace specdec::engine {

struct BenchRun {
  SpecConfig config;
  SpecMetrics metrics;
  double seconds = 0.0;       // wall time of the configuration's generate calls
  int64_t output_tokens = 0;  // sum of the outputs' lengths
  int64_t decode_tokens = 0;  // sum of (length - 1): tokens after each request's first
  std::vector<std::vector<int32_t>> outputs;  // [prompt][token]
};

// What the runs were: echoed into the report.
struct BenchSetup {
  std::string model_path, draft_path, prompts_file, device;
  int batch = 1;
  int prompts = 0;
  int max_new_tokens = 0;
};

struct BenchRow {
  std::string name;  // bench_name(config)
  SpecConfig config;
  double decode_tokens_per_s = 0.0;
  double tokens_per_s = 0.0;
  double speedup = 1.0;
  double accept_length = 1.0;
  double accept_rate = 0.0;
  std::vector<double> per_position_accept;  // depths 1..D, D the deepest proposed
  double efficiency = 1.0;
  int64_t verify_ct = 0;
  SpecMetrics metrics;  // the time split
  int prompts_differing = 0;
  double predicted_decode_tokens_per_s = 0.0;
};

struct BenchReport {
  BenchSetup setup;
  std::vector<BenchRow> rows;
  int choice = 0;         // index into rows: the advisor's choice (0: plain decoding)
  int measured_best = 0;  // index into rows: the highest decode_tokens_per_s
  double choice_vs_best = 1.0;
  bool choice_within_5_percent = true;
  bool speculating = false;  // the advisor chose a speculative configuration
  std::string summary;       // the advisor's line
  StepCosts costs;           // costs_from_runs of the runs (at setup.batch)
  std::vector<Candidate> candidates;  // in the rows' order
};

// A sweep at several batch sizes (bench --batch 1,4,16): the drafting plan of one configuration.
struct BenchPlan {
  bool planned = false;   // false: the advisor chose plain decoding at the smallest batch
  SpecConfig config;      // the configuration planned: the advisor's choice at the smallest batch
  DraftStepsPlan plan;    // its depth per batch size (plan_draft_steps)
  std::string summary;    // one line for the log
};

inline std::string bench_name(SpecConfig const& c) {
  if (c.num_steps == 0) return c.algorithm;
  if (c.eagle_topk == 1) return "chain " + std::to_string(c.num_steps);
  return "tree " + std::to_string(c.eagle_topk) + "x" + std::to_string(c.num_steps) + "/" +
         std::to_string(c.num_draft_tokens);
}

namespace detail {
inline double bench_steps_s(SpecMetrics const& m) {
  return m.draft_s + m.build_s + m.verify_s + m.commit_s + m.extend_s;
}
}  // namespace detail

inline Status summarize_bench(BenchSetup const& setup, std::span<BenchRun const> runs,
                              BenchReport* out) {
  if (out == nullptr) return Status::InvalidArgument("summarize_bench: out is null");
  if (runs.empty()) return Status::InvalidArgument("summarize_bench: no runs");
  if (runs[0].config.num_steps != 0) {
    return Status::InvalidArgument("summarize_bench: runs[0] is " + describe(runs[0].config) +
                                   ", not plain decoding (the baseline comes first)");
  }
  BenchReport r;
  r.setup = setup;
  std::vector<MeasuredRun> measured;
  for (BenchRun const& run : runs) {
    std::string const name = bench_name(run.config);
    SpecMetrics const& m = run.metrics;
    double const steps_s = detail::bench_steps_s(m);
    if (m.verify_ct < 1 || !(steps_s > 0.0)) {
      return Status::InvalidArgument("summarize_bench: " + name + " made no timed verify (" +
                                     std::to_string(m.verify_ct) + " verifies): 2 or more new "
                                     "tokens per prompt are needed to measure a step");
    }
    if (run.outputs.size() != runs[0].outputs.size()) {
      return Status::InvalidArgument("summarize_bench: " + name + " has " +
                                     std::to_string(run.outputs.size()) + " outputs, plain "
                                     "decoding " + std::to_string(runs[0].outputs.size()));
    }
    BenchRow row;
    row.name = name;
    row.config = run.config;
    row.decode_tokens_per_s = static_cast<double>(run.decode_tokens) / steps_s;
    row.tokens_per_s =
        run.seconds > 0.0 ? static_cast<double>(run.output_tokens) / run.seconds : 0.0;
    row.accept_length = m.accept_length();
    row.accept_rate = m.accept_rate();
    row.per_position_accept = m.per_position_accept();
    size_t depth = 0;  // the deepest depth any draft was proposed at
    for (size_t d = 1; d < m.proposed_at_depth.size(); ++d) {
      if (m.proposed_at_depth[d] > 0) depth = d;
    }
    row.per_position_accept.resize(depth);
    row.verify_ct = m.verify_ct;
    row.metrics = m;
    for (size_t p = 0; p < run.outputs.size(); ++p) {
      row.prompts_differing += run.outputs[p] != runs[0].outputs[p] ? 1 : 0;
    }
    r.rows.push_back(std::move(row));
    measured.push_back({run.config, m});
  }
  double const plain = r.rows[0].decode_tokens_per_s;
  for (BenchRow& row : r.rows) {
    row.speedup = row.decode_tokens_per_s / plain;
    row.efficiency = row.accept_length > 0.0 ? row.speedup / row.accept_length : 0.0;
  }
  StepCosts costs;
  std::vector<Candidate> candidates;
  SPECDEC_RETURN_IF_ERROR(costs_from_runs(measured, &costs, &candidates));
  Advice advice;
  SPECDEC_RETURN_IF_ERROR(advise(costs, candidates, &advice));
  for (size_t i = 0; i < r.rows.size(); ++i) {
    r.rows[i].predicted_decode_tokens_per_s = advice.predictions[i].tokens_per_s;
  }
  r.speculating = advice.use;
  r.choice = advice.use ? advice.best : 0;
  r.summary = advice.summary;
  r.costs = costs;
  r.candidates = candidates;
  for (size_t i = 1; i < r.rows.size(); ++i) {
    if (r.rows[i].decode_tokens_per_s > r.rows[static_cast<size_t>(r.measured_best)]
                                            .decode_tokens_per_s) {
      r.measured_best = static_cast<int>(i);
    }
  }
  r.choice_vs_best = r.rows[static_cast<size_t>(r.choice)].decode_tokens_per_s /
                     r.rows[static_cast<size_t>(r.measured_best)].decode_tokens_per_s;
  r.choice_within_5_percent = r.choice_vs_best >= 0.95;
  *out = std::move(r);
  return Status::Ok();
}

inline Status plan_bench(std::span<BenchReport const> reports, BenchPlan* out) {
  if (out == nullptr) return Status::InvalidArgument("plan_bench: out is null");
  if (reports.empty()) return Status::InvalidArgument("plan_bench: no reports");
  BenchPlan p;
  BenchReport const& first = reports[0];
  if (!first.speculating) {
    p.summary = "no drafting plan: the advisor chose plain decoding at the smallest batch (" +
                std::to_string(first.setup.batch) + ")";
    *out = std::move(p);
    return Status::Ok();
  }
  Candidate const& chosen = first.candidates.at(static_cast<size_t>(first.choice));
  // Each batch size's costs, and the chosen configuration's own run there (when it ran).
  std::vector<std::pair<int, StepCosts>> by_batch;
  std::vector<std::optional<RunCosts>> own;
  for (BenchReport const& r : reports) {
    by_batch.emplace_back(r.setup.batch, r.costs);
    auto const same = std::find_if(r.candidates.begin(), r.candidates.end(), [&](auto const& c) {
      return describe(c.config) == describe(chosen.config);
    });
    own.push_back(same == r.candidates.end() ? std::nullopt : same->own);
  }
  SPECDEC_RETURN_IF_ERROR(plan_draft_steps(by_batch, chosen, &p.plan, own));
  p.planned = true;
  p.config = chosen.config;
  p.summary = "drafting plan for " + bench_name(p.config) +
              ": --speculative-draft-steps-by-batch " + format_draft_steps(p.plan.rules) + " (";
  for (size_t i = 0; i < p.plan.chosen.size(); ++i) {
    auto const& [batch, pred] = p.plan.chosen[i];
    char part[96];
    std::snprintf(part, sizeof part, "%sbatch %d: %d steps, predicted %.3fx", i ? "; " : "",
                  batch, pred.config.num_steps, pred.speedup);
    p.summary += part;
  }
  p.summary += ")";
  *out = std::move(p);
  return Status::Ok();
}

inline nlohmann::json bench_plan_json(BenchPlan const& p) {
  nlohmann::json chosen = nlohmann::json::array();
  for (auto const& [batch, pred] : p.plan.chosen) {
    chosen.push_back({{"batch", batch},
                      {"steps", pred.config.num_steps},
                      {"draft_tokens", pred.config.num_draft_tokens},
                      {"predicted_speedup", pred.speedup},
                      {"predicted_accept_length", pred.accept_length}});
  }
  return {{"planned", p.planned},
          {"config", p.planned ? bench_name(p.config) : "NONE"},
          {"draft_steps_by_batch", format_draft_steps(p.plan.rules)},
          {"by_batch", std::move(chosen)},
          {"summary", p.summary}};
}

inline std::string bench_table(BenchReport const& r) {
  if (r.rows.empty()) return "";  // not a summarize_bench report
  std::string out =
      "| config | accept length | per-position | decode tok/s | speedup | efficiency | "
      "predicted tok/s |\n|---|---:|---|---:|---:|---:|---:|\n";
  for (BenchRow const& row : r.rows) {
    std::string positions;
    for (double p : row.per_position_accept) {
      char v[16];
      std::snprintf(v, sizeof v, "%s%.2f", positions.empty() ? "" : " ", p);
      positions += v;
    }
    char line[256];
    std::snprintf(line, sizeof line, "| %s | %.3f | %s | %.1f | %.3f | %.3f | %.1f |\n",
                  row.name.c_str(), row.accept_length, positions.empty() ? "-" : positions.c_str(),
                  row.decode_tokens_per_s, row.speedup, row.efficiency,
                  row.predicted_decode_tokens_per_s);
    out += line;
  }
  return out;
}

inline nlohmann::json bench_json(BenchReport const& r) {
  if (r.rows.empty()) return nlohmann::json::object();  // not a summarize_bench report
  nlohmann::json configs = nlohmann::json::array();
  for (BenchRow const& row : r.rows) {
    SpecMetrics const& m = row.metrics;
    configs.push_back({{"name", row.name},
                       {"algorithm", row.config.algorithm},
                       {"steps", row.config.num_steps},
                       {"topk", row.config.eagle_topk},
                       {"draft_tokens", row.config.num_draft_tokens},
                       {"speculative_config", describe(row.config)},
                       {"decode_tokens_per_s", row.decode_tokens_per_s},
                       {"tokens_per_s", row.tokens_per_s},
                       {"speedup", row.speedup},
                       {"accept_length", row.accept_length},
                       {"accept_rate", row.accept_rate},
                       {"per_position_accept", row.per_position_accept},
                       {"efficiency", row.efficiency},
                       {"verify_ct", row.verify_ct},
                       {"time_s",
                        {{"prefill", m.prefill_s},
                         {"draft", m.draft_s},
                         {"build", m.build_s},
                         {"verify", m.verify_s},
                         {"commit", m.commit_s},
                         {"extend", m.extend_s}}},
                       {"same_tokens_as_plain", row.prompts_differing == 0},
                       {"prompts_differing_from_plain", row.prompts_differing},
                       {"predicted_decode_tokens_per_s", row.predicted_decode_tokens_per_s}});
  }
  BenchSetup const& s = r.setup;
  return {{"model_path", s.model_path},
          {"draft_path", s.draft_path},
          {"prompts_file", s.prompts_file},
          {"device", s.device},
          {"batch", s.batch},
          {"prompts", s.prompts},
          {"max_new_tokens", s.max_new_tokens},
          {"configs", std::move(configs)},
          {"advisor",
           {{"choice", r.rows[static_cast<size_t>(r.choice)].name},
            {"measured_best", r.rows[static_cast<size_t>(r.measured_best)].name},
            {"choice_vs_best", r.choice_vs_best},
            {"choice_within_5_percent", r.choice_within_5_percent},
            {"speculating", r.speculating},
            {"summary", r.summary}}}};
}

}  // namespace specdec::engine
