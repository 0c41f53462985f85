// tree_build CPU reference: hand-worked trees (expected masks, depths, links and leaf paths
// written out by hand), multi-word masks (N = 33, 64), every malformed case, every validation
// error, and invariants on random trees.
#include "specdec/ops/tree_build/tree_build.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "support/testing.hpp"

namespace {

using specdec::CpuExecutor;
using specdec::Status;
using specdec::StatusCode;
using specdec::ops::TreeBuildParams;

// Host buffers for one tree_build call, poisoned with 0x7f7f7f7f so unwritten outputs show.
struct Tree {
  int B, N, P, W;
  std::vector<int32_t> tokens, parents, node_count, prefix;
  std::vector<uint32_t> mask;
  std::vector<int32_t> depth, positions, first_child, next_sibling, leaf_paths, leaf_count, status;

  Tree(int batch, int nodes, int path_capacity)
      : B(batch),
        N(nodes),
        P(path_capacity),
        W((nodes + 31) / 32),
        tokens(batch * nodes, 7),
        parents(batch * nodes, -1),
        node_count(batch, nodes),
        prefix(batch, 0),
        mask(batch * nodes * W, 0x7f7f7f7fu),
        depth(batch * nodes, 0x7f7f7f7f),
        positions(depth),
        first_child(depth),
        next_sibling(depth),
        leaf_paths(batch * nodes * path_capacity, 0x7f7f7f7f),
        leaf_count(batch, 0x7f7f7f7f),
        status(batch, 0x7f7f7f7f) {}

  TreeBuildParams params(bool with_count = true) {
    TreeBuildParams p;
    p.tree = {tokens.data(), parents.data(), with_count ? node_count.data() : nullptr, B, N};
    p.prefix_len = prefix.data();
    p.out = {mask.data(),        depth.data(),        positions.data(),
             first_child.data(), next_sibling.data(), leaf_paths.data(),
             leaf_count.data(),  status.data(),       P};
    return p;
  }
  Status run(bool with_count = true) {
    return specdec::ops::tree_build(CpuExecutor{}, params(with_count));
  }
  std::vector<int32_t> row(std::vector<int32_t> const& v, int b) const {
    return {v.begin() + b * N, v.begin() + (b + 1) * N};
  }
  std::vector<int32_t> path(int b, int k) const {
    auto it = leaf_paths.begin() + (b * N + k) * P;
    return {it, it + P};
  }
  std::vector<uint32_t> mask_row(int b, int i) const {
    auto it = mask.begin() + (b * N + i) * W;
    return {it, it + W};
  }
};

using V = std::vector<int32_t>;

// Every output of request b holds the "unused" values (malformed request).
void check_all_unused(Tree const& t, int b) {
  for (int i = 0; i < t.N; ++i) {
    for (uint32_t w : t.mask_row(b, i)) CHECK(w == 0u);
    CHECK(t.depth[b * t.N + i] == -1);
    CHECK(t.positions[b * t.N + i] == -1);
    CHECK(t.first_child[b * t.N + i] == -1);
    CHECK(t.next_sibling[b * t.N + i] == -1);
    for (int32_t x : t.path(b, i)) CHECK(x == -1);
  }
  CHECK(t.leaf_count[b] == 0);
}

}  // namespace

TEST_CASE("tree_build: root with two children, the first with two children") {
  //      0
  //     / \.
  //    1   2
  //   / \.
  //  3   4
  Tree t(1, 5, 3);
  t.parents = {-1, 0, 0, 1, 1};
  t.prefix = {10};
  REQUIRE(t.run().ok());
  CHECK(t.status[0] == specdec::kTreeOk);
  // Row i: bits of i and its ancestors. 0:{0}=1, 1:{0,1}=3, 2:{0,2}=5, 3:{0,1,3}=11, 4:{0,1,4}=19.
  CHECK(t.mask == std::vector<uint32_t>{1u, 3u, 5u, 11u, 19u});
  CHECK(t.depth == V{0, 1, 1, 2, 2});
  CHECK(t.positions == V{10, 11, 11, 12, 12});
  CHECK(t.first_child == V{1, 3, -1, -1, -1});
  CHECK(t.next_sibling == V{-1, 2, -1, 4, -1});
  CHECK(t.leaf_count[0] == 3);
  CHECK(t.path(0, 0) == V{0, 2, -1});
  CHECK(t.path(0, 1) == V{0, 1, 3});
  CHECK(t.path(0, 2) == V{0, 1, 4});
  CHECK(t.path(0, 3) == V{-1, -1, -1});
  CHECK(t.path(0, 4) == V{-1, -1, -1});
}

