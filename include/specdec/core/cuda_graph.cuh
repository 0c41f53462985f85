// CUDA graphs keyed by the launch shape they were captured for: the first run of a key captures
// what `enqueue(stream)` queues into a graph and replays it; later runs of the key replay it.
//   GraphCache<Key> graphs;                   capacity 0: every run is eager
//   graphs.set_capacity(16);                  keep up to 16 shapes (least recently used leave)
//   graphs.run(key, stream, [&] { return enqueue(stream); })
//                                             stream: a created stream (the legacy default
//                                             stream cannot be captured: an error)
// Key: a regular type with operator==, holding everything the queued work bakes in (sizes, grid
// shapes, pointers); data that changes between runs must be read from device memory the caller
// rewrites before each run (stream-ordered). `enqueue` must queue stream work only: no host
// synchronisation, no allocation, no host read of a result. A failed capture is discarded
// (nothing cached) and its status returned. Move-only; destroys its graphs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/core/status.hpp"

namespace specdec {

template <class Key>
class GraphCache {
 public:
  GraphCache() = default;
  GraphCache(GraphCache&&) = default;
  GraphCache& operator=(GraphCache&&) = default;

  size_t capacity() const { return capacity_; }
  void set_capacity(size_t n) {
    capacity_ = n;
    while (entries_.size() > capacity_) evict_oldest();
  }
  // Forgets every graph (e.g. when the buffers they point into move).
  void clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

  template <class Enqueue>
  Status run(Key const& key, cudaStream_t stream, Enqueue&& enqueue) {
    if (capacity_ == 0) return enqueue();
    ++clock_;
    for (Entry& e : entries_) {
      if (e.key == key) {
        e.last_use = clock_;
        ++replays_;
        return cuda_status(cudaGraphLaunch(e.exec.get(), stream), "cudaGraphLaunch");
      }
    }
    if (stream == nullptr || stream == cudaStreamLegacy) {
      return Status::InvalidArgument(
          "CUDA graphs: the legacy default stream cannot be captured; run on a stream made by "
          "cudaStreamCreate (or set the graph capacity to 0 for eager launches)");
    }
    SPECDEC_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    Status const queued = enqueue();
    cudaGraph_t graph = nullptr;
    cudaError_t const ended = cudaStreamEndCapture(stream, &graph);
    std::unique_ptr<CUgraph_st, GraphDeleter> owned(graph);
    SPECDEC_RETURN_IF_ERROR(queued.prefixed("while capturing a CUDA graph: "));
    SPECDEC_RETURN_IF_ERROR(cuda_status(ended, "cudaStreamEndCapture"));
    cudaGraphExec_t exec = nullptr;
    SPECDEC_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
    if (entries_.size() >= capacity_) evict_oldest();
    entries_.push_back(Entry{key, std::unique_ptr<CUgraphExec_st, ExecDeleter>(exec), clock_});
    ++captures_;
    return cuda_status(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  }

 private:
  struct GraphDeleter {
    void operator()(cudaGraph_t g) const { cudaGraphDestroy(g); }
  };
  struct ExecDeleter {
    void operator()(cudaGraphExec_t g) const { cudaGraphExecDestroy(g); }
  };
  struct Entry {
    Key key;
    std::unique_ptr<CUgraphExec_st, ExecDeleter> exec;
    uint64_t last_use = 0;
  };
  void evict_oldest() {
    if (entries_.empty()) return;
    size_t oldest = 0;
    for (size_t i = 1; i < entries_.size(); ++i) {
      if (entries_[i].last_use < entries_[oldest].last_use) oldest = i;
    }
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(oldest));
  }

  std::vector<Entry> entries_;
  size_t capacity_ = 0;
  uint64_t clock_ = 0;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace specdec
