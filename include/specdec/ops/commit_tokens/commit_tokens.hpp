// commit_tokens: per request of a verified step, the tokens it commits up to its stop (eos, a
// stop id, max_new_tokens), why it stopped, and its tree's drafts per depth, as one record row
// [2 + 2P] (params.hpp). Same call on a CpuExecutor (host pointers) or a CudaExecutor (device
// pointers, queued on the stream), so a device-resident step reads back only its new tokens.
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/commit_tokens/params.hpp"
#include "specdec/ops/commit_tokens/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/commit_tokens/kernel.cuh"
#endif

namespace specdec::ops {

inline Status commit_tokens(CpuExecutor, CommitTokensParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return commit_tokens_reference(p);
}

#if defined(__CUDACC__)
inline Status commit_tokens(CudaExecutor e, CommitTokensParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return commit_tokens_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
