// draft_select CUDA kernels.
//   draft_expand_kernel<kTopK>: grid (splits, K_in, B), one launch. Each block reads one chunk of
//     one branch's logits row with 16-byte loads (kUnroll in flight per thread), keeping an online
//     (max, sum of exp) and a register top-kTopK of (logit, draft id) keys per thread, merges them
//     block-wide (warp shuffles, then one warp over the per-warp lists) into the workspace, and
//     counts itself in with an atomic. The request's last block merges its K_in * splits partials
//     (one warp per branch) into the log-sum-exp and each branch's top-kTopK children, writes the
//     candidates, ranks the K_in * kTopK children by score (one thread per child, counting better
//     ones) for the next frontier and resets the counter.
//   draft_finalize_kernel: one block per request; each thread ranks its candidates by counting
//     better ones over the buffer in shared memory (O(C) each, all in parallel); the chosen get
//     their node index by counting chosen slots below them.
// Launchers do no host synchronisation, allocation or host read of device data: B, topk, step,
// steps and the vocabulary are the op's static shape (a CUDA graph holds one node per step).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "specdec/core/cuda.cuh"
#include "specdec/core/warp.cuh"
#include "specdec/core/macros.hpp"
#include "specdec/ops/draft_select/params.hpp"

namespace specdec::ops {
namespace draft_select_detail {

// 256 threads x kUnroll = 4 float4 loads in flight = 16 KiB per block per round; up to 8 blocks
// per SM cover H200 latency x bandwidth (same choice as verify_greedy's argmax).
constexpr int kExpandThreads = 256;
constexpr int kExpandUnroll = 4;
constexpr int kExpandWarps = kExpandThreads / 32;
// draft_finalize: candidates are ranked by 256 threads (C <= 2048: at most 8 per thread).
constexpr int kFinalizeThreads = 256;

// Inserts `key` into the descending list keys[0..K) (compile-time indices only: no local memory).
template <int K>
__device__ __forceinline__ void topk_insert(uint64_t (&keys)[K], uint64_t key) {
  if (key <= keys[K - 1]) return;
  keys[K - 1] = key;
#pragma unroll
  for (int j = K - 1; j > 0; --j) {
    if (keys[j] > keys[j - 1]) {
      uint64_t const t = keys[j];
      keys[j] = keys[j - 1];
      keys[j - 1] = t;
    }
  }
}

// Warp-wide top-K of the lanes' descending lists: K rounds of (warp max, the owner pops its
// head). Keys are unique except the empty key 0, so exactly one lane pops per round. On return
// every lane's `keys` holds the warp's top K, descending.
template <int K>
__device__ __forceinline__ void warp_topk(uint64_t (&keys)[K]) {
  uint64_t out[K];
#pragma unroll
  for (int r = 0; r < K; ++r) {
    uint64_t const best = warp_max_u64(keys[0]);
    out[r] = best;
    if (best != 0 && keys[0] == best) {
#pragma unroll
      for (int j = 0; j + 1 < K; ++j) keys[j] = keys[j + 1];
      keys[K - 1] = 0;
    }
  }
#pragma unroll
  for (int r = 0; r < K; ++r) keys[r] = out[r];
}

__device__ __forceinline__ void warp_softmax_merge(float& m, float& s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    float const m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    float const s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    draft_softmax_merge(m, s, m2, s2);
  }
}

// One logit into the thread's online softmax state and top-K list. The float pre-test skips the
// key arithmetic for the (common) logit below the current K-th best; NaN and ties fall through
// to the exact key compare.
template <int K>
__device__ __forceinline__ void consume(float x, int32_t id, float& m, float& s, float& kth,
                                        uint64_t (&keys)[K]) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;  // m = -inf: s was 0, stays 0 + 1
    m = x;
  } else if (x != -INFINITY) {
    s += expf(x - m);
  }
  if (!(x < kth)) {
    topk_insert(keys, pack_value_index(x, id));
    kth = keys[K - 1] == 0 ? -INFINITY : unpack_value(keys[K - 1]);
  }
}

template <int K>
struct ExpandWorkspace {
  float2* partial;     // [B * K_in * splits] (max, sum)
  uint64_t* keys;      // [B * K_in * splits, K]
  uint32_t* arrivals_end;  // one past the counters: request b's is arrivals_end[-1 - b]

