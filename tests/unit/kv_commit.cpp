// kv_commit CPU reference: hand-worked moves in contiguous and paged caches (non-identity page
// table, overlapping source/destination slots), every elem_bytes with W not a multiple of 8,
// per-request device-side errors (nothing moved, other requests unaffected), validation errors.
#include "specdec/ops/kv_commit/kv_commit.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

namespace {

using specdec::CpuExecutor;
using specdec::StatusCode;
using specdec::ops::KvCommitParams;
using specdec::ops::KvLayout;

// A cache of L layers x rows x row_bytes (+ padding between layers), filled with a byte pattern
// that differs for every (layer, row, byte).
struct Cache {
  int layers, rows, row_bytes;
  int64_t stride;
  std::vector<unsigned char> bytes;
  Cache(int l, int r, int rb, int pad)
      : layers(l), rows(r), row_bytes(rb), stride(int64_t(r) * rb + pad) {
    bytes.resize(static_cast<size_t>(stride * l));
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<unsigned char>((i * 7 + 3) % 251);
  }
  unsigned char const* row(int layer, int r) const {
    return bytes.data() + layer * stride + int64_t(r) * row_bytes;
  }
};

// Expected cache: `before` with row dst[i] replaced by before's row src[i] in every layer.
std::vector<unsigned char> moved(Cache const& before,
                                 std::vector<std::pair<int, int>> const& dst_src) {
  std::vector<unsigned char> out = before.bytes;
  for (int l = 0; l < before.layers; ++l) {
    for (auto [dst, src] : dst_src) {
      std::memcpy(out.data() + l * before.stride + int64_t(dst) * before.row_bytes,
                  before.row(l, src), before.row_bytes);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("kv_commit: contiguous cache, overlapping moves, every elem_bytes") {
  for (int elem_bytes : {1, 2, 4}) {
    int const W = 3, B = 2, max_seq = 8, L = 2, P = 4;
    Cache cache(L, B * max_seq, W * elem_bytes, 5);
    Cache const before = cache;
    // Request 0: prefix 2, path [0 2 3] -> slot 4 -> 3, slot 5 -> 4 (slot 4 is both a source and
    //   a destination); rows b*8+s: row 3 <- row 4, row 4 <- row 5. seq_len 2 + 2 + 1 = 5.
    // Request 1: prefix 0, path [0 1 3] -> slot 1 -> 1 (in place), slot 3 -> 2: row 10 <- row 11.
    //   seq_len 0 + 2 + 1 = 3.
    std::vector<int32_t> prefix = {2, 0}, path = {0, 2, 3, -1, 0, 1, 3, -1}, num = {2, 2};
    std::vector<int32_t> seq(B, 77), status(B, 77);
    KvCommitParams p;
    p.cache = cache.bytes.data();
    p.layer_stride_bytes = cache.stride;
    p.num_layers = L;
    p.width = W;
    p.elem_bytes = elem_bytes;
    p.batch = B;
    p.max_seq = max_seq;
    p.prefix_len = prefix.data();
    p.acceptance = {path.data(), num.data(), nullptr, P};
    p.seq_len_out = seq.data();
    p.status = status.data();
    REQUIRE(specdec::ops::kv_commit(CpuExecutor{}, p).ok());
    CHECK(cache.bytes == moved(before, {{3, 4}, {4, 5}, {10, 11}}));
    CHECK(seq == std::vector<int32_t>{5, 3});
    CHECK(status == std::vector<int32_t>{0, 0});
  }
}

TEST_CASE("kv_commit: paged cache with a non-identity page table") {
  for (int elem_bytes : {1, 2, 4}) {
    int const W = 7, B = 2, L = 3, P = 4, page_size = 2, num_pages = 6, max_pages = 3;
    Cache cache(L, num_pages * page_size, W * elem_bytes, 16);
    Cache const before = cache;
    std::vector<int32_t> table = {4, 1, 3, 0, 5, 2};
    // Request 0: pages [4 1 3], prefix 1, path [0 3 4]: slot 4 -> 2, slot 5 -> 3.
    //   slot 4 = page 3 row 0 = row 6; slot 2 = page 1 row 0 = row 2;
    //   slot 5 = page 3 row 1 = row 7; slot 3 = page 1 row 1 = row 3.  => 2 <- 6, 3 <- 7.
    // Request 1: pages [0 5 2], prefix 1, path [0 2 4]: slot 3 -> 2, slot 5 -> 3.
    //   slot 3 = page 5 row 1 = row 11; slot 2 = page 5 row 0 = row 10; slot 5 = page 2 row 1 =
    //   row 5.
    //   => 10 <- 11, 11 <- 5 (row 11 is a source and a destination).
    std::vector<int32_t> prefix = {1, 1}, path = {0, 3, 4, -1, 0, 2, 4, -1}, num = {2, 2};
    std::vector<int32_t> status(B, 77);
    KvCommitParams p;
    p.cache = cache.bytes.data();
    p.layer_stride_bytes = cache.stride;
    p.num_layers = L;
    p.width = W;
    p.elem_bytes = elem_bytes;
    p.batch = B;
    p.layout = KvLayout::kPaged;
    p.page_table = table.data();
    p.max_pages_per_request = max_pages;
    p.page_size = page_size;
    p.num_pages = num_pages;
    p.prefix_len = prefix.data();
    p.acceptance = {path.data(), num.data(), nullptr, P};
    p.status = status.data();  // seq_len_out left null: skipped
    REQUIRE(specdec::ops::kv_commit(CpuExecutor{}, p).ok());
    CHECK(cache.bytes == moved(before, {{2, 6}, {3, 7}, {10, 11}, {11, 5}}));
    CHECK(status == std::vector<int32_t>{0, 0});
  }
}

TEST_CASE("kv_commit: per-request errors move nothing and leave other requests alone") {
  int const W = 5, B = 7, max_seq = 6, L = 2, P = 3;
  Cache cache(L, B * max_seq, W * 2, 0);
  Cache const before = cache;
  // b0 ok: prefix 1, path [0 2] -> slot 3 -> 2: row 2 <- row 3.
  // b1 prefix -1 -> 1.  b2 num_accepted 3 > P-1 -> 2.  b3 path [0 0] -> 3.
  // b4 prefix 3, path [0 1 3]: slot 6 >= max_seq -> 4.  b5 prefix 6 (root beyond capacity) -> 1.
  // b6 num_accepted 0, prefix 5 -> nothing to move, seq_len 6 (fills the request exactly).
  std::vector<int32_t> prefix = {1, -1, 0, 0, 3, 6, 5};
  std::vector<int32_t> path = {0, 2, -1, 0, 1, -1, 0, 1, 2, 0, 0, -1, 0, 1, 3, 0, 1, -1, 0, -1, -1};
  std::vector<int32_t> num = {1, 1, 3, 1, 2, 1, 0};
  std::vector<int32_t> seq(B, 77), status(B, 77);
  KvCommitParams p;
  p.cache = cache.bytes.data();
  p.layer_stride_bytes = cache.stride;
  p.num_layers = L;
  p.width = W;
  p.elem_bytes = 2;
  p.batch = B;
  p.max_seq = max_seq;
  p.prefix_len = prefix.data();
  p.acceptance = {path.data(), num.data(), nullptr, P};
  p.seq_len_out = seq.data();
  p.status = status.data();
  REQUIRE(specdec::ops::kv_commit(CpuExecutor{}, p).ok());
  CHECK(status == std::vector<int32_t>{0, 1, 2, 3, 4, 1, 0});
  CHECK(seq == std::vector<int32_t>{3, -1, -1, -1, -1, -1, 6});
  CHECK(cache.bytes == moved(before, {{2, 3}}));
  CHECK(std::string(specdec::ops::kv_commit_error_name(4)).find("max_seq") != std::string::npos);
}

TEST_CASE("kv_commit: paged errors (slot past the page table, bad page id)") {
  int const W = 4, B = 3, L = 1, P = 3, page_size = 2, num_pages = 4, max_pages = 2;
  Cache cache(L, num_pages * page_size, W, 0);
  Cache const before = cache;
  std::vector<int32_t> table = {1, 2, 3, -1, 0, 4};
  // b0 pages [1 2], prefix 2, path [0 2]: slot 4 = page index 2 >= 2 -> 4.
  // b1 pages [3 -1], prefix 1, path [0 2]: slot 3 -> page -1 -> 5 (and slot 1 fine).
  // b2 pages [0 4], prefix 0, path [0 1 2]: slot 2 -> page 4 >= num_pages -> 5.
  std::vector<int32_t> prefix = {2, 1, 0}, path = {0, 2, -1, 0, 2, -1, 0, 1, 2}, num = {1, 1, 2};
  std::vector<int32_t> status(B, 77);
  KvCommitParams p;
  p.cache = cache.bytes.data();
  p.num_layers = L;
  p.width = W;
  p.elem_bytes = 1;
  p.batch = B;
  p.layout = KvLayout::kPaged;
  p.page_table = table.data();
  p.max_pages_per_request = max_pages;
  p.page_size = page_size;
  p.num_pages = num_pages;
  p.prefix_len = prefix.data();
  p.acceptance = {path.data(), num.data(), nullptr, P};
  p.status = status.data();
  REQUIRE(specdec::ops::kv_commit(CpuExecutor{}, p).ok());
  CHECK(status == std::vector<int32_t>{4, 5, 5});
  CHECK(cache.bytes == before.bytes);
}

TEST_CASE("kv_commit: validation names the problem") {
  std::vector<unsigned char> cache(1024);
  std::vector<int32_t> prefix = {0}, path = {0, 1}, num = {1}, status(1), table = {0};
  auto base = [&] {
    KvCommitParams p;
    p.cache = cache.data();
    p.layer_stride_bytes = 64;
    p.num_layers = 2;
    p.width = 4;
    p.elem_bytes = 2;
    p.batch = 1;
    p.max_seq = 8;
    p.prefix_len = prefix.data();
    p.acceptance = {path.data(), num.data(), nullptr, 2};
    p.status = status.data();
    return p;
  };
  auto expect = [&](auto mutate, char const* needle) {
    auto p = base();
    mutate(p);
    auto s = specdec::ops::kv_commit(CpuExecutor{}, p);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(s.message().find(needle) != std::string::npos, s.message());
  };
  expect([](KvCommitParams& p) { p.cache = nullptr; }, "cache");
  expect([](KvCommitParams& p) { p.num_layers = 0; }, "num_layers");
  expect([](KvCommitParams& p) { p.width = 0; }, "width");
  expect([](KvCommitParams& p) { p.elem_bytes = 3; }, "elem_bytes");
  expect([](KvCommitParams& p) { p.batch = 0; }, "batch");
  expect([](KvCommitParams& p) { p.max_seq = 0; }, "max_seq");
  expect([](KvCommitParams& p) { p.layer_stride_bytes = 63; }, "layer_stride_bytes");
  expect([](KvCommitParams& p) { p.layout = static_cast<KvLayout>(7); }, "layout");
  expect([](KvCommitParams& p) { p.layout = KvLayout::kPaged; }, "page_table");
  expect(
      [&](KvCommitParams& p) {
        p.layout = KvLayout::kPaged;
        p.page_table = table.data();
      },
      "max_pages");
  expect(
      [&](KvCommitParams& p) {
        p.layout = KvLayout::kPaged;
        p.page_table = table.data();
        p.max_pages_per_request = 1;
      },
      "page_size");
  expect(
      [&](KvCommitParams& p) {
        p.layout = KvLayout::kPaged;
        p.page_table = table.data();
        p.max_pages_per_request = 1;
        p.page_size = 4;
      },
      "num_pages");
  expect([](KvCommitParams& p) { p.acceptance.path_capacity = 0; }, "path capacity");
  expect([](KvCommitParams& p) { p.acceptance.path_capacity = 1026; }, "path capacity");
  expect([](KvCommitParams& p) { p.prefix_len = nullptr; }, "prefix_len");
  expect([](KvCommitParams& p) { p.acceptance.accepted_path = nullptr; }, "accepted_path");
  expect([](KvCommitParams& p) { p.acceptance.num_accepted = nullptr; }, "num_accepted");
  expect([](KvCommitParams& p) { p.status = nullptr; }, "status");
  auto p = base();
  CHECK(specdec::ops::kv_commit(CpuExecutor{}, p).ok());
  CHECK(status[0] == 0);
}
