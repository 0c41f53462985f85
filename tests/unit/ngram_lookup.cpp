// ngram_lookup CPU reference: hand-worked chains and tries (answers worked out in the comments),
// longest-n precedence over recency, skipping fully inserted continuations, min_n/max_n edges,
// no match, bad lengths, and every validation error.
#include "specdec/ops/ngram_lookup/ngram_lookup.hpp"

#include <doctest/doctest.h>

#include <vector>

namespace {

using specdec::CpuExecutor;
using specdec::StatusCode;
using specdec::ops::NgramLookupParams;

struct Result {
  std::vector<int32_t> tokens, parents;
  int32_t count;
};

// Runs one request (max_len = history size + 2 so the row stride differs from the length).
Result lookup(std::vector<int32_t> history, int min_n, int max_n, int nodes, int branches,
              int length = -1) {
  int const len = length >= 0 ? length : static_cast<int>(history.size());
  int const max_len = static_cast<int>(history.size()) + 2;
  history.resize(max_len, 42);
  std::vector<int32_t> lengths = {len};
  Result r{std::vector<int32_t>(nodes, 77), std::vector<int32_t>(nodes, 77), 77};
  NgramLookupParams p;
  p.tokens = history.data();
  p.lengths = lengths.data();
  p.batch = 1;
  p.max_len = max_len;
  p.min_n = min_n;
  p.max_n = max_n;
  p.nodes = nodes;
  p.branches = branches;
  p.out_tokens = r.tokens.data();
  p.out_parents = r.parents.data();
  p.out_node_count = &r.count;
  REQUIRE(specdec::ops::ngram_lookup(CpuExecutor{}, p).ok());
  return r;
}

using V = std::vector<int32_t>;

}  // namespace

TEST_CASE("ngram_lookup: chain from the most recent longest match") {
  // [1 2 3 9 1 2 3 7 1 2 3], max_n 3: suffix [1 2 3] at 8..10; latest earlier start s = 4
  // (s + 3 <= 10); continuation tokens[7..10] = 7 1 2 3 (4 <= N-1 = 5).
  auto r = lookup({1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3}, 1, 3, 6, 1);
  CHECK(r.count == 5);
  CHECK(r.tokens == V{3, 7, 1, 2, 3, -1});
  CHECK(r.parents == V{-1, 0, 1, 2, 3, -1});
  // N = 4 keeps 3 proposed tokens.
  r = lookup({1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3}, 1, 3, 4, 1);
  CHECK(r.count == 4);
  CHECK(r.tokens == V{3, 7, 1, 2});
  CHECK(r.parents == V{-1, 0, 1, 2});
}

TEST_CASE("ngram_lookup: a longer n-gram wins over a more recent shorter one") {
  // [1 2 3 5 4 2 3 6 1 2 3]: n = 3 matches only at s = 0 -> continuation 5 4 2 ...;
  // n = 2 ([2 3]) would match later at s = 5 -> 6, but n = 3 comes first.
  auto r = lookup({1, 2, 3, 5, 4, 2, 3, 6, 1, 2, 3}, 1, 3, 4, 1);
  CHECK(r.tokens == V{3, 5, 4, 2});
  CHECK(r.parents == V{-1, 0, 1, 2});
  // With max_n = 2 the recent [2 3] at s = 5 wins: continuation 6 1 2.
  r = lookup({1, 2, 3, 5, 4, 2, 3, 6, 1, 2, 3}, 1, 2, 4, 1);
  CHECK(r.tokens == V{3, 6, 1, 2});
}

TEST_CASE("ngram_lookup: tree of two matches fills N") {
  // Same history, branches 2, N = 8: s = 4 gives 7 1 2 3 (nodes 1..4); s = 0 gives
  // 9 1 2 3 7 1 2 (m = min(7, 8) = 7): 9 is a new root child (5), then 1 (6), 2 (7): N full.
  auto r = lookup({1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3}, 1, 3, 8, 2);
  CHECK(r.count == 8);
  CHECK(r.tokens == V{3, 7, 1, 2, 3, 9, 1, 2});
  CHECK(r.parents == V{-1, 0, 1, 2, 3, 0, 5, 6});
}

TEST_CASE("ngram_lookup: tree merges shared prefixes and skips continuations already present") {
  // [5 1 2 3 5 1 2 4 8 5 1], min 1, max 2, root 1. n = 2, suffix [5 1]:
  //   s = 4 -> tokens[6..10] = 2 4 8 5 1 -> nodes 1..5, parents 0 1 2 3 4.
  //   s = 0 -> tokens[2..10] = 2 3 5 1 2 4 8 5 1: 2 is node 1 (shared prefix); then new
  //   3(6, par 1) 5(7) 1(8) 2(9) 4(10) 8(11) 5(12) 1(13) -> 14 nodes.
  // n = 1, suffix [1]: s = 5 -> 2 4 8 5 1 already present: skipped; s = 1 -> same as s = 0:
  //   skipped. Only 2 of 3 branches used.
  auto r = lookup({5, 1, 2, 3, 5, 1, 2, 4, 8, 5, 1}, 1, 2, 16, 3);
  CHECK(r.count == 14);
  CHECK(r.tokens == V{1, 2, 4, 8, 5, 1, 3, 5, 1, 2, 4, 8, 5, 1, -1, -1});
  CHECK(r.parents == V{-1, 0, 1, 2, 3, 4, 1, 6, 7, 8, 9, 10, 11, 12, -1, -1});
  // N = 8: the second continuation adds 3 (6) and 5 (7), then the trie is full.
  r = lookup({5, 1, 2, 3, 5, 1, 2, 4, 8, 5, 1}, 1, 2, 8, 3);
  CHECK(r.count == 8);
  CHECK(r.tokens == V{1, 2, 4, 8, 5, 1, 3, 5});
  CHECK(r.parents == V{-1, 0, 1, 2, 3, 4, 1, 6});
  // branches 1 is the chain of the first match.
  r = lookup({5, 1, 2, 3, 5, 1, 2, 4, 8, 5, 1}, 1, 2, 8, 1);
  CHECK(r.count == 6);
  CHECK(r.tokens == V{1, 2, 4, 8, 5, 1, -1, -1});
}

