// SpecEngine<Policy, CpuExecutor> (engine/spec_engine.hpp) on the tiny random Kimi target, a
// random EAGLE-3 draft over its layers [0, 1, 2] and a random EAGLE-1/2 draft:
//   * lossless greedy: for a batch of mixed-length requests, every draft strategy and tree shape
//     (EAGLE-3 chains of 2..8 and top-k 2..8 trees up to 64 nodes, EAGLE-1/2 chains and trees up
//     to 32 nodes, n-gram chains and trees) gives
//     the output of plain decoding through the same engine, token for token, and that equals
//     kimi_generate's (an independent loop of prefill + decode);
//   * n-gram drafting on a repetitive continuation accepts more than one token per verify;
//   * sampling: a seed reproduces its output; greedy requests batched with a sampled one keep
//     their greedy output; the joint distribution of the first three sampled
//     tokens with speculation is the target's exact one (chi-square at p-value 1e-4), computed
//     from the target's logits (top-k 3, temperature 1);
//   * errors: a missing / superfluous draft, a draft whose layer order differs from the policy's,
//     an EAGLE-3 draft under EAGLE and the reverse, and every bad request field, by name.
#include "specdec/engine/spec_engine.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "specdec/engine/self_check.hpp"
#include "specdec/model/kimi/generate.hpp"
#include "support/chi_square.hpp"
#include "support/engine_cases.hpp"
#include "support/kimi_model.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

namespace {

using namespace specdec;
using engine::GenerationRequest;
using engine::GenerationResult;
using engine::SpecEngine;
using engine::SpecMetrics;
namespace kimi = specdec::model::kimi;
namespace eagle = specdec::model::eagle;

using testing::E3;
using testing::EG;
using testing::greedy_request;
using testing::NG;
using testing::Plain;
using testing::TinyLayers;

using testing::draft_for;

testing::TinyEngineModels const& models() { return testing::tiny_engine_models(); }

template <class P>
Status make_engine(SpecEngine<P, CpuExecutor>* e) {
  return SpecEngine<P, CpuExecutor>::create(&models().target, draft_for<P>(), {}, e);
}

template <class P>
std::vector<GenerationResult> run(std::vector<GenerationRequest> const& requests,
                                  SpecMetrics* total = nullptr) {
  return testing::run_engine<P, CpuExecutor>(&models().target, draft_for<P>(), requests, total);
}

std::vector<GenerationRequest> mixed_requests() {
  return testing::mixed_requests(static_cast<int>(models().tiny.config.vocab_size), true);
}

template <class P>
void check_lossless(std::vector<GenerationRequest> const& requests,
                    std::vector<GenerationResult> const& want) {
  CAPTURE(describe<P>());
  SpecMetrics total;
  auto const got = run<P>(requests, &total);
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    CHECK(got[r].output_ids == want[r].output_ids);
    CHECK(got[r].stopped_at_eos == want[r].stopped_at_eos);
    SpecMetrics const& m = got[r].metrics;
    CHECK(m.verify_ct >= 1);
    // The outputs after the first came from verifies, each at least one.
    CHECK(m.committed == static_cast<int64_t>(got[r].output_ids.size()) - 1);
    CHECK(m.accept_length() >= 1.0);
    CHECK(m.per_position_accept().size() ==
          static_cast<size_t>(SpecEngine<P, CpuExecutor>::kPathCapacity - 1));
    if constexpr (SpecEngine<P, CpuExecutor>::kDraftsWithModel) {
      CHECK(m.proposed() == m.verify_ct * (P::kNodes - 1));  // a full tree every step
    }
  }
  MESSAGE(describe<P>() << ": accept length " << total.accept_length() << ", accept rate "
                        << total.accept_rate());
}

TEST_CASE("engine: plain decoding through the engine equals kimi_generate") {
  auto const& m = models();
  auto const requests = mixed_requests();
  auto const want = run<Plain>(requests);
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    kimi::GenerateOptions o;
    o.max_new_tokens = requests[r].max_new_tokens;
    o.stop_at_eos = requests[r].stop_at_eos;
    kimi::GenerateResult g;
    Status const s =
        kimi::kimi_generate(CpuExecutor{}, m.target, m.tiny.config, requests[r].prompt, o, &g);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    CHECK(want[r].output_ids == g.output_ids);
    CHECK(want[r].metrics.accept_length() == doctest::Approx(1.0));
    CHECK(want[r].metrics.proposed() == 0);
  }
}

