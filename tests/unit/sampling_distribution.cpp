// Statistical proof that verify_sample (CPU reference, the definition the kernel is compared with)
// is lossless: over many seeds, the first committed token is distributed as p_root and the first
// two as p(x1) p(x2 | x1), for chains and trees, deterministic and sampled drafts, temperature,
// top-k and top-p. Chi-square goodness of fit at p-value 1e-4; the same test rejects deliberately
// wrong acceptance rules (power).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "specdec/ops/verify_sample/verify_sample.hpp"
#include "support/chi_square.hpp"

using namespace specdec;
using namespace specdec::ops;

using specdec::testing::chi2;
using specdec::testing::chi2_pvalue;

namespace {

constexpr int kV = 6;
constexpr int kDraws = 200000;
constexpr double kAlpha = 1e-4;

bool fits(std::vector<int64_t> const& counts, std::vector<double> const& probs) {
  auto [stat, dof] = chi2(counts, probs);
  double const pv = chi2_pvalue(stat, dof);
  MESSAGE("chi2 = " << stat << ", dof = " << dof << ", p-value = " << pv);
  return pv >= kAlpha;
}

// The test's own target distribution (double, sort-based), independent of the reference code.
std::vector<double> expected_probs(std::vector<float> const& l, float t, int k, float top_p) {
  std::vector<double> z(kV);
  for (int v = 0; v < kV; ++v) z[v] = static_cast<double>(l[v]) / t;
  std::vector<double> sorted = z;
  std::sort(sorted.rbegin(), sorted.rend());
  double const zk = (k > 0 && k < kV) ? sorted[k - 1] : -INFINITY;
  std::vector<double> p(kV, 0.0);
  double s = 0;
  for (int v = 0; v < kV; ++v) {
    if (z[v] >= zk) s += p[v] = std::exp(z[v] - sorted[0]);
  }
  for (auto& x : p) x /= s;
  if (top_p < 1) {
    double cut = 0;
    for (double zz : sorted) {  // smallest value whose {p >= value} mass reaches top_p
      double m = 0;
      for (int v = 0; v < kV; ++v) if (z[v] >= zz) m += p[v];
      cut = zz;
      if (m >= top_p) break;
    }
    double s2 = 0;
    for (int v = 0; v < kV; ++v) s2 += (z[v] >= cut) ? p[v] : (p[v] = 0);
    for (auto& x : p) x /= s2;
  }
  return p;
}

std::vector<float> random_row(std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> n(0, scale);
  std::vector<float> r(kV);
  for (auto& x : r) x = n(rng);
  return r;
}

std::vector<double> softmax(std::vector<float> const& l) { return expected_probs(l, 1.0f, 0, 1.0f); }

int draw(std::mt19937_64& rng, std::vector<double> const& p) {
  std::discrete_distribution<int> d(p.begin(), p.end());
  return d(rng);
}

// One speculative tree over a two-token target model: p(x1) = target(root row), p(x2 | x1) =
// target(cond[x1]); the draft model q(x1), q(x2 | x1) likewise.
struct Model {
  std::vector<float> root;                 // target logits of the first token
  std::vector<std::vector<float>> cond;    // [V] target logits of the second token given the first
  std::vector<double> q_root;              // draft distribution of the first token
  std::vector<std::vector<double>> q_cond; // [V] draft distribution of the second given the first
  float t = 1.0f, top_p = 1.0f;
  int top_k = 0;
};

Model make_model(uint64_t seed, float t, int k, float top_p) {
  std::mt19937_64 rng(seed);
  Model m;
  m.root = random_row(rng, 1.5f);
  for (int v = 0; v < kV; ++v) m.cond.push_back(random_row(rng, 1.5f));
  m.q_root = softmax(random_row(rng, 1.5f));
  for (int v = 0; v < kV; ++v) m.q_cond.push_back(softmax(random_row(rng, 1.5f)));
  m.t = t;
  m.top_k = k;
  m.top_p = top_p;
  return m;
}

// parents of the tree; node tokens are filled per trial.
struct Shape {
  std::vector<int32_t> parents;
};

struct Links {
  std::vector<int32_t> depth, first_child, next_sibling;
};
Links links_of(std::vector<int32_t> const& parents) {
  int const n = static_cast<int>(parents.size());
  Links l{std::vector<int32_t>(n, 0), std::vector<int32_t>(n, -1), std::vector<int32_t>(n, -1)};
  for (int i = 1; i < n; ++i) l.depth[i] = l.depth[parents[i]] + 1;
  for (int i = n - 1; i >= 1; --i) {  // smallest child first, siblings by increasing index
    l.next_sibling[i] = l.first_child[parents[i]];
    l.first_child[parents[i]] = i;
  }
  return l;
}

enum class Drafts { kTopK, kFixed, kSampled };
// Which committed tokens a trial returns; `variant` replaces the reference with a wrong rule.
enum class Variant { kReference, kNoRenormalisation, kNoRecursion };

// Wrong rules at the root only (first committed token), on the same uniforms.
int first_token_wrong(Model const& m, std::vector<int32_t> const& tokens, Links const& links,
                      RandomKeys keys, Variant variant, bool sampled) {
  auto p = expected_probs(m.root, m.t, m.top_k, m.top_p);
  std::vector<double> r = p;
  for (int c = links.first_child[0]; c != -1; c = links.next_sibling[c]) {
    int const x = tokens[c];
    float const u = keys.uniform(0, c, 0);
    if (variant == Variant::kNoRenormalisation) {
      if (u < r[x]) return x;  // accepts with p(x), never renormalises after a rejection
      r[x] = 0;
    } else {
      if (u < p[x] / m.q_root[x]) return x;  // p/q for every sibling, residual never updated
      for (int v = 0; v < kV; ++v) r[v] = std::max(p[v] - m.q_root[v], 0.0);
    }
  }
  (void)sampled;
  double s = 0;
  for (double x : r) s += x;
  double const target = keys.uniform(0, 0, 1) * s;
  double acc = 0;
  for (int v = 0; v < kV; ++v) {
    acc += r[v];
    if (acc > target) return v;
  }
  return kV - 1;
}

// Runs `draws` trials; returns counts of the first committed token ([V]) or of the first two
// ([V * V]).
std::vector<int64_t> run(Model const& m, std::vector<int32_t> const& parents, Drafts drafts,
                         bool joint, Variant variant = Variant::kReference, int draws = kDraws) {
  int const n = static_cast<int>(parents.size());
  Links const links = links_of(parents);
  std::vector<int32_t> tokens(n, 0), status_tree(1, 0), path(n + 1), num(1), next(1), status(1);
  std::vector<float> logits(static_cast<size_t>(n) * kV);
  std::vector<float> q(static_cast<size_t>(n) * kV);
  std::vector<float> temperature{m.t}, top_p{m.top_p};
  std::vector<int32_t> top_k{m.top_k};
  std::vector<uint64_t> seed(1);
  std::vector<uint32_t> step{5};
  std::mt19937_64 rng(12345);
  std::vector<int64_t> counts(joint ? kV * kV : kV, 0);
  bool const sampled = drafts == Drafts::kSampled;
  std::vector<std::vector<double>> cond_probs;
  for (int v = 0; v < kV; ++v) cond_probs.push_back(expected_probs(m.cond[v], m.t, m.top_k, m.top_p));
  // Deterministic drafts from q: each node's children are the top-k tokens of its q row.
  for (int trial = 0; trial < draws; ++trial) {
    for (int i = 0; i < n; ++i) {
      // Row of node i: the target's distribution of the token after node i.
      std::vector<float> const& row = i == 0 ? m.root : m.cond[tokens[i]];
      std::copy(row.begin(), row.end(), logits.begin() + static_cast<size_t>(i) * kV);
      std::vector<double> const& qi = i == 0 ? m.q_root : m.q_cond[tokens[i]];
      for (int v = 0; v < kV; ++v) q[static_cast<size_t>(i) * kV + v] = static_cast<float>(qi[v]);
      // Tokens of node i's children.
      int rank = 0;
      std::vector<int> order(kV);
      for (int v = 0; v < kV; ++v) order[v] = v;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return qi[a] > qi[b]; });
      for (int c = links.first_child[i]; c != -1; c = links.next_sibling[c], ++rank) {
        if (drafts == Drafts::kSampled) tokens[c] = draw(rng, qi);
        else if (drafts == Drafts::kTopK) tokens[c] = order[rank];
        else tokens[c] = (3 * c + 1) % kV;  // arbitrary fixed tokens (duplicates included)
      }
    }
    seed[0] = 0x9e3779b97f4a7c15ull * (trial + 1);
    VerifySampleParams p;
    p.tree.tokens = tokens.data();
    p.tree.parents = parents.data();
    p.tree.batch = 1;
    p.tree.nodes = n;
    p.links.depth = links.depth.data();
    p.links.first_child = links.first_child.data();
    p.links.next_sibling = links.next_sibling.data();
    p.links.tree_status = status_tree.data();
    p.logits = logits.data();
    p.draft_probs = sampled ? q.data() : nullptr;
    p.vocab = kV;
    p.config = {temperature.data(), top_k.data(), top_p.data()};
    p.keys.seed = seed.data();
    p.keys.step = step.data();
    p.out = {path.data(), num.data(), next.data(), n + 1};
    p.status = status.data();
    int x1;
    if (variant != Variant::kReference) {
      x1 = first_token_wrong(m, tokens, links, p.keys, variant, sampled);
      counts[x1]++;
      continue;
    }
    if (!verify_sample(CpuExecutor{}, p).ok() || status[0] != kSampleOk) {
      FAIL("verify_sample failed in trial " << trial);
    }
    x1 = num[0] >= 1 ? tokens[path[1]] : next[0];
    if (!joint) {
      counts[x1]++;
      continue;
    }
    int x2;
    if (num[0] >= 2) x2 = tokens[path[2]];
    else if (num[0] == 1) x2 = next[0];
    else x2 = draw(rng, cond_probs[x1]);  // the next step
    counts[x1 * kV + x2]++;
  }
  return counts;
}

