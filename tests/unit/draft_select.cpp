// draft_select CPU references: a hand-worked two-step expansion and its tree (log-probs chosen
// as logs of known probabilities), tie-breaking (draft ids, frontier slots, finalize slots), the
// d2t mapping, the missing-parent report, every validation error, and an end-to-end run of
// expand x steps + finalize against a plain brute-force enumeration of EAGLE-2's beam.
#include "specdec/ops/draft_select/draft_select.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/testing.hpp"

namespace {

using specdec::CpuExecutor;
using specdec::Status;
using specdec::StatusCode;
using specdec::ops::DraftExpandParams;
using specdec::ops::DraftFinalizeParams;
using V = std::vector<int32_t>;
using F = std::vector<float>;

// Log of each probability: logits whose log-softmax is exactly (up to rounding) log(p).
F logs(std::vector<double> const& probs) {
  F out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

// Host buffers of one expand/finalize pipeline for B requests.
struct Draft {
  int B, K, steps, Vd, C;
  std::vector<int64_t> d2t;
  V cand_tokens, cand_parent;
  F cand_scores;
  F next_scores;
  V next_slots, next_tokens, next_draft, next_branch;

  Draft(int batch, int topk, int nsteps, int vocab)
      : B(batch),
        K(topk),
        steps(nsteps),
        Vd(vocab),
        C(specdec::ops::draft_candidate_count(topk, nsteps)),
        cand_tokens(batch * C, -77),
        cand_parent(batch * C, -77),
        cand_scores(batch * C, -77.0f),
        next_scores(batch * topk),
        next_slots(batch * topk),
        next_tokens(batch * topk),
        next_draft(batch * topk),
        next_branch(batch * topk) {}

  specdec::ops::DraftSelectBuffers buffers() {
    return specdec::ops::DraftSelectBuffers{
        B,                  Vd,                 K,                  steps,
        cand_tokens.data(), cand_scores.data(), cand_parent.data(), next_scores.data(),
        next_slots.data(),  next_tokens.data(), next_draft.data(),  next_branch.data()};
  }
  DraftExpandParams expand_params(int step, F const& logits, F const& fscores, V const& fslots) {
    return buffers().expand(step, logits.data(), fscores.data(), fslots.data(),
                            d2t.empty() ? nullptr : d2t.data());
  }
  Status expand(int step, F const& logits, F const& fscores, V const& fslots) {
    return specdec::ops::draft_expand(CpuExecutor{}, expand_params(step, logits, fscores, fslots));
  }
};

struct Tree {
  V tokens, parents, node_slot, status;
  F scores;
  DraftFinalizeParams params(Draft& d, int N, V const& roots) {
    tokens.assign(d.B * N, -77);
    parents.assign(d.B * N, -77);
    node_slot.assign(d.B * N, -77);
    scores.assign(d.B * N, -77.0f);
    status.assign(d.B, -77);
    DraftFinalizeParams p = d.buffers().finalize(
        roots.data(), N, tokens.data(), parents.data(), node_slot.data(), status.data());
    p.node_scores = scores.data();
    return p;
  }
};

void check_close(F const& got, std::vector<double> const& want) {
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    CAPTURE(k);
    CHECK(got[k] == doctest::Approx(want[k]).epsilon(1e-6));
  }
}

}  // namespace

