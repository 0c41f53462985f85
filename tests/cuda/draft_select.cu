// draft_select CUDA kernels vs the CPU references. draft_expand: batch {1, 8, 64} x topk
// {1, 2, 4, 8} x steps 1..6, Vd {32000, 163840} (163840 with the smaller batches so the CPU
// reference stays fast) plus odd / tiny vocabularies (misaligned rows, Vd == topk), with and
// without d2t. Every step gets the CPU chain's frontier as input on both sides; candidate tokens
// and parents compared exactly, scores within 1e-5 relative, untouched slots must stay poisoned.
// draft_finalize: exact on the same candidate buffers for several N <= 64, and on arbitrary
// (non log-prob) scores where parents go missing. One expand + finalize replayed from a graph.
// The expand workspace is zeroed once per case and reused by every step (its arrival counters
// must come back to zero, or later steps' outputs stay poisoned).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/draft_select/draft_select.hpp"
#include "support/testing.hpp"

namespace {

using specdec::DeviceBuffer;
namespace ops = specdec::ops;

// Fast random logits in [-6, 6) from 23 random bits (ties are possible and are handled exactly
// by the (logit, id) keys on both sides).
void fill_logits(specdec::testing::Rng& rng, std::vector<float>& x) {
  for (size_t k = 0; k < x.size(); k += 2) {
    uint64_t const r = rng();
    x[k] = static_cast<float>(r & 0x7fffff) * (12.0f / 8388608.0f) - 6.0f;
    if (k + 1 < x.size())
      x[k + 1] = static_cast<float>((r >> 32) & 0x7fffff) * (12.0f / 8388608.0f) - 6.0f;
  }
}

bool close(float got, float want) {
  return std::fabs(got - want) <= 1e-5f * std::max(1.0f, std::fabs(want));
}

struct Case {
  int batch, topk, steps, vocab;
  bool d2t;
};

void check_finalize(int B, int K, int steps, int N, std::vector<int32_t> const& tokens,
                    std::vector<float> const& scores, std::vector<int32_t> const& parents,
                    std::vector<int32_t> const& roots) {
  CAPTURE(N);
  ops::DraftFinalizeParams hp;
  std::vector<int32_t> h_tok(B * N), h_par(B * N), h_slot(B * N), h_status(B);
  std::vector<float> h_sc(B * N);
  hp.cand_tokens = tokens.data();
  hp.cand_scores = scores.data();
  hp.cand_parent = parents.data();
  hp.root_tokens = roots.data();
  hp.batch = B;
  hp.topk = K;
  hp.steps = steps;
  hp.nodes = N;
  hp.tokens = h_tok.data();
  hp.parents = h_par.data();
  hp.node_slot = h_slot.data();
  hp.node_scores = h_sc.data();
  hp.status = h_status.data();
  specdec::Status const cpu = ops::draft_finalize(specdec::CpuExecutor{}, hp);

  DeviceBuffer<int32_t> d_ctok(tokens), d_cpar(parents), d_roots(roots);
  DeviceBuffer<float> d_csc(scores), d_sc(B * N);
  DeviceBuffer<int32_t> d_tok(B * N), d_par(B * N), d_slot(B * N), d_status(B);
  for (auto* buf : {&d_tok, &d_par, &d_slot, &d_status}) REQUIRE(buf->fill_bytes(0xff).ok());
  REQUIRE(d_sc.fill_bytes(0xff).ok());
  ops::DraftFinalizeParams dp = hp;
  dp.cand_tokens = d_ctok.data();
  dp.cand_scores = d_csc.data();
  dp.cand_parent = d_cpar.data();
  dp.root_tokens = d_roots.data();
  dp.tokens = d_tok.data();
  dp.parents = d_par.data();
  dp.node_slot = d_slot.data();
  dp.node_scores = d_sc.data();
  dp.status = d_status.data();
  specdec::Status const s = ops::draft_finalize(specdec::CudaExecutor{}, dp);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto const status = d_status.download();
  CHECK(status == h_status);
  CHECK((std::count(status.begin(), status.end(), 0) == B) == cpu.ok());
  CHECK(d_tok.download() == h_tok);
  CHECK(d_par.download() == h_par);
  CHECK(d_slot.download() == h_slot);
  auto const sc = d_sc.download();
  CHECK(std::memcmp(sc.data(), h_sc.data(), sc.size() * sizeof(float)) == 0);  // copies: exact
}

void run_case(Case const& c, uint64_t seed) {
  CAPTURE(c.batch);
  CAPTURE(c.topk);
  CAPTURE(c.steps);
  CAPTURE(c.vocab);
  CAPTURE(c.d2t);
  specdec::testing::Rng rng(seed);
  int const B = c.batch, K = c.topk, Vd = c.vocab, C = ops::draft_candidate_count(K, c.steps);
  std::vector<int64_t> d2t;
  if (c.d2t) {
    std::uniform_int_distribution<int64_t> off(0, Vd);
    for (int d = 0; d < Vd; ++d) d2t.push_back(off(rng));
  }
  // CPU chain state.
  std::vector<int32_t> h_ctok(B * C, -1), h_cpar(B * C, -1);
  std::vector<float> h_csc(B * C, 0.0f);
  std::vector<float> fscores(B, 0.0f);
  std::vector<int32_t> fslots(B, -1);
  std::vector<float> n_sc(B * K);
  std::vector<int32_t> n_slot(B * K), n_tok(B * K), n_draft(B * K), n_branch(B * K);
  // GPU buffers.
  DeviceBuffer<int32_t> d_ctok(B * C), d_cpar(B * C);
  DeviceBuffer<float> d_csc(B * C);
  REQUIRE(d_ctok.fill_bytes(0xff).ok());
  REQUIRE(d_cpar.fill_bytes(0xff).ok());
  REQUIRE(d_csc.fill_bytes(0xff).ok());
  DeviceBuffer<int64_t> d_d2t(d2t);
  size_t const ws_bytes = ops::draft_expand_workspace_bytes(B, Vd, K);
  DeviceBuffer<uint64_t> d_ws(ws_bytes / 8 + 1);
  REQUIRE(d_ws.fill_bytes(0).ok());  // zeroed once; every launch leaves its counters at zero

  for (int step = 0; step < c.steps; ++step) {
    CAPTURE(step);
    int const K_in = ops::draft_branches(K, step), base = ops::draft_step_base(K, step);
    std::vector<float> logits(static_cast<size_t>(B) * K_in * Vd);
    fill_logits(rng, logits);
    ops::DraftExpandParams hp;
    hp.logits = logits.data();
    hp.frontier_scores = fscores.data();
    hp.frontier_slots = fslots.data();
    hp.d2t = c.d2t ? d2t.data() : nullptr;
    hp.batch = B;
    hp.vocab = Vd;
    hp.topk = K;
    hp.steps = c.steps;
    hp.step = step;
    hp.cand_tokens = h_ctok.data();
    hp.cand_scores = h_csc.data();
    hp.cand_parent = h_cpar.data();
    hp.next_scores = n_sc.data();
    hp.next_slots = n_slot.data();
    hp.next_tokens = n_tok.data();
    hp.next_draft_tokens = n_draft.data();
    hp.next_branch = n_branch.data();
    REQUIRE(ops::draft_expand(specdec::CpuExecutor{}, hp).ok());

    DeviceBuffer<float> d_logits(logits), d_fsc(fscores), d_nsc(B * K);
    DeviceBuffer<int32_t> d_fslot(fslots), d_nslot(B * K), d_ntok(B * K), d_ndraft(B * K),
        d_nbranch(B * K);
    for (auto* buf : {&d_nslot, &d_ntok, &d_ndraft, &d_nbranch})
      REQUIRE(buf->fill_bytes(0xff).ok());
    REQUIRE(d_nsc.fill_bytes(0xff).ok());
    ops::DraftExpandParams dp = hp;
    dp.logits = d_logits.data();
    dp.frontier_scores = d_fsc.data();
    dp.frontier_slots = d_fslot.data();
    dp.d2t = c.d2t ? d_d2t.data() : nullptr;
    dp.cand_tokens = d_ctok.data();
    dp.cand_scores = d_csc.data();
    dp.cand_parent = d_cpar.data();
    dp.next_scores = d_nsc.data();
    dp.next_slots = d_nslot.data();
    dp.next_tokens = d_ntok.data();
    dp.next_draft_tokens = d_ndraft.data();
    dp.next_branch = d_nbranch.data();
    dp.workspace = d_ws.data();
    dp.workspace_bytes = d_ws.size() * 8;
    specdec::Status const s = ops::draft_expand(specdec::CudaExecutor{}, dp);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

    // Candidates: this step's slots match; later steps' slots are still poisoned.
    auto const g_tok = d_ctok.download(), g_par = d_cpar.download();
    auto const g_sc = d_csc.download();
    int const end = base + K_in * K;
    int bad_scores = 0;
    for (int b = 0; b < B; ++b) {
      for (int slot = 0; slot < C; ++slot) {
        size_t const at = static_cast<size_t>(b) * C + slot;
        if (slot < base) continue;  // earlier steps, checked then
        if (slot >= end) {
          CHECK(g_tok[at] == -1);
          continue;
        }
        // Token choice uses exact (logit, id) keys: identical on both sides.
        CHECK(g_tok[at] == h_ctok[at]);
        CHECK(g_par[at] == h_cpar[at]);
        bad_scores += close(g_sc[at], h_csc[at]) ? 0 : 1;
      }
    }
    CHECK(bad_scores == 0);
    // Next frontier: identical, except that two candidates whose scores differ by less than the
    // log-sum-exp rounding (a near-tie) may swap; then the GPU's pick must be such a near-tie.
    auto const g_nslot = d_nslot.download(), g_ntok = d_ntok.download(),
               g_ndraft = d_ndraft.download(), g_nbranch = d_nbranch.download();
    auto const g_nsc = d_nsc.download();
    for (int r = 0; r < B * K; ++r) {
      int const b = r / K;
      if (g_nslot[r] != n_slot[r]) {
        REQUIRE(g_nslot[r] >= base);
        REQUIRE(g_nslot[r] < end);
        float const alt = h_csc[static_cast<size_t>(b) * C + g_nslot[r]];
        CHECK_MESSAGE(close(alt, n_sc[r]), "frontier differs beyond a near-tie");
        MESSAGE("frontier near-tie at request " << b << ": slot " << g_nslot[r] << " vs "
                                                << n_slot[r]);
      } else {
        CHECK(g_ndraft[r] == n_draft[r]);
        CHECK(g_nbranch[r] == n_branch[r]);
      }
      CHECK(g_ntok[r] == h_ctok[static_cast<size_t>(b) * C + g_nslot[r]]);
      CHECK(g_nbranch[r] == (g_nslot[r] - base) / K);
      CHECK(close(g_nsc[r], n_sc[r]));
    }
    // Both sides continue from the CPU's frontier.
    fscores = n_sc;
    fslots = n_slot;
  }

  // Finalize on the CPU chain's candidates, several N.
  std::vector<int32_t> roots(B);
  for (int b = 0; b < B; ++b) roots[b] = static_cast<int32_t>(rng() % 100000);
  for (int N : {2, std::min(1 + C, 8), std::min(1 + C, 33), std::min(1 + C, 64)}) {
    check_finalize(B, K, c.steps, N, h_ctok, h_csc, h_cpar, roots);
  }
}

}  // namespace

