// draft_select: EAGLE-2 expand and rerank of draft tokens, in two calls.
//   draft_expand (once per draft step): log-softmax top-k of every frontier branch's draft logits
//     [B, K_in, Vd] into the candidate buffer [B, C] and the next frontier [B, topk].
//   draft_finalize (once per speculative step): the best N-1 candidates, parents first, as a
//     TreeInput (tokens / parents [B, N]) with node_slot [B, N] and a per-request status [B].
// Same calls on a CpuExecutor (host pointers) or a CudaExecutor (device pointers; draft_expand
// also needs a workspace of draft_expand_workspace_bytes). See params.hpp for every shape.
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/draft_select/params.hpp"
#include "specdec/ops/draft_select/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/draft_select/kernel.cuh"
#endif

namespace specdec::ops {

inline Status draft_expand(CpuExecutor, DraftExpandParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return draft_expand_reference(p);
}

inline Status draft_finalize(CpuExecutor, DraftFinalizeParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return draft_finalize_reference(p);
}

#if defined(__CUDACC__)
inline Status draft_expand(CudaExecutor e, DraftExpandParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  SPECDEC_RETURN_IF_ERROR(validate_workspace(p));
  return draft_expand_cuda(p, e.stream);
}

inline Status draft_finalize(CudaExecutor e, DraftFinalizeParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return draft_finalize_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
