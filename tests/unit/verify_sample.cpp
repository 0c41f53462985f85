// verify_sample CPU reference on hand-worked trees (V = 4): forced accept / reject by one-hot and
// zero-probability targets, probabilities of 1/2 checked against the drawn uniform, duplicate
// sibling tokens, sampled-draft residuals, greedy rows, skipped trees, the path capacity, and
// every validation error.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "specdec/ops/verify_sample/verify_sample.hpp"

using namespace specdec;
using namespace specdec::ops;

namespace {

constexpr float kNegInf = -INFINITY;

// One request: parents, tokens, a logit row per node; links built from the parents.
struct Tree {
  std::vector<int32_t> parents, tokens, depth, first_child, next_sibling, tree_status{0};
  std::vector<float> logits, q, temperature{1.0f}, top_p{1.0f};
  std::vector<int32_t> top_k{0};
  std::vector<uint64_t> seed{1};
  std::vector<uint32_t> step{0};
  std::vector<int32_t> path, num{-9}, next{-9}, status{-9};
  int vocab = 4;

  Tree(std::vector<int32_t> p, std::vector<int32_t> t, std::vector<std::vector<float>> rows)
      : parents(std::move(p)), tokens(std::move(t)) {
    int const n = static_cast<int>(parents.size());
    depth.assign(n, 0);
    first_child.assign(n, -1);
    next_sibling.assign(n, -1);
    for (int i = 1; i < n; ++i) depth[i] = depth[parents[i]] + 1;
    for (int i = n - 1; i >= 1; --i) {
      next_sibling[i] = first_child[parents[i]];
      first_child[parents[i]] = i;
    }
    for (auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());
    path.assign(n, -9);
  }
  VerifySampleParams params() {
    VerifySampleParams p;
    int const n = static_cast<int>(parents.size());
    p.tree = {tokens.data(), parents.data(), nullptr, 1, n};
    p.links = {depth.data(), first_child.data(), next_sibling.data(), tree_status.data()};
    p.logits = logits.data();
    p.draft_probs = q.empty() ? nullptr : q.data();
    p.vocab = vocab;
    p.config = {temperature.data(), top_k.data(), top_p.data()};
    p.keys = {seed.data(), step.data(), nullptr};
    p.out = {path.data(), num.data(), next.data(), static_cast<int>(path.size())};
    p.status = status.data();
    return p;
  }
  void run() { REQUIRE(verify_sample(CpuExecutor{}, params()).ok()); }
};

std::vector<float> onehot(int v) {
  std::vector<float> r(4, kNegInf);
  r[v] = 0.0f;
  return r;
}
std::vector<float> const kHalf01 = {0.0f, 0.0f, kNegInf, kNegInf};  // p = {1/2, 1/2, 0, 0}

}  // namespace

TEST_CASE("verify_sample: forced chain accept, reject and correction without the rejected token") {
  // root -> 1 (token 1) -> 2 (token 2). p_0 one-hot at 1: accept surely. p_1 = {0, 0, 1/2, 1/2}:
  // node 2 (token 2) has acceptance 1/2 by u; when rejected the correction is 3 (2 removed), and
  // when accepted the bonus comes from p_2 one-hot at 0.
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Tree t({-1, 0, 1}, {0, 1, 2}, {onehot(1), {kNegInf, kNegInf, 0.0f, 0.0f}, onehot(0)});
    t.seed[0] = seed;
    t.run();
    float const u2 = t.params().keys.uniform(0, 2, 0);
    CHECK(t.status[0] == kSampleOk);
    CHECK(t.path[0] == 0);
    CHECK(t.path[1] == 1);
    if (u2 < 0.5f) {
      CHECK(t.num[0] == 2);
      CHECK(t.path[2] == 2);
      CHECK(t.next[0] == 0);
    } else {
      CHECK(t.num[0] == 1);
      CHECK(t.path[2] == -1);
      CHECK(t.next[0] == 3);
    }
  }
}

TEST_CASE("verify_sample: siblings are renormalised and duplicates rejected") {
  // Root children: node 1 token 2 (p = 0: rejected), node 2 token 0 (accept iff u < 1/2 / (1 - 0)),
  // node 3 token 0 again (duplicate of a rejected token: rejected), node 4 token 1: after 0 is
  // rejected, acceptance 1/2 / (1 - 1/2) = 1: accepted surely.
  int saw_first = 0, saw_second = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Tree t({-1, 0, 0, 0, 0}, {0, 2, 0, 0, 1}, {kHalf01, onehot(3), onehot(3), onehot(3), onehot(2)});
    t.seed[0] = seed;
    t.run();
    float const u2 = t.params().keys.uniform(0, 2, 0);
    REQUIRE(t.num[0] == 1);
    if (u2 < 0.5f) {
      CHECK(t.path[1] == 2);
      CHECK(t.next[0] == 3);  // bonus from node 2's row
      ++saw_first;
    } else {
      CHECK(t.path[1] == 4);
      CHECK(t.next[0] == 2);
      ++saw_second;
    }
  }
  CHECK(saw_first > 0);
  CHECK(saw_second > 0);
}

