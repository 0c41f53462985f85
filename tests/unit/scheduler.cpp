// Continuous batching on the CPU executor (tiny random target, random EAGLE-3 / EAGLE drafts):
//   SpecEngine::Session  requests admitted at different steps, prefilled in chunks of a few
//                        tokens, cancelled mid-run: every greedy output equals the same request
//                        generated alone, for each draft strategy; a seeded sampled request
//                        draws the same tokens alone and in a batch; cancel and finish return
//                        every page; requests too large are refused by name
//   Scheduler            many client threads submitting at once: every request answered, each
//                        output equal to the same request alone; a stop (on_tokens false) and a
//                        cancel free the request's pages; a full cache queues (never fails); a
//                        full queue and a request larger than the cache are refused; shutdown
//                        cancels what is queued and the gauges return to idle; tensor parallel
//                        over two CPU ranks in lockstep (engine/lockstep.hpp) gives every
//                        request its one-rank output
#include "specdec/engine/scheduler.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "specdec/dist/communicator.hpp"
#include "specdec/dist/shard.hpp"
#include "support/engine_cases.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

namespace {

using namespace specdec;
using engine::FinishReason;
using engine::GenerationRequest;
using engine::GenerationResult;
using engine::RequestOutcome;
using engine::Scheduler;
using engine::SessionOptions;
using engine::SpecEngine;
using engine::StepEvent;
using testing::draft_for;
using testing::E3;
using testing::EG;
using testing::NG;
using testing::Plain;

auto const& models() { return testing::tiny_engine_models(); }
int vocab() { return static_cast<int>(models().tiny.config.vocab_size); }

template <class P>
SpecEngine<P, CpuExecutor> make_engine() {
  SpecEngine<P, CpuExecutor> e;
  Status const s = SpecEngine<P, CpuExecutor>::create(&models().target, draft_for<P>(), {}, &e);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return e;
}

// Eight requests of different lengths, budgets and stopping (two stop at eos).
std::vector<GenerationRequest> workload() {
  std::mt19937 rng(17);
  std::vector<GenerationRequest> r(8);
  for (size_t i = 0; i < r.size(); ++i) {
    r[i].prompt = testing::random_tokens(rng, 2 + static_cast<int>(i * 5) % 19, vocab());
    r[i].max_new_tokens = 5 + static_cast<int>(i * 7) % 17;
    r[i].stop_at_eos = i % 4 == 1;
  }
  r[3].prompt = {40, 41, 42, 43, 40, 41, 42, 43, 40, 41};  // repetitive: n-gram drafts match
  return r;
}

// Each request generated alone (a one-request generate).
template <class P>
std::vector<GenerationResult> alone(std::vector<GenerationRequest> const& requests) {
  return testing::each_alone(make_engine<P>(), requests);
}

// Requests admitted one per step (as they fit), prefilled `chunk` tokens per step.
template <class P>
void check_staggered(int64_t chunk, int max_running) {
  CAPTURE(describe<P>());
  CAPTURE(chunk);
  auto const requests = workload();
  auto const want = alone<P>(requests);
  auto const e = make_engine<P>();
  typename SpecEngine<P, CpuExecutor>::Session session(e);
  SessionOptions o;
  o.max_running = max_running;
  o.num_pages = 40;
  o.max_request_tokens = 64;
  o.max_prefill_tokens = chunk;
  REQUIRE(session.open(o).ok());
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, FinishReason> reason;
  size_t next = 0;
  std::vector<StepEvent> events;
  int steps = 0;
  while (next < requests.size() || !session.idle()) {
    if (next < requests.size() && session.fits_now(requests[next])) {
      REQUIRE(session.admit(static_cast<int64_t>(next), requests[next], 0).ok());
      ++next;
    }
    Status const s = session.step(&events);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    for (StepEvent const& ev : events) {
      got[ev.id].insert(got[ev.id].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) reason[ev.id] = ev.reason;
    }
    REQUIRE(++steps < 2000);
  }
  CHECK(session.free_pages() == o.num_pages);
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<int64_t>(r)] == want[r].output_ids);
    REQUIRE(reason.count(static_cast<int64_t>(r)));
    CHECK(reason[static_cast<int64_t>(r)] == want[r].finish_reason);
  }
}

