// The CPU executor's cached Kimi forward (model/kimi/forward_cpu.hpp) over the paged MLA latent
// cache (model/kimi/mla_cache.hpp), against the plain-loop reference (forward_reference.hpp) on
// the tiny random preset (bf16 and INT4 experts; n_group 2, YaRN): prefill; prefill then decode
// one token at a time; a batch of requests with 4-slot pages that interleave; tree verify of
// random trees after a prefix (every node against the reference on prefix + its path), then
// decoding an accepted path and kv_commit + commit + decode; aux capture of {-1, 1, 3}; the
// cache's page bookkeeping; every error by message.
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/forward_reference.hpp"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "specdec/ops/tree_build/tree_build.hpp"
#include "support/kimi_model.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

namespace kimi = specdec::model::kimi;
using kimi::KimiCpuModel;
using kimi::MlaCache;
using kimi::RequestId;
using specdec::CpuExecutor;
using specdec::Status;
using specdec::StatusCode;
using specdec::testing::load_tiny_kimi;
using specdec::testing::MaxDiff;
using specdec::testing::random_tokens;
using specdec::testing::Rng;
using specdec::testing::TempDir;
using specdec::testing::TinyKimi;
using specdec::testing::Tree;

// Tolerance, relative to the largest |value| of the reference rows compared:
// max |cpu - reference| / max |reference|. Both sides compute in fp32 from the same fp32 weights;
// the reference accumulates dot products in double, the CPU executor in float (Eigen) and through
// weight absorption (q_nope W_UK^T c instead of q_nope (W_UK c), W_UV (sum p c) instead of
// sum p (W_UV c)): float rounding only. Observed maxima in this file (bf16 and INT4): logits
// 1.1e-6 (verify), aux hidden states 8e-7; a sweep of 30 seeds x bf16 / INT4 over 40-token
// prefills: 1.4e-6, with no routing decision flipped. Bound: 1e-5, about 7x the worst seen. A
// causal mask off by one, the tree mask ignored, verify positions = slots instead of depths, the
// softmax scale without mscale^2, or W_UK rows used as W_UV each broke it when put in on purpose.
constexpr double kTol = 1e-5;

struct Model {
  TempDir tmp;
  TinyKimi m;
  KimiCpuModel cpu;
  Model(bool int4, uint64_t seed) {
    load_tiny_kimi(tmp.path / (int4 ? "int4" : "bf16"), int4, seed, &m);
    Status const s = kimi::load_kimi_cpu_model(m.weights, m.config, &cpu);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }
  int64_t V() const { return m.config.vocab_size; }
  int64_t H() const { return m.config.hidden_size; }
};

MlaCache make_cache(Model const& md, int page_size, int num_pages, int max_pages) {
  MlaCache c;
  Status const s = MlaCache::create_for(md.m.config, page_size, num_pages, max_pages, &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return c;
}

void reference(Model const& md, std::vector<int32_t> const& tokens, std::vector<int> const& ids,
               std::vector<float>* logits, std::vector<float>* aux) {
  Status const s =
      kimi::kimi_forward_reference(md.m.weights, md.m.config, tokens, 0, ids, logits, aux);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
}

// Observed maxima over the whole file (reported by the last test case).
MaxDiff g_logits, g_aux;

void expect_close(MaxDiff const& d, std::string const& what) {
  CHECK_MESSAGE(d.rel() <= kTol, what, ": max |diff| ", d.abs, " over max |ref| ", d.ref, " = ",
                d.rel());
  CHECK(d.ref > 0.0);
}

// Compares `rows` rows of width n: got row gr + k against want row wr + k.
void compare_rows(std::vector<float> const& got, int64_t gr, std::vector<float> const& want,
                  int64_t wr, int64_t rows, int64_t n, MaxDiff* d, MaxDiff* global) {
  REQUIRE(int64_t(got.size()) >= (gr + rows) * n);
  REQUIRE(int64_t(want.size()) >= (wr + rows) * n);
  d->add(got.data() + gr * n, want.data() + wr * n, rows * n);
  global->add(got.data() + gr * n, want.data() + wr * n, rows * n);
}

using specdec::testing::check_error;
using specdec::testing::contains;

int64_t length_of(MlaCache const& c, RequestId id) {
  int64_t n = -1;
  Status const s = c.length(id, &n);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return n;
}

std::vector<int32_t> pages_of(MlaCache const& c, RequestId id) {
  std::span<int32_t const> p;
  Status const s = c.pages(id, &p);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  return {p.begin(), p.end()};
}


std::vector<int> const kAux{specdec::kEmbedding, 1, 3};

}  // namespace