  // Blocks of request b done (the last one resets it to 0). Counted from the workspace's end, so
  // a counter's address does not depend on (B, Vd, topk): a workspace sized for the largest
  // shape serves every smaller one without stale counters.
  __device__ uint32_t* arrival(int b) const { return arrivals_end - 1 - b; }
};

template <int K>
__device__ __forceinline__ ExpandWorkspace<K> expand_workspace(DraftExpandParams const& p) {
  size_t const parts = static_cast<size_t>(p.batch) * p.topk * draft_expand_max_splits(p.vocab);
  float2* partial = static_cast<float2*>(p.workspace);
  uint64_t* keys = reinterpret_cast<uint64_t*>(partial + parts);
  return {partial, keys,
          reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(p.workspace) + p.workspace_bytes)};
}

// Run by the last block of request b: warp i merges branch i's split partials (read through L2:
// other blocks wrote them) into its log-sum-exp and top-K children and writes them to the
// candidate buffer; then thread t < K_in * K ranks child t by score for the next frontier.
template <int K>
__device__ __forceinline__ void expand_merge_request(DraftExpandParams const& p,
                                                     ExpandWorkspace<K> const& ws, int b, int K_in,
                                                     int splits) {
  __shared__ uint64_t s_child_key[K * K];  // (score, slot) keys of the children, index i * K + j
  __shared__ int32_t s_child_draft[K * K];
  int const tid = threadIdx.x, lane = tid & 31, i = tid >> 5;
  int const C = draft_candidate_count(K, p.steps), base = draft_step_base(K, p.step);
  if (i < K_in) {
    int64_t const row = static_cast<int64_t>(b) * K_in + i;
    float m = -INFINITY, s = 0.0f;
    uint64_t keys[K];
#pragma unroll
    for (int j = 0; j < K; ++j) keys[j] = 0;
    for (int sp = lane; sp < splits; sp += 32) {
      int64_t const part = row * splits + sp;
      float2 const ms = __ldcg(ws.partial + part);
      draft_softmax_merge(m, s, ms.x, ms.y);
#pragma unroll
      for (int j = 0; j < K; ++j) topk_insert(keys, __ldcg(ws.keys + part * K + j));
    }
    warp_softmax_merge(m, s);
    warp_topk(keys);
    if (lane == 0) {
      float const lse = draft_log_sum_exp(m, s);
      float const frontier_score = p.frontier_scores[row];
      int32_t const parent = p.frontier_slots[row];
#pragma unroll
      for (int j = 0; j < K; ++j) {
        int32_t const d = unpack_index(keys[j]);
        int const slot = base + i * K + j;
        int64_t const at = static_cast<int64_t>(b) * C + slot;
        float const score = draft_child_score(frontier_score, unpack_value(keys[j]), lse);
        p.cand_tokens[at] = draft_target_token(p.d2t, d);
        p.cand_scores[at] = score;
        p.cand_parent[at] = parent;
        s_child_key[i * K + j] = pack_value_index(score, slot);
        s_child_draft[i * K + j] = d;
      }
    }
  }
  __syncthreads();
  int const children = K_in * K;
  if (tid < children) {
    uint64_t const key = s_child_key[tid];
    int rank = 0;
    for (int u = 0; u < children; ++u) rank += s_child_key[u] > key ? 1 : 0;
    if (rank < K) {
      int64_t const at = static_cast<int64_t>(b) * K + rank;
      int32_t const d = s_child_draft[tid];
      p.next_scores[at] = unpack_value(key);
      p.next_slots[at] = unpack_index(key);
      p.next_tokens[at] = draft_target_token(p.d2t, d);
      p.next_draft_tokens[at] = d;
      p.next_branch[at] = tid / K;
    }
  }
}

