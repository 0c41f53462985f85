// mla_attention CUDA kernels vs the CPU reference, every output within 1e-4 of its (token, head)
// row's largest magnitude, over heads {1, 3, 16, 64} (groups of 16 heads, padded groups),
// c / r {512 / 64 (Kimi-K2.5), 32 / 16, 16 / 8, 20 / 4, 28 / 0} (c and W not multiples of 16),
// page_size {1, 16, 64} with pages handed out in turns between the requests from a shuffled pool
// (non-contiguous page tables): decode (B up to 64,
// ragged contexts 1..5000 slots), causal prefill (several tokens per request, tokens in request
// order or shuffled), tree verify (random trees of up to 64 nodes, 2 mask words), max_slots equal
// to or well above what is needed; both the split (workspace + combine) and the direct path.
// Outputs are poisoned with NaN first, and every cache row the op must not read holds NaN.
// Plus a CUDA-graph capture replayed with new q and base values (the new answer, bit-identical to
// an eager run).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/mla_attention/mla_attention.hpp"
#include "support/paged_batch.hpp"
#include "support/testing.hpp"

using namespace specdec;
using namespace specdec::ops;

namespace {

enum class Mode { kDecode, kPrefill, kVerify };

// A batch on the host. Request b holds valid entries in slots [0, capacity[b]) (>= base + count)
// of its pages; every other row of the cache is NaN.
struct Problem : testing::PagedMlaBatch {
  int max_slots = 0;
  float scale = 1.0f;
  std::vector<int32_t> capacity;

