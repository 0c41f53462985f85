// mla_attention (CPU reference): a hand-worked two-slot case with a known softmax; the reference
// against an independent computation that never sees the page table (each request's logical
// entries materialised densely, scattered into interleaved pages with NaN in every row that must
// not be read) over decode, causal prefill and tree-verify batches; visibility as the tree mask or
// causality says (perturbing an invisible entry changes nothing); a token with no visible slot
// gets zeros; the shape and data contract refused by name; the CUDA plan and workspace sizes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "specdec/ops/mla_attention/mla_attention.hpp"
#include "support/paged_batch.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

using namespace specdec;
using namespace specdec::ops;

namespace {

// A batch on the host: every request's logical entries [base + count, W], scattered into pages.
struct Problem : testing::PagedMlaBatch {
  std::vector<std::vector<float>> entries;  // [B][(base + count) * W]; the cache NaN elsewhere

  MlaAttentionParams params(std::vector<float>* out, float scale, int extra_slots = 0) {
    int max_slots = 1;
    for (int b = 0; b < batch; ++b) max_slots = std::max(max_slots, base[b] + count[b]);
    return PagedMlaBatch::params(out, -7.0f, max_slots + extra_slots, scale);
  }

  // Writes the logical entries into the pages (after a test edits `entries`).
  void scatter() {
    int const W = width();
    for (int b = 0; b < batch; ++b) {
      for (int u = 0; u < base[b] + count[b]; ++u) {
        int64_t const row =
            int64_t{page_table[static_cast<size_t>(b * max_pages + u / page_size)]} * page_size +
            u % page_size;
        std::copy_n(entries[b].begin() + static_cast<int64_t>(u) * W, W,
                    cache.begin() + row * W);
      }
    }
  }
};

// Pages handed out in turns between the requests (so their pages interleave), from a shuffled
// pool; tokens in request order, or shuffled. parents: per request, a tree over its count nodes
// (verify mask rows); empty: causal.
Problem make_problem(testing::Rng& rng, int heads, int c, int r, int page_size,
                     std::vector<int32_t> base, std::vector<int32_t> count,
                     std::vector<std::vector<int32_t>> const& parents, int words,
                     bool shuffle_tokens = false) {
  Problem P;
  P.heads = heads;
  P.c = c;
  P.r = r;
  P.page_size = page_size;
  P.batch = static_cast<int>(base.size());
  P.base = std::move(base);
  P.count = std::move(count);
  int const W = P.width();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int> pages_of(static_cast<size_t>(P.batch));
  int total = 0;
  for (int b = 0; b < P.batch; ++b) {
    pages_of[b] = (P.base[b] + P.count[b] + page_size - 1) / page_size;
    P.max_pages = std::max(P.max_pages, pages_of[b] + 1);
    total += pages_of[b];
  }
  P.num_pages = total + 3;
  P.page_table = testing::interleaved_page_table(rng, pages_of, P.max_pages, P.num_pages);
  P.cache.assign(static_cast<size_t>(P.num_pages) * page_size * W, NAN);
  P.entries.resize(static_cast<size_t>(P.batch));
  for (int b = 0; b < P.batch; ++b) {
    P.entries[b].resize(static_cast<size_t>(P.base[b] + P.count[b]) * W);
    for (float& x : P.entries[b]) x = normal(rng);
  }
  P.scatter();
  testing::list_tokens(rng, P.count, shuffle_tokens, &P.token_request, &P.token_index);
  P.tokens = static_cast<int>(P.token_request.size());
  if (!parents.empty()) {
    P.words = words;
    P.mask = testing::ancestor_mask(P.token_request, P.token_index, parents, words);
  }
  P.q.resize(static_cast<size_t>(P.tokens) * heads * W);
  for (float& x : P.q) x = normal(rng);
  return P;
}

// The rule of params.hpp on the logical entries (no page table), in long double.
std::vector<float> dense_attention(Problem const& P, float scale) {
  int const W = P.width();
  std::vector<float> out(static_cast<size_t>(P.tokens) * P.heads * P.c);
  for (int t = 0; t < P.tokens; ++t) {
    int const b = P.token_request[t], i = P.token_index[t];
    std::vector<float const*> keys;
    for (int u = 0; u < P.base[b]; ++u) keys.push_back(P.entries[b].data() + int64_t{u} * W);
    for (int j = 0; j <= i; ++j) {
      bool const visible =
          P.mask.empty() || ((P.mask[static_cast<size_t>(t * P.words + j / 32)] >> (j % 32)) & 1u);
      if (visible) keys.push_back(P.entries[b].data() + int64_t{P.base[b] + j} * W);
    }
    for (int h = 0; h < P.heads; ++h) {
      float const* q = P.q.data() + (int64_t{t} * P.heads + h) * W;
      std::vector<long double> s(keys.size());
      long double mx = -INFINITY, z = 0;
      for (size_t k = 0; k < keys.size(); ++k) {
        long double d = 0;
        for (int x = 0; x < W; ++x) d += static_cast<long double>(q[x]) * keys[k][x];
        s[k] = scale * d;
        mx = std::max(mx, s[k]);
      }
      for (auto& v : s) z += (v = std::exp(v - mx));
      for (int x = 0; x < P.c; ++x) {
        long double o = 0;
        for (size_t k = 0; k < keys.size(); ++k) o += s[k] * keys[k][x];
        out[static_cast<size_t>((int64_t{t} * P.heads + h) * P.c + x)] =
            keys.empty() ? 0.0f : static_cast<float>(o / z);
      }
    }
  }
  return out;
}

// Largest |a - b| over one (token, head) row divided by the row's largest |b| (at least 1e-3).
double max_row_error(std::vector<float> const& a, std::vector<float> const& b, int c) {
  double worst = 0;
  for (size_t row = 0; row + c <= b.size(); row += c) {
    double scale = 1e-3, err = 0;
    for (int x = 0; x < c; ++x) {
      if (!std::isfinite(a[row + x]) || !std::isfinite(b[row + x])) return INFINITY;
      scale = std::max(scale, std::fabs(static_cast<double>(b[row + x])));
      err = std::max(err, std::fabs(static_cast<double>(a[row + x]) - b[row + x]));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

std::vector<std::vector<int32_t>> chains(int batch, int n) {
  std::vector<int32_t> chain(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) chain[i] = i - 1;
  return std::vector<std::vector<int32_t>>(static_cast<size_t>(batch), chain);
}

}  // namespace

TEST_CASE("mla_attention: two slots, a hand-worked softmax") {
  // c = 4, r = 4, one request: slot 0 cached (row 1), the new token at slot 1 (row 0).
  // q = [2 ln 3, 1, 0, 0 | 1, 0, 0, 0], scale 0.5:
  //   e0 = [1, 0, 2, 0 | 0, 0, 0, 0]   q . e0 = 2 ln 3   s0 = ln 3
  //   e1 = [0, 1, 0, 4 | -1, 0, 0, 0]  q . e1 = 1 - 1    s1 = 0
  // p = (3/4, 1/4); out = 3/4 e0[0:4] + 1/4 e1[0:4] = [0.75, 0.25, 1.5, 1.0].
  float const ln3 = std::log(3.0f);
  std::vector<float> const q{2 * ln3, 1, 0, 0, 1, 0, 0, 0};
  std::vector<float> const cache{0, 1, 0, 4, -1, 0, 0, 0,   // row 0 = slot 1
                                 1, 0, 2, 0, 0, 0, 0, 0};   // row 1 = slot 0
  std::vector<int32_t> const token_request{0}, token_index{0}, base{1}, page_table{1, 0};
  std::vector<float> out(4, -1.0f);
  MlaAttentionParams p;
  p.q = q.data();
  p.cache = cache.data();
  p.token_request = token_request.data();
  p.token_index = token_index.data();
  p.base = base.data();
  p.page_table = page_table.data();
  p.tokens = 1;
  p.heads = 1;
  p.kv_lora_rank = 4;
  p.rope_dim = 4;
  p.batch = 1;
  p.page_size = 1;
  p.max_pages = 2;
  p.num_pages = 2;
  p.max_slots = 2;
  p.scale = 0.5f;
  p.out = out.data();
  REQUIRE(mla_attention(CpuExecutor{}, p).ok());
  CHECK(out[0] == doctest::Approx(0.75).epsilon(1e-6));
  CHECK(out[1] == doctest::Approx(0.25).epsilon(1e-6));
  CHECK(out[2] == doctest::Approx(1.5).epsilon(1e-6));
  CHECK(out[3] == doctest::Approx(1.0).epsilon(1e-6));
  // Under a mask that hides the new token itself only slot 0 remains: out = e0[0:4].
  std::vector<uint32_t> const none{0u};
  p.mask = none.data();
  p.words = 1;
  REQUIRE(mla_attention(CpuExecutor{}, p).ok());
  CHECK(out == std::vector<float>{1, 0, 2, 0});
}

TEST_CASE("mla_attention: the reference equals a dense computation without the page table") {
  testing::Rng rng(7);
  struct Shape { int heads, c, r, page_size; };
  for (Shape const sh : {Shape{1, 16, 8, 1}, Shape{3, 32, 16, 16}, Shape{16, 64, 16, 4},
                         Shape{2, 512, 64, 64}}) {
    CAPTURE(sh.heads);
    CAPTURE(sh.c);
    CAPTURE(sh.page_size);
    // Decode: one new token per request, ragged contexts (1 slot up to ~200).
    Problem decode = make_problem(rng, sh.heads, sh.c, sh.r, sh.page_size, {0, 5, 199, 64, 17},
                                  {1, 1, 1, 1, 1}, {}, 0);
    // Causal prefill: several tokens per request, tokens in shuffled order.
    Problem prefill = make_problem(rng, sh.heads, sh.c, sh.r, sh.page_size, {0, 40, 3},
                                   {6, 3, 11}, {}, 0, /*shuffle_tokens=*/true);
    // Tree verify: random trees of 40 nodes, 2 mask words.
    std::vector<std::vector<int32_t>> trees{testing::random_parents(rng, 40, true),
                                            testing::random_parents(rng, 40, false)};
    Problem verify =
        make_problem(rng, sh.heads, sh.c, sh.r, sh.page_size, {13, 0}, {40, 40}, trees, 2);
    for (Problem* P : {&decode, &prefill, &verify}) {
      for (float scale : {0.125f, 1.0f}) {
        std::vector<float> out;
        REQUIRE(mla_attention(CpuExecutor{}, P->params(&out, scale, 5)).ok());
        CHECK(max_row_error(out, dense_attention(*P, scale), P->c) < 1e-6);
      }
    }
  }
}

TEST_CASE("mla_attention: a tree token sees its prefix and its ancestors only") {
  testing::Rng rng(11);
  // parents [-1, 0, 0, 1, 2]: rows {0}, {0,1}, {0,2}, {0,1,3}, {0,2,4}.
  std::vector<std::vector<int32_t>> const tree{{-1, 0, 0, 1, 2}};
  Problem P = make_problem(rng, 2, 16, 8, 4, {3}, {5}, tree, 2);
  CHECK(P.mask == std::vector<uint32_t>{1, 0, 3, 0, 5, 0, 11, 0, 21, 0});
  std::vector<float> before, after;
  REQUIRE(mla_attention(CpuExecutor{}, P.params(&before, 0.3f)).ok());
  CHECK(max_row_error(before, dense_attention(P, 0.3f), P.c) < 1e-6);
  // Node 1's entry: seen by tokens 1 and 3 only.
  int const W = P.width(), row = P.heads * P.c;
  for (int x = 0; x < W; ++x) P.entries[0][static_cast<size_t>((3 + 1) * W + x)] += 0.5f;
  P.scatter();
  REQUIRE(mla_attention(CpuExecutor{}, P.params(&after, 0.3f)).ok());
  for (int t = 0; t < 5; ++t) {
    CAPTURE(t);
    bool const same = std::equal(before.begin() + t * row, before.begin() + (t + 1) * row,
                                 after.begin() + t * row);
    CHECK(same == (t != 1 && t != 3));
  }
}

TEST_CASE("mla_attention: causal, a new token never sees the ones after it") {
  testing::Rng rng(12);
  Problem P = make_problem(rng, 3, 32, 16, 16, {2}, {4}, {}, 0);
  std::vector<float> before, after;
  REQUIRE(mla_attention(CpuExecutor{}, P.params(&before, 0.2f)).ok());
  CHECK(max_row_error(before, dense_attention(P, 0.2f), P.c) < 1e-6);
  // The same problem as a chain mask gives the same answer.
  Problem chain = P;
  chain.words = 1;
  chain.mask = {1, 3, 7, 15};
  std::vector<float> masked;
  REQUIRE(mla_attention(CpuExecutor{}, chain.params(&masked, 0.2f)).ok());
  CHECK(masked == before);
  // New token 2 (slot 4): seen by tokens 2 and 3.
  int const W = P.width(), row = P.heads * P.c;
  for (int x = 0; x < W; ++x) P.entries[0][static_cast<size_t>(4 * W + x)] *= -1.0f;
  P.scatter();
  REQUIRE(mla_attention(CpuExecutor{}, P.params(&after, 0.2f)).ok());
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    bool const same = std::equal(before.begin() + t * row, before.begin() + (t + 1) * row,
                                 after.begin() + t * row);
    CHECK(same == (t < 2));
  }
}

TEST_CASE("mla_attention: a token with no visible slot gets zeros") {
  testing::Rng rng(13);
  Problem P = make_problem(rng, 2, 16, 8, 1, {0, 4}, {2, 1}, chains(2, 2), 1);
  P.mask[0] = 0;  // token 0 (request 0, new token 0, nothing cached) hides itself
  std::vector<float> out;
  REQUIRE(mla_attention(CpuExecutor{}, P.params(&out, 1.0f)).ok());
  int const row = P.heads * P.c;
  CHECK(std::all_of(out.begin(), out.begin() + row, [](float x) { return x == 0.0f; }));
  CHECK(max_row_error(out, dense_attention(P, 1.0f), P.c) < 1e-6);
}

TEST_CASE("mla_attention: shape refusals name the field and the numbers") {
  testing::Rng rng(14);
  Problem P = make_problem(rng, 2, 16, 8, 4, {3, 0}, {2, 1}, {}, 0);
  std::vector<float> out;
  MlaAttentionParams const good = P.params(&out, 1.0f);
  REQUIRE(mla_attention(CpuExecutor{}, good).ok());
  auto refused = [&](auto edit, std::vector<std::string> const& parts) {
    MlaAttentionParams p = good;
    edit(p);
    testing::check_error(mla_attention(CpuExecutor{}, p), StatusCode::kInvalidArgument, parts);
  };
  refused([](MlaAttentionParams& p) { p.tokens = -1; }, {"tokens -1 < 0"});
  refused([](MlaAttentionParams& p) { p.heads = 0; }, {"heads 0 < 1"});
  refused([](MlaAttentionParams& p) { p.kv_lora_rank = 0; }, {"kv_lora_rank (c) 0 < 1"});
  refused([](MlaAttentionParams& p) { p.rope_dim = -4; }, {"rope_dim (r) -4 < 0"});
  refused([](MlaAttentionParams& p) { p.rope_dim = 6; }, {"rope_dim (r) 6", "multiples of 4"});
  refused([](MlaAttentionParams& p) { p.kv_lora_rank = 514; }, {"kv_lora_rank (c) 514", "multiples of 4"});
  refused([](MlaAttentionParams& p) { p.kv_lora_rank = 1024; }, {"kv_lora_rank (c) 1024 > 512"});
  refused([](MlaAttentionParams& p) { p.kv_lora_rank = 512; p.rope_dim = 132; },
          {"c + r = 644 > 640"});
  refused([](MlaAttentionParams& p) { p.page_size = 0; }, {"page_size 0 < 1"});
  refused([](MlaAttentionParams& p) { p.max_pages = 0; }, {"max_pages 0 < 1"});
  refused([](MlaAttentionParams& p) { p.num_pages = 0; }, {"num_pages 0 < 1"});
  refused([](MlaAttentionParams& p) { p.max_slots = 0; }, {"max_slots 0 < 1"});
  refused([](MlaAttentionParams& p) { p.scale = INFINITY; }, {"scale is not finite"});
  refused([](MlaAttentionParams& p) { p.batch = 0; }, {"batch 0 < 1 with 3 tokens"});
  std::vector<uint32_t> rows(3, 1u);
  refused([&](MlaAttentionParams& p) { p.mask = rows.data(); p.words = 0; }, {"words 0 < 1"});
  refused([](MlaAttentionParams& p) { p.q = nullptr; }, {"q is null"});
  refused([](MlaAttentionParams& p) { p.cache = nullptr; }, {"cache is null"});
  refused([](MlaAttentionParams& p) { p.token_request = nullptr; }, {"token_request is null"});
  refused([](MlaAttentionParams& p) { p.token_index = nullptr; }, {"token_index is null"});
  refused([](MlaAttentionParams& p) { p.base = nullptr; }, {"base is null"});
  refused([](MlaAttentionParams& p) { p.page_table = nullptr; }, {"page_table is null"});
  refused([](MlaAttentionParams& p) { p.out = nullptr; }, {"out is null"});
  // No tokens: nothing to read, null pointers are fine.
  MlaAttentionParams empty = good;
  empty.tokens = 0;
  empty.q = nullptr;
  empty.out = nullptr;
  CHECK(mla_attention(CpuExecutor{}, empty).ok());
  // The CUDA path's workspace and alignment (checked on the host, so testable here).
  MlaAttentionParams cuda = good;
  cuda.max_slots = 5000;  // 88 chunks of a token's slots: a workspace is needed
  CHECK(mla_attention_workspace_bytes(3, 2, 16, 5000) == size_t{3} * 88 * 16 * 18 * sizeof(float));
  testing::check_error(validate_cuda(cuda), StatusCode::kInvalidArgument,
                       {"workspace of 0 bytes <", "mla_attention_workspace_bytes"});
  alignas(16) static float ws[1 << 17];
  cuda.workspace = ws;
  cuda.workspace_bytes = sizeof(ws);
  CHECK(validate_cuda(cuda).ok());
  cuda.workspace = ws + 1;
  testing::check_error(validate_cuda(cuda), StatusCode::kInvalidArgument,
                       {"workspace is not 16-byte aligned"});
  cuda.workspace = ws;
  cuda.q = ws + 2;
  testing::check_error(validate_cuda(cuda), StatusCode::kInvalidArgument, {"16-byte aligned"});
}

TEST_CASE("mla_attention: the reference refuses data outside the contract and writes nothing") {
  testing::Rng rng(15);
  Problem P = make_problem(rng, 2, 16, 8, 4, {5, 0}, {3, 2}, chains(2, 3), 2);
  std::vector<float> out;
  auto refused = [&](auto edit, std::vector<std::string> const& parts) {
    Problem bad = P;
    MlaAttentionParams p = bad.params(&out, 1.0f);
    edit(bad, p);
    testing::check_error(mla_attention(CpuExecutor{}, p), StatusCode::kInvalidArgument, parts);
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == -7.0f; }));
  };
  refused([](Problem& b, MlaAttentionParams&) { b.token_request[4] = 2; },
          {"token_request[4] = 2 not in [0, batch 2)"});
  refused([](Problem& b, MlaAttentionParams&) { b.token_index[1] = -1; },
          {"token_index[1] = -1 < 0"});
  refused([](Problem& b, MlaAttentionParams&) { b.base[1] = -3; }, {"base[1] = -3 < 0"});
  refused([](Problem&, MlaAttentionParams& p) { p.max_slots = 7; },
          {"token 2 (request 0, new token 2)", "5 + i + 1 = 8", "> max_slots 7"});
  refused([](Problem& b, MlaAttentionParams&) { b.mask[2] |= 1u << 5; },
          {"mask row of token 1 (new token 1) has bit 5 set"});
  refused([](Problem& b, MlaAttentionParams&) { b.mask[3] = 1u << 31; },
          {"mask row of token 1 (new token 1) has bit 63 set"});
  refused([](Problem& b, MlaAttentionParams& p) {
    b.token_index[0] = 40;
    p.words = 1;
    p.max_slots = 100;
  },
          {"new token 40 but mask rows have 1 words (32 bits)"});
  refused([](Problem& b, MlaAttentionParams&) { b.page_table[1] = -1; },
          {"page_table[0][1] = -1 not in [0, num_pages", "slot 4, read by token 0"});
  refused([&](Problem& b, MlaAttentionParams&) { b.page_table[0] = P.num_pages; },
          {"page_table[0][0] = " + std::to_string(P.num_pages) + " not in [0, num_pages"});
  refused([](Problem&, MlaAttentionParams& p) { p.max_pages = 1; },
          {"token 0 reads slot 4 of request 0: page index 1 >= max_pages 1"});
}