TEST_CASE("tree_build: a chain and a star in one batch, different prefixes") {
  Tree t(2, 4, 4);
  t.parents = {-1, 0, 1, 2,   // chain 0-1-2-3
               -1, 0, 0, 0};  // star
  t.prefix = {5, 100};
  REQUIRE(t.run().ok());
  CHECK(t.mask == std::vector<uint32_t>{1u, 3u, 7u, 15u, 1u, 3u, 5u, 9u});
  CHECK(t.row(t.depth, 0) == V{0, 1, 2, 3});
  CHECK(t.row(t.depth, 1) == V{0, 1, 1, 1});
  CHECK(t.row(t.positions, 0) == V{5, 6, 7, 8});
  CHECK(t.row(t.positions, 1) == V{100, 101, 101, 101});
  CHECK(t.row(t.first_child, 0) == V{1, 2, 3, -1});
  CHECK(t.row(t.next_sibling, 0) == V{-1, -1, -1, -1});
  CHECK(t.row(t.first_child, 1) == V{1, -1, -1, -1});
  CHECK(t.row(t.next_sibling, 1) == V{-1, 2, 3, -1});
  CHECK(t.leaf_count == V{1, 3});
  CHECK(t.path(0, 0) == V{0, 1, 2, 3});
  CHECK(t.path(0, 1) == V{-1, -1, -1, -1});
  CHECK(t.path(1, 0) == V{0, 1, -1, -1});
  CHECK(t.path(1, 1) == V{0, 2, -1, -1});
  CHECK(t.path(1, 2) == V{0, 3, -1, -1});
  CHECK(t.path(1, 3) == V{-1, -1, -1, -1});
}

TEST_CASE("tree_build: node_count < N leaves the tail slots unused; nullptr count uses all N") {
  Tree t(1, 5, 5);
  t.parents = {-1, 0, 1, 99, -7};  // slots 3, 4 unused: their garbage parents are never read
  t.node_count = {3};
  t.prefix = {2};
  REQUIRE(t.run().ok());
  CHECK(t.mask == std::vector<uint32_t>{1u, 3u, 7u, 0u, 0u});
  CHECK(t.depth == V{0, 1, 2, -1, -1});
  CHECK(t.positions == V{2, 3, 4, -1, -1});
  CHECK(t.first_child == V{1, 2, -1, -1, -1});
  CHECK(t.next_sibling == V{-1, -1, -1, -1, -1});
  CHECK(t.leaf_count[0] == 1);
  CHECK(t.path(0, 0) == V{0, 1, 2, -1, -1});
  for (int k = 1; k < 5; ++k) CHECK(t.path(0, k) == V{-1, -1, -1, -1, -1});

  Tree all(1, 2, 2);
  all.parents = {-1, 0};
  all.node_count = {1};  // ignored without the pointer
  REQUIRE(all.run(/*with_count=*/false).ok());
  CHECK(all.depth == V{0, 1});
  CHECK(all.leaf_count[0] == 1);
}

TEST_CASE("tree_build: N = 1 (root only)") {
  Tree t(1, 1, 1);
  REQUIRE(t.run().ok());
  CHECK(t.mask == std::vector<uint32_t>{1u});
  CHECK(t.depth == V{0});
  CHECK(t.first_child == V{-1});
  CHECK(t.leaf_count[0] == 1);
  CHECK(t.path(0, 0) == V{0});
}

