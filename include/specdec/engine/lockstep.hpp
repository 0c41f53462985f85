// LockstepChannel: tensor-parallel serving in one process. Every rank holds a SpecEngine::Session
// over its shard of the target (dist/shard.hpp); rank 0's Scheduler (engine/scheduler.hpp)
// decides what its session does (admit, cancel, step) and the channel replays the same calls, in
// the same order, on every other rank's session, so each step's collectives meet on every rank
// and every rank commits the same tokens (spec_engine.hpp "Tensor parallel").
//
//   LockstepChannel ch(ranks);
//   rank 0:  LockstepLeaderScope stop(ch, true);  // ch.stop() however rank 0 ends
//            Scheduler::create(&engine, options, info, &s, &ch); ...; s->shutdown();
//   rank r:  follow_lockstep(ch, r, &session)   // returns when ch.stop() is called
//
// The leader posts admit / cancel (bookkeeping, replayed before the followers' next step) and
// runs each step through step_all(leader_step): the step is posted, the leader's step runs on
// its own thread while each follower runs its own, and step_all returns when all are done: the
// leader's Status, else the first follower's error (named "rank r: ..."). A follower whose
// replayed admit or cancel fails reports that error at its next step. stop() ends every
// follower's loop (the leader calls it on every exit path, so no follower waits forever).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/engine/serving.hpp"
#include "specdec/engine/spec_engine.hpp"

namespace specdec::engine {

struct LockstepCommand {
  enum class Kind { kAdmit, kCancel, kStep };
  Kind kind = Kind::kStep;
  model::kimi::RequestId id = 0;
  GenerationRequest request;  // kAdmit
  uint32_t stream = 0;        // kAdmit
};

class LockstepChannel {
 public:
  // Rank 0 leads; ranks 1..ranks-1 follow.
  explicit LockstepChannel(int ranks)
      : cursor_(static_cast<size_t>(std::max(ranks, 1)), 0),
        step_status_(static_cast<size_t>(std::max(ranks, 1))),
        finished_(static_cast<size_t>(std::max(ranks, 1)), 0) {}

  int ranks() const { return static_cast<int>(cursor_.size()); }

  // Leader: an admit or cancel the followers replay before their next step.
  void post(LockstepCommand c) {
    std::lock_guard lock(mu_);
    log_.push_back(std::move(c));
    wake_.notify_all();
  }

  // Leader: one step on every rank at once (leader_step on this thread).
  Status step_all(std::function<Status()> const& leader_step) {
    uint64_t step = 0;
    {
      std::lock_guard lock(mu_);
      step = ++posted_steps_;
      LockstepCommand c;
      c.kind = LockstepCommand::Kind::kStep;
      log_.push_back(std::move(c));
      wake_.notify_all();
    }
    Status const mine = leader_step();
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return stopped_ || finished_steps_all(step); });
    if (stopped_) return Status::Internal("lockstep: stopped during a step");
    trim();
    if (!mine.ok()) return mine;
    for (size_t r = 1; r < step_status_.size(); ++r) {
      if (!step_status_[r].ok()) return step_status_[r].prefixed("rank " + std::to_string(r) + ": ");
    }
    return Status::Ok();
  }

  // Leader: every follower's loop ends.
  void stop() {
    std::lock_guard lock(mu_);
    stopped_ = true;
    wake_.notify_all();
    done_.notify_all();
  }

  // Follower `rank`: the next command, false once stopped.
  bool next(int rank, LockstepCommand* out) {
    std::unique_lock lock(mu_);
    size_t& at = cursor_[static_cast<size_t>(rank)];
    wake_.wait(lock, [&] { return stopped_ || at < base_ + log_.size(); });
    if (stopped_) return false;
    *out = log_[at - base_];
    ++at;
    return true;
  }

  // Follower `rank`: its step finished with `s` (and any earlier replay error).
  void step_done(int rank, Status s) {
    std::lock_guard lock(mu_);
    step_status_[static_cast<size_t>(rank)] = std::move(s);
    ++finished_[static_cast<size_t>(rank)];
    done_.notify_all();
  }

 private:
  bool finished_steps_all(uint64_t step) const {
    for (size_t r = 1; r < finished_.size(); ++r) {
      if (finished_[r] < step) return false;
    }
    return true;
  }
  // Drops the commands every follower has read.
  void trim() {
    size_t low = base_ + log_.size();
    for (size_t r = 1; r < cursor_.size(); ++r) low = std::min(low, cursor_[r]);
    while (base_ < low) {
      log_.pop_front();
      ++base_;
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<LockstepCommand> log_;  // commands base_ .. base_ + size - 1
  size_t base_ = 0;
  std::vector<size_t> cursor_;       // per rank: the next command index
  std::vector<Status> step_status_;  // per rank: its last step's Status
  std::vector<uint64_t> finished_;   // per rank: steps it finished
  uint64_t posted_steps_ = 0;
  bool stopped_ = false;
};

// Stops the followers when the leader's scope ends, however it ends (a follower's scope: nothing).
class LockstepLeaderScope {
 public:
  LockstepLeaderScope(LockstepChannel& channel, bool leader) : channel_(channel), leader_(leader) {}
  LockstepLeaderScope(LockstepLeaderScope const&) = delete;
  LockstepLeaderScope& operator=(LockstepLeaderScope const&) = delete;
  ~LockstepLeaderScope() {
    if (leader_) channel_.stop();
  }

 private:
  LockstepChannel& channel_;
  bool leader_;
};

// Follower `rank`: replays the leader's admits, cancels and steps on `session` until stop().
// A cancel of a request the follower already finished is not an error (the leader's cancel can
// race its own finish only by the same step, which both sides take in order).
template <class Session>
void follow_lockstep(LockstepChannel& ch, int rank, Session* session) {
  LockstepCommand c;
  std::vector<StepEvent> events;
  Status pending;  // a failed replay, reported with the next step
  while (ch.next(rank, &c)) {
    switch (c.kind) {
      case LockstepCommand::Kind::kAdmit: {
        Status const s = session->admit(c.id, c.request, c.stream);
        if (!s.ok() && pending.ok()) pending = s;
        break;
      }
      case LockstepCommand::Kind::kCancel:
        if (session->has_request(c.id)) {
          Status const s = session->cancel(c.id);
          if (!s.ok() && pending.ok()) pending = s;
        }
        break;
      case LockstepCommand::Kind::kStep: {
        Status s = session->step(&events);
        if (!pending.ok()) s = std::exchange(pending, Status::Ok());
        ch.step_done(rank, s);
        break;
      }
    }
  }
}

}  // namespace specdec::engine
