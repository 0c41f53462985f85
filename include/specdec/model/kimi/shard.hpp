// The Kimi model's tensor-parallel shard (dist/shard.hpp's rule) as the ranges one rank holds,
// shared by the CPU and CUDA loaders: heads [nh / P], the dense MLP's and the shared experts'
// width slices, the routed experts held (expert parallel: E / P whole; tensor parallel: all E with
// the width slice expert_width, on INT4 group boundaries), and the lm_head's vocabulary rows.
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/status.hpp"
#include "specdec/dist/shard.hpp"
#include "specdec/io/hf_config.hpp"
#include "specdec/model/kimi/weights.hpp"

namespace specdec::model::kimi {

struct ShardRanges {
  dist::Range heads, dense, shared, experts, expert_width, vocab;
};

inline Status shard_ranges(KimiWeights const& w, io::DeepseekV3Config const& c,
                           dist::TpShard const& s, ShardRanges* out) {
  using dist::shard_range;
  SPECDEC_RETURN_IF_ERROR(
      shard_range(s, c.num_attention_heads, 1, "num_attention_heads", &out->heads));
  SPECDEC_RETURN_IF_ERROR(shard_range(s, c.intermediate_size, 1, "intermediate_size", &out->dense));
  int64_t const E = c.n_routed_experts, M = c.moe_intermediate_size;
  SPECDEC_RETURN_IF_ERROR(shard_range(s, int64_t{c.n_shared_experts} * M, 1,
                                      "the shared experts' width", &out->shared));
  if (s.moe == dist::MoeSplit::kExpertParallel) {
    SPECDEC_RETURN_IF_ERROR(
        shard_range(s, E, 1, "n_routed_experts (expert parallel)", &out->experts));
    out->expert_width = {0, M};
  } else {
    out->experts = {0, E};
    int64_t const align = w.experts_int4 && c.quantization ? c.quantization->group_size : 1;
    SPECDEC_RETURN_IF_ERROR(shard_range(s, M, align,
                                        w.experts_int4
                                            ? "moe_intermediate_size (tensor-parallel INT4 experts "
                                              "split on quantization groups)"
                                            : "moe_intermediate_size (tensor-parallel experts)",
                                        &out->expert_width));
  }
  if (s.replicate_lm_head) {
    out->vocab = {0, c.vocab_size};
  } else {
    SPECDEC_RETURN_IF_ERROR(
        shard_range(s, c.vocab_size, 1, "vocab_size (lm_head split by vocabulary)", &out->vocab));
  }
  return Status::Ok();
}

// A shard of size > 1 comes with that rank's communicator (any dist::Communicator).
template <class Comm>
Status check_shard_communicator(dist::TpShard const& shard, Comm const* comm) {
  SPECDEC_RETURN_IF_ERROR(shard.check());
  if (shard.size > 1 &&
      (comm == nullptr || comm->size() != shard.size || comm->rank() != shard.rank)) {
    return Status::InvalidArgument("a tensor-parallel shard (rank " + std::to_string(shard.rank) +
                                   " of " + std::to_string(shard.size) +
                                   ") needs the rank's communicator (same rank and size)");
  }
  return Status::Ok();
}

}  // namespace specdec::model::kimi
