// Policies: the compile-time rules (checked as concepts, so a bad type is `false`, not a hard
// error), their run-time mirror validate(SpecConfig) with the flag names and fixes in every
// message, and DESIGN.md failures 1-3 expressed as configs that must be caught.
#include <doctest/doctest.h>

#include <array>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "specdec/policy/spec_policy.hpp"

using namespace specdec;

namespace {

bool contains(std::string const& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// Every needle must be in the message of a kInvalidArgument status.
void check_invalid(SpecConfig const& c, std::vector<std::string_view> const& needles) {
  Status const s = validate(c);
  INFO("config: ", describe(c), "\nmessage: ", s.message());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  for (std::string_view needle : needles) CHECK_MESSAGE(contains(s.message(), needle), needle);
}

SpecConfig eagle3(int topk, int steps, int nodes) {
  SpecConfig c;
  c.algorithm = "EAGLE3";
  c.eagle_topk = topk;
  c.num_steps = steps;
  c.num_draft_tokens = nodes;
  c.layers = {1, 29, 57};
  return c;
}

struct NotEmpty {
  static constexpr DraftKind kKind = DraftKind::kEagle3;
  int x;
};

}  // namespace

TEST_CASE("draft strategies: tags, traits and names") {
  static_assert(DraftStrategy<Eagle3> && DraftStrategy<Eagle> && DraftStrategy<NGram> &&
                DraftStrategy<NoDraft>);
  static_assert(!DraftStrategy<int> && !DraftStrategy<NotEmpty> && !DraftStrategy<Layers<1>>);
  static_assert(std::string_view(DraftTraits<Eagle3>::kName) == "EAGLE3");
  static_assert(std::string_view(DraftTraits<Eagle>::kName) == "EAGLE");
  static_assert(std::string_view(DraftTraits<NGram>::kName) == "NGRAM");
  static_assert(std::string_view(DraftTraits<NoDraft>::kName) == "NONE");
  static_assert(DraftTraits<Eagle3>::kNeedsLayers && !DraftTraits<Eagle>::kNeedsLayers);
  static_assert(DraftTraits<Eagle>::kHasModel && !DraftTraits<NGram>::kHasModel);
  static_assert(!DraftTraits<NoDraft>::kNeedsTree && DraftTraits<NGram>::kNeedsTree);

  DraftKind kind = DraftKind::kNone;
  CHECK(parse_draft_kind("EAGLE3", &kind));
  CHECK(kind == DraftKind::kEagle3);
  CHECK(parse_draft_kind("EAGLE", &kind));
  CHECK(kind == DraftKind::kEagle);
  CHECK(parse_draft_kind("NGRAM", &kind));
  CHECK(kind == DraftKind::kNGram);
  CHECK(parse_draft_kind("NONE", &kind));
  CHECK(kind == DraftKind::kNone);
  CHECK_FALSE(parse_draft_kind("eagle3", &kind));  // exact spelling, no guessing
  CHECK_FALSE(parse_draft_kind("EAGLE-3", &kind));
  CHECK_FALSE(parse_draft_kind("", &kind));
  for (int k = 0; k < kNumDraftKinds; ++k) {
    CHECK(static_cast<int>(kDraftInfos[k].kind) == k);  // the table is indexed by kind
  }
}

TEST_CASE("layer sets: convention, order kept, duplicates and ids below the embedding rejected") {
  static_assert(kEmbedding == -1);
  static_assert(input_of_layer(0) == kEmbedding);
  static_assert(input_of_layer(2) == 1 && input_of_layer(30) == 29 && input_of_layer(58) == 57);
  static_assert(output_of_layer(57) == 57);
  // Kimi-K2.5: outputs of 1, 29, 57 = SGLang's default inputs [2, L//2, L-3] for L = 61.
  constexpr int L = 61;
  static_assert(KimiK25Layers::kSize == 3);
  static_assert(KimiK25Layers::kIds == std::array<int, 3>{1, 29, 57});
  static_assert(KimiK25Layers::kIds == std::array<int, 3>{input_of_layer(2), input_of_layer(L / 2),
                                                          input_of_layer(L - 3)});
  // The embedding output is expressible, and any order is kept as written.
  static_assert(Layers<kEmbedding, 3, 31>::kIds == std::array<int, 3>{-1, 3, 31});
  static_assert(Layers<31, 3>::kIds == std::array<int, 2>{31, 3});
  static_assert(Layers<>::kSize == 0);
  static_assert(LayerSet<Layers<>> && LayerSet<KimiK25Layers> && LayerSet<Layers<57, -1, 29>>);
  static_assert(!LayerSet<Layers<1, 29, 1>> && !LayerSet<Layers<-2>> && !LayerSet<int>);

  std::array<int, 3> const dup = {4, 7, 4}, below = {0, -2, 5}, ok = {-1, 0, 60};
  CHECK(layer_set_error(dup) == LayerSetError::kDuplicate);
  CHECK(layer_set_error(below) == LayerSetError::kBelowEmbedding);
  CHECK(layer_set_error(ok) == LayerSetError::kOk);
  CHECK(format_layers(KimiK25Layers::ids()) == "[1,29,57]");
  CHECK(format_layers(std::span<int const>()) == "[]");
  CHECK(format_layers(Layers<-1, 3>::ids()) == "[-1,3]");
}

TEST_CASE("compare_layers: equal sets pass, order / content / count mismatches name both sides") {
  std::array<int, 3> const kimi = {1, 29, 57}, swapped = {29, 1, 57};
  CHECK(compare_layers(kimi, KimiK25Layers::ids(), "a", "b").ok());

  Status s = compare_layers(kimi, swapped, "the draft checkpoint", "the serving policy");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(),
                 "expected [1,29,57] (the draft checkpoint) got [29,1,57] (the "
                 "serving policy)"));
  CHECK(contains(s.message(), "different order"));

  // DESIGN.md failure 2: trained on [embed, layer3, layer31], served [layer3, layer31, layer59].
  std::array<int, 3> const trained = {kEmbedding, 3, 31}, served = {3, 31, 59};
  s = compare_layers(trained, served, "the draft checkpoint", "the serving policy");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(), "expected [-1,3,31] (the draft checkpoint) got [3,31,59]"));
  CHECK(contains(s.message(), "same width with different layers"));
  CHECK(contains(s.message(), "-1 the embedding output"));

  std::array<int, 2> const two = {1, 29};
  s = compare_layers(kimi, two, "x", "y");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(), "different number of layers (3 vs 2)"));
}

