// Layer sets: which target residual streams feed the draft, and in what order.
//
// Convention (the one used everywhere in specdec):
//   id i >= 0      the residual stream after target layer i (the output of layer i), 0-based
//   kEmbedding -1  the embedding output (the input of layer 0)
// so the input of layer i is id i - 1 (input_of_layer). This equals the ids of a draft config's
// eagle_aux_hidden_state_layer_ids (SGLang captures the input of layer id + 1).
//
// Order is part of the meaning: the hidden states are concatenated in the listed order into the
// draft's fc input [T, size * H], and a draft trained on [embedding, 3, 31] fed [3, 31, 59] sees
// input of the right width and the wrong meaning (DESIGN.md failure 2). Any order is allowed and
// kept exactly as written; an id may appear only once; every id is >= kEmbedding. An upper bound
// (the target's layer count) is checked at run time, where the model is known.
//
// Kimi-K2.5 (61 layers) default: KimiK25Layers = Layers<1, 29, 57>, the outputs of layers 1, 29,
// 57 = the inputs of layers 2, 30, 58, which is SGLang's default capture [2, L//2, L-3] (inputs of
// those layers) for L = 61.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "specdec/core/status.hpp"

namespace specdec {

inline constexpr int kEmbedding = -1;

constexpr int output_of_layer(int layer) { return layer; }
constexpr int input_of_layer(int layer) { return layer - 1; }

enum class LayerSetError : int {
  kOk = 0,
  kBelowEmbedding,  // an id < kEmbedding (-1)
  kDuplicate,       // an id listed twice
};

// The layer-set rules, in one place: used by Layers<...> (static_assert) and by validate().
// Pointer + count (not std::span) so that nvcc's front end can evaluate it in a constraint.
constexpr LayerSetError layer_set_error(int const* ids, int count) {
  for (int i = 0; i < count; ++i) {
    if (ids[i] < kEmbedding) return LayerSetError::kBelowEmbedding;
    for (int j = 0; j < i; ++j) {
      if (ids[j] == ids[i]) return LayerSetError::kDuplicate;
    }
  }
  return LayerSetError::kOk;
}
constexpr LayerSetError layer_set_error(std::span<int const> ids) {
  return layer_set_error(ids.data(), static_cast<int>(ids.size()));
}

template <int... Ids>
struct Layers {
  static constexpr int kSize = static_cast<int>(sizeof...(Ids));
  static constexpr std::array<int, sizeof...(Ids)> kIds = {Ids...};
  static constexpr LayerSetError kError = layer_set_error(kIds.data(), kSize);
  static_assert(
      kError != LayerSetError::kBelowEmbedding,
      "Layers: a layer id is below kEmbedding (-1): id i is the output of target layer i "
      "and -1 the embedding output (the input of layer 0); the input of layer i is i - 1");
  static_assert(kError != LayerSetError::kDuplicate,
                "Layers: a layer id is listed twice: each residual stream feeds the draft at most "
                "once; remove the duplicate");

  static constexpr std::span<int const> ids() { return kIds; }
};

using KimiK25Layers = Layers<1, 29, 57>;

namespace detail {
template <class T>
struct LayersParts : std::false_type {};
template <int... Ids>
struct LayersParts<Layers<Ids...>> : std::true_type {
  static constexpr int kSize = static_cast<int>(sizeof...(Ids));
  static constexpr std::array<int, sizeof...(Ids)> kIds = {Ids...};
  static constexpr bool kOk = layer_set_error(kIds.data(), kSize) == LayerSetError::kOk;
};
}  // namespace detail

// A well-formed Layers<...>. Checked without instantiating Layers, so a bad set is just `false`.
template <class T>
concept LayerSet = detail::LayersParts<T>::value && detail::LayersParts<T>::kOk;

// "[1,29,57]"; the embedding shows as -1.
inline std::string format_layers(std::span<int const> ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(ids[i]);
  }
  return out + "]";
}

// Run-time comparison of two layer sets, order included. `expected_what` / `got_what` name the
// two sides, e.g. "the draft checkpoint" and "the serving policy". The message reads
// "... expected [-1,3,31] (the draft checkpoint) got [3,31,59] (the serving policy) ...".
inline Status compare_layers(std::span<int const> expected, std::span<int const> got,
                             std::string_view expected_what, std::string_view got_what) {
  bool same = expected.size() == got.size();
  for (size_t i = 0; same && i < expected.size(); ++i) same = expected[i] == got[i];
  if (same) return Status::Ok();
  std::string why;
  if (expected.size() != got.size()) {
    why = "a different number of layers (" + std::to_string(expected.size()) + " vs " +
          std::to_string(got.size()) + "): the draft's fc input width differs";
  } else {
    bool permutation = true;
    for (int id : expected) {
      int in_expected = 0, in_got = 0;
      for (int e : expected) in_expected += e == id;
      for (int g : got) in_got += g == id;
      permutation = permutation && in_expected == in_got;
    }
    why = permutation ? "the same layers in a different order: order is part of the meaning (the "
                        "hidden states are concatenated in this order), so the width matches and "
                        "the meaning does not"
                      : "the same width with different layers: the draft would read hidden states "
                        "it was not trained on and acceptance would collapse without an error";
  }
  return Status::InvalidArgument(
      "hidden-state layer sets differ: expected " + format_layers(expected) + " (" +
      std::string(expected_what) + ") got " + format_layers(got) + " (" + std::string(got_what) +
      "): " + why +
      ". Ids are outputs of target layers, -1 the embedding output; capture exactly the layers "
      "the draft was trained with, in its order");
}

}  // namespace specdec
