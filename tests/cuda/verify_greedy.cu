// verify_greedy CUDA kernels vs the CPU reference: exact argmax, paths, counts and bonus tokens
// over batch 1..256, nodes 1..64, vocab up to 163840 (big vocab with small B*N, big batch with
// smaller vocab), odd vocab sizes and misaligned rows, bad trees, planted argmax ties; outputs
// poisoned before each run; one case replayed from a captured CUDA graph.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/verify_greedy/verify_greedy.hpp"
#include "support/testing.hpp"

namespace {

using specdec::DeviceBuffer;

struct SweepCase {
  int batch, nodes, vocab, offset;  // offset: floats between the buffer start and logits[0]
};

// Plain depth / children links from parents (no dependency on tree_build).
void build_links(std::vector<int32_t> const& parents, std::vector<int32_t> const& counts, int nodes,
                 std::vector<int32_t>& depth, std::vector<int32_t>& first_child,
                 std::vector<int32_t>& next_sibling) {
  depth.assign(parents.size(), -1);
  first_child.assign(parents.size(), -1);
  next_sibling.assign(parents.size(), -1);
  for (size_t b = 0; b < counts.size(); ++b) {
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

void run_case(SweepCase const& sc, uint64_t seed, bool capture) {
  specdec::testing::Rng rng(seed);
  int const B = sc.batch, N = sc.nodes, V = sc.vocab, P = N + 1;
  size_t const rows = static_cast<size_t>(B) * N;
  // Fast non-zero random logits in (-8, 8), then a planted winner per row (sometimes tied).
  std::vector<float> logits(sc.offset + rows * V);
  for (auto& x : logits)
    x = static_cast<float>(static_cast<int64_t>(rng() >> 44) - 524288) / 65536.0f + 1e-3f;
  std::vector<int32_t> winner(rows);
  std::uniform_int_distribution<int> tok(0, V - 1), coin(0, 3);
  for (size_t r = 0; r < rows; ++r) {
    winner[r] = tok(rng);
    float* row = logits.data() + sc.offset + r * V;
    row[winner[r]] = 9.0f;
    if (coin(rng) == 0) row[tok(rng)] = 9.0f;  // a tie: the smaller id must win
  }
  std::vector<int32_t> parents, tokens, counts(B), status(B, 0);
  std::uniform_int_distribution<int> cnt(1, N);
  for (int b = 0; b < B; ++b) {
    auto par = specdec::testing::random_parents(rng, N, b % 2 == 0);
    counts[b] = b % 3 == 0 ? N : cnt(rng);
    for (int i = 0; i < N; ++i) {
      int t = tok(rng);
      if (i > 0 && coin(rng) != 0) t = winner[b * N + par[i]];  // mostly on the greedy path
      tokens.push_back(t);
    }
    parents.insert(parents.end(), par.begin(), par.end());
    if (B > 1 && b % 7 == 5) status[b] = specdec::kTreeBadParent;
  }
  std::vector<int32_t> depth, first_child, next_sibling;
  build_links(parents, counts, N, depth, first_child, next_sibling);

  // CPU reference.
  std::vector<int32_t> ref_argmax(rows), ref_path(B * P), ref_num(B), ref_next(B);
  specdec::ops::VerifyGreedyParams hp;
  hp.tree = {tokens.data(), parents.data(), counts.data(), B, N};
  hp.links = {depth.data(), first_child.data(), next_sibling.data(), status.data()};
  hp.logits = logits.data() + sc.offset;
  hp.vocab = V;
  hp.argmax_scratch = ref_argmax.data();
  hp.out = {ref_path.data(), ref_num.data(), ref_next.data(), P};
  REQUIRE(specdec::ops::verify_greedy(specdec::CpuExecutor{}, hp).ok());

  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> d_tokens(tokens), d_parents(parents), d_counts(counts), d_status(status),
      d_depth(depth), d_first(first_child), d_next_sib(next_sibling);
  DeviceBuffer<int32_t> d_argmax(rows), d_path(B * P), d_num(B), d_next(B);
  REQUIRE(d_argmax.fill_bytes(0xff).ok());
  REQUIRE(d_path.fill_bytes(0xff).ok());
  REQUIRE(d_num.fill_bytes(0xff).ok());
  REQUIRE(d_next.fill_bytes(0xff).ok());
  specdec::ops::VerifyGreedyParams dp = hp;
  dp.tree = {d_tokens.data(), d_parents.data(), d_counts.data(), B, N};
  dp.links = {d_depth.data(), d_first.data(), d_next_sib.data(), d_status.data()};
  dp.logits = d_logits.data() + sc.offset;
  dp.argmax_scratch = d_argmax.data();
  dp.out = {d_path.data(), d_num.data(), d_next.data(), P};
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  if (capture) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    auto s = specdec::ops::verify_greedy(specdec::CudaExecutor{stream}, dp);
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  } else {
    auto s = specdec::ops::verify_greedy(specdec::CudaExecutor{stream}, dp);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  cudaStreamDestroy(stream);
  INFO("B=" << B << " N=" << N << " V=" << V << " offset=" << sc.offset << " seed=" << seed);
  CHECK(d_argmax.download() == ref_argmax);
  CHECK(d_path.download() == ref_path);
  CHECK(d_num.download() == ref_num);
  CHECK(d_next.download() == ref_next);
  if (!capture) {  // the argmax given instead of the logits (a vocabulary-sharded target)
    DeviceBuffer<int32_t> d_given(ref_argmax), d_argmax2(rows), d_path2(B * P), d_num2(B),
        d_next2(B);
    specdec::ops::VerifyGreedyParams gp = dp;
    gp.logits = nullptr;
    gp.target_argmax = d_given.data();
    gp.argmax_scratch = d_argmax2.data();
    gp.out = {d_path2.data(), d_num2.data(), d_next2.data(), P};
    auto s = specdec::ops::verify_greedy(specdec::CudaExecutor{}, gp);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(d_argmax2.download() == ref_argmax);
    CHECK(d_path2.download() == ref_path);
    CHECK(d_num2.download() == ref_num);
    CHECK(d_next2.download() == ref_next);
  }
  int accepted = 0;
  for (int n : ref_num) accepted += n;
  if (N > 1 && B >= 8) CHECK(accepted > 0);  // the sweep really exercises acceptance
}

}  // namespace

TEST_CASE("verify_greedy cuda matches the CPU reference over a sweep") {
  std::vector<SweepCase> const cases = {
      {1, 1, 163840, 0},  {1, 4, 163840, 0}, {1, 16, 163840, 1}, {2, 64, 163840, 0},
      {8, 16, 163840, 0}, {8, 4, 32000, 3},  {64, 16, 32000, 0}, {256, 4, 32000, 0},
      {256, 64, 500, 0},  {1, 64, 32001, 0}, {3, 5, 7, 1},       {16, 16, 1, 0},
      {4, 4, 4099, 2},    {64, 1, 2048, 0},
  };
  uint64_t seed = 100;
  for (auto const& sc : cases) run_case(sc, seed++, false);
}

TEST_CASE("verify_greedy cuda replays from a captured graph") {
  run_case({4, 16, 32000, 0}, 7, true);
  run_case({1, 4, 163840, 0}, 8, true);  // split rows (clusters) under capture
}
