// verify_greedy CPU reference: a hand-built tree with crafted logits (argmax ties, a rejected
// first child with an accepted sibling, node_count < N, a bad tree_status), invariants on random
// trees, and every validation error.
#include "specdec/ops/verify_greedy/verify_greedy.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "support/testing.hpp"

namespace {

using specdec::CpuExecutor;
using specdec::StatusCode;
using specdec::ops::VerifyGreedyParams;

// Plain TreeLinks from parents (tree_build is tested elsewhere): depth, first child, next sibling.
struct Links {
  std::vector<int32_t> depth, first_child, next_sibling, status;
  Links(std::vector<int32_t> const& parents, std::vector<int32_t> const& counts, int nodes) {
    int const batch = static_cast<int>(counts.size());
    depth.assign(parents.size(), -1);
    first_child.assign(parents.size(), -1);
    next_sibling.assign(parents.size(), -1);
    status.assign(counts.size(), 0);
    for (int b = 0; b < batch; ++b) {
      int32_t const* par = parents.data() + b * nodes;
      for (int i = 0; i < counts[b]; ++i) {
        depth[b * nodes + i] = i == 0 ? 0 : depth[b * nodes + par[i]] + 1;
        if (i == 0) continue;
        int32_t* slot = &first_child[b * nodes + par[i]];
        while (*slot != -1) slot = &next_sibling[b * nodes + *slot];
        *slot = i;
      }
    }
  }
  specdec::TreeLinks view() const {
    return {depth.data(), first_child.data(), next_sibling.data(), status.data()};
  }
};

struct Case {
  int batch, nodes, vocab, cap;
  std::vector<int32_t> tokens, parents, counts;
  std::vector<float> logits;
  std::vector<int32_t> argmax, path, num, next;
  Links links;
  Case(int b, int n, int v, int p, std::vector<int32_t> t, std::vector<int32_t> par,
       std::vector<int32_t> c, std::vector<float> l)
      : batch(b),
        nodes(n),
        vocab(v),
        cap(p),
        tokens(std::move(t)),
        parents(std::move(par)),
        counts(std::move(c)),
        logits(std::move(l)),
        argmax(b * n, 77),
        path(b * p, 77),
        num(b, 77),
        next(b, 77),
        links(parents, counts, n) {}
  VerifyGreedyParams params() {
    VerifyGreedyParams p;
    p.tree = {tokens.data(), parents.data(), counts.data(), batch, nodes};
    p.links = links.view();
    p.logits = logits.data();
    p.vocab = vocab;
    p.argmax_scratch = argmax.data();
    p.out = {path.data(), num.data(), next.data(), cap};
    return p;
  }
};

}  // namespace