TEST_CASE("draft_select cuda: expand + finalize sweep vs reference") {
  uint64_t seed = 10;
  for (int K : {1, 2, 4, 8}) {
    for (int steps = 1; steps <= 6; ++steps) {
      run_case({1, K, steps, 163840, steps % 2 == 0}, seed++);
      run_case({8, K, steps, 32000, steps % 2 == 1}, seed++);
    }
    run_case({8, K, 3, 163840, true}, seed++);
    run_case({64, K, K == 8 ? 2 : 4, 32000, false}, seed++);
    run_case({3, K, 3, 32001, true}, seed++);  // odd vocabulary: misaligned rows, scalar path
    run_case({5, K, 4, K, false}, seed++);     // Vd == topk
    run_case({2, K, 2, 1000, false}, seed++);  // one split per row
  }
}

TEST_CASE("draft_select cuda: finalize with arbitrary scores (missing parents)") {
  specdec::testing::Rng rng(77);
  for (int K : {1, 2, 4, 8}) {
    for (int steps : {1, 3, 6}) {
      int const B = 16, C = ops::draft_candidate_count(K, steps);
      std::vector<int32_t> tokens(B * C), parents(B * C), roots(B, 3);
      std::vector<float> scores(B * C);
      std::normal_distribution<float> score(-3.0f, 2.0f);
      for (int b = 0; b < B; ++b) {
        for (int s = 0; s < steps; ++s) {
          int const base = ops::draft_step_base(K, s), K_in = ops::draft_branches(K, s);
          for (int c = base; c < base + K_in * K; ++c) {
            // Parent: the root at step 0, else a random slot of the previous step.
            int const prev = ops::draft_step_base(K, s - 1 < 0 ? 0 : s - 1);
            int const prev_n = ops::draft_branches(K, s - 1 < 0 ? 0 : s - 1) * K;
            parents[b * C + c] = s == 0 ? -1 : prev + static_cast<int>(rng() % prev_n);
            tokens[b * C + c] = static_cast<int32_t>(rng() % 163840);
            scores[b * C + c] = b % 4 == 0 ? -1.0f : score(rng);  // b % 4 == 0: all tied
          }
        }
      }
      for (int N : {2, std::min(1 + C, 5), std::min(1 + C, 64), 1 + C}) {
        check_finalize(B, K, steps, N, tokens, scores, parents, roots);
      }
    }
  }
}