TEST_CASE("ngram_lookup: sibling branches from different n") {
  // [4 6 7 4 5 4], min 1, max 2, branches 4, N = 8, root 4.
  //   n = 2, suffix [5 4]: starts s <= 3: [7 4] [6 7] [4 6] -> no match.
  //   n = 1, suffix [4]: s = 3 -> tokens[4..5] = 5 4; s = 0 -> tokens[1..5] = 6 7 4 5 4.
  //   -> nodes 5(1) 4(2) | 6(3) 7(4) 4(5) 5(6) 4(7): count 8, used 2.
  auto r = lookup({4, 6, 7, 4, 5, 4}, 1, 2, 8, 4);
  CHECK(r.count == 8);
  CHECK(r.tokens == V{4, 5, 4, 6, 7, 4, 5, 4});
  CHECK(r.parents == V{-1, 0, 1, 0, 3, 4, 5, 6});
}

TEST_CASE("ngram_lookup: no match, min_n/max_n edges, tiny inputs") {
  // [1 2 3 4]: no earlier 4, [3 4] or [2 3 4] -> root only.
  auto r = lookup({1, 2, 3, 4}, 1, 3, 4, 2);
  CHECK(r.count == 1);
  CHECK(r.tokens == V{4, -1, -1, -1});
  CHECK(r.parents == V{-1, -1, -1, -1});
  // [7 8 9 8]: min_n 2 -> [9 8] never occurred before -> root only; min_n 1 -> [8] at s = 1
  // proposes 9 8.
  CHECK(lookup({7, 8, 9, 8}, 2, 2, 4, 1).count == 1);
  r = lookup({7, 8, 9, 8}, 1, 2, 4, 1);
  CHECK(r.tokens == V{8, 9, 8, -1});
  CHECK(r.parents == V{-1, 0, 1, -1});
  // max_n beyond len - 1: [4 4] uses n = 1 only: s = 0 proposes 4.
  r = lookup({4, 4}, 1, 5, 3, 1);
  CHECK(r.count == 2);
  CHECK(r.tokens == V{4, 4, -1});
  // min_n > len - 1: nothing to match.
  CHECK(lookup({4, 4}, 2, 5, 3, 1).count == 1);
  // N = 1: root only even with matches.
  r = lookup({1, 2, 1, 2}, 1, 2, 1, 1);
  CHECK(r.count == 1);
  CHECK(r.tokens == V{2});
  // A suffix match may overlap the suffix: [3 3 3], n = 2, s = 0 ([3 3] at 0..1) -> 3.
  r = lookup({3, 3, 3}, 2, 2, 4, 1);
  CHECK(r.tokens == V{3, 3, -1, -1});
  // Length 1: root only. Length 0 or beyond max_len: no tree (node_count 0, all -1).
  r = lookup({9, 9, 9}, 1, 2, 3, 1, 1);
  CHECK(r.count == 1);
  CHECK(r.tokens == V{9, -1, -1});
  r = lookup({9, 9, 9}, 1, 2, 3, 1, 0);
  CHECK(r.count == 0);
  CHECK(r.tokens == V{-1, -1, -1});
  CHECK(r.parents == V{-1, -1, -1});
  CHECK(lookup({9, 9, 9}, 1, 2, 3, 1, 6).count == 0);  // max_len is 5
}

TEST_CASE("ngram_lookup: validation names the problem") {
  std::vector<int32_t> tokens = {1, 2, 3}, lengths = {3}, out(4), parents(4), count(1);
  auto expect = [&](auto mutate, char const* needle) {
    NgramLookupParams p;
    p.tokens = tokens.data();
    p.lengths = lengths.data();
    p.batch = 1;
    p.max_len = 3;
    p.min_n = 1;
    p.max_n = 2;
    p.nodes = 4;
    p.branches = 1;
    p.out_tokens = out.data();
    p.out_parents = parents.data();
    p.out_node_count = count.data();
    mutate(p);
    auto s = specdec::ops::ngram_lookup(CpuExecutor{}, p);
    if (needle == nullptr) {
      CHECK(s.ok());
      return;
    }
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find(needle) != std::string::npos, s.message());
  };
  expect([](NgramLookupParams&) {}, nullptr);
  expect([](NgramLookupParams& p) { p.batch = 0; }, "batch");
  expect([](NgramLookupParams& p) { p.max_len = 0; }, "max_len");
  expect([](NgramLookupParams& p) { p.min_n = 0; }, "min_n");
  expect([](NgramLookupParams& p) { p.max_n = 0; }, "max_n");
  expect([](NgramLookupParams& p) { p.nodes = 0; }, "nodes");
  expect([](NgramLookupParams& p) { p.nodes = 1025; }, "nodes");
  expect([](NgramLookupParams& p) { p.branches = 0; }, "branches");
  expect([](NgramLookupParams& p) { p.tokens = nullptr; }, "tokens is null");
  expect([](NgramLookupParams& p) { p.lengths = nullptr; }, "lengths");
  expect([](NgramLookupParams& p) { p.out_tokens = nullptr; }, "out_tokens");
  expect([](NgramLookupParams& p) { p.out_parents = nullptr; }, "out_parents");
  expect([](NgramLookupParams& p) { p.out_node_count = nullptr; }, "out_node_count");
}