TEST_CASE("verify_sample: all siblings rejected -> correction from the rest") {
  // p_0 = {1/2, 1/2, 0, 0}; children tokens 0, 0 (dup), 3 (p = 0). When token 0 is rejected the
  // correction must be 1 (the only remaining mass); a duplicate must never be accepted.
  int rejected_cases = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Tree t({-1, 0, 0, 0}, {0, 0, 0, 3}, {kHalf01, onehot(1), onehot(1), onehot(1)});
    t.seed[0] = seed;
    t.run();
    float const u1 = t.params().keys.uniform(0, 1, 0);
    if (u1 < 0.5f) {
      CHECK(t.num[0] == 1);
      CHECK(t.path[1] == 1);
    } else {
      ++rejected_cases;
      CHECK(t.num[0] == 0);
      CHECK(t.path[1] == -1);
      CHECK(t.next[0] == 1);
    }
  }
  CHECK(rejected_cases > 0);
}

TEST_CASE("verify_sample: sampled drafts use the residual max(p - q, 0)") {
  // p_0 = {1/2, 1/2, 0, 0}, q_0 = {1, 0, 0, 0}; two children drawn from q: both token 0.
  // First: accept iff u < p(0)/q(0) = 1/2. Else residual = {0, 1, 0, 0}: the second (token 0)
  // has r(0)/q(0) = 0 and is rejected; the correction is 1.
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Tree t({-1, 0, 0}, {0, 0, 0}, {kHalf01, onehot(2), onehot(2)});
    t.q = {1, 0, 0, 0, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
    t.seed[0] = seed;
    t.run();
    float const u1 = t.params().keys.uniform(0, 1, 0);
    if (u1 < 0.5f) {
      CHECK(t.num[0] == 1);
      CHECK(t.path[1] == 1);
      CHECK(t.next[0] == 2);
    } else {
      CHECK(t.num[0] == 0);
      CHECK(t.next[0] == 1);
    }
  }
}

TEST_CASE("verify_sample: sampled drafts, residual acceptance of a second sibling") {
  // p = {0.6, 0.4, 0, 0}, q = {0.5, 0.5, 0, 0}. Child 1 token 1: accept iff u < 0.4/0.5 = 0.8.
  // On rejection (by hand) residual = max(p - q, 0) = {0.1, 0, ...} / 0.1 = one-hot 0, so child 2
  // with token 0 is accepted iff u < 1 / 0.5 (always), and child 2 with token 1 never.
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Tree t({-1, 0, 0}, {0, 1, 1}, {{std::log(0.6f), std::log(0.4f), kNegInf, kNegInf}, onehot(2), onehot(2)});
    t.q = std::vector<float>(12, 0.0f);
    t.q[0] = t.q[1] = 0.5f;
    t.seed[0] = seed;
    t.run();
    float const u1 = t.params().keys.uniform(0, 1, 0);
    if (u1 < 0.8f) {
      CHECK(t.path[1] == 1);
    } else {
      CHECK(t.num[0] == 0);
      CHECK(t.next[0] == 0);
    }
  }
}

TEST_CASE("verify_sample: greedy rows verify greedily") {
  // T = 0: argmaxes 1 (ties to the smallest id), then 3, then 2. Chain tokens 1, 3 accepted.
  Tree t({-1, 0, 1}, {0, 1, 3}, {{0, 5, 5, 1}, {0, 1, 2, 3}, {0, 0, 7, 1}});
  t.temperature[0] = 0.0f;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    t.seed[0] = seed;
    t.run();
    CHECK(t.num[0] == 2);
    CHECK(t.path == std::vector<int32_t>{0, 1, 2});
    CHECK(t.next[0] == 2);
  }
  Tree r({-1, 0, 0}, {0, 2, 1}, {{0, 5, 5, 1}, {0, 1, 2, 3}, {0, 0, 7, 1}});
  r.temperature[0] = 0.0f;
  r.run();  // token 2 rejected, token 1 (argmax) accepted
  CHECK(r.path[1] == 2);
  CHECK(r.next[0] == 2);
}

