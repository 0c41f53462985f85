// SpecEngine<Policy, Executor>: speculative generation for a batch of requests, the policy's draft
// strategy (EAGLE3, EAGLE, NGRAM, NONE) proposing for the Kimi-K2.5 / DeepseekV3 target.
//
//   SpecEngine<P, CpuExecutor> engine;
//   SpecEngine<P, CpuExecutor>::create(&target, &draft (EAGLE3 / EAGLE; DraftModel) or nullptr,
//                                      options, &engine);
//   engine.generate(requests [R], &results [R], &total);
//
//   SpecEngine<P, CpuExecutor>::Session session(engine);   // continuous batching (below)
//   session.open(options); session.admit(id, request, stream); session.step(&events); ...
//
// Requests may differ in prompt length, max_new_tokens and sampling settings; each runs until it
// stops (an eos id of the target's config when stop_at_eos, one of its stop_ids, or
// max_new_tokens). generate() is one Session that admits every request at once and steps until
// all are done; a Session (engine/scheduler.hpp drives one for the server) admits and cancels
// requests between steps and prefills prompts in chunks (see Session below).
// One run, DESIGN.md "One speculative step":
//   prefill  target prefill of the prompts, in chunks of up to max_prefill_tokens per step (the
//            draft's feature streams captured: EAGLE3 the layer set P::Layers, EAGLE the last
//            layer's output); after a prompt's last chunk its first token is drawn (ops::sample,
//            step 0); the draft consumes each chunk: draft entry i pairs token i + 1 with the
//            target's features of token i
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
//              accepted tokens and the bonus / correction token join the output up to the
//              request's stop (ops::commit_tokens: eos, a stop id, max_new_tokens)
//     extend   EAGLE3 / EAGLE: the draft consumes the committed tokens with their features
// Greedy output equals plain greedy decoding whatever the draft: only the target's logits decide.
// Token for token on the CPU executor; on the CUDA executor up to near-ties, since a verify of N
// rows rounds its bf16 GEMMs (and so may route or argmax a near-tie) unlike a forward of 1 row.
//
// Errors (Status, nothing adjusted): a missing or superfluous draft model, a draft that does not
// fit the policy (algorithm, layer set and order, feature width, vocabulary), a request with an
// empty prompt, an id outside the vocabulary, max_new_tokens < 1, prompt + max_new_tokens +
// kPathCapacity - 1 past max_position_embeddings (the target's, and the draft's), a
// temperature that is negative, not finite or above 0 and below ops::kSampleMinTemperature,
// top_p outside (0, 1], top_k < -1; on the CUDA executor, a tree the CUDA draft_select kernels
// do not take (topk outside {1, 2, 4, 8}, more than 2048 candidates), and a token outside the
// vocabulary that the draft met on the device (draft_device_errors).
//
// Executors (one engine, a target per executor; engine/target_cpu.hpp, engine/target_cuda.cuh):
//   SpecEngine<P, CpuExecutor>   the CPU Kimi forward and the ops' CPU references
//   SpecEngine<P, CudaExecutor>  (CUDA translation units) the CUDA Kimi forward, verify and
//                                kv_commit kernels on the device logits and cache (the target's
//                                step forwards padded to the policy's GraphLadder, eager above
//                                it, captured when KimiCudaModel::graphs is on; Eager: no
//                                padding, every shape captured when graphs are on), and the EAGLE
//                                draft on the device (DraftCudaModel, model/eagle/forward_cuda.cuh:
//                                extend on the target's aux rows gathered on the device, steps,
//                                draft_expand / draft_finalize's CUDA kernels, the proposal's
//                                tree on the device, so that the whole proposal is one CUDA
//                                graph per (batch, steps, nodes), and the extend after a verify
//                                one per shape, padded to the GraphLadder as the target's
//                                forwards: DraftCudaModel::step_graphs). With a draft
//                                model a step waits for the device once
//                                (EngineOptions::device_resident_step): the proposal stays on
//                                the device, tree_build lays out its tree there, the verify
//                                forward reads it there, verify / kv_commit / commit_tokens
//                                run behind it, and the host reads back only the acceptance,
//                                each request's committed tokens and stop, its drafts per
//                                depth and the proposal's status, in one copy. Otherwise (n-gram
//                                lookup and tree_build on the host, or device_resident_step
//                                off) the host holds the tree: one more wait, for the
//                                proposal. Either way the requests stop on the device
//                                (commit_tokens). The verify and the extend are queued
//                                without a wait; the phases are timed by events on the
//                                stream (detail::CudaStepClock).
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
#include <map>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "specdec/core/executor.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/engine/batch.hpp"
#include "specdec/engine/draft_steps.hpp"
#include "specdec/engine/metrics.hpp"
#include "specdec/engine/serving.hpp"
#include "specdec/engine/target_cpu.hpp"
#include "specdec/model/eagle/forward_cpu.hpp"
#include "specdec/model/kimi/generate.hpp"
#include "specdec/ops/commit_tokens/commit_tokens.hpp"
#include "specdec/ops/draft_select/draft_select.hpp"
#include "specdec/ops/ngram_lookup/ngram_lookup.hpp"
#include "specdec/ops/tree_build/tree_build.hpp"
#include "specdec/policy/spec_policy.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/core/cuda_graph.cuh"
#include "specdec/engine/target_cuda.cuh"
#include "specdec/model/eagle/forward_cuda.cuh"
#endif

