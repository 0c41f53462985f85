// kv_commit on the H200: MLA-shaped entries (W = 576 bf16 = 1152 bytes), L = 61 layers, batch
// {1,8,64,256} x accepted drafts {1,3,7,15} (every one a real move), contiguous and paged
// (page_size 64, shuffled pages). Bytes per launch = rows read + rows written =
// 2 * L * B * accepted * 1152. The cache is B x 61 x 128 slots (9 MB per request): at batch 1 it
// fits in L2, so that row measures latency, not bandwidth.
#include <algorithm>
#include <numeric>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

void BM_kv_commit(benchmark::State& state) {
  int const B = static_cast<int>(state.range(0)), accepted = static_cast<int>(state.range(1));
  bool const paged = state.range(2) != 0;
  int const L = 61, W = 576, elem_bytes = 2, max_seq = 128, page_size = 64, P = 17;
  int const max_pages = max_seq / page_size, num_pages = B * max_pages;
  int64_t const row_bytes = W * elem_bytes;
  int64_t const stride = int64_t(B) * max_seq * row_bytes;
  specdec::DeviceBuffer<unsigned char> cache(static_cast<size_t>(stride * L));
  specdec::bench::check_cuda(cudaMemset(cache.data(), 0x3c, cache.size()), "cudaMemset");
  specdec::testing::Rng rng(3);
  std::vector<int32_t> table(static_cast<size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> prefix(B, 40), num(B, accepted), path(static_cast<size_t>(B) * P, -1);
  for (int b = 0; b < B; ++b) {
    path[static_cast<size_t>(b) * P] = 0;
    for (int k = 1; k <= accepted; ++k) path[static_cast<size_t>(b) * P + k] = 2 * k;  // all move
  }
  specdec::DeviceBuffer<int32_t> d_table(table), d_prefix(prefix), d_num(num), d_path(path), seq(B),
      status(B);
  specdec::ops::KvCommitParams p;
  p.cache = cache.data();
  p.layer_stride_bytes = stride;
  p.num_layers = L;
  p.width = W;
  p.elem_bytes = elem_bytes;
  p.batch = B;
  p.layout = paged ? specdec::ops::KvLayout::kPaged : specdec::ops::KvLayout::kContiguous;
  p.max_seq = max_seq;
  p.page_table = d_table.data();
  p.max_pages_per_request = max_pages;
  p.page_size = page_size;
  p.num_pages = num_pages;
  p.prefix_len = d_prefix.data();
  p.acceptance = {d_path.data(), d_num.data(), nullptr, P};
  p.seq_len_out = seq.data();
  p.status = status.data();
  double const bytes = 2.0 * L * B * accepted * row_bytes;
  specdec::bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    auto s = specdec::ops::kv_commit(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}
SPECDEC_CUDA_BENCHMARK(BM_kv_commit)
    ->ArgNames({"B", "accepted", "paged"})
    ->ArgsProduct({{1, 8, 64, 256}, {1, 3, 7, 15}, {0}})
    ->ArgsProduct({{1, 64}, {3, 15}, {1}});

}  // namespace
