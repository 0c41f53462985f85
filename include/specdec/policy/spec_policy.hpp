// SpecPolicy<Draft, Layers, Tree, Graph>: the compile-time bundle that instantiates the propose /
// verify kernels and the engine, its concept, and its run-time mirror SpecConfig (the flags).
//
//   SpecPolicy<Eagle3, Layers<1, 29, 57>, TreeShape<4, 3, 8>, GraphLadder<1, 2, 4, 8>>
//   SpecPolicy<NoDraft, Layers<>, NoTree, Eager>
//
// The pairing rules (policy_error, one place for SpecPolicy's static_asserts and validate()):
//   Eagle3 needs a non-empty layer set; Eagle, NGram and NoDraft take Layers<> (EAGLE-1/2 reads the
//   target's last hidden state by convention: the engine feeds [token embedding, last hidden], so a
//   layer set given to Eagle is an Eagle3 draft mistaken for EAGLE: DESIGN.md failure 1);
//   NoDraft takes NoTree (nodes 1); every drafting strategy takes a tree with nodes >= 2.
// Component rules live beside their types: layer_set_error (layers.hpp), tree_shape_error
// (tree.hpp), graph_ladder_error (graph.hpp). validate(SpecConfig) applies all of them and names
// the flags; nothing is ever adjusted.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/policy/draft.hpp"
#include "specdec/policy/graph.hpp"
#include "specdec/policy/layers.hpp"
#include "specdec/policy/tree.hpp"

namespace specdec {

enum class PolicyError : int {
  kOk = 0,
  kLayerSet,        // the layer set breaks layer_set_error
  kLayersRequired,  // Eagle3 with an empty layer set
  kLayersNotUsed,   // Eagle / NGram / NoDraft with a layer set
  kTreeNotUsed,     // NoDraft with a draft tree (not NoTree)
  kTreeRequired,    // a drafting strategy with NoTree
  kTreeShape,       // the tree breaks tree_shape_error
};

// Pointer + count (not std::span) so that nvcc's front end can evaluate it in a constraint.
constexpr PolicyError policy_error(DraftKind kind, int const* layers, int layer_count, int topk,
                                   int steps, int nodes) {
  DraftInfo const& info = draft_info(kind);
  if (layer_set_error(layers, layer_count) != LayerSetError::kOk) return PolicyError::kLayerSet;
  if (info.needs_layers && layer_count == 0) return PolicyError::kLayersRequired;
  if (!info.needs_layers && layer_count != 0) return PolicyError::kLayersNotUsed;
  bool const root_only = is_root_only_shape(topk, steps, nodes);
  if (!info.needs_tree && !root_only) return PolicyError::kTreeNotUsed;
  if (info.needs_tree && root_only) return PolicyError::kTreeRequired;
  if (tree_shape_error(topk, steps, nodes) != TreeShapeError::kOk) return PolicyError::kTreeShape;
  return PolicyError::kOk;
}
constexpr PolicyError policy_error(DraftKind kind, std::span<int const> layers, int topk, int steps,
                                   int nodes) {
  return policy_error(kind, layers.data(), static_cast<int>(layers.size()), topk, steps, nodes);
}

namespace detail {
// DraftTraits<D>::kKind (its static_assert names a tag without traits); kNone for a non-tag,
// which SpecPolicy reports itself.
template <class D>
constexpr DraftKind draft_kind_of() {
  if constexpr (DraftStrategy<D>) {
    return DraftTraits<D>::kKind;
  } else {
    return DraftKind::kNone;
  }
}

// policy_error of a bundle's parts, or kOk when a part is malformed (its own check reports it).
template <class D, class L, class T, class G>
constexpr PolicyError bundle_error() {
  if constexpr (DraftStrategy<D> && LayersParts<L>::value && TreeShapeParts<T>::value) {
    return policy_error(D::kKind, LayersParts<L>::kIds.data(), LayersParts<L>::kSize,
                        TreeShapeParts<T>::kTopK, TreeShapeParts<T>::kSteps,
                        TreeShapeParts<T>::kNodes);
  } else {
    return PolicyError::kOk;
  }
}
}  // namespace detail

template <class D, class L, class T, class G>
struct SpecPolicy {
  static_assert(DraftStrategy<D>,
                "SpecPolicy: the first parameter must be a draft strategy tag: Eagle3, Eagle, "
                "NGram or NoDraft");
  static_assert(detail::LayersParts<L>::value,
                "SpecPolicy: the second parameter must be Layers<ids...> (Layers<> for none)");
  static_assert(detail::TreeShapeParts<T>::value,
                "SpecPolicy: the third parameter must be TreeShape<TopK, Steps, Nodes>, "
                "Chain<Steps> or NoTree");
  static_assert(detail::GraphParts<G>::value,
                "SpecPolicy: the fourth parameter must be Eager or GraphLadder<batch sizes...>");