TEST_CASE("tree shapes: the rules worked by hand") {
  static_assert(std::is_same_v<Chain<3>, TreeShape<1, 3, 4>>);
  static_assert(std::is_same_v<NoTree, TreeShape<0, 0, 1>>);
  static_assert(Chain<3>::kIsChain && Chain<3>::kDraftNodes == 3 && !Chain<3>::kRootOnly);
  static_assert(NoTree::kRootOnly && NoTree::kNodes == 1);
  static_assert(TreeShape<4, 3, 8>::kTopK == 4 && TreeShape<4, 3, 8>::kSteps == 3 &&
                TreeShape<4, 3, 8>::kNodes == 8 && !TreeShape<4, 3, 8>::kIsChain);

  // topk + (steps-1)*topk^2
  CHECK(max_draft_candidates(1, 5) == 5);
  CHECK(max_draft_candidates(2, 3) == 10);       // 2 + 2*4
  CHECK(max_draft_candidates(4, 3) == 36);       // 4 + 2*16
  CHECK(max_draft_candidates(8, 5) == 264);      // 8 + 4*64
  CHECK(max_draft_candidates(10, 7) == 610);     // 10 + 6*100 (EAGLE reference defaults)
  CHECK(max_draft_candidates(2000, 2) == 1024);  // saturates at kMaxTreeNodes
  CHECK(max_draft_candidates(1000, 1000000) == 1024);

  using E = TreeShapeError;
  CHECK(tree_shape_error(0, 0, 1) == E::kOk);  // the root-only shape
  CHECK(tree_shape_error(1, 3, 4) == E::kOk);
  CHECK(tree_shape_error(4, 3, 8) == E::kOk);
  CHECK(tree_shape_error(2, 3, 11) == E::kOk);       // 10 candidates for 10 draft nodes
  CHECK(tree_shape_error(1, 1023, 1024) == E::kOk);  // the longest chain
  CHECK(tree_shape_error(0, 3, 4) == E::kTopKTooSmall);
  CHECK(tree_shape_error(-1, 3, 4) == E::kTopKTooSmall);
  CHECK(tree_shape_error(4, 0, 8) == E::kStepsTooSmall);
  CHECK(tree_shape_error(1, 0, 1) == E::kStepsTooSmall);
  CHECK(tree_shape_error(4, 3, 1) == E::kNodesTooSmall);
  CHECK(tree_shape_error(4, 3, 1025) == E::kNodesTooLarge);
  CHECK(tree_shape_error(1, 1024, 1025) == E::kNodesTooLarge);
  CHECK(tree_shape_error(1, 3, 8) == E::kChainNodes);
  CHECK(tree_shape_error(1, 1, 16) == E::kChainNodes);  // DESIGN.md failure 3
  CHECK(tree_shape_error(1, 3, 3) == E::kChainNodes);
  CHECK(tree_shape_error(2, 3, 12) == E::kTooManyNodes);        // 11 > 10
  CHECK(tree_shape_error(4, 1, 6) == E::kTooManyNodes);         // 5 > 4
  CHECK(tree_shape_error(4, 5, 4) == E::kStepsDeeperThanTree);  // 5 steps, 3 deep at most

  static_assert(TreeShapePolicy<Chain<1>> && TreeShapePolicy<NoTree> &&
                TreeShapePolicy<TreeShape<8, 5, 32>>);
  static_assert(!TreeShapePolicy<TreeShape<1, 3, 8>> && !TreeShapePolicy<TreeShape<2, 3, 12>> &&
                !TreeShapePolicy<TreeShape<4, 0, 8>> && !TreeShapePolicy<int>);
}