TEST_CASE("mla_attention: the CUDA plan and its workspace") {
  // Kimi decode, batch 1: 4 groups of 16 heads, each token split into 66 chunks.
  MlaAttentionPlan plan = mla_attention_plan(1, 64, 131072);
  CHECK(plan.group == 16);
  CHECK(plan.groups == 4);
  CHECK(plan.chunks == 66);
  // Verify of 4 tokens at context ~1024 (max_slots 1280: 40 tiles): 17 chunks of 3 tiles (272
  // blocks, rounded up); at context ~8192, long chunks: 16 (256 blocks, rounded down). Of 16
  // tokens: 4 (rounded down from 5 chunks of 8 tiles); of 64: no split (from 2).
  CHECK(mla_attention_plan(4, 64, 1280).chunks == 17);
  CHECK(mla_attention_plan(4, 64, 8448).chunks == 16);
  CHECK(mla_attention_plan(16, 64, 1280).chunks == 4);
  CHECK(mla_attention_plan(64, 64, 1280).chunks == 1);
  // Short max_slots: never more chunks than tiles.
  CHECK(mla_attention_plan(1, 64, 40).chunks == 2);
  // TP-sharded heads: one group of 16, padded.
  plan = mla_attention_plan(8, 8, 4096);
  CHECK(plan.group == 16);
  CHECK(plan.groups == 1);
  CHECK(plan.chunks == 33);
  // Enough blocks without a split: no workspace.
  CHECK(mla_attention_plan(66, 64, 131072).chunks == 1);
  CHECK(mla_attention_workspace_bytes(66, 64, 512, 131072) == 0);
  CHECK(mla_attention_workspace_bytes(1, 64, 512, 131072) ==
        size_t{1} * 4 * 66 * 16 * 514 * sizeof(float));
  // The bound holds for every shape.
  for (int tokens : {1, 2, 3, 5, 7, 16, 33, 64, 65, 100, 263, 264, 1000}) {
    for (int heads : {1, 3, 8, 9, 16, 17, 64, 128}) {
      for (int max_slots : {1, 31, 33, 1000, 5000, 131072}) {
        CHECK(mla_attention_workspace_bytes(tokens, heads, 512, max_slots) <=
              mla_attention_workspace_bound_bytes(512));
        MlaAttentionPlan const pl = mla_attention_plan(tokens, heads, max_slots);
        CHECK(pl.chunks >= 1);
        // Past the target only unsplit or with short chunks.
        int64_t const tiles = ceil_div<int64_t>(max_slots, kMlaAttentionTile);
        int64_t const blocks = int64_t{tokens} * pl.groups * pl.chunks;
        CHECK((pl.chunks == 1 || blocks <= kMlaAttentionTargetBlocks ||
               ceil_div<int64_t>(tiles, pl.chunks) < kMlaAttentionLongChunkTiles));
        CHECK(int64_t{pl.chunks} * kMlaAttentionTile < int64_t{max_slots} + kMlaAttentionTile);
      }
    }
  }
}
