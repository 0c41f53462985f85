// verify_sample parameters: lossless speculative sampling over a token tree.
//
// Per request b of B with N tree slots, vocabulary V and path capacity P:
//   tree.tokens [B, N] int32          draft token of each node (tree.parents is not read;
//                                      tree.node_count [B] or nullptr bounds the links)
//   links.first_child / next_sibling [B, N] int32 and links.tree_status [B] int32 (tree_build)
//   logits      [B, N, V] float        target logits; row n gives p_n, the target distribution
//                                      (params.hpp of sample: temperature/top-k/top-p) of the
//                                      token after node n
//   draft_probs [B, N, V] float        or nullptr. Row n = q_n, the distribution node n's children
//                                      were drawn from (i.i.d.). nullptr: deterministic drafts.
//   config      SamplingConfig         temperature [B], top_k [B] or nullptr, top_p [B] or nullptr
//   keys        RandomKeys             seed [B], step [B], request_id [B] or nullptr
//   out         Acceptance             accepted_path [B, P], num_accepted [B], next_token [B]
//   status      [B] int32              SampleError of request b
//
// The walk, from n = 0 (the root), with w the target weights of row n (w_v = S p_n(v)):
//   Children c of n are tried in sibling order (first_child, next_sibling) with u_c =
//   keys.uniform(b, c, 0) and token x = tokens[c].
//   * Deterministic drafts (target-only form; exact for top-k drafts with distinct siblings):
//     R = weight of the distinct tokens of the rejected siblings so far (initially 0).
//     A sibling repeating an earlier (hence rejected) sibling's token is rejected. Otherwise accept
//     iff u_c < p(x) / (1 - R/S), computed as u_c * (S - R) < w_x; on rejection R += w_x.
//     All rejected: the correction is drawn from w with the rejected tokens removed.
//   * Sampled drafts (SpecInfer recursion with residual renormalisation): with residual r_k
//     (r_0 = p_n) accept iff u_c < r_k(x) / q(x); on rejection r_{k+1} = norm(max(r_k - q, 0)).
//     Closed form (induction: where p - c_k q > 0, max(r_k - q, 0) = max(p - (c_k + M_k) q, 0) / M_k;
//     where p - c_k q <= 0 both sides are 0 since q >= 0):
//        r_k = max(p - c_k q, 0) / M_k,   c_0 = 0, M_0 = 1,
//        c_{k+1} = c_k + M_k,             M_{k+1} = sum_v max(p_v - c_{k+1} q_v, 0).
//     In weight units (C = c S, M_w = M S): accept iff u_c * M_w * q(x) < max(w_x - C q(x), 0);
//     on rejection C += M_w, M_w = sum_v max(w_v - C q_v, 0) (one vocabulary pass). q(x) = 0
//     accepts iff the residual at x is positive. All rejected: the correction is drawn from
//     max(w - C q, 0); if its mass is 0 (exhausted by rounding), from w.
//   * No children (a leaf, or the path already holds P nodes): the bonus is drawn from w.
//   Corrections and bonuses use u = keys.uniform(b, n, 1) and the inverse CDF of sample.
//   On acceptance the walk moves to c. Greedy requests (temperature <= 0) have one-hot p, so the
//   same rules are greedy verification.
// Output: accepted_path [0, c1, c2, ...] (-1 padded to P), num_accepted = accepted drafts,
// next_token = the correction or bonus. Requests with tree_status != 0 (status kSampleBadTree)
// and requests whose settings or a used logit row are invalid (status 1..3) get accepted_path
// [0, -1, ...], num_accepted 0 and next_token -1.
#pragma once

#include <cstdint>
#include <string>

#include "specdec/core/philox.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"
#include "specdec/ops/sample/params.hpp"