TEST_CASE("draft_select: hand-worked topk 2, steps 2, vocab 5") {
  Draft d(1, 2, 2, 5);
  // Step 0, root: p = [.1, .6, .05, .2, .05] -> children id 1 (.6) at slot 0, id 3 (.2) at slot 1.
  REQUIRE(d.expand(0, logs({.1, .6, .05, .2, .05}), F{0.0f}, V{-1}).ok());
  CHECK(V(d.cand_tokens.begin(), d.cand_tokens.begin() + 2) == V{1, 3});
  CHECK(V(d.cand_parent.begin(), d.cand_parent.begin() + 2) == V{-1, -1});
  check_close(F(d.cand_scores.begin(), d.cand_scores.begin() + 2), {std::log(.6), std::log(.2)});
  CHECK(d.next_slots == V{0, 1});
  CHECK(d.next_branch == V{0, 0});
  CHECK(d.next_draft == V{1, 3});
  CHECK(d.next_tokens == V{1, 3});
  check_close(d.next_scores, {std::log(.6), std::log(.2)});
  // Slots 2.. untouched by step 0.
  CHECK(d.cand_tokens[2] == -77);

  // Step 1. Branch 0 (slot 0): p = [.5, .1, .3, .05, .05] -> id 0 (slot 2, .6*.5 = .3),
  // id 2 (slot 3, .6*.3 = .18). Branch 1 (slot 1): p = [.2, .2, .1, .4, .1] -> id 3 (slot 4,
  // .2*.4 = .08), then the tie .2/.2 goes to id 0 (slot 5, .2*.2 = .04).
  F step1 = logs({.5, .1, .3, .05, .05});
  F b1 = logs({.2, .2, .1, .4, .1});
  step1.insert(step1.end(), b1.begin(), b1.end());
  F fscores = d.next_scores;
  V fslots = d.next_slots;
  REQUIRE(d.expand(1, step1, fscores, fslots).ok());
  CHECK(d.cand_tokens == V{1, 3, 0, 2, 3, 0});
  CHECK(d.cand_parent == V{-1, -1, 0, 0, 1, 1});
  check_close(d.cand_scores, {std::log(.6), std::log(.2), std::log(.3), std::log(.18),
                              std::log(.08), std::log(.04)});
  // Next frontier: .3 (slot 2), .18 (slot 3), both extending branch 0.
  CHECK(d.next_slots == V{2, 3});
  CHECK(d.next_branch == V{0, 0});
  CHECK(d.next_draft == V{0, 2});
  check_close(d.next_scores, {std::log(.3), std::log(.18)});

  // Finalize N = 4: best 3 are slots 0 (.6), 2 (.3), 1 (.2); in slot order nodes 1, 2, 3.
  Tree t;
  REQUIRE(specdec::ops::draft_finalize(CpuExecutor{}, t.params(d, 4, V{42})).ok());
  CHECK(t.tokens == V{42, 1, 3, 0});
  CHECK(t.parents == V{-1, 0, 0, 1});
  CHECK(t.node_slot == V{-1, 0, 1, 2});
  CHECK(t.status == V{0});
  check_close(t.scores, {0.0, std::log(.6), std::log(.2), std::log(.3)});
  // N = 5 adds slot 3 (.18), token 2 under node 1.
  REQUIRE(specdec::ops::draft_finalize(CpuExecutor{}, t.params(d, 5, V{42})).ok());
  CHECK(t.tokens == V{42, 1, 3, 0, 2});
  CHECK(t.parents == V{-1, 0, 0, 1, 1});
  CHECK(t.node_slot == V{-1, 0, 1, 2, 3});
  // N = 7 takes every candidate.
  REQUIRE(specdec::ops::draft_finalize(CpuExecutor{}, t.params(d, 7, V{42})).ok());
  CHECK(t.tokens == V{42, 1, 3, 0, 2, 3, 0});
  CHECK(t.parents == V{-1, 0, 0, 1, 1, 2, 2});
}

TEST_CASE("draft_select: d2t maps draft ids to target ids") {
  Draft d(1, 2, 1, 5);
  d.d2t = {10, 10, 20, 30, 40};  // target = d + d2t[d]: 0->10, 1->11, 2->22, 3->33, 4->44
  REQUIRE(d.expand(0, logs({.1, .2, .05, .6, .05}), F{0.0f}, V{-1}).ok());
  CHECK(d.cand_tokens == V{33, 11});
  CHECK(d.next_tokens == V{33, 11});
  CHECK(d.next_draft == V{3, 1});
}

