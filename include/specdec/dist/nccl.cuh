// The NCCL communicator: dist/communicator.hpp's calls on DEVICE memory, queued on the stream
// bound with bind_stream (the model's forward binds its own), in stream order. Ranks are GPUs:
//   nccl_init_all(devices, &comms)          one process, one communicator per GPU
//                                           (ncclCommInitAll); drive each from its own thread
//   nccl_unique_id(nnodes, node_rank, "host:port", &id) + nccl_init_rank(id, world, rank, device)
//                                           several processes or nodes (SGLang's --nnodes,
//                                           --node-rank, --dist-init-addr): rank 0's process
//                                           creates the ncclUniqueId and hands it to the other
//                                           nodes over TCP
//   run_nccl_ranks(comms, fn)               fn(rank, comm) on one thread per communicator; a rank
//                                           that fails aborts every communicator (ncclCommAbort),
//                                           so the others' pending collectives end instead of
//                                           hanging; the failing rank's own error is returned
// Every call checks NCCL's result and the communicator's asynchronous error; synchronize(timeout)
// waits for the stream and fails, naming the rank, when a collective has not completed in time.
// Built without NCCL (SPECDEC_WITH_NCCL unset: cmake found no NCCL), every call returns
// Unsupported naming the missing library.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(SPECDEC_WITH_NCCL)
#include <nccl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#endif

#include "specdec/core/cuda.cuh"
#include "specdec/core/status.hpp"
#include "specdec/dist/communicator.hpp"

namespace specdec::dist {

#if defined(SPECDEC_WITH_NCCL)
inline constexpr bool kHaveNccl = true;
using NcclUniqueId = ncclUniqueId;
#else
inline constexpr bool kHaveNccl = false;
struct NcclUniqueId {
  char internal[128];
};
#endif

inline Status nccl_missing(std::string const& fn) {
  return Status::Unsupported(fn +
                             ": specdec was built without NCCL (cmake found no nccl.h / "
                             "libnccl; install NCCL or set NCCL_ROOT)");
}

// Move-only (one owner of the NCCL communicator); abort() may be called from another thread.
class NcclCommunicator {
 public:
  NcclCommunicator() = default;
  NcclCommunicator(NcclCommunicator const&) = delete;
  NcclCommunicator& operator=(NcclCommunicator const&) = delete;
  NcclCommunicator(NcclCommunicator&&) noexcept = default;
  NcclCommunicator& operator=(NcclCommunicator&&) noexcept = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  // The stream the next collectives are queued on (the forward's).
  void bind_stream(cudaStream_t s) { stream_ = s; }

  Status all_reduce_sum(float* data, int64_t n) {
#if defined(SPECDEC_WITH_NCCL)
    SPECDEC_RETURN_IF_ERROR(async_error());
    return check(
        ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32, ncclSum, comm(), stream_),
        "ncclAllReduce");
#else
    (void)data, (void)n;
    return nccl_missing("NcclCommunicator::all_reduce_sum");
#endif
  }
  Status all_gather(float const* in, int64_t n, float* out) {
#if defined(SPECDEC_WITH_NCCL)
    SPECDEC_RETURN_IF_ERROR(async_error());
    return check(ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat32, comm(), stream_),
                 "ncclAllGather");
#else
    (void)in, (void)n, (void)out;
    return nccl_missing("NcclCommunicator::all_gather");
#endif
  }
  Status all_gather_bytes(std::byte const* in, int64_t bytes, std::byte* out) {
#if defined(SPECDEC_WITH_NCCL)
    SPECDEC_RETURN_IF_ERROR(async_error());
    return check(ncclAllGather(in, out, static_cast<size_t>(bytes), ncclUint8, comm(), stream_),
                 "ncclAllGather (bytes)");
#else
    (void)in, (void)bytes, (void)out;
    return nccl_missing("NcclCommunicator::all_gather_bytes");
#endif
  }
  Status broadcast(std::byte* data, int64_t bytes, int root) {
#if defined(SPECDEC_WITH_NCCL)
    SPECDEC_RETURN_IF_ERROR(async_error());
    return check(
        ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm(), stream_),
        "ncclBroadcast");