TEST_CASE("kimi_forward_cpu: MlaCache over entries the caller owns (create_external)") {
  // 2 layers, entries 6 + 4 = 10 floats, 6 pages of 4 slots: 480 floats.
  int64_t const need = MlaCache::floats_needed(2, 6, 4, 4, 6);
  CHECK(need == 2 * 6 * 4 * 10);
  std::vector<float> owned(size_t(need) + 3, 0.0f);
  MlaCache c;
  check_error(MlaCache::create_external(nullptr, need, 2, 6, 4, 4, 6, 3, &c),
              StatusCode::kInvalidArgument, {"entries is null"});
  check_error(MlaCache::create_external(owned.data(), need - 1, 2, 6, 4, 4, 6, 3, &c),
              StatusCode::kInvalidArgument, {"479 floats given", "needs 480"});
  check_error(MlaCache::create_external(owned.data(), need, 2, 6, 4, 0, 6, 3, &c),
              StatusCode::kInvalidArgument, {"page_size 0"});
  REQUIRE(MlaCache::create_external(owned.data(), need, 2, 6, 4, 4, 6, 3, &c).ok());
  CHECK(c.external());
  CHECK(c.entries() == owned.data());
  CHECK(c.layer(1) == owned.data() + c.layer_stride());
  // Copies share the entries; the bookkeeping is the host cache's.
  MlaCache const copy = c;
  CHECK(copy.entries() == owned.data());
  REQUIRE(c.add_request(1).ok());
  REQUIRE(c.append(1, 5).ok());
  int64_t row = -1;
  REQUIRE(c.row(1, 4, &row).ok());
  CHECK(row == 4);  // pages 0, 1: slot 4 is page 1's first row
  std::vector<int32_t> table, prefix;
  specdec::ops::KvCommitParams kp;
  std::vector<RequestId> const ids{1};
  REQUIRE(c.kv_commit_params(ids, &table, &prefix, &kp).ok());
  CHECK(kp.cache == static_cast<void*>(owned.data()));
  MlaCache host;
  REQUIRE(MlaCache::create(2, 6, 4, 4, 6, 3, &host).ok());
  CHECK_FALSE(host.external());
}

