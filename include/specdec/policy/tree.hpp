// Tree shapes: top-k per draft step, draft depth (steps) and verified nodes (root included).
//   TreeShape<TopK, Steps, Nodes>   a draft tree: step 0 proposes TopK children of the root, each
//                                   later step scores TopK x TopK children of the TopK best leaves;
//                                   the best Nodes - 1 candidates (parents first) are verified.
//   Chain<Steps>                    TreeShape<1, Steps, Steps + 1>
//   NoTree                          TreeShape<0, 0, 1>: the root only (NoDraft, plain decoding)
// Flags: TopK = --speculative-eagle-topk, Steps = --speculative-num-steps,
//        Nodes = --speculative-num-draft-tokens.
//
// The rules (tree_shape_error, one place for the static_asserts here and validate(SpecConfig)):
//   topk >= 1, steps >= 1, 2 <= nodes <= kMaxTreeNodes (except the root-only shape 0, 0, 1);
//   topk 1 is a chain: nodes == steps + 1 (never adjusted: DESIGN.md failure 3);
//   nodes - 1 <= topk + (steps - 1) * topk^2 (the draft candidates there are to choose from);
//   steps <= nodes - 1 (a tree of N nodes is at most N - 1 deep: deeper draft steps are wasted).
#pragma once

#include <cstdint>
#include <type_traits>

namespace specdec {

inline constexpr int kMaxTreeNodes = 1024;

enum class TreeShapeError : int {
  kOk = 0,
  kTopKTooSmall,        // topk < 1
  kStepsTooSmall,       // steps < 1
  kNodesTooSmall,       // nodes < 2
  kNodesTooLarge,       // nodes > kMaxTreeNodes
  kChainNodes,          // topk 1 and nodes != steps + 1
  kTooManyNodes,        // nodes - 1 > topk + (steps - 1) * topk^2
  kStepsDeeperThanTree  // steps > nodes - 1
};

// topk + (steps - 1) * topk^2: how many candidates `steps` draft steps produce. Saturates at
// kMaxTreeNodes (enough to compare with any valid node count). Requires topk >= 1, steps >= 1.
constexpr int64_t max_draft_candidates(int topk, int steps) {
  if (topk >= kMaxTreeNodes) return kMaxTreeNodes;
  int64_t const k = topk;
  int64_t const c = k + static_cast<int64_t>(steps - 1) * k * k;
  return c < kMaxTreeNodes ? c : kMaxTreeNodes;
}

constexpr bool is_root_only_shape(int topk, int steps, int nodes) {
  return topk == 0 && steps == 0 && nodes == 1;
}

constexpr TreeShapeError tree_shape_error(int topk, int steps, int nodes) {
  if (is_root_only_shape(topk, steps, nodes)) return TreeShapeError::kOk;
  if (topk < 1) return TreeShapeError::kTopKTooSmall;
  if (steps < 1) return TreeShapeError::kStepsTooSmall;
  if (nodes < 2) return TreeShapeError::kNodesTooSmall;
  if (nodes > kMaxTreeNodes) return TreeShapeError::kNodesTooLarge;
  if (topk == 1 && nodes != steps + 1) return TreeShapeError::kChainNodes;
  if (nodes - 1 > max_draft_candidates(topk, steps)) return TreeShapeError::kTooManyNodes;
  if (steps > nodes - 1) return TreeShapeError::kStepsDeeperThanTree;
  return TreeShapeError::kOk;
}

template <int TopK, int Steps, int Nodes>
struct TreeShape {
  static constexpr TreeShapeError kError = tree_shape_error(TopK, Steps, Nodes);
  static_assert(kError != TreeShapeError::kTopKTooSmall,
                "TreeShape: TopK must be >= 1 (TreeShape<0, 0, 1> = NoTree is the only shape "
                "without draft tokens, for NoDraft)");
  static_assert(kError != TreeShapeError::kStepsTooSmall,
                "TreeShape: Steps must be >= 1: a draft tree needs at least one draft step");
  static_assert(kError != TreeShapeError::kNodesTooSmall,
                "TreeShape: Nodes (verified nodes, root included) must be >= 2: the root plus at "
                "least one draft token; for no drafting use NoDraft with NoTree");
  static_assert(kError != TreeShapeError::kNodesTooLarge,
                "TreeShape: Nodes must be <= kMaxTreeNodes (1024)");
  static_assert(kError != TreeShapeError::kChainNodes,
                "TreeShape: with TopK 1 the tree is a chain: Nodes must be Steps + 1; write "
                "Chain<Steps>, or raise TopK for a wider tree");
  static_assert(kError != TreeShapeError::kTooManyNodes,
                "TreeShape: Nodes - 1 exceeds the TopK + (Steps-1)*TopK^2 draft candidates the "
                "draft steps produce: raise Steps or TopK, or lower Nodes");
  static_assert(kError != TreeShapeError::kStepsDeeperThanTree,
                "TreeShape: Steps > Nodes - 1: a tree of Nodes nodes is at most Nodes - 1 deep, so "
                "the extra draft steps are wasted; lower Steps or raise Nodes");

  static constexpr int kTopK = TopK;
  static constexpr int kSteps = Steps;
  static constexpr int kNodes = Nodes;           // verified nodes per request, root included
  static constexpr int kDraftNodes = Nodes - 1;  // draft tokens verified per request
  static constexpr bool kRootOnly = is_root_only_shape(TopK, Steps, Nodes);
  static constexpr bool kIsChain = TopK == 1;
};

template <int Steps>
using Chain = TreeShape<1, Steps, Steps + 1>;

using NoTree = TreeShape<0, 0, 1>;

namespace detail {
template <class T>
struct TreeShapeParts : std::false_type {};
template <int TopK, int Steps, int Nodes>
struct TreeShapeParts<TreeShape<TopK, Steps, Nodes>> : std::true_type {
  static constexpr int kTopK = TopK;
  static constexpr int kSteps = Steps;
  static constexpr int kNodes = Nodes;
  static constexpr TreeShapeError kError = tree_shape_error(TopK, Steps, Nodes);
};
}  // namespace detail

// A well-formed TreeShape<...> (NoTree included). Checked without instantiating TreeShape.
template <class T>
concept TreeShapePolicy =
    detail::TreeShapeParts<T>::value && detail::TreeShapeParts<T>::kError == TreeShapeError::kOk;

}  // namespace specdec