TEST_CASE("engine: greedy output with every draft equals plain decoding") {
  auto const requests = mixed_requests();
  auto const want = run<Plain>(requests);
  check_lossless<E3<Chain<2>>>(requests, want);
  check_lossless<E3<Chain<4>>>(requests, want);
  check_lossless<E3<Chain<8>>>(requests, want);
  check_lossless<E3<TreeShape<2, 4, 8>>>(requests, want);
  check_lossless<E3<TreeShape<4, 3, 16>>>(requests, want);
  check_lossless<E3<TreeShape<8, 3, 64>>>(requests, want);
  check_lossless<EG<Chain<3>>>(requests, want);
  check_lossless<EG<Chain<6>>>(requests, want);
  check_lossless<EG<TreeShape<4, 3, 16>>>(requests, want);
  check_lossless<EG<TreeShape<8, 2, 32>>>(requests, want);
  check_lossless<NG<Chain<2>>>(requests, want);
  check_lossless<NG<Chain<5>>>(requests, want);
  check_lossless<NG<TreeShape<4, 2, 8>>>(requests, want);
}

// A stop id ends a request at its first occurrence, also inside a speculative step's accepted
// path (ops::commit_tokens), and the request's output is plain decoding's cut there.
template <class P>
void check_stop_id(std::vector<GenerationRequest> const& requests,
                   std::vector<GenerationResult> const& plain, size_t r, int32_t stop) {
  CAPTURE(describe<P>());
  auto const got = run<P>(requests);
  std::vector<int32_t> const& full = plain[r].output_ids;
  auto const first = std::find(full.begin(), full.end(), stop);
  REQUIRE(first != full.end());
  CHECK(got[r].output_ids == std::vector<int32_t>(full.begin(), first + 1));
  CHECK(got[r].finish_reason == engine::FinishReason::kStopId);
  CHECK(got[r].metrics.committed == static_cast<int64_t>(got[r].output_ids.size()) - 1);
}

TEST_CASE("engine: a stop id ends a request at its first occurrence, with every draft") {
  auto requests = mixed_requests();
  auto const plain = run<Plain>(requests);
  REQUIRE(plain[2].output_ids.size() > 10);
  int32_t const stop = plain[2].output_ids[9];
  requests[2].stop_ids = {stop};
  check_stop_id<Plain>(requests, plain, 2, stop);
  check_stop_id<E3<Chain<4>>>(requests, plain, 2, stop);
  check_stop_id<E3<TreeShape<4, 3, 16>>>(requests, plain, 2, stop);
  check_stop_id<NG<Chain<5>>>(requests, plain, 2, stop);
}

TEST_CASE("engine: n-gram drafting accepts several tokens per verify on repetitive text") {
  // Greedy decoding of the random target drifts into repeats ("217 217 217 ...", recurring
  // runs of 5-6 tokens) within 200 tokens, which prompt lookup then drafts.
  GenerationRequest const r = greedy_request({7, 8, 9}, 200);
  auto const plain = run<Plain>({r});
  SpecMetrics total;
  auto const got = run<NG<Chain<4>>>({r}, &total);
  CHECK(got[0].output_ids == plain[0].output_ids);
  MESSAGE("n-gram chain 4: accept length " << total.accept_length() << " over " << total.verify_ct
                                           << " verifies");
  CHECK(total.accept_length() > 1.0);
  CHECK(total.verify_ct < plain[0].metrics.verify_ct);
}

TEST_CASE("engine: greedy requests keep their output in a batch with sampled ones") {
  // A sampled request makes the batch verify with verify_sample, whose rule for a greedy request
  // is greedy verification.
  auto const want = run<Plain>(mixed_requests());
  auto requests = mixed_requests();
  requests[1].temperature = 0.9f;
  requests[1].top_k = 40;
  requests[1].seed = 3;
  auto const tree = run<E3<TreeShape<4, 3, 16>>>(requests);
  auto const chain = run<NG<Chain<5>>>(requests);
  for (size_t r : {size_t{0}, size_t{2}}) {
    CAPTURE(r);
    CHECK(tree[r].output_ids == want[r].output_ids);
    CHECK(chain[r].output_ids == want[r].output_ids);
  }
  CHECK(tree[1].output_ids.size() == 13);
}