TEST_CASE("graph policies: ladders sorted and positive, buckets round up") {
  using G = GraphLadder<1, 2, 4, 8>;
  static_assert(G::kCaptured && !Eager::kCaptured && G::kMaxBatch == 8);
  CHECK(G::bucket(1) == 1);
  CHECK(G::bucket(3) == 4);
  CHECK(G::bucket(8) == 8);
  CHECK(G::bucket(9) == -1);  // above the ladder: eager
  CHECK(Eager::bucket(1) == -1);
  static_assert(GraphPolicy<Eager> && GraphPolicy<G> && GraphPolicy<GraphLadder<3>>);
  static_assert(!GraphPolicy<GraphLadder<2, 1>> && !GraphPolicy<GraphLadder<1, 1>> &&
                !GraphPolicy<GraphLadder<0, 1>> && !GraphPolicy<GraphLadder<>> &&
                !GraphPolicy<int>);
  std::array<int, 3> const unsorted = {1, 4, 2}, negative = {-1, 2, 4};
  CHECK(graph_ladder_error(unsorted) == GraphLadderError::kNotIncreasing);
  CHECK(graph_ladder_error(negative) == GraphLadderError::kNonPositive);
  CHECK(graph_ladder_error(std::span<int const>()) == GraphLadderError::kEmpty);
}