TEST_CASE("kimi_forward_cpu: MlaCache pages, lengths and errors") {
  MlaCache c;
  // 2 layers, entries 6 + 4 = 10 floats, 6 pages of 4 slots, at most 3 pages per request.
  REQUIRE(MlaCache::create(2, 6, 4, 4, 6, 3, &c).ok());
  CHECK(c.width() == 10);
  CHECK(c.layer_stride() == 6 * 4 * 10);
  CHECK(c.layer(1) - c.layer(0) == c.layer_stride());
  CHECK(c.free_pages() == 6);
  REQUIRE(c.add_request(7).ok());
  REQUIRE(c.add_request(9).ok());
  check_error(c.add_request(7), StatusCode::kInvalidArgument, {"request 7 already exists"});

  // Requests growing in turn interleave their pages, lowest free page first.
  REQUIRE(c.append(7, 3).ok());  // page 0
  REQUIRE(c.append(9, 5).ok());  // pages 1, 2
  REQUIRE(c.append(7, 2).ok());  // length 5: page 3
  CHECK(pages_of(c, 7) == std::vector<int32_t>{0, 3});
  CHECK(pages_of(c, 9) == std::vector<int32_t>{1, 2});
  CHECK(length_of(c, 7) == 5);
  CHECK(c.free_pages() == 2);
  int64_t row = -1;
  REQUIRE(c.row(7, 6, &row).ok());
  CHECK(row == 3 * 4 + 2);  // slot 6 = page_table[1] * 4 + 2
  check_error(c.row(7, 8, &row), StatusCode::kInvalidArgument,
              {"slot 8 of request 7", "2 page(s) (8 slots)"});

  // Out of pages: nothing changes. Past max_pages_per_request: also refused.
  std::vector<RequestId> ids{7, 9};
  std::vector<int64_t> slots{12, 12};  // 7: +1 page, 9: +1 page -> 2 of 2 free: fits
  std::vector<int64_t> too_many{12, 13};
  check_error(c.reserve(ids, too_many), StatusCode::kInvalidArgument,
              {"request 9 needs 13 slots", "max_pages_per_request 3"});
  REQUIRE(c.add_request(11).ok());
  REQUIRE(c.append(11, 1).ok());  // page 4, 1 free left
  check_error(c.reserve(ids, slots), StatusCode::kInvalidArgument,
              {"out of pages", "2 more page(s)", "1 of 6 free"});
  CHECK(pages_of(c, 7) == std::vector<int32_t>{0, 3});
  CHECK(pages_of(c, 9) == std::vector<int32_t>{1, 2});
  CHECK(c.free_pages() == 1);

  // Stage / commit / truncate.
  REQUIRE(c.reserve(7, 8).ok());
  REQUIRE(c.stage(7, 3).ok());  // slots 5..7
  check_error(c.stage(7, 4), StatusCode::kInvalidArgument, {"slots [5, 9)", "8 reserved"});
  check_error(c.commit(7, 9), StatusCode::kInvalidArgument,
              {"new length 9", "[length 5, length + staged 8]"});
  check_error(c.commit(7, 4), StatusCode::kInvalidArgument, {"new length 4"});
  REQUIRE(c.commit(7, 7).ok());
  CHECK(length_of(c, 7) == 7);
  check_error(c.commit(7, 8), StatusCode::kInvalidArgument, {"length + staged 7"});  // dropped
  check_error(c.truncate(7, 8), StatusCode::kInvalidArgument, {"new length 8", "[0, length 7]"});
  REQUIRE(c.truncate(7, 4).ok());  // page 3 back
  CHECK(pages_of(c, 7) == std::vector<int32_t>{0});
  CHECK(c.free_pages() == 2);
  REQUIRE(c.free_request(9).ok());
  CHECK(c.free_pages() == 4);
  CHECK(!c.has_request(9));
  REQUIRE(c.add_request(12).ok());
  REQUIRE(c.append(12, 5).ok());  // the lowest free pages: 1, 2
  CHECK(pages_of(c, 12) == std::vector<int32_t>{1, 2});

  // kv_commit parameters describe exactly this layout.
  std::vector<int32_t> table, prefix;
  specdec::ops::KvCommitParams p;
  std::vector<RequestId> two{12, 7};
  REQUIRE(c.kv_commit_params(two, &table, &prefix, &p).ok());
  CHECK(p.layout == specdec::ops::KvLayout::kPaged);
  CHECK(p.layer_stride_bytes == c.layer_stride() * 4);
  CHECK(p.width == 10);
  CHECK(p.elem_bytes == 4);
  CHECK(p.num_layers == 2);
  CHECK(p.page_size == 4);
  CHECK(p.num_pages == 6);
  CHECK(table == std::vector<int32_t>{1, 2, -1, 0, -1, -1});
  CHECK(prefix == std::vector<int32_t>{5, 4});
  CHECK(specdec::ops::kv_commit_slot_row(p, 0, 5) == 2 * 4 + 1);

  // Unknown requests and bad arguments.
  int64_t n = 0;
  check_error(c.length(42, &n), StatusCode::kInvalidArgument, {"unknown request 42"});
  check_error(c.free_request(42), StatusCode::kInvalidArgument,
              {"free_request", "unknown request 42"});
  check_error(c.append(42, 1), StatusCode::kInvalidArgument, {"unknown request 42"});
  check_error(c.truncate(42, 0), StatusCode::kInvalidArgument, {"unknown request 42"});
  std::vector<RequestId> dup{7, 7};
  std::vector<int64_t> dup_slots{4, 4};
  check_error(c.reserve(dup, dup_slots), StatusCode::kInvalidArgument, {"request 7 listed twice"});
  check_error(MlaCache::create(2, 6, 3, 4, 6, 3, &c), StatusCode::kInvalidArgument, {"rope_dim 3"});
  check_error(MlaCache::create(2, 6, 4, 4, 6, 7, &c), StatusCode::kInvalidArgument,
              {"max_pages_per_request 7", "num_pages 6"});
  check_error(MlaCache::create(0, 6, 4, 4, 6, 3, &c), StatusCode::kInvalidArgument,
              {"num_layers 0"});
}

