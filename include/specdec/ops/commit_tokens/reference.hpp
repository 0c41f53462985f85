// commit_tokens CPU reference (params.hpp): plain loops over the requests, host pointers; the
// kernel (kernel.cuh) runs the same per-request function, one thread per request.
#pragma once

#include "specdec/ops/commit_tokens/params.hpp"

namespace specdec::ops {

// Request b's record row (params.hpp). A num_accepted outside [0, P - 1] or a node depth
// outside [0, P) is never read past: the accepted drafts are clamped to P - 1 and such nodes
// are not counted (verify and tree_build report those requests themselves).
SPECDEC_HD inline void commit_tokens_row(CommitTokensParams const& p, int b) {
  int const N = p.tree.nodes, P = p.acceptance.path_capacity;
  int32_t* row = p.record + static_cast<int64_t>(b) * commit_record_width(P);
  int64_t const t0 = static_cast<int64_t>(b) * N;
  int32_t const* path = p.acceptance.accepted_path + static_cast<int64_t>(b) * P;
  int a = p.acceptance.num_accepted[b];
  a = a < 0 ? 0 : (a > P - 1 ? P - 1 : a);
  int32_t const* stop = p.stop_ids + p.stop_offsets[b];
  int const num_stop = p.stop_offsets[b + 1] - p.stop_offsets[b];
  int count = 0;
  int32_t reason = kCommitGoOn;
  for (int k = 1; k <= a + 1 && reason == kCommitGoOn; ++k) {
    int const node = k <= a ? path[k] : -1;
    int32_t const token = k <= a ? (node >= 0 && node < N ? p.tree.tokens[t0 + node] : -1)
                                 : p.acceptance.next_token[b];
    row[2 + count++] = token;
    reason = commit_stop(token, p.stop_at_eos[b] != 0, p.eos, p.num_eos, stop, num_stop, k,
                         static_cast<int64_t>(p.remaining[b]));
  }
  row[0] = count;
  row[1] = reason;
  for (int k = count; k < P; ++k) row[2 + k] = -1;
  int32_t* proposed = row + 2 + P;
  for (int d = 0; d < P; ++d) proposed[d] = 0;
  int const n = p.tree.count(b);
  for (int i = 1; i < n && i < N; ++i) {
    int32_t const d = p.depth[t0 + i];
    if (d >= 1 && d < P) ++proposed[d];
  }
}

inline Status commit_tokens_reference(CommitTokensParams const& p) {
  for (int b = 0; b < p.tree.batch; ++b) commit_tokens_row(p, b);
  return Status::Ok();
}

}  // namespace specdec::ops
