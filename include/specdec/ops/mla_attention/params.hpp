// mla_attention parameters: absorbed MLA attention (DeepseekV3 / Kimi-K2.5 "weight absorption",
// model/kimi/forward_cpu.hpp) of T new tokens of a batch of B requests over the paged latent KV
// cache of one layer (model/kimi/mla_cache.hpp), giving each token's latent context per head.
// With c = kv_lora_rank, r = rope_dim, W = c + r:
//
//   q            [T, heads, W] float   per token and head qa = [W_UK_h^T q_nope_h | roped q_pe_h]
//   cache        one layer: rows of W floats, entry = [c_kv (c values) | k_pe (r values)];
//                slot s of request b is row page_table[b][s / page_size] * page_size +
//                s % page_size (MlaCache::layer(l) with its page tables)
//   token_request [T] int32  request b of token t;  token_index [T] int32  its index i among
//                request b's new tokens (new token i sits at slot base[b] + i; its own entry and
//                those of the request's other new tokens are ALREADY in the cache)
//   base         [B] int32   slots cached before this forward
//   page_table   [B, max_pages] int32 (unused entries may hold anything, e.g. -1)
//   mask         [T, words] uint32 or nullptr. Bit j of token t's row = new token j of its request
//                is visible (tree verify: the ancestor-or-self set, j <= i). nullptr = causal:
//                new token j visible iff j <= i.
//   out          [T, heads, c] float, written
//
// Per token t (request b, index i) and head h, over the visible slots u: [0, base[b]) and
// base[b] + j for the visible j (j <= i: at most base[b] + i + 1 candidates):
//   s_u = scale * (q[t, h, :] . entry_u[0:W]),  p = softmax_u(s),  out[t, h, :] = sum_u p_u entry_u[0:c]
// A token with no visible slot gets zeros.
//
// Precision: the reference (reference.hpp) takes every dot product and the softmax in double and
// rounds the output to float: the oracle. The CUDA kernel multiplies q by scale in float, splits q,
// the cache rows and the probabilities into bf16 pairs hi + lo and forms every product as three
// bf16 tensor-core products with fp32 accumulation (about 16 bits of mantissa per product, the
// scores summed in a fixed order over k-steps and warps), uses max-subtracted expf and merges
// chunk partials in a fixed order; it agrees with the reference to about 1e-5 of each (token,
// head) row's largest magnitude (the GPU test allows 1e-4).
// The summation order depends on (T, heads, max_slots) only, never on the data: a rerun of the
// same call is bit-identical; the same token in a batch of a different size may round differently.
//
// Contract (what the CPU reference checks and reports as InvalidArgument; the kernel cannot read
// device data from the host, so there it is the caller's duty; the kernel never reads outside the
// page table, the mask row or the cache for such data, and an invalid slot counts as invisible):
//   token_request[t] in [0, B); token_index[t] >= 0; base[b] >= 0;
//   base[b] + token_index[t] + 1 <= max_slots (the CUDA grid's bound);
//   with a mask: words >= ceil((i + 1) / 32) for every token's i, and no bit above i set;
//   every visible slot s has s / page_size < max_pages and a page table entry in [0, num_pages).
//
// Kernel limits, checked for both executors (one contract): c % 4 == 0 and r % 4 == 0 (128-bit
// loads of q, rows and out), c <= kMlaAttentionMaxLatent, W <= kMlaAttentionMaxWidth. The CUDA path
// also needs q, cache, out and the workspace 16-byte aligned and a workspace of
// mla_attention_workspace_bytes(tokens, heads, c, max_slots) bytes (validate_cuda).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "specdec/core/math.hpp"
#include "specdec/core/status.hpp"