#else
    (void)data, (void)bytes, (void)root;
    return nccl_missing("NcclCommunicator::broadcast");
#endif
  }
  // All ranks' queued work done: a one-float all-reduce, then synchronize().
  Status barrier() {
#if defined(SPECDEC_WITH_NCCL)
    if (state_ == nullptr) return Status::Internal(who() + "barrier: no communicator");
    if (state_->barrier_buf == nullptr) {
      SPECDEC_CUDA_TRY(cudaMalloc(&state_->barrier_buf, sizeof(float)));
    }
    SPECDEC_RETURN_IF_ERROR(all_reduce_sum(state_->barrier_buf, 1));
    return synchronize();
#else
    return nccl_missing("NcclCommunicator::barrier");
#endif
  }

  // Waits for the bound stream; fails (and aborts the communicator, so no rank waits forever)
  // when NCCL reports an asynchronous error or `timeout` passes first.
  Status synchronize(std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
#if defined(SPECDEC_WITH_NCCL)
    auto const start = std::chrono::steady_clock::now();
    while (true) {
      cudaError_t const q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return Status::Ok();
      if (q != cudaErrorNotReady) return cuda_status(q, (who() + "cudaStreamQuery").c_str());
      SPECDEC_RETURN_IF_ERROR(async_error());
      if (std::chrono::steady_clock::now() - start > timeout) {
        abort();
        return Status::Internal(who() + "a collective did not complete within " +
                                std::to_string(timeout.count()) + " ms; communicator aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
#else
    (void)timeout;
    return nccl_missing("NcclCommunicator::synchronize");
#endif
  }

  // Ends this rank's pending collectives (another rank failed); the communicator is then unusable.
  void abort() {
#if defined(SPECDEC_WITH_NCCL)
    if (state_ == nullptr) return;
    std::lock_guard<std::mutex> lock(state_->mu);
    if (!state_->aborted.exchange(true)) ncclCommAbort(state_->comm);
#endif
  }

#if defined(SPECDEC_WITH_NCCL)
  // Takes ownership of an initialised communicator.
  static NcclCommunicator adopt(ncclComm_t comm, int rank, int size, int device) {
    NcclCommunicator c;
    c.state_ = std::make_shared<State>();
    c.state_->comm = comm;
    c.rank_ = rank;
    c.size_ = size;
    c.device_ = device;
    return c;
  }
#endif

 private:
  std::string who() const {
    return "NCCL rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (GPU " +
           std::to_string(device_) + "): ";
  }
#if defined(SPECDEC_WITH_NCCL)
  // The NCCL communicator and what is shared with a thread that aborts it.
  struct State {
    ncclComm_t comm = nullptr;
    std::mutex mu;
    std::atomic<bool> aborted{false};
    float* barrier_buf = nullptr;
    ~State() {
      if (barrier_buf != nullptr) cudaFree(barrier_buf);
      if (!aborted && comm != nullptr) ncclCommDestroy(comm);
    }
  };
  ncclComm_t comm() const { return state_ ? state_->comm : nullptr; }
  Status check(ncclResult_t r, char const* call) {
    if (r != ncclSuccess && r != ncclInProgress) {
      return Status::Internal(who() + call + ": " + ncclGetErrorString(r) +
                              (comm() ? std::string(" (") + ncclGetLastError(comm()) + ")" : ""));
    }
    return async_error();
  }
  Status async_error() {
    if (state_ == nullptr) return Status::Internal(who() + "no communicator (nccl_init_*)");
    if (state_->aborted) return Status::Internal(who() + "the communicator was aborted");
    ncclResult_t a = ncclSuccess;
    ncclResult_t const r = ncclCommGetAsyncError(state_->comm, &a);
    if (r != ncclSuccess) return Status::Internal(who() + "ncclCommGetAsyncError failed");
    if (a != ncclSuccess && a != ncclInProgress) {
      return Status::Internal(who() + "asynchronous NCCL error: " + ncclGetErrorString(a));
    }
    return Status::Ok();
  }
  std::shared_ptr<State> state_;
#endif
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

static_assert(Communicator<NcclCommunicator>);

// One communicator per device of `devices` (ranks in that order), in one process.
inline Status nccl_init_all(std::vector<int> const& devices, std::vector<NcclCommunicator>* out) {
  std::string const fn = "nccl_init_all";
  if (devices.empty()) return Status::InvalidArgument(fn + ": no devices");
#if defined(SPECDEC_WITH_NCCL)
  int count = 0;
  SPECDEC_CUDA_TRY(cudaGetDeviceCount(&count));
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return Status::InvalidArgument(fn + ": GPU " + std::to_string(d) + " does not exist (" +
                                     std::to_string(count) + " visible)");
    }
  }
  int const n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  ncclResult_t const r = ncclCommInitAll(comms.data(), n, devices.data());
  if (r != ncclSuccess) {
    return Status::Internal(fn + ": ncclCommInitAll over " + std::to_string(n) +
                            " GPUs: " + ncclGetErrorString(r));
  }
  out->clear();
  for (int i = 0; i < n; ++i) {
    out->push_back(NcclCommunicator::adopt(comms[static_cast<size_t>(i)], i, n,
                                           devices[static_cast<size_t>(i)]));
  }
  return Status::Ok();
#else
  (void)out;
  return nccl_missing(fn);
#endif
}

#if defined(SPECDEC_WITH_NCCL)
namespace detail {

// "host:port" -> a connected or listening socket address.
inline Status resolve(std::string const& addr, sockaddr_storage* out, socklen_t* len) {
  size_t const colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) {
    return Status::InvalidArgument("--dist-init-addr '" + addr + "': expected HOST:PORT");
  }
  std::string const host = addr.substr(0, colon), port = addr.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int const e = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (e != 0 || res == nullptr) {
    return Status::InvalidArgument("--dist-init-addr '" + addr + "': " + gai_strerror(e));
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return Status::Ok();
}

}  // namespace detail
#endif

// The ncclUniqueId of a job of `nnodes` processes: node 0 creates it and sends it to each other
// node that connects to `addr` (HOST:PORT, node 0's address); the others connect (retrying until
// `timeout`) and receive it.
inline Status nccl_unique_id(int nnodes, int node_rank, std::string const& addr, NcclUniqueId* out,
                             std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  std::string const fn = "nccl_unique_id (node " + std::to_string(node_rank) + " of " +
                         std::to_string(nnodes) + ", " + addr + "): ";
  if (nnodes < 1 || node_rank < 0 || node_rank >= nnodes) {
    return Status::InvalidArgument(fn + "--node-rank must be in [0, --nnodes)");
  }
#if defined(SPECDEC_WITH_NCCL)
  if (nnodes == 1) {
    ncclResult_t const r = ncclGetUniqueId(out);
    return r == ncclSuccess ? Status::Ok()
                            : Status::Internal(fn + "ncclGetUniqueId: " + ncclGetErrorString(r));
  }
  sockaddr_storage sa{};
  socklen_t len = 0;
  SPECDEC_RETURN_IF_ERROR(detail::resolve(addr, &sa, &len).prefixed(fn));
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  auto closer = [](int* fd) {
    if (*fd >= 0) ::close(*fd);
  };
  if (node_rank == 0) {
    ncclResult_t const r = ncclGetUniqueId(out);
    if (r != ncclSuccess) return Status::Internal(fn + "ncclGetUniqueId: " + ncclGetErrorString(r));
    int fd = ::socket(sa.ss_family, SOCK_STREAM, 0);
    std::unique_ptr<int, decltype(closer)> guard(&fd, closer);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
        ::listen(fd, nnodes) != 0) {
      return Status::Internal(fn + "cannot listen: " + std::strerror(errno));
    }
    for (int served = 1; served < nnodes; ++served) {
      timeval tv{};
      auto const left = std::chrono::duration_cast<std::chrono::seconds>(
          deadline - std::chrono::steady_clock::now());
      tv.tv_sec = std::max<long>(1, static_cast<long>(left.count()));
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) {
        return Status::Internal(fn + "only " + std::to_string(served - 1) + " of " +
                                std::to_string(nnodes - 1) +
                                " nodes connected: " + std::strerror(errno));
      }
      ssize_t const sent = ::send(c, out, sizeof(*out), MSG_NOSIGNAL);
      ::close(c);
      if (sent != static_cast<ssize_t>(sizeof(*out))) {
        return Status::Internal(fn + "sending the NCCL id failed: " + std::strerror(errno));
      }
    }
    return Status::Ok();
  }
  while (true) {
    int fd = ::socket(sa.ss_family, SOCK_STREAM, 0);
    std::unique_ptr<int, decltype(closer)> guard(&fd, closer);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) {
      size_t got = 0;
      char* p = reinterpret_cast<char*>(out);
      while (got < sizeof(*out)) {
        ssize_t const n = ::recv(fd, p + got, sizeof(*out) - got, 0);
        if (n <= 0) return Status::Internal(fn + "node 0 closed before sending the NCCL id");
        got += static_cast<size_t>(n);
      }
      return Status::Ok();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Internal(fn + "node 0 did not answer within " +
                              std::to_string(timeout.count()) + " ms: " + std::strerror(errno));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
#else
  (void)addr, (void)out, (void)timeout;
  return nccl_missing(fn);
#endif
}