TEST_CASE("verify_sample: skipped trees, invalid settings and the path capacity") {
  Tree t({-1, 0, 1}, {0, 1, 2}, {onehot(1), onehot(2), onehot(3)});
  t.tree_status[0] = kTreeBadParent;
  t.run();
  CHECK(t.status[0] == kSampleBadTree);
  CHECK(t.path == std::vector<int32_t>{0, -1, -1});
  CHECK(t.num[0] == 0);
  CHECK(t.next[0] == -1);

  Tree s({-1, 0, 1}, {0, 1, 2}, {onehot(1), onehot(2), onehot(3)});
  s.top_p[0] = 1.5f;
  s.run();
  CHECK(s.status[0] == kSampleBadTopP);
  CHECK(s.next[0] == -1);
  CHECK(s.path == std::vector<int32_t>{0, -1, -1});

  // Path capacity 2: the chain stops after one accepted node; bonus from node 1's row.
  Tree c({-1, 0, 1}, {0, 1, 2}, {onehot(1), onehot(2), onehot(3)});
  c.path.assign(2, -9);
  c.run();
  CHECK(c.path == std::vector<int32_t>{0, 1});
  CHECK(c.num[0] == 1);
  CHECK(c.next[0] == 2);

  // A broken link (child before its parent) is a bad tree, not a hang.
  Tree l({-1, 0, 1}, {0, 1, 2}, {onehot(1), onehot(2), onehot(3)});
  l.first_child[1] = 0;
  l.run();
  CHECK(l.status[0] == kSampleBadTree);

  // A sibling cycle 1 -> 2 -> 1 under a root whose target rejects both: a bad tree, not a hang.
  Tree y({-1, 0, 0}, {0, 1, 2}, {onehot(3), onehot(2), onehot(3)});
  y.next_sibling[2] = 1;
  y.run();
  CHECK(y.status[0] == kSampleBadTree);
  CHECK(y.next[0] == -1);
}

TEST_CASE("verify_sample: validation names the problem") {
  Tree t({-1, 0}, {0, 1}, {onehot(1), onehot(2)});
  auto expect_error = [](VerifySampleParams p, char const* what) {
    Status s = verify_sample(CpuExecutor{}, p);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find(what) != std::string::npos, s.message());
  };
  auto p = t.params();
  { auto q = p; q.tree.batch = 0; expect_error(q, "batch"); }
  { auto q = p; q.tree.nodes = 0; expect_error(q, "nodes"); }
  { auto q = p; q.tree.nodes = kVerifySampleMaxNodes + 1; expect_error(q, "nodes"); }
  { auto q = p; q.vocab = 0; expect_error(q, "vocab"); }
  { auto q = p; q.out.path_capacity = 0; expect_error(q, "path capacity"); }
  { auto q = p; q.tree.tokens = nullptr; expect_error(q, "tokens"); }
  { auto q = p; q.links.first_child = nullptr; expect_error(q, "first_child"); }
  { auto q = p; q.links.next_sibling = nullptr; expect_error(q, "next_sibling"); }
  { auto q = p; q.links.tree_status = nullptr; expect_error(q, "tree_status"); }
  { auto q = p; q.logits = nullptr; expect_error(q, "logits"); }
  { auto q = p; q.out.accepted_path = nullptr; expect_error(q, "accepted_path"); }
  { auto q = p; q.out.num_accepted = nullptr; expect_error(q, "num_accepted"); }
  { auto q = p; q.out.next_token = nullptr; expect_error(q, "next_token"); }
  { auto q = p; q.status = nullptr; expect_error(q, "status"); }
  { auto q = p; q.config.temperature = nullptr; expect_error(q, "temperature"); }
  { auto q = p; q.keys.seed = nullptr; expect_error(q, "seed"); }
}

TEST_CASE("verify_sample: the CUDA workspace holds the chunk partials and the residual draws") {
  Tree t({-1, 0}, {0, 1}, {onehot(1), onehot(2)});
  auto p = t.params();
  for (int vocab : {4, 32000, 163840}) {
    p.vocab = vocab;
    int const B = p.tree.batch, N = p.tree.nodes;
    size_t const need = verify_sample_workspace_bytes(B, N, vocab);
    std::vector<uint64_t> ws(need / 8 + 1);
    p.workspace = ws.data();
    // The residual draws lie past every row's partials, and their chunk masses past the draws,
    // within the size.
    auto* base = reinterpret_cast<unsigned char*>(ws.data());
    auto* draws = reinterpret_cast<unsigned char*>(verify_residual_draws(ws.data(), B, N, vocab));
    auto* masses = reinterpret_cast<unsigned char*>(verify_residual_masses(ws.data(), B, N, vocab));
    CHECK(draws >= base + sample_workspace_bytes(int64_t{B} * N, vocab));
    CHECK(reinterpret_cast<uintptr_t>(draws) % alignof(VerifyResidualDraw) == 0);
    CHECK(masses == draws + B * sizeof(VerifyResidualDraw));
    CHECK(masses + B * sample_chunks(vocab) * sizeof(float) == base + need);
    p.workspace_bytes = need;
    CHECK(validate_workspace(p).ok());
    // The partials alone (sample's workspace for B * N rows) are refused, naming the size call.
    p.workspace_bytes = sample_workspace_bytes(int64_t{B} * N, vocab);
    Status const s = validate_workspace(p);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find("verify_sample_workspace_bytes(batch, nodes, vocab)") !=
                      std::string::npos,
                  s.message());
  }
}