TEST_CASE("session: requests joining and leaving between steps keep their greedy output") {
  check_staggered<Plain>(/*chunk=*/1000, /*max_running=*/8);
  check_staggered<E3<Chain<3>>>(1000, 8);
  check_staggered<E3<TreeShape<4, 3, 8>>>(1000, 3);
  check_staggered<EG<Chain<2>>>(1000, 8);
  check_staggered<NG<Chain<3>>>(1000, 8);
  check_staggered<NG<TreeShape<2, 2, 4>>>(1000, 2);
}

// EngineOptions::draft_steps_by_batch: the eight requests admitted at once, so the batch only
// shrinks as they finish; each step drafts the rule's steps for its batch size (the session says
// which, and an EAGLE request's proposed drafts add up to draft_nodes(steps) - 1 per verify:
// none when nothing is drafted), and every output stays the one of the request alone. The steps
// must take `distinct` values over the run (the batch crossed the rules).
template <class P>
void check_draft_steps_by_batch(std::vector<engine::DraftStepsRule> const& rules,
                                std::vector<int> const& want_steps_at /* [batch] */,
                                size_t distinct) {
  using Engine = SpecEngine<P, CpuExecutor>;
  CAPTURE(describe<P>());
  auto const requests = workload();
  auto const want = alone<P>(requests);
  engine::EngineOptions eo;
  eo.draft_steps_by_batch = rules;
  Engine e;
  Status s = Engine::create(&models().target, draft_for<P>(), eo, &e);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  typename Engine::Session session(e);
  SessionOptions o;
  o.max_running = 8;
  o.num_pages = 40;
  o.max_request_tokens = 64;
  o.max_prefill_tokens = 1000;
  REQUIRE(session.open(o).ok());
  for (size_t r = 0; r < requests.size(); ++r) {
    REQUIRE(session.admit(static_cast<int64_t>(r), requests[r], 0).ok());
  }
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, int64_t> proposed;  // each request's expected proposed drafts
  std::set<int> seen;
  std::vector<StepEvent> events;
  for (int step = 0; !session.idle(); ++step) {
    REQUIRE(step < 200);
    int const batch = session.running();  // all decode: prompts prefill whole in step 0
    events.clear();
    s = session.step(&events);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    int const steps = want_steps_at[static_cast<size_t>(batch)];
    CAPTURE(batch);
    CHECK(session.draft_steps() == steps);
    seen.insert(steps);
    for (StepEvent const& ev : events) {
      got[ev.id].insert(got[ev.id].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.verified) proposed[ev.id] += Engine::draft_nodes(steps) - 1;
      // (An n-gram lookup may propose fewer nodes than the tree has.)
      if (ev.finished && Engine::kDraftsWithModel) CHECK(ev.metrics.proposed() == proposed[ev.id]);
    }
  }
  CHECK(seen.size() == distinct);
  for (size_t r = 0; r < requests.size(); ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<int64_t>(r)] == want[r].output_ids);
  }
}

TEST_CASE("session: the engine drafts by batch size as draft_steps_by_batch says") {
  // Chain of 3: 3 steps alone, 2 at batch 2-3, 1 at 4-5, none from 6 on.
  check_draft_steps_by_batch<E3<Chain<3>>>({{2, 2}, {4, 1}, {6, 0}},
                                           {-1, 3, 2, 2, 1, 1, 0, 0, 0}, 4);
  // Top-4 tree of 3 steps and 8 nodes: 1 step (5 nodes) at batch 3-6, 2 steps (8) from 7 on.
  check_draft_steps_by_batch<E3<TreeShape<4, 3, 8>>>({{3, 1}, {7, 2}},
                                                     {-1, 3, 3, 1, 1, 1, 1, 2, 2}, 3);
  check_draft_steps_by_batch<EG<Chain<2>>>({{5, 0}}, {-1, 2, 2, 2, 2, 0, 0, 0, 0}, 2);
  check_draft_steps_by_batch<NG<Chain<3>>>({{4, 0}}, {-1, 3, 3, 3, 0, 0, 0, 0, 0}, 2);
  check_draft_steps_by_batch<Plain>({{1, 0}}, {-1, 0, 0, 0, 0, 0, 0, 0, 0}, 1);
}

