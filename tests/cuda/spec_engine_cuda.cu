// SpecEngine<Policy, CudaExecutor> (engine/spec_engine.hpp + engine/target_cuda.cuh) on the tiny
// random target on the GPU, with the random EAGLE-3 draft over layers [0, 1, 2] and a random
// EAGLE-1/2 draft on the GPU too (DraftCudaModel, model/eagle/forward_cuda.cuh; the draft
// engine_cases.hpp writes, loaded over the GPU target's tensors):
//   * plain decoding through the CUDA engine gives kimi_generate's tokens on the CUDA executor;
//   * greedy speculation (n-gram chain and tree, EAGLE-3 and EAGLE-1/2 chains and trees) gives
//     the CUDA engine's plain output for a batch of mixed requests, except where the two part at
//     a near-tie: the verify forward runs N tokens per request where plain decoding runs 1, so
//     the bf16 GEMMs round differently and a routing or argmax choice within that rounding may flip
//     (as in cuda.kimi_forward_cuda: the fp32 CPU executor's top-2 logit gap at the parting step
//     must be within 2e-2 of its largest |logit|);
//   * a SpecEngine::Session that admits the requests one per step, prefilled in chunks, gives
//     each request its output alone (up to the same near-ties);
//   * the Scheduler (continuous batching on its own thread) gives nine concurrent clients their
//     outputs alone (up to the same near-ties);
//   * the n-gram chain accepts more than one token per verify on the repetitive 200-token run;
//   * the CUDA engine's sampled output is reproducible from its seeds;
//   * the device-resident step (the proposal and its tree never on the host) gives the output,
//     stops and per-depth counts of the step that reads the proposal back, exactly, and a stop
//     id ends a request at its first occurrence;
//   * a GraphLadder policy pads the target's step forwards and the draft's proposals and
//     extends, eager above the ladder (graphed = eager, lossless);
//   * with the target's forwards replayed from CUDA graphs the engine's output and acceptance
//     are the eager engine's, exactly;
//   * sampling: the joint distribution of the first three sampled tokens (top-k 2, temperature
//     1) without a draft, with an n-gram chain and with an EAGLE-3 tree is the target's exact one
//     (chi-square at p-value 1e-4, 3000 draws each), computed from the fp32 CPU executor's logits
//     as unit.spec_engine does, on the tiny target with every expert routed and a prompt whose
//     top-k sets hold in bf16 (the test says why).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/engine/scheduler.hpp"
#include "specdec/engine/spec_engine.hpp"
#include "specdec/model/eagle/forward_cuda.cuh"
#include "specdec/model/eagle/random_checkpoint.hpp"
#include "specdec/model/kimi/forward_cuda.cuh"
#include "specdec/model/kimi/generate.hpp"
#include "specdec/ops/ngram_lookup/ngram_lookup.hpp"
#include "support/chi_square.hpp"
#include "support/cuda_stream.cuh"
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
namespace eagle = specdec::model::eagle;

constexpr double kLogitTol = 2e-2;

using testing::E3;
using testing::EG;
using testing::greedy_request;
using testing::NG;
using testing::Plain;
using testing::TinyLayers;

using CudaDraft = eagle::DraftCudaModel;