TEST_CASE("kimi_forward_cpu: MlaCache's padding page is taken once and held by no request") {
  MlaCache c;
  REQUIRE(MlaCache::create(2, 6, 4, 4, 3, 2, &c).ok());  // 3 pages of 4 slots
  REQUIRE(c.add_request(1).ok());
  REQUIRE(c.append(1, 4).ok());  // page 0
  int32_t page = -1, again = -1;
  REQUIRE(c.padding_page(&page).ok());
  CHECK(page == 1);  // the lowest free page
  CHECK(c.free_pages() == 1);
  REQUIRE(c.padding_page(&again).ok());
  CHECK(again == page);
  CHECK(c.free_pages() == 1);
  REQUIRE(c.free_request(1).ok());  // page 0 back; the padding page stays out
  CHECK(c.free_pages() == 2);
  REQUIRE(c.add_request(2).ok());
  REQUIRE(c.append(2, 8).ok());
  CHECK(pages_of(c, 2) == std::vector<int32_t>{0, 2});
  MlaCache full;
  REQUIRE(MlaCache::create(2, 6, 4, 4, 1, 1, &full).ok());
  REQUIRE(full.add_request(1).ok());
  REQUIRE(full.append(1, 1).ok());
  check_error(full.padding_page(&page), StatusCode::kInvalidArgument,
              {"out of pages", "filler rows", "all 1 are held"});
}

TEST_CASE("kimi_forward_cpu: prefill equals the reference, logits and aux {-1, 1, 3}") {
  for (bool int4 : {false, true}) {
    CAPTURE(int4);
    Model md(int4, 3);
    MESSAGE("fp32 weight cache: ", md.cpu.num_floats(), " floats = ", md.cpu.num_floats() * 4,
            " bytes");
    Rng rng(17);
    std::vector<int32_t> const tokens = random_tokens(rng, 12, int(md.V()));
    MlaCache cache = make_cache(md, 4, 16, 8);
    REQUIRE(cache.add_request(5).ok());
    std::vector<RequestId> const ids{5};
    std::vector<int32_t> const counts{12};
    std::vector<float> logits, aux, want_logits, want_aux;
    Status const s =
        kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, ids, counts, tokens, kAux, &logits, &aux);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    CHECK(length_of(cache, 5) == 12);
    reference(md, tokens, kAux, &want_logits, &want_aux);
    REQUIRE(logits.size() == want_logits.size());
    REQUIRE(aux.size() == want_aux.size());
    MaxDiff dl, da;
    compare_rows(logits, 0, want_logits, 0, 12, md.V(), &dl, &g_logits);
    compare_rows(aux, 0, want_aux, 0, 12, 3 * md.H(), &da, &g_aux);
    expect_close(dl, "prefill logits");
    expect_close(da, "prefill aux");
    // The embedding pseudo-layer is the bf16 rows themselves on both sides.
    for (int64_t t = 0; t < 12; ++t) {
      CHECK(std::equal(aux.begin() + t * 3 * md.H(), aux.begin() + (t * 3 + 1) * md.H(),
                       want_aux.begin() + t * 3 * md.H()));
    }
  }
}

TEST_CASE("kimi_forward_cpu: prefill 10 then decode 6, each decode = the reference's last row") {
  for (bool int4 : {false, true}) {
    CAPTURE(int4);
    Model md(int4, 7);
    Rng rng(23);
    std::vector<int32_t> const tokens = random_tokens(rng, 16, int(md.V()));
    MlaCache cache = make_cache(md, 4, 8, 8);
    REQUIRE(cache.add_request(1).ok());
    std::vector<RequestId> const ids{1};
    std::vector<int32_t> const counts{10};
    std::vector<int> const order{3, specdec::kEmbedding, 1};  // any order, kept as listed
    std::vector<float> logits, aux, want_logits, want_aux;
    REQUIRE(kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, ids, counts,
                               std::span(tokens.data(), 10), order, &logits, &aux)
                .ok());
    MaxDiff dl, da;
    for (int t = 10; t < 16; ++t) {
      CAPTURE(t);
      std::vector<int32_t> const one{tokens[t]};
      Status const s =
          kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, ids, one, order, &logits, &aux);
      REQUIRE_MESSAGE(s.ok(), s.to_string());
      CHECK(length_of(cache, 1) == t + 1);
      reference(md, {tokens.begin(), tokens.begin() + t + 1}, order, &want_logits, &want_aux);
      compare_rows(logits, 0, want_logits, t, 1, md.V(), &dl, &g_logits);
      compare_rows(aux, 0, want_aux, t, 1, 3 * md.H(), &da, &g_aux);
    }
    expect_close(dl, "decode logits");
    expect_close(da, "decode aux");
    CHECK(pages_of(cache, 1).size() == 4);  // 16 slots
  }
}

