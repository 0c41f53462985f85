// SpecEngine<Policy, Executor>: speculative generation for a batch of requests, the policy's draft
// strategy (EAGLE3, EAGLE, NGRAM, NONE) proposing for the Kimi-K2.5 / DeepseekV3 target.
//
//   SpecEngine<P, CpuExecutor> engine;
//   SpecEngine<P, CpuExecutor>::create(&target, &draft (EAGLE3 / EAGLE; DraftModel) or nullptr,
//                                      options, &engine);
//   engine.generate(requests [R], &results [R], &total);
//
// Requests may differ in prompt length, max_new_tokens and sampling settings; they run as one
// batch until each stops (an eos id of the target's config when stop_at_eos, or max_new_tokens).
// One run, DESIGN.md "One speculative step":
//   prefill  target prefill of every prompt (the draft's feature streams captured: EAGLE3 the
//            layer set P::Layers, EAGLE the last layer's output), the first token drawn
//            (ops::sample, step 0), then the draft consumes the prompt: draft entry i pairs
//            token i + 1 with the target's features of token i
//   per step, for the requests still running (B of them; N slots each: P::kNodes, or fewer when
//   every n-gram proposal of the step is smaller, N = the largest):
//     propose  EAGLE3 / EAGLE: the draft's logits of the last extend give step 0; each later
//              step runs the draft on the topk frontier branches (each branch attends to its own
//              ancestors' draft KV), ops::draft_expand keeps the best topk by cumulative
//              log-probability, ops::draft_finalize picks the best N-1 as the tree.
//              NGRAM: ops::ngram_lookup over prompt + output (a chain for topk 1, else up to
//              topk merged continuations); fewer than N nodes when little matches.
//              NONE: the root alone (plain decoding through the same loop).
//     build    ops::tree_build: masks, depths, positions, links (path capacity kPathCapacity)
//     verify   the target's tree verify forward over the N slots (slots past a smaller n-gram
//              tree's node count hold the root token as a child of the root; nothing reads them)
//     accept   ops::verify_greedy when every request is greedy, else ops::verify_sample
//              (lossless for deterministic drafts; Philox keys (seed, request index, step = the
//              request's output count before the step, node))
//     commit   ops::kv_commit moves the accepted nodes' target KV to contiguous slots; the
//              accepted tokens and the bonus / correction token join the output
//     extend   EAGLE3 / EAGLE: the draft consumes the committed tokens with their features
// Greedy output equals plain greedy decoding whatever the draft: only the target's logits decide.
// Token for token on the CPU executor; on the CUDA executor up to near-ties, since a verify of N
// rows rounds its bf16 GEMMs (and so may route or argmax a near-tie) unlike a forward of 1 row.
//
// Errors (Status, nothing adjusted): a missing or superfluous draft model, a draft that does not
// fit the policy (algorithm, layer set and order, feature width, vocabulary), a request with an
// empty prompt, an id outside the vocabulary, max_new_tokens < 1, prompt + max_new_tokens +
// kPathCapacity - 1 past max_position_embeddings (the target's, and the draft's), a
// temperature that is negative or not finite, top_p outside (0, 1]; on the CUDA executor, a
// tree the CUDA draft_select kernels do not take (topk outside {1, 2, 4, 8}, more than 2048
// candidates), and a token outside the vocabulary that the draft met on the device
// (draft_device_errors).
//
// Executors (one engine, a target per executor; engine/target_cpu.hpp, engine/target_cuda.cuh):
//   SpecEngine<P, CpuExecutor>   the CPU Kimi forward and the ops' CPU references
//   SpecEngine<P, CudaExecutor>  (CUDA translation units) the CUDA Kimi forward, verify and
//                                kv_commit kernels on the device logits and cache, and the EAGLE
//                                draft on the device (DraftCudaModel, model/eagle/forward_cuda.cuh:
//                                extend on the target's aux rows gathered on the device, steps,
//                                draft_expand / draft_finalize's CUDA kernels); the host reads
//                                back each draft step's next_branch [B, K] (the draft's scratch
//                                tree is host metadata), the proposal's tokens / parents [B, N]
//                                and each step's acceptance; n-gram lookup and tree_build run on
//                                the host. draft_device_errors is read once per proposal.
// Tensor parallel (dist/): each rank runs its own engine, with the same requests, over its shard
// of the target (a KimiCpuModel / KimiCudaModel loaded with a TpShard and the rank's communicator)
// and its own copy of the draft. The forward's all-reduces leave every rank the same residual
// stream, so every rank computes the same logits (or, for an all-greedy batch, the same argmax),
// draws the same Philox uniforms and accepts the same tokens: the ranks stay in lockstep with no
// other exchange.
// The draft model is the executor's (SpecEngine::DraftModel): DraftCpuModel const on the CPU,
// DraftCudaModel on CUDA (non-const: its calls use its scratch, so one engine's generate calls,
// and any other use of that draft, must not overlap).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "specdec/core/executor.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/engine/batch.hpp"
#include "specdec/engine/metrics.hpp"
#include "specdec/engine/target_cpu.hpp"
#include "specdec/model/eagle/forward_cpu.hpp"
#include "specdec/model/kimi/generate.hpp"
#include "specdec/ops/draft_select/draft_select.hpp"
#include "specdec/ops/ngram_lookup/ngram_lookup.hpp"
#include "specdec/ops/tree_build/tree_build.hpp"
#include "specdec/policy/spec_policy.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/engine/target_cuda.cuh"
#include "specdec/model/eagle/forward_cuda.cuh"
#endif

namespace specdec::engine {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // >= 1 target token ids
  int max_new_tokens = 16;
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // <= 0: no top-k
  float top_p = 1.0f;        // (0, 1]; 1: no top-p
  uint64_t seed = 0;
  bool stop_at_eos = true;
};

struct GenerationResult {
  std::vector<int32_t> output_ids;
  bool stopped_at_eos = false;
  SpecMetrics metrics;  // this request's counters; times of the batch phases it took part in
};

struct EngineOptions {
  int page_size = 16;   // target MLA cache page, in tokens
  int ngram_min_n = 1;  // NGRAM: shortest suffix matched
  int ngram_max_n = 4;  // NGRAM: longest suffix matched
};