namespace specdec::engine {

// GenerationRequest (engine/serving.hpp): prompt, max_new_tokens, sampling, eos and stop ids.
struct GenerationResult {
  std::vector<int32_t> output_ids;
  bool stopped_at_eos = false;
  FinishReason finish_reason = FinishReason::kLength;
  SpecMetrics metrics;  // this request's counters; times of the batch phases it took part in
};

struct EngineOptions {
  int page_size = 16;   // target MLA cache page, in tokens
  int ngram_min_n = 1;  // NGRAM: shortest suffix matched
  int ngram_max_n = 4;  // NGRAM: longest suffix matched
  // Drafting by batch size: rule i holds from its from_batch (strictly increasing, >= 1) up to
  // the next rule's; below the first rule, and with none, the policy's kSteps. steps 0: nothing
  // is drafted (the root alone is verified, plain decoding through the same loop; an EAGLE
  // draft still extends over the committed tokens, so that it can resume); 0 < steps <
  // kSteps (EAGLE3 / EAGLE): a shallower tree of the policy's topk, draft_nodes(steps) nodes.
  // NGRAM and NONE take steps 0 or kSteps only. engine/advisor.hpp's plan_draft_steps makes
  // the rules from measured costs; format_draft_steps / parse_draft_steps write and read them
  // as "1:3,8:1,32:0".
  std::vector<DraftStepsRule> draft_steps_by_batch;
  // The CUDA executor with a draft model (EAGLE3 / EAGLE): a step keeps the draft's proposal,
  // its tree and the verify's inputs on the device and waits for it once, at the acceptance
  // (Session::speculate_on_device). false: the proposal is read back and the tree built on
  // the host (a second wait per step), as every other strategy and executor does; the two give
  // the same output (to measure what the wait costs).
  bool device_resident_step = true;
};

// A session (SpecEngine::Session): the running batch's capacity, fixed when it opens.
//   max_running         requests prefilling or decoding at once (the CUDA draft's cache slots)
//   num_pages           target MLA cache pages of EngineOptions::page_size tokens
//   max_request_tokens  prompt + max_new_tokens of one request at most (sizes page tables and
//                       the CUDA draft's slots)
//   max_prefill_tokens  prompt tokens prefilled per step, over all prefilling requests (chunked
//                       prefill: a longer prompt takes several steps)
struct SessionOptions {
  int max_running = 0;
  int num_pages = 0;
  int64_t max_request_tokens = 0;
  int64_t max_prefill_tokens = 0;
};

// What one Session::step did for one request: the output tokens it committed (the first token
// of a finished prefill, or a verify's accepted drafts and bonus; possibly none, for a prefill
// chunk), and, when the request finished, why and its metrics. A request whose prefill finished
// in a step also decodes in it: two events with its id, in that order.
struct StepEvent {
  model::kimi::RequestId id = 0;
  std::vector<int32_t> tokens;
  bool verified = false;  // the tokens come from a verify (else from a prefill)
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  SpecMetrics metrics;  // finished only
};

namespace detail {

inline Status check_request(io::DeepseekV3Config const& c, GenerationRequest const& r,
                            std::string const& who, int path_capacity, int page_size) {
  model::kimi::GenerateOptions o;
  o.max_new_tokens = r.max_new_tokens;
  o.temperature = r.temperature;
  o.page_size = page_size;
  model::kimi::GenerateResult unused;
  SPECDEC_RETURN_IF_ERROR(
      model::kimi::detail::check_generate(c, r.prompt, o, &unused).prefixed(who + ": "));
  if (!(r.top_p > 0.0f && r.top_p <= 1.0f)) {
    return Status::InvalidArgument(who + ": top_p " + float_text(r.top_p) +
                                   " outside (0, 1] (1 means no top-p)");
  }
  if (r.top_k < -1) {
    return Status::InvalidArgument(who + ": top_k " + std::to_string(r.top_k) +
                                   " < -1 (-1 or 0 means no top-k; k >= 1 keeps the k best)");
  }
  for (int32_t id : r.stop_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return Status::InvalidArgument(who + ": stop id " + std::to_string(id) +
                                     " outside the vocabulary [0, " +
                                     std::to_string(c.vocab_size) + ")");
    }
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

// The sampling arrays of a batch: each request's settings, step = its output count so far,
// request id = its Philox stream.
template <class Slot>
void fill_sampling(std::span<Slot const* const> batch, BatchSampling* s) {
  s->resize(batch.size());
  s->all_greedy = true;
  for (size_t b = 0; b < batch.size(); ++b) {
    GenerationRequest const& q = batch[b]->request;
    s->temperature[b] = q.temperature;
    s->top_p[b] = q.top_p;
    s->top_k[b] = q.top_k;
    s->seed[b] = q.seed;
    s->step[b] = static_cast<uint32_t>(batch[b]->output.size());
    s->request_id[b] = batch[b]->stream;
    s->all_greedy = s->all_greedy && q.temperature <= 0.0f;
  }
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

// The host draft's state during one session: its cache and each request's last extend row
// (hidden [H], logits [Vd]).
struct HostDraftRun {
  model::eagle::DraftCache cache;
  std::map<model::kimi::RequestId, std::vector<float>> hidden, logits;

  Status release(model::kimi::RequestId id) {
    hidden.erase(id);
    logits.erase(id);
    return cache.free_request(id);
  }
};

template <>
struct DraftFor<CpuExecutor> {
  using Model = model::eagle::DraftCpuModel const;
  using Run = HostDraftRun;
};

#if defined(__CUDACC__)
// The CUDA draft's state during one session, all on the device but the small per-step arrays:
// its cache (one slot per request), each request's last extend row hidden [H] / logits [Vd] in
// row `slot` of [R, H] / [R, Vd] (so requests extended in different calls, a prefill's and a
// verify's, propose together), and the proposal's buffers, sized once for R requests.
//   set_graph_ladder(sizes)   the policy's graph ladder (before create): a batch of B <= its
//       largest size runs padded to the smallest size G >= B, with G - B filler requests on the
//       cache's padding slot, so that one CUDA graph per ladder size serves every batch;
//       above the ladder everything is launched eagerly. Without a ladder every batch runs as
//       it is, captured per exact shape.
//   extend_padding(B, entries)   the filler entries a verify's extend of B requests and
//       `entries` entries takes (G x path capacity - entries; 0 unpadded): the caller appends
//       them to tokens and features (any token, any of the forward's rows)
//   extend(ids [B], counts [B], tokens [sum counts (+ filler)] host, features [.., F] device,
//       after_verify): the draft extend into [B, H] / [B, Vd] rows (padded: G), scattered to the
//       requests' slots; after a verify its stream work replays from a CUDA graph per (B, sum
//       counts) (padded: per G)
//   propose(ids [B], roots [B] host, steps, nodes, &tokens, &parents [B, nodes] host): the
//       batch's slots, lengths and roots uploaded (and the fillers'); the proposal
//       (enqueue_proposal: draft_expand at step 0, then per step draft_tree_step, whose tree
//       lives on the device, and draft_expand; draft_finalize) queued, or replayed from the CUDA
//       graph captured for (B or G, steps, nodes) (model.step_graphs of them); then one
//       read-back of tokens / parents / status and the draft's device error record (the one
//       check of the tokens the draft read since the last proposal; draft_device_errors names
//       a fault): one host wait per proposal.
//   queue_proposal(ids, roots, steps, nodes, &device)   the same proposal, left on the device
//       (DeviceProposal) without a wait; check_proposal(ids, device, words) checks its words
//       once the caller has read them back (the engine's device-resident step, with its
//       acceptance).
class CudaDraftRun {
 public:
  using Model = model::eagle::DraftCudaModel;
  model::eagle::DraftCudaCache cache;

  void set_graph_ladder(std::span<int const> batch_sizes) { ladder_ = batch_sizes; }

  // R requests of up to max_length draft entries (prompt + new tokens + path capacity), the
  // largest extend of extend_rows entries; topk K, steps S, nodes N of the policy, up to
  // `path` entries per request in a verify's extend.
  Status create(Model* model, CudaExecutor exec, int R, int64_t max_length, int64_t extend_rows,
                int K, int S, int N, int path) {
    model_ = model;
    exec_ = exec;
    topk_ = K;
    steps_ = S;
    nodes_ = N;
    path_ = path;
    int64_t const H = model->hidden(), Vd = model->draft_vocab();
    // Padded, a batch of R runs as padded_batch(R) rows; the fillers take one more slot.
    int const slots = R + (ladder_.empty() ? 0 : 1);
    size_t const r = static_cast<size_t>(padded_batch(R)), RK = r * static_cast<size_t>(K);
    size_t const RC = r * static_cast<size_t>(ops::draft_candidate_count(K, S));
    SPECDEC_RETURN_IF_ERROR(model::eagle::DraftCudaCache::create_for(
        model->config, slots, max_length, int64_t{S} * K, &cache));
    int padding_slot = -1;
    if (!ladder_.empty()) SPECDEC_RETURN_IF_ERROR(cache.padding_slot(&padding_slot));
    extend_rows = std::max<int64_t>(extend_rows, static_cast<int64_t>(r) * path);
    SPECDEC_RETURN_IF_ERROR(model::eagle::reserve_draft_scratch(
        *model, std::max<int64_t>(extend_rows, static_cast<int64_t>(RK)), S));
    size_t const by_slot = static_cast<size_t>(slots);
    SPECDEC_RETURN_IF_ERROR(hidden_last_.reserve(by_slot * H));
    SPECDEC_RETURN_IF_ERROR(logits_last_.reserve(by_slot * Vd));
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
    SPECDEC_RETURN_IF_ERROR(node_slot_.reserve(RN));
    SPECDEC_RETURN_IF_ERROR(results_.reserve(2 * RN + r + kErrorRecord));
    SPECDEC_RETURN_IF_ERROR(inputs_.reserve(3 * r));
    SPECDEC_RETURN_IF_ERROR(tokens_.reserve(static_cast<size_t>(extend_rows)));
    SPECDEC_RETURN_IF_ERROR(from_.reserve(r));
    // The buffers may have moved: no earlier graph is valid.
    graphs_.clear();
    graphs_.set_capacity(model->step_graphs);
    extend_graphs_.clear();
    extend_graphs_.set_capacity(model->step_graphs);
    // draft_expand's workspace, zeroed once (its launches leave it zeroed).
    has_last_.assign(by_slot, false);
    if (padding_slot >= 0) {
      // The fillers propose from zero rows until a padded extend writes theirs.
      SPECDEC_CUDA_TRY(cudaMemsetAsync(hidden_last_.data() + padding_slot * H, 0,
                                       sizeof(float) * H, exec_.stream));
      SPECDEC_CUDA_TRY(cudaMemsetAsync(logits_last_.data() + padding_slot * Vd, 0,
                                       sizeof(float) * Vd, exec_.stream));
      has_last_[static_cast<size_t>(padding_slot)] = true;
    }
    workspace_bytes_ =
        ops::draft_expand_workspace_bytes(static_cast<int>(r), static_cast<int>(Vd), K);
    SPECDEC_RETURN_IF_ERROR(workspace_.reserve((workspace_bytes_ + 7) / 8));
    workspace_bytes_ = (workspace_bytes_ + 7) / 8 * 8;
    SPECDEC_CUDA_TRY(cudaMemsetAsync(workspace_.data(), 0, workspace_bytes_, exec_.stream));
    return Status::Ok();
  }

  // The filler entries of a verify's extend of B requests and `entries` entries.
  int64_t extend_padding(int B, int64_t entries) const {
    int const G = ladder_bucket(B);
    return G < 0 ? 0 : int64_t{G} * path_ - entries;
  }

  // `after_verify`: the extend of a step's accepted tokens (up to `path` per request), padded
  // to the ladder (tokens and features hold extend_padding's filler entries) and replayed from
  // a CUDA graph per padded size (unpadded: per (batch, entries) shape); eager above the
  // ladder. A prefill chunk's extend (any length) launches from the host.
  Status extend(std::span<model::kimi::RequestId const> ids, std::span<int32_t const> counts,
                std::span<int32_t const> tokens, std::span<float const> features,
                bool after_verify) {
    int const B = static_cast<int>(ids.size());
    int const G = after_verify ? ladder_bucket(B) : -1;
    int const outputs = G < 0 ? B : G;
    int64_t const H = model_->hidden(), Vd = model_->draft_vocab();
    cudaStream_t const stream = exec_.stream;
    int32_t* d_tokens = nullptr;
    SPECDEC_RETURN_IF_ERROR(tokens_.put(tokens.data(), tokens.size(), stream, &d_tokens));
    std::vector<int64_t> slots;
    SPECDEC_RETURN_IF_ERROR(slots_of(ids, outputs, &slots));
    int64_t* d_slots = nullptr;
    SPECDEC_RETURN_IF_ERROR(from_.put(slots, stream, &d_slots));
    model::eagle::DraftPadding padding;
    if (G >= 0) {
      padding.requests = G - B;
      padding.entries = static_cast<int64_t>(tokens.size()) -
                        std::accumulate(counts.begin(), counts.end(), int64_t{0});
    }
    model::eagle::DraftExtendCall call;
    SPECDEC_RETURN_IF_ERROR(model::eagle::prepare_draft_extend(
        exec_, *model_, &cache, ids, counts, {d_tokens, tokens.size()}, features,
        {step_hidden_.data(), static_cast<size_t>(outputs * H)},
        {step_logits_.data(), static_cast<size_t>(outputs * Vd)}, &call, padding));
    auto enqueue = [&]() -> Status {
      SPECDEC_RETURN_IF_ERROR(model::eagle::enqueue_draft_extend(exec_, *model_, &cache, call));
      SPECDEC_RETURN_IF_ERROR(
          scatter_rows(step_hidden_.data(), d_slots, outputs, H, hidden_last_.data(), stream));
      return scatter_rows(step_logits_.data(), d_slots, outputs, Vd, logits_last_.data(), stream);
    };
    if (after_verify) count_ladder_run(G, B, padding.entries);
    if (after_verify && (G >= 0 || ladder_.empty())) {
      ExtendShape const shape{outputs, static_cast<int64_t>(tokens.size()), d_tokens,
                              features.data(), model_->scratch_generation()};
      int64_t const replays = extend_graphs_.replays();
      SPECDEC_RETURN_IF_ERROR(extend_graphs_.run(shape, stream, enqueue));
      model_->graph_replays += extend_graphs_.replays() - replays;
    } else {
      SPECDEC_RETURN_IF_ERROR(enqueue());
    }
    model::eagle::finish_draft_extend(call);
    for (int64_t slot : slots) has_last_[static_cast<size_t>(slot)] = true;
    // A prefill chunk's extend is waited for, so that the prefill's time (the host's) holds it;
    // a verify's is not (the engine's step clock times it on the stream).
    if (!after_verify) SPECDEC_CUDA_TRY(cudaStreamSynchronize(stream));
    return Status::Ok();
  }

  // A request leaves: its slot's rows no longer hold a last extend.
  Status release(model::kimi::RequestId id) {
    model::eagle::DraftCudaCache::Sequence const* seq = cache.find(id);
    if (seq != nullptr) has_last_[static_cast<size_t>(seq->slot)] = false;
    return cache.free_request(id);
  }

  // Where a queued proposal's results lie on the device, for G = rows requests (fillers last):
  // tokens and parents [G, nodes], draft_finalize's status [G], then the draft's error record
  // (kErrorRecord words), contiguous from `tokens` (words() in all; status_words() from
  // status()).
  struct DeviceProposal {
    int32_t const* tokens = nullptr;
    int32_t const* parents = nullptr;
    int rows = 0, nodes = 0;
    int32_t const* status() const { return parents + static_cast<size_t>(rows) * nodes; }
    size_t status_words() const { return static_cast<size_t>(rows) + kErrorRecord; }
    size_t words() const { return 2 * static_cast<size_t>(rows) * nodes + status_words(); }
  };

  // `steps` (1 .. the policy's) draft steps and `nodes` nodes (<= the policy's), read back:
  // tokens / parents [B, nodes] host.
  Status propose(std::span<model::kimi::RequestId const> ids, std::span<int32_t const> roots,
                 int steps, int nodes, std::vector<int32_t>* tokens,
                 std::vector<int32_t>* parents) {
    DeviceProposal d;
    SPECDEC_RETURN_IF_ERROR(queue(ids, roots, steps, nodes, &d));
    ++model_->host_proposals;
    std::vector<int32_t> results(d.words());
    SPECDEC_RETURN_IF_ERROR(results_.get(results.data(), results.size(), exec_.stream));
    SPECDEC_CUDA_TRY(cudaStreamSynchronize(exec_.stream));
    size_t const BN = ids.size() * static_cast<size_t>(nodes);
    size_t const GN = static_cast<size_t>(d.rows) * static_cast<size_t>(nodes);
    tokens->assign(results.begin(), results.begin() + static_cast<int64_t>(BN));
    parents->assign(results.begin() + static_cast<int64_t>(GN),
                    results.begin() + static_cast<int64_t>(GN + BN));
    return check_proposal(ids, d, std::span<int32_t const>(results).subspan(2 * GN));
  }

  // A proposal's status words read back (DeviceProposal::status_words(), from status()): a
  // token outside the vocabulary the draft met (draft_device_errors names it, and clears the
  // record), or a draft_finalize status other than ok.
  Status check_proposal(std::span<model::kimi::RequestId const> ids, DeviceProposal const& d,
                        std::span<int32_t const> status_words) const {
    if (status_words[static_cast<size_t>(d.rows)] != 0) {
      return model::eagle::draft_device_errors(exec_, *model_);
    }
    for (size_t b = 0; b < ids.size(); ++b) {
      int32_t const status = status_words[b];
      if (status != ops::kDraftSelectOk) {
        return Status::Internal("SpecEngine: draft_finalize status " + std::to_string(status) +
                                " for request " + std::to_string(ids[b]));
      }
    }
    return Status::Ok();
  }

  // The same proposal queued on the stream, nothing read back: *out says where it lies.
  // check_proposal(ids, the words read back later) reports its faults.
  Status queue_proposal(std::span<model::kimi::RequestId const> ids,
                        std::span<int32_t const> roots, int steps, int nodes,
                        DeviceProposal* out) {
    SPECDEC_RETURN_IF_ERROR(queue(ids, roots, steps, nodes, out));
    ++model_->device_proposals;
    return Status::Ok();
  }

 private:
  static constexpr size_t kErrorRecord = 4;  // int32 words of the draft's device error record

  // The proposal's inputs uploaded and its work queued (or replayed): queue_proposal's.
  Status queue(std::span<model::kimi::RequestId const> ids, std::span<int32_t const> roots,
               int steps, int nodes, DeviceProposal* out) {
    int const B = static_cast<int>(ids.size()), N = nodes;
    int const G = ladder_bucket(B), rows = G < 0 ? B : G;  // the proposal's batch, fillers in
    if (steps < 1 || steps > steps_ || nodes < 2 || nodes > nodes_) {
      return Status::Internal("SpecEngine (cuda): a proposal of " + std::to_string(steps) +
                              " steps and " + std::to_string(nodes) + " nodes is outside the " +
                              "session's " + std::to_string(steps_) + " and " +
                              std::to_string(nodes_));
    }
    size_t const GN = static_cast<size_t>(rows) * N;
    cudaStream_t const stream = exec_.stream;
    std::vector<int64_t> slots;
    SPECDEC_RETURN_IF_ERROR(slots_of(ids, rows, &slots));
    // The proposal's inputs, at fixed device addresses (a captured proposal reads them there):
    // slots (int64, for gather_rows) and [slots | lengths | roots] (int32); a filler's length
    // and root are 0.
    inputs_host_.assign(static_cast<size_t>(3 * rows), 0);
    for (size_t b = 0; b < slots.size(); ++b) {
      inputs_host_[b] = static_cast<int32_t>(slots[b]);
      if (b >= ids.size()) continue;
      if (!has_last_[static_cast<size_t>(slots[b])]) {
        return Status::Internal("SpecEngine (cuda): request " + std::to_string(ids[b]) +
                                " proposes before any draft extend");
      }
      inputs_host_[static_cast<size_t>(rows) + b] =
          static_cast<int32_t>(cache.find(ids[b])->length);
      inputs_host_[static_cast<size_t>(2 * rows) + b] = roots[b];
    }
    if (steps > 1) {
      SPECDEC_RETURN_IF_ERROR(model::eagle::check_draft_tree(*model_, cache, ids, steps, topk_));
    }
    int64_t* d_slots = nullptr;
    int32_t* d_inputs = nullptr;
    SPECDEC_RETURN_IF_ERROR(from_.put(slots, stream, &d_slots));
    SPECDEC_RETURN_IF_ERROR(inputs_.put(inputs_host_, stream, &d_inputs));
    count_ladder_run(G, B, 0);
    auto const enqueue = [&] { return enqueue_proposal(ids, rows - B, steps, nodes); };
    if (G >= 0 || ladder_.empty()) {
      ProposalShape const shape{rows, steps, nodes, model_->scratch_generation()};
      int64_t const replays = graphs_.replays();
      SPECDEC_RETURN_IF_ERROR(graphs_.run(shape, stream, enqueue));
      model_->graph_replays += graphs_.replays() - replays;
    } else {
      SPECDEC_RETURN_IF_ERROR(enqueue());
    }
    int32_t const* const r = results_.data();
    *out = DeviceProposal{r, r + GN, rows, N};
    return Status::Ok();
  }

  // What a captured proposal bakes in besides the session's fixed buffers: the batch size, the
  // tree's steps and nodes, where the draft's scratch lives.
  struct ProposalShape {
    int batch = 0, steps = 0, nodes = 0;
    uint64_t scratch_generation = 0;
    bool operator==(ProposalShape const&) const = default;
  };
  // What a captured extend bakes in: the batch size, the entries, where the tokens and the
  // features are read, where the draft's scratch lives.
  struct ExtendShape {
    int batch = 0;
    int64_t entries = 0;
    int32_t const* tokens = nullptr;
    float const* features = nullptr;
    uint64_t scratch_generation = 0;
    bool operator==(ExtendShape const&) const = default;
  };

  // The proposal of the batch whose inputs are in from_ / inputs_, stream work only (capturable):
  // the batch's logits rows gathered, draft_expand at step 0; each later step draft_tree_step
  // on the K frontier tokens (each branch continuing next_branch of the step before, on the
  // device) and draft_expand; draft_finalize into results_ (tokens, parents, status), and the
  // draft's error record beside them.
  // `fillers` filler requests after ids (their inputs uploaded too).
  Status enqueue_proposal(std::span<model::kimi::RequestId const> ids, int fillers, int steps,
                          int nodes) {
    int const B = static_cast<int>(ids.size()) + fillers, K = topk_, S = steps, N = nodes;
    int64_t const Vd = model_->draft_vocab();
    size_t const BK = static_cast<size_t>(B) * K;
    cudaStream_t const stream = exec_.stream;
    int32_t const* d_slots32 = inputs_.data();
    SPECDEC_RETURN_IF_ERROR(
        gather_rows(logits_last_.data(), from_.data(), B, Vd, step_logits_.data(), stream));
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
    for (int s = 0; s < S; ++s) {
      if (s > 0) {
        model::eagle::DraftTreeStep t;
        t.step = s;
        t.branches = K;
        t.padding = fillers;
        t.slots = d_slots32;
        t.lengths = d_slots32 + B;
        t.next_branch = next_branch_.data();
        t.tokens = next_tokens_.data();
        t.source_hidden = s == 1 ? hidden_last_.data() : step_hidden_.data();
        t.parent_hidden = parent_hidden_.data();
        t.hidden = step_hidden_.data();
        t.logits = step_logits_.data();
        SPECDEC_RETURN_IF_ERROR(model::eagle::draft_tree_step(exec_, *model_, &cache, ids, t));
        SPECDEC_CUDA_TRY(cudaMemcpyAsync(frontier_scores_.data(), next_scores_.data(),
                                         sizeof(float) * BK, cudaMemcpyDeviceToDevice, stream));
        SPECDEC_CUDA_TRY(cudaMemcpyAsync(frontier_slots_.data(), next_slots_.data(),
                                         sizeof(int32_t) * BK, cudaMemcpyDeviceToDevice, stream));
      }
      ops::DraftExpandParams const x = buffers.expand(
          s, step_logits_.data(), frontier_scores_.data(), frontier_slots_.data(), d2t);
      SPECDEC_RETURN_IF_ERROR(ops::draft_expand(exec_, x));
    }
    int32_t* const out = results_.data();
    size_t const BN = static_cast<size_t>(B) * N;
    ops::DraftFinalizeParams const f = buffers.finalize(d_slots32 + 2 * B, N, out, out + BN,
                                                        node_slot_.data(), out + 2 * BN);
    SPECDEC_RETURN_IF_ERROR(ops::draft_finalize(exec_, f));
    int32_t const* record = model::eagle::detail::draft_error_record(*model_);
    SPECDEC_CUDA_TRY(cudaMemcpyAsync(out + 2 * BN + B, record, kErrorRecord * sizeof(int32_t),
                                     cudaMemcpyDeviceToDevice, stream));
    return Status::Ok();
  }

  // The smallest ladder size >= B, or -1 (unpadded: no ladder, or B above it).
  int ladder_bucket(int B) const {
    return graph_bucket(ladder_.data(), static_cast<int>(ladder_.size()), B);
  }
  // The rows a batch of B takes (padded or not).
  int padded_batch(int B) const { return std::max(B, ladder_bucket(B)); }
  // The model's padded / above-ladder counters, for a call of B requests run as G (-1: as
  // they are) with `filler_entries`.
  void count_ladder_run(int G, int B, int64_t filler_entries) {
    if (ladder_.empty()) return;
    model_->padded_calls += G > B || filler_entries > 0;
    model_->above_ladder_calls += G < 0;
  }

  // Each request's draft cache slot (the row of its last extend), then the padding slot up to
  // `rows` entries.
  Status slots_of(std::span<model::kimi::RequestId const> ids, int rows,
                  std::vector<int64_t>* out) const {
    out->assign(static_cast<size_t>(rows), cache.padding_slot());
    for (size_t b = 0; b < ids.size(); ++b) {
      model::eagle::DraftCudaCache::Sequence const* seq = cache.find(ids[b]);
      if (seq == nullptr) {
        return Status::Internal("SpecEngine (cuda): request " + std::to_string(ids[b]) +
                                " has no draft cache slot");
      }
      (*out)[b] = seq->slot;
    }
    return Status::Ok();
  }

  Model* model_ = nullptr;
  CudaExecutor exec_{};
  std::span<int const> ladder_;  // the policy's graph ladder (static storage); empty: unpadded
  int topk_ = 0, steps_ = 0, nodes_ = 0, path_ = 0;
  std::vector<bool> has_last_;  // [R]: the slot's rows hold its request's last extend
  size_t workspace_bytes_ = 0;
  Staging<float> hidden_last_, logits_last_, parent_hidden_, step_hidden_, step_logits_,
      cand_scores_, next_scores_, frontier_scores_;
  Staging<int32_t> tokens_, inputs_, cand_tokens_, cand_parent_, next_slots_, next_tokens_,
      next_draft_, next_branch_, frontier_slots_, node_slot_, results_;
  Staging<int64_t> from_;
  Staging<uint64_t> workspace_;
  std::vector<int32_t> inputs_host_;
  GraphCache<ProposalShape> graphs_;
  GraphCache<ExtendShape> extend_graphs_;
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

// The boundaries of one speculative step's phases, in order: each phase runs from its mark to
// the next one's (extend: to kExtendEnd).
enum StepMark : int {
  kDraftStart = 0,
  kBuildStart,
  kVerifyStart,
  kCommitStart,
  kExtendStart,
  kExtendEnd,
  kStepMarks
};

// The phase clock of the host executor: a mark is the host's time.
class HostStepClock {
 public:
  Status open(CpuExecutor) { return Status::Ok(); }
  Status mark(StepMark m) {
    at_[m] = Clock::now();
    return Status::Ok();
  }
  Status seconds(StepMark from, StepMark to, double* out) const {
    *out = std::chrono::duration<double>(at_[to] - at_[from]).count();
    return Status::Ok();
  }

 private:
  Clock::time_point at_[kStepMarks]{};
};

#if defined(__CUDACC__)
// The phase clock of the CUDA executor: a mark is an event recorded on the engine's stream, so a
// phase's time is the stream's between its marks: GPU work queued in the phase, and host work
// while the stream waits for it, but not what the stream still ran of the phase before (the
// draft phase of a step does not hold the tail of the previous step's extend). Nothing waits at
// a mark; seconds(from, to) waits for `to`'s event (the engine reads a step's times after its
// accept read-back, when the stream has drained).
class CudaStepClock {
 public:
  CudaStepClock() = default;
  CudaStepClock(CudaStepClock const&) = delete;
  CudaStepClock& operator=(CudaStepClock const&) = delete;
  ~CudaStepClock() {
    for (cudaEvent_t e : events_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  Status open(CudaExecutor exec) {
    stream_ = exec.stream;
    for (cudaEvent_t& e : events_) {
      if (e == nullptr) SPECDEC_CUDA_TRY(cudaEventCreate(&e));
    }
    return Status::Ok();
  }
  Status mark(StepMark m) {
    SPECDEC_CUDA_TRY(cudaEventRecord(events_[m], stream_));
    return Status::Ok();
  }
  Status seconds(StepMark from, StepMark to, double* out) const {
    SPECDEC_CUDA_TRY(cudaEventSynchronize(events_[to]));
    float ms = 0.0f;
    SPECDEC_CUDA_TRY(cudaEventElapsedTime(&ms, events_[from], events_[to]));
    *out = 1e-3 * ms;
    return Status::Ok();
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[kStepMarks] = {};
};
#endif

template <class Exec>
struct StepClockFor {
  using type = HostStepClock;
};
#if defined(__CUDACC__)
template <>
struct StepClockFor<CudaExecutor> {
  using type = CudaStepClock;
};
#endif

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
  // A step whose proposal never comes to the host (speculate_on_device): the CUDA draft's.
  static constexpr bool kDeviceStep = kDraftsWithModel && !kHostDraft;

  // Nodes of a proposal of `steps` draft steps (draft_nodes_at for the policy's tree).
  static int draft_nodes(int steps) { return draft_nodes_at(kTopK, kSteps, kNodes, steps); }
  // The rules' checks (EngineOptions::draft_steps_by_batch).
  static Status check_draft_steps(std::span<DraftStepsRule const> rules) {
    for (size_t i = 0; i < rules.size(); ++i) {
      DraftStepsRule const& r = rules[i];
      std::string const at = "draft_steps_by_batch[" + std::to_string(i) + "] = " +
                             std::to_string(r.from_batch) + ":" + std::to_string(r.steps) + ": ";
      if (r.from_batch < 1 || (i > 0 && r.from_batch <= rules[i - 1].from_batch)) {
        return Status::InvalidArgument(at + "batch sizes must be >= 1 and strictly increasing");
      }
      if (r.steps < 0 || r.steps > kSteps) {
        return Status::InvalidArgument(at + "steps must be in [0, " + std::to_string(kSteps) +
                                       "], the policy's " + describe<P>());
      }
      if (!kDraftsWithModel && r.steps != 0 && r.steps != kSteps) {
        return Status::InvalidArgument(at + std::string(P::kName) + " drafts all " +
                                       std::to_string(kSteps) + " steps or none (0)");
      }
    }
    return Status::Ok();
  }
  // Draft steps at a step of `batch` decoding requests.
  int draft_steps_at(int batch) const {
    int steps = kSteps;
    for (DraftStepsRule const& r : options_.draft_steps_by_batch) {
      if (r.from_batch <= batch) steps = r.steps;
    }
    return steps;
  }

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
    SPECDEC_RETURN_IF_ERROR(check_draft_steps(options.draft_steps_by_batch).prefixed(fn));
    out->target_ = target;
    out->draft_ = draft;
    out->options_ = options;
    out->exec_ = exec;
    return Status::Ok();
  }

  // Checks one request against the target, the draft and the policy; `who` names it in errors.
  Status check_request(GenerationRequest const& r, std::string const& who) const {
    SPECDEC_RETURN_IF_ERROR(detail::check_request(target_->config, r, who, kPathCapacity,
                                                  options_.page_size));
    if constexpr (kDraftsWithModel) {
      int64_t const last =
          static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens + kPathCapacity - 1;
      int64_t const limit = draft_->config.max_position_embeddings;
      if (last > limit) {
        return Status::InvalidArgument(
            who + ": " + std::to_string(r.prompt.size()) + " prompt tokens + " +
            std::to_string(r.max_new_tokens) + " new tokens + " +
            std::to_string(kPathCapacity - 1) +
            " speculative positions exceed the draft's max_position_embeddings " +
            std::to_string(limit));
      }
    }
    return Status::Ok();
  }

  EngineOptions const& options() const { return options_; }

  // Target cache pages a request of `tokens` prompt + new tokens holds (its tree's slots past
  // the last token included).
  int pages_for(int64_t tokens) const {
    return static_cast<int>(ceil_div<int64_t>(tokens + kNodes, options_.page_size));
  }

  class Session;

  // Every request to its end, as one session of R slots that admits them all at once.
  Status generate(std::span<GenerationRequest const> requests,
                  std::vector<GenerationResult>* results, SpecMetrics* total) const {
    if (target_ == nullptr) return Status::InvalidArgument("SpecEngine::generate: not created");
    if (results == nullptr) return Status::InvalidArgument("SpecEngine::generate: results is null");
    if (requests.empty()) return Status::InvalidArgument("SpecEngine::generate: no requests");
    SessionOptions o;
    o.max_running = static_cast<int>(requests.size());
    for (size_t r = 0; r < requests.size(); ++r) {
      GenerationRequest const& q = requests[r];
      SPECDEC_RETURN_IF_ERROR(check_request(q, "request " + std::to_string(r))
                                  .prefixed("SpecEngine::generate: "));
      int64_t const tokens = static_cast<int64_t>(q.prompt.size()) + q.max_new_tokens;
      o.num_pages += pages_for(tokens);
      o.max_request_tokens = std::max(o.max_request_tokens, tokens);
      o.max_prefill_tokens += static_cast<int64_t>(q.prompt.size());
    }
    Session session(*this);
    SPECDEC_RETURN_IF_ERROR(session.open(o));
    for (size_t r = 0; r < requests.size(); ++r) {
      SPECDEC_RETURN_IF_ERROR(session.admit(static_cast<model::kimi::RequestId>(r), requests[r],
                                            static_cast<uint32_t>(r)));
    }
    results->assign(requests.size(), GenerationResult{});
    std::vector<StepEvent> events;
    while (!session.idle()) {
      SPECDEC_RETURN_IF_ERROR(session.step(&events));
      for (StepEvent& ev : events) {
        GenerationResult& out = (*results)[static_cast<size_t>(ev.id)];
        out.output_ids.insert(out.output_ids.end(), ev.tokens.begin(), ev.tokens.end());
        if (!ev.finished) continue;
        out.finish_reason = ev.reason;
        out.stopped_at_eos = ev.reason == FinishReason::kEos;
        out.metrics = std::move(ev.metrics);
      }
    }
    if (total != nullptr) *total = session.totals();
    return Status::Ok();
  }

  // A running batch that requests join and leave between steps (continuous batching;
  // engine/scheduler.hpp drives one):
  //   Session session(engine); session.open(options);
  //   session.fits_now(r) -> admit(id, r, stream)   target pages for prompt + max_new_tokens +
  //                                                 the tree reserved now, a draft slot taken
  //   session.step(&events)   one prefill forward over up to max_prefill_tokens prompt tokens
  //                           of the prefilling requests (admission order; a request's last
  //                           chunk draws its first token and it joins the decoding batch),
  //                           then one speculative step (DESIGN.md "One speculative step") over
  //                           the decoding batch; finished requests are released
  //   session.cancel(id)      frees a request's pages and draft slot at once
  // A request's Philox stream (`stream`, with its seed) keys its draws, so a seeded request
  // samples the same tokens whichever batch it runs in. RequestIds are the caller's, unique
  // among the session's requests.
  class Session {
   public:
    using RequestId = model::kimi::RequestId;

    explicit Session(SpecEngine const& engine)
        : e_(engine), cfg_(engine.target_->config), target_(engine.target_, engine.exec_) {
      totals_.reserve_depth(kPathCapacity - 1);
      // The policy's graph ladder: the CUDA target's verify forwards, the draft's proposals and
      // its extends after a verify run padded to it.
      if constexpr (!kHostDraft) {
        target_.set_graph_ladder(P::Graph::batch_sizes());
        if constexpr (kDraftsWithModel) draft_.set_graph_ladder(P::Graph::batch_sizes());
      }
    }
    Session(Session const&) = delete;
    Session& operator=(Session const&) = delete;

    Status open(SessionOptions const& o) {
      std::string const fn = "SpecEngine::Session::open: ";
      if (e_.target_ == nullptr) return Status::InvalidArgument(fn + "the engine is not created");
      if (o.max_running < 1 || o.num_pages < 1 || o.max_request_tokens < 1 ||
          o.max_prefill_tokens < 1) {
        return Status::InvalidArgument(
            fn + "max_running " + std::to_string(o.max_running) + ", num_pages " +
            std::to_string(o.num_pages) + ", max_request_tokens " +
            std::to_string(o.max_request_tokens) + " and max_prefill_tokens " +
            std::to_string(o.max_prefill_tokens) + " must all be >= 1");
      }
      int const per_request = e_.pages_for(o.max_request_tokens);
      if (per_request > o.num_pages) {
        return Status::InvalidArgument(
            fn + "a request of max_request_tokens " + std::to_string(o.max_request_tokens) +
            " needs " + std::to_string(per_request) + " pages of " +
            std::to_string(e_.options_.page_size) + " tokens, more than the cache's " +
            std::to_string(o.num_pages) + ": give more pages or a smaller max_request_tokens");
      }
      options_ = o;
      SPECDEC_RETURN_IF_ERROR(
          target_.create_cache(e_.options_.page_size, o.num_pages, per_request));
      if constexpr (kDraftsWithModel && kHostDraft) {
        SPECDEC_RETURN_IF_ERROR(
            model::eagle::DraftCache::create_for(e_.draft_->config, &draft_.cache));
      } else if constexpr (kDraftsWithModel) {
        SPECDEC_RETURN_IF_ERROR(draft_.create(
            e_.draft_, e_.exec_, o.max_running, o.max_request_tokens + kPathCapacity,
            std::max<int64_t>(o.max_prefill_tokens, int64_t{o.max_running} * kNodes), kTopK,
            kSteps, kNodes, kPathCapacity));
      }
      SPECDEC_RETURN_IF_ERROR(clock_.open(e_.exec_));
      extended_.clear();
      opened_ = true;
      return Status::Ok();
    }

    SessionOptions const& options() const { return options_; }
    // Requests admitted and not finished (prefilling or decoding).
    int running() const { return static_cast<int>(slots_.size()); }
    bool idle() const { return slots_.empty(); }
    // Draft steps of the last speculative step (EngineOptions::draft_steps_by_batch at its
    // batch size; -1 before the first).
    int draft_steps() const { return draft_steps_; }
    // Forwards and draft work replayed from CUDA graphs so far, by the target's and the draft's
    // models (0 on the CPU executor): a step replayed one iff this grew.
    int64_t graph_replays() const {
      int64_t n = target_.graph_replays();
      if constexpr (kDraftsWithModel && !kHostDraft) n += e_.draft_->graph_replays;
      return n;
    }
    // How a speculative step of `batch` requests runs: the ladder size its forwards are padded
    // to (0: unpadded, i.e. above the policy's graph ladder, no ladder, or the CPU executor) and
    // whether they replay CUDA graphs (the target's graph cache on, and padded or the policy
    // Eager, whose every shape is captured; above a ladder they launch eagerly).
    struct GraphRun {
      int size = 0;
      bool captured = false;
      bool operator==(GraphRun const&) const = default;
    };
    GraphRun graph_run(int batch) const {
      if constexpr (kHostDraft) {
        return {};
      } else {
        int const size = std::max(0, P::Graph::bucket(batch));
        return {size, target_.graphs_on() && (size > 0 || !P::Graph::kCaptured)};
      }
    }
    bool has_request(RequestId id) const { return slots_.count(id) != 0; }
    int free_pages() { return target_.table().free_pages(); }
    int num_pages() const { return options_.num_pages; }
    // Tokens the running requests hold in the target cache.
    int64_t cached_tokens() {
      int64_t sum = 0;
      for (auto const& [id, slot] : slots_) {
        int64_t length = 0;
        if (target_.table().length(id, &length).ok()) sum += length;
      }
      return sum;
    }
    // Every verify's counters since open, and the phase times of the batch steps, once per step
    // (not per request).
    SpecMetrics const& totals() const { return totals_; }

    // Checks the request (the engine's check_request) and that one of its size fits an idle
    // session; `who` names it.
    Status check(GenerationRequest const& r, std::string const& who) const {
      SPECDEC_RETURN_IF_ERROR(e_.check_request(r, who));
      int64_t const tokens = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
      if (tokens > options_.max_request_tokens) {
        return Status::InvalidArgument(
            who + ": " + std::to_string(r.prompt.size()) + " prompt tokens + " +
            std::to_string(r.max_new_tokens) + " new tokens exceed the " +
            std::to_string(options_.max_request_tokens) +
            " tokens a request may hold (max_request_tokens)");
      }
      return Status::Ok();
    }

    // Whether the request can be admitted now: a free running slot and its pages free.
    bool fits_now(GenerationRequest const& r) {
      return running() < options_.max_running &&
             free_pages() >= e_.pages_for(static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens);
    }

    Status admit(RequestId id, GenerationRequest const& r, uint32_t stream) {
      std::string const who = "request " + std::to_string(id);
      if (!opened_) return Status::InvalidArgument("SpecEngine::Session::admit: not open");
      if (has_request(id)) {
        return Status::InvalidArgument("SpecEngine::Session::admit: " + who + " is already running");
      }
      SPECDEC_RETURN_IF_ERROR(check(r, who).prefixed("SpecEngine::Session::admit: "));
      if (!fits_now(r)) {
        return Status::InvalidArgument(
            "SpecEngine::Session::admit: " + who + " does not fit now: " +
            std::to_string(running()) + " of " + std::to_string(options_.max_running) +
            " running, " + std::to_string(free_pages()) + " free pages (fits_now first)");
      }
      model::kimi::MlaCache& cache = target_.table();
      int64_t const tokens = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
      SPECDEC_RETURN_IF_ERROR(cache.add_request(id));
      Status s = cache.reserve(id, int64_t{e_.pages_for(tokens)} * e_.options_.page_size);
      if constexpr (kDraftsWithModel) {
        if (s.ok()) s = draft_.cache.add_request(id);
      }
      if (!s.ok()) {
        (void)cache.free_request(id);
        return s;
      }
      Slot& slot = slots_[id];
      slot.request = r;
      slot.stream = stream;
      slot.history = r.prompt;
      slot.metrics.reserve_depth(kPathCapacity - 1);
      prefilling_.push_back(id);
      return Status::Ok();
    }

    // A running request's metrics so far (empty for an unknown id).
    SpecMetrics metrics(RequestId id) const {
      auto it = slots_.find(id);
      return it == slots_.end() ? SpecMetrics{} : it->second.metrics;
    }

    Status cancel(RequestId id) {
      if (!has_request(id)) {
        return Status::InvalidArgument("SpecEngine::Session::cancel: request " +
                                       std::to_string(id) + " is not running");
      }
      return release(id);
    }

    // One step; *events lists what it did per request (cleared first).
    Status step(std::vector<StepEvent>* events) {
      events->clear();
      if (!prefilling_.empty()) SPECDEC_RETURN_IF_ERROR(prefill(events));
      if (!decoding_.empty()) SPECDEC_RETURN_IF_ERROR(speculate(events));
      return Status::Ok();
    }

   private:
    struct Slot {
      GenerationRequest request;
      uint32_t stream = 0;
      std::vector<int32_t> history;  // prompt + output
      std::vector<int32_t> output;
      int64_t prefilled = 0;         // prompt tokens in the target cache
      SpecMetrics metrics;
    };

    Slot& slot(RequestId id) { return slots_.at(id); }

    std::vector<Slot const*> slots_of(std::span<RequestId const> batch) const {
      std::vector<Slot const*> out;
      for (RequestId id : batch) out.push_back(&slots_.at(id));
      return out;
    }

    // The target streams the draft reads (none without a draft model).
    std::span<int const> aux_layers() const {
      if constexpr (kDraftsWithModel) return e_.draft_->feature_layers;
      return {};
    }

    // Adds `token` to the request's output; the reason when it is done.
    std::optional<FinishReason> push(Slot& s, int32_t token) {
      s.output.push_back(token);
      s.history.push_back(token);
      int32_t const stop = ops::commit_stop(
          token, s.request.stop_at_eos, cfg_.eos_token_ids.data(),
          static_cast<int>(cfg_.eos_token_ids.size()), s.request.stop_ids.data(),
          static_cast<int>(s.request.stop_ids.size()), static_cast<int64_t>(s.output.size()),
          int64_t{s.request.max_new_tokens});
      if (stop == ops::kCommitGoOn) return std::nullopt;
      return finish_reason(stop);
    }
    static FinishReason finish_reason(int32_t stop) {
      return stop == ops::kCommitEos      ? FinishReason::kEos
             : stop == ops::kCommitStopId ? FinishReason::kStopId
                                          : FinishReason::kLength;
    }

    // The request leaves: its pages and draft slot are freed.
    Status release(RequestId id) {
      SPECDEC_RETURN_IF_ERROR(target_.table().free_request(id));
      if constexpr (kDraftsWithModel) SPECDEC_RETURN_IF_ERROR(draft_.release(id));
      std::erase(prefilling_, id);
      std::erase(decoding_, id);
      slots_.erase(id);
      return Status::Ok();
    }

    // The request finished: its event closes with the reason and metrics, and it leaves.
    Status finish(RequestId id, FinishReason reason, StepEvent* ev) {
      ev->finished = true;
      ev->reason = reason;
      ev->metrics = slot(id).metrics;
      return release(id);
    }

    void add_time(double SpecMetrics::*phase, double seconds, std::span<RequestId const> batch) {
      totals_.*phase += seconds;
      for (RequestId id : batch) slot(id).metrics.*phase += seconds;
    }
    // The last step's extend time, to the requests it extended that still run (and the totals).
    Status take_extend_time() {
      if (extended_.empty()) return Status::Ok();
      double seconds = 0.0;
      SPECDEC_RETURN_IF_ERROR(clock_.seconds(detail::kExtendStart, detail::kExtendEnd, &seconds));
      std::erase_if(extended_, [this](RequestId id) { return !has_request(id); });
      add_time(&SpecMetrics::extend_s, seconds, extended_);
      extended_.clear();
      return Status::Ok();
    }

    // One prefill forward over the next chunks of the prefilling requests; a request whose
    // prompt is complete draws its first token and joins the decoding batch.
    Status prefill(std::vector<StepEvent>* events) {
      auto const t0 = detail::Clock::now();
      std::vector<RequestId> batch;
      std::vector<int32_t> counts, tokens;
      int64_t budget = options_.max_prefill_tokens;
      for (RequestId id : prefilling_) {
        if (budget == 0) break;
        Slot& s = slot(id);
        int64_t const n = std::min<int64_t>(
            budget, static_cast<int64_t>(s.request.prompt.size()) - s.prefilled);
        batch.push_back(id);
        counts.push_back(static_cast<int32_t>(n));
        tokens.insert(tokens.end(), s.request.prompt.begin() + s.prefilled,
                      s.request.prompt.begin() + s.prefilled + n);
        budget -= n;
      }
      auto const batch_slots = slots_of(batch);
      BatchSampling all;
      detail::fill_sampling<Slot>(batch_slots, &all);
      SPECDEC_RETURN_IF_ERROR(target_.prefill(batch, counts, tokens, aux_layers(), all.all_greedy));
      // The requests whose prompt is complete: the first token from their last row.
      std::vector<RequestId> complete;
      std::vector<int64_t> first_row(batch.size()), last_rows;
      int64_t row = 0;
      for (size_t b = 0; b < batch.size(); ++b) {
        first_row[b] = row;
        row += counts[b];
        Slot& s = slot(batch[b]);
        s.prefilled += counts[b];
        if (s.prefilled == static_cast<int64_t>(s.request.prompt.size())) {
          complete.push_back(batch[b]);
          last_rows.push_back(row - 1);
        }
      }
      std::vector<int32_t> drawn;
      if (!complete.empty()) {
        BatchSampling sampling;
        detail::fill_sampling<Slot>(slots_of(complete), &sampling);
        SPECDEC_RETURN_IF_ERROR(target_.sample_rows(last_rows, sampling, &drawn));
      }
      // Draft entry i of a prompt: token i + 1 (the drawn token after the last) with the
      // target's features of token i; entries of a chunk [p0, p0 + n).
      std::vector<RequestId> extended, finished;
      std::vector<int32_t> d_counts, d_tokens;
      std::vector<int64_t> d_rows;
      std::vector<StepEvent> mine;
      size_t c = 0;
      for (size_t b = 0; b < batch.size(); ++b) {
        RequestId const id = batch[b];
        Slot& s = slot(id);
        bool const last = c < complete.size() && complete[c] == id;
        std::optional<FinishReason> done;
        if (last) {
          int32_t const token = drawn[c++];
          StepEvent& ev = mine.emplace_back();
          ev.id = id;
          ev.tokens.push_back(token);
          done = push(s, token);
          if (done) {
            ev.reason = *done;
            finished.push_back(id);
            continue;
          }
        }
        if constexpr (kDraftsWithModel) {
          int64_t const p0 = s.prefilled - counts[b];
          extended.push_back(id);
          d_counts.push_back(counts[b]);
          for (int64_t i = p0; i < s.prefilled; ++i) {
            d_tokens.push_back(s.history[static_cast<size_t>(i + 1)]);
            d_rows.push_back(first_row[b] + (i - p0));
          }
        }
      }
      SPECDEC_RETURN_IF_ERROR(extend(extended, d_counts, d_tokens, d_rows, false));
      add_time(&SpecMetrics::prefill_s, detail::seconds_since(t0), batch);
      for (StepEvent& ev : mine) {
        std::erase(prefilling_, ev.id);
        if (std::find(finished.begin(), finished.end(), ev.id) != finished.end()) {
          SPECDEC_RETURN_IF_ERROR(finish(ev.id, ev.reason, &ev));
        } else {
          decoding_.push_back(ev.id);
        }
        events->push_back(std::move(ev));
      }
      return Status::Ok();
    }

    // The draft consumes tokens [sum counts] with the features of the last target forward's
    // rows `rows` [sum counts] for batch; keeps each request's last hidden / logits row for the
    // next proposal (on the host, or on the device for the CUDA draft, whose features are
    // gathered on the device).
    // after_verify: a step's accepted tokens (else a prefill chunk's).
    // tokens and rows are the step's own (a padded extend appends its fillers to them).
    Status extend(std::span<RequestId const> batch, std::vector<int32_t> const& counts,
                  std::vector<int32_t>& tokens, std::vector<int64_t>& rows, bool after_verify) {
      if (batch.empty()) return Status::Ok();
      if constexpr (!kHostDraft) {
        // A padded extend's filler entries: token 0 with the features of the forward's row 0.
        if (after_verify) {
          size_t const fillers = static_cast<size_t>(draft_.extend_padding(
              static_cast<int>(batch.size()), static_cast<int64_t>(tokens.size())));
          tokens.resize(tokens.size() + fillers, 0);
          rows.resize(rows.size() + fillers, 0);
        }
        std::span<float const> features;
        SPECDEC_RETURN_IF_ERROR(target_.gather_aux_rows(rows, &features));
        return draft_.extend(batch, counts, tokens, features, after_verify);
      } else {
        std::vector<float> features;
        SPECDEC_RETURN_IF_ERROR(target_.aux_rows(rows, &features));
        std::vector<float> hidden, logits;
        SPECDEC_RETURN_IF_ERROR(model::eagle::draft_extend(CpuExecutor{}, *e_.draft_,
                                                           &draft_.cache, batch, counts, tokens,
                                                           features, &hidden, &logits));
        int64_t const H = e_.draft_->hidden(), Vd = e_.draft_->draft_vocab();
        for (size_t b = 0; b < batch.size(); ++b) {
          draft_.hidden[batch[b]].assign(hidden.begin() + static_cast<int64_t>(b) * H,
                                         hidden.begin() + static_cast<int64_t>(b + 1) * H);
          draft_.logits[batch[b]].assign(logits.begin() + static_cast<int64_t>(b) * Vd,
                                         logits.begin() + static_cast<int64_t>(b + 1) * Vd);
        }
        return Status::Ok();
      }
    }
    // Propose for the batch with `steps` draft steps (draft_steps_at): tokens / parents
    // [B, *stride] (kNodes, or the draft's draft_nodes(steps)), node_count [B].
    Status propose(std::span<RequestId const> batch, int steps, std::vector<int32_t>* tokens,
                   std::vector<int32_t>* parents, std::vector<int32_t>* node_count,
                   int* stride) {
      int const B = static_cast<int>(batch.size());
      size_t const BN = static_cast<size_t>(B) * kNodes;
      *stride = kNodes;
      tokens->assign(BN, -1);
      parents->assign(BN, -1);
      node_count->assign(static_cast<size_t>(B), kNodes);
      if (steps == 0) {  // the root alone
        for (int b = 0; b < B; ++b) {
          (*tokens)[static_cast<size_t>(b) * kNodes] = slot(batch[b]).history.back();
          (*node_count)[static_cast<size_t>(b)] = 1;
        }
        return Status::Ok();
      }
      if constexpr (kKind == DraftKind::kNone) {
        for (int b = 0; b < B; ++b) {
          (*tokens)[static_cast<size_t>(b) * kNodes] =
              slot(batch[b]).history.back();
        }
        return Status::Ok();
      } else if constexpr (kKind == DraftKind::kNGram) {
        size_t max_len = 0;
        for (RequestId id : batch) max_len = std::max(max_len, slot(id).history.size());
        std::vector<int32_t> text(static_cast<size_t>(B) * max_len, 0), lengths(B);
        for (int b = 0; b < B; ++b) {
          auto const& h = slot(batch[b]).history;
          std::copy(h.begin(), h.end(), text.begin() + static_cast<int64_t>(b) * max_len);
          lengths[static_cast<size_t>(b)] = static_cast<int32_t>(h.size());
        }
        ops::NgramLookupParams p;
        p.tokens = text.data();
        p.lengths = lengths.data();
        p.batch = B;
        p.max_len = static_cast<int>(max_len);
        p.min_n = e_.options_.ngram_min_n;
        p.max_n = e_.options_.ngram_max_n;
        p.nodes = kNodes;
        p.branches = kTopK;
        p.out_tokens = tokens->data();
        p.out_parents = parents->data();
        p.out_node_count = node_count->data();
        return ops::ngram_lookup(CpuExecutor{}, p);
      } else if constexpr (kDraftsWithModel) {
        // The draft's proposal [B, n], n = draft_nodes(steps).
        int const n = draft_nodes(steps);
        if constexpr (kHostDraft) {
          SPECDEC_RETURN_IF_ERROR(propose_with_draft(batch, steps, n, tokens, parents));
        } else {
          std::vector<int32_t> roots(static_cast<size_t>(B));
          for (int b = 0; b < B; ++b)
            roots[static_cast<size_t>(b)] = slot(batch[b]).history.back();
          SPECDEC_RETURN_IF_ERROR(draft_.propose(batch, roots, steps, n, tokens, parents));
        }
        *stride = n;
        node_count->assign(static_cast<size_t>(B), n);
        return Status::Ok();
      } else {
        return Status::Unsupported("SpecEngine: no proposer for " + std::string(P::kName));
      }
    }

    // The draft's proposal of `steps` steps and `nodes` nodes: tokens / parents [B, nodes].
    Status propose_with_draft(std::span<RequestId const> batch, int steps, int nodes,
                              std::vector<int32_t>* tokens, std::vector<int32_t>* parents) {
      int const B = static_cast<int>(batch.size()), K = kTopK, S = steps;
      int64_t const H = e_.draft_->hidden(), Vd = e_.draft_->draft_vocab();
      int const C = ops::draft_candidate_count(K, S);
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
        std::vector<float> const& last_logits = draft_.logits.at(batch[b]);
        std::vector<float> const& last_hidden = draft_.hidden.at(batch[b]);
        std::copy(last_logits.begin(), last_logits.end(), logits.begin() + b * Vd);
        std::copy(last_hidden.begin(), last_hidden.end(), hidden.begin() + b * H);
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
              model::eagle::draft_step(CpuExecutor{}, *e_.draft_, &draft_.cache, batch, K, next_tokens,
                                       parent_hidden, parent_scratch, &hidden, &logits, &scratch));
          frontier_scores = next_scores;
          frontier_slots = next_slots;
          branches = K;
        }
        ops::DraftExpandParams const x = buffers.expand(
            s, logits.data(), frontier_scores.data(), frontier_slots.data(), e_.draft_->d2t.data());
        SPECDEC_RETURN_IF_ERROR(ops::draft_expand(CpuExecutor{}, x));
      }
      std::vector<int32_t> roots(static_cast<size_t>(B)),
          node_slot(static_cast<size_t>(B) * nodes), status(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b)
        roots[static_cast<size_t>(b)] = slot(batch[b]).history.back();
      tokens->assign(static_cast<size_t>(B) * nodes, -1);
      parents->assign(static_cast<size_t>(B) * nodes, -1);
      ops::DraftFinalizeParams const f = buffers.finalize(
          roots.data(), nodes, tokens->data(), parents->data(), node_slot.data(), status.data());
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

    // One speculative step over the decoding batch.
    Status speculate(std::vector<StepEvent>* events) {
      std::vector<RequestId> const batch = decoding_;
      std::span<RequestId const> const ids = batch;
      int const B = static_cast<int>(batch.size());
      size_t const first_event = events->size();
      BatchSampling s;
      detail::fill_sampling<Slot>(slots_of(batch), &s);

      // 1. Propose (draft_steps_at(B) steps).
      SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kDraftStart));
      draft_steps_ = e_.draft_steps_at(B);
      if constexpr (kDeviceStep) {
        if (draft_steps_ > 0 && e_.options_.device_resident_step) {
          return speculate_on_device(batch, s, events);
        }
      }
      std::vector<int32_t> tokens, parents, node_count;
      int stride = 0;
      SPECDEC_RETURN_IF_ERROR(
          propose(batch, draft_steps_, &tokens, &parents, &node_count, &stride));
      // The step verifies N = the batch's largest proposal (an n-gram lookup may propose fewer
      // than kNodes, down to the root alone): [B, stride] -> [B, N].
      int const N = *std::max_element(node_count.begin(), node_count.end());
      if (N < stride) {
        for (int b = 1; b < B; ++b) {
          std::copy_n(tokens.begin() + int64_t{b} * stride, N, tokens.begin() + int64_t{b} * N);
          std::copy_n(parents.begin() + int64_t{b} * stride, N, parents.begin() + int64_t{b} * N);
        }
        tokens.resize(static_cast<size_t>(B) * N);
        parents.resize(static_cast<size_t>(B) * N);
      }
      int const W = mask_words(N), P_cap = std::min(kPathCapacity, N);
      size_t const BN = static_cast<size_t>(B) * N;

      // 2. Build.
      SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kBuildStart));
      std::vector<int32_t> prefix(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) {
        int64_t length = 0;
        SPECDEC_RETURN_IF_ERROR(target_.table().length(batch[static_cast<size_t>(b)], &length));
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

      // 3. Verify forward over the N slots; slots past a smaller tree's node count hold the root
      // token as a child of the root (valid for the forward, never read by accept or commit).
      // The CUDA target queues it without a host wait: accept and commit queue behind it.
      SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kVerifyStart));
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
      SPECDEC_RETURN_IF_ERROR(
          target_.verify(ids, N, v_tokens, v_positions, v_mask, aux_layers(), s.all_greedy));