TEST_CASE("draft_select: ties go to the smaller draft id, slot and candidate") {
  Draft d(1, 2, 2, 4);
  // All four logits equal: children are ids 0 and 1.
  REQUIRE(d.expand(0, F{0.5f, 0.5f, 0.5f, 0.5f}, F{0.0f}, V{-1}).ok());
  CHECK(d.cand_tokens[0] == 0);
  CHECK(d.cand_tokens[1] == 1);
  // Equal scores: frontier in slot order.
  CHECK(d.next_slots == V{0, 1});
  // Step 1: both branches have the same score and the same logits -> children scores
  // a (slot 2), b (3), a (4), b (5) with a > b; the frontier is slots 2 then 4.
  F fscores{-1.0f, -1.0f};
  V fslots{0, 1};
  REQUIRE(d.expand(1, logs({.1, .6, .1, .2, .1, .6, .1, .2}), fscores, fslots).ok());
  CHECK(d.cand_tokens == V{0, 1, 1, 3, 1, 3});
  CHECK(d.next_slots == V{2, 4});
  CHECK(d.next_branch == V{0, 1});
  // Finalize: scores [ln .25, ln .25, a, b, a, b]; best 3: slots 0, 1 (tie, both kept), then a
  // at slot 2 before slot 4.
  d.cand_scores[0] = d.cand_scores[1] = -1.0f;
  Tree t;
  REQUIRE(specdec::ops::draft_finalize(CpuExecutor{}, t.params(d, 4, V{9})).ok());
  CHECK(t.node_slot == V{-1, 0, 1, 2});
  CHECK(t.parents == V{-1, 0, 0, 1});
  // Finalize ties among equal scores: slots 1 and 0 tie above the rest; N = 2 keeps slot 0.
  REQUIRE(specdec::ops::draft_finalize(CpuExecutor{}, t.params(d, 2, V{9})).ok());
  CHECK(t.node_slot == V{-1, 0});
}

TEST_CASE("draft_select: a chosen candidate whose parent was not chosen is reported") {
  Draft d(2, 2, 2, 5);
  // Request 0 well formed, request 1: slot 4 (parent slot 1) outscores its parent.
  d.cand_tokens = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
  d.cand_parent = {-1, -1, 0, 0, 1, 1, -1, -1, 0, 0, 1, 1};
  d.cand_scores = {-1, -2, -3, -4, -5, -6, -1, -9, -2, -3, -0.5f, -8};
  Tree t;
  Status s = specdec::ops::draft_finalize(CpuExecutor{}, t.params(d, 4, V{7, 8}));
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(s.message().find("request 1") != std::string::npos);
  CHECK(s.message().find("slot 4") != std::string::npos);
  CHECK(s.message().find("parent slot 1") != std::string::npos);
  CHECK(t.status == V{specdec::ops::kDraftSelectOk, specdec::ops::kDraftParentMissing});
  // Request 0: best 3 = slots 0, 1, 2. Request 1: slots 0, 2, 4 -> node 3's parent is missing.
  CHECK(V(t.node_slot.begin(), t.node_slot.begin() + 4) == V{-1, 0, 1, 2});
  CHECK(V(t.parents.begin(), t.parents.begin() + 4) == V{-1, 0, 0, 1});
  CHECK(V(t.node_slot.begin() + 4, t.node_slot.end()) == V{-1, 0, 2, 4});
  CHECK(V(t.parents.begin() + 4, t.parents.end()) == V{-1, 0, 1, -1});
  CHECK(V(t.tokens.begin() + 4, t.tokens.end()) == V{8, 1, 3, 5});
  // A parent slot that does not precede its child is reported the same way.
  d.cand_scores = {-1, -2, -3, -4, -5, -6, -1, -2, -3, -4, -5, -6};
  d.cand_parent[6 + 2] = 3;
  s = specdec::ops::draft_finalize(CpuExecutor{}, t.params(d, 4, V{7, 8}));
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(s.message().find("request 1, candidate slot 2") != std::string::npos);
}