namespace detail {

inline Status check_request(io::DeepseekV3Config const& c, GenerationRequest const& r, int index,
                            int path_capacity, int page_size) {
  model::kimi::GenerateOptions o;
  o.max_new_tokens = r.max_new_tokens;
  o.temperature = r.temperature;
  o.page_size = page_size;
  model::kimi::GenerateResult unused;
  std::string const who = "request " + std::to_string(index);
  SPECDEC_RETURN_IF_ERROR(
      model::kimi::detail::check_generate(c, r.prompt, o, &unused).prefixed(who + ": "));
  if (!(r.top_p > 0.0f && r.top_p <= 1.0f)) {
    return Status::InvalidArgument(who + ": top_p " + std::to_string(r.top_p) +
                                   " outside (0, 1] (1 means no top-p)");
  }
  int64_t const need = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens + path_capacity - 1;
  if (need > c.max_position_embeddings) {
    return Status::InvalidArgument(
        who + ": " + std::to_string(r.prompt.size()) + " prompt tokens + " +
        std::to_string(r.max_new_tokens) + " new tokens + " + std::to_string(path_capacity - 1) +
        " speculative positions past the last token exceed max_position_embeddings " +
        std::to_string(c.max_position_embeddings));
  }
  return Status::Ok();
}

// The sampling arrays of the requests `batch` (indices into requests), step = each one's output
// count so far, request id = its index.
inline void fill_sampling(std::span<GenerationRequest const> requests, std::span<int const> batch,
                          std::vector<GenerationResult> const& results, BatchSampling* s) {
  s->resize(batch.size());
  s->all_greedy = true;
  for (size_t b = 0; b < batch.size(); ++b) {
    size_t const r = static_cast<size_t>(batch[b]);
    s->temperature[b] = requests[r].temperature;
    s->top_p[b] = requests[r].top_p;
    s->top_k[b] = requests[r].top_k;
    s->seed[b] = requests[r].seed;
    s->step[b] = static_cast<uint32_t>(results[r].output_ids.size());
    s->request_id[b] = static_cast<uint32_t>(batch[b]);
    s->all_greedy = s->all_greedy && requests[r].temperature <= 0.0f;
  }
}

// Every request of `batch` is greedy (a vocabulary-sharded target then needs only the argmax).
inline bool all_greedy(std::span<GenerationRequest const> requests, std::span<int const> batch) {
  return std::all_of(batch.begin(), batch.end(), [&](int r) {
    return requests[static_cast<size_t>(r)].temperature <= 0.0f;
  });
}

// The target of each executor (engine/target_cpu.hpp, engine/target_cuda.cuh).
template <class Exec>
struct TargetFor {
  static_assert(kDependentFalse<Exec>, "SpecEngine: no target for this executor");
};
template <>
struct TargetFor<CpuExecutor> {
  using type = CpuTarget;
};
#if defined(__CUDACC__)
template <>
struct TargetFor<CudaExecutor> {
  using type = CudaTarget;
};
#endif

// The EAGLE draft model of each executor (model/eagle/forward_cpu.hpp, forward_cuda.cuh; the
// CUDA draft's calls change its scratch, so the engine holds it non-const), and its state during
// one generate.
template <class Exec>
struct DraftFor {
  static_assert(kDependentFalse<Exec>, "SpecEngine: no draft model for this executor");
};

// The host draft's state during one generate: its cache and each request's last extend row
// (hidden [H], logits [Vd]), indexed by request.
struct HostDraftRun {
  model::eagle::DraftCache cache;
  std::vector<std::vector<float>> hidden, logits;
};

template <>
struct DraftFor<CpuExecutor> {
  using Model = model::eagle::DraftCpuModel const;
  using Run = HostDraftRun;
};

#if defined(__CUDACC__)
// The CUDA draft's state during one generate, all on the device but the small per-step arrays:
// its cache (one slot per request), the last extend's hidden / logits rows [B, H] / [B, Vd] in the
// order of that extend's batch (the next proposal's batch, which propose checks), and the
// proposal's buffers, sized once for R requests.
//   extend(ids [B], counts [B], tokens [sum counts] host, features [sum counts, F] device)
//   propose(ids [B], roots [B] host, &tokens, &parents [B, N] host): draft_expand at step 0 on
//       the extend's logits; for each later step the host reads next_branch [B, K] back (the
//       draft's parent_scratch is a host array), gathers the parents' hidden rows on the device
//       and runs draft_step on the K frontier tokens (device); draft_finalize on the device, then
//       tokens / parents / status [B, N] / [B] to the host, and draft_device_errors (the one
//       check of the tokens the draft read since the last proposal).
class CudaDraftRun {
 public:
  using Model = model::eagle::DraftCudaModel;
  model::eagle::DraftCudaCache cache;

  // R requests of up to max_length draft entries (prompt + new tokens + path capacity), the
  // largest extend of extend_rows entries; topk K, steps S, nodes N of the policy.
  Status create(Model* model, CudaExecutor exec, int R, int64_t max_length, int64_t extend_rows,
                int K, int S, int N) {
    model_ = model;
    exec_ = exec;
    topk_ = K;
    steps_ = S;
    nodes_ = N;
    int64_t const H = model->hidden(), Vd = model->draft_vocab();
    size_t const r = static_cast<size_t>(R), RK = r * static_cast<size_t>(K);
    size_t const RC = r * static_cast<size_t>(ops::draft_candidate_count(K, S));
    SPECDEC_RETURN_IF_ERROR(model::eagle::DraftCudaCache::create_for(model->config, R, max_length,
                                                                     int64_t{S} * K, &cache));
    SPECDEC_RETURN_IF_ERROR(model::eagle::reserve_draft_scratch(
        *model, std::max<int64_t>(extend_rows, static_cast<int64_t>(RK)), S));
    SPECDEC_RETURN_IF_ERROR(hidden_last_.reserve(r * H));
    SPECDEC_RETURN_IF_ERROR(logits_last_.reserve(r * Vd));
    SPECDEC_RETURN_IF_ERROR(parent_hidden_.reserve(RK * H));
    SPECDEC_RETURN_IF_ERROR(step_hidden_.reserve(RK * H));
    SPECDEC_RETURN_IF_ERROR(step_logits_.reserve(RK * Vd));
    SPECDEC_RETURN_IF_ERROR(cand_scores_.reserve(RC));
    SPECDEC_RETURN_IF_ERROR(cand_tokens_.reserve(RC));
    SPECDEC_RETURN_IF_ERROR(cand_parent_.reserve(RC));
    for (auto* b : {&next_scores_, &frontier_scores_}) SPECDEC_RETURN_IF_ERROR(b->reserve(RK));
    for (auto* b : {&next_slots_, &next_tokens_, &next_draft_, &next_branch_, &frontier_slots_}) {
      SPECDEC_RETURN_IF_ERROR(b->reserve(RK));
    }
    size_t const RN = r * static_cast<size_t>(N);
    for (auto* b : {&out_tokens_, &out_parents_, &node_slot_})
      SPECDEC_RETURN_IF_ERROR(b->reserve(RN));
    SPECDEC_RETURN_IF_ERROR(status_.reserve(r));
    // draft_expand's workspace, zeroed once (its launches leave it zeroed).
    workspace_bytes_ = ops::draft_expand_workspace_bytes(R, static_cast<int>(Vd), K);
    SPECDEC_RETURN_IF_ERROR(workspace_.reserve((workspace_bytes_ + 7) / 8));
    workspace_bytes_ = (workspace_bytes_ + 7) / 8 * 8;
    SPECDEC_CUDA_TRY(cudaMemsetAsync(workspace_.data(), 0, workspace_bytes_, exec_.stream));
    return Status::Ok();
  }