// testing::write_tiny_draft's random draft of the tiny target, loaded on the GPU over `target`'s
// device tensors.
void load_tiny_cuda_draft(std::filesystem::path const& dir, kimi::KimiCudaModel const& target,
                          CudaDraft* out, DraftKind kind = DraftKind::kEagle3) {
  std::span<int const> const layers = testing::write_tiny_draft(dir, target.config, kind);
  Status const s = eagle::load_draft_cuda_model(dir.string(), target.config,
                                                eagle::cuda_target_tensors_of(target), kind, layers,
                                                "the test policy", out);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

struct Models {
  testing::TempDir tmp;
  testing::TinyKimi tiny;
  kimi::KimiCpuModel cpu;  // the near-tie oracle
  kimi::KimiCudaModel gpu;
  CudaDraft draft;   // EAGLE-3 over TinyLayers
  CudaDraft draft1;  // EAGLE-1/2
};

// CUDA graphs for the target's forwards and a draft's steps, on for one scope: off again when it
// ends, a failed REQUIRE included, so no later test captures by surprise.
struct GraphsOn {
  kimi::KimiCudaModel* target;
  CudaDraft* draft;
  GraphsOn(kimi::KimiCudaModel* t, CudaDraft* d, int capacity) : target(t), draft(d) {
    target->graphs.set_capacity(capacity);
    draft->step_graphs = capacity;
  }
  ~GraphsOn() {
    target->graphs.set_capacity(0);
    draft->step_graphs = 0;
  }
  GraphsOn(GraphsOn const&) = delete;
  GraphsOn& operator=(GraphsOn const&) = delete;
};

Models& models() {
  static Models m;
  static bool const loaded = [] {
    testing::load_tiny_kimi(m.tmp.path / "target", /*int4=*/false, /*seed=*/11, &m.tiny);
    Status s = kimi::load_kimi_cpu_model(m.tiny.weights, m.tiny.config, &m.cpu);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    s = kimi::load_kimi_cuda_model(m.tiny.weights, m.tiny.config, &m.gpu);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    load_tiny_cuda_draft(m.tmp.path / "draft", m.gpu, &m.draft);
    load_tiny_cuda_draft(m.tmp.path / "draft1", m.gpu, &m.draft1, DraftKind::kEagle);
    return true;
  }();
  (void)loaded;
  return m;
}

template <class P>
std::vector<GenerationResult> run(std::vector<GenerationRequest> const& requests,
                                  SpecMetrics* total = nullptr,
                                  engine::EngineOptions const& options = {}) {
  CudaDraft* draft = P::kKind == DraftKind::kEagle ? &models().draft1 : &models().draft;
  return testing::run_engine<P, CudaExecutor>(&models().gpu, draft, requests, total, options);
}

// want and got agree, or part at a near-tie of the CPU model (testing::check_same_or_near_tie).
void check_same_or_near_tie(std::vector<int32_t> const& prompt, std::vector<int32_t> const& want,
                            std::vector<int32_t> const& got) {
  testing::check_same_or_near_tie(models().cpu, kLogitTol, prompt, want, got);
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
  check_lossless<EG<Chain<3>>>(requests, want);
  check_lossless<EG<TreeShape<4, 3, 16>>>(requests, want);
}

// The device-resident step (the proposal, its tree and the verify's inputs stay on the device;
// one host wait per step) against the same engine reading each proposal back to build its tree
// on the host: the same tokens, stops, acceptance and drafts per depth, exactly; the draft's
// counters say which step ran. Request `stopper` stops at its stop id `stop`: its output ends
// at the first `stop` and nowhere before.
template <class P>
void check_device_step(std::vector<GenerationRequest> const& requests, size_t stopper,
                       int32_t stop) {
  CAPTURE(describe<P>());
  CudaDraft* draft = P::kKind == DraftKind::kEagle ? &models().draft1 : &models().draft;
  std::vector<GenerationResult> results[2];
  SpecMetrics totals[2];
  for (int on = 0; on < 2; ++on) {
    engine::EngineOptions o;
    o.device_resident_step = on == 1;
    int64_t const host = draft->host_proposals, device = draft->device_proposals;
    results[on] = run<P>(requests, &totals[on], o);
    CHECK((draft->device_proposals > device) == (on == 1));
    CHECK((draft->host_proposals > host) == (on == 0));
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    CHECK(results[1][r].output_ids == results[0][r].output_ids);
    CHECK(results[1][r].finish_reason == results[0][r].finish_reason);
    CHECK(results[1][r].metrics.verify_ct == results[0][r].metrics.verify_ct);
    CHECK(results[1][r].metrics.proposed_at_depth == results[0][r].metrics.proposed_at_depth);
    CHECK(results[1][r].metrics.accepted_at_depth == results[0][r].metrics.accepted_at_depth);
  }
  CHECK(totals[1].committed == totals[0].committed);
  std::vector<int32_t> const& out = results[1][stopper].output_ids;
  REQUIRE(!out.empty());
  CHECK(results[1][stopper].finish_reason == engine::FinishReason::kStopId);
  CHECK(out.back() == stop);
  CHECK(std::count(out.begin(), out.end(), stop) == 1);
}

TEST_CASE("engine (cuda): the device-resident step equals the step read back to the host") {
  auto requests = mixed_requests();
  // Request 2 stops at the token of its plain output's 10th place (at its first occurrence),
  // inside a speculative step's path whenever the draft accepts.
  auto const plain = run<Plain>(requests);
  REQUIRE(plain[2].output_ids.size() > 10);
  int32_t const stop = plain[2].output_ids[9];
  requests[2].stop_ids = {stop};
  check_device_step<E3<Chain<3>>>(requests, 2, stop);
  check_device_step<E3<TreeShape<4, 3, 16>>>(requests, 2, stop);
  check_device_step<E3<TreeShape<8, 3, 64>>>(requests, 2, stop);
  check_device_step<EG<TreeShape<2, 3, 6>>>(requests, 2, stop);
}

// The engine on a stream of its own, the target's decode / verify forwards and the draft's
// proposals and extends replayed from CUDA graphs (KimiCudaModel::graphs,
// DraftCudaModel::step_graphs) against the same engine launching them eagerly: the same tokens
// and the same acceptance, exactly (captured and eager forwards give the same bits).
template <class P>
void check_graphs_equal_eager(std::vector<GenerationRequest> const& requests) {
  CAPTURE(describe<P>());
  CudaDraft* draft = P::kKind == DraftKind::kEagle ? &models().draft1 : &models().draft;
  testing::Stream stream;
  std::vector<GenerationResult> results[2];
  SpecMetrics totals[2];
  for (int graphed = 0; graphed < 2; ++graphed) {
    GraphsOn const graphs(&models().gpu, draft, graphed ? 16 : 0);
    int64_t const graph_replays = draft->graph_replays;
    SpecEngine<P, CudaExecutor> e;
    Status s = SpecEngine<P, CudaExecutor>::create(
        &models().gpu, SpecEngine<P, CudaExecutor>::kDraftsWithModel ? draft : nullptr, {}, &e,
        stream.exec());
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    int64_t const replays = models().gpu.graphs.replays();
    s = e.generate(requests, &results[graphed], &totals[graphed]);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    if (graphed) CHECK(models().gpu.graphs.replays() > replays);
    bool const proposes = SpecEngine<P, CudaExecutor>::kDraftsWithModel && graphed;
    CHECK((draft->graph_replays > graph_replays) == proposes);
  }
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    CHECK(results[1][r].output_ids == results[0][r].output_ids);
    CHECK(results[1][r].metrics.verify_ct == results[0][r].metrics.verify_ct);
  }
  CHECK(totals[1].accept_length() == totals[0].accept_length());
}

