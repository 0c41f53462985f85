// Scheduler<Engine>: continuous batching over one SpecEngine::Session, behind the
// ServingBackend interface (engine/serving.hpp) a server talks to.
//
//   std::unique_ptr<Scheduler<Engine>> s;
//   Scheduler<Engine>::create(&engine, options, info, &s);   // opens the session, starts a thread
//   s->submit(request, {on_tokens, on_finish}, &id);          // from any thread
//   s->cancel(id); s->stats(); s->shutdown(cancel_running);  // shutdown: from any threads
//
// One worker thread owns the session and loops:
//   1. cancellations (cancel(), a stop string, shutdown): queued requests leave the queue,
//      running ones leave the session (their target pages and draft slot freed at once)
//   2. admission, first come first served: the queue's head joins the running batch while the
//      session has a free running slot and the target cache pages for its prompt +
//      max_new_tokens + the tree (reserved whole at admission, so a running request never runs
//      out of pages and nothing is preempted); a request that cannot fit yet waits, and the ones
//      behind it wait too (no starvation of long prompts)
//   3. Session::step: a chunked prefill of the prefilling requests (SessionOptions::
//      max_prefill_tokens per step), then one speculative step over the decoding batch
//   4. the step's tokens go to each request's on_tokens, finished requests to on_finish (both
//      called on the worker thread, outside the scheduler's lock: they may call cancel());
//      counters, gauges and histograms update; every decode_log_interval speculative steps one
//      line in SGLang's format (serve/metrics_text.hpp) goes to options.log, and one line
//      whenever the step's drafting depth changes (EngineOptions::draft_steps_by_batch: "batch
//      8: drafting nothing (plain decoding), ...") or the way its forwards launch (CUDA: "batch
//      3: CUDA graphs of batch size 4 (padded), ..." / "... launched eagerly: above the CUDA
//      graph ladder's largest batch size 256"; the gauge ServingStats::cuda_graph_batch)
// Tensor parallel (one process): every rank's session sees the same admits, cancels and steps
// through a LockstepChannel (engine/lockstep.hpp); this scheduler runs on rank 0.
// A request too large for the session (max_request_tokens) or invalid is refused at submit with
// the Session's message; a full queue (max_queued) is refused too. A failing engine step ends
// every running request with FinishReason::kError and the Status's message (logged), and the
// scheduler keeps serving the queue.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/engine/lockstep.hpp"
#include "specdec/engine/serving.hpp"
#include "specdec/engine/spec_engine.hpp"
#include "specdec/serve/metrics_text.hpp"

namespace specdec::engine {

struct SchedulerOptions {
  SessionOptions session;
  int max_queued = 4096;            // >= 1 waiting requests at most; submit past it is refused
  int decode_log_interval = 40;     // speculative steps between decode log lines; 0: none
  std::function<void(std::string const&)> log;  // the decode log and errors; null: stderr
  std::function<void()> on_worker_start;  // first thing on the worker thread (e.g. bind its GPU)
};

template <class Engine>
class Scheduler final : public ServingBackend {
 public:
  using Session = typename Engine::Session;
  using RequestId = model::kimi::RequestId;

  // lockstep: null on one rank; under tensor parallel, the channel that replays this session's
  // admits, cancels and steps on the other ranks (engine/lockstep.hpp).
  static Status create(Engine const* engine, SchedulerOptions options, ServingInfo info,
                       std::unique_ptr<Scheduler>* out, LockstepChannel* lockstep = nullptr) {
    std::string const fn = "Scheduler::create: ";
    if (engine == nullptr || out == nullptr) return Status::InvalidArgument(fn + "null argument");
    if (options.max_queued < 1) {  // every submit waits in the queue first
      return Status::InvalidArgument(fn + "max_queued " + std::to_string(options.max_queued) +
                                     " < 1: every request would be refused");
    }
    if (options.decode_log_interval < 0) {
      return Status::InvalidArgument(fn + "decode_log_interval " +
                                     std::to_string(options.decode_log_interval) +
                                     " < 0 (0: no decode log)");
    }
    std::unique_ptr<Scheduler> s(new Scheduler(*engine, std::move(options), std::move(info)));
    s->lockstep_ = lockstep;
    SPECDEC_RETURN_IF_ERROR(s->session_.open(s->options_.session));
    s->stats_.queue_capacity = s->options_.max_queued;
    s->stats_.kv_pages_total = s->options_.session.num_pages;
    s->stats_.page_size = engine->options().page_size;
    s->info_.max_running_requests = s->options_.session.max_running;
    s->info_.prefill_chunk = s->options_.session.max_prefill_tokens;
    s->worker_ = std::thread([p = s.get()] { p->loop(); });
    *out = std::move(s);
    return Status::Ok();
  }

  ~Scheduler() override { shutdown(/*cancel_running=*/true); }