TEST_CASE("session: draft_steps_by_batch rules are checked by name") {
  auto const bad = [](std::vector<engine::DraftStepsRule> rules, auto policy,
                      std::vector<std::string> const& want) {
    using P = decltype(policy);
    engine::EngineOptions eo;
    eo.draft_steps_by_batch = std::move(rules);
    SpecEngine<P, CpuExecutor> e;
    testing::check_error(SpecEngine<P, CpuExecutor>::create(&models().target, draft_for<P>(), eo,
                                                            &e),
                         StatusCode::kInvalidArgument, want);
  };
  bad({{2, 1}, {2, 0}}, E3<Chain<3>>{}, {"draft_steps_by_batch[1] = 2:0", "strictly increasing"});
  bad({{0, 1}}, E3<Chain<3>>{}, {"draft_steps_by_batch[0] = 0:1", ">= 1"});
  bad({{4, 4}}, E3<Chain<3>>{}, {"draft_steps_by_batch[0] = 4:4", "steps must be in [0, 3]"});
  bad({{4, 2}}, NG<Chain<3>>{}, {"draft_steps_by_batch[0] = 4:2", "drafts all 3 steps or none"});
}

TEST_CASE("session: chunked prefill gives the output of whole prompts") {
  check_staggered<Plain>(/*chunk=*/3, /*max_running=*/8);
  check_staggered<E3<Chain<3>>>(3, 8);
  check_staggered<E3<TreeShape<4, 3, 8>>>(1, 4);
  check_staggered<EG<Chain<2>>>(5, 8);
  check_staggered<NG<Chain<3>>>(2, 8);
}

TEST_CASE("session: a seeded sampled request draws the same tokens alone and in a batch") {
  using P = E3<Chain<3>>;
  auto const e = make_engine<P>();
  GenerationRequest hot;
  hot.prompt = {5, 6, 7, 8};
  hot.max_new_tokens = 24;
  hot.temperature = 1.0f;
  hot.top_k = 40;
  hot.seed = 99;
  hot.stop_at_eos = false;
  auto run = [&](std::vector<GenerationRequest> const& batch) {
    typename SpecEngine<P, CpuExecutor>::Session session(e);
    SessionOptions o{4, 40, 64, 64};
    REQUIRE(session.open(o).ok());
    for (size_t i = 0; i < batch.size(); ++i) {
      REQUIRE(session.admit(static_cast<int64_t>(i), batch[i], /*stream=*/0).ok());
    }
    std::vector<int32_t> out;
    std::vector<StepEvent> events;
    while (!session.idle()) {
      REQUIRE(session.step(&events).ok());
      for (StepEvent const& ev : events) {
        if (ev.id == 0) out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
      }
    }
    return out;
  };
  std::vector<int32_t> const solo = run({hot});
  auto others = workload();
  others.insert(others.begin(), hot);
  others.resize(4);
  CHECK(run(others) == solo);
  GenerationRequest other_seed = hot;
  other_seed.seed = 100;
  CHECK(run({other_seed}) != solo);
}