TEST_CASE("verify_greedy: hand-worked tree with ties, rejected sibling, unused slot, bad tree") {
  // Request 0 (6 of 7 slots used), V = 5:
  //   node: 0    1    2    3    4    5    6(unused)
  //   par : -1   0    0    2    2    1    4
  //   tok : 9    3    1    4    0    2    2
  //   argmax rows (by hand): row0 [.1 2.5 -1 2.4 0] -> 1; row1 [0 0 5 0 0] -> 2;
  //   row2 [7 1 0 -3 7] tie 0/4 -> 0; row3 [1 2 3 4 5] -> 4; row4 [-1 -2 -.5 -3 -4] -> 2;
  //   row5 [0 0 0 9 0] -> 3; row6 unused -> -1.
  //   node1 tok 3 != argmax(0)=1 rejected; node2 tok 1 accepted; node3 tok 4 != 0 rejected;
  //   node4 tok 0 accepted (depth 2); node5 matches argmax(1) but its parent is rejected;
  //   slot 6 would be accepted at depth 3 but is past node_count.
  //   => path [0 2 4 -1], num_accepted 2, next_token argmax(4) = 2.
  // Request 1: same tree, tree_status 3 -> skipped.
  // Request 2 (3 nodes): siblings 1 and 2 both carry argmax(0) = 1 -> tie at depth 1 -> node 1;
  //   next_token = argmax(1): row [-0 +0 -1 -1 -1] -> +0 beats -0 -> 1.
  std::vector<float> const req0 = {0.1f, 2.5f, -1, 2.4f, 0, 0, 0, 5, 0,  0,  7,     1,
                                   0,    -3,   7,  1,    2, 3, 4, 5, -1, -2, -0.5f, -3,
                                   -4,   0,    0,  0,    9, 0, 0, 0, 2,  0,  0};
  std::vector<float> logits = req0;
  logits.insert(logits.end(), req0.begin(), req0.end());
  std::vector<float> const req2 = {0, 1, 0, 0, 0, -0.0f, 0.0f, -1, -1, -1, 3, 3, 3, 3, 3};
  logits.insert(logits.end(), req2.begin(), req2.end());
  logits.resize(3 * 7 * 5, 1.0f);
  std::vector<int32_t> tokens = {9, 3, 1, 4, 0, 2, 2, 9, 3, 1, 4, 0, 2, 2, 5, 1, 1, 0, 0, 0, 0};
  std::vector<int32_t> parents = {-1, 0, 0, 2,  2, 1, 4,  -1, 0,  0, 2,
                                  2,  1, 4, -1, 0, 0, -1, -1, -1, -1};
  Case c(3, 7, 5, 4, tokens, parents, {6, 6, 3}, logits);
  c.links.status[1] = 3;
  auto p = c.params();
  REQUIRE(specdec::ops::verify_greedy(CpuExecutor{}, p).ok());
  CHECK(c.argmax == std::vector<int32_t>{1,  2,  0,  4, 2, 3, -1, -1, -1, -1, -1,
                                         -1, -1, -1, 1, 1, 0, -1, -1, -1, -1});
  CHECK(c.path == std::vector<int32_t>{0, 2, 4, -1, 0, -1, -1, -1, 0, 1, -1, -1});
  CHECK(c.num == std::vector<int32_t>{2, 0, 1});
  CHECK(c.next == std::vector<int32_t>{2, -1, 1});
}

TEST_CASE("verify_greedy: nothing accepted gives the root and its argmax; chain fully accepted") {
  // Request 0: chain 0-1-2, tokens 4, 0, 0; argmax(0) = 3 != 0 -> only the root; bonus 3.
  // Request 1: chain 0-1-2, tokens 4, 3, 1; argmax(0) = 3, argmax(1) = 1, argmax(2) = 0
  //   -> all accepted, path [0 1 2], num 2, next 0. P = 3 exactly depth + 1.
  std::vector<float> logits = {0, 0, 0, 1, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 1,
                               0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0};
  Case c(2, 3, 5, 3, {4, 0, 0, 4, 3, 1}, {-1, 0, 1, -1, 0, 1}, {3, 3}, logits);
  auto p = c.params();
  p.tree.node_count = nullptr;  // all N slots used
  REQUIRE(specdec::ops::verify_greedy(CpuExecutor{}, p).ok());
  CHECK(c.path == std::vector<int32_t>{0, -1, -1, 0, 1, 2});
  CHECK(c.num == std::vector<int32_t>{0, 2});
  CHECK(c.next == std::vector<int32_t>{3, 0});
  CHECK(c.argmax == std::vector<int32_t>{3, 0, 4, 3, 1, 0});
}