// grid (splits, K_in, B): block (split, i, b) reduces chunk `split` of branch i's logits row to a
// (max, sum) pair and its top-K keys in the workspace; the last of request b's K_in * splits
// blocks to arrive (threadfence + atomic counter) merges the request in place. One launch.
template <int K>
__global__ void __launch_bounds__(kExpandThreads)
    draft_expand_kernel(__grid_constant__ DraftExpandParams const p, int const chunk) {
  __shared__ uint64_t s_keys[kExpandWarps][K];
  __shared__ float2 s_ms[kExpandWarps];
  __shared__ bool s_last;
  int const split = blockIdx.x, i = blockIdx.y, b = blockIdx.z;
  int const K_in = gridDim.y, splits = gridDim.x, tid = threadIdx.x;
  int const Vd = p.vocab;
  int64_t const row = static_cast<int64_t>(b) * K_in + i;
  float const* x = p.logits + row * Vd;
  int const c0 = split * chunk, c1 = min(c0 + chunk, Vd);

  float m = -INFINITY, s = 0.0f, kth = -INFINITY;
  uint64_t keys[K];
#pragma unroll
  for (int j = 0; j < K; ++j) keys[j] = 0;

  // float4 body when the row is 16-byte aligned (chunks start at multiples of 4), scalar rest.
  bool const aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  int const vectors = aligned ? (c1 - c0) >> 2 : 0;
  float4 const* xv = reinterpret_cast<float4 const*>(x + c0);
  for (int v0 = 0; v0 < vectors; v0 += kExpandThreads * kExpandUnroll) {
    float4 v[kExpandUnroll];
#pragma unroll
    for (int u = 0; u < kExpandUnroll; ++u) {
      int const idx = v0 + u * kExpandThreads + tid;
      if (idx < vectors) v[u] = __ldg(xv + idx);
    }
#pragma unroll
    for (int u = 0; u < kExpandUnroll; ++u) {
      int const idx = v0 + u * kExpandThreads + tid;
      if (idx < vectors) {
        int32_t const id = c0 + 4 * idx;
        consume(v[u].x, id, m, s, kth, keys);
        consume(v[u].y, id + 1, m, s, kth, keys);
        consume(v[u].z, id + 2, m, s, kth, keys);
        consume(v[u].w, id + 3, m, s, kth, keys);
      }
    }
  }
  for (int d = c0 + 4 * vectors + tid; d < c1; d += kExpandThreads)
    consume(x[d], d, m, s, kth, keys);

  // Block merge: warps, then warp 0 over the per-warp results, into the workspace.
  int const lane = tid & 31, warp = tid >> 5;
  warp_softmax_merge(m, s);
  warp_topk(keys);
  if (lane == 0) {
    s_ms[warp] = make_float2(m, s);
#pragma unroll
    for (int j = 0; j < K; ++j) s_keys[warp][j] = keys[j];
  }
  __syncthreads();
  ExpandWorkspace<K> const ws = expand_workspace<K>(p);
  if (warp == 0) {
    m = -INFINITY;
    s = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) keys[j] = 0;
    if (lane < kExpandWarps) {
      m = s_ms[lane].x;
      s = s_ms[lane].y;
#pragma unroll
      for (int j = 0; j < K; ++j) keys[j] = s_keys[lane][j];
    }
    warp_softmax_merge(m, s);
    warp_topk(keys);
    int64_t const part = row * splits + split;
    if (lane == 0) ws.partial[part] = make_float2(m, s);
    if (lane < K) {
      uint64_t mine = 0;
#pragma unroll
      for (int j = 0; j < K; ++j) mine = j == lane ? keys[j] : mine;
      ws.keys[part * K + lane] = mine;
    }
    __threadfence();  // partials visible device-wide before this block counts as arrived
  }
  __syncthreads();
  if (tid == 0) {
    uint32_t const arrived = atomicAdd(ws.arrival(b), 1u);
    s_last = arrived == static_cast<uint32_t>(K_in * splits - 1);
  }
  __syncthreads();
  if (!s_last) return;  // block-uniform
  __threadfence();
  expand_merge_request<K>(p, ws, b, K_in, splits);
  if (tid == 0) *ws.arrival(b) = 0;  // ready for the next launch (stream order)
}

template <int K>
Status draft_expand_launch(DraftExpandParams const& p, cudaStream_t stream) {
  int const K_in = draft_branches(K, p.step);
  int const rows = p.batch * K_in;
  int const chunk = draft_expand_chunk(rows, p.vocab);
  int const splits = ceil_div(p.vocab, chunk);
  draft_expand_kernel<K><<<dim3(splits, K_in, p.batch), kExpandThreads, 0, stream>>>(p, chunk);
  return cuda_launch_status("draft_expand_kernel");
}