TEST_CASE("engine (cuda): forwards and proposals replayed from CUDA graphs give the eager output") {
  auto const requests = mixed_requests();
  check_graphs_equal_eager<Plain>(requests);
  check_graphs_equal_eager<E3<TreeShape<4, 3, 16>>>(requests);
  check_graphs_equal_eager<E3<TreeShape<1, 5, 6>>>(requests);
  check_graphs_equal_eager<EG<TreeShape<2, 3, 6>>>(requests);
}

// A GraphLadder policy: the target's step forwards, the draft's proposals and its extends after
// a verify run padded to the ladder (3 requests to 4, then 2 and 1 as they finish), captured per
// size; above the ladder (3 requests on <1, 2>) eagerly. Graphed equals eager exactly;
// speculation equals plain decoding (up to near-ties: a padded verify's GEMMs may round unlike
// B rows').
using Ladder = GraphLadder<1, 2, 4>;
using PlainLadder = SpecPolicy<NoDraft, Layers<>, NoTree, Ladder>;
using E3Ladder = SpecPolicy<Eagle3, testing::TinyLayers, TreeShape<4, 3, 16>, Ladder>;
using E3ShortLadder = SpecPolicy<Eagle3, testing::TinyLayers, Chain<3>, GraphLadder<1, 2>>;