TEST_CASE("SpecPolicy bundles: the concept accepts fitting parts and rejects the rest") {
  using Kimi = SpecPolicy<Eagle3, KimiK25Layers, TreeShape<4, 3, 8>, GraphLadder<1, 2, 4, 8>>;
  static_assert(SpecPolicyBundle<Kimi>);
  static_assert(std::is_same_v<Kimi::Draft, Eagle3> && std::is_same_v<Kimi::Layers, KimiK25Layers>);
  static_assert(std::is_same_v<Kimi::Tree, TreeShape<4, 3, 8>>);
  static_assert(Kimi::kKind == DraftKind::kEagle3 && Kimi::kLayerCount == 3 && Kimi::kTopK == 4 &&
                Kimi::kSteps == 3 && Kimi::kNodes == 8 && Kimi::kCaptured);
  static_assert(SpecPolicyBundle<SpecPolicy<Eagle, Layers<>, Chain<2>, Eager>>);
  static_assert(SpecPolicyBundle<SpecPolicy<NGram, Layers<>, TreeShape<2, 2, 5>, Eager>>);
  static_assert(SpecPolicyBundle<SpecPolicy<NoDraft, Layers<>, NoTree, Eager>>);
  static_assert(SpecPolicyBundle<SpecPolicy<Eagle3, Layers<-1, 3, 31>, Chain<3>, Eager>>);

  // Each of these would fail to compile if instantiated; the concept just says no.
  static_assert(!SpecPolicyBundle<int>);
  static_assert(!SpecPolicyBundle<Kimi::Tree>);
  static_assert(!SpecPolicyBundle<SpecPolicy<Eagle3, Layers<>, Chain<3>, Eager>>);
  static_assert(!SpecPolicyBundle<SpecPolicy<Eagle, KimiK25Layers, Chain<3>, Eager>>);  // failure 1
  static_assert(!SpecPolicyBundle<SpecPolicy<NGram, Layers<1>, Chain<3>, Eager>>);
  static_assert(!SpecPolicyBundle<SpecPolicy<NoDraft, Layers<>, Chain<3>, Eager>>);
  static_assert(!SpecPolicyBundle<SpecPolicy<Eagle3, KimiK25Layers, NoTree, Eager>>);
  static_assert(!SpecPolicyBundle<SpecPolicy<Eagle3, KimiK25Layers, TreeShape<1, 1, 16>, Eager>>);
  static_assert(!SpecPolicyBundle<SpecPolicy<Eagle3, Layers<1, 1>, Chain<3>, Eager>>);
  static_assert(!SpecPolicyBundle<SpecPolicy<Eagle3, KimiK25Layers, Chain<3>, GraphLadder<2, 1>>>);
  static_assert(!SpecPolicyBundle<SpecPolicy<int, KimiK25Layers, Chain<3>, Eager>>);

  std::array<int, 3> const kimi = {1, 29, 57};
  std::span<int const> const none;
  using P = PolicyError;
  CHECK(policy_error(DraftKind::kEagle3, kimi, 4, 3, 8) == P::kOk);
  CHECK(policy_error(DraftKind::kNone, none, 0, 0, 1) == P::kOk);
  CHECK(policy_error(DraftKind::kEagle3, none, 4, 3, 8) == P::kLayersRequired);
  CHECK(policy_error(DraftKind::kEagle, kimi, 4, 3, 8) == P::kLayersNotUsed);
  CHECK(policy_error(DraftKind::kNGram, kimi, 1, 3, 4) == P::kLayersNotUsed);
  CHECK(policy_error(DraftKind::kNone, none, 1, 3, 4) == P::kTreeNotUsed);
  CHECK(policy_error(DraftKind::kNGram, none, 0, 0, 1) == P::kTreeRequired);
  CHECK(policy_error(DraftKind::kEagle3, kimi, 1, 1, 16) == P::kTreeShape);
  std::array<int, 2> const dup = {3, 3};
  CHECK(policy_error(DraftKind::kEagle3, dup, 4, 3, 8) == P::kLayerSet);

  CHECK(describe<Kimi>() == "EAGLE3 layers=[1,29,57] topk=4 steps=3 nodes=8 graph=[1,2,4,8]");
  CHECK(describe<SpecPolicy<NoDraft, Layers<>, NoTree, Eager>>() ==
        "NONE layers=[] topk=0 steps=0 nodes=1 eager");
  SpecConfig const c = spec_config_of<Kimi>();
  CHECK(c.algorithm == "EAGLE3");
  CHECK(c.eagle_topk == 4);
  CHECK(c.num_steps == 3);
  CHECK(c.num_draft_tokens == 8);
  CHECK(c.layers == std::vector<int>{1, 29, 57});
  CHECK(c.cuda_graph_bs == std::vector<int>{1, 2, 4, 8});
  CHECK(validate(c).ok());
  CHECK(describe(c) == describe<Kimi>());
}

TEST_CASE("validate: valid configs pass unchanged") {
  CHECK(validate(SpecConfig{}).ok());  // the default is plain decoding
  CHECK(validate(eagle3(1, 3, 4)).ok());
  CHECK(validate(eagle3(4, 3, 8)).ok());
  CHECK(validate(eagle3(8, 5, 32)).ok());
  CHECK(validate(eagle3(10, 7, 60)).ok());  // the EAGLE reference defaults
  SpecConfig e = eagle3(1, 3, 4);
  e.algorithm = "EAGLE";
  e.layers.clear();
  CHECK(validate(e).ok());
  e.algorithm = "NGRAM";
  e.cuda_graph_bs = {1, 2, 4};
  CHECK(validate(e).ok());
  SpecConfig k = eagle3(4, 3, 8);
  k.num_target_layers = 61;
  k.layers = {kEmbedding, 29, 60};
  CHECK(validate(k).ok());
}

TEST_CASE("validate: DESIGN.md failure 3, topk 1 steps 1 draft tokens 16, is an error") {
  SpecConfig const c = eagle3(1, 1, 16);
  check_invalid(c,
                {"with --speculative-eagle-topk 1 the tree is a chain",
                 "--speculative-num-draft-tokens must be --speculative-num-steps + 1 = 2, got 16",
                 "nothing is adjusted", "set --speculative-num-draft-tokens 2",
                 "or --speculative-num-steps 15"});
  CHECK(c.num_draft_tokens == 16);
}

TEST_CASE(
    "validate: DESIGN.md failure 1, an EAGLE-3 draft (a layer set) under EAGLE, is an error") {
  SpecConfig c = eagle3(1, 3, 4);
  c.algorithm = "EAGLE";
  check_invalid(c, {"--speculative-algorithm EAGLE with layer set [1,29,57]", "last hidden state",
                    "use --speculative-algorithm EAGLE3"});
}