// Dynamic shared memory of draft_finalize_kernel: keys [C] u64, node index [C] i32, chosen [C] u8.
inline size_t finalize_smem_bytes(int C) { return static_cast<size_t>(C) * (8 + 4 + 1); }

static __global__ void __launch_bounds__(kFinalizeThreads)
    draft_finalize_kernel(__grid_constant__ DraftFinalizeParams const p) {
  await_prior_kernels();
  extern __shared__ __align__(8) unsigned char s_raw[];
  int const C = draft_candidate_count(p.topk, p.steps), N = p.nodes;
  uint64_t* s_key = reinterpret_cast<uint64_t*>(s_raw);
  int32_t* s_node = reinterpret_cast<int32_t*>(s_key + C);
  uint8_t* s_chosen = reinterpret_cast<uint8_t*>(s_node + C);
  int const b = blockIdx.x, tid = threadIdx.x;
  int64_t const c0 = static_cast<int64_t>(b) * C, n0 = static_cast<int64_t>(b) * N;

  for (int c = tid; c < C; c += blockDim.x) s_key[c] = pack_value_index(p.cand_scores[c0 + c], c);
  __syncthreads();
  // Chosen: fewer than N-1 better candidates (keys are unique, so exactly N-1 are chosen).
  for (int c = tid; c < C; c += blockDim.x) {
    uint64_t const key = s_key[c];
    int rank = 0;
    for (int u = 0; u < C; ++u) rank += s_key[u] > key ? 1 : 0;
    s_chosen[c] = rank < N - 1 ? 1 : 0;
  }
  __syncthreads();
  // Node index of a chosen slot: 1 + chosen slots below it (slot order puts parents first).
  for (int c = tid; c < C; c += blockDim.x) {
    int below = 0;
    if (s_chosen[c]) {
      for (int u = 0; u < c; ++u) below += s_chosen[u];
    }
    s_node[c] = s_chosen[c] ? 1 + below : -1;
  }
  __syncthreads();
  bool missing = false;
  for (int c = tid; c < C; c += blockDim.x) {
    int const node = s_node[c];
    if (node < 0) continue;
    int32_t const ps = p.cand_parent[c0 + c];
    int32_t const parent = ps == -1 ? 0 : (ps >= 0 && ps < c ? s_node[ps] : -1);
    missing |= parent == -1;
    p.tokens[n0 + node] = p.cand_tokens[c0 + c];
    p.parents[n0 + node] = parent;
    p.node_slot[n0 + node] = c;
    if (p.node_scores) p.node_scores[n0 + node] = p.cand_scores[c0 + c];
  }
  missing = __syncthreads_or(missing);
  if (tid == 0) {
    p.tokens[n0] = p.root_tokens[b];
    p.parents[n0] = -1;
    p.node_slot[n0] = -1;
    if (p.node_scores) p.node_scores[n0] = 0.0f;
    p.status[b] = missing ? kDraftParentMissing : kDraftSelectOk;
  }
}

}  // namespace draft_select_detail

// Launches draft_expand on `stream` (one kernel); all pointers in p are device memory and
// p.workspace holds draft_expand_workspace_bytes(B, Vd, topk) bytes.
inline Status draft_expand_cuda(DraftExpandParams const& p, cudaStream_t stream) {
  switch (p.topk) {
    case 1:
      return draft_select_detail::draft_expand_launch<1>(p, stream);
    case 2:
      return draft_select_detail::draft_expand_launch<2>(p, stream);
    case 4:
      return draft_select_detail::draft_expand_launch<4>(p, stream);
    case 8:
      return draft_select_detail::draft_expand_launch<8>(p, stream);
    default:
      return Status::Unsupported("draft_expand: topk " + std::to_string(p.topk) +
                                 " is not compiled in: use one of " + kDraftSelectTopKList);
  }
}

// Launches draft_finalize on `stream`; all pointers in p are device memory.
inline Status draft_finalize_cuda(DraftFinalizeParams const& p, cudaStream_t stream) {
  int const C = draft_candidate_count(p.topk, p.steps);
  return launch_kernel("draft_finalize_kernel", draft_select_detail::draft_finalize_kernel,
                       dim3(p.batch), draft_select_detail::kFinalizeThreads,
                       draft_select_detail::finalize_smem_bytes(C), stream, p);
}

}  // namespace specdec::ops