  Status extend(std::span<model::kimi::RequestId const> ids, std::span<int32_t const> counts,
                std::span<int32_t const> tokens, std::span<float const> features) {
    int64_t const B = static_cast<int64_t>(ids.size());
    int64_t const H = model_->hidden(), Vd = model_->draft_vocab();
    int32_t* d_tokens = nullptr;
    SPECDEC_RETURN_IF_ERROR(tokens_.put(tokens.data(), tokens.size(), exec_.stream, &d_tokens));
    SPECDEC_RETURN_IF_ERROR(
        model::eagle::draft_extend(exec_, *model_, &cache, ids, counts, {d_tokens, tokens.size()},
                                   features, {hidden_last_.data(), static_cast<size_t>(B * H)},
                                   {logits_last_.data(), static_cast<size_t>(B * Vd)}));
    extended_.assign(ids.begin(), ids.end());
    // The host waits, so that the extend's phase time holds its GPU work (as the target's
    // forwards do, engine/target_cuda.cuh).
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
    return Status::Ok();
  }

  Status propose(std::span<model::kimi::RequestId const> ids, std::span<int32_t const> roots,
                 std::vector<int32_t>* tokens, std::vector<int32_t>* parents) {
    int const B = static_cast<int>(ids.size()), K = topk_, S = steps_, N = nodes_;
    if (!std::equal(ids.begin(), ids.end(), extended_.begin(), extended_.end())) {
      return Status::Internal(
          "SpecEngine (cuda): the proposal's batch is not the last draft extend's");
    }
    int64_t const H = model_->hidden(), Vd = model_->draft_vocab();
    size_t const BK = static_cast<size_t>(B) * K, BN = static_cast<size_t>(B) * N;
    cudaStream_t const stream = exec_.stream;
    // Step 0's frontier: the root of every request (score 0, slot -1).
    SPECDEC_CUDA_TRY(cudaMemsetAsync(frontier_scores_.data(), 0, sizeof(float) * B, stream));
    SPECDEC_CUDA_TRY(cudaMemsetAsync(frontier_slots_.data(), 0xff, sizeof(int32_t) * B, stream));
    ops::DraftSelectBuffers buffers;
    buffers.batch = B;
    buffers.vocab = static_cast<int>(Vd);
    buffers.topk = K;
    buffers.steps = S;
    buffers.cand_tokens = cand_tokens_.data();
    buffers.cand_scores = cand_scores_.data();
    buffers.cand_parent = cand_parent_.data();
    buffers.next_scores = next_scores_.data();
    buffers.next_slots = next_slots_.data();
    buffers.next_tokens = next_tokens_.data();
    buffers.next_draft_tokens = next_draft_.data();
    buffers.next_branch = next_branch_.data();
    buffers.workspace = workspace_.data();
    buffers.workspace_bytes = workspace_bytes_;
    int64_t const* d2t = model_->d2t.empty() ? nullptr : model_->d2t_device;
    // The branches' hidden rows [B * branches, H] and logits; their scratch indices (host).
    float const* hidden = hidden_last_.data();
    float const* logits = logits_last_.data();
    std::vector<int32_t> scratch(static_cast<size_t>(B), -1), next_branch(BK), parent_scratch(BK);
    std::vector<int64_t> from(BK);
    int branches = 1;
    for (int s = 0; s < S; ++s) {
      if (s > 0) {
        // Each frontier branch i extends branch next_branch[i] of the previous forward.
        for (int b = 0; b < B; ++b) {
          for (int i = 0; i < K; ++i) {
            size_t const at = static_cast<size_t>(b) * K + i;
            from[at] = int64_t{b} * branches + next_branch[at];
            parent_scratch[at] = scratch[static_cast<size_t>(from[at])];
          }
        }
        int64_t* d_from = nullptr;
        SPECDEC_RETURN_IF_ERROR(from_.put(from, stream, &d_from));
        SPECDEC_RETURN_IF_ERROR(gather_rows(hidden, d_from, static_cast<int64_t>(BK), H,
                                            parent_hidden_.data(), stream));
        SPECDEC_RETURN_IF_ERROR(model::eagle::draft_step(
            exec_, *model_, &cache, ids, K, {next_tokens_.data(), BK},
            {parent_hidden_.data(), BK * H}, parent_scratch, {step_hidden_.data(), BK * H},
            {step_logits_.data(), BK * Vd}, &scratch));
        SPECDEC_CUDA_TRY(cudaMemcpyAsync(frontier_scores_.data(), next_scores_.data(),
                                         sizeof(float) * BK, cudaMemcpyDeviceToDevice, stream));
        SPECDEC_CUDA_TRY(cudaMemcpyAsync(frontier_slots_.data(), next_slots_.data(),
                                         sizeof(int32_t) * BK, cudaMemcpyDeviceToDevice, stream));
        hidden = step_hidden_.data();
        logits = step_logits_.data();
        branches = K;
      }
      ops::DraftExpandParams const x =
          buffers.expand(s, logits, frontier_scores_.data(), frontier_slots_.data(), d2t);
      SPECDEC_RETURN_IF_ERROR(ops::draft_expand(exec_, x));
      if (s + 1 < S) {
        SPECDEC_RETURN_IF_ERROR(next_branch_.get(next_branch.data(), BK, stream));
        SPECDEC_CUDA_TRY(cudaStreamSynchronize(stream));
      }
    }
    int32_t* d_roots = nullptr;
    SPECDEC_RETURN_IF_ERROR(roots_.put(roots.data(), roots.size(), stream, &d_roots));
    ops::DraftFinalizeParams const f = buffers.finalize(
        d_roots, N, out_tokens_.data(), out_parents_.data(), node_slot_.data(), status_.data());
    SPECDEC_RETURN_IF_ERROR(ops::draft_finalize(exec_, f));
    tokens->assign(BN, -1);
    parents->assign(BN, -1);
    std::vector<int32_t> status(static_cast<size_t>(B));
    SPECDEC_RETURN_IF_ERROR(out_tokens_.get(tokens->data(), BN, stream));
    SPECDEC_RETURN_IF_ERROR(out_parents_.get(parents->data(), BN, stream));
    SPECDEC_RETURN_IF_ERROR(status_.get(status.data(), static_cast<size_t>(B), stream));
    // Waits for the stream (so the copies above have landed).
    SPECDEC_RETURN_IF_ERROR(model::eagle::draft_device_errors(exec_, *model_));
    for (int b = 0; b < B; ++b) {
      if (status[static_cast<size_t>(b)] != ops::kDraftSelectOk) {
        return Status::Internal("SpecEngine: draft_finalize status " +
                                std::to_string(status[static_cast<size_t>(b)]) + " for request " +
                                std::to_string(ids[static_cast<size_t>(b)]));
      }
    }
    return Status::Ok();
  }