  Status submit(GenerationRequest request, RequestEvents events, uint64_t* id) override {
    std::unique_lock lock(mu_);
    uint64_t const next = next_id_;
    Status s = session_.check(request, "request");
    if (s.ok() && stopping_) s = Status::Unsupported("the server is shutting down");
    if (s.ok() && static_cast<int64_t>(queue_.size()) >= options_.max_queued) {
      s = Status::Unsupported("the request queue is full (" + std::to_string(queue_.size()) +
                              " waiting); retry later");
    }
    if (!s.ok()) {
      ++stats_.requests_rejected;
      return s;
    }
    ++next_id_;
    ++stats_.requests_submitted;
    Pending p;
    p.id = next;
    p.request = std::move(request);
    p.events = std::move(events);
    p.submitted = Clock::now();
    queue_.push_back(std::move(p));
    if (id != nullptr) *id = next;
    wake_.notify_all();
    return Status::Ok();
  }

  void cancel(uint64_t id) override {
    std::lock_guard lock(mu_);
    cancels_.insert(id);
    wake_.notify_all();
  }

  ServingStats stats() const override {
    std::lock_guard lock(mu_);
    ServingStats s = stats_;
    s.queued = static_cast<int64_t>(queue_.size());
    return s;
  }

  void shutdown(bool cancel_running) override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      cancel_running_ = cancel_running_ || cancel_running;
      wake_.notify_all();
    }
    std::lock_guard join(join_mu_);  // concurrent callers wait for the one join
    if (worker_.joinable()) worker_.join();
  }

  ServingInfo const& info() const override { return info_; }

 private:
  using Clock = std::chrono::steady_clock;

  struct Pending {
    uint64_t id = 0;
    GenerationRequest request;
    RequestEvents events;
    Clock::time_point submitted;
  };
  struct Running {
    RequestEvents events;
    int64_t prompt_tokens = 0, output_tokens = 0;
    Clock::time_point submitted, admitted, first_token;
    bool has_first = false;
  };

  Scheduler(Engine const& engine, SchedulerOptions options, ServingInfo info)
      : options_(std::move(options)), info_(std::move(info)), session_(engine) {
    stats_.requests_finished.assign(static_cast<size_t>(FinishReason::kError) + 1, 0);
    stats_.accept_length = Histogram(accept_length_bounds(Engine::kPathCapacity));
    for (Histogram* h : {&stats_.step_draft_s, &stats_.step_verify_s, &stats_.step_commit_s}) {
      *h = Histogram({0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5});
    }
    stats_.time_to_first_token_s =
        Histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
    stats_.time_per_output_token_s =
        Histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1});
    stats_.e2e_request_s = Histogram({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300});
  }

  // Tokens committed per verify: 1 .. the deepest path + 1.
  static std::vector<double> accept_length_bounds(int path_capacity) {
    std::vector<double> b;
    for (int k = 1; k <= path_capacity; ++k) b.push_back(k);
    return b;
  }

  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  void log(std::string const& line) const {
    if (options_.log) {
      options_.log(line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

  // The request's outcome, its counters and histograms, then its on_finish. Called on the
  // worker thread without the lock held.
  void close(uint64_t id, Running& r, FinishReason reason, SpecMetrics metrics,
             std::string error = {}) {
    auto const now = Clock::now();
    RequestOutcome o;
    o.reason = reason;
    o.error = std::move(error);
    o.prompt_tokens = r.prompt_tokens;
    o.output_tokens = r.output_tokens;
    o.metrics = std::move(metrics);
    o.queue_s = seconds(r.submitted, r.admitted);
    o.first_token_s = r.has_first ? seconds(r.submitted, r.first_token) : 0.0;
    o.total_s = seconds(r.submitted, now);
    {
      std::lock_guard lock(mu_);
      ++stats_.requests_finished[static_cast<size_t>(reason)];
      stats_.e2e_request_s.observe(o.total_s);
      if (r.output_tokens > 1) {
        stats_.time_per_output_token_s.observe(seconds(r.first_token, now) /
                                               static_cast<double>(r.output_tokens - 1));
      }
    }
    (void)id;
    if (r.events.on_finish) r.events.on_finish(o);
  }

  // A queued request that never ran.
  void close_queued(Pending& p, FinishReason reason) {
    Running r;
    r.events = std::move(p.events);
    r.prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
    r.submitted = r.admitted = p.submitted;
    close(p.id, r, reason, SpecMetrics{});
  }

  // A running request leaves the session early (cancelled, a stop string, an error).
  void close_running(uint64_t id, FinishReason reason, std::string error = {}) {
    auto it = running_.find(id);
    if (it == running_.end()) return;
    SpecMetrics metrics = session_.metrics(static_cast<RequestId>(id));
    if (session_.cancel(static_cast<RequestId>(id)).ok() && lockstep_ != nullptr) {
      LockstepCommand c;
      c.kind = LockstepCommand::Kind::kCancel;
      c.id = static_cast<RequestId>(id);
      lockstep_->post(std::move(c));
    }
    Running r = std::move(it->second);
    running_.erase(it);
    close(id, r, reason, std::move(metrics), std::move(error));
  }

  void loop() {
    if (options_.on_worker_start) options_.on_worker_start();
    std::vector<StepEvent> events;
    ServingStats at_last_log;
    int logged_draft_steps = Engine::kSteps;  // the policy's, which the startup line gives
    std::optional<typename Session::GraphRun> logged_graph_run;
    auto last_log = Clock::now();
    int64_t decode_steps = 0;
    for (;;) {
      std::vector<Pending> dropped;  // cancelled while queued
      std::vector<uint64_t> cancelled;
      bool stop = false;
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] {
          return stopping_ || !cancels_.empty() || !running_.empty() ||
                 (!queue_.empty() && session_.fits_now(queue_.front().request));
        });
        // 1. Cancellations, and the whole queue at shutdown.
        for (auto it = queue_.begin(); it != queue_.end();) {
          if (stopping_ || cancels_.count(it->id)) {
            dropped.push_back(std::move(*it));
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
        for (uint64_t id : cancels_) {
          if (running_.count(id)) cancelled.push_back(id);
        }
        cancels_.clear();
        if (stopping_ && cancel_running_) {
          for (auto const& [id, r] : running_) cancelled.push_back(id);
        }
        // 2. Admission, first come first served.
        while (!queue_.empty() && session_.fits_now(queue_.front().request)) {
          Pending p = std::move(queue_.front());
          queue_.pop_front();
          Status const s =
              session_.admit(static_cast<RequestId>(p.id), p.request, /*stream=*/0);
          if (s.ok() && lockstep_ != nullptr) {
            LockstepCommand c;
            c.kind = LockstepCommand::Kind::kAdmit;
            c.id = static_cast<RequestId>(p.id);
            c.request = p.request;
            lockstep_->post(std::move(c));
          }
          if (!s.ok()) {
            // submit checked the request; a failure here is the engine's.
            log("specdec: admitting request " + std::to_string(p.id) + " failed: " +
                s.to_string());
            dropped.push_back(std::move(p));
            continue;
          }
          Running& r = running_[p.id];
          r.events = std::move(p.events);
          r.prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
          r.submitted = p.submitted;
          r.admitted = Clock::now();
          stats_.prompt_tokens += r.prompt_tokens;
        }
        stop = stopping_ && queue_.empty() && running_.empty() && cancelled.empty() &&
               dropped.empty();
      }
      for (Pending& p : dropped) close_queued(p, FinishReason::kCancelled);
      std::sort(cancelled.begin(), cancelled.end());
      cancelled.erase(std::unique(cancelled.begin(), cancelled.end()), cancelled.end());
      for (uint64_t id : cancelled) close_running(id, FinishReason::kCancelled);
      if (stop) break;
      if (session_.idle()) {
        update_gauges();
        continue;
      }
      // 3. One step.
      SpecMetrics const before = session_.totals();
      int64_t const replays_before = session_.graph_replays();
      Status const s = lockstep_ == nullptr
                           ? session_.step(&events)
                           : lockstep_->step_all([&] { return session_.step(&events); });
      if (!s.ok()) {
        log("specdec: engine step failed: " + s.to_string() +
            "; ending every running request with an error");
        std::vector<uint64_t> ids;
        for (auto const& [id, r] : running_) ids.push_back(id);
        for (uint64_t id : ids) close_running(id, FinishReason::kError, s.to_string());
        update_gauges();
        continue;
      }
      // 4. The step's counters first (a client that reads /metrics after its last token sees
      // them), then tokens and finished requests.
      bool decoded = false;
      int64_t new_tokens = 0;
      int batch = 0;
      for (StepEvent const& ev : events) {
        decoded = decoded || ev.verified;
        batch += ev.verified ? 1 : 0;
        if (running_.count(static_cast<uint64_t>(ev.id))) {
          new_tokens += static_cast<int64_t>(ev.tokens.size());
        }
      }
      if (decoded && session_.draft_steps() != logged_draft_steps) {
        logged_draft_steps = session_.draft_steps();
        log(draft_steps_line(batch, logged_draft_steps));
      }
      typename Session::GraphRun const graph_run = session_.graph_run(batch);
      if (decoded && !Engine::kHostDraft && graph_run != logged_graph_run) {
        logged_graph_run = graph_run;
        log(graph_line(batch, graph_run));
      }
      SpecMetrics const& after = session_.totals();
      {
        std::lock_guard lock(mu_);
        ++stats_.steps;
        stats_.generation_tokens += new_tokens;
        stats_.spec = after;
        if (decoded) {
          stats_.cuda_graph = session_.graph_replays() > replays_before;
          stats_.cuda_graph_batch = graph_run.captured ? graph_run.size : 0;
          stats_.step_draft_s.observe(after.draft_s + after.build_s - before.draft_s -
                                      before.build_s);
          stats_.step_verify_s.observe(after.verify_s - before.verify_s);
          stats_.step_commit_s.observe(after.commit_s + after.extend_s - before.commit_s -
                                       before.extend_s);
        }
      }
      update_gauges();
      for (StepEvent& ev : events) {
        uint64_t const id = static_cast<uint64_t>(ev.id);
        auto it = running_.find(id);
        if (it == running_.end()) continue;  // stopped earlier in this step
        Running& r = it->second;
        if (!ev.tokens.empty()) {
          if (!r.has_first) {
            r.has_first = true;
            r.first_token = Clock::now();
            std::lock_guard lock(mu_);
            stats_.time_to_first_token_s.observe(seconds(r.submitted, r.first_token));
          }
          r.output_tokens += static_cast<int64_t>(ev.tokens.size());
          if (ev.verified) {
            std::lock_guard lock(mu_);
            stats_.accept_length.observe(static_cast<double>(ev.tokens.size()));
          }
          bool const go_on = !r.events.on_tokens || r.events.on_tokens(ev.tokens);
          if (!go_on) {
            if (ev.finished) {  // already out of the session
              Running done = std::move(r);
              running_.erase(it);
              close(id, done, FinishReason::kStopString, std::move(ev.metrics));
            } else {
              close_running(id, FinishReason::kStopString);
            }
            continue;
          }
        }
        if (ev.finished) {
          Running done = std::move(r);
          running_.erase(it);
          close(id, done, ev.reason, std::move(ev.metrics));
        }
      }
      update_gauges();
      if (decoded && options_.decode_log_interval > 0 &&
          ++decode_steps % options_.decode_log_interval == 0) {
        ServingStats const now_stats = stats();
        auto const now = Clock::now();
        log(serve::decode_log_line(
            serve::decode_log_window(now_stats, at_last_log, seconds(last_log, now))));
        at_last_log = now_stats;
        last_log = now;
      }
    }
    update_gauges();
  }

  // The line a change of the drafting depth logs (EngineOptions::draft_steps_by_batch).
  static std::string draft_steps_line(int batch, int steps) {
    std::string const what =
        steps == 0 ? "drafting nothing (plain decoding)"
                   : "drafting " + std::to_string(steps) + " of " +
                         std::to_string(Engine::kSteps) + " steps (" +
                         std::to_string(Engine::draft_nodes(steps)) + " verified tokens)";
    return "specdec: batch " + std::to_string(batch) + ": " + what +
           ", as the draft steps by batch size say (--speculative-draft-steps-by-batch)";
  }

  static std::string graph_line(int batch, typename Session::GraphRun const& run) {
    std::string const head = "specdec: batch " + std::to_string(batch) + ": ";
    if (run.captured) {
      return head + (run.size > 0 ? "CUDA graphs of batch size " + std::to_string(run.size) +
                                        (run.size > batch ? " (padded)" : "")
                                  : std::string("CUDA graphs of its exact shape")) +
             ", for the target's forwards and the draft's proposal and extend";
    }
    std::string const why =
        run.size > 0 ? "padded to batch size " + std::to_string(run.size) +
                           ", CUDA graphs off (--disable-cuda-graph)"
        : Engine::Policy::Graph::kMaxBatch > 0 && batch > Engine::Policy::Graph::kMaxBatch
            ? "above the CUDA graph ladder's largest batch size " +
                  std::to_string(Engine::Policy::Graph::kMaxBatch)
            : std::string("CUDA graphs off");
    return head + "launched eagerly: " + why;
  }

  // The session's gauges into the stats (worker thread).
  void update_gauges() {
    int64_t const used = session_.num_pages() - session_.free_pages();
    int64_t const tokens = session_.cached_tokens();
    std::lock_guard lock(mu_);
    stats_.running = session_.running();
    stats_.kv_pages_used = used;
    stats_.kv_tokens = tokens;
  }

  SchedulerOptions options_;
  ServingInfo info_;
  Session session_;  // the worker thread's alone (open and check excepted)
  LockstepChannel* lockstep_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Pending> queue_;           // guarded by mu_
  std::set<uint64_t> cancels_;          // guarded by mu_
  std::map<uint64_t, Running> running_; // worker thread; its size read under mu_
  ServingStats stats_;                  // guarded by mu_
  uint64_t next_id_ = 1;                // guarded by mu_
  bool stopping_ = false, cancel_running_ = false;  // guarded by mu_
  std::mutex join_mu_;
  std::thread worker_;
};

}  // namespace specdec::engine