namespace specdec::ops {

// c <= 512: 8 warps x 64 columns hold a head group's context (kernel.cuh).
constexpr int kMlaAttentionMaxLatent = 512;
// W <= 640: a staged fp32 tile and its bf16 split in shared memory (182 KB at the limit).
constexpr int kMlaAttentionMaxWidth = 640;
// Heads per CUDA block: the tensor-core mma's 16 rows (fewer heads pad the group with zeros).
constexpr int kMlaAttentionGroup = 16;
// Slots per shared-memory tile (one lane per slot in the kernel's softmax).
constexpr int kMlaAttentionTile = 32;
// Blocks the CUDA kernel aims for (the split of each token's slots into chunks): 2 waves of one
// 167 KB block (W = 576) per multiprocessor on the H200's 132.
constexpr int kMlaAttentionTargetBlocks = 264;
// A split whose chunks would hold at least this many tiles of max_slots rounds the block count
// down (mla_attention_plan). Measured on Kimi's 64 heads (benchmarks/RESULTS.md): rounding down
// took a verify of 16 tokens at context 1024 from 5 chunks of 8 tiles to 4 (-1.1 ms per step),
// one of 64 from 2 to 1 (-2.7 ms) and the op at 8 tokens and context 8192 from 9 to 8 (-22%), but
// a verify of 4 at context 1024 from 17 chunks of 3 tiles to 16 (+0.34 ms: 11 of 3 tiles used,
// where 17 of 2 left the blocks past two waves as the tokens' short last chunks).
constexpr int kMlaAttentionLongChunkTiles = 4;

struct MlaAttentionParams {
  float const* q = nullptr;                // [T, heads, W] float
  float const* cache = nullptr;            // layer base: [num_pages * page_size, W] float
  int32_t const* token_request = nullptr;  // [T] int32, request b of token t
  int32_t const* token_index = nullptr;    // [T] int32, i = index among request b's new tokens
  int32_t const* base = nullptr;           // [B] int32, slots cached before this forward
  int32_t const* page_table = nullptr;     // [B, max_pages] int32 page ids
  uint32_t const* mask = nullptr;          // [T, words] uint32 or nullptr (causal)
  int tokens = 0;                          // T
  int heads = 0;                           // attention heads
  int kv_lora_rank = 0;                    // c
  int rope_dim = 0;                        // r (W = c + r)
  int batch = 0;                           // B
  int page_size = 0;                       // slots per page
  int max_pages = 0;                       // page table columns
  int num_pages = 0;                       // pages in the layer (rows = num_pages * page_size)
  int words = 0;                           // mask words per token (with a mask)
  int max_slots = 0;                       // >= every base[b] + i + 1 (sizes the CUDA grid)
  float scale = 1.0f;                      // softmax scale
  float* out = nullptr;                    // [T, heads, c] float, written
  void* workspace = nullptr;               // CUDA only: mla_attention_workspace_bytes(T, heads,
  size_t workspace_bytes = 0;              //   c, max_slots) bytes, 16-byte aligned
};

// How the CUDA kernel cuts the work: heads in groups of `group` (kMlaAttentionGroup),
// each token's candidate slots split into `chunks` (<= ceil(max_slots / tile)) so that
// T * groups * chunks is about kMlaAttentionTargetBlocks: rounded down where the chunks would be
// long (kMlaAttentionLongChunkTiles tiles or more of max_slots: a third wave of a few such blocks
// is a whole long round), else rounded up (the blocks past two waves are then the tokens' short
// last chunks); one block per (token, group, chunk).
// A token with n candidate slots gives each chunk max(tile, roundup(ceil(n / chunks), tile))
// slots (computed on the device from n, so short contexts still spread over all chunks).
// chunks == 1: blocks write out directly; otherwise chunk partials go to the workspace and a
// combine kernel merges them.
struct MlaAttentionPlan {
  int group = kMlaAttentionGroup;
  int groups = 1;
  int chunks = 1;
};

inline MlaAttentionPlan mla_attention_plan(int tokens, int heads, int max_slots) {
  MlaAttentionPlan plan;
  plan.group = kMlaAttentionGroup;
  plan.groups = heads < 1 ? 1 : (heads + plan.group - 1) / plan.group;
  int64_t const rows = static_cast<int64_t>(tokens < 1 ? 1 : tokens) * plan.groups;
  int64_t const tiles = max_slots < 1 ? 1 : ceil_div<int64_t>(max_slots, kMlaAttentionTile);
  int64_t const up = ceil_div<int64_t>(kMlaAttentionTargetBlocks, rows);
  int64_t const down = std::max<int64_t>(1, kMlaAttentionTargetBlocks / rows);
  int64_t const splits = ceil_div(tiles, up) >= kMlaAttentionLongChunkTiles ? down : up;
  plan.chunks = static_cast<int>(std::min(splits, tiles));
  return plan;
}

// Bytes of CUDA workspace for this shape: T * groups * chunks partials of group * (c + 2) floats
// (the unnormalised context, the running max and sum), 0 when chunks == 1. Not monotone in
// tokens (fewer tokens split into more chunks); mla_attention_workspace_bound_bytes(c) serves
// every shape.
inline size_t mla_attention_workspace_bytes(int tokens, int heads, int c, int max_slots) {
  if (tokens < 1 || heads < 1 || c < 1) return 0;
  MlaAttentionPlan const plan = mla_attention_plan(tokens, heads, max_slots);
  if (plan.chunks <= 1) return 0;
  return static_cast<size_t>(tokens) * static_cast<size_t>(plan.groups) *
         static_cast<size_t>(plan.chunks) * static_cast<size_t>(plan.group) *
         (static_cast<size_t>(c) + 2) * sizeof(float);
}

// An upper bound of mla_attention_workspace_bytes(T, heads, c, max_slots) over every T, heads and
// max_slots: chunks > 1 only when T * groups < kMlaAttentionTargetBlocks, and then
// T * groups * chunks < 2 * kMlaAttentionTargetBlocks partials of at most 16 heads
// (c = 512: 17.4 MB). One allocation of this size serves every captured shape.
inline size_t mla_attention_workspace_bound_bytes(int c) {
  if (c < 1) return 0;
  return size_t{2} * kMlaAttentionTargetBlocks * kMlaAttentionGroup * (static_cast<size_t>(c) + 2) *
         sizeof(float);
}

inline Status validate(MlaAttentionParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("mla_attention: " + m); };
  auto num = [](int64_t v) { return std::to_string(v); };
  if (p.tokens < 0) return bad("tokens " + num(p.tokens) + " < 0");
  if (p.heads < 1) return bad("heads " + num(p.heads) + " < 1");
  if (p.kv_lora_rank < 1) return bad("kv_lora_rank (c) " + num(p.kv_lora_rank) + " < 1");
  if (p.rope_dim < 0) return bad("rope_dim (r) " + num(p.rope_dim) + " < 0");
  if (p.kv_lora_rank % 4 != 0 || p.rope_dim % 4 != 0) {
    return bad("kv_lora_rank (c) " + num(p.kv_lora_rank) + " and rope_dim (r) " + num(p.rope_dim) +
               " must be multiples of 4 (the kernel's 128-bit loads)");
  }
  if (p.kv_lora_rank > kMlaAttentionMaxLatent) {
    return bad("kv_lora_rank (c) " + num(p.kv_lora_rank) + " > " + num(kMlaAttentionMaxLatent) +
               " (the kernel's per-thread context registers)");
  }
  int64_t const width = int64_t{p.kv_lora_rank} + p.rope_dim;
  if (width > kMlaAttentionMaxWidth) {
    return bad("entry width c + r = " + num(width) + " > " + num(kMlaAttentionMaxWidth) +
               " (the kernel's shared memory)");
  }
  if (p.page_size < 1) return bad("page_size " + num(p.page_size) + " < 1");
  if (p.max_pages < 1) return bad("max_pages " + num(p.max_pages) + " < 1");
  if (p.num_pages < 1) return bad("num_pages " + num(p.num_pages) + " < 1");
  if (p.max_slots < 1) {
    return bad("max_slots " + num(p.max_slots) + " < 1: pass a bound >= every base[b] + i + 1");
  }
  if (p.mask && p.words < 1) {
    return bad("words " + num(p.words) + " < 1 with a mask: pass ceil(N / 32) words per row");
  }
  if (!std::isfinite(p.scale)) return bad("scale is not finite");
  if (p.tokens == 0) return Status::Ok();
  if (p.batch < 1) return bad("batch " + num(p.batch) + " < 1 with " + num(p.tokens) + " tokens");
  if (!p.q) return bad("q is null: pass [T, heads, c + r] absorbed queries");
  if (!p.cache) return bad("cache is null: pass the layer's [rows, c + r] entries");
  if (!p.token_request) return bad("token_request is null: pass the [T] request of each token");
  if (!p.token_index) return bad("token_index is null: pass the [T] index of each new token");
  if (!p.base) return bad("base is null: pass the [B] slots cached before this forward");
  if (!p.page_table) return bad("page_table is null: pass [B, max_pages] page ids");
  if (!p.out) return bad("out is null: pass a [T, heads, c] float output");
  return Status::Ok();
}