TEST_CASE("engine (cuda): a GraphLadder policy pads the batch; graphed equals eager, lossless") {
  auto const requests = mixed_requests();
  REQUIRE(requests.size() == 3);
  int64_t const padded = models().gpu.padded_forwards;
  int64_t const draft_padded = models().draft.padded_calls;
  check_graphs_equal_eager<PlainLadder>(requests);
  check_graphs_equal_eager<E3Ladder>(requests);
  CHECK(models().gpu.padded_forwards > padded);
  CHECK(models().gpu.above_ladder_forwards == 0);
  CHECK(models().draft.padded_calls > draft_padded);
  CHECK(models().draft.above_ladder_calls == 0);
  check_graphs_equal_eager<E3ShortLadder>(requests);
  CHECK(models().gpu.above_ladder_forwards > 0);
  CHECK(models().draft.above_ladder_calls > 0);
  auto const want = run<Plain>(requests);
  auto const plain = run<PlainLadder>(requests);
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    check_same_or_near_tie(requests[r].prompt, want[r].output_ids, plain[r].output_ids);
  }
  check_lossless<E3Ladder>(requests, want);
  check_lossless<E3ShortLadder>(requests, want);
}

// Requests admitted one per step into a SpecEngine::Session of `max_running` slots, prefilled
// `chunk` tokens per step: each keeps the output it has alone (up to near-ties), so the CUDA
// draft's per-slot rows follow requests that join and leave between steps.
template <class P>
void check_staggered_session(int64_t chunk, int max_running) {
  CAPTURE(describe<P>());
  CAPTURE(chunk);
  auto const requests = mixed_requests();
  CudaDraft* draft = P::kKind == DraftKind::kEagle ? &models().draft1 : &models().draft;
  SpecEngine<P, CudaExecutor> e;
  Status s = SpecEngine<P, CudaExecutor>::create(
      &models().gpu, SpecEngine<P, CudaExecutor>::kDraftsWithModel ? draft : nullptr, {}, &e);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<GenerationResult> const want = testing::each_alone(e, requests);
  typename SpecEngine<P, CudaExecutor>::Session session(e);
  REQUIRE(session.open(engine::SessionOptions{max_running, 24, 64, chunk}).ok());
  std::map<int64_t, std::vector<int32_t>> got;
  std::vector<engine::StepEvent> events;
  size_t next = 0;
  for (int steps = 0; next < requests.size() || !session.idle(); ++steps) {
    REQUIRE(steps < 1000);
    if (next < requests.size() && session.fits_now(requests[next])) {
      REQUIRE(session.admit(static_cast<int64_t>(next), requests[next], 0).ok());
      ++next;
    }
    s = session.step(&events);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    for (engine::StepEvent const& ev : events) {
      got[ev.id].insert(got[ev.id].end(), ev.tokens.begin(), ev.tokens.end());
    }
  }
  CHECK(session.free_pages() == 24);
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    check_same_or_near_tie(requests[r].prompt, want[r].output_ids, got[static_cast<int64_t>(r)]);
  }
}

TEST_CASE("engine (cuda): requests joining and leaving a session keep their output") {
  check_staggered_session<Plain>(/*chunk=*/3, /*max_running=*/3);
  check_staggered_session<NG<Chain<4>>>(3, 2);
  check_staggered_session<E3<Chain<3>>>(3, 3);
  check_staggered_session<E3<TreeShape<4, 3, 16>>>(5, 2);
  check_staggered_session<EG<Chain<3>>>(64, 3);
}

