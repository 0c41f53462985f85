// kv_commit: after acceptance, move accepted tree nodes' KV entries (slot prefix_len + path[k])
// to contiguous slots prefix_len + k in every layer, contiguous [L][B, max_seq, W] or paged
// [L][num_pages, page_size, W] caches; per-request status [B] and optional seq_len_out [B].
// Same call on a CpuExecutor (host pointers) or a CudaExecutor (device pointers).
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/kv_commit/params.hpp"
#include "specdec/ops/kv_commit/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/kv_commit/kernel.cuh"
#endif

namespace specdec::ops {

inline Status kv_commit(CpuExecutor, KvCommitParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return kv_commit_reference(p);
}

#if defined(__CUDACC__)
inline Status kv_commit(CudaExecutor e, KvCommitParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return kv_commit_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