TEST_CASE("session: cancel frees the pages; requests too large are refused by name") {
  using P = NG<Chain<3>>;
  auto const e = make_engine<P>();
  typename SpecEngine<P, CpuExecutor>::Session session(e);
  SessionOptions o{2, 12, 64, 64};
  REQUIRE(session.open(o).ok());
  GenerationRequest r = testing::greedy_request({1, 2, 3}, 40);
  REQUIRE(session.fits_now(r));
  REQUIRE(session.admit(7, r, 0).ok());
  CHECK(session.free_pages() < 12);
  testing::check_error(session.admit(7, r, 0), StatusCode::kInvalidArgument, {"request 7", "already running"});
  std::vector<StepEvent> events;
  REQUIRE(session.step(&events).ok());
  REQUIRE(session.cancel(7).ok());
  CHECK(session.free_pages() == 12);
  CHECK(session.idle());
  testing::check_error(session.cancel(7), StatusCode::kInvalidArgument, {"request 7", "not running"});
  GenerationRequest big = testing::greedy_request(std::vector<int32_t>(30, 1), 40);
  testing::check_error(session.check(big, "request x"), StatusCode::kInvalidArgument,
                       {"request x", "30 prompt tokens", "40 new tokens", "max_request_tokens"});
  // A cache smaller than one request of max_request_tokens cannot open.
  typename SpecEngine<P, CpuExecutor>::Session small(e);
  testing::check_error(small.open(SessionOptions{2, 3, 64, 64}), StatusCode::kInvalidArgument,
                       {"max_request_tokens 64", "more than the cache's 3"});
}

// A client of the scheduler: collects its tokens and waits for on_finish.
struct Client {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  bool done = false;
  RequestOutcome outcome;
  int stop_after = -1;          // on_tokens returns false once this many tokens arrived
  std::function<void()> gate;  // called in on_tokens (on the scheduler's thread)

  engine::RequestEvents events() {
    engine::RequestEvents ev;
    ev.on_tokens = [this](std::span<int32_t const> t) {
      if (gate) gate();
      std::lock_guard lock(mu);
      tokens.insert(tokens.end(), t.begin(), t.end());
      return stop_after < 0 || static_cast<int>(tokens.size()) < stop_after;
    };
    ev.on_finish = [this](RequestOutcome const& o) {
      std::lock_guard lock(mu);
      CHECK_FALSE(done);  // exactly once
      outcome = o;
      done = true;
      cv.notify_all();
    };
    return ev;
  }
  bool wait(double seconds = 120) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; });
  }
};

template <class P>
std::unique_ptr<Scheduler<SpecEngine<P, CpuExecutor>>> make_scheduler(
    SpecEngine<P, CpuExecutor> const& e, SessionOptions so, int max_queued = 4096) {
  engine::SchedulerOptions o;
  o.session = so;
  o.max_queued = max_queued;
  o.decode_log_interval = 0;
  std::unique_ptr<Scheduler<SpecEngine<P, CpuExecutor>>> s;
  Status const st = Scheduler<SpecEngine<P, CpuExecutor>>::create(&e, o, {}, &s);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  return s;
}

// Waits until the scheduler's gauges show no running and no queued request.
template <class S>
engine::ServingStats wait_idle(S& s) {
  for (int i = 0; i < 2000; ++i) {
    engine::ServingStats const st = s.stats();
    if (st.running == 0 && st.queued == 0 && st.kv_pages_used == 0) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  FAIL("the scheduler did not return to idle");
  return {};
}

TEST_CASE("scheduler: concurrent clients each get their output alone") {
  using P = E3<Chain<3>>;
  auto const e = make_engine<P>();
  auto base = workload();
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 32; ++i) requests.push_back(base[static_cast<size_t>(i) % base.size()]);
  auto const want = alone<P>(base);
  // 20 pages: a full cache makes later requests wait for earlier ones to finish.
  auto s = make_scheduler<P>(e, SessionOptions{6, 20, 64, 16});
  std::vector<Client> clients(requests.size());
  std::vector<std::thread> threads;
  std::atomic<int> refused{0};
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      uint64_t id = 0;
      if (!s->submit(requests[i], clients[i].events(), &id).ok()) ++refused;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(refused == 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(i);
    REQUIRE(clients[i].wait());
    GenerationResult const& w = want[i % base.size()];
    CHECK(clients[i].tokens == w.output_ids);
    CHECK(clients[i].outcome.reason == w.finish_reason);
    CHECK(clients[i].outcome.output_tokens == static_cast<int64_t>(w.output_ids.size()));
    CHECK(clients[i].outcome.metrics.verify_ct == w.metrics.verify_ct);
  }
  engine::ServingStats const st = wait_idle(*s);
  CHECK(st.requests_submitted == 32);
  int64_t finished = 0, generated = 0;
  for (int64_t n : st.requests_finished) finished += n;
  for (auto const& c : clients) generated += static_cast<int64_t>(c.tokens.size());
  CHECK(finished == 32);
  CHECK(st.generation_tokens == generated);
  CHECK(st.spec.verify_ct > 0);
  CHECK(st.accept_length.count == st.spec.verify_ct);
}