TEST_CASE("engine: a seed reproduces sampled output") {
  auto requests = mixed_requests();
  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].temperature = 0.8f;
    requests[r].top_p = 0.9f;
    requests[r].seed = 100 + r;
  }
  auto const a = run<E3<TreeShape<4, 3, 16>>>(requests);
  auto const b = run<E3<TreeShape<4, 3, 16>>>(requests);
  for (size_t r = 0; r < requests.size(); ++r) CHECK(a[r].output_ids == b[r].output_ids);
  for (auto& q : requests) q.seed += 1000;
  auto const c = run<E3<TreeShape<4, 3, 16>>>(requests);
  bool differs = false;
  for (size_t r = 0; r < requests.size(); ++r)
    differs = differs || a[r].output_ids != c[r].output_ids;
  CHECK(differs);
}

// The first three sampled tokens of SpecEngine<P, CpuExecutor> against the target's exact
// distribution (testing::check_three_token_distribution).
template <class P>
void check_three_token_distribution(GenerationRequest const& base, int draws) {
  testing::check_three_token_distribution<P, CpuExecutor>(models().target, &models().target,
                                                          draft_for<P>(), base, draws);
}

TEST_CASE("engine: sampled speculation keeps the target's distribution of three tokens") {
  // A prompt ending where greedy decoding repeats a token: the 48 tokens of the prompt and its
  // greedy continuation up to the second of three equal tokens, so the likely next tokens already
  // followed the last one in the text (n-gram drafts that get accepted).
  auto const greedy = run<Plain>({greedy_request({7, 8, 9}, 200)})[0].output_ids;
  size_t i = 1;
  while (i + 1 < greedy.size() && !(greedy[i - 1] == greedy[i] && greedy[i] == greedy[i + 1])) ++i;
  REQUIRE_MESSAGE(i + 1 < greedy.size(), "the target never repeats a token three times");
  REQUIRE(i >= 47);
  auto const end = greedy.begin() + static_cast<int64_t>(i) + 1;
  GenerationRequest base = greedy_request(std::vector<int32_t>(end - 48, end), 3);
  base.temperature = 1.0f;
  base.top_k = 3;
  check_three_token_distribution<Plain>(base, 3000);
  check_three_token_distribution<NG<Chain<3>>>(base, 3000);
  check_three_token_distribution<E3<TreeShape<2, 2, 4>>>(base, 3000);
  check_three_token_distribution<EG<Chain<2>>>(base, 3000);
}

TEST_CASE("engine: the draft model must match the policy") {
  auto const& m = models();
  SpecEngine<E3<Chain<3>>, CpuExecutor> e3;
  testing::check_error(SpecEngine<E3<Chain<3>>, CpuExecutor>::create(&m.target, nullptr, {}, &e3),
                       StatusCode::kInvalidArgument, {"EAGLE3 needs a draft model"});
  SpecEngine<NG<Chain<3>>, CpuExecutor> ng;
  testing::check_error(SpecEngine<NG<Chain<3>>, CpuExecutor>::create(&m.target, &m.draft, {}, &ng),
                       StatusCode::kInvalidArgument, {"NGRAM takes no draft model"});
  using Reordered = SpecPolicy<Eagle3, Layers<2, 1, 0>, Chain<3>, Eager>;
  SpecEngine<Reordered, CpuExecutor> re;
  testing::check_error(SpecEngine<Reordered, CpuExecutor>::create(&m.target, &m.draft, {}, &re),
                       StatusCode::kInvalidArgument, {"[0,1,2]", "[2,1,0]", "different order"});
  // An EAGLE-3 draft served as EAGLE, and the reverse.
  SpecEngine<EG<Chain<3>>, CpuExecutor> e1;
  testing::check_error(SpecEngine<EG<Chain<3>>, CpuExecutor>::create(&m.target, nullptr, {}, &e1),
                       StatusCode::kInvalidArgument, {"EAGLE needs a draft model"});
  testing::check_error(SpecEngine<EG<Chain<3>>, CpuExecutor>::create(&m.target, &m.draft, {}, &e1),
                       StatusCode::kInvalidArgument, {"EAGLE3"});
  testing::check_error(SpecEngine<E3<Chain<3>>, CpuExecutor>::create(&m.target, &m.draft1, {}, &e3),
                       StatusCode::kInvalidArgument, {"EAGLE"});
}