std::vector<double> joint_probs(Model const& m) {
  auto p1 = expected_probs(m.root, m.t, m.top_k, m.top_p);
  std::vector<double> out(kV * kV);
  for (int a = 0; a < kV; ++a) {
    auto p2 = expected_probs(m.cond[a], m.t, m.top_k, m.top_p);
    for (int b = 0; b < kV; ++b) out[a * kV + b] = p1[a] * p2[b];
  }
  return out;
}

std::vector<int32_t> const kChain = {-1, 0, 1, 2};
std::vector<int32_t> const kTree2 = {-1, 0, 0, 1, 1, 2, 2};       // top-k 2, depth 2
std::vector<int32_t> const kTree3 = {-1, 0, 0, 0, 1, 1, 1, 2, 3};  // top-k 3, depth 2

}  // namespace

TEST_CASE("distribution: first token equals p_root (deterministic drafts)") {
  Model const m = make_model(1, 1.0f, 0, 1.0f);
  auto p = expected_probs(m.root, m.t, m.top_k, m.top_p);
  CHECK(fits(run(m, kChain, Drafts::kTopK, false), p));
  CHECK(fits(run(m, kTree3, Drafts::kTopK, false), p));
  CHECK(fits(run(m, kTree3, Drafts::kFixed, false), p));
}