TEST_CASE("kimi_forward_cpu: a batch of three requests on interleaved 4-slot pages") {
  Model md(false, 11);
  Rng rng(5);
  int const V = int(md.V());
  MlaCache cache = make_cache(md, 4, 16, 6);
  std::vector<RequestId> const ids{10, 11, 12};
  std::vector<std::vector<int32_t>> seq{random_tokens(rng, 5, V), random_tokens(rng, 9, V),
                                        random_tokens(rng, 2, V)};
  for (RequestId id : ids) REQUIRE(cache.add_request(id).ok());
  std::vector<int32_t> flat, counts;
  for (auto const& s : seq) {
    flat.insert(flat.end(), s.begin(), s.end());
    counts.push_back(int32_t(s.size()));
  }
  std::vector<float> logits, aux, want, want_aux;
  REQUIRE(kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, ids, counts, flat, kAux, &logits, &aux)
              .ok());
  MaxDiff dl, da;
  int64_t row = 0;
  for (size_t b = 0; b < 3; ++b) {
    int64_t const n = int64_t(seq[b].size());
    reference(md, seq[b], kAux, &want, &want_aux);
    compare_rows(logits, row, want, 0, n, md.V(), &dl, &g_logits);
    compare_rows(aux, row, want_aux, 0, n, 3 * md.H(), &da, &g_aux);
    row += n;
  }
  // Six decode steps for all three: each crosses at least one page boundary.
  for (int step = 0; step < 6; ++step) {
    std::vector<int32_t> next = random_tokens(rng, 3, V);
    REQUIRE(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, ids, next, kAux, &logits, &aux).ok());
    for (size_t b = 0; b < 3; ++b) {
      seq[b].push_back(next[b]);
      reference(md, seq[b], kAux, &want, &want_aux);
      int64_t const last = int64_t(seq[b].size()) - 1;
      compare_rows(logits, int64_t(b), want, last, 1, md.V(), &dl, &g_logits);
      compare_rows(aux, int64_t(b), want_aux, last, 1, 3 * md.H(), &da, &g_aux);
    }
  }
  // The pages really interleave between the requests.
  std::vector<int32_t> const p10 = pages_of(cache, 10), p11 = pages_of(cache, 11),
                             p12 = pages_of(cache, 12);
  // Prefill took 10: {0, 1}, 11: {2, 3, 4}, 12: {5}; the decodes crossed page boundaries in turn
  // (12 at slot 4, 10 at slot 8, 11 at slot 12).
  CHECK(p10 == std::vector<int32_t>{0, 1, 7});
  CHECK(p11 == std::vector<int32_t>{2, 3, 4, 8});
  CHECK(p12 == std::vector<int32_t>{5, 6});

  // Free request 11; a new request 13 reuses its pages; results unaffected by page identity.
  REQUIRE(cache.free_request(11).ok());
  REQUIRE(cache.add_request(13).ok());
  std::vector<int32_t> const s13 = random_tokens(rng, 11, V);
  std::vector<RequestId> const id13{13};
  std::vector<int32_t> const c13{11};
  REQUIRE(
      kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, id13, c13, s13, kAux, &logits, &aux).ok());
  CHECK(pages_of(cache, 13) == std::vector<int32_t>{2, 3, 4});
  reference(md, s13, kAux, &want, &want_aux);
  compare_rows(logits, 0, want, 0, 11, md.V(), &dl, &g_logits);

  // Truncate request 10 back to 4 tokens (page 5 returns) and continue with another token.
  REQUIRE(cache.truncate(10, 4).ok());
  CHECK(pages_of(cache, 10) == std::vector<int32_t>{0});
  std::vector<int32_t> cont(seq[0].begin(), seq[0].begin() + 4);
  cont.push_back((seq[0][4] + 1) % V);
  std::vector<RequestId> const id10{10};
  std::vector<int32_t> const t10{cont.back()};
  REQUIRE(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, id10, t10, kAux, &logits, &aux).ok());
  reference(md, cont, kAux, &want, &want_aux);
  compare_rows(logits, 0, want, 4, 1, md.V(), &dl, &g_logits);
  compare_rows(aux, 0, want_aux, 4, 1, 3 * md.H(), &da, &g_aux);
  expect_close(dl, "batched logits");
  expect_close(da, "batched aux");
}

