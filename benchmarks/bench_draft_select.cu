// draft_select on the H200.
//   BM_draft_expand: batch {1, 8, 64, 256} x topk {1, 4, 8} x Vd {32000, 163840} at step 1
//     (K_in = topk branches, the step every draft step after the first looks like) plus step 0 (one
//     branch) at batch 1. Bytes per launch = the logits read once (outputs are a few KB); compare
//     bytes_per_second with BM_copy_floor (target >= 60% of it at batch 64). Logit sets are
//     rotated so >= 128 MB (> 2x the 50 MB L2) separates two reads of the same logits.
//   BM_draft_finalize: batch {1, 8, 64, 256} x N {4, 8, 16, 32, 64} from a topk 8, 4-step
//     candidate buffer (C = 200). Bytes = candidates read once + the tree written once; the
//     buffers stay in L2 as in the engine (no rotation).
// Target: every op < 10 us of GPU time at batch 1.
#include <algorithm>
#include <vector>

#include "specdec/core/cuda.cuh"
#include "specdec/ops/draft_select/draft_select.hpp"
#include "support/bench.cuh"
#include "support/testing.hpp"

namespace {

namespace ops = specdec::ops;

void BM_draft_expand(benchmark::State& state) {
  int const B = static_cast<int>(state.range(0)), K = static_cast<int>(state.range(1));
  int const Vd = static_cast<int>(state.range(2)), step = static_cast<int>(state.range(3));
  int const steps = 2, C = ops::draft_candidate_count(K, steps),
            K_in = ops::draft_branches(K, step);
  size_t const count = static_cast<size_t>(B) * K_in * Vd;
  size_t const set_bytes = count * sizeof(float);
  int const sets = static_cast<int>(std::max<size_t>(1, (size_t{128} << 20) / set_bytes + 1));
  specdec::DeviceBuffer<float> logits(count * sets);
  {
    // One host chunk of random logits for the whole process (setup runs once per repetition).
    static std::vector<float> const chunk = [] {
      specdec::testing::Rng rng(3);
      std::vector<float> c(size_t{1} << 24);
      for (auto& x : c)
        x = static_cast<float>(static_cast<int64_t>(rng() >> 44) - 524288) / 65536.0f + 1e-3f;
      return c;
    }();
    for (size_t at = 0; at < count * sets; at += chunk.size()) {
      size_t const n = std::min(chunk.size(), count * sets - at);
      specdec::bench::check_cuda(
          cudaMemcpy(logits.data() + at, chunk.data(), n * sizeof(float), cudaMemcpyHostToDevice),
          "upload logits");
    }
  }
  std::vector<float> fscores(B * K_in);
  std::vector<int32_t> fslots(B * K_in);
  for (int r = 0; r < B * K_in; ++r)
    fscores[r] = -0.25f * (r % K_in), fslots[r] = step == 0 ? -1 : r % K_in;
  specdec::DeviceBuffer<float> d_fsc(fscores), csc(B * C), nsc(B * K);
  specdec::DeviceBuffer<int32_t> d_fslot(fslots), ctok(B * C), cpar(B * C), nslot(B * K),
      ntok(B * K), ndraft(B * K), nbranch(B * K);
  specdec::DeviceBuffer<uint64_t> ws(ops::draft_expand_workspace_bytes(B, Vd, K) / 8 + 1);
  specdec::bench::check_cuda(cudaMemset(ws.data(), 0, ws.size() * 8), "zero workspace");
  ops::DraftExpandParams p;
  p.frontier_scores = d_fsc.data();
  p.frontier_slots = d_fslot.data();
  p.batch = B;
  p.vocab = Vd;
  p.topk = K;
  p.steps = steps;
  p.step = step;
  p.cand_tokens = ctok.data();
  p.cand_scores = csc.data();
  p.cand_parent = cpar.data();
  p.next_scores = nsc.data();
  p.next_slots = nslot.data();
  p.next_tokens = ntok.data();
  p.next_draft_tokens = ndraft.data();
  p.next_branch = nbranch.data();
  p.workspace = ws.data();
  p.workspace_bytes = ws.size() * 8;
  specdec::bench::time_launches(state, static_cast<double>(set_bytes), [&](int i, cudaStream_t stream) {
    p.logits = logits.data() + (i % sets) * count;
    auto s = ops::draft_expand(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}

void draft_expand_sizes(benchmark::internal::Benchmark* b) {
  for (int vocab : {32000, 163840}) {
    b->Args({1, 4, vocab, 0});
    for (int batch : {1, 8, 64, 256}) {
      for (int topk : {1, 4, 8}) b->Args({batch, topk, vocab, 1});
    }
  }
}
SPECDEC_CUDA_BENCHMARK(BM_draft_expand)
    ->ArgNames({"B", "topk", "Vd", "step"})
    ->Apply(draft_expand_sizes);

void BM_draft_finalize(benchmark::State& state) {
  int const B = static_cast<int>(state.range(0)), N = static_cast<int>(state.range(1));
  int const K = 8, steps = 4, C = ops::draft_candidate_count(K, steps);
  specdec::testing::Rng rng(4);
  std::vector<int32_t> tokens(B * C), parents(B * C), roots(B, 1);
  std::vector<float> scores(B * C);
  for (int b = 0; b < B; ++b) {
    for (int c = 0; c < C; ++c) {
      // Parents in the previous step's slots; scores decreasing with depth (log-prob-like).
      int const step = c < K ? 0 : 1 + (c - K) / (K * K);
      int const prev = ops::draft_step_base(K, step - 1 < 0 ? 0 : step - 1);
      int const prev_n = ops::draft_branches(K, step - 1 < 0 ? 0 : step - 1) * K;
      parents[b * C + c] = step == 0 ? -1 : prev + static_cast<int>(rng() % prev_n);
      tokens[b * C + c] = static_cast<int32_t>(rng() % 163840);
      scores[b * C + c] = -static_cast<float>(step + 1) - static_cast<float>(rng() % 1000) * 1e-3f;
    }
  }
  specdec::DeviceBuffer<int32_t> d_tok(tokens), d_par(parents), d_roots(roots), t(B * N), pa(B * N),
      slot(B * N), status(B);
  specdec::DeviceBuffer<float> d_sc(scores);
  ops::DraftFinalizeParams p;
  p.cand_tokens = d_tok.data();
  p.cand_scores = d_sc.data();
  p.cand_parent = d_par.data();
  p.root_tokens = d_roots.data();
  p.batch = B;
  p.topk = K;
  p.steps = steps;
  p.nodes = N;
  p.tokens = t.data();
  p.parents = pa.data();
  p.node_slot = slot.data();
  p.status = status.data();
  double const bytes = 12.0 * B * C + 4.0 * B + 12.0 * B * N + 4.0 * B;
  specdec::bench::time_launches(state, bytes, [&](int, cudaStream_t stream) {
    auto s = ops::draft_finalize(specdec::CudaExecutor{stream}, p);
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
}
SPECDEC_CUDA_BENCHMARK(BM_draft_finalize)
    ->ArgNames({"B", "N"})
    ->ArgsProduct({{1, 8, 64, 256}, {4, 8, 16, 32, 64}});

}  // namespace