TEST_CASE("distribution: first two tokens equal p(x1) p(x2|x1), deterministic drafts") {
  Model const m = make_model(2, 0.7f, 0, 1.0f);
  CHECK(fits(run(m, kChain, Drafts::kTopK, true), joint_probs(m)));
  CHECK(fits(run(m, kTree2, Drafts::kTopK, true), joint_probs(m)));
  Model const mk = make_model(3, 1.3f, 4, 0.9f);  // top-k 4 then top-p 0.9
  CHECK(fits(run(mk, kTree3, Drafts::kFixed, true), joint_probs(mk)));
}

TEST_CASE("distribution: first two tokens equal p(x1) p(x2|x1), sampled drafts") {
  Model const m = make_model(4, 1.0f, 0, 1.0f);
  CHECK(fits(run(m, kChain, Drafts::kSampled, true), joint_probs(m)));
  CHECK(fits(run(m, kTree3, Drafts::kSampled, true), joint_probs(m)));
  Model const mp = make_model(5, 0.8f, 0, 0.8f);  // top-p: p has zeros where q does not
  CHECK(fits(run(mp, kTree2, Drafts::kSampled, true), joint_probs(mp)));
  Model const mk = make_model(6, 1.2f, 3, 1.0f);  // top-k 3
  CHECK(fits(run(mk, kTree3, Drafts::kSampled, false), expected_probs(mk.root, mk.t, 3, 1.0f)));
}

TEST_CASE("distribution: the test rejects wrong acceptance rules (power)") {
  Model const m = make_model(7, 1.0f, 0, 1.0f);
  auto p = expected_probs(m.root, m.t, m.top_k, m.top_p);
  // Deterministic top-k drafts accepted with p(x) and no renormalisation after a rejection.
  CHECK_FALSE(fits(run(m, kTree3, Drafts::kTopK, false, Variant::kNoRenormalisation), p));
  // Sampled drafts accepted with p/q for every sibling (no residual recursion).
  CHECK_FALSE(fits(run(m, kTree3, Drafts::kSampled, false, Variant::kNoRecursion), p));
  // And the statistic itself: a 1% total-variation shift at 200k draws is far past the threshold.
  std::vector<double> shifted = p;
  shifted[0] += 0.01;
  shifted[1] -= 0.01;
  std::vector<int64_t> counts(kV);
  for (int v = 0; v < kV; ++v) counts[v] = std::llround(shifted[v] * kDraws);
  CHECK_FALSE(fits(counts, p));
}

TEST_CASE("distribution: chi-square p-values match tables") {
  CHECK(chi2_pvalue(11.0705, 5) == doctest::Approx(0.05).epsilon(1e-3));
  CHECK(chi2_pvalue(25.7448, 5) == doctest::Approx(1e-4).epsilon(1e-2));
  CHECK(chi2_pvalue(49.8018, 35) == doctest::Approx(0.05).epsilon(1e-3));
}
