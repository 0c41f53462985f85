// The Communicator concept, the CPU communicator (ranks = threads of one process over shared
// memory) and run_ranks, which runs one function per rank and stops the whole group when one rank
// fails. The NCCL communicator (dist/nccl.cuh) has the same calls on device memory.
//
//   c.rank(), c.size()
//   c.all_reduce_sum(float* data, n)          data [n] := sum over ranks of data [n]
//   c.all_gather(float const* in, n, out)     out [size, n]: row q = rank q's in [n]
//   c.all_gather_bytes(std::byte const* in, bytes, out)   the same on raw bytes (any POD)
//   c.broadcast(std::byte* data, bytes, root) data [bytes] := root's data
//   c.barrier()
// Every rank calls the same collectives in the same order with the same sizes; the result is the
// same on every rank, bit for bit (the CPU communicator sums in rank order 0, 1, ..., size-1 on
// every rank; NCCL's all-reduce ends with every rank holding the same values), so ranks that run
// the same deterministic program after a collective stay in lockstep: the same accepted tokens,
// the same Philox draws.
//
// Failure, never a hang: a rank whose collective does not match the others' (another call or size)
// fails every rank with both calls named; a rank that fails (run_ranks: its function returned an
// error or threw) aborts the group, and every rank waiting in or later entering a collective gets
// "aborted: rank r failed: <reason>"; a collective that waits longer than the group's timeout
// fails naming the call and the ranks that arrived. run_ranks returns the failing rank's own error
// ("rank r of n: <reason>"), not the aborts it caused.
#pragma once

#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "specdec/core/status.hpp"

namespace specdec::dist {

template <class C>
concept Communicator = requires(C& c, float* f, float const* cf, std::byte* b, int64_t n, int r) {
  { c.rank() } -> std::same_as<int>;
  { c.size() } -> std::same_as<int>;
  { c.all_reduce_sum(f, n) } -> std::same_as<Status>;
  { c.all_gather(cf, n, f) } -> std::same_as<Status>;
  { c.all_gather_bytes(static_cast<std::byte const*>(b), n, b) } -> std::same_as<Status>;
  { c.broadcast(b, n, r) } -> std::same_as<Status>;
  { c.barrier() } -> std::same_as<Status>;
};

// The state the ranks of one CPU group share. Create one per group, then one CpuCommunicator per
// rank (run_ranks does both).
class CpuCommGroup {
 public:
  explicit CpuCommGroup(int size, std::chrono::milliseconds timeout = std::chrono::minutes(10))
      : size_(size), timeout_(timeout), posts_(static_cast<size_t>(size > 0 ? size : 0)) {}
  CpuCommGroup(CpuCommGroup const&) = delete;
  CpuCommGroup& operator=(CpuCommGroup const&) = delete;

  int size() const { return size_; }

  // Fails every rank's current and later collectives with "rank `rank` failed: reason".
  void abort(int rank, std::string const& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abort_rank_ = rank;
    abort_reason_ = "aborted: rank " + std::to_string(rank) + " failed: " + reason;
    cv_.notify_all();
  }
  // The rank whose failure aborted the group (-1: none).
  int abort_rank() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_ ? abort_rank_ : -1;
  }

 private:
  friend class CpuCommunicator;

  struct Post {
    char const* op = "";
    int64_t count = 0;
    int root = 0;
    void const* data = nullptr;
  };

  // Waits until every rank has arrived at this barrier (one per phase of a collective).
  Status arrive(int rank, char const* op, std::unique_lock<std::mutex>& lock) {
    if (aborted_) return Status::Internal(abort_reason_);
    uint64_t const gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status::Ok();
    }
    bool const done = cv_.wait_for(lock, timeout_, [&] { return aborted_ || generation_ != gen; });
    if (generation_ != gen) return Status::Ok();
    if (aborted_) return Status::Internal(abort_reason_);
    std::string const why = "rank " + std::to_string(rank) + " waited " +
                            std::to_string(timeout_.count()) + " ms in " + op + " with " +
                            std::to_string(arrived_) + " of " + std::to_string(size_) +
                            " ranks arrived";
    (void)done;
    aborted_ = true;
    abort_rank_ = rank;
    abort_reason_ = "aborted: " + why;
    cv_.notify_all();
    return Status::Internal("timed out: " + why);
  }

  int size_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  int abort_rank_ = -1;
  std::string abort_reason_;
  std::vector<Post> posts_;
};

// One rank's handle on a CpuCommGroup. Host memory.
class CpuCommunicator {
 public:
  CpuCommunicator(CpuCommGroup* group, int rank) : group_(group), rank_(rank) {}

  int rank() const { return rank_; }
  int size() const { return group_->size(); }

  Status all_reduce_sum(float* data, int64_t n) {
    std::vector<float> sum;
    return collective(
        "all_reduce_sum", n, 0, data,
        [&](std::vector<CpuCommGroup::Post> const& p) {
          sum.assign(static_cast<size_t>(n), 0.0f);
          for (auto const& post : p) {
            float const* src = static_cast<float const*>(post.data);
            for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += src[i];
          }
        },
        [&] { std::copy(sum.begin(), sum.end(), data); });
  }

