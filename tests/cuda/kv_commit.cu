// kv_commit CUDA kernel vs the CPU reference: byte-exact caches, status and seq_len over
// contiguous and paged layouts (shuffled page tables), elem_bytes {1,2,4}, W {1,7,64,576},
// batch 1..256, path capacity 2..65, misaligned bases and odd layer strides, and requests with
// device-detected errors; outputs poisoned before each run.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "support/testing.hpp"

namespace {

using specdec::DeviceBuffer;
using specdec::ops::KvLayout;

struct SweepCase {
  KvLayout layout;
  int batch, layers, width, elem_bytes, path_capacity, offset, stride_pad;
};

void run_case(SweepCase const& sc, uint64_t seed) {
  specdec::testing::Rng rng(seed);
  int const B = sc.batch, P = sc.path_capacity, nodes = 2 * P;
  int const row_bytes = sc.width * sc.elem_bytes;
  int const page_size = 16, max_pages = (3 * nodes + page_size - 1) / page_size + 1;
  int const max_seq = 3 * nodes;
  int const num_pages = B * max_pages + 3;
  int64_t const rows =
      sc.layout == KvLayout::kContiguous ? int64_t(B) * max_seq : int64_t(num_pages) * page_size;
  int64_t const stride = rows * row_bytes + sc.stride_pad;
  std::vector<unsigned char> cache(sc.offset + stride * sc.layers);
  for (auto& x : cache) x = static_cast<unsigned char>(rng() >> 56);

  std::vector<int32_t> table(static_cast<size_t>(B) * max_pages);  // a shuffled permutation
  std::iota(table.begin(), table.end(), 3);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> prefix(B), path(static_cast<size_t>(B) * P, -1), num(B);
  std::uniform_int_distribution<int> pre(0, nodes), len(0, P - 1), any(0, 19);
  for (int b = 0; b < B; ++b) {
    prefix[b] = pre(rng);
    num[b] = len(rng);
    int32_t* row = &path[static_cast<size_t>(b) * P];
    row[0] = 0;
    for (int k = 1; k <= num[b]; ++k) {  // increasing node indices, sometimes in place
      std::uniform_int_distribution<int> step(1, 3);
      row[k] = row[k - 1] + (any(rng) < 5 ? 1 : step(rng));
    }
    switch (any(rng)) {  // some requests carry a device-detected error
      case 0:
        prefix[b] = -3;
        break;
      case 1:
        num[b] = P;
        break;
      case 2:
        if (num[b] > 0) row[num[b]] = 0;
        break;
      case 3:
        prefix[b] = max_seq - 1;
        break;  // moves past max_seq / the page table
      case 4:
        table[static_cast<size_t>(b) * max_pages] = num_pages;
        break;
      default:
        break;
    }
  }
  if (B >= 8) prefix[1] = -3;  // at least one error in every batch of 8 or more
  specdec::ops::KvCommitParams hp;
  std::vector<unsigned char> ref = cache;
  std::vector<int32_t> ref_seq(B), ref_status(B);
  hp.cache = ref.data() + sc.offset;
  hp.layer_stride_bytes = stride;
  hp.num_layers = sc.layers;
  hp.width = sc.width;
  hp.elem_bytes = sc.elem_bytes;
  hp.batch = B;
  hp.layout = sc.layout;
  hp.max_seq = max_seq;
  hp.page_table = table.data();
  hp.max_pages_per_request = max_pages;
  hp.page_size = page_size;
  hp.num_pages = num_pages;
  hp.prefix_len = prefix.data();
  hp.acceptance = {path.data(), num.data(), nullptr, P};
  hp.seq_len_out = ref_seq.data();
  hp.status = ref_status.data();
  REQUIRE(specdec::ops::kv_commit(specdec::CpuExecutor{}, hp).ok());

  DeviceBuffer<unsigned char> d_cache(cache);
  DeviceBuffer<int32_t> d_table(table), d_prefix(prefix), d_path(path), d_num(num), d_seq(B),
      d_status(B);
  REQUIRE(d_seq.fill_bytes(0xff).ok());
  REQUIRE(d_status.fill_bytes(0xff).ok());
  auto dp = hp;
  dp.cache = d_cache.data() + sc.offset;
  dp.page_table = d_table.data();
  dp.prefix_len = d_prefix.data();
  dp.acceptance = {d_path.data(), d_num.data(), nullptr, P};
  dp.seq_len_out = d_seq.data();
  dp.status = d_status.data();
  auto s = specdec::ops::kv_commit(specdec::CudaExecutor{nullptr}, dp);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  INFO("layout=" << int(sc.layout) << " B=" << B << " L=" << sc.layers << " W=" << sc.width
                 << " eb=" << sc.elem_bytes << " P=" << P << " offset=" << sc.offset);
  CHECK(d_status.download() == ref_status);
  CHECK(d_seq.download() == ref_seq);
  CHECK(d_cache.download() == ref);
  int ok = 0, moved = 0;
  for (int b = 0; b < B; ++b) ok += ref_status[b] == 0, moved += ref_status[b] == 0 ? num[b] : 0;
  if (B >= 8 && P > 2) CHECK(moved > 0);
  if (B >= 8) CHECK(ok < B);  // errors are exercised too
}

}  // namespace

TEST_CASE("kv_commit cuda matches the CPU reference over a sweep") {
  std::vector<SweepCase> const cases = {
      {KvLayout::kContiguous, 1, 61, 576, 2, 5, 0, 0},
      {KvLayout::kPaged, 1, 61, 576, 2, 65, 0, 0},
      {KvLayout::kContiguous, 8, 3, 7, 2, 17, 2, 6},   // 14-byte rows: 2-byte accesses
      {KvLayout::kPaged, 8, 3, 7, 1, 17, 1, 3},        // odd everything: 1-byte accesses
      {KvLayout::kContiguous, 64, 2, 64, 4, 9, 4, 4},  // 4-byte aligned base: 4-byte accesses
      {KvLayout::kPaged, 64, 2, 576, 2, 65, 0, 16},
      {KvLayout::kContiguous, 256, 2, 576, 2, 9, 0, 0},
      {KvLayout::kPaged, 256, 2, 1, 4, 5, 8, 8},        // 4-byte rows
      {KvLayout::kContiguous, 16, 2, 100, 1, 2, 0, 0},  // P = 2: at most one move
      {KvLayout::kPaged, 4, 2, 576, 2, 1025, 0, 0},     // P at its maximum: one-vector chunks
  };
  uint64_t seed = 300;
  for (auto const& sc : cases) run_case(sc, seed++);
}