TEST_CASE("validate: every rule, naming the flag and the fix") {
  SpecConfig c = eagle3(1, 3, 4);
  c.algorithm = "eagle3";
  check_invalid(c, {"--speculative-algorithm 'eagle3' is unknown", "EAGLE3, EAGLE, NGRAM, NONE"});

  c = eagle3(1, 3, 4);
  c.layers.clear();
  check_invalid(c, {"--speculative-algorithm EAGLE3 needs the draft's layer set",
                    "eagle_aux_hidden_state_layer_ids", "[1,29,57]"});

  c = eagle3(1, 3, 4);
  c.algorithm = "NGRAM";
  check_invalid(c,
                {"--speculative-algorithm NGRAM reads no hidden states", "[1,29,57]", "drop it"});

  c = SpecConfig{};
  c.num_steps = 3;
  c.eagle_topk = 1;
  c.num_draft_tokens = 4;
  check_invalid(
      c, {"--speculative-algorithm NONE verifies the root only", "--speculative-num-steps 3",
          "--speculative-eagle-topk 1", "--speculative-num-draft-tokens 4", "must be 0, 0, 1"});

  c = SpecConfig{};
  c.algorithm = "EAGLE";
  check_invalid(c, {"--speculative-algorithm EAGLE drafts tokens", "--speculative-num-steps",
                    "--speculative-eagle-topk", "--speculative-num-draft-tokens"});

  check_invalid(eagle3(0, 3, 4), {"--speculative-eagle-topk 0 must be >= 1"});
  check_invalid(eagle3(4, 0, 8), {"--speculative-num-steps 0 must be >= 1"});
  check_invalid(eagle3(4, 3, 1), {"--speculative-num-draft-tokens 1 must be >= 2", "root"});
  check_invalid(eagle3(4, 300, 2000), {"--speculative-num-draft-tokens 2000 > 1024"});
  check_invalid(eagle3(1, 3, 8), {"--speculative-num-steps + 1 = 4, got 8"});
  check_invalid(eagle3(2, 3, 12),
                {"--speculative-num-draft-tokens 12 needs 11 draft candidates",
                 "--speculative-eagle-topk 2 with --speculative-num-steps 3",
                 "topk + (steps-1)*topk^2 = 10", "lower --speculative-num-draft-tokens to 11"});
  check_invalid(
      eagle3(4, 5, 4),
      {"--speculative-num-steps 5 > --speculative-num-draft-tokens - 1 = 3",
       "lower --speculative-num-steps to 3", "raise --speculative-num-draft-tokens to 6"});

  c = eagle3(4, 3, 8);
  c.layers = {1, 29, 29};
  check_invalid(c, {"layer set [1,29,29]", "id 29 is listed twice"});
  c.layers = {-2, 29};
  check_invalid(c, {"layer set [-2,29]", "id -2 is below -1", "embedding"});
  c.layers = {1, 29, 61};
  c.num_target_layers = 61;
  check_invalid(c, {"id 61 is past the target's last layer (61 layers: ids 0..60"});

  c = eagle3(4, 3, 8);
  c.cuda_graph_bs = {1, 4, 2};
  check_invalid(c, {"--cuda-graph-bs [1,4,2]", "strictly increasing"});
  c.cuda_graph_bs = {0, 4};
  check_invalid(c, {"--cuda-graph-bs [0,4]", ">= 1"});
}

TEST_CASE("check_draft_fits: a checkpoint that does not fit the policy names both sides") {
  std::array<int, 3> const kimi = {1, 29, 57};
  using Kimi = SpecPolicy<Eagle3, KimiK25Layers, Chain<3>, Eager>;
  CHECK(check_draft_fits<Kimi>(DraftKind::kEagle3, kimi).ok());

  // Failure 1: an EAGLE-3 checkpoint served by an EAGLE policy.
  Status s =
      check_draft_fits<SpecPolicy<Eagle, Layers<>, Chain<3>, Eager>>(DraftKind::kEagle3, kimi);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(), "trained as EAGLE3 (layers [1,29,57]) but the policy runs EAGLE"));
  CHECK(contains(s.message(), "--speculative-algorithm EAGLE3"));

  // Failure 2: trained on [embed, 3, 31], served [3, 31, 59].
  std::array<int, 3> const trained = {kEmbedding, 3, 31};
  s = check_draft_fits<SpecPolicy<Eagle3, Layers<3, 31, 59>, Chain<3>, Eager>>(DraftKind::kEagle3,
                                                                               trained);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(),
                 "expected [-1,3,31] (the draft checkpoint) got [3,31,59] (the policy "
                 "EAGLE3 layers=[3,31,59]"));
}