// The CUDA path's extra requirements: 16-byte aligned q, cache and out, and a 16-byte aligned
// workspace of mla_attention_workspace_bytes(tokens, heads, c, max_slots) bytes (none needed when
// that is 0).
inline Status validate_cuda(MlaAttentionParams const& p) {
  auto bad = [](std::string m) { return Status::InvalidArgument("mla_attention: " + m); };
  auto misaligned = [](void const* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (p.tokens == 0) return Status::Ok();
  if (misaligned(p.q) || misaligned(p.cache) || misaligned(p.out)) {
    return bad("q, cache and out must be 16-byte aligned (the kernel's 128-bit loads)");
  }
  size_t const need =
      mla_attention_workspace_bytes(p.tokens, p.heads, p.kv_lora_rank, p.max_slots);
  if (need == 0) return Status::Ok();
  if (!p.workspace || p.workspace_bytes < need) {
    return bad("workspace of " + std::to_string(p.workspace ? p.workspace_bytes : 0) +
               " bytes < " + std::to_string(need) +
               " needed: allocate mla_attention_workspace_bytes(tokens, heads, kv_lora_rank, "
               "max_slots) (or mla_attention_workspace_bound_bytes(kv_lora_rank) for every shape)");
  }
  if (misaligned(p.workspace)) return bad("workspace is not 16-byte aligned");
  return Status::Ok();
}

}  // namespace specdec::ops
