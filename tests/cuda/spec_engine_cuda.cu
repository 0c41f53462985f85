// SpecEngine<Policy, CudaExecutor> (engine/spec_engine.hpp + engine/target_cuda.cuh) on the tiny
// random target on the GPU, with the random EAGLE-3 draft over layers [0, 1, 2] on the host:
//   * plain decoding through the CUDA engine gives kimi_generate's tokens on the CUDA executor;
//   * greedy speculation (n-gram chain and tree, EAGLE-3 chain and trees) gives the CUDA engine's
//     plain output for a batch of mixed requests, except where the two part at a near-tie: the
//     verify forward runs N tokens per request where plain decoding runs 1, so the bf16 GEMMs
//     round differently and a routing or argmax choice within that rounding may flip (as in
//     cuda.kimi_forward_cuda: the fp32 CPU executor's top-2 logit gap at the parting step must be
//     within 2e-2 of its largest |logit|);
//   * the n-gram chain accepts more than one token per verify on the repetitive 200-token run;
//   * the CUDA engine's sampled output is reproducible from its seeds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/engine/spec_engine.hpp"
#include "specdec/model/kimi/forward_cuda.cuh"
#include "specdec/model/kimi/generate.hpp"
#include "support/engine_cases.hpp"
#include "support/kimi_model.hpp"
#include "support/testing.hpp"

namespace {

using namespace specdec;
using engine::GenerationRequest;
using engine::GenerationResult;
using engine::SpecEngine;
using engine::SpecMetrics;
namespace kimi = specdec::model::kimi;
namespace eagle3 = specdec::model::eagle3;

constexpr double kLogitTol = 2e-2;

using testing::E3;
using testing::greedy_request;
using testing::NG;
using testing::Plain;
using testing::TinyLayers;

struct Models {
  testing::TempDir tmp;
  testing::TinyKimi tiny;
  kimi::KimiCpuModel cpu;  // the near-tie oracle, and the draft's shared embedding
  kimi::KimiCudaModel gpu;
  eagle3::Eagle3CpuModel draft;
};

Models& models() {
  static Models m;
  static bool const loaded = [] {
    testing::load_tiny_kimi(m.tmp.path / "target", /*int4=*/false, /*seed=*/11, &m.tiny);
    Status s = kimi::load_kimi_cpu_model(m.tiny.weights, m.tiny.config, &m.cpu);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    s = kimi::load_kimi_cuda_model(m.tiny.weights, m.tiny.config, &m.gpu);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    testing::load_tiny_draft(m.tmp.path / "draft", m.tiny.config, m.cpu.embed_tokens.data(),
                             &m.draft);
    return true;
  }();
  (void)loaded;
  return m;
}

template <class P>
std::vector<GenerationResult> run(std::vector<GenerationRequest> const& requests,
                                  SpecMetrics* total = nullptr) {
  return testing::run_engine<P, CudaExecutor>(&models().gpu, &models().draft, requests, total);
}

// want and got agree, or part at a step where the fp32 CPU executor's top-2 gap is a near-tie.
void check_same_or_near_tie(std::vector<int32_t> const& prompt, std::vector<int32_t> const& want,
                            std::vector<int32_t> const& got) {
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  if (k == want.size() && k == got.size()) return;
  REQUIRE(k < want.size());
  REQUIRE(k < got.size());
  Models& m = models();
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), want.begin(), want.begin() + static_cast<int64_t>(k));
  std::vector<float> row = testing::last_logits_cpu(m.cpu, context);
  double scale = 0.0;
  for (float v : row) scale = std::max(scale, std::fabs(double(v)));
  std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
  double const gap = double(row[0]) - row[1];
  MESSAGE("parted at step ", k, ": ", want[k], " vs ", got[k], ", cpu top-2 gap ", gap,
          " (max |logit| ", scale, ")");
  CHECK_MESSAGE(gap <= kLogitTol * scale, "parting at step ", k, " is not at a near-tie");
}

std::vector<GenerationRequest> mixed_requests() {
  return testing::mixed_requests(static_cast<int>(models().tiny.config.vocab_size), false);
}

template <class P>
void check_lossless(std::vector<GenerationRequest> const& requests,
                    std::vector<GenerationResult> const& want) {
  CAPTURE(describe<P>());
  SpecMetrics total;
  auto const got = run<P>(requests, &total);
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    check_same_or_near_tie(requests[r].prompt, want[r].output_ids, got[r].output_ids);
    CHECK(got[r].metrics.verify_ct >= 1);
  }
  MESSAGE(describe<P>() << " (cuda): accept length " << total.accept_length());
}

TEST_CASE("engine (cuda): plain decoding equals kimi_generate on the CUDA executor") {
  Models& m = models();
  auto const requests = mixed_requests();
  auto const plain = run<Plain>(requests);
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    kimi::GenerateOptions o;
    o.max_new_tokens = requests[r].max_new_tokens;
    o.stop_at_eos = requests[r].stop_at_eos;
    kimi::GenerateResult g;
    Status const s = kimi::kimi_generate(CudaExecutor{}, m.gpu, requests[r].prompt, o, &g);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    check_same_or_near_tie(requests[r].prompt, g.output_ids, plain[r].output_ids);
  }
}

TEST_CASE("engine (cuda): greedy speculation equals plain decoding") {
  auto const requests = mixed_requests();
  auto const want = run<Plain>(requests);
  check_lossless<NG<Chain<4>>>(requests, want);
  check_lossless<NG<TreeShape<4, 2, 8>>>(requests, want);
  check_lossless<E3<Chain<3>>>(requests, want);
  check_lossless<E3<TreeShape<4, 3, 16>>>(requests, want);
  check_lossless<E3<TreeShape<8, 3, 64>>>(requests, want);
}

TEST_CASE("engine (cuda): n-gram drafting accepts on repetitive text") {
  GenerationRequest const r = greedy_request({7, 8, 9}, 200);
  auto const plain = run<Plain>({r});
  SpecMetrics total;
  auto const got = run<NG<Chain<4>>>({r}, &total);
  check_same_or_near_tie(r.prompt, plain[0].output_ids, got[0].output_ids);
  MESSAGE("n-gram chain 4 (cuda): accept length " << total.accept_length() << " over "
                                                  << total.verify_ct << " verifies");
  CHECK(total.accept_length() > 1.0);
}

TEST_CASE("engine (cuda): a seed reproduces sampled output") {
  auto requests = mixed_requests();
  for (size_t r = 0; r < requests.size(); ++r) {
    requests[r].temperature = 0.8f;
    requests[r].top_k = 20;
    requests[r].seed = 100 + r;
  }
  auto const a = run<NG<TreeShape<4, 2, 8>>>(requests);
  auto const b = run<NG<TreeShape<4, 2, 8>>>(requests);
  for (size_t r = 0; r < requests.size(); ++r) CHECK(a[r].output_ids == b[r].output_ids);
  auto const c = run<E3<Chain<3>>>(requests);
  auto const d = run<E3<Chain<3>>>(requests);
  for (size_t r = 0; r < requests.size(); ++r) CHECK(c[r].output_ids == d[r].output_ids);
}

}  // namespace
