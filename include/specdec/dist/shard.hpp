// Tensor-parallel sharding: which part of each weight a rank holds (TpShard) and the even split of
// one dimension (shard_range). The Kimi model's sharding (model/kimi/forward_cpu.hpp,
// forward_cuda.cuh) is, per rank r of size P:
//   MLA heads          heads [r nh/P, (r+1) nh/P): q_b_proj / q_proj and kv_b_proj rows of those
//                      heads, o_proj columns of those heads; q_a_proj, kv_a_proj_with_mqa, the
//                      norms and the latent cache replicated (MLA's cache is shared by all heads)
//   dense MLP          gate / up rows and down columns [r I/P, (r+1) I/P) (shared experts alike)
//   routed experts     kExpertParallel: experts [r E/P, (r+1) E/P) whole; kTensorParallel: every
//                      expert, its width split as a dense MLP's (INT4: a multiple of the group
//                      size)
//   router, embedding  replicated
//   lm_head            rows (vocabulary) [r V/P, (r+1) V/P), unless replicate_lm_head (an EAGLE-1/2
//                      draft reads the target's whole lm_head)
// Each partial output (attention's o_proj, the MLP's down, the experts' weighted sum) is summed by
// one all-reduce per block; the residual stream after it, and so every EAGLE feature captured from
// it, is the same on every rank. Sizes that do not split evenly are errors, never padded.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "specdec/core/status.hpp"

namespace specdec::dist {

enum class MoeSplit {
  kExpertParallel,  // whole experts per rank
  kTensorParallel,  // every expert on every rank, its width split
};

inline char const* moe_split_name(MoeSplit s) {
  return s == MoeSplit::kExpertParallel ? "expert" : "tensor";
}

inline Status parse_moe_split(std::string_view s, MoeSplit* out) {
  if (s == "expert")
    *out = MoeSplit::kExpertParallel;
  else if (s == "tensor")
    *out = MoeSplit::kTensorParallel;
  else
    return Status::InvalidArgument("--moe-split '" + std::string(s) +
                                   "': expected expert or tensor");
  return Status::Ok();
}

struct TpShard {
  int rank = 0;
  int size = 1;
  MoeSplit moe = MoeSplit::kExpertParallel;
  bool replicate_lm_head = false;

  Status check() const {
    if (size < 1 || rank < 0 || rank >= size) {
      return Status::InvalidArgument("TpShard: rank " + std::to_string(rank) + " of size " +
                                     std::to_string(size) + " (need 0 <= rank < size)");
    }
    return Status::Ok();
  }
};

// [begin, end) of one dimension.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The rank's even part of n; an error naming `what` unless P divides n and the part is a multiple
// of `align` (1: any).
inline Status shard_range(TpShard const& s, int64_t n, int64_t align, std::string const& what,
                          Range* out) {
  SPECDEC_RETURN_IF_ERROR(s.check());
  if (n % s.size != 0) {
    return Status::InvalidArgument(what + " " + std::to_string(n) + " does not split over " +
                                   std::to_string(s.size) + " tensor-parallel ranks");
  }
  int64_t const part = n / s.size;
  if (align > 1 && part % align != 0) {
    return Status::InvalidArgument(what + " " + std::to_string(n) + " over " +
                                   std::to_string(s.size) + " ranks gives " + std::to_string(part) +
                                   " per rank, not a multiple of " + std::to_string(align));
  }
  *out = {s.rank * part, (s.rank + 1) * part};
  return Status::Ok();
}

}  // namespace specdec::dist
