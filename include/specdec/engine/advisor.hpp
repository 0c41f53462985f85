// The speculation advisor: from measured acceptance and measured step costs, the predicted decode
// throughput of each speculative configuration, and the best of them, or none when no
// configuration is predicted to beat plain decoding.
//
//   CostCurve{{{n, seconds}, ...}}      a cost measured at a few sizes (nodes of a verify, rows of
//                                       a draft step); at(n) is piecewise linear between the
//                                       points and follows the last two points' slope beyond
//                                       them (the first two below), never below 0; one point is
//                                       a constant
//   expected_accept_length(p, depth)    tokens a verify commits, bonus included, for a draft chain
//                                       of `depth` steps, from p = SpecMetrics::
//                                       per_position_accept() measured on a chain of any depth D:
//                                       1 + sum_{d <= depth} p_d. Past D the conditional rate
//                                       p_D / p_{D-1} (p_0 = 1) is taken to hold (a geometric
//                                       tail: an assumption, said in the prediction)
//   StepCosts{plain_step_s, verify, draft_step, overhead_s}
//                                       at one batch size: the plain decode step; verify(nodes)
//                                       per request; draft_step(rows) one draft step over `rows`
//                                       rows per request (a chain drafts 1 row per step, a top-k
//                                       tree k); overhead_s the rest of a speculative step
//                                       (build, accept + commit, draft extend)
//   predict(costs, candidate)           one configuration: accept length, seconds per step,
//                                       tokens per second, speedup over plain decoding; a
//                                       candidate with its own run's costs (candidate.own) is
//                                       timed by them, any other by the cost curves
//   advise(costs, candidates, &advice)  every candidate predicted, the best chosen; advice.use
//                                       false (draft nothing) when the best speedup is below
//                                       min_speedup, with the reason in advice.summary
//   costs_from_runs(runs, &costs, &candidates)
//                                       StepCosts and candidates from measured runs (e.g. a short
//                                       generate of each compiled configuration: what
//                                       `specdec-kimi generate --speculative-config auto` does),
//                                       one of them plain (steps 0): plain_step_s is its seconds
//                                       per verify (draft + build + verify + commit + extend);
//                                       verify(n) each run's verify seconds per verify at its
//                                       nodes (the plain run at 1; runs of equal nodes averaged);
//                                       draft_step(rows) each speculative run's draft seconds per
//                                       verify / steps at rows = topk (averaged per topk);
//                                       overhead_s the speculative runs' build + commit + extend
//                                       per verify, averaged; each candidate's acceptance and
//                                       step costs (own: draft, verify and the rest per verify)
//                                       its own run's. Averaged curves misjudge configurations
//                                       whose costs do not scale as the curves assume (on the
//                                       H200 demo, 2026-12-01/02, chain 1 predicted 7% slow and
//                                       chain 4 8.5% fast: the advisor chose chain 4 at 0.90 to
//                                       0.96 of the best), so a measured configuration is
//                                       predicted from what it measured
//   plan_draft_steps(costs_by_batch, policy, &plan[, policy_own])
//                                       the drafting depth by batch size for one tree (policy:
//                                       its config and measured acceptance): at each measured
//                                       batch size every depth d in [0, steps] predicted (d = 0
//                                       plain decoding; else the tree cut to d steps, draft_
//                                       nodes_at nodes, the policy's acceptance to depth d: exact
//                                       for a chain, an estimate for a top-k tree, whose cut
//                                       keeps other nodes than the full tree's first d levels), the
//                                       fastest chosen (ties: the shallower); plan.rules the
//                                       engine's EngineOptions::draft_steps_by_batch (a rule at
//                                       the first batch size and wherever the choice changes),
//                                       plan.chosen the prediction chosen at each batch size. A
//                                       depth is timed by the curves, or, where policy_own (one
//                                       entry per batch size) holds the policy's own run at that
//                                       batch size, by that run cut to d steps: d / steps of its
//                                       draft, its whole rest of the step (the same compiled tree
//                                       commits and extends alike at any depth), its verify at
//                                       d = steps and the verify curve below
// A candidate's acceptance is a chain's (`per_position_accept` of any chain serves every chain
// depth) or, for a top-k tree, the acceptance measured with that tree, to the depth measured
// (its steps for an EAGLE tree; an n-gram tree's continuations reach nodes - 1 deep).
// A speculative step: its own run's draft + verify + rest (candidate.own), or else steps x
// draft_step(rows) + verify(nodes) + overhead_s, committing the accept length; plain decoding
// commits 1 token per plain_step_s.
// Errors (Status, naming the field): an empty or unsorted cost curve, a negative or non-finite
// cost or rate, acceptance rates outside [0, 1] or rising with depth, a speculative candidate
// with topk < 1 or fewer than 2 nodes, no candidates. Whether steps / topk / nodes make a
// compiled tree is the policies' check (policy/spec_policy.hpp), not repeated here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/engine/draft_steps.hpp"
#include "specdec/engine/metrics.hpp"
#include "specdec/policy/spec_policy.hpp"