TEST_CASE("draft_select: validation errors") {
  Draft d(1, 2, 3, 8);
  F logits(2 * 8, 0.25f), fscores(2, 0.0f);
  V fslots(2, 0), roots(1, 0);
  auto expect = [](Status s, StatusCode code, std::string const& needle) {
    CHECK(s.code() == code);
    CHECK_MESSAGE(s.message().find(needle) != std::string::npos, s.message());
  };
  auto run = [](DraftExpandParams const& p) {
    return specdec::ops::draft_expand(CpuExecutor{}, p);
  };
  DraftExpandParams const p = d.expand_params(1, logits, fscores, fslots);
  REQUIRE(specdec::ops::validate(p).ok());
  auto const inv = StatusCode::kInvalidArgument;
  {
    auto q = p;
    q.batch = 0;
    expect(run(q), inv, "batch 0");
  }
  {
    auto q = p;
    q.topk = 0;
    expect(run(q), inv, "topk 0");
  }
  {
    auto q = p;
    q.topk = 3;
    expect(run(q), StatusCode::kUnsupported, "{1, 2, 4, 8}");
  }
  {
    auto q = p;
    q.topk = 16;
    expect(run(q), StatusCode::kUnsupported, "topk 16");
  }
  {
    auto q = p;
    q.steps = 0;
    expect(run(q), inv, "steps 0");
  }
  {
    auto q = p;
    q.step = 3;
    expect(run(q), inv, "step 3 outside");
  }
  {
    auto q = p;
    q.step = -1;
    expect(run(q), inv, "step -1 outside");
  }
  {
    auto q = p;
    q.vocab = 1;
    expect(run(q), inv, "draft vocabulary 1 < topk 2");
  }
  {
    auto q = p;
    q.logits = nullptr;
    expect(run(q), inv, "logits");
  }
  {
    auto q = p;
    q.frontier_scores = nullptr;
    expect(run(q), inv, "frontier_scores");
  }
  {
    auto q = p;
    q.frontier_slots = nullptr;
    expect(run(q), inv, "frontier_slots");
  }
  {
    auto q = p;
    q.cand_tokens = nullptr;
    expect(run(q), inv, "cand_tokens");
  }
  {
    auto q = p;
    q.cand_scores = nullptr;
    expect(run(q), inv, "cand_scores");
  }
  {
    auto q = p;
    q.cand_parent = nullptr;
    expect(run(q), inv, "cand_parent");
  }
  {
    auto q = p;
    q.next_scores = nullptr;
    expect(run(q), inv, "next_scores");
  }
  {
    auto q = p;
    q.next_slots = nullptr;
    expect(run(q), inv, "next_slots");
  }
  {
    auto q = p;
    q.next_tokens = nullptr;
    expect(run(q), inv, "next_tokens");
  }
  {
    auto q = p;
    q.next_draft_tokens = nullptr;
    expect(run(q), inv, "next_draft_tokens");
  }
  {
    auto q = p;
    q.next_branch = nullptr;
    expect(run(q), inv, "next_branch");
  }
  {
    auto q = p;
    q.next_scores = d.next_scores.data();
    q.frontier_scores = d.next_scores.data();
    expect(run(q), inv, "aliases");
  }
  {
    auto q = p;
    q.next_slots = d.next_slots.data();
    q.frontier_slots = d.next_slots.data();
    expect(run(q), inv, "aliases");
  }
  // The CUDA-only workspace check.
  {
    auto q = p;
    expect(specdec::ops::validate_workspace(q), inv, "workspace");
  }
  {
    auto q = p;
    std::vector<uint64_t> ws(specdec::ops::draft_expand_workspace_bytes(1, 8, 2) / 8 + 1);
    q.workspace = ws.data();
    q.workspace_bytes = ws.size() * 8;
    CHECK(specdec::ops::validate_workspace(q).ok());
    q.workspace_bytes = 8;
    expect(specdec::ops::validate_workspace(q), inv, "draft_expand_workspace_bytes");
  }

  Tree t;
  auto fin = [](DraftFinalizeParams const& f) {
    return specdec::ops::draft_finalize(CpuExecutor{}, f);
  };
  DraftFinalizeParams const f = t.params(d, 4, roots);  // C = 2 + 2*4 = 10
  REQUIRE(specdec::ops::validate(f).ok());
  {
    auto q = f;
    q.nodes = 12;
    expect(fin(q), inv, "nodes - 1 = 11 exceeds topk + (steps-1)*topk^2 = 10: raise steps or topk");
  }
  {
    auto q = f;
    q.nodes = 11;
    CHECK(specdec::ops::validate(q).ok());
  }
  {
    auto q = f;
    q.nodes = 1;
    expect(fin(q), inv, "nodes 1 < 2");
  }
  {
    auto q = f;
    q.batch = 0;
    expect(fin(q), inv, "batch 0");
  }
  {
    auto q = f;
    q.topk = 5;
    expect(fin(q), StatusCode::kUnsupported, "topk 5");
  }
  {
    auto q = f;
    q.steps = 0;
    expect(fin(q), inv, "steps 0");
  }
  {
    auto q = f;
    q.topk = 8;
    q.steps = 40;
    expect(fin(q), inv, "lower steps or topk");
  }
  {
    auto q = f;
    q.cand_tokens = nullptr;
    expect(fin(q), inv, "cand_tokens");
  }
  {
    auto q = f;
    q.cand_scores = nullptr;
    expect(fin(q), inv, "cand_scores");
  }
  {
    auto q = f;
    q.cand_parent = nullptr;
    expect(fin(q), inv, "cand_parent");
  }
  {
    auto q = f;
    q.root_tokens = nullptr;
    expect(fin(q), inv, "root_tokens");
  }
  {
    auto q = f;
    q.tokens = nullptr;
    expect(fin(q), inv, "tokens is null");
  }
  {
    auto q = f;
    q.parents = nullptr;
    expect(fin(q), inv, "parents");
  }
  {
    auto q = f;
    q.node_slot = nullptr;
    expect(fin(q), inv, "node_slot");
  }
  {
    auto q = f;
    q.status = nullptr;
    expect(fin(q), inv, "status");
  }
  {
    auto q = f;
    q.node_scores = nullptr;
    CHECK(specdec::ops::validate(q).ok());
  }
}