TEST_CASE("kimi_forward_cpu: tree verify of random trees, then decode / kv_commit + commit") {
  for (bool int4 : {false, true}) {
    CAPTURE(int4);
    Model md(int4, int4 ? 13 : 2);
    Rng rng(int4 ? 101 : 202);
    int const V = int(md.V());
    std::uniform_int_distribution<int> pick_n(8, 16);
    int const N = pick_n(rng);
    CAPTURE(N);
    MlaCache cache = make_cache(md, 4, 32, 8);
    std::vector<RequestId> const ids{0, 1};
    std::vector<std::vector<int32_t>> prefix{random_tokens(rng, 7, V), random_tokens(rng, 5, V)};
    for (RequestId id : ids) REQUIRE(cache.add_request(id).ok());
    std::vector<int32_t> flat = prefix[0];
    flat.insert(flat.end(), prefix[1].begin(), prefix[1].end());
    std::vector<int32_t> const counts{7, 5};
    std::vector<float> logits, aux, want, want_aux;
    REQUIRE(
        kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, ids, counts, flat, {}, &logits, nullptr)
            .ok());
    // Request 0 a deep tree, request 1 a bushy one.
    std::vector<int32_t> parents = specdec::testing::random_parents(rng, N, true);
    std::vector<int32_t> const bushy = specdec::testing::random_parents(rng, N, false);
    parents.insert(parents.end(), bushy.begin(), bushy.end());
    Tree tree;
    tree.build(parents, {7, 5}, N);
    std::vector<int32_t> const node_tokens = random_tokens(rng, 2 * N, V);
    std::vector<float> vlogits, vaux;
    Status const s = kimi::kimi_verify(CpuExecutor{}, md.cpu, &cache, ids, N, node_tokens,
                                       tree.positions, tree.mask, kAux, &vlogits, &vaux);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    REQUIRE(vlogits.size() == size_t(2 * N * V));
    CHECK(length_of(cache, 0) == 7);  // not advanced
    CHECK(length_of(cache, 1) == 5);
    MaxDiff dl, da;
    for (int b = 0; b < 2; ++b) {
      for (int i = 0; i < N; ++i) {
        std::vector<int32_t> seq = prefix[b];
        for (int k : tree.path(b, i)) seq.push_back(node_tokens[size_t(b) * N + k]);
        reference(md, seq, kAux, &want, &want_aux);
        int64_t const last = int64_t(seq.size()) - 1;
        compare_rows(vlogits, int64_t(b) * N + i, want, last, 1, md.V(), &dl, &g_logits);
        compare_rows(vaux, int64_t(b) * N + i, want_aux, last, 1, 3 * md.H(), &da, &g_aux);
      }
    }
    expect_close(dl, "verify logits");
    expect_close(da, "verify aux");

    // The deepest node of each tree: its path is the "accepted" one.
    auto deepest = [&](int b) {
      int best = 0;
      for (int i = 0; i < N; ++i) {
        if (tree.depth[size_t(b) * N + i] > tree.depth[size_t(b) * N + best]) best = i;
      }
      return best;
    };

    // Request 0: drop the staged tree and decode its accepted path one token at a time: each
    // decode reproduces the verify row of that node.
    std::vector<int> const path0 = tree.path(0, deepest(0));
    REQUIRE(path0.size() >= 3);
    REQUIRE(cache.truncate(0, 7).ok());
    MaxDiff dd;
    std::vector<RequestId> const id0{0};
    for (int k : path0) {
      std::vector<int32_t> const one{node_tokens[size_t(k)]};
      REQUIRE(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, id0, one, kAux, &logits, &aux).ok());
      compare_rows(logits, 0, vlogits, k, 1, md.V(), &dd, &g_logits);
      compare_rows(aux, 0, vaux, k, 1, 3 * md.H(), &dd, &g_aux);
    }
    expect_close(dd, "decode of the accepted path vs verify rows");
    CHECK(length_of(cache, 0) == 7 + int64_t(path0.size()));

    // Request 1: kv_commit moves the accepted entries (slot 5 + node) to slots 5 + k; commit the
    // new length; a decode of the bonus token then equals the reference on prefix + path + bonus.
    std::vector<int> const path1 = tree.path(1, deepest(1));
    REQUIRE(path1.size() >= 2);
    std::vector<int32_t> accepted(size_t(N), -1), num{int32_t(path1.size()) - 1}, next{0};
    for (size_t k = 0; k < path1.size(); ++k) accepted[k] = path1[k];
    std::vector<int32_t> table, prefix_len, seq_len(1, 0), status(1, -1);
    specdec::ops::KvCommitParams p;
    std::vector<RequestId> const id1{1};
    REQUIRE(cache.kv_commit_params(id1, &table, &prefix_len, &p).ok());
    p.acceptance = specdec::Acceptance{accepted.data(), num.data(), next.data(), N};
    p.status = status.data();
    p.seq_len_out = seq_len.data();
    Status const kc = specdec::ops::kv_commit(CpuExecutor{}, p);
    REQUIRE_MESSAGE(kc.ok(), kc.to_string());
    REQUIRE(status[0] == specdec::ops::kKvCommitOk);
    CHECK(seq_len[0] == 5 + int32_t(path1.size()));
    REQUIRE(cache.commit(1, seq_len[0]).ok());
    std::vector<int32_t> seq = prefix[1];
    for (int k : path1) seq.push_back(node_tokens[size_t(N) + k]);
    seq.push_back(int32_t(rng() % uint64_t(V)));
    std::vector<int32_t> const bonus{seq.back()};
    REQUIRE(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, id1, bonus, kAux, &logits, &aux).ok());
    reference(md, seq, kAux, &want, &want_aux);
    MaxDiff dc;
    int64_t const last = int64_t(seq.size()) - 1;
    compare_rows(logits, 0, want, last, 1, md.V(), &dc, &g_logits);
    compare_rows(aux, 0, want_aux, last, 1, 3 * md.H(), &dc, &g_aux);
    expect_close(dc, "decode after kv_commit + commit");
  }
}

