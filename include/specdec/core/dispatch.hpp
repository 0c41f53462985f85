// The one place where run-time flags (a SpecConfig) select a compiled policy bundle.
//
//   using Compiled = PolicyList<SpecPolicy<Eagle3, KimiK25Layers, Chain<3>, Eager>, ...>;
//   Status s = dispatch<Compiled>(config, [&]<class P>() -> Status { return run<P>(...); });
//
// dispatch validates the config first (an invalid config reports the validation error), then calls
// the visitor for the one bundle whose algorithm, layer set (order included), topk, steps, nodes
// and graph batch sizes equal the config's, and returns the visitor's Status. When no bundle
// matches it returns Unsupported naming the request and listing every compiled bundle. The visitor
// is called as visitor.template operator()<P>() or, failing that, visitor(std::type_identity<P>{}).
//
// KimiK25Policies is the library's default compiled list for Kimi-K2.5.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/status.hpp"
#include "specdec/policy/spec_policy.hpp"

namespace specdec {

namespace detail {
template <class... Ps>
struct Distinct : std::true_type {};
template <class P, class... Ps>
struct Distinct<P, Ps...>
    : std::bool_constant<(!std::is_same_v<P, Ps> && ...) && Distinct<Ps...>::value> {};

// Whether an already validated config selects bundle P.
template <class P>
bool matches(SpecConfig const& c) {
  auto const layers = P::Layers::ids();
  auto const graph = P::Graph::batch_sizes();
  return c.algorithm == P::kName && c.eagle_topk == P::kTopK && c.num_steps == P::kSteps &&
         c.num_draft_tokens == P::kNodes &&
         std::equal(layers.begin(), layers.end(), c.layers.begin(), c.layers.end()) &&
         std::equal(graph.begin(), graph.end(), c.cuda_graph_bs.begin(), c.cuda_graph_bs.end());
}

template <class P, class Visitor>
Status visit(Visitor& visitor) {
  if constexpr (requires { visitor.template operator()<P>(); }) {
    static_assert(std::is_convertible_v<decltype(visitor.template operator()<P>()), Status>,
                  "dispatch: the visitor must return Status");
    return visitor.template operator()<P>();
  } else if constexpr (std::is_invocable_v<Visitor&, std::type_identity<P>>) {
    static_assert(
        std::is_convertible_v<std::invoke_result_t<Visitor&, std::type_identity<P>>, Status>,
        "dispatch: the visitor must return Status");
    return visitor(std::type_identity<P>{});
  } else {
    static_assert(kDependentFalse<P>,
                  "dispatch: the visitor must be callable as visitor.template operator()<Policy>() "
                  "(e.g. []<class P>() -> Status {...}) or visitor(std::type_identity<Policy>{})");
    return Status::Internal("unreachable");
  }
}
}  // namespace detail

template <class... Policies>
struct PolicyList {
  static_assert(sizeof...(Policies) > 0, "PolicyList: compile at least one bundle");
  static_assert((SpecPolicyBundle<Policies> && ...),
                "PolicyList: every entry must be a SpecPolicy<Draft, Layers, Tree, Graph> bundle "
                "that satisfies SpecPolicyBundle");
  static_assert(detail::Distinct<Policies...>::value, "PolicyList: a bundle is listed twice");

  static constexpr int kSize = static_cast<int>(sizeof...(Policies));

  // "EAGLE3 layers=[1,29,57] topk=1 steps=3 nodes=4 eager; NONE layers=[] ...".
  static std::string describe_all() {
    std::string out;
    ((out += (out.empty() ? "" : "; ") + describe<Policies>()), ...);
    return out;
  }

  // The flags of every bundle, in the list's order.
  static std::vector<SpecConfig> configs() { return {spec_config_of<Policies>()...}; }

  template <class Visitor>
  static Status dispatch(SpecConfig const& config, Visitor& visitor) {
    SPECDEC_RETURN_IF_ERROR(validate(config));
    return first_match<Policies...>(config, visitor);
  }

 private:
  template <class P, class... Rest, class Visitor>
  static Status first_match(SpecConfig const& config, Visitor& visitor) {
    if (detail::matches<P>(config)) return detail::visit<P>(visitor);
    if constexpr (sizeof...(Rest) > 0) {
      return first_match<Rest...>(config, visitor);
    } else {
      return Status::Unsupported("no compiled policy for " + describe(config) +
                                 "; compiled: " + describe_all() +
                                 ". Choose one of these, or add the bundle to the PolicyList "
                                 "given to dispatch (core/dispatch.hpp)");
    }
  }
};

template <class List>
std::string describe_list() {
  return List::describe_all();
}

template <class List, class Visitor>
Status dispatch(SpecConfig const& config, Visitor&& visitor) {
  return List::dispatch(config, visitor);
}

// Kimi-K2.5 defaults: the EAGLE-3 layer set of layers.hpp (outputs of 1, 29, 57 = inputs of
// 2, 30, 58), a chain and two trees (topk 4 / 8), an n-gram chain and the no-draft baseline, each
// eager (--cuda-graph-bs empty) and captured for the batch sizes of KimiK25GraphLadder.
using KimiK25GraphLadder = GraphLadder<1, 2, 4, 8, 16, 32, 64, 128, 256>;

template <class Graph>
using KimiK25Eagle3Chain = SpecPolicy<Eagle3, KimiK25Layers, Chain<3>, Graph>;
template <class Graph>
using KimiK25Eagle3Top4 = SpecPolicy<Eagle3, KimiK25Layers, TreeShape<4, 3, 8>, Graph>;
template <class Graph>
using KimiK25Eagle3Top8 = SpecPolicy<Eagle3, KimiK25Layers, TreeShape<8, 5, 32>, Graph>;
template <class Graph>
using KimiK25NGramChain = SpecPolicy<NGram, Layers<>, Chain<4>, Graph>;
template <class Graph>
using KimiK25NoDraft = SpecPolicy<NoDraft, Layers<>, NoTree, Graph>;

using KimiK25Policies =
    PolicyList<KimiK25Eagle3Chain<KimiK25GraphLadder>, KimiK25Eagle3Top4<KimiK25GraphLadder>,
               KimiK25Eagle3Top8<KimiK25GraphLadder>, KimiK25NGramChain<KimiK25GraphLadder>,
               KimiK25NoDraft<KimiK25GraphLadder>, KimiK25Eagle3Chain<Eager>,
               KimiK25Eagle3Top4<Eager>, KimiK25Eagle3Top8<Eager>, KimiK25NGramChain<Eager>,
               KimiK25NoDraft<Eager>>;

}  // namespace specdec
