// draft_select parameters and shared arithmetic: EAGLE-2 expand and rerank in two calls.
//
// Candidate buffer per request b of B, C = topk + (steps-1)*topk^2 slots:
//   step 0 fills slots [0, topk) (children of the root), step s >= 1 fills
//   [topk + (s-1)*topk^2, topk + s*topk^2): child j of frontier branch i at base + i*topk + j.
//
// draft_expand (one call per draft step s; K_in = 1 at step 0, topk after):
//   in   logits [B, K_in, Vd] float, frontier_scores [B, K_in] float (cumulative log-prob; 0 for
//        the root), frontier_slots [B, K_in] int32 (-1 for the root), d2t [Vd] int64 or nullptr
//        (EAGLE-3: target id = d + d2t[d]; nullptr = identity)
//   out  cand_tokens / cand_scores / cand_parent [B, C] (this step's slots only; target ids,
//        frontier_scores[i] + log_softmax(logits[i])[d], frontier_slots[i]) and the next frontier
//        [B, topk]: the best topk of this step's candidates by score (ties: smaller slot), in
//        decreasing score order: next_scores, next_slots, next_tokens (target ids),
//        next_draft_tokens (draft ids), next_branch (the branch i < K_in each extends).
//   Each branch keeps its topk best draft ids by logit (ties: smaller draft id).
// draft_finalize: the best N-1 candidates by score (ties: smaller slot), in slot order, become
//   nodes 1..N-1 of a TreeInput (tokens / parents / node_slot [B, N], node 0 = root_tokens[b]).
//   A chosen candidate whose parent slot is not chosen gets parent -1 (tree_build then rejects
//   the tree) and status[b] = kDraftParentMissing.
// Logits must be finite or -inf (a row of only -inf has no log-softmax).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "specdec/core/macros.hpp"
#include "specdec/core/math.hpp"
#include "specdec/core/status.hpp"
#include "specdec/core/tree.hpp"