namespace {

// The draft "model" of the end-to-end test: logits of the next token after a path of tokens,
// a deterministic pseudo-random function of the path.
std::vector<float> model_logits(V const& path, int vocab) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : path) h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
  specdec::testing::Rng rng(h);
  return specdec::testing::random_logits(rng, 1, vocab, 2.0f);
}

struct Path {
  V tokens;
  double score;
};

// Plain EAGLE-2 beam: level 1 = the root's topk children; level s+1 = the topk children of each
// of the topk best level-s paths; the tree = the best N-1 of all levels' paths.
std::vector<Path> brute_force(int topk, int steps, int nodes, int vocab) {
  auto children = [&](Path const& parent) {
    std::vector<float> x = model_logits(parent.tokens, vocab);
    double mx = -1e30, sum = 0;
    for (float v : x) mx = std::max(mx, double(v));
    for (float v : x) sum += std::exp(v - mx);
    std::vector<std::pair<double, int>> lp;
    for (int d = 0; d < vocab; ++d) lp.push_back({x[d] - mx - std::log(sum), d});
    std::sort(lp.begin(), lp.end(), [](auto a, auto b) { return a.first > b.first; });
    std::vector<Path> out;
    for (int j = 0; j < topk; ++j) {
      Path c = parent;
      c.tokens.push_back(lp[j].second);
      c.score += lp[j].first;
      out.push_back(c);
    }
    return out;
  };
  auto by_score = [](Path const& a, Path const& b) { return a.score > b.score; };
  std::vector<Path> all, level = children(Path{{}, 0.0});
  all = level;
  for (int s = 1; s < steps; ++s) {
    std::sort(level.begin(), level.end(), by_score);
    std::vector<Path> next;
    for (int i = 0; i < topk; ++i) {
      auto c = children(level[i]);
      next.insert(next.end(), c.begin(), c.end());
    }
    level = next;
    all.insert(all.end(), next.begin(), next.end());
  }
  std::sort(all.begin(), all.end(), by_score);
  all.resize(nodes - 1);
  return all;
}

}  // namespace

