// dispatch: run-time flags select exactly one compiled bundle; an unsupported combination lists
// what is compiled; an invalid one reports the validation error and calls nothing.
#include "specdec/core/dispatch.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>

using namespace specdec;

namespace {

bool contains(std::string const& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

using Chain3 = SpecPolicy<Eagle3, KimiK25Layers, Chain<3>, Eager>;
using NoSpec = SpecPolicy<NoDraft, Layers<>, NoTree, Eager>;
using Eagle1 = SpecPolicy<Eagle, Layers<>, Chain<2>, GraphLadder<1, 8>>;
using Small = PolicyList<Chain3, NoSpec, Eagle1>;

// Records which bundle the visitor got.
struct Recorder {
  int calls = 0;
  std::string name;
  template <class P>
  Status operator()() {
    ++calls;
    name = describe<P>();
    return Status::Ok();
  }
};

// dispatch(spec_config_of<Expected>()) must call the visitor once, with exactly Expected.
template <class List, class Expected>
void check_picks() {
  int calls = 0;
  bool same = false;
  Status const s = dispatch<List>(spec_config_of<Expected>(), [&]<class P>() -> Status {
    ++calls;
    same = std::is_same_v<P, Expected>;
    return Status::Ok();
  });
  INFO(describe<Expected>(), ": ", s.to_string());
  CHECK(s.ok());
  CHECK(calls == 1);
  CHECK(same);
}

template <class List, class... Ps>
void check_round_trip(PolicyList<Ps...>*) {
  (check_picks<List, Ps>(), ...);
}

}  // namespace

TEST_CASE("dispatch picks the bundle the flags name, for every compiled bundle") {
  static_assert(KimiK25Policies::kSize == 10);
  static_assert(Small::kSize == 3);
  check_round_trip<KimiK25Policies>(static_cast<KimiK25Policies*>(nullptr));
  check_round_trip<Small>(static_cast<Small*>(nullptr));

  SpecConfig c;  // defaults: NONE, eager
  Recorder r;
  CHECK(dispatch<Small>(c, r).ok());
  CHECK(r.calls == 1);
  CHECK(r.name == "NONE layers=[] topk=0 steps=0 nodes=1 eager");

  c.algorithm = "EAGLE3";
  c.num_steps = 3;
  c.eagle_topk = 1;
  c.num_draft_tokens = 4;
  c.layers = {1, 29, 57};
  r = Recorder{};
  CHECK(dispatch<Small>(c, r).ok());
  CHECK(r.calls == 1);
  CHECK(r.name == "EAGLE3 layers=[1,29,57] topk=1 steps=3 nodes=4 eager");
}

TEST_CASE("dispatch returns the visitor's status and accepts a type_identity visitor") {
  Status s = dispatch<Small>(
      SpecConfig{}, []<class P>() -> Status { return Status::Internal("from " + describe<P>()); });
  CHECK(s.code() == StatusCode::kInternal);
  CHECK(s.message() == "from NONE layers=[] topk=0 steps=0 nodes=1 eager");

  bool got_eagle1 = false;
  s = dispatch<Small>(spec_config_of<Eagle1>(), [&](auto tag) {
    got_eagle1 = std::is_same_v<typename decltype(tag)::type, Eagle1>;
    return Status::Ok();
  });
  CHECK(s.ok());
  CHECK(got_eagle1);
}

TEST_CASE("an unsupported combination lists every compiled bundle and calls nothing") {
  CHECK(describe_list<Small>() ==
        "EAGLE3 layers=[1,29,57] topk=1 steps=3 nodes=4 eager; "
        "NONE layers=[] topk=0 steps=0 nodes=1 eager; "
        "EAGLE layers=[] topk=1 steps=2 nodes=3 graph=[1,8]");

  SpecConfig c;
  c.algorithm = "EAGLE3";
  c.num_steps = 3;
  c.eagle_topk = 2;
  c.num_draft_tokens = 6;
  c.layers = {1, 29, 57};
  Recorder r;
  Status s = dispatch<Small>(c, r);
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK(r.calls == 0);
  CHECK(contains(s.message(),
                 "no compiled policy for EAGLE3 layers=[1,29,57] topk=2 steps=3 nodes=6 eager"));
  CHECK(contains(s.message(), "compiled: " + describe_list<Small>()));

  // Same layers, another order: valid flags, but not what is compiled.
  c = spec_config_of<Chain3>();
  c.layers = {29, 1, 57};
  s = dispatch<Small>(c, r);
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK(contains(s.message(), "layers=[29,1,57]"));

  // Graph ladder differs from the compiled one.
  c = spec_config_of<Eagle1>();
  c.cuda_graph_bs = {1, 2, 8};
  s = dispatch<Small>(c, r);
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK(contains(s.message(), "graph=[1,2,8]"));
  CHECK(r.calls == 0);

  // The Kimi list names all ten bundles.
  c = spec_config_of<Chain3>();
  c.num_steps = 5;
  c.num_draft_tokens = 6;
  s = dispatch<KimiK25Policies>(c, r);
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK(contains(s.message(), describe<KimiK25Eagle3Top8<KimiK25GraphLadder>>()));
  CHECK(contains(s.message(), describe<KimiK25NoDraft<Eager>>()));
  CHECK(contains(s.message(),
                 "EAGLE3 layers=[1,29,57] topk=4 steps=3 nodes=8 "
                 "graph=[1,2,4,8,16,32,64,128,256]"));
  CHECK(r.calls == 0);
}

TEST_CASE("an invalid combination reports the validation error, not 'unsupported'") {
  SpecConfig c = spec_config_of<Chain3>();
  c.num_steps = 1;
  c.num_draft_tokens = 16;  // DESIGN.md failure 3
  Recorder r;
  Status s = dispatch<KimiK25Policies>(c, r);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(
      contains(s.message(), "--speculative-num-draft-tokens must be --speculative-num-steps + 1"));
  CHECK(r.calls == 0);

  c = spec_config_of<Chain3>();
  c.algorithm = "EAGLE";  // DESIGN.md failure 1
  s = dispatch<KimiK25Policies>(c, r);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(), "use --speculative-algorithm EAGLE3"));

  c = spec_config_of<Chain3>();
  c.algorithm = "EAGLE-3";
  s = dispatch<KimiK25Policies>(c, r);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(), "'EAGLE-3' is unknown"));
  CHECK(r.calls == 0);
}