namespace specdec::ops {

// The kernel keeps the rejected sibling tokens of one node in shared memory.
constexpr int kVerifySampleMaxNodes = 1024;

struct VerifySampleParams {
  TreeInput tree;                      // tokens [B, N], node_count [B] or nullptr; B, N
  TreeLinks links;                     // first_child, next_sibling [B, N], tree_status [B]
  float const* logits = nullptr;       // [B, N, V] float
  float const* draft_probs = nullptr;  // [B, N, V] float or nullptr (deterministic drafts)
  int vocab = 0;                       // V
  SamplingConfig config;               // temperature [B], top_k [B] / nullptr, top_p [B] / nullptr
  RandomKeys keys;                     // seed [B], step [B], request_id [B] or nullptr
  Acceptance out;                      // accepted_path [B, P], num_accepted [B], next_token [B]
  int32_t* status = nullptr;           // [B] int32, written (SampleError)
  void* workspace = nullptr;           // CUDA only: verify_sample_workspace_bytes(B, N, V) bytes,
  size_t workspace_bytes = 0;          //   8-byte aligned (no initial contents needed)
};

// A request's residual draw, left by the walk to the kernel after it (sampled drafts whose walk
// ended at a rejected child): the row's distribution, the residual max(w - C q, 0)'s C, the
// draw's uniform and the count of chunk blocks done (the last one draws).
struct VerifyResidualDraw {
  TargetDist dist;
  float c_mass = 0.0f;
  float u = 0.0f;
  int32_t node = -1;  // the row's node; -1: no draw
  uint32_t arrived = 0;
};

// The CUDA workspace: the chunk partials (sample/params.hpp) of every logit row [B, N], then the
// residual draws [B] VerifyResidualDraw and their chunk masses [B, ceil(V / kSampleChunk)] float.
SPECDEC_HD inline size_t verify_sample_partials_bytes(int batch, int nodes, int vocab) {
  constexpr size_t kAlign = alignof(VerifyResidualDraw);
  return ceil_div(sample_workspace_bytes(static_cast<int64_t>(batch) * nodes, vocab), kAlign) *
         kAlign;
}
inline size_t verify_sample_workspace_bytes(int batch, int nodes, int vocab) {
  return verify_sample_partials_bytes(batch, nodes, vocab) +
         static_cast<size_t>(batch) *
             (sizeof(VerifyResidualDraw) + sample_chunks(vocab) * sizeof(float));
}
// The workspace's residual draws [B] ...
SPECDEC_HD inline VerifyResidualDraw* verify_residual_draws(void* workspace, int batch, int nodes,
                                                            int vocab) {
  return reinterpret_cast<VerifyResidualDraw*>(static_cast<unsigned char*>(workspace) +
                                               verify_sample_partials_bytes(batch, nodes, vocab));
}
// ... and their chunk masses [B, ceil(V / kSampleChunk)].
SPECDEC_HD inline float* verify_residual_masses(void* workspace, int batch, int nodes, int vocab) {
  return reinterpret_cast<float*>(verify_residual_draws(workspace, batch, nodes, vocab) + batch);
}

// A link to node c, reached from `after` (the parent for its first child, the previous sibling
// otherwise), is usable iff c lies after it and inside the request's node count: links only move
// forward, so every walk ends within N steps. Anything else is a broken link (the request gets
// kSampleBadTree).
SPECDEC_HD inline bool verify_sample_link_ok(int32_t c, int32_t after, int32_t count) {
  return c == -1 || (c > after && c < count);
}

inline Status validate(VerifySampleParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("verify_sample: " + m); };
  if (p.tree.batch < 1) return bad("batch " + std::to_string(p.tree.batch) + " < 1");
  if (p.tree.nodes < 1 || p.tree.nodes > kVerifySampleMaxNodes) {
    return bad("nodes " + std::to_string(p.tree.nodes) + " outside [1, " +
               std::to_string(kVerifySampleMaxNodes) + "]");
  }
  if (p.vocab < 1 || p.vocab > kSampleMaxVocab) {
    return bad("vocab " + std::to_string(p.vocab) + " outside [1, " +
               std::to_string(kSampleMaxVocab) + "]");
  }
  if (p.out.path_capacity < 1) {
    return bad("path capacity P " + std::to_string(p.out.path_capacity) +
               " < 1: pass P = max tree depth + 1 (the P given to tree_build)");
  }
  if (!p.tree.tokens) return bad("tree.tokens is null: pass the [B, N] draft tokens");
  if (!p.links.first_child) return bad("links.first_child is null: pass tree_build's first_child [B, N]");
  if (!p.links.next_sibling) return bad("links.next_sibling is null: pass tree_build's next_sibling [B, N]");
  if (!p.links.tree_status) return bad("links.tree_status is null: pass tree_build's tree_status [B]");
  if (!p.logits) return bad("logits is null: pass the target logits [B, N, V]");
  if (!p.out.accepted_path) return bad("out.accepted_path is null: pass a [B, P] int32 output");
  if (!p.out.num_accepted) return bad("out.num_accepted is null: pass a [B] int32 output");
  if (!p.out.next_token) return bad("out.next_token is null: pass a [B] int32 output");
  if (!p.status) return bad("status is null: pass a [B] int32 output");
  SPECDEC_RETURN_IF_ERROR(validate_sampling_config(p.config, "verify_sample"));
  SPECDEC_RETURN_IF_ERROR(validate_random_keys(p.keys, "verify_sample"));
  return Status::Ok();
}

// The CUDA path's extra requirement: a workspace of verify_sample_workspace_bytes(B, N, V).
inline Status validate_workspace(VerifySampleParams const& p) {
  return validate_sample_workspace(
      p.workspace, p.workspace_bytes,
      verify_sample_workspace_bytes(p.tree.batch, p.tree.nodes, p.vocab), "verify_sample",
      "verify_sample_workspace_bytes(batch, nodes, vocab)");
}

}  // namespace specdec::ops