TEST_CASE("draft_select: expand x steps + finalize equals a brute-force EAGLE-2 beam") {
  struct Case {
    int topk, steps, nodes, vocab;
  };
  for (Case c : {Case{1, 3, 3, 7}, Case{2, 2, 4, 11}, Case{2, 4, 8, 40}, Case{4, 3, 12, 50},
                 Case{4, 5, 21, 64}, Case{8, 3, 40, 100}, Case{8, 2, 73, 33}}) {
    CAPTURE(c.topk);
    CAPTURE(c.steps);
    CAPTURE(c.nodes);
    int const B = 2;
    Draft d(B, c.topk, c.steps, c.vocab);
    // Frontier state and the token paths behind each frontier branch (from the candidate buffer).
    F fscores(B, 0.0f);
    V fslots(B, -1);
    auto path_of = [&](int b, int slot) {
      V rev;
      for (int s = slot; s != -1; s = d.cand_parent[b * d.C + s])
        rev.push_back(d.cand_tokens[b * d.C + s]);
      return V(rev.rbegin(), rev.rend());
    };
    for (int step = 0; step < c.steps; ++step) {
      int const K_in = specdec::ops::draft_branches(c.topk, step);
      F logits;
      for (int b = 0; b < B; ++b) {
        for (int i = 0; i < K_in; ++i) {
          V path = fslots[b * K_in + i] == -1 ? V{} : path_of(b, fslots[b * K_in + i]);
          if (b == 1) path.insert(path.begin(), 1000);  // request 1 sees a different model
          auto x = model_logits(path, c.vocab);
          logits.insert(logits.end(), x.begin(), x.end());
        }
      }
      REQUIRE(d.expand(step, logits, fscores, fslots).ok());
      fscores = d.next_scores;
      fslots = d.next_slots;
      // The frontier's draft tokens are the tokens at its slots (identity d2t).
      for (int r = 0; r < B * c.topk; ++r) {
        CHECK(d.next_tokens[r] == d.cand_tokens[(r / c.topk) * d.C + d.next_slots[r]]);
      }
    }
    Tree t;
    V roots{5, 6};
    REQUIRE(specdec::ops::draft_finalize(CpuExecutor{}, t.params(d, c.nodes, roots)).ok());
    // Request 0 against the brute force: the same set of token paths with the same scores.
    auto want = brute_force(c.topk, c.steps, c.nodes, c.vocab);
    std::map<V, double> want_paths;
    for (auto const& p : want) want_paths[p.tokens] = p.score;
    int const N = c.nodes;
    std::vector<V> node_path(N);
    CHECK(t.tokens[0] == 5);
    CHECK(t.tokens[N] == 6);
    for (int k = 1; k < N; ++k) {
      REQUIRE(t.parents[k] >= 0);
      REQUIRE(t.parents[k] < k);
      node_path[k] = node_path[t.parents[k]];
      node_path[k].push_back(t.tokens[k]);
      auto it = want_paths.find(node_path[k]);
      REQUIRE_MESSAGE(it != want_paths.end(),
                      "node " << k << " is not in the brute-force best set");
      CHECK(t.scores[k] == doctest::Approx(it->second).epsilon(1e-5));
      want_paths.erase(it);
    }
    CHECK(want_paths.empty());
    CHECK(t.status == V{0, 0});
  }
}