 private:
  Model* model_ = nullptr;
  CudaExecutor exec_{};
  int topk_ = 0, steps_ = 0, nodes_ = 0;
  std::vector<model::kimi::RequestId> extended_;  // the last extend's batch
  size_t workspace_bytes_ = 0;
  Staging<float> hidden_last_, logits_last_, parent_hidden_, step_hidden_, step_logits_,
      cand_scores_, next_scores_, frontier_scores_;
  Staging<int32_t> tokens_, roots_, cand_tokens_, cand_parent_, next_slots_, next_tokens_,
      next_draft_, next_branch_, frontier_slots_, out_tokens_, out_parents_, node_slot_, status_;
  Staging<int64_t> from_;
  Staging<uint64_t> workspace_;
};

template <>
struct DraftFor<CudaExecutor> {
  using Model = model::eagle::DraftCudaModel;
  using Run = CudaDraftRun;
};
#endif

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace detail

template <SpecPolicyBundle P, class Exec>
class SpecEngine {
 public:
  using Policy = P;
  using Target = typename detail::TargetFor<Exec>::type;
  using TargetModel = typename Target::Model;
  // DraftCpuModel const (CpuExecutor), DraftCudaModel (CudaExecutor).
  using DraftModel = typename detail::DraftFor<Exec>::Model;
  static constexpr DraftKind kKind = P::kKind;
  // EAGLE3 and EAGLE draft with a model (model/eagle), the others without.
  static constexpr bool kDraftsWithModel =
      kKind == DraftKind::kEagle3 || kKind == DraftKind::kEagle;
  static constexpr int kNodes = P::kNodes;
  static constexpr int kTopK = P::kTopK;
  static constexpr int kSteps = P::kSteps;
  // Deepest accepted path + 1: an n-gram tree may be a chain of all N nodes.
  static constexpr int kPathCapacity = kKind == DraftKind::kNGram ? kNodes : kSteps + 1;
  // The draft runs on the host (CpuExecutor) or on the device (CudaExecutor).
  static constexpr bool kHostDraft = std::is_same_v<Exec, CpuExecutor>;

  static Status create(TargetModel* target, DraftModel* draft, EngineOptions const& options,
                       SpecEngine* out, Exec exec = Exec{}) {
    std::string const fn = "SpecEngine<" + describe<P>() + ">::create: ";
    auto bad = [&](std::string m) { return Status::InvalidArgument(fn + m); };
    if (out == nullptr) return bad("out is null");
    if (target == nullptr) return bad("the target model is null");
    if (options.page_size < 1)
      return bad("page_size " + std::to_string(options.page_size) + " < 1");
    if constexpr (kDraftsWithModel) {
      if (draft == nullptr) {
        return bad(std::string(P::kName) + " needs a draft model (--speculative-draft-model-path)");
      }
      SPECDEC_RETURN_IF_ERROR(check_draft_fits<P>(draft->kind(), draft->layers()).prefixed(fn));
      int const L = target->config.num_hidden_layers;
      for (int id : draft->feature_layers) {
        if (id < kEmbedding || id >= L) {
          return bad("the draft reads target stream " + std::to_string(id) +
                     ", outside the target's [-1, " + std::to_string(L) + ")");
        }
      }
      int64_t const width =
          static_cast<int64_t>(draft->feature_layers.size()) * target->config.hidden_size;
      if (draft->feature_width() != width) {
        return bad("the draft reads " + std::to_string(draft->feature_width()) +
                   " features, the target gives |streams " + format_layers(draft->feature_layers) +
                   "| x hidden " + std::to_string(target->config.hidden_size) + " = " +
                   std::to_string(width));
      }
      if (draft->draft_vocab() < kTopK) {
        return bad("the draft's vocabulary of " + std::to_string(draft->draft_vocab()) +
                   " ids is smaller than the tree's topk " + std::to_string(kTopK));
      }
      if (draft->vocab() != target->config.vocab_size) {
        return bad("the draft maps to a vocabulary of " + std::to_string(draft->vocab()) +
                   " ids, the target has " + std::to_string(target->config.vocab_size));
      }
      if constexpr (!kHostDraft) {
        // The CUDA draft_select kernels' limits (ops/draft_select/params.hpp).
        if (!ops::draft_topk_supported(kTopK)) {
          return Status::Unsupported(fn + "topk " + std::to_string(kTopK) +
                                     " has no CUDA draft_expand kernel: use one of " +
                                     ops::kDraftSelectTopKList);
        }
        if (ops::draft_candidate_count(kTopK, kSteps) > ops::kDraftFinalizeMaxCandidates) {
          return Status::Unsupported(
              fn + "topk + (steps - 1) * topk^2 = " +
              std::to_string(ops::draft_candidate_count(kTopK, kSteps)) + " candidates exceed " +
              std::to_string(ops::kDraftFinalizeMaxCandidates) + ", CUDA draft_finalize's limit");
        }
      }
    } else if (draft != nullptr) {
      return bad(std::string(P::kName) + " takes no draft model, but one was given");
    }
    if (options.ngram_min_n < 1 || options.ngram_max_n < options.ngram_min_n) {
      return bad("n-gram sizes min " + std::to_string(options.ngram_min_n) + " max " +
                 std::to_string(options.ngram_max_n) + ": need 1 <= min <= max");
    }
    out->target_ = target;
    out->draft_ = draft;
    out->options_ = options;
    out->exec_ = exec;
    return Status::Ok();
  }