TEST_CASE("tree_build: multi-word masks, N = 33 and N = 64") {
  // N = 33: chain 0..31 (31 deep), node 32 a child of node 31 -> row 32 has every bit 0..32.
  Tree t(1, 33, 33);
  for (int i = 1; i < 33; ++i) t.parents[i] = i - 1;
  REQUIRE(t.run().ok());
  CHECK(t.W == 2);
  CHECK(t.mask_row(0, 0) == std::vector<uint32_t>{1u, 0u});
  CHECK(t.mask_row(0, 31) == std::vector<uint32_t>{0xffffffffu, 0u});
  CHECK(t.mask_row(0, 32) == std::vector<uint32_t>{0xffffffffu, 1u});
  CHECK(t.depth[32] == 32);
  CHECK(t.leaf_count[0] == 1);
  CHECK(t.path(0, 0)[32] == 32);

  // N = 64: star around the root except 63 -> 40 -> 0 and 33 -> 0.
  Tree s(1, 64, 3);
  for (int i = 1; i < 64; ++i) s.parents[i] = 0;
  s.parents[63] = 40;
  REQUIRE(s.run().ok());
  CHECK(s.mask_row(0, 33) == std::vector<uint32_t>{1u, 1u << 1});                 // {0, 33}
  CHECK(s.mask_row(0, 40) == std::vector<uint32_t>{1u, 1u << 8});                 // {0, 40}
  CHECK(s.mask_row(0, 63) == std::vector<uint32_t>{1u, (1u << 8) | (1u << 31)});  // {0, 40, 63}
  CHECK(s.depth[63] == 2);
  CHECK(s.first_child[40] == 63);
  CHECK(s.next_sibling[39] == 40);
  CHECK(s.next_sibling[41] == 42);
  CHECK(s.next_sibling[62] == -1);
  CHECK(s.leaf_count[0] == 62);  // 1..62 except 40, plus 63
  CHECK(s.path(0, 38) == V{0, 39, -1});
  CHECK(s.path(0, 39) == V{0, 41, -1});
  CHECK(s.path(0, 61) == V{0, 40, 63});
  CHECK(s.path(0, 62) == V{-1, -1, -1});
}

TEST_CASE("tree_build: malformed trees are reported and never spill into good requests") {
  struct Case {
    std::string name;
    V parents;
    int count;
    int P;
    int32_t code;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"root parent", {0, 0, 1, 2}, 4, 4, specdec::kTreeBadRoot, "node 0"},
      {"parent == i", {-1, 0, 2, 1}, 4, 4, specdec::kTreeBadParent, "node 2"},
      {"parent > i", {-1, 0, 1, 3}, 4, 4, specdec::kTreeBadParent, "node 3"},
      {"parent < -1", {-1, -5, 0, 0}, 4, 4, specdec::kTreeBadParent, "node 1"},
      {"parent -1 at i > 0", {-1, 0, -1, 0}, 4, 4, specdec::kTreeBadParent, "node 2"},
      {"node_count 0", {-1, 0, 1, 2}, 0, 4, specdec::kTreeBadNodeCount, "node_count 0"},
      {"node_count > N", {-1, 0, 1, 2}, 5, 4, specdec::kTreeBadNodeCount, "node_count 5"},
      {"too deep", {-1, 0, 1, 2}, 4, 3, specdec::kTreeTooDeep, "node 3"},
  };
  for (auto const& c : cases) {
    CAPTURE(c.name);
    // Request 0 and 2 good, request 1 the malformed one.
    Tree t(3, 4, c.P);
    t.parents = {-1, 0, 0, 1, -1, 0, 0, 0, -1, 0, 1, 1};
    for (int i = 0; i < 4; ++i) t.parents[4 + i] = c.parents[i];
    t.node_count = {4, c.count, 3};
    t.prefix = {1, 2, 3};
    Status s = t.run();
    CHECK(s.code() == StatusCode::kMalformedInput);
    CHECK(s.message().find("request 1") != std::string::npos);
    CHECK(s.message().find(c.needle) != std::string::npos);
    CHECK(t.status == V{specdec::kTreeOk, c.code, specdec::kTreeOk});
    check_all_unused(t, 1);
    // The neighbours are intact.
    CHECK(t.row(t.depth, 0) == V{0, 1, 1, 2});
    CHECK(t.row(t.positions, 2) == V{3, 4, 5, -1});
    CHECK(t.leaf_count[0] == 2);
    CHECK(t.leaf_count[2] == 1);
  }
}

TEST_CASE("tree_build: a bad parent takes precedence over depth") {
  Tree t(1, 5, 2);
  t.parents = {-1, 0, 1, 2, 9};  // node 2 is too deep for P = 2, node 4's parent is bad
  Status s = t.run();
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(s.message().find("node 4") != std::string::npos);
  CHECK(t.status[0] == specdec::kTreeBadParent);
  check_all_unused(t, 0);
}

TEST_CASE("tree_build: the first bad request is named") {
  Tree t(3, 3, 3);
  t.parents = {-1, 0, 0, -1, 0, 5, 3, 0, 0};
  Status s = t.run();
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(s.message().find("request 1, node 2") != std::string::npos);
  CHECK(t.status == V{0, specdec::kTreeBadParent, specdec::kTreeBadRoot});
  CHECK(specdec::check_tree_status(t.status.data(), 3).code() == StatusCode::kMalformedInput);
}