  using Draft = D;
  using Layers = L;
  using Tree = T;
  using Graph = G;

  // Reading the parts instantiates them, so their own static_asserts report first.
  static constexpr DraftKind kKind = detail::draft_kind_of<D>();
  static constexpr char const* kName = draft_name(kKind);
  static constexpr int kLayerCount = L::kSize;
  static constexpr int kTopK = T::kTopK;
  static constexpr int kSteps = T::kSteps;
  static constexpr int kNodes = T::kNodes;
  static constexpr bool kCaptured = G::kCaptured;

  static constexpr PolicyError kError = detail::bundle_error<D, L, T, G>();
  static_assert(kError != PolicyError::kLayersRequired,
                "SpecPolicy: Eagle3 needs a non-empty layer set: its fc reads the concatenated "
                "hidden states of those target layers, e.g. Layers<1, 29, 57> (KimiK25Layers)");
  static_assert(kError != PolicyError::kLayersNotUsed,
                "SpecPolicy: only Eagle3 reads a layer set: Eagle (EAGLE-1/2) reads the last "
                "hidden state, NGram and NoDraft none; write Layers<>, or Eagle3 for a draft "
                "trained on a layer set");
  static_assert(kError != PolicyError::kTreeNotUsed,
                "SpecPolicy: NoDraft verifies the root only: its tree shape must be NoTree "
                "(TreeShape<0, 0, 1>)");
  static_assert(kError != PolicyError::kTreeRequired,
                "SpecPolicy: a drafting strategy (Eagle3, Eagle, NGram) needs a draft tree with "
                "Nodes >= 2, not NoTree: e.g. Chain<3> or TreeShape<4, 3, 8>");
};

namespace detail {
template <class P>
struct SpecPolicyParts : std::false_type {};
template <class D, class L, class T, class G>
struct SpecPolicyParts<SpecPolicy<D, L, T, G>> : std::true_type {
  static constexpr bool kPartsOk =
      DraftStrategy<D> && LayerSet<L> && TreeShapePolicy<T> && GraphPolicy<G>;
  static constexpr bool kOk = kPartsOk && bundle_error<D, L, T, G>() == PolicyError::kOk;
};
}  // namespace detail

// A SpecPolicy<...> whose parts are well formed and fit together. Checked without instantiating
// the bundle, so for anything else (an int, a bad bundle) it is simply false.
template <class P>
concept SpecPolicyBundle = detail::SpecPolicyParts<P>::value && detail::SpecPolicyParts<P>::kOk;

// ---------------------------------------------------------------------------------------------
// Run-time mirror: the flags.

struct SpecConfig {
  std::string algorithm = "NONE";  // --speculative-algorithm: EAGLE3, EAGLE, NGRAM or NONE
  int num_steps = 0;               // --speculative-num-steps: draft depth (0 with NONE)
  int eagle_topk = 0;              // --speculative-eagle-topk: branching per step (0 with NONE)
  int num_draft_tokens = 1;        // --speculative-num-draft-tokens: verified nodes, root included
  std::vector<int> layers;         // the draft's layer set (its eagle_aux_hidden_state_layer_ids),
                                   // layers.hpp convention, in order; EAGLE3 only
  std::vector<int> cuda_graph_bs;  // --cuda-graph-bs: captured batch sizes; empty = eager
  int num_target_layers = 0;       // the target's layer count, bounds layer ids; 0 = not checked
};

// "EAGLE3 layers=[1,29,57] topk=4 steps=3 nodes=8 graph=[1,2,4,8]" ("eager" without capture).
inline std::string describe_spec(std::string_view algorithm, std::span<int const> layers, int topk,
                                 int steps, int nodes, std::span<int const> graph_bs) {
  return std::string(algorithm) + " layers=" + format_layers(layers) +
         " topk=" + std::to_string(topk) + " steps=" + std::to_string(steps) +
         " nodes=" + std::to_string(nodes) +
         (graph_bs.empty() ? std::string(" eager") : " graph=" + format_layers(graph_bs));
}

inline std::string describe(SpecConfig const& c) {
  return describe_spec(c.algorithm, c.layers, c.eagle_topk, c.num_steps, c.num_draft_tokens,
                       c.cuda_graph_bs);
}

template <SpecPolicyBundle P>
std::string describe() {
  return describe_spec(P::kName, P::Layers::ids(), P::kTopK, P::kSteps, P::kNodes,
                       P::Graph::batch_sizes());
}

// The flags that select bundle P.
template <SpecPolicyBundle P>
SpecConfig spec_config_of() {
  SpecConfig c;
  c.algorithm = P::kName;
  c.num_steps = P::kSteps;
  c.eagle_topk = P::kTopK;
  c.num_draft_tokens = P::kNodes;
  auto const layers = P::Layers::ids();
  c.layers.assign(layers.begin(), layers.end());
  auto const graph = P::Graph::batch_sizes();
  c.cuda_graph_bs.assign(graph.begin(), graph.end());
  return c;
}

namespace detail {
inline std::string tree_shape_message(TreeShapeError error, int topk, int steps, int nodes) {
  std::string const k = std::to_string(topk), s = std::to_string(steps), n = std::to_string(nodes);
  switch (error) {
    case TreeShapeError::kOk:
      return "ok";
    case TreeShapeError::kTopKTooSmall:
      return "--speculative-eagle-topk " + k + " must be >= 1";
    case TreeShapeError::kStepsTooSmall:
      return "--speculative-num-steps " + s + " must be >= 1";
    case TreeShapeError::kNodesTooSmall:
      return "--speculative-num-draft-tokens " + n +
             " must be >= 2 (it counts the root: the root plus at least one draft token)";
    case TreeShapeError::kNodesTooLarge:
      return "--speculative-num-draft-tokens " + n + " > " + std::to_string(kMaxTreeNodes) +
             " (kMaxTreeNodes): lower it";
    case TreeShapeError::kChainNodes:
      return "with --speculative-eagle-topk 1 the tree is a chain: --speculative-num-draft-tokens "
             "must be --speculative-num-steps + 1 = " +
             std::to_string(steps + 1) + ", got " + n +
             " (nothing is adjusted): set --speculative-num-draft-tokens " +
             std::to_string(steps + 1) + ", or --speculative-num-steps " +
             std::to_string(nodes - 1) + ", or raise --speculative-eagle-topk for a tree";
    case TreeShapeError::kTooManyNodes: {
      int64_t const c = max_draft_candidates(topk, steps);
      return "--speculative-num-draft-tokens " + n + " needs " + std::to_string(nodes - 1) +
             " draft candidates, but --speculative-eagle-topk " + k +
             " with --speculative-num-steps " + s +
             " makes at most topk + (steps-1)*topk^2 = " + std::to_string(c) +
             ": raise --speculative-num-steps or --speculative-eagle-topk, or lower "
             "--speculative-num-draft-tokens to " +
             std::to_string(c + 1);
    }
    case TreeShapeError::kStepsDeeperThanTree:
      return "--speculative-num-steps " + s +
             " > --speculative-num-draft-tokens - 1 = " + std::to_string(nodes - 1) +
             ": a tree of " + n + " nodes is at most " + std::to_string(nodes - 1) +
             " deep, so the extra draft steps are wasted work; lower --speculative-num-steps to " +
             std::to_string(nodes - 1) + " or raise --speculative-num-draft-tokens to " +
             std::to_string(steps + 1);
  }
  return "unknown tree shape error";
}

inline std::string layer_set_message(std::span<int const> layers) {
  std::string const set = "layer set " + format_layers(layers) + ": ";
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] < kEmbedding) {
      return set + "id " + std::to_string(layers[i]) +
             " is below -1; id i is the output of target layer i, -1 the embedding output (the "
             "input of layer i is id i - 1)";
    }
    for (size_t j = 0; j < i; ++j) {
      if (layers[j] == layers[i]) {
        return set + "id " + std::to_string(layers[i]) +
               " is listed twice; each residual stream feeds the draft at most once";
      }
    }
  }
  return set + "ok";
}
}  // namespace detail