TEST_CASE("verify_greedy: invariants on random trees") {
  specdec::testing::Rng rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    int const batch = 4, nodes = 16, vocab = 6, cap = 17;
    std::vector<int32_t> parents, tokens, counts;
    std::uniform_int_distribution<int> tok(0, vocab - 1), cnt(1, nodes);
    for (int b = 0; b < batch; ++b) {
      auto par = specdec::testing::random_parents(rng, nodes, trial % 2 == 0);
      parents.insert(parents.end(), par.begin(), par.end());
      for (int i = 0; i < nodes; ++i) tokens.push_back(tok(rng));
      counts.push_back(cnt(rng));
    }
    Case c(batch, nodes, vocab, cap, tokens, parents, counts,
           specdec::testing::random_logits(rng, batch * nodes, vocab));
    auto p = c.params();
    REQUIRE(specdec::ops::verify_greedy(CpuExecutor{}, p).ok());
    for (int b = 0; b < batch; ++b) {
      int32_t const* path = &c.path[b * cap];
      int const n = c.num[b];
      REQUIRE(n >= 0);
      REQUIRE(n < counts[b]);
      CHECK(path[0] == 0);
      for (int k = 1; k <= n; ++k) {
        int const node = path[k], parent = path[k - 1];
        REQUIRE(node > 0);
        REQUIRE(node < counts[b]);
        CHECK(parents[b * nodes + node] == parent);
        CHECK(tokens[b * nodes + node] == c.argmax[b * nodes + parent]);
      }
      for (int k = n + 1; k < cap; ++k) CHECK(path[k] == -1);
      CHECK(c.next[b] == c.argmax[b * nodes + path[n]]);
      // No child of the last path node matches its argmax (else the path would go deeper).
      for (int i = 1; i < counts[b]; ++i) {
        if (parents[b * nodes + i] == path[n]) CHECK(tokens[b * nodes + i] != c.next[b]);
      }
      for (int i = 0; i < counts[b]; ++i) {  // argmax really is a maximum
        float const* row = &c.logits[(b * nodes + i) * vocab];
        for (int v = 0; v < vocab; ++v) CHECK(row[v] <= row[c.argmax[b * nodes + i]]);
      }
    }
    // The same argmax given instead of the logits (a vocabulary-sharded target) accepts the same.
    std::vector<int32_t> const given = c.argmax;
    std::vector<int32_t> argmax2(c.argmax.size(), 77), path2(c.path.size(), 77), num2(batch, 77),
        next2(batch, 77);
    auto q = c.params();
    q.logits = nullptr;
    q.target_argmax = given.data();
    q.argmax_scratch = argmax2.data();
    q.out = {path2.data(), num2.data(), next2.data(), cap};
    REQUIRE(specdec::ops::verify_greedy(CpuExecutor{}, q).ok());
    CHECK(argmax2 == given);
    CHECK(path2 == c.path);
    CHECK(num2 == c.num);
    CHECK(next2 == c.next);
  }
}

TEST_CASE("verify_greedy: validation names the problem") {
  Case c(1, 2, 3, 2, {0, 1}, {-1, 0}, {2}, {1, 2, 3, 4, 5, 6});
  auto expect = [&](auto mutate, char const* needle) {
    auto p = c.params();
    mutate(p);
    auto s = specdec::ops::verify_greedy(CpuExecutor{}, p);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find(needle) != std::string::npos, s.message());
  };
  expect([](VerifyGreedyParams& p) { p.tree.batch = 0; }, "batch");
  expect([](VerifyGreedyParams& p) { p.tree.nodes = 0; }, "nodes");
  expect([](VerifyGreedyParams& p) { p.tree.nodes = 1025; }, "nodes");
  expect([](VerifyGreedyParams& p) { p.vocab = 0; }, "vocab");
  expect([](VerifyGreedyParams& p) { p.out.path_capacity = 0; }, "path capacity");
  expect([](VerifyGreedyParams& p) { p.tree.tokens = nullptr; }, "tree.tokens");
  expect([](VerifyGreedyParams& p) { p.tree.parents = nullptr; }, "tree.parents");
  expect([](VerifyGreedyParams& p) { p.links.depth = nullptr; }, "links.depth");
  expect([](VerifyGreedyParams& p) { p.links.tree_status = nullptr; }, "tree_status");
  expect([](VerifyGreedyParams& p) { p.logits = nullptr; }, "logits");
  expect([](VerifyGreedyParams& p) { p.argmax_scratch = nullptr; }, "argmax_scratch");
  expect([](VerifyGreedyParams& p) { p.out.accepted_path = nullptr; }, "accepted_path");
  expect([](VerifyGreedyParams& p) { p.out.num_accepted = nullptr; }, "num_accepted");
  expect([](VerifyGreedyParams& p) { p.out.next_token = nullptr; }, "next_token");
  auto p = c.params();
  CHECK(specdec::ops::verify_greedy(CpuExecutor{}, p).ok());
}
