// tree_build CUDA kernel vs the CPU reference: batch {1, 7, 64, 256} x N {1, 2, 5, 31, 32, 33,
// 64, 257, 1024}, deep and bushy random trees, node_count given or not, malformed requests of
// every kind mixed into good batches; every output compared exactly after poisoning (0xff).
// One case is also replayed from a captured CUDA graph.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/tree_build/tree_build.hpp"
#include "support/testing.hpp"

namespace {

using specdec::DeviceBuffer;

void run_case(int B, int N, bool deep, bool with_count, uint64_t seed, bool capture = false) {
  CAPTURE(B);
  CAPTURE(N);
  CAPTURE(deep);
  CAPTURE(with_count);
  specdec::testing::Rng rng(seed);
  int const W = (N + 31) / 32;
  // Full path capacity while leaf_paths stays small; otherwise P = 64 and deep trees become
  // kTreeTooDeep (which is tested too).
  int const P = static_cast<int64_t>(B) * N * N <= (int64_t{1} << 24) ? N : std::min(N, 64);
  std::vector<int32_t> parents(static_cast<size_t>(B) * N), counts(B), prefix(B);
  std::uniform_int_distribution<int> cnt(1, N), kind(0, 6), pre(0, 100000);
  for (int b = 0; b < B; ++b) {
    auto par = specdec::testing::random_parents(rng, N, deep);
    counts[b] = (!with_count || b % 3 == 0) ? N : cnt(rng);
    prefix[b] = pre(rng);
    // Every fourth request malformed (when node_count is given), the kind cycling.
    if (b % 4 == 3) {
      int const n = counts[b];
      std::uniform_int_distribution<int> node(1, std::max(1, n - 1));
      switch (kind(rng)) {
        case 0:
          if (with_count) counts[b] = 0;
          break;
        case 1:
          if (with_count) counts[b] = N + 1 + b;
          break;
        case 2:
          par[0] = 0;
          break;
        case 3:
          if (n > 1) {
            int i = node(rng);
            par[i] = i;
          }
          break;
        case 4:
          if (n > 1) {
            int i = node(rng);
            par[i] = i + 5;
          }
          break;
        case 5:
          if (n > 1) {
            int i = node(rng);
            par[i] = -2 - i;
          }
          break;
        default:
          if (n > 1) {
            int i = node(rng);
            par[i] = -1;
          }
          break;
      }
    }
    std::copy(par.begin(), par.end(), parents.begin() + static_cast<size_t>(b) * N);
  }

  size_t const rows = static_cast<size_t>(B) * N;
  std::vector<uint32_t> h_mask(rows * W);
  std::vector<int32_t> h_depth(rows), h_pos(rows), h_fc(rows), h_ns(rows), h_paths(rows * P),
      h_leaves(B), h_status(B);
  specdec::ops::TreeBuildParams hp;
  hp.tree = {nullptr, parents.data(), with_count ? counts.data() : nullptr, B, N};
  hp.prefix_len = prefix.data();
  hp.out = {h_mask.data(),   h_depth.data(),  h_pos.data(),
            h_fc.data(),     h_ns.data(),     h_paths.data(),
            h_leaves.data(), h_status.data(), P};
  specdec::Status const cpu = specdec::ops::tree_build(specdec::CpuExecutor{}, hp);

  DeviceBuffer<int32_t> d_par(parents), d_counts(counts), d_prefix(prefix);
  DeviceBuffer<uint32_t> d_mask(rows * W);
  DeviceBuffer<int32_t> d_depth(rows), d_pos(rows), d_fc(rows), d_ns(rows), d_paths(rows * P),
      d_leaves(B), d_status(B);
  for (auto* buf : {&d_depth, &d_pos, &d_fc, &d_ns, &d_paths, &d_leaves, &d_status}) {
    REQUIRE(buf->fill_bytes(0xff).ok());
  }
  REQUIRE(d_mask.fill_bytes(0xff).ok());
  specdec::ops::TreeBuildParams dp = hp;
  dp.tree = {nullptr, d_par.data(), with_count ? d_counts.data() : nullptr, B, N};
  dp.prefix_len = d_prefix.data();
  dp.out = {d_mask.data(),   d_depth.data(),  d_pos.data(),
            d_fc.data(),     d_ns.data(),     d_paths.data(),
            d_leaves.data(), d_status.data(), P};
  if (capture) {
    cudaStream_t stream;
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    specdec::Status const s = specdec::ops::tree_build(specdec::CudaExecutor{stream}, dp);
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    REQUIRE(s.ok());
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  } else {
    specdec::Status const s = specdec::ops::tree_build(specdec::CudaExecutor{}, dp);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  auto const status = d_status.download();
  CHECK(status == h_status);
  // The CPU Status and the GPU tree_status agree on the first bad request.
  CHECK(specdec::check_tree_status(status.data(), B).ok() == cpu.ok());
  CHECK(d_mask.download() == h_mask);
  CHECK(d_depth.download() == h_depth);
  CHECK(d_pos.download() == h_pos);
  CHECK(d_fc.download() == h_fc);
  CHECK(d_ns.download() == h_ns);
  CHECK(d_paths.download() == h_paths);
  CHECK(d_leaves.download() == h_leaves);
}

}  // namespace

TEST_CASE("tree_build cuda: sweep vs reference") {
  uint64_t seed = 1;
  for (int B : {1, 7, 64, 256}) {
    for (int N : {1, 2, 5, 31, 32, 33, 64, 257, 1024}) {
      for (bool deep : {false, true}) {
        run_case(B, N, deep, /*with_count=*/true, seed++);
      }
      run_case(B, N, /*deep=*/B % 2 == 0, /*with_count=*/false, seed++);
    }
  }
}

TEST_CASE("tree_build cuda: replay from a captured graph") {
  run_case(64, 33, /*deep=*/true, /*with_count=*/true, 99, /*capture=*/true);
}