// Checks a SpecConfig against every rule, naming the flags and the fix. Never adjusts a value.
inline Status validate(SpecConfig const& c) {
  DraftKind kind{};
  if (!parse_draft_kind(c.algorithm, &kind)) {
    return Status::InvalidArgument("--speculative-algorithm '" + c.algorithm +
                                   "' is unknown: use one of " + kDraftNamesList +
                                   " (exact spelling)");
  }
  std::string const algo = "--speculative-algorithm " + c.algorithm;
  switch (policy_error(kind, c.layers, c.eagle_topk, c.num_steps, c.num_draft_tokens)) {
    case PolicyError::kOk:
      break;
    case PolicyError::kLayerSet:
      return Status::InvalidArgument(detail::layer_set_message(c.layers));
    case PolicyError::kLayersRequired:
      return Status::InvalidArgument(
          algo +
          " needs the draft's layer set (eagle_aux_hidden_state_layer_ids), got none: its fc reads "
          "the concatenated hidden states of those target layers (Kimi-K2.5: [1,29,57])");
    case PolicyError::kLayersNotUsed:
      if (kind == DraftKind::kEagle) {
        return Status::InvalidArgument(
            algo + " with layer set " + format_layers(c.layers) +
            ": EAGLE (EAGLE-1/2) reads only the target's last hidden state, so the layer set and "
            "the draft's fc over it would be skipped and acceptance would collapse; a draft "
            "trained on a layer set is an EAGLE3 draft: use --speculative-algorithm EAGLE3");
      }
      return Status::InvalidArgument(algo + " reads no hidden states, but a layer set " +
                                     format_layers(c.layers) +
                                     " was given: drop it, or use --speculative-algorithm EAGLE3 "
                                     "for a draft trained on those layers");
    case PolicyError::kTreeNotUsed:
      return Status::InvalidArgument(
          algo + " verifies the root only, but --speculative-num-steps " +
          std::to_string(c.num_steps) + ", --speculative-eagle-topk " +
          std::to_string(c.eagle_topk) + ", --speculative-num-draft-tokens " +
          std::to_string(c.num_draft_tokens) +
          " were given: they must be 0, 0, 1 (unset); drop them or choose a drafting "
          "--speculative-algorithm (EAGLE3, EAGLE, NGRAM)");
    case PolicyError::kTreeRequired:
      return Status::InvalidArgument(
          algo +
          " drafts tokens: set --speculative-num-steps, --speculative-eagle-topk and "
          "--speculative-num-draft-tokens (e.g. 3, 1, 4 for a 3-step chain)");
    case PolicyError::kTreeShape:
      return Status::InvalidArgument(detail::tree_shape_message(
          tree_shape_error(c.eagle_topk, c.num_steps, c.num_draft_tokens), c.eagle_topk,
          c.num_steps, c.num_draft_tokens));
  }
  if (c.num_target_layers > 0) {
    for (int id : c.layers) {
      if (id >= c.num_target_layers) {
        return Status::InvalidArgument("layer set " + format_layers(c.layers) + ": id " +
                                       std::to_string(id) + " is past the target's last layer (" +
                                       std::to_string(c.num_target_layers) + " layers: ids 0.." +
                                       std::to_string(c.num_target_layers - 1) +
                                       ", -1 the embedding output)");
      }
    }
  }
  if (!c.cuda_graph_bs.empty()) {
    switch (graph_ladder_error(c.cuda_graph_bs)) {
      case GraphLadderError::kOk:
      case GraphLadderError::kEmpty:
        break;
      case GraphLadderError::kNonPositive:
        return Status::InvalidArgument("--cuda-graph-bs " + format_layers(c.cuda_graph_bs) +
                                       ": batch sizes must be >= 1");
      case GraphLadderError::kNotIncreasing:
        return Status::InvalidArgument("--cuda-graph-bs " + format_layers(c.cuda_graph_bs) +
                                       ": batch sizes must be strictly increasing (sorted, no "
                                       "repeats)");
    }
  }
  return Status::Ok();
}

// Whether a draft checkpoint trained as `trained` on `trained_layers` fits the policy that runs
// `kind` on `layers`. Names both sides: "the draft checkpoint is EAGLE3 ... the policy runs EAGLE".
inline Status check_draft_fits(DraftKind trained, std::span<int const> trained_layers,
                               DraftKind kind, std::span<int const> layers,
                               std::string_view policy_what) {
  if (trained != kind) {
    return Status::InvalidArgument(
        std::string("the draft checkpoint was trained as ") + draft_name(trained) + " (layers " +
        format_layers(trained_layers) + ") but the policy runs " + std::string(policy_what) +
        ": serve it with --speculative-algorithm " + draft_name(trained));
  }
  return compare_layers(trained_layers, layers, "the draft checkpoint",
                        "the policy " + std::string(policy_what));
}

template <SpecPolicyBundle P>
Status check_draft_fits(DraftKind trained, std::span<int const> trained_layers) {
  return check_draft_fits(trained, trained_layers, P::kKind, P::Layers::ids(), describe<P>());
}

}  // namespace specdec