TEST_CASE("draft_select cuda: expand and finalize replayed from a captured graph") {
  int const B = 4, K = 4, steps = 2, Vd = 32000, C = ops::draft_candidate_count(K, steps), N = 12;
  specdec::testing::Rng rng(5);
  std::vector<float> logits(B * K * Vd);
  fill_logits(rng, logits);
  std::vector<float> fscores(B * K);
  std::vector<int32_t> fslots(B * K);
  for (int r = 0; r < B * K; ++r) fscores[r] = -0.5f * (r % K), fslots[r] = r % K;
  DeviceBuffer<float> d_logits(logits), d_fsc(fscores), d_csc(B * C), d_nsc(B * K);
  DeviceBuffer<int32_t> d_fslot(fslots), d_ctok(B * C), d_cpar(B * C), d_nslot(B * K),
      d_ntok(B * K), d_ndraft(B * K), d_nbranch(B * K), d_roots(std::vector<int32_t>(B, 1)),
      d_tok(B * N), d_par(B * N), d_slot(B * N), d_status(B);
  DeviceBuffer<uint64_t> d_ws(ops::draft_expand_workspace_bytes(B, Vd, K) / 8 + 1);
  REQUIRE(d_ws.fill_bytes(0).ok());
  ops::DraftExpandParams e;
  e.logits = d_logits.data();
  e.frontier_scores = d_fsc.data();
  e.frontier_slots = d_fslot.data();
  e.batch = B;
  e.vocab = Vd;
  e.topk = K;
  e.steps = steps;
  e.step = 1;
  e.cand_tokens = d_ctok.data();
  e.cand_scores = d_csc.data();
  e.cand_parent = d_cpar.data();
  e.next_scores = d_nsc.data();
  e.next_slots = d_nslot.data();
  e.next_tokens = d_ntok.data();
  e.next_draft_tokens = d_ndraft.data();
  e.next_branch = d_nbranch.data();
  e.workspace = d_ws.data();
  e.workspace_bytes = d_ws.size() * 8;
  ops::DraftFinalizeParams f;
  f.cand_tokens = d_ctok.data();
  f.cand_scores = d_csc.data();
  f.cand_parent = d_cpar.data();
  f.root_tokens = d_roots.data();
  f.batch = B;
  f.topk = K;
  f.steps = steps;
  f.nodes = N;
  f.tokens = d_tok.data();
  f.parents = d_par.data();
  f.node_slot = d_slot.data();
  f.status = d_status.data();
  // Step 0's slots are not produced here: fill them with a valid root layer.
  std::vector<int32_t> ctok(B * C, 0), cpar(B * C, -1);
  std::vector<float> csc(B * C, -0.1f);
  REQUIRE(d_ctok.upload(ctok).ok());
  REQUIRE(d_cpar.upload(cpar).ok());
  REQUIRE(d_csc.upload(csc).ok());

  auto run_eager = [&] {
    REQUIRE(ops::draft_expand(specdec::CudaExecutor{}, e).ok());
    REQUIRE(ops::draft_finalize(specdec::CudaExecutor{}, f).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return std::make_tuple(d_ctok.download(), d_csc.download(), d_nslot.download(),
                           d_tok.download(), d_par.download());
  };
  auto const eager = run_eager();
  for (auto* buf : {&d_nslot, &d_tok, &d_par}) REQUIRE(buf->fill_bytes(0xff).ok());

  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  specdec::Status const s1 = ops::draft_expand(specdec::CudaExecutor{stream}, e);
  specdec::Status const s2 = ops::draft_finalize(specdec::CudaExecutor{stream}, f);
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(s1.ok());
  REQUIRE(s2.ok());
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  auto const replay = std::make_tuple(d_ctok.download(), d_csc.download(), d_nslot.download(),
                                      d_tok.download(), d_par.download());
  CHECK(replay == eager);
  CHECK(d_status.download() == std::vector<int32_t>(B, 0));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