// The scheduler logs each change of the drafting depth (EngineOptions::draft_steps_by_batch):
// one request decodes alone (the policy's 3 steps: nothing to log), its first tokens bring five
// more (batch 6: nothing drafted), and as they finish the batch falls below 3 again.
TEST_CASE("scheduler: the log says when the batch size changes how much is drafted") {
  using P = E3<Chain<3>>;
  using Engine = SpecEngine<P, CpuExecutor>;
  engine::EngineOptions eo;
  eo.draft_steps_by_batch = {{3, 0}};
  Engine e;
  Status st = Engine::create(&models().target, draft_for<P>(), eo, &e);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  engine::SchedulerOptions o;
  o.session = SessionOptions{6, 40, 64, 64};
  o.decode_log_interval = 0;
  std::mutex mu;
  std::vector<std::string> lines;
  o.log = [&](std::string const& line) {
    std::lock_guard lock(mu);
    lines.push_back(line);
  };
  std::unique_ptr<Scheduler<Engine>> s;
  st = Scheduler<Engine>::create(&e, o, {}, &s);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  auto const requests = workload();
  std::vector<Client> more(5);
  Client first;
  bool once = true;
  first.gate = [&] {
    if (!std::exchange(once, false)) return;
    for (size_t i = 0; i < more.size(); ++i) {
      REQUIRE(s->submit(requests[i + 1], more[i].events(), nullptr).ok());
    }
  };
  GenerationRequest const lead = testing::greedy_request(requests[0].prompt, 30);
  REQUIRE(s->submit(lead, first.events(), nullptr).ok());
  REQUIRE(first.wait());
  for (Client& c : more) REQUIRE(c.wait());
  CHECK_FALSE(wait_idle(*s).cuda_graph);  // the CPU executor replays no graph
  std::lock_guard lock(mu);
  std::vector<std::string> drafting;
  for (std::string const& l : lines) {
    if (l.find("drafting") != std::string::npos) drafting.push_back(l);
  }
  REQUIRE(drafting.size() >= 2);
  CHECK(drafting[0].find("batch 6: drafting nothing (plain decoding)") != std::string::npos);
  CHECK(drafting[0].find("--speculative-draft-steps-by-batch") != std::string::npos);
  CHECK(drafting.back().find("drafting 3 of 3 steps (4 verified tokens)") != std::string::npos);
  // Each line's batch size is on its side of the rule.
  for (std::string const& l : drafting) {
    CAPTURE(l);
    int const batch = std::stoi(l.substr(l.find("batch ") + 6));
    CHECK((l.find("drafting nothing") != std::string::npos) == (batch >= 3));
  }
}

TEST_CASE("scheduler: options that would refuse every request or log nonsense are refused") {
  using P = NG<Chain<3>>;
  auto const e = make_engine<P>();
  auto refused = [&](int max_queued, int decode_log_interval, std::string const& what) {
    engine::SchedulerOptions o;
    o.session = SessionOptions{1, 10, 64, 64};
    o.max_queued = max_queued;
    o.decode_log_interval = decode_log_interval;
    std::unique_ptr<Scheduler<SpecEngine<P, CpuExecutor>>> s;
    testing::check_error(Scheduler<SpecEngine<P, CpuExecutor>>::create(&e, o, {}, &s),
                         StatusCode::kInvalidArgument, {what});
    CHECK(s == nullptr);
  };
  refused(0, 0, "max_queued 0 < 1: every request would be refused");
  refused(1, -1, "decode_log_interval -1 < 0");
}