  Status generate(std::span<GenerationRequest const> requests,
                  std::vector<GenerationResult>* results, SpecMetrics* total) const {
    if (target_ == nullptr) return Status::InvalidArgument("SpecEngine::generate: not created");
    if (results == nullptr) return Status::InvalidArgument("SpecEngine::generate: results is null");
    if (requests.empty()) return Status::InvalidArgument("SpecEngine::generate: no requests");
    for (size_t r = 0; r < requests.size(); ++r) {
      SPECDEC_RETURN_IF_ERROR(detail::check_request(target_->config, requests[r],
                                                    static_cast<int>(r), kPathCapacity,
                                                    options_.page_size)
                                  .prefixed("SpecEngine::generate: "));
      if constexpr (kDraftsWithModel) {
        int64_t const last = static_cast<int64_t>(requests[r].prompt.size()) +
                             requests[r].max_new_tokens + kPathCapacity - 1;
        int64_t const limit = draft_->config.max_position_embeddings;
        if (last > limit) {
          return Status::InvalidArgument(
              "SpecEngine::generate: request " + std::to_string(r) + ": " +
              std::to_string(requests[r].prompt.size()) + " prompt tokens + " +
              std::to_string(requests[r].max_new_tokens) + " new tokens + " +
              std::to_string(kPathCapacity - 1) +
              " speculative positions exceed the draft's max_position_embeddings " +
              std::to_string(limit));
        }
      }
    }
    Run run(*this, requests);
    SPECDEC_RETURN_IF_ERROR(run.start());
    while (!run.active.empty()) SPECDEC_RETURN_IF_ERROR(run.step());
    if (total != nullptr) *total = run.total();
    *results = std::move(run.results);
    return Status::Ok();
  }

 private:
  // The state of one generate call.
  struct Run {
    SpecEngine const& e;
    io::DeepseekV3Config const& cfg;
    std::span<GenerationRequest const> requests;
    int64_t V;
    std::vector<GenerationResult> results;
    std::vector<std::vector<int32_t>> history;   // prompt + output per request
    std::vector<int> active;                     // running request indices, increasing
    Target target;                               // target KV; RequestId = request index
    typename detail::DraftFor<Exec>::Run draft;  // EAGLE3 / EAGLE: cache, last extend rows
    SpecMetrics batch_time;                      // phase times, once per batch phase

    Run(SpecEngine const& engine, std::span<GenerationRequest const> reqs)
        : e(engine),
          cfg(engine.target_->config),
          requests(reqs),
          V(cfg.vocab_size),
          results(reqs.size()),
          history(reqs.size()),
          target(engine.target_, engine.exec_) {
      for (GenerationResult& r : results) r.metrics.reserve_depth(kPathCapacity - 1);
      batch_time.reserve_depth(kPathCapacity - 1);
    }

    // The target streams the draft reads (none without a draft model).
    std::span<int const> aux_layers() const {
      if constexpr (kDraftsWithModel) return e.draft_->feature_layers;
      return {};
    }

    std::vector<model::kimi::RequestId> ids_of(std::span<int const> batch) const {
      return std::vector<model::kimi::RequestId>(batch.begin(), batch.end());
    }

    // Adds `token` to request r's output; true when the request is done.
    bool push(int r, int32_t token) {
      GenerationResult& out = results[static_cast<size_t>(r)];
      out.output_ids.push_back(token);
      history[static_cast<size_t>(r)].push_back(token);
      if (requests[static_cast<size_t>(r)].stop_at_eos) {
        for (int64_t eos : cfg.eos_token_ids) {
          if (eos == token) {
            out.stopped_at_eos = true;
            return true;
          }
        }
      }
      return static_cast<int>(out.output_ids.size()) >=
             requests[static_cast<size_t>(r)].max_new_tokens;
    }

    void add_time(double SpecMetrics::*phase, double seconds, std::span<int const> batch) {
      batch_time.*phase += seconds;
      for (int r : batch) results[static_cast<size_t>(r)].metrics.*phase += seconds;
    }