  Status all_gather(float const* in, int64_t n, float* out) {
    return collective(
        "all_gather", n, 0, in,
        [&](std::vector<CpuCommGroup::Post> const& p) {
          for (size_t q = 0; q < p.size(); ++q) {
            float const* src = static_cast<float const*>(p[q].data);
            std::copy(src, src + n, out + static_cast<int64_t>(q) * n);
          }
        },
        [] {});
  }

  Status all_gather_bytes(std::byte const* in, int64_t bytes, std::byte* out) {
    return collective(
        "all_gather_bytes", bytes, 0, in,
        [&](std::vector<CpuCommGroup::Post> const& p) {
          for (size_t q = 0; q < p.size(); ++q) {
            if (bytes > 0) {
              std::memcpy(out + static_cast<int64_t>(q) * bytes, p[q].data,
                          static_cast<size_t>(bytes));
            }
          }
        },
        [] {});
  }

  Status broadcast(std::byte* data, int64_t bytes, int root) {
    if (root < 0 || root >= size()) {
      return Status::InvalidArgument("CpuCommunicator::broadcast: root " + std::to_string(root) +
                                     " is not a rank of a group of " + std::to_string(size()));
    }
    return collective(
        "broadcast", bytes, root, data,
        [&](std::vector<CpuCommGroup::Post> const& p) {
          if (rank_ != root && bytes > 0) {
            std::memcpy(data, p[static_cast<size_t>(root)].data, static_cast<size_t>(bytes));
          }
        },
        [] {});
  }

  Status barrier() {
    return collective(
        "barrier", 0, 0, nullptr, [](auto const&) {}, [] {});
  }

 private:
  // Phase 1: post (op, size, root, buffer), wait for all; check that the calls agree; `read` the
  // others' buffers. Phase 2: wait until every rank has read, then `write` this rank's buffer.
  template <class Read, class Write>
  Status collective(char const* op, int64_t count, int root, void const* data, Read&& read,
                    Write&& write) {
    std::string const fn = std::string("CpuCommunicator::") + op + " (rank " +
                           std::to_string(rank_) + " of " + std::to_string(size()) + "): ";
    if (count < 0) return Status::InvalidArgument(fn + "negative size " + std::to_string(count));
    std::vector<CpuCommGroup::Post> posts;
    {
      std::unique_lock<std::mutex> lock(group_->mu_);
      group_->posts_[static_cast<size_t>(rank_)] = {op, count, root, data};
      SPECDEC_RETURN_IF_ERROR(group_->arrive(rank_, op, lock).prefixed(fn));
      posts = group_->posts_;
    }
    for (size_t q = 0; q < posts.size(); ++q) {
      auto const& p = posts[q];
      if (std::strcmp(p.op, op) != 0 || p.count != count || p.root != root) {
        std::string const why = "collectives do not match: rank " + std::to_string(rank_) +
                                " called " + op + "(" + std::to_string(count) + ", root " +
                                std::to_string(root) + "), rank " + std::to_string(q) + " called " +
                                p.op + "(" + std::to_string(p.count) + ", root " +
                                std::to_string(p.root) + ")";
        group_->abort(rank_, why);
        return Status::Internal(fn + why);
      }
    }
    read(posts);
    {
      std::unique_lock<std::mutex> lock(group_->mu_);
      SPECDEC_RETURN_IF_ERROR(group_->arrive(rank_, op, lock).prefixed(fn));
    }
    write();
    return Status::Ok();
  }

  CpuCommGroup* group_;
  int rank_;
};

static_assert(Communicator<CpuCommunicator>);

// Runs fn(rank, communicator) on `size` threads sharing one CpuCommGroup. A rank whose fn returns
// an error or throws aborts the group (the others' collectives fail instead of waiting); the
// result is the first failing rank's own error, "rank r of n: <its message>".
inline Status run_ranks(int size, std::function<Status(int, CpuCommunicator&)> const& fn,
                        std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
  if (size < 1) {
    return Status::InvalidArgument("run_ranks: size " + std::to_string(size) + " < 1");
  }
  CpuCommGroup group(size, timeout);
  std::vector<Status> status(static_cast<size_t>(size));
  auto body = [&](int rank) {
    CpuCommunicator comm(&group, rank);
    Status s = [&]() -> Status {
      try {
        return fn(rank, comm);
      } catch (std::exception const& e) {
        return Status::Internal(std::string("exception: ") + e.what());
      }
    }();
    if (!s.ok()) group.abort(rank, s.message());
    // (void): nvcc's front end reads the [[nodiscard]] of Status into the Status& an
    // assignment returns.
    (void)(status[static_cast<size_t>(rank)] = std::move(s));
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < size; ++r) threads.emplace_back(body, r);
  body(0);
  for (auto& t : threads) t.join();
  int r = group.abort_rank();
  if (r < 0 || status[static_cast<size_t>(r)].ok()) {
    r = -1;
    for (int q = 0; q < size && r < 0; ++q) {
      if (!status[static_cast<size_t>(q)].ok()) r = q;
    }
  }
  if (r < 0) return Status::Ok();
  Status const& s = status[static_cast<size_t>(r)];
  return Status(s.code(),
                "rank " + std::to_string(r) + " of " + std::to_string(size) + ": " + s.message());
}

}  // namespace specdec::dist