TEST_CASE("kimi_forward_cpu: errors name the problem and change nothing") {
  Model md(false, 4);
  int const V = int(md.V());
  Rng rng(9);
  MlaCache cache = make_cache(md, 4, 4, 4);  // 16 slots in all
  REQUIRE(cache.add_request(3).ok());
  std::vector<RequestId> const id3{3};
  std::vector<int32_t> const c5{5};
  std::vector<int32_t> const five = random_tokens(rng, 5, V);
  std::vector<float> logits, aux;
  REQUIRE(
      kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, id3, c5, five, {}, &logits, nullptr).ok());
  std::vector<int32_t> const one{1};

  SUBCASE("decode on an unknown request") {
    std::vector<RequestId> const unknown{99};
    check_error(
        kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, unknown, one, {}, &logits, nullptr),
        StatusCode::kInvalidArgument, {"kimi_decode (cpu)", "requests[0] = 99", "unknown request"});
    std::vector<RequestId> const twice{3, 3};
    std::vector<int32_t> const two{1, 2};
    check_error(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, twice, two, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"requests[1] = 3 repeats requests[0]"});
  }
  SUBCASE("cache out of pages") {
    // 5 cached + 12 new = 17 slots = 5 pages > 4: refused; the length and pages do not move.
    std::vector<int32_t> const twelve = random_tokens(rng, 12, V);
    std::vector<int32_t> const c12{12};
    REQUIRE(cache.add_request(4).ok());
    std::vector<RequestId> const both{4, 3};
    std::vector<int32_t> const c_both{2, 12};
    std::vector<int32_t> flat{7, 8};
    flat.insert(flat.end(), twelve.begin(), twelve.end());
    Status const s =
        kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, both, c_both, flat, {}, &logits, nullptr);
    check_error(s, StatusCode::kInvalidArgument,
                {"kimi_prefill (cpu)", "request 3 needs 17 slots", "max_pages_per_request 4"});
    MlaCache small = make_cache(md, 4, 5, 4);
    REQUIRE(small.add_request(1).ok());
    REQUIRE(small.add_request(2).ok());
    std::vector<RequestId> const pair{1, 2};
    std::vector<int32_t> const c_pair{9, 9};  // 3 + 3 pages > 5
    std::vector<int32_t> const eighteen = random_tokens(rng, 18, V);
    check_error(kimi::kimi_prefill(CpuExecutor{}, md.cpu, &small, pair, c_pair, eighteen, {},
                                   &logits, nullptr),
                StatusCode::kInvalidArgument, {"out of pages", "6 more page(s)", "5 of 5 free"});
    CHECK(small.free_pages() == 5);
    CHECK(length_of(small, 1) == 0);
    CHECK(length_of(cache, 3) == 5);
    CHECK(pages_of(cache, 4).empty());
  }
  SUBCASE("verify with a malformed mask") {
    // A 4-node chain 0 -> 1 -> 2 and 0 -> 3: rows {0}, {0,1}, {0,1,2}, {0,3}; positions 5 + depth.
    std::vector<int32_t> const tok{1, 2, 3, 4}, pos{5, 6, 7, 6};
    std::vector<uint32_t> const good{0b1, 0b11, 0b111, 0b1001};
    std::vector<float> vl;
    auto verify = [&](std::vector<uint32_t> const& m, std::vector<int32_t> const& p) {
      return kimi::kimi_verify(CpuExecutor{}, md.cpu, &cache, id3, 4, tok, p, m, {}, &vl, nullptr);
    };
    check_error(verify({0b1, 0b10, 0b111, 0b1001}, pos), StatusCode::kMalformedInput,
                {"kimi_verify (cpu)", "request 0: mask row 1", "bit 0, the root, is missing"});
    check_error(verify({0b1, 0b11, 0b011, 0b1001}, pos), StatusCode::kMalformedInput,
                {"mask row 2 lacks bit 2"});
    check_error(verify({0b1, 0b111, 0b111, 0b1001}, pos), StatusCode::kMalformedInput,
                {"mask row 1 sets bit 2 > 1"});
    check_error(verify({0b1, 0b11, 0b111, 0b1101}, pos), StatusCode::kMalformedInput,
                {"mask row 3 is not the row of its parent (node 2"});
    check_error(verify({0b1, 0b11, 0b111, 0b1001 | (1u << 20)}, pos), StatusCode::kMalformedInput,
                {"mask row 3 sets bit 20"});
    check_error(verify(good, {5, 6, 7, 7}), StatusCode::kInvalidArgument,
                {"positions[3] = 7", "length 5 + depth 1"});
    check_error(verify({0b1, 0b11, 0b111}, pos), StatusCode::kInvalidArgument,
                {"mask 3 words (want B*N*1)"});
    CHECK(length_of(cache, 3) == 5);
    Status const ok = verify(good, pos);
    REQUIRE_MESSAGE(ok.ok(), ok.to_string());
    int64_t staged = 0;
    REQUIRE(cache.staged(3, &staged).ok());
    CHECK(staged == 4);
  }
  SUBCASE("bad tokens, aux layers, counts and cache geometry") {
    std::vector<int32_t> const bad{V};
    check_error(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, id3, bad, {}, &logits, nullptr),
                StatusCode::kInvalidArgument, {"tokens[0] = 512", "vocab_size 512"});
    std::vector<int> const a4{4};
    check_error(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, id3, one, a4, &logits, &aux),
                StatusCode::kInvalidArgument, {"aux_layers[0] = 4", "[kEmbedding -1, 4)"});
    std::vector<int> const a_dup{1, -1, 1};
    check_error(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, id3, one, a_dup, &logits, &aux),
                StatusCode::kInvalidArgument, {"[1,-1,1] lists a layer twice"});
    check_error(kimi::kimi_decode(CpuExecutor{}, md.cpu, &cache, id3, one, a_dup, &logits, nullptr),
                StatusCode::kInvalidArgument, {"aux is null"});
    std::vector<int32_t> const c3{3};
    check_error(
        kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, id3, c3, five, {}, &logits, nullptr),
        StatusCode::kInvalidArgument, {"counts add up to 3 tokens, tokens has 5"});
    std::vector<int32_t> const c0{0};
    check_error(
        kimi::kimi_prefill(CpuExecutor{}, md.cpu, &cache, id3, c0, {}, {}, &logits, nullptr),
        StatusCode::kInvalidArgument, {"counts[0] = 0 < 1"});
    MlaCache other;
    REQUIRE(MlaCache::create(4, 16, 8, 4, 4, 4, &other).ok());
    REQUIRE(other.add_request(3).ok());
    check_error(kimi::kimi_decode(CpuExecutor{}, md.cpu, &other, id3, one, {}, &logits, nullptr),
                StatusCode::kInvalidArgument,
                {"cache has 4 layers of [16 + 8]", "kv_lora_rank 32"});
    CHECK(length_of(cache, 3) == 5);
  }
}

TEST_CASE("kimi_forward_cpu: observed maxima (run last)") {
  MESSAGE("max relative difference to the reference: logits ", g_logits.rel(), " (abs ",
          g_logits.abs, "), aux ", g_aux.rel(), " (abs ", g_aux.abs, ")");
  CHECK(g_logits.rel() <= kTol);
  CHECK(g_aux.rel() <= kTol);
}