    Status start() {
      auto const t0 = detail::Clock::now();
      int const R = static_cast<int>(requests.size());
      int64_t total_pages = 0;
      int max_pages = 1;
      std::vector<int> pages(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        GenerationRequest const& q = requests[static_cast<size_t>(r)];
        pages[static_cast<size_t>(r)] = static_cast<int>(
            ceil_div<int64_t>(static_cast<int64_t>(q.prompt.size()) + q.max_new_tokens + kNodes,
                              e.options_.page_size));
        total_pages += pages[static_cast<size_t>(r)];
        max_pages = std::max(max_pages, pages[static_cast<size_t>(r)]);
      }
      SPECDEC_RETURN_IF_ERROR(
          target.create_cache(e.options_.page_size, static_cast<int>(total_pages), max_pages));
      model::kimi::MlaCache& cache = target.table();
      std::vector<int> all(static_cast<size_t>(R));
      std::iota(all.begin(), all.end(), 0);
      std::vector<int32_t> counts, tokens;
      if constexpr (kDraftsWithModel && kHostDraft) {
        SPECDEC_RETURN_IF_ERROR(
            model::eagle::DraftCache::create_for(e.draft_->config, &draft.cache));
        draft.hidden.resize(static_cast<size_t>(R));
        draft.logits.resize(static_cast<size_t>(R));
      } else if constexpr (kDraftsWithModel) {
        // Entries per request: prompt + new tokens + the speculative positions past them.
        int64_t max_length = 1, prompt_rows = 0;
        for (GenerationRequest const& q : requests) {
          int64_t const n = static_cast<int64_t>(q.prompt.size());
          max_length = std::max(max_length, n + q.max_new_tokens + kPathCapacity);
          prompt_rows += n;
        }
        SPECDEC_RETURN_IF_ERROR(draft.create(e.draft_, e.exec_, R, max_length,
                                             std::max<int64_t>(prompt_rows, int64_t{R} * kNodes),
                                             kTopK, kSteps, kNodes));
      }
      for (int r = 0; r < R; ++r) {
        SPECDEC_RETURN_IF_ERROR(cache.add_request(r));
        SPECDEC_RETURN_IF_ERROR(
            cache.reserve(r, int64_t{pages[static_cast<size_t>(r)]} * e.options_.page_size));
        auto const& prompt = requests[static_cast<size_t>(r)].prompt;
        counts.push_back(static_cast<int32_t>(prompt.size()));
        tokens.insert(tokens.end(), prompt.begin(), prompt.end());
        history[static_cast<size_t>(r)] = prompt;
        if constexpr (kDraftsWithModel) {
          SPECDEC_RETURN_IF_ERROR(draft.cache.add_request(r));
        }
      }
      auto const ids = ids_of(all);
      SPECDEC_RETURN_IF_ERROR(
          target.prefill(ids, counts, tokens, aux_layers(), detail::all_greedy(requests, all)));
      // The first token of every request from its prompt's last row.
      std::vector<int64_t> first_row(static_cast<size_t>(R)), last_row(static_cast<size_t>(R));
      int64_t row = 0;
      for (int r = 0; r < R; ++r) {
        first_row[static_cast<size_t>(r)] = row;
        row += counts[static_cast<size_t>(r)];
        last_row[static_cast<size_t>(r)] = row - 1;
      }
      BatchSampling s;
      detail::fill_sampling(requests, all, results, &s);
      std::vector<int32_t> drawn;
      SPECDEC_RETURN_IF_ERROR(target.sample_rows(last_row, s, &drawn));
      for (int r = 0; r < R; ++r) {
        if (!push(r, drawn[static_cast<size_t>(r)])) active.push_back(r);
      }
      if constexpr (kDraftsWithModel) {
        // Draft entry i of a prompt: token i + 1 (the drawn token after the last) with the
        // target's features of token i.
        std::vector<int32_t> d_counts, d_tokens;
        std::vector<int64_t> rows;
        for (int r : active) {
          auto const& h = history[static_cast<size_t>(r)];
          int64_t const T = counts[static_cast<size_t>(r)];
          d_counts.push_back(static_cast<int32_t>(T));
          d_tokens.insert(d_tokens.end(), h.begin() + 1, h.begin() + T + 1);
          for (int64_t i = 0; i < T; ++i) rows.push_back(first_row[static_cast<size_t>(r)] + i);
        }
        SPECDEC_RETURN_IF_ERROR(extend(active, d_counts, d_tokens, rows));
      }
      add_time(&SpecMetrics::prefill_s, detail::seconds_since(t0), all);
      return Status::Ok();
    }

    // The draft consumes tokens [sum counts] with the features of the last target forward's
    // rows `rows` [sum counts] for batch; keeps each request's last hidden / logits row for the
    // next proposal (on the host, or on the device for the CUDA draft, whose features are
    // gathered on the device).
    Status extend(std::span<int const> batch, std::vector<int32_t> const& counts,
                  std::vector<int32_t> const& tokens, std::vector<int64_t> const& rows) {
      if (batch.empty()) return Status::Ok();
      auto const ids = ids_of(batch);
      if constexpr (!kHostDraft) {
        std::span<float const> features;
        SPECDEC_RETURN_IF_ERROR(target.gather_aux_rows(rows, &features));
        return draft.extend(ids, counts, tokens, features);
      } else {
        std::vector<float> features;
        SPECDEC_RETURN_IF_ERROR(target.aux_rows(rows, &features));
        std::vector<float> hidden, logits;
        SPECDEC_RETURN_IF_ERROR(model::eagle::draft_extend(CpuExecutor{}, *e.draft_, &draft.cache,
                                                           ids, counts, tokens, features, &hidden,
                                                           &logits));
        int64_t const H = e.draft_->hidden(), Vd = e.draft_->draft_vocab();
        for (size_t b = 0; b < batch.size(); ++b) {
          size_t const r = static_cast<size_t>(batch[b]);
          draft.hidden[r].assign(hidden.begin() + static_cast<int64_t>(b) * H,
                                 hidden.begin() + static_cast<int64_t>(b + 1) * H);
          draft.logits[r].assign(logits.begin() + static_cast<int64_t>(b) * Vd,
                                 logits.begin() + static_cast<int64_t>(b + 1) * Vd);
        }
        return Status::Ok();
      }
    }

    // Propose for the batch: tokens / parents [B, N], node_count [B].
    Status propose(std::span<int const> batch, std::vector<int32_t>* tokens,
                   std::vector<int32_t>* parents, std::vector<int32_t>* node_count) {
      int const B = static_cast<int>(batch.size());
      size_t const BN = static_cast<size_t>(B) * kNodes;
      tokens->assign(BN, -1);
      parents->assign(BN, -1);
      node_count->assign(static_cast<size_t>(B), kNodes);
      if constexpr (kKind == DraftKind::kNone) {
        for (int b = 0; b < B; ++b) {
          (*tokens)[static_cast<size_t>(b) * kNodes] =
              history[static_cast<size_t>(batch[b])].back();
        }
        return Status::Ok();
      } else if constexpr (kKind == DraftKind::kNGram) {
        size_t max_len = 0;
        for (int r : batch) max_len = std::max(max_len, history[static_cast<size_t>(r)].size());
        std::vector<int32_t> text(static_cast<size_t>(B) * max_len, 0), lengths(B);
        for (int b = 0; b < B; ++b) {
          auto const& h = history[static_cast<size_t>(batch[b])];
          std::copy(h.begin(), h.end(), text.begin() + static_cast<int64_t>(b) * max_len);
          lengths[static_cast<size_t>(b)] = static_cast<int32_t>(h.size());
        }
        ops::NgramLookupParams p;
        p.tokens = text.data();
        p.lengths = lengths.data();
        p.batch = B;
        p.max_len = static_cast<int>(max_len);
        p.min_n = e.options_.ngram_min_n;
        p.max_n = e.options_.ngram_max_n;
        p.nodes = kNodes;
        p.branches = kTopK;
        p.out_tokens = tokens->data();
        p.out_parents = parents->data();
        p.out_node_count = node_count->data();
        return ops::ngram_lookup(CpuExecutor{}, p);
      } else if constexpr (kDraftsWithModel && !kHostDraft) {
        std::vector<int32_t> roots(static_cast<size_t>(B));
        for (int b = 0; b < B; ++b)
          roots[static_cast<size_t>(b)] = history[static_cast<size_t>(batch[b])].back();
        return draft.propose(ids_of(batch), roots, tokens, parents);
      } else if constexpr (kDraftsWithModel) {
        return propose_with_draft(batch, tokens, parents);
      } else {
        return Status::Unsupported("SpecEngine: no proposer for " + std::string(P::kName));
      }
    }