namespace specdec::engine {

struct CostCurve {
  std::vector<std::pair<int, double>> points;  // (size, seconds), sizes strictly increasing

  Status check(std::string const& what) const {
    if (points.empty()) return Status::InvalidArgument(what + ": no measured point");
    for (size_t i = 0; i < points.size(); ++i) {
      auto const [n, s] = points[i];
      if (n < 1 || !std::isfinite(s) || s < 0.0) {
        return Status::InvalidArgument(what + ": point (" + std::to_string(n) + ", " +
                                       std::to_string(s) +
                                       "): sizes must be >= 1 and seconds finite, >= 0");
      }
      if (i > 0 && n <= points[i - 1].first) {
        return Status::InvalidArgument(what + ": sizes must increase, got " +
                                       std::to_string(points[i - 1].first) + " then " +
                                       std::to_string(n));
      }
    }
    return Status::Ok();
  }

  // Piecewise linear through the points; the end segments extended; >= 0.
  double at(int n) const {
    if (points.size() == 1) return points[0].second;
    size_t i = 1;
    while (i + 1 < points.size() && points[i].first < n) ++i;
    auto const [n0, s0] = points[i - 1];
    auto const [n1, s1] = points[i];
    double const slope = (s1 - s0) / static_cast<double>(n1 - n0);
    return std::max(0.0, s0 + slope * static_cast<double>(n - n0));
  }
};

struct StepCosts {
  double plain_step_s = 0.0;
  CostCurve verify;      // per verify of `nodes` nodes (root included)
  CostCurve draft_step;  // per draft step over `rows` rows
  double overhead_s = 0.0;
};

// A configuration's own measured costs, in seconds per verify: its draft phase, its verify
// forward, and the rest of its step (build + accept + commit + draft extend).
struct RunCosts {
  double draft_s = 0.0, verify_s = 0.0, overhead_s = 0.0;
};

struct Candidate {
  SpecConfig config;                        // algorithm, num_steps, eagle_topk, num_draft_tokens
  std::vector<double> per_position_accept;  // SpecMetrics::per_position_accept()
  std::optional<RunCosts> own = std::nullopt;  // measured with this config (costs_from_runs)
};

struct Prediction {
  SpecConfig config;
  double accept_length = 1.0;
  double step_s = 0.0;
  double tokens_per_s = 0.0;
  double speedup = 1.0;        // tokens_per_s x plain_step_s
  bool extrapolated = false;   // acceptance past the measured depth (the geometric tail)
  bool own_costs = false;      // timed by the candidate's own run, not the cost curves
};

struct Advice {
  std::vector<Prediction> predictions;  // one per candidate, in the candidates' order
  int best = -1;                        // index of the highest tokens_per_s
  bool use = false;                     // speculate with predictions[best]
  std::string summary;                  // one line for the log
};

// Checks p: rates in [0, 1], non-increasing with depth (a path reaches depth d only through d-1).
inline Status check_acceptance(std::vector<double> const& p, std::string const& what) {
  for (size_t d = 0; d < p.size(); ++d) {
    if (!std::isfinite(p[d]) || p[d] < 0.0 || p[d] > 1.0) {
      return Status::InvalidArgument(what + ": per_position_accept[" + std::to_string(d) + "] = " +
                                     std::to_string(p[d]) + " is not a rate in [0, 1]");
    }
    if (d > 0 && p[d] > p[d - 1] + 1e-12) {
      return Status::InvalidArgument(what + ": per_position_accept rises from " +
                                     std::to_string(p[d - 1]) + " at depth " + std::to_string(d) +
                                     " to " + std::to_string(p[d]) + " at depth " +
                                     std::to_string(d + 1) +
                                     " (a path reaches a depth only through the one before)");
    }
  }
  return Status::Ok();
}

// 1 + sum_{d <= depth} p_d, p extended past its end by its last conditional rate; *extrapolated
// (when given) says whether that tail was used.
inline double expected_accept_length(std::vector<double> const& p, int depth,
                                     bool* extrapolated = nullptr) {
  double length = 1.0, reach = 1.0;
  double const tail = p.empty() ? 0.0
                      : p.size() == 1 ? p[0]
                      : p[p.size() - 2] > 0.0 ? p.back() / p[p.size() - 2]
                                              : 0.0;
  if (extrapolated) *extrapolated = depth > static_cast<int>(p.size());
  for (int d = 0; d < depth; ++d) {
    reach = d < static_cast<int>(p.size()) ? p[static_cast<size_t>(d)] : reach * tail;
    length += reach;
  }
  return length;
}

inline Status predict(StepCosts const& costs, Candidate const& c, Prediction* out) {
  std::string const what = "advisor (" + describe(c.config) + ")";
  if (!std::isfinite(costs.plain_step_s) || costs.plain_step_s <= 0.0 ||
      !std::isfinite(costs.overhead_s) || costs.overhead_s < 0.0) {
    return Status::InvalidArgument(what + ": plain_step_s " + std::to_string(costs.plain_step_s) +
                                   " must be > 0 and overhead_s " +
                                   std::to_string(costs.overhead_s) + " >= 0");
  }
  SPECDEC_RETURN_IF_ERROR(costs.verify.check(what + ": verify costs"));
  SpecConfig const& s = c.config;
  Prediction p;
  p.config = s;
  if (s.num_steps == 0) {  // plain decoding
    p.step_s = costs.plain_step_s;
  } else {
    if (s.num_steps < 0 || s.eagle_topk < 1 || s.num_draft_tokens < 2) {
      return Status::InvalidArgument(what + ": steps " + std::to_string(s.num_steps) + ", topk " +
                                     std::to_string(s.eagle_topk) + ", nodes " +
                                     std::to_string(s.num_draft_tokens) +
                                     " do not describe a draft tree");
    }
    SPECDEC_RETURN_IF_ERROR(check_acceptance(c.per_position_accept, what));
    if (!c.own) SPECDEC_RETURN_IF_ERROR(costs.draft_step.check(what + ": draft step costs"));
    // A chain's acceptance serves any chain depth; a tree's is its own, to the depth measured
    // (an n-gram tree's continuations reach past its steps: nodes - 1 deep).
    int const depth = s.eagle_topk > 1
                          ? std::max(s.num_steps, static_cast<int>(c.per_position_accept.size()))
                          : s.num_steps;
    p.accept_length = expected_accept_length(c.per_position_accept, depth, &p.extrapolated);
    if (c.own) {
      RunCosts const& o = *c.own;
      for (double v : {o.draft_s, o.verify_s, o.overhead_s}) {
        if (!std::isfinite(v) || v < 0.0) {
          return Status::InvalidArgument(what + ": its own run's costs (draft " +
                                         std::to_string(o.draft_s) + ", verify " +
                                         std::to_string(o.verify_s) + ", rest " +
                                         std::to_string(o.overhead_s) +
                                         " s per verify) must be finite and >= 0");
        }
      }
      p.step_s = o.draft_s + o.verify_s + o.overhead_s;
      p.own_costs = true;
    } else {
      p.step_s = s.num_steps * costs.draft_step.at(s.eagle_topk) +
                 costs.verify.at(s.num_draft_tokens) + costs.overhead_s;
    }
  }
  if (p.step_s <= 0.0) return Status::InvalidArgument(what + ": a step predicted to take 0 s");
  p.tokens_per_s = p.accept_length / p.step_s;
  p.speedup = p.tokens_per_s * costs.plain_step_s;
  *out = p;
  return Status::Ok();
}

// min_speedup: the best candidate must be predicted at least this much faster than plain
// decoding to be used (1.0: any gain).
inline Status advise(StepCosts const& costs, std::vector<Candidate> const& candidates,
                     Advice* out, double min_speedup = 1.0) {
  if (out == nullptr) return Status::InvalidArgument("advise: out is null");
  if (candidates.empty()) return Status::InvalidArgument("advise: no candidate configuration");
  Advice a;
  for (Candidate const& c : candidates) {
    Prediction p;
    SPECDEC_RETURN_IF_ERROR(predict(costs, c, &p));
    a.predictions.push_back(p);
    int const i = static_cast<int>(a.predictions.size()) - 1;
    if (a.best < 0 || p.tokens_per_s > a.predictions[static_cast<size_t>(a.best)].tokens_per_s) {
      a.best = i;
    }
  }
  Prediction const& b = a.predictions[static_cast<size_t>(a.best)];
  a.use = b.config.num_steps > 0 && b.speedup >= min_speedup;
  char line[160];
  std::snprintf(line, sizeof line, "predicted %.3fx over plain decoding (accept length %.3f, %.3f ms "
                "per step%s)", b.speedup, b.accept_length, 1e3 * b.step_s,
                b.extrapolated ? ", acceptance extrapolated past the measured depth" : "");
  a.summary = a.use ? "speculating with " + describe(b.config) + ": " + line
                    : "not speculating: no configuration is predicted to beat plain decoding" +
                          (min_speedup > 1.0 ? " by " + std::to_string(min_speedup) + "x" : "") +
                          " (best: " + describe(b.config) + ", " + line + ")";
  *out = std::move(a);
  return Status::Ok();
}

// One configuration measured: its flags and the metrics of a run with them.
struct MeasuredRun {
  SpecConfig config;
  SpecMetrics metrics;
};

inline Status costs_from_runs(std::span<MeasuredRun const> runs, StepCosts* costs,
                              std::vector<Candidate>* candidates) {
  if (costs == nullptr || candidates == nullptr) {
    return Status::InvalidArgument("costs_from_runs: costs and candidates must not be null");
  }
  StepCosts c;
  std::vector<Candidate> out;
  std::map<int, std::pair<double, int>> verify, draft;  // size -> (sum of seconds, count)
  double overhead = 0.0;
  int plain = 0, speculative = 0;
  for (MeasuredRun const& r : runs) {
    SpecMetrics const& m = r.metrics;
    std::string const what = "costs_from_runs (" + describe(r.config) + ")";
    if (m.verify_ct < 1) return Status::InvalidArgument(what + ": the run made no verify");
    double const n = static_cast<double>(m.verify_ct);
    auto add = [](std::map<int, std::pair<double, int>>& curve, int size, double s) {
      curve[size].first += s;
      curve[size].second += 1;
    };
    Candidate candidate{r.config, m.per_position_accept(), std::nullopt};
    if (r.config.num_steps == 0) {
      if (++plain > 1) return Status::InvalidArgument(what + ": a second plain run");
      c.plain_step_s = (m.draft_s + m.build_s + m.verify_s + m.commit_s + m.extend_s) / n;
      add(verify, 1, m.verify_s / n);
    } else {
      ++speculative;
      RunCosts const own{m.draft_s / n, m.verify_s / n, (m.build_s + m.commit_s + m.extend_s) / n};
      add(verify, r.config.num_draft_tokens, own.verify_s);
      add(draft, r.config.eagle_topk, own.draft_s / r.config.num_steps);
      overhead += own.overhead_s;
      candidate.own = own;
    }
    out.push_back(std::move(candidate));
  }
  if (plain != 1) {
    return Status::InvalidArgument("costs_from_runs: needs exactly one plain run (steps 0), the "
                                   "baseline; got " + std::to_string(plain));
  }
  if (speculative < 1) {
    return Status::InvalidArgument("costs_from_runs: no speculative run to predict");
  }
  for (auto const& [size, sum] : verify) c.verify.points.emplace_back(size, sum.first / sum.second);
  for (auto const& [size, sum] : draft) {
    c.draft_step.points.emplace_back(size, sum.first / sum.second);
  }
  c.overhead_s = overhead / speculative;
  *costs = std::move(c);
  *candidates = std::move(out);
  return Status::Ok();
}

struct DraftStepsPlan {
  std::vector<DraftStepsRule> rules;
  std::vector<std::pair<int, Prediction>> chosen;  // (batch size, its chosen depth's prediction)
};

inline Status plan_draft_steps(std::span<std::pair<int, StepCosts> const> costs_by_batch,
                               Candidate const& policy, DraftStepsPlan* out,
                               std::span<std::optional<RunCosts> const> policy_own = {}) {
  if (out == nullptr) return Status::InvalidArgument("plan_draft_steps: out is null");
  if (!policy_own.empty() && policy_own.size() != costs_by_batch.size()) {
    return Status::InvalidArgument("plan_draft_steps: policy_own has " +
                                   std::to_string(policy_own.size()) + " entries for " +
                                   std::to_string(costs_by_batch.size()) +
                                   " batch sizes (one per batch size, or none)");
  }
  SpecConfig const& s = policy.config;
  if (s.num_steps < 1) {
    return Status::InvalidArgument("plan_draft_steps: " + describe(s) +
                                   " drafts nothing: there is no depth to plan");
  }
  if (costs_by_batch.empty()) {
    return Status::InvalidArgument("plan_draft_steps: no batch size measured");
  }
  DraftStepsPlan plan;
  for (size_t i = 0; i < costs_by_batch.size(); ++i) {
    auto const& [batch, costs] = costs_by_batch[i];
    if (batch < 1 || (i > 0 && batch <= costs_by_batch[i - 1].first)) {
      return Status::InvalidArgument("plan_draft_steps: batch sizes must be >= 1 and increase, "
                                     "got " + std::to_string(batch));
    }
    Prediction best;
    int best_depth = -1;
    for (int d = 0; d <= s.num_steps; ++d) {
      Candidate c = policy;
      c.own.reset();
      c.config.num_steps = d;
      c.config.num_draft_tokens = draft_nodes_at(s.eagle_topk, s.num_steps, s.num_draft_tokens, d);
      std::optional<RunCosts> const own = policy_own.empty() ? std::nullopt : policy_own[i];
      if (own && d > 0) {  // the policy's own run at this batch size, cut to d steps
        double const verify =
            d == s.num_steps ? own->verify_s : costs.verify.at(c.config.num_draft_tokens);
        c.own = RunCosts{own->draft_s * d / s.num_steps, verify, own->overhead_s};
      }
      if (d == 0) c.config.eagle_topk = 0;
      if (c.per_position_accept.size() > static_cast<size_t>(d)) {
        c.per_position_accept.resize(static_cast<size_t>(d));
      }
      Prediction p;
      SPECDEC_RETURN_IF_ERROR(predict(costs, c, &p).prefixed("at batch " + std::to_string(batch) +
                                                            ": "));
      if (best_depth < 0 || p.tokens_per_s > best.tokens_per_s) {
        best = p;
        best_depth = d;
      }
    }
    plan.chosen.emplace_back(batch, best);
    if (plan.rules.empty() || plan.rules.back().steps != best_depth) {
      plan.rules.push_back(DraftStepsRule{batch, best_depth});
    }
  }
  *out = std::move(plan);
  return Status::Ok();
}

}  // namespace specdec::engine
