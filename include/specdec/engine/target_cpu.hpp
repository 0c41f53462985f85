// The engine's target on the CPU executor: the Kimi CPU forward (model/kimi/forward_cpu.hpp) over
// a host MLA cache, and the CPU references of sample / verify / kv_commit on its host logits.
// SpecEngine (engine/spec_engine.hpp) drives every executor's target through the same calls:
//   create_cache(page_size, total_pages, max_pages_per_request); table() (the page bookkeeping)
//   prefill(ids [B], counts [B], tokens [sum counts], aux_layers, all_greedy)   keeps logits / aux
//   verify(ids [B], N, tokens [B*N], positions [B*N], mask [B*N*W], aux_layers, all_greedy)
//   sample_rows(rows [B] of the last forward, sampling, &tokens [B])  one draw per row
//   accept_commit(ids [B], tree, links, sampling, stops, &acceptance, &record)
//       verify_greedy (all greedy) or verify_sample over the last verify's logits, then kv_commit
//       of the accepted nodes + MlaCache::commit, then ops::commit_tokens: each request's
//       committed tokens up to its stop (record [B, commit_record_width(P)]); host arrays
// all_greedy (every request of the forward's batch is greedy): a vocabulary-sharded target
// (tensor parallel, dist/shard.hpp) then asks the forward for each row's argmax
// (LogitsMode::kArgmax: one key per row crosses the ranks, not the [T, V] logits), and
// sample_rows / accept_commit read the argmax; otherwise, and on a whole-vocabulary target, the
// logits.
//   aux_rows(rows [R], &out [R, F])               the last forward's aux rows, on the host
//   graph_replays()                               forwards replayed from CUDA graphs (0 here)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/executor.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/engine/batch.hpp"
#include "specdec/model/kimi/forward_cpu.hpp"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/ops/commit_tokens/commit_tokens.hpp"
#include "specdec/ops/kv_commit/kv_commit.hpp"
#include "specdec/ops/sample/sample.hpp"
#include "specdec/ops/verify_greedy/verify_greedy.hpp"
#include "specdec/ops/verify_sample/verify_sample.hpp"

namespace specdec::engine {

class CpuTarget {
 public:
  using Model = model::kimi::KimiCpuModel const;
  using RequestId = model::kimi::RequestId;

  CpuTarget(Model* model, CpuExecutor) : model_(model) {}

  io::DeepseekV3Config const& config() const { return model_->config; }
  model::kimi::MlaCache& table() { return cache_; }

  Status create_cache(int page_size, int total_pages, int max_pages_per_request) {
    return model::kimi::MlaCache::create_for(model_->config, page_size, total_pages,
                                             max_pages_per_request, &cache_);
  }

  Status prefill(std::span<RequestId const> ids, std::span<int32_t const> counts,
                 std::span<int32_t const> tokens, std::span<int const> aux_layers,
                 bool all_greedy) {
    mode_ = logits_mode(all_greedy);
    tokens_ = static_cast<int64_t>(tokens.size());
    return model::kimi::kimi_prefill(CpuExecutor{}, *model_, &cache_, ids, counts, tokens,
                                     aux_layers, &logits_, &aux_, mode_, &argmax_);
  }

  Status verify(std::span<RequestId const> ids, int nodes, std::span<int32_t const> tokens,
                std::span<int32_t const> positions, std::span<uint32_t const> mask,
                std::span<int const> aux_layers, bool all_greedy) {
    mode_ = logits_mode(all_greedy);
    tokens_ = static_cast<int64_t>(tokens.size());
    return model::kimi::kimi_verify(CpuExecutor{}, *model_, &cache_, ids, nodes, tokens, positions,
                                    mask, aux_layers, &logits_, &aux_, mode_, &argmax_);
  }

  Status sample_rows(std::span<int64_t const> rows, BatchSampling const& s,
                     std::vector<int32_t>* tokens) {
    int64_t const V = model_->config.vocab_size;
    int const B = static_cast<int>(rows.size());
    if (mode_ == model::kimi::LogitsMode::kArgmax) {
      SPECDEC_RETURN_IF_ERROR(check_argmax_batch("CpuTarget", s));
      tokens->resize(rows.size());
      for (size_t b = 0; b < rows.size(); ++b) (*tokens)[b] = argmax_[static_cast<size_t>(rows[b])];
      return Status::Ok();
    }
    std::vector<float> picked(static_cast<size_t>(B * V));
    for (int b = 0; b < B; ++b) {
      std::copy_n(logits_.begin() + rows[static_cast<size_t>(b)] * V, V, picked.begin() + b * V);
    }
    std::vector<int32_t> status(static_cast<size_t>(B));
    tokens->assign(static_cast<size_t>(B), -1);
    ops::SampleParams p;
    p.logits = picked.data();
    p.batch = B;
    p.vocab = static_cast<int>(V);
    p.config = s.config();
    p.keys = s.keys();
    p.tokens = tokens->data();
    p.status = status.data();
    SPECDEC_RETURN_IF_ERROR(ops::sample(CpuExecutor{}, p));
    return ops::check_sample_status(status.data(), B);
  }