    Status propose_with_draft(std::span<int const> batch, std::vector<int32_t>* tokens,
                              std::vector<int32_t>* parents) {
      int const B = static_cast<int>(batch.size()), K = kTopK, S = kSteps;
      int64_t const H = e.draft_->hidden(), Vd = e.draft_->draft_vocab();
      int const C = ops::draft_candidate_count(K, S);
      auto const ids = ids_of(batch);
      std::vector<int32_t> cand_tokens(static_cast<size_t>(B) * C),
          cand_parent(static_cast<size_t>(B) * C), next_slots(static_cast<size_t>(B) * K),
          next_tokens(static_cast<size_t>(B) * K), next_draft(static_cast<size_t>(B) * K),
          next_branch(static_cast<size_t>(B) * K), frontier_slots(static_cast<size_t>(B) * K, -1);
      std::vector<float> cand_scores(static_cast<size_t>(B) * C),
          next_scores(static_cast<size_t>(B) * K),
          frontier_scores(static_cast<size_t>(B) * K, 0.0f);
      // Step 0's logits (one branch per request: the root) and the branches' hidden / scratch.
      std::vector<float> logits(static_cast<size_t>(B * Vd)), hidden(static_cast<size_t>(B * H));
      std::vector<int32_t> scratch(static_cast<size_t>(B), -1);
      for (int b = 0; b < B; ++b) {
        size_t const r = static_cast<size_t>(batch[b]);
        std::copy(draft.logits[r].begin(), draft.logits[r].end(), logits.begin() + b * Vd);
        std::copy(draft.hidden[r].begin(), draft.hidden[r].end(), hidden.begin() + b * H);
      }
      ops::DraftSelectBuffers const buffers{B,
                                            static_cast<int>(Vd),
                                            K,
                                            S,
                                            cand_tokens.data(),
                                            cand_scores.data(),
                                            cand_parent.data(),
                                            next_scores.data(),
                                            next_slots.data(),
                                            next_tokens.data(),
                                            next_draft.data(),
                                            next_branch.data()};
      int branches = 1;
      for (int s = 0; s < S; ++s) {
        if (s > 0) {
          // Each frontier branch i extends branch next_branch[i] of the previous forward.
          std::vector<float> parent_hidden(static_cast<size_t>(B * K * H));
          std::vector<int32_t> parent_scratch(static_cast<size_t>(B * K));
          for (int b = 0; b < B; ++b) {
            for (int i = 0; i < K; ++i) {
              int const from = b * branches + next_branch[static_cast<size_t>(b * K + i)];
              std::copy_n(hidden.begin() + from * H, H, parent_hidden.begin() + (b * K + i) * H);
              parent_scratch[static_cast<size_t>(b * K + i)] = scratch[static_cast<size_t>(from)];
            }
          }
          SPECDEC_RETURN_IF_ERROR(
              model::eagle::draft_step(CpuExecutor{}, *e.draft_, &draft.cache, ids, K, next_tokens,
                                       parent_hidden, parent_scratch, &hidden, &logits, &scratch));
          frontier_scores = next_scores;
          frontier_slots = next_slots;
          branches = K;
        }
        ops::DraftExpandParams const x = buffers.expand(
            s, logits.data(), frontier_scores.data(), frontier_slots.data(), e.draft_->d2t.data());
        SPECDEC_RETURN_IF_ERROR(ops::draft_expand(CpuExecutor{}, x));
      }
      std::vector<int32_t> roots(static_cast<size_t>(B)),
          node_slot(static_cast<size_t>(B) * kNodes), status(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b)
        roots[static_cast<size_t>(b)] = history[static_cast<size_t>(batch[b])].back();
      ops::DraftFinalizeParams const f = buffers.finalize(
          roots.data(), kNodes, tokens->data(), parents->data(), node_slot.data(), status.data());
      SPECDEC_RETURN_IF_ERROR(ops::draft_finalize(CpuExecutor{}, f));
      for (int b = 0; b < B; ++b) {
        if (status[static_cast<size_t>(b)] != ops::kDraftSelectOk) {
          return Status::Internal("SpecEngine: draft_finalize status " +
                                  std::to_string(status[static_cast<size_t>(b)]) + " for request " +
                                  std::to_string(batch[b]));
        }
      }
      return Status::Ok();
    }

