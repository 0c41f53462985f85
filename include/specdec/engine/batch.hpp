// What the engine and every executor's target share about one batch step, on the host:
//   BatchSampling   per-request sampling arrays [B] (temperature, top_k, top_p, seed, step,
//                   request id) in the layout ops::sample / ops::verify_sample read; all_greedy
//   BatchStops      per-request stop arrays in the layout ops::commit_tokens reads, and its
//                   arguments (params)
//   finish_commit   kv_commit's per-request status [B] checked, then each request's MlaCache
//                   length advanced to seq_len [B]
//   logits_mode_for LogitsMode::kArgmax for an all-greedy batch on a vocabulary-sharded target
//                   (tensor parallel: the argmax alone crosses the ranks), else kFull;
//                   check_argmax_batch: the batch a kept argmax decides is all greedy
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/philox.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/model/kimi/forward_plan.hpp"
#include "specdec/model/kimi/mla_cache.hpp"
#include "specdec/ops/commit_tokens/params.hpp"
#include "specdec/ops/kv_commit/params.hpp"
#include "specdec/ops/sample/params.hpp"

namespace specdec::engine {

struct BatchSampling {
  std::vector<float> temperature, top_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seed;
  std::vector<uint32_t> step, request_id;
  bool all_greedy = true;

  void resize(size_t batch) {
    temperature.resize(batch), top_p.resize(batch), top_k.resize(batch), seed.resize(batch),
        step.resize(batch), request_id.resize(batch);
  }
  ops::SamplingConfig config() const {
    return ops::SamplingConfig{temperature.data(), top_k.data(), top_p.data()};
  }
  RandomKeys keys() const { return RandomKeys{seed.data(), step.data(), request_id.data()}; }
};

// stop_at_eos [B] (0 / 1), remaining [B] (tokens each may still produce, >= 1), each request's
// stop ids end to end (stop_ids, its own from stop_offsets[b] to stop_offsets[b + 1]), and the
// model's eos ids.
struct BatchStops {
  std::vector<int32_t> stop_at_eos, remaining, stop_offsets{0}, stop_ids, eos;

  void add(bool at_eos, int64_t left, std::span<int32_t const> ids) {
    stop_at_eos.push_back(at_eos ? 1 : 0);
    remaining.push_back(static_cast<int32_t>(left));
    stop_ids.insert(stop_ids.end(), ids.begin(), ids.end());
    stop_offsets.push_back(static_cast<int32_t>(stop_ids.size()));
  }
  // The arrays end to end (stop_at_eos | remaining | stop_offsets | stop_ids | eos), for one
  // upload.
  std::vector<int32_t> flat() const {
    std::vector<int32_t> all;
    for (auto const* v : {&stop_at_eos, &remaining, &stop_offsets, &stop_ids, &eos}) {
      all.insert(all.end(), v->begin(), v->end());
    }
    return all;
  }
  // commit_tokens's arguments: the verified step's tree (tokens [B, N], node_count), its
  // depths [B, N], its acceptance and the record to write, with the stops the vectors
  // themselves (uploaded nullptr) or flat()'s upload at `uploaded`.
  ops::CommitTokensParams params(TreeInput const& tree, int32_t const* depth,
                                 Acceptance const& acceptance, int32_t const* uploaded,
                                 int32_t* record) const {
    ops::CommitTokensParams c;
    c.tree = tree;
    c.depth = depth;
    c.acceptance = acceptance;
    c.record = record;
    int32_t const* at = uploaded;
    auto place = [&](std::vector<int32_t> const& v) {
      int32_t const* p = uploaded ? at : v.data();
      at += uploaded ? v.size() : 0;
      return p;
    };
    c.stop_at_eos = place(stop_at_eos);
    c.remaining = place(remaining);
    c.stop_offsets = place(stop_offsets);
    c.stop_ids = place(stop_ids);
    c.eos = place(eos);
    c.num_eos = static_cast<int>(eos.size());
    return c;
  }
};

inline Status finish_commit(std::span<model::kimi::RequestId const> ids,
                            std::span<int32_t const> status, std::span<int32_t const> seq_len,
                            model::kimi::MlaCache* cache) {
  for (size_t b = 0; b < ids.size(); ++b) {
    if (status[b] != ops::kKvCommitOk) {
      return Status::Internal("kv_commit of request " + std::to_string(ids[b]) + ": " +
                              ops::kv_commit_error_name(status[b]));
    }
    SPECDEC_RETURN_IF_ERROR(cache->commit(ids[b], seq_len[b]));
  }
  return Status::Ok();
}

inline model::kimi::LogitsMode logits_mode_for(bool all_greedy, bool vocab_sharded) {
  return all_greedy && vocab_sharded ? model::kimi::LogitsMode::kArgmax
                                     : model::kimi::LogitsMode::kFull;
}

inline Status check_argmax_batch(char const* target, BatchSampling const& s) {
  if (s.all_greedy) return Status::Ok();
  return Status::Internal(std::string(target) +
                          ": the last forward kept only the argmax (an all-greedy batch), but "
                          "the sampling given is not all greedy");
}

}  // namespace specdec::engine