TEST_CASE("scheduler: a stop and a cancel free the request; a full queue and a huge request are refused") {
  using P = NG<Chain<3>>;
  auto const e = make_engine<P>();
  auto s = make_scheduler<P>(e, SessionOptions{1, 10, 64, 64}, /*max_queued=*/2);
  // Stopped by its client after 3 tokens (a stop string): no more tokens, pages back.
  Client stopped;
  stopped.stop_after = 3;
  GenerationRequest r = testing::greedy_request({40, 41, 42, 43, 40, 41, 42, 43}, 40);
  REQUIRE(s->submit(r, stopped.events(), nullptr).ok());
  REQUIRE(stopped.wait());
  CHECK(stopped.outcome.reason == FinishReason::kStopString);
  CHECK(stopped.tokens.size() >= 3);
  CHECK(stopped.tokens.size() <= 3 + 3);  // the step that crossed 3 committed at most 4
  wait_idle(*s);
  // One running (a long one, held on the scheduler's thread at its first tokens), two queued,
  // the fourth refused.
  std::promise<void> reached, release;
  std::shared_future<void> released = release.get_future().share();
  bool first = true;
  Client a, b, c;
  a.gate = [&] {
    if (!std::exchange(first, false)) return;
    reached.set_value();
    released.wait();
  };
  GenerationRequest long_one = testing::greedy_request({1, 2, 3}, 60);
  uint64_t id_a = 0;
  REQUIRE(s->submit(long_one, a.events(), &id_a).ok());
  reached.get_future().wait();
  REQUIRE(s->submit(long_one, b.events(), nullptr).ok());
  uint64_t id_c = 0;
  REQUIRE(s->submit(long_one, c.events(), &id_c).ok());
  Client d;
  testing::check_error(s->submit(long_one, d.events(), nullptr), StatusCode::kUnsupported,
                       {"queue is full"});
  s->cancel(id_c);  // queued: never runs
  s->cancel(id_a);  // running: leaves at the next step
  release.set_value();
  REQUIRE(a.wait());
  REQUIRE(c.wait());
  CHECK(a.outcome.reason == FinishReason::kCancelled);
  CHECK(c.outcome.reason == FinishReason::kCancelled);
  CHECK(c.tokens.empty());
  REQUIRE(b.wait());
  CHECK(b.outcome.reason == FinishReason::kLength);
  CHECK(b.tokens.size() == 60);
  // Larger than a request may be.
  GenerationRequest huge = testing::greedy_request(std::vector<int32_t>(50, 1), 30);
  testing::check_error(s->submit(huge, d.events(), nullptr), StatusCode::kInvalidArgument,
                       {"50 prompt tokens", "30 new tokens", "max_request_tokens"});
  engine::ServingStats const st = wait_idle(*s);
  CHECK(st.requests_rejected == 2);
  CHECK(st.requests_finished[static_cast<size_t>(FinishReason::kCancelled)] == 2);
  CHECK(st.requests_finished[static_cast<size_t>(FinishReason::kStopString)] == 1);
}