namespace specdec::ops {

// topk values the CUDA kernels are compiled for (per-thread top-k lives in registers).
constexpr int kDraftSelectTopKs[] = {1, 2, 4, 8};
constexpr char kDraftSelectTopKList[] = "{1, 2, 4, 8}";
// draft_finalize ranks the whole candidate buffer in shared memory (13 bytes per slot).
constexpr int kDraftFinalizeMaxCandidates = 2048;

// draft_expand CUDA split of each vocabulary row over blocks (tuning, benchmarks/RESULTS.md): a
// block loads kDraftExpandRoundFloats floats per round, and each round is a DRAM latency on the
// batch-1 critical path, so a row is split until the grid has ~kDraftExpandTargetBlocks blocks
// (2 per SM on a 132-SM H200), in chunks of whole rounds (a partial round costs a full one and
// its block more merge work), at most kDraftExpandMaxSplits blocks per row.
constexpr int kDraftExpandTargetBlocks = 264;
constexpr int kDraftExpandRoundFloats = 4096;  // 256 threads x 4 float4 loads
constexpr int kDraftExpandMaxSplits = 64;

// Per-request status written by draft_finalize.
enum DraftSelectError : int32_t {
  kDraftSelectOk = 0,
  kDraftParentMissing = 1,  // a chosen candidate's parent slot is not chosen (or not in [-1, slot))
};

SPECDEC_HD inline int draft_candidate_count(int topk, int steps) {
  return topk + (steps - 1) * topk * topk;
}
SPECDEC_HD inline int draft_step_base(int topk, int step) {
  return step == 0 ? 0 : topk + (step - 1) * topk * topk;
}
SPECDEC_HD inline int draft_branches(int topk, int step) { return step == 0 ? 1 : topk; }

// Candidates and children are ranked by pack_value_index(score, draft id or slot) (core/math.hpp):
// larger score first, ties to the smaller index; a key of 0 marks an empty entry.

// log(sum_j exp(x_j)) from the row max and sum_j exp(x_j - max).
SPECDEC_HD inline float draft_log_sum_exp(float max, float sum) { return max + logf(sum); }
// Cumulative log-prob of a child: its branch's score plus the token's log-softmax.
SPECDEC_HD inline float draft_child_score(float frontier_score, float logit, float lse) {
  return frontier_score + (logit - lse);
}
SPECDEC_HD inline int32_t draft_target_token(int64_t const* d2t, int32_t draft_id) {
  return d2t ? static_cast<int32_t>(draft_id + d2t[draft_id]) : draft_id;
}
// Merges the (max, sum of exp(x - max)) pair (m2, s2) into (m, s).
SPECDEC_HD inline void draft_softmax_merge(float& m, float& s, float m2, float s2) {
  float const mn = m > m2 ? m : m2;
  if (mn == -INFINITY) return;  // both empty (or all -inf)
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

// CUDA split of rows of `vocab` floats over blocks: blocks per row (<= draft_expand_max_splits).
SPECDEC_HD inline int draft_expand_max_splits(int vocab) {
  int const s = ceil_div(vocab, kDraftExpandRoundFloats);
  return s < 1 ? 1 : (s > kDraftExpandMaxSplits ? kDraftExpandMaxSplits : s);
}
SPECDEC_HD inline int draft_expand_chunk(int rows, int vocab) {
  int want = ceil_div(kDraftExpandTargetBlocks, rows < 1 ? 1 : rows);
  int const most = draft_expand_max_splits(vocab);
  want = want < 1 ? 1 : (want > most ? most : want);
  return ceil_div(vocab, want * kDraftExpandRoundFloats) * kDraftExpandRoundFloats;
}
SPECDEC_HD inline int draft_expand_splits(int rows, int vocab) {
  return ceil_div(vocab, draft_expand_chunk(rows, vocab));
}

// Bytes of CUDA workspace draft_expand needs for any step: per (request, branch, split) a
// (max, sum) float pair and topk keys from the start, and one uint32 arrival counter per request
// at the end (counted back from workspace + workspace_bytes). Zero the workspace once after
// allocating it (cudaMemset): every launch leaves the counters at zero. One workspace sized for
// the largest (batch, vocab, topk) serves every call with smaller or equal values.
inline size_t draft_expand_workspace_bytes(int batch, int vocab, int topk) {
  size_t const parts = static_cast<size_t>(batch) * topk * draft_expand_max_splits(vocab);
  return parts * (2 * sizeof(float) + static_cast<size_t>(topk) * sizeof(uint64_t)) +
         static_cast<size_t>(batch) * sizeof(uint32_t);
}

struct DraftExpandParams {
  float const* logits = nullptr;           // [B, K_in, Vd] float, K_in = 1 at step 0, else topk
  float const* frontier_scores = nullptr;  // [B, K_in] float cumulative log-prob of each branch
  int32_t const* frontier_slots =
      nullptr;                           // [B, K_in] int32 candidate slot of each branch (-1 root)
  int64_t const* d2t = nullptr;          // [Vd] int64 draft->target offsets, or nullptr
  int batch = 0;                         // B
  int vocab = 0;                         // Vd
  int topk = 0;                          // children per branch and frontier width
  int steps = 0;                         // draft steps in all (C = topk + (steps-1)*topk^2)
  int step = 0;                          // this step, 0 <= step < steps
  int32_t* cand_tokens = nullptr;        // [B, C] int32 target ids (this step's slots written)
  float* cand_scores = nullptr;          // [B, C] float cumulative log-probs
  int32_t* cand_parent = nullptr;        // [B, C] int32 parent slot (-1 = root)
  float* next_scores = nullptr;          // [B, topk] float, decreasing
  int32_t* next_slots = nullptr;         // [B, topk] int32 candidate slots
  int32_t* next_tokens = nullptr;        // [B, topk] int32 target ids (next draft input)
  int32_t* next_draft_tokens = nullptr;  // [B, topk] int32 draft ids (pre-d2t)
  int32_t* next_branch = nullptr;        // [B, topk] int32 extended branch, in [0, K_in)
  void* workspace = nullptr;             // CUDA only: draft_expand_workspace_bytes(B, Vd, topk)
  size_t workspace_bytes = 0;            //   bytes, 8-byte aligned, zeroed once after allocation
                                         //   (launches leave it zeroed); unused on the CPU
};

struct DraftFinalizeParams {
  int32_t const* cand_tokens = nullptr;  // [B, C] int32 (all C slots filled by draft_expand)
  float const* cand_scores = nullptr;    // [B, C] float
  int32_t const* cand_parent = nullptr;  // [B, C] int32
  int32_t const* root_tokens = nullptr;  // [B] int32 last committed token of each request
  int batch = 0;                         // B
  int topk = 0;                          // as given to draft_expand
  int steps = 0;                         // as given to draft_expand
  int nodes = 0;                         // N: tree nodes, root included, 2 <= N <= 1 + C
  int32_t* tokens = nullptr;             // [B, N] int32 written (TreeInput tokens)
  int32_t* parents = nullptr;            // [B, N] int32 written (TreeInput parents)
  int32_t* node_slot = nullptr;          // [B, N] int32 written: candidate slot, -1 for the root
  float* node_scores = nullptr;          // [B, N] float written when not null (root 0)
  int32_t* status = nullptr;             // [B] int32 written: DraftSelectError

  TreeInput tree() const { return TreeInput{tokens, parents, nullptr, batch, nodes}; }
};

// The buffers one proposal's draft_expand steps and its draft_finalize share (executor memory;
// shapes as in DraftExpandParams), so callers fill each params struct in one place.
struct DraftSelectBuffers {
  int batch = 0;                         // B
  int vocab = 0;                         // Vd
  int topk = 0;
  int steps = 0;
  int32_t* cand_tokens = nullptr;        // [B, C]
  float* cand_scores = nullptr;          // [B, C]
  int32_t* cand_parent = nullptr;        // [B, C]
  float* next_scores = nullptr;          // [B, topk]
  int32_t* next_slots = nullptr;         // [B, topk]
  int32_t* next_tokens = nullptr;        // [B, topk]
  int32_t* next_draft_tokens = nullptr;  // [B, topk]
  int32_t* next_branch = nullptr;        // [B, topk]
  void* workspace = nullptr;             // CUDA only (DraftExpandParams::workspace)
  size_t workspace_bytes = 0;

  DraftExpandParams expand(int step, float const* logits, float const* frontier_scores,
                           int32_t const* frontier_slots, int64_t const* d2t) const {
    DraftExpandParams p;
    p.logits = logits;
    p.frontier_scores = frontier_scores;
    p.frontier_slots = frontier_slots;
    p.d2t = d2t;
    p.batch = batch;
    p.vocab = vocab;
    p.topk = topk;
    p.steps = steps;
    p.step = step;
    p.cand_tokens = cand_tokens;
    p.cand_scores = cand_scores;
    p.cand_parent = cand_parent;
    p.next_scores = next_scores;
    p.next_slots = next_slots;
    p.next_tokens = next_tokens;
    p.next_draft_tokens = next_draft_tokens;
    p.next_branch = next_branch;
    p.workspace = workspace;
    p.workspace_bytes = workspace_bytes;
    return p;
  }

  DraftFinalizeParams finalize(int32_t const* root_tokens, int nodes, int32_t* tokens,
                               int32_t* parents, int32_t* node_slot, int32_t* status) const {
    DraftFinalizeParams p;
    p.cand_tokens = cand_tokens;
    p.cand_scores = cand_scores;
    p.cand_parent = cand_parent;
    p.root_tokens = root_tokens;
    p.batch = batch;
    p.topk = topk;
    p.steps = steps;
    p.nodes = nodes;
    p.tokens = tokens;
    p.parents = parents;
    p.node_slot = node_slot;
    p.status = status;
    return p;
  }
};

inline bool draft_topk_supported(int topk) {
  for (int k : kDraftSelectTopKs) {
    if (k == topk) return true;
  }
  return false;
}

namespace draft_select_detail {
inline Status check_shape(char const* op, int batch, int topk, int steps) {
  std::string const pre = std::string(op) + ": ";
  if (batch < 1) return Status::InvalidArgument(pre + "batch " + std::to_string(batch) + " < 1");
  if (topk < 1) return Status::InvalidArgument(pre + "topk " + std::to_string(topk) + " < 1");
  if (!draft_topk_supported(topk)) {
    return Status::Unsupported(pre + "topk " + std::to_string(topk) +
                               " is not compiled in: use one of " + kDraftSelectTopKList);
  }
  if (steps < 1) return Status::InvalidArgument(pre + "steps " + std::to_string(steps) + " < 1");
  return Status::Ok();
}
}  // namespace draft_select_detail

inline Status validate(DraftExpandParams const& p) {
  SPECDEC_RETURN_IF_ERROR(
      draft_select_detail::check_shape("draft_expand", p.batch, p.topk, p.steps));
  auto bad = [](std::string m) { return Status::InvalidArgument("draft_expand: " + m); };
  if (p.step < 0 || p.step >= p.steps) {
    return bad("step " + std::to_string(p.step) +
               " outside [0, steps = " + std::to_string(p.steps) + ")");
  }
  if (p.vocab < p.topk) {
    return bad("draft vocabulary " + std::to_string(p.vocab) + " < topk " + std::to_string(p.topk) +
               ": lower topk");
  }
  if (!p.logits) return bad("logits is null: pass the draft logits [B, K_in, Vd]");
  if (!p.frontier_scores)
    return bad("frontier_scores is null: pass [B, K_in] floats (0 for the root)");
  if (!p.frontier_slots)
    return bad("frontier_slots is null: pass [B, K_in] int32 (-1 for the root)");
  if (!p.cand_tokens) return bad("cand_tokens is null: pass an int32 buffer [B, C]");
  if (!p.cand_scores) return bad("cand_scores is null: pass a float buffer [B, C]");
  if (!p.cand_parent) return bad("cand_parent is null: pass an int32 buffer [B, C]");
  if (!p.next_scores) return bad("next_scores is null: pass a float buffer [B, topk]");
  if (!p.next_slots) return bad("next_slots is null: pass an int32 buffer [B, topk]");
  if (!p.next_tokens) return bad("next_tokens is null: pass an int32 buffer [B, topk]");
  if (!p.next_draft_tokens) return bad("next_draft_tokens is null: pass an int32 buffer [B, topk]");
  if (!p.next_branch) return bad("next_branch is null: pass an int32 buffer [B, topk]");
  void const* outs[] = {p.next_scores, p.next_slots, p.next_tokens, p.next_draft_tokens,
                        p.next_branch};
  for (void const* o : outs) {
    if (o == static_cast<void const*>(p.frontier_scores) ||
        o == static_cast<void const*>(p.frontier_slots)) {
      return bad(
          "a next_* output aliases frontier_scores or frontier_slots: the next frontier must "
          "go to separate buffers (double-buffer the frontier between steps)");
    }
  }
  return Status::Ok();
}

// The CUDA path's extra requirement: a workspace of draft_expand_workspace_bytes.
inline Status validate_workspace(DraftExpandParams const& p) {
  size_t const need = draft_expand_workspace_bytes(p.batch, p.vocab, p.topk);
  if (!p.workspace || p.workspace_bytes < need) {
    return Status::InvalidArgument(
        "draft_expand: workspace of " + std::to_string(p.workspace_bytes) + " bytes < " +
        std::to_string(need) +
        " needed: allocate draft_expand_workspace_bytes(batch, vocab, topk)");
  }
  if (reinterpret_cast<uintptr_t>(p.workspace) % 8 != 0 || p.workspace_bytes % 4 != 0) {
    return Status::InvalidArgument(
        "draft_expand: workspace is not 8-byte aligned or its size is not a multiple of 4");
  }
  return Status::Ok();
}

inline Status validate(DraftFinalizeParams const& p) {
  SPECDEC_RETURN_IF_ERROR(
      draft_select_detail::check_shape("draft_finalize", p.batch, p.topk, p.steps));
  auto bad = [](std::string m) { return Status::InvalidArgument("draft_finalize: " + m); };
  int const C = draft_candidate_count(p.topk, p.steps);
  if (C > kDraftFinalizeMaxCandidates) {
    return bad("candidates topk + (steps-1)*topk^2 = " + std::to_string(C) + " > " +
               std::to_string(kDraftFinalizeMaxCandidates) + ": lower steps or topk");
  }
  if (p.nodes < 2) {
    return bad("nodes " + std::to_string(p.nodes) +
               " < 2: a tree needs the root and a draft token");
  }
  if (p.nodes - 1 > C) {
    return bad("nodes - 1 = " + std::to_string(p.nodes - 1) +
               " exceeds topk + (steps-1)*topk^2 = " + std::to_string(C) +
               ": raise steps or topk, or lower the number of draft tokens");
  }
  if (!p.cand_tokens) return bad("cand_tokens is null: pass draft_expand's [B, C] tokens");
  if (!p.cand_scores) return bad("cand_scores is null: pass draft_expand's [B, C] scores");
  if (!p.cand_parent) return bad("cand_parent is null: pass draft_expand's [B, C] parents");
  if (!p.root_tokens) return bad("root_tokens is null: pass the [B] last committed tokens");
  if (!p.tokens) return bad("tokens is null: pass an int32 buffer [B, N]");
  if (!p.parents) return bad("parents is null: pass an int32 buffer [B, N]");
  if (!p.node_slot) return bad("node_slot is null: pass an int32 buffer [B, N]");
  if (!p.status) return bad("status is null: pass an int32 buffer [B]");
  return Status::Ok();
}

}  // namespace specdec::ops
