// Draft strategies: empty tag types that name how draft tokens are proposed, and their traits.
//   Eagle3   fc over the concatenated target hidden states of a layer set (a non-empty
//   Layers<...>),
//            one Llama-style decoder layer with a 2H attention input, reduced draft vocab (d2t).
//   Eagle    EAGLE-1/2: fc over [token embedding, the target's last hidden state]. Takes Layers<>:
//            the last hidden state is implied by the strategy, never listed as a layer set. A draft
//            trained on a layer set is an Eagle3 draft (DESIGN.md failure 1).
//   NGram    prompt lookup: no model, reads no hidden states (Layers<>).
//   NoDraft  plain decoding through the same engine, the baseline: Layers<>, NoTree (nodes 1).
// DraftTraits<Tag> gives the --speculative-algorithm name and what the strategy needs; it reads
// the one table kDraftInfos, which the run-time side (parse_draft_kind) reads too.
#pragma once

#include <concepts>
#include <string_view>
#include <type_traits>

namespace specdec {

template <class T>
inline constexpr bool kDependentFalse = false;

enum class DraftKind : int { kEagle3 = 0, kEagle = 1, kNGram = 2, kNone = 3 };

struct DraftInfo {
  DraftKind kind;
  char const* name;   // the --speculative-algorithm value
  bool has_model;     // runs a draft network
  bool needs_layers;  // reads a non-empty layer set; every other strategy takes Layers<>
  bool needs_tree;    // proposes draft tokens (nodes >= 2); the one that does not takes NoTree
};

// Indexed by DraftKind.
inline constexpr DraftInfo kDraftInfos[] = {
    {DraftKind::kEagle3, "EAGLE3", true, true, true},
    {DraftKind::kEagle, "EAGLE", true, false, true},
    {DraftKind::kNGram, "NGRAM", false, false, true},
    {DraftKind::kNone, "NONE", false, false, false},
};
inline constexpr int kNumDraftKinds = static_cast<int>(sizeof(kDraftInfos) / sizeof(DraftInfo));

constexpr DraftInfo const& draft_info(DraftKind kind) {
  return kDraftInfos[static_cast<int>(kind)];
}
constexpr char const* draft_name(DraftKind kind) { return draft_info(kind).name; }

// Parses a --speculative-algorithm value. Exact match (upper case, as SGLang spells them); false
// for anything else, so a misspelling is an error rather than a guess.
constexpr bool parse_draft_kind(std::string_view name, DraftKind* kind) {
  for (DraftInfo const& info : kDraftInfos) {
    if (name == info.name) {
      *kind = info.kind;
      return true;
    }
  }
  return false;
}

// "EAGLE3, EAGLE, NGRAM, NONE": for messages.
inline constexpr char const* kDraftNamesList = "EAGLE3, EAGLE, NGRAM, NONE";

struct Eagle3 {
  static constexpr DraftKind kKind = DraftKind::kEagle3;
};
struct Eagle {
  static constexpr DraftKind kKind = DraftKind::kEagle;
};
struct NGram {
  static constexpr DraftKind kKind = DraftKind::kNGram;
};
struct NoDraft {
  static constexpr DraftKind kKind = DraftKind::kNone;
};

// A draft strategy: an empty tag with a kKind. A new strategy needs a tag, a kDraftInfos row
// and a DraftTraits specialization.
template <class T>
concept DraftStrategy = std::is_empty_v<T> && requires {
  { T::kKind } -> std::convertible_to<DraftKind>;
};

namespace detail {
template <DraftKind K>
struct DraftTraitsOf {
  static constexpr DraftKind kKind = K;
  static constexpr char const* kName = draft_info(K).name;
  static constexpr bool kHasModel = draft_info(K).has_model;
  static constexpr bool kNeedsLayers = draft_info(K).needs_layers;
  static constexpr bool kNeedsTree = draft_info(K).needs_tree;
};
}  // namespace detail

template <class Tag>
struct DraftTraits {
  static_assert(kDependentFalse<Tag>,
                "no specialization of DraftTraits for this type: a draft strategy is Eagle3, "
                "Eagle, NGram or NoDraft (policy/draft.hpp); a new one needs a tag, a kDraftInfos "
                "row and a DraftTraits specialization");
};
template <>
struct DraftTraits<Eagle3> : detail::DraftTraitsOf<DraftKind::kEagle3> {};
template <>
struct DraftTraits<Eagle> : detail::DraftTraitsOf<DraftKind::kEagle> {};
template <>
struct DraftTraits<NGram> : detail::DraftTraitsOf<DraftKind::kNGram> {};
template <>
struct DraftTraits<NoDraft> : detail::DraftTraitsOf<DraftKind::kNone> {};

}  // namespace specdec
