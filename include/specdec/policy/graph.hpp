// Graph capture policies: how the engine launches one speculative step.
//   Eager                    no ladder: the engine pads nothing (on the CUDA executor each step
//                            shape is its own, captured only if the caller turns the target's
//                            graph cache on, KimiCudaModel::graphs)
//   GraphLadder<Bs...>       batch sizes Bs (strictly increasing, positive): the CUDA engine's
//                            target forwards run a batch padded to the smallest size >= its own,
//                            one CUDA graph per size (with KimiCudaModel::graphs on); above the
//                            largest size they run eagerly (model/kimi/forward_cuda.cuh's
//                            cuda_forward). So do the CUDA draft's proposals and its extends
//                            after a verify (engine/spec_engine.hpp's CudaDraftRun: filler rows
//                            on the draft cache's padding slot, DraftCudaModel::step_graphs).
// Run-time mirror: SpecConfig::cuda_graph_bs (--cuda-graph-bs), empty = Eager.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <type_traits>

namespace specdec {

enum class GraphLadderError : int {
  kOk = 0,
  kEmpty,          // GraphLadder<> (write Eager)
  kNonPositive,    // a batch size < 1
  kNotIncreasing,  // sizes not strictly increasing
};

// The ladder rules, in one place: GraphLadder's static_asserts and validate(SpecConfig).
// An empty list is an error for GraphLadder only (the run-time empty list means Eager).
// Pointer + count (not std::span) so that nvcc's front end can evaluate it in a constraint.
constexpr GraphLadderError graph_ladder_error(int const* batch_sizes, int count) {
  if (count == 0) return GraphLadderError::kEmpty;
  for (int i = 0; i < count; ++i) {
    if (batch_sizes[i] < 1) return GraphLadderError::kNonPositive;
    if (i > 0 && batch_sizes[i] <= batch_sizes[i - 1]) return GraphLadderError::kNotIncreasing;
  }
  return GraphLadderError::kOk;
}
constexpr GraphLadderError graph_ladder_error(std::span<int const> batch_sizes) {
  return graph_ladder_error(batch_sizes.data(), static_cast<int>(batch_sizes.size()));
}

// The captured size a batch runs in: the smallest size >= batch, or -1 (eager) above the ladder.
constexpr int graph_bucket(int const* batch_sizes, int count, int batch) {
  for (int i = 0; i < count; ++i) {
    if (batch_sizes[i] >= batch) return batch_sizes[i];
  }
  return -1;
}

struct Eager {
  static constexpr bool kCaptured = false;
  static constexpr std::array<int, 0> kBatchSizes = {};
  static constexpr int kMaxBatch = 0;
  static constexpr std::span<int const> batch_sizes() { return kBatchSizes; }
  static constexpr int bucket(int) { return -1; }
};

template <int... BatchSizes>
struct GraphLadder {
  static constexpr std::array<int, sizeof...(BatchSizes)> kBatchSizes = {BatchSizes...};
  static constexpr int kCount = static_cast<int>(sizeof...(BatchSizes));
  static constexpr GraphLadderError kError = graph_ladder_error(kBatchSizes.data(), kCount);
  static_assert(kError != GraphLadderError::kEmpty,
                "GraphLadder: needs at least one batch size; for no capture use Eager");
  static_assert(kError != GraphLadderError::kNonPositive, "GraphLadder: batch sizes must be >= 1");
  static_assert(kError != GraphLadderError::kNotIncreasing,
                "GraphLadder: batch sizes must be strictly increasing (sorted, no repeats), e.g. "
                "GraphLadder<1, 2, 4, 8>");

  static constexpr bool kCaptured = true;
  static constexpr int kMaxBatch = kBatchSizes.empty() ? 0 : kBatchSizes.back();
  static constexpr std::span<int const> batch_sizes() { return kBatchSizes; }
  static constexpr int bucket(int batch) { return graph_bucket(kBatchSizes.data(), kCount, batch); }
};

namespace detail {
template <class T>
struct GraphParts : std::false_type {};
template <>
struct GraphParts<Eager> : std::true_type {
  static constexpr bool kOk = true;
};
template <int... BatchSizes>
struct GraphParts<GraphLadder<BatchSizes...>> : std::true_type {
  static constexpr std::array<int, sizeof...(BatchSizes)> kBatchSizes = {BatchSizes...};
  static constexpr bool kOk =
      graph_ladder_error(kBatchSizes.data(), static_cast<int>(sizeof...(BatchSizes))) ==
      GraphLadderError::kOk;
};
}  // namespace detail

// Eager or a well-formed GraphLadder<...>. Checked without instantiating GraphLadder.
template <class T>
concept GraphPolicy = detail::GraphParts<T>::value && detail::GraphParts<T>::kOk;

}  // namespace specdec
