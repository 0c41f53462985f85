// ngram_lookup: prompt-lookup drafting. From token histories [B, max_len] and lengths [B], writes a
// TreeInput-shaped draft (tokens [B, N], parents [B, N], node_count [B]) rooted at the last token:
// a chain (branches = 1) or a trie of up to `branches` continuations of earlier occurrences of the
// history's suffix (n-grams of max_n down to min_n tokens). Same call on a CpuExecutor (host
// pointers) or a CudaExecutor (device pointers).
#pragma once

#include "specdec/core/executor.hpp"
#include "specdec/ops/ngram_lookup/params.hpp"
#include "specdec/ops/ngram_lookup/reference.hpp"

#if defined(__CUDACC__)
#include "specdec/core/cuda.cuh"
#include "specdec/ops/ngram_lookup/kernel.cuh"
#endif

namespace specdec::ops {

inline Status ngram_lookup(CpuExecutor, NgramLookupParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return ngram_lookup_reference(p);
}

#if defined(__CUDACC__)
inline Status ngram_lookup(CudaExecutor e, NgramLookupParams const& p) {
  SPECDEC_RETURN_IF_ERROR(validate(p));
  return ngram_lookup_cuda(p, e.stream);
}
#endif

}  // namespace specdec::ops