  MlaAttentionParams host_params(std::vector<float>* out) {
    return params(out, NAN, max_slots, scale);
  }
};

Problem make_problem(testing::Rng& rng, int heads, int c, int r, int page_size,
                     std::vector<int32_t> const& base, std::vector<int32_t> const& count,
                     std::vector<int32_t> const& capacity,
                     std::vector<std::vector<int32_t>> const& parents, int words, bool shuffle,
                     int extra_slots, float scale) {
  Problem P;
  P.heads = heads;
  P.c = c;
  P.r = r;
  P.page_size = page_size;
  P.batch = static_cast<int>(base.size());
  P.base = base;
  P.count = count;
  P.capacity = capacity;
  P.scale = scale;
  int const W = P.width();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int> pages_of(static_cast<size_t>(P.batch));
  int total = 0;
  for (int b = 0; b < P.batch; ++b) {
    P.max_slots = std::max(P.max_slots, base[b] + count[b]);
    pages_of[b] = (capacity[b] + page_size - 1) / page_size;
    P.max_pages = std::max(P.max_pages, pages_of[b] + 2);
    total += pages_of[b];
  }
  P.max_slots += extra_slots;
  P.num_pages = total + 5;
  P.page_table = testing::interleaved_page_table(rng, pages_of, P.max_pages, P.num_pages);
  P.cache.assign(static_cast<size_t>(P.num_pages) * page_size * W, NAN);
  for (int b = 0; b < P.batch; ++b) {
    for (int u = 0; u < capacity[b]; ++u) {
      int64_t const row =
          int64_t{P.page_table[static_cast<size_t>(b) * P.max_pages + u / page_size]} * page_size +
          u % page_size;
      for (int x = 0; x < W; ++x) P.cache[static_cast<size_t>(row * W + x)] = normal(rng);
    }
  }
  testing::list_tokens(rng, count, shuffle, &P.token_request, &P.token_index);
  P.tokens = static_cast<int>(P.token_request.size());
  if (!parents.empty()) {
    P.words = words;
    P.mask = testing::ancestor_mask(P.token_request, P.token_index, parents, words);
  }
  P.q.resize(static_cast<size_t>(P.tokens) * heads * W);
  for (float& x : P.q) x = normal(rng);
  return P;
}

// Largest |got - want| over one (token, head) row divided by the row's largest |want| (at least
// 1e-3); infinity for a non-finite value.
double max_row_error(std::vector<float> const& got, std::vector<float> const& want, int c) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (size_t row = 0; row + c <= want.size(); row += c) {
    double scale = 1e-3, err = 0;
    for (int x = 0; x < c; ++x) {
      if (!std::isfinite(got[row + x]) || !std::isfinite(want[row + x])) return INFINITY;
      scale = std::max(scale, std::fabs(static_cast<double>(want[row + x])));
      err = std::max(err, std::fabs(static_cast<double>(got[row + x]) - want[row + x]));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

// The problem's buffers on the device.
struct DeviceProblem {
  DeviceBuffer<float> q, cache, out, workspace;
  DeviceBuffer<int32_t> token_request, token_index, base, page_table;
  DeviceBuffer<uint32_t> mask;
  MlaAttentionParams params;

  DeviceProblem(Problem& P, size_t workspace_bytes)
      : q(P.q), cache(P.cache), out(static_cast<size_t>(P.tokens) * P.heads * P.c),
        workspace((workspace_bytes + 3) / 4), token_request(P.token_request),
        token_index(P.token_index), base(P.base), page_table(P.page_table), mask(P.mask) {
    std::vector<float> unused;
    params = P.host_params(&unused);
    params.q = q.data();
    params.cache = cache.data();
    params.token_request = token_request.data();
    params.token_index = token_index.data();
    params.base = base.data();
    params.page_table = page_table.data();
    params.mask = P.mask.empty() ? nullptr : mask.data();
    params.out = out.data();
    params.workspace = workspace.data();
    params.workspace_bytes = workspace.size() * sizeof(float);
  }
  bool valid() const {
    return q.valid() && cache.valid() && out.valid() && workspace.valid() &&
           token_request.valid() && token_index.valid() && base.valid() && page_table.valid() &&
           mask.valid();
  }
};

struct Case {
  char const* name;
  int heads, c, r, page_size;
  Mode mode;
  int batch;
  int n;        // decode 1; prefill: up to n tokens per request; verify: n tree nodes
  int max_ctx;  // decode: contexts 1..max_ctx; prefill / verify: base 0..max_ctx
  int extra_slots;
  float scale;
  bool shuffle;
};

}  // namespace

TEST_CASE("mla_attention: GPU equals the CPU reference (decode, prefill, tree verify)") {
  Case const cases[] = {
      // name                  heads  c    r   page  mode           B   n   ctx  extra  scale shuffle
      {"decode kimi",            64, 512, 64, 16, Mode::kDecode,   4,  1, 5000,     0, 0.07f, false},
      {"decode kimi B64",        64, 512, 64,  1, Mode::kDecode,  64,  1,  300,     0, 0.07f, false},
      {"decode 16 heads",        16, 512, 64, 64, Mode::kDecode,  16,  1, 5000,     0, 0.07f, false},
      {"decode 3 heads",          3,  32, 16,  1, Mode::kDecode,  64,  1, 5000,     0, 0.3f,  false},
      {"decode 1 head",           1,  16,  8, 64, Mode::kDecode,  64,  1, 5000,  1000, 0.5f,  false},
      {"decode 16 heads c32",    16,  32, 16, 16, Mode::kDecode,  33,  1, 5000,     3, 0.3f,  false},
      {"decode 64 heads c16",    64,  16,  8,  1, Mode::kDecode,  64,  1, 5000,     0, 1.0f,  false},
      {"decode 3 heads kimi",     3, 512, 64, 16, Mode::kDecode,   8,  1, 5000, 20000, 0.07f, false},
      {"decode 1 head kimi",      1, 512, 64,  1, Mode::kDecode,  64,  1, 5000,     0, 0.07f, false},
      {"decode batch 1",         64,  32, 16, 64, Mode::kDecode,   1,  1, 5000,     0, 0.3f,  false},
      {"decode one slot",        16,  16,  8, 16, Mode::kDecode,   1,  1,    1,     0, 0.5f,  false},
      {"decode 8 heads kimi",     8, 512, 64, 64, Mode::kDecode,   2,  1, 1024,     0, 0.07f, false},
      {"decode c20 r4",          64,  20,  4, 16, Mode::kDecode,   8,  1, 3000,     0, 0.3f,  false},
      {"decode c28 r0",          17,  28,  0,  1, Mode::kDecode,   8,  1, 3000,    40, 0.3f,  false},
      {"prefill kimi",           16, 512, 64, 16, Mode::kPrefill,  3, 40,  500,     0, 0.07f, false},
      {"prefill direct",         64,  32, 16,  1, Mode::kPrefill,  4, 70,  300,     0, 0.3f,  false},
      {"prefill shuffled",        3,  16,  8, 64, Mode::kPrefill,  5, 100, 2000,   64, 0.5f,  true},
      {"prefill 1 head kimi",     1, 512, 64, 64, Mode::kPrefill,  2, 64, 1000,     0, 0.07f, true},
      {"verify kimi 16 heads",   16, 512, 64, 16, Mode::kVerify,   3, 64,  300,     0, 0.07f, false},
      {"verify 64 heads c32",    64,  32, 16, 64, Mode::kVerify,   4, 33,  900,     5, 0.3f,  false},
      {"verify direct",           3,  16,  8,  1, Mode::kVerify,   8, 64, 3000,     0, 0.5f,  true},
      {"verify 1 head kimi",      1, 512, 64, 16, Mode::kVerify,   2, 17, 5000,   100, 0.07f, false},
      {"verify kimi 64 heads",   64, 512, 64, 64, Mode::kVerify,   1, 64,  200,     0, 0.07f, false},
  };
  testing::Rng rng(2024);
  int64_t compared = 0;
  for (Case const& cs : cases) {
    CAPTURE(cs.name);
    std::uniform_int_distribution<int> ctx(1, cs.max_ctx), prefix(0, cs.max_ctx),
        how_many(1, cs.n);
    std::vector<int32_t> base, count, capacity;
    std::vector<std::vector<int32_t>> parents;
    for (int b = 0; b < cs.batch; ++b) {
      if (cs.mode == Mode::kDecode) {
        // Contexts 1 and max_ctx always present, the rest ragged.
        int const n = cs.batch == 1 ? cs.max_ctx : b == 0 ? 1 : b == 1 ? cs.max_ctx : ctx(rng);
        base.push_back(n - 1);
        count.push_back(1);
      } else {
        base.push_back(cs.batch == 1 ? cs.max_ctx : b == 0 ? 0 : b == 1 ? cs.max_ctx : prefix(rng));
        count.push_back(cs.mode == Mode::kVerify ? cs.n : (b == 0 ? cs.n : how_many(rng)));
        if (cs.mode == Mode::kVerify) parents.push_back(testing::random_parents(rng, cs.n, b % 2));
      }
      capacity.push_back(base.back() + count.back());
    }
    Problem P = make_problem(rng, cs.heads, cs.c, cs.r, cs.page_size, base, count, capacity,
                             parents, 2, cs.shuffle, cs.extra_slots, cs.scale);
    std::vector<float> want;
    REQUIRE(mla_attention(CpuExecutor{}, P.host_params(&want)).ok());

    size_t const ws = mla_attention_workspace_bytes(P.tokens, P.heads, P.c, P.max_slots);
    DeviceProblem D(P, ws);
    REQUIRE(D.valid());
    REQUIRE(D.out.fill_bytes(0xff).ok());
    REQUIRE(D.workspace.fill_bytes(0xff).ok());
    REQUIRE(mla_attention(CudaExecutor{}, D.params).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> const got = D.out.download();
    MlaAttentionPlan const plan = mla_attention_plan(P.tokens, P.heads, P.max_slots);
    double const err = max_row_error(got, want, P.c);
    MESSAGE(cs.name << ": T " << P.tokens << ", heads " << P.heads << " (groups of " << plan.group
                    << "), max_slots " << P.max_slots << ", chunks " << plan.chunks
                    << ", max row error " << err);
    CHECK(err < 1e-4);
    // A rerun is bit-identical (fixed summation order).
    REQUIRE(D.out.fill_bytes(0xff).ok());
    REQUIRE(mla_attention(CudaExecutor{}, D.params).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(D.out.download() == got);
    compared += P.tokens;
  }
  MESSAGE("compared " << compared << " tokens");
}

TEST_CASE("mla_attention: captured in a CUDA graph, replayed with new q and base") {
  testing::Rng rng(77);
  int const B = 8;
  std::vector<int32_t> base, count, capacity;
  std::uniform_int_distribution<int> ctx(1, 3000);
  for (int b = 0; b < B; ++b) {
    base.push_back(ctx(rng) - 1);
    count.push_back(1);
    capacity.push_back(3000);  // every slot a later base may reach holds a valid entry
  }
  Problem P = make_problem(rng, 16, 512, 64, 16, base, count, capacity, {}, 0, false, 0, 0.07f);
  P.max_slots = 3000;
  // One workspace for every shape.
  DeviceProblem D(P, mla_attention_workspace_bound_bytes(P.c));
  REQUIRE(D.valid());
  cudaStream_t stream;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  MlaAttentionParams dp = D.params;

  std::vector<float> want;
  REQUIRE(mla_attention(CpuExecutor{}, P.host_params(&want)).ok());
  // Memsets and copies run on the legacy stream, which `stream` does not wait for: synchronise.
  REQUIRE(D.out.fill_bytes(0xff).ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(mla_attention(CudaExecutor{stream}, dp).ok());
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  std::vector<float> const eager = D.out.download();
  CHECK(max_row_error(eager, want, P.c) < 1e-4);

  cudaGraph_t graph;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  Status const captured = mla_attention(CudaExecutor{stream}, dp);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(captured.ok());
  cudaGraphExec_t exec;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);

  // Replay on the same inputs: the eager answer, bit for bit.
  REQUIRE(D.out.fill_bytes(0xff).ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(D.out.download() == eager);

  // New queries and contexts (longer and shorter) written into the same buffers.
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : P.q) x = normal(rng);
    for (int b = 0; b < B; ++b) P.base[b] = round == 0 ? 2999 - b * 7 : b;  // n = base + 1
    REQUIRE(D.q.upload(P.q).ok());
    REQUIRE(D.base.upload(P.base).ok());
    REQUIRE(mla_attention(CpuExecutor{}, P.host_params(&want)).ok());
    REQUIRE(D.out.fill_bytes(0xff).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<float> const replay = D.out.download();
    CHECK(max_row_error(replay, want, P.c) < 1e-4);
    REQUIRE(D.out.fill_bytes(0xff).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(mla_attention(CudaExecutor{stream}, dp).ok());
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(D.out.download() == replay);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