TEST_CASE("engine (cuda): the scheduler serves concurrent clients their outputs alone") {
  using P = SpecPolicy<Eagle3, testing::TinyLayers, Chain<3>, Ladder>;
  testing::Stream stream;  // graph capture needs a stream of the engine's own
  SpecEngine<P, CudaExecutor> e;
  Status s = SpecEngine<P, CudaExecutor>::create(&models().gpu, &models().draft, {}, &e,
                                                 stream.exec());
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  std::vector<GenerationRequest> requests;
  for (int rep = 0; rep < 3; ++rep) {
    for (GenerationRequest const& r : mixed_requests()) requests.push_back(r);
  }
  std::vector<GenerationResult> const want = testing::each_alone(e, requests);
  // The scheduler's steps replay CUDA graphs (on its worker thread), and its stats say so.
  GraphsOn const graphs(&models().gpu, &models().draft, 16);
  engine::SchedulerOptions o;
  o.session = engine::SessionOptions{3, 24, 64, 4};
  o.decode_log_interval = 0;
  std::mutex log_mu;
  std::vector<std::string> log;
  o.log = [&](std::string const& line) {
    std::lock_guard lock(log_mu);
    log.push_back(line);
  };
  int device = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  o.on_worker_start = [device] { cudaSetDevice(device); };
  std::unique_ptr<engine::Scheduler<SpecEngine<P, CudaExecutor>>> scheduler;
  s = engine::Scheduler<SpecEngine<P, CudaExecutor>>::create(&e, o, {}, &scheduler);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  struct Client {
    std::mutex mu;
    std::vector<int32_t> tokens;
    std::promise<engine::FinishReason> done;
  };
  std::vector<Client> clients(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      engine::RequestEvents ev;
      ev.on_tokens = [&c = clients[i]](std::span<int32_t const> t) {
        std::lock_guard lock(c.mu);
        c.tokens.insert(c.tokens.end(), t.begin(), t.end());
        return true;
      };
      ev.on_finish = [&c = clients[i]](engine::RequestOutcome const& out) {
        c.done.set_value(out.reason);
      };
      CHECK(scheduler->submit(requests[i], std::move(ev), nullptr).ok());
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(i);
    auto f = clients[i].done.get_future();
    REQUIRE(f.wait_for(std::chrono::seconds(120)) == std::future_status::ready);
    CHECK(f.get() != engine::FinishReason::kError);
    std::lock_guard lock(clients[i].mu);
    check_same_or_near_tie(requests[i].prompt, want[i].output_ids, clients[i].tokens);
  }
  scheduler->shutdown(/*cancel_running=*/false);
  CHECK(scheduler->stats().kv_pages_used == 0);
  CHECK(scheduler->stats().cuda_graph);  // the last decode step replayed a graph
  int const last_size = scheduler->stats().cuda_graph_batch;
  CHECK((last_size == 1 || last_size == 2 || last_size == 4));
  // Three running requests replay the graphs of batch size 4, and the log says so.
  std::lock_guard lock(log_mu);
  bool padded_line = false;
  for (std::string const& l : log) {
    padded_line = padded_line || l.find("batch 3: CUDA graphs of batch size 4 (padded)") !=
                                     std::string::npos;
  }
  CHECK_MESSAGE(padded_line, "no padded-graph line among ", log.size(), " log lines");
}