  Status accept_commit(std::span<RequestId const> ids, TreeInput const& tree,
                       TreeLinks const& links, BatchSampling const& s, BatchStops const& stops,
                       Acceptance const& out, std::vector<int32_t>* record) {
    SPECDEC_RETURN_IF_ERROR(accept(tree, links, s, out));
    SPECDEC_RETURN_IF_ERROR(commit(ids, out));
    record->assign(static_cast<size_t>(tree.batch) *
                       static_cast<size_t>(ops::commit_record_width(out.path_capacity)),
                   -1);
    return ops::commit_tokens(CpuExecutor{},
                              stops.params(tree, links.depth, out, nullptr, record->data()));
  }

  Status aux_rows(std::span<int64_t const> rows, std::vector<float>* out) const {
    int64_t const F = aux_width();
    out->resize(rows.size() * static_cast<size_t>(F));
    for (size_t i = 0; i < rows.size(); ++i) {
      std::copy_n(aux_.begin() + rows[i] * F, F, out->begin() + static_cast<int64_t>(i) * F);
    }
    return Status::Ok();
  }

  int64_t graph_replays() const { return 0; }  // no graphs on the host
  bool graphs_on() const { return false; }
  int64_t aux_width() const {
    return tokens_ > 0 ? static_cast<int64_t>(aux_.size()) / tokens_ : 0;
  }

 private:
  Status accept(TreeInput const& tree, TreeLinks const& links, BatchSampling const& s,
                Acceptance const& out) {
    int const V = static_cast<int>(model_->config.vocab_size);
    if (mode_ == model::kimi::LogitsMode::kArgmax)
      SPECDEC_RETURN_IF_ERROR(check_argmax_batch("CpuTarget", s));
    if (s.all_greedy) {
      std::vector<int32_t> argmax(static_cast<size_t>(tree.batch) * tree.nodes);
      ops::VerifyGreedyParams p;
      p.tree = tree;
      p.links = links;
      bool const given = mode_ == model::kimi::LogitsMode::kArgmax;
      p.logits = given ? nullptr : logits_.data();
      p.target_argmax = given ? argmax_.data() : nullptr;
      p.vocab = V;
      p.argmax_scratch = argmax.data();
      p.out = out;
      return ops::verify_greedy(CpuExecutor{}, p);
    }
    std::vector<int32_t> status(static_cast<size_t>(tree.batch));
    ops::VerifySampleParams p;
    p.tree = tree;
    p.links = links;
    p.logits = logits_.data();
    p.vocab = V;
    p.config = s.config();
    p.keys = s.keys();
    p.out = out;
    p.status = status.data();
    SPECDEC_RETURN_IF_ERROR(ops::verify_sample(CpuExecutor{}, p));
    return ops::check_sample_status(status.data(), tree.batch);
  }

  Status commit(std::span<RequestId const> ids, Acceptance const& acceptance) {
    std::vector<int32_t> table, prefix, seq_len(ids.size()), status(ids.size());
    ops::KvCommitParams p;
    SPECDEC_RETURN_IF_ERROR(cache_.kv_commit_params(ids, &table, &prefix, &p));
    p.acceptance = acceptance;
    p.seq_len_out = seq_len.data();
    p.status = status.data();
    SPECDEC_RETURN_IF_ERROR(ops::kv_commit(CpuExecutor{}, p));
    return finish_commit(ids, status, seq_len, &cache_);
  }

  model::kimi::LogitsMode logits_mode(bool all_greedy) const {
    return logits_mode_for(all_greedy, model_->vocab.size() != model_->config.vocab_size);
  }

  Model* model_;
  model::kimi::MlaCache cache_;
  std::vector<float> logits_, aux_;
  std::vector<int32_t> argmax_;
  model::kimi::LogitsMode mode_ = model::kimi::LogitsMode::kFull;
  int64_t tokens_ = 0;  // rows of the last forward
};

}  // namespace specdec::engine