      // 4. Accept, 5. commit.
      SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kCommitStart));
      std::vector<int32_t> path(static_cast<size_t>(B) * P_cap), num_accepted(B), next_token(B);
      Acceptance const acc{path.data(), num_accepted.data(), next_token.data(), P_cap};
      TreeLinks const links{depth.data(), first_child.data(), next_sibling.data(),
                            tree_status.data()};
      std::vector<int32_t> record;
      SPECDEC_RETURN_IF_ERROR(
          target_.accept_commit(ids, tree, links, s, stops_of(batch), acc, &record));
      return finish_step(batch, N, acc, record, events, first_event);
    }

    // The batch's stop arrays (ops::commit_tokens): each request's eos flag, the tokens it may
    // still produce and its stop ids; the model's eos ids.
    BatchStops stops_of(std::span<RequestId const> batch) {
      BatchStops stops;
      for (int64_t id : cfg_.eos_token_ids) stops.eos.push_back(static_cast<int32_t>(id));
      for (RequestId id : batch) {
        Slot const& q = slot(id);
        stops.add(q.request.stop_at_eos,
                  q.request.max_new_tokens - static_cast<int64_t>(q.output.size()),
                  q.request.stop_ids);
      }
      return stops;
    }

    // The device-resident step (kDeviceStep, draft steps > 0): the draft's proposal, its tree
    // (tree_build) and the verify forward over it stay on the device, queued without a wait;
    // accept and commit read back the acceptance, the commit record (commit_tokens) and the
    // proposal's status in one copy, the step's one host wait.
    Status speculate_on_device(std::vector<RequestId> const& batch, BatchSampling const& s,
                               std::vector<StepEvent>* events) {
      size_t const first_event = events->size();
      int const B = static_cast<int>(batch.size()), N = draft_nodes(draft_steps_);
      int const P_cap = std::min(kPathCapacity, N);
      std::vector<int32_t> roots(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) roots[static_cast<size_t>(b)] = slot(batch[b]).history.back();
      typename decltype(draft_)::DeviceProposal proposal;
      SPECDEC_RETURN_IF_ERROR(draft_.queue_proposal(batch, roots, draft_steps_, N, &proposal));
      SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kBuildStart));
      SPECDEC_RETURN_IF_ERROR(
          target_.build_device_tree(batch, N, proposal.tokens, proposal.parents, P_cap));
      SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kVerifyStart));
      SPECDEC_RETURN_IF_ERROR(target_.verify_device_tree(aux_layers(), s.all_greedy));
      SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kCommitStart));
      std::vector<int32_t> path(static_cast<size_t>(B) * P_cap), num_accepted(B), next_token(B);
      std::vector<int32_t> also;  // [commit record | the proposal's status words]
      Acceptance const acc{path.data(), num_accepted.data(), next_token.data(), P_cap};
      Status const accepted = target_.accept_commit_device(
          batch, s, stops_of(batch), acc, {proposal.status(), proposal.status_words()}, &also);
      // The proposal's faults first: a tree or acceptance error would follow from them.
      size_t const R = static_cast<size_t>(B) * ops::commit_record_width(P_cap);
      if (also.size() == R + proposal.status_words()) {
        SPECDEC_RETURN_IF_ERROR(draft_.check_proposal(
            batch, proposal, std::span<int32_t const>(also).subspan(R)));
      }
      SPECDEC_RETURN_IF_ERROR(accepted);
      return finish_step(batch, N, acc, std::span<int32_t const>(also.data(), R), events,
                         first_event);
    }

    // After accept and commit: each request's commit record (ops::commit_tokens: the tokens it
    // takes, up to its stop, and its drafts per depth) into its output and metrics, the phase
    // times, the draft extend over the accepted tokens (queued: path nodes of a tree of N
    // nodes), and the finished requests' release.
    Status finish_step(std::vector<RequestId> const& batch, int N, Acceptance const& acc,
                       std::span<int32_t const> record, std::vector<StepEvent>* events,
                       size_t first_event) {
      int const B = static_cast<int>(batch.size()), P_cap = acc.path_capacity;
      int const width = ops::commit_record_width(P_cap);
      std::vector<RequestId> still, finished;
      std::vector<int32_t> d_counts, d_tokens;
      std::vector<int64_t> d_rows;
      for (int b = 0; b < B; ++b) {
        RequestId const id = batch[static_cast<size_t>(b)];
        Slot& slot_b = slot(id);
        int const a = acc.num_accepted[b];
        std::span<int32_t const> const row = record.subspan(static_cast<size_t>(b) * width, width);
        int const taken = row[0];
        std::span<int32_t const> const committed = row.subspan(2, static_cast<size_t>(taken));
        StepEvent& ev = events->emplace_back();
        ev.id = id;
        ev.tokens.assign(committed.begin(), committed.end());
        slot_b.output.insert(slot_b.output.end(), committed.begin(), committed.end());
        slot_b.history.insert(slot_b.history.end(), committed.begin(), committed.end());
        std::span<int32_t const> const proposed = row.subspan(2 + static_cast<size_t>(P_cap));
        slot_b.metrics.record_verify_counts(proposed, std::min(a, taken), taken);
        totals_.record_verify_counts(proposed, std::min(a, taken), taken);
        ev.verified = true;
        if (row[1] != ops::kCommitGoOn) {
          ev.reason = finish_reason(row[1]);
          finished.push_back(id);
          continue;
        }
        still.push_back(id);
        if constexpr (kDraftsWithModel) {
          // Draft entries: committed token k with the features of path node k - 1 (a request
          // that runs on took all a + 1).
          d_counts.push_back(taken);
          d_tokens.insert(d_tokens.end(), committed.begin(), committed.end());
          for (int k = 0; k < taken; ++k) {
            d_rows.push_back(static_cast<int64_t>(b) * N + acc.accepted_path[b * P_cap + k]);
          }
        }
      }
      // The phase times (the accept read-back has drained the stream); the previous step's
      // extend first, since its marks are reused now.
      SPECDEC_RETURN_IF_ERROR(take_extend_time());
      SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kExtendStart));
      for (auto [phase, from, to] :
           {std::tuple{&SpecMetrics::draft_s, detail::kDraftStart, detail::kBuildStart},
            std::tuple{&SpecMetrics::build_s, detail::kBuildStart, detail::kVerifyStart},
            std::tuple{&SpecMetrics::verify_s, detail::kVerifyStart, detail::kCommitStart},
            std::tuple{&SpecMetrics::commit_s, detail::kCommitStart, detail::kExtendStart}}) {
        double seconds = 0.0;
        SPECDEC_RETURN_IF_ERROR(clock_.seconds(from, to, &seconds));
        add_time(phase, seconds, batch);
      }

      // 6. Draft extend, queued without a host wait on the CUDA executor: the next step's
      // proposal queues behind it, and its time is taken at the next step's commit.
      if constexpr (kDraftsWithModel) {
        SPECDEC_RETURN_IF_ERROR(extend(still, d_counts, d_tokens, d_rows, true));
        SPECDEC_RETURN_IF_ERROR(clock_.mark(detail::kExtendEnd));
        extended_ = still;
      }
      // The finished requests leave (their events of this speculative step close).
      for (size_t i = first_event; i < events->size(); ++i) {
        StepEvent& ev = (*events)[i];
        if (std::find(finished.begin(), finished.end(), ev.id) != finished.end()) {
          SPECDEC_RETURN_IF_ERROR(finish(ev.id, ev.reason, &ev));
        }
      }
      return Status::Ok();
    }


    SpecEngine const& e_;
    io::DeepseekV3Config const& cfg_;
    SessionOptions options_;
    bool opened_ = false;
    Target target_;                                  // target KV; the caller's RequestIds
    typename detail::DraftFor<Exec>::Run draft_;     // EAGLE3 / EAGLE: cache, last extend rows
    std::map<RequestId, Slot> slots_;                // the running requests
    std::vector<RequestId> prefilling_, decoding_;   // in admission order
    int draft_steps_ = -1;                           // of the last speculative step
    SpecMetrics totals_;                             // see totals()
    typename detail::StepClockFor<Exec>::type clock_;  // the phase marks of the step
    std::vector<RequestId> extended_;  // the last step's extend, whose time is not taken yet
  };

 private:
  TargetModel* target_ = nullptr;
  DraftModel* draft_ = nullptr;
  EngineOptions options_;
  Exec exec_{};
};

}  // namespace specdec::engine