    Status step() {
      std::vector<int> const batch = active;
      int const B = static_cast<int>(batch.size());
      auto const ids = ids_of(batch);

      // 1. Propose.
      auto t = detail::Clock::now();
      std::vector<int32_t> tokens, parents, node_count;
      SPECDEC_RETURN_IF_ERROR(propose(batch, &tokens, &parents, &node_count));
      // The step verifies N = the batch's largest proposal (an n-gram lookup may propose fewer
      // than kNodes, down to the root alone): [B, kNodes] -> [B, N].
      int const N = *std::max_element(node_count.begin(), node_count.end());
      if (N < kNodes) {
        for (int b = 1; b < B; ++b) {
          std::copy_n(tokens.begin() + int64_t{b} * kNodes, N, tokens.begin() + int64_t{b} * N);
          std::copy_n(parents.begin() + int64_t{b} * kNodes, N, parents.begin() + int64_t{b} * N);
        }
        tokens.resize(static_cast<size_t>(B) * N);
        parents.resize(static_cast<size_t>(B) * N);
      }
      int const W = mask_words(N), P_cap = std::min(kPathCapacity, N);
      size_t const BN = static_cast<size_t>(B) * N;
      add_time(&SpecMetrics::draft_s, detail::seconds_since(t), batch);

      // 2. Build.
      t = detail::Clock::now();
      std::vector<int32_t> prefix(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) {
        int64_t length = 0;
        SPECDEC_RETURN_IF_ERROR(target.table().length(batch[static_cast<size_t>(b)], &length));
        prefix[static_cast<size_t>(b)] = static_cast<int32_t>(length);
      }
      TreeInput const tree{tokens.data(), parents.data(), node_count.data(), B, N};
      std::vector<uint32_t> mask(BN * W);
      std::vector<int32_t> depth(BN), positions(BN), first_child(BN), next_sibling(BN),
          leaf_paths(BN * P_cap), leaf_count(static_cast<size_t>(B)),
          tree_status(static_cast<size_t>(B));
      ops::TreeBuildParams tb;
      tb.tree = tree;
      tb.prefix_len = prefix.data();
      tb.out = TreeTopology{mask.data(),        depth.data(),        positions.data(),
                            first_child.data(), next_sibling.data(), leaf_paths.data(),
                            leaf_count.data(),  tree_status.data(),  P_cap};
      SPECDEC_RETURN_IF_ERROR(ops::tree_build(CpuExecutor{}, tb));
      SPECDEC_RETURN_IF_ERROR(check_tree_status(tree_status.data(), B));
      add_time(&SpecMetrics::build_s, detail::seconds_since(t), batch);

      // 3. Verify forward over the N slots; slots past a smaller tree's node count hold the root
      // token as a child of the root (valid for the forward, never read by accept or commit).
      t = detail::Clock::now();
      std::vector<int32_t> v_tokens = tokens, v_positions = positions;
      std::vector<uint32_t> v_mask = mask;
      for (int b = 0; b < B; ++b) {
        for (int i = node_count[static_cast<size_t>(b)]; i < N; ++i) {
          size_t const at = static_cast<size_t>(b) * N + i;
          v_tokens[at] = tokens[static_cast<size_t>(b) * N];
          v_positions[at] = prefix[static_cast<size_t>(b)] + 1;
          uint32_t* row = &v_mask[at * W];
          std::fill(row, row + W, 0u);
          row[0] |= 1u;
          row[i >> 5] |= 1u << (i & 31);
        }
      }
      SPECDEC_RETURN_IF_ERROR(target.verify(ids, N, v_tokens, v_positions, v_mask, aux_layers(),
                                            detail::all_greedy(requests, batch)));
      add_time(&SpecMetrics::verify_s, detail::seconds_since(t), batch);

      // 4. Accept, 5. commit.
      t = detail::Clock::now();
      std::vector<int32_t> path(static_cast<size_t>(B) * P_cap), num_accepted(B), next_token(B);
      Acceptance const acc{path.data(), num_accepted.data(), next_token.data(), P_cap};
      TreeLinks const links{depth.data(), first_child.data(), next_sibling.data(),
                            tree_status.data()};
      BatchSampling s;
      detail::fill_sampling(requests, batch, results, &s);
      SPECDEC_RETURN_IF_ERROR(target.accept(tree, links, s, acc));
      SPECDEC_RETURN_IF_ERROR(target.commit(ids, acc));
      std::vector<int> still;
      std::vector<int32_t> d_counts, d_tokens;
      std::vector<int64_t> d_rows;
      for (int b = 0; b < B; ++b) {
        int const r = batch[static_cast<size_t>(b)];
        int const a = num_accepted[static_cast<size_t>(b)];
        std::vector<int> proposed_depths;
        for (int i = 1; i < node_count[static_cast<size_t>(b)]; ++i) {
          proposed_depths.push_back(depth[static_cast<size_t>(b) * N + i]);
        }
        // The committed tokens: the accepted drafts, then the bonus / correction; the output
        // takes them until the request stops.
        std::vector<int32_t> committed;
        for (int k = 1; k <= a; ++k) {
          committed.push_back(
              tokens[static_cast<size_t>(b) * N + path[static_cast<size_t>(b) * P_cap + k]]);
        }
        committed.push_back(next_token[static_cast<size_t>(b)]);
        bool done = false;
        int taken = 0;
        for (int32_t token : committed) {
          ++taken;
          if ((done = push(r, token))) break;
        }
        results[static_cast<size_t>(r)].metrics.record_verify(proposed_depths, std::min(a, taken),
                                                              taken);
        if (done) continue;
        still.push_back(r);
        if constexpr (kDraftsWithModel) {
          // Draft entries: committed token k with the features of path node k - 1.
          d_counts.push_back(a + 1);
          d_tokens.insert(d_tokens.end(), committed.begin(), committed.end());
          for (int k = 0; k <= a; ++k) {
            d_rows.push_back(static_cast<int64_t>(b) * N +
                             path[static_cast<size_t>(b) * P_cap + k]);
          }
        }
      }
      add_time(&SpecMetrics::commit_s, detail::seconds_since(t), batch);
      active = std::move(still);

      // 6. Draft extend.
      if constexpr (kDraftsWithModel) {
        t = detail::Clock::now();
        SPECDEC_RETURN_IF_ERROR(extend(active, d_counts, d_tokens, d_rows));
        add_time(&SpecMetrics::extend_s, detail::seconds_since(t), active);
      }
      return Status::Ok();
    }

    // Counters summed over requests; times of the batch phases, once each.
    SpecMetrics total() const {
      SpecMetrics t;
      for (GenerationResult const& r : results) {
        SpecMetrics counters = r.metrics;
        counters.prefill_s = counters.draft_s = counters.build_s = counters.verify_s =
            counters.commit_s = counters.extend_s = 0.0;
        t.merge(counters);
      }
      t.merge(batch_time);
      return t;
    }
  };

  TargetModel* target_ = nullptr;
  DraftModel* draft_ = nullptr;
  EngineOptions options_;
  Exec exec_{};
};

}  // namespace specdec::engine