TEST_CASE("tree_build: validation errors") {
  Tree t(1, 4, 4);
  auto expect = [](TreeBuildParams const& p, std::string const& needle) {
    Status s = specdec::ops::tree_build(CpuExecutor{}, p);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find(needle) != std::string::npos);
  };
  TreeBuildParams p = t.params();
  REQUIRE(specdec::ops::validate(p).ok());
  {
    auto q = p;
    q.tree.batch = 0;
    expect(q, "batch 0");
  }
  {
    auto q = p;
    q.tree.nodes = 0;
    expect(q, "nodes N = 0");
  }
  {
    auto q = p;
    q.tree.nodes = 1025;
    expect(q, "nodes N = 1025");
  }
  {
    auto q = p;
    q.out.path_capacity = 0;
    expect(q, "path capacity P = 0");
  }
  {
    auto q = p;
    q.out.path_capacity = 5;
    expect(q, "path capacity P = 5");
  }
  {
    auto q = p;
    q.tree.parents = nullptr;
    expect(q, "tree.parents");
  }
  {
    auto q = p;
    q.prefix_len = nullptr;
    expect(q, "prefix_len");
  }
  {
    auto q = p;
    q.out.mask = nullptr;
    expect(q, "out.mask");
  }
  {
    auto q = p;
    q.out.depth = nullptr;
    expect(q, "out.depth");
  }
  {
    auto q = p;
    q.out.positions = nullptr;
    expect(q, "out.positions");
  }
  {
    auto q = p;
    q.out.first_child = nullptr;
    expect(q, "out.first_child");
  }
  {
    auto q = p;
    q.out.next_sibling = nullptr;
    expect(q, "out.next_sibling");
  }
  {
    auto q = p;
    q.out.leaf_paths = nullptr;
    expect(q, "out.leaf_paths");
  }
  {
    auto q = p;
    q.out.leaf_count = nullptr;
    expect(q, "out.leaf_count");
  }
  {
    auto q = p;
    q.out.tree_status = nullptr;
    expect(q, "out.tree_status");
  }
  // tokens are not read by tree_build.
  {
    auto q = p;
    q.tree.tokens = nullptr;
    CHECK(specdec::ops::validate(q).ok());
  }
}

TEST_CASE("tree_build: invariants on random trees") {
  specdec::testing::Rng rng(1234);
  for (int N : {2, 7, 31, 32, 33, 64, 100, 257}) {
    for (bool deep : {false, true}) {
      CAPTURE(N);
      CAPTURE(deep);
      Tree t(1, N, N);
      t.parents = specdec::testing::random_parents(rng, N, deep);
      t.prefix = {17};
      REQUIRE(t.run().ok());
      int leaves = 0, children_seen = 0;
      for (int i = 0; i < N; ++i) {
        auto row = t.mask_row(0, i);
        int pop = 0;
        for (uint32_t w : row) pop += std::popcount(w);
        CHECK(t.depth[i] == pop - 1);
        CHECK(t.positions[i] == 17 + t.depth[i]);
        CHECK(((row[i / 32] >> (i % 32)) & 1u) == 1u);
        if (i > 0) {
          auto prow = t.mask_row(0, t.parents[i]);
          prow[i / 32] |= 1u << (i % 32);
          CHECK(row == prow);
        }
        // Walking first_child / next_sibling visits exactly the children, in increasing order.
        int prev = i;
        for (int c = t.first_child[i]; c != -1; c = t.next_sibling[c]) {
          CHECK(t.parents[c] == i);
          CHECK(c > prev);
          prev = c;
          ++children_seen;
        }
        if (t.first_child[i] == -1) {
          auto path = t.path(0, leaves++);
          CHECK(path[t.depth[i]] == i);
          CHECK(path[0] == 0);
          for (int d = 1; d <= t.depth[i]; ++d) CHECK(t.parents[path[d]] == path[d - 1]);
          for (int d = t.depth[i] + 1; d < N; ++d) CHECK(path[d] == -1);
          // The kernel's path arithmetic: entry d is the d-th set bit of the leaf's mask row.
          for (int d = 0; d < N; ++d) {
            CHECK(specdec::ops::tree_path_node(t.mask_row(0, i).data(), t.W, d) == path[d]);
          }
        }
      }
      CHECK(children_seen == N - 1);
      CHECK(t.leaf_count[0] == leaves);
    }
  }
}