// The step clock (events on the engine's stream; the verify and the extend queued without a host
// wait): every phase takes time, each request's times are within the totals, and the phases
// together fit in the run's wall time (a phase counted twice, or a host-clock span holding the
// GPU work of another phase, would overflow it on the drafts' many short steps).
TEST_CASE("engine (cuda): phase times are taken on the stream and fit the wall time") {
  auto const requests = mixed_requests();
  SpecMetrics total;
  auto const t0 = std::chrono::steady_clock::now();
  auto const got = run<E3<Chain<3>>>(requests, &total);
  double const wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (double SpecMetrics::*phase : {&SpecMetrics::prefill_s, &SpecMetrics::draft_s,
                                     &SpecMetrics::verify_s, &SpecMetrics::commit_s,
                                     &SpecMetrics::extend_s}) {
    CHECK(total.*phase > 0.0);
    for (GenerationResult const& r : got) {
      CHECK(r.metrics.*phase > 0.0);
      CHECK(r.metrics.*phase <= total.*phase);
    }
  }
  CHECK(total.build_s >= 0.0);
  double const phases = total.prefill_s + total.draft_s + total.build_s + total.verify_s +
                        total.commit_s + total.extend_s;
  MESSAGE("phases " << phases << " s of a " << wall << " s run: draft " << total.draft_s
                    << ", verify " << total.verify_s << ", commit " << total.commit_s
                    << ", extend " << total.extend_s);
  CHECK(phases <= wall);
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

// The sampling test's target: the tiny checkpoint with every expert routed (num_experts_per_tok 8,
// topk_group 2, as in cuda.kimi_forward_cuda), on the CPU (the oracle) and the GPU, and its
// EAGLE-3 draft. Loaded on first use.
struct AllExperts {
  testing::TempDir tmp;
  testing::TinyKimi tiny;
  kimi::KimiCpuModel cpu;
  kimi::KimiCudaModel gpu;
  CudaDraft draft;  // EAGLE-3 over TinyLayers
};

AllExperts& all_experts() {
  static AllExperts m;
  static bool const loaded = [] {
    testing::load_tiny_kimi(m.tmp.path / "target", /*int4=*/false, /*seed=*/11, &m.tiny,
                            [](nlohmann::json& j) {
                              j["num_experts_per_tok"] = j["n_routed_experts"];
                              j["topk_group"] = j["n_group"];
                            });
    Status s = kimi::load_kimi_cpu_model(m.tiny.weights, m.tiny.config, &m.cpu);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    s = kimi::load_kimi_cuda_model(m.tiny.weights, m.tiny.config, &m.gpu);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    load_tiny_cuda_draft(m.tmp.path / "draft", m.gpu, &m.draft);
    return true;
  }();
  (void)loaded;
  return m;
}

constexpr int kSampleTopK = 2;
constexpr int kSamplePromptLen = 16;
// Twice the largest |cuda - cpu| / max |cpu| logit difference cuda.kimi_forward_cuda observes
// with every expert routed (7.3e-3): no two logits this far apart on the CPU swap on the GPU.
constexpr double kSupportGap = 1.5e-2;

// `context` and every context below it in the exact distribution (each top-k token appended,
// `depth` levels: the contexts of the next `depth` sampled tokens) have their k-th and (k+1)-th
// largest CPU logits at least kSupportGap x max |logit| apart.
bool top_k_sets_hold(kimi::KimiCpuModel const& cpu, std::vector<int32_t> const& context, int k,
                     int depth) {
  std::vector<float> const row = testing::last_logits_cpu(cpu, context);
  std::vector<float> sorted = row;
  std::partial_sort(sorted.begin(), sorted.begin() + k + 1, sorted.end(), std::greater<>());
  double scale = 0.0;
  for (float v : row) scale = std::max(scale, std::fabs(double(v)));
  if (double(sorted[static_cast<size_t>(k - 1)]) - sorted[static_cast<size_t>(k)] <
      kSupportGap * scale) {
    return false;
  }
  if (depth == 1) return true;
  int64_t const V = static_cast<int64_t>(row.size());
  for (auto const& [x, p] : testing::top_k_distribution(row.data(), V, k)) {
    std::vector<int32_t> next = context;
    next.push_back(x);
    if (!top_k_sets_hold(cpu, next, k, depth - 1)) return false;
  }
  return true;
}

// The n-gram proposer's first draft token after `history` (ops::ngram_lookup with the engine's
// default n-gram sizes), -1 when nothing matches.
int32_t ngram_first_draft(std::vector<int32_t> const& history) {
  engine::EngineOptions const o;
  int32_t const length = static_cast<int32_t>(history.size());
  int32_t tokens[2] = {-1, -1}, parents[2] = {-1, -1}, count = 0;
  ops::NgramLookupParams p;
  p.tokens = history.data();
  p.lengths = &length;
  p.batch = 1;
  p.max_len = length;
  p.min_n = o.ngram_min_n;
  p.max_n = o.ngram_max_n;
  p.nodes = 2;
  p.branches = 1;
  p.out_tokens = tokens;
  p.out_parents = parents;
  p.out_node_count = &count;
  Status const s = ops::ngram_lookup(CpuExecutor{}, p);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return count > 1 ? tokens[1] : -1;
}

TEST_CASE("engine (cuda): sampled speculation keeps the target's distribution of three tokens") {
  // unit.spec_engine's test on the CUDA engine: the GPU engine's draws against the exact joint
  // distribution of (x1, x2, x3) computed from the fp32 CPU executor's logits
  // (testing::check_three_token_distribution). The GPU target is bf16: its logits differ from the
  // CPU's by up to 7.3e-3 of max |logit| (cuda.kimi_forward_cuda, every expert routed). That
  // moves the 8 cell probabilities by a chi-square noncentrality of 0.1-0.6 over 3000 draws (a
  // CPU emulation of the bf16 forward on this prompt, 7-8e-3 logit difference), against a
  // p = 1e-4 threshold of 29.9 for 7 degrees of freedom: far below what the draws can detect.
  // Two discrete choices would not be:
  //   * MoE routing: a router near-tie that bf16 rounding flips moves that token's logits by tens
  //     of percent (unit.spec_engine's prompt has router score margins down to 9e-4), so every
  //     expert is routed here, which leaves no choice to flip;
  //   * the top-k set: a k-th / (k+1)-th logit pair closer than the rounding puts another token
  //     in the GPU's set, outside the exact support (unit.spec_engine's top-3 prompt has pairs
  //     0.2% of max |logit| apart), so the prompt is one whose 7 contexts all keep their top-2
  //     set (top_k_sets_hold); prompts whose 13 top-3 sets hold are too rare on this target.
  // The prompt: the first 16-token window of the CPU's greedy continuation of {7, 8, 9} whose
  // n-gram draft after the likely x1 (the greedy next token) is the likely x2, so that n-gram
  // drafts get accepted, and whose top-2 sets hold. The random EAGLE-3 draft's proposals fall
  // outside the top-2 (none of 18000 accepted through the CPU engine), so its case checks the
  // rejection path of a tree.
  // Cost: per policy 12 generate calls of 250 requests (a prefill of 250 x 16 tokens, then 1-2
  // verifies), a few ms each on the GPU, the EAGLE-3 draft's included (it runs on the GPU); the
  // CPU oracle (200 greedy tokens, the window search, 7 prefills per policy) under 1 s.
  AllExperts& a = all_experts();
  std::vector<GenerationRequest> const run200{greedy_request({7, 8, 9}, 200)};
  auto const greedy =
      testing::run_engine<Plain, CpuExecutor>(&a.cpu, nullptr, run200, nullptr)[0].output_ids;
  auto window = [&](size_t end) {
    return std::vector<int32_t>(greedy.begin() + static_cast<int64_t>(end - kSamplePromptLen),
                                greedy.begin() + static_cast<int64_t>(end));
  };
  size_t end = kSamplePromptLen;
  for (; end + 1 < greedy.size(); ++end) {
    std::vector<int32_t> history = window(end);
    history.push_back(greedy[end]);
    if (ngram_first_draft(history) == greedy[end + 1] &&
        top_k_sets_hold(a.cpu, window(end), kSampleTopK, 3)) {
      break;
    }
  }
  REQUIRE_MESSAGE(end + 1 < greedy.size(),
                  "no window of the greedy continuation has an n-gram draft of the likely x2 "
                  "and top-2 sets that hold in bf16");
  MESSAGE("prompt: greedy tokens [", end - kSamplePromptLen, ", ", end, ")");
  GenerationRequest base = greedy_request(window(end), 3);
  base.temperature = 1.0f;
  base.top_k = kSampleTopK;
  testing::check_three_token_distribution<Plain, CudaExecutor>(a.cpu, &a.gpu, nullptr, base, 3000);
  testing::check_three_token_distribution<NG<Chain<3>>, CudaExecutor>(a.cpu, &a.gpu, nullptr, base,
                                                                      3000);
  testing::check_three_token_distribution<E3<TreeShape<2, 2, 4>>, CudaExecutor>(
      a.cpu, &a.gpu, &a.draft, base, 3000);
}

}  // namespace