// This process's communicator for global rank `rank` of `world` on `device`, from the job's id.
inline Status nccl_init_rank(NcclUniqueId const& id, int world, int rank, int device,
                             NcclCommunicator* out) {
  std::string const fn = "nccl_init_rank (rank " + std::to_string(rank) + " of " +
                         std::to_string(world) + ", GPU " + std::to_string(device) + "): ";
#if defined(SPECDEC_WITH_NCCL)
  SPECDEC_CUDA_TRY(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  ncclResult_t const r = ncclCommInitRank(&comm, world, id, rank);
  if (r != ncclSuccess) return Status::Internal(fn + "ncclCommInitRank: " + ncclGetErrorString(r));
  *out = NcclCommunicator::adopt(comm, rank, world, device);
  return Status::Ok();
#else
  (void)id, (void)world, (void)rank, (void)device, (void)out;
  return nccl_missing(fn);
#endif
}

// fn(rank, comm) for each communicator on its own thread (its GPU current); the first failing
// rank aborts every communicator and its own error is returned, "rank r of n: <reason>".
inline Status run_nccl_ranks(std::vector<NcclCommunicator>& comms,
                             std::function<Status(int, NcclCommunicator&)> const& fn) {
  int const n = static_cast<int>(comms.size());
  std::vector<Status> status(static_cast<size_t>(n));
  std::mutex mu;
  int first = -1;
  auto body = [&](int i) {
    NcclCommunicator& c = comms[static_cast<size_t>(i)];
    Status s = cuda_status(cudaSetDevice(c.device()), "cudaSetDevice");
    if (s.ok()) {
      try {
        s = fn(c.rank(), c);
      } catch (std::exception const& e) {
        s = Status::Internal(std::string("exception: ") + e.what());
      }
    }
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first < 0) {
        first = i;
        for (auto& other : comms) other.abort();
      }
    }
    status[static_cast<size_t>(i)] = std::move(s);
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back(body, i);
  if (n > 0) body(0);
  for (auto& t : threads) t.join();
  if (first < 0) return Status::Ok();
  Status const& s = status[static_cast<size_t>(first)];
  return Status(s.code(), "rank " + std::to_string(comms[static_cast<size_t>(first)].rank()) +
                              " of " + std::to_string(n) + ": " + s.message());
}

}  // namespace specdec::dist