TEST_CASE("scheduler: shutdown cancels the queue, finishes or cancels the running, refuses more") {
  using P = Plain;
  auto const e = make_engine<P>();
  for (bool cancel_running : {false, true}) {
    CAPTURE(cancel_running);
    auto s = make_scheduler<P>(e, SessionOptions{1, 10, 64, 64});
    // a's first tokens hold the scheduler's thread until shutdown has begun: a is running and b
    // queued when it does.
    std::promise<void> reached, release;
    std::shared_future<void> released = release.get_future().share();
    bool first = true;
    Client a, b;
    a.gate = [&] {
      if (!std::exchange(first, false)) return;
      reached.set_value();
      released.wait();
    };
    GenerationRequest r = testing::greedy_request({1, 2, 3}, 30);
    REQUIRE(s->submit(r, a.events(), nullptr).ok());
    reached.get_future().wait();
    REQUIRE(s->submit(r, b.events(), nullptr).ok());
    std::thread stopper([&] { s->shutdown(cancel_running); });
    std::deque<Client> late;  // submitted before the shutdown began: queued, then cancelled
    while (s->submit(r, late.emplace_back().events(), nullptr).ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    Client refused;
    testing::check_error(s->submit(r, refused.events(), nullptr), StatusCode::kUnsupported,
                         {"shutting down"});
    release.set_value();
    stopper.join();
    REQUIRE(a.wait(1));
    REQUIRE(b.wait(1));
    CHECK(a.outcome.reason == (cancel_running ? FinishReason::kCancelled : FinishReason::kLength));
    CHECK(b.outcome.reason == FinishReason::kCancelled);
    late.pop_back();  // the refused one
    for (Client& c : late) {
      REQUIRE(c.wait(1));
      CHECK(c.outcome.reason == FinishReason::kCancelled);
    }
    engine::ServingStats const st = s->stats();
    CHECK(st.running == 0);
    CHECK(st.kv_pages_used == 0);
  }
}

TEST_CASE("scheduler: two tensor-parallel ranks in lockstep give the one-rank outputs") {
  using P = E3<Chain<3>>;
  namespace eagle = specdec::model::eagle;
  auto const requests = workload();
  auto const want = alone<P>(requests);
  auto const& m = models();
  testing::TempDir tmp;
  std::span<int const> const layers =
      testing::write_tiny_draft(tmp.path / "draft", m.tiny.config, DraftKind::kEagle3);
  std::vector<Client> clients(requests.size());
  engine::LockstepChannel channel(2);
  SessionOptions const so{3, 30, 64, 8};
  Status const st = dist::run_ranks(2, [&](int rank, dist::CpuCommunicator& comm) -> Status {
    engine::LockstepLeaderScope const stop_followers(channel, rank == 0);
    model::kimi::KimiCpuModel target;
    SPECDEC_RETURN_IF_ERROR(model::kimi::load_kimi_cpu_model(
        m.tiny.weights, m.tiny.config, dist::TpShard{rank, 2}, &comm, &target));
    eagle::DraftCpuModel draft;
    SPECDEC_RETURN_IF_ERROR(eagle::load_draft_cpu_model(
        (tmp.path / "draft").string(), target.config, eagle::target_tensors_of(target),
        DraftKind::kEagle3, layers, "the test policy", &draft));
    SpecEngine<P, CpuExecutor> e;
    SPECDEC_RETURN_IF_ERROR((SpecEngine<P, CpuExecutor>::create(&target, &draft, {}, &e)));
    if (rank != 0) {
      typename SpecEngine<P, CpuExecutor>::Session session(e);
      SPECDEC_RETURN_IF_ERROR(session.open(so));
      engine::follow_lockstep(channel, rank, &session);
      return Status::Ok();
    }
    engine::SchedulerOptions o;
    o.session = so;
    o.decode_log_interval = 0;
    std::unique_ptr<Scheduler<SpecEngine<P, CpuExecutor>>> s;
    SPECDEC_RETURN_IF_ERROR(
        (Scheduler<SpecEngine<P, CpuExecutor>>::create(&e, o, {}, &s, &channel)));
    for (size_t i = 0; i < requests.size(); ++i) {
      SPECDEC_RETURN_IF_ERROR(s->submit(requests[i], clients[i].events(), nullptr));
    }
    for (Client& c : clients) {
      if (!c.wait()) return Status::Internal("a request did not finish");
    }
    s->shutdown(/*cancel_running=*/false);
    return Status::Ok();
  });
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  for (size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(i);
    CHECK(clients[i].tokens == want[i].output_ids);
    CHECK(clients[i].outcome.reason == want[i].finish_reason);
  }
}

}  // namespace