TEST_CASE("draft_select: CUDA split arithmetic (chunks, splits, softmax merge)") {
  for (int vocab : {1, 2, 3, 8, 1000, 4096, 4097, 32000, 32001, 151936, 163840, 262144, 1 << 22}) {
    for (int rows : {1, 2, 8, 64, 512, 4096}) {
      CAPTURE(vocab);
      CAPTURE(rows);
      int const chunk = specdec::ops::draft_expand_chunk(rows, vocab);
      int const splits = specdec::ops::draft_expand_splits(rows, vocab);
      CHECK(chunk % specdec::ops::kDraftExpandRoundFloats == 0);  // whole load rounds
      CHECK(splits >= 1);
      CHECK(splits <= specdec::ops::draft_expand_max_splits(vocab));
      CHECK(static_cast<int64_t>(splits) * chunk >= vocab);
      CHECK(static_cast<int64_t>(splits - 1) * chunk < vocab);  // no empty split
    }
  }
  // Workspace: (max, sum) pair + topk keys per (request, branch, max split).
  CHECK(specdec::ops::draft_expand_workspace_bytes(2, 163840, 4) ==
        size_t{2} * 4 * 40 * (8 + 4 * 8) + 2 * 4);  // 163840 / 4096 = 40 splits, 2 counters
  CHECK(specdec::ops::draft_expand_workspace_bytes(1, 1 << 20, 8) ==
        size_t{1} * 8 * 64 * (8 + 8 * 8) + 4);  // 2^20 / 4096 = 256 -> at most 64 splits
  // Chunks are whole load rounds: 8 splits of 4096 for one row of 32000, 4 of 8192 for 64 rows.
  CHECK(specdec::ops::draft_expand_chunk(1, 32000) == 4096);
  CHECK(specdec::ops::draft_expand_chunk(64, 32000) == 8192);
  // Merging (max, sum) pairs of any split of a row gives the row's (max, sum of exp(x - max)).
  std::vector<float> x = {-3.0f, 1.5f, -INFINITY, 0.25f, 2.0f, -1.0f, -INFINITY};
  float m = -INFINITY, s = 0.0f;
  for (size_t k = 0; k < x.size(); k += 2) {
    float pm = -INFINITY, ps = 0.0f;
    for (size_t j = k; j < std::min(x.size(), k + 2); ++j) {
      if (x[j] == -INFINITY) continue;
      float const nm = std::max(pm, x[j]);
      ps = ps * std::exp(pm - nm) + std::exp(x[j] - nm);
      pm = nm;
    }
    specdec::ops::draft_softmax_merge(m, s, pm, ps);
  }
  double want = 0;
  for (float v : x) want += v == -INFINITY ? 0.0 : std::exp(double(v) - 2.0);
  CHECK(m == 2.0f);
  CHECK(s == doctest::Approx(want).epsilon(1e-6));
  // An empty (all -inf) part changes nothing.
  specdec::ops::draft_softmax_merge(m, s, -INFINITY, 0.0f);
  CHECK(s == doctest::Approx(want).epsilon(1e-6));
  // Keys: larger value first, ties to the smaller index, 0 never produced.
  using specdec::pack_value_index;
  CHECK(pack_value_index(1.0f, 5) > pack_value_index(0.5f, 0));
  CHECK(pack_value_index(1.0f, 3) > pack_value_index(1.0f, 4));
  CHECK(pack_value_index(-INFINITY, 2147483647) > 0u);
  CHECK(specdec::unpack_index(pack_value_index(-2.5f, 1234)) == 1234);
  CHECK(specdec::unpack_value(pack_value_index(-2.5f, 1234)) == -2.5f);
}