TEST_CASE("engine: bad requests are refused by name") {
  SpecEngine<NG<Chain<3>>, CpuExecutor> e;
  REQUIRE(make_engine(&e).ok());
  // A request of `prompt` and `max_new_tokens`, the rest defaulted.
  auto request = [](std::vector<int32_t> prompt, int max_new_tokens) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = max_new_tokens;
    return r;
  };
  auto refuse = [&](GenerationRequest const& r, std::vector<std::string> const& parts) {
    std::vector<GenerationResult> out;
    std::vector<GenerationRequest> const two{request({1, 2}, 4), r};
    testing::check_error(e.generate(two, &out, nullptr), StatusCode::kInvalidArgument, parts);
  };
  refuse(request({}, 4), {"request 1", "prompt", "empty"});
  refuse(request({1, 512}, 4), {"request 1", "input id 512", "vocabulary"});
  refuse(request({1, 2}, 0), {"request 1", "max_new_tokens 0"});
  GenerationRequest hot = request({1, 2}, 4);
  hot.temperature = -1.0f;
  refuse(hot, {"request 1", "temperature"});
  GenerationRequest nucleus = request({1, 2}, 4);
  nucleus.top_p = 0.0f;
  refuse(nucleus, {"request 1", "top_p 0", "(0, 1]"});
  GenerationRequest cold = request({1, 2}, 4);
  cold.temperature = 1e-30f;  // 1 / T would overflow the scaled logits
  refuse(cold, {"request 1", "temperature 1e-30", ">= 1e-06"});
  GenerationRequest fewest = request({1, 2}, 4);
  fewest.top_k = -5;
  refuse(fewest, {"request 1", "top_k -5 < -1"});
  GenerationRequest const longer = request(std::vector<int32_t>(200, 1), 54);
  refuse(longer, {"request 1", "speculative positions", "max_position_embeddings 256"});
  std::vector<GenerationResult> out;
  testing::check_error(e.generate({}, &out, nullptr), StatusCode::kInvalidArgument,
                       {"no requests"});
}

TEST_CASE("engine: the self-check warns when nothing is accepted, naming the causes") {
  SpecMetrics none;
  none.record_verify({1, 2, 3}, 0, 1);
  std::string const w = engine::self_check_warning(DraftKind::kEagle3, none);
  CHECK(testing::contains(w, "accept length 1.0"));
  CHECK(testing::contains(w, "layer set"));
  CHECK(testing::contains(w, "EAGLE-3 draft run as EAGLE"));
  CHECK(testing::contains(w, "d2t"));
  SpecMetrics some = none;
  some.record_verify({1, 2, 3}, 2, 3);
  CHECK(engine::self_check_warning(DraftKind::kEagle3, some).empty());
  CHECK(engine::self_check_warning(DraftKind::kNone, none).empty());
  // On the built-in prompt through a real engine: a random draft for a random target.
  SpecEngine<E3<Chain<3>>, CpuExecutor> e;
  REQUIRE(make_engine(&e).ok());
  engine::SelfCheckReport report;
  Status const s = engine::self_check(e, models().tiny.config.vocab_size, &report);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(report.metrics.verify_ct >= 1);
  CHECK(report.warning.empty() == (report.metrics.accept_length() > 1.0));
}

TEST_CASE("metrics: accept length, rate and per-position acceptance") {
  SpecMetrics m;
  m.record_verify({1, 2, 3}, 3, 4);  // a chain of 3, all accepted: 4 tokens
  m.record_verify({1, 2, 3}, 1, 2);  // 2 tokens
  m.record_verify({1, 1, 2}, 0, 1);  // a tree, nothing accepted: 1 token
  CHECK(m.verify_ct == 3);
  CHECK(m.committed == 7);
  CHECK(m.accept_length() == doctest::Approx(7.0 / 3.0));
  CHECK(m.proposed() == 9);
  CHECK(m.accepted() == 4);
  CHECK(m.accept_rate() == doctest::Approx(4.0 / 9.0));
  auto const per = m.per_position_accept();
  REQUIRE(per.size() == 3);
  CHECK(per[0] == doctest::Approx(2.0 / 3.0));
  CHECK(per[1] == doctest::Approx(1.0 / 3.0));
  CHECK(per[2] == doctest::Approx(1.0 / 3.0));
  SpecMetrics sum;
  sum.merge(m);
  sum.merge(m);
  CHECK(sum.committed == 14);
  CHECK(sum.accept_length() == doctest::Approx(7.0 / 3.0));
}

}  // namespace
